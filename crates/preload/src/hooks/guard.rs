//! No panic of the shim reaches the program: every hook body runs through
//! [`guard`]. A panic is logged once per (socket, call) at error level,
//! counted in the stats report (`panics`), moves the socket to the kernel
//! path ([`crate::shim::Sock::fallback`]) and the call is made again,
//! where it has no partial effect to repeat; otherwise, or when the retry
//! panics too, the call fails with `EIO`.
//!
//! `catch_unwind` costs nothing while nothing panics; the test-only panic
//! switch ([`eudp_engine::testpanic`]) costs one relaxed load.
//! A panic inside an endpoint borrow leaves this thread's hazard slot
//! naming the socket: its endpoint is then leaked at close, not freed.

use crate::shim;
use crate::sys::set_errno;
use eudp_engine::failure;
use libc::c_int;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;

/// Whether a call whose body panicked may be made again.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Retry {
    Yes,
    /// The call may have done part of its work (closed a descriptor,
    /// sent some messages): it fails with `EIO` instead.
    No,
}

/// A hook's result that reports failure with `EIO`.
pub(super) trait Failed {
    fn eio() -> Self;
}

macro_rules! minus_one {
    ($($t:ty),*) => {$(
        impl Failed for $t {
            fn eio() -> Self {
                set_errno(libc::EIO);
                -1
            }
        }
    )*};
}
minus_one!(i32, i64, isize);

impl Failed for () {
    fn eio() {}
}

impl Failed for libc::sighandler_t {
    fn eio() -> Self {
        set_errno(libc::EIO);
        libc::SIG_ERR
    }
}

/// Runs the body of the hook `call` on descriptor `fd` (-1: none), with a
/// panic in it contained (see the module's comment).
#[inline(always)]
pub(super) fn guard<R: Failed>(fd: c_int, call: &'static str, retry: Retry, body: impl Fn() -> R) -> R {
    let first = catch_unwind(AssertUnwindSafe(|| {
        // Counted on the program's sockets only: the engine's own calls
        // reach these symbols too.
        if eudp_engine::testpanic::armed() && fd >= 0 && shim::maybe(fd) {
            eudp_engine::testpanic::point("hook", call);
        }
        body()
    }));
    match first {
        Ok(r) => r,
        Err(p) => after_panic(fd, call, retry, &*p, body),
    }
}

#[cold]
#[inline(never)]
fn after_panic<R: Failed>(
    fd: c_int,
    call: &'static str,
    retry: Retry,
    p: &(dyn std::any::Any + Send),
    body: impl Fn() -> R,
) -> R {
    let msg = failure::take_message(p);
    failure::PANICS.fetch_add(1, Relaxed);
    if first_for(fd, call) {
        eudp_engine::log::write(
            eudp_engine::log::Level::Error,
            format_args!("panic in {call} on fd {fd}: {msg}; the socket goes on on the kernel path"),
        );
    }
    let moved = catch_unwind(AssertUnwindSafe(|| {
        if fd >= 0 {
            if let Some(s) = shim::lookup(fd) {
                s.fallback(fd, &format!("panic in {call}"));
            }
        }
    }))
    .is_ok();
    if !moved || retry == Retry::No {
        return R::eio();
    }
    catch_unwind(AssertUnwindSafe(body)).unwrap_or_else(|_| {
        failure::PANICS.fetch_add(1, Relaxed);
        R::eio()
    })
}

/// True the first time (socket, call) panics in this process.
fn first_for(fd: c_int, call: &'static str) -> bool {
    static SEEN: Mutex<Vec<(c_int, &'static str)>> = Mutex::new(Vec::new());
    // A lock a fork left held in the child is never released: give up
    // on the bookkeeping (and log) rather than wait.
    for _ in 0..1000 {
        match SEEN.try_lock() {
            Ok(mut g) => return add(&mut g, fd, call),
            Err(std::sync::TryLockError::Poisoned(e)) => return add(&mut e.into_inner(), fd, call),
            Err(std::sync::TryLockError::WouldBlock) => std::thread::yield_now(),
        }
    }
    true
}

fn add(seen: &mut Vec<(c_int, &'static str)>, fd: c_int, call: &'static str) -> bool {
    if seen.contains(&(fd, call)) {
        return false;
    }
    seen.push((fd, call));
    true
}
