//! The shim's raw calls on kernel sockets and descriptors: socket options,
//! flags, readiness waits and errno. Safe functions over `real`'s libc
//! functions; every pointer handed on points at a local of the stated size.
//!
//! By job, below this module: [`errno`], [`process`] (pid, thread name),
//! [`fdspace`] (descriptor numbers and RLIMIT_NOFILE), [`timestamp`] (the
//! kernel path's receive timestamps for `ktrace`), [`hazard`] (the
//! borrow's hazard slots and `membarrier`), [`fork_lock`] (a guard handed
//! over across fork), [`leaked`] (values that live for the process) and
//! [`sigflush`] (the handler that flushes on a deadly signal), [`sigrelay`]
//! (the relay that counts the runs of handlers without `SA_RESTART`).
//! None of them names this module, so concept modules above can use them
//! while this one still reaches `crate::fdspace`.

pub mod errno;
pub mod fdspace;
pub mod fork_lock;
pub mod hazard;
pub mod leaked;
pub mod process;
pub mod sigflush;
pub mod sigrelay;
pub mod timestamp;

pub(crate) use errno::{errno, set_errno};
pub(crate) use process::getpid;

use crate::real;
use libc::{c_int, c_ulong, c_void, socklen_t};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::time::Duration;

pub(crate) const UDP_GRO: c_int = 104;

pub(crate) fn real_close(fd: c_int) {
    crate::fdspace::close_private(fd);
}

/// A close-on-exec duplicate for the shim's own use, at a private number
/// (out of the program's descriptor space: see `crate::fdspace`).
pub(crate) fn real_dup_cloexec(fd: c_int) -> io::Result<c_int> {
    crate::fdspace::private_dup(fd)
}

/// [`real_dup_cloexec`], owned: closed when dropped.
pub(crate) fn dup_owned(fd: c_int) -> io::Result<OwnedFd> {
    let d = real_dup_cloexec(fd)?;
    // SAFETY: `d` was just made for the shim and nothing else holds it.
    Ok(unsafe { OwnedFd::from_raw_fd(d) })
}

/// The coarse monotonic clock, in nanoseconds.
pub(crate) fn coarse_ns() -> i64 {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer; CLOCK_MONOTONIC_COARSE is served by the vDSO.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    t.tv_sec * 1_000_000_000 + t.tv_nsec
}

/// The descriptor flags of `fd` (F_GETFD), if it is open.
pub(crate) fn fd_flags(fd: c_int) -> Option<c_int> {
    // SAFETY: fcntl with integer arguments.
    let f = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    (f >= 0).then_some(f)
}

pub(crate) fn sockopt_int(fd: c_int, level: c_int, name: c_int, v: c_int) {
    // SAFETY: pointer to a live c_int and its size.
    unsafe { real::setsockopt(fd, level, name, &v as *const c_int as *const c_void, 4) };
}

/// Raises the kernel receive buffer of `fd` to at least `bytes` (never
/// lowers it): SO_RCVBUFFORCE when privileged, else SO_RCVBUF (capped by
/// rmem_max).
pub(crate) fn grow_kernel_rcvbuf(fd: c_int, bytes: c_int) {
    let mut cur: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: pointer/length of a live c_int.
    unsafe { real::getsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &mut cur as *mut c_int as *mut c_void, &mut len) };
    if cur >= bytes {
        return;
    }
    let v = bytes / 2; // the kernel doubles the value it is given
                       // SAFETY: pointer to a live c_int and its size.
    let r =
        unsafe { real::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &v as *const c_int as *const c_void, 4) };
    if r != 0 {
        sockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, v);
    }
}

pub(crate) fn gro_off(fd: c_int) {
    gro_set(fd, false);
}

pub(crate) fn gro_set(fd: c_int, on: bool) {
    sockopt_int(fd, libc::SOL_UDP, UDP_GRO, on as c_int);
}

fn getsockopt_int(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = 4 as socklen_t;
    // SAFETY: pointer/length of a live c_int.
    let r = unsafe { real::getsockopt(fd, level, name, &mut v as *mut c_int as *mut c_void, &mut len) };
    (r == 0).then_some(v)
}

/// The kernel socket's receive drop count (`SO_MEMINFO`'s `SK_MEMINFO_DROPS`:
/// its receive buffer was full, or a checksum failed).
pub(crate) fn socket_drops(fd: c_int) -> Option<u64> {
    const SO_MEMINFO: c_int = 55;
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as socklen_t;
    // SAFETY: pointer/length of a live u32 array; the kernel writes at most `len` bytes.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, SO_MEMINFO, info.as_mut_ptr() as *mut c_void, &mut len) };
    let at = libc::SK_MEMINFO_DROPS as usize;
    (r == 0 && len as usize >= (at + 1) * 4).then(|| u64::from(info[at]))
}

/// The inode of the file `fd` names: which socket it is, across dups.
pub(crate) fn inode(fd: c_int) -> Option<u64> {
    // SAFETY: stat is plain data, written by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live out pointer.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some(st.st_ino)
}

/// Whether the kernel socket has UDP_GRO on.
pub(crate) fn gro_enabled(fd: c_int) -> bool {
    getsockopt_int(fd, libc::SOL_UDP, UDP_GRO).is_some_and(|v| v != 0)
}

/// An integer option of the kernel socket.
pub(crate) fn int_opt(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    getsockopt_int(fd, level, name)
}

/// Sets an integer option on the kernel socket.
pub(crate) fn set_int_opt(fd: c_int, level: c_int, name: c_int, v: c_int) {
    sockopt_int(fd, level, name, v);
}

/// The kernel socket's receive buffer (SO_RCVBUF as the kernel reports it).
pub(crate) fn kernel_rcvbuf(fd: c_int) -> usize {
    getsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF).map_or(0, |v| v.max(0) as usize)
}

/// True when the kernel socket itself has a message queued (the shim's
/// own readiness, leftovers or rings, is not asked).
pub(crate) fn kernel_has_data(fd: c_int) -> bool {
    let mut p = [libc::pollfd { fd, events: libc::POLLIN, revents: 0 }];
    // SAFETY: pointer/length of a live pollfd array.
    let r = unsafe { real::poll(p.as_mut_ptr(), 1, 0) };
    r > 0 && p[0].revents & libc::POLLIN != 0
}

/// Whether `fd` has FD_CLOEXEC (an fd that cannot be asked counts as
/// inherited).
pub(crate) fn cloexec(fd: c_int) -> bool {
    // SAFETY: fcntl with integer arguments.
    let f = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    f >= 0 && f & libc::FD_CLOEXEC != 0
}

/// After a fallback or before exec: the kernel socket gets the flags the
/// application asked for and delivers plain (not coalesced) datagrams.
pub(crate) fn restore_kernel_socket(fd: c_int, nonblock: bool) {
    gro_off(fd);
    restore_kernel_flags(fd, nonblock);
}

/// The file description's `O_NONBLOCK` as the application asked (a
/// fallback that leaves a sleeping read GRO on, see `shim::hand_over`).
pub(crate) fn restore_kernel_flags(fd: c_int, nonblock: bool) {
    // SAFETY: fcntl with integer arguments.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let want = if nonblock { fl | libc::O_NONBLOCK } else { fl & !libc::O_NONBLOCK };
            real::fcntl(fd, libc::F_SETFL, want as c_ulong);
        }
    }
}

fn timeval_opt(fd: c_int, name: c_int) -> Option<Duration> {
    let mut tv = libc::timeval { tv_sec: 0, tv_usec: 0 };
    let mut len = std::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: pointer/length of a live timeval.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, &mut tv as *mut _ as *mut c_void, &mut len) };
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return None;
    }
    Some(Duration::from_secs(tv.tv_sec.max(0) as u64) + Duration::from_micros(tv.tv_usec.max(0) as u64))
}

/// SO_RCVTIMEO and SO_SNDTIMEO as the kernel socket holds them.
pub(crate) fn kernel_timeouts(fd: c_int) -> (Option<Duration>, Option<Duration>) {
    (timeval_opt(fd, libc::SO_RCVTIMEO), timeval_opt(fd, libc::SO_SNDTIMEO))
}

fn poll_some(fds: &mut [libc::pollfd], timeout: Option<Duration>) -> Result<c_int, c_int> {
    let ms = timeout.map(|d| d.as_millis().clamp(1, i32::MAX as u128) as c_int).unwrap_or(-1);
    // SAFETY: pointer/length of a live pollfd slice.
    let r = unsafe { real::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        Err(errno())
    } else {
        Ok(r)
    }
}

/// Sleeps until the socket or the ring is readable (or the timeout).
pub(crate) fn wait_readable(sock: c_int, ring: Option<c_int>, timeout: Option<Duration>) -> Result<(), c_int> {
    let mut p = [
        libc::pollfd { fd: sock, events: libc::POLLIN, revents: 0 },
        libc::pollfd { fd: ring.unwrap_or(-1), events: libc::POLLIN, revents: 0 },
    ];
    poll_some(&mut p, timeout).map(drop)
}
