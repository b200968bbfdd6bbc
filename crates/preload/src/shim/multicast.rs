//! Multicast under transports that leave it to the kernel.
//!
//! The kernel transport reads the program's own kernel socket, so group
//! membership, `IP_MULTICAST_*` and the kernel's delivery to every member
//! socket hold unchanged on the engine. The tcp transport carries each
//! datagram over a connection to one peer host, and the xdp transport's
//! program redirects unicast frames only: a socket that joins a group
//! there (or, under tcp, sends to one) stays on the kernel path, counted
//! in the report's `multicast_kernel`.

use super::generation::{tcp_transport, xdp_transport};
use super::sock::{Sock, KERNEL};
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;

/// True when the transport in effect leaves a group member to the kernel
/// path (see the module's note).
pub fn membership_off_transport() -> bool {
    tcp_transport() || xdp_transport()
}

/// True for a destination the transport in effect cannot carry: a group
/// under the tcp transport.
pub fn multicast_off_transport(ip: IpAddr) -> bool {
    tcp_transport() && ip.to_canonical().is_multicast()
}

impl Sock {
    /// Moves the socket to the kernel path for multicast (`what`: the call
    /// that asked), counted once per socket.
    pub fn fallback_multicast(&self, fd: i32, what: &str) {
        if self.mode() == KERNEL {
            return;
        }
        crate::stat::MULTICAST_KERNEL.fetch_add(1, Relaxed);
        let transport = if tcp_transport() { "tcp" } else { "xdp" };
        self.fallback(
            fd,
            &format!("multicast {what} under the {transport} transport (the kernel path carries groups)"),
        );
    }
}
