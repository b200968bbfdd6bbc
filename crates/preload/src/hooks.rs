//! The interposed C functions. Every function here has the exact C
//! signature of the libc function it replaces (variadic `fcntl`/`ioctl`
//! take their one optional argument as a register-sized integer or pointer,
//! which is how the Linux ABIs pass it).
//!
//! Safety policy: the application's pointers are used only as the C
//! contract of the replaced function allows (buffers of the stated length,
//! `msghdr`s whose iovecs and names are valid), for the duration of the
//! call; anything else goes to libc unchanged. Calls on descriptors that
//! are not the application's UDP sockets go straight to libc.

#![allow(clippy::missing_safety_doc, unsafe_op_in_unsafe_fn)]

use crate::fdspace::{is_private, program_fds};
use crate::ktrace;
use crate::real;
use crate::shim::{self, dlog, ep_recv, ep_send, lookup, with_sock_in, with_tls, Sock, Tls, ACTIVE};
use eudp_engine::{Endpoint, Received, RecvFlags};
use libc::{c_char, c_int, c_uint, c_ulong, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::collections::BTreeSet;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

// ------------------------------------------------------------- helpers

fn errno() -> c_int {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

fn set_errno(e: c_int) {
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = e };
}

fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

const UDP_GRO: c_int = 104;

pub(crate) fn real_close(fd: c_int) {
    crate::fdspace::close_private(fd);
}

/// A close-on-exec duplicate for the shim's own use, at a private number
/// (out of the program's descriptor space: see `crate::fdspace`).
pub(crate) fn real_dup_cloexec(fd: c_int) -> io::Result<c_int> {
    crate::fdspace::private_dup(fd)
}

fn sockopt_int(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: pointer to a live c_int and its size.
    unsafe { real::setsockopt(fd, level, name, &v as *const c_int as *const c_void, 4) };
}

/// Raises the kernel receive buffer of `fd` to at least `bytes` (never
/// lowers it): SO_RCVBUFFORCE when privileged, else SO_RCVBUF (capped by
/// rmem_max).
pub(crate) fn grow_kernel_rcvbuf(fd: c_int, bytes: c_int) {
    let mut cur: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: pointer/length of a live c_int.
    unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &mut cur as *mut c_int as *mut c_void, &mut len) };
    if cur >= bytes {
        return;
    }
    let v = bytes / 2; // the kernel doubles the value it is given
                       // SAFETY: pointer to a live c_int and its size.
    let r =
        unsafe { real::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &v as *const c_int as *const c_void, 4) };
    if r != 0 {
        sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
}

pub(crate) fn gro_off(fd: c_int) {
    gro_set(fd, false);
}

pub(crate) fn gro_set(fd: c_int, on: bool) {
    sockopt_int(fd, libc::SOL_UDP, UDP_GRO, on as c_int);
}

fn getsockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: pointer/length of a live c_int.
    let r = unsafe { real::getsockopt(fd, level, name, &mut v as *mut c_int as *mut c_void, &mut len) };
    (r == 0).then_some(v)
}

/// Whether the kernel socket has UDP_GRO on.
pub(crate) fn gro_enabled(fd: c_int) -> bool {
    getsockopt_int(fd, libc::SOL_UDP, UDP_GRO).is_some_and(|v| v != 0)
}

/// An integer option of the kernel socket.
pub(crate) fn int_opt(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    getsockopt_int(fd, level, name)
}

/// Sets an integer option on the kernel socket.
pub(crate) fn set_int_opt(fd: c_int, level: c_int, name: c_int, v: c_int) {
    sockopt_int(fd, level, name, v);
}

/// The kernel socket's receive buffer (SO_RCVBUF as the kernel reports it).
pub(crate) fn kernel_rcvbuf(fd: c_int) -> usize {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).map_or(0, |v| v.max(0) as usize)
}

/// True when the kernel socket itself has a message queued (the shim's
/// own readiness, leftovers or rings, is not asked).
pub(crate) fn kernel_has_data(fd: c_int) -> bool {
    let mut p = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
    // SAFETY: pointer/length of a live pollfd array.
    let r = unsafe { real::poll(p.as_mut_ptr(), 1, 0) };
    r > 0 && p[0].revents & libc::POLLIN != 0
}

/// Whether `fd` has FD_CLOEXEC (an fd that cannot be asked counts as
/// inherited).
pub(crate) fn cloexec(fd: c_int) -> bool {
    // SAFETY: fcntl with integer arguments.
    let f = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    f >= 0 && f & libc::FD_CLOEXEC != 0
}

/// After a fallback or before exec: the kernel socket gets the flags the
/// application asked for and delivers plain (not coalesced) datagrams.
pub(crate) fn restore_kernel_socket(fd: c_int, nonblock: bool) {
    gro_off(fd);
    restore_kernel_flags(fd, nonblock);
}

/// The file description's `O_NONBLOCK` as the application asked (a
/// fallback that leaves a sleeping read GRO on, see `shim::hand_over`).
pub(crate) fn restore_kernel_flags(fd: c_int, nonblock: bool) {
    // SAFETY: fcntl with integer arguments.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let want = if nonblock { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
            real::fcntl(fd, libc::F_SETFL, want as c_ulong);
        }
    }
}

fn timeval_opt(fd: c_int, name: c_int) -> Option<Duration> {
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = std::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: pointer/length of a live timeval.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, &mut tv as *mut _ as *mut c_void, &mut len) };
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return None;
    }
    Some(Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64))
}

/// SO_RCVTIMEO and SO_SNDTIMEO as the kernel socket holds them.
pub(crate) fn kernel_timeouts(fd: c_int) -> (Option<Duration>, Option<Duration>) {
    (timeval_opt(fd, libc::SO_RCVTIMEO), timeval_opt(fd, libc::SO_SNDTIMEO))
}

fn poll_some(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<c_int, c_int> {
    let ms = timeout.map(|d| d.as_millis().clamp(1, i32::MAX as u128) as c_int).unwrap_or(-1);
    // SAFETY: pointer/length of a live pollfd slice.
    let r = unsafe { real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// Sleeps until the socket or the ring is readable (or the timeout).
pub(crate) fn wait_readable(sock: c_int, ring: Option<c_int>, timeout: Option<Duration>) -> Result<(), c_int> {
    let mut p = [
        libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: ring.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    poll_some(&mut p, timeout).map(drop)
}

unsafe fn read_addr(p: *const sockaddr, len: socklen_t) -> Result<SocketAddr, c_int> {
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
unsafe fn write_addr(a: SocketAddr, v6: bool, p: *mut sockaddr, lenp: *mut socklen_t) {
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

unsafe fn iovs<'a>(iov: *const libc::iovec, n: usize) -> &'a [libc::iovec] {
    if iov.is_null() || n == 0 {
        &[]
    } else {
        std::slice::from_raw_parts(iov, n)
    }
}

/// Runs `f` with one contiguous buffer standing for the iovecs: the first
/// iovec itself when it is the only non-empty one, else a scratch buffer
/// gathered from (`gather`) or scattered to the iovecs afterwards.
unsafe fn with_buf<R>(v: &[libc::iovec], gather: bool, f: impl FnOnce(&mut [u8]) -> (R, usize)) -> R {
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
unsafe fn iov_total(iov: *const libc::iovec, n: c_int) -> Option<usize> {
    if !(0..=libc::UIO_MAXIOV).contains(&n) || (iov.is_null() && n > 0) {
        return None;
    }
    Some(iovs(iov, n as usize).iter().map(|v| v.iov_len).sum())
}

// ----------------------------------------------------- receive and send

/// [`shim::with_sock`] handing `f` this thread's [`Tls`] as well, looked up once
/// for the whole call (and not at all for a descriptor the shim does not
/// know).
#[inline]
fn with_sock_t<R>(fd: c_int, f: impl FnOnce(&Tls, &Arc<Sock>) -> R) -> Option<R> {
    if !shim::maybe(fd) {
        return None;
    }
    with_tls(|t| with_sock_in(t, fd, |s| f(t, s)))
}

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
    if s.mode() == shim::KERNEL {
        // Handed over meanwhile: what this receive's read brought
        // beyond its datagram joins the kept ones.
        s.after_hand_over(fd);
    }
    *out = Some(with_peer(&ep, r));
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

/// Checks send flags; `Err(reason)` moves the socket to the kernel path.
fn send_flags_ok(flags: c_int) -> Result<(), &'static str> {
    if flags & libc::MSG_MORE != 0 {
        return Err("send flag MSG_MORE (corking)");
    }
    if flags & libc::MSG_DONTROUTE != 0 {
        return Err("send flag MSG_DONTROUTE");
    }
    Ok(())
}

/// Send on the engine path. `None`: kernel path.
fn shim_send(
    t: &Tls,
    s: &Arc<Sock>,
    fd: c_int,
    data: &[u8],
    flags: c_int,
    dst: Option<SocketAddr>,
) -> Option<Result<usize, c_int>> {
    if flags & libc::MSG_OOB != 0 {
        return Some(Err(libc::EOPNOTSUPP));
    }
    if s.mode() == shim::KERNEL {
        // A fallback under way on another thread sends what the engine
        // queued first; this send goes after it, as this thread's earlier
        // sends would on a kernel socket.
        s.await_hand_over();
        return None;
    }
    if let Err(why) = send_flags_ok(flags) {
        s.fallback(fd, why);
        return None;
    }
    if let Some(r) = s.with_existing_in(t, |ep| ep_send(ep, data, dst, flags)) {
        return Some(r);
    }
    let Some(ep) = s.endpoint(fd) else {
        s.await_hand_over(); // handed over since the check above
        return None;
    };
    Some(ep_send(&ep, data, dst, flags))
}

fn ret_isize(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
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
    let b: &mut [u8] =
        if len == 0 || buf.is_null() { &mut [] } else { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
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

#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
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
    if len > buflen {
        return real::__recvfrom_chk(fd, buf, len, buflen, flags, addr, alen);
    }
    recvfrom(fd, buf, len, flags, addr, alen)
}

#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
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

#[no_mangle]
pub unsafe extern "C" fn __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t {
    if len > buflen {
        return real::__recv_chk(fd, buf, len, buflen, flags);
    }
    recv(fd, buf, len, flags)
}

#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t {
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

#[no_mangle]
pub unsafe extern "C" fn __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t {
    if len > buflen {
        return real::__read_chk(fd, buf, len, buflen);
    }
    read(fd, buf, len)
}

unsafe fn recvmsg_shim(t: &Tls, fd: c_int, s: &Sock, msg: *mut libc::msghdr, flags: c_int) -> Option<ssize_t> {
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

/// The control messages the kernel gave the engine for this datagram
/// (`IP_PKTINFO`, `IPV6_PKTINFO`, and `IP_TTL`, `IP_TOS`, `IPV6_HOPLIMIT`,
/// `IPV6_TCLASS` when the program asked for them), in the kernel's order, written as the kernel's
/// `put_cmsg` does: a message that does not fit is cut to the room left
/// (header included when it fits) and flagged `MSG_CTRUNC`.
unsafe fn write_pktinfo(m: &mut libc::msghdr, s: &Sock, info: Option<&eudp_engine::backend::PktInfo>) {
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

/// Appends one control message at `*used` within `room` bytes of
/// `m.msg_control`, cut (and `MSG_CTRUNC`) when it does not fit.
unsafe fn put_cmsg<T: Copy>(m: &mut libc::msghdr, room: usize, used: &mut usize, level: c_int, kind: c_int, data: &T) {
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

#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
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

#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
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

#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
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
                let f = if got > 0 && flags & libc::MSG_WAITFORONE != 0 { base | libc::MSG_DONTWAIT } else { base };
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

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    if let Some(k) = ktrace::traced(fd) {
        return ktrace::send(&k, fd, len, ktrace::addr_of(addr, alen), || {
            real::sendto(fd, buf, len, flags, addr, alen)
        });
    }
    with_sock_t(fd, |t, s| {
        let dst = if addr.is_null() {
            None
        } else {
            match read_addr(addr, alen) {
                Ok(a) => Some(a),
                Err(_) => return real::sendto(fd, buf, len, flags, addr, alen),
            }
        };
        let data: &[u8] =
            if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
        match shim_send(t, s, fd, data, flags, dst) {
            Some(r) => ret_isize(r),
            None => real::sendto(fd, buf, len, flags, addr, alen),
        }
    })
    .unwrap_or_else(|| real::sendto(fd, buf, len, flags, addr, alen))
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    if let Some(k) = ktrace::traced(fd) {
        return ktrace::send(&k, fd, len, None, || real::send(fd, buf, len, flags));
    }
    with_sock_t(fd, |t, s| {
        let data: &[u8] =
            if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
        match shim_send(t, s, fd, data, flags, None) {
            Some(r) => ret_isize(r),
            None => real::send(fd, buf, len, flags),
        }
    })
    .unwrap_or_else(|| real::send(fd, buf, len, flags))
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    if let Some(k) = ktrace::traced(fd) {
        return ktrace::send(&k, fd, len, None, || real::write(fd, buf, len));
    }
    with_sock_t(fd, |t, s| {
        let data: &[u8] =
            if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
        match shim_send(t, s, fd, data, 0, None) {
            Some(r) => ret_isize(r),
            None => real::write(fd, buf, len),
        }
    })
    .unwrap_or_else(|| real::write(fd, buf, len))
}

/// sendmsg on the shim's path; `None`: kernel path.
unsafe fn sendmsg_shim(t: &Tls, fd: c_int, s: &Arc<Sock>, msg: *const libc::msghdr, flags: c_int) -> Option<ssize_t> {
    if msg.is_null() {
        return Some(fail(libc::EFAULT));
    }
    let m = &*msg;
    if s.mode() == shim::KERNEL {
        return None;
    }
    if m.msg_controllen > 0 && !m.msg_control.is_null() {
        let c = libc::CMSG_FIRSTHDR(m);
        if !c.is_null() {
            let why = format!("sendmsg control message (level {}, type {})", (*c).cmsg_level, (*c).cmsg_type);
            s.fallback(fd, &why);
            return None;
        }
    }
    let dst = if m.msg_name.is_null() || m.msg_namelen == 0 {
        None
    } else {
        match read_addr(m.msg_name as *const sockaddr, m.msg_namelen) {
            Ok(a) => Some(a),
            Err(_) => return None,
        }
    };
    let v = iovs(m.msg_iov, m.msg_iovlen);
    let r = with_buf(v, true, |b| (shim_send(t, s, fd, b, flags, dst), 0))?;
    Some(ret_isize(r))
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    if let Some(k) = ktrace::traced(fd) {
        let (len, dst) = if msg.is_null() {
            (0, None)
        } else {
            (
                iov_total((*msg).msg_iov, (*msg).msg_iovlen as c_int).unwrap_or(0),
                ktrace::addr_of((*msg).msg_name as *const sockaddr, (*msg).msg_namelen),
            )
        };
        return ktrace::send(&k, fd, len, dst, || real::sendmsg(fd, msg, flags));
    }
    with_sock_t(fd, |t, s| {
        if let Some(r) = sendmsg_shim(t, fd, s, msg, flags) {
            return r;
        }
        real::sendmsg(fd, msg, flags)
    })
    .unwrap_or_else(|| real::sendmsg(fd, msg, flags))
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    if ktrace::traced(fd).is_some() {
        ktrace::forget(fd);
    }
    if iov_total(iov, n) == Some(0) {
        // writev of nothing sends nothing on the kernel (write, send and
        // sendmsg of nothing do send an empty datagram).
        return real::writev(fd, iov, n);
    }
    with_sock_t(fd, |t, s| {
        let mut m: libc::msghdr = std::mem::zeroed();
        m.msg_iov = iov as *mut libc::iovec;
        m.msg_iovlen = n.max(0) as usize;
        if let Some(r) = sendmsg_shim(t, fd, s, &m, 0) {
            return r;
        }
        real::writev(fd, iov, n)
    })
    .unwrap_or_else(|| real::writev(fd, iov, n))
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    if ktrace::traced(fd).is_some() {
        ktrace::forget(fd);
    }
    with_sock_t(fd, |t, s| {
        if s.mode() != shim::KERNEL && !msgs.is_null() {
            let mut sent = 0u32;
            while sent < vlen {
                let h = &mut *msgs.add(sent as usize);
                match sendmsg_shim(t, fd, s, &h.msg_hdr, flags) {
                    None => break,
                    Some(r) if r >= 0 => {
                        h.msg_len = r as c_uint;
                        sent += 1;
                    }
                    Some(_) => {
                        if sent == 0 {
                            return -1;
                        }
                        return sent as c_int;
                    }
                }
            }
            if sent == vlen {
                return sent as c_int;
            }
            if sent > 0 {
                // The rest goes on the kernel path (the socket fell back).
                let r = real::sendmmsg(fd, msgs.add(sent as usize), vlen - sent, flags);
                return sent as c_int + r.max(0);
            }
        }
        real::sendmmsg(fd, msgs, vlen, flags) as ssize_t as c_int
    })
    .unwrap_or_else(|| real::sendmmsg(fd, msgs, vlen, flags))
}

// ------------------------------------------------------------ lifecycle

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    let fd = program_fds(|| real::socket(domain, ty, proto));
    shim::forget_stale(fd);
    if fd >= 0
        && (domain == libc::AF_INET || domain == libc::AF_INET6)
        && ty & 0xf == libc::SOCK_DGRAM
        && (proto == 0 || proto == libc::IPPROTO_UDP)
    {
        shim::register_new(fd, domain == libc::AF_INET6, ty & libc::SOCK_NONBLOCK != 0);
        ktrace::register(fd);
    }
    fd
}

/// The program's other calls that make descriptors: numbers lent to the
/// shim below the program's limit are given back when the program needs
/// them (see [`crate::fdspace::program_fds`]); otherwise plain
/// pass-throughs. `open`'s optional mode is read as a plain third argument
/// (how the x86-64 and AArch64 ABIs pass it) and handed on.
macro_rules! fd_makers {
    ($($name:ident ( $($a:ident : $t:ty),* );)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
                program_fds(|| real::$name($($a),*))
            }
        )*
    };
}

fd_makers! {
    socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int);
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t);
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int);
    epoll_create(size: c_int);
    epoll_create1(flags: c_int);
    eventfd(initval: c_uint, flags: c_int);
    pipe(fds: *mut c_int);
    pipe2(fds: *mut c_int, flags: c_int);
    open(path: *const c_char, flags: c_int, mode: libc::mode_t);
    open64(path: *const c_char, flags: c_int, mode: libc::mode_t);
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t);
    openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t);
}

#[cfg(target_arch = "x86_64")]
const SYS_DUP2: libc::c_long = libc::SYS_dup2;
#[cfg(not(target_arch = "x86_64"))]
const SYS_DUP2: libc::c_long = -1;

/// `syscall(2)`: libuv, for one, closes descriptors with
/// `syscall(SYS_close, fd)`; the shim must see those closes. The six
/// argument registers are taken as plain arguments (how the x86-64 and
/// AArch64 ABIs pass variadic integers) and handed on unchanged.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: libc::c_long,
    a: libc::c_long,
    b: libc::c_long,
    c: libc::c_long,
    d: libc::c_long,
    e: libc::c_long,
    f: libc::c_long,
) -> libc::c_long {
    match n {
        libc::SYS_close if is_private(a as c_int) => return fail(libc::EBADF),
        libc::SYS_close => shim::remove(a as c_int),
        libc::SYS_close_range if c & libc::CLOSE_RANGE_CLOEXEC as libc::c_long == 0 => {
            forget_range(a as u32, b as u32);
            let close = |x: c_uint, y: c_uint, fl: c_int| {
                real::syscall(n, x as libc::c_long, y as libc::c_long, fl as libc::c_long, 0, 0, 0) as c_int
            };
            return crate::fdspace::close_range_sparing(a as c_uint, b as c_uint, c as c_int, close) as libc::c_long;
        }
        SYS_DUP2 | libc::SYS_dup3 if is_private(b as c_int) => return fail(libc::EBADF),
        SYS_DUP2 | libc::SYS_dup3 => shim::remove(b as c_int),
        _ => {}
    }
    // Socket calls made through syscall() (libuv's uv__sendmmsg and
    // uv__recvmmsg, for one) on an application UDP socket.
    if matches!(
        n,
        libc::SYS_sendmmsg
            | libc::SYS_recvmmsg
            | libc::SYS_sendto
            | libc::SYS_recvfrom
            | libc::SYS_sendmsg
            | libc::SYS_recvmsg
    ) && lookup(a as c_int).is_some()
    {
        let fd = a as c_int;
        return match n {
            libc::SYS_sendmmsg => sendmmsg(fd, b as *mut libc::mmsghdr, c as c_uint, d as c_int) as libc::c_long,
            libc::SYS_recvmmsg => {
                recvmmsg(fd, b as *mut libc::mmsghdr, c as c_uint, d as c_int, e as *mut libc::timespec) as libc::c_long
            }
            libc::SYS_sendto => {
                sendto(fd, b as *const c_void, c as size_t, d as c_int, e as *const sockaddr, f as socklen_t)
                    as libc::c_long
            }
            libc::SYS_recvfrom => {
                recvfrom(fd, b as *mut c_void, c as size_t, d as c_int, e as *mut sockaddr, f as *mut socklen_t)
                    as libc::c_long
            }
            libc::SYS_sendmsg => sendmsg(fd, b as *const libc::msghdr, c as c_int) as libc::c_long,
            _ => recvmsg(fd, b as *mut libc::msghdr, c as c_int) as libc::c_long,
        };
    }
    let r = real::syscall(n, a, b, c, d, e, f);
    if (n == SYS_DUP2 || n == libc::SYS_dup3) && r >= 0 {
        after_dup(a as c_int, r as c_int);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if ktrace::traced(fd).is_some() {
        ktrace::forget(fd);
    }
    // The shim's and the engine's own descriptors are beyond the program's
    // reach, as a number beyond its limit is on the kernel.
    if is_private(fd) {
        return fail(libc::EBADF);
    }
    shim::remove(fd);
    real::close(fd)
}

fn forget_range(first: u32, last: u32) {
    if !shim::any() {
        return;
    }
    for (fd, _) in shim::all() {
        if (fd as u32) >= first && (fd as u32) <= last {
            shim::remove(fd);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
        forget_range(first, last);
    }
    crate::fdspace::close_range_sparing(first, last, flags, |a, b, fl| real::close_range(a, b, fl))
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(first: c_int) {
    forget_range(first.max(0) as u32, u32::MAX);
    crate::fdspace::closefrom_sparing(first)
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(s) = lookup(fd) {
        s.fallback(fd, "shutdown()");
    }
    real::shutdown(fd, how)
}

fn after_dup(old: c_int, new: c_int) {
    if new < 0 || new == old {
        return;
    }
    match lookup(old) {
        Some(s) => shim::insert(new, s),
        None => shim::remove(new),
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    let r = program_fds(|| real::dup(fd));
    after_dup(fd, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    if is_private(to) {
        return fail(libc::EBADF);
    }
    let r = real::dup2(fd, to);
    after_dup(fd, r);
    r
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    if is_private(to) {
        return fail(libc::EBADF);
    }
    let r = real::dup3(fd, to, flags);
    after_dup(fd, r);
    r
}

/// Under the `tcp` transport a bound socket is attached to the engine at
/// once, so its port is the transport's from the first frame: attached on
/// first use instead, the frames that came before that use went through the
/// listener's hand-over to the kernel socket while later ones reached the
/// endpoint, and a burst could be read out of order. The kernel backend
/// needs nothing here (the kernel socket itself queues what arrives).
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let r = real::bind(fd, addr, len);
    if r == 0 && !shim::inside() && shim::bypass_transport() {
        if let Some(s) = lookup(fd) {
            let e = errno();
            let _ = s.endpoint(fd);
            set_errno(e);
        }
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(s) = lookup(fd) else { return real::connect(fd, addr, len) };
    let Some(ep) = s.existing() else { return real::connect(fd, addr, len) };
    if addr.is_null() {
        return fail(libc::EFAULT);
    }
    let r = if (*addr).sa_family as c_int == libc::AF_UNSPEC {
        ep.disconnect()
    } else {
        match read_addr(addr, len) {
            Ok(a) => ep.connect(a),
            Err(e) => return fail(e),
        }
    };
    match r {
        Ok(()) => 0,
        Err(e) => fail(shim::errno_of(&e)),
    }
}

// ---------------------------------------------------- flags and options

unsafe fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong, f: unsafe fn(c_int, c_int, c_ulong) -> c_int) -> c_int {
    let Some(s) = lookup(fd) else {
        return match cmd {
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => program_fds(|| f(fd, cmd, arg)),
            _ => f(fd, cmd, arg),
        };
    };
    match cmd {
        libc::F_GETFL => {
            let r = f(fd, cmd, arg);
            if r >= 0 && s.mode() == ACTIVE {
                (r & !libc::O_NONBLOCK) | if s.nonblock() { libc::O_NONBLOCK } else { 0 }
            } else {
                r
            }
        }
        libc::F_SETFL => {
            s.set_nonblock(arg as c_int & libc::O_NONBLOCK != 0);
            f(fd, cmd, arg)
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
            let r = program_fds(|| f(fd, cmd, arg));
            after_dup(fd, r);
            r
        }
        _ => f(fd, cmd, arg),
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_common(fd, cmd, arg, real::fcntl)
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    fcntl_common(fd, cmd, arg, real::fcntl64)
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    let Some(s) = lookup(fd) else { return real::ioctl(fd, req, arg) };
    match req {
        libc::FIONBIO if !arg.is_null() => {
            s.set_nonblock(*(arg as *const c_int) != 0);
            real::ioctl(fd, req, arg)
        }
        libc::FIONREAD if !arg.is_null() => {
            if s.has_leftover() {
                if let Some(r) = s.pop_leftover(&mut [], true, None) {
                    *(arg as *mut c_int) = r.len as c_int;
                    return 0;
                }
            }
            match s.existing() {
                Some(ep) => {
                    let n = match ep.recv_with(
                        &mut [],
                        eudp_engine::RecvFlags { peek: true, dont_wait: true, interruptible: false },
                    ) {
                        Ok(r) => r.len,
                        Err(_) => 0,
                    };
                    *(arg as *mut c_int) = n as c_int;
                    0
                }
                None => real::ioctl(fd, req, arg),
            }
        }
        _ => real::ioctl(fd, req, arg),
    }
}

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
            IP_ADD_MEMBERSHIP
            | IP_DROP_MEMBERSHIP
            | IP_ADD_SOURCE_MEMBERSHIP
            | IP_DROP_SOURCE_MEMBERSHIP
            | MCAST_JOIN_GROUP
            | MCAST_LEAVE_GROUP
            | MCAST_JOIN_SOURCE_GROUP
            | MCAST_LEAVE_SOURCE_GROUP
            | MCAST_BLOCK_SOURCE
            | MCAST_UNBLOCK_SOURCE
            | IP_BLOCK_SOURCE
            | IP_UNBLOCK_SOURCE => unsupported("multicast membership (not accelerated yet)"),
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
            IPV6_ADD_MEMBERSHIP
            | IPV6_DROP_MEMBERSHIP
            | MCAST_JOIN_GROUP
            | MCAST_LEAVE_GROUP
            | MCAST_JOIN_SOURCE_GROUP
            | MCAST_LEAVE_SOURCE_GROUP => unsupported("multicast membership (not accelerated yet)"),
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
/// transport can: it gives an address's datagrams to one endpoint (an
/// `SO_REUSEPORT` group is spread by the kernel), sends every frame
/// without IP options, and takes its frames from one interface only.
fn xdp_unsupported(level: c_int, name: c_int, val: Option<c_int>) -> Option<String> {
    if val.unwrap_or(1) == 0 {
        return None;
    }
    match (level, name) {
        (libc::SOL_SOCKET, libc::SO_REUSEPORT) => {
            Some("setsockopt SO_REUSEPORT under the xdp transport (the kernel spreads the group's datagrams)".into())
        }
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
    if let Opt::Unsupported(why) = &kind {
        if s.mode() != shim::KERNEL {
            s.fallback(fd, why);
        }
    }
    let r = real::setsockopt(fd, level, name, val, len);
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

#[no_mangle]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    let r = real::getsockopt(fd, level, name, val, len);
    let rx_opt = |v6| shim::rx_opt_is_tos(v6, level, name);
    if r == 0 && (rx_opt(false).is_some() || rx_opt(true).is_some()) && !val.is_null() && !len.is_null() && *len > 0 {
        if let Some((s, tos)) = lookup(fd).filter(|s| s.rx_opts_forced()).and_then(|s| rx_opt(s.v6).map(|t| (s, t))) {
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

// ------------------------------------------------------------ readiness

/// poll/ppoll over a mix of kernel fds and accelerated sockets: an
/// accelerated socket is readable when its kernel socket is (the receive
/// then reads it directly) or its ring holds a datagram (an extra pollfd
/// on the ring's eventfd).
unsafe fn poll_impl(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !shim::any() || fds.is_null() || n == 0 {
        return real::ppoll(fds, n, ts, mask);
    }
    let app = std::slice::from_raw_parts_mut(fds, n as usize);
    if !app.iter().any(|p| p.events & libc::POLLOUT != 0 && queue_full(t, p.fd)) {
        // Every accelerated socket asked for output has room in L1, as
        // just looked at: `scan_ready` need not look again.
        return poll_input(t, fds, n, ts, mask, true);
    }
    // Some accelerated socket asked for output has its L1 queue half full
    // or more: the kernel socket would say writable, the engine would not
    // take a send. Report POLLOUT only with room: look at everything
    // without sleeping, then sleep on that queue — the engine wakes it the
    // moment it takes L1 — for at most a slice, so the other descriptors
    // are looked at again at least that often.
    const SLICE: Duration = Duration::from_millis(1);
    let deadline = (!ts.is_null()).then(|| Instant::now() + duration_of(&*ts));
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    loop {
        let r = poll_input(t, fds, n, &zero, mask, false);
        if r < 0 {
            return r;
        }
        let mut count = 0;
        let mut full = None;
        for p in app.iter_mut() {
            if p.events & libc::POLLOUT != 0 {
                if let Some(ep) = full_queue(t, p.fd) {
                    p.revents &= !libc::POLLOUT;
                    full.get_or_insert(ep);
                }
            }
            if p.revents != 0 {
                count += 1;
            }
        }
        let now = Instant::now();
        if count > 0 || deadline.is_some_and(|d| now >= d) {
            return count;
        }
        match full {
            Some(ep) => {
                mark_sleep(t, std::ptr::null());
                ep.wait_writable(deadline.map_or(SLICE, |d| (d - now).min(SLICE)));
            }
            // Every queue has room but nothing is ready yet: the kernel
            // sleeps until something is (or the time is up), then the
            // queues are looked at again.
            None => {
                let left = deadline.map(|d| {
                    let l = d.saturating_duration_since(Instant::now());
                    timespec_of(l)
                });
                let r = poll_input(t, fds, n, left.as_ref().map_or(std::ptr::null(), |x| x as *const _), mask, false);
                if r <= 0 {
                    return r;
                }
            }
        }
    }
}

/// True when `fd` is an accelerated socket whose L1 queue has no room
/// (lock-free: the common, writable case costs no reference).
fn queue_full(t: &Tls, fd: c_int) -> bool {
    with_sock_in(t, fd, |s| s.with_existing_in(t, |ep| !ep.writable())).flatten().unwrap_or(false)
}

/// The endpoint of an accelerated socket whose L1 queue has no room.
fn full_queue(t: &Tls, fd: c_int) -> Option<Arc<Endpoint>> {
    with_sock_in(t, fd, |s| s.existing()).flatten().filter(|ep| !ep.writable())
}

/// poll for input readiness, spinning first when the settings ask for it
/// (`EUDP_SPIN_US`) and an accelerated socket is polled for input: the
/// call looks at everything without sleeping, yielding the CPU between
/// looks, until something is ready or the spin is over, and only then
/// sleeps: a reply that comes within the spin costs no sleep and wake-up
/// (the latency profile). Kernel descriptors are looked at in every round
/// as well. For a stream it does not pay on a small machine: an iperf3
/// receiver spinning 50 µs used twice the CPU per datagram and lost more.
/// `room`: every accelerated socket asked for output was just found to
/// have room in L1.
unsafe fn poll_input(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
) -> c_int {
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let limit = (!ts.is_null()).then(|| duration_of(&*ts));
    let spin = match shim::running_engine() {
        Some(e) => e.config().recv_spin.min(limit.unwrap_or(Duration::MAX)),
        None => Duration::ZERO,
    };
    let app = std::slice::from_raw_parts(fds, n as usize);
    if spin.is_zero() || !app.iter().any(|p| p.events & libc::POLLIN != 0 && shim::maybe(p.fd)) {
        return poll_input_once(t, fds, n, ts, mask, room);
    }
    mark_sleep(t, ts);
    // A signal must end this call with EINTR as it would the kernel's poll,
    // even one that arrives while the spin runs in user space: signals stay
    // blocked for the whole call and every look (and the final sleep) is a
    // ppoll with the caller's mask, which delivers a pending one atomically
    // and fails with EINTR. Fault signals are never blocked. eudp's own
    // threads block the rest for good, so a signal sent to the process
    // waits for an application thread rather than going to one of them.
    spin_then_wait(
        spin,
        mask,
        |during| poll_input_once(t, fds, n, &zero, during, false),
        |during, spent| {
            let left = limit.map(|l| timespec_of(l.saturating_sub(spent)));
            poll_input_once(t, fds, n, left.as_ref().map_or(std::ptr::null(), |x| x as *const _), during, false)
        },
    )
}

/// The spinning wait of `poll`/`select` and of `epoll`: with the
/// asynchronous signals blocked for the whole call, `look` (which must not
/// sleep) is made until it returns nonzero or `spin` has passed, then
/// `wait` for the rest of the call's time (given the time spent). Both get
/// the mask to wait with — the caller's `mask`, or the thread's own — and
/// must put it in place for their system call, which then takes a pending
/// signal and fails with EINTR. The CPU is given up every fourth look,
/// not after each: a yield with nobody else to run still goes through the
/// scheduler, as the engine's spinning receive does (`SPIN_YIELD_EVERY`).
/// The thread's mask and the call's errno are as they should be after.
unsafe fn spin_then_wait(
    spin: Duration,
    mask: *const libc::sigset_t,
    mut look: impl FnMut(*const libc::sigset_t) -> c_int,
    wait: impl FnOnce(*const libc::sigset_t, Duration) -> c_int,
) -> c_int {
    let held = eudp_engine::sys::process::AsyncSignalsBlocked::new();
    let during: *const libc::sigset_t = if mask.is_null() { held.mask_before() } else { mask };
    let start = Instant::now();
    let mut looks: u32 = 0;
    let r = loop {
        let r = look(during);
        if r != 0 {
            break r;
        }
        looks += 1;
        let spent = start.elapsed();
        if spent >= spin {
            break wait(during, spent);
        }
        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
        if looks % 4 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    };
    let e = errno();
    drop(held);
    set_errno(e);
    r
}

/// One look at the readiness of accelerated sockets (ring, L1 and socket).
///
/// An accelerated socket whose ring holds a datagram is readable without a
/// syscall; so is one whose ring was empty but whose socket, read right
/// here because a stream is arriving (see `Endpoint::ready_or_fill`),
/// gave more; one asked for output is writable while its L1 has room (a
/// streaming sender's select then costs no syscall). Such calls are
/// answered from what the shim knows alone (see
/// `may_skip_kernel`); otherwise the kernel is asked about everything, the
/// rings' eventfds included, and sleeps if nothing is ready.
unsafe fn poll_input_once(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
) -> c_int {
    let app = std::slice::from_raw_parts_mut(fds, n as usize);
    // Left uninitialised: a call names one or two accelerated sockets, and
    // filling the whole array cost more than the rest of the scan.
    let mut fixed = [std::mem::MaybeUninit::<Extra>::uninit(); EXTRA_MAX];
    let mut k = 0;
    let mut many: Vec<Extra> = Vec::new();
    scan_ready(t, app, room, |e| {
        if k < EXTRA_MAX {
            fixed[k].write(e);
            k += 1;
        } else {
            if many.is_empty() {
                // SAFETY: all EXTRA_MAX entries were written (k reached it).
                many.extend(fixed.iter().map(|x| x.assume_init()));
            }
            many.push(e);
        }
    });
    // SAFETY: the first k entries were written above.
    let extra: &[Extra] =
        if many.is_empty() { std::slice::from_raw_parts(fixed.as_ptr() as *const Extra, k) } else { &many };
    if extra.is_empty() {
        if !no_wait(ts) {
            before_sleep();
        }
        return real::ppoll(fds, n, ts, mask);
    }
    if extra.iter().any(|e| e.fd == NO_RING) {
        return poll_without_rings(t, fds, n, ts, mask, room, extra);
    }
    let ready_now = extra.iter().any(|e| e.ready != 0);
    if ready_now && !extra.iter().any(|e| e.ask) && may_skip_kernel(t) {
        for p in app.iter_mut() {
            p.revents = 0;
        }
        let mut count = 0;
        for e in extra {
            if e.ready != 0 {
                count += c_int::from(app[e.at].revents == 0);
                app[e.at].revents |= e.ready;
            }
        }
        return count;
    }
    kernel_checked(t);
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    let mut wait = if ready_now { &zero as *const _ } else { ts };
    if !ready_now {
        mark_sleep(t, ts);
    }
    let _polling = if ready_now || (!ts.is_null() && (*ts).tv_sec == 0 && (*ts).tv_nsec == 0) {
        Polling::default()
    } else {
        polling(t, app)
    };
    let deadline = (!ts.is_null()).then(|| Instant::now() + duration_of(&*ts));
    let mut left;
    loop {
        // A signal handler polling inside a poll gets its own array.
        let mut fresh = Vec::new();
        let mut guard = t.poll_all.try_borrow_mut().ok();
        let all: &mut Vec<libc::pollfd> = guard.as_deref_mut().unwrap_or(&mut fresh);
        all.clear();
        all.extend_from_slice(app);
        all.extend(extra.iter().map(|e| libc::pollfd { fd: e.fd, events: libc::POLLIN, revents: 0 }));
        let r = real::ppoll(all.as_mut_ptr(), all.len() as libc::nfds_t, wait, mask);
        if r < 0 {
            return r;
        }
        // An input descriptor was readable but brought no datagram.
        let mut empty = false;
        for (j, e) in extra.iter().enumerate() {
            if all[e.at].revents & libc::POLLERR != 0 && !claim_error(t, all[e.at].fd) {
                // Not an error: the kernel's error queue held TX stamps of
                // `eudp trace` (now read into the trace).
                all[e.at].revents &= !libc::POLLERR;
            }
            all[e.at].revents |= e.ready;
            // The ring's eventfd or the backend's descriptor (POLLIN), or
            // the error flag (POLLERR).
            if all[app.len() + j].revents & (libc::POLLIN | libc::POLLERR) != 0 {
                let ev = ring_events_of(t, all[e.at].fd);
                empty |= ev == 0;
                all[e.at].revents |= ev;
            }
        }
        let mut count = 0;
        for (i, p) in app.iter_mut().enumerate() {
            p.revents = all[i].revents;
            if p.revents != 0 {
                count += 1;
            }
        }
        // Nothing ready after all (a partial frame, a spurious wake-up):
        // wait on for what is left of the caller's time, as the kernel
        // would, rather than report a timeout early. Yield first: the rest
        // of a partial frame keeps its descriptor readable until it comes.
        if count != 0 || !empty || ready_now {
            return count;
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return 0;
        }
        std::thread::yield_now();
        left = deadline.map(|d| timespec_of(d.saturating_duration_since(now)));
        wait = left.as_ref().map_or(std::ptr::null(), |x| x as *const _);
    }
}

/// The endpoints a sleeping poll watches for input on their kernel
/// sockets (kernel transport), announced to the engine for the call
/// (`Endpoint::app_poll_begin`): it stays off those sockets, so an arrival
/// wakes this thread alone, which reads the socket itself.
#[derive(Default)]
struct Polling(Vec<Arc<Endpoint>>);

impl Drop for Polling {
    fn drop(&mut self) {
        for ep in &self.0 {
            ep.app_poll_end();
        }
    }
}

/// [`Polling`] for the accelerated sockets `app` asks for input (those
/// announced: see `Endpoint::app_poll_begin`).
fn polling(t: &Tls, app: &[libc::pollfd]) -> Polling {
    let mut v: Vec<Arc<Endpoint>> = Vec::new();
    if shim::bypass_transport() {
        return Polling(v);
    }
    for p in app {
        if p.events & libc::POLLIN == 0 || !shim::maybe(p.fd) {
            continue;
        }
        if let Some(ep) = with_sock_in(t, p.fd, |s| s.existing()).flatten() {
            if !v.iter().any(|e| Arc::ptr_eq(e, &ep)) && ep.app_poll_begin() {
                v.push(ep);
            }
        }
    }
    Polling(v)
}

/// [`Extra::fd`] of a socket whose ring's eventfd could not be made.
const NO_RING: c_int = -2;

/// Some polled sockets have no ring eventfd (the descriptor budget): they
/// move to the kernel path (out of the scan, which found them), then the
/// poll is made again.
#[cold]
#[inline(never)]
unsafe fn poll_without_rings(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
    extra: &[Extra],
) -> c_int {
    let app = std::slice::from_raw_parts(fds, n as usize);
    for e in extra.iter().filter(|e| e.fd == NO_RING) {
        let fd = app[e.at].fd;
        if let Some(s) = lookup(fd) {
            s.fallback(fd, &shim::budget_reason("poll"));
        }
    }
    poll_input_once(t, fds, n, ts, mask, room)
}

/// What stands for one accelerated socket of a poll besides its own
/// descriptor.
#[derive(Clone, Copy)]
struct Extra {
    /// Index in the application's array.
    at: usize,
    /// A descriptor to poll for input on its behalf (its ring's eventfd),
    /// or -1.
    fd: c_int,
    /// Events known to be ready now, without asking the kernel: POLLIN
    /// (datagrams in the ring), POLLERR (an error waiting for the
    /// application) and POLLOUT (room in L1).
    ready: libc::c_short,
    /// The kernel socket's own events must be asked for even with `ready`
    /// set (a socket back on the kernel path with datagrams kept from its
    /// ring: its other events are the kernel's).
    ask: bool,
}

/// Accelerated sockets a poll names before `poll_input` allocates.
const EXTRA_MAX: usize = 16;

/// Reports, for each accelerated socket polled for input or output, the
/// descriptors that stand for its input besides itself and what is ready
/// now. `room`: those asked for output are known to have room in L1.
fn scan_ready(t: &Tls, app: &[libc::pollfd], room: bool, mut add: impl FnMut(Extra)) {
    let bypass = shim::bypass_transport();
    for (at, p) in app.iter().enumerate() {
        let input = p.events & libc::POLLIN != 0;
        let output = p.events & libc::POLLOUT != 0;
        if !(input || output) || !shim::maybe(p.fd) {
            continue;
        }
        with_sock_in(t, p.fd, |s| {
            // A ring with data is input whatever else stands for the
            // socket (under the TCP transport, the backend's descriptor).
            if !output {
                if let Some(fd) = s.ready_ring_fd() {
                    add(Extra { at, fd, ready: libc::POLLIN, ask: false });
                    return;
                }
            }
            let mut seen = |ep: &Endpoint| {
                // Room in L1 is what POLLOUT means for an accelerated
                // socket (a full L1 is `poll_impl`'s business).
                let out = if output && (room || ep.writable()) { libc::POLLOUT } else { 0 };
                if !input {
                    if out != 0 {
                        add(Extra { at, fd: -1, ready: out, ask: false });
                    }
                    return;
                }
                let ready = if ep.ready_or_fill() { input_events(s, ep) } else { 0 } | out;
                if let Some(fd) = s.ring_fd(ep) {
                    add(Extra { at, fd, ready, ask: false });
                } else {
                    // No eventfd (the descriptor budget): without it a wait
                    // would miss the ring; the caller moves the socket to
                    // the kernel path.
                    add(Extra { at, fd: NO_RING, ready, ask: false });
                }
                if let Some(fd) = s.err_fd_made() {
                    add(Extra { at, fd, ready: 0, ask: false });
                }
                // (A kernel-backend endpoint under a bypass transport that
                // could not start has none: its socket is the program's.)
                if let Some(fd) = ep.bypass_fd().filter(|_| bypass) {
                    add(Extra { at, fd, ready: 0, ask: false });
                }
            };
            // Under the TCP transport a socket waited on for input is adopted
            // now; one already on the engine is borrowed without its mutex.
            let found = if bypass && input && s.mode() != ACTIVE {
                s.endpoint(p.fd).map(|ep| seen(&ep))
            } else {
                s.with_existing_in(t, seen)
            };
            if found.is_none() && input && s.has_leftover() {
                add(Extra { at, fd: -1, ready: libc::POLLIN, ask: true });
            }
        });
    }
}

/// What input readiness of an accelerated socket stands for: POLLIN for
/// datagrams in the ring, POLLERR for an asynchronous error waiting for the
/// next send or receive (the engine took it off the kernel socket, whose
/// own poll would have said POLLERR, not POLLIN).
fn input_events(s: &Sock, ep: &Endpoint) -> libc::c_short {
    let mut ev = 0;
    if ep.has_pending_error() {
        ev |= libc::POLLERR;
    }
    if s.ring_has_data() || ev == 0 {
        ev |= libc::POLLIN;
    }
    ev
}

/// The kernel socket of the accelerated socket `fd` reported an error
/// (POLLERR): it becomes the endpoint's pending error at once, so the send
/// or receive the program makes next fails with it, as on the kernel —
/// rather than a send being queued and the engine's own send meeting the
/// error later. Only on POLLERR, which is rare.
///
/// Returns false when the POLLERR stood for no error: the socket is traced
/// (`eudp trace`) and its error queue held the kernel's TX stamps, which
/// are read into the trace here (a kernel socket the program traced
/// itself would not report them).
fn claim_error(t: &Tls, fd: c_int) -> bool {
    let Some(ep) = with_sock_in(t, fd, |s| s.existing()).flatten() else { return true };
    let mut v: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: pointer/length of a live c_int.
    if unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR, &mut v as *mut c_int as *mut c_void, &mut len) }
        == 0
    {
        ep.note_error(v);
    }
    if v == 0 && eudp_engine::tracepoint::on() {
        ep.drain_trace();
        return ep.has_pending_error();
    }
    true
}

/// [`input_events`] of the accelerated socket `fd` one of whose input
/// descriptors (ring eventfd, error flag, the backend's descriptor) was
/// found readable; 0 when the ring is still empty after a read on the spot
/// (`Endpoint::ready_after_read`): the backend's descriptor does not
/// promise a datagram, and "readable" must mean the next nonblocking
/// receive returns one.
fn ring_events_of(t: &Tls, fd: c_int) -> libc::c_short {
    with_sock_in(t, fd, |s| {
        if s.ring_has_data() {
            None
        } else {
            s.existing().map(|ep| if ep.ready_after_read() { input_events(s, &ep) } else { 0 })
        }
    })
    .flatten()
    .unwrap_or(libc::POLLIN)
}

/// A poll/select whose accelerated sockets already have datagrams in their
/// rings is answered without a syscall, except that the kernel is asked
/// (timeout 0) about the other descriptors at least every
/// `SKIP_LIMIT`-th call and at least once per tick of the coarse clock
/// (4 ms at HZ=250), so none of them waits long behind a busy socket.
/// Past about 256 000 calls a second the count binds before the tick.
/// It was 64: an iperf3 receiver (one `select` per datagram, 2.4 M a
/// second) then asked the kernel every 27 µs, and lost a median 1.5 % of
/// an unpaced stream against 0.4 % with 1024 (23 and 10 interleaved
/// runs, stop 30, docs/preload.md).
const SKIP_LIMIT: u32 = 1024;

fn coarse_ns() -> i64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC_COARSE is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// True (and counted) when this call may be answered from the rings alone.
fn may_skip_kernel(t: &Tls) -> bool {
    let (n, at) = t.skipped.get();
    if n < SKIP_LIMIT && coarse_ns() == at {
        t.skipped.set((n + 1, at));
        true
    } else {
        false
    }
}

/// The kernel is being asked about every descriptor now.
fn kernel_checked(t: &Tls) {
    t.skipped.set((0, coarse_ns()));
}

/// Records, for a running `select`, the moment before a call that may sleep
/// (`ts` not zero).
unsafe fn mark_sleep(t: &Tls, ts: *const libc::timespec) {
    if no_wait(ts) {
        return;
    }
    before_sleep();
    if let (true, None) = t.sleep_mark.get() {
        t.sleep_mark.set((true, Some(Instant::now())));
    }
}

/// This thread may sleep in the kernel now (a wait whose timeout is not
/// zero): whatever it queued that waits out its coalescing interval is sent
/// first (`Engine::send_coalesced_now`; one atomic load when nothing
/// waits). A program that sent a burst and now waits for the answers
/// would otherwise wait up to `EUDP_TX_COALESCE_US` for its last datagrams
/// to leave. (A wait that finds something ready at once has then sent its
/// remainder early: a smaller batch, nothing worse.)
fn before_sleep() {
    if let Some(e) = shim::running_engine() {
        e.send_coalesced_now();
    }
}

/// True for a timeout that makes a wait return at once.
unsafe fn no_wait(ts: *const libc::timespec) -> bool {
    !ts.is_null() && (*ts).tv_sec == 0 && (*ts).tv_nsec == 0
}

/// A poll timeout as a duration (negative fields count as zero).
fn duration_of(ts: &libc::timespec) -> Duration {
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

fn timespec_of(d: Duration) -> libc::timespec {
    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ }
}

fn ms_to_ts(ms: c_int) -> Option<libc::timespec> {
    (ms >= 0)
        .then(|| libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) as i64 * 1_000_000) as _ })
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    if !shim::any() {
        return real::poll(fds, n, timeout);
    }
    let ts = ms_to_ts(timeout);
    with_tls(|t| poll_impl(t, fds, n, ts.as_ref().map_or(std::ptr::null(), |x| x as *const _), std::ptr::null()))
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, _fdslen: size_t) -> c_int {
    poll(fds, n, timeout)
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !shim::any() {
        return real::ppoll(fds, n, ts, mask);
    }
    with_tls(|t| poll_impl(t, fds, n, ts, mask))
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    _l: size_t,
) -> c_int {
    ppoll(fds, n, ts, mask)
}

/// A select answered from what the shim knows alone, as `poll_input_once`
/// answers a poll (see `may_skip_kernel`), without building its pollfd
/// array: every accelerated socket named is on the engine and not in the
/// except set, each one in the write set has room in L1 (`POLLOUT`), and at
/// least one named is ready — for input, datagrams in its ring, or more
/// read right here for a stream that is arriving (`ready_or_fill`), or a
/// pending error. Accelerated sockets not ready and the other descriptors
/// are reported not ready, as on that path. `None`: take the general path.
///
/// Under the TCP transport too: its ring is the same ring, and a ring with
/// data (or a fill that brought some) is readable whatever the backend's
/// descriptor says; only an empty ring needs that descriptor polled, which
/// the general path does when the kernel is asked.
unsafe fn select_from_rings(
    t: &Tls,
    n: usize,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
) -> Option<c_int> {
    let word = |set: *mut libc::fd_set, i: usize| if set.is_null() { 0 } else { fd_word(set, i) };
    let mut rd = [0u64; libc::FD_SETSIZE / 64];
    let mut wr = [0u64; libc::FD_SETSIZE / 64];
    let mut count = 0;
    let words = n.div_ceil(64);
    for i in 0..words {
        let valid = if (i + 1) * 64 > n { (1u64 << (n % 64)) - 1 } else { u64::MAX };
        let mut except = word(e, i) & valid;
        while except != 0 {
            let b = except.trailing_zeros();
            except &= except - 1;
            if shim::maybe((i * 64) as c_int + b as c_int) {
                return None;
            }
        }
        let (rw, ww) = (word(r, i) & valid, word(w, i) & valid);
        let mut any = rw | ww;
        while any != 0 {
            let b = any.trailing_zeros();
            any &= any - 1;
            let fd = (i * 64) as c_int + b as c_int;
            if !shim::maybe(fd) {
                continue;
            }
            let bit = 1u64 << b;
            let (input, output) = (rw & bit != 0, ww & bit != 0);
            let (readable, writable) = with_sock_in(t, fd, |s| {
                if s.mode() != ACTIVE {
                    return None;
                }
                if input && !output && s.ring_has_data() {
                    // The common case, without touching the endpoint.
                    return Some((true, false));
                }
                s.with_existing_in(t, |ep| {
                    let writable = output && ep.writable();
                    // A full L1 is `poll_impl`'s business (it waits on it).
                    (writable || !output).then(|| (input && ep.ready_or_fill(), writable))
                })
                .flatten()
            })
            .flatten()?;
            if readable {
                rd[i] |= bit;
                count += 1;
            }
            if writable {
                wr[i] |= bit;
                count += 1;
            }
        }
    }
    if count == 0 || !may_skip_kernel(t) {
        return None;
    }
    for i in 0..words {
        for (set, bits) in [(r, rd[i]), (w, wr[i]), (e, 0)] {
            if !set.is_null() {
                std::ptr::write_unaligned((set as *mut u64).add(i), bits);
            }
        }
    }
    Some(count)
}

/// Word `i` (descriptors `64 i .. 64 i + 63`) of a non-null `fd_set`,
/// which is an array of `FD_SETSIZE` bits in 64-bit words on Linux.
unsafe fn fd_word(set: *const libc::fd_set, i: usize) -> u64 {
    const _: () = assert!(std::mem::size_of::<libc::fd_set>() * 8 == libc::FD_SETSIZE);
    debug_assert!(i < libc::FD_SETSIZE / 64);
    std::ptr::read_unaligned((set as *const u64).add(i))
}

/// select/pselect through `poll_impl` when an accelerated socket is named:
/// `None` when none is (the kernel's select then serves the call as is).
unsafe fn select_impl(
    t: &Tls,
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    let n = n.clamp(0, libc::FD_SETSIZE as c_int);
    if let Some(k) = select_from_rings(t, n as usize, r, w, e) {
        return Some(k);
    }
    {
        let mut fresh = Vec::new();
        let mut guard = t.select_fds.try_borrow_mut().ok();
        let p: &mut Vec<libc::pollfd> = guard.as_deref_mut().unwrap_or(&mut fresh);
        p.clear();
        let mut named = false;
        // Word by word: a program's sets are mostly empty, and a bit test
        // per descriptor cost a tenth of a select-driven receiver's time.
        let word = |set: *mut libc::fd_set, i: usize| if set.is_null() { 0 } else { fd_word(set, i) };
        let n = n as usize;
        for i in 0..n.div_ceil(64) {
            let (rw, ww, ew) = (word(r, i), word(w, i), word(e, i));
            let mut any = rw | ww | ew;
            if (i + 1) * 64 > n {
                any &= (1u64 << (n % 64)) - 1;
            }
            while any != 0 {
                let b = any.trailing_zeros();
                any &= any - 1;
                let bit = 1u64 << b;
                let mut ev = 0;
                if rw & bit != 0 {
                    ev |= libc::POLLIN;
                }
                if ww & bit != 0 {
                    ev |= libc::POLLOUT;
                }
                if ew & bit != 0 {
                    ev |= libc::POLLPRI;
                }
                let fd = (i * 64) as c_int + b as c_int;
                if !named && shim::maybe(fd) {
                    named = with_sock_in(t, fd, |s| {
                        s.mode() == ACTIVE || s.has_leftover() || (shim::bypass_transport() && s.endpoint(fd).is_some())
                    })
                    .unwrap_or(false);
                }
                p.push(libc::pollfd { fd, events: ev, revents: 0 });
            }
        }
        if !named {
            return None;
        }
        let k = poll_impl(t, p.as_mut_ptr(), p.len() as libc::nfds_t, ts, mask);
        if k < 0 {
            return Some(k);
        }
        if p.iter().any(|x| x.revents & libc::POLLNVAL != 0) {
            return Some(fail(libc::EBADF));
        }
        // The kernel writes back the first n bits rounded up to a word,
        // leaving the rest of each set as the caller had it.
        for set in [r, w, e] {
            if !set.is_null() {
                for i in 0..n.div_ceil(64) {
                    std::ptr::write_unaligned((set as *mut u64).add(i), 0);
                }
            }
        }
        let mut count = 0;
        for x in p.iter() {
            if x.events & libc::POLLIN != 0 && x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                libc::FD_SET(x.fd, r);
                count += 1;
            }
            if x.events & libc::POLLOUT != 0 && x.revents & (libc::POLLOUT | libc::POLLERR) != 0 {
                libc::FD_SET(x.fd, w);
                count += 1;
            }
            if x.events & libc::POLLPRI != 0 && x.revents & libc::POLLPRI != 0 {
                libc::FD_SET(x.fd, e);
                count += 1;
            }
        }
        Some(count)
    }
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    if !shim::any() {
        return real::select(n, r, w, e, t);
    }
    let ts = (!t.is_null()).then(|| libc::timespec { tv_sec: (*t).tv_sec, tv_nsec: ((*t).tv_usec * 1000) as _ });
    let (k, slept) = with_tls(|tl| {
        let outer = tl.sleep_mark.replace((true, None));
        let k = select_impl(tl, n, r, w, e, ts.as_ref().map_or(std::ptr::null(), |x| x as *const _), std::ptr::null());
        (k, tl.sleep_mark.replace(outer).1)
    });
    let Some(k) = k else {
        if t.is_null() || (*t).tv_sec != 0 || (*t).tv_usec != 0 {
            before_sleep();
        }
        return real::select(n, r, w, e, t);
    };
    if let (Some(x), Some(start)) = (ts, slept) {
        // Linux writes back the time not slept; a call answered without
        // sleeping used (well) under a microsecond and leaves it unchanged.
        let total = Duration::new(x.tv_sec.max(0) as u64, x.tv_nsec.max(0) as u32);
        let left = total.saturating_sub(start.elapsed());
        (*t).tv_sec = left.as_secs() as libc::time_t;
        (*t).tv_usec = left.subsec_micros() as libc::suseconds_t;
    }
    k
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !shim::any() {
        return real::pselect(n, r, w, e, ts, mask);
    }
    match with_tls(|t| select_impl(t, n, r, w, e, ts, mask)) {
        Some(k) => k,
        None => {
            if !no_wait(ts) {
                before_sleep();
            }
            real::pselect(n, r, w, e, ts, mask)
        }
    }
}

// epoll_wait and friends are the kernel's (accelerated sockets stand in an
// epoll set through their rings' eventfds, see `epoll_ctl`); they are
// interposed only to send what this thread left to be coalesced before the
// program sleeps in them (`before_sleep`).

/// Epoll sets (by descriptor number) that an accelerated socket was added
/// to: under a spinning profile only these spin. A number that another
/// epoll set takes after a close keeps the mark (it then spins for
/// nothing, under that profile only).
static SPIN_EPOLLS: Mutex<BTreeSet<c_int>> = Mutex::new(BTreeSet::new());

fn mark_spin_epoll(epfd: c_int) {
    SPIN_EPOLLS.lock().unwrap_or_else(|e| e.into_inner()).insert(epfd);
}

/// A wait of an epoll set under a spinning profile (`EUDP_SPIN_US`, the
/// latency profile), as `poll_input` spins: the set is looked at without
/// sleeping (a zero-timeout `ppoll` of the epoll descriptor), the CPU
/// given up every fourth look, until something is ready or the spin is
/// over, and only then does the call sleep, for what is left of its timeout. Signals stay
/// blocked for the call and every look (and the final wait) takes the
/// caller's mask, so a signal ends the call with `EINTR` as it would the
/// kernel's wait. `None`: no spin here (not spinning, a zero timeout, or a
/// set without an accelerated socket).
unsafe fn epoll_spin(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
    pwait2: bool,
) -> Option<c_int> {
    let spin = match shim::running_engine() {
        Some(e) => e.config().recv_spin.min(timeout.unwrap_or(Duration::MAX)),
        None => Duration::ZERO,
    };
    if spin.is_zero() || !SPIN_EPOLLS.lock().unwrap_or_else(|e| e.into_inner()).contains(&epfd) {
        return None;
    }
    before_sleep();
    let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    Some(spin_then_wait(
        spin,
        mask,
        |during| {
            // A look is a `ppoll` of the epoll descriptor itself (readable
            // while the set has events): unlike `epoll_pwait` with a zero
            // timeout, which returns 0 with a signal pending, it takes the
            // signal and fails with EINTR. The events are then collected.
            let mut set = libc::pollfd { fd: epfd, events: libc::POLLIN, revents: 0 };
            match real::ppoll(&mut set, 1, &zero, during) {
                0 => 0,
                r if r < 0 => r,
                _ => real::epoll_pwait(epfd, evs, max, 0, during),
            }
        },
        |during, spent| {
            let left = timeout.map(|t| t.saturating_sub(spent));
            if pwait2 {
                let ts = left.map(timespec_of);
                real::epoll_pwait2(epfd, evs, max, ts.as_ref().map_or(std::ptr::null(), |x| x as *const _), during)
            } else {
                // Rounded up, as the kernel rounds a wait's milliseconds.
                let ms = left.map_or(-1, |l| l.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int);
                real::epoll_pwait(epfd, evs, max, ms, during)
            }
        },
    ))
}

fn ms_duration(timeout: c_int) -> Option<Duration> {
    (timeout >= 0).then(|| Duration::from_millis(timeout as u64))
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int {
    if timeout != 0 && shim::any() {
        if let Some(r) = epoll_spin(epfd, evs, max, ms_duration(timeout), std::ptr::null(), false) {
            return r;
        }
        before_sleep();
    }
    real::epoll_wait(epfd, evs, max, timeout)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    if timeout != 0 && shim::any() {
        if let Some(r) = epoll_spin(epfd, evs, max, ms_duration(timeout), mask, false) {
            return r;
        }
        before_sleep();
    }
    real::epoll_pwait(epfd, evs, max, timeout, mask)
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    if !no_wait(ts) && shim::any() {
        if let Some(r) = epoll_spin(epfd, evs, max, (!ts.is_null()).then(|| duration_of(&*ts)), mask, true) {
            return r;
        }
        before_sleep();
    }
    real::epoll_pwait2(epfd, evs, max, ts, mask)
}

/// Events of the ring's eventfd registration for an application epoll
/// registration `ev` (`None`: the application does not want input).
fn ring_events(ev: u32) -> Option<u32> {
    if ev & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32 == 0 {
        return None;
    }
    let mut keep = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLWAKEUP | libc::EPOLLEXCLUSIVE) as u32;
    if shim::bypass_transport() {
        // Datagrams reach the ring after the program may already wait; an
        // exclusive wake-up would then go to one waiting epoll set only,
        // and a set not waiting at that moment would never report them,
        // where a loopback kernel socket had the datagram before any wait.
        // Waking every set is within EPOLLEXCLUSIVE's promise (one or
        // more). The backend's descriptor, an epoll set, cannot take the
        // flag anyway (EINVAL).
        keep &= !(libc::EPOLLEXCLUSIVE as u32);
    }
    Some(libc::EPOLLIN as u32 | (ev & keep))
}

/// Descriptors whose readability means input for an accelerated socket,
/// besides the socket itself: the ring's eventfd, and under the TCP
/// transport the backend's descriptor; and whether all of them could be
/// made (a private descriptor may be out of the budget, see
/// [`crate::fdspace`]).
fn ready_fds(s: &Sock, ep: &Endpoint) -> (Vec<c_int>, bool) {
    let ring = s.ring_fd(ep);
    // An asynchronous error the engine took off the kernel socket: the
    // error flag reports it as EPOLLERR, as the kernel socket would have
    // (the ring's eventfd then stands for datagrams only).
    let err = s.err_fd(ep);
    let complete = ring.is_some() && err.is_some();
    let mut v: Vec<c_int> = ring.into_iter().chain(err).collect();
    if let Some(fd) = ep.bypass_fd().filter(|_| shim::bypass_transport()) {
        v.push(fd);
    }
    (v, complete)
}

/// A duplicate of a ring's eventfd `rfd` standing for it in the epoll
/// registrations made through descriptor `fd` of socket `s`.
struct RingDup {
    sock: std::sync::Weak<Sock>,
    ring: c_int,
    dup: c_int,
}

/// epoll keys a registration by descriptor number and file, so two
/// descriptors of one socket (dup) registered in one epoll need two
/// descriptors of its ring's eventfd (and of its error flag, and under the
/// TCP transport of the backend's descriptor): the first uses the
/// descriptor itself, the next a duplicate, made then and kept while the
/// socket and its ring last.
/// Key: (socket address, application descriptor, descriptor duplicated).
type DupKey = (usize, c_int, c_int);
static RING_DUPS: std::sync::Mutex<Option<std::collections::HashMap<DupKey, RingDup>>> = std::sync::Mutex::new(None);

/// The duplicate of `rfd` for `(s, fd)`: made when `create`, else only
/// one already made. A stale one (another socket at that address, or
/// another ring) is closed.
fn ring_dup(s: &Arc<Sock>, fd: c_int, rfd: c_int, create: bool) -> Option<c_int> {
    let mut g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() && !create {
        return None;
    }
    let map = g.get_or_insert_with(Default::default);
    let key = (Arc::as_ptr(s) as usize, fd, rfd);
    if let Some(d) = map.get(&key) {
        if d.ring == rfd && std::ptr::eq(d.sock.as_ptr(), Arc::as_ptr(s)) && d.sock.strong_count() > 0 {
            return Some(d.dup);
        }
        let old = map.remove(&key).expect("just found");
        real_close(old.dup);
    }
    if !create {
        return None;
    }
    let dup = real_dup_cloexec(rfd).ok()?;
    RING_DUPS_MADE.store(true, std::sync::atomic::Ordering::Relaxed);
    map.insert(key, RingDup { sock: Arc::downgrade(s), ring: rfd, dup });
    Some(dup)
}

/// Set once a duplicate was ever made: sockets of programs that never
/// register two descriptors of one socket skip the table at drop.
static RING_DUPS_MADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether duplicates were made for the socket at `addr`.
pub(crate) fn has_ring_dups(addr: usize) -> bool {
    if !RING_DUPS_MADE.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().is_some_and(|m| m.keys().any(|&(a, _, _)| a == addr))
}

/// The socket at `addr` is gone: the duplicates made for it close too, so
/// the epoll registrations made through them end with the socket, as the
/// kernel's end when the socket's last descriptor closes (a duplicate left
/// open could keep reporting a readable ring for a closed socket).
pub(crate) fn forget_ring_dups(addr: usize) {
    if !RING_DUPS_MADE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(map) = g.as_mut() {
        map.retain(|&(a, _, _), d| {
            if a == addr {
                real_close(d.dup);
            }
            a != addr
        });
    }
}

/// MOD or DEL of the ring registration made through `fd`'s own duplicate
/// of the ring's eventfd, if it has one in this epoll. `false`: it has
/// none there; the eventfd itself is the key.
unsafe fn ring_ctl_dup(
    s: &Arc<Sock>,
    fd: c_int,
    rfd: c_int,
    epfd: c_int,
    op: c_int,
    ev: &mut libc::epoll_event,
) -> bool {
    match ring_dup(s, fd, rfd, false) {
        Some(d) => real::epoll_ctl(epfd, op, d, ev) == 0,
        None => false,
    }
}

/// epoll: an accelerated socket is registered twice under the application's
/// event data — the kernel socket (output, errors, and input still in the
/// socket) and the ring's eventfd (input in the ring). Each report stands
/// for at least one distinct datagram, so a duplicate report never makes a
/// receive block.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int {
    let Some(s) = lookup(fd) else { return real::epoll_ctl(epfd, op, fd, ev) };
    if matches!(op, libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD)
        && !ev.is_null()
        && (*ev).events & libc::EPOLLONESHOT as u32 != 0
        && (*ev).events & libc::EPOLLEXCLUSIVE as u32 == 0
        && s.mode() != shim::KERNEL
    {
        // One report per arming cannot span two registrations (the kernel
        // socket and the ring's eventfd each report once): kernel path.
        // (With EPOLLEXCLUSIVE the kernel refuses the registration.)
        s.fallback(fd, "epoll_ctl EPOLLONESHOT");
    }
    let r = real::epoll_ctl(epfd, op, fd, ev);
    if r != 0 {
        return r;
    }
    let saved = errno();
    // After a fallback that kept datagrams, their readiness eventfd stands
    // in for the ring's (see `Sock::fallback`). A socket whose descriptors
    // for this cannot all be made (the descriptor budget) falls back: an
    // epoll set that missed its ring would miss its datagrams.
    let extra = |ep: Option<Arc<Endpoint>>, need: bool| -> Vec<c_int> {
        if let Some(ep) = ep {
            let (v, complete) = ready_fds(&s, &ep);
            if complete || !need {
                return v;
            }
            drop(ep);
            s.fallback(fd, &shim::budget_reason("epoll_ctl"));
        }
        s.leftover_ready_fd().into_iter().collect()
    };
    match op {
        libc::EPOLL_CTL_ADD if !ev.is_null() => {
            if let Some(events) = ring_events((*ev).events) {
                if s.mode() != shim::KERNEL {
                    mark_spin_epoll(epfd);
                }
                for rfd in extra(s.endpoint(fd), true) {
                    let mut e2 = libc::epoll_event { events, u64: (*ev).u64 };
                    if real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, rfd, &mut e2) != 0 && errno() == libc::EEXIST {
                        // Another descriptor of this socket has the ring
                        // in this epoll: this one gets its own key.
                        match ring_dup(&s, fd, rfd, true) {
                            Some(d) => {
                                real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, d, &mut e2);
                            }
                            None if s.mode() == ACTIVE => {
                                s.fallback(fd, &shim::budget_reason("epoll_ctl of a duplicate"));
                                break;
                            }
                            None => {}
                        }
                    }
                }
            }
        }
        libc::EPOLL_CTL_MOD if !ev.is_null() => {
            let need = ring_events((*ev).events).is_some();
            for rfd in extra(s.existing(), need) {
                match ring_events((*ev).events) {
                    Some(events) => {
                        let mut e2 =
                            libc::epoll_event { events: events & !(libc::EPOLLEXCLUSIVE as u32), u64: (*ev).u64 };
                        if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_MOD, &mut e2)
                            && real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, rfd, &mut e2) != 0
                        {
                            real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, rfd, &mut e2);
                        }
                    }
                    None => {
                        let mut e2 = libc::epoll_event { events: 0, u64: 0 };
                        if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_DEL, &mut e2) {
                            real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, rfd, &mut e2);
                        }
                    }
                }
            }
        }
        libc::EPOLL_CTL_DEL => {
            for rfd in extra(s.existing(), false) {
                let mut e2 = libc::epoll_event { events: 0, u64: 0 };
                if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_DEL, &mut e2) {
                    real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, rfd, &mut e2);
                }
            }
        }
        _ => {}
    }
    // The program now waits for this socket's input in its epoll set, which
    // watches the kernel socket: its threads read arrivals themselves, and
    // the engine stops watching the socket (`Endpoint::app_waits_on_socket`;
    // not under the TCP transport, whose socket never becomes readable).
    if matches!(op, libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD)
        && !ev.is_null()
        && (*ev).events & libc::EPOLLIN as u32 != 0
        && s.mode() == ACTIVE
        && !shim::bypass_transport()
    {
        s.with_existing(|ep| ep.app_waits_on_socket());
    }
    set_errno(saved);
    0
}

// ------------------------------------------------- exec, fork, signals

/// Before exec: what is queued goes out, and sockets the new program
/// inherits become plain kernel sockets with the flags it asked for.
fn before_exec() -> Vec<(c_int, bool)> {
    let mut touched = Vec::new();
    if !shim::any() {
        return touched;
    }
    crate::stat::write_now(true);
    for (fd, s) in shim::all() {
        if let Some(ep) = s.existing() {
            ep.flush(Duration::from_secs(1));
            // SAFETY: fcntl with integer arguments.
            let fdfl = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
            if fdfl >= 0 && fdfl & libc::FD_CLOEXEC == 0 {
                restore_kernel_socket(fd, s.nonblock());
                s.restore_rx_opts(fd, true);
                touched.push((fd, s.nonblock()));
            }
        }
    }
    touched
}

/// exec failed: the sockets stay on the engine.
fn after_failed_exec(touched: Vec<(c_int, bool)>) {
    for (fd, _) in touched {
        sockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1);
        if let Some(s) = lookup(fd) {
            s.reforce_rx_opts(fd);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let t = before_exec();
    let r = real::execve(path, argv, envp);
    let e = errno();
    after_failed_exec(t);
    set_errno(e);
    r
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    let t = before_exec();
    let r = real::execv(path, argv);
    let e = errno();
    after_failed_exec(t);
    set_errno(e);
    r
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    let t = before_exec();
    let r = real::execvp(file, argv);
    let e = errno();
    after_failed_exec(t);
    set_errno(e);
    r
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    let t = before_exec();
    let r = real::execvpe(file, argv, envp);
    let e = errno();
    after_failed_exec(t);
    set_errno(e);
    r
}

// execl, execlp and execle are variadic, and glibc's versions call its
// internal execve, bypassing the hook above. Stable Rust cannot define a
// C-variadic function, so these take 32 pointer arguments: on x86-64 and
// AArch64 Linux a variadic call passes its pointer arguments exactly where
// these parameters are read from (registers, then the caller's stack), and
// only the slots up to the terminating NULL (and execle's envp after it)
// are used. A list longer than 30 arguments fails with E2BIG.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod exec_list {
    use super::*;

    /// The argument vector up to and including its NULL, and the slot after.
    fn argv(slots: &[*const c_char]) -> Option<(Vec<*const c_char>, *const c_char)> {
        let end = slots.iter().position(|p| p.is_null())?;
        Some((slots[..=end].to_vec(), slots.get(end + 1).copied().unwrap_or(std::ptr::null())))
    }

    #[no_mangle]
    pub unsafe extern "C" fn execl(
        path: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        match argv(&[
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22,
            a23, a24, a25, a26, a27, a28, a29, a30, a31,
        ]) {
            Some((v, _)) => execv(path, v.as_ptr()),
            None => fail::<c_int>(libc::E2BIG),
        }
    }

    #[no_mangle]
    pub unsafe extern "C" fn execlp(
        file: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        match argv(&[
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22,
            a23, a24, a25, a26, a27, a28, a29, a30, a31,
        ]) {
            Some((v, _)) => execvp(file, v.as_ptr()),
            None => fail::<c_int>(libc::E2BIG),
        }
    }

    #[no_mangle]
    pub unsafe extern "C" fn execle(
        path: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        match argv(&[
            a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21, a22,
            a23, a24, a25, a26, a27, a28, a29, a30, a31,
        ]) {
            Some((v, envp)) if v.len() < 32 => execve(path, v.as_ptr(), envp as *const *const c_char),
            _ => fail::<c_int>(libc::E2BIG),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let r = real::sigaction(sig, act, old);
    if r == 0 && !act.is_null() {
        crate::signals::record(sig, (*act).sa_sigaction, (*act).sa_flags);
    }
    r
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let r = real::signal(sig, handler);
    if r != libc::SIG_ERR {
        // glibc's signal() has BSD semantics: handlers restart calls.
        crate::signals::record(sig, handler, libc::SA_RESTART);
    }
    r
}

fn flush_all(t: Duration) {
    if shim::any() {
        for (_, s) in shim::all() {
            if let Some(ep) = s.existing() {
                ep.flush(t);
            }
        }
    }
    if shim::tcp_transport() {
        // Flushed endpoints, and endpoints already closed (a program that
        // sends, closes its socket and exits: logger), may leave datagrams
        // in the transport's lanes, waiting for a connection.
        eudp_engine::backend::tcp::TcpTransport::wait_global_sent(t);
    }
}

/// Under `eudp trace` (`EUDP_TRACE`): at exit, the trace is written with
/// every socket's pending TX stamps, also for a program that never closes
/// its sockets (an endpoint's close writes it otherwise).
fn trace_at_exit() {
    if !eudp_engine::tracepoint::on() {
        return;
    }
    if shim::any() {
        for (_, s) in shim::all() {
            if let Some(ep) = s.existing() {
                ep.drain_trace();
            }
        }
    }
    if let Err(e) = eudp_engine::tracepoint::finish() {
        eprintln!("eudp trace: cannot write the trace at exit: {e}");
    }
}

/// `_exit` skips atexit handlers, but a kernel socket would already hold
/// what the program sent: flush the queues first.
#[no_mangle]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    flush_all(Duration::from_secs(2));
    trace_at_exit();
    libc::syscall(libc::SYS_exit_group, code);
    loop {
        std::hint::spin_loop();
    }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(code: c_int) -> ! {
    _exit(code)
}

/// `vfork` runs as `fork`, which POSIX allows: a vfork child shares the
/// parent's memory and runs no fork handlers, so the shim's hooks it calls
/// before exec (`close_range`, `close`, `dup2` in Python's subprocess)
/// would tear down the parent's sockets. As a fork child it has its own
/// copy of the shim's state, and the fork handlers apply `vfork`'s policy
/// (`shim::fork_prepare`: sockets closed at exec stay on the engine in the
/// parent). `vfork` cannot be wrapped (the child would return through the
/// wrapper's frame the parent then reuses); glibc's `fork` is called
/// instead. `posix_spawn` and `system` are not affected: glibc's child
/// there calls its internal functions, which no preloaded library
/// interposes, and never reaches the shim.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    shim::vforking(true);
    // SAFETY: glibc's fork; the child returns through its own copy of
    // this frame.
    let pid = libc::fork();
    shim::vforking(false);
    pid
}

#[no_mangle]
pub unsafe extern "C" fn __vfork() -> libc::pid_t {
    vfork()
}

extern "C" fn on_prepare() {
    shim::fork_prepare();
}
extern "C" fn on_parent() {
    shim::fork_parent();
}
extern "C" fn on_child() {
    shim::fork_child();
}

/// At exit: what is queued goes out (the kernel would have sent it), and
/// the final counters are written.
extern "C" fn on_exit() {
    flush_all(Duration::from_secs(2));
    trace_at_exit();
    crate::stat::write_now(true);
}

extern "C" fn init() {
    // SAFETY: registering plain extern "C" functions with libc.
    unsafe {
        libc::pthread_atfork(Some(on_prepare), Some(on_parent), Some(on_child));
        libc::atexit(on_exit);
    }
    // Both cost an RCU grace period once the process has a second thread
    // and almost nothing before: done here, the first socket's adoption
    // (inside its bind, first send or receive) does not pay 20-60 ms.
    // Under either transport (docs/preload.md, "The fast start under the
    // tcp transport too").
    crate::borrow::init();
    crate::fdspace::pregrow();
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
