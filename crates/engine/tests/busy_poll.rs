//! `EUDP_BUSY_POLL`: engine threads that spin instead of sleeping must not
//! starve the application threads they serve. On a machine with fewer
//! cores than busy threads (two spinning engines and two spinning
//! receivers here), an engine that polled without ever giving up its CPU
//! held a woken receiver off it until the scheduler's next preemption:
//! each message of a ping-pong took about 2 ms (sockperf on the 2-core
//! testbed: p50 2 000 µs against 11 µs with the engines asleep). Loopback
//! only.

use eudp_engine::{Config, Endpoint, Engine};
use std::sync::Arc;
use std::time::{Duration, Instant};

const ROUNDS: u32 = 200;

/// Time for `ROUNDS` ping-pong rounds between two endpoints, each on its
/// own engine, receivers spinning 50 µs before they sleep.
fn pingpong(busy_poll: bool) -> Duration {
    let cfg = || Config { busy_poll, recv_spin: Duration::from_micros(50), ..Config::default() };
    let (ea, eb) = (Engine::start(cfg()).unwrap(), Engine::start(cfg()).unwrap());
    let a = Endpoint::with_engine(&ea, false).unwrap();
    let b = Arc::new(Endpoint::with_engine(&eb, false).unwrap());
    a.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    b.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    let pb = b.local_addr().unwrap();
    a.set_read_timeout(Some(Duration::from_secs(5)));
    b.set_read_timeout(Some(Duration::from_secs(5)));
    let echo = {
        let b = b.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 64];
            for _ in 0..ROUNDS + 10 {
                let (n, from) = b.recv_from(&mut buf).unwrap();
                b.send_to(&buf[..n], from).unwrap();
            }
        })
    };
    let mut buf = [0u8; 64];
    let mut round = |i: u32| {
        a.send_to(&i.to_le_bytes(), pb).unwrap();
        let (n, from) = a.recv_from(&mut buf).unwrap();
        assert_eq!((&buf[..n], from), (&i.to_le_bytes()[..], pb));
    };
    for i in 0..10 {
        round(i);
    }
    let t = Instant::now();
    for i in 10..ROUNDS + 10 {
        round(i);
    }
    let took = t.elapsed();
    echo.join().unwrap();
    took
}

/// Keeps the calling thread, and the threads it starts from now on, on one
/// CPU: fewer cores than busy threads on any machine.
fn one_cpu() {
    // SAFETY: a zeroed cpu_set_t is an empty set; the calls only read it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set), 0);
        let cpu = (0..libc::CPU_SETSIZE as usize).find(|&c| libc::CPU_ISSET(c, &set)).unwrap();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        assert_eq!(libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

#[test]
fn busy_polling_engines_leave_the_cpu_to_woken_receivers() {
    one_cpu();
    // Against the same ping-pong with the engines asleep, in the same run
    // (a loaded machine slows both).
    let asleep = pingpong(false);
    let busy = pingpong(true);
    assert!(
        busy < asleep * 10 + Duration::from_millis(20),
        "{ROUNDS} rounds: {busy:?} busy polling, {asleep:?} asleep"
    );
}
