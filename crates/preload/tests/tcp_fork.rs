//! Fork under the TCP transport (`tests/c/tcp_fork.c`): a fork child gives
//! up its parent's transport descriptors at once, while it still runs,
//! and starts a transport of its own for its own sockets.
//!
//! * `lane`: the test's listener stands in for the peer host's UOE. Once
//!   the parent has exited, its connection must end (EOF) while its child
//!   still waits; before, the child held the connection open until it
//!   exited. The child's later datagram then comes on a new connection.
//! * `listen`: once the parent has exited, its pre-decided port must be
//!   free for another process while the child still waits; before, the
//!   child held the listening socket. The child then talks to itself over
//!   a transport of its own (which takes the port).
//! * `exec`: the program a child executes holds no socket or epoll set of
//!   the transport (all close-on-exec).
//! * `race`: a fork while another thread starts the transport and then
//!   talks to itself: both processes must keep working transports.
//! * `relay`: a listening parent whose child connected to it first must
//!   not send its own datagrams through that child.
//! * `holderexit`: a child holding the port ends while its parent's
//!   datagrams to itself still sit in the child's connections.

mod common;
use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the child waits before using the network itself; every check
/// on what it holds happens well within it.
const CHILD_WAIT_MS: u64 = 3000;

fn result_path(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("eudp-tcp-fork-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

/// The program under the shim with the TCP transport on `port`.
fn uoe(exe: &Path, port: u16) -> Command {
    let mut c = Command::new(exe);
    c.env("LD_PRELOAD", lib()).env("EUDP_TRANSPORT", "tcp").env("EUDP_TCP_PORT", port.to_string());
    c
}

/// Starts the program under the shim with the TCP transport on `port`;
/// returns the parent process and the child's pid (its first line).
fn start(exe: &Path, port: u16, args: &[String]) -> (Child, u32) {
    let mut parent = uoe(exe, port).args(args).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(parent.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let pid = line.trim().parse().unwrap_or_else(|_| panic!("no child pid: {line:?}"));
    (parent, pid)
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

/// The child's verdict (bounded wait).
fn child_result(path: &Path) -> String {
    let end = Instant::now() + Duration::from_millis(CHILD_WAIT_MS) + Duration::from_secs(10);
    while Instant::now() < end {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return s.trim().to_string();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    "no result from the child".into()
}

/// Reads `conn` until `needle` has been seen (bounded).
fn read_until(conn: &mut TcpStream, needle: &[u8]) -> bool {
    conn.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
        if got.windows(needle.len()).any(|w| w == needle) {
            return true;
        }
    }
    false
}

/// Accepts one connection (bounded) and answers its hello as a UOE would.
fn accept(l: &TcpListener) -> TcpStream {
    l.set_nonblocking(true).unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        match l.accept() {
            Ok((mut c, _)) => {
                c.set_nonblocking(false).unwrap();
                // The hello of lane 0 (eudp_wire::uot): magic, version 2, lane, 0, 0.
                c.write_all(b"EUT1\x02\x00\x00\x00").unwrap();
                return c;
            }
            Err(_) if Instant::now() < end => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => panic!("no connection: {e}"),
        }
    }
}

fn kill(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

#[test]
fn a_fork_child_lets_the_parents_connection_end() {
    let exe = cc("tcp_fork", &[]);
    let port = uoe_port();
    let uoe = TcpListener::bind(("127.0.0.1", port)).unwrap();
    let res = result_path("lane");
    let (mut parent, child) =
        start(&exe, port, &["lane".into(), "5555".into(), CHILD_WAIT_MS.to_string(), res.display().to_string()]);
    let mut conn = accept(&uoe);
    assert!(read_until(&mut conn, b"parent"), "the parent's datagram did not arrive");
    assert!(parent.wait().unwrap().success());
    // The parent is gone: its connection must end now, not when the child
    // does (FIN, or RST when our hello was still unread at its exit).
    conn.set_read_timeout(Some(Duration::from_millis(1000))).unwrap();
    let mut buf = [0u8; 256];
    let eof = loop {
        match conn.read(&mut buf) {
            Ok(0) => break Ok(()),
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break Ok(()),
            Err(e) => break Err(e),
        }
    };
    let child_alive = alive(child) && !res.exists();
    if eof.is_err() {
        kill(child);
    }
    assert!(
        eof.is_ok(),
        "no end (EOF/RST) of the parent's connection within 1 s of its exit while its child lives: {eof:?}"
    );
    assert!(child_alive, "the child ended before the check (it waits {CHILD_WAIT_MS} ms)");
    // The child's own datagram: a new connection from its own transport.
    let mut conn2 = accept(&uoe);
    assert!(read_until(&mut conn2, b"child"), "the child's datagram did not arrive");
    assert_eq!(child_result(&res), "child ok");
    let _ = std::fs::remove_file(&res);
}

#[test]
fn a_fork_child_lets_the_listening_port_go() {
    let exe = cc("tcp_fork", &[]);
    let port = uoe_port();
    let res = result_path("listen");
    let (mut parent, child) =
        start(&exe, port, &["listen".into(), CHILD_WAIT_MS.to_string(), res.display().to_string()]);
    assert!(parent.wait().unwrap().success());
    // Another process may listen on the port now (as the transport binds it).
    let end = Instant::now() + Duration::from_millis(1000);
    let bound = loop {
        match TcpListener::bind(("::", port)) {
            Ok(l) => break Ok(l),
            Err(e) if Instant::now() >= end => break Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    let child_alive = alive(child) && !res.exists();
    if bound.is_err() {
        kill(child);
    }
    assert!(bound.is_ok(), "port {port} still taken 1 s after the parent exited, while its child lives: {bound:?}");
    assert!(child_alive, "the child ended before the check (it waits {CHILD_WAIT_MS} ms)");
    drop(bound);
    assert_eq!(child_result(&res), "child ok");
    let _ = std::fs::remove_file(&res);
}

#[test]
fn an_executed_program_holds_no_transport_descriptor() {
    let exe = cc("tcp_fork", &[]);
    let res = result_path("exec");
    let st = uoe(&exe, uoe_port()).args(["exec", &res.display().to_string()]).status().unwrap();
    assert!(st.success());
    let fds = std::fs::read_to_string(&res).unwrap();
    let held: Vec<&str> = fds.lines().filter(|l| l.contains("socket:") || l.contains("anon_inode:")).collect();
    assert!(fds.lines().any(|l| l.contains("/proc/")), "no listing: {fds}");
    assert!(held.is_empty(), "inherited across exec: {held:?}\n{fds}");
    let _ = std::fs::remove_file(&res);
}

/// A fork while another thread's first datagram starts the transport: the
/// child must neither hang on state the other thread held (the start lock,
/// the log's stderr) nor take the parent's half-started transport for its
/// own. The parent's thread must get each of its own 50 datagrams: a child
/// forked around the parent's start must not listen on the port first and
/// take the parent's connection to itself, and a child's connection to the
/// parent's listener must not become the parent's lane to its own host
/// ([`a_listening_parent_does_not_send_to_itself_through_its_child`]).
/// Each run is a new process (one start per process); 100 runs, bounded to
/// 150 s.
#[test]
fn a_fork_during_the_transports_start_leaves_both_processes_a_working_one() {
    let exe = cc("tcp_fork", &[]);
    let mut failed = Vec::new();
    let end = Instant::now() + Duration::from_secs(150);
    let mut runs = 0;
    for i in 0..100u32 {
        if Instant::now() >= end {
            break;
        }
        runs += 1;
        let delay = (i % 20) * 100; // µs between the thread's start and the fork
        let out = Command::new("timeout")
            .args(["30", &exe.display().to_string(), "race", &delay.to_string()])
            .env("LD_PRELOAD", lib())
            .env("EUDP_TRANSPORT", "tcp")
            .env("EUDP_TCP_PORT", uoe_port().to_string())
            .output()
            .unwrap();
        if !out.status.success() {
            let who = match out.status.code() {
                Some(1) => "the child failed",
                Some(4) => "the parent's thread lost a datagram",
                Some(5) => "the child failed and the parent's thread lost a datagram",
                _ => "failed",
            };
            failed.push(format!(
                "run {i}, delay {delay} µs: {who} ({}) {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    assert!(runs >= 20, "only {runs} runs in the time bound");
    assert!(failed.is_empty(), "{} of {runs} runs failed:\n{}", failed.len(), failed.join("\n"));
}

/// Runs `tcp_fork MODE ARGS` under the shim `times` times (a new port
/// each); the failures, with their exit status and stderr.
fn runs_of(mode: &str, args: &[&str], times: usize) -> Vec<String> {
    let exe = cc("tcp_fork", &[]);
    (0..times)
        .filter_map(|i| {
            let out = Command::new("timeout")
                .args(["30", &exe.display().to_string(), mode])
                .args(args)
                .env("LD_PRELOAD", lib())
                .env("EUDP_TRANSPORT", "tcp")
                .env("EUDP_TCP_PORT", uoe_port().to_string())
                .output()
                .unwrap();
            (!out.status.success())
                .then(|| format!("run {i}: {} {}", out.status, String::from_utf8_lossy(&out.stderr).trim()))
        })
        .collect()
}

/// A listening parent whose fork child connected to it before the parent
/// had sent anything (the child's first datagram, to itself, goes to the
/// parent's listener): the parent's datagrams to itself must not depend on
/// that child. The child is stopped (SIGSTOP) before the parent sends
/// itself 5 datagrams, each to arrive within 1 s. Before, the parent took
/// the child's connection as its lane to its own host, so they went to the
/// stopped child (5 of 5 runs failed; had the child ended instead, they
/// were lost): the race case's loss, without the race.
#[test]
fn a_listening_parent_does_not_send_to_itself_through_its_child() {
    let failed = runs_of("relay", &[], 5);
    assert!(failed.is_empty(), "{} of 5 runs failed:\n{}", failed.len(), failed.join("\n"));
}

/// A thread asleep in a receive on the transport when a fork moves its
/// socket to the kernel path: the next datagram (the parent's send is
/// plain UDP now) must reach it within 1 s. This order passes on the
/// library before `Endpoint::stop_receiving` woke such receivers too (the
/// transport still carried that datagram to the endpoint's queue); the
/// order that hung, a receiver left polling the endpoint's queue while its
/// datagram went to the kernel socket, is the race test's (about one race
/// in 1000 with the fast first adoption before, none in 8000 after).
#[test]
fn a_receiver_asleep_at_a_fork_gets_the_next_datagram() {
    let failed = runs_of("blockedfork", &[], 5);
    assert!(failed.is_empty(), "{} of 5 runs failed:\n{}", failed.len(), failed.join("\n"));
}

/// A process that ends while it holds the port hands over what its
/// connections still carry for other processes' ports. The child takes
/// the port (its parent has no transport yet); the parent's transport,
/// started then, finds the port held, so its datagrams to itself go
/// through the child's listener and hand-over; the parent sends itself
/// 200 at once as the child calls `_exit`, and must get all of them.
/// Before, what sat unread in the child's connections when it ended was
/// lost without a trace (in 6 of 6 runs, 1 to all 200 of them).
#[test]
fn a_listener_that_ends_hands_over_what_its_connections_still_carry() {
    let failed = runs_of("holderexit", &["200"], 5);
    assert!(failed.is_empty(), "{} of 5 runs failed:\n{}", failed.len(), failed.join("\n"));
}

/// The pid (of `pids`) whose socket listens on TCP `port`, if any.
fn listener_owner(port: u16, pids: &[u32]) -> Option<u32> {
    let mut socks = Vec::new();
    for path in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for l in std::fs::read_to_string(path).unwrap_or_default().lines().skip(1) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let p = f.get(1).and_then(|a| a.rsplit_once(':')).and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            if f.len() > 9 && f[3] == "0A" && p == Some(port) {
                socks.push(format!("socket:[{}]", f[9]));
            }
        }
    }
    pids.iter().copied().find(|pid| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| std::fs::read_link(e.path()).is_ok_and(|t| socks.iter().any(|s| t.to_str() == Some(s))))
    })
}

/// Waits (bounded) until `f` holds; how long it took.
fn within(limit: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if f() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    None
}

/// Child processes killed when the test ends, however it ends.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A transport counter from `<pid>-<start>.tcp.json` in `dir` (0: not written yet).
fn uoe_counter(dir: &Path, pid: u32, name: &str) -> u64 {
    eudp_engine::stat_dir::files_of(dir, pid.into(), true)
        .pop()
        .and_then(|p| std::fs::read_to_string(p).ok())
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|j| j["tcp"][name].as_u64())
        .unwrap_or(0)
}

/// `tcp_fork recv PORT` under the shim; its output lines arrive on
/// the returned channel (after its "ready").
fn receiver(exe: &Path, port: u16, udp_port: u16, stats: &Path) -> (Child, std::sync::mpsc::Receiver<String>) {
    let mut c = uoe(exe, port)
        .args(["recv", &udp_port.to_string()])
        .env("EUDP_STAT_DIR", stats)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in out.lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    (c, rx)
}

/// A process that could not listen (another UOE process held the port)
/// takes the port once that process is gone. A listens; B, on the same
/// transport port with another UDP port, runs without a listener; a peer
/// process (send-only) sends to B's port: A hands it over to B's kernel
/// socket. A is killed: B must listen within the retry bound (1 s, plus
/// slack here) and get the peer's later datagrams over its own
/// connections. Before, B never listened: the peer was refused and its
/// datagrams waited in its queue until the DML deadline dropped them.
#[test]
fn a_process_without_a_listener_takes_the_port_when_its_holder_ends() {
    let exe = cc("tcp_fork", &[]);
    let port = uoe_port();
    let (ua, ub) = (uoe_port(), uoe_port());
    let stats = stat_dir("relisten");
    let (a, _arx) = receiver(&exe, port, ua, &stats);
    let mut procs = Procs(vec![a]);
    let pa = procs.0[0].id();
    assert!(
        within(Duration::from_secs(3), || listener_owner(port, &[pa]) == Some(pa)).is_some(),
        "A does not listen on {port}"
    );
    let (b, brx) = receiver(&exe, port, ub, &stats);
    procs.0.push(b);
    let pb = procs.0[1].id();
    let mut peer = uoe(&exe, port)
        .args(["send", &ub.to_string()])
        .env("EUDP_TCP_LISTEN", "0")
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let mut to_peer = peer.stdin.take().unwrap();
    procs.0.push(peer);
    let got = |want: &str, limit: Duration| {
        let end = Instant::now() + limit;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            match brx.recv_timeout(left) {
                Ok(l) if l == format!("got {want}") => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
        false
    };
    writeln!(to_peer, "before").unwrap();
    assert!(got("before", Duration::from_secs(5)), "B did not get the peer's datagram through A's hand-over");
    assert_eq!(listener_owner(port, &[pa, pb]), Some(pa));
    assert!(
        within(Duration::from_secs(3), || uoe_counter(&stats, pa, "forwarded_kernel") >= 1).is_some(),
        "A's forwarded_kernel stayed 0"
    );
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    let took = within(Duration::from_secs(3), || listener_owner(port, &[pb]) == Some(pb));
    assert!(
        took.is_some_and(|t| t <= Duration::from_millis(1500)),
        "B did not listen on {port} within 1.5 s of A's end: {took:?}"
    );
    eprintln!("B listens {:?} after A's end", took.unwrap());
    // The peer's connection to A is gone; its next datagrams go to B's listener.
    let mut delivered = false;
    for i in 0..30 {
        writeln!(to_peer, "after {i}").unwrap();
        if got(&format!("after {i}"), Duration::from_millis(200)) {
            delivered = true;
            break;
        }
    }
    assert!(delivered, "the peer's datagrams to B were not delivered after A's end");
    writeln!(to_peer, "last").unwrap();
    assert!(got("last", Duration::from_secs(3)), "the peer's last datagram to B was not delivered");
    let counted = within(Duration::from_secs(3), || {
        uoe_counter(&stats, pb, "conns_accepted") >= 1
            && uoe_counter(&stats, pb, "frames_received") >= 1
            && uoe_counter(&stats, pb, "listen_takeovers") == 1
    });
    assert!(
        counted.is_some(),
        "B's counters: conns_accepted {}, frames_received {}, listen_takeovers {}",
        uoe_counter(&stats, pb, "conns_accepted"),
        uoe_counter(&stats, pb, "frames_received"),
        uoe_counter(&stats, pb, "listen_takeovers")
    );
    drop(to_peer);
    drop(procs);
    let _ = std::fs::remove_dir_all(&stats);
}

/// A parent that starts its transport later than its fork child's wait
/// for it (50 ms): the child, which listened meanwhile, gives the port
/// back while it runs, and the parent keeps it after the child's end.
/// Before, the parent never listened: while the child lived its datagrams
/// to itself went through the child, and after the child's end they were
/// refused and dropped by the DML deadline (exit status bit 4).
#[test]
fn a_parent_slower_than_its_childs_wait_gets_the_port_back() {
    let exe = cc("tcp_fork", &[]);
    let port = uoe_port();
    let mut parent = uoe(&exe, port)
        .args(["slowparent", "300", "3000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pp = parent.id();
    let mut out = BufReader::new(parent.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let child: u32 = line.trim().parse().unwrap_or_else(|_| panic!("no child pid: {line:?}"));
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "bound");
    let back = within(Duration::from_secs(2), || listener_owner(port, &[pp, child]) == Some(pp));
    let child_alive = alive(child);
    let owner = listener_owner(port, &[pp, child]);
    if back.is_none() {
        kill(child);
    }
    let st = parent.wait().unwrap();
    assert!(
        back.is_some(),
        "the parent did not get its port back within 2 s (listener: {owner:?}, parent {pp}, child {child})"
    );
    assert!(child_alive, "the child ended before the check");
    assert!(st.success(), "parent: {st} (bit 1: the child failed, bit 4: a datagram to itself was lost)");
}
