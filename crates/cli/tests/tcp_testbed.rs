//! The `tcp` (UDP over TCP) transport between the two testbed hosts, and
//! its benchmark against kernel UDP and eudp's kernel-UDP backend. Needs
//! root (network namespaces). Workers are this test binary re-executed in a
//! namespace (`tcp_worker_entry`), so nothing has to be wired into `eudp`.
//!
//! Bench: `cargo test --release -p eudp-cli --test tcp_testbed -- --ignored --nocapture tcp_bench`
//! (writes `bench/results/tcp-<unix time>.json`).

use eudp_cli::tcpbench::{self, Job, TcpMode, WorkerCmd};
use eudp_cli::testbed::{unique_name, Testbed};
use std::io::{BufRead, BufReader};
use std::time::Duration;

use eudp_cli::testbed::is_root;

fn testbed(prefix: &str) -> Option<Testbed> {
    if !is_root() {
        eprintln!("SKIPPED: the testbed needs root (CI runs as root)");
        return None;
    }
    Some(Testbed::up(&unique_name(prefix)).expect("testbed up"))
}

/// This binary, asked to run only the worker entry; job words follow.
fn me(env: &[(&str, &str)]) -> WorkerCmd {
    let mut e: Vec<(String, String)> = vec![("EUDP_TCP_WORKER".into(), "1".into())];
    e.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    WorkerCmd {
        program: std::env::current_exe().unwrap().display().to_string(),
        args: ["--exact", "tcp_worker_entry", "--nocapture", "--test-threads=1", "--quiet"].map(String::from).to_vec(),
        env: e,
    }
}

/// The worker, when re-executed by a test (a no-op otherwise).
#[test]
fn tcp_worker_entry() {
    if std::env::var("EUDP_TCP_WORKER").is_err() {
        return;
    }
    let words: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with("--") && a.contains('=')).collect();
    std::process::exit(tcpbench::worker_main(&words));
}

fn exact(tb: &Testbed, size: usize, count: u64) {
    let (s, r) = tcpbench::transfer(tb, &me(&[]), TcpMode::Tcp, size, 30.0, count, 16).expect("transfer");
    assert_eq!(s.datagrams, count);
    assert_eq!((r.corrupt, r.reordered), (0, 0), "{size} B: {r:?}");
    assert_eq!(r.datagrams, count, "{size} B lost datagrams: {r:?}");
    let tx = s.eudp.expect("sender stats");
    assert_eq!(tx["tcp"]["conns_opened"], 1, "{tx}");
    assert_eq!(tx["tcp"]["frames_sent"], count, "{tx}");
    assert_eq!(tx["queued_bytes"], 0, "{tx}");
    let rx = r.eudp.expect("receiver stats");
    assert_eq!(rx["tcp"]["conns_accepted"], 1, "{rx}");
    assert_eq!(rx["tcp"]["frames_received"], count, "{rx}");
}

#[test]
fn tcp_transport_is_exact_over_veth() {
    let Some(tb) = testbed("tcx") else { return };
    exact(&tb, 1472, 5000);
    exact(&tb, 65_507, 300);
    exact(&tb, 8, 3000);
}

#[test]
fn tcp_sender_before_receiver_over_veth() {
    // The sender starts while host b has no UOE listener: DML (a) keeps the
    // datagrams and retries; the receiver starts 700 ms later and gets all.
    let Some(tb) = testbed("tcl") else { return };
    let w = me(&[]);
    let count = 2000;
    let send = Job { role: "send".into(), mode: TcpMode::Tcp, addr: "198.18.0.2:9555".parse().unwrap(), size: 1472, secs: 30.0, count, pace_every: 16 };
    let mut tx = tb.command('a', &w.program);
    tx.args(&w.args).args(send.to_args()).envs(w.env.iter().map(|(k, v)| (k, v))).stdout(std::process::Stdio::piped());
    let tx = tx.spawn().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let recv = Job { role: "recv".into(), addr: "0.0.0.0:9555".parse().unwrap(), ..send.clone() };
    let mut rx = tb.command('b', &w.program);
    rx.args(&w.args).args(recv.to_args()).envs(w.env.iter().map(|(k, v)| (k, v))).stdout(std::process::Stdio::piped());
    let rx = rx.spawn().unwrap();
    let report = |c: std::process::Child| -> serde_json::Value {
        let out = c.wait_with_output().unwrap();
        let s = String::from_utf8_lossy(&out.stdout).to_string();
        let line = BufReader::new(s.as_bytes()).lines().map_while(Result::ok).filter(|l| l.starts_with('{')).last().expect("report");
        serde_json::from_str(&line).unwrap()
    };
    let s = report(tx);
    let r = report(rx);
    assert_eq!(s["datagrams"], count);
    assert_eq!(r["datagrams"], count, "receiver {r}\nsender {s}");
    assert!(s["eudp"]["tcp"]["connect_failures"].as_u64().unwrap() >= 1, "{s}");
    assert_eq!(r["corrupt"], 0);
}

#[test]
#[ignore = "benchmark: run with --release -- --ignored"]
fn tcp_bench() {
    let Some(tb) = testbed("tcb") else { return };
    let secs: f64 = std::env::var("TCP_BENCH_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(3.0);
    let reps: usize = std::env::var("TCP_BENCH_REPEATS").ok().and_then(|v| v.parse().ok()).unwrap_or(3);
    let extra: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("EUDP_")).collect();
    let mut w = me(&[]);
    w.env.extend(extra);
    let out = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/results");
    let (res, path) = tcpbench::bench(&tb, &w, 1472, secs, reps, out).expect("bench");
    println!("{}", tcpbench::table(&res));
    println!("wrote {path}");
}

/// A process whose `tcp` transport drops a datagram: its peer never
/// listens and the DML deadline runs out. Re-executed by
/// `stat_shows_uoe_counters` (a no-op otherwise); the counters file is
/// written at exit.
#[test]
fn uoe_stat_child_entry() {
    use eudp_engine::backend::tcp::TcpTransport;
    use eudp_engine::backend::Backend;
    let Ok(port) = std::env::var("EUDP_STAT_CHILD_PEER") else { return };
    let t = TcpTransport::global().expect("transport");
    let s = t.socket(false).unwrap();
    let dst = std::net::SocketAddr::new("127.0.0.1".parse().unwrap(), port.parse().unwrap());
    s.send_one(b"lost", Some(&dst)).unwrap();
    let t0 = std::time::Instant::now();
    while t.stats().drop_deadline == 0 && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn stat_shows_uoe_counters() {
    // No root needed: loopback only.
    let dir = std::env::temp_dir().join(format!("eudp-uoe-stat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port(); // closed again: refused
    let child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "uoe_stat_child_entry", "--nocapture", "--test-threads=1", "--quiet"])
        .env("EUDP_STAT_CHILD_PEER", port.to_string())
        .env("EUDP_STAT_DIR", &dir)
        .env("EUDP_TCP_PORT", port.to_string())
        .env("EUDP_TCP_LISTEN", "0")
        .env("EUDP_TCP_DEADLINE_MS", "100")
        .status()
        .unwrap();
    assert!(child.success());
    let reps = eudp_cli::run::read_reports(&dir, true, &[]);
    assert_eq!(reps.len(), 1, "{reps:?}");
    let tcp = &reps[0]["uoe"]["tcp"];
    assert_eq!((tcp["drop_deadline"].as_u64(), tcp["frames_sent"].as_u64()), (Some(1), Some(0)), "{tcp}");
    assert!(tcp["connect_failures"].as_u64() >= Some(1), "{tcp}");
    let text = eudp_cli::run::format_reports(&reps);
    assert!(text.contains("uoe: connections ") && text.contains("frames 0 sent"), "{text}");
    assert!(text.contains("uoe drops: deadline 1\n"), "{text}");
    assert!(text.contains("uoe refused/closed input: none"), "{text}");
    // Next to a shim report of the same process, the counters join it.
    let pid = reps[0]["pid"].as_u64().unwrap();
    std::fs::write(dir.join(format!("{pid}.json")), format!("{{\"pid\": {pid}, \"exe\": \"x\", \"sockets\": []}}")).unwrap();
    let reps = eudp_cli::run::read_reports(&dir, true, &[]);
    assert_eq!((reps.len(), reps[0]["exe"].as_str(), reps[0]["uoe"]["tcp"]["drop_deadline"].as_u64()), (1, Some("x"), Some(1)));
    let _ = std::fs::remove_dir_all(&dir);
}
