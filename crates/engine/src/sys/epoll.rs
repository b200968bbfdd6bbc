//! The epoll set of the engine thread, the `xdp` backend and the `tcp`
//! transport's manager: one wrapper for every epoll user of the engine.

use super::cvt;
use crate::fdspace::{new_private, Private};
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

/// The kernel lacks `epoll_pwait2` (before 5.11): waits round up to milliseconds.
static NO_PWAIT2: AtomicBool = AtomicBool::new(false);

/// Readable.
pub const EV_IN: u32 = libc::EPOLLIN as u32;
/// Writable.
pub const EV_OUT: u32 = libc::EPOLLOUT as u32;
/// An error, a hang-up, or the peer's shutdown of its sending side.
pub const EV_ERR: u32 = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;
/// The peer shut its sending side (a stream's FIN).
pub const EV_RDHUP: u32 = libc::EPOLLRDHUP as u32;
/// Edge-triggered: one report per change.
pub const EDGE: u32 = libc::EPOLLET as u32;

/// An epoll set keyed by `u64` tokens (level-triggered unless asked otherwise).
#[derive(Debug)]
pub struct Epoll {
    fd: Private<OwnedFd>,
}

impl AsRawFd for Epoll {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Epoll {
    /// A new close-on-exec epoll instance.
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(Epoll { fd })
    }

    /// Watches `fd` for readability under `token` (level-triggered).
    pub fn add_readable(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, libc::EPOLLIN as u32)
    }

    /// Watches `fd` for new readability under `token` (edge-triggered: one
    /// report per arrival, the watcher must read until EAGAIN).
    pub fn add_readable_edge(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, (libc::EPOLLIN | libc::EPOLLET) as u32)
    }

    /// Watches `fd` for readability once (level-triggered, EPOLLONESHOT):
    /// after one report the watch is disarmed until [`Epoll::rearm`].
    pub fn add_readable_oneshot(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.add(fd, token, (libc::EPOLLIN | libc::EPOLLONESHOT) as u32)
    }

    /// Re-arms a one-shot watch (reports at once if `fd` is readable now).
    pub fn rearm(&self, fd: RawFd, token: u64) -> io::Result<()> {
        self.modify(fd, token, (libc::EPOLLIN | libc::EPOLLONESHOT) as u32)
    }

    /// Watches `fd` once for writability (`EPOLLOUT | EPOLLONESHOT`), or
    /// re-arms that watch when `rearm` (it reports at once if `fd` is
    /// writable now).
    pub fn watch_writable_once(&self, fd: RawFd, token: u64, rearm: bool) -> io::Result<()> {
        let events = (libc::EPOLLOUT | libc::EPOLLONESHOT) as u32;
        if rearm {
            self.modify(fd, token, events)
        } else {
            self.add(fd, token, events)
        }
    }

    /// Watches `fd` under `token` for `events` (`EV_*` flags, with
    /// [`EDGE`] for edge-triggered reports).
    pub fn add(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, token, events)
    }

    /// Replaces the events (and token) `fd` is watched for.
    pub fn modify(&self, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, token, events)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64, events: u32) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: token };
        // SAFETY: pointer to a live epoll_event (ignored by DEL on new kernels).
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), op, fd, &mut ev) }).map(drop)
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits for readiness; returns the tokens that are ready. `None` waits
    /// forever; a timeout is honoured to the microsecond where the kernel
    /// allows.
    pub fn wait(&self, out: &mut Vec<u64>, timeout: Option<Duration>) -> io::Result<()> {
        let mut evs: [MaybeUninit<libc::epoll_event>; 64] = [MaybeUninit::uninit(); 64];
        out.clear();
        let n = epoll_wait_for(self.fd.as_raw_fd(), &mut evs, timeout)?;
        for ev in &evs[..n] {
            // SAFETY: the first n entries were initialised by the kernel.
            let ev = unsafe { ev.assume_init() };
            out.push(ev.u64);
        }
        Ok(())
    }

    /// As [`Epoll::wait`], with each token's `EV_*` flags.
    pub fn wait_events(&self, out: &mut Vec<(u64, u32)>, timeout: Option<Duration>) -> io::Result<()> {
        let mut evs: [MaybeUninit<libc::epoll_event>; 128] = [MaybeUninit::uninit(); 128];
        out.clear();
        let n = epoll_wait_for(self.fd.as_raw_fd(), &mut evs, timeout)?;
        for ev in &evs[..n] {
            // SAFETY: the first n entries were initialised by the kernel.
            let ev = unsafe { ev.assume_init() };
            out.push((ev.u64, ev.events));
        }
        Ok(())
    }
}

/// `epoll_pwait2` on `epfd` into `evs`; returns how many events it wrote
/// (0 on `EINTR`). `None` waits forever. The timeout is honoured to the
/// nanosecond (a sub-millisecond wait must not round to a busy poll);
/// before Linux 5.11 `epoll_wait` waits whole milliseconds, rounded up.
fn epoll_wait_for(
    epfd: RawFd,
    evs: &mut [MaybeUninit<libc::epoll_event>],
    timeout: Option<Duration>,
) -> io::Result<usize> {
    let cap = evs.len().min(i32::MAX as usize) as i32;
    let ptr = evs.as_mut_ptr() as *mut libc::epoll_event;
    let ts = timeout.map(|d| libc::timespec {
        tv_sec: d.as_secs().min(i32::MAX as u64) as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    let mut r = -1;
    if !NO_PWAIT2.load(Relaxed) {
        // SAFETY: the kernel writes at most `cap` events at `ptr`; `tsp` is
        // null or points to `ts`, alive for the call; no signal mask.
        r = unsafe { libc::epoll_pwait2(epfd, ptr, cap, tsp, std::ptr::null()) };
        if r < 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
            NO_PWAIT2.store(true, Relaxed);
        }
    }
    if NO_PWAIT2.load(Relaxed) {
        let ms = timeout.map(|d| d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as i32).unwrap_or(-1);
        // SAFETY: as above.
        r = unsafe { libc::epoll_wait(epfd, ptr, cap, ms) };
    }
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::Interrupted { Ok(0) } else { Err(e) };
    }
    Ok(r as usize)
}
