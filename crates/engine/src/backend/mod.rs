//! Backends: how the engine reaches the network.
//!
//! A backend provides one datagram socket per endpoint behind the small
//! [`Backend`] trait. Today there is [`kernel`] (kernel UDP with GSO/GRO);
//! the trait is the seam where `tcp` (UDP over TCP) and `xdp` plug in.
//! The system calls they share are in [`crate::sys`].

pub mod kernel;
pub mod partly;

use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::time::Duration;

pub use kernel::{InMeta, OutMsg, PktInfo};
pub use partly::{partly_sent, partly_sent_error, PartlySent};

/// What a backend is, as facts the engine and the preload shim plan by
/// (in the manner of a device's capabilities): fixed for the backend's
/// life, read where a decision needs them. The defaults describe a kernel
/// UDP socket, apart from `writable_fd`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Whether a streaming sender's own thread should drain a full L1 and
    /// queued sends wait to coalesce. True where a batch costs one cheap
    /// syscall (UDP GSO); a backend whose send path does more per call (the
    /// `tcp` backend's framing and its manager) keeps draining on the
    /// engine, woken at once.
    pub drain_on_caller: bool,
    /// Whether [`Backend::raw_fd`] is the kernel socket that input reaches
    /// after a hand-over (a receiver asleep on it then wakes by itself).
    /// False for the `tcp` backend: its frames go to the kernel socket
    /// after a hand-over, not to what a receiver on the endpoint polls.
    pub input_reaches_raw_fd: bool,
    /// A descriptor readable when input waits that the kernel socket does
    /// not show (the preload shim adds it to a program's poll and epoll
    /// sets beside the program's own socket). `None`: all input reaches the
    /// kernel socket (the `kernel` backend). The `tcp` backend's is its
    /// `raw_fd`; the `xdp` backend's covers the AF_XDP ring and its inbox,
    /// not the kernel socket, which the program's set holds already.
    pub bypass_fd: Option<RawFd>,
    /// A descriptor that polls writable (`EPOLLOUT`) exactly when a send
    /// refused with `EAGAIN` may make progress, and whose `send_batch`
    /// never waits for room. The engine thread then leaves a blocked
    /// endpoint's batch in place and watches this descriptor instead of
    /// waiting on one socket while others have work. `None`: the engine
    /// waits with [`Backend::wait_writable`] in bounded slices.
    pub writable_fd: Option<RawFd>,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities { drain_on_caller: true, input_reaches_raw_fd: true, bypass_fd: None, writable_fd: None }
    }
}

/// One socket's datagrams a transport dropped ([`Backend::transport_drops`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TransportDrops {
    /// Sent by the socket and dropped before they left (queue full,
    /// deadlines, lane cap, cut by a failed connection).
    pub send: u64,
    /// Sent to the socket and dropped (its queue full, or filtered by its peer).
    pub receive: u64,
    /// Sent by the socket and still queued when the process ended.
    pub exit: u64,
}

/// The operations the engine performs on an endpoint's transport.
///
/// A `dyn Backend` upcasts to `dyn Any`, so a caller that knows the
/// concrete backend reaches its own API with `downcast_ref`.
pub trait Backend: std::any::Any + Send + Sync + std::fmt::Debug {
    /// The backend's fixed facts ([`Capabilities`]).
    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }
    /// True for an IPv6 (dual-stack) transport.
    fn is_v6(&self) -> bool;
    /// File descriptor whose readability means "receive may make progress".
    fn raw_fd(&self) -> RawFd;
    fn bind(&self, addr: &SocketAddr) -> io::Result<()>;
    fn connect(&self, addr: &SocketAddr) -> io::Result<()>;
    fn disconnect(&self) -> io::Result<()>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn peer_addr(&self) -> io::Result<SocketAddr>;
    /// One datagram, nonblocking.
    fn send_one(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize>;
    /// As `send_one`, asking the kernel for the datagram's TX stamps where
    /// the backend's socket makes them (sampled tracing, [`kernel::OutMsg::stamp`]).
    fn send_one_stamped(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        self.send_one(buf, dst)
    }
    /// Several messages (plain or GSO) in one call; returns how many were accepted.
    fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize>;
    /// After `send_batch` on this thread: the datagrams of each kernel
    /// message the backend made of a message it split (empty: none split),
    /// so a tracer numbers each as the kernel's `OPT_ID` keys do.
    fn take_split_pieces(&self) -> Vec<usize> {
        Vec::new()
    }
    /// Several messages (possibly GRO-coalesced) in one call, nonblocking.
    /// A backend may replace a buffer in `bufs` by one of its own holding
    /// the message (the `tcp` backend hands over 64 KiB blocks this way,
    /// without a copy); `meta[i].len` bytes of `bufs[i]` are valid.
    fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize>;
    /// A look of a blocking receive that spins: as `recv_batch`, except
    /// that a backend whose input comes in user memory may skip the kernel
    /// socket's system call on some looks (the spin's sleep, if it comes
    /// to one, waits on that socket too).
    fn recv_spinning(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        self.recv_batch(bufs, meta)
    }
    /// As `recv_batch`, but sleeping in the kernel until the first message
    /// arrives (bounded by the socket's receive timeout), so a blocked
    /// receiver needs no separate wait. `Unsupported` where the backend
    /// cannot (the engine then waits on readiness instead).
    fn recv_batch_wait(&self, _bufs: &mut [Vec<u8>], _meta: &mut [InMeta]) -> io::Result<usize> {
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Takes one asynchronous error, if any (pending error or error queue).
    fn take_error(&self) -> Option<i32>;
    /// Send buffer size in bytes (sizes L1).
    fn send_buffer_size(&self) -> usize;
    /// Receive buffer size in bytes (sizes the receive ring).
    fn recv_buffer_size(&self) -> usize;
    /// Messages the underlying kernel socket dropped on receive, when the
    /// backend has one.
    fn socket_drops(&self) -> Option<u64> {
        None
    }
    /// The socket's datagrams its transport dropped, when the backend is
    /// a transport that queues them (the `tcp` backend).
    fn transport_drops(&self) -> Option<TransportDrops> {
        None
    }
    /// Whether segmentation offload may be used on send.
    fn probe_gso(&self) -> bool;
    /// Enables receive coalescing; false when unavailable.
    fn enable_gro(&self) -> bool;
    /// Sets an integer socket option on the underlying socket.
    fn set_option(&self, level: i32, name: i32, val: i32) -> io::Result<()>;
    /// Reads an integer socket option of the underlying socket.
    fn option(&self, level: i32, name: i32) -> io::Result<i32>;
    /// Waits at most `timeout` until a send may make progress (after
    /// `EAGAIN`); true when it may. The default polls `raw_fd` for
    /// writability, which is exact for a kernel socket. A backend whose
    /// `raw_fd` is not its send path (the `tcp` backend's is an eventfd,
    /// always writable) overrides it.
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        crate::sys::poll::poll_writable(self.raw_fd(), Some(timeout))
    }
    /// Lets go of the kernel socket now, while something else may still
    /// hold this backend for a moment (the engine thread, a call in
    /// flight): an endpoint being dropped calls it so that its port is
    /// free when the drop returns, as after close(2). Later calls on the
    /// backend fail. The default keeps the socket until the backend drops.
    fn release_socket(&self) {}
    /// The socket's options were changed directly on its descriptor (the
    /// preload shim passes a program's `setsockopt` to the kernel socket):
    /// a backend that keeps its own copy of some (the `xdp` backend builds
    /// and reads IP headers itself) reads them again.
    fn option_changed(&self) {}
}

impl Backend for kernel::UdpSocket {
    fn capabilities(&self) -> Capabilities {
        Capabilities { writable_fd: Some(std::os::fd::AsRawFd::as_raw_fd(self)), ..Capabilities::default() }
    }
    fn is_v6(&self) -> bool {
        kernel::UdpSocket::is_v6(self)
    }
    fn release_socket(&self) {
        kernel::UdpSocket::release_socket(self)
    }
    fn raw_fd(&self) -> RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self)
    }
    fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        kernel::UdpSocket::bind(self, addr)
    }
    fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        kernel::UdpSocket::connect(self, addr)
    }
    fn disconnect(&self) -> io::Result<()> {
        kernel::UdpSocket::disconnect(self)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        kernel::UdpSocket::local_addr(self)
    }
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        kernel::UdpSocket::peer_addr(self)
    }
    fn send_one(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        self.send_to(buf, dst)
    }
    fn send_one_stamped(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        self.send_to_stamped(buf, dst)
    }
    fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        kernel::UdpSocket::send_batch_nowait(self, msgs)
    }
    fn take_split_pieces(&self) -> Vec<usize> {
        kernel::take_split_pieces()
    }
    fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        kernel::UdpSocket::recv_batch(self, bufs, meta)
    }
    fn recv_batch_wait(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        kernel::UdpSocket::recv_batch_wait(self, bufs, meta)
    }
    fn take_error(&self) -> Option<i32> {
        // The error queue (IP_RECVERR) first, then the socket's pending error.
        if let Ok(Some((e, _))) = self.take_queued_error() {
            let _ = self.take_socket_error();
            return Some(e);
        }
        match self.take_socket_error() {
            0 => None,
            e => Some(e),
        }
    }
    fn send_buffer_size(&self) -> usize {
        kernel::UdpSocket::send_buffer_size(self).unwrap_or(212_992)
    }
    fn recv_buffer_size(&self) -> usize {
        kernel::UdpSocket::recv_buffer_size(self).unwrap_or(212_992)
    }
    fn socket_drops(&self) -> Option<u64> {
        kernel::UdpSocket::drops(self).ok()
    }
    fn probe_gso(&self) -> bool {
        kernel::UdpSocket::probe_gso(self)
    }
    fn enable_gro(&self) -> bool {
        kernel::UdpSocket::enable_gro(self)
    }
    fn set_option(&self, level: i32, name: i32, val: i32) -> io::Result<()> {
        kernel::UdpSocket::set_option(self, level, name, val)
    }
    fn option(&self, level: i32, name: i32) -> io::Result<i32> {
        kernel::UdpSocket::option(self, level, name)
    }
}
#[path = "tcp/mod.rs"]
pub mod tcp;
#[path = "xdp/mod.rs"]
pub mod xdp;
