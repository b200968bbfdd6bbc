//! Receives and sends on an endpoint, with the kernel's return conventions.

use super::sock::{errno_of, Sock};
use eudp_engine::{Endpoint, Received, RecvFlags};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

static RACE_PAUSE: AtomicU64 = AtomicU64::new(u64::MAX);

/// `EUDP_TEST_RACE_PAUSE_US` (tests only; default 0): a receive that
/// found its socket on the engine and its ring empty pauses this long
/// before it takes the endpoint, so that a test can make another thread's
/// fallback land in that window every time instead of once in hundreds of
/// runs. Read once; a receive served from the ring never gets here.
#[cold]
pub fn race_pause() {
    let mut us = RACE_PAUSE.load(Relaxed);
    if us == u64::MAX {
        us = std::env::var("EUDP_TEST_RACE_PAUSE_US").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        RACE_PAUSE.store(us, Relaxed);
    }
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

/// One receive on the engine path with the application's flags.
///
/// A blocking receive is the engine's own: it reads the socket on this
/// thread, keeps the engine off it while waiting (no second wake-up per
/// arrival), spins first under the latency profile (`EUDP_SPIN_US`, the
/// engine's `recv_spin`), honours SO_RCVTIMEO (mirrored into the endpoint
/// by `setsockopt`) and fails with `EINTR` when the program has a handler
/// without `SA_RESTART`, as the kernel would.
pub fn ep_recv(s: &Sock, ep: &Endpoint, buf: &mut [u8], flags: i32, mut info: Info) -> Result<Received, i32> {
    let peek = flags & libc::MSG_PEEK != 0;
    if flags & libc::MSG_DONTWAIT != 0 || s.nonblock() {
        return nonblocking_recv(s, ep, buf, peek, info);
    }
    let f = RecvFlags { peek, dont_wait: false, interruptible: crate::signals::eintr_wanted() };
    recv_info(ep, buf, f, &mut info).map_err(|e| errno_of(&e))
}

/// Where a receive writes the datagram's destination information
/// (`IP_PKTINFO` and the like): only `recvmsg` asks, so read/recv/recvfrom
/// do not carry it through the receive's layers.
pub type Info<'a> = Option<&'a mut Option<eudp_engine::backend::PktInfo>>;

/// One engine receive, with the destination information when asked for.
#[inline]
pub fn recv_info(ep: &Endpoint, buf: &mut [u8], f: RecvFlags, info: &mut Info) -> io::Result<Received> {
    match info {
        Some(i) => ep.recv_with_info(buf, f, i),
        None => ep.recv_with(buf, f),
    }
}

/// A nonblocking receive that never reports `EAGAIN` for a datagram that
/// is on its way into the ring. The engine takes a datagram off the socket
/// and pushes it into the ring a moment later; a receive in between finds
/// both empty, while the program was told (by the socket's readiness) that
/// a datagram is there — and some programs (libuv users such as dig) take
/// such an `EAGAIN` for end of stream. A receive that could not read the
/// socket itself (its `direct_recv_calls` did not move: the engine or
/// another thread holds the socket) waits briefly for the ring.
#[inline]
pub fn nonblocking_recv(s: &Sock, ep: &Endpoint, buf: &mut [u8], peek: bool, mut info: Info) -> Result<Received, i32> {
    let f = RecvFlags { peek, dont_wait: true, interruptible: false };
    let before = ep.socket_reads();
    match recv_info(ep, buf, f, &mut info) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => nonblocking_recv_empty(s, ep, buf, f, info, before),
        r => r.map_err(|e| errno_of(&e)),
    }
}

/// [`nonblocking_recv`] once the ring was found empty, out of line so the
/// common case (a datagram waiting) stays small enough to inline. When the
/// socket was read during that receive (on this thread, or another's read
/// that began after this call did) it was found empty: `EAGAIN` at once,
/// as the kernel answers, with the one read the kernel would make: a
/// second read and its stats snapshots would make each `EAGAIN` of a
/// read-until-empty event loop cost several times the kernel's.
#[inline(never)]
fn nonblocking_recv_empty(
    s: &Sock,
    ep: &Endpoint,
    buf: &mut [u8],
    f: RecvFlags,
    mut info: Info,
    before: u64,
) -> Result<Received, i32> {
    if ep.socket_reads() != before {
        return Err(libc::EAGAIN); // the socket was read: really empty
    }
    let ring = s.ring_fd(ep);
    let deadline = Instant::now() + Duration::from_millis(2);
    loop {
        if let Some(r) = ring {
            let _ = crate::sys::wait_readable(r, None, Some(Duration::from_millis(1)));
        }
        match recv_info(ep, buf, f, &mut info) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r.map_err(|e| errno_of(&e)),
        }
        if ep.socket_reads() != before || Instant::now() >= deadline {
            return Err(libc::EAGAIN);
        }
    }
}

/// One send on the engine path; `MSG_DONTWAIT` makes this call
/// nonblocking on a blocking socket, as the kernel does.
pub fn ep_send(ep: &Endpoint, data: &[u8], dst: Option<SocketAddr>, flags: i32) -> Result<usize, i32> {
    let f = eudp_engine::SendFlags { dont_wait: flags & libc::MSG_DONTWAIT != 0 };
    ep.send_with(data, dst, f).map_err(|e| errno_of(&e))
}
