//! Raw descriptor-space calls for `crate::fdspace`: placing, testing and
//! closing numbers, and the RLIMIT_NOFILE the placement works within.
//! Integer arguments only, or pointers to locals of the stated size.

use crate::real;
use libc::{c_int, c_uint};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

/// Closes `fd` (the caller's own descriptor).
pub fn close(fd: c_int) {
    // SAFETY: close takes any number; the caller owns what it closes.
    unsafe { real::close(fd) };
}

/// Whether `fd` is an open descriptor (F_GETFD succeeds).
pub fn is_open(fd: c_int) -> bool {
    // SAFETY: F_GETFD only asks whether the number is open.
    unsafe { real::fcntl(fd, libc::F_GETFD, 0) >= 0 }
}

/// F_DUPFD_CLOEXEC: a close-on-exec duplicate of `fd` at the lowest free
/// number at or above `min`.
pub fn dup_cloexec_from(fd: c_int, min: u64) -> io::Result<c_int> {
    // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes an integer argument.
    let d = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, min as libc::c_ulong) };
    if d < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(d)
    }
}

/// Takes ownership of a descriptor the caller has just made and that
/// nothing else holds or will close.
pub fn own_new(fd: c_int) -> OwnedFd {
    // SAFETY: per this function's contract, `fd` is open and unowned.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// libc's `dup3` (not the hooked one, which refuses private numbers).
pub fn dup3(from: c_int, onto: c_int, flags: c_int) -> c_int {
    // SAFETY: dup3 with integer arguments.
    unsafe { real::dup3(from, onto, flags) }
}

/// A fresh close-on-exec eventfd, the caller's to close.
pub fn eventfd() -> Option<c_int> {
    // SAFETY: eventfd with constant flags.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    (fd >= 0).then_some(fd)
}

/// This process's RLIMIT_NOFILE.
pub fn nofile() -> Option<libc::rlimit64> {
    let mut r = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: pid 0 (this process), no new limit, a live rlimit64 out.
    (unsafe { real::prlimit64(0, libc::RLIMIT_NOFILE as c_int, std::ptr::null(), &mut r) } == 0).then_some(r)
}

/// Sets this process's RLIMIT_NOFILE; true on success.
pub fn set_nofile(soft: u64, hard: u64) -> bool {
    let r = libc::rlimit64 { rlim_cur: soft, rlim_max: hard };
    // SAFETY: pid 0, a live rlimit64 in, no old value asked for.
    unsafe { real::prlimit64(0, libc::RLIMIT_NOFILE as c_int, &r, std::ptr::null_mut()) == 0 }
}

/// The kernel's `close_range` (-1 with errno on failure).
pub fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: close_range with integer arguments.
    unsafe { real::close_range(first, last, flags) }
}

/// libc's `closefrom`.
pub fn closefrom(first: c_int) {
    // SAFETY: closefrom with an integer argument.
    unsafe { real::closefrom(first) };
}
