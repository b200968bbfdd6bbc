//! While an application keeps receiving on a socket itself, the engine's
//! check for its leaving (the receive hand-off) comes less and less often,
//! so the engine thread is not woken every handoff interval for as long as
//! the program runs; once the program stops receiving, the engine still
//! takes the socket over. Loopback only; every wait is bounded.
//! (One test in this binary: it counts the one engine thread's wake-ups.)

use eudp_engine::{Config, Endpoint, Engine};
use std::net::UdpSocket;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Voluntary context switches of the thread named `eudp-engine`.
fn engine_switches() -> u64 {
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let p = t.path();
        if std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim() == "eudp-engine" {
            let st = std::fs::read_to_string(p.join("status")).unwrap();
            let line = st.lines().find(|l| l.starts_with("voluntary_ctxt_switches:")).unwrap();
            return line.split_whitespace().nth(1).unwrap().parse().unwrap();
        }
    }
    panic!("no engine thread");
}

#[test]
fn a_busy_receiver_is_checked_less_often_and_handed_back_when_it_stops() {
    const HANDOFF: Duration = Duration::from_millis(1);
    const BUSY: Duration = Duration::from_millis(400);
    let engine = Engine::start(Config { rx_handoff: HANDOFF, ..Config::default() }).unwrap();
    let ep = Endpoint::with_engine(&engine, false).unwrap();
    ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(2)));
    let dst = ep.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let s = UdpSocket::bind("127.0.0.1:0").unwrap();
            let mut n = 0u64;
            while !stop.load(Relaxed) && n < 100_000 {
                s.send_to(&n.to_be_bytes(), dst).unwrap();
                n += 1;
                std::thread::sleep(Duration::from_micros(200));
            }
        })
    };
    let mut buf = [0u8; 64];
    // Warm up: the engine sees the application receiving and parks it.
    let t = Instant::now();
    while t.elapsed() < Duration::from_millis(50) {
        ep.recv(&mut buf).unwrap();
    }
    let before = engine_switches();
    let t = Instant::now();
    let mut got = 0u64;
    while t.elapsed() < BUSY {
        ep.recv(&mut buf).unwrap();
        got += 1;
    }
    let woke = engine_switches() - before;
    eprintln!("engine wake-ups while receiving: {woke}");
    assert!(got > 100, "the sender stalled: {got} datagrams in {BUSY:?}");
    // A check every handoff interval would wake it ~400 times.
    let checks_at_base = (BUSY.as_micros() / HANDOFF.as_micros()) as u64;
    assert!(woke < checks_at_base / 4, "engine woke {woke} times in {BUSY:?} of receiving (base interval: {checks_at_base})");
    // The application stops receiving: the engine takes the socket over
    // (reads arrivals into the ring) within the grown interval.
    let reads = ep.socket_reads();
    let t = Instant::now();
    while ep.pending_datagrams() == 0 && t.elapsed() < Duration::from_secs(1) {
        std::thread::sleep(Duration::from_millis(2));
    }
    let took = t.elapsed();
    stop.store(true, Relaxed);
    sender.join().unwrap();
    assert!(ep.pending_datagrams() > 0, "the engine did not take the socket over in {took:?} (socket reads {reads} -> {})", ep.socket_reads());
    assert!(took < Duration::from_millis(200), "hand-back took {took:?}");
}
