//! `struct sockaddr` ⇄ [`SocketAddr`], with the kernel's validation rules.
//!
//! The checks mirror Linux (`inet_bind`, `inet6_bind`, `inet_dgram_connect`,
//! `ip6_datagram_connect`, `udp_sendmsg`, `udpv6_sendmsg`) so a C caller sees
//! the errno an equivalent socket call would set.

use libc::{c_int, sa_family_t, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use libc::{AF_INET, AF_INET6, AF_UNSPEC, EAFNOSUPPORT, EINVAL};
use std::mem::size_of;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `sizeof(struct sockaddr_in)`.
const SIN_LEN: usize = size_of::<sockaddr_in>();
/// `SIN6_LEN_RFC2133`: a sockaddr_in6 without `sin6_scope_id`.
const SIN6_LEN_RFC2133: usize = 24;
/// `offsetof(struct sockaddr, sa_data)`.
const FAMILY_LEN: usize = size_of::<sa_family_t>();

/// An address as the caller passed it, copied out of its buffer.
pub(crate) enum Parsed {
    /// `AF_UNSPEC` (dissolve association / no address).
    Unspec,
    Addr(SocketAddr),
}

/// Copies `len` bytes of a caller's address into zeroed storage and returns
/// its family. Lengths beyond `sockaddr_storage` fail with `EINVAL`, as in
/// the kernel's `move_addr_to_kernel`.
///
/// # Safety
/// `addr` must be non-null and readable for `len` bytes.
unsafe fn copy_in(addr: *const sockaddr, len: socklen_t) -> Result<(sockaddr_storage, c_int), c_int> {
    let len = len as usize;
    if len > size_of::<sockaddr_storage>() {
        return Err(EINVAL);
    }
    if len < FAMILY_LEN {
        return Err(EINVAL);
    }
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    // SAFETY: the caller guarantees `len` readable bytes at `addr`; `len`
    // fits in `ss` (checked above); byte copies need no alignment.
    unsafe { std::ptr::copy_nonoverlapping(addr.cast::<u8>(), (&mut ss as *mut sockaddr_storage).cast::<u8>(), len) };
    let family = ss.ss_family as c_int;
    Ok((ss, family))
}

fn v4_of(ss: &sockaddr_storage) -> SocketAddr {
    // SAFETY: sockaddr_storage is aligned for and larger than sockaddr_in,
    // and every bit pattern is a valid sockaddr_in.
    let sin = unsafe { &*(ss as *const sockaddr_storage).cast::<sockaddr_in>() };
    let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
    SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)))
}

fn v6_of(ss: &sockaddr_storage) -> SocketAddr {
    // SAFETY: as in `v4_of`, for sockaddr_in6.
    let s = unsafe { &*(ss as *const sockaddr_storage).cast::<sockaddr_in6>() };
    let ip = Ipv6Addr::from(s.sin6_addr.s6_addr);
    SocketAddr::V6(SocketAddrV6::new(ip, u16::from_be(s.sin6_port), s.sin6_flowinfo, s.sin6_scope_id))
}

/// What operation the address is for; the kernel's rules differ slightly.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Op {
    Bind,
    Connect,
    SendTo,
}

/// Parses a caller's address for `op` on an endpoint of family `v6`.
///
/// # Safety
/// `addr` must be non-null and readable for `len` bytes.
pub(crate) unsafe fn parse(addr: *const sockaddr, len: socklen_t, v6: bool, op: Op) -> Result<Parsed, c_int> {
    let n = len as usize;
    if n < FAMILY_LEN {
        return Err(EINVAL);
    }
    // SAFETY: forwarded caller guarantee.
    let (ss, family) = unsafe { copy_in(addr, len) }?;
    if !v6 {
        // inet_bind / __ip4_datagram_connect / udp_sendmsg: length first.
        if op == Op::Connect && family == AF_UNSPEC {
            return Ok(Parsed::Unspec);
        }
        if n < SIN_LEN {
            return Err(EINVAL);
        }
        return match family {
            AF_INET => Ok(Parsed::Addr(v4_of(&ss))),
            // udp_sendmsg accepts AF_UNSPEC as a legacy spelling of AF_INET.
            AF_UNSPEC if op == Op::SendTo => Ok(Parsed::Addr(v4_of(&ss))),
            _ => Err(EAFNOSUPPORT),
        };
    }
    match (op, family) {
        (Op::Connect, AF_UNSPEC) | (Op::SendTo, AF_UNSPEC) => Ok(Parsed::Unspec),
        // inet6_bind: no IPv4 addresses (use ::ffff:a.b.c.d).
        (Op::Bind, _) => {
            if n < SIN6_LEN_RFC2133 {
                Err(EINVAL)
            } else if family != AF_INET6 {
                Err(EAFNOSUPPORT)
            } else {
                Ok(Parsed::Addr(v6_of(&ss)))
            }
        }
        // Dual-stack: an AF_INET address takes the IPv4 path.
        (_, AF_INET) => {
            if n < SIN_LEN {
                Err(EINVAL)
            } else {
                Ok(Parsed::Addr(v4_of(&ss)))
            }
        }
        (_, AF_INET6) => {
            if n < SIN6_LEN_RFC2133 {
                Err(EINVAL)
            } else {
                Ok(Parsed::Addr(v6_of(&ss)))
            }
        }
        (Op::Connect, _) => Err(EAFNOSUPPORT),
        (Op::SendTo, _) => Err(EINVAL),
    }
}

/// True when datagrams to `a` travel over IPv4 (also `::ffff:a.b.c.d`).
pub(crate) fn is_v4_path(a: &SocketAddr) -> bool {
    match a {
        SocketAddr::V4(_) => true,
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().is_some(),
    }
}

/// The kernel's representation of `a` as an endpoint of family `v6` reports
/// it: IPv6 endpoints see IPv4 peers as `::ffff:a.b.c.d` (`AF_INET6`).
pub(crate) fn to_storage(a: SocketAddr, v6: bool) -> (sockaddr_storage, socklen_t) {
    let a = match (a, v6) {
        (SocketAddr::V4(v4), true) => SocketAddr::V6(SocketAddrV6::new(v4.ip().to_ipv6_mapped(), v4.port(), 0, 0)),
        (a, _) => a,
    };
    // SAFETY: plain data; all-zero is valid.
    let mut ss: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(a) => {
            let sin = sockaddr_in {
                sin_family: AF_INET as sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: storage is aligned for and larger than sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast::<sockaddr_in>(), sin) };
            SIN_LEN
        }
        SocketAddr::V6(a) => {
            // SAFETY: plain data; all-zero is valid (avoids naming private padding).
            let mut sin6: sockaddr_in6 = unsafe { std::mem::zeroed() };
            sin6.sin6_family = AF_INET6 as sa_family_t;
            sin6.sin6_port = a.port().to_be();
            sin6.sin6_flowinfo = a.flowinfo();
            sin6.sin6_addr = libc::in6_addr { s6_addr: a.ip().octets() };
            sin6.sin6_scope_id = a.scope_id();
            // SAFETY: as above, for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut sockaddr_storage).cast::<sockaddr_in6>(), sin6) };
            size_of::<sockaddr_in6>()
        }
    };
    (ss, len as socklen_t)
}

/// Writes `a` to a caller's `(addr, *addrlen)` pair with `getsockname`
/// semantics: at most `*addrlen` bytes are copied, and `*addrlen` is set to
/// the full length (larger than the buffer means truncated).
///
/// # Safety
/// `out` must be writable for `*len` bytes and `len` valid for read/write
/// (both non-null; the caller checks).
pub(crate) unsafe fn write_out(a: SocketAddr, v6: bool, out: *mut u8, len: *mut socklen_t) {
    let (ss, full) = to_storage(a, v6);
    // SAFETY: caller guarantees `len` is valid.
    let room = unsafe { *len } as usize;
    let n = room.min(full as usize);
    // SAFETY: `n` ≤ `*len` writable bytes at `out`; `n` ≤ size of `ss`.
    unsafe { std::ptr::copy_nonoverlapping((&ss as *const sockaddr_storage).cast::<u8>(), out, n) };
    // SAFETY: as above.
    unsafe { *len = full };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(a: SocketAddr) -> (sockaddr_storage, socklen_t) {
        to_storage(a, false)
    }

    #[test]
    fn round_trip_and_rules() {
        let a4: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let a6: SocketAddr = "[::1]:9".parse().unwrap();
        let (s4, l4) = raw(a4);
        let (s6, l6) = raw(a6);
        let p4 = (&s4 as *const sockaddr_storage).cast::<sockaddr>();
        let p6 = (&s6 as *const sockaddr_storage).cast::<sockaddr>();
        // SAFETY: pointers to live storage, lengths within it.
        unsafe {
            assert!(matches!(parse(p4, l4, false, Op::Bind), Ok(Parsed::Addr(a)) if a == a4));
            assert!(matches!(parse(p6, l6, true, Op::SendTo), Ok(Parsed::Addr(a)) if a == a6));
            assert!(matches!(parse(p4, l4, true, Op::SendTo), Ok(Parsed::Addr(a)) if a == a4));
            assert_eq!(parse(p4, l4 - 1, false, Op::Bind).err(), Some(EINVAL));
            assert_eq!(parse(p6, l6, false, Op::SendTo).err(), Some(EAFNOSUPPORT));
            // inet6_bind: length before family.
            assert_eq!(parse(p4, l4, true, Op::Bind).err(), Some(EINVAL));
            assert_eq!(parse(p4, l6, true, Op::Bind).err(), Some(EAFNOSUPPORT));
            assert_eq!(parse(p6, 23, true, Op::Connect).err(), Some(EINVAL));
            assert_eq!(parse(p6, 1, true, Op::Connect).err(), Some(EINVAL));
            assert_eq!(parse(p6, 1000, true, Op::Connect).err(), Some(EINVAL));
        }
        let (m, ml) = to_storage(a4, true);
        assert_eq!(m.ss_family as c_int, AF_INET6);
        assert_eq!(ml as usize, size_of::<sockaddr_in6>());
        assert!(is_v4_path(&"[::ffff:127.0.0.1]:1".parse().unwrap()));
        assert!(!is_v4_path(&a6));
    }
}
