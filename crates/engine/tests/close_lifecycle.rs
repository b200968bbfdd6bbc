//! Dropping an endpoint closes its kernel socket before it returns (the
//! port is free at once, as after close(2)) without waiting for the engine
//! thread's next turn: a program that opens a socket per query pays for
//! the close, not for the engine's coalescing interval. Loopback only.

use eudp_engine::{Config, Endpoint, Engine};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

/// Long enough that a close waiting for the engine's turn would show.
const COALESCE: Duration = Duration::from_millis(300);
/// A close that returns within this did not wait for that turn.
const FAST: Duration = Duration::from_millis(50);

fn engine() -> Engine {
    Engine::start(Config { tx_coalesce: COALESCE, rx_handoff: Duration::from_secs(10), ..Config::default() }).unwrap()
}

fn peer() -> (UdpSocket, SocketAddr) {
    let p = UdpSocket::bind("127.0.0.1:0").unwrap();
    p.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let a = p.local_addr().unwrap();
    (p, a)
}

/// Drops `ep`, checks it was quick and that its port can be bound again.
fn close_and_rebind(ep: Endpoint, what: &str) {
    let local = ep.local_addr().unwrap();
    let t = Instant::now();
    drop(ep);
    let took = t.elapsed();
    assert!(took < FAST, "{what}: close took {took:?}");
    UdpSocket::bind(local).unwrap_or_else(|e| panic!("{what}: port {local} still taken after close: {e}"));
}

#[test]
fn close_after_a_send_does_not_wait_for_the_engine() {
    let engine = engine();
    let (p, dst) = peer();
    let mut buf = [0u8; 64];
    for i in 0..20u8 {
        let ep = Endpoint::with_engine(&engine, false).unwrap();
        ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
        // A first send is posted directly and left for the engine to reap
        // within the coalescing interval.
        ep.send_to(&[i; 8], dst).unwrap();
        close_and_rebind(ep, "after one send");
        let (n, _) = p.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[i; 8]);
    }
}

#[test]
fn close_flushes_what_was_queued() {
    let engine = engine();
    let (p, dst) = peer();
    p.set_nonblocking(false).unwrap();
    // (Within the default receive buffer of the peer.)
    const N: usize = 150;
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    for i in 0..N {
        ep.send_to(&(i as u32).to_be_bytes(), dst).unwrap();
    }
    let st = ep.stats();
    assert!(st.queued_posts > 0, "nothing was queued: {st:?}");
    close_and_rebind(ep, "after a burst");
    let mut buf = [0u8; 64];
    for i in 0..N {
        let (n, _) = p.recv_from(&mut buf).unwrap_or_else(|e| panic!("datagram {i} of {N} lost: {e}"));
        assert_eq!(&buf[..n], &(i as u32).to_be_bytes());
    }
}

#[test]
fn close_of_a_socket_its_application_receives_on() {
    let engine = engine();
    let (p, _) = peer();
    let mut buf = [0u8; 64];
    for _ in 0..10 {
        let ep = Endpoint::with_engine(&engine, false).unwrap();
        ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_read_timeout(Some(Duration::from_secs(2)));
        let me = ep.local_addr().unwrap();
        // Received on the application's thread while the engine sees the
        // socket: it parks it (its hand-off check is 10 s away).
        for k in 0..5u8 {
            p.send_to(&[k], me).unwrap();
            assert_eq!(ep.recv(&mut buf).unwrap(), 1);
        }
        ep.send_to(b"q", p.local_addr().unwrap()).unwrap();
        assert_eq!(p.recv_from(&mut buf).unwrap().0, 1);
        close_and_rebind(ep, "after receiving");
    }
}

/// A socket used for one query (send, receive the reply, close) leaves the
/// engine thread asleep: its lone send is reaped by its close, not by an
/// engine turn scheduled on the coalescing timer.
#[test]
fn a_one_query_socket_does_not_wake_the_engine() {
    let engine = engine();
    let (p, dst) = peer();
    let mut buf = [0u8; 64];
    // Let the engine settle into its sleep.
    std::thread::sleep(Duration::from_millis(20));
    let before = engine.wakeups();
    for i in 0..20u8 {
        let ep = Endpoint::with_engine(&engine, false).unwrap();
        ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_read_timeout(Some(Duration::from_secs(2)));
        // As the shim does for a socket in the program's epoll set: the
        // engine does not watch for the reply (the receive side's own
        // hand-off is not what this checks).
        ep.app_waits_on_socket();
        ep.send_to(&[i], dst).unwrap();
        let (_, from) = p.recv_from(&mut buf).unwrap();
        p.send_to(&[i], from).unwrap();
        assert_eq!(ep.recv(&mut buf).unwrap(), 1);
        close_and_rebind(ep, "after one query");
    }
    // Past every interval a send could have scheduled.
    std::thread::sleep(COALESCE + Duration::from_millis(100));
    assert_eq!(engine.wakeups() - before, 0, "the engine was woken for one-query sockets");
}

/// A sender whose second datagram comes after the coalescing interval posts
/// it directly, as when the engine reaped the first; within the interval it
/// queues and the engine sends it, as before.
#[test]
fn a_second_send_after_the_interval_posts_directly() {
    let interval = Duration::from_millis(30);
    let engine = Engine::start(Config { tx_coalesce: interval, ..Config::default() }).unwrap();
    let (p, dst) = peer();
    let mut buf = [0u8; 64];
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.send_to(b"1", dst).unwrap();
    std::thread::sleep(interval + Duration::from_millis(20));
    ep.send_to(b"2", dst).unwrap();
    let st = ep.stats();
    assert_eq!((st.direct_posts, st.queued_posts), (2, 0), "{st:?}");
    // Within the interval: queued, and sent by the engine without a flush.
    ep.send_to(b"3", dst).unwrap();
    assert_eq!(ep.stats().queued_posts, 1, "{:?}", ep.stats());
    for want in [b"1", b"2", b"3"] {
        let (n, _) = p.recv_from(&mut buf).unwrap();
        assert_eq!(&buf[..n], want);
    }
}
