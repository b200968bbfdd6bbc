//! Peak RSS in the benches: the wrapper measures the program it runs (not
//! the process that started it), the application rows carry real values,
//! and `eudp bench --sockets` reports its runs (and a failure) as they
//! went. Behaviour only: no timing is checked.

use eudp_cli::{rss, run, sockbench, testbed};
use std::path::Path;
use std::process::Command;

/// Runs `argv` under the wrapper and returns its usage report.
fn wrapped(argv: &[&str]) -> rss::Usage {
    let w = rss::wrapper().expect("rsswrap (needs cc)");
    let out = rss::report_path("test");
    let mut c = Command::new(w);
    rss::wrap_args(&mut c, &out, None, &[], argv);
    let st = c.status().expect("rsswrap");
    assert!(st.success(), "{argv:?}: {st}");
    rss::take_usage(&out).expect("usage report")
}

const PY_64M: &str = "x = bytes(range(256)) * (1 << 18); print(len(x))";

#[test]
fn wrapper_measures_the_program_not_its_starter() {
    // This process holds 192 MiB, touched; a program it starts (and the
    // launcher image in between) must not be charged with them.
    let big = vec![7u8; 192 << 20];
    let small = wrapped(&["/bin/true"]);
    assert!(small.max_rss_kib > 0 && small.max_rss_kib < 16 << 10, "{small:?}");
    assert_eq!((small.exit_code, small.signal), (0, 0));
    // A program that writes 64 MiB has at least that resident.
    let py = wrapped(&["/usr/bin/python3", "-c", PY_64M]);
    assert!(py.max_rss_kib >= 64 << 10 && py.max_rss_kib < 160 << 10, "{py:?}");
    // GNU time reads the same kernel figure for the same program.
    if Path::new("/usr/bin/time").exists() {
        let o =
            Command::new("/usr/bin/time").args(["-f", "%M", "/usr/bin/python3", "-c", PY_64M]).output().expect("time");
        let t: u64 =
            String::from_utf8_lossy(&o.stderr).trim().lines().last().unwrap_or("").parse().expect("time -f %M");
        let (a, b) = (py.max_rss_kib as f64, t as f64);
        assert!((a - b).abs() / b < 0.1, "rsswrap {a} KiB, /usr/bin/time {b} KiB");
    }
    // Exit codes and signals come through.
    let w = rss::wrapper().unwrap();
    let out = rss::report_path("test");
    let st = Command::new(&w).arg(&out).args(["/bin/sh", "-c", "exit 3"]).status().unwrap();
    assert_eq!(st.code(), Some(3));
    assert_eq!(rss::take_usage(&out).unwrap().exit_code, 3);
    assert_eq!(big[big.len() - 1], 7);
}

#[test]
fn wrapper_sets_environment_and_fd_limit() {
    let w = rss::wrapper().unwrap();
    let out = rss::report_path("test");
    let o = Command::new(&w)
        .arg(&out)
        .args(["-n", "300", "EUDP_RSS_TEST=yes", "/bin/sh", "-c", "echo $EUDP_RSS_TEST $(ulimit -Sn) $(ulimit -Hn)"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "yes 300 300");
    assert!(rss::take_usage(&out).is_some());
}

/// iperf3 and sockperf rows of the application benches carry each
/// program's peak RSS (kernel stack: needs root for the testbed).
#[test]
fn app_rows_carry_peak_rss() {
    if !testbed::is_root() || Command::new("iperf3").arg("-v").output().is_err() {
        eprintln!("skipped: needs root and iperf3");
        return;
    }
    let tb = testbed::Testbed::up(&testbed::unique_name("rss")).expect("testbed");
    let stats = std::env::temp_dir().join(format!("eudp-rss-test-{}", std::process::id()));
    std::fs::create_dir_all(&stats).unwrap();
    let lib = Path::new("/nonexistent/libeudp_preload.so");
    let mut rows = Vec::new();
    for reverse in [false, true] {
        let r = run::iperf3_udp(&tb, run::Stack::Kernel, lib, &stats, 1, 1472, "50M", reverse).expect("iperf3");
        for k in ["sender_peak_rss_kib", "receiver_peak_rss_kib"] {
            let v = r[k].as_u64().unwrap_or(0);
            assert!(v > 500 && v < 1 << 20, "{k} = {v}: {r}");
        }
        rows.push(r);
    }
    if Command::new("sockperf").arg("--version").output().is_ok() {
        let r = run::sockperf(&tb, run::Stack::Kernel, run::Stack::Kernel, lib, &stats, "ping-pong", 1, 64)
            .expect("sockperf");
        for k in ["client_peak_rss_kib", "server_peak_rss_kib"] {
            let v = r[k].as_u64().unwrap_or(0);
            assert!(v > 500 && v < 1 << 20, "{k} = {v}: {r}");
        }
        rows.push(r);
    }
    let meds = rss::medians(&rows, &|r| format!("{}{}", r["tool"], r["reverse"]), &|_| "kernel".into());
    assert_eq!(meds.len(), rows.len());
    assert!(meds.iter().all(|m| m["a_kib"].as_f64().is_some() && m["b_kib"].as_f64().is_some()), "{meds:?}");
    assert!(rss::table(&meds).lines().count() == rows.len() + 1);
    let _ = std::fs::remove_dir_all(&stats);
}

fn sockets(count: u64, nofile: Option<u64>) -> serde_json::Value {
    let dir = std::env::temp_dir().join(format!("eudp-sockbench-test-{}-{count}", std::process::id()));
    let args = sockbench::SocketsArgs { count, out_dir: Some(dir.clone()), lib: run::preload_lib().ok(), nofile };
    let (res, path) = sockbench::run(&args).expect("sockets bench");
    println!("{}", sockbench::table(&res));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path.expect("JSON written")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    v
}

#[test]
fn sockets_bench_small() {
    let n = 200;
    let v = sockets(n, None);
    assert_eq!(v["schema"], "eudp-bench-sockets/2");
    assert_eq!(v["count"], n);
    assert_eq!(v["nofile_limit"], sockbench::nofile_for(n));
    let runs = v["runs"].as_array().unwrap();
    let stacks: Vec<&str> = runs.iter().map(|r| r["stack"].as_str().unwrap()).collect();
    assert_eq!(stacks[..2], ["kernel", "eudp"]);
    assert!(stacks.len() == 2 || stacks[2..] == ["eudp-room"], "{stacks:?}");
    let k = &runs[0];
    assert_eq!(k["success"], true, "{k}");
    assert_eq!((k["opened"].as_u64(), k["answered"].as_u64()), (Some(n), Some(n)), "{k}");
    assert!(k["error"].is_null());
    assert!(k["peak_rss_kib"].as_u64().unwrap() > 0);
    // The program's own VmHWM before its last line agrees with what the
    // wrapper got at exit (the kernel syncs its RSS counters lazily, so the
    // two can differ by a little either way).
    let (hwm, peak) = (k["vmhwm_kib"].as_f64().unwrap(), k["peak_rss_kib"].as_f64().unwrap());
    assert!((hwm - peak).abs() <= 0.25 * peak, "{k}");
    // The sockets, the epoll set and stdin/out/err; nothing the caller leaked.
    assert_eq!(k["fds_in_use"].as_u64(), Some(n + 4), "{k}");
    assert!(k["open_secs"].as_f64().unwrap() > 0.0 && k["answer_secs"].as_f64().unwrap() > 0.0);
    assert_eq!(k["client"]["wrong"], 0);
    // With a hard limit well above the soft one, the shim has room for
    // every socket's descriptors above it: the engine carries them all.
    if let Some(room) = runs.iter().find(|r| r["stack"] == "eudp-room") {
        assert_eq!(room["success"], true, "{room}");
        if room["nofile_hard"].as_u64().unwrap() >= room["nofile_soft"].as_u64().unwrap() + 4 * n + 64 {
            assert_eq!(room["accelerated"].as_u64(), Some(n), "{room}");
        }
    }
    // The shim's run: whatever happened, said as it was.
    let e = &runs[1];
    assert_eq!(e["nofile_hard"], e["nofile_soft"]);
    if e["success"] == true {
        assert_eq!(e["answered"].as_u64(), Some(n));
        // Its stat report says how many sockets the engine carried.
        assert!(e["accelerated"].as_u64().is_some_and(|a| a <= n), "{e}");
        assert!(e["peak_rss_kib"].as_u64().unwrap() > 0);
        assert!(v["eudp_over_kernel"]["peak_rss_kib"].as_f64().unwrap() > 0.0);
    } else {
        assert!(!e["error"].as_str().unwrap_or("").is_empty(), "{e}");
        assert!(e["answered"].as_u64().unwrap() < n);
        assert!(v["eudp_over_kernel"]["open_secs"].is_null());
    }
}

#[test]
fn sockets_bench_reports_a_tight_limit_as_failure() {
    // 100 descriptors cannot hold 200 sockets, on any stack.
    let v = sockets(200, Some(100));
    assert_eq!(v["nofile_limit"], 100);
    for r in v["runs"].as_array().unwrap() {
        assert_eq!(r["success"], false, "{r}");
        assert!(r["opened"].as_u64().unwrap() < 100);
    }
    let k = &v["runs"][0];
    assert!(k["error"].as_str().unwrap().contains("Too many open files"), "{k}");
    assert!(k["fds_in_use"].as_u64().unwrap() <= 100);
    assert!(v["eudp_over_kernel"]["peak_rss_kib"].is_null());
}
