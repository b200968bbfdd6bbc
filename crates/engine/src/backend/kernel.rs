//! The kernel UDP backend: a nonblocking kernel UDP socket with GSO and
//! GRO.
//!
//! * [`UdpSocket`] — `send_to`, GSO + `sendmmsg` batch sends
//!   ([`UdpSocket::send_batch`]), GRO + `recvmmsg` batch receives
//!   ([`UdpSocket::recv_batch`]) with their [`OutMsg`] / [`InMeta`] /
//!   [`PktInfo`], and the socket's error queue.
//! * [`gso_max_segments`] — how many segments a GSO message may carry here.
//!
//! The socket's own system calls are here, under the safety policy of
//! [`crate::sys`]; the engine's other primitives are in [`crate::sys`].

#![allow(unsafe_code)] // The kernel transport's own socket calls (sendmmsg, recvmmsg, cmsgs).

use super::partly::partly;
use crate::fdspace::{new_private, private, Private};
use crate::sys::addr::RawAddr;
use crate::sys::cvt;
use crate::sys::poll::poll_writable;
use crate::sys::timestamp::SO_TIMESTAMPING;
use eudp_wire::limits::{GSO_MAX_SEGMENTS, GSO_MAX_SEGMENTS_RAISED};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::Duration;

/// `UDP_SEGMENT` (linux/udp.h): per-send GSO segment size.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): receive coalesced super-packets.
const UDP_GRO: libc::c_int = 104;
/// Room for one `UDP_SEGMENT` (u16) control message.
const GSO_CMSG_SPACE: usize = 32;
/// Room for the receive control messages we ask for: `UDP_GRO` (an int, 24
/// bytes with its header), `IP_PKTINFO` (32) or `IPV6_PKTINFO` (40),
/// `IP_TTL` and `IP_TOS` or `IPV6_HOPLIMIT` and `IPV6_TCLASS` (24 each)
/// and, when tracing, `SCM_TIMESTAMPING` (three timespecs, 64 bytes).
const RX_CMSG_SPACE: usize = 192;

/// `recvmmsg` header arrays of one thread, kept between reads (see
/// `UdpSocket::recv_batch_into`).
#[derive(Default)]
struct RxArrays {
    addrs: Vec<RawAddr>,
    cmsgs: Vec<[u64; RX_CMSG_SPACE / 8]>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

thread_local! {
    static RX_ARRAYS: std::cell::RefCell<RxArrays> = std::cell::RefCell::new(RxArrays::default());
}

/// One outgoing backend message: a run of equal-size datagrams to one
/// destination, sent as one GSO super-packet when `segment` is set.
pub struct OutMsg<'a> {
    /// Destination, or `None` on a connected socket.
    pub dst: Option<SocketAddr>,
    /// Payload pieces, concatenated by the kernel.
    pub iov: &'a [io::IoSlice<'a>],
    /// GSO segment size; `None` for a single plain datagram.
    pub segment: Option<u16>,
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
        Ok(s.send_mmsg(&[OutMsg { dst: Some(me), iov: &iov, segment: Some(1) }])? == 1)
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
        let fd = self.fd.as_raw_fd();
        // SAFETY: a plain open of a constant path, closed below (never
        // kept); dup3 onto `fd`, which this value owns, only changes what
        // that number refers to.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null < 0 {
                return;
            }
            match crate::fdspace::placement_dup3() {
                Some(dup3) => dup3(null, fd, libc::O_CLOEXEC),
                None => libc::dup3(null, fd, libc::O_CLOEXEC),
            };
            libc::close(null);
        }
    }

    /// Opens a nonblocking, close-on-exec UDP socket of the given family.
    pub fn new(v6: bool) -> io::Result<Self> {
        let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
        let fd = new_private(|| {
            // SAFETY: plain syscall; the returned fd is owned by OwnedFd below.
            let fd =
                cvt(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
            // SAFETY: fd was just returned by socket() and is owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
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
        let raw = fd.as_raw_fd();
        let mut ty: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointer to a live c_int and its length.
        cvt(unsafe {
            libc::getsockopt(raw, libc::SOL_SOCKET, libc::SO_TYPE, &mut ty as *mut _ as *mut libc::c_void, &mut len)
        })?;
        if ty != libc::SOCK_DGRAM {
            return Err(io::Error::from_raw_os_error(libc::ENOTSOCK));
        }
        let mut dom: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: as above.
        cvt(unsafe {
            libc::getsockopt(raw, libc::SOL_SOCKET, libc::SO_DOMAIN, &mut dom as *mut _ as *mut libc::c_void, &mut len)
        })?;
        if dom != libc::AF_INET && dom != libc::AF_INET6 {
            return Err(io::Error::from_raw_os_error(libc::EAFNOSUPPORT));
        }
        Ok(UdpSocket { fd, v6: dom == libc::AF_INET6 })
    }

    /// Clears O_NONBLOCK on the file description. Calls of this type pass
    /// `MSG_DONTWAIT` anyway; only [`UdpSocket::recv_batch_wait`] blocks.
    pub fn set_description_blocking(&self) -> io::Result<()> {
        let raw = self.fd.as_raw_fd();
        // SAFETY: fcntl with integer arguments on a valid fd we own.
        let fl = cvt(unsafe { libc::fcntl(raw, libc::F_GETFL) })?;
        // SAFETY: as above.
        cvt(unsafe { libc::fcntl(raw, libc::F_SETFL, fl & !libc::O_NONBLOCK) }).map(drop)
    }

    /// True for an IPv6 socket.
    pub fn is_v6(&self) -> bool {
        self.v6
    }

    fn setsockopt_int(&self, level: libc::c_int, name: libc::c_int, val: libc::c_int) -> io::Result<()> {
        // SAFETY: passes a pointer to a live c_int and its size.
        cvt(unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                name,
                &val as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as u32,
            )
        })
        .map(drop)
    }

    fn getsockopt_int(&self, level: libc::c_int, name: libc::c_int) -> io::Result<libc::c_int> {
        let mut val: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointer to a live c_int and its length.
        cvt(unsafe {
            libc::getsockopt(self.fd.as_raw_fd(), level, name, &mut val as *mut _ as *mut libc::c_void, &mut len)
        })?;
        Ok(val)
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
        const SO_MEMINFO: libc::c_int = 55;
        let mut info = [0u32; 16];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: pointer and length of a live u32 array; the kernel writes
        // at most `len` bytes and reports how many.
        cvt(unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                SO_MEMINFO,
                info.as_mut_ptr() as *mut libc::c_void,
                &mut len,
            )
        })?;
        let at = libc::SK_MEMINFO_DROPS as usize;
        if (len as usize) < (at + 1) * 4 {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        Ok(u64::from(info[at]))
    }

    /// Probes UDP GSO: true when the kernel accepts `UDP_SEGMENT` on this socket.
    pub fn probe_gso(&self) -> bool {
        // Setting a segment size of 0 as the socket default is a no-op that
        // fails with ENOPROTOOPT on kernels without UDP GSO.
        self.setsockopt_int(libc::SOL_UDP, UDP_SEGMENT, 0).is_ok()
    }

    /// Enables UDP GRO on receive; false when the kernel lacks it.
    pub fn enable_gro(&self) -> bool {
        self.setsockopt_int(libc::SOL_UDP, UDP_GRO, 1).is_ok()
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
        self.getsockopt_int(libc::SOL_UDP, UDP_GRO).map(|v| v != 0).unwrap_or(false)
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
        let raw = RawAddr::from_std(addr);
        // SAFETY: pointer/length from a live RawAddr.
        cvt(unsafe { libc::bind(self.fd.as_raw_fd(), raw.as_ptr(), raw.len) }).map(drop)
    }

    /// Connects to a peer (sets the default destination and filters sources).
    pub fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        let raw = RawAddr::from_std(addr);
        // SAFETY: pointer/length from a live RawAddr.
        cvt(unsafe { libc::connect(self.fd.as_raw_fd(), raw.as_ptr(), raw.len) }).map(drop)
    }

    /// Dissolves the association (connect to AF_UNSPEC).
    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: plain data.
        let mut sa: libc::sockaddr = unsafe { zeroed() };
        sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
        // SAFETY: pointer to a live sockaddr.
        cvt(unsafe { libc::connect(self.fd.as_raw_fd(), &sa, size_of::<libc::sockaddr>() as u32) }).map(drop)
    }

    /// The bound local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let mut raw = RawAddr::empty();
        // SAFETY: pointer/length into a live RawAddr that the kernel fills.
        cvt(unsafe {
            libc::getsockname(self.fd.as_raw_fd(), &mut raw.storage as *mut _ as *mut libc::sockaddr, &mut raw.len)
        })?;
        raw.to_std().ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
    }

    /// The connected peer address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        let mut raw = RawAddr::empty();
        // SAFETY: as in local_addr.
        cvt(unsafe {
            libc::getpeername(self.fd.as_raw_fd(), &mut raw.storage as *mut _ as *mut libc::sockaddr, &mut raw.len)
        })?;
        raw.to_std().ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
    }

    /// Sends one datagram (nonblocking). `dst` is `None` on a connected socket.
    pub fn send_to(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        let raw = dst.map(RawAddr::from_std);
        let (p, l) = match &raw {
            Some(r) => (r.as_ptr(), r.len),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: buffer and address pointers come from live borrows.
        cvt(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                p,
                l,
            )
        })
        .map(|n| n as usize)
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
        let mut sent = 0;
        for (i, piece) in pieces.iter().enumerate() {
            match self.send_retrying(OutMsg { dst: m.dst, iov: piece, segment: m.segment }, wait) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(partly(sent, e)),
                Err(_) if i == 0 => return Err(first_err),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EIO | libc::EINVAL | libc::EMSGSIZE)) => {
                    return self.send_plain_rest(m.dst, &pieces[i..], seg, sent, wait);
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
        dst: Option<SocketAddr>,
        pieces: &[Vec<io::IoSlice<'_>>],
        seg: usize,
        mut sent: usize,
        wait: bool,
    ) -> io::Result<()> {
        for piece in pieces {
            for iov in split_iov(piece, seg) {
                self.send_retrying(OutMsg { dst, iov: &iov, segment: None }, wait).map_err(|e| partly(sent, e))?;
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
        let mut addrs: Vec<Option<RawAddr>> = Vec::with_capacity(n);
        let mut cmsgs: Vec<[u64; GSO_CMSG_SPACE / 8]> = vec![[0; GSO_CMSG_SPACE / 8]; n];
        // SAFETY: mmsghdr is plain data; zero is a valid initial value.
        let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
        for m in &msgs[..n] {
            addrs.push(m.dst.as_ref().map(RawAddr::from_std));
        }
        for i in 0..n {
            let m = &msgs[i];
            let h = &mut hdrs[i].msg_hdr;
            if let Some(a) = &addrs[i] {
                h.msg_name = a.as_ptr() as *mut libc::c_void;
                h.msg_namelen = a.len;
            }
            // IoSlice is ABI-compatible with iovec on Unix.
            h.msg_iov = m.iov.as_ptr() as *mut libc::iovec;
            h.msg_iovlen = m.iov.len();
            if let Some(seg) = m.segment {
                let buf = cmsgs[i].as_mut_ptr() as *mut u8;
                h.msg_control = buf as *mut libc::c_void;
                // SAFETY: CMSG_SPACE is a pure size computation.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
                // SAFETY: msg_control points at GSO_CMSG_SPACE zeroed, aligned bytes,
                // enough for one u16 cmsg; CMSG_FIRSTHDR/DATA stay inside it.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
                }
            }
        }
        // SAFETY: every pointer in hdrs refers to addrs, cmsgs or the caller's
        // iov slices, all alive across this call.
        let r = unsafe {
            libc::sendmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT)
        };
        cvt(r).map(|v| v as usize)
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
        let r = RX_ARRAYS.try_with(|cell| {
            cell.try_borrow_mut().ok().map(|mut a| self.recv_batch_into(&mut a, bufs, meta, n, flags))
        });
        match r {
            Ok(Some(r)) => r,
            // Not expected (nothing here receives re-entrantly; a thread
            // past its thread-locals' end): fresh arrays.
            _ => self.recv_batch_into(&mut RxArrays::default(), bufs, meta, n, flags),
        }
    }

    /// [`UdpSocket::recv_batch_flags`] with the header arrays `a`, grown to
    /// `n` as needed and reused: allocating and zeroing four arrays per call
    /// would be a good part of a request/response server's receive.
    fn recv_batch_into(
        &self,
        a: &mut RxArrays,
        bufs: &mut [Vec<u8>],
        meta: &mut [InMeta],
        n: usize,
        flags: libc::c_int,
    ) -> io::Result<usize> {
        if a.addrs.len() < n {
            a.addrs.resize(n, RawAddr::empty());
            a.cmsgs.resize(n, [0; RX_CMSG_SPACE / 8]);
            // SAFETY: plain data.
            a.hdrs.resize_with(n, || unsafe { zeroed() });
            a.iovs.resize(n, libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 });
        }
        let RxArrays { addrs, cmsgs, iovs, hdrs } = a;
        for (i, b) in bufs[..n].iter_mut().enumerate() {
            iovs[i] = libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() };
            addrs[i].len = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            // Every field the kernel reads is set; the rest are outputs.
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = &mut addrs[i].storage as *mut _ as *mut libc::c_void;
            h.msg_namelen = addrs[i].len;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = cmsgs[i].as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = RX_CMSG_SPACE;
            h.msg_flags = 0;
            hdrs[i].msg_len = 0;
        }
        // SAFETY: all pointers refer to the live arrays above and the caller's buffers.
        let r = unsafe {
            if n == 1 {
                // One message (a blocking read on the program's thread, a
                // request/response socket): `recvmsg` does what a one-entry
                // `recvmmsg` does with less work in the kernel (no header
                // vector copied in, no length written back, no batch loop).
                // A datagram of 0 bytes is still one message, as there.
                match libc::recvmsg(self.fd.as_raw_fd(), &mut hdrs[0].msg_hdr, flags & !libc::MSG_WAITFORONE) {
                    len if len >= 0 => {
                        hdrs[0].msg_len = len as u32;
                        1
                    }
                    _ => -1,
                }
            } else {
                libc::recvmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, flags, std::ptr::null_mut())
            }
        };
        let got = cvt(r)? as usize;
        for i in 0..got {
            let h = &hdrs[i].msg_hdr;
            addrs[i].len = h.msg_namelen;
            let mut segment = None;
            let mut info = PktInfo::default();
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG
            // macros walk only within that range.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        if v > 0 {
                            segment = Some(v as usize);
                        }
                    }
                    if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_PKTINFO {
                        let p = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in_pktinfo);
                        let a = |x: libc::in_addr| std::net::Ipv4Addr::from(u32::from_be(x.s_addr));
                        info.v4 = Some((p.ipi_ifindex as u32, a(p.ipi_spec_dst), a(p.ipi_addr)));
                    }
                    if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TOS {
                        info.tos = Some(std::ptr::read_unaligned(libc::CMSG_DATA(c)));
                    }
                    if (*c).cmsg_level == libc::IPPROTO_IP && (*c).cmsg_type == libc::IP_TTL {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int);
                        info.ttl = Some(v.clamp(0, 255) as u8);
                    }
                    if (*c).cmsg_level == libc::IPPROTO_IPV6 && (*c).cmsg_type == libc::IPV6_PKTINFO {
                        let p = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::in6_pktinfo);
                        info.v6 = Some((std::net::Ipv6Addr::from(p.ipi6_addr.s6_addr), p.ipi6_ifindex));
                    }
                    if (*c).cmsg_level == libc::IPPROTO_IPV6
                        && matches!((*c).cmsg_type, libc::IPV6_TCLASS | libc::IPV6_HOPLIMIT)
                    {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int).clamp(0, 255) as u8;
                        if (*c).cmsg_type == libc::IPV6_TCLASS {
                            info.tclass = Some(v);
                        } else {
                            info.hoplimit = Some(v);
                        }
                    }
                    if (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == SO_TIMESTAMPING
                        && crate::tracepoint::on()
                    {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        crate::tracepoint::note_rx_stamp(i, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
            meta[i] = InMeta {
                len: hdrs[i].msg_len as usize,
                src: addrs[i].to_std(),
                segment,
                truncated: h.msg_flags & libc::MSG_TRUNC != 0,
                pktinfo: (!info.is_empty()).then_some(info),
            };
        }
        Ok(got)
    }

    /// Reads one queued extended error (IP_RECVERR), returning its errno and
    /// the address it concerns. `Ok(None)` when the error queue is empty.
    pub fn take_queued_error(&self) -> io::Result<Option<(i32, Option<SocketAddr>)>> {
        let mut buf = [0u8; 512];
        let mut ctrl = [0u64; 64];
        let mut name = RawAddr::empty();
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        // SAFETY: plain data.
        let mut h: libc::msghdr = unsafe { zeroed() };
        h.msg_name = &mut name.storage as *mut _ as *mut libc::c_void;
        h.msg_namelen = name.len;
        h.msg_iov = &mut iov;
        h.msg_iovlen = 1;
        h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = std::mem::size_of_val(&ctrl);
        // SAFETY: pointers refer to the live locals above.
        let r = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(None) } else { Err(e) };
        }
        name.len = h.msg_namelen;
        let mut errno = None;
        // SAFETY: walking the control data the kernel wrote.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h);
            while !c.is_null() {
                let lvl = (*c).cmsg_level;
                let ty = (*c).cmsg_type;
                if (lvl == libc::IPPROTO_IP && ty == libc::IP_RECVERR)
                    || (lvl == libc::IPPROTO_IPV6 && ty == libc::IPV6_RECVERR)
                {
                    let ee = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                    errno = Some(ee.ee_errno as i32);
                }
                c = libc::CMSG_NXTHDR(&h, c);
            }
        }
        Ok(errno.map(|e| (e, name.to_std())))
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
        assert_eq!(gso_segments(&OutMsg { dst: None, iov: &iov, segment: Some(64) }), 16);
        assert_eq!(gso_segments(&OutMsg { dst: None, iov: &iov, segment: None }), 0);
    }
}
