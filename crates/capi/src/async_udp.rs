//! The C ABI of asynchronous UDP sends (`eudp_async_*` in `eudp.h`; the
//! design is `docs/async.md`).
//!
//! The caller's buffer is sent where it lies: the library keeps its
//! pointer, the kernel may read it after the send call returns, and the
//! buffer is the caller's again only when its completion has been read.

use crate::wait_turn::Waiters;
use crate::{addr, address_to, code, free_handle, guard, FOREVER};
use eudp_engine::async_udp::{AsyncConfig, AsyncSender, Completion, Datagram, Full, SendBuf, SendEngine};
use eudp_engine::sys::sync::lock;
use libc::{c_int, c_void, size_t, sockaddr, sockaddr_storage, socklen_t, ssize_t};
use libc::{AF_INET6, EAGAIN, EINVAL, EOPNOTSUPP};
use std::io;
use std::net::UdpSocket;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// [`eudp_async_config::flags`]: copy every send (no `MSG_ZEROCOPY`).
pub const EUDP_ASYNC_COPY: u32 = 1;
/// [`eudp_async_config::flags`]: send every datagram alone (no GSO runs).
pub const EUDP_ASYNC_NO_GSO: u32 = 2;
/// [`eudp_async_config::flags`]: send through io_uring `SEND_ZC` (and
/// `SENDMSG_ZC` for GSO runs) instead of `MSG_ZEROCOPY`.
pub const EUDP_ASYNC_URING: u32 = 4;
/// [`eudp_async_engine`]: every send copies.
pub const EUDP_ASYNC_ENGINE_COPY: c_int = 0;
/// [`eudp_async_engine`]: `sendmsg(MSG_ZEROCOPY)`.
pub const EUDP_ASYNC_ENGINE_MSG_ZEROCOPY: c_int = 1;
/// [`eudp_async_engine`]: io_uring `SEND_ZC` / `SENDMSG_ZC`.
pub const EUDP_ASYNC_ENGINE_URING: c_int = 2;
/// [`eudp_async_completion::flags`]: the kernel copied the payload.
pub const EUDP_ASYNC_COPIED: u32 = 1;

/// Knobs of a sender; a zero field takes the default.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct eudp_async_config {
    /// Most buffers the library holds at once (default 1024).
    pub max_in_flight: u32,
    /// `EUDP_ASYNC_*` flags.
    pub flags: u32,
}

/// One datagram for [`eudp_async_send`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct eudp_async_msg {
    pub buf: *const c_void,
    pub len: size_t,
    /// Destination, or null for the connected peer.
    pub addr: *const sockaddr,
    pub addrlen: socklen_t,
    pub token: u64,
}

/// The end of one datagram's send.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct eudp_async_completion {
    pub token: u64,
    /// The buffer given with the datagram; the caller's again.
    pub buf: *const c_void,
    /// Bytes sent, or `-errno` for a datagram the kernel refused.
    pub result: i64,
    /// `EUDP_ASYNC_COPIED` when the kernel copied the payload.
    pub flags: u32,
    pub reserved: u32,
}

/// A caller's buffer as the sender holds it: the pointer and length only.
struct CallerBuf {
    ptr: *const u8,
    len: usize,
}

// SAFETY: the caller's contract (`eudp_async_send`) is that the bytes stay
// valid and unmodified until the completion is read, on whatever thread.
unsafe impl Send for CallerBuf {}

impl SendBuf for CallerBuf {
    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: checked non-null with `len` readable bytes when queued;
        // the caller keeps them valid until the completion is read.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// `EOPNOTSUPP` for what this kernel lacks, else the error's errno.
fn unsupported_code(e: io::Error) -> c_int {
    if e.kind() == io::ErrorKind::Unsupported {
        EOPNOTSUPP
    } else {
        code(e)
    }
}

/// A sender handle (opaque in C).
pub struct eudp_async {
    sender: Mutex<AsyncSender<CallerBuf>>,
    v6: bool,
    waiters: Waiters,
}

/// # Safety
/// `h` is null or a live handle from [`eudp_async_open`].
unsafe fn handle<'a>(h: *mut eudp_async) -> Result<&'a eudp_async, c_int> {
    // SAFETY: caller guarantee; null is rejected by `as_ref`.
    unsafe { h.as_ref() }.ok_or(EINVAL)
}

/// # Safety
/// `a` is null or readable for `len` bytes.
pub(crate) unsafe fn socket_addr(
    a: *const sockaddr,
    len: socklen_t,
    op: addr::Op,
) -> Result<std::net::SocketAddr, c_int> {
    if a.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return Err(EINVAL);
    }
    // SAFETY: non-null with the family's bytes readable (caller).
    let family = unsafe { std::ptr::read_unaligned(a.cast::<libc::sa_family_t>()) };
    // SAFETY: `len` readable bytes (caller).
    match unsafe { addr::parse(a, len, c_int::from(family) == AF_INET6, op) }? {
        addr::Parsed::Addr(a) => Ok(a),
        addr::Parsed::Unspec => Err(libc::EAFNOSUPPORT),
    }
}

/// Opens a sender bound to `addr`, connected to `peer` unless it is null.
///
/// # Safety
/// `addr`/`peer` are null or readable for their lengths; `cfg` null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_open(
    addr: *const sockaddr,
    addrlen: socklen_t,
    peer: *const sockaddr,
    peerlen: socklen_t,
    cfg: *const eudp_async_config,
) -> *mut eudp_async {
    guard(std::ptr::null_mut(), || {
        // SAFETY: caller guarantee.
        let local = unsafe { socket_addr(addr, addrlen, addr::Op::Bind) }?;
        let sock = UdpSocket::bind(local).map_err(code)?;
        if !peer.is_null() {
            // SAFETY: caller guarantee.
            let p = unsafe { socket_addr(peer, peerlen, addr::Op::Connect) }?;
            sock.connect(p).map_err(code)?;
        }
        // SAFETY: null or valid for reads (caller); unaligned-tolerant.
        let c = if cfg.is_null() { eudp_async_config::default() } else { unsafe { cfg.read_unaligned() } };
        let d = AsyncConfig::default();
        let cfg = AsyncConfig {
            zerocopy: c.flags & EUDP_ASYNC_COPY == 0,
            engine: if c.flags & EUDP_ASYNC_URING != 0 { SendEngine::Uring } else { SendEngine::MsgZerocopy },
            gso: c.flags & EUDP_ASYNC_NO_GSO == 0,
            max_in_flight: if c.max_in_flight == 0 { d.max_in_flight } else { c.max_in_flight as usize },
        };
        let sender = AsyncSender::new(sock, cfg).map_err(unsupported_code)?;
        let h = eudp_async { sender: Mutex::new(sender), v6: local.is_ipv6(), waiters: Waiters::default() };
        Ok(Box::into_raw(Box::new(h)))
    })
}

/// Frees the sender after waiting (up to a second) for the kernel to be
/// done with its buffers; completions not read are discarded.
///
/// # Safety
/// `h` is null or a live handle; it is invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_close(h: *mut eudp_async) -> c_int {
    // SAFETY: `h` came from `eudp_async_open` and is given back (caller).
    guard(-1, || unsafe { free_handle(h) })
}

/// The bound address, `getsockname` semantics.
///
/// # Safety
/// `h` is null or a live handle; `addr` is null or writable for
/// `*addrlen` bytes; `addrlen` is null or valid.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_local_addr(
    h: *mut eudp_async,
    addr: *mut sockaddr_storage,
    addrlen: *mut socklen_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantees.
        let a = unsafe { handle(h) }?;
        // SAFETY: as above.
        unsafe { address_to(addr, addrlen, a.v6, || lock(&a.sender).socket().local_addr().map_err(code)) }
    })
}

/// Sends `n` datagrams from the caller's buffers; returns how many were
/// sent (the first ones: fewer than `n` when the socket's send buffer
/// filled), or -1 with `EAGAIN` when none was.
///
/// # Safety
/// `h` is null or a live handle; `msgs` is null or `n` readable entries,
/// each buffer readable for its length until its completion is read.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_send(h: *mut eudp_async, msgs: *const eudp_async_msg, n: size_t) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        if n == 0 {
            return Ok(0);
        }
        if msgs.is_null() || n > isize::MAX as usize / std::mem::size_of::<eudp_async_msg>() {
            return Err(EINVAL);
        }
        // SAFETY: non-null, `n` readable entries (caller).
        let msgs = unsafe { std::slice::from_raw_parts(msgs, n) };
        let mut batch = Vec::with_capacity(n);
        for m in msgs {
            if m.buf.is_null() && m.len > 0 || m.len > isize::MAX as usize {
                return Err(EINVAL);
            }
            let dst = if m.addr.is_null() {
                None
            } else {
                // SAFETY: `addrlen` readable bytes at `addr` (caller).
                match unsafe { addr::parse(m.addr, m.addrlen, a.v6, addr::Op::SendTo) }? {
                    addr::Parsed::Unspec => None,
                    addr::Parsed::Addr(d) => Some(d),
                }
            };
            let buf = CallerBuf { ptr: m.buf.cast(), len: m.len };
            batch.push(Datagram { buf, token: m.token, dst });
        }
        match lock(&a.sender).submit_batch(batch) {
            Ok(()) => Ok(n as ssize_t),
            Err(Full(rest)) if rest.len() == n => Err(EAGAIN),
            Err(Full(rest)) => Ok((n - rest.len()) as ssize_t),
        }
    })
}

fn to_c(c: Completion<CallerBuf>) -> eudp_async_completion {
    let result = match c.result {
        Ok(len) => len as i64,
        Err(e) => -i64::from(code(e)),
    };
    let flags = if c.copied { EUDP_ASYNC_COPIED } else { 0 };
    eudp_async_completion { token: c.token, buf: c.buf.ptr.cast(), result, flags, reserved: 0 }
}

/// Reads up to `max` completions without waiting; returns how many.
///
/// # Safety
/// `h` is null or a live handle; `out` is null or writable for `max` entries.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_completions(
    h: *mut eudp_async,
    out: *mut eudp_async_completion,
    max: size_t,
) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        if max == 0 {
            return Ok(0);
        }
        if out.is_null() {
            return Err(EINVAL);
        }
        let mut got = Vec::new();
        let n = lock(&a.sender).poll_completions(&mut got, max).map_err(code)?;
        for (i, c) in got.into_iter().enumerate() {
            // SAFETY: i < max entries writable at `out` (caller).
            unsafe { out.add(i).write_unaligned(to_c(c)) };
        }
        Ok(n as ssize_t)
    })
}

/// Waits up to `timeout_ms` (-1: forever) for completions; returns 1 when
/// some can be read, 0 on timeout. The wait itself holds no lock: other
/// threads send and read completions meanwhile, and several may wait at
/// once (each returns when completions are there to read).
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_wait(h: *mut eudp_async, timeout_ms: c_int) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        let t = match timeout_ms {
            -1 => FOREVER,
            v if v < 0 => return Err(EINVAL),
            v => Duration::from_millis(v as u64),
        };
        let deadline = Instant::now() + t;
        let fd = lock(&a.sender).completion_fd();
        // Under the sender's lock, without waiting: read what the kernel posted.
        let ready = || Ok(lock(&a.sender).wait(Some(Duration::ZERO)).map_err(code)?.then_some(()));
        Ok(a.waiters.wait(fd, deadline, ready)?.map_or(0, |()| 1))
    })
}

/// Registers buffer regions with an `EUDP_ASYNC_URING` sender, once: a
/// datagram whose bytes lie inside one is sent from pages pinned now.
///
/// # Safety
/// `h` is null or a live handle; `regions` is null or `n` readable
/// entries, each naming `iov_len` readable bytes that stay mapped while
/// the sender lives.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_register(h: *mut eudp_async, regions: *const libc::iovec, n: size_t) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        if regions.is_null() || n == 0 || n > u16::MAX as usize {
            return Err(EINVAL);
        }
        // SAFETY: non-null, `n` readable entries (caller).
        let iov = unsafe { std::slice::from_raw_parts(regions, n) };
        let mut slices: Vec<&[u8]> = Vec::with_capacity(n);
        for r in iov {
            if r.iov_base.is_null() || r.iov_len == 0 || r.iov_len > isize::MAX as usize {
                return Err(EINVAL);
            }
            // SAFETY: `iov_len` readable bytes at `iov_base` (caller),
            // read by the kernel during the call only.
            slices.push(unsafe { std::slice::from_raw_parts(r.iov_base as *const u8, r.iov_len) });
        }
        lock(&a.sender).register_buffers(&slices).map_err(unsupported_code)?;
        Ok(0)
    })
}

/// The engine in use: `EUDP_ASYNC_ENGINE_*`.
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_engine(h: *mut eudp_async) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        Ok(match lock(&a.sender).engine() {
            None => EUDP_ASYNC_ENGINE_COPY,
            Some(SendEngine::MsgZerocopy) => EUDP_ASYNC_ENGINE_MSG_ZEROCOPY,
            Some(SendEngine::Uring) => EUDP_ASYNC_ENGINE_URING,
        })
    })
}

/// The completion fd: readable while completions wait to be read.
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_fd(h: *mut eudp_async) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        Ok(lock(&a.sender).completion_fd())
    })
}

/// 1 when sends are zero-copy (asked for and accepted by the kernel), else 0.
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_zerocopy(h: *mut eudp_async) -> c_int {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        Ok(c_int::from(lock(&a.sender).zerocopy()))
    })
}

/// Datagrams whose buffers the library holds (sent and not yet
/// completed, or completed and not yet read).
///
/// # Safety
/// `h` is null or a live handle.
#[no_mangle]
pub unsafe extern "C" fn eudp_async_in_flight(h: *mut eudp_async) -> ssize_t {
    guard(-1, || {
        // SAFETY: caller guarantee.
        let a = unsafe { handle(h) }?;
        Ok(lock(&a.sender).in_flight() as ssize_t)
    })
}
