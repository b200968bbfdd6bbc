//! The process-wide `tcp` transport writes its counters next to the shim's
//! per-process report (`$EUDP_STAT_DIR/<pid>-<start>.tcp.json`), so the drops of a
//! program run under `eudp run --transport tcp` can be told apart
//! (receive queue, DML bound, deadlines). Its own binary: it sets the
//! environment of the whole process.

use eudp_engine::backend::tcp::TcpTransport;
use eudp_engine::{Config, Engine};
use std::time::{Duration, Instant};

#[test]
fn the_global_transport_writes_its_counters_for_eudp_stat() {
    let dir = std::env::temp_dir().join(format!("eudp-tcp-stat-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    // This binary's only test: nothing else reads the environment meanwhile.
    std::env::set_var("EUDP_STAT_DIR", &dir);
    std::env::set_var("EUDP_TCP_PORT", (30000 + std::process::id() % 20000).to_string());
    std::env::set_var("EUDP_TCP_BIND", "127.0.0.60");
    let t = TcpTransport::global().expect("global transport");
    let e = Engine::start(Config::default()).unwrap();
    let rx = t.endpoint(&e, false).unwrap();
    rx.bind_to("127.0.0.60:0".parse().unwrap()).unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5)));
    let tx = t.endpoint(&e, false).unwrap();
    tx.bind_to("127.0.0.60:0".parse().unwrap()).unwrap();
    for _ in 0..5 {
        tx.send_to(b"hello", rx.local_addr().unwrap()).unwrap();
    }
    let mut buf = [0u8; 64];
    for _ in 0..5 {
        assert_eq!(rx.recv_from(&mut buf).unwrap().0, 5);
    }
    let path = dir.join(format!("{}.tcp.json", eudp_engine::stat_dir::own_stem()));
    let t0 = Instant::now();
    loop {
        let s = std::fs::read_to_string(&path).unwrap_or_default();
        // Sent and received by this process (a connection to itself).
        if s.contains("\"frames_received\": 5,")
            && s.contains("\"frames_sent\": 5,")
            && s.contains("\"drop_rx_full\": 0,")
        {
            assert!(s.contains(&format!("\"pid\": {},", std::process::id())), "{s}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "no current counters in {}: {s:?}", path.display());
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = std::fs::remove_dir_all(&dir);
}
