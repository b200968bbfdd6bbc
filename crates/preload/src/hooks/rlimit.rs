//! RLIMIT_NOFILE as the program sees it: its own soft limit, even while
//! `crate::fdspace` has it raised for a private descriptor, and its changes
//! of the limit serialized with those windows.

#![allow(clippy::missing_safety_doc)]

use super::guard::{guard, Retry};
use crate::fdspace::{self, window_count};
use crate::real;
use libc::c_int;

#[no_mangle]
pub unsafe extern "C" fn getrlimit(res: c_int, rl: *mut libc::rlimit) -> c_int {
    guard(-1, "getrlimit", Retry::Yes, || {
        let before = window_count();
        // SAFETY: the caller's pointer, as getrlimit's contract allows.
        let r = unsafe { real::getrlimit(res, rl) };
        if r == 0 && res == libc::RLIMIT_NOFILE as c_int && !rl.is_null() {
            // SAFETY: getrlimit just filled it.
            unsafe { (*rl).rlim_cur = fdspace::program_view((*rl).rlim_cur, before, window_count()) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn getrlimit64(res: c_int, rl: *mut libc::rlimit64) -> c_int {
    // SAFETY: rlimit and rlimit64 are one layout on 64-bit Linux.
    unsafe { getrlimit(res, rl as *mut libc::rlimit) }
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit(res: c_int, rl: *const libc::rlimit) -> c_int {
    guard(-1, "setrlimit", Retry::Yes, || {
        let _l = (res == libc::RLIMIT_NOFILE as c_int).then(fdspace::lock_limits);
        // SAFETY: the caller's pointer, as setrlimit's contract allows.
        unsafe { real::setrlimit(res, rl) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn setrlimit64(res: c_int, rl: *const libc::rlimit64) -> c_int {
    // SAFETY: rlimit and rlimit64 are one layout on 64-bit Linux.
    unsafe { setrlimit(res, rl as *const libc::rlimit) }
}

#[no_mangle]
pub unsafe extern "C" fn prlimit64(
    pid: libc::pid_t,
    res: c_int,
    new: *const libc::rlimit64,
    old: *mut libc::rlimit64,
) -> c_int {
    guard(-1, "prlimit64", Retry::Yes, || {
        let ours = res == libc::RLIMIT_NOFILE as c_int && fdspace::is_self(pid);
        let _l = (ours && !new.is_null()).then(fdspace::lock_limits);
        let before = window_count();
        // SAFETY: the caller's pointers, as prlimit's contract allows.
        let r = unsafe { real::prlimit64(pid, res, new, old) };
        if r == 0 && ours && !old.is_null() {
            // SAFETY: prlimit just filled it.
            unsafe { (*old).rlim_cur = fdspace::program_view((*old).rlim_cur, before, window_count()) };
        }
        r
    })
}

#[no_mangle]
pub unsafe extern "C" fn prlimit(
    pid: libc::pid_t,
    res: c_int,
    new: *const libc::rlimit,
    old: *mut libc::rlimit,
) -> c_int {
    // SAFETY: rlimit and rlimit64 are one layout on 64-bit Linux.
    unsafe { prlimit64(pid, res, new as *const libc::rlimit64, old as *mut libc::rlimit64) }
}

#[no_mangle]
pub unsafe extern "C" fn getdtablesize() -> c_int {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: a live rlimit out.
    if unsafe { getrlimit(libc::RLIMIT_NOFILE as c_int, &mut r) } == 0 {
        r.rlim_cur.min(c_int::MAX as u64) as c_int
    } else {
        // SAFETY: no arguments.
        unsafe { real::getdtablesize() }
    }
}

#[no_mangle]
pub unsafe extern "C" fn sysconf(name: c_int) -> libc::c_long {
    if name == libc::_SC_OPEN_MAX {
        let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: a live rlimit out.
        if unsafe { getrlimit(libc::RLIMIT_NOFILE as c_int, &mut r) } == 0 {
            return if r.rlim_cur == libc::RLIM_INFINITY {
                -1
            } else {
                r.rlim_cur.min(libc::c_long::MAX as u64) as libc::c_long
            };
        }
    }
    // SAFETY: sysconf takes any name.
    unsafe { real::sysconf(name) }
}
