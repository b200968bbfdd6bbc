//! EMP endpoints on loopback: ping-pong, a 16 MiB message, many small
//! messages in order, matching rules, the unmatched drop and its recovery,
//! the unexpected queue, cancel, a dead peer, the pollable completion
//! queue, and hostile datagrams counted.

use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Op, PeerId, Status};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn cfg() -> EmpConfig {
    EmpConfig { rto_initial: Duration::from_millis(5), ..EmpConfig::default() }
}

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

/// Two endpoints that know each other: (a, a's id of b, b, b's id of a).
fn pair(ca: EmpConfig, cb: EmpConfig) -> (EmpEndpoint, PeerId, EmpEndpoint, PeerId) {
    let a = EmpEndpoint::bind(any(), ca).unwrap();
    let b = EmpEndpoint::bind(any(), cb).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    (a, ab, b, ba)
}

fn next(e: &EmpEndpoint) -> Completion {
    e.wait(Some(WAIT)).expect("a completion within the wait")
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8).collect()
}

#[test]
fn ping_pong_of_ten_bytes() {
    let (a, ab, b, ba) = pair(cfg(), cfg());
    for i in 0..200u64 {
        b.recv(Some(ba), 7, 0, 64, i).unwrap();
        a.recv(Some(ab), 8, 0, 64, i).unwrap();
        a.send(ab, 7, pattern(10, i), i).unwrap();
        let got = next(&b);
        assert_eq!((got.op, got.status, got.data.clone(), got.peer), (Op::Recv, Status::Ok, pattern(10, i), Some(ba)));
        b.send(ba, 8, got.data, i).unwrap();
        let mut seen = 0;
        while seen < 2 {
            let c = next(&a);
            assert_eq!(c.status, Status::Ok, "{c:?}");
            if c.op == Op::Recv {
                assert_eq!(c.data, pattern(10, i));
            }
            seen += 1;
        }
        assert_eq!(next(&b).op, Op::Send);
    }
    let c = a.counters();
    assert_eq!(c.messages_sent, 200);
    assert_eq!(c.messages_received, 200);
}

/// A ping-pong of `n` messages of 10 bytes; b's counters after the last.
fn echo(ca: EmpConfig, cb: EmpConfig, n: u64) -> (eudp_engine::emp::EmpCounters, eudp_engine::emp::EmpCounters) {
    let (a, ab, b, ba) = pair(ca, cb);
    for i in 0..n {
        b.recv(Some(ba), 7, 0, 64, i).unwrap();
        a.recv(Some(ab), 8, 0, 64, i).unwrap();
        a.send(ab, 7, pattern(10, i), i).unwrap();
        let got = next(&b);
        assert_eq!((got.status, got.data.clone()), (Status::Ok, pattern(10, i)));
        b.send(ba, 8, got.data, i).unwrap();
        let mut ops = [next(&a), next(&a)].map(|c| (c.op == Op::Recv, c.status, c.data));
        ops.sort_by_key(|o| o.0);
        assert_eq!(ops, [(false, Status::Ok, vec![]), (true, Status::Ok, pattern(10, i))]);
        assert_eq!(next(&b).op, Op::Send);
    }
    let (mut ka, mut kb) = (a.counters(), b.counters());
    let until = Instant::now() + WAIT;
    while (ka.messages_sent < n || kb.messages_sent < n) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
        (ka, kb) = (a.counters(), b.counters());
    }
    (ka, kb)
}

#[test]
fn replies_carry_the_acknowledgments_of_requests() {
    let (a, b) = echo(cfg(), cfg(), 100);
    // A reply that comes within the delay carries the request's ack; one
    // that comes later (a loaded host) finds it sent alone.
    assert!(b.acks_piggybacked > 0, "{b:?}");
    assert!(b.acks_piggybacked + b.acks_sent >= 100, "{b:?}");
    assert!(a.acks_received <= b.acks_piggybacked + b.acks_sent, "{a:?}\n{b:?}");
    // A carried acknowledgment is no frame of its own.
    assert_eq!(b.frames_sent, 100 + b.retransmits + b.acks_sent + b.naks_sent, "{b:?}");
}

#[test]
fn without_a_delay_every_acknowledgment_goes_alone() {
    let now = EmpConfig { ack_delay: Duration::ZERO, ..cfg() };
    let (_, b) = echo(now.clone(), now, 50);
    assert_eq!(b.acks_piggybacked, 0, "{b:?}");
    assert!(b.acks_sent >= 50, "{b:?}");
}

#[test]
fn a_message_without_a_reply_is_acknowledged_when_the_delay_ends() {
    let (a, ab, b, ba) = pair(cfg(), cfg());
    b.recv(Some(ba), 1, 0, 64, 1).unwrap();
    a.send(ab, 1, pattern(10, 1), 2).unwrap();
    assert_eq!(next(&b).status, Status::Ok);
    let sent = next(&a);
    assert_eq!((sent.op, sent.status), (Op::Send, Status::Ok));
    let until = Instant::now() + WAIT;
    while b.counters().acks_sent == 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(1));
    }
    let k = b.counters();
    assert!(k.acks_sent >= 1 && k.acks_piggybacked == 0, "{k:?}");
}

#[test]
fn a_sixteen_mib_message_arrives_byte_exact() {
    let (a, ab, b, ba) = pair(cfg(), cfg());
    let msg = pattern(16 << 20, 3);
    b.recv(Some(ba), 1, 0, 16 << 20, 99).unwrap();
    a.send(ab, 1, msg.clone(), 5).unwrap();
    let got = next(&b);
    assert_eq!((got.status, got.len, got.context), (Status::Ok, 16 << 20, 99));
    assert!(got.data == msg, "bytes differ");
    let sent = next(&a);
    assert_eq!((sent.op, sent.status, sent.context), (Op::Send, Status::Ok, 5));
}

#[test]
fn ten_thousand_small_messages_in_order() {
    let (a, ab, b, ba) = pair(cfg(), cfg());
    let n = 10_000u64;
    for i in 0..n {
        b.recv(Some(ba), 0, u64::MAX, 64, i).unwrap();
    }
    let mut sent = 0;
    let mut acked = 0;
    while sent < n {
        match a.send(ab, sent, pattern(1 + (sent % 50) as usize, sent), sent) {
            Ok(()) => sent += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert_eq!(next(&a).status, Status::Ok);
                acked += 1;
            }
            Err(e) => panic!("{e}"),
        }
    }
    for i in 0..n {
        let c = next(&b);
        assert_eq!((c.context, c.tag, c.status), (i, i, Status::Ok), "in posting and sending order");
        assert_eq!(c.data, pattern(1 + (i % 50) as usize, i));
    }
    while acked < n {
        assert_eq!(next(&a).status, Status::Ok);
        acked += 1;
    }
}

#[test]
fn tags_and_ignore_masks_match_in_posting_order() {
    let (a, ab, b, _) = pair(cfg(), cfg());
    b.recv(None, 0x100, 0xff, 64, 1).unwrap(); // any tag 0x1__
    b.recv(None, 0x105, 0, 64, 2).unwrap(); // exactly 0x105
    b.recv(Some(PeerId(77)), 0x200, 0, 64, 3).unwrap(); // another source: never
    b.recv(None, 0x200, 0, 64, 4).unwrap();
    a.send(ab, 0x105, b"first".to_vec(), 0).unwrap();
    a.send(ab, 0x105, b"second".to_vec(), 0).unwrap();
    a.send(ab, 0x200, b"third".to_vec(), 0).unwrap();
    let got: Vec<(u64, Vec<u8>)> = (0..3).map(|_| next(&b)).map(|c| (c.context, c.data)).collect();
    assert_eq!(got, vec![(1, b"first".to_vec()), (2, b"second".to_vec()), (4, b"third".to_vec())]);
    assert!(b.cancel(3));
    let c = next(&b);
    assert_eq!((c.context, c.status, c.op), (3, Status::Canceled, Op::Recv));
    // Matched already, or never posted: nothing to cancel.
    assert!(!b.cancel(1));
    assert!(!b.cancel(12345));
}

#[test]
fn cancel_sees_a_receive_posted_just_before_and_counters_exist_from_insert() {
    let mut a = EmpEndpoint::bind(any(), cfg()).unwrap();
    let peer = a.insert("127.0.0.1:9".parse().unwrap());
    // Before any round accounted for the peer, its counters read as zero.
    assert_eq!(a.peer_counters(peer), Some(Default::default()));
    assert_eq!(a.peer_counters(PeerId(999)), None);
    a.recv(Some(peer), 1, 0, 16, 5).unwrap();
    assert!(a.cancel(5));
    assert_eq!(next(&a).status, Status::Canceled);
    assert!(!a.stopped());
    a.shutdown();
    assert!(a.stopped());
    assert!(a.send(peer, 1, b"x".to_vec(), 1).is_err());
}

#[test]
fn an_unmatched_message_is_dropped_then_delivered_once_posted() {
    let (a, ab, b, ba) = pair(cfg(), cfg());
    a.send(ab, 9, b"late".to_vec(), 1).unwrap();
    let t = Instant::now();
    while b.counters().unmatched == 0 {
        assert!(t.elapsed() < WAIT, "never counted as unmatched");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(b.poll().is_none());
    b.recv(Some(ba), 9, 0, 64, 2).unwrap();
    let c = next(&b);
    assert_eq!((c.context, c.data.as_slice(), c.status), (2, &b"late"[..], Status::Ok));
    assert_eq!(next(&a).status, Status::Ok);
    assert!(a.counters().retransmits > 0);
    assert!(b.peer_counters(ba).unwrap().unmatched > 0);
}

#[test]
fn the_unexpected_queue_holds_messages_for_later_receives() {
    let cb = EmpConfig { unexpected_messages: 4, unexpected_bytes: 1 << 16, ..cfg() };
    let (a, ab, b, _) = pair(cfg(), cb);
    for i in 0..3u64 {
        a.send(ab, i, pattern(100, i), i).unwrap();
    }
    for _ in 0..3 {
        assert_eq!(next(&a).status, Status::Ok, "acknowledged into the queue");
    }
    assert_eq!(b.counters().unmatched, 0);
    b.recv(None, 2, 0, 10, 20).unwrap();
    let c = next(&b);
    assert_eq!((c.context, c.tag, c.status, c.len, c.data.clone()), (20, 2, Status::Truncated, 100, pattern(10, 2)));
    b.recv(None, 0, 0xff, 1000, 21).unwrap();
    let c = next(&b);
    assert_eq!((c.context, c.tag, c.data.clone()), (21, 0, pattern(100, 0)));
}

#[test]
fn a_peer_that_never_answers_times_out() {
    let silent = UdpSocket::bind(any()).unwrap();
    let c = EmpConfig { deadline: Duration::from_millis(300), rto_max: Duration::from_millis(50), ..cfg() };
    let a = EmpEndpoint::bind(any(), c).unwrap();
    let p = a.insert(silent.local_addr().unwrap());
    let t = Instant::now();
    a.send(p, 1, b"hello?".to_vec(), 42).unwrap();
    let done = next(&a);
    assert_eq!((done.context, done.status), (42, Status::TimedOut));
    assert!(t.elapsed() < Duration::from_secs(3), "took {:?}", t.elapsed());
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(a.counters().give_ups, 1);
}

#[test]
fn the_completion_fd_becomes_readable() {
    use eudp_engine::sys::poll::has_data;
    use std::os::fd::AsRawFd;
    let (a, ab, b, ba) = pair(cfg(), cfg());
    assert!(!has_data(b.as_raw_fd()));
    b.recv(Some(ba), 1, 0, 8, 1).unwrap();
    a.send(ab, 1, b"x".to_vec(), 1).unwrap();
    let t = Instant::now();
    while !has_data(b.as_raw_fd()) {
        assert!(t.elapsed() < WAIT);
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(b.poll().is_some());
    assert!(!has_data(b.as_raw_fd()));
}

#[test]
fn malformed_and_unknown_peer_frames_are_counted() {
    let (a, _ab, b, _ba) = pair(cfg(), cfg());
    let stranger = UdpSocket::bind(any()).unwrap();
    stranger.send_to(b"EM\x01\x01garbage-from-a-stranger", b.local_addr()).unwrap();
    let t = Instant::now();
    while b.counters().unknown_peer < 1 {
        assert!(t.elapsed() < WAIT, "{:?}", b.counters());
        std::thread::sleep(Duration::from_millis(5));
    }
    // Then b learns the stranger, whose next datagrams are not EMP frames.
    let s_id = b.insert(stranger.local_addr().unwrap());
    std::thread::sleep(Duration::from_millis(20));
    for junk in [&b"EM"[..], b"EM\x01\x09xxxxxxxxxxxxxxxxxxxx", b"XX\x01\x01aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", b""] {
        stranger.send_to(junk, b.local_addr()).unwrap();
    }
    let t = Instant::now();
    while b.counters().malformed < 4 || b.counters().unknown_peer < 1 {
        assert!(t.elapsed() < WAIT, "{:?}", b.counters());
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(b.counters().malformed, 4);
    assert_eq!(b.counters().unknown_peer, 1);
    assert_eq!(b.peer_counters(s_id).unwrap().messages_received, 0);
    drop(a);
}
