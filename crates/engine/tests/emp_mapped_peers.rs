//! EMP endpoints of both families on loopback: an endpoint bound to `[::]`
//! exchanges messages with an IPv4 endpoint, and its address vector takes
//! `a.b.c.d` and `::ffff:a.b.c.d` as one peer.

use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Status};
use std::net::SocketAddr;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);

fn next(e: &EmpEndpoint) -> Completion {
    e.wait(Some(WAIT)).expect("a completion within the wait")
}

#[test]
fn probe() {
    let a = EmpEndpoint::bind("[::]:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let b = EmpEndpoint::bind("127.0.0.1:0".parse().unwrap(), EmpConfig::default()).unwrap();
    let a_addr: SocketAddr = format!("127.0.0.1:{}", a.local_addr().port()).parse().unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a_addr);
    b.recv(Some(ba), 1, 0, 64, 1).unwrap();
    a.recv(Some(ab), 2, 0, 64, 2).unwrap();
    a.send(ab, 1, b"hello".to_vec(), 3).unwrap();
    let got = b.wait(Some(Duration::from_secs(3)));
    eprintln!("b got {got:?}\na {:?}\nb {:?}", a.counters(), b.counters());
    let got = a.wait(Some(Duration::from_secs(3)));
    eprintln!("a got {got:?}\na {:?}\nb {:?}", a.counters(), b.counters());
    let _ = (next, Status::Ok);
}
