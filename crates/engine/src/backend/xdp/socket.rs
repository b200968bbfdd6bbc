//! [`XdpSocket`]: one UDP socket of the transport, and how it takes and
//! gives up its demultiplexing key.

use super::shared::{Inbox, Shared};
use super::sys;
use crate::backend::kernel::UdpSocket;
use crate::sys::epoll::Epoll;
use crate::sys::sync::lock;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::{AtomicU16, AtomicU32};
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub(super) struct SockState {
    /// The demultiplexing key this socket holds, once bound.
    pub(super) key: Option<(Ipv4Addr, u16)>,
    pub(super) local: Option<SocketAddrV4>,
    pub(super) peer: Option<SocketAddrV4>,
}

/// One UDP socket on the `xdp` transport (see the module docs).
pub struct XdpSocket {
    pub(super) t: Arc<Shared>,
    pub(super) kernel: UdpSocket,
    pub(super) inbox: Arc<Inbox>,
    /// Readable when the kernel socket or `fast` is.
    pub(super) epoll: Epoll,
    /// Readable when the shared RX ring or the inbox is: the input the
    /// kernel socket does not show ([`Capabilities::bypass_fd`]).
    pub(super) fast: Epoll,
    pub(super) state: Mutex<SockState>,
    /// `IP_TOS << 8 | IP_TTL` as the socket has them set.
    pub(super) tos_ttl: AtomicU32,
    /// Receive options on: 1 `IP_PKTINFO`, 2 `IP_RECVTOS`, 4 `IP_RECVTTL`;
    /// IPv6 sockets also 8 `IPV6_RECVPKTINFO`, 16 `IPV6_RECVTCLASS`, 32
    /// `IPV6_RECVHOPLIMIT` (v4-mapped for IPv4 datagrams, as the kernel).
    pub(super) rx_opts: AtomicU32,
    pub(super) ident: AtomicU16,
    /// Spinning looks so far ([`crate::backend::Backend::recv_spinning`]).
    pub(super) spin_looks: AtomicU32,
    /// An IPv6 socket (its IPv4 peers are v4-mapped addresses).
    pub(super) v6: bool,
}

impl std::fmt::Debug for XdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSocket").field("state", &*lock(&self.state)).finish()
    }
}

impl XdpSocket {
    /// Takes the demultiplexing key for the kernel socket's address, when
    /// that address is the interface's (or the wildcard).
    pub(super) fn register(&self, st: &mut SockState) -> io::Result<()> {
        // An IPv6 socket takes IPv4 datagrams at a v4-mapped address, or at
        // the wildcard unless it is IPV6_V6ONLY.
        let local = match self.kernel.local_addr()? {
            SocketAddr::V4(l) => l,
            SocketAddr::V6(l)
                if l.ip().is_unspecified()
                    && self.kernel.option(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(1) == 0 =>
            {
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, l.port())
            }
            SocketAddr::V6(l) => match l.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddrV4::new(ip, l.port()),
                None => return Ok(()),
            },
        };
        st.local = Some(local);
        if st.key.is_some() || local.port() == 0 {
            return Ok(());
        }
        let ip = *local.ip();
        if !ip.is_unspecified() && !self.t.iface.v4.iter().any(|(a, _)| *a == ip) {
            return Ok(());
        }
        // The kernel spreads an `SO_REUSEPORT` group's unicast datagrams over
        // its members by a hash of its own: they stay on the kernel path. Its
        // group datagrams go to every member, as redirected ones do
        // (`group_path`), so membership keeps the fast path.
        if self.kernel.option(libc::SOL_SOCKET, libc::SO_REUSEPORT).unwrap_or(0) != 0 {
            return Ok(());
        }
        let key = (ip, local.port());
        self.t.add_socket(key, &self.inbox)?;
        st.key = Some(key);
        Ok(())
    }

    pub(super) fn unregister(&self) {
        self.leave_groups();
        self.drop_key(&mut lock(&self.state));
    }

    /// Gives up the demultiplexing key, if the socket holds one.
    pub(super) fn drop_key(&self, st: &mut SockState) {
        if let Some(key) = st.key.take() {
            self.t.remove_socket(key, &self.inbox);
        }
    }

    /// The socket's local address, binding it to an ephemeral port first if
    /// it has none (as the kernel does on a first send); `None` when it has
    /// no IPv4 form (an IPv6 address, or `IPV6_V6ONLY`).
    pub(super) fn local(&self) -> io::Result<Option<SocketAddrV4>> {
        let mut st = lock(&self.state);
        if let Some(l) = st.local.filter(|l| l.port() != 0) {
            return Ok(Some(l));
        }
        let l = self.kernel.local_addr()?;
        if l.port() == 0 {
            let any = if self.v6 {
                SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0)
            } else {
                SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0)
            };
            self.kernel.bind(&any)?;
        }
        self.register(&mut st)?;
        Ok(st.local)
    }

    pub(super) fn umem(&self) -> &sys::Umem {
        self.t.umem()
    }
}

impl Drop for XdpSocket {
    fn drop(&mut self) {
        self.unregister();
    }
}
