//! A remainder that waits out its coalescing interval in L1 leaves as soon
//! as the thread that queued it goes to sleep (`Engine::send_coalesced_now`,
//! called by a blocking receive): a program that sent a burst and now
//! waits for the answer must not wait the interval for its last datagrams
//! to leave. Another thread's sleep leaves it alone. The interval is set to
//! 2 s so that the old behaviour (the remainder leaves by the timer) fails
//! the timing bounds by a wide margin. Loopback only; every wait is bounded.

use eudp_engine::{Config, Endpoint, Engine};
use std::time::{Duration, Instant};

const LEN: usize = 100;
const BURST: usize = 100;
const INTERVAL: Duration = Duration::from_secs(2);

fn endpoint(engine: &Engine) -> Endpoint {
    let ep = Endpoint::with_engine(engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_send_buffer_size(1 << 20).unwrap();
    ep.set_recv_buffer_size(1 << 20).unwrap();
    ep
}

/// Sends a burst from `ep` to `dst` and checks that part of it is still
/// queued for the coalescing timer (else the cases below test nothing).
fn burst(ep: &Endpoint, dst: std::net::SocketAddr) {
    for i in 0..BURST {
        ep.send_to(&[i as u8; LEN], dst).unwrap();
    }
    let st = ep.stats();
    assert!(st.datagrams_sent < BURST as u64, "nothing left to coalesce: {st:?}");
}

#[test]
fn a_remainder_leaves_when_its_thread_sleeps_in_a_receive() {
    let engine = Engine::start(Config { tx_coalesce: INTERVAL, ..Config::default() }).unwrap();
    let peer_engine = Engine::start(Config::default()).unwrap();
    let ep = endpoint(&engine);
    let peer = endpoint(&peer_engine);
    let (me, there) = (ep.local_addr().unwrap(), peer.local_addr().unwrap());
    let echo = std::thread::spawn(move || {
        peer.set_read_timeout(Some(Duration::from_secs(5)));
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while got < BURST {
            match peer.recv(&mut buf) {
                Ok(n) => {
                    assert_eq!((n, buf[0]), (LEN, got as u8), "datagram {got} out of order or cut");
                    got += 1;
                }
                Err(e) => panic!("peer: {got} of {BURST} datagrams, then {e}"),
            }
        }
        peer.send_to(b"all here", me).unwrap();
    });
    burst(&ep, there);
    assert!(engine.coalesced_pending());
    let start = Instant::now();
    ep.set_read_timeout(None);
    let mut buf = [0u8; 64];
    let n = ep.recv(&mut buf).unwrap();
    let waited = start.elapsed();
    assert_eq!(&buf[..n], b"all here");
    echo.join().unwrap();
    assert!(waited < INTERVAL / 2, "the answer took {waited:?}: the remainder waited for the timer");
    let st = ep.stats();
    assert_eq!(st.sleep_flushes, 1, "{st:?}");
    assert_eq!(st.datagrams_sent, BURST as u64, "{st:?}");
    assert_eq!(engine.sleep_flushes(), 1);
}

#[test]
fn a_receive_with_a_timeout_sends_the_remainder_too() {
    let engine = Engine::start(Config { tx_coalesce: INTERVAL, ..Config::default() }).unwrap();
    let ep = endpoint(&engine);
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    burst(&ep, sink.local_addr().unwrap());
    // Nothing will answer: the receive sleeps out its timeout, and the
    // remainder must leave when it begins, not when the interval ends.
    ep.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 64];
    assert!(ep.recv(&mut buf).is_err());
    let st = ep.stats();
    assert_eq!(st.datagrams_sent, BURST as u64, "{st:?}");
    assert_eq!(st.sleep_flushes, 1, "{st:?}");
    let mut got = 0;
    let mut b = [0u8; 2048];
    while got < BURST {
        assert_eq!(sink.recv(&mut b).unwrap(), LEN);
        got += 1;
    }
}

#[test]
fn another_threads_sleep_leaves_the_remainder_to_its_interval() {
    let engine = Engine::start(Config { tx_coalesce: INTERVAL, ..Config::default() }).unwrap();
    let ep = endpoint(&engine);
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let start = Instant::now();
    burst(&ep, sink.local_addr().unwrap());
    let sent_before = ep.stats().datagrams_sent;
    // A second thread of the same engine sleeps in a receive of its own.
    let idle = endpoint(&engine);
    std::thread::spawn(move || {
        idle.set_read_timeout(Some(Duration::from_millis(200)));
        let mut buf = [0u8; 64];
        assert!(idle.recv(&mut buf).is_err());
    })
    .join()
    .unwrap();
    let st = ep.stats();
    assert!(start.elapsed() < INTERVAL, "test thread stalled: timing not checkable");
    assert_eq!(st.datagrams_sent, sent_before, "another thread's sleep sent the remainder: {st:?}");
    assert_eq!(st.sleep_flushes, 0, "{st:?}");
    assert!(engine.coalesced_pending());
    // The thread that queued it sends it on its own call.
    assert_eq!(engine.send_coalesced_now(), 1);
    assert_eq!(ep.stats().datagrams_sent, BURST as u64);
    // Once sent, there is nothing left to send.
    assert_eq!(engine.send_coalesced_now(), 0);
}
