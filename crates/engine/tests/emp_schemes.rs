//! Every EMP scheme (base and the two-thread SO, RO, DSR, SR) on
//! loopback behaves as base does: ping-pong, a 16 MiB message byte-exact,
//! many small messages in order with a small window, an unmatched message
//! delivered once its receive is posted, a dead peer timing out.

use eudp_engine::emp::{Completion, EmpConfig, EmpEndpoint, Op, PeerId, Scheme, Status};
use std::net::{SocketAddr, UdpSocket};
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(20);

fn cfg(scheme: Scheme) -> EmpConfig {
    EmpConfig { rto_initial: Duration::from_millis(5), scheme, ..EmpConfig::default() }
}

fn any() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn pair(ca: EmpConfig, cb: EmpConfig) -> (EmpEndpoint, PeerId, EmpEndpoint, PeerId) {
    let a = EmpEndpoint::bind(any(), ca).unwrap();
    let b = EmpEndpoint::bind(any(), cb).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    (a, ab, b, ba)
}

fn next(e: &EmpEndpoint, s: Scheme) -> Completion {
    e.wait(Some(WAIT)).unwrap_or_else(|| panic!("{s}: no completion within the wait"))
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len).map(|i| (i as u64).wrapping_mul(2654435761).wrapping_add(seed) as u8).collect()
}

#[test]
fn ping_pong_of_ten_bytes_in_every_scheme() {
    for s in Scheme::ALL {
        let (a, ab, b, ba) = pair(cfg(s), cfg(s));
        assert_eq!(a.scheme(), s);
        for i in 0..1000u64 {
            b.recv(Some(ba), 7, 0, 64, i).unwrap();
            a.recv(Some(ab), 8, 0, 64, i).unwrap();
            a.send(ab, 7, pattern(10, i), i).unwrap();
            let got = next(&b, s);
            assert_eq!((got.op, got.status, got.data.clone()), (Op::Recv, Status::Ok, pattern(10, i)), "{s}");
            b.send(ba, 8, got.data, i).unwrap();
            for _ in 0..2 {
                let c = next(&a, s);
                assert_eq!(c.status, Status::Ok, "{s}: {c:?}");
                if c.op == Op::Recv {
                    assert_eq!(c.data, pattern(10, i), "{s}");
                }
            }
            assert_eq!(next(&b, s).op, Op::Send, "{s}");
        }
        let t = Instant::now();
        while a.counters().messages_received < 1000 && t.elapsed() < WAIT {
            std::thread::sleep(Duration::from_millis(2));
        }
        assert_eq!((a.counters().messages_sent, a.counters().messages_received), (1000, 1000), "{s}");
    }
}

#[test]
fn a_sixteen_mib_message_arrives_byte_exact_in_every_scheme() {
    let msg = pattern(16 << 20, 3);
    for s in Scheme::ALL {
        let (a, ab, b, ba) = pair(cfg(s), cfg(s));
        b.recv(Some(ba), 1, 0, 16 << 20, 99).unwrap();
        a.send(ab, 1, msg.clone(), 5).unwrap();
        let got = next(&b, s);
        assert_eq!((got.status, got.len, got.context), (Status::Ok, 16 << 20, 99), "{s}");
        assert!(got.data == msg, "{s}: bytes differ");
        let sent = next(&a, s);
        assert_eq!((sent.op, sent.status, sent.context), (Op::Send, Status::Ok, 5), "{s}");
    }
}

#[test]
fn five_thousand_small_messages_in_order_with_a_small_window_in_every_scheme() {
    for s in Scheme::ALL {
        let c = EmpConfig { window: 8, ack_group: 4, ..cfg(s) };
        let (a, ab, b, ba) = pair(c.clone(), c);
        let n = 5_000u64;
        for i in 0..n {
            b.recv(Some(ba), 0, u64::MAX, 64, i).unwrap();
        }
        let (mut sent, mut acked) = (0, 0);
        while sent < n {
            match a.send(ab, sent, pattern(1 + (sent % 50) as usize, sent), sent) {
                Ok(()) => sent += 1,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    assert_eq!(next(&a, s).status, Status::Ok, "{s}");
                    acked += 1;
                }
                Err(e) => panic!("{s}: {e}"),
            }
        }
        for i in 0..n {
            let c = next(&b, s);
            assert_eq!((c.context, c.tag, c.status), (i, i, Status::Ok), "{s}: in posting and sending order");
            assert_eq!(c.data, pattern(1 + (i % 50) as usize, i), "{s}");
        }
        while acked < n {
            assert_eq!(next(&a, s).status, Status::Ok, "{s}");
            acked += 1;
        }
    }
}

#[test]
fn an_unmatched_message_is_delivered_once_posted_in_every_scheme() {
    for s in Scheme::ALL {
        let (a, ab, b, ba) = pair(cfg(s), cfg(s));
        a.send(ab, 9, b"late".to_vec(), 1).unwrap();
        let t = Instant::now();
        while b.counters().unmatched == 0 {
            assert!(t.elapsed() < WAIT, "{s}: never counted as unmatched");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(b.poll().is_none(), "{s}");
        b.recv(Some(ba), 9, 0, 64, 2).unwrap();
        let c = next(&b, s);
        assert_eq!((c.context, c.data.as_slice(), c.status), (2, &b"late"[..], Status::Ok), "{s}");
        assert_eq!(next(&a, s).status, Status::Ok, "{s}");
        assert!(a.counters().retransmits > 0, "{s}");
    }
}

#[test]
fn a_peer_that_never_answers_times_out_in_every_scheme() {
    for s in Scheme::ALL {
        let silent = UdpSocket::bind(any()).unwrap();
        let c = EmpConfig { deadline: Duration::from_millis(300), rto_max: Duration::from_millis(50), ..cfg(s) };
        let a = EmpEndpoint::bind(any(), c).unwrap();
        let p = a.insert(silent.local_addr().unwrap());
        let t = Instant::now();
        a.send(p, 1, b"hello?".to_vec(), 42).unwrap();
        let done = next(&a, s);
        assert_eq!((done.context, done.status), (42, Status::TimedOut), "{s}");
        assert!(t.elapsed() < Duration::from_secs(3), "{s}: took {:?}", t.elapsed());
    }
}

#[test]
fn shutdown_completes_pending_operations_as_closed_in_every_scheme() {
    for s in Scheme::ALL {
        let silent = UdpSocket::bind(any()).unwrap();
        let mut a = EmpEndpoint::bind(any(), cfg(s)).unwrap();
        let p = a.insert(silent.local_addr().unwrap());
        a.recv(None, 1, 0, 8, 7).unwrap();
        a.send(p, 1, b"x".to_vec(), 8).unwrap();
        a.shutdown();
        let mut closed: Vec<u64> = std::iter::from_fn(|| a.poll()).map(|c| c.context).collect();
        closed.sort();
        assert_eq!(closed, vec![7, 8], "{s}");
    }
}
