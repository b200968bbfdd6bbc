//! The interposed C functions. Every function here has the exact C
//! signature of the libc function it replaces (variadic `fcntl`/`ioctl`
//! take their one optional argument as a register-sized integer or pointer,
//! which is how the Linux ABIs pass it).
//!
//! Safety policy: the application's pointers are used only as the C
//! contract of the replaced function allows (buffers of the stated length,
//! `msghdr`s whose iovecs and names are valid), for the duration of the
//! call; anything else goes to libc unchanged. Calls on descriptors that
//! are not the application's UDP sockets go straight to libc.
//!
//! By call family: `recv`, `send`, `fd` (descriptors: socket, close, dup,
//! bind, connect, fcntl, ioctl, ...), `sockopt`, `poll`, `select` and
//! `epoll` over `ready` (readiness shared by the three), `sleep` (the timed
//! sleeps, which send what waits out its coalescing interval first), and `process`
//! (syscall(), exec, fork, signals, exit, the constructor), `rlimit`
//! (RLIMIT_NOFILE as the program sees it); `args` decodes
//! the C arguments. This module holds what they share: errno results and
//! the socket lookup with this thread's state.

#![allow(clippy::missing_safety_doc)]

mod args;
mod epoll;
mod fd;
mod guard;
mod poll;
mod process;
mod ready;
mod recv;
mod rlimit;
mod select;
mod send;
mod sleep;
mod sockopt;

use crate::shim::{self, with_sock_in, with_tls, Sock, Tls};
use crate::sys::set_errno;
use libc::{c_int, ssize_t};
use std::sync::Arc;

fn fail<T: From<i8>>(e: c_int) -> T {
    set_errno(e);
    T::from(-1)
}

/// [`shim::with_sock`] handing `f` this thread's [`Tls`] as well, looked up once
/// for the whole call (and not at all for a descriptor the shim does not
/// know).
#[inline]
fn with_sock_t<R>(fd: c_int, f: impl FnOnce(&Tls, &Arc<Sock>) -> R) -> Option<R> {
    if !shim::maybe(fd) {
        return None;
    }
    with_tls(|t| with_sock_in(t, fd, |s| f(t, s)))
}

fn ret_isize(r: Result<usize, c_int>) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(e),
    }
}
