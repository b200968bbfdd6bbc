//! The receive family: recv, recvfrom, recvmsg, recvmmsg, read, readv and
//! the fortified `__*_chk` variants.

use super::args::{iov_total, iovs, put_cmsg, with_buf, write_addr};
use super::guard::{guard, Retry};
use super::{fail, with_sock_t};
use crate::ktrace;
use crate::real;
use crate::shim::{self, ep_recv, Sock, Tls};
use eudp_engine::{Endpoint, Received, RecvFlags};
use libc::{c_int, c_uint, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::time::{Duration, Instant};

/// Receive on the shim's path: leftovers of a fallback, then the engine.
/// `out` left `None`: the socket is on the kernel path; use libc.
///
/// A receive that began on the engine and found the socket handed over to
/// the kernel path meanwhile (a fallback on another thread) is made again,
/// here: it then waits for the hand-over, takes what it kept, or goes to
/// the kernel like any receive after the fallback.
///
/// The result is written to `out`, which the caller reads in place: a
/// returned record was copied on its way out, and the first copy of a
/// just-written record stalls on store forwarding.
#[inline]
fn shim_recv(
    t: &Tls,
    s: &Sock,
    fd: c_int,
    buf: &mut [u8],
    flags: c_int,
    mut info: shim::Info,
    out: &mut Option<Result<Received, c_int>>,
) {
    shim_recv_once(t, s, fd, buf, flags, info.as_deref_mut(), out);
    if matches!(out, Some(Err(shim::RETRY))) {
        *out = shim_recv_again(t, s, fd, buf, flags, info);
    }
}

/// The receive made again after a hand-over; out of line, so the first
/// attempt's result is written in place (see `shim_recv_once`).
#[inline(never)]
#[cold]
fn shim_recv_again(
    t: &Tls,
    s: &Sock,
    fd: c_int,
    buf: &mut [u8],
    flags: c_int,
    info: shim::Info,
) -> Option<Result<Received, c_int>> {
    let mut out = None;
    shim_recv_once(t, s, fd, buf, flags, info, &mut out);
    match out {
        // Cannot happen twice (the socket is on the kernel path now).
        Some(Err(shim::RETRY)) => Some(Err(libc::EAGAIN)),
        r => r,
    }
}

/// [`shim_recv`]'s single attempt, writing to `out`.
#[inline(always)]
fn shim_recv_once(
    t: &Tls,
    s: &Sock,
    fd: c_int,
    buf: &mut [u8],
    flags: c_int,
    mut info: shim::Info,
    out: &mut Option<Result<Received, c_int>>,
) {
    *out = None;
    if flags & (libc::MSG_ERRQUEUE | libc::MSG_OOB) != 0 {
        return;
    }
    let peek = flags & libc::MSG_PEEK != 0;
    let on_kernel = s.mode() == shim::KERNEL;
    if on_kernel {
        s.await_hand_over();
        if s.reader_in_flight() {
            let blocking = flags & libc::MSG_DONTWAIT == 0 && !s.nonblock();
            *out = s.await_reader(fd, buf, peek, blocking, info);
            return;
        }
    }
    if s.has_leftover() {
        if let Some(r) = s.pop_leftover(buf, peek, info.as_deref_mut()) {
            *out = Some(Ok(r));
            return;
        }
    }
    let blocking = flags & libc::MSG_DONTWAIT == 0 && !s.nonblock();
    // The common case borrows the endpoint without a lock. It must not
    // sleep: a blocking receive takes this path only for a datagram already
    // in the ring (anything else reads the socket or sleeps, on the locked
    // path).
    let once = RecvFlags { peek, dont_wait: true, interruptible: false };
    // The result is written in place: passed back through the borrow's
    // layers it was copied three times, which cost more than the borrow.
    if !blocking || s.ring_has_data() {
        s.with_existing_in(t, |ep| {
            let r = if blocking {
                shim::recv_info(ep, buf, once, &mut info).map_err(|e| shim::errno_of(&e))
            } else {
                shim::nonblocking_recv(s, ep, buf, peek, info.as_deref_mut())
            };
            *out = Some(with_peer(ep, r));
        });
    }
    match out {
        Some(Err(libc::EAGAIN)) if blocking => {}
        Some(_) => return,
        None => {}
    }
    shim::race_pause();
    let Some(ep) = s.endpoint(fd) else {
        if !on_kernel && s.mode() == shim::KERNEL {
            // Handed over since the check above (a fallback on another
            // thread): made again once the hand-over is done, which may
            // have kept datagrams or left a read asleep in the socket, and
            // with GRO still on meanwhile a plain read of the kernel socket
            // could return several datagrams glued together.
            *out = Some(Err(shim::RETRY));
        }
        return;
    };
    let r = ep_recv(s, &ep, buf, flags, info);
    if matches!(r, Err(libc::EMFILE | libc::ENFILE)) {
        // A wait needs the ring's eventfd and none could be made (the
        // descriptor budget; a UDP receive never fails so on its own):
        // the receive is made again on the kernel path.
        drop(ep);
        s.fallback(fd, &shim::budget_reason("receive"));
        *out = Some(Err(shim::RETRY));
        return;
    }
    if r.is_err() && eudp_engine::failure::failed() {
        // The engine thread died: the program goes on on the kernel path.
        drop(ep);
        s.fallback(fd, "eudp engine thread failed");
        *out = Some(Err(shim::RETRY));
        return;
    }
    if s.mode() == shim::KERNEL {
        // Handed over meanwhile: what this receive's read brought
        // beyond its datagram joins the kept ones.
        s.after_hand_over(fd);
    }
    *out = Some(with_peer(&ep, r));
}

/// The receive of a stream, ahead of [`shim_recv`]: a socket on the engine
/// with nothing kept from a fallback and a datagram in its ring, and no
/// flag but `MSG_DONTWAIT`/`MSG_TRUNC` (neither changes a receive the ring
/// serves). It gives what [`shim_recv`] would, through one borrow and the
/// ring's pop alone (the general path's result records, flags and wait
/// path were a third of such a call's instructions). `None`: take that path.
#[inline(always)]
fn recv_from_ring(t: &Tls, s: &Sock, buf: &mut [u8], flags: c_int) -> Option<Received> {
    if flags & !(libc::MSG_DONTWAIT | libc::MSG_TRUNC) != 0
        || s.mode() != shim::ACTIVE
        || s.has_leftover()
        || !s.ring_has_data()
    {
        return None;
    }
    let mut got = None;
    s.with_existing_in(t, |ep| {
        if let Some(r) = ep.recv_ready(buf) {
            got = with_peer(ep, Ok(r)).ok();
        }
    });
    got
}

/// A datagram whose source the ring does not keep (a connected socket's
/// receive) comes from the peer.
#[inline]
fn with_peer(ep: &Endpoint, mut r: Result<Received, c_int>) -> Result<Received, c_int> {
    if let Ok(x) = &mut r {
        if x.src.port() == 0 {
            if let Ok(p) = ep.peer_addr() {
                x.src = p;
            }
        }
    }
    r
}

/// The value recv-family calls return for a datagram.
fn recv_ret(r: &Received, flags: c_int) -> ssize_t {
    if flags & libc::MSG_TRUNC != 0 {
        r.len as ssize_t
    } else {
        r.copied as ssize_t
    }
}

#[allow(clippy::too_many_arguments)] // the C call's arguments, and the thread's state
unsafe fn recv_common(
    t: &Tls,
    fd: c_int,
    s: &Sock,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> Option<ssize_t> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let b: &mut [u8] =
            if len == 0 || buf.is_null() { &mut [] } else { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        if let Some(r) = recv_from_ring(t, s, b, flags) {
            write_addr(r.src, s.v6, addr, alen);
            return Some(recv_ret(&r, flags));
        }
        let mut out = None;
        shim_recv(t, s, fd, b, flags, None, &mut out);
        match &out {
            None => None,
            Some(Ok(r)) => {
                write_addr(r.src, s.v6, addr, alen);
                Some(recv_ret(r, flags))
            }
            Some(Err(e)) => Some(fail(*e)),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    guard(fd, "recvfrom", Retry::Yes, || {
        // SAFETY: the caller passes `recvfrom`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::recv(&k, fd, buf, len, flags, addr, alen);
            }
            with_sock_t(fd, |t, s| {
                if let Some(r) = recv_common(t, fd, s, buf, len, flags, addr, alen) {
                    return r;
                }
                real::recvfrom(fd, buf, len, flags, addr, alen)
            })
            .unwrap_or_else(|| real::recvfrom(fd, buf, len, flags, addr, alen))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    guard(fd, "__recvfrom_chk", Retry::Yes, || {
        // SAFETY: the caller passes `__recvfrom_chk`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if len > buflen {
                return real::__recvfrom_chk(fd, buf, len, buflen, flags, addr, alen);
            }
            recvfrom(fd, buf, len, flags, addr, alen)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    guard(fd, "recv", Retry::Yes, || {
        // SAFETY: the caller passes `recv`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::recv(&k, fd, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut());
            }
            with_sock_t(fd, |t, s| {
                if let Some(r) = recv_common(t, fd, s, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut()) {
                    return r;
                }
                real::recv(fd, buf, len, flags)
            })
            .unwrap_or_else(|| real::recv(fd, buf, len, flags))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    guard(fd, "__recv_chk", Retry::Yes, || {
        // SAFETY: the caller passes `__recv_chk`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if len > buflen {
                return real::__recv_chk(fd, buf, len, buflen, flags);
            }
            recv(fd, buf, len, flags)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
    guard(fd, "read", Retry::Yes, || {
        // SAFETY: the caller passes `read`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if len == 0 {
                // A socket's read of nothing returns 0 at once and leaves the
                // queued datagram alone (unlike recv with a zero length).
                return real::read(fd, buf, len);
            }
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::recv(&k, fd, buf, len, 0, std::ptr::null_mut(), std::ptr::null_mut());
            }
            with_sock_t(fd, |t, s| {
                if let Some(r) = recv_common(t, fd, s, buf, len, 0, std::ptr::null_mut(), std::ptr::null_mut()) {
                    return r;
                }
                real::read(fd, buf, len)
            })
            .unwrap_or_else(|| real::read(fd, buf, len))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t {
    guard(fd, "__read_chk", Retry::Yes, || {
        // SAFETY: the caller passes `__read_chk`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if len > buflen {
                return real::__read_chk(fd, buf, len, buflen);
            }
            read(fd, buf, len)
        }
    })
}

unsafe fn recvmsg_shim(t: &Tls, fd: c_int, s: &Sock, msg: *mut libc::msghdr, flags: c_int) -> Option<ssize_t> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        if msg.is_null() {
            return Some(fail(libc::EFAULT));
        }
        let m = &mut *msg;
        let v = iovs(m.msg_iov, m.msg_iovlen);
        let mut info = None;
        let r = with_buf(v, false, |b| {
            let mut out = None;
            shim_recv(t, s, fd, b, flags, Some(&mut info), &mut out);
            match out {
                Some(Ok(r)) => {
                    let used = r.copied;
                    (Some(Ok(r)), used)
                }
                other => (other, 0),
            }
        })?;
        match r {
            Ok(r) => {
                if !m.msg_name.is_null() {
                    write_addr(r.src, s.v6, m.msg_name as *mut sockaddr, &mut m.msg_namelen);
                } else {
                    m.msg_namelen = 0;
                }
                m.msg_flags = if r.len > r.copied { libc::MSG_TRUNC } else { 0 };
                write_pktinfo(m, s, info.as_ref());
                Some(recv_ret(&r, flags))
            }
            Err(e) => Some(fail(e)),
        }
    }
}

/// The control messages the kernel gave the engine for this datagram
/// (`IP_PKTINFO`, `IPV6_PKTINFO`, and `IP_TTL`, `IP_TOS`, `IPV6_HOPLIMIT`,
/// `IPV6_TCLASS` when the program asked for them), in the kernel's order, written as the kernel's
/// `put_cmsg` does: a message that does not fit is cut to the room left
/// (header included when it fits) and flagged `MSG_CTRUNC`.
unsafe fn write_pktinfo(m: &mut libc::msghdr, s: &Sock, info: Option<&eudp_engine::backend::PktInfo>) {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let room = if m.msg_control.is_null() { 0 } else { m.msg_controllen };
        m.msg_controllen = 0;
        let Some(info) = info else { return };
        let mut used = 0usize;
        if let Some((ifindex, spec, addr)) = info.v4 {
            let p = libc::in_pktinfo {
                ipi_ifindex: ifindex as c_int,
                ipi_spec_dst: libc::in_addr { s_addr: u32::from(spec).to_be() },
                ipi_addr: libc::in_addr { s_addr: u32::from(addr).to_be() },
            };
            put_cmsg(m, room, &mut used, libc::IPPROTO_IP, libc::IP_PKTINFO, &p);
        }
        if let Some((addr, ifindex)) = info.v6 {
            let p = libc::in6_pktinfo { ipi6_addr: libc::in6_addr { s6_addr: addr.octets() }, ipi6_ifindex: ifindex };
            put_cmsg(m, room, &mut used, libc::IPPROTO_IPV6, libc::IPV6_PKTINFO, &p);
        }
        if let Some(ttl) = info.ttl.filter(|_| s.wants_rx_opt(false)) {
            put_cmsg(m, room, &mut used, libc::IPPROTO_IP, libc::IP_TTL, &c_int::from(ttl));
        }
        if let Some(tos) = info.tos.filter(|_| s.wants_rx_opt(true)) {
            put_cmsg(m, room, &mut used, libc::IPPROTO_IP, libc::IP_TOS, &tos);
        }
        if let Some(hops) = info.hoplimit.filter(|_| s.wants_rx_opt(false)) {
            put_cmsg(m, room, &mut used, libc::IPPROTO_IPV6, libc::IPV6_HOPLIMIT, &c_int::from(hops));
        }
        if let Some(tclass) = info.tclass.filter(|_| s.wants_rx_opt(true)) {
            put_cmsg(m, room, &mut used, libc::IPPROTO_IPV6, libc::IPV6_TCLASS, &c_int::from(tclass));
        }
        m.msg_controllen = used as _;
    }
}

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    guard(fd, "recvmsg", Retry::Yes, || {
        // SAFETY: the caller passes `recvmsg`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::recvmsg(&k, fd, msg, flags);
            }
            with_sock_t(fd, |t, s| {
                if let Some(r) = recvmsg_shim(t, fd, s, msg, flags) {
                    return r;
                }
                real::recvmsg(fd, msg, flags)
            })
            .unwrap_or_else(|| real::recvmsg(fd, msg, flags))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    guard(fd, "readv", Retry::Yes, || {
        // SAFETY: the caller passes `readv`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            if iov_total(iov, n) == Some(0) {
                // readv of nothing: 0 at once, the queue untouched, as on the kernel.
                return real::readv(fd, iov, n);
            }
            with_sock_t(fd, |t, s| {
                let mut m: libc::msghdr = std::mem::zeroed();
                m.msg_iov = iov as *mut libc::iovec;
                m.msg_iovlen = n.max(0) as usize;
                if let Some(r) = recvmsg_shim(t, fd, s, &mut m, 0) {
                    return r;
                }
                real::readv(fd, iov, n)
            })
            .unwrap_or_else(|| real::readv(fd, iov, n))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    guard(fd, "recvmmsg", Retry::No, || {
        // SAFETY: the caller passes `recvmmsg`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            with_sock_t(fd, |t, s| {
                // On the kernel path too while datagrams kept at the fallback wait
                // or a read left asleep at the hand-over has not returned: they
                // come first (the loop ends where they do).
                if s.mode() == shim::KERNEL {
                    s.await_hand_over();
                }
                if (s.mode() != shim::KERNEL || s.has_leftover() || s.reader_in_flight())
                    && flags & (libc::MSG_ERRQUEUE | libc::MSG_OOB) == 0
                    && !msgs.is_null()
                {
                    let base = flags & !libc::MSG_WAITFORONE;
                    // As in the kernel: the timeout is looked at after each datagram
                    // (the time left is written back); the receives themselves wait as
                    // plain receives would (recvmmsg(2), BUGS).
                    let deadline = if timeout.is_null() {
                        None
                    } else {
                        let t = *timeout;
                        if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                            return fail(libc::EINVAL);
                        }
                        Some(Instant::now() + Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
                    };
                    let mut got = 0u32;
                    while got < vlen {
                        let f =
                            if got > 0 && flags & libc::MSG_WAITFORONE != 0 { base | libc::MSG_DONTWAIT } else { base };
                        let h = &mut *msgs.add(got as usize);
                        match recvmsg_shim(t, fd, s, &mut h.msg_hdr, f) {
                            None => break, // moved to the kernel path meanwhile
                            Some(r) if r >= 0 => {
                                h.msg_len = r as c_uint;
                                got += 1;
                                if deadline.is_some_and(|d| Instant::now() >= d) {
                                    break;
                                }
                            }
                            Some(_) => {
                                if got == 0 {
                                    return -1;
                                }
                                break;
                            }
                        }
                    }
                    if let Some(d) = deadline {
                        // Linux writes back the time left.
                        let left = d.saturating_duration_since(Instant::now());
                        (*timeout).tv_sec = left.as_secs() as libc::time_t;
                        (*timeout).tv_nsec = left.subsec_nanos() as _;
                    }
                    if got > 0 || s.mode() != shim::KERNEL {
                        return got as c_int;
                    }
                }
                real::recvmmsg(fd, msgs, vlen, flags, timeout) as ssize_t as c_int
            })
            .unwrap_or_else(|| real::recvmmsg(fd, msgs, vlen, flags, timeout))
        }
    })
}
