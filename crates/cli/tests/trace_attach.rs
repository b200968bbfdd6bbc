//! `eudp trace --attach PID`: a Python program already running under
//! `eudp run` (loopback, sending to a socket of its own) is traced for a
//! second and charted like a traced PROGRAM: every layer of every traced
//! datagram, the Perfetto file valid; the program keeps running and ends
//! normally. Also sampled, and an error for a pid that runs no eudp.

use eudp_cli::trace as trace_cmd;
use eudp_trace::{perfetto, resolve};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");

const PROGRAM: &str = r#"
import socket, sys, time
rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
rx.bind(("127.0.0.1", 0))
tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
end = time.time() + float(sys.argv[1])
n = 0
while time.time() < end:
    tx.sendto(n.to_bytes(8, "little") + b"x" * 56, rx.getsockname())
    rx.recv(2048)
    n += 1
    time.sleep(0.001)
print("sent", n)
"#;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eudp-trace-attach-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The program under `eudp run`, its stats in `stats`; returns once its
/// stats report exists (its shim is up).
fn start(stats: &Path, secs: u32) -> Child {
    let child = Command::new(EUDP)
        .args(["run", "--", "python3", "-c", PROGRAM, &secs.to_string()])
        .env("EUDP_STAT_DIR", stats)
        .env("EUDP_STAT_MS", "200")
        .stdout(Stdio::piped())
        .spawn()
        .expect("eudp run");
    let t0 = Instant::now();
    while eudp_engine::stat_dir::files_of(stats, u64::from(child.id()), false).is_empty() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no stats report from the program");
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}

fn attach(stats: &Path, out: &Path, pid: u32, extra: &[&str]) -> i32 {
    std::env::set_var("EUDP_STAT_DIR", stats);
    let mut args: Vec<String> = vec!["--attach".into(), pid.to_string(), "--for".into(), "1".into()];
    args.extend(["--out".into(), out.display().to_string()]);
    args.extend(["--perfetto".into(), out.join("p.json").display().to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    trace_cmd::trace_main(&args)
}

fn finished(child: Child) {
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "the program failed: {}", o.status);
    assert!(String::from_utf8_lossy(&o.stdout).contains("sent "));
}

fn check(out: &Path, sample: u64) -> usize {
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("trace.json")).unwrap()).unwrap();
    assert_eq!(json["problems"].as_array().unwrap().len(), 0, "{}", json["problems"]);
    let recs = json["records"].as_array().unwrap();
    let layers = resolve::layers_of("eudp");
    let n = recs.iter().filter(|r| r["layer"] == "app.send").count();
    for l in &layers {
        assert_eq!(recs.iter().filter(|r| r["layer"] == l.name).count(), n, "layer {}", l.name);
    }
    assert!(recs.iter().all(|r| eudp_engine::tracepoint::is_sampled(r["packet"].as_u64().unwrap(), sample)));
    let traced = json["runs"][0]["layers"][0]["packets"].as_u64().unwrap() as usize;
    let pf: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(out.join("p.json")).unwrap()).unwrap();
    let c = perfetto::check(&pf).unwrap();
    assert_eq!(c.slices.values().sum::<usize>(), recs.len());
    traced
}

// The window opens when no datagram is between its send and its receive,
// so sends and receives pair from the first datagram on; the program sends
// one datagram a millisecond, so such moments come often.
#[test]
fn attach_traces_a_running_program_for_a_while() {
    let stats = dir("stats");
    let child = start(&stats, 6);
    let pid = child.id();
    let out = dir("full");
    assert_eq!(attach(&stats, &out, pid, &["--packets", "20"]), 0);
    // About one datagram a millisecond for a second (a loaded machine sends fewer).
    let traced = check(&out, 1);
    assert!(traced >= 50, "{traced} datagrams traced");
    // Again, sampled: the same process, a second window.
    let out2 = dir("sampled");
    assert_eq!(attach(&stats, &out2, pid, &["--sample", "4", "--packets", "5"]), 0);
    let sampled = check(&out2, 4);
    assert!(sampled >= 10, "{sampled} datagrams traced");
    finished(child);
    // A process that runs no eudp has no stats report to answer through.
    assert_eq!(attach(&stats, &dir("none"), std::process::id(), &[]), 1);
    for d in [stats, out, out2] {
        let _ = std::fs::remove_dir_all(d);
    }
}
