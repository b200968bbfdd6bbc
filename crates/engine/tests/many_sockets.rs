//! A DNS-server-like process: 10,000 UDP endpoints on one engine must fit in
//! bounded, predictable memory (queues are allocated on use, sized from
//! SO_SNDBUF/SO_RCVBUF, not preallocated), and all of them must work.

use eudp_engine::sys::process::raise_fd_limit;
use eudp_engine::{Config, Endpoint, Engine};
use std::time::Duration;

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap().trim().trim_end_matches("kB").trim().parse().unwrap()
}

#[test]
fn ten_thousand_endpoints_fit_and_work() {
    let n = 10_000usize;
    let limit = raise_fd_limit(2 * n as u64 + 256).unwrap();
    assert!(limit >= n as u64 + 64, "fd limit {limit} too low for this test");
    let engine = Engine::start(Config::default()).unwrap();
    let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sink.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let sink_addr = sink.local_addr().unwrap();
    let before = rss_kib();
    let eps: Vec<Endpoint> = (0..n)
        .map(|_| {
            let e = Endpoint::with_engine(&engine, false).unwrap();
            e.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
            e
        })
        .collect();
    // Every endpoint sends one datagram and receives one reply.
    let mut buf = [0u8; 64];
    for (i, e) in eps.iter().enumerate() {
        e.send_to(&(i as u32).to_be_bytes(), sink_addr).unwrap();
        let (len, from) = sink.recv_from(&mut buf).unwrap();
        assert_eq!(len, 4);
        sink.send_to(&buf[..4], from).unwrap();
    }
    for (i, e) in eps.iter().enumerate() {
        e.set_read_timeout(Some(Duration::from_secs(5)));
        let got = e.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], &(i as u32).to_be_bytes());
    }
    let per_endpoint = (rss_kib().saturating_sub(before)) * 1024 / n as u64;
    eprintln!("RSS per endpoint after use: {per_endpoint} bytes");
    // Generous bound: a few KiB each, not the 64 KiB a preallocated
    // receive buffer (or an L1 sized from SO_SNDBUF) would cost.
    assert!(per_endpoint < 16 * 1024, "{per_endpoint} bytes per endpoint");
}
