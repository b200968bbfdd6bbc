//! EMP endpoints of both families on loopback: an endpoint bound to `[::]`
//! exchanges messages with an IPv4 endpoint both ways, and an address
//! vector takes `a.b.c.d` and `::ffff:a.b.c.d` as one peer, counted per
//! insert.

use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Op, PeerId, Status};
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

/// `n` completions of `e`, receives first.
fn take(e: &EmpEndpoint, n: usize) -> Vec<Completion> {
    let mut v: Vec<Completion> = (0..n).map(|_| e.wait(Some(WAIT)).expect("a completion within the wait")).collect();
    v.sort_by_key(|c| c.op != Op::Recv);
    v
}

/// One message each way between `a` (knowing b as `ab`) and `b`.
fn exchange(a: &EmpEndpoint, ab: PeerId, b: &EmpEndpoint, ba: PeerId) {
    b.recv(Some(ba), 1, 0, 64, 1).unwrap();
    a.recv(Some(ab), 2, 0, 64, 2).unwrap();
    a.send(ab, 1, b"from a".to_vec(), 3).unwrap();
    let got = take(b, 1).remove(0);
    assert_eq!((got.op, got.status, got.peer, got.data.as_slice()), (Op::Recv, Status::Ok, Some(ba), &b"from a"[..]));
    b.send(ba, 2, b"from b".to_vec(), 4).unwrap();
    let got = take(a, 2);
    assert_eq!((got[0].status, got[0].peer, got[0].data.as_slice()), (Status::Ok, Some(ab), &b"from b"[..]));
    assert_eq!((got[1].op, got[1].status), (Op::Send, Status::Ok));
    let got = take(b, 1).remove(0);
    assert_eq!((got.op, got.status), (Op::Send, Status::Ok));
    for e in [a, b] {
        assert_eq!(e.counters().unknown_peer, 0);
    }
}

fn v4(port: u16) -> SocketAddr {
    format!("127.0.0.1:{port}").parse().unwrap()
}

fn mapped(port: u16) -> SocketAddr {
    format!("[::ffff:127.0.0.1]:{port}").parse().unwrap()
}

#[test]
fn a_dual_stack_endpoint_talks_to_an_ipv4_one_in_either_form() {
    let six = EmpEndpoint::bind("[::]:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let four = EmpEndpoint::bind("127.0.0.1:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let (p6, p4) = (six.local_addr().port(), four.local_addr().port());
    // The IPv6 endpoint names its peer a.b.c.d, the IPv4 one ::ffff:a.b.c.d.
    let six_four = six.insert(v4(p4));
    let four_six = four.try_insert(mapped(p6)).unwrap();
    assert_eq!(six.peer_addr(six_four), Some(mapped(p4)));
    assert_eq!(four.peer_addr(four_six), Some(v4(p6)));
    exchange(&six, six_four, &four, four_six);
    // The other forms: the same peers.
    assert_eq!(six.insert(mapped(p4)), six_four);
    assert_eq!(four.insert(v4(p6)), four_six);
    exchange(&four, four_six, &six, six_four);
}

#[test]
fn the_address_vector_counts_inserts_of_one_peer() {
    let six = EmpEndpoint::bind("[::]:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let p = six.insert(v4(9));
    assert_eq!(six.insert(mapped(9)), p);
    assert_ne!(six.insert(v4(10)), p);
    assert!(six.remove(p));
    assert_eq!(six.peer_addr(p), Some(mapped(9)), "one insert still holds it");
    assert!(six.remove(p));
    assert_eq!(six.peer_addr(p), None);
    assert!(!six.remove(p));
}

#[test]
fn an_ipv4_endpoint_refuses_an_ipv6_peer() {
    let four = EmpEndpoint::bind("127.0.0.1:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let e = four.try_insert("[2001:db8::1]:5".parse().unwrap()).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
}
