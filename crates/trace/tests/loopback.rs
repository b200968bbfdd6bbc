//! The engine's tracepoints in one process over loopback (no root needed):
//! enabled by the API, an eudp sender and an eudp receiver; the joined paths
//! are complete and ordered.

use eudp_engine::tracepoint;
use eudp_engine::{Config, Endpoint, Engine};
use eudp_trace::resolve::{self, Dump, RawEvent};
use std::time::Duration;

fn dump() -> Dump {
    let events = tracepoint::events()
        .into_iter()
        .map(|e| RawEvent(e.ts_ns, e.kind, e.ep, e.thread, e.a, e.b, e.extra))
        .collect();
    Dump { clock: "CLOCK_MONOTONIC_RAW".into(), dropped: tracepoint::dropped(), pid: std::process::id(), events }
}

#[test]
fn loopback_paths_are_complete_and_ordered() {
    tracepoint::enable();
    let engine = Engine::start(Config::default()).unwrap();
    let rx = Endpoint::with_engine(&engine, false).unwrap();
    rx.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
    rx.set_recv_buffer_size(4 << 20).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(2)));
    let dst = rx.local_addr().unwrap();
    let tx = Endpoint::with_engine(&engine, false).unwrap();
    tx.connect(dst).unwrap();
    let n = 200u64;
    let recv = std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        for i in 0..n {
            let k = rx.recv(&mut buf).unwrap();
            assert_eq!(u64::from_be_bytes(buf[..8].try_into().unwrap()), i);
            tracepoint::tag_received(i);
            assert_eq!(k, 1000);
        }
        rx
    });
    let mut d = vec![7u8; 1000];
    for i in 0..n {
        d[..8].copy_from_slice(&i.to_be_bytes());
        tx.send(&d).unwrap();
    }
    tx.flush(Duration::from_secs(5));
    let rx = recv.join().unwrap();
    drop(tx); // drains the last TX stamps
    drop(rx);
    tracepoint::disable();
    let d = dump();
    assert_eq!(d.dropped, 0);
    // Sender and receiver share the process: the sender endpoint has the
    // send calls, the receiver endpoint the pushes.
    let paths = resolve::join(&d, &d);
    assert_eq!(paths.len() as u64, n);
    let (recs, missing) = resolve::records("eudp", &paths);
    assert!(missing.is_empty(), "{} missing, first {:?}", missing.len(), missing.first());
    assert_eq!(recs.len() as u64, n * resolve::LAYERS.len() as u64);
    let v = resolve::order_violations(&paths, 1_000);
    assert!(v.is_empty(), "{} violations, first {:?}", v.len(), v[0]);
    for p in &paths {
        assert_eq!(p.bytes, 1000);
        assert!(p.points[7] >= p.points[6] && p.points[10] >= p.points[7]);
    }
}
