//! The completion queue's bound: an application that posts and never
//! reads its completions is refused with `WouldBlock` at
//! `EmpConfig::completion_queue` posts, loses nothing it posted, and gets
//! one post back per completion it takes.

use eudp_engine::emp::{EmpConfig, EmpEndpoint, Op, Status};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
const LIMIT: usize = 4;

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

#[test]
fn posts_beyond_the_bound_wait_for_completions_to_be_read() {
    let cfg = EmpConfig { rto_initial: Duration::from_millis(5), ..EmpConfig::default() };
    let a = EmpEndpoint::bind(any(), EmpConfig { completion_queue: LIMIT, ..cfg.clone() }).unwrap();
    let b = EmpEndpoint::bind(any(), cfg).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    for i in 0..16u64 {
        b.recv(Some(ba), 7, 0, 64, i).unwrap();
    }

    // Three sends and a receive fill the bound; nothing more gets in,
    // whether a send or a receive, however long nobody reads.
    for i in 0..3u64 {
        a.send(ab, 7, vec![i as u8; 10], i).unwrap();
    }
    a.recv(Some(ab), 9, 0, 64, 100).unwrap();
    for _ in 0..3 {
        assert_eq!(a.send(ab, 7, vec![9; 10], 50).unwrap_err().kind(), ErrorKind::WouldBlock);
        assert_eq!(a.recv(Some(ab), 9, 0, 64, 51).unwrap_err().kind(), ErrorKind::WouldBlock);
        std::thread::sleep(Duration::from_millis(20));
    }

    // Every admitted send is delivered and completes; each completion read
    // lets exactly one more post in.
    let mut sends = 0;
    while sends < 3 {
        let c = a.wait(Some(WAIT)).expect("a send's completion");
        assert_eq!((c.op, c.status), (Op::Send, Status::Ok), "{c:?}");
        sends += 1;
        a.send(ab, 7, vec![3 + sends as u8; 10], 10 + sends).unwrap();
        assert_eq!(a.send(ab, 7, vec![9; 10], 50).unwrap_err().kind(), ErrorKind::WouldBlock);
    }
    let mut got = Vec::new();
    while got.len() < 6 {
        let c = b.wait(Some(WAIT)).expect("b's receive");
        assert_eq!((c.op, c.status), (Op::Recv, Status::Ok), "{c:?}");
        got.push(c.data[0]);
    }
    assert_eq!(got, vec![0, 1, 2, 4, 5, 6], "the refused posts never went out");

    // The posted receive still completes normally once its message comes.
    b.send(ba, 9, b"reply".to_vec(), 200).unwrap();
    let mut recv_done = false;
    for _ in 0..4 {
        let c = a.wait(Some(WAIT)).expect("a's completions");
        if c.op == Op::Recv {
            assert_eq!((c.status, c.context, c.data.as_slice()), (Status::Ok, 100, &b"reply"[..]));
            recv_done = true;
        }
    }
    assert!(recv_done);
    assert_eq!(a.counters().messages_sent, 6);
}
