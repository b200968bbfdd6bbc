//! The asynchronous receiver over loopback: datagrams lent in place, GRO
//! runs split without a copy, buffers given back and reused.

use eudp_engine::async_udp::{AsyncReceiver, RecvConfig, RxLease};
use std::net::UdpSocket;
use std::time::Duration;

fn payload(seq: u32, len: usize) -> Vec<u8> {
    let mut v = vec![(seq % 251) as u8; len];
    v[..4].copy_from_slice(&seq.to_le_bytes());
    v
}

/// A receiver, or `None` (with a message) where the kernel has no io_uring
/// provided-buffer rings.
fn receiver(cfg: RecvConfig) -> Option<AsyncReceiver> {
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    match AsyncReceiver::new(sock, cfg) {
        Ok(r) => Some(r),
        Err(e) => {
            eprintln!("SKIPPED: no io_uring provided-buffer receive here: {e}");
            None
        }
    }
}

/// Receives until `want` datagrams arrived, checking each and giving every
/// buffer back; returns the sequence numbers in arrival order.
fn take(r: &mut AsyncReceiver, want: usize, len: usize) -> (Vec<u32>, usize) {
    let mut seen = Vec::new();
    let mut runs = 0;
    for _ in 0..500 {
        if seen.len() >= want {
            break;
        }
        let mut got: Vec<RxLease> = Vec::new();
        r.recv(&mut got, 16, Some(Duration::from_millis(20))).unwrap();
        for l in got {
            runs += usize::from(l.gro_segment().is_some());
            for d in r.datagrams(&l) {
                let seq = u32::from_le_bytes(d[..4].try_into().unwrap());
                assert_eq!(d, &payload(seq, len)[..], "datagram {seq}");
                seen.push(seq);
            }
            r.release(l).unwrap();
        }
    }
    (seen, runs)
}

#[test]
fn datagrams_arrive_in_place_and_buffers_come_back() {
    let Some(mut r) = receiver(RecvConfig { buffers: 4, buffer_size: 4096, gro: false }) else { return };
    let dst = r.socket().local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    // More datagrams than buffers, in rounds the ring can hold: every
    // buffer is lent and given back several times.
    let mut all = Vec::new();
    for round in 0..10u32 {
        for i in 0..4 {
            tx.send_to(&payload(round * 4 + i, 1000), dst).unwrap();
        }
        let (seen, _) = take(&mut r, 4, 1000);
        all.extend(seen);
    }
    assert_eq!(all, (0..40).collect::<Vec<_>>());
}

#[test]
fn a_gro_run_is_split_in_place() {
    let Some(mut r) = receiver(RecvConfig::default()) else { return };
    let dst = r.socket().local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(dst).unwrap();
    let mut s = eudp_engine::async_udp::AsyncSender::new(tx, eudp_engine::async_udp::AsyncConfig::default()).unwrap();
    let batch =
        (0..10).map(|t| eudp_engine::async_udp::Datagram { buf: payload(t, 1200), token: 0, dst: None }).collect();
    s.submit_batch(batch).unwrap();
    let (seen, runs) = take(&mut r, 10, 1200);
    assert_eq!(seen, (0..10).collect::<Vec<_>>());
    assert!(runs >= 1, "the GSO run arrives as a GRO run");
}

#[test]
fn a_lease_reports_its_source() {
    let Some(mut r) = receiver(RecvConfig { buffers: 2, buffer_size: 2048, gro: false }) else { return };
    let dst = r.socket().local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(&payload(7, 100), dst).unwrap();
    let mut got = Vec::new();
    while got.is_empty() {
        r.recv(&mut got, 1, Some(Duration::from_secs(2))).unwrap();
    }
    let l = got.pop().unwrap();
    assert_eq!(l.src(), Some(tx.local_addr().unwrap()));
    assert_eq!(l.len(), 100);
    assert!(!l.truncated());
    r.release(l).unwrap();
}

#[test]
fn a_dry_ring_is_counted_and_the_held_datagrams_follow_once_buffers_return() {
    let Some(mut r) = receiver(RecvConfig { buffers: 2, buffer_size: 2048, gro: false }) else { return };
    let dst = r.socket().local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    for seq in 0..6 {
        tx.send_to(&payload(seq, 500), dst).unwrap();
    }
    // Hold every buffer: the kernel fills both, finds the ring empty for the
    // third and ends the receive.
    let mut held: Vec<RxLease> = Vec::new();
    for _ in 0..100 {
        if held.len() == 2 && r.stats().ring_dry > 0 {
            break;
        }
        r.recv(&mut held, 8, Some(Duration::from_millis(20))).unwrap();
    }
    assert_eq!(held.len(), 2, "two buffers, two datagrams lent");
    assert!(r.stats().ring_dry >= 1, "the dry ring is counted: {:?}", r.stats());
    let mut seen: Vec<u32> = Vec::new();
    for l in held {
        seen.extend(r.datagrams(&l).map(|d| u32::from_le_bytes(d[..4].try_into().unwrap())));
        r.release(l).unwrap();
    }
    // The others waited in the socket and arrive after the re-arm.
    let (rest, _) = take(&mut r, 4, 500);
    seen.extend(rest);
    assert_eq!(seen, (0..6).collect::<Vec<_>>());
    let st = r.stats();
    assert_eq!(st.received, 6);
    assert!(st.syscalls >= 2, "arming and waiting are counted: {st:?}");
}
