//! The `tcp` transport counts every datagram it drops per socket as well
//! as per reason: `drop_tcp_send`, `drop_tcp_receive` and `drop_tcp_exit`
//! of the endpoint's report balance what it sent or was sent. Over
//! loopback, each "host" a `TcpTransport` on its own 127.0.0.x address.

use eudp_engine::backend::tcp::{TcpConfig, TcpTransport};
use eudp_engine::{Config, Endpoint, Engine};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 30000 + (std::process::id() % 1000) as u16 * 10;
    loop {
        let p = base + NEXT.fetch_add(1, Ordering::SeqCst);
        if std::net::TcpListener::bind(("0.0.0.0", p)).is_ok() {
            return p;
        }
    }
}

fn host(ip: &str, port: u16, f: impl FnOnce(&mut TcpConfig)) -> TcpTransport {
    let mut c = TcpConfig { port, bind_ip: Some(ip.parse().unwrap()), ..TcpConfig::default() };
    f(&mut c);
    TcpTransport::start(c).expect("transport")
}

fn ep(t: &TcpTransport, e: &Engine, ip: &str) -> Endpoint {
    let ep = t.endpoint(e, false).unwrap();
    ep.bind_to(SocketAddr::new(ip.parse().unwrap(), 0)).unwrap();
    ep.set_read_timeout(Some(Duration::from_millis(500)));
    ep
}

fn wait_for(what: &str, secs: u64, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(secs), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn send_drops_are_counted_on_the_socket_that_sent() {
    // No host at .21: the lane never connects; its bounded queue drops the
    // overflow at once and the rest at the deadline.
    let port = free_port();
    let a = host("127.0.0.20", port, |c| {
        c.queue_bytes = 10 * (100 + 6);
        c.queue_deadline = Duration::from_millis(300);
    });
    let e = Engine::start(Config::default()).unwrap();
    let tx = ep(&a, &e, "127.0.0.20");
    let idle = ep(&a, &e, "127.0.0.20");
    let to: SocketAddr = "127.0.0.21:9".parse().unwrap();
    for _ in 0..40 {
        tx.send_to(&[7u8; 100], to).unwrap();
    }
    tx.flush(Duration::from_secs(2));
    wait_for("deadline drops", 5, || a.queued_bytes() == 0);
    let s = a.stats();
    let r = tx.report();
    assert_eq!(s.drop_queue_full + s.drop_deadline, 40, "{s:?}");
    assert_eq!(r.drop_tcp_send, 40, "sent = the socket's counted drops: {r:?}");
    assert_eq!(idle.report().drop_tcp_send, 0, "another socket's count is its own");
}

#[test]
fn receive_drops_are_counted_on_the_socket_they_were_for() {
    let port = free_port();
    let a = host("127.0.0.22", port, |_| {});
    let b = host("127.0.0.23", port, |_| {});
    let e = Engine::start(Config::default()).unwrap();
    let rx = ep(&b, &e, "127.0.0.23");
    let peer = ep(&a, &e, "127.0.0.22");
    let other = ep(&a, &e, "127.0.0.22");
    rx.connect(peer.local_addr().unwrap()).unwrap();
    let to = rx.local_addr().unwrap();
    // From another source than its peer: filtered by the connected socket.
    for _ in 0..20 {
        other.send_to(b"not for you", to).unwrap();
    }
    for _ in 0..5 {
        peer.send_to(b"for you", to).unwrap();
    }
    let mut buf = [0u8; 64];
    let mut got = 0;
    while got < 5 {
        let n = rx.recv(&mut buf).expect("the peer's datagrams arrive");
        assert_eq!(&buf[..n], b"for you");
        got += 1;
    }
    wait_for("the filtered ones counted", 5, || rx.report().drop_tcp_receive >= 20);
    assert_eq!(b.stats().drop_filtered, 20);
    assert_eq!(25, got + rx.report().drop_tcp_receive, "sent = received + counted drops");
}

#[test]
fn what_a_lane_still_holds_at_the_end_is_counted_on_its_socket() {
    // No host at .25 and a long deadline: every datagram waits in the lane
    // when the transport ends.
    let port = free_port();
    let a = host("127.0.0.24", port, |c| {
        c.queue_deadline = Duration::from_secs(60);
    });
    let e = Engine::start(Config::default()).unwrap();
    let tx = ep(&a, &e, "127.0.0.24");
    let to: SocketAddr = "127.0.0.25:9".parse().unwrap();
    for _ in 0..12 {
        tx.send_to(&[1u8; 200], to).unwrap();
    }
    tx.flush(Duration::from_secs(2));
    wait_for("queued on the lane", 5, || a.queued_bytes() > 0);
    a.shutdown();
    let r = tx.report();
    assert_eq!(a.stats().drop_exit, 12);
    assert_eq!(12, r.drop_tcp_send + r.drop_tcp_exit, "sent = counted drops: {r:?}");
    assert_eq!(r.drop_tcp_exit, 12, "{r:?}");
}
