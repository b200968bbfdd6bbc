//! What an endpoint's ring holds unread when it is dropped is counted
//! (`drop_close`), so that sent = received + counted drops holds across a
//! close (docs/promises.md, "Datagrams"). Loopback only.

use eudp_engine::{Config, Endpoint, Engine};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// Sends `n + m` datagrams to a fresh endpoint, receives `n`, waits (at
/// most 5 s) for the engine to take the other `m` into the ring, drops
/// the endpoint; returns its final counters and the datagrams it held.
fn close_with_unread(n: usize, m: usize) -> (eudp_engine::StatsSnapshot, u64) {
    let engine = Engine::start(Config::default()).unwrap();
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    let to = ep.local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..n + m {
        tx.send_to(&(i as u32).to_be_bytes(), to).unwrap();
    }
    let mut buf = [0u8; 64];
    for i in 0..n {
        let got = ep.recv_from(&mut buf).unwrap();
        assert_eq!(buf[..got.0], (i as u32).to_be_bytes(), "datagram {i} in order");
    }
    let t0 = Instant::now();
    while ep.unread() < m as u64 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let held = ep.unread();
    let last = ep.final_counters();
    drop(ep);
    let fin = last.lock().unwrap().take().expect("the drop leaves its final counters");
    (fin, held)
}

#[test]
fn a_close_counts_what_the_ring_held_unread() {
    let (n, m) = (20, 13);
    let (fin, held) = close_with_unread(n, m);
    assert_eq!(held, m as u64, "the engine took every datagram into the ring");
    assert_eq!(fin.drop_close, m as u64, "{fin:?}");
    let drops = fin.drop_close + fin.drop_ring_full + fin.drop_truncated + fin.socket_drops.unwrap_or(0);
    assert_eq!((n + m) as u64, n as u64 + drops, "sent = received + counted drops: {fin:?}");
    assert_eq!(fin.datagrams_received, (n + m) as u64, "{fin:?}");
}

#[test]
fn a_close_with_nothing_unread_counts_nothing() {
    let (fin, held) = close_with_unread(9, 0);
    assert_eq!((held, fin.drop_close), (0, 0), "{fin:?}");
}
