//! The `tcp` transport's process-wide queue bound (`total_queue_bytes`):
//! datagrams queued for a peer that does not listen may fill it. A send
//! to a connected peer whose socket is full must then be refused (or
//! queued within bounds) and return, and other peers keep being served.
//! Before, `Mgr::submit` retried such a send forever, holding the lane.
//!
//! Over loopback, each "host" a transport on its own 127.0.0.x; the peer
//! whose socket fills is this test binary again, in a stopped child.

use eudp_engine::backend::tcp::{TcpConfig, TcpTransport};
use eudp_engine::{Config, Endpoint, Engine};
use std::io::{BufRead, BufReader, ErrorKind};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CHILD: &str = "EUDP_TCP_TOTAL_BOUND_CHILD";
const SENDER: &str = "127.0.0.81";
const STOPPED: &str = "127.0.0.82";
const FREE_HOST: &str = "127.0.0.83";
const NOBODY: &str = "127.0.0.84:9";
const SLOW_PORT: u16 = 5611;
const FREE_PORT: u16 = 5612;
const TOTAL: usize = 256 << 10;

fn host(ip: &str, port: u16, f: impl FnOnce(&mut TcpConfig)) -> TcpTransport {
    let mut c = TcpConfig { port, bind_ip: Some(ip.parse().unwrap()), ..TcpConfig::default() };
    f(&mut c);
    TcpTransport::start(c).expect("transport")
}

fn ep(t: &TcpTransport, e: &Engine, ip: &str, port: u16) -> Endpoint {
    let ep = t.endpoint(e, false).unwrap();
    ep.bind_to(SocketAddr::new(ip.parse().unwrap(), port)).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    ep
}

fn free_port() -> u16 {
    let base = 33000 + (std::process::id() % 3000) as u16 * 10;
    (base..base + 10).find(|&p| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok()).expect("a free port")
}

/// The peer that gets stopped: small buffers, says "got" after the first
/// datagram, reads until killed.
fn child() {
    let port: u16 = std::env::var(CHILD).unwrap().parse().unwrap();
    let t = host(STOPPED, port, |c| c.rcvbuf = 4608);
    let e = Engine::start(Config::default()).unwrap();
    let rx = ep(&t, &e, STOPPED, SLOW_PORT);
    rx.set_read_timeout(Some(Duration::from_secs(30)));
    println!("ready");
    let mut buf = vec![0u8; 65_536];
    let mut first = true;
    while rx.recv_from(&mut buf).is_ok() {
        if std::mem::take(&mut first) {
            println!("got");
        }
    }
}

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
    assert!(st.success(), "kill {sig} {pid}");
}

fn wait_line(out: &mut impl BufRead, want: &str) {
    let mut line = String::new();
    while !line.trim_end().ends_with(want) {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the stopped peer's process ended early");
    }
}

#[test]
fn a_full_process_queue_refuses_a_full_connection_instead_of_spinning() {
    if std::env::var_os(CHILD).is_some() {
        return child();
    }
    let port = free_port();
    let mut c = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "a_full_process_queue_refuses_a_full_connection_instead_of_spinning", "--nocapture", "--test-threads=1"])
        .env(CHILD, port.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(c.stdout.take().unwrap());
    let peer = Kill(c);
    wait_line(&mut out, "ready");

    let fh = host(FREE_HOST, port, |_| {});
    let fe = Engine::start(Config::default()).unwrap();
    let rx = ep(&fh, &fe, FREE_HOST, FREE_PORT);

    let a = host(SENDER, port, |c| {
        c.sndbuf = 4608;
        c.queue_bytes = TOTAL;
        c.total_queue_bytes = TOTAL;
    });
    let e = Engine::start(Config::default()).unwrap();
    let slow = ep(&a, &e, SENDER, 0);
    let free = ep(&a, &e, SENDER, 0);
    let slow_dst = SocketAddr::new(STOPPED.parse().unwrap(), SLOW_PORT);
    let free_dst = SocketAddr::new(FREE_HOST.parse().unwrap(), FREE_PORT);
    slow.send_to(b"hello", slow_dst).unwrap();
    wait_line(&mut out, "got");
    let mut buf = vec![0u8; 2048];
    free.send_to(b"up", free_dst).unwrap();
    rx.recv_from(&mut buf).unwrap();
    signal(peer.0.id(), "-STOP");

    // Fill the process-wide queue with datagrams for a host nobody listens on.
    slow.set_nonblocking(true);
    let nobody: SocketAddr = NOBODY.parse().unwrap();
    let t0 = Instant::now();
    while a.stats().drop_queue_full == 0 {
        let _ = slow.send_to(&[1u8; 8000], nobody);
        assert!(t0.elapsed() < Duration::from_secs(10), "the process queue never filled: {:?}", a.stats());
    }

    // Sends to the stopped peer: its socket fills, and every call returns.
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let (mut ok, mut refused) = (0, 0);
        for _ in 0..400 {
            match slow.send_to(&[7u8; 8000], slow_dst) {
                Ok(_) => ok += 1,
                Err(e) if e.kind() == ErrorKind::WouldBlock => refused += 1,
                Err(e) => panic!("send to the stopped peer: {e}"),
            }
        }
        let _ = done.send((ok, refused));
    });
    let (ok, refused) = finished.recv_timeout(Duration::from_secs(10)).expect("sends to a full connection never returned");
    println!("to the stopped peer: {ok} accepted, {refused} refused; {:?}", a.stats());
    assert!(refused > 0, "nothing was refused: the connection never filled");

    // The engine still serves the other peer.
    for i in 0..50u32 {
        free.send_to(&i.to_be_bytes(), free_dst).unwrap();
    }
    rx.set_read_timeout(Some(Duration::from_secs(10)));
    for i in 0..50u32 {
        let (n, _) = rx.recv_from(&mut buf).unwrap_or_else(|err| panic!("datagram {i} to the free peer: {err}"));
        assert_eq!(&buf[..n], &i.to_be_bytes());
    }
    signal(peer.0.id(), "-CONT");
}
