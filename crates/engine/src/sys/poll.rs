//! One-shot readiness waits on a few descriptors (`poll`, `ppoll`).

use std::io;
use std::os::fd::RawFd;
use std::time::Duration;

/// Blocks until one of `fds` is readable or `timeout` passes (`None`: forever).
/// Returns true when something became readable. EINTR counts as a wake-up.
pub fn poll_readable(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    restarted(poll_events(fds, libc::POLLIN, timeout))
}

/// As [`poll_readable`], but a signal handler that ran during the wait
/// fails it with `ErrorKind::Interrupted` (a receive that must report
/// `EINTR` as the kernel would for a handler without `SA_RESTART`).
pub fn poll_readable_interruptible(fds: &[RawFd], timeout: Option<Duration>) -> io::Result<bool> {
    poll_events(fds, libc::POLLIN, timeout)
}

/// As [`poll_readable`] for writability.
pub fn poll_writable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    restarted(poll_events(&[fd], libc::POLLOUT, timeout))
}

/// An interrupted wait counts as a wake-up: the caller looks again.
fn restarted(r: io::Result<bool>) -> io::Result<bool> {
    match r {
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
        r => r,
    }
}

/// True when `fd` has data to read now (`POLLIN`; unlike
/// [`poll_readable`], a queued error or timestamp alone does not count).
pub fn has_data(fd: RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: pointer to one live pollfd.
    unsafe { libc::poll(&mut p, 1, 0) > 0 && p.revents & libc::POLLIN != 0 }
}

/// As [`poll_readable`] (or [`poll_readable_interruptible`]), but also
/// watching the first descriptor, a socket, for a shutdown of its reading
/// side (`shutdown(SHUT_RD)`): `Ok(true)` when that happened. An
/// uninterruptible wait ended by a signal is `Ok(false)`.
pub fn poll_readable_or_shut(fds: &[RawFd], timeout: Option<Duration>, interruptible: bool) -> io::Result<bool> {
    match poll_events_first(fds, libc::POLLIN | libc::POLLRDHUP, timeout, None) {
        Ok((_, first)) => Ok(first & libc::POLLRDHUP != 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted && !interruptible => Ok(false),
        Err(e) => Err(e),
    }
}

/// As [`poll_readable_or_shut`], waiting with the signal mask `mask` in
/// place for the wait only (`ppoll`), as a thread that holds its signals
/// blocked ([`super::process::AsyncSignalsBlocked`]) must: a signal pending or arriving is
/// taken inside the wait, which then fails with `EINTR`.
pub fn poll_readable_or_shut_masked(
    fds: &[RawFd],
    timeout: Option<Duration>,
    mask: &libc::sigset_t,
) -> io::Result<bool> {
    poll_events_first(fds, libc::POLLIN | libc::POLLRDHUP, timeout, Some(mask))
        .map(|(_, first)| first & libc::POLLRDHUP != 0)
}

fn poll_events(fds: &[RawFd], events: libc::c_short, timeout: Option<Duration>) -> io::Result<bool> {
    poll_events_first(fds, events, timeout, None).map(|(any, _)| any)
}

/// One poll: whether anything was ready, and the first descriptor's revents.
/// With `mask`, a `ppoll` that waits with that signal mask.
fn poll_events_first(
    fds: &[RawFd],
    events: libc::c_short,
    timeout: Option<Duration>,
    mask: Option<&libc::sigset_t>,
) -> io::Result<(bool, libc::c_short)> {
    // At most two descriptors are ever polled: no allocation on the wait path.
    let mut p = [libc::pollfd { fd: -1, events, revents: 0 }; 4];
    debug_assert!(fds.len() <= p.len());
    let n = fds.len().min(p.len());
    for (slot, &fd) in p.iter_mut().zip(fds) {
        slot.fd = fd;
    }
    let r = if let Some(mask) = mask {
        let ts = timeout.map(|d| libc::timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: d.subsec_nanos() as _,
        });
        // The system call itself, not libc's `ppoll` (which the preload
        // shim interposes); the kernel's sigset is 8 bytes.
        // SAFETY: live pollfd array and length; `ts` null or a live
        // timespec; a live sigset.
        unsafe {
            libc::syscall(
                libc::SYS_ppoll,
                p.as_mut_ptr(),
                n as libc::nfds_t,
                ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec),
                mask as *const libc::sigset_t,
                8usize,
            ) as libc::c_int
        }
    } else {
        let ms = timeout
            .map(|d| d.as_millis().min(i32::MAX as u128).max(if d.is_zero() { 0 } else { 1 }) as i32)
            .unwrap_or(-1);
        // SAFETY: pointer to a live pollfd array and a length within it.
        unsafe { libc::poll(p.as_mut_ptr(), n as libc::nfds_t, ms) }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((r > 0, p[0].revents))
}
