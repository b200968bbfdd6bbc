//! Socket addresses: the kernel's representation and the dual-stack forms.

use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A socket address in the kernel's representation.
#[derive(Clone, Copy)]
pub(crate) struct RawAddr {
    pub(crate) storage: libc::sockaddr_storage,
    pub(crate) len: libc::socklen_t,
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

    /// Room for any address, for the kernel to fill.
    pub(crate) fn empty() -> Self {
        // SAFETY: plain data.
        RawAddr { storage: unsafe { zeroed() }, len: size_of::<libc::sockaddr_storage>() as libc::socklen_t }
    }

    /// Converts back to a std address; `None` for families other than IPv4/6.
    #[allow(clippy::wrong_self_convention)] // by reference: the receive path converts entries of its arrays
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

    pub(crate) fn as_ptr(&self) -> *const libc::sockaddr {
        &self.storage as *const _ as *const libc::sockaddr
    }
}

/// Maps an IPv4 address to its IPv4-mapped IPv6 form for dual-stack sockets.
pub fn to_family(addr: SocketAddr, v6: bool) -> SocketAddr {
    match (addr, v6) {
        (SocketAddr::V4(a), true) => SocketAddr::V6(SocketAddrV6::new(a.ip().to_ipv6_mapped(), a.port(), 0, 0)),
        (a, _) => a,
    }
}

/// Normalises an IPv4-mapped IPv6 address back to IPv4.
pub fn unmap(addr: SocketAddr) -> SocketAddr {
    if let SocketAddr::V6(a) = addr {
        if let Some(v4) = a.ip().to_ipv4_mapped() {
            return SocketAddr::new(IpAddr::V4(v4), a.port());
        }
    }
    addr
}
