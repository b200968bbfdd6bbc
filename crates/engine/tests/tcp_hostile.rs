//! The UDP-over-TCP listener under hostile peers, over loopback: a flood of
//! connections from many addresses and ports, slow-loris hellos, and a
//! stream of malformed and oversized frames at full rate. In each, the
//! caps hold, memory stays bounded, a peer that was already talking goes on
//! receiving every datagram, and the counters say what happened.

use eudp_engine::backend::tcp::{TcpConfig, TcpTransport};
use eudp_engine::sys::process::raise_fd_limit;
use eudp_engine::{Config, Endpoint, Engine};
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 40000 + (std::process::id() % 1000) as u16 * 10;
    loop {
        let p = base + NEXT.fetch_add(1, Ordering::SeqCst);
        if std::net::TcpListener::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
}

fn host(ip: &str, port: u16, f: impl FnOnce(&mut TcpConfig)) -> TcpTransport {
    let mut c = TcpConfig { port, bind_ip: Some(ip.parse().unwrap()), ..TcpConfig::default() };
    f(&mut c);
    TcpTransport::start(c).expect("transport")
}

fn ep(t: &TcpTransport, e: &Engine, ip: &str) -> Endpoint {
    let ep = t.endpoint(e, false).unwrap();
    ep.bind_to(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    ep
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The transport's preamble for lane 0 (format version 1).
const HELLO: [u8; 8] = [b'E', b'U', b'T', b'1', 1, 0, 0, 0];

fn frame_header(src: u16, dst: u16, len: u16) -> [u8; 6] {
    let (s, d, l) = (src.to_be_bytes(), dst.to_be_bytes(), len.to_be_bytes());
    [s[0], s[1], d[0], d[1], l[0], l[1]]
}

/// Resident and peak memory of this process, in KiB.
fn rss_kib() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("VmRSS:"), get("VmHWM:"))
}

/// A legitimate peer sending numbered datagrams to `rx` until told to stop,
/// and a reader of `rx` checking that what arrives is intact and in order.
struct Talk {
    stop: Arc<AtomicBool>,
    sender: std::thread::JoinHandle<u64>,
    done: Arc<AtomicBool>,
    reader: std::thread::JoinHandle<Result<(u64, u64), String>>,
}

fn talk(a: Arc<TcpTransport>, e: Arc<Engine>, from_ip: &'static str, rx: Endpoint) -> Talk {
    let to = rx.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let sender = std::thread::spawn(move || {
        let tx = ep(&a, &e, from_ip);
        let mut i = 0u64;
        while !s.load(Ordering::Relaxed) {
            let mut p = vec![(i % 251) as u8; 200];
            p[..8].copy_from_slice(&i.to_be_bytes());
            tx.send_to(&p, to).unwrap();
            i += 1;
            if i & 15 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        i
    });
    let d = done.clone();
    let reader = std::thread::spawn(move || {
        rx.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = vec![0u8; 2048];
        let (mut got, mut next) = (0u64, 0u64);
        loop {
            let n = match rx.recv(&mut buf) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if d.load(Ordering::SeqCst) {
                        return Ok((got, next));
                    }
                    continue;
                }
                Err(e) => return Err(format!("legitimate datagram after {got}: {e}")),
            };
            let seq = u64::from_be_bytes(buf[..8].try_into().unwrap());
            if n != 200 || seq < next {
                return Err(format!("legitimate datagram {seq}: {n} bytes, after {next}"));
            }
            if !buf[8..n].iter().all(|&b| b == (seq % 251) as u8) {
                return Err(format!("bytes of legitimate datagram {seq}"));
            }
            got += 1;
            next = seq + 1;
        }
    });
    Talk { stop, sender, done, reader }
}

/// Waits until the legitimate lane carries datagrams.
fn started(b: &TcpTransport) {
    wait_for("the legitimate lane", 5, || b.stats().frames_received > 0);
}

fn drops(fields: Vec<(&'static str, u64)>) -> u64 {
    fields.iter().filter(|(k, _)| k.starts_with("drop_") || *k == "lost_partial").map(|(_, v)| v).sum()
}

/// Every legitimate datagram arrived or was counted as dropped, and the last arrived.
fn check_talk(t: Talk, a: &TcpTransport, b: &TcpTransport) {
    t.stop.store(true, Ordering::Relaxed);
    let sent = t.sender.join().unwrap();
    wait_for("the legitimate tail", 10, || b.stats().frames_received + drops(a.stats().fields()) >= sent);
    t.done.store(true, Ordering::SeqCst);
    let (got, next) = t.reader.join().unwrap().unwrap();
    let lost = drops(a.stats().fields()) + b.stats().drop_rx_full;
    eprintln!("legitimate peer: {sent} sent, {got} received, {lost} counted drops");
    assert_eq!(got + lost, sent, "sent = received + counted drops");
    assert_eq!(next, sent, "the last legitimate datagram arrives");
}

/// Reads `s` until the server closes it (true) or `secs` pass with it open (false).
fn wait_closed(s: &mut TcpStream, secs: u64) -> bool {
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let t0 = Instant::now();
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                if t0.elapsed() > Duration::from_secs(secs) {
                    return false;
                }
            }
            Err(_) => return true,
        }
    }
}

/// True once the server has closed `s` (EOF or reset), false while it is open.
fn closed_now(s: &mut TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    let r = loop {
        match s.read(&mut b) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).unwrap();
    r
}

#[test]
fn a_flood_of_connections_is_capped_and_memory_stays_bounded() {
    raise_fd_limit(8192).unwrap();
    let port = free_port();
    let (max_conns, per_peer) = (64usize, 8usize);
    let b = host("127.0.3.1", port, |c| {
        c.max_conns = max_conns;
        c.max_conns_per_peer = per_peer;
        c.hello_timeout = Duration::from_secs(30);
    });
    let a = Arc::new(host("127.0.3.2", port, |_| {}));
    let e = Arc::new(Engine::start(Config::default()).unwrap());
    // The legitimate peer's lane is up before the flood.
    let t = talk(a.clone(), e.clone(), "127.0.3.2", ep(&b, &e, "127.0.3.1"));
    started(&b);
    let (rss0, _) = rss_kib();

    // 2,000 attempts from 100 addresses, 20 source ports each, every one saying hello.
    let server = SocketAddr::new("127.0.3.1".parse().unwrap(), port);
    let mut flood = Vec::new();
    for i in 0..2000u32 {
        let src = Ipv4Addr::new(127, 0, 4, (i % 100) as u8 + 1);
        if let Some(mut s) = connect_from(src, server) {
            let _ = s.write_all(&HELLO);
            flood.push((src, s));
        }
    }
    let attempts = 2000u64;
    // Every refused attempt is counted; what stays open is within the caps.
    wait_for("the caps' refusals to be counted", 20, || {
        let s = b.stats();
        s.rejected_conns + s.conns_accepted >= attempts
    });
    std::thread::sleep(Duration::from_millis(200));
    let mut open_by_peer = std::collections::HashMap::<Ipv4Addr, usize>::new();
    for (src, s) in flood.iter_mut() {
        if !closed_now(s) {
            *open_by_peer.entry(*src).or_default() += 1;
        }
    }
    let open: usize = open_by_peer.values().sum();
    let st = b.stats();
    assert!(open < max_conns, "{open} flood connections open, cap {max_conns} (one is the legitimate lane's): {st:?}");
    assert!(open_by_peer.values().all(|&n| n <= per_peer), "per-peer cap {per_peer}: {open_by_peer:?}");
    assert!(st.rejected_conns >= attempts - max_conns as u64, "{st:?}");
    let (rss1, hwm) = rss_kib();
    eprintln!("flood: {open} open, {} refused; RSS {rss0} -> {rss1} KiB, peak {hwm} KiB", st.rejected_conns);
    assert!(rss1.saturating_sub(rss0) < 64 * 1024, "RSS grew by {} KiB under the flood", rss1 - rss0);
    drop(flood);
    check_talk(t, &a, &b);
}

/// A TCP connection to `to` from address `src` (any port), as a peer host would make it.
fn connect_from(src: Ipv4Addr, to: SocketAddr) -> Option<TcpStream> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
    s.bind(&SocketAddr::V4(SocketAddrV4::new(src, 0)).into()).ok()?;
    s.connect_timeout(&to.into(), Duration::from_secs(2)).ok()?;
    Some(s.into())
}

#[test]
fn slow_loris_hellos_are_closed_and_do_not_hold_the_listener() {
    let port = free_port();
    let b = host("127.0.3.11", port, |c| {
        c.hello_timeout = Duration::from_millis(300);
        c.max_conns_per_peer = 64;
    });
    let a = Arc::new(host("127.0.3.12", port, |_| {}));
    let e = Arc::new(Engine::start(Config::default()).unwrap());
    let t = talk(a.clone(), e.clone(), "127.0.3.12", ep(&b, &e, "127.0.3.11"));
    started(&b);
    let server = SocketAddr::new("127.0.3.11".parse().unwrap(), port);
    // 40 peers dribble their hello one byte every 100 ms: never done in time.
    let mut loris: Vec<TcpStream> = (0..40).map(|_| TcpStream::connect(server).unwrap()).collect();
    let t0 = Instant::now();
    for k in 0..HELLO.len() {
        for s in loris.iter_mut() {
            let _ = s.write_all(&HELLO[k..k + 1]);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for s in loris.iter_mut() {
        assert!(wait_closed(s, 3), "a slow hello must be closed");
    }
    wait_for("every slow hello counted", 5, || b.stats().hello_timeouts == 40);
    assert!(t0.elapsed() < Duration::from_secs(5));
    check_talk(t, &a, &b);
}

#[test]
fn malformed_and_oversized_frames_at_full_rate_close_only_their_senders() {
    let port = free_port();
    let b = host("127.0.3.21", port, |c| c.max_conns_per_peer = 16);
    let a = Arc::new(host("127.0.3.22", port, |_| {}));
    let e = Arc::new(Engine::start(Config::default()).unwrap());
    let junk_rx = ep(&b, &e, "127.0.3.21");
    let junk_port = junk_rx.local_addr().unwrap().port();
    let t = talk(a.clone(), e.clone(), "127.0.3.22", ep(&b, &e, "127.0.3.21"));
    started(&b);
    let server = SocketAddr::new("127.0.3.21".parse().unwrap(), port);
    // Four hostile peers, each connection: hello, `good` well-formed frames
    // to the junk socket, then one bad header, written as fast as it goes.
    let conns_each = 50u64;
    let good = 10u64;
    let hostile: Vec<_> = (0..4u16)
        .map(|w| {
            std::thread::spawn(move || {
                let mut closes = [0u64; 2];
                for c in 0..conns_each {
                    let mut s = TcpStream::connect(server).unwrap();
                    let mut out = HELLO.to_vec();
                    for _ in 0..good {
                        out.extend_from_slice(&frame_header(1000 + w, junk_port, 100));
                        out.extend_from_slice(&[0xab; 100]);
                    }
                    let oversized = c % 2 == 0;
                    out.extend_from_slice(&if oversized {
                        frame_header(1000 + w, junk_port, 0xfff0)
                    } else {
                        frame_header(1000 + w, 0, 4)
                    });
                    let _ = s.write_all(&out);
                    assert!(wait_closed(&mut s, 5), "a bad frame must close its connection");
                    closes[usize::from(oversized)] += 1;
                }
                closes
            })
        })
        .collect();
    let mut closes = [0u64; 2];
    for h in hostile {
        let c = h.join().unwrap();
        closes[0] += c[0];
        closes[1] += c[1];
    }
    let st = b.stats();
    assert_eq!((st.malformed, st.oversized), (closes[0], closes[1]), "{st:?}");
    // Every well-formed frame before a bad header was delivered, not lost with its connection.
    let mut buf = vec![0u8; 2048];
    for i in 0..4 * conns_each * good {
        let n = junk_rx.recv(&mut buf).unwrap_or_else(|e| panic!("frame {i} before a bad header: {e}"));
        assert_eq!(&buf[..n], &[0xab; 100][..]);
    }
    check_talk(t, &a, &b);
}
