//! Multicast under transports other than the kernel one.
//!
//! The kernel transport reads the program's own kernel socket, so group
//! membership, `IP_MULTICAST_*` and the kernel's delivery to every member
//! socket hold unchanged on the engine. The xdp transport keeps that too,
//! and mirrors each IPv4 join so that its program can redirect the group's
//! frames while the process holds every socket on the group's port (the
//! engine's `backend::xdp::group`); IPv6 groups stay on the kernel path,
//! counted in `multicast_kernel`. The tcp transport carries each datagram
//! over a connection to one peer host: a socket that joins a group there,
//! or sends to one, stays on the kernel path, counted in the report's
//! `multicast_kernel`.

use super::generation::tcp_transport;
use super::sock::{Sock, KERNEL, LAZY};
use eudp_engine::backend::xdp::XdpSocket;
use std::net::IpAddr;
use std::sync::atomic::Ordering::Relaxed;

/// True when the transport in effect leaves a group member to the kernel
/// path (see the module's note).
pub fn membership_off_transport() -> bool {
    tcp_transport()
}

/// True for a destination the transport in effect cannot carry: a group
/// under the tcp transport.
pub fn multicast_off_transport(ip: IpAddr) -> bool {
    tcp_transport() && ip.to_canonical().is_multicast()
}

fn is_join(level: i32, name: i32) -> bool {
    use libc::*;
    matches!(name, MCAST_JOIN_GROUP | MCAST_JOIN_SOURCE_GROUP)
        || (level == IPPROTO_IP && matches!(name, IP_ADD_MEMBERSHIP | IP_ADD_SOURCE_MEMBERSHIP))
        || (level == IPPROTO_IPV6 && name == IPV6_ADD_MEMBERSHIP)
}

/// Under the xdp transport: a membership option the program's socket has
/// just accepted goes to the socket's AF_XDP backend. A join whose group
/// stays on the kernel path for good is counted: an IPv6 group, another
/// interface, or a socket not on the engine yet (its joins before the
/// adoption are the kernel's alone).
pub fn mirror_membership(s: &Sock, level: i32, name: i32, val: &[u8]) {
    let mirrored = s.existing().and_then(|ep| {
        let any: &dyn std::any::Any = ep.backend();
        any.downcast_ref::<XdpSocket>().map(|x| x.membership_changed(level, name, val))
    });
    let kernel = match mirrored {
        Some(r) => r == Some(false),
        // The kernel backend (the transport could not start) reads the
        // kernel socket: nothing is left behind.
        None => s.mode() == LAZY && is_join(level, name),
    };
    if kernel {
        crate::stat::MULTICAST_KERNEL.fetch_add(1, Relaxed);
    }
}

impl Sock {
    /// Moves the socket to the kernel path for multicast (`what`: the call
    /// that asked), counted once per socket.
    pub fn fallback_multicast(&self, fd: i32, what: &str) {
        if self.mode() == KERNEL {
            return;
        }
        crate::stat::MULTICAST_KERNEL.fetch_add(1, Relaxed);
        self.fallback(fd, &format!("multicast {what} under the tcp transport (the kernel path carries groups)"));
    }
}
