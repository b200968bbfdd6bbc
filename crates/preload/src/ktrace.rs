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

use crate::sys::errno::set_errno;
use crate::sys::timestamp::{local_addr, peer_addr, RecvTrace};
use eudp_engine::sys::timestamp::SO_TIMESTAMPING;
use eudp_engine::tracepoint::{self, EpTrace, SIDE_RECV, SIDE_SEND};
use libc::{c_int, ssize_t};
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
    if !crate::sys::timestamp::enable(fd, flags) {
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

// The traced receives (`recv`, `recvmsg`) and the address decoding the
// hooks use are raw work on the program's buffers: they live in
// `crate::sys::timestamp`, which reports each receive to [`KSock`]'s
// [`RecvTrace`].
pub use crate::sys::timestamp::{addr_of, recv, recvmsg};

impl RecvTrace for KSock {
    type Enter = u64;

    fn enter(&self, peek: bool) -> Option<u64> {
        let enter = (tracepoint::on() && !peek).then(|| self.tr.recv_enter());
        if !peek {
            self.tr.rx_enter();
        }
        enter
    }

    fn stamp(&self, ns: u64) {
        tracepoint::note_rx_stamp(0, ns);
    }

    fn received(&self, enter: u64, fd: c_int, src: Option<SocketAddr>) {
        // Taken after the read, not around it: a receive may block, and a
        // second thread's receive (with its own SO_RCVTIMEO) must not wait
        // behind it. Arrival indices then follow the order in which the
        // reads return.
        let _g = self.recv.lock().unwrap_or_else(|e| e.into_inner());
        self.tr.rx_push(0, 1);
        self.tr.pop();
        self.tr.recv_return(enter);
        inside(|| self.tr.note_addrs(SIDE_RECV, || (local_addr(fd), src)));
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
    k.tr.sys_enter(true);
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
