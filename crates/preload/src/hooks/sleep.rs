//! The timed sleeps: `nanosleep`, `clock_nanosleep` and `usleep` (which
//! the C library implements without calling the interposed `nanosleep`).
//! A thread that goes to sleep queues no more sends until it wakes, so
//! what it queued that waits out its coalescing interval is sent first
//! (`before_sleep`), as before a sleeping `poll`: a sender that paces
//! itself with `usleep` otherwise adds the interval to every burst's
//! one-way latency. `sleep` (whole seconds) is left alone: the interval's
//! timer sends the remainder long before such a sleep ends.

use super::guard::{guard, Retry};
use super::ready::{before_sleep, no_wait};
use crate::real;
use libc::c_int;

#[no_mangle]
pub unsafe extern "C" fn nanosleep(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int {
    guard(-1, "nanosleep", Retry::Yes, || {
        // SAFETY: the caller passes `nanosleep`'s arguments under its C
        // contract; `req` is only read (when not null) and both go to libc
        // unchanged.
        unsafe {
            if !req.is_null() && !no_wait(req) {
                before_sleep();
            }
            real::nanosleep(req, rem)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn clock_nanosleep(
    clock: libc::clockid_t,
    flags: c_int,
    req: *const libc::timespec,
    rem: *mut libc::timespec,
) -> c_int {
    guard(-1, "clock_nanosleep", Retry::Yes, || {
        // SAFETY: as in `nanosleep`. An absolute deadline may already have
        // passed; sending the remainder early then costs a smaller batch.
        unsafe {
            if !req.is_null() && (flags & libc::TIMER_ABSTIME != 0 || !no_wait(req)) {
                before_sleep();
            }
            real::clock_nanosleep(clock, flags, req, rem)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn usleep(usec: libc::useconds_t) -> c_int {
    guard(-1, "usleep", Retry::Yes, || {
        if usec > 0 {
            before_sleep();
        }
        // SAFETY: `usleep` takes no pointer; the argument goes to libc unchanged.
        unsafe { real::usleep(usec) }
    })
}
