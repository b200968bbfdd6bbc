//! C ABI for the eudp engine; the header is `include/eudp.h` and the guide
//! `docs/capi.md`.
//!
//! Conventions, as for socket calls: functions return `-1` (or `NULL`) and
//! set `errno` on failure, with the value the kernel would set on an
//! equivalent UDP socket. A null pointer or an impossible length is
//! `EINVAL`. No Rust panic crosses the boundary: one is reported as `EIO`.
//!
//! An `eudp_endpoint` may be used from several threads at once (like a
//! socket), but [`eudp_close`] must not race with other calls on it.
//!
//! All `unsafe` of the C ABI is in this crate: dereferencing the caller's
//! pointers here, in [`addr`], in [`emp`] (EMP's tagged messages), in
//! [`async_udp`] (sends from the caller's buffers with completions), in
//! [`async_recv`] (received datagrams lent in place), and `errno`.
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

mod addr;
pub mod async_recv;
pub mod async_udp;
pub mod emp;
mod wait_turn;

pub use async_recv::*;
pub use async_udp::*;
pub use emp::*;

use addr::{Op, Parsed};
use eudp_engine::{Endpoint, Received, RecvFlags, StatsSnapshot};
use libc::{c_int, c_void, size_t, sockaddr, sockaddr_storage, socklen_t, ssize_t};
use libc::{AF_INET, AF_INET6, EAFNOSUPPORT, EAGAIN, EINVAL, EIO, EMSGSIZE, EOPNOTSUPP, ETIMEDOUT};
use std::io;
use std::net::SocketAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::time::Duration;

/// Leave the datagram queued (`MSG_PEEK`).
pub const EUDP_MSG_PEEK: c_int = libc::MSG_PEEK;
/// Return the full datagram length even when truncated (`MSG_TRUNC`); in
/// [`eudp_rxmsg::flags`]: the datagram was truncated.
pub const EUDP_MSG_TRUNC: c_int = libc::MSG_TRUNC;
/// Do not block for this call (`MSG_DONTWAIT`).
pub const EUDP_MSG_DONTWAIT: c_int = libc::MSG_DONTWAIT;
/// Buckets of [`eudp_stats::batch_hist`].
pub const EUDP_HIST_BUCKETS: usize = 10;
const _: () = assert!(eudp_engine::stats::HIST_BUCKETS == EUDP_HIST_BUCKETS);

/// Largest UDP payload over IPv4 and over IPv6 (as `eudp_wire::limits`).
const MAX_PAYLOAD_V4: usize = 65_507;
const MAX_PAYLOAD_V6: usize = 65_527;
/// "Forever" for waits given in milliseconds (-1).
const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// An endpoint handle (opaque in C).
#[derive(Debug)]
pub struct eudp_endpoint {
    ep: Endpoint,
    v6: bool,
    /// The connected peer is reached over IPv4 (limits payload to 65507).
    peer_v4: AtomicBool,
    /// An error met after a batch call had already made progress; reported
    /// by the next send or receive call, as the kernel keeps `sk_err`.
    deferred: AtomicI32,
}

// The C contract lets several threads use one handle at once.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<eudp_endpoint>();
};

/// One datagram to send with [`eudp_send_batch`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct eudp_txmsg {
    pub buf: *const c_void,
    pub len: size_t,
    /// Destination, or null on a connected endpoint.
    pub addr: *const sockaddr,
    pub addrlen: socklen_t,
}

/// One datagram received by [`eudp_recvmsg`] / [`eudp_recv_batch`].
#[repr(C)]
pub struct eudp_rxmsg {
    /// In: where to copy the payload, and its capacity.
    pub buf: *mut c_void,
    pub cap: size_t,
    /// Out: bytes copied, and the datagram's full length.
    pub len: size_t,
    pub full_len: size_t,
    /// Out: sender, and its length.
    pub addr: sockaddr_storage,
    pub addrlen: socklen_t,
    /// Out: `EUDP_MSG_TRUNC` when `full_len > len`.
    pub flags: c_int,
}

/// Mirror of [`StatsSnapshot`]; see `eudp.h` for the fields.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct eudp_stats {
    pub direct_posts: u64,
    pub queued_posts: u64,
    pub send_full: u64,
    pub engine_batches: u64,
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    pub send_calls: u64,
    pub gso_messages: u64,
    pub send_calls_per_datagram: f64,
    pub batch_hist: [u64; EUDP_HIST_BUCKETS],
    pub drop_send_error: u64,
    pub drop_shutdown: u64,
    pub gso_fallbacks: u64,
    pub datagrams_received: u64,
    pub bytes_received: u64,
    pub recv_calls: u64,
    pub gro_superpackets: u64,
    pub direct_recv_calls: u64,
    pub drop_ring_full: u64,
    pub drop_truncated: u64,
    pub errors_surfaced: u64,
}

impl From<&StatsSnapshot> for eudp_stats {
    fn from(s: &StatsSnapshot) -> Self {
        eudp_stats {
            direct_posts: s.direct_posts,
            queued_posts: s.queued_posts,
            send_full: s.send_full,
            engine_batches: s.engine_batches,
            datagrams_sent: s.datagrams_sent,
            bytes_sent: s.bytes_sent,
            send_calls: s.send_calls,
            gso_messages: s.gso_messages,
            send_calls_per_datagram: s.send_calls_per_datagram,
            batch_hist: s.batch_hist,
            drop_send_error: s.drop_send_error,
            drop_shutdown: s.drop_shutdown,
            gso_fallbacks: s.gso_fallbacks,
            datagrams_received: s.datagrams_received,
            bytes_received: s.bytes_received,
            recv_calls: s.recv_calls,
            gro_superpackets: s.gro_superpackets,
            direct_recv_calls: s.direct_recv_calls,
            drop_ring_full: s.drop_ring_full,
            drop_truncated: s.drop_truncated,
            errors_surfaced: s.errors_surfaced,
        }
    }
}

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot,
    // valid and exclusively ours for the thread's lifetime.
    unsafe { *libc::__errno_location() = e };
}

/// The errno for an engine error.
fn code(e: io::Error) -> c_int {
    e.raw_os_error().unwrap_or(match e.kind() {
        io::ErrorKind::WouldBlock => EAGAIN,
        io::ErrorKind::TimedOut => ETIMEDOUT,
        io::ErrorKind::InvalidInput => EINVAL,
        _ => EIO,
    })
}

/// Runs `f`, turning `Err(errno)` and panics into `fail` with errno set.
fn guard<T>(fail: T, f: impl FnOnce() -> Result<T, c_int>) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_errno(e);
            fail
        }
        Err(_) => {
            set_errno(EIO);
            fail
        }
    }
}

/// # Safety
/// `ep` is null or a live handle from [`eudp_endpoint_new`].
unsafe fn handle<'a>(ep: *const eudp_endpoint) -> Result<&'a eudp_endpoint, c_int> {
    // SAFETY: caller guarantee; null is rejected by `as_ref`.
    unsafe { ep.as_ref() }.ok_or(EINVAL)
}

/// A caller's input buffer (null allowed when empty).
///
/// # Safety
/// `buf` is null or readable for `len` bytes, unmodified while borrowed.
unsafe fn in_bytes<'a>(buf: *const c_void, len: size_t) -> Result<&'a [u8], c_int> {
    if len == 0 {
        return Ok(&[]);
    }
    if buf.is_null() || len > isize::MAX as usize {
        return Err(EINVAL);
    }
    // SAFETY: non-null, `len` readable bytes (caller), len ≤ isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), len) })
}

/// A caller's output buffer (null allowed when empty).
///
/// # Safety
/// `buf` is null or writable for `len` bytes, not otherwise accessed while
/// borrowed.
unsafe fn out_bytes<'a>(buf: *mut c_void, len: size_t) -> Result<&'a mut [u8], c_int> {
    if len == 0 {
        return Ok(&mut []);
    }
    if buf.is_null() || len > isize::MAX as usize {
        return Err(EINVAL);
    }
    // SAFETY: non-null, `len` writable bytes (caller), len ≤ isize::MAX.
    Ok(unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) })
}

/// Frees a handle its `eudp_*_close` call gives back.
///
/// # Safety
/// `h` is null or came from `Box::into_raw` in its open call, and the
/// caller hands its ownership back here (no concurrent use).
unsafe fn free_handle<T>(h: *mut T) -> Result<c_int, c_int> {
    if h.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: a `Box::into_raw` pointer whose ownership the caller gives back.
    drop(unsafe { Box::from_raw(h) });
    Ok(0)
}

/// Writes the address `query` gives to the caller's `getsockname`-style
/// `(addr, addrlen)` pair, which is checked first (bad arguments fail
/// before the query).
///
/// # Safety
/// `addr` is null or writable for `*addrlen` bytes; `addrlen` is null or valid.
unsafe fn address_to(
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
    v6: bool,
    query: impl FnOnce() -> Result<SocketAddr, c_int>,
) -> Result<c_int, c_int> {
    // SAFETY: as the caller guarantees.
    unsafe { out_addr_ok(addr.cast(), addrlen) }?;
    let a = query()?;
    // SAFETY: checked non-null; `*addrlen` writable bytes (caller).
    unsafe { addr::write_out(a, v6, addr.cast(), addrlen) };
    Ok(0)
}

/// Validates a caller's `(addr, addrlen)` output pair (both non-null,
/// length not negative as an `int`).
///
/// # Safety
/// `len` is null or valid for reads.
unsafe fn out_addr_ok(addr: *mut c_void, len: *mut socklen_t) -> Result<(), c_int> {
    if addr.is_null() || len.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: non-null and valid (caller).
    if unsafe { *len } > i32::MAX as socklen_t {
        return Err(EINVAL);
    }
    Ok(())
}

/// Parses a caller's address.
///
/// # Safety
/// `addr` is null or readable for `len` bytes.
unsafe fn in_addr(h: &eudp_endpoint, addr: *const sockaddr, len: socklen_t, op: Op) -> Result<Parsed, c_int> {
    if addr.is_null() {
        return Err(EINVAL);
    }
    // SAFETY: non-null, `len` readable bytes (caller).
    unsafe { addr::parse(addr, len, h.v6, op) }
}

impl eudp_endpoint {
    fn take_deferred(&self) -> Result<(), c_int> {
        match self.deferred.swap(0, SeqCst) {
            0 => Ok(()),
            e => Err(e),
        }
    }

    fn max_payload(&self, dst: Option<&SocketAddr>) -> usize {
        let v4 = !self.v6 || dst.map_or_else(|| self.peer_v4.load(SeqCst), addr::is_v4_path);
        if v4 {
            MAX_PAYLOAD_V4
        } else {
            MAX_PAYLOAD_V6
        }
    }

    /// One datagram; `addr` null (or `AF_UNSPEC` on IPv6) means the peer.
    ///
    /// # Safety
    /// As [`eudp_sendto`].
    unsafe fn send_one(
        &self,
        buf: *const c_void,
        len: size_t,
        addr: *const sockaddr,
        addrlen: socklen_t,
    ) -> Result<usize, c_int> {
        let dst = if addr.is_null() {
            None
        } else {
            // SAFETY: non-null, `addrlen` readable bytes (caller).
            match unsafe { in_addr(self, addr, addrlen, Op::SendTo) }? {
                Parsed::Unspec => None,
                Parsed::Addr(a) => Some(a),
            }
        };
        if len > self.max_payload(dst.as_ref()) {
            return Err(EMSGSIZE);
        }
        // SAFETY: `len` readable bytes at `buf` (caller).
        let data = unsafe { in_bytes(buf, len) }?;
        match dst {
            Some(a) => self.ep.send_to(data, a),
            None => self.ep.send(data),
        }
        .map_err(code)
    }

    fn recv_into(&self, buf: &mut [u8], flags: c_int) -> Result<Received, c_int> {
        let f = RecvFlags {
            peek: flags & EUDP_MSG_PEEK != 0,
            dont_wait: flags & EUDP_MSG_DONTWAIT != 0,
            interruptible: false,
        };
        self.ep.recv_with(buf, f).map_err(code)
    }

    /// One receive into an [`eudp_rxmsg`] whose buffer was validated.
    ///
    /// # Safety
    /// `m.buf` is null or writable for `m.cap` bytes.
    unsafe fn recv_msg(&self, m: &mut eudp_rxmsg, flags: c_int) -> Result<(), c_int> {
        // SAFETY: caller guarantee.
        let buf = unsafe { out_bytes(m.buf, m.cap) }?;
        let r = self.recv_into(buf, flags)?;
        let (ss, len) = addr::to_storage(r.src, self.v6);
        m.len = r.copied;
        m.full_len = r.len;
        m.addr = ss;
        m.addrlen = len;
        m.flags = if r.len > r.copied { EUDP_MSG_TRUNC } else { 0 };
        Ok(())
    }
}

fn check_flags(flags: c_int, allowed: c_int) -> Result<(), c_int> {
    if flags & !allowed != 0 {
        Err(EOPNOTSUPP)
    } else {
        Ok(())
    }
}

fn ms(v: c_int) -> Result<Option<Duration>, c_int> {
    match v {
        -1 => Ok(None),
        v if v < 0 => Err(EINVAL),
        v => Ok(Some(Duration::from_millis(v as u64))),
    }
}

/// Creates an unbound endpoint on the process-wide engine (started on first
/// use). `family` is `AF_INET` or `AF_INET6` (dual-stack).
#[no_mangle]
pub extern "C" fn eudp_endpoint_new(family: c_int) -> *mut eudp_endpoint {
    guard(std::ptr::null_mut(), || {
        let v6 = match family {
            AF_INET => false,
            AF_INET6 => true,
            _ => return Err(EAFNOSUPPORT),
        };
        let ep = Endpoint::new(v6).map_err(code)?;
        let h = eudp_endpoint { ep, v6, peer_v4: AtomicBool::new(false), deferred: AtomicI32::new(0) };
        Ok(Box::into_raw(Box::new(h)))
    })
}

/// Flushes what was accepted (up to 5 s) and frees the endpoint.
///
/// # Safety
/// `ep` is null or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn eudp_close(ep: *mut eudp_endpoint) -> c_int {
    // SAFETY: `ep` came from `eudp_endpoint_new` and is given back (caller).
    guard(-1, || unsafe { free_handle(ep) })
}

/// Binds to a local address.
///
/// # Safety
/// `ep` is null or a live handle; `addr` is null or readable for `addrlen`.
#[no_mangle]
pub unsafe extern "C" fn eudp_bind(ep: *mut eudp_endpoint, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees for `ep` and `addr`.
        let h = unsafe { handle(ep) }?;
        // SAFETY: as above.
        match unsafe { in_addr(h, addr, addrlen, Op::Bind) }? {
            Parsed::Addr(a) => h.ep.bind_to(a).map_err(code)?,
            Parsed::Unspec => return Err(EAFNOSUPPORT),
        }
        Ok(0)
    })
}

/// Connects (sets the default peer); `AF_UNSPEC` disconnects.
///
/// # Safety
/// As [`eudp_bind`].
#[no_mangle]
pub unsafe extern "C" fn eudp_connect(ep: *mut eudp_endpoint, addr: *const sockaddr, addrlen: socklen_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees for `ep` and `addr`.
        let h = unsafe { handle(ep) }?;
        // SAFETY: as above.
        match unsafe { in_addr(h, addr, addrlen, Op::Connect) }? {
            Parsed::Addr(a) => {
                h.ep.connect(a).map_err(code)?;
                h.peer_v4.store(addr::is_v4_path(&a), SeqCst);
            }
            Parsed::Unspec => {
                h.ep.disconnect().map_err(code)?;
                h.peer_v4.store(false, SeqCst);
            }
        }
        Ok(0)
    })
}

/// Dissolves the association.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_disconnect(ep: *mut eudp_endpoint) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        h.ep.disconnect().map_err(code)?;
        h.peer_v4.store(false, SeqCst);
        Ok(0)
    })
}

/// Writes the address `query` returns to a caller's `(addr, *addrlen)`.
///
/// # Safety
/// As [`eudp_local_addr`].
unsafe fn address_out(
    ep: *mut eudp_endpoint,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
    query: fn(&Endpoint) -> io::Result<SocketAddr>,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees.
        let h = unsafe { handle(ep) }?;
        // SAFETY: as above.
        unsafe { address_to(addr, addrlen, h.v6, || query(&h.ep).map_err(code)) }
    })
}

/// Local address, `getsockname` semantics.
///
/// # Safety
/// `ep` is null or a live handle; `addr` is null or writable for `*addrlen`
/// bytes; `addrlen` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_local_addr(
    ep: *mut eudp_endpoint,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { address_out(ep, addr, addrlen, Endpoint::local_addr) }
}

/// Connected peer, `getpeername` semantics (`ENOTCONN` when not connected).
///
/// # Safety
/// As [`eudp_local_addr`].
#[no_mangle]
pub unsafe extern "C" fn eudp_peer_addr(
    ep: *mut eudp_endpoint,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
) -> c_int {
    // SAFETY: forwarded caller guarantees.
    unsafe { address_out(ep, addr, addrlen, Endpoint::peer_addr) }
}

/// Sends one datagram to the connected peer.
///
/// # Safety
/// `ep` is null or a live handle; `buf` is null or readable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_send(ep: *mut eudp_endpoint, buf: *const c_void, len: size_t) -> ssize_t {
    // SAFETY: forwarded caller guarantees; a null address means "the peer".
    unsafe { eudp_sendto(ep, buf, len, std::ptr::null(), 0) }
}

/// Sends one datagram to `addr` (null: the connected peer).
///
/// # Safety
/// As [`eudp_send`]; `addr` is null or readable for `addrlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_sendto(
    ep: *mut eudp_endpoint,
    buf: *const c_void,
    len: size_t,
    addr: *const sockaddr,
    addrlen: socklen_t,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        h.take_deferred()?;
        // SAFETY: caller guarantees for `buf` and `addr`.
        unsafe { h.send_one(buf, len, addr, addrlen) }.map(|n| n as ssize_t)
    })
}

/// Sends `n` datagrams; returns how many were accepted.
///
/// # Safety
/// `ep` is null or a live handle; `msgs` is null or points to `n` entries,
/// each valid as the arguments of [`eudp_sendto`].
#[no_mangle]
pub unsafe extern "C" fn eudp_send_batch(ep: *mut eudp_endpoint, msgs: *const eudp_txmsg, n: size_t) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        if n == 0 {
            return Ok(0);
        }
        if msgs.is_null() || n > isize::MAX as usize / std::mem::size_of::<eudp_txmsg>() {
            return Err(EINVAL);
        }
        // SAFETY: non-null, `n` entries (caller), total size ≤ isize::MAX.
        let items = unsafe { std::slice::from_raw_parts(msgs, n) };
        h.take_deferred()?;
        let surfaced = h.ep.stats().errors_surfaced;
        for (i, m) in items.iter().enumerate() {
            // SAFETY: each entry is valid as sendto arguments (caller).
            if let Err(e) = unsafe { h.send_one(m.buf, m.len, m.addr, m.addrlen) } {
                if i == 0 {
                    return Err(e);
                }
                // Progress was made: report the count. An error that was
                // consumed from the socket (asynchronous, like ICMP) would
                // be lost by a retry; keep it for the next call. Errors of
                // this message itself recur when the caller retries it.
                if e != EAGAIN && h.ep.stats().errors_surfaced > surfaced {
                    h.deferred.store(e, SeqCst);
                }
                return Ok(i as ssize_t);
            }
        }
        Ok(n as ssize_t)
    })
}

/// Receives one datagram (`recv` semantics).
///
/// # Safety
/// `ep` is null or a live handle; `buf` is null or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_recv(ep: *mut eudp_endpoint, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t {
    // SAFETY: forwarded caller guarantees; no address requested.
    unsafe { eudp_recvfrom(ep, buf, len, flags, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// Receives one datagram and its sender (`recvfrom` semantics).
///
/// # Safety
/// As [`eudp_recv`]; `addr` is null or writable for `*addrlen` bytes, and
/// `addrlen` valid when `addr` is non-null.
#[no_mangle]
pub unsafe extern "C" fn eudp_recvfrom(
    ep: *mut eudp_endpoint,
    buf: *mut c_void,
    len: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    addrlen: *mut socklen_t,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        check_flags(flags, EUDP_MSG_PEEK | EUDP_MSG_DONTWAIT | EUDP_MSG_TRUNC)?;
        // SAFETY: `len` writable bytes at `buf` (caller).
        let out = unsafe { out_bytes(buf, len) }?;
        if !addr.is_null() {
            // SAFETY: caller guarantee for `addrlen`.
            unsafe { out_addr_ok(addr.cast(), addrlen) }?;
        }
        h.take_deferred()?;
        let r = h.recv_into(out, flags)?;
        if !addr.is_null() {
            // SAFETY: checked above; `*addrlen` writable bytes (caller).
            unsafe { addr::write_out(r.src, h.v6, addr.cast(), addrlen) };
        }
        Ok(if flags & EUDP_MSG_TRUNC != 0 { r.len } else { r.copied } as ssize_t)
    })
}

/// Receives one datagram into `msg`, reporting truncation in `msg->flags`.
///
/// # Safety
/// `ep` is null or a live handle; `msg` is null or valid, with `msg->buf`
/// null or writable for `msg->cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_recvmsg(ep: *mut eudp_endpoint, msg: *mut eudp_rxmsg, flags: c_int) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        check_flags(flags, EUDP_MSG_PEEK | EUDP_MSG_DONTWAIT | EUDP_MSG_TRUNC)?;
        // SAFETY: null or valid, exclusively ours for the call (caller).
        let m = unsafe { msg.as_mut() }.ok_or(EINVAL)?;
        if m.cap > 0 && m.buf.is_null() {
            return Err(EINVAL);
        }
        h.take_deferred()?;
        // SAFETY: `m.cap` writable bytes at `m.buf` (caller).
        unsafe { h.recv_msg(m, flags) }?;
        Ok(if flags & EUDP_MSG_TRUNC != 0 { m.full_len } else { m.len } as ssize_t)
    })
}

/// Receives up to `n` datagrams: waits (per the endpoint's mode and
/// `flags`) for the first, then takes only what is already waiting.
///
/// # Safety
/// `ep` is null or a live handle; `msgs` is null or points to `n` valid
/// entries, each `buf` null or writable for its `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn eudp_recv_batch(
    ep: *mut eudp_endpoint,
    msgs: *mut eudp_rxmsg,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        if flags & EUDP_MSG_PEEK != 0 {
            return Err(EINVAL);
        }
        check_flags(flags, EUDP_MSG_DONTWAIT | EUDP_MSG_TRUNC)?;
        if n == 0 {
            return Ok(0);
        }
        if msgs.is_null() || n > isize::MAX as usize / std::mem::size_of::<eudp_rxmsg>() {
            return Err(EINVAL);
        }
        // SAFETY: non-null, `n` valid entries exclusively ours (caller).
        let items = unsafe { std::slice::from_raw_parts_mut(msgs, n) };
        if items.iter().any(|m| m.cap > 0 && m.buf.is_null()) {
            return Err(EINVAL);
        }
        h.take_deferred()?;
        for (i, m) in items.iter_mut().enumerate() {
            let f = if i == 0 { flags } else { flags | EUDP_MSG_DONTWAIT };
            // SAFETY: `m.cap` writable bytes at `m.buf` (caller).
            if let Err(e) = unsafe { h.recv_msg(m, f) } {
                if i == 0 {
                    return Err(e);
                }
                // As recvmmsg: an error after progress is kept for the next call.
                if e != EAGAIN {
                    h.deferred.store(e, SeqCst);
                }
                return Ok(i as ssize_t);
            }
        }
        Ok(n as ssize_t)
    })
}

/// Nonblocking mode on (`on != 0`) or off.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_set_nonblocking(ep: *mut eudp_endpoint, on: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        unsafe { handle(ep) }?.ep.set_nonblocking(on != 0);
        Ok(0)
    })
}

/// Receive and send timeouts in milliseconds; -1: none (wait forever).
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_set_timeouts(ep: *mut eudp_endpoint, recv_ms: c_int, send_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        let (r, s) = (ms(recv_ms)?, ms(send_ms)?);
        h.ep.set_read_timeout(r);
        h.ep.set_write_timeout(s);
        Ok(0)
    })
}

/// Sets SO_SNDBUF (and the L1 bound that follows it).
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_set_send_buffer_size(ep: *mut eudp_endpoint, bytes: size_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        unsafe { handle(ep) }?.ep.set_send_buffer_size(bytes).map_err(code)?;
        Ok(0)
    })
}

/// Sets SO_RCVBUF (and the receive ring's bound that follows it).
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_set_recv_buffer_size(ep: *mut eudp_endpoint, bytes: size_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        unsafe { handle(ep) }?.ep.set_recv_buffer_size(bytes).map_err(code)?;
        Ok(0)
    })
}

/// ICMP error reporting on an unconnected endpoint (IP_RECVERR).
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_set_recv_err(ep: *mut eudp_endpoint, on: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        unsafe { handle(ep) }?.ep.set_recv_err(on != 0).map_err(code)?;
        Ok(0)
    })
}

/// A file descriptor readable exactly while a datagram (or an error) waits.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_poll_fd(ep: *mut eudp_endpoint) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        unsafe { handle(ep) }?.ep.poll_fd().map_err(code)
    })
}

/// Datagrams waiting and the length of the next one (either pointer may be null).
///
/// # Safety
/// `ep` is null or a live handle; the out pointers are null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_pending(ep: *mut eudp_endpoint, datagrams: *mut size_t, next_len: *mut size_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        // SAFETY: null or valid for writes (caller).
        if let Some(d) = unsafe { datagrams.as_mut() } {
            *d = h.ep.pending_datagrams();
        }
        // SAFETY: as above.
        if let Some(l) = unsafe { next_len.as_mut() } {
            *l = h.ep.next_datagram_len();
        }
        Ok(0)
    })
}

/// Waits until everything accepted has been handed to the kernel.
///
/// # Safety
/// `ep` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_flush(ep: *mut eudp_endpoint, timeout_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        let t = ms(timeout_ms)?.unwrap_or(FOREVER);
        if h.ep.flush(t) {
            Ok(0)
        } else {
            Err(ETIMEDOUT)
        }
    })
}

/// Copies the endpoint's counters into `out`.
///
/// # Safety
/// `ep` is null or a live handle; `out` is null or valid for writes.
#[no_mangle]
pub unsafe extern "C" fn eudp_stats(ep: *mut eudp_endpoint, out: *mut eudp_stats) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let h = unsafe { handle(ep) }?;
        if out.is_null() {
            return Err(EINVAL);
        }
        let s = eudp_stats::from(&h.ep.stats());
        // SAFETY: non-null and valid for writes (caller); unaligned-tolerant.
        unsafe { out.write_unaligned(s) };
        Ok(0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_become_eio() {
        let r: c_int = guard(-1, || panic!("boom"));
        assert_eq!(r, -1);
        assert_eq!(io::Error::last_os_error().raw_os_error(), Some(EIO));
    }

    #[test]
    fn millis() {
        assert_eq!(ms(-1), Ok(None));
        assert_eq!(ms(0), Ok(Some(Duration::ZERO)));
        assert_eq!(ms(-2), Err(EINVAL));
    }
}
