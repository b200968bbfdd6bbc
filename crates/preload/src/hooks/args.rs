//! Decoding and encoding of the C arguments the hooks receive: socket
//! addresses, iovec arrays and control messages. Every function reads or
//! writes only within the pointers and lengths its caller vouches for.

use libc::{c_int, sockaddr, socklen_t};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

pub(super) unsafe fn read_addr(p: *const sockaddr, len: socklen_t) -> Result<SocketAddr, c_int> {
    if p.is_null() {
        return Err(libc::EFAULT);
    }
    match (*p).sa_family as c_int {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            let s = std::ptr::read_unaligned(p as *const libc::sockaddr_in);
            Ok(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes()),
                u16::from_be(s.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let s = std::ptr::read_unaligned(p as *const libc::sockaddr_in6);
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
pub(super) unsafe fn write_addr(a: SocketAddr, v6: bool, p: *mut sockaddr, lenp: *mut socklen_t) {
    if p.is_null() || lenp.is_null() {
        return;
    }
    let a = match (a, v6) {
        (SocketAddr::V4(x), true) => SocketAddr::V6(SocketAddrV6::new(x.ip().to_ipv6_mapped(), x.port(), 0, 0)),
        (x, _) => x,
    };
    let mut st: libc::sockaddr_storage = std::mem::zeroed();
    let n = match a {
        SocketAddr::V4(x) => {
            let s = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: x.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(x.ip().octets()) },
                sin_zero: [0; 8],
            };
            std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in, s);
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(x) => {
            let s = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: x.port().to_be(),
                sin6_flowinfo: x.flowinfo(),
                sin6_addr: libc::in6_addr { s6_addr: x.ip().octets() },
                sin6_scope_id: x.scope_id(),
            };
            std::ptr::write(&mut st as *mut _ as *mut libc::sockaddr_in6, s);
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    let room = (*lenp as usize).min(n);
    std::ptr::copy_nonoverlapping(&st as *const _ as *const u8, p as *mut u8, room);
    *lenp = n as socklen_t;
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

pub(super) unsafe fn iovs<'a>(iov: *const libc::iovec, n: usize) -> &'a [libc::iovec] {
    if iov.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(iov, n)
    }
}

/// Runs `f` with one contiguous buffer standing for the iovecs: the first
/// iovec itself when it is the only non-empty one, else a scratch buffer
/// gathered from (`gather`) or scattered to the iovecs afterwards.
pub(super) unsafe fn with_buf<R>(v: &[libc::iovec], gather: bool, f: impl FnOnce(&mut [u8]) -> (R, usize)) -> R {
    let nonempty = v.iter().filter(|i| i.iov_len > 0).count();
    if nonempty <= 1 {
        let one = v.iter().find(|i| i.iov_len > 0);
        let buf: &mut [u8] = match one {
            Some(i) => std::slice::from_raw_parts_mut(i.iov_base as *mut u8, i.iov_len),
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
                std::ptr::copy_nonoverlapping(i.iov_base as *const u8, s.as_mut_ptr().add(at), n);
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
                std::ptr::copy_nonoverlapping(s.as_ptr().add(at), i.iov_base as *mut u8, n);
                at += n;
            }
        }
        c.replace(s);
        r
    })
}

/// Total length of `n` iovecs (`None`: a count the kernel refuses).
pub(super) unsafe fn iov_total(iov: *const libc::iovec, n: c_int) -> Option<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) || (iov.is_null() && n > 0) {
        return None;
    }
    Some(iovs(iov, n as usize).iter().map(|v| v.iov_len).sum())
}

/// Appends one control message at `*used` within `room` bytes of
/// `m.msg_control`, cut (and `MSG_CTRUNC`) when it does not fit.
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
    let full = libc::CMSG_LEN(size as u32) as usize;
    if left < full {
        m.msg_flags |= libc::MSG_CTRUNC;
    }
    let len = full.min(left);
    let c = (m.msg_control as *mut u8).add(*used) as *mut libc::cmsghdr;
    (*c).cmsg_len = len as _;
    (*c).cmsg_level = level;
    (*c).cmsg_type = kind;
    std::ptr::copy_nonoverlapping(data as *const T as *const u8, libc::CMSG_DATA(c), len - hdr);
    *used += (libc::CMSG_SPACE(size as u32) as usize).min(left);
}
