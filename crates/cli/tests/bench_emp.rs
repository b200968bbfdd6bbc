//! `eudp bench --emp` in a short run: the JSON holds every row, the
//! baselines succeed, each row carries both sides' peak RSS, and targets
//! and best schemes are judged. EMP rows may be errors only while the EMP
//! worker subcommand does not exist. Structure only, never timings.

use eudp_cli::testbed::is_root;
use serde_json::Value;
use std::process::Command;

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");

/// The error of an EMP row run by a build without `eudp worker emp`.
fn worker_missing(e: &str) -> bool {
    e.contains("unrecognized subcommand 'emp'")
}

#[test]
fn bench_emp_writes_every_row() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let dir = std::env::temp_dir().join(format!("eudp-bench-emp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let out = Command::new(EUDP)
        .args(["bench", "--emp", "--secs", "0.5", "--out"])
        .arg(&dir)
        .output()
        .expect("eudp bench --emp");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("targets:") && stdout.contains("paper: ro"), "{stdout}");
    let file = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().unwrap().to_string_lossy().starts_with("emp-"))
        .expect("emp-<time>.json");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(v["schema"], "eudp-bench-emp/1");
    let rows = v["rows"].as_array().expect("rows");
    let row = |stack: &str, pattern: &str, size: u64, topology: &str, loss: Option<u64>| {
        rows.iter()
            .find(|r| {
                r["stack"] == stack
                    && r["pattern"] == pattern
                    && r["size"] == size
                    && r["topology"] == topology
                    && r["loss_pct"].as_u64() == loss
            })
            .unwrap_or_else(|| panic!("no row {stack} {pattern} {size} {topology} {loss:?}"))
    };
    let baselines = [
        row("kernel-udp", "pingpong", 10, "testbed", None),
        row("kernel-tcp", "stream", 16384, "testbed", None),
        row("kernel-tcp", "pingpong", 10, "testbed", None),
        row("libfabric-rxd", "pingpong", 10, "testbed", None),
        row("libfabric-rxd", "pingpong", 16384, "testbed", None),
    ];
    for r in baselines {
        assert_eq!(r["ok"], true, "baseline row failed: {r}");
        assert!(r["client_peak_rss_kib"].as_u64() > Some(0) && r["server_peak_rss_kib"].as_u64() > Some(0), "{r}");
    }
    assert!(baselines[0]["result"]["lat_ns"]["p50"].as_u64() > Some(0));
    assert!(baselines[1]["result"]["mbit_s"].as_f64() > Some(0.0));
    assert_eq!(baselines[1]["result"]["errors"], 0);
    assert_eq!(baselines[1]["server"]["corrupt"], 0);
    assert!(baselines[2]["result"]["lat_ns"]["p99"].as_u64() > Some(0));
    assert!(baselines[3]["result"]["rtt_ns"].as_f64() > Some(0.0), "{}", baselines[3]);
    assert!(baselines[4]["result"]["mb_s"].as_f64() > Some(0.0), "{}", baselines[4]);
    assert!(v["loadavg_before"].as_str().is_some_and(|l| !l.is_empty()), "{}", v["loadavg_before"]);
    assert!(v["loadavg_after"].as_str().is_some_and(|l| !l.is_empty()));
    // System calls per message, counted with strace on both sides.
    for stack in ["kernel-udp", "emp"] {
        let r = row(stack, "pingpong", 10, "testbed-strace", None);
        if stack == "emp" && r["error"].as_str().is_some_and(worker_missing) {
            continue;
        }
        assert_eq!(r["ok"], true, "strace row failed: {r}");
        for side in ["client", "server"] {
            assert!(r[format!("{side}_syscalls_per_message")].as_f64() > Some(0.0), "{r}");
            assert!(r[format!("{side}_syscalls")]["total"].as_u64() > Some(0), "{r}");
        }
    }
    let emp = [
        row("emp", "pingpong", 10, "testbed", None),
        row("emp", "stream", 16384, "testbed", None),
        row("emp", "bidir", 16384, "testbed", None),
        row("emp", "stream", 16384, "impair", Some(0)),
        row("emp", "stream", 16384, "impair", Some(1)),
    ];
    for r in emp {
        assert_eq!(r["scheme"], "base");
        if let Some(e) = r["error"].as_str() {
            assert!(worker_missing(e), "EMP row failed: {r}");
            continue;
        }
        let res = &r["result"];
        assert!(res["messages"].as_u64() > Some(0), "{r}");
        assert!(res["counters"]["frames_sent"].as_u64() > Some(0), "{r}");
        assert!(r["client_peak_rss_kib"].as_u64() > Some(0), "{r}");
        if r["pattern"] == "pingpong" {
            assert!(res["lat_ns"]["p50"].as_u64() > Some(0), "{r}");
        } else {
            assert!(res["mbit_s"].as_f64() > Some(0.0), "{r}");
            assert_eq!(r["server"]["corrupt"], 0, "{r}");
        }
        if r["pattern"] == "stream" {
            assert_eq!(res["errors"], 0, "{r}");
        }
    }
    let targets = v["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), 4, "{targets:?}");
    for t in targets {
        assert!(["pass", "miss", "n/a"].contains(&t["result"].as_str().unwrap_or("")), "{t}");
    }
    assert_eq!(v["best"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["relay"]["ended_by"], "signal", "{}", v["relay"]);
}
