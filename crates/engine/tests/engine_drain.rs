//! `Config::tx_caller_drain` (`EUDP_TX_CALLER_DRAIN`): on (the default), a
//! streaming sender's own thread sends L1 once it holds a batch; off, the
//! engine thread sends every queued batch and the sender's thread never
//! does. Either way a remainder short of a batch leaves by the coalescing
//! timer, with no flush. Loopback only; every wait is bounded.

use eudp_engine::{Config, Endpoint, Engine, StatsSnapshot};
use std::time::{Duration, Instant};

const LEN: usize = 1472;
const TOTAL: usize = 4001;
const COALESCE: Duration = Duration::from_millis(200);

/// Streams `TOTAL` datagrams (an odd count: the last batch is short) and
/// receives them all without flushing; returns the sender's stats.
fn stream(caller_drain: bool) -> StatsSnapshot {
    let cfg = Config {
        tx_caller_drain: caller_drain,
        tx_flush_batches: 2,
        max_msgs: 64,
        tx_coalesce: COALESCE,
        ..Config::default()
    };
    let engine = Engine::start(cfg).unwrap();
    let rx_engine = Engine::start(Config::default()).unwrap();
    let rx = Endpoint::with_engine(&rx_engine, false).unwrap();
    rx.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    rx.set_recv_buffer_size(16 << 20).unwrap();
    rx.set_read_timeout(Some(COALESCE + Duration::from_millis(800)));
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
    let t = Instant::now();
    while got < TOTAL && rx.recv(&mut buf).is_ok() {
        got += 1;
    }
    assert_eq!(got, TOTAL, "datagrams stranded after {:?}: {:?}", t.elapsed(), ep.stats());
    assert!(ep.flush(Duration::from_secs(1)));
    ep.stats()
}

#[test]
fn with_caller_drain_off_the_engine_sends_every_batch() {
    let st = stream(false);
    assert_eq!(st.caller_flushes, 0, "the sender's thread sent L1 itself: {st:?}");
    assert_eq!(st.datagrams_sent, TOTAL as u64, "{st:?}");
    // The engine sent in batches: far fewer calls than datagrams, and the
    // sender's thread posted (almost) nothing directly.
    assert!(st.gso_messages > 0 && st.send_calls < TOTAL as u64 / 20, "no batching: {st:?}");
    assert!(st.direct_posts < 10, "{st:?}");
}

#[test]
fn with_caller_drain_on_the_sender_thread_sends_batches() {
    let st = stream(true);
    assert!(st.caller_flushes > 0, "the sender's thread never sent L1: {st:?}");
    assert_eq!(st.datagrams_sent, TOTAL as u64, "{st:?}");
}
