//! Send room and order across a full lane's refusals, under the `tcp`
//! transport. The engine's send to a lane whose peer is stopped is refused;
//! the rest waits staged while the program keeps queueing in L1; when the
//! peer reads again, the engine sends the rest and then L1. Two things must
//! hold whatever the timing:
//! * order: every datagram reaches the peer once, in the order sent (the
//!   rest is older than all of L1);
//! * room: once the endpoint reports room (`writable`, what `POLLOUT`
//!   reports for the socket), a send is accepted at once.
//!
//! Over loopback; the peer is this test binary again, in a child process
//! that is stopped (SIGSTOP) and continued a few times.

use eudp_engine::backend::tcp::{TcpConfig, TcpTransport};
use eudp_engine::{Config, Engine};
use std::io::{BufRead, BufReader, ErrorKind};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CHILD: &str = "EUDP_TCP_ROOM_ORDER_CHILD";
const SENDER: &str = "127.0.0.101";
const PEER: &str = "127.0.0.102";
const PEER_PORT: u16 = 5611;
const ROUNDS: u32 = 8;
/// Marks the last datagram: its sequence number.
const END: u32 = u32::MAX;

fn host(ip: &str, port: u16, f: impl FnOnce(&mut TcpConfig)) -> TcpTransport {
    let mut c = TcpConfig { port, bind_ip: Some(ip.parse().unwrap()), ..TcpConfig::default() };
    f(&mut c);
    TcpTransport::start(c).expect("transport")
}

fn free_port() -> u16 {
    let base = 33000 + (std::process::id() % 3000) as u16 * 10;
    (base..base + 10).find(|&p| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok()).expect("a free port")
}

/// Datagram `seq` of `len` bytes: the sequence number, then a pattern.
fn datagram(seq: u32, len: usize) -> Vec<u8> {
    let mut d = vec![(seq % 251) as u8; len];
    d[..4].copy_from_slice(&seq.to_be_bytes());
    d
}

/// The peer: reads until the end mark and reports what it saw, in order.
fn child() {
    let port: u16 = std::env::var(CHILD).unwrap().parse().unwrap();
    let t = host(PEER, port, |c| c.rcvbuf = 4608);
    let e = Engine::start(Config::default()).unwrap();
    let rx = t.endpoint(&e, false).unwrap();
    rx.bind_to(SocketAddr::new(PEER.parse().unwrap(), PEER_PORT)).unwrap();
    // Room for all that can be in flight after a stop, so that nothing is
    // dropped for want of it (a gap would then not be the sender's).
    rx.set_recv_buffer_size(16 << 20).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(30)));
    println!("ready");
    let mut buf = vec![0u8; 65_536];
    let (mut next, mut got, mut bad) = (0u32, 0u64, Vec::new());
    loop {
        let Ok((n, _)) = rx.recv_from(&mut buf) else {
            println!("RESULT timeout next {next} got {got} bad {bad:?}");
            return;
        };
        let seq = u32::from_be_bytes(buf[..4].try_into().unwrap());
        if seq == END {
            break;
        }
        got += 1;
        if (seq != next || buf[4..n].iter().any(|&b| b != (seq % 251) as u8)) && bad.len() < 8 {
            bad.push((next, seq));
        }
        next = seq.wrapping_add(1);
    }
    let s = rx.stats();
    println!("RESULT end next {next} got {got} bad {bad:?} ring_drops {}", s.drop_ring_full);
}

/// The peer process, killed when the test ends however it ends.
struct Peer {
    proc: std::process::Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Peer {
    fn start(test: &str, port: u16) -> Peer {
        let mut proc = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--nocapture", "--test-threads=1"])
            .env(CHILD, port.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(proc.stdout.take().unwrap());
        let mut p = Peer { proc, out };
        p.line_starting("ready");
        p
    }

    /// SIGSTOP or SIGCONT.
    fn send_signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(sig).arg(self.proc.id().to_string()).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} of the peer");
    }

    /// The peer's next line that says `want`, from there on (its first
    /// line follows the test harness's "test NAME ... ").
    fn line_starting(&mut self, want: &str) -> String {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(self.out.read_line(&mut line).unwrap() > 0, "the peer ended before saying {want}");
            if let Some(at) = line.find(want) {
                return line[at..].trim_end().to_string();
            }
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.proc.kill();
        let _ = self.proc.wait();
    }
}

#[test]
fn a_full_lane_resumes_in_order_and_room_means_a_send_is_taken() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let port = free_port();
    let mut peer = Peer::start("a_full_lane_resumes_in_order_and_room_means_a_send_is_taken", port);

    // Small kernel buffers, so the lane fills after little data.
    let a = host(SENDER, port, |c| c.sndbuf = 4608);
    let e = Engine::start(Config::default()).unwrap();
    let ep = a.endpoint(&e, false).unwrap();
    ep.bind_to(SocketAddr::new(SENDER.parse().unwrap(), 0)).unwrap();
    ep.set_send_buffer_size(256 << 10).unwrap();
    let dst = SocketAddr::new(PEER.parse().unwrap(), PEER_PORT);
    ep.set_nonblocking(true);

    // Mixed sizes: engine runs end at different places in the rest and in L1.
    let len = |seq: u32| [1472usize, 1472, 1472, 300, 8000, 1472, 64][seq as usize % 7];
    let mut seq = 0u32;
    let mut refused_after_room = Vec::new();
    let mut room_waits = Vec::new();
    for round in 0..ROUNDS {
        peer.send_signal("-STOP");
        // Queue until the lane, the rest and L1 are full: refused again
        // and again, with pauses long enough for the engine to give up
        // waiting on the lane (10 ms) and watch the room descriptor.
        let (mut refused, t0) = (0, Instant::now());
        while refused < 30 && t0.elapsed() < Duration::from_secs(10) {
            match ep.send_to(&datagram(seq, len(seq)), dst) {
                Ok(_) => seq += 1,
                Err(err) if err.kind() == ErrorKind::WouldBlock => {
                    refused += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(err) => panic!("send: {err}"),
            }
        }
        assert!(refused >= 30, "round {round}: the lane never filled ({seq} sent)");
        assert!(!ep.writable(), "round {round}: room reported with the lane full");
        peer.send_signal("-CONT");
        // The moment room is reported, a send must be taken.
        let t0 = Instant::now();
        while !ep.writable() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "round {round}: no room within 10 s of the peer reading again"
            );
            std::hint::spin_loop();
        }
        room_waits.push(t0.elapsed());
        match ep.send_to(&datagram(seq, len(seq)), dst) {
            Ok(_) => seq += 1,
            Err(err) => refused_after_room.push((round, err.kind())),
        }
        // A stream while the peer reads, queued behind what is left.
        for _ in 0..200 {
            match ep.send_to(&datagram(seq, len(seq)), dst) {
                Ok(_) => seq += 1,
                Err(err) if err.kind() == ErrorKind::WouldBlock => std::thread::sleep(Duration::from_micros(200)),
                Err(err) => panic!("send: {err}"),
            }
        }
    }
    ep.set_nonblocking(false);
    ep.send_to(&END.to_be_bytes(), dst).unwrap();
    assert!(ep.flush(Duration::from_secs(20)), "the endpoint drains once the peer reads");
    let result = peer.line_starting("RESULT");
    let st = a.stats();
    println!(
        "{ROUNDS} rounds, {seq} datagrams; room after the peer read again in {room_waits:?}; refused right after room: {refused_after_room:?}; \
         lane refusals {}, engine waits {} ({} timed out, {} cut short); peer: {}",
        st.backpressure_waits,
        st.engine_waits,
        st.engine_wait_timeouts,
        st.engine_wait_yields,
        result
    );
    drop(peer);
    // The test reached the engine's resume (a refusal it stopped waiting
    // for on the lane, then the room descriptor).
    assert!(
        st.engine_wait_timeouts + st.engine_wait_yields > 0,
        "the engine never left a refused rest for the room descriptor: {st:?}"
    );
    assert!(
        refused_after_room.is_empty(),
        "a send right after the endpoint reported room was refused: {refused_after_room:?}"
    );
    let want = format!("RESULT end next {seq} got {seq} bad [] ring_drops 0");
    assert_eq!(result, want, "the peer did not get every datagram once, in order");
}
