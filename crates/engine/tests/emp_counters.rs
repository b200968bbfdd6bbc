//! EMP counters are summed when asked: each completion is already counted
//! when the application sees it (no round publishes them late), a removed
//! peer's counts stay in the endpoint's total, and a removed peer has no
//! counters of its own.

use eudp_engine::emp::{EmpConfig, EmpEndpoint, Op, Status};
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

#[test]
fn completions_are_counted_when_seen_and_removed_peers_stay_in_the_total() {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = EmpEndpoint::bind(any, EmpConfig::default()).unwrap();
    let b = EmpEndpoint::bind(any, EmpConfig::default()).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    let n = 50u64;
    for i in 0..n {
        b.recv(Some(ba), i, 0, 64, i).unwrap();
        a.recv(Some(ab), i, 0, 64, i).unwrap();
        a.send(ab, i, vec![i as u8; 10], i).unwrap();
        let got = b.wait(Some(WAIT)).expect("the request");
        assert_eq!((got.op, got.status), (Op::Recv, Status::Ok));
        assert_eq!(b.counters().messages_received, i + 1, "b counted the request it completed");
        b.send(ba, i, got.data, i).unwrap();
        for _ in 0..2 {
            let c = a.wait(Some(WAIT)).expect("a completion");
            assert_eq!(c.status, Status::Ok, "{c:?}");
            let (k, p) = (a.counters(), a.peer_counters(ab).expect("b is in a's address vector"));
            match c.op {
                Op::Send => assert_eq!((k.messages_sent, p.messages_sent), (i + 1, i + 1)),
                Op::Recv => assert_eq!((k.messages_received, p.messages_received), (i + 1, i + 1)),
            }
        }
        assert_eq!(b.wait(Some(WAIT)).expect("the reply's completion").op, Op::Send);
    }
    let before = a.counters();
    assert!(a.remove(ab));
    assert!(a.peer_counters(ab).is_none(), "a removed peer has no counters");
    let after = a.counters();
    assert_eq!((after.messages_sent, after.messages_received), (n, n), "removed peers stay in the total");
    assert!(after.frames_sent >= before.frames_sent);
}
