//! An application thread that stays in a blocking receive keeps its
//! endpoint parked (the engine stays off the socket), and the engine looks
//! at it less and less often instead of once per handoff interval: a
//! program idle in `recv` for minutes must not wake the engine about 1 000
//! times a second. Loopback only.

use eudp_engine::{Config, Endpoint, Engine};
use std::net::UdpSocket;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HANDOFF: Duration = Duration::from_millis(1);
/// How long the receiver stays asleep in its receive.
const IDLE: Duration = Duration::from_millis(400);

/// One endpoint through datagrams, round trips and an idle receive;
/// returns the engine's looks at parked endpoints during the idle time and
/// how many handoff intervals that time was.
fn idle_receiver(engine: &Engine) -> (u64, u64) {
    let ep = Arc::new(Endpoint::with_engine(engine, false).unwrap());
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    let dst = ep.local_addr().unwrap();
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Datagrams before anyone receives: the engine reads them into the
    // ring and keeps its watch on the socket. Then round trips while the
    // receiver waits in its receive: the watch sees it there and parks the
    // endpoint (most of the time: the receiver may also take them all
    // before the engine looks).
    for i in 0..3u8 {
        peer.send_to(&[i], dst).unwrap();
    }
    std::thread::sleep(Duration::from_millis(20));
    let rx = {
        let ep = ep.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 16];
            let mut got = Vec::new();
            for _ in 0..54 {
                let n = ep.recv(&mut buf).unwrap();
                got.push(buf[..n].to_vec());
            }
            got
        })
    };
    for i in 3..53u8 {
        peer.send_to(&[i], dst).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    std::thread::sleep(Duration::from_millis(20));
    let before = engine.park_looks();
    let t = Instant::now();
    std::thread::sleep(IDLE);
    let looks = engine.park_looks() - before;
    let slept = t.elapsed();
    peer.send_to(b"end", dst).unwrap();
    let got = rx.join().unwrap();
    assert_eq!(got.len(), 54);
    assert_eq!(got.last().unwrap(), b"end");
    for (i, d) in got[..53].iter().enumerate() {
        assert_eq!(d, &[i as u8], "datagram {i}");
    }
    (looks, (slept.as_secs_f64() / HANDOFF.as_secs_f64()) as u64)
}

#[test]
fn a_receiver_asleep_in_recv_is_looked_at_ever_less_often() {
    let engine = Engine::start(Config { rx_handoff: HANDOFF, ..Config::default() }).unwrap();
    // Up to four endpoints, until one was parked (looked at) while idle.
    for attempt in 0..4 {
        let (looks, intervals) = idle_receiver(&engine);
        if looks == 0 {
            eprintln!("attempt {attempt}: not parked, again");
            continue;
        }
        // One look per handoff interval was about 400 (356 measured); with
        // the interval doubling up to 32 of them, about 5 + 400 / 32 ≈ 18.
        assert!(looks * 8 < intervals, "{looks} looks in {intervals} handoff intervals");
        return;
    }
    panic!("no endpoint was parked in four attempts: the test's premise failed");
}

/// The inode numbers of the files registered in this process's epoll sets
/// (from the `tfd:` lines of `/proc/self/fdinfo`; by inode, since a line's
/// descriptor number may since have been closed and reused).
fn epoll_watched_inodes() -> Vec<u64> {
    let mut inodes = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo").unwrap().flatten() {
        let Ok(info) = std::fs::read_to_string(entry.path()) else { continue };
        for line in info.lines().filter(|l| l.starts_with("tfd:")) {
            let ino = line.split_whitespace().find_map(|w| w.strip_prefix("ino:")).unwrap();
            inodes.push(u64::from_str_radix(ino, 16).unwrap());
        }
    }
    inodes
}

/// Whether the endpoint's socket is in an epoll set.
fn watched(ep: &Endpoint) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ino = std::fs::metadata(format!("/proc/self/fd/{}", ep.raw_fd())).unwrap().ino();
    epoll_watched_inodes().contains(&ino)
}

/// While its application thread receives, a parked socket is out of the
/// engine's epoll set: a disarmed one-shot watch would still sit on the
/// socket's wait queue and run the epoll callback for every datagram the
/// socket sends or receives. Once the application has stopped receiving,
/// the engine adds the watch back and reads arrivals into the ring again.
#[test]
fn a_parked_socket_leaves_the_epoll_set_and_comes_back() {
    let engine = Engine::start(Config { rx_handoff: HANDOFF, ..Config::default() }).unwrap();
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    let dst = ep.local_addr().unwrap();
    assert!(watched(&ep), "a new socket is watched");
    let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
    // The application receives what arrives, never blocked: the engine,
    // woken by an arrival, finds receives made since its last look and
    // parks the socket. (Not a receiver blocked inside the read: woken
    // first, it may take each datagram before the engine's `epoll_wait`
    // looks, which then reports nothing and the engine never parks.)
    let mut buf = [0u8; 16];
    let mut parked_out = false;
    for i in 0..200u8 {
        peer.send_to(&[i], dst).unwrap();
        std::thread::sleep(Duration::from_micros(100));
        let n = ep.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[i]);
        if i >= 20 && !watched(&ep) {
            parked_out = true;
            break;
        }
    }
    assert!(parked_out, "a parked socket is still in an epoll set");
    // The application stopped receiving: within a few handoff intervals
    // the watch is back and an arrival reaches the ring with no receive.
    let before = ep.stats().datagrams_received;
    let t = Instant::now();
    while !watched(&ep) {
        assert!(t.elapsed() < Duration::from_secs(2), "the watch did not come back");
        std::thread::sleep(Duration::from_millis(2));
    }
    peer.send_to(b"later", dst).unwrap();
    while ep.stats().datagrams_received == before {
        assert!(t.elapsed() < Duration::from_secs(2), "the engine did not read the arrival");
        std::thread::sleep(Duration::from_millis(2));
    }
    let n = ep.recv(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"later");
}
