//! Setup shared by the engine's integration tests.

use eudp_engine::{Endpoint, Engine};
use std::net::SocketAddr;
use std::time::Duration;

/// Two endpoints of `e` bound on loopback: a sender and a receiver with a
/// 2 s read timeout and a 4 MiB receive buffer (where the kernel allows);
/// returns them with the receiver's address.
pub fn loopback_pair(e: &Engine) -> (Endpoint, Endpoint, SocketAddr) {
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = Endpoint::with_engine(e, false).unwrap();
    a.bind_to(any).unwrap();
    let b = Endpoint::with_engine(e, false).unwrap();
    b.bind_to(any).unwrap();
    b.set_read_timeout(Some(Duration::from_secs(2)));
    let _ = b.set_recv_buffer_size(4 << 20);
    let dst = b.local_addr().unwrap();
    (a, b, dst)
}
