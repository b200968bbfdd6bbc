//! The C ABI of EMP, reliable tagged messages over UDP (`eudp_emp_*` in
//! `eudp.h`; the protocol is `docs/emp.md`).
//!
//! A receive is posted with the caller's buffer, which the engine writes
//! each frame's bytes into as it arrives (no second copy). This layer posts
//! each receive under a context of its own, so that several receives may
//! share the caller's context, and remembers the caller's context, buffer
//! and capacity under it for the completion. After the completion is read
//! the library never touches the buffer again, so the buffer belongs to
//! the library exactly from `eudp_emp_trecv` until its completion is
//! returned (or the endpoint is closed).

use crate::{addr, address_to, code, free_handle, guard, in_bytes, ms, FOREVER};
use eudp_engine::emp::{Completion, EmpConfig, EmpCounters, EmpEndpoint, Op, PeerId, RecvBuffer, Status};
use eudp_engine::sys::sync::lock;
use eudp_engine::sys::user_buffer::UserBuffer;
use libc::{c_int, c_void, size_t, sockaddr, sockaddr_storage, socklen_t, ssize_t};
use libc::{AF_INET6, EAGAIN, ECANCELED, EINVAL, EMSGSIZE, ENOENT, ENOSPC, ESHUTDOWN, ETIMEDOUT};
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// "Any peer" for receives and counters; never a peer id.
pub const EUDP_EMP_ANY_PEER: u32 = u32::MAX;
/// [`eudp_emp_completion::op`] of a send.
pub const EUDP_EMP_OP_SEND: c_int = 1;
/// [`eudp_emp_completion::op`] of a receive.
pub const EUDP_EMP_OP_RECV: c_int = 2;
/// [`eudp_emp_completion::flags`]: the message was longer than the
/// receive's buffer; `len` bytes of its `full_len` landed.
pub const EUDP_EMP_TRUNCATED: u32 = 1;
/// Largest message, in bytes.
pub const EUDP_EMP_MAX_MESSAGE: usize = eudp_wire::emp::MAX_MESSAGE as usize;

/// Knobs of an endpoint; a zero field takes the default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct eudp_emp_config {
    pub frame_payload: u32,
    pub ack_group: u32,
    pub window: u32,
    pub rto_initial_us: u32,
    pub rto_max_us: u32,
    pub deadline_ms: u32,
    pub send_queue_bytes: u64,
    pub unexpected_messages: u64,
    pub unexpected_bytes: u64,
    pub socket_buffer: u64,
    pub poll_spin_us: u32,
    /// Delay of the acknowledgment of a message's last frame, waiting for
    /// a reverse data frame to carry it; [`EUDP_EMP_ACK_NOW`]: none.
    pub ack_delay_us: u32,
}

/// [`eudp_emp_config::ack_delay_us`]: acknowledge at once.
pub const EUDP_EMP_ACK_NOW: u32 = u32::MAX;

impl eudp_emp_config {
    fn to_config(self) -> EmpConfig {
        let mut c = EmpConfig::default();
        let us = |v: u32| Duration::from_micros(u64::from(v));
        if self.frame_payload > 0 {
            c.frame_payload = self.frame_payload as usize;
        }
        if self.ack_group > 0 {
            c.ack_group = self.ack_group;
        }
        if self.window > 0 {
            c.window = self.window;
        }
        if self.rto_initial_us > 0 {
            c.rto_initial = us(self.rto_initial_us);
        }
        if self.rto_max_us > 0 {
            c.rto_max = us(self.rto_max_us);
        }
        if self.deadline_ms > 0 {
            c.deadline = Duration::from_millis(u64::from(self.deadline_ms));
        }
        if self.send_queue_bytes > 0 {
            c.send_queue_bytes = usize::try_from(self.send_queue_bytes).unwrap_or(usize::MAX);
        }
        c.unexpected_messages = usize::try_from(self.unexpected_messages).unwrap_or(usize::MAX);
        c.unexpected_bytes = usize::try_from(self.unexpected_bytes).unwrap_or(usize::MAX);
        if self.socket_buffer > 0 {
            c.socket_buffer = usize::try_from(self.socket_buffer).unwrap_or(usize::MAX);
        }
        c.poll_spin = us(self.poll_spin_us);
        match self.ack_delay_us {
            0 => {}
            EUDP_EMP_ACK_NOW => c.ack_delay = Duration::ZERO,
            d => c.ack_delay = us(d),
        }
        c
    }
}

/// One finished send or receive.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct eudp_emp_completion {
    pub context: u64,
    pub tag: u64,
    /// A receive's buffer (null for a send).
    pub buf: *mut c_void,
    /// Bytes sent, or bytes copied into `buf`.
    pub len: size_t,
    /// The message's length (> `len`: truncated).
    pub full_len: size_t,
    /// Peer sent to or received from; `EUDP_EMP_ANY_PEER` when none.
    pub peer: u32,
    pub op: c_int,
    /// 0, or an errno value saying how the operation failed.
    pub status: c_int,
    /// [`EUDP_EMP_TRUNCATED`] or 0.
    pub flags: u32,
}

/// Mirror of [`EmpCounters`]; see `eudp.h` for the fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct eudp_emp_counters {
    pub frames_sent: u64,
    pub frames_received: u64,
    pub retransmits: u64,
    pub acks_sent: u64,
    pub acks_received: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub unmatched: u64,
    pub unexpected: u64,
    pub truncated: u64,
    pub stale: u64,
    pub timeouts: u64,
    pub give_ups: u64,
    pub messages_sent: u64,
    pub messages_failed: u64,
    pub messages_received: u64,
    pub malformed: u64,
    pub unknown_peer: u64,
    pub go_backs: u64,
    pub held: u64,
    pub acks_piggybacked: u64,
}

impl From<&EmpCounters> for eudp_emp_counters {
    fn from(c: &EmpCounters) -> Self {
        eudp_emp_counters {
            frames_sent: c.frames_sent,
            frames_received: c.frames_received,
            retransmits: c.retransmits,
            acks_sent: c.acks_sent,
            acks_received: c.acks_received,
            naks_sent: c.naks_sent,
            naks_received: c.naks_received,
            duplicates: c.duplicates,
            gaps: c.gaps,
            unmatched: c.unmatched,
            unexpected: c.unexpected,
            truncated: c.truncated,
            stale: c.stale,
            timeouts: c.timeouts,
            give_ups: c.give_ups,
            messages_sent: c.messages_sent,
            messages_failed: c.messages_failed,
            messages_received: c.messages_received,
            malformed: c.malformed,
            unknown_peer: c.unknown_peer,
            go_backs: c.go_backs,
            held: c.held,
            acks_piggybacked: c.acks_piggybacked,
        }
    }
}

/// A posted receive as the caller gave it.
#[derive(Debug)]
struct Posted {
    context: u64,
    /// The caller's buffer, as an address (the engine writes it through
    /// the receive's [`UserBuffer`]).
    buf: usize,
    cap: usize,
}

/// An EMP endpoint handle (opaque in C).
#[derive(Debug)]
pub struct eudp_emp {
    ep: EmpEndpoint,
    v6: bool,
    /// Posted receives by the context this layer gave the engine.
    posted: Mutex<HashMap<u64, Posted>>,
    next_id: AtomicU64,
}

// The C contract lets several threads use one handle at once.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<eudp_emp>();
};

fn status(s: Status) -> c_int {
    match s {
        Status::Ok => 0,
        Status::TimedOut => ETIMEDOUT,
        Status::Truncated | Status::TooLong => EMSGSIZE,
        Status::Canceled => ECANCELED,
        Status::Closed => ESHUTDOWN,
    }
}

/// The errno for an EMP endpoint error.
fn emp_code(e: io::Error) -> c_int {
    match e.kind() {
        io::ErrorKind::NotFound => ENOENT,
        io::ErrorKind::BrokenPipe => ESHUTDOWN,
        _ => code(e),
    }
}

fn peer_arg(peer: u32) -> Option<PeerId> {
    (peer != EUDP_EMP_ANY_PEER).then_some(PeerId(peer))
}

/// # Safety
/// `ep` is null or a live handle from [`eudp_emp_open`].
unsafe fn emp<'a>(ep: *const eudp_emp) -> Result<&'a eudp_emp, c_int> {
    // SAFETY: caller guarantee; null is rejected by `as_ref`.
    unsafe { ep.as_ref() }.ok_or(EINVAL)
}

impl eudp_emp {
    /// A caller's peer address of either family (the engine's address
    /// vector puts it in the endpoint's: `a.b.c.d` and `::ffff:a.b.c.d`
    /// name one peer).
    ///
    /// # Safety
    /// `addr` is null or readable for `len` bytes.
    unsafe fn peer_addr_in(&self, addr: *const sockaddr, len: socklen_t) -> Result<SocketAddr, c_int> {
        if addr.is_null() {
            return Err(EINVAL);
        }
        // SAFETY: non-null, `len` readable bytes (caller).
        match unsafe { addr::parse(addr, len, true, addr::Op::Connect) }? {
            addr::Parsed::Addr(a) => Ok(a),
            addr::Parsed::Unspec => Err(libc::EAFNOSUPPORT),
        }
    }

    /// The C form of a completion; a receive's bytes go to its buffer.
    fn deliver(&self, c: Completion) -> eudp_emp_completion {
        let mut out = eudp_emp_completion {
            context: c.context,
            tag: c.tag,
            buf: std::ptr::null_mut(),
            len: 0,
            full_len: c.len,
            peer: c.peer.map_or(EUDP_EMP_ANY_PEER, |p| p.0),
            op: EUDP_EMP_OP_SEND,
            status: status(c.status),
            flags: 0,
        };
        if c.op == Op::Send {
            out.len = if c.status == Status::Ok { c.len } else { 0 };
            return out;
        }
        out.op = EUDP_EMP_OP_RECV;
        let Some(p) = lock(&self.posted).remove(&c.context) else {
            return out;
        };
        out.context = p.context;
        out.buf = p.buf as *mut c_void;
        // The bytes are in the buffer already: the engine placed them.
        if matches!(c.status, Status::Ok | Status::Truncated) {
            out.len = c.len.min(p.cap);
        }
        if c.status == Status::Truncated {
            out.flags = EUDP_EMP_TRUNCATED;
        }
        out
    }
}

/// Opens an endpoint bound to `addr`; `cfg` null takes the defaults.
///
/// # Safety
/// `addr` is null or readable for `addrlen` bytes; `cfg` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_open(
    addr: *const sockaddr,
    addrlen: socklen_t,
    cfg: *const eudp_emp_config,
) -> *mut eudp_emp {
    guard(std::ptr::null_mut(), || {
        if addr.is_null() || (addrlen as usize) < std::mem::size_of::<libc::sa_family_t>() {
            return Err(EINVAL);
        }
        // SAFETY: non-null and the family's bytes are readable (caller);
        // read unaligned, as `addr::parse` copies bytes.
        let family = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sa_family_t>()) };
        let v6 = c_int::from(family) == AF_INET6;
        // SAFETY: `addrlen` readable bytes at `addr` (caller).
        let local = match unsafe { addr::parse(addr, addrlen, v6, addr::Op::Bind) }? {
            addr::Parsed::Addr(a) => a,
            addr::Parsed::Unspec => return Err(libc::EAFNOSUPPORT),
        };
        // SAFETY: null or valid for reads (caller); unaligned-tolerant.
        let c = if cfg.is_null() { eudp_emp_config::default() } else { unsafe { cfg.read_unaligned() } };
        let ep = EmpEndpoint::bind(local, c.to_config()).map_err(code)?;
        let h = eudp_emp { ep, v6, posted: Mutex::new(HashMap::new()), next_id: AtomicU64::new(0) };
        Ok(Box::into_raw(Box::new(h)))
    })
}

/// Stops the endpoint and frees it; unread completions are discarded.
///
/// # Safety
/// `ep` is null or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_close(ep: *mut eudp_emp) -> c_int {
    // SAFETY: `ep` came from `eudp_emp_open` and is given back (caller).
    guard(-1, || unsafe { free_handle(ep) })
}

/// The bound address, `getsockname` semantics.
///
/// # Safety
/// `ep` is null or a live handle; `addr` is null or writable for
/// `*addrlen` bytes; `addrlen` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_local_addr(
    ep: *mut eudp_emp,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees.
        let h = unsafe { emp(ep) }?;
        // SAFETY: as above.
        unsafe { address_to(addr, addrlen, h.v6, || Ok(h.ep.local_addr())) }
    })
}

/// Adds a peer to the address vector; returns its id.
///
/// # Safety
/// `ep` is null or a live handle; `addr` is null or readable for `addrlen`.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_av_insert(ep: *mut eudp_emp, addr: *const sockaddr, addrlen: socklen_t) -> i64 {
    guard(-1, || {
        // SAFETY: caller guarantees.
        let h = unsafe { emp(ep) }?;
        // SAFETY: as above.
        let a = unsafe { h.peer_addr_in(addr, addrlen) }?;
        // Only an IPv6 address on an IPv4 endpoint is refused.
        let peer = h.ep.try_insert(a).map_err(|_| libc::EAFNOSUPPORT)?;
        if peer.0 == EUDP_EMP_ANY_PEER {
            h.ep.remove(peer);
            return Err(ENOSPC);
        }
        Ok(i64::from(peer.0))
    })
}

/// Removes a peer from the address vector.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_av_remove(ep: *mut eudp_emp, peer: u32) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if h.ep.remove(PeerId(peer)) {
            Ok(0)
        } else {
            Err(ENOENT)
        }
    })
}

/// Sends a tagged message (copied before the call returns).
///
/// # Safety
/// `ep` is null or a live handle; `buf` is null or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_tsend(
    ep: *mut eudp_emp,
    peer: u32,
    tag: u64,
    buf: *const c_void,
    len: size_t,
    context: u64,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if len > EUDP_EMP_MAX_MESSAGE {
            return Err(EMSGSIZE);
        }
        // SAFETY: `len` readable bytes at `buf` (caller).
        let data = unsafe { in_bytes(buf, len) }?;
        h.ep.send(PeerId(peer), tag, data, context).map_err(emp_code)?;
        Ok(0)
    })
}

/// Pre-posts a tagged receive into the caller's buffer.
///
/// # Safety
/// `ep` is null or a live handle; `buf` is null or writable for `cap`
/// bytes, and stays so, untouched by the caller, until the receive's
/// completion is read (or the endpoint is closed).
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_trecv(
    ep: *mut eudp_emp,
    peer: u32,
    tag: u64,
    ignore: u64,
    buf: *mut c_void,
    cap: size_t,
    context: u64,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if (cap > 0 && buf.is_null()) || cap > isize::MAX as usize {
            return Err(EINVAL);
        }
        let source = peer_arg(peer);
        if source.is_some_and(|p| h.ep.peer_addr(p).is_none()) {
            return Err(ENOENT);
        }
        // SAFETY: `buf` is writable for `cap` bytes and the library's until
        // the receive's completion is returned or the endpoint closed (the
        // caller's contract above); the engine drops the `UserBuffer` by
        // then, with the completion or at shutdown.
        let user = unsafe { UserBuffer::new(buf.cast::<u8>(), cap) }.ok_or(EINVAL)?;
        let id = h.next_id.fetch_add(1, Relaxed);
        // Recorded before posting: the completion may be read at once.
        lock(&h.posted).insert(id, Posted { context, buf: buf as usize, cap });
        if let Err(e) = h.ep.recv_buffer(source, tag, ignore, RecvBuffer::User(user), id) {
            lock(&h.posted).remove(&id);
            return Err(emp_code(e));
        }
        Ok(0)
    })
}

/// Cancels the posted receives with the caller's `context`.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_cancel(ep: *mut eudp_emp, context: u64) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        let ids: Vec<u64> = lock(&h.posted).iter().filter(|(_, p)| p.context == context).map(|(&id, _)| id).collect();
        if ids.is_empty() {
            return Err(ENOENT);
        }
        for id in ids {
            h.ep.cancel(id);
        }
        Ok(0)
    })
}

/// Reads up to `max` completions without waiting; returns how many.
///
/// # Safety
/// `ep` is null or a live handle; `out` is null or writable for `max`
/// entries.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_cq_read(ep: *mut eudp_emp, out: *mut eudp_emp_completion, max: size_t) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if max == 0 {
            return Ok(0);
        }
        if out.is_null() || max > isize::MAX as usize / std::mem::size_of::<eudp_emp_completion>() {
            return Err(EINVAL);
        }
        let mut n = 0;
        while n < max {
            let Some(c) = h.ep.poll() else { break };
            let done = h.deliver(c);
            // SAFETY: `n < max` entries writable at `out` (caller).
            unsafe { out.add(n).write_unaligned(done) };
            n += 1;
        }
        Ok(n as ssize_t)
    })
}

/// Waits up to `timeout_ms` (-1: no limit) for one completion.
///
/// # Safety
/// `ep` is null or a live handle; `out` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_cq_wait(
    ep: *mut eudp_emp,
    out: *mut eudp_emp_completion,
    timeout_ms: c_int,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let limit = ms(timeout_ms)?;
        let start = Instant::now();
        match h.ep.wait(limit) {
            Some(c) => {
                let done = h.deliver(c);
                // SAFETY: non-null and valid for writes (caller).
                unsafe { out.write_unaligned(done) };
                Ok(1)
            }
            // Without a completion before the limit, the endpoint stopped.
            None if start.elapsed() < limit.unwrap_or(FOREVER) => Err(ESHUTDOWN),
            None if timeout_ms == 0 => Err(EAGAIN),
            None => Err(ETIMEDOUT),
        }
    })
}

/// A descriptor readable while completions are pending.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_cq_fd(ep: *mut eudp_emp) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        Ok(unsafe { emp(ep) }?.ep.as_raw_fd())
    })
}

/// Copies the counters of one peer (or, with `EUDP_EMP_ANY_PEER`, of the
/// whole endpoint) into `out`.
///
/// # Safety
/// `ep` is null or a live handle; `out` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn eudp_emp_counters(ep: *mut eudp_emp, peer: u32, out: *mut eudp_emp_counters) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { emp(ep) }?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let c = match peer_arg(peer) {
            None => h.ep.counters(),
            Some(p) => h.ep.peer_counters(p).ok_or(ENOENT)?,
        };
        // SAFETY: non-null and valid for writes (caller); unaligned-tolerant.
        unsafe { out.write_unaligned(eudp_emp_counters::from(&c)) };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_config_is_the_default() {
        let d = EmpConfig::default();
        let c = eudp_emp_config::default().to_config();
        assert_eq!((c.window, c.ack_group, c.deadline, c.unexpected_messages), (d.window, d.ack_group, d.deadline, 0));
        let c = eudp_emp_config { deadline_ms: 200, window: 8, ..Default::default() }.to_config();
        assert_eq!((c.deadline, c.window), (Duration::from_millis(200), 8));
    }

    #[test]
    fn statuses_are_errno_values() {
        assert_eq!(status(Status::Ok), 0);
        assert_eq!(status(Status::TimedOut), ETIMEDOUT);
        assert_eq!(status(Status::Canceled), ECANCELED);
        assert_eq!(status(Status::Truncated), EMSGSIZE);
        assert_eq!(status(Status::Closed), ESHUTDOWN);
    }
}
