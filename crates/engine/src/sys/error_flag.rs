//! A descriptor that polls as an error: how a socket's asynchronous error,
//! taken off the kernel socket by the engine, still reaches a program's
//! poll or epoll set.

use super::cvt;
use crate::fdspace::{new_private, Private};
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{
    AtomicI32,
    Ordering::{Acquire, Relaxed, Release},
};
use std::sync::{Arc, OnceLock};

/// A descriptor that reports `POLLERR`/`EPOLLERR` (and nothing else) while
/// raised: an application's poll or epoll set can hold it next to a
/// socket whose asynchronous error the engine took off the kernel socket,
/// so the set reports that error as the kernel socket would have, level-
/// or edge-triggered, rather than as input.
///
/// Unnamed (autobound) `AF_UNIX` datagram sockets: each flag's own `a`,
/// connected to `b`, one socket the process's flags share (one descriptor
/// per flag, not two). Raising connects `b` to `a`, queues one byte at `b`
/// from `a` and disconnects `b`, which discards the byte and sets `a`'s
/// pending error (`ECONNRESET`, the kernel's signal that one side of a
/// connected datagram pair went away) with an error wake-up; clearing
/// reads `a`'s `SO_ERROR`. `a` never receives anything, so it is never
/// readable, and it is polled for input only. Raises are serialized (they
/// share `b`'s peer); a fork child makes its own `b`.
#[derive(Debug)]
pub struct ErrorFlag {
    a: Private<OwnedFd>,
    b: Arc<SharedEnd>,
    /// `a`'s name, given at the first raise: only a raise needs it, and
    /// the bind and `getsockname` were a sixth of a socket's adoption.
    a_name: OnceLock<(libc::sockaddr_un, libc::socklen_t)>,
}

/// The `b` end shared by a process's error flags.
#[derive(Debug)]
struct SharedEnd {
    fd: Private<OwnedFd>,
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
    pid: libc::pid_t,
}

/// The process's shared end; held by each flag too, so it outlives them.
/// Guarded by `END_HOLDER` (which also serializes raises) rather than a
/// mutex: a fork child takes over a lock its parent's thread held.
static SHARED_END: EndSlot = EndSlot(std::cell::UnsafeCell::new(None));

struct EndSlot(std::cell::UnsafeCell<Option<Arc<SharedEnd>>>);

// SAFETY: the cell is only reached through `EndLock::slot`, with the lock held.
unsafe impl Sync for EndSlot {}

/// Pid of the process holding the shared end (0: free).
static END_HOLDER: AtomicI32 = AtomicI32::new(0);

struct EndLock;

impl Drop for EndLock {
    fn drop(&mut self) {
        END_HOLDER.store(0, Release);
    }
}

impl AsRawFd for ErrorFlag {
    fn as_raw_fd(&self) -> RawFd {
        self.a.as_raw_fd()
    }
}

/// A nonblocking close-on-exec `AF_UNIX` datagram socket, unnamed.
fn unix_dgram() -> io::Result<Private<OwnedFd>> {
    new_private(|| {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = cvt(unsafe {
            libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0)
        })?;
        // SAFETY: fresh fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    })
}

/// Gives an `AF_UNIX` socket an autobound (abstract) name; returns it.
fn autobind(fd: RawFd) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    // SAFETY: an address of just the family asks for an autobound
    // (abstract) name; getsockname writes within `addr`'s size.
    let len = unsafe {
        cvt(libc::bind(
            fd,
            &addr as *const _ as *const libc::sockaddr,
            size_of::<libc::sa_family_t>() as libc::socklen_t,
        ))?;
        let mut len = size_of::<libc::sockaddr_un>() as libc::socklen_t;
        cvt(libc::getsockname(fd, &mut addr as *mut _ as *mut libc::sockaddr, &mut len))?;
        len
    };
    Ok((addr, len))
}

/// [`unix_dgram`] with an autobound name, and that name.
fn unix_autobound() -> io::Result<(Private<OwnedFd>, libc::sockaddr_un, libc::socklen_t)> {
    let fd = unix_dgram()?;
    let (addr, len) = autobind(fd.as_raw_fd())?;
    Ok((fd, addr, len))
}

fn lock_end() -> EndLock {
    // SAFETY: getpid has no preconditions.
    let me = unsafe { libc::getpid() };
    loop {
        match END_HOLDER.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => return EndLock,
            Err(h) if h != me && END_HOLDER.compare_exchange(h, me, Acquire, Relaxed).is_ok() => return EndLock,
            Err(_) => std::thread::yield_now(),
        }
    }
}

impl EndLock {
    /// The shared end's slot.
    fn slot(&mut self) -> &mut Option<Arc<SharedEnd>> {
        // SAFETY: this process holds END_HOLDER while `self` lives, and
        // `&mut self` makes this the one reference through it.
        unsafe { &mut *SHARED_END.0.get() }
    }
}

impl ErrorFlag {
    /// A lowered flag.
    pub fn new() -> io::Result<Self> {
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let b = {
            let mut l = lock_end();
            let g = l.slot();
            match g.as_ref().filter(|e| e.pid == pid) {
                Some(e) => e.clone(),
                None => {
                    let (fd, addr, len) = unix_autobound()?;
                    // An end inherited across fork stays with the flags
                    // that hold it (the parent's, never raised here).
                    let e = Arc::new(SharedEnd { fd, addr, len, pid });
                    *g = Some(e.clone());
                    e
                }
            }
        };
        let a = unix_dgram()?;
        // SAFETY: the shared end's address and length as getsockname returned them.
        cvt(unsafe { libc::connect(a.as_raw_fd(), &b.addr as *const _ as *const libc::sockaddr, b.len) })?;
        Ok(ErrorFlag { a, b, a_name: OnceLock::new() })
    }

    /// Raises the flag: `a` reports an error until [`ErrorFlag::clear`].
    pub fn raise(&self) {
        let _serial = lock_end();
        // (Raises are serialized, so one thread names `a`.)
        let (a_addr, a_len) = match self.a_name.get() {
            Some(n) => *n,
            None => match autobind(self.a.as_raw_fd()) {
                Ok(n) => *self.a_name.get_or_init(|| n),
                Err(_) => return,
            },
        };
        let b = self.b.fd.as_raw_fd();
        let unspec = libc::sockaddr { sa_family: libc::AF_UNSPEC as libc::sa_family_t, sa_data: [0; 14] };
        // SAFETY: addresses and lengths of live values; one byte from a live
        // buffer. A failure leaves the flag down (as before the call).
        unsafe {
            libc::connect(b, &a_addr as *const _ as *const libc::sockaddr, a_len);
            libc::send(
                self.a.as_raw_fd(),
                b"!".as_ptr() as *const libc::c_void,
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            );
            libc::connect(b, &unspec, size_of::<libc::sockaddr>() as libc::socklen_t);
        }
    }

    /// Lowers the flag.
    pub fn clear(&self) {
        let mut v: libc::c_int = 0;
        let mut len = size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: pointer/length of a live c_int.
        unsafe {
            libc::getsockopt(
                self.a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                &mut v as *mut _ as *mut libc::c_void,
                &mut len,
            )
        };
    }
}

#[cfg(test)]
mod error_flag_tests {
    use super::*;

    fn pollerr(f: &ErrorFlag) -> bool {
        let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd.
        unsafe { libc::poll(&mut p, 1, 0) };
        p.revents & libc::POLLIN == 0 && p.revents & libc::POLLERR != 0
    }

    /// Flags share one end, yet each goes up and down on its own.
    #[test]
    fn flags_sharing_an_end_rise_and_fall_alone() {
        let (a, b) = (ErrorFlag::new().unwrap(), ErrorFlag::new().unwrap());
        assert!(Arc::ptr_eq(&a.b, &b.b));
        assert!(!pollerr(&a) && !pollerr(&b));
        a.raise();
        assert!(pollerr(&a) && !pollerr(&b));
        b.raise();
        a.clear();
        assert!(!pollerr(&a) && pollerr(&b));
        b.clear();
        drop(a);
        b.raise();
        assert!(pollerr(&b));
    }
}
