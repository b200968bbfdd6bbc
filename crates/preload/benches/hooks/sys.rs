//! The libc calls the benchmark makes: each hook under test called as a
//! program calls it (through the dynamic symbol, so `LD_PRELOAD` decides
//! whether the shim or libc answers), and the fixture's own set-up.

use std::mem::{size_of, zeroed};

pub type Fd = libc::c_int;

fn check(r: libc::c_long, what: &str) -> libc::c_long {
    if r < 0 {
        panic!("{what}: {}", std::io::Error::last_os_error());
    }
    r
}

/// A UDP socket bound to 127.0.0.1 on a free port. `tracked` ones come from
/// `socket(2)` (the shim takes them as the program's); the others from
/// `syscall(SYS_socket)`, which the shim passes through without tracking.
pub fn udp_socket(tracked: bool) -> (Fd, libc::sockaddr_in) {
    // SAFETY: plain socket calls on a descriptor this function owns, with a
    // sockaddr_in of the size passed.
    unsafe {
        let fd = if tracked {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)
        } else {
            libc::syscall(libc::SYS_socket, libc::AF_INET, libc::SOCK_DGRAM, 0) as Fd
        };
        check(fd as libc::c_long, "socket");
        let mut a: libc::sockaddr_in = zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        check(libc::bind(fd, &a as *const _ as *const libc::sockaddr, len) as libc::c_long, "bind");
        let mut l = len;
        check(libc::getsockname(fd, &mut a as *mut _ as *mut libc::sockaddr, &mut l) as libc::c_long, "getsockname");
        (fd, a)
    }
}

/// `sendto` of `len` bytes to `to`.
#[inline(always)]
pub fn sendto(fd: Fd, buf: &[u8], to: &libc::sockaddr_in) -> isize {
    // SAFETY: `buf` and `to` are valid for the lengths passed.
    unsafe {
        libc::sendto(
            fd,
            buf.as_ptr().cast(),
            buf.len(),
            0,
            to as *const _ as *const libc::sockaddr,
            size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    }
}

/// `recvfrom` into `buf`, the source address into `from`.
#[inline(always)]
pub fn recvfrom(fd: Fd, buf: &mut [u8], flags: libc::c_int) -> isize {
    // SAFETY: `buf` and the address are valid for the lengths passed.
    unsafe {
        let mut from: libc::sockaddr_in = zeroed();
        let mut l = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            flags,
            &mut from as *mut _ as *mut libc::sockaddr,
            &mut l,
        )
    }
}

/// `recvmsg` with one iovec and the source address, no control data.
#[inline(always)]
pub fn recvmsg(fd: Fd, buf: &mut [u8]) -> isize {
    // SAFETY: the msghdr points at `buf`, `iov` and `from`, all alive for the call.
    unsafe {
        let mut from: libc::sockaddr_in = zeroed();
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
        let mut m: libc::msghdr = zeroed();
        m.msg_name = &mut from as *mut _ as *mut libc::c_void;
        m.msg_namelen = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        m.msg_iov = &mut iov;
        m.msg_iovlen = 1;
        libc::recvmsg(fd, &mut m, 0)
    }
}

/// `select` for reading on `fd` alone, with a 1 s timeout (as a streaming
/// receiver calls it).
#[inline(always)]
pub fn select(fd: Fd) -> libc::c_int {
    // SAFETY: the fd_set and timeval live on this stack frame for the call.
    unsafe {
        let mut set: libc::fd_set = zeroed();
        libc::FD_SET(fd, &mut set);
        let mut tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
        libc::select(fd + 1, &mut set, std::ptr::null_mut(), std::ptr::null_mut(), &mut tv)
    }
}

/// `select` for reading on every descriptor of `fds`, 1 s timeout, as
/// iperf3's server selects: its TCP listener and control connection beside
/// the UDP socket it receives on.
#[inline(always)]
pub fn select_all(fds: &[Fd]) -> libc::c_int {
    // SAFETY: the fd_set and timeval live on this stack frame for the call;
    // every descriptor is below FD_SETSIZE (a fresh process's).
    unsafe {
        let mut set: libc::fd_set = zeroed();
        let mut top = 0;
        for &fd in fds {
            libc::FD_SET(fd, &mut set);
            top = top.max(fd);
        }
        let mut tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
        libc::select(top + 1, &mut set, std::ptr::null_mut(), std::ptr::null_mut(), &mut tv)
    }
}

/// A TCP listener on 127.0.0.1 and a connection to it, accepted: the
/// listener and the accepted end (an iperf3 server's two TCP descriptors,
/// idle while the test runs). The connecting end is returned too, to keep
/// the connection open.
pub fn tcp_pair() -> [Fd; 3] {
    // SAFETY: plain socket calls on descriptors this function owns, with a
    // sockaddr_in of the size passed.
    unsafe {
        let l = check(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as libc::c_long, "socket") as Fd;
        let mut a: libc::sockaddr_in = zeroed();
        a.sin_family = libc::AF_INET as libc::sa_family_t;
        a.sin_addr.s_addr = u32::from_ne_bytes([127, 0, 0, 1]);
        let len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
        check(libc::bind(l, &a as *const _ as *const libc::sockaddr, len) as libc::c_long, "bind");
        check(libc::listen(l, 4) as libc::c_long, "listen");
        let mut n = len;
        check(libc::getsockname(l, &mut a as *mut _ as *mut libc::sockaddr, &mut n) as libc::c_long, "getsockname");
        let c = check(libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as libc::c_long, "socket") as Fd;
        check(libc::connect(c, &a as *const _ as *const libc::sockaddr, len) as libc::c_long, "connect");
        let ctl = check(libc::accept(l, std::ptr::null_mut(), std::ptr::null_mut()) as libc::c_long, "accept") as Fd;
        [l, ctl, c]
    }
}

/// `poll` for `POLLIN` on `fd`, 1 s timeout.
#[inline(always)]
pub fn poll(fd: Fd) -> libc::c_int {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one pollfd, alive for the call.
    unsafe { libc::poll(&mut p, 1, 1000) }
}

/// An epoll set watching `fd` for `EPOLLIN`, level-triggered.
pub fn epoll_for(fd: Fd) -> Fd {
    // SAFETY: a new epoll descriptor and an event struct alive for the call.
    unsafe {
        let ep = check(libc::epoll_create1(libc::EPOLL_CLOEXEC) as libc::c_long, "epoll_create1") as Fd;
        let mut ev = libc::epoll_event { events: libc::EPOLLIN as u32, u64: fd as u64 };
        check(libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) as libc::c_long, "epoll_ctl");
        ep
    }
}

/// `epoll_wait` for up to 8 events, 1 s timeout.
#[inline(always)]
pub fn epoll_wait(ep: Fd) -> libc::c_int {
    // SAFETY: room for the 8 events passed.
    unsafe {
        let mut evs: [libc::epoll_event; 8] = zeroed();
        libc::epoll_wait(ep, evs.as_mut_ptr(), 8, 1000)
    }
}

/// `SO_RCVTIMEO`, so a receive that finds nothing fails instead of hanging the run.
pub fn recv_timeout(fd: Fd, secs: i64) {
    let tv = libc::timeval { tv_sec: secs, tv_usec: 0 };
    // SAFETY: a timeval of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const _ as *const libc::c_void,
            size_of::<libc::timeval>() as libc::socklen_t,
        );
    }
}

/// Bytes queued in the kernel socket `fd` (`SIOCINQ`), asked through
/// `syscall(SYS_ioctl)`, which the shim passes to the kernel as it is: the
/// kernel socket's own queue, not the shim's view of the socket.
pub fn kernel_queued(fd: Fd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCINQ writes one int, alive for the call.
    let r = unsafe { libc::syscall(libc::SYS_ioctl, fd, libc::FIONREAD, &mut n as *mut libc::c_int) };
    if r < 0 {
        -1
    } else {
        n
    }
}
