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
    let send = Job {
        role: "send".into(),
        mode: TcpMode::Tcp,
        addr: "198.18.0.2:9555".parse().unwrap(),
        size: 1472,
        secs: 30.0,
        count,
        pace_every: 16,
    };
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
        let line = BufReader::new(s.as_bytes())
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.starts_with('{'))
            .last()
            .expect("report");
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
        // The process-wide transport would send to the refusing peer as
        // plain UDP (DML (c)); this test is about the deadline drop.
        .env("EUDP_TCP_DML", "queue")
        .status()
        .unwrap();
    assert!(child.success());
    let reps = eudp_cli::stat_report::read_reports(&dir, true, &[]);
    assert_eq!(reps.len(), 1, "{reps:?}");
    let tcp = &reps[0]["uoe"]["tcp"];
    assert_eq!((tcp["drop_deadline"].as_u64(), tcp["frames_sent"].as_u64()), (Some(1), Some(0)), "{tcp}");
    assert!(tcp["connect_failures"].as_u64() >= Some(1), "{tcp}");
    let text = eudp_cli::stat_report::format_reports(&reps);
    assert!(text.contains("uoe: connections ") && text.contains("frames 0 sent"), "{text}");
    assert!(text.contains("uoe drops: deadline 1\n"), "{text}");
    assert!(text.contains("uoe refused/closed input: none"), "{text}");
    // Next to a shim report of the same process, the counters join it.
    let pid = reps[0]["pid"].as_u64().unwrap();
    let start = reps[0]["start_ticks"].as_u64().expect("start time in the file name");
    std::fs::write(
        dir.join(format!("{pid}-{start}.json")),
        format!("{{\"pid\": {pid}, \"exe\": \"x\", \"sockets\": []}}"),
    )
    .unwrap();
    let reps = eudp_cli::stat_report::read_reports(&dir, true, &[]);
    assert_eq!(
        (reps.len(), reps[0]["exe"].as_str(), reps[0]["uoe"]["tcp"]["drop_deadline"].as_u64()),
        (1, Some("x"), Some(1))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- loopback (no root): what unmodified programs need of the transport ----

/// Two `tcp` hosts on their own 127.0.0.x addresses, on a port free on both.
fn uoe_hosts(
    a: &str,
    b: &str,
) -> (eudp_engine::backend::tcp::TcpTransport, eudp_engine::backend::tcp::TcpTransport, u16) {
    use eudp_engine::backend::tcp::{Dml, TcpConfig, TcpTransport};
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let cfg =
            |ip: &str| TcpConfig { port, bind_ip: Some(ip.parse().unwrap()), dml: Dml::Udp, ..TcpConfig::default() };
        if let (Ok(x), Ok(y)) = (TcpTransport::start(cfg(a)), TcpTransport::start(cfg(b))) {
            return (x, y, port);
        }
    }
}

fn uoe_ep(
    t: &eudp_engine::backend::tcp::TcpTransport,
    e: &eudp_engine::Engine,
    addr: &str,
    reuse: bool,
) -> eudp_engine::Endpoint {
    let ep = t.endpoint(e, false).unwrap();
    if reuse {
        ep.backend().set_option(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).unwrap();
    }
    ep.bind_to(addr.parse().unwrap()).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    ep
}

/// A UDP server that connects one socket per client and keeps an
/// unconnected one on the same port for the next (iperf3 does this per
/// stream): each frame goes to the socket the kernel would pick. The code
/// before the fix gave every frame to the first socket, which dropped the
/// second client's as from the wrong peer (iperf3 `--bidir`/`-P 4` hung).
#[test]
fn frames_reach_the_socket_the_kernel_would_pick() {
    let (a, b, _) = uoe_hosts("127.0.0.41", "127.0.0.42");
    let e = eudp_engine::Engine::start(eudp_engine::Config::default()).unwrap();
    let (c1, c2) = (uoe_ep(&a, &e, "127.0.0.41:0", false), uoe_ep(&a, &e, "127.0.0.41:0", false));
    let conn = uoe_ep(&b, &e, "127.0.0.42:0", true);
    let srv = conn.local_addr().unwrap();
    conn.connect(c1.local_addr().unwrap()).unwrap();
    let next = uoe_ep(&b, &e, &srv.to_string(), true);
    for i in 0..50u8 {
        c2.send_to(&[2, i], srv).unwrap();
        c1.send_to(&[1, i], srv).unwrap();
    }
    let mut buf = [0u8; 16];
    for i in 0..50u8 {
        let (n, from) = next.recv_from(&mut buf).expect("the unconnected socket gets the other client's datagrams");
        assert_eq!((&buf[..n], from), (&[2, i][..], c2.local_addr().unwrap()));
        let (n, from) = conn.recv_from(&mut buf).expect("the connected socket gets its peer's");
        assert_eq!((&buf[..n], from), (&[1, i][..], c1.local_addr().unwrap()));
    }
    assert_eq!(b.stats().drop_filtered, 0, "{:?}", b.stats());
}

/// DML (c): a host with no UOE (a program on kernel UDP) gets plain UDP
/// from the endpoint's own port, in order, and its answers come back
/// through the endpoint's kernel socket.
#[test]
fn a_host_without_a_uoe_is_sent_plain_udp() {
    let (a, _b, _) = uoe_hosts("127.0.0.43", "127.0.0.44");
    let e = eudp_engine::Engine::start(eudp_engine::Config::default()).unwrap();
    let ep = uoe_ep(&a, &e, "127.0.0.43:0", false);
    let plain = std::net::UdpSocket::bind("127.0.0.45:0").unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let to = plain.local_addr().unwrap();
    for i in 0..200u16 {
        ep.send_to(&i.to_be_bytes(), to).unwrap();
    }
    let mut buf = [0u8; 16];
    for i in 0..200u16 {
        let (n, from) = plain.recv_from(&mut buf).expect("plain UDP from the endpoint");
        assert_eq!((&buf[..n], from), (&i.to_be_bytes()[..], ep.local_addr().unwrap()));
        plain.send_to(&buf[..n], from).unwrap();
        let (n, src) = ep.recv_from(&mut buf).expect("the answer");
        assert_eq!((&buf[..n], src), (&i.to_be_bytes()[..], to));
    }
    let s = a.stats();
    assert_eq!((s.plain_sent, s.plain_lost, s.frames_sent), (200, 0, 0), "{s:?}");
}
