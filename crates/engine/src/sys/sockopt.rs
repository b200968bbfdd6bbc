//! Integer socket options on descriptors of any owner.

use super::cvt;
use std::io;
use std::mem::size_of;
use std::os::fd::AsRawFd;

/// Sets an integer socket option on any socket (used by tools for sockets
/// the engine does not own).
pub fn set_int_option(fd: std::os::fd::BorrowedFd<'_>, level: i32, name: i32, val: i32) -> io::Result<()> {
    // SAFETY: pointer to a live c_int and its size; fd is borrowed for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            &val as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as u32,
        )
    })
    .map(drop)
}

/// Reads an integer socket option of any socket.
pub fn get_int_option(fd: std::os::fd::BorrowedFd<'_>, level: i32, name: i32) -> io::Result<i32> {
    let mut val: libc::c_int = 0;
    let mut len = size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: pointer to a live c_int and its length; fd is borrowed for the call.
    cvt(unsafe { libc::getsockopt(fd.as_raw_fd(), level, name, &mut val as *mut _ as *mut libc::c_void, &mut len) })?;
    Ok(val)
}

/// Sets a socket option whose value is a structure (a multicast membership
/// request, say), given as its bytes.
pub fn set_bytes_option(fd: &impl AsRawFd, level: i32, name: i32, val: &[u8]) -> io::Result<()> {
    // SAFETY: pointer to live bytes and their length; `fd` is borrowed (open) for the call.
    cvt(unsafe { libc::setsockopt(fd.as_raw_fd(), level, name, val.as_ptr() as *const libc::c_void, val.len() as u32) })
        .map(drop)
}

/// Sets the receive timeout (`SO_RCVTIMEO`) of a socket: a blocking receive
/// on it returns `EAGAIN` after `t` (zero would mean never; callers pass
/// at least a microsecond).
pub fn set_receive_timeout(fd: std::os::fd::BorrowedFd<'_>, t: std::time::Duration) -> io::Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: pointer to a live timeval and its size; fd is borrowed for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            size_of::<libc::timeval>() as u32,
        )
    })
    .map(drop)
}
