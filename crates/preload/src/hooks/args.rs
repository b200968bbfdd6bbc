//! Decoding and encoding of the C arguments the hooks receive: socket
//! addresses, iovec arrays and control messages. Every function reads or
//! writes only within the pointers and lengths its caller vouches for.

use libc::{c_int, sockaddr, socklen_t};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// The socket address at `p`.
///
/// # Safety
/// `p` is null or points at `len` readable bytes.
pub(super) unsafe fn read_addr(p: *const sockaddr, len: socklen_t) -> Result<SocketAddr, c_int> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    // SAFETY: `p` is not null and points at a sockaddr (the caller's
    // contract); the family field starts every sockaddr.
    match unsafe { (*p).sa_family } as c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: `len` covers a sockaddr_in at `p`; any alignment is read.
            let s = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in) };
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: `len` covers a sockaddr_in6 at `p`; any alignment is read.
            let s = unsafe { std::ptr::read_unaligned(p as *const libc::sockaddr_in6) };
            Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(s.sin6_addr.s6_addr),
                u16::from_be(s.sin6_port),
                s.sin6_flowinfo,
                s.sin6_scope_id,
            )))
        }
        libc::AF_INET | libc::AF_INET6 => Err(libc::EINVAL),
        _ => Err(libc::EAFNOSUPPORT),
    }
}

/// Writes `a` as the kernel would for a socket of the given family
/// (IPv4 senders appear IPv4-mapped on an IPv6 socket).
///
/// # Safety
/// `p` and `lenp` are null, or `lenp` points at a writable length and `p`
/// at that many writable bytes.
pub(super) unsafe fn write_addr(a: SocketAddr, v6: bool, p: *mut sockaddr, lenp: *mut socklen_t) {
    if p.is_null() || lenp.is_null() {
        return;
    }
    let a = match (a, v6) {
        (SocketAddr::V4(x), true) => SocketAddr::V6(SocketAddrV6::new(x.ip().to_ipv6_mapped(), x.port(), 0, 0)),
        (x, _) => x,
    };
    // Each form is written straight from its own struct (building it in a
    // zeroed sockaddr_storage first cost a 128-byte clear per receive).
    match a {
        SocketAddr::V4(x) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: x.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(x.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: as this function's contract.
            unsafe { put_addr(&s, p, lenp) }
        }
        SocketAddr::V6(x) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: x.port().to_be(),
                sin6_flowinfo: x.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: x.ip().octets() },
                sin6_scope_id: x.scope_id(),
            };
            // SAFETY: as this function's contract.
            unsafe { put_addr(&s, p, lenp) }
        }
    }
}

/// Copies the address `s` to `p`, cut to the room `*lenp` says, and sets
/// `*lenp` to its full size, as the kernel's `move_addr_to_user` does.
///
/// # Safety
/// Neither pointer is null; `lenp` points at a writable length and `p` at
/// that many writable bytes.
unsafe fn put_addr<T>(s: &T, p: *mut sockaddr, lenp: *mut socklen_t) {
    let n = std::mem::size_of::<T>();
    // SAFETY: `*lenp` is the room at `p` (the caller's contract), and no
    // more than that is written; `s` holds `n` bytes.
    unsafe {
        let room = (*lenp as usize).min(n);
        std::ptr::copy_nonoverlapping(s as *const T as *const u8, p as *mut u8, room);
        *lenp = n as socklen_t;
    }
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The `n` iovecs at `iov` as a slice.
///
/// # Safety
/// `iov` is null or points at `n` iovecs that outlive `'a`.
pub(super) unsafe fn iovs<'a>(iov: *const libc::iovec, n: usize) -> &'a [libc::iovec] {
    if iov.is_null() || n == 0 {
        &[]
    } else {
        // SAFETY: not null, and `n` iovecs live there (the caller's contract).
        unsafe { std::slice::from_raw_parts(iov, n) }
    }
}

/// Runs `f` with one contiguous buffer standing for the iovecs: the first
/// iovec itself when it is the only non-empty one, else a scratch buffer
/// gathered from (`gather`) or scattered to the iovecs afterwards.
///
/// # Safety
/// Each iovec's base points at `iov_len` bytes, writable unless `gather`.
pub(super) unsafe fn with_buf<R>(v: &[libc::iovec], gather: bool, f: impl FnOnce(&mut [u8]) -> (R, usize)) -> R {
    let nonempty = v.iter().filter(|i| i.iov_len > 0).count();
    if nonempty <= 1 {
        let one = v.iter().find(|i| i.iov_len > 0);
        let buf: &mut [u8] = match one {
            // SAFETY: the iovec's base holds `iov_len` bytes (the caller's contract).
            Some(i) => unsafe { std::slice::from_raw_parts_mut(i.iov_base as *mut u8, i.iov_len) },
            None => &mut [],
        };
        return f(buf).0;
    }
    let total: usize = v.iter().map(|i| i.iov_len).sum::<usize>().min(1 << 17);
    SCRATCH.with(|c| {
        let mut s = c.take();
        s.resize(total, 0);
        if gather {
            let mut at = 0;
            for i in v {
                let n = i.iov_len.min(total - at);
                // SAFETY: `n` is within both the iovec and the scratch's
                // `total - at` bytes left; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(i.iov_base as *const u8, s.as_mut_ptr().add(at), n) };
                at += n;
            }
        }
        let (r, used) = f(&mut s);
        if !gather {
            let mut at = 0;
            for i in v {
                if at >= used {
                    break;
                }
                let n = i.iov_len.min(used - at);
                // SAFETY: `n` is within both the writable iovec and the
                // `used - at` scratch bytes left; they do not overlap.
                unsafe { std::ptr::copy_nonoverlapping(s.as_ptr().add(at), i.iov_base as *mut u8, n) };
                at += n;
            }
        }
        c.replace(s);
        r
    })
}

/// Total length of `n` iovecs (`None`: a count the kernel refuses).
///
/// # Safety
/// `iov` is null or points at `n` iovecs.
pub(super) unsafe fn iov_total(iov: *const libc::iovec, n: c_int) -> Option<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) || (iov.is_null() && n > 0) {
        return None;
    }
    // SAFETY: the caller's contract, and `n` is not negative.
    Some(unsafe { iovs(iov, n as usize) }.iter().map(|v| v.iov_len).sum())
}

/// Appends one control message at `*used` within `room` bytes of
/// `m.msg_control`, cut (and `MSG_CTRUNC`) when it does not fit.
///
/// # Safety
/// `m.msg_control` points at `room` writable bytes, aligned for a
/// cmsghdr at `*used`, and `*used <= room`.
pub(super) unsafe fn put_cmsg<T: Copy>(
    m: &mut libc::msghdr,
    room: usize,
    used: &mut usize,
    level: c_int,
    kind: c_int,
    data: &T,
) {
    let hdr = std::mem::size_of::<libc::cmsghdr>();
    let size = std::mem::size_of::<T>();
    let left = room - *used;
    if left < hdr {
        m.msg_flags |= libc::MSG_CTRUNC;
        return;
    }
    // SAFETY: CMSG_LEN is arithmetic on its argument.
    let full = unsafe { libc::CMSG_LEN(size as u32) } as usize;
    if left < full {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
    let len = full.min(left);
    // SAFETY: at least a header's worth of the `room` bytes is left at
    // `*used` (checked above), and `len` never passes `room`: the header
    // and the `len - hdr` data bytes are within the caller's buffer.
    unsafe {
        let c = (m.msg_control as *mut u8).add(*used) as *mut libc::cmsghdr;
        (*c).cmsg_len = len as _;
        (*c).cmsg_level = level;
        (*c).cmsg_type = kind;
        std::ptr::copy_nonoverlapping(data as *const T as *const u8, libc::CMSG_DATA(c), len - hdr);
    }
    // SAFETY: CMSG_SPACE is arithmetic on its argument.
    *used += (unsafe { libc::CMSG_SPACE(size as u32) } as usize).min(left);
}
