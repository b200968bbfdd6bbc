//! The kernel UDP socket's raw calls: socket creation, socket options,
//! `bind`/`connect`, `sendmmsg` with `UDP_SEGMENT` control messages,
//! `recvmmsg` and the decoding of its control messages, and error-queue
//! reads. Each call follows the safety policy of [`crate::sys`]; the
//! socket's logic above it, in [`super`], is safe Rust.

#![allow(unsafe_code)] // The kernel UDP socket's own calls (sendmmsg, recvmmsg, cmsgs).

use crate::sys::addr::RawAddr;
use crate::sys::cvt;
use crate::sys::timestamp::SO_TIMESTAMPING;
use std::cell::RefCell;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// `UDP_SEGMENT` (linux/udp.h): per-send GSO segment size.
pub(super) const UDP_SEGMENT: libc::c_int = 103;
/// `UDP_GRO` (linux/udp.h): receive coalesced super-packets.
pub(super) const UDP_GRO: libc::c_int = 104;
/// Room for a send's control messages: one `UDP_SEGMENT` (u16, 24 bytes
/// with its header) and one `SO_TIMESTAMPING` (u32, 24 bytes).
const TX_CMSG_SPACE: usize = 48;
/// The TX stamps a per-message `SO_TIMESTAMPING` control message asks for
/// (the socket's own flags give the reporting and `OPT_ID`).
pub(super) const TX_RECORD_FLAGS: u32 = libc::SOF_TIMESTAMPING_TX_SCHED | libc::SOF_TIMESTAMPING_TX_SOFTWARE;
/// Room for the receive control messages the socket asks for: `UDP_GRO`
/// (an int, 24 bytes with its header), `IP_PKTINFO` (32) or
/// `IPV6_PKTINFO` (40), `IP_TTL` and `IP_TOS` or `IPV6_HOPLIMIT` and
/// `IPV6_TCLASS` (24 each) and, when tracing, `SCM_TIMESTAMPING` (three
/// timespecs, 64 bytes).
const RX_CMSG_SPACE: usize = 192;

/// Makes `fd` refer to `/dev/null` in place (atomically, by `dup3`), so
/// the socket behind it is released while the number stays taken.
pub(super) fn release_fd(fd: BorrowedFd<'_>) {
    let fd = fd.as_raw_fd();
    // SAFETY: a plain open of a constant path, closed below (never kept);
    // dup3 onto `fd`, which the caller owns, only changes what that number
    // refers to.
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

/// A new nonblocking, close-on-exec UDP socket of the given family.
pub(super) fn udp_socket(v6: bool) -> io::Result<OwnedFd> {
    let family = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain syscall; the returned fd is owned by OwnedFd below.
    let fd = cvt(unsafe { libc::socket(family, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Clears O_NONBLOCK on the file description of `fd`.
pub(super) fn clear_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: fcntl with integer arguments on a borrowed, open fd.
    let fl = cvt(unsafe { libc::fcntl(raw, libc::F_GETFL) })?;
    // SAFETY: as above.
    cvt(unsafe { libc::fcntl(raw, libc::F_SETFL, fl & !libc::O_NONBLOCK) }).map(drop)
}

/// The socket's receive drop count (`SO_MEMINFO`'s, the one `ss -m` shows).
pub(super) fn meminfo_drops(fd: BorrowedFd<'_>) -> io::Result<u64> {
    const SO_MEMINFO: libc::c_int = 55;
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: pointer and length of a live u32 array; the kernel writes at
    // most `len` bytes and reports how many.
    cvt(unsafe {
        libc::getsockopt(fd.as_raw_fd(), libc::SOL_SOCKET, SO_MEMINFO, info.as_mut_ptr() as *mut libc::c_void, &mut len)
    })?;
    let at = libc::SK_MEMINFO_DROPS as usize;
    if (len as usize) < (at + 1) * 4 {
        return Err(io::Error::from(io::ErrorKind::Unsupported));
    }
    Ok(u64::from(info[at]))
}

/// Binds `fd` to `addr`.
pub(super) fn bind(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    let raw = RawAddr::from_std(addr);
    // SAFETY: pointer/length from a live RawAddr.
    cvt(unsafe { libc::bind(fd.as_raw_fd(), raw.as_ptr(), raw.len) }).map(drop)
}

/// Connects `fd` to `addr`.
pub(super) fn connect(fd: BorrowedFd<'_>, addr: &SocketAddr) -> io::Result<()> {
    let raw = RawAddr::from_std(addr);
    // SAFETY: pointer/length from a live RawAddr.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), raw.as_ptr(), raw.len) }).map(drop)
}

/// Dissolves `fd`'s association (connect to AF_UNSPEC).
pub(super) fn disconnect(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: plain data.
    let mut sa: libc::sockaddr = unsafe { zeroed() };
    sa.sa_family = libc::AF_UNSPEC as libc::sa_family_t;
    // SAFETY: pointer to a live sockaddr.
    cvt(unsafe { libc::connect(fd.as_raw_fd(), &sa, size_of::<libc::sockaddr>() as u32) }).map(drop)
}

/// `fd`'s local (`peer` false) or peer address.
pub(super) fn name(fd: BorrowedFd<'_>, peer: bool) -> io::Result<SocketAddr> {
    let mut raw = RawAddr::empty();
    let p = &mut raw.storage as *mut _ as *mut libc::sockaddr;
    // SAFETY: pointer/length into a live RawAddr that the kernel fills.
    cvt(unsafe {
        if peer {
            libc::getpeername(fd.as_raw_fd(), p, &mut raw.len)
        } else {
            libc::getsockname(fd.as_raw_fd(), p, &mut raw.len)
        }
    })?;
    raw.to_std().ok_or_else(|| io::Error::from_raw_os_error(libc::EAFNOSUPPORT))
}

/// Sends one datagram without waiting; `dst` is `None` on a connected socket.
pub(super) fn send_to(fd: BorrowedFd<'_>, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
    let raw = dst.map(RawAddr::from_std);
    let (p, l) = match &raw {
        Some(r) => (r.as_ptr(), r.len),
        None => (std::ptr::null(), 0),
    };
    // SAFETY: buffer and address pointers come from live borrows.
    cvt(unsafe {
        libc::sendto(
            fd.as_raw_fd(),
            buf.as_ptr() as *const libc::c_void,
            buf.len(),
            libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
            p,
            l,
        )
    })
    .map(|n| n as usize)
}

/// One `sendmmsg` of `n` messages without waiting; `msg(i)` gives message
/// `i`'s destination, payload pieces, GSO segment size (sent as a
/// `UDP_SEGMENT` control message) and whether the kernel is to stamp it
/// (an `SO_TIMESTAMPING` control message asking for [`TX_RECORD_FLAGS`]:
/// the kernel stamps, and counts an `OPT_ID` key for, only such messages
/// when the socket's own flags ask for no TX stamps). Returns how many the
/// kernel accepted.
pub(super) fn send_mmsg<'a>(
    fd: BorrowedFd<'_>,
    n: usize,
    msg: impl Fn(usize) -> (Option<SocketAddr>, &'a [io::IoSlice<'a>], Option<u16>, bool),
) -> io::Result<usize> {
    let mut addrs: Vec<Option<RawAddr>> = Vec::with_capacity(n);
    let mut cmsgs: Vec<[u64; TX_CMSG_SPACE / 8]> = vec![[0; TX_CMSG_SPACE / 8]; n];
    // SAFETY: mmsghdr is plain data; zero is a valid initial value.
    let mut hdrs: Vec<libc::mmsghdr> = (0..n).map(|_| unsafe { zeroed() }).collect();
    for i in 0..n {
        addrs.push(msg(i).0.as_ref().map(RawAddr::from_std));
    }
    for i in 0..n {
        let (_, iov, segment, stamp) = msg(i);
        let h = &mut hdrs[i].msg_hdr;
        if let Some(a) = &addrs[i] {
            h.msg_name = a.as_ptr() as *mut libc::c_void;
            h.msg_namelen = a.len;
        }
        // IoSlice is ABI-compatible with iovec on Unix.
        h.msg_iov = iov.as_ptr() as *mut libc::iovec;
        h.msg_iovlen = iov.len();
        if segment.is_none() && !stamp {
            continue;
        }
        h.msg_control = cmsgs[i].as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = TX_CMSG_SPACE;
        // SAFETY: msg_control points at TX_CMSG_SPACE zeroed, 8-aligned
        // bytes, room for both control messages (CMSG_SPACE of a u16 and of
        // a u32, 24 bytes each); CMSG_FIRSTHDR/NXTHDR/DATA stay inside it,
        // and msg_controllen is cut to what was written.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(h);
            let mut used = 0;
            if let Some(seg) = segment {
                (*c).cmsg_level = libc::SOL_UDP;
                (*c).cmsg_type = UDP_SEGMENT;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
                used += libc::CMSG_SPACE(size_of::<u16>() as u32) as usize;
                c = libc::CMSG_NXTHDR(h, c);
            }
            if stamp {
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = SO_TIMESTAMPING;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<u32>() as u32) as usize;
                std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u32, TX_RECORD_FLAGS);
                used += libc::CMSG_SPACE(size_of::<u32>() as u32) as usize;
            }
            h.msg_controllen = used;
        }
    }
    // SAFETY: every pointer in hdrs refers to addrs, cmsgs or the caller's
    // iov slices, all alive across this call.
    let r =
        unsafe { libc::sendmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    cvt(r).map(|v| v as usize)
}

/// What the control messages of one received message said.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RxControl {
    /// `UDP_GRO`: the segment size of a coalesced message.
    pub(super) gro_segment: Option<usize>,
    /// `IP_PKTINFO`: interface index, `ipi_spec_dst`, `ipi_addr`.
    pub(super) v4: Option<(u32, Ipv4Addr, Ipv4Addr)>,
    /// `IPV6_PKTINFO`: destination address and interface index.
    pub(super) v6: Option<(Ipv6Addr, u32)>,
    pub(super) tos: Option<u8>,
    pub(super) ttl: Option<u8>,
    pub(super) tclass: Option<u8>,
    pub(super) hoplimit: Option<u8>,
    /// `SCM_TIMESTAMPING`'s software stamp, in nanoseconds.
    pub(super) stamp_ns: Option<u64>,
}

/// One received message as [`recv_mmsg`] reports it.
pub(super) struct RxMsg {
    pub(super) len: usize,
    pub(super) src: Option<SocketAddr>,
    pub(super) truncated: bool,
    pub(super) control: RxControl,
}

/// `recvmmsg` header arrays of one thread, kept between reads: allocating
/// and zeroing four arrays per call would be a good part of a
/// request/response server's receive.
#[derive(Default)]
struct RxArrays {
    addrs: Vec<RawAddr>,
    cmsgs: Vec<[u64; RX_CMSG_SPACE / 8]>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

thread_local! {
    static RX_ARRAYS: RefCell<RxArrays> = RefCell::new(RxArrays::default());
}

/// Receives up to `n` messages (at most `bufs.len()`) into `bufs` in one
/// call with `flags`, passing each to `each(i, msg)`; returns how many.
pub(super) fn recv_mmsg(
    fd: BorrowedFd<'_>,
    bufs: &mut [Vec<u8>],
    n: usize,
    flags: libc::c_int,
    each: impl FnMut(usize, RxMsg),
) -> io::Result<usize> {
    let mut each = Some(each);
    let r = RX_ARRAYS.try_with(|cell| {
        cell.try_borrow_mut().ok().map(|mut a| recv_into(&mut a, fd, bufs, n, flags, each.take().expect("once")))
    });
    match r {
        Ok(Some(r)) => r,
        // Not expected (nothing here receives re-entrantly; a thread past
        // its thread-locals' end): fresh arrays.
        _ => recv_into(&mut RxArrays::default(), fd, bufs, n, flags, each.take().expect("not taken")),
    }
}

/// [`recv_mmsg`] with the header arrays `a`, grown to `n` as needed.
fn recv_into(
    a: &mut RxArrays,
    fd: BorrowedFd<'_>,
    bufs: &mut [Vec<u8>],
    n: usize,
    flags: libc::c_int,
    mut each: impl FnMut(usize, RxMsg),
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
            match libc::recvmsg(fd.as_raw_fd(), &mut hdrs[0].msg_hdr, flags & !libc::MSG_WAITFORONE) {
                len if len >= 0 => {
                    hdrs[0].msg_len = len as u32;
                    1
                }
                _ => -1,
            }
        } else {
            libc::recvmmsg(fd.as_raw_fd(), hdrs.as_mut_ptr(), n as u32, flags, std::ptr::null_mut())
        }
    };
    let got = cvt(r)? as usize;
    for i in 0..got {
        let h = &hdrs[i].msg_hdr;
        addrs[i].len = h.msg_namelen;
        let msg = RxMsg {
            len: hdrs[i].msg_len as usize,
            src: addrs[i].to_std(),
            truncated: h.msg_flags & libc::MSG_TRUNC != 0,
            control: decode_control(h),
        };
        each(i, msg);
    }
    Ok(got)
}

/// The control messages of `h`, which the kernel just filled.
fn decode_control(h: &libc::msghdr) -> RxControl {
    let mut out = RxControl::default();
    // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG
    // macros walk only within that range.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(h);
        while !c.is_null() {
            let (level, ty) = ((*c).cmsg_level, (*c).cmsg_type);
            let data = libc::CMSG_DATA(c);
            if level == libc::SOL_UDP && ty == UDP_GRO {
                let v = std::ptr::read_unaligned(data as *const libc::c_int);
                if v > 0 {
                    out.gro_segment = Some(v as usize);
                }
            }
            if level == libc::IPPROTO_IP && ty == libc::IP_PKTINFO {
                let p = std::ptr::read_unaligned(data as *const libc::in_pktinfo);
                let a = |x: libc::in_addr| Ipv4Addr::from(u32::from_be(x.s_addr));
                out.v4 = Some((p.ipi_ifindex as u32, a(p.ipi_spec_dst), a(p.ipi_addr)));
            }
            if level == libc::IPPROTO_IP && ty == libc::IP_TOS {
                out.tos = Some(std::ptr::read_unaligned(data));
            }
            if level == libc::IPPROTO_IP && ty == libc::IP_TTL {
                let v = std::ptr::read_unaligned(data as *const libc::c_int);
                out.ttl = Some(v.clamp(0, 255) as u8);
            }
            if level == libc::IPPROTO_IPV6 && ty == libc::IPV6_PKTINFO {
                let p = std::ptr::read_unaligned(data as *const libc::in6_pktinfo);
                out.v6 = Some((Ipv6Addr::from(p.ipi6_addr.s6_addr), p.ipi6_ifindex));
            }
            if level == libc::IPPROTO_IPV6 && matches!(ty, libc::IPV6_TCLASS | libc::IPV6_HOPLIMIT) {
                let v = std::ptr::read_unaligned(data as *const libc::c_int).clamp(0, 255) as u8;
                if ty == libc::IPV6_TCLASS {
                    out.tclass = Some(v);
                } else {
                    out.hoplimit = Some(v);
                }
            }
            if level == libc::SOL_SOCKET && ty == SO_TIMESTAMPING {
                let ts = std::ptr::read_unaligned(data as *const libc::timespec);
                out.stamp_ns = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            }
            c = libc::CMSG_NXTHDR(h, c);
        }
    }
    out
}

/// Reads one queued extended error (`IP_RECVERR`): its errno and the
/// address it concerns; `Ok(None)` when the error queue is empty.
pub(super) fn take_queued_error(fd: BorrowedFd<'_>) -> io::Result<Option<(i32, Option<SocketAddr>)>> {
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
    let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
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
