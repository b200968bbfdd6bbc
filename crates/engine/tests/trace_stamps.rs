//! Tracing on (this test binary is its own process): a traced sender's
//! kernel TX timestamps are all read — none lost to a full error queue —
//! by either stamp reader, and reading them does not take a wake-up of
//! the engine per send syscall.

use eudp_engine::tracepoint::{self as tp, Kind};
use eudp_engine::{Config, Endpoint, Engine};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

/// Tracing state is global to the process: the tests here take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const BURSTS: u64 = 150;
const PER_BURST: u64 = 300;
const SINGLES: u64 = 2000;

#[test]
fn traced_sender_reads_every_stamp_without_waking_the_engine() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Both stamp readers, one after the other (one process: tracing state
    // is global): through io_uring where it pays (the default), then with
    // recvmmsg only.
    for ring in [true, false] {
        tp::set_ring_reads(ring);
        let before = eudp_engine::sys::io_uring::stamps_read();
        check_wakes(None);
        let via_ring = eudp_engine::sys::io_uring::stamps_read() - before;
        eprintln!("ring reads {ring}: {via_ring} stamps read through io_uring");
        if !ring {
            assert_eq!(via_ring, 0);
        } else if eudp_engine::sys::io_uring::usable() {
            // The bursts leave 16 messages' stamps waiting at a time.
            assert!(via_ring > 0, "no stamp was read through the ring");
        }
    }
}

/// A sender with a small receive buffer, which its waiting stamps share:
/// they are read sooner, and none is dropped.
#[test]
fn a_small_receive_buffer_loses_no_stamp() {
    let _turn = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    tp::set_ring_reads(true);
    run_once(Some(4096));
}

fn check_wakes(rcvbuf: Option<usize>) {
    // Before, each burst woke the engine with its first stamp (its watch
    // re-armed every handoff interval): ~BURSTS + SINGLES/20 wakes. Now
    // the socket leaves the epoll set after the first such wake and returns
    // only when the application stops sending.
    //
    // A sender descheduled past the engine's 4 ms check looks idle and has
    // its socket watched again, so a loaded machine adds some: 1-9 here
    // unloaded, 3-37 with two CPU hogs beside it, up to ~120 while another
    // build and test suite ran. The run is repeated once when over the
    // bound; the old behaviour (~250+) exceeds it every time.
    let bound = (BURSTS + SINGLES / 20) / 4;
    let first = run_once(rcvbuf);
    let wakes = if first <= bound { first } else { first.min(run_once(rcvbuf)) };
    assert!(wakes <= bound, "{wakes} engine wake-ups for stamps only (first run {first}), bound {bound}");
}

/// One traced run (every stamp checked), the sender's SO_RCVBUF set to
/// `rcvbuf` if given; the engine's stamp-only wakes.
fn run_once(rcvbuf: Option<usize>) -> u64 {
    tp::reset();
    tp::enable();
    tp::set_capacity(1 << 20);
    let e = Engine::start(Config::default()).expect("engine");
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Endpoint::with_engine(&e, false).unwrap();
    a.bind_to(any).unwrap();
    if let Some(n) = rcvbuf {
        a.set_recv_buffer_size(n).unwrap();
    }
    let b = Endpoint::with_engine(&e, false).unwrap();
    b.bind_to(any).unwrap();
    b.set_read_timeout(Some(Duration::from_millis(500)));
    // Room for a whole burst (capped by net.core.rmem_max; the receipt
    // count below is reported, the stamps are what this test checks).
    let _ = b.set_recv_buffer_size(4 << 20);
    let dst = b.local_addr().unwrap();
    // Bursts with pauses: the engine sleeps between them with its watch on
    // the sender's socket, so each burst's first stamp could wake it. Each
    // burst has direct posts, batches sent by the application thread and a
    // remainder the engine sends on its coalescing timer. Then direct posts
    // alone (request/response pacing: one every 50 µs), whose stamps no
    // batch drains.
    let total = BURSTS * PER_BURST + SINGLES;
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rx = {
        let sent = sent.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 2048];
            let mut got = 0u64;
            // Until the sender is done and nothing came for a while (a
            // receiver stalled on a busy host must not give up early).
            while got < total {
                match b.recv(&mut buf) {
                    Ok(_) => got += 1,
                    Err(_) if sent.load(std::sync::atomic::Ordering::Acquire) => break,
                    Err(_) => {}
                }
            }
            got
        })
    };
    let data = [7u8; 1000];
    for _ in 0..BURSTS {
        for _ in 0..PER_BURST {
            a.send_to(&data, dst).unwrap();
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for _ in 0..SINGLES {
        a.send_to(&data, dst).unwrap();
        std::thread::sleep(Duration::from_micros(50));
    }
    assert!(a.flush(Duration::from_secs(5)));
    sent.store(true, std::sync::atomic::Ordering::Release);
    let got = rx.join().unwrap();
    let sends = a.stats().send_calls;
    let stamp_wakes = e.stamp_wakes();
    // Dropping the endpoint reads what is left on its error queue.
    drop(a);
    tp::disable();
    assert!(got > total / 2, "{got} of {total} datagrams arrived");

    let ev = tp::events();
    let keys = |k: Kind| ev.iter().filter(|x| x.kind == k as u8).map(|x| x.a).collect::<BTreeSet<u64>>();
    let (kmsgs, sched, soft) = (keys(Kind::KMsg), keys(Kind::TxSched), keys(Kind::TxSoft));
    assert!(kmsgs.len() as u64 > BURSTS, "kernel messages traced: {}", kmsgs.len());
    // Both kernel stamps of every kernel message: the error queue never
    // overflowed and nothing was left unread.
    assert_eq!(
        sched.symmetric_difference(&kmsgs).count(),
        0,
        "TX_SCHED of {} of {} messages",
        sched.len(),
        kmsgs.len()
    );
    assert_eq!(
        soft.symmetric_difference(&kmsgs).count(),
        0,
        "TX_SOFTWARE of {} of {} messages",
        soft.len(),
        kmsgs.len()
    );
    eprintln!("{got} of {total} received, {sends} send syscalls, {} kernel messages, {stamp_wakes} engine wakes for stamps only", kmsgs.len());
    e.shutdown(Duration::from_secs(1));
    stamp_wakes
}
