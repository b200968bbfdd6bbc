//! One engine thread serves every endpoint of a process: a socket whose
//! kernel send buffer stays full must not hold up the others. On the netns
//! testbed, host `a`'s veth gets a 40 kbit/s token bucket and a small
//! SO_SNDBUF keeps a "slow" endpoint's socket full (loopback frees a
//! datagram's buffer as it is delivered, so only a link that holds packets
//! makes a UDP send wait). Meanwhile a "free" endpoint of the same engine
//! sends over host `a`'s loopback: each of its datagrams must arrive well
//! within a second of its send, while the slow one's queue takes seconds
//! to drain. Then the link is made fast, and the slow endpoint's datagrams
//! must all reach host `b`, in order. Needs root and the `eudp` binary
//! (`cargo build --release -p eudp-cli`); skipped without them.

use eudp_engine::{Config, Endpoint, Engine, SendFlags};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "EUDP_SEND_ROOM_CHILD";
const SLOW_PORT: u16 = 5391;
const SLOW_LEN: usize = 1000;
const FREE: usize = 200;
/// Far above what a free socket's datagram needs (well under 10 ms when
/// the engine does not wait on the slow socket) and far below what it
/// waited before (seconds: the engine drained the slow socket's batch at
/// the link's rate first).
const BOUND: Duration = Duration::from_secs(1);
/// The CPU the sending half and every `tc` change run on. A veth passes
/// what its queue releases to the receiving side through the backlog of the
/// CPU that released it, and two CPUs' backlogs are served independently:
/// datagrams released on two CPUs (the sender's, and `tc`'s when the link
/// is made fast) could reach host b out of the order the engine sent them
/// in. On one CPU, what host b sees is the engine's order.
const PATH_CPU: &str = "0";

struct Testbed {
    eudp: PathBuf,
    name: String,
}

impl Testbed {
    fn up(tag: &str) -> Option<Testbed> {
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false);
        // target/<profile>/deps/send_room-… -> target/<profile>/eudp
        let exe = std::env::current_exe().unwrap();
        let eudp = exe.parent().and_then(|d| d.parent()).unwrap().join("eudp");
        if !root || !eudp.exists() {
            eprintln!("SKIPPED: needs root and {}", eudp.display());
            return None;
        }
        let name = format!("{tag}{:x}", std::process::id() & 0xfffff);
        let st = Command::new(&eudp).args(["testbed", "up", &name]).status().unwrap();
        assert!(st.success(), "testbed up");
        Some(Testbed { eudp, name })
    }

    fn ns(&self, host: char) -> String {
        format!("eudp-{}-{host}", self.name)
    }

    /// Host `a`'s veth at `rate`: a token bucket whose queue (1 MB) holds
    /// what it has not sent yet, charged to the sending socket meanwhile.
    /// `tc` runs on [`PATH_CPU`], as the sending half does.
    fn link_rate(&self, rate: &str, replace: bool) {
        let dev = format!("eu{}a", self.name);
        let verb = if replace { "change" } else { "add" };
        if !replace {
            let _ = Command::new("ip")
                .args(["netns", "exec", &self.ns('a'), "tc", "qdisc", "del", "dev", &dev, "root"])
                .output();
        }
        let o = Command::new("ip")
            .args(["netns", "exec", &self.ns('a'), "taskset", "-c", PATH_CPU, "tc", "qdisc", verb, "dev", &dev])
            .args(["root", "tbf", "rate", rate])
            .args(["burst", "1600", "limit", "1000000"])
            .output()
            .unwrap();
        assert!(o.status.success(), "tc: {}", String::from_utf8_lossy(&o.stderr));
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = Command::new(&self.eudp).args(["testbed", "down", &self.name]).status();
    }
}

/// Host `b`'s receiver of the slow endpoint's datagrams: prints "ready",
/// then, once nothing came for 3 s, the sequence numbers it received.
const RECEIVER: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind(("198.18.0.2", int(sys.argv[1])))
print("ready", flush=True)
s.settimeout(30)
seen = []
try:
    while True:
        d = s.recv(65536)
        seen.append(struct.unpack(">I", d[:4])[0])
        s.settimeout(3)
except socket.timeout:
    pass
print(" ".join(map(str, seen)), flush=True)
"#;

#[test]
fn full_socket_does_not_hold_up_the_others() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    run_parent("sr", "full_socket_does_not_hold_up_the_others", SLOW_PORT);
}

/// One test's parent on the testbed tagged `tag`: host `a`'s link slow,
/// a receiver on host `b` at `port`, the test's sending half (`name`) on
/// host `a` until it reports "SLOW_QUEUED n"; then the link is made fast
/// and host `b` must receive datagrams 0..n, all, in order.
fn run_parent(tag: &str, name: &str, port: u16) {
    let Some(tb) = Testbed::up(tag) else { return };
    tb.link_rate("40kbit", false);
    let mut rx = Command::new("ip")
        .args(["netns", "exec", &tb.ns('b'), "python3", "-c", RECEIVER, &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut rx_out = BufReader::new(rx.stdout.take().unwrap());
    let mut line = String::new();
    rx_out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "receiver on host b");
    // The sending half runs on host a: this test binary again, in the
    // namespace. It prints how many slow datagrams it queued, then waits
    // for a line on stdin (the link made fast) before it flushes them.
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", &tb.ns('a'), "taskset", "-c", PATH_CPU, "env", &format!("{CHILD}=1")])
        .arg(&exe)
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut queued = None;
    let mut log = String::new();
    let mut l = String::new();
    while out.read_line(&mut l).unwrap() > 0 {
        log.push_str(&l);
        if let Some(n) = l.trim().strip_prefix("SLOW_QUEUED ") {
            queued = Some(n.parse::<u32>().unwrap());
            break;
        }
        l.clear();
    }
    tb.link_rate("1gbit", true);
    let mut stdin = child.stdin.take().unwrap();
    let _ = std::io::Write::write_all(&mut stdin, b"fast\n");
    drop(stdin);
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    log.push_str(&rest);
    let st = child.wait().unwrap();
    print!("{log}");
    assert!(st.success(), "sending half failed:\n{log}");
    let queued = queued.expect("the sending half reports its slow datagrams");
    let mut seen = String::new();
    rx_out.read_to_string(&mut seen).unwrap();
    let _ = rx.wait();
    let seen: Vec<u32> = seen.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert_eq!(seen, (0..queued).collect::<Vec<u32>>(), "the slow endpoint's datagrams on host b: all, in order");
}

/// The sending half, on host `a`.
fn child() {
    let engine = Engine::start(Config::default()).unwrap();
    // Slow: a small send buffer behind the 40 kbit/s link, fed without
    // blocking until L1 and the kernel are full.
    let slow = Endpoint::with_engine(&engine, false).unwrap();
    slow.set_send_buffer_size(8192).unwrap();
    slow.set_nonblocking(true);
    let dst: SocketAddr = format!("198.18.0.2:{SLOW_PORT}").parse().unwrap();
    let mut queued = 0u32;
    let mut refused = 0;
    let t0 = Instant::now();
    while refused < 50 && t0.elapsed() < Duration::from_secs(2) {
        let mut d = vec![0u8; SLOW_LEN];
        d[..4].copy_from_slice(&queued.to_be_bytes());
        match slow.send_to(&d, dst) {
            Ok(_) => queued += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                refused += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("slow send: {e}"),
        }
    }
    assert!(refused >= 50, "the slow endpoint never filled up ({queued} queued)");
    // MSG_DONTWAIT on a blocking endpoint is refused too: a send that
    // waited for the link's room would return Ok. (Room for one datagram
    // comes every 200 ms: one may be taken, in order.)
    slow.set_nonblocking(false);
    let mut dont_wait = None;
    for _ in 0..20 {
        let mut d = vec![0u8; SLOW_LEN];
        d[..4].copy_from_slice(&queued.to_be_bytes());
        match slow.send_with(&d, Some(dst), SendFlags { dont_wait: true }) {
            Ok(_) => queued += 1,
            Err(e) => {
                dont_wait = Some(e.kind());
                break;
            }
        }
    }
    assert_eq!(
        dont_wait,
        Some(std::io::ErrorKind::WouldBlock),
        "MSG_DONTWAIT on a blocking endpoint with a full send buffer"
    );
    slow.set_nonblocking(true);
    let backlog = slow.stats();
    // Free: the same engine, to a receiver on this host's loopback.
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let rx_addr = rx.local_addr().unwrap();
    let start = Instant::now();
    let recv = std::thread::spawn(move || {
        let mut at = vec![None; FREE];
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < FREE && start.elapsed() < Duration::from_secs(30) {
            if let Ok(n) = rx.recv(&mut buf) {
                let i = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
                assert!(n == 64 && i < FREE && at[i].is_none(), "datagram {i}");
                at[i] = Some(start.elapsed());
                got += 1;
            }
        }
        at
    });
    let free = Endpoint::with_engine(&engine, false).unwrap();
    let mut sent = Vec::with_capacity(FREE);
    for i in 0..FREE as u32 {
        let mut d = [0u8; 64];
        d[..4].copy_from_slice(&i.to_be_bytes());
        sent.push(start.elapsed());
        free.send_to(&d, rx_addr).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    let at = recv.join().unwrap();
    let mut delays: Vec<Duration> = at.iter().zip(&sent).filter_map(|(a, s)| a.map(|a| a.saturating_sub(*s))).collect();
    delays.sort();
    let lost = FREE - delays.len();
    let max = delays.last().copied().unwrap_or_default();
    println!(
        "slow: {queued} queued ({} sent before the free sends began); free: {} of {FREE} arrived, delay median {:?}, max {:?} (bound {BOUND:?})",
        backlog.datagrams_sent,
        delays.len(),
        delays.get(delays.len() / 2).copied().unwrap_or_default(),
        max
    );
    // Still stuck: the link lets about 5 of these through per second.
    let slow_sent = slow.stats().datagrams_sent;
    println!("slow: {slow_sent} sent when the free sends were all in");
    println!("SLOW_QUEUED {queued}");
    // The parent makes the link fast, then everything queued must leave.
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    assert!(slow.flush(Duration::from_secs(10)), "the slow endpoint drains once the link is fast");
    let s = slow.stats();
    assert_eq!((s.datagrams_sent, s.drop_send_error), (u64::from(queued), 0), "{s:?}");
    assert_eq!(lost, 0, "free datagrams lost");
    assert!(max < BOUND, "a free datagram waited {max:?} behind the full socket");
    assert!(slow_sent + 5 < u64::from(queued), "the slow socket was not held full: {slow_sent} of {queued} sent");
}

const ROOM_PORT: u16 = 5392;
/// Rounds of "fill, wait for room, send" (each waits for the link to
/// free about 2 KiB: a few hundred ms).
const ROUNDS: usize = 8;

/// A program that polls the socket for room (`EPOLLOUT`, `POLLOUT`: the
/// kernel socket's) and then sends must find the send accepted, as on a
/// kernel socket, however late the engine thread notices the room. The
/// sending half fills L1 and the kernel (4 KiB `SO_SNDBUF` behind the
/// 40 kbit/s link) until `EAGAIN`, spins on the socket until it polls
/// writable, which beats the engine's wake-up, and sends at once. Every
/// datagram accepted must then reach host `b`, in order.
#[test]
fn send_after_room_is_accepted() {
    if std::env::var_os(CHILD).is_some() {
        return child_room();
    }
    run_parent("sa", "send_after_room_is_accepted", ROOM_PORT);
}

/// The sending half of [`send_after_room_is_accepted`], on host `a`.
fn child_room() {
    use eudp_engine::sys::poll::poll_writable;
    let engine = Engine::start(Config::default()).unwrap();
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.set_send_buffer_size(4096).unwrap();
    ep.set_nonblocking(true);
    let dst: SocketAddr = format!("198.18.0.2:{ROOM_PORT}").parse().unwrap();
    let mut seq = 0u32;
    let send = |seq: &mut u32| {
        let mut d = vec![0u8; SLOW_LEN];
        d[..4].copy_from_slice(&seq.to_be_bytes());
        let r = ep.send_to(&d, dst);
        if r.is_ok() {
            *seq += 1;
        }
        r
    };
    let mut refused = Vec::new();
    for round in 0..ROUNDS {
        let mut n = 0;
        while n < 4000 && send(&mut seq).is_ok() {
            n += 1;
        }
        assert!(n < 4000, "round {round}: the send buffer never filled");
        let t0 = Instant::now();
        while !poll_writable(ep.raw_fd(), Some(Duration::ZERO)).unwrap() {
            assert!(t0.elapsed() < Duration::from_secs(20), "round {round}: no room within 20 s");
        }
        if let Err(e) = send(&mut seq) {
            refused.push((round, e.kind()));
        }
    }
    println!("room: {ROUNDS} rounds, sends refused right after the socket polled writable: {refused:?}");
    println!("SLOW_QUEUED {seq}");
    let mut l = String::new();
    std::io::stdin().read_line(&mut l).unwrap();
    assert!(ep.flush(Duration::from_secs(10)), "the endpoint drains once the link is fast");
    let s = ep.stats();
    assert_eq!((s.datagrams_sent, s.drop_send_error), (u64::from(seq), 0), "{s:?}");
    assert!(refused.is_empty(), "a send after the socket polled writable was refused: {refused:?}");
}
