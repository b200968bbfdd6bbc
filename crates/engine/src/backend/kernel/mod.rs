//! The kernel UDP backend: a nonblocking kernel UDP socket with GSO and
//! GRO.
//!
//! * [`UdpSocket`] — `send_to`, GSO + `sendmmsg` batch sends
//!   ([`UdpSocket::send_batch`]), GRO + `recvmmsg` batch receives
//!   ([`UdpSocket::recv_batch`]) with their [`OutMsg`] / [`InMeta`] /
//!   [`PktInfo`], and the socket's error queue.
//! * [`gso_max_segments`] — how many segments a GSO message may carry here.
//!
//! The socket's raw calls and control-message coding are in `sys.rs`;
//! everything here is safe Rust over them.

mod sys;

use super::partly::partly;
use crate::fdspace::{new_private, private, Private};
use crate::sys::poll::poll_writable;
use crate::sys::sockopt::{get_int_option, set_int_option, set_receive_timeout};
use eudp_wire::limits::{GSO_MAX_SEGMENTS, GSO_MAX_SEGMENTS_RAISED};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;

/// One outgoing backend message: a run of equal-size datagrams to one
/// destination, sent as one GSO super-packet when `segment` is set.
pub struct OutMsg<'a> {
    /// Destination, or `None` on a connected socket.
    pub dst: Option<SocketAddr>,
    /// Payload pieces, concatenated by the kernel.
    pub iov: &'a [io::IoSlice<'a>],
    /// GSO segment size; `None` for a single plain datagram.
    pub segment: Option<u16>,
    /// Ask the kernel for this message's TX stamps with a control message
    /// (sampled tracing; a socket whose own flags ask for TX stamps gets
    /// them for every message anyway).
    pub stamp: bool,
}

/// Segments of a GSO message: its bytes over the segment size, rounded up
/// (0 for a plain datagram).
fn gso_segments(m: &OutMsg<'_>) -> usize {
    match m.segment {
        Some(seg) if seg > 0 => m.iov.iter().map(|v| v.len()).sum::<usize>().div_ceil(usize::from(seg)),
        _ => 0,
    }
}

/// `iov` cut into consecutive pieces of `bytes` bytes each (the last may be
/// shorter), splitting slices where a boundary falls inside one.
fn split_iov<'a>(iov: &'a [io::IoSlice<'a>], bytes: usize) -> Vec<Vec<io::IoSlice<'a>>> {
    let bytes = bytes.max(1);
    let mut out = vec![Vec::new()];
    let mut room = bytes;
    for v in iov {
        let mut rest: &'a [u8] = v;
        while !rest.is_empty() {
            if room == 0 {
                out.push(Vec::new());
                room = bytes;
            }
            let k = rest.len().min(room);
            out.last_mut().expect("non-empty").push(io::IoSlice::new(&rest[..k]));
            rest = &rest[k..];
            room -= k;
        }
    }
    out.retain(|p| !p.is_empty());
    out
}

thread_local! {
    /// The datagrams of each send the last split message was made of on
    /// this thread ([`take_split_pieces`]).
    static SPLIT: std::cell::RefCell<Vec<usize>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The datagrams of each send (`sendmsg`) that the last [`UdpSocket::send_batch`]
/// on this thread made of a message it split, in order, the refused whole
/// first (0 datagrams); empty when it split none. Each send is a kernel
/// message of its own, with its own `OPT_ID` key where it is stamped (the
/// refused one too: the kernel numbers a message before it counts its
/// segments), so a tracer numbers each.
pub fn take_split_pieces() -> Vec<usize> {
    SPLIT.with(|s| std::mem::take(&mut *s.borrow_mut()))
}

fn note_split_piece(datagrams: usize) {
    SPLIT.with(|s| s.borrow_mut().push(datagrams));
}

/// The process's UDP GSO segment limit after a kernel refusal lowered it
/// (`usize::MAX` until then). [`crate::batch::gso_batch`] never packs more.
static GSO_SEGMENT_CAP: AtomicUsize = AtomicUsize::new(usize::MAX);
/// What [`gso_max_segments`] found, once per process.
static GSO_SEGMENTS_PROBED: OnceLock<usize> = OnceLock::new();

/// The current segment cap (see [`GSO_SEGMENT_CAP`]); one relaxed load.
pub fn gso_segment_cap() -> usize {
    GSO_SEGMENT_CAP.load(Relaxed)
}

/// Lowers the process's segment cap to at most `n` (never raises it).
pub fn lower_gso_segment_cap(n: usize) {
    GSO_SEGMENT_CAP.fetch_min(n.max(1), Relaxed);
}

/// Segments per UDP GSO message this process uses: 128 when the kernel
/// accepts that many ([`GSO_MAX_SEGMENTS_RAISED`], probed once, lazily),
/// else 64 ([`GSO_MAX_SEGMENTS`]); lowered by `EUDP_GSO_SEGMENTS` (a number
/// from 1 up; values up to 64 skip the probe) and by a later refusal
/// ([`gso_segment_cap`]).
pub fn gso_max_segments() -> usize {
    let n = *GSO_SEGMENTS_PROBED.get_or_init(|| {
        let forced =
            std::env::var("EUDP_GSO_SEGMENTS").ok().and_then(|v| v.trim().parse::<usize>().ok()).filter(|&n| n > 0);
        match forced {
            Some(n) if n <= GSO_MAX_SEGMENTS => n,
            f => f.unwrap_or(usize::MAX).min(probe_gso_segments()),
        }
    });
    n.min(gso_segment_cap())
}

/// Whether the kernel accepts a UDP GSO message of
/// [`GSO_MAX_SEGMENTS_RAISED`] segments: one socket bound to 127.0.0.1
/// sends one 128-byte message of 1-byte segments to itself (the kernel
/// checks the count against `UDP_MAX_SEGMENTS` before anything else; the
/// 128 tiny datagrams are freed with the socket). Loopback only; any
/// failure means [`GSO_MAX_SEGMENTS`].
fn probe_gso_segments() -> usize {
    let accepted = (|| -> io::Result<bool> {
        let s = UdpSocket::new(false)?;
        s.bind(&SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))?;
        let me = s.local_addr()?;
        let payload = [0u8; GSO_MAX_SEGMENTS_RAISED];
        let iov = [io::IoSlice::new(&payload)];
        Ok(s.send_mmsg(&[OutMsg { dst: Some(me), iov: &iov, segment: Some(1), stamp: false }])? == 1)
    })();
    if matches!(accepted, Ok(true)) {
        GSO_MAX_SEGMENTS_RAISED
    } else {
        GSO_MAX_SEGMENTS
    }
}

/// Where a received datagram was addressed, as the kernel reports it in
/// `IP_PKTINFO` / `IPV6_PKTINFO` control messages (present only while the
/// socket has `IP_PKTINFO` / `IPV6_RECVPKTINFO` on). A server bound to a
/// wildcard address replies from the address it was asked on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PktInfo {
    /// `IP_PKTINFO`: interface index, local address (`ipi_spec_dst`) and
    /// header destination address (`ipi_addr`).
    pub v4: Option<(u32, std::net::Ipv4Addr, std::net::Ipv4Addr)>,
    /// `IPV6_PKTINFO`: header destination address and interface index.
    pub v6: Option<(std::net::Ipv6Addr, u32)>,
    /// `IP_TOS` (present while the socket has `IP_RECVTOS` on): the IPv4
    /// header's TOS byte.
    pub tos: Option<u8>,
    /// `IP_TTL` (present while the socket has `IP_RECVTTL` on): the IPv4
    /// header's TTL.
    pub ttl: Option<u8>,
    /// `IPV6_TCLASS` (present while the socket has `IPV6_RECVTCLASS` on):
    /// the IPv6 header's traffic class.
    pub tclass: Option<u8>,
    /// `IPV6_HOPLIMIT` (present while the socket has `IPV6_RECVHOPLIMIT`
    /// on): the IPv6 header's hop limit.
    pub hoplimit: Option<u8>,
}

impl PktInfo {
    fn is_empty(&self) -> bool {
        self.v4.is_none()
            && self.v6.is_none()
            && self.tos.is_none()
            && self.ttl.is_none()
            && self.tclass.is_none()
            && self.hoplimit.is_none()
    }
}

/// Metadata of one received (possibly coalesced) message.
#[derive(Clone, Copy, Debug, Default)]
pub struct InMeta {
    /// Bytes received into the buffer.
    pub len: usize,
    /// Sender address.
    pub src: Option<SocketAddr>,
    /// GRO segment size when the kernel coalesced datagrams (all segments
    /// have this size except possibly the last).
    pub segment: Option<usize>,
    /// The datagram did not fit in the buffer (MSG_TRUNC).
    pub truncated: bool,
    /// Destination information, when the socket asked for it.
    pub pktinfo: Option<PktInfo>,
}

/// A nonblocking kernel UDP socket owned by the engine.
#[derive(Debug)]
pub struct UdpSocket {
    fd: Private<OwnedFd>,
    v6: bool,
}

impl AsRawFd for UdpSocket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl UdpSocket {
    /// See [`Backend::release_socket`]: `/dev/null` takes the socket's
    /// descriptor number in place (atomically, by `dup3`), so the socket
    /// itself is released once no call has it in flight, while the number
    /// stays this value's until it drops. Calls made meanwhile fail
    /// (`ENOTSOCK`) instead of reaching whatever might reuse the number.
    pub fn release_socket(&self) {
        sys::release_fd(self.fd.as_fd());
    }

    /// Opens a nonblocking, close-on-exec UDP socket of the given family.
    pub fn new(v6: bool) -> io::Result<Self> {
        let fd = new_private(|| sys::udp_socket(v6))?;
        Ok(UdpSocket { fd, v6 })
    }

    /// Adopts an existing kernel UDP socket (e.g. one an application
    /// created); the family is read from the socket itself. Its file
    /// description keeps the owner's O_NONBLOCK: every call of this type
    /// passes `MSG_DONTWAIT` except [`UdpSocket::recv_batch_wait`], and an
    /// application's blocking receive may then sleep in the kernel itself.
    pub fn from_owned_fd(fd: OwnedFd) -> io::Result<Self> {
        // Placed first, so that an early return below releases it too.
        let fd = private(fd)?;
        let ty = get_int_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_TYPE)?;
        if ty != libc::SOCK_DGRAM {
            return Err(io::Error::from_raw_os_error(libc::ENOTSOCK));
        }
        let dom = get_int_option(fd.as_fd(), libc::SOL_SOCKET, libc::SO_DOMAIN)?;
        if dom != libc::AF_INET && dom != libc::AF_INET6 {
            return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        }
        Ok(UdpSocket { fd, v6: dom == libc::AF_INET6 })
    }

    /// Clears O_NONBLOCK on the file description. Calls of this type pass
    /// `MSG_DONTWAIT` anyway; only [`UdpSocket::recv_batch_wait`] blocks.
    pub fn set_description_blocking(&self) -> io::Result<()> {
        sys::clear_nonblocking(self.fd.as_fd())
    }

    /// Bounds a blocking receive ([`UdpSocket::recv_batch_wait`]) to `t`.
    pub fn set_receive_timeout(&self, t: std::time::Duration) -> io::Result<()> {
        set_receive_timeout(self.fd.as_fd(), t)
    }

    /// True for an IPv6 socket.
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    fn setsockopt_int(&self, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
        set_int_option(self.fd.as_fd(), level, name, val)
    }

    fn getsockopt_int(&self, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
        get_int_option(self.fd.as_fd(), level, name)
    }

    /// Sets an integer socket option (`SOL_SOCKET`, `IPPROTO_IP`, …).
    pub fn set_option(&self, level: i32, name: i32, val: i32) -> io::Result<()> {
        self.setsockopt_int(level, name, val)
    }

    /// Reads an integer socket option.
    pub fn option(&self, level: i32, name: i32) -> io::Result<i32> {
        self.getsockopt_int(level, name)
    }

    /// Kernel send buffer size in bytes (as `getsockopt(SO_SNDBUF)` reports it).
    pub fn send_buffer_size(&self) -> io::Result<usize> {
        self.getsockopt_int(libc::SOL_SOCKET, libc::SO_SNDBUF).map(|v| v.max(0) as usize)
    }

    /// Kernel receive buffer size in bytes.
    pub fn recv_buffer_size(&self) -> io::Result<usize> {
        self.getsockopt_int(libc::SOL_SOCKET, libc::SO_RCVBUF).map(|v| v.max(0) as usize)
    }

    /// Packets this socket dropped on receive (`SO_MEMINFO`'s drop count,
    /// the one `ss -m` shows).
    pub fn drops(&self) -> io::Result<u64> {
        sys::meminfo_drops(self.fd.as_fd())
    }

    /// Probes UDP GSO: true when the kernel accepts `UDP_SEGMENT` on this socket.
    pub fn probe_gso(&self) -> bool {
        // Setting a segment size of 0 as the socket default is a no-op that
        // fails with ENOPROTOOPT on kernels without UDP GSO.
        self.setsockopt_int(libc::SOL_UDP, sys::UDP_SEGMENT, 0).is_ok()
    }

    /// Enables UDP GRO on receive; false when the kernel lacks it.
    pub fn enable_gro(&self) -> bool {
        self.setsockopt_int(libc::SOL_UDP, sys::UDP_GRO, 1).is_ok()
    }

    /// An unbound socket with `UDP_GRO` on, kept only to hold the kernel's
    /// UDP encapsulation static keys on. `UDP_GRO` on a socket raises them
    /// (`udp_tunnel_encap_enable`: `udp_encap_needed_key`, and for an IPv6
    /// socket `udpv6_encap_needed_key` too) and its close lowers them
    /// again; a change between 0 and 1 patches kernel text (tens of µs or
    /// more each way), so a program whose only GRO socket comes and goes
    /// would pay both per socket. IPv6
    /// first, as it holds both keys; IPv4 where the kernel has no IPv6.
    /// Unbound, it is in no lookup table and receives nothing.
    pub fn gro_key_holder() -> io::Result<UdpSocket> {
        let s = UdpSocket::new(true).or_else(|_| UdpSocket::new(false))?;
        if s.enable_gro() {
            Ok(s)
        } else {
            Err(io::ErrorKind::Unsupported.into())
        }
    }

    /// Whether `UDP_GRO` is on (false where the kernel lacks it).
    pub fn gro_enabled(&self) -> bool {
        self.getsockopt_int(libc::SOL_UDP, sys::UDP_GRO).map(|v| v != 0).unwrap_or(false)
    }

    /// Enables extended error reporting (ICMP errors on unconnected sockets).
    pub fn set_recv_err(&self, on: bool) -> io::Result<()> {
        if self.v6 {
            self.setsockopt_int(libc::IPPROTO_IPV6, libc::IPV6_RECVERR, on as i32)?;
        }
        // A dual-stack IPv6 socket also carries IPv4 traffic.
        match self.setsockopt_int(libc::IPPROTO_IP, libc::IP_RECVERR, on as i32) {
            Err(e) if self.v6 => drop(e),
            r => r?,
        }
        Ok(())
    }

    /// Binds to a local address.
    pub fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        sys::bind(self.fd.as_fd(), addr)
    }

    /// Connects to a peer (sets the default destination and filters sources).
    pub fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        sys::connect(self.fd.as_fd(), addr)
    }

    /// Dissolves the association (connect to AF_UNSPEC).
    pub fn disconnect(&self) -> io::Result<()> {
        sys::disconnect(self.fd.as_fd())
    }

    /// The bound local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        sys::name(self.fd.as_fd(), false)
    }

    /// The connected peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        sys::name(self.fd.as_fd(), true)
    }

    /// Sends one datagram (nonblocking). `dst` is `None` on a connected socket.
    pub fn send_to(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        sys::send_to(self.fd.as_fd(), buf, dst)
    }

    /// As [`UdpSocket::send_to`], with a control message asking the kernel
    /// for the datagram's TX stamps (see [`OutMsg::stamp`]).
    pub fn send_to_stamped(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        let iov = [io::IoSlice::new(buf)];
        sys::send_mmsg(self.fd.as_fd(), 1, |_| (dst.copied(), &iov[..], None, true)).map(|_| buf.len())
    }

    /// Sends up to `msgs.len()` messages in one `sendmmsg` call, each message a
    /// plain datagram or a GSO super-packet. Returns how many messages the
    /// kernel accepted (a prefix); an error means none was.
    ///
    /// A GSO message of more than [`GSO_MAX_SEGMENTS`] segments that the
    /// kernel refuses with `EINVAL` (a kernel or path whose segment limit
    /// is lower than the probe found) is sent again as messages of at most
    /// [`GSO_MAX_SEGMENTS`] segments; when that works the process's segment
    /// limit drops to [`GSO_MAX_SEGMENTS`] ([`gso_segment_cap`]) and it
    /// counts as accepted. Only if the first of those is refused too does
    /// the `EINVAL` reach the caller (whose fallback then sends the
    /// message's datagrams without GSO): nothing of it was sent.
    pub fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        self.send_batch_with(msgs, true)
    }

    /// As [`UdpSocket::send_batch`], but never waiting for room: where a
    /// split message meets a full send buffer after some of its pieces went
    /// out, the error is `WouldBlock` carrying [`super::partly::PartlySent`] (see
    /// [`super::partly::partly_sent`]) and the caller sends the rest of the message later.
    /// The engine uses this, so its thread never waits on one socket.
    pub fn send_batch_nowait(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        self.send_batch_with(msgs, false)
    }

    fn send_batch_with(&self, msgs: &[OutMsg<'_>], wait: bool) -> io::Result<usize> {
        // A split's pieces not taken by a tracer describe no later call.
        SPLIT.with(|s| {
            if !s.borrow().is_empty() {
                s.borrow_mut().clear()
            }
        });
        match self.send_mmsg(msgs) {
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) && gso_segments(&msgs[0]) > GSO_MAX_SEGMENTS => {
                self.send_split(&msgs[0], e, wait).map(|()| 1)
            }
            r => r,
        }
    }

    /// Sends `m`, a GSO message the kernel refused with `first_err`, as
    /// messages of at most [`GSO_MAX_SEGMENTS`] segments, each retried on
    /// `EINTR` and — when `wait` — on `EAGAIN` until accepted. Without
    /// `wait`, a full send buffer ends it: `WouldBlock`, with [`super::partly::PartlySent`]
    /// once a piece went out.
    /// A refusal of the first piece returns `first_err`: nothing was sent.
    /// Once a piece went out, a later piece the kernel will not segment
    /// (`EIO`/`EINVAL`/`EMSGSIZE`) goes out as plain datagrams, and any
    /// other error is returned (the caller drops the rest and reports it)
    /// — never a resend of what was sent.
    fn send_split(&self, m: &OutMsg<'_>, first_err: io::Error, wait: bool) -> io::Result<()> {
        let seg = usize::from(m.segment.unwrap_or(0)).max(1);
        let pieces = split_iov(m.iov, seg * GSO_MAX_SEGMENTS);
        // The refused message was a kernel message too: the kernel gave it
        // an `OPT_ID` key (when stamped) before its segments were counted.
        note_split_piece(0);
        let mut sent = 0;
        for (i, piece) in pieces.iter().enumerate() {
            // Every piece of a stamped message is stamped, each under its
            // own `OPT_ID` key ([`take_split_pieces`] tells the tracer).
            match self.send_retrying(OutMsg { dst: m.dst, iov: piece, segment: m.segment, stamp: m.stamp }, wait) {
                Ok(()) => note_split_piece(piece.iter().map(|v| v.len()).sum::<usize>().div_ceil(seg)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(partly(sent, e)),
                Err(_) if i == 0 => return Err(first_err),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) => {
                    return self.send_plain_rest(m, &pieces[i..], seg, sent, wait);
                }
                Err(e) => return Err(e),
            }
            sent += piece.iter().map(|v| v.len()).sum::<usize>().div_ceil(seg);
            if i == 0 {
                // The kernel took a smaller message of the same segments:
                // its limit, not GSO itself, refused the whole one.
                lower_gso_segment_cap(GSO_MAX_SEGMENTS);
            }
        }
        Ok(())
    }

    /// The rest of a split message, one plain datagram per segment (`sent`
    /// of its datagrams went out before).
    fn send_plain_rest(
        &self,
        m: &OutMsg<'_>,
        pieces: &[Vec<io::IoSlice<'_>>],
        seg: usize,
        mut sent: usize,
        wait: bool,
    ) -> io::Result<()> {
        for piece in pieces {
            for iov in split_iov(piece, seg) {
                self.send_retrying(OutMsg { dst: m.dst, iov: &iov, segment: None, stamp: m.stamp }, wait)
                    .map_err(|e| partly(sent, e))?;
                note_split_piece(1);
                sent += 1;
            }
        }
        Ok(())
    }

    /// Sends one message, retrying on `EINTR` and — when `wait` — waiting
    /// out `EAGAIN` (bounded polls for room) until the kernel accepts it or
    /// refuses it otherwise.
    fn send_retrying(&self, m: OutMsg<'_>, wait: bool) -> io::Result<()> {
        let out = [m];
        loop {
            match self.send_mmsg(&out) {
                Ok(_) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && wait => {
                    let _ = poll_writable(self.fd.as_raw_fd(), Some(Duration::from_millis(10)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// One `sendmmsg` of up to 1024 of `msgs`, as [`UdpSocket::send_batch`].
    fn send_mmsg(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        let n = msgs.len().min(1024);
        if n == 0 {
            return Ok(0);
        }
        sys::send_mmsg(self.fd.as_fd(), n, |i| (msgs[i].dst, msgs[i].iov, msgs[i].segment, msgs[i].stamp))
    }

    /// Receives up to `bufs.len()` messages in one `recvmmsg` call (nonblocking).
    /// With GRO enabled a message may hold several datagrams of
    /// `meta.segment` bytes each. Returns the number of messages.
    pub fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        self.recv_batch_flags(bufs, meta, libc::MSG_DONTWAIT)
    }

    /// As [`UdpSocket::recv_batch`], but sleeps in the kernel until the
    /// first message arrives (`MSG_WAITFORONE`), bounded by the socket's
    /// `SO_RCVTIMEO`. Only a blocking file description blocks: on a
    /// nonblocking one this returns `EAGAIN` at once.
    pub fn recv_batch_wait(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        self.recv_batch_flags(bufs, meta, libc::MSG_WAITFORONE)
    }

    fn recv_batch_flags(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], flags: libc::c_int) -> io::Result<usize> {
        let n = bufs.len().min(meta.len()).min(1024);
        if n == 0 {
            return Ok(0);
        }
        sys::recv_mmsg(self.fd.as_fd(), bufs, n, flags, |i, m| {
            let c = m.control;
            if let Some(ns) = c.stamp_ns {
                if crate::tracepoint::on() {
                    crate::tracepoint::note_rx_stamp(i, ns);
                }
            }
            let info = PktInfo { v4: c.v4, v6: c.v6, tos: c.tos, ttl: c.ttl, tclass: c.tclass, hoplimit: c.hoplimit };
            meta[i] = InMeta {
                len: m.len,
                src: m.src,
                segment: c.gro_segment,
                truncated: m.truncated,
                pktinfo: (!info.is_empty()).then_some(info),
            };
        })
    }

    /// Reads one queued extended error (IP_RECVERR), returning its errno and
    /// the address it concerns. `Ok(None)` when the error queue is empty.
    pub fn take_queued_error(&self) -> io::Result<Option<(i32, Option<SocketAddr>)>> {
        sys::take_queued_error(self.fd.as_fd())
    }

    /// Reads and clears the socket's pending error (SO_ERROR); 0 when none.
    pub fn take_socket_error(&self) -> i32 {
        self.getsockopt_int(libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(0)
    }
}

#[cfg(test)]
mod gso_tests {
    use super::*;

    #[test]
    fn split_iov_cuts_at_byte_boundaries_across_slices() {
        let data: Vec<u8> = (0..=255).collect();
        let iov = [io::IoSlice::new(&data[..100]), io::IoSlice::new(&data[100..])];
        let pieces = split_iov(&iov, 64);
        let lens: Vec<Vec<usize>> = pieces.iter().map(|p| p.iter().map(|v| v.len()).collect()).collect();
        assert_eq!(lens, vec![vec![64], vec![36, 28], vec![64], vec![64]]);
        let joined: Vec<u8> = pieces.iter().flatten().flat_map(|v| v.iter().copied()).collect();
        assert_eq!(joined, data);
        assert!(split_iov(&[], 64).is_empty());
    }

    #[test]
    fn segments_of_a_message() {
        let d = [0u8; 1000];
        let iov = [io::IoSlice::new(&d)];
        assert_eq!(gso_segments(&OutMsg { dst: None, iov: &iov, segment: Some(64), stamp: false }), 16);
        assert_eq!(gso_segments(&OutMsg { dst: None, iov: &iov, segment: None, stamp: false }), 0);
    }
}
