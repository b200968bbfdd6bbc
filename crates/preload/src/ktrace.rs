//! The kernel stack of a program, traced (`eudp trace --compare kernel,eudp
//! -- PROGRAM`): with `EUDP_TRACE` and `EUDP_TRACE_STACK=kernel` the shim
//! accelerates nothing. Every UDP socket stays the program's plain kernel
//! socket, and the shim records around the program's own calls the points
//! the `burst` scenario's kernel worker records: application call enter and
//! return, send syscall enter and return, the kernel's TX_SCHED,
//! TX_SOFTWARE and RX_SOFTWARE stamps (`SO_TIMESTAMPING`), the receive
//! syscall and its return. So a program's kernel run and its eudp run are
//! charted on the same axes.
//!
//! What changes for the program while traced, and how it is kept
//! invisible:
//! * the TX stamps land on the socket's error queue, which would make
//!   `poll` report `POLLERR`: the sending thread reads them right after
//!   each send (veth and loopback make them during the send call itself);
//! * the RX stamp comes as a control message: receives are made with
//!   `recvmsg` and a control buffer of the shim's, and the program's own
//!   `recvmsg` gets its control messages without the stamp (truncated, with
//!   `MSG_CTRUNC`, as the kernel would for its buffer).
//!
//! A socket shared with a fork child is traced in the parent only (the
//! child's sends on it would still shift the parent's keys).
//!
//! A socket stops being traced (its events so far stay) when the program
//! turns on timestamps or `IP_RECVERR` itself (both use what the tracing
//! uses) or sends or receives with calls not traced here (`sendmmsg`,
//! `recvmmsg`, `readv`, `writev`): their datagrams would shift the
//! kernel's `OPT_ID` keys and the arrival indices against the traced ones.

use eudp_engine::sys::timestamp::SO_TIMESTAMPING;
use eudp_engine::tracepoint::{self, EpTrace, SIDE_RECV, SIDE_SEND};
use libc::{c_int, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Mutex, RwLock};

/// One traced kernel socket.
pub struct KSock {
    tr: EpTrace,
    /// Serialises a send's syscall with its trace counters, so the send
    /// sequence and the kernel's `OPT_ID` keys advance together.
    send: Mutex<()>,
    /// Serialises a receive's trace counters (arrival indices); taken
    /// after the read returns.
    recv: Mutex<()>,
}

static TABLE: RwLock<Option<HashMap<c_int, Arc<KSock>>>> = RwLock::new(None);
/// 255: not read yet; 0 off; 1 on.
static ACTIVE: AtomicU8 = AtomicU8::new(255);

/// True when the program's kernel path is being traced (`EUDP_TRACE` and
/// `EUDP_TRACE_STACK=kernel`); the shim then adopts no socket.
pub fn active() -> bool {
    match ACTIVE.load(Relaxed) {
        255 => {
            let on = std::env::var("EUDP_TRACE_STACK").is_ok_and(|v| v == "kernel")
                && std::env::var("EUDP_TRACE").is_ok_and(|v| !v.is_empty());
            ACTIVE.store(on as u8, Relaxed);
            on
        }
        v => v == 1,
    }
}

thread_local! {
    /// This thread is inside the tracing: the calls the tracing itself
    /// makes (its error-queue reads through `recvmmsg`, the socket of the
    /// RX stamp hold) reach the shim's hooks too, and are not the program's.
    static INSIDE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f` marked as the tracing's own work (see `INSIDE`).
fn inside<R>(f: impl FnOnce() -> R) -> R {
    let was = INSIDE.with(|c| c.replace(true));
    let r = f();
    INSIDE.with(|c| c.set(was));
    r
}

/// The traced socket `fd`, if any, for a call of the program's: one
/// relaxed load, inlined into every hook, when not tracing (the lookup is
/// out of line, so the hooks' hot paths pay no call for it).
#[inline(always)]
pub fn traced(fd: c_int) -> Option<Arc<KSock>> {
    if ACTIVE.load(Relaxed) != 1 {
        return None;
    }
    traced_lookup(fd)
}

#[cold]
#[inline(never)]
fn traced_lookup(fd: c_int) -> Option<Arc<KSock>> {
    if INSIDE.with(|c| c.get()) {
        return None;
    }
    TABLE.read().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&fd).cloned()
}

/// A new UDP socket of the program: timestamped and traced.
pub fn register(fd: c_int) {
    if active() && !INSIDE.with(|c| c.get()) {
        inside(|| register_now(fd));
    }
}

fn register_now(fd: c_int) {
    tracepoint::init_from_env();
    let flags = tracepoint::timestamping_flags();
    // SAFETY: an int option on the program's own new socket.
    let ok = unsafe {
        crate::real::setsockopt(fd, libc::SOL_SOCKET, SO_TIMESTAMPING, &flags as *const c_int as *const c_void, 4)
    } == 0;
    if !ok {
        return;
    }
    tracepoint::rx_stamps_ready(flags);
    let k = Arc::new(KSock { tr: EpTrace::new(), send: Mutex::new(()), recv: Mutex::new(()) });
    TABLE.write().unwrap_or_else(|e| e.into_inner()).get_or_insert_with(HashMap::new).insert(fd, k);
}

/// `fd` is closed, or used in a way this module cannot trace: its stamps
/// still queued are read, and it is traced no more.
pub fn forget(fd: c_int) {
    let k = TABLE.write().unwrap_or_else(|e| e.into_inner()).as_mut().and_then(|t| t.remove(&fd));
    if let Some(k) = k {
        let _g = k.send.lock().unwrap_or_else(|e| e.into_inner());
        inside(|| {
            k.tr.drain_tx(fd);
            let _ = tracepoint::finish();
        });
    }
}

/// In a fork child: the sockets inherited from the parent are traced in
/// the parent only (two processes counting one socket's sends could not
/// match the kernel's keys); the child traces the sockets it makes.
pub fn forked_child() {
    if let Ok(mut t) = TABLE.try_write() {
        *t = None;
    }
}

/// A `setsockopt` the tracing conflicts with (the program's own
/// timestamps, or its own error queue).
pub fn conflicts(level: c_int, name: c_int) -> bool {
    matches!(
        (level, name),
        (libc::SOL_SOCKET, libc::SO_TIMESTAMP | libc::SO_TIMESTAMPNS | SO_TIMESTAMPING)
            | (libc::IPPROTO_IP, libc::IP_RECVERR)
            | (libc::IPPROTO_IPV6, libc::IPV6_RECVERR)
    )
}

fn local_addr(fd: c_int) -> Option<SocketAddr> {
    sock_name(fd, libc::getsockname)
}

fn peer_addr(fd: c_int) -> Option<SocketAddr> {
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

/// A traced send: `call` makes the program's own send syscall. `dst` is
/// its destination when it names one.
pub fn send(k: &KSock, fd: c_int, len: usize, dst: Option<SocketAddr>, call: impl FnOnce() -> ssize_t) -> ssize_t {
    // Marked inside: a signal handler that sends on this thread meanwhile
    // goes untraced instead of waiting for the lock this thread holds.
    inside(|| send_locked(k, fd, len, dst, call))
}

fn send_locked(k: &KSock, fd: c_int, len: usize, dst: Option<SocketAddr>, call: impl FnOnce() -> ssize_t) -> ssize_t {
    let _g = k.send.lock().unwrap_or_else(|e| e.into_inner());
    let tok = tracepoint::on().then(|| k.tr.send_enter(len));
    k.tr.sys_enter();
    let r = call();
    if r >= 0 {
        let errno = std::io::Error::last_os_error().raw_os_error();
        k.tr.direct();
        k.tr.sys_return_direct();
        if let Some(t) = tok {
            k.tr.send_return(t);
        }
        k.tr.drain_tx(fd);
        k.tr.note_addrs(SIDE_SEND, || (local_addr(fd), dst.or_else(|| peer_addr(fd))));
        if let Some(e) = errno {
            // The trace's own calls leave errno as the send left it.
            set_errno(e);
        }
    }
    r
}

fn set_errno(e: c_int) {
    // SAFETY: this thread's errno.
    unsafe { *libc::__errno_location() = e };
}

/// Control-message room the shim adds for its RX stamp.
const STAMP_ROOM: usize = 128;

/// A traced receive into `buf` (`recv`, `recvfrom`, `read`): made as a
/// `recvmsg` with the shim's control buffer, for the RX stamp.
///
/// # Safety
/// As `recvfrom(2)`'s arguments.
pub unsafe fn recv(
    k: &KSock,
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
pub unsafe fn recvmsg(k: &KSock, fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        // SAFETY: passes the program's call on; the kernel reports EFAULT.
        return unsafe { crate::real::recvmsg(fd, msg, flags) };
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
unsafe fn recvmsg_stamped(
    k: &KSock,
    fd: c_int,
    m: &mut libc::msghdr,
    flags: c_int,
    app_ctrl: Option<(*mut u8, usize)>,
) -> ssize_t {
    if flags & (libc::MSG_ERRQUEUE) != 0 {
        // SAFETY: the program's own call.
        return unsafe { crate::real::recvmsg(fd, m, flags) };
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
    let enter = if tracepoint::on() && !peek { Some(k.tr.recv_enter()) } else { None };
    if !peek {
        k.tr.rx_enter();
    }
    // SAFETY: m's pointers are the caller's buffers, `ctrl` and `own_name`.
    let r = unsafe { crate::real::recvmsg(fd, m, flags) };
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
                tracepoint::note_rx_stamp(0, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
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
        // Taken after the read, not around it: a receive may block, and a
        // second thread's receive (with its own SO_RCVTIMEO) must not wait
        // behind it. Arrival indices then follow the order in which the
        // reads return.
        let _g = k.recv.lock().unwrap_or_else(|e| e.into_inner());
        k.tr.rx_push(0, 1);
        k.tr.pop();
        k.tr.recv_return(enter);
        inside(|| k.tr.note_addrs(SIDE_RECV, || (local_addr(fd), src)));
    }
    if let Some(e) = errno {
        set_errno(e);
    }
    r
}
