//! EMP receives into the caller's buffer (`EmpEndpoint::recv_into`, as
//! libfabric's `fi_trecv`): the message lands in the vector the caller
//! posted, which comes back in the completion; a longer message completes
//! truncated with its true length; a cancel hands the buffer back as posted.

use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Op, PeerId, Status};
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn pair(cfg: EmpConfig) -> (EmpEndpoint, PeerId, EmpEndpoint, PeerId) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = EmpEndpoint::bind(any, cfg.clone()).unwrap();
    let b = EmpEndpoint::bind(any, cfg).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    (a, ab, b, ba)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8).collect()
}

/// The next completion of `op` on `e` (sends of the other kind skipped).
fn next(e: &EmpEndpoint, op: Op) -> Completion {
    loop {
        let c = e.wait(Some(WAIT)).expect("a completion within the wait");
        if c.op == op {
            return c;
        }
        assert_eq!(c.status, Status::Ok, "{c:?}");
    }
}

#[test]
fn a_message_lands_in_the_callers_buffer() {
    let (a, ab, b, ba) = pair(EmpConfig::default());
    // One frame, many frames, and a buffer longer than the message.
    for (i, (len, room)) in [(10, 10), (100_000, 100_000), (5_000, 8_192)].into_iter().enumerate() {
        let buf = vec![0xEE; room];
        let at = buf.as_ptr();
        b.recv_into(Some(ba), 7, 0, buf, i as u64).unwrap();
        a.send(ab, 7, pattern(len, i as u64), 0).unwrap();
        let c = next(&b, Op::Recv);
        assert_eq!((c.status, c.context, c.len, c.peer), (Status::Ok, i as u64, len, Some(ba)));
        assert_eq!(c.data, pattern(len, i as u64));
        // The caller's allocation came back: the bytes were placed in it.
        assert_eq!((c.data.as_ptr(), c.data.capacity()), (at, room));
        next(&a, Op::Send);
    }
}

#[test]
fn a_longer_message_is_truncated_with_its_length() {
    let (a, ab, b, ba) = pair(EmpConfig::default());
    b.recv_into(Some(ba), 1, 0, vec![0; 3_000], 5).unwrap();
    a.send(ab, 1, pattern(20_000, 3), 0).unwrap();
    let c = next(&b, Op::Recv);
    assert_eq!((c.status, c.len, c.data.len()), (Status::Truncated, 20_000, 3_000));
    assert_eq!(c.data, pattern(20_000, 3)[..3_000]);
    assert_eq!(b.counters().truncated, 1);
    // An empty buffer takes none of it.
    b.recv_into(None, 2, 0, Vec::new(), 6).unwrap();
    a.send(ab, 2, pattern(10, 4), 0).unwrap();
    let c = next(&b, Op::Recv);
    assert_eq!((c.status, c.len, c.data.len()), (Status::Truncated, 10, 0));
}

#[test]
fn cancel_and_shutdown_hand_the_buffer_back() {
    let (_a, _ab, mut b, ba) = pair(EmpConfig::default());
    let buf = pattern(4_096, 9);
    let at = buf.as_ptr();
    b.recv_into(Some(ba), 3, 0, buf, 1).unwrap();
    assert!(b.cancel(1));
    let c = next(&b, Op::Recv);
    assert_eq!((c.status, c.context, c.peer, c.len), (Status::Canceled, 1, None, 0));
    assert_eq!((c.data.as_ptr(), c.data.clone()), (at, pattern(4_096, 9)));
    b.recv_into(Some(ba), 3, 0, vec![1; 64], 2).unwrap();
    b.shutdown();
    let c = b.poll().expect("the closed receive");
    assert_eq!((c.status, c.context, c.data), (Status::Closed, 2, vec![1; 64]));
}

#[test]
fn an_unexpected_message_is_copied_into_a_later_buffer() {
    let cfg = EmpConfig { unexpected_messages: 4, unexpected_bytes: 1 << 20, ..EmpConfig::default() };
    let (a, ab, b, ba) = pair(cfg);
    a.send(ab, 9, pattern(6_000, 1), 0).unwrap();
    next(&a, Op::Send);
    b.recv_into(Some(ba), 9, 0, vec![0; 4_000], 3).unwrap();
    let c = next(&b, Op::Recv);
    assert_eq!((c.status, c.len, c.data), (Status::Truncated, 6_000, pattern(6_000, 1)[..4_000].to_vec()));
}
