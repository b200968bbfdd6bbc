//! The C ABI of the asynchronous receiver (`eudp_async_recv_*` in
//! `eudp.h`; the design is `docs/async.md`).
//!
//! Datagrams are lent in place: [`eudp_async_recv_next`] hands out
//! pointers into the receiver's buffers, which stay valid and unchanged
//! until the caller gives each back with [`eudp_async_recv_release`].

use crate::async_udp::socket_addr;
use crate::wait_turn::Waiters;
use crate::{addr, address_to, code, free_handle, guard, FOREVER};
use eudp_engine::async_udp::{AsyncReceiver, RecvConfig, RxLease};
use eudp_engine::sys::sync::lock;
use libc::{c_int, c_void, size_t, sockaddr, sockaddr_storage, socklen_t, ssize_t};
use libc::{EINVAL, ENOENT};
use std::collections::HashMap;
use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// [`eudp_async_rx_config::flags`]: take datagrams one by one (no `UDP_GRO`).
pub const EUDP_ASYNC_RX_NO_GRO: u32 = 1;
/// [`eudp_async_rx_datagram::flags`]: the datagram did not fit the buffer.
pub const EUDP_ASYNC_RX_TRUNCATED: u32 = 1;

/// Knobs of a receiver; a zero field takes the default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct eudp_async_rx_config {
    /// Buffers in the ring, rounded up to a power of two (default 64).
    pub buffers: u32,
    /// Bytes per buffer, headers included (default 64 KiB + 512).
    pub buffer_size: u32,
    /// `EUDP_ASYNC_RX_*` flags.
    pub flags: u32,
    pub reserved: u32,
}

/// One received buffer, lent to the caller until released.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct eudp_async_rx_datagram {
    /// The payload in place: one datagram, or a GRO run's datagrams back
    /// to back, each `segment` bytes but the last.
    pub data: *const c_void,
    pub len: size_t,
    /// The segment size of a GRO run; 0 for a lone datagram.
    pub segment: u32,
    /// `EUDP_ASYNC_RX_TRUNCATED`.
    pub flags: u32,
    /// Give it to [`eudp_async_recv_release`].
    pub lease: u64,
    pub src: sockaddr_storage,
    pub srclen: socklen_t,
    pub reserved: u32,
}

struct Inner {
    rx: AsyncReceiver,
    lent: HashMap<u64, RxLease>,
    next_lease: u64,
}

/// A receiver handle (opaque in C).
pub struct eudp_async_rx {
    inner: Mutex<Inner>,
    fd: c_int,
    v6: bool,
    waiters: Waiters,
}

/// # Safety
/// `h` is null or a live handle from [`eudp_async_recv_open`].
unsafe fn handle<'a>(h: *mut eudp_async_rx) -> Result<&'a eudp_async_rx, c_int> {
    // SAFETY: caller guarantee; null is rejected by `as_ref`.
    unsafe { h.as_ref() }.ok_or(EINVAL)
}

/// Opens a receiver bound to `addr` with its receive armed.
///
/// # Safety
/// `addr` is null or readable for `addrlen` bytes; `cfg` null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_open(
    addr: *const sockaddr,
    addrlen: socklen_t,
    cfg: *const eudp_async_rx_config,
) -> *mut eudp_async_rx {
    guard(std::ptr::null_mut(), || {
        // SAFETY: caller guarantee.
        let local = unsafe { socket_addr(addr, addrlen, addr::Op::Bind) }?;
        // SAFETY: null or valid for reads (caller); unaligned-tolerant.
        let c = if cfg.is_null() { eudp_async_rx_config::default() } else { unsafe { cfg.read_unaligned() } };
        let d = RecvConfig::default();
        let buffers = if c.buffers == 0 { d.buffers } else { u16::try_from(c.buffers).map_err(|_| EINVAL)? };
        let cfg = RecvConfig {
            buffers,
            buffer_size: if c.buffer_size == 0 { d.buffer_size } else { c.buffer_size as usize },
            gro: c.flags & EUDP_ASYNC_RX_NO_GRO == 0,
        };
        let sock = UdpSocket::bind(local).map_err(code)?;
        let rx = AsyncReceiver::new(sock, cfg).map_err(code)?;
        let fd = rx.ready_fd();
        let inner = Inner { rx, lent: HashMap::new(), next_lease: 1 };
        Ok(Box::into_raw(Box::new(eudp_async_rx {
            inner: Mutex::new(inner),
            fd,
            v6: local.is_ipv6(),
            waiters: Waiters::default(),
        })))
    })
}

/// Frees the receiver; pointers of datagrams not released are invalid
/// afterwards.
///
/// # Safety
/// `h` is null or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_close(h: *mut eudp_async_rx) -> c_int {
    // SAFETY: `h` came from `eudp_async_recv_open` and is given back (caller).
    guard(-1, || unsafe { free_handle(h) })
}

/// The bound address, `getsockname` semantics.
///
/// # Safety
/// `h` is null or a live handle; `addr` is null or writable for
/// `*addrlen` bytes; `addrlen` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_local_addr(
    h: *mut eudp_async_rx,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees.
        let r = unsafe { handle(h) }?;
        // SAFETY: as above.
        unsafe { address_to(addr, addrlen, r.v6, || lock(&r.inner).rx.socket().local_addr().map_err(code)) }
    })
}

/// Arms the receive unless it is armed. Opening arms it; it ends when the
/// caller holds every buffer and is armed again by the release that gives
/// one back, so this is for callers that want to be sure before they poll.
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_arm(h: *mut eudp_async_rx) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let r = unsafe { handle(h) }?;
        lock(&r.inner).rx.arm().map_err(code)?;
        Ok(0)
    })
}

/// Lends up to `max` received buffers, waiting up to `timeout_ms` (-1:
/// forever, 0: not at all) for the first; returns how many (0: none in
/// time). The wait holds no lock.
///
/// # Safety
/// `h` is null or a live handle; `out` is null or writable for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_next(
    h: *mut eudp_async_rx,
    out: *mut eudp_async_rx_datagram,
    max: size_t,
    timeout_ms: c_int,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let r = unsafe { handle(h) }?;
        if max == 0 {
            return Ok(0);
        }
        if out.is_null() {
            return Err(EINVAL);
        }
        let t = match timeout_ms {
            -1 => FOREVER,
            v if v < 0 => return Err(EINVAL),
            v => Duration::from_millis(v as u64),
        };
        let deadline = Instant::now() + t;
        let take = || {
            let mut g = lock(&r.inner);
            let inner = &mut *g;
            let mut got = Vec::new();
            let n = inner.rx.recv(&mut got, max, Some(Duration::ZERO)).map_err(code)?;
            for (i, l) in got.into_iter().enumerate() {
                let d = describe(inner, l, r.v6);
                // SAFETY: i < max entries writable at `out` (caller).
                unsafe { out.add(i).write_unaligned(d) };
            }
            Ok((n > 0).then_some(n))
        };
        Ok(r.waiters.wait(r.fd, deadline, take)?.unwrap_or(0) as ssize_t)
    })
}

/// Records `l` as lent and describes it for C.
fn describe(inner: &mut Inner, l: RxLease, v6: bool) -> eudp_async_rx_datagram {
    let lease = inner.next_lease;
    inner.next_lease += 1;
    let payload = inner.rx.payload(&l);
    // SAFETY: sockaddr_storage is plain data; all-zero is a valid value.
    let mut d = eudp_async_rx_datagram {
        data: payload.as_ptr().cast(),
        len: payload.len(),
        segment: l.gro_segment().map_or(0, |s| s as u32),
        flags: if l.truncated() { EUDP_ASYNC_RX_TRUNCATED } else { 0 },
        lease,
        src: unsafe { std::mem::zeroed() },
        srclen: 0,
        reserved: 0,
    };
    if let Some(a) = l.src() {
        let (ss, len) = addr::to_storage(a, v6);
        d.src = ss;
        d.srclen = len;
    }
    inner.lent.insert(lease, l);
    d
}

/// Gives a lent buffer back; its pointer is invalid afterwards. -1 with
/// `ENOENT` for a lease not lent (or released already).
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_release(h: *mut eudp_async_rx, lease: u64) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let r = unsafe { handle(h) }?;
        let mut g = lock(&r.inner);
        let l = g.lent.remove(&lease).ok_or(ENOENT)?;
        g.rx.release(l).map_err(code)?;
        Ok(0)
    })
}

/// A descriptor readable while received datagrams wait (the receive armed).
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_recv_fd(h: *mut eudp_async_rx) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        Ok(unsafe { handle(h) }?.fd)
    })
}
