//! `Config::tx_caller_drain` (`EUDP_TX_CALLER_DRAIN`): on (the default), a
//! streaming sender's own thread sends L1 once it holds a batch; off, the
//! engine thread sends every queued batch and the sender's thread never
//! does, and nothing waits for the coalescing timer (the engine is woken at
//! once). Loopback only; every wait is bounded.

use eudp_engine::{Config, Endpoint, Engine, StatsSnapshot};
use std::time::{Duration, Instant};

const LEN: usize = 1472;
const TOTAL: usize = 4000;

/// Streams `TOTAL` datagrams on an engine with a long coalescing interval,
/// then (with the engine draining) one lone datagram after a pause; returns
/// the sender's stats and how long the lone datagram took to arrive.
fn stream(caller_drain: bool) -> (StatsSnapshot, Duration) {
    let coalesce = Duration::from_secs(2);
    let cfg = Config { tx_caller_drain: caller_drain, tx_flush_batches: 2, max_msgs: 64, tx_coalesce: coalesce, ..Config::default() };
    let engine = Engine::start(cfg).unwrap();
    let rx_engine = Engine::start(Config::default()).unwrap();
    let rx = Endpoint::with_engine(&rx_engine, false).unwrap();
    rx.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    rx.set_recv_buffer_size(16 << 20).unwrap();
    rx.set_read_timeout(Some(Duration::from_millis(500)));
    let dst = rx.local_addr().unwrap();
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_send_buffer_size(4 << 20).unwrap();
    let mut buf = [0u8; 2048];
    let mut got = 0;
    for i in 0..TOTAL {
        ep.send_to(&[7u8; LEN], dst).unwrap();
        // Keep the receiver's socket from overflowing.
        if i % 512 == 511 {
            while got + 1024 < i && rx.recv(&mut buf).is_ok() {
                got += 1;
            }
        }
    }
    if caller_drain {
        // The remainder short of a batch would wait for the 2 s interval.
        assert!(ep.flush(Duration::from_secs(3)));
    }
    while got < TOTAL && rx.recv(&mut buf).is_ok() {
        got += 1;
    }
    assert_eq!(got, TOTAL, "datagrams lost or stranded: {:?}", ep.stats());
    if caller_drain {
        // (A lone datagram would wait for the 2 s interval: the stream is on.)
        return (ep.stats(), Duration::ZERO);
    }
    // A lone datagram: the engine is woken for it at once, the coalescing
    // interval plays no part.
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    ep.send_to(&[7u8; LEN], dst).unwrap();
    assert_eq!(rx.recv(&mut buf).ok(), Some(LEN), "the lone datagram was stranded: {:?}", ep.stats());
    let took = t.elapsed();
    assert!(ep.flush(Duration::from_secs(1)));
    (ep.stats(), took)
}

#[test]
fn with_caller_drain_off_the_engine_sends_every_batch() {
    let (st, took) = stream(false);
    assert_eq!(st.caller_flushes, 0, "the sender's thread sent L1 itself: {st:?}");
    assert_eq!(st.datagrams_sent, TOTAL as u64 + 1, "{st:?}");
    // The engine sent in batches: far fewer calls than datagrams.
    assert!(st.gso_messages > 0 && st.send_calls < TOTAL as u64 / 4, "no batching: {st:?}");
    assert!(took < Duration::from_millis(100), "the lone datagram waited {took:?}: {st:?}");
}

#[test]
fn with_caller_drain_on_the_sender_thread_sends_batches() {
    let (st, _) = stream(true);
    assert!(st.caller_flushes > 0, "the sender's thread never sent L1: {st:?}");
    assert_eq!(st.datagrams_sent, TOTAL as u64, "{st:?}");
}
