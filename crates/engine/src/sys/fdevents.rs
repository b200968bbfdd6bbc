//! Descriptors that exist only to be polled: the eventfd doorbell and the
//! timerfd deadline.

use super::cvt;
use crate::fdspace::{new_private, Private};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// An eventfd used as a doorbell or as a pollable readiness flag.
#[derive(Debug)]
pub struct EventFd {
    fd: Private<OwnedFd>,
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl EventFd {
    /// A nonblocking, close-on-exec eventfd starting at 0 (not readable).
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(EventFd { fd })
    }

    /// Makes the fd readable (adds 1 to the counter).
    pub fn set(&self) {
        let v: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64. A full counter (EAGAIN)
        // still leaves the fd readable, which is all a doorbell needs.
        unsafe { libc::write(self.fd.as_raw_fd(), &v as *const u64 as *const libc::c_void, 8) };
    }

    /// Makes the fd unreadable (drains the counter).
    pub fn clear(&self) {
        read_counter(self.fd.as_raw_fd());
    }
}

/// Reads (and so resets) the 8-byte counter of an eventfd or timerfd;
/// EAGAIN means it was zero already.
fn read_counter(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    unsafe { libc::read(fd, &mut v as *mut u64 as *mut libc::c_void, 8) };
}

/// A one-shot CLOCK_MONOTONIC timer as a file descriptor, so the engine's
/// deadline can be moved by any thread without waking the engine.
#[derive(Debug)]
pub struct TimerFd {
    fd: Private<OwnedFd>,
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl TimerFd {
    /// A nonblocking, close-on-exec timer, disarmed.
    pub fn new() -> io::Result<Self> {
        let fd = new_private(|| {
            // SAFETY: plain syscall; the fd is owned below.
            let fd =
                cvt(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) })?;
            // SAFETY: fresh fd owned by nobody else.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        })?;
        Ok(TimerFd { fd })
    }

    /// Fires once, `after` from now (at least 1 ns: zero would disarm);
    /// `None` disarms. Replaces any earlier setting.
    pub fn set(&self, after: Option<Duration>) {
        let value = match after {
            Some(d) => {
                let d = d.max(Duration::from_nanos(1));
                libc::timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as libc::time_t,
                    tv_nsec: d.subsec_nanos() as _,
                }
            }
            None => libc::timespec { tv_sec: 0, tv_nsec: 0 },
        };
        let spec = libc::itimerspec { it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 }, it_value: value };
        // SAFETY: valid itimerspec; the old value is not asked for. It cannot
        // fail on a valid timerfd with a normalised relative time.
        unsafe { libc::timerfd_settime(self.fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Consumes an expiry (the fd is then unreadable until the next one).
    pub fn clear(&self) {
        read_counter(self.fd.as_raw_fd());
    }
}
