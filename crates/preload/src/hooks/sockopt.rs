//! setsockopt and getsockopt: which options the engine honours, which
//! move a socket to the kernel path, and which it mirrors.

use super::guard::{guard, Retry};
use crate::ktrace;
use crate::log::dlog;
use crate::real;
use crate::shim::{self, lookup};
use crate::sys::{errno, int_opt, kernel_timeouts, set_errno};
use eudp_engine::Endpoint;
use libc::{c_int, c_void, socklen_t};

/// What the engine makes of a socket option.
enum Opt {
    /// Passed to the kernel socket; nothing else to do.
    Pass,
    /// Passed, and the endpoint follows it.
    Sync,
    /// The engine cannot honour it: kernel path.
    Unsupported(String),
}

fn classify(level: c_int, name: c_int, val: Option<c_int>) -> Opt {
    use libc::*;
    let on = val.map(|v| v != 0).unwrap_or(true);
    let unsupported = |what: &str| Opt::Unsupported(format!("setsockopt {what}"));
    match level {
        SOL_SOCKET => match name {
            SO_SNDBUF | SO_RCVBUF | SO_SNDBUFFORCE | SO_RCVBUFFORCE | SO_RCVTIMEO | SO_SNDTIMEO | 66 | 67 => Opt::Sync,
            SO_REUSEADDR | SO_REUSEPORT | SO_BROADCAST | SO_PRIORITY | SO_MARK | SO_BINDTODEVICE | 62 /* SO_BINDTOIFINDEX */
            | SO_KEEPALIVE | SO_LINGER | SO_ATTACH_FILTER | SO_DETACH_FILTER | SO_LOCK_FILTER | SO_ATTACH_BPF
            | SO_ATTACH_REUSEPORT_CBPF | SO_ATTACH_REUSEPORT_EBPF | SO_INCOMING_CPU | SO_BUSY_POLL | SO_NO_CHECK
            | SO_RCVLOWAT | SO_SNDLOWAT | SO_PASSCRED | SO_OOBINLINE => Opt::Pass,
            SO_TIMESTAMP | SO_TIMESTAMPNS | SO_TIMESTAMPING | SO_RXQ_OVFL | SO_WIFI_STATUS | SO_TXTIME | SO_ZEROCOPY | SO_PASSSEC
            | 63 /* SO_TIMESTAMP_NEW */ | 64 | 65 => {
                if on {
                    unsupported(&format!("SOL_SOCKET/{name} (per-datagram control data)"))
                } else {
                    Opt::Pass
                }
            }
            _ => unsupported(&format!("SOL_SOCKET/{name}")),
        },
        IPPROTO_IP => match name {
            IP_TOS
            | IP_TTL
            | IP_MTU_DISCOVER
            | IP_FREEBIND
            | IP_TRANSPARENT
            | IP_BIND_ADDRESS_NO_PORT
            | IP_MULTICAST_IF
            | IP_MULTICAST_TTL
            | IP_MULTICAST_LOOP
            | IP_MULTICAST_ALL
            | IP_OPTIONS => Opt::Pass,
            // The kernel transport reads the program's own kernel socket, so
            // the kernel keeps the membership and delivers the group's
            // datagrams to it as to any socket; the xdp transport also
            // mirrors it (see `membership`, `shim::mirror_membership`).
            _ if membership(level, name) => Opt::Pass,
            // The engine keeps the kernel's IP_PKTINFO of every datagram and
            // the shim hands it back in recvmsg.
            IP_PKTINFO => Opt::Pass,
            _ => {
                if on {
                    unsupported(&format!("IPPROTO_IP/{name}"))
                } else {
                    Opt::Pass
                }
            }
        },
        IPPROTO_IPV6 => match name {
            IPV6_V6ONLY | IPV6_UNICAST_HOPS | IPV6_TCLASS | IPV6_MTU_DISCOVER | IPV6_MULTICAST_IF
            | IPV6_MULTICAST_HOPS | IPV6_MULTICAST_LOOP | IPV6_FREEBIND | IPV6_TRANSPARENT => Opt::Pass,
            _ if membership(level, name) => Opt::Pass,
            29 /* IPV6_MULTICAST_ALL */ => Opt::Pass,
            IPV6_RECVPKTINFO => Opt::Pass,
            _ => {
                if on {
                    unsupported(&format!("IPPROTO_IPV6/{name}"))
                } else {
                    Opt::Pass
                }
            }
        },
        _ => unsupported(&format!("level {level} name {name}")),
    }
}

/// A multicast membership option (join, leave, block or unblock a source).
fn membership(level: c_int, name: c_int) -> bool {
    use libc::*;
    let mcast = matches!(
        name,
        MCAST_JOIN_GROUP
            | MCAST_LEAVE_GROUP
            | MCAST_JOIN_SOURCE_GROUP
            | MCAST_LEAVE_SOURCE_GROUP
            | MCAST_BLOCK_SOURCE
            | MCAST_UNBLOCK_SOURCE
    );
    match level {
        IPPROTO_IP => {
            mcast
                || matches!(
                    name,
                    IP_ADD_MEMBERSHIP
                        | IP_DROP_MEMBERSHIP
                        | IP_ADD_SOURCE_MEMBERSHIP
                        | IP_DROP_SOURCE_MEMBERSHIP
                        | IP_BLOCK_SOURCE
                        | IP_UNBLOCK_SOURCE
                )
        }
        IPPROTO_IPV6 => mcast || matches!(name, IPV6_ADD_MEMBERSHIP | IPV6_DROP_MEMBERSHIP),
        _ => false,
    }
}

/// Options the TCP transport cannot honour although the kernel transport
/// can. Its frames carry no destination address, so `IP_PKTINFO` and
/// `IPV6_RECVPKTINFO` would have nothing to report; and it gives a port's
/// datagrams to one endpoint, where the kernel spreads an `SO_REUSEPORT`
/// group's over its members. On the kernel path such a socket still gets
/// the datagrams of senders on this transport (see `Mgr::forward` in the
/// engine's tcp backend).
fn tcp_unsupported(level: c_int, name: c_int, val: Option<c_int>) -> Option<String> {
    if val.unwrap_or(1) == 0 {
        return None;
    }
    match (level, name) {
        (libc::IPPROTO_IP, libc::IP_PKTINFO) | (libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO) => Some(format!(
            "setsockopt {} under the tcp transport (frames carry no destination address)",
            if level == libc::IPPROTO_IP { "IP_PKTINFO" } else { "IPV6_RECVPKTINFO" }
        )),
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => {
            Some("setsockopt SO_REUSEPORT under the tcp transport (the kernel spreads the group's datagrams)".into())
        }
        _ => None,
    }
}

/// Options the AF_XDP transport cannot honour although the kernel
/// transport can: it sends every frame without IP options, and takes its
/// frames from one interface only. (An `SO_REUSEPORT` member stays: its
/// unicast datagrams stay on the kernel path, which spreads them, and its
/// groups' frames are copied to every member as the kernel copies them.)
fn xdp_unsupported(level: c_int, name: c_int, val: Option<c_int>) -> Option<String> {
    if val.unwrap_or(1) == 0 {
        return None;
    }
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_BINDTODEVICE | 62) => Some(
            "setsockopt SO_BINDTODEVICE under the xdp transport (frames come from the transport's interface)".into(),
        ),
        (libc::IPPROTO_IP, libc::IP_OPTIONS) => {
            Some("setsockopt IP_OPTIONS under the xdp transport (its frames carry none)".into())
        }
        _ => None,
    }
}

#[no_mangle]
pub unsafe extern "C" fn setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int {
    guard(fd, "setsockopt", Retry::Yes, || {
        // SAFETY: the caller passes `setsockopt`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::conflicts(level, name) && ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            let Some(s) = lookup(fd) else { return real::setsockopt(fd, level, name, val, len) };
            if shim::rx_opt_is_tos(s.v6, level, name).is_some() && !shim::tcp_transport() {
                match s.mode() {
                    shim::ACTIVE if s.rx_opts_forced() => {
                        // The engine keeps every datagram's TOS and TTL (traffic
                        // class and hop limit; the kernel socket has both on): the
                        // program's setting decides what recvmsg shows. The kernel
                        // checks the value as usual.
                        let r = real::setsockopt(fd, level, name, val, len);
                        if r == 0 {
                            let saved = errno();
                            s.note_rx_opt(fd, name, int_opt(fd, level, name).unwrap_or(0) != 0);
                            set_errno(saved);
                        }
                        return r;
                    }
                    // Not on the engine yet: adoption reads the setting.
                    shim::LAZY | shim::KERNEL => return real::setsockopt(fd, level, name, val, len),
                    _ => {}
                }
            }
            let iv = if !val.is_null() && len as usize >= 4 {
                Some(std::ptr::read_unaligned(val as *const c_int))
            } else if !val.is_null() && len == 1 {
                Some(*(val as *const u8) as c_int)
            } else {
                None
            };
            let mut kind = classify(level, name, iv);
            if shim::tcp_transport() {
                if let Some(why) = tcp_unsupported(level, name, iv) {
                    kind = Opt::Unsupported(why);
                }
            } else if shim::xdp_transport() {
                if let Some(why) = xdp_unsupported(level, name, iv) {
                    kind = Opt::Unsupported(why);
                }
            }
            if membership(level, name) && shim::membership_off_transport() {
                s.fallback_multicast(fd, "membership");
            }
            if let Opt::Unsupported(why) = &kind {
                if s.mode() != shim::KERNEL {
                    s.fallback(fd, why);
                }
            }
            let r = real::setsockopt(fd, level, name, val, len);
            if r == 0 && membership(level, name) && shim::xdp_transport() && !val.is_null() {
                let saved = errno();
                shim::mirror_membership(&s, level, name, std::slice::from_raw_parts(val as *const u8, len as usize));
                set_errno(saved);
            }
            if r == 0
                && matches!(kind, Opt::Pass)
                && (level == libc::IPPROTO_IP || level == libc::IPPROTO_IPV6)
                && shim::xdp_transport()
            {
                // The AF_XDP backend builds and reads headers itself: it keeps its
                // own copy of the socket's IP options.
                if let Some(ep) = s.existing() {
                    ep.backend().option_changed();
                }
            }
            if r == 0 && matches!(kind, Opt::Sync) {
                if let Some(ep) = s.existing() {
                    sync_option(&ep, fd, name, iv);
                }
            }
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    guard(fd, "getsockopt", Retry::Yes, || {
        // SAFETY: the caller passes `getsockopt`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let r = real::getsockopt(fd, level, name, val, len);
            let rx_opt = |v6| shim::rx_opt_is_tos(v6, level, name);
            if r == 0
                && (rx_opt(false).is_some() || rx_opt(true).is_some())
                && !val.is_null()
                && !len.is_null()
                && *len > 0
            {
                if let Some((s, tos)) =
                    lookup(fd).filter(|s| s.rx_opts_forced()).and_then(|s| rx_opt(s.v6).map(|t| (s, t)))
                {
                    // What the program set, in the width the kernel wrote.
                    let on = s.wants_rx_opt(tos);
                    if *len as usize >= 4 {
                        std::ptr::write_unaligned(val as *mut c_int, c_int::from(on));
                    } else {
                        *(val as *mut u8) = u8::from(on);
                    }
                }
                return r;
            }
            if r != 0
                || level != libc::SOL_SOCKET
                || name != libc::SO_ERROR
                || val.is_null()
                || len.is_null()
                || (*len as usize) < 4
            {
                return r;
            }
            // The engine reads the kernel socket, so an asynchronous error (ICMP
            // port unreachable, say) may already be the endpoint's: SO_ERROR
            // reports and clears it as the kernel would have.
            if std::ptr::read_unaligned(val as *const c_int) == 0 {
                if let Some(e) = lookup(fd).and_then(|s| s.existing()).map(|ep| ep.take_error()).filter(|&e| e != 0) {
                    std::ptr::write_unaligned(val as *mut c_int, e);
                }
            }
            r
        }
    })
}

fn sync_option(ep: &Endpoint, fd: c_int, name: c_int, iv: Option<c_int>) {
    match name {
        libc::SO_SNDBUF | libc::SO_SNDBUFFORCE => {
            if let Some(v) = iv {
                let _ = ep.set_send_buffer_size(v.max(0) as usize);
            }
        }
        libc::SO_RCVBUF | libc::SO_RCVBUFFORCE => {
            if let Some(v) = iv {
                let _ = ep.set_recv_buffer_size(v.max(0) as usize);
            }
        }
        _ => {
            let (r, w) = kernel_timeouts(fd);
            ep.set_read_timeout_in_socket(r);
            ep.set_write_timeout(w);
        }
    }
    dlog!("fd {fd}: option {name} applied to the endpoint");
}
