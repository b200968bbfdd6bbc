//! The kernel UDP backend: every raw syscall of the engine lives here.
//!
//! Safety policy: each `unsafe` block below calls one libc function with
//! pointers derived from live Rust borrows for the duration of the call, or
//! reads a kernel-initialised structure after the call reported success. No
//! pointer outlives the call it was made for. Everything above this module is
//! safe Rust.
//!
//! What this backend offers the engine:
//! * [`UdpSocket`] — a nonblocking kernel UDP socket (IPv4 or IPv6) with
//!   `send_to`, GSO + `sendmmsg` batch sends ([`UdpSocket::send_batch`]) and
//!   GRO + `recvmmsg` batch receives ([`UdpSocket::recv_batch`]).
//! * [`EventFd`], [`Epoll`] and [`poll_readable`] — readiness primitives.
//! * [`pin_current_thread`] — CPU pinning for the engine thread.

#![allow(unsafe_code)] // This module is the documented home of the engine's unsafe code.

use crate::fdspace::{new_private, private, Private};
use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{
    AtomicBool, AtomicI32, AtomicUsize,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, OnceLock};

use eudp_wire::limits::{GSO_MAX_SEGMENTS, GSO_MAX_SEGMENTS_RAISED};
use std::time::Duration;

/// The kernel lacks `epoll_pwait2` (before 5.11): waits round up to milliseconds.
static NO_PWAIT2: AtomicBool = AtomicBool::new(false);

/// `UDP_SEGMENT` (linux/udp.h): per-send GSO segment size.
const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): receive coalesced super-packets.
const UDP_GRO: libc::c_int = 104;
/// `SO_TIMESTAMPING` (asm-generic/socket.h, the 32-bit-time variant that is
/// also `SCM_TIMESTAMPING`), and `SCM_TSTAMP_SCHED` (linux/errqueue.h).
pub const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TSTAMP_SCHED: u32 = 1;
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

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_isize(r: isize) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// A socket address in the kernel's representation.
#[derive(Clone, Copy)]
pub(crate) struct RawAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl RawAddr {
    pub(crate) fn from_std(addr: &SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
        let mut storage: libc::sockaddr_storage = unsafe { zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in, sin) };
                size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: a.flowinfo(),
                    sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                    sin6_scope_id: a.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe { std::ptr::write(&mut storage as *mut _ as *mut libc::sockaddr_in6, sin6) };
                size_of::<libc::sockaddr_in6>()
            }
        };
        RawAddr { storage, len: len as libc::socklen_t }
    }

    /// The storage and its length, for callers that build their own calls.
    pub(crate) fn into_parts(self) -> (libc::sockaddr_storage, libc::socklen_t) {
        (self.storage, self.len)
    }

    fn empty() -> Self {
        // SAFETY: plain data.
        RawAddr { storage: unsafe { zeroed() }, len: size_of::<libc::sockaddr_storage>() as libc::socklen_t }
    }

    /// Converts back to a std address; `None` for families other than IPv4/6.
    #[allow(clippy::wrong_self_convention)] // newer clippy (1.95); the fix (by value) is the send path's owner's call
    pub(crate) fn to_std(&self) -> Option<SocketAddr> {
        match self.storage.ss_family as libc::c_int {
            libc::AF_INET => {
                // SAFETY: the kernel wrote a sockaddr_in for AF_INET.
                let sin = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in) };
                let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                // SAFETY: the kernel wrote a sockaddr_in6 for AF_INET6.
                let s = unsafe { &*(&self.storage as *const _ as *const libc::sockaddr_in6) };
                let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(s.sin6_port), s.sin6_flowinfo, s.sin6_scope_id)))
            }
            _ => None,
        }
    }

    fn as_ptr(&self) -> *const libc::sockaddr {
        &self.storage as *const _ as *const libc::sockaddr
    }
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

/// The first `datagrams` datagrams of a message went out before the
/// kernel's send buffer filled (a split GSO message, see
/// [`UdpSocket::send_batch_nowait`]); the rest was not sent.
#[derive(Debug)]
pub struct PartlySent {
    pub datagrams: usize,
}

impl std::fmt::Display for PartlySent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "send buffer full after {} datagrams of the message", self.datagrams)
    }
}

impl std::error::Error for PartlySent {}

/// `e` as is when nothing was sent, else `WouldBlock` carrying [`PartlySent`]
/// when `e` is a full send buffer (other errors after a partial send are
/// returned as they are: the caller drops the rest).
fn partly(sent: usize, e: io::Error) -> io::Error {
    if sent == 0 || e.kind() != io::ErrorKind::WouldBlock {
        return e;
    }
    io::Error::new(io::ErrorKind::WouldBlock, PartlySent { datagrams: sent })
}

/// The error a backend returns when only the first `datagrams` datagrams
/// of a GSO message went out (read back with [`partly_sent`]).
pub fn partly_sent_error(datagrams: usize) -> io::Error {
    partly(datagrams, io::ErrorKind::WouldBlock.into())
}

/// The datagrams of the first message that went out, when a send failed
/// with [`PartlySent`].
pub fn partly_sent(e: &io::Error) -> Option<usize> {
    e.get_ref().and_then(|x| x.downcast_ref::<PartlySent>()).map(|p| p.datagrams)
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
    /// again; a change between 0 and 1 patches kernel text (~85 µs each
    /// way for IPv4, ~155 for IPv6 measured on the test VM), so a program
    /// whose only GRO socket comes and goes would pay both per socket. IPv6
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
        cvt_isize(unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                buf.as_ptr() as *const libc::c_void,
                buf.len(),
                libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                p,
                l,
            )
        })
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
    /// out, the error is `WouldBlock` carrying [`PartlySent`] (see
    /// [`partly_sent`]) and the caller sends the rest of the message later.
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
    /// `wait`, a full send buffer ends it: `WouldBlock`, with [`PartlySent`]
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
    /// `n` as needed and reused: a read used to allocate and zero four
    /// arrays per call, a good part of a request/response server's receive.
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

/// An eventfd used as a doorbell or as a pollable readiness flag.
#[derive(Debug)]
pub struct EventFd {
    fd: Private<OwnedFd>,
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl EventFd {
    /// A nonblocking, close-on-exec eventfd starting at 0 (not readable).
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(EventFd { fd })
    }

    /// Makes the fd readable (adds 1 to the counter).
    pub fn set(&self) {
        let v: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN)
        // still leaves the fd readable, which is all a doorbell needs.
        unsafe { libc::write(self.fd.as_raw_fd(), &v as *const u64 as *const libc::c_void, 8) };
    }

    /// Makes the fd unreadable (drains the counter).
    pub fn clear(&self) {
        read_counter(self.fd.as_raw_fd());
    }
}

/// A descriptor that reports `POLLERR`/`EPOLLERR` (and nothing else) while
/// raised: an application's poll or epoll set can hold it next to a
/// socket whose asynchronous error the engine took off the kernel socket,
/// so the set reports that error as the kernel socket would have, level-
/// or edge-triggered, rather than as input.
///
/// Unnamed (autobound) `AF_UNIX` datagram sockets: each flag's own `a`,
/// connected to `b`, one socket the process's flags share (one descriptor
/// per flag, not two). Raising connects `b` to `a`, queues one byte at `b`
/// from `a` and disconnects `b`, which discards the byte and sets `a`'s
/// pending error (`ECONNRESET`, the kernel's signal that one side of a
/// connected datagram pair went away) with an error wake-up; clearing
/// reads `a`'s `SO_ERROR`. `a` never receives anything, so it is never
/// readable, and it is polled for input only. Raises are serialized (they
/// share `b`'s peer); a fork child makes its own `b`.
#[derive(Debug)]
pub struct ErrorFlag {
    a: Private<OwnedFd>,
    b: Arc<SharedEnd>,
    /// `a`'s name, given at the first raise: only a raise needs it, and
    /// the bind and `getsockname` were a sixth of a socket's adoption.
    a_name: OnceLock<(libc::sockaddr_un, libc::socklen_t)>,
}

/// The `b` end shared by a process's error flags.
#[derive(Debug)]
struct SharedEnd {
    fd: Private<OwnedFd>,
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
    pid: libc::pid_t,
}

/// The process's shared end; held by each flag too, so it outlives them.
/// Guarded by `END_HOLDER` (which also serializes raises) rather than a
/// mutex: a fork child takes over a lock its parent's thread held.
static SHARED_END: EndSlot = EndSlot(std::cell::UnsafeCell::new(None));

struct EndSlot(std::cell::UnsafeCell<Option<Arc<SharedEnd>>>);

// SAFETY: the cell is only reached through `EndLock::slot`, with the lock held.
unsafe impl Sync for EndSlot {}

/// Pid of the process holding the shared end (0: free).
static END_HOLDER: AtomicI32 = AtomicI32::new(0);

struct EndLock;

impl Drop for EndLock {
    fn drop(&mut self) {
        END_HOLDER.store(0, Release);
    }
}

impl AsRawFd for ErrorFlag {
    fn as_raw_fd(&self) -> RawFd {
        self.a.as_raw_fd()
    }
}

/// A nonblocking close-on-exec `AF_UNIX` datagram socket, unnamed.
fn unix_dgram() -> io::Result<Private<OwnedFd>> {
    new_private(|| {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = cvt(unsafe {
            libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: fresh fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
}

/// Gives an `AF_UNIX` socket an autobound (abstract) name; returns it.
fn autobind(fd: RawFd) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // SAFETY: an address of just the family asks for an autobound
    // (abstract) name; getsockname writes within `addr`'s size.
    let len = unsafe {
        cvt(libc::bind(
            fd,
            &addr as *const _ as *const libc::sockaddr,
            size_of::<libc::sa_family_t>() as libc::socklen_t,
        ))?;
        let mut len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
        cvt(libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len))?;
        len
    };
    Ok((addr, len))
}

/// [`unix_dgram`] with an autobound name, and that name.
fn unix_autobound() -> io::Result<(Private<OwnedFd>, libc::sockaddr_un, libc::socklen_t)> {
    let fd = unix_dgram()?;
    let (addr, len) = autobind(fd.as_raw_fd())?;
    Ok((fd, addr, len))
}

fn lock_end() -> EndLock {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        match END_HOLDER.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => return EndLock,
            Err(h) if h != me && END_HOLDER.compare_exchange(h, me, Acquire, Relaxed).is_ok() => return EndLock,
            Err(_) => std::thread::yield_now(),
        }
    }
}

impl EndLock {
    /// The shared end's slot.
    fn slot(&mut self) -> &mut Option<Arc<SharedEnd>> {
        // SAFETY: this process holds END_HOLDER while `self` lives, and
        // `&mut self` makes this the one reference through it.
        unsafe { &mut *SHARED_END.0.get() }
    }
}

impl ErrorFlag {
    /// A lowered flag.
    pub fn new() -> io::Result<Self> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let b = {
            let mut l = lock_end();
            let g = l.slot();
            match g.as_ref().filter(|e| e.pid == pid) {
                Some(e) => e.clone(),
                None => {
                    let (fd, addr, len) = unix_autobound()?;
                    // An end inherited across fork stays with the flags
                    // that hold it (the parent's, never raised here).
                    let e = Arc::new(SharedEnd { fd, addr, len, pid });
                    *g = Some(e.clone());
                    e
                }
            }
        };
        let a = unix_dgram()?;
        // SAFETY: the shared end's address and length as getsockname returned them.
        cvt(unsafe { libc::connect(a.as_raw_fd(), &b.addr as *const _ as *const libc::sockaddr, b.len) })?;
        Ok(ErrorFlag { a, b, a_name: OnceLock::new() })
    }

    /// Raises the flag: `a` reports an error until [`ErrorFlag::clear`].
    pub fn raise(&self) {
        let _serial = lock_end();
        // (Raises are serialized, so one thread names `a`.)
        let (a_addr, a_len) = match self.a_name.get() {
            Some(n) => *n,
            None => match autobind(self.a.as_raw_fd()) {
                Ok(n) => *self.a_name.get_or_init(|| n),
                Err(_) => return,
            },
        };
        let b = self.b.fd.as_raw_fd();
        let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
        // SAFETY: addresses and lengths of live values; one byte from a live
        // buffer. A failure leaves the flag down (as before the call).
        unsafe {
            libc::connect(b, &a_addr as *const _ as *const libc::sockaddr, a_len);
            libc::send(
                self.a.as_raw_fd(),
                b"!".as_ptr() as *const libc::c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
            libc::connect(b, &unspec, size_of::<libc::sockaddr>() as libc::socklen_t);
        }
    }

    /// Lowers the flag.
    pub fn clear(&self) {
        let mut v: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointer/length of a live c_int.
        unsafe {
            libc::getsockopt(
                self.a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut v as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
    }
}

/// Reads (and so resets) the 8-byte counter of an eventfd or timerfd;
/// EAGAIN means it was zero already.
fn read_counter(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// A one-shot CLOCK_MONOTONIC timer as a file descriptor, so the engine's
/// deadline can be moved by any thread without waking the engine.
#[derive(Debug)]
pub struct TimerFd {
    fd: Private<OwnedFd>,
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl TimerFd {
    /// A nonblocking, close-on-exec timer, disarmed.
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd =
                cvt(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(TimerFd { fd })
    }

    /// Fires once, `after` from now (at least 1 ns: zero would disarm);
    /// `None` disarms. Replaces any earlier setting.
    pub fn set(&self, after: Option<Duration>) {
        let value = match after {
            Some(d) => {
                let d = d.max(Duration::from_nanos(1));
                libc::timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: d.subsec_nanos() as _,
                }
            }
            None => libc::timespec { tv_sec: 0, tv_nsec: 0 },
        };
        let spec = libc::itimerspec { it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 }, it_value: value };
        // SAFETY: valid itimerspec; the old value is not asked for. It cannot
        // fail on a valid timerfd with a normalised relative time.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Consumes an expiry (the fd is then unreadable until the next one).
    pub fn clear(&self) {
        read_counter(self.fd.as_raw_fd());
    }
}

/// A level-triggered epoll set keyed by `u64` tokens.
#[derive(Debug)]
pub struct Epoll {
    fd: Private<OwnedFd>,
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Epoll {
    /// A new close-on-exec epoll instance.
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(Epoll { fd })
    }

    /// Watches `fd` for readability under `token` (level-triggered).
    pub fn add_readable(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, libc::EPOLLIN as u32)
    }

    /// Watches `fd` for new readability under `token` (edge-triggered: one
    /// report per arrival, the watcher must read until EAGAIN).
    pub fn add_readable_edge(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, (libc::EPOLLIN | libc::EPOLLET) as u32)
    }

    /// Watches `fd` for readability once (level-triggered, EPOLLONESHOT):
    /// after one report the watch is disarmed until [`Epoll::rearm`].
    pub fn add_readable_oneshot(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, (libc::EPOLLIN | libc::EPOLLONESHOT) as u32)
    }

    /// Re-arms a one-shot watch (reports at once if `fd` is readable now).
    pub fn rearm(&self, fd: RawFd, token: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: (libc::EPOLLIN | libc::EPOLLONESHOT) as u32, u64: token };
        // SAFETY: pointer to a live epoll_event.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) }).map(drop)
    }

    /// Watches `fd` once for writability (`EPOLLOUT | EPOLLONESHOT`), or
    /// re-arms that watch when `rearm` (it reports at once if `fd` is
    /// writable now).
    pub fn watch_writable_once(&self, fd: RawFd, token: u64, rearm: bool) -> io::Result<()> {
        let events = (libc::EPOLLOUT | libc::EPOLLONESHOT) as u32;
        if !rearm {
            return self.add(fd, token, events);
        }
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: pointer to a live epoll_event.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_MOD, fd, &mut ev) }).map(drop)
    }

    fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: pointer to a live epoll_event.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) }).map(drop)
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: pointer to a live epoll_event (ignored by DEL on new kernels).
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_DEL, fd, &mut ev) }).map(drop)
    }

    /// Waits for readiness; returns the tokens that are ready. `None` waits
    /// forever; a timeout is honoured to the microsecond where the kernel
    /// allows.
    pub fn wait(&self, out: &mut Vec<u64>, timeout: Option<Duration>) -> io::Result<()> {
        let mut evs: [MaybeUninit<libc::epoll_event>; 64] = [MaybeUninit::uninit(); 64];
        out.clear();
        let n = epoll_wait_for(self.fd.as_raw_fd(), &mut evs, timeout)?;
        for ev in &evs[..n] {
            // SAFETY: the first n entries were initialised by the kernel.
            let ev = unsafe { ev.assume_init() };
            out.push(ev.u64);
        }
        Ok(())
    }
}

/// `epoll_pwait2` on `epfd` into `evs`; returns how many events it wrote
/// (0 on `EINTR`). `None` waits forever. The timeout is honoured to the
/// nanosecond (a sub-millisecond wait must not round to a busy poll);
/// before Linux 5.11 `epoll_wait` waits whole milliseconds, rounded up.
pub(crate) fn epoll_wait_for(
    epfd: RawFd,
    evs: &mut [MaybeUninit<libc::epoll_event>],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    let cap = evs.len().min(i32::MAX as usize) as i32;
    let ptr = evs.as_mut_ptr() as *mut libc::epoll_event;
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let mut r = -1;
    if !NO_PWAIT2.load(Relaxed) {
        // SAFETY: the kernel writes at most `cap` events at `ptr`; `tsp` is
        // null or points to `ts`, alive for the call; no signal mask.
        r = unsafe { libc::epoll_pwait2(epfd, ptr, cap, tsp, std::ptr::null()) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            NO_PWAIT2.store(true, Relaxed);
        }
    }
    if NO_PWAIT2.load(Relaxed) {
        let ms = timeout.map(|d| d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32).unwrap_or(-1);
        // SAFETY: as above.
        r = unsafe { libc::epoll_wait(epfd, ptr, cap, ms) };
    }
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(r as usize)
}

/// Blocks until one of `fds` is readable or `timeout` passes (`None`: forever).
/// Returns true when something became readable. EINTR counts as a wake-up.
pub fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    restarted(poll_events(fds, libc::POLLIN, timeout))
}

/// As [`poll_readable`], but a signal handler that ran during the wait
/// fails it with `ErrorKind::Interrupted` (a receive that must report
/// `EINTR` as the kernel would for a handler without `SA_RESTART`).
pub fn poll_readable_interruptible(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    poll_events(fds, libc::POLLIN, timeout)
}

/// As [`poll_readable`] for writability.
pub fn poll_writable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    restarted(poll_events(&[fd], libc::POLLOUT, timeout))
}

/// An interrupted wait counts as a wake-up: the caller looks again.
fn restarted(r: io::Result<bool>) -> io::Result<bool> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
        r => r,
    }
}

/// True when `fd` has data to read now (`POLLIN`; unlike
/// [`poll_readable`], a queued error or timestamp alone does not count).
pub fn has_data(fd: RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: pointer to one live pollfd.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// As [`poll_readable`] (or [`poll_readable_interruptible`]), but also
/// watching the first descriptor, a socket, for a shutdown of its reading
/// side (`shutdown(SHUT_RD)`): `Ok(true)` when that happened. An
/// uninterruptible wait ended by a signal is `Ok(false)`.
pub fn poll_readable_or_shut(fds: &[RawFd], timeout: Option<Duration>, interruptible: bool) -> io::Result<bool> {
    match poll_events_first(fds, libc::POLLIN | libc::POLLRDHUP, timeout, None) {
        Ok((_, first)) => Ok(first & libc::POLLRDHUP != 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted && !interruptible => Ok(false),
        Err(e) => Err(e),
    }
}

/// As [`poll_readable_or_shut`], waiting with the signal mask `mask` in
/// place for the wait only (`ppoll`), as a thread that holds its signals
/// blocked ([`AsyncSignalsBlocked`]) must: a signal pending or arriving is
/// taken inside the wait, which then fails with `EINTR`.
pub fn poll_readable_or_shut_masked(
    fds: &[RawFd],
    timeout: Option<Duration>,
    mask: &libc::sigset_t,
) -> io::Result<bool> {
    poll_events_first(fds, libc::POLLIN | libc::POLLRDHUP, timeout, Some(mask))
        .map(|(_, first)| first & libc::POLLRDHUP != 0)
}

/// The asynchronous signals ([`async_signals`]) blocked in this thread
/// until dropped, when the mask they replaced is back (and a signal that
/// came meanwhile is taken). A receive that spins in user space holds them
/// so: a handler that ran between two looks would leave nothing for the
/// wait after the spin to fail with `EINTR` for; blocked, the signal stays
/// pending until that wait ([`poll_readable_or_shut_masked`] with
/// [`AsyncSignalsBlocked::mask_before`]) or the drop.
pub struct AsyncSignalsBlocked {
    old: libc::sigset_t,
}

impl AsyncSignalsBlocked {
    pub fn new() -> Self {
        let set = async_signals();
        // SAFETY: sigset_t is plain data, filled in by the call below.
        let mut old: libc::sigset_t = unsafe { zeroed() };
        // SAFETY: valid set and out pointer.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        AsyncSignalsBlocked { old }
    }

    /// The thread's mask before [`AsyncSignalsBlocked::new`].
    pub fn mask_before(&self) -> &libc::sigset_t {
        &self.old
    }
}

impl Default for AsyncSignalsBlocked {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

fn poll_events(fds: &[RawFd], events: libc::c_short, timeout: Option<Duration>) -> io::Result<bool> {
    poll_events_first(fds, events, timeout, None).map(|(any, _)| any)
}

/// One poll: whether anything was ready, and the first descriptor's revents.
/// With `mask`, a `ppoll` that waits with that signal mask.
fn poll_events_first(
    fds: &[RawFd],
    events: libc::c_short,
    timeout: Option<Duration>,
    mask: Option<&libc::sigset_t>,
) -> io::Result<(bool, libc::c_short)> {
    // At most two descriptors are ever polled: no allocation on the wait path.
    let mut p = [libc::pollfd { fd: -1, events, revents: 0 }; 4];
    debug_assert!(fds.len() <= p.len());
    let n = fds.len().min(p.len());
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
    }
    let r = if let Some(mask) = mask {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as _,
        });
        // The system call itself, not libc's `ppoll` (which the preload
        // shim interposes); the kernel's sigset is 8 bytes.
        // SAFETY: live pollfd array and length; `ts` null or a live
        // timespec; a live sigset.
        unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                p.as_mut_ptr(),
                n as libc::nfds_t,
                ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec),
                mask as *const libc::sigset_t,
                8usize,
            ) as libc::c_int
        }
    } else {
        let ms = timeout
            .map(|d| d.as_millis().min(i32::MAX as u128).max(if d.is_zero() { 0 } else { 1 }) as i32)
            .unwrap_or(-1);
        // SAFETY: pointer to a live pollfd array and a length within it.
        unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms) }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r > 0, p[0].revents))
}

/// Sets an integer socket option on any socket (used by tools for sockets
/// the engine does not own).
pub fn set_int_option(fd: std::os::fd::BorrowedFd<'_>, level: i32, name: i32, val: i32) -> io::Result<()> {
    // SAFETY: pointer to a live c_int and its size; fd is borrowed for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &val as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as u32,
        )
    })
    .map(drop)
}

/// Raises the soft limit on open files towards `want` (bounded by the hard
/// limit); returns the new soft limit. Servers with many sockets need this.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: pointer to a live rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) })?;
    if r.rlim_cur < want {
        r.rlim_cur = want.min(r.rlim_max);
        // SAFETY: pointer to a live rlimit.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) })?;
    }
    Ok(r.rlim_cur)
}

/// Every signal but the synchronous ones a fault raises on the faulting
/// thread (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) and SIGABRT.
pub fn async_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset only write it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS, libc::SIGABRT]
        {
            libc::sigdelset(&mut set, sig);
        }
        set
    }
}

/// Blocks [`async_signals`] in the calling thread, for eudp's own threads:
/// a signal sent to the process is then taken by one of the program's
/// threads, as it would be without eudp, and a program's handler never
/// runs on an engine thread in the middle of its work.
pub fn block_async_signals() {
    let set = async_signals();
    // SAFETY: valid set; the old mask is not asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; the syscall
    // reads it for the duration of the call.
    unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        cvt(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)).map(drop)
    }
}

/// CPU time consumed by the whole process so far (user + system).
pub fn process_cpu_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time consumed by the calling thread so far.
pub fn thread_cpu_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The time-stamp counter, where it is invariant (x86-64 with
/// `constant_tsc` and `nonstop_tsc`); `None` elsewhere.
#[inline]
pub fn tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *OK.get_or_init(|| {
            let c = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            c.contains(" constant_tsc") && c.contains(" nonstop_tsc")
        }) {
            // SAFETY: RDTSC has no memory effects; it is available on every x86-64 CPU.
            return Some(unsafe { core::arch::x86_64::_rdtsc() });
        }
    }
    None
}

/// The time-stamp counter without [`tsc`]'s check, for a caller that made
/// that check once (the tracer's hot path); 0 where there is none.
#[inline(always)]
pub fn tsc_unchecked() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC has no memory effects; it is available on every x86-64 CPU.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// `CLOCK_MONOTONIC_RAW` in nanoseconds (the trace clock).
pub fn monotonic_raw_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC_RAW).as_nanos() as u64
}

/// `CLOCK_REALTIME` in nanoseconds (the clock of kernel software timestamps).
pub fn realtime_ns() -> u64 {
    clock(libc::CLOCK_REALTIME).as_nanos() as u64
}

/// Reads every kernel TX timestamp queued on `fd`'s error queue
/// (`SO_TIMESTAMPING` with `OPT_ID | OPT_TSONLY`), up to 64 per `recvmmsg`, calling `f(key, sched,
/// realtime_ns)` for each: `sched` for TX_SCHED, otherwise TX_SOFTWARE.
/// Other queued errors read on the way are consumed, so only traced sockets
/// are drained. Returns how many messages were read.
pub fn read_tx_timestamps(fd: RawFd, f: &mut dyn FnMut(u32, bool, u64)) -> usize {
    // A drain after a send syscall finds 2-4 stamps (two per kernel
    // message); a fuller queue takes more calls.
    const BATCH: usize = 32;
    let mut n = 0;
    loop {
        // Control space only, left uninitialised: the kernel writes it and
        // reports its length in msg_controllen, and only that much is read.
        // No data buffer: with OPT_TSONLY a stamp carries no payload (other
        // queued errors are truncated, and dropped anyway). On the stack
        // and small: this runs after every traced send syscall.
        let mut ctrl = [MaybeUninit::<[u64; 16]>::uninit(); BATCH];
        // SAFETY: mmsghdr is plain data; zero is a valid initial value.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for (h, c) in hdrs.iter_mut().zip(ctrl.iter_mut()) {
            h.msg_hdr.msg_control = c.as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = size_of::<[u64; 16]>();
        }
        // SAFETY: every pointer refers to the live arrays above.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r <= 0 {
            return n;
        }
        for h in &hdrs[..r as usize] {
            n += 1;
            let mut stamp = None;
            let mut key = None;
            // SAFETY: walking the control data the kernel wrote for this message.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    let lvl = (*c).cmsg_level;
                    let ty = (*c).cmsg_type;
                    if lvl == libc::SOL_SOCKET && ty == SO_TIMESTAMPING {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                    } else if (lvl == libc::IPPROTO_IP && ty == libc::IP_RECVERR)
                        || (lvl == libc::IPPROTO_IPV6 && ty == libc::IPV6_RECVERR)
                    {
                        let ee = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                        if ee.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING {
                            key = Some((ee.ee_data, ee.ee_info == SCM_TSTAMP_SCHED));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            if let (Some(ts), Some((k, sched))) = (stamp, key) {
                f(k, sched, ts);
            }
        }
        if (r as usize) < BATCH {
            return n;
        }
    }
}

/// Makes sure the kernel stamps arriving packets (RX_SOFTWARE) from now on.
///
/// The first socket of the machine that asks for receive timestamps turns
/// the kernel's stamping on through a deferred work item
/// (`net_enable_timestamp` schedules `netstamp_work` and returns), so
/// packets that arrive before a kworker runs it carry no stamp: under load,
/// for milliseconds — traced packets without an RX_SOFTWARE point. The
/// same happens again whenever the last such socket closed (the disable is
/// deferred too). This opens a socket that asks for receive timestamps and
/// keeps it open for the life of the process (holding the kernel's count,
/// so later sockets turn stamping on at once and closing them never turns
/// it off), then sends itself one-byte datagrams over loopback until one
/// arrives stamped, for up to `wait`. Returns whether one did (false where
/// loopback is down: then only the hold is in place).
pub fn hold_rx_timestamps(wait: Duration) -> bool {
    let Ok(sock) = new_private(|| {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = cvt(unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
        })?;
        // SAFETY: fresh fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }) else {
        return false;
    };
    let fd = sock.as_raw_fd();
    let flags = (libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE) as libc::c_int;
    // SAFETY: pointer to a live c_int of the given size.
    if unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            &flags as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    } != 0
    {
        return false;
    }
    // From here on the kernel's count is held: keep the socket for good.
    std::mem::forget(sock);
    let mut a = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ap = &mut a as *mut libc::sockaddr_in as *mut libc::sockaddr;
    // SAFETY: pointers to the live sockaddr_in and its length.
    if unsafe {
        libc::bind(fd, ap, len) != 0 || libc::getsockname(fd, ap, &mut len) != 0 || libc::connect(fd, ap, len) != 0
    } {
        return false;
    }
    let t0 = std::time::Instant::now();
    loop {
        // SAFETY: one byte from a live buffer on a connected socket.
        unsafe { libc::send(fd, b"t".as_ptr() as *const libc::c_void, 1, 0) };
        let _ = poll_readable(&[fd], Some(Duration::from_millis(2)));
        loop {
            let mut ctrl = [0u64; 16];
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
            // SAFETY: msghdr is plain data; zero is a valid initial value.
            let mut h: libc::msghdr = unsafe { zeroed() };
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = size_of::<[u64; 16]>() as _;
            // SAFETY: every pointer refers to the live locals above.
            if unsafe { libc::recvmsg(fd, &mut h, libc::MSG_DONTWAIT) } < 0 {
                break;
            }
            // SAFETY: walking the control data the kernel wrote for this message.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SO_TIMESTAMPING {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                            return true;
                        }
                    }
                    c = libc::CMSG_NXTHDR(&h, c);
                }
            }
        }
        if t0.elapsed() >= wait {
            return false;
        }
    }
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: pointer to a live timespec.
    unsafe { libc::clock_gettime(id, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Maps an IPv4 address to its IPv4-mapped IPv6 form for dual-stack sockets.
pub fn to_family(addr: SocketAddr, v6: bool) -> SocketAddr {
    match (addr, v6) {
        (SocketAddr::V4(a), true) => SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0)),
        (a, _) => a,
    }
}

/// Normalises an IPv4-mapped IPv6 address back to IPv4 when `want_v4` holds.
pub fn unmap(addr: SocketAddr) -> SocketAddr {
    if let SocketAddr::V6(a) = addr {
        if let Some(v4) = a.ip().to_ipv4_mapped() {
            return SocketAddr::new(IpAddr::V4(v4), a.port());
        }
    }
    addr
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

#[cfg(test)]
mod error_flag_tests {
    use super::*;

    fn pollerr(f: &ErrorFlag) -> bool {
        let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) };
        p.revents & libc::POLLIN == 0 && p.revents & libc::POLLERR != 0
    }

    /// Flags share one end, yet each goes up and down on its own.
    #[test]
    fn flags_sharing_an_end_rise_and_fall_alone() {
        let (a, b) = (ErrorFlag::new().unwrap(), ErrorFlag::new().unwrap());
        assert!(Arc::ptr_eq(&a.b, &b.b));
        assert!(!pollerr(&a) && !pollerr(&b));
        a.raise();
        assert!(pollerr(&a) && !pollerr(&b));
        b.raise();
        a.clear();
        assert!(!pollerr(&a) && pollerr(&b));
        b.clear();
        drop(a);
        b.raise();
        assert!(pollerr(&b));
    }
}
