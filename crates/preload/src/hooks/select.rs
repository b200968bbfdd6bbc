//! select and pselect, emulated over poll for accelerated sockets.

use super::fail;
use super::guard::{guard, Retry};
use super::poll::poll_impl;
use super::ready::{before_sleep, may_skip_kernel, no_wait};
use crate::real;
use crate::shim::{self, with_sock_in, with_tls, Tls, ACTIVE};
use libc::c_int;
use std::time::Duration;

/// A select answered from what the shim knows alone, as `poll_input_once`
/// answers a poll (see `may_skip_kernel`), without building its pollfd
/// array: every accelerated socket named is on the engine and not in the
/// except set, each one in the write set has room in L1 (`POLLOUT`), and at
/// least one named is ready — for input, datagrams in its ring, or more
/// read right here for a stream that is arriving (`ready_or_fill`), or a
/// pending error. Accelerated sockets not ready and the other descriptors
/// are reported not ready, as on that path. `None`: take the general path.
///
/// Under the TCP transport too: its ring is the same ring, and a ring with
/// data (or a fill that brought some) is readable whatever the backend's
/// descriptor says; only an empty ring needs that descriptor polled, which
/// the general path does when the kernel is asked.
unsafe fn select_from_rings(
    t: &Tls,
    n: usize,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
) -> Option<c_int> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        // Most programs' sets fit one word (descriptors below 64): their
        // answer is built in one word, not in two zeroed FD_SETSIZE bit
        // arrays (which cost a tenth of such a call).
        if n <= 64 {
            select_words::<1>(t, n, r, w, e)
        } else {
            select_words::<{ libc::FD_SETSIZE / 64 }>(t, n, r, w, e)
        }
    }
}

/// [`select_from_rings`] for sets of at most `WORDS` 64-bit words.
#[inline(always)]
unsafe fn select_words<const WORDS: usize>(
    t: &Tls,
    n: usize,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
) -> Option<c_int> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let word = |set: *mut libc::fd_set, i: usize| if set.is_null() { 0 } else { fd_word(set, i) };
        let mut rd = [0u64; WORDS];
        let mut wr = [0u64; WORDS];
        let mut count = 0;
        debug_assert!(n.div_ceil(64) <= WORDS);
        // (`min`: no bound check on the arrays below.)
        let words = n.div_ceil(64).min(WORDS);
        for i in 0..words {
            let valid = if (i + 1) * 64 > n { (1u64 << (n % 64)) - 1 } else { u64::MAX };
            let mut except = word(e, i) & valid;
            while except != 0 {
                let b = except.trailing_zeros();
                except &= except - 1;
                if shim::maybe((i * 64) as c_int + b as c_int) {
                    return None;
                }
            }
            let (rw, ww) = (word(r, i) & valid, word(w, i) & valid);
            let mut any = rw | ww;
            while any != 0 {
                let b = any.trailing_zeros();
                any &= any - 1;
                let fd = (i * 64) as c_int + b as c_int;
                if !shim::maybe(fd) {
                    continue;
                }
                let bit = 1u64 << b;
                let (input, output) = (rw & bit != 0, ww & bit != 0);
                let (readable, writable) = with_sock_in(t, fd, |s| {
                    if s.mode() != ACTIVE {
                        return None;
                    }
                    if input && !output && s.ring_has_data() {
                        // The common case, without touching the endpoint.
                        return Some((true, false));
                    }
                    s.with_existing_in(t, |ep| {
                        let writable = output && ep.writable();
                        // A full L1 is `poll_impl`'s business (it waits on it).
                        (writable || !output).then(|| (input && ep.ready_or_fill(), writable))
                    })
                    .flatten()
                })
                .flatten()?;
                if readable {
                    rd[i] |= bit;
                    count += 1;
                }
                if writable {
                    wr[i] |= bit;
                    count += 1;
                }
            }
        }
        if count == 0 || !may_skip_kernel(t) {
            return None;
        }
        for i in 0..words {
            for (set, bits) in [(r, rd[i]), (w, wr[i]), (e, 0)] {
                if !set.is_null() {
                    std::ptr::write_unaligned((set as *mut u64).add(i), bits);
                }
            }
        }
        Some(count)
    }
}

/// Word `i` (descriptors `64 i .. 64 i + 63`) of a non-null `fd_set`,
/// which is an array of `FD_SETSIZE` bits in 64-bit words on Linux.
unsafe fn fd_word(set: *const libc::fd_set, i: usize) -> u64 {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        const _: () = assert!(std::mem::size_of::<libc::fd_set>() * 8 == libc::FD_SETSIZE);
        debug_assert!(i < libc::FD_SETSIZE / 64);
        std::ptr::read_unaligned((set as *const u64).add(i))
    }
}

/// select/pselect past [`select_from_rings`], through `poll_impl` when an
/// accelerated socket is named: `None` when none is (the kernel's select
/// then serves the call as is). `n` is clamped to `FD_SETSIZE`.
unsafe fn select_polled(
    t: &Tls,
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> Option<c_int> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        {
            let mut fresh = Vec::new();
            let mut guard = t.select_fds.try_borrow_mut().ok();
            let p: &mut Vec<libc::pollfd> = guard.as_deref_mut().unwrap_or(&mut fresh);
            p.clear();
            let mut named = false;
            // Word by word: a program's sets are mostly empty, and a bit test
            // per descriptor cost a tenth of a select-driven receiver's time.
            let word = |set: *mut libc::fd_set, i: usize| if set.is_null() { 0 } else { fd_word(set, i) };
            let n = n as usize;
            for i in 0..n.div_ceil(64) {
                let (rw, ww, ew) = (word(r, i), word(w, i), word(e, i));
                let mut any = rw | ww | ew;
                if (i + 1) * 64 > n {
                    any &= (1u64 << (n % 64)) - 1;
                }
                while any != 0 {
                    let b = any.trailing_zeros();
                    any &= any - 1;
                    let bit = 1u64 << b;
                    let mut ev = 0;
                    if rw & bit != 0 {
                        ev |= libc::POLLIN;
                    }
                    if ww & bit != 0 {
                        ev |= libc::POLLOUT;
                    }
                    if ew & bit != 0 {
                        ev |= libc::POLLPRI;
                    }
                    let fd = (i * 64) as c_int + b as c_int;
                    if !named && shim::maybe(fd) {
                        named = with_sock_in(t, fd, |s| {
                            s.mode() == ACTIVE
                                || s.has_leftover()
                                || (shim::bypass_transport() && s.endpoint(fd).is_some())
                        })
                        .unwrap_or(false);
                    }
                    p.push(libc::pollfd { fd, events: ev, revents: 0 });
                }
            }
            if !named {
                return None;
            }
            let k = poll_impl(t, p.as_mut_ptr(), p.len() as libc::nfds_t, ts, mask);
            if k < 0 {
                return Some(k);
            }
            if p.iter().any(|x| x.revents & libc::POLLNVAL != 0) {
                return Some(fail(libc::EBADF));
            }
            // The kernel writes back the first n bits rounded up to a word,
            // leaving the rest of each set as the caller had it.
            for set in [r, w, e] {
                if !set.is_null() {
                    for i in 0..n.div_ceil(64) {
                        std::ptr::write_unaligned((set as *mut u64).add(i), 0);
                    }
                }
            }
            let mut count = 0;
            for x in p.iter() {
                if x.events & libc::POLLIN != 0 && x.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    libc::FD_SET(x.fd, r);
                    count += 1;
                }
                if x.events & libc::POLLOUT != 0 && x.revents & (libc::POLLOUT | libc::POLLERR) != 0 {
                    libc::FD_SET(x.fd, w);
                    count += 1;
                }
                if x.events & libc::POLLPRI != 0 && x.revents & libc::POLLPRI != 0 {
                    libc::FD_SET(x.fd, e);
                    count += 1;
                }
            }
            Some(count)
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn select(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    t: *mut libc::timeval,
) -> c_int {
    guard(-1, "select", Retry::Yes, || {
        // SAFETY: the caller passes `select`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if !shim::any() {
                return real::select(n, r, w, e, t);
            }
            let ts =
                (!t.is_null()).then(|| libc::timespec { tv_sec: (*t).tv_sec, tv_nsec: ((*t).tv_usec * 1000) as _ });
            let (k, slept) = with_tls(|tl| {
                // A streaming receiver's select is answered from the rings
                // without sleeping: no mark to set and restore (copying the
                // mark in and out cost a tenth of such a call).
                let nc = n.clamp(0, libc::FD_SETSIZE as c_int);
                if let Some(k) = select_from_rings(tl, nc as usize, r, w, e) {
                    return (Some(k), None);
                }
                let outer = tl.sleep_mark.replace((true, None));
                let k = select_polled(
                    tl,
                    nc,
                    r,
                    w,
                    e,
                    ts.as_ref().map_or(std::ptr::null(), |x| x as *const _),
                    std::ptr::null(),
                );
                (k, tl.sleep_mark.replace(outer).1)
            });
            let Some(k) = k else {
                if t.is_null() || (*t).tv_sec != 0 || (*t).tv_usec != 0 {
                    before_sleep();
                }
                return real::select(n, r, w, e, t);
            };
            if let (Some(x), Some(start)) = (ts, slept) {
                // Linux writes back the time not slept; a call answered without
                // sleeping used (well) under a microsecond and leaves it unchanged.
                let total = Duration::new(x.tv_sec.max(0) as u64, x.tv_nsec.max(0) as u32);
                let left = total.saturating_sub(start.elapsed());
                (*t).tv_sec = left.as_secs() as libc::time_t;
                (*t).tv_usec = left.subsec_micros() as libc::suseconds_t;
            }
            k
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn pselect(
    n: c_int,
    r: *mut libc::fd_set,
    w: *mut libc::fd_set,
    e: *mut libc::fd_set,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    guard(-1, "pselect", Retry::Yes, || {
        // SAFETY: the caller passes `pselect`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if !shim::any() {
                return real::pselect(n, r, w, e, ts, mask);
            }
            let nc = n.clamp(0, libc::FD_SETSIZE as c_int);
            match with_tls(|t| {
                select_from_rings(t, nc as usize, r, w, e).or_else(|| select_polled(t, nc, r, w, e, ts, mask))
            }) {
                Some(k) => k,
                None => {
                    if !no_wait(ts) {
                        before_sleep();
                    }
                    real::pselect(n, r, w, e, ts, mask)
                }
            }
        }
    })
}
