//! `xdp`: UDP over AF_XDP — the kernel's network stack bypassed on the data
//! path, as E-UDP (paper 000) moves per-packet work off the host's path.
//!
//! * One [`XdpTransport`] per interface and process: an XDP program
//!   (hand-assembled, [`sys::load_redirect_prog`]) attached to the
//!   interface redirects IPv4 UDP frames whose destination address and
//!   port belong to one of the transport's sockets into an AF_XDP socket
//!   (copy mode, queue [`XdpConfig::queue`]); every other frame (ARP, ICMP,
//!   other ports, IP options, fragments) goes on to the kernel as before.
//! * Each endpoint gets an [`XdpSocket`] (the [`Backend`]). It keeps a
//!   kernel UDP socket, which reserves its port, holds its options and
//!   carries everything the fast path does not: destinations that are not
//!   on the interface's subnets or whose MAC address the kernel's neighbour
//!   table does not know yet (the kernel's send resolves it), datagrams
//!   larger than the MTU (the kernel fragments), broadcast and multicast,
//!   IPv6, and whatever arrives through another interface.
//! * Send: the frame (Ethernet, IPv4, UDP with its checksum computed while
//!   the payload is copied into the UMEM frame) goes on the TX ring, and one
//!   kick per batch transmits it; no socket, no routing, no qdisc.
//! * Receive: whichever socket reads drains the shared RX ring, copying its
//!   own datagrams straight into the engine's buffers and queueing the
//!   others' in their bounded inboxes (sized by their `SO_RCVBUF`, drops
//!   counted as the kernel counts them).
//!
//! Limits (see docs/xdp.md): one process per interface queue (an AF_XDP
//! socket owns its queue; a second process falls back to the kernel
//! backend); root or `CAP_NET_ADMIN` + `CAP_BPF`; IPv4 only.
//!
//! One file per concern: `config` (settings, counters), `transport` (the
//! program attached, the AF_XDP socket, the process-wide transport),
//! `shared` (rings, ports map, bound sockets, neighbours), `socket`
//! ([`XdpSocket`] and its key), `tx` and `rx` (the data paths),
//! `socket_backend` (the [`Backend`](super::Backend) impl), `addr`
//! (address arithmetic), and `group` and `group_path` (multicast groups
//! redirected while the process holds them alone on the host). All `unsafe` code of this backend is in `sys.rs`.

mod addr;
mod config;
mod group;
mod group_path;
mod rx;
mod shared;
mod socket;
mod socket_backend;
pub mod sys;
mod transport;
mod tx;

pub use config::{AttachMode, CopyBlock, XdpConfig, XdpStats};
pub use socket::XdpSocket;
pub use transport::{endpoint_from_kernel_fd, XdpTransport};
