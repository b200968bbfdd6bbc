//! The raw calls of `crate::ktrace`, the kernel path traced: turning on
//! `SO_TIMESTAMPING`, the socket's addresses, and receives made as a
//! `recvmsg` with a control buffer of the shim's for the RX stamp, the
//! program's own control messages handed back without it. What a receive
//! means for the trace is the caller's ([`RecvTrace`]).

use crate::real;
use crate::sys::errno::set_errno;
use eudp_engine::sys::timestamp::SO_TIMESTAMPING;
use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::net::SocketAddr;
use std::sync::Arc;

/// What a traced receive tells the tracer above.
pub trait RecvTrace {
    /// The token of a receive the trace times.
    type Enter;
    /// Just before the read (`peek`: MSG_PEEK): a token when the receive is
    /// timed.
    fn enter(&self, peek: bool) -> Option<Self::Enter>;
    /// The RX stamp found in the control data, in nanoseconds.
    fn stamp(&self, ns: u64);
    /// After a successful read that [`RecvTrace::enter`] timed; `src` is
    /// the datagram's source.
    fn received(&self, enter: Self::Enter, fd: c_int, src: Option<SocketAddr>);
}

impl<T: RecvTrace> RecvTrace for Arc<T> {
    type Enter = T::Enter;
    fn enter(&self, peek: bool) -> Option<T::Enter> {
        (**self).enter(peek)
    }
    fn stamp(&self, ns: u64) {
        (**self).stamp(ns)
    }
    fn received(&self, enter: T::Enter, fd: c_int, src: Option<SocketAddr>) {
        (**self).received(enter, fd, src)
    }
}

/// Sets `SO_TIMESTAMPING` to `flags` on `fd`; true on success.
pub fn enable(fd: c_int, flags: c_int) -> bool {
    // SAFETY: pointer to a live c_int and its size.
    unsafe { real::setsockopt(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, &flags as *const c_int as *const c_void, 4) == 0 }
}

/// The local address of `fd`.
pub fn local_addr(fd: c_int) -> Option<SocketAddr> {
    sock_name(fd, libc::getsockname)
}

/// The peer address of `fd` (a connected socket).
pub fn peer_addr(fd: c_int) -> Option<SocketAddr> {
    sock_name(fd, libc::getpeername)
}

/// `getsockname` or `getpeername` of `fd`.
fn sock_name(
    fd: c_int,
    call: unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int,
) -> Option<SocketAddr> {
    // SAFETY: plain data.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of_val(&ss) as socklen_t;
    // SAFETY: the call writes at most `len` bytes into the local buffer.
    if unsafe { call(fd, &mut ss as *mut _ as *mut sockaddr, &mut len) } != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of an address.
    unsafe { addr_of(&ss as *const _ as *const sockaddr, len) }
}

/// An IPv4 or IPv6 socket address at `a` (`len` bytes), if it is one.
///
/// # Safety
/// `a` is null or points to `len` readable bytes.
pub unsafe fn addr_of(a: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if a.is_null() {
        return None;
    }
    // SAFETY: the caller's guarantee; the family decides how much is read.
    unsafe {
        match (*a).sa_family as c_int {
            libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
                let v = &*(a as *const libc::sockaddr_in);
                Some(SocketAddr::from((u32::from_be(v.sin_addr.s_addr).to_be_bytes(), u16::from_be(v.sin_port))))
            }
            libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
                let v = &*(a as *const libc::sockaddr_in6);
                Some(SocketAddr::from((v.sin6_addr.s6_addr, u16::from_be(v.sin6_port))))
            }
            _ => None,
        }
    }
}

/// Control-message room the shim adds for its RX stamp.
const STAMP_ROOM: usize = 128;

/// A traced receive into `buf` (`recv`, `recvfrom`, `read`): made as a
/// `recvmsg` with the shim's control buffer, for the RX stamp.
///
/// # Safety
/// As `recvfrom(2)`'s arguments.
pub unsafe fn recv<T: RecvTrace>(
    k: &T,
    fd: c_int,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    alen: *mut socklen_t,
) -> ssize_t {
    let mut iov = libc::iovec { iov_base: buf, iov_len: len };
    // SAFETY: plain data.
    let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
    m.msg_iov = &mut iov;
    m.msg_iovlen = 1;
    if !addr.is_null() && !alen.is_null() {
        m.msg_name = addr as *mut c_void;
        // SAFETY: the caller's address length.
        m.msg_namelen = unsafe { *alen };
    }
    // SAFETY: m refers to the caller's buffers and its own iovec.
    let r = unsafe { recvmsg_stamped(k, fd, &mut m, flags, None) };
    if r >= 0 && !addr.is_null() && !alen.is_null() {
        // SAFETY: as above.
        unsafe { *alen = m.msg_namelen };
    }
    r
}

/// A traced `recvmsg` of the program's: its control messages are returned
/// without the shim's RX stamp.
///
/// # Safety
/// As `recvmsg(2)`'s arguments.
pub unsafe fn recvmsg<T: RecvTrace>(k: &T, fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        // SAFETY: passes the program's call on; the kernel reports EFAULT.
        return unsafe { real::recvmsg(fd, msg, flags) };
    }
    // SAFETY: the caller's msghdr, readable and writable.
    let app = unsafe { &mut *msg };
    let mut m = *app;
    // SAFETY: `m` is a copy of the caller's msghdr, whose buffers and
    // control area are valid for this call.
    let r = unsafe { recvmsg_stamped(k, fd, &mut m, flags, Some((app.msg_control as *mut u8, app.msg_controllen))) };
    if r >= 0 {
        app.msg_namelen = m.msg_namelen;
        app.msg_flags = m.msg_flags;
        app.msg_controllen = m.msg_controllen;
    }
    r
}

/// `recvmsg` with a control buffer of the program's size plus room for the
/// stamp; the stamp is taken out and the rest copied to `app_ctrl` (the
/// program's control buffer and its length), `m`'s `msg_controllen` and
/// `msg_flags` set as the kernel would have set them for that buffer.
///
/// # Safety
/// `m` refers to valid buffers; `app_ctrl` to a writable buffer of its length.
unsafe fn recvmsg_stamped<T: RecvTrace>(
    k: &T,
    fd: c_int,
    m: &mut libc::msghdr,
    flags: c_int,
    app_ctrl: Option<(*mut u8, usize)>,
) -> ssize_t {
    if flags & (libc::MSG_ERRQUEUE) != 0 {
        // SAFETY: the program's own call.
        return unsafe { real::recvmsg(fd, m, flags) };
    }
    let (app_ptr, app_len) = app_ctrl.filter(|c| !c.0.is_null()).unwrap_or((std::ptr::null_mut(), 0));
    // On the stack unless the program's own control buffer is large: no
    // allocation per traced receive.
    let words = (app_len + STAMP_ROOM).div_ceil(8);
    let mut small = [0u64; 64];
    let mut big = Vec::new();
    let ctrl: &mut [u64] = if words <= small.len() {
        &mut small[..words]
    } else {
        big.resize(words, 0);
        &mut big
    };
    m.msg_control = ctrl.as_mut_ptr() as *mut c_void;
    m.msg_controllen = ctrl.len() * 8;
    // The source is recorded once per socket (`EpAddr`) even when the
    // program does not ask for it: a name buffer of the shim's then.
    // SAFETY: plain data.
    let mut own_name: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let app_name = m.msg_name.is_null();
    if app_name {
        m.msg_name = &mut own_name as *mut _ as *mut c_void;
        m.msg_namelen = std::mem::size_of_val(&own_name) as socklen_t;
    }
    let peek = flags & libc::MSG_PEEK != 0;
    let enter = k.enter(peek);
    // SAFETY: m's pointers are the caller's buffers, `ctrl` and `own_name`.
    let r = unsafe { real::recvmsg(fd, m, flags) };
    let src = if r >= 0 {
        // SAFETY: msg_name holds msg_namelen bytes the kernel wrote.
        unsafe { addr_of(m.msg_name as *const sockaddr, m.msg_namelen) }
    } else {
        None
    };
    if app_name {
        m.msg_name = std::ptr::null_mut();
        m.msg_namelen = 0;
    }
    if r < 0 {
        m.msg_control = app_ptr as *mut c_void;
        m.msg_controllen = app_len;
        return r;
    }
    let errno = std::io::Error::last_os_error().raw_os_error();
    // Copy the program's control messages, leave the stamp.
    let mut out = 0usize;
    let mut truncated = m.msg_flags & libc::MSG_CTRUNC != 0;
    // SAFETY: the CMSG macros walk the control data the kernel wrote.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(m);
        while !c.is_null() {
            let clen = (*c).cmsg_len;
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SO_TIMESTAMPING {
                let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                k.stamp(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
            } else {
                let space = libc::CMSG_SPACE((clen - libc::CMSG_LEN(0) as usize) as u32) as usize;
                if out + clen <= app_len {
                    std::ptr::copy_nonoverlapping(c as *const u8, app_ptr.add(out), clen);
                    out += space.min(app_len - out);
                } else {
                    truncated = true;
                }
            }
            c = libc::CMSG_NXTHDR(m, c);
        }
    }
    m.msg_control = app_ptr as *mut c_void;
    m.msg_controllen = out;
    m.msg_flags = if truncated { m.msg_flags | libc::MSG_CTRUNC } else { m.msg_flags & !libc::MSG_CTRUNC };
    if let Some(enter) = enter {
        k.received(enter, fd, src);
    }
    if let Some(e) = errno {
        set_errno(e);
    }
    r
}
