//! `MSG_ZEROCOPY` sends and their error-queue notifications.
//!
//! A socket with `SO_ZEROCOPY` set takes `sendmsg(MSG_ZEROCOPY)`: the
//! kernel pins the caller's pages instead of copying them, and when it no
//! longer needs them it queues a notification on the socket's error queue.
//! Each successful zero-copy `sendmsg` of a socket gets the next 32-bit
//! notification id (from 0); one notification covers an inclusive id range
//! and says whether the kernel fell back to copying for any send in it
//! (`SO_EE_CODE_ZEROCOPY_COPIED`, the normal case on loopback and veth,
//! whose receivers copy the pages before they are freed). A failed send
//! takes no id and gets no notification.

use super::addr::RawAddr;
use super::cvt;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `UDP_SEGMENT` (linux/udp.h): per-send GSO segment size.
const UDP_SEGMENT: libc::c_int = 103;
/// `SO_EE_ORIGIN_ZEROCOPY` (linux/errqueue.h).
const SO_EE_ORIGIN_ZEROCOPY: u8 = 5;
/// `SO_EE_CODE_ZEROCOPY_COPIED`: the kernel copied the data after all.
const SO_EE_CODE_ZEROCOPY_COPIED: u8 = 1;
/// Room for one `UDP_SEGMENT` control message, in u64 words.
const GSO_CMSG_WORDS: usize = 4;
/// Room for a few extended-error control messages, in u64 words.
const ERR_CMSG_WORDS: usize = 16;

/// Turns on `SO_ZEROCOPY`; fails on kernels without it (before 4.14).
pub fn enable(fd: BorrowedFd<'_>) -> io::Result<()> {
    super::sockopt::set_int_option(fd, libc::SOL_SOCKET, libc::SO_ZEROCOPY, 1)
}

/// One notification: sends `lo..=hi` (ids, wrapping) are done with their
/// pages; `copied` when the kernel copied instead of sending from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Notification {
    pub lo: u32,
    pub hi: u32,
    pub copied: bool,
}

/// One `sendmsg` of `iov` (one datagram, or a GSO run when `segment` is
/// set) to `dst` (the connected peer when `None`), nonblocking. With
/// `zerocopy` the kernel may read `iov`'s pages after this returns, until
/// the notification of this send's id.
pub fn send(
    fd: BorrowedFd<'_>,
    dst: Option<&SocketAddr>,
    iov: &[io::IoSlice<'_>],
    segment: Option<u16>,
    zerocopy: bool,
) -> io::Result<usize> {
    let addr = dst.map(RawAddr::from_std);
    let mut cmsg = [0u64; GSO_CMSG_WORDS];
    // SAFETY: msghdr is plain data; all-zero is a valid value.
    let mut h: libc::msghdr = unsafe { zeroed() };
    if let Some(a) = &addr {
        h.msg_name = a.as_ptr() as *mut libc::c_void;
        h.msg_namelen = a.len;
    }
    // IoSlice is ABI-compatible with iovec on Unix.
    h.msg_iov = iov.as_ptr() as *mut libc::iovec;
    h.msg_iovlen = iov.len();
    if let Some(seg) = segment {
        h.msg_control = cmsg.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is a pure size computation.
        h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        // SAFETY: msg_control points at 32 zeroed, aligned bytes, enough for
        // one u16 control message; CMSG_FIRSTHDR/DATA stay inside them.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&h);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
        }
    }
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if zerocopy { libc::MSG_ZEROCOPY } else { 0 };
    // SAFETY: h points at addr, cmsg and the caller's iov, all alive across the call.
    cvt(unsafe { libc::sendmsg(fd.as_raw_fd(), &h, flags) }).map(|n| n as usize)
}

/// Reads the queued zero-copy notifications (at most `max`) without
/// waiting, passing each to `each`; returns how many messages it read.
/// Other queued errors are passed on as `Err(errno)`.
pub fn read_notifications(
    fd: BorrowedFd<'_>,
    max: usize,
    mut each: impl FnMut(Result<Notification, i32>),
) -> io::Result<usize> {
    let mut read = 0;
    while read < max {
        let mut ctrl = [0u64; ERR_CMSG_WORDS];
        // SAFETY: msghdr is plain data; all-zero is a valid value.
        let mut h: libc::msghdr = unsafe { zeroed() };
        h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
        h.msg_controllen = size_of::<[u64; ERR_CMSG_WORDS]>();
        // SAFETY: h points at the live ctrl array; no payload is asked for.
        let r = unsafe { libc::recvmsg(fd.as_raw_fd(), &mut h, libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::WouldBlock { Ok(read) } else { Err(e) };
        }
        read += 1;
        // SAFETY: walks the control data the kernel just wrote into ctrl,
        // reading each extended error with an unaligned read.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&h);
            while !c.is_null() {
                let (lvl, ty) = ((*c).cmsg_level, (*c).cmsg_type);
                if (lvl == libc::SOL_IP && ty == libc::IP_RECVERR)
                    || (lvl == libc::SOL_IPV6 && ty == libc::IPV6_RECVERR)
                {
                    let ee = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                    if ee.ee_origin == SO_EE_ORIGIN_ZEROCOPY && ee.ee_errno == 0 {
                        each(Ok(Notification {
                            lo: ee.ee_info,
                            hi: ee.ee_data,
                            copied: ee.ee_code & SO_EE_CODE_ZEROCOPY_COPIED != 0,
                        }));
                    } else {
                        each(Err(ee.ee_errno as i32));
                    }
                }
                c = libc::CMSG_NXTHDR(&h, c);
            }
        }
    }
    Ok(read)
}

/// Takes (and so clears) the socket's pending error, such as the
/// `ECONNREFUSED` an ICMP message left on a connected socket.
pub fn take_pending_error(fd: BorrowedFd<'_>) -> io::Result<i32> {
    super::sockopt::get_int_option(fd, libc::SOL_SOCKET, libc::SO_ERROR)
}
