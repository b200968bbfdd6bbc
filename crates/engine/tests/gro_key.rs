//! The engine's GRO key holder (`Config::gro_hold`, `EUDP_GRO_HOLD`): one
//! unbound UDP socket with `UDP_GRO` on, opened with the first kernel UDP
//! endpoint so that the kernel's UDP encapsulation static keys stay on
//! while sockets come and go; none when the setting or GRO is off, or
//! before any endpoint; closed for good by `release_gro_hold`, and every
//! engine's by `Engine::release_gro_holds` (process-wide, so in a child
//! process). Receiving with the holder open still delivers GRO batches
//! whole and in order.
//! (Loopback only; what the hold saves is a time, measured in
//! docs/preload.md, not asserted here.)

use eudp_engine::{Config, Endpoint, Engine};
use std::net::SocketAddr;
use std::time::Duration;

const CHILD: &str = "EUDP_GRO_KEY_TEST_CHILD";

fn link(fd: i32) -> Option<String> {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).ok().map(|p| p.to_string_lossy().into_owned())
}

#[test]
fn holder_opens_with_the_first_endpoint_and_closes_with_the_engine() {
    let e = Engine::start(Config::default()).unwrap();
    assert_eq!(e.gro_key_holder_fd(), None, "opened before any socket needed it");
    let a = Endpoint::with_engine(&e, false).unwrap();
    let fd = e.gro_key_holder_fd().expect("no holder after the first endpoint");
    assert!(e.gro_key_held(), "the holder's UDP_GRO is off");
    let sock = link(fd).expect("holder descriptor not open");
    assert!(sock.starts_with("socket:"), "{sock}");
    assert_ne!(fd, a.raw_fd());
    // One holder per engine, whatever the number of endpoints.
    let b = Endpoint::with_engine(&e, true).unwrap();
    assert_eq!(e.gro_key_holder_fd(), Some(fd));
    drop((a, b));
    assert_eq!(e.gro_key_holder_fd(), Some(fd), "held beyond the last endpoint");
    // Released for good: the descriptor closes and is not opened again.
    assert!(e.release_gro_hold());
    assert_eq!(e.gro_key_holder_fd(), None);
    assert_ne!(link(fd).as_deref(), Some(sock.as_str()), "holder still open after release");
    let _c = Endpoint::with_engine(&e, false).unwrap();
    assert_eq!(e.gro_key_holder_fd(), None);
    assert!(!e.release_gro_hold());
    // Closed with the engine.
    let e = Engine::start(Config::default()).unwrap();
    let _d = Endpoint::with_engine(&e, false).unwrap();
    let fd = e.gro_key_holder_fd().unwrap();
    let sock = link(fd).unwrap();
    drop(_d);
    e.shutdown(Duration::from_secs(1));
    drop(e);
    assert_ne!(link(fd).as_deref(), Some(sock.as_str()), "holder outlived its engine");
}

#[test]
fn no_holder_when_switched_off_or_without_gro() {
    for cfg in [Config { gro_hold: false, ..Config::default() }, Config { gro: false, ..Config::default() }] {
        let e = Engine::start(cfg.clone()).unwrap();
        let _a = Endpoint::with_engine(&e, false).unwrap();
        let _b = Endpoint::with_engine(&e, true).unwrap();
        assert_eq!(e.gro_key_holder_fd(), None, "{cfg:?}");
        assert!(!e.gro_key_held());
    }
    let c = Config::from_lookup(|k| (k == "EUDP_GRO_HOLD").then(|| "0".into())).unwrap();
    assert!(!c.gro_hold);
}

/// Datagrams of one size sent back to back over loopback arrive whole, in
/// order, with the receiving socket's GRO in use (the sender's GSO batch
/// reaches it as one coalesced message) while the holder is open.
#[test]
fn gro_batches_arrive_whole_with_the_holder_open() {
    let e = Engine::start(Config::default()).unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let rx = Endpoint::with_engine(&e, false).unwrap();
    rx.bind_to(any).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2)));
    let tx = Endpoint::with_engine(&e, false).unwrap();
    tx.bind_to(any).unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    assert!(e.gro_key_held());
    const N: usize = 48;
    const SIZE: usize = 1000;
    for round in 0..4u8 {
        for i in 0..N {
            let mut d = vec![round; SIZE];
            d[..8].copy_from_slice(&(i as u64).to_le_bytes());
            tx.send(&d).unwrap();
        }
        // A shorter datagram closes the run (the last of a GRO batch may
        // be shorter; it must still come out on its own).
        tx.send(&[0xee; 77]).unwrap();
        assert!(tx.flush(Duration::from_secs(2)));
        let mut buf = [0u8; 2048];
        for i in 0..N {
            let n = rx.recv(&mut buf).unwrap_or_else(|err| panic!("round {round}, datagram {i}: {err}"));
            assert_eq!(n, SIZE, "round {round}, datagram {i}");
            assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), i as u64, "round {round}: out of order");
            assert!(buf[8..SIZE].iter().all(|&b| b == round));
        }
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], &[0xee; 77][..]);
    }
    let st = rx.stats();
    assert_eq!(st.datagrams_received, 4 * (N as u64 + 1));
    assert!(st.gro_superpackets > 0, "no coalesced receive: {st:?}");
}

#[test]
fn releasing_every_holder_is_for_good() {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--exact", "child_release_all", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("1 passed"),
        "child failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "run by releasing_every_holder_is_for_good in a child process"]
fn child_release_all() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    let (e1, e2) = (Engine::start(Config::default()).unwrap(), Engine::start(Config::default()).unwrap());
    let _a = Endpoint::with_engine(&e1, false).unwrap();
    let _b = Endpoint::with_engine(&e2, false).unwrap();
    let fds = [e1.gro_key_holder_fd().unwrap(), e2.gro_key_holder_fd().unwrap()];
    let links = fds.map(|fd| link(fd).unwrap());
    assert_eq!(Engine::release_gro_holds(), 2);
    for (fd, l) in fds.iter().zip(&links) {
        assert_ne!(link(*fd).as_ref(), Some(l), "holder {fd} still open");
    }
    assert_eq!((e1.gro_key_holder_fd(), e2.gro_key_holder_fd()), (None, None));
    // No engine of this process opens one any more.
    let e3 = Engine::start(Config::default()).unwrap();
    let _c = Endpoint::with_engine(&e3, false).unwrap();
    assert_eq!(e3.gro_key_holder_fd(), None);
    assert_eq!(Engine::release_gro_holds(), 0);
}
