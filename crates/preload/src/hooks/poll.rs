//! poll and ppoll over a mix of kernel descriptors and accelerated sockets.

use super::guard::{guard, Retry};
use super::ready::{
    before_sleep, claim_error, kernel_checked, mark_sleep, may_skip_kernel, no_wait, ring_events_of, scan_ready, Extra,
    EXTRA_MAX, NO_RING,
};
use crate::real;
use crate::shim::{self, lookup, with_sock_in, with_tls, Tls};
use crate::sys::{errno, set_errno};
use eudp_engine::Endpoint;
use libc::{c_int, size_t};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// poll/ppoll over a mix of kernel fds and accelerated sockets: an
/// accelerated socket is readable when its kernel socket is (the receive
/// then reads it directly) or its ring holds a datagram (an extra pollfd
/// on the ring's eventfd).
pub(super) unsafe fn poll_impl(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        if !shim::any() || fds.is_null() || n == 0 {
            return real::ppoll(fds, n, ts, mask);
        }
        let app = std::slice::from_raw_parts_mut(fds, n as usize);
        if !app.iter().any(|p| p.events & libc::POLLOUT != 0 && queue_full(t, p.fd)) {
            // Every accelerated socket asked for output has room in L1, as
            // just looked at: `scan_ready` need not look again.
            return poll_input(t, fds, n, ts, mask, true);
        }
        // Some accelerated socket asked for output has its L1 queue half full
        // or more: the kernel socket would say writable, the engine would not
        // take a send. Report POLLOUT only with room: look at everything
        // without sleeping, then sleep on that queue — the engine wakes it the
        // moment it takes L1 — for at most a slice, so the other descriptors
        // are looked at again at least that often.
        const SLICE: Duration = Duration::from_millis(1);
        let deadline = (!ts.is_null()).then(|| Instant::now() + duration_of(&*ts));
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        loop {
            let r = poll_input(t, fds, n, &zero, mask, false);
            if r < 0 {
                return r;
            }
            let mut count = 0;
            let mut full = None;
            for p in app.iter_mut() {
                if p.events & libc::POLLOUT != 0 {
                    if let Some(ep) = full_queue(t, p.fd) {
                        p.revents &= !libc::POLLOUT;
                        full.get_or_insert(ep);
                    }
                }
                if p.revents != 0 {
                    count += 1;
                }
            }
            let now = Instant::now();
            if count > 0 || deadline.is_some_and(|d| now >= d) {
                return count;
            }
            match full {
                Some(ep) => {
                    mark_sleep(t, std::ptr::null());
                    ep.wait_writable(deadline.map_or(SLICE, |d| (d - now).min(SLICE)));
                }
                // Every queue has room but nothing is ready yet: the kernel
                // sleeps until something is (or the time is up), then the
                // queues are looked at again.
                None => {
                    let left = deadline.map(|d| {
                        let l = d.saturating_duration_since(Instant::now());
                        timespec_of(l)
                    });
                    let r =
                        poll_input(t, fds, n, left.as_ref().map_or(std::ptr::null(), |x| x as *const _), mask, false);
                    if r <= 0 {
                        return r;
                    }
                }
            }
        }
    }
}

/// True when `fd` is an accelerated socket whose L1 queue has no room
/// (lock-free: the common, writable case costs no reference).
fn queue_full(t: &Tls, fd: c_int) -> bool {
    with_sock_in(t, fd, |s| s.with_existing_in(t, |ep| !ep.writable())).flatten().unwrap_or(false)
}

/// The endpoint of an accelerated socket whose L1 queue has no room.
fn full_queue(t: &Tls, fd: c_int) -> Option<Arc<Endpoint>> {
    with_sock_in(t, fd, |s| s.existing()).flatten().filter(|ep| !ep.writable())
}

/// poll for input readiness, spinning first when the settings ask for it
/// (`EUDP_SPIN_US`) and an accelerated socket is polled for input: the
/// call looks at everything without sleeping, yielding the CPU between
/// looks, until something is ready or the spin is over, and only then
/// sleeps: a reply that comes within the spin costs no sleep and wake-up
/// (the latency profile). Kernel descriptors are looked at in every round
/// as well. For a stream it does not pay on a small machine: a receiver
/// that spins spends more CPU per datagram and so keeps up with less.
/// `room`: every accelerated socket asked for output was just found to
/// have room in L1.
unsafe fn poll_input(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
) -> c_int {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let limit = (!ts.is_null()).then(|| duration_of(&*ts));
        let spin = match shim::running_engine() {
            Some(e) => e.config().recv_spin.min(limit.unwrap_or(Duration::MAX)),
            None => Duration::ZERO,
        };
        let app = std::slice::from_raw_parts(fds, n as usize);
        if spin.is_zero() || !app.iter().any(|p| p.events & libc::POLLIN != 0 && shim::maybe(p.fd)) {
            return poll_input_once(t, fds, n, ts, mask, room);
        }
        mark_sleep(t, ts);
        // A signal ends this call with EINTR as it would the kernel's poll,
        // even one that arrives while the spin runs in user space (see
        // `spin_then_wait`). eudp's own threads block the asynchronous
        // signals for good, so a signal sent to the process waits for an
        // application thread rather than going to one of them.
        spin_then_wait(
            spin,
            mask,
            |during| poll_input_once(t, fds, n, &zero, during, false),
            |during, spent| {
                let left = limit.map(|l| timespec_of(l.saturating_sub(spent)));
                poll_input_once(t, fds, n, left.as_ref().map_or(std::ptr::null(), |x| x as *const _), during, false)
            },
        )
    }
}

/// The spinning wait of `poll`/`select` and of `epoll`: `look` (which
/// must not sleep) is made until it returns nonzero or `spin` has passed,
/// then `wait` for the rest of the call's time (given the time spent).
/// Both get the mask to wait with and must put it in place for their
/// system call. The CPU is given up every fourth look, not after each: a
/// yield with nobody else to run still goes through the scheduler, as the
/// engine's spinning receive does (`SPIN_YIELD_EVERY`).
///
/// A signal must end the call with `EINTR` as it would the kernel's wait,
/// even one whose handler runs while the spin is in user space. Without a
/// mask of the caller's (`poll`, `select`, `epoll_wait`) the spin runs with
/// the signals as they are and compares the thread's count of handler runs
/// (`sigrelay::handlers_run`) after each look: no system call for signals
/// while it spins. Only from its last look to its return does it hold the
/// asynchronous signals blocked, and it sleeps in a `wait` given the
/// caller's mask, which takes a signal pending since and fails with
/// `EINTR`: a handler run between that look and the sleep would otherwise
/// leave nothing for the sleep to fail for. With a mask (`ppoll`,
/// `pselect`, `epoll_pwait`), which the spin's looks could not apply
/// without a system call each, the signals stay blocked for the whole call
/// and every look and the sleep take that mask. The thread's mask and the
/// call's errno are as they should be after.
pub(super) unsafe fn spin_then_wait(
    spin: Duration,
    mask: *const libc::sigset_t,
    mut look: impl FnMut(*const libc::sigset_t) -> c_int,
    wait: impl FnOnce(*const libc::sigset_t, Duration) -> c_int,
) -> c_int {
    let counted = mask.is_null();
    let handled_at = crate::sys::sigrelay::handlers_run();
    let interrupted = || counted && crate::sys::sigrelay::handlers_run() != handled_at;
    let mut held = (!counted).then(eudp_engine::sys::process::AsyncSignalsBlocked::new);
    let start = Instant::now();
    let mut looks: u32 = 0;
    let r = loop {
        let during: *const libc::sigset_t = match &held {
            Some(_) if !mask.is_null() => mask,
            Some(h) => h.mask_before(),
            None => std::ptr::null(),
        };
        let r = look(during);
        if r != 0 {
            break r;
        }
        if interrupted() {
            set_errno(libc::EINTR);
            break -1;
        }
        looks += 1;
        let spent = start.elapsed();
        if spent >= spin {
            if held.is_none() {
                let h = held.insert(eudp_engine::sys::process::AsyncSignalsBlocked::new());
                // A handler that ran since the last look: none can run now.
                if interrupted() {
                    set_errno(libc::EINTR);
                    break -1;
                }
                break wait(h.mask_before(), spent);
            }
            break wait(during, spent);
        }
        #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
        if looks % 4 == 0 {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    };
    let e = errno();
    drop(held);
    set_errno(e);
    r
}

/// One look at the readiness of accelerated sockets (ring, L1 and socket).
///
/// An accelerated socket whose ring holds a datagram is readable without a
/// syscall; so is one whose ring was empty but whose socket, read right
/// here because a stream is arriving (see `Endpoint::ready_or_fill`),
/// gave more; one asked for output is writable while its L1 has room (a
/// streaming sender's select then costs no syscall). Such calls are
/// answered from what the shim knows alone (see
/// `may_skip_kernel`); otherwise the kernel is asked about everything, the
/// rings' eventfds included, and sleeps if nothing is ready.
unsafe fn poll_input_once(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
) -> c_int {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let app = std::slice::from_raw_parts_mut(fds, n as usize);
        // Left uninitialised: a call names one or two accelerated sockets, and
        // filling the whole array cost more than the rest of the scan.
        let mut fixed = [std::mem::MaybeUninit::<Extra>::uninit(); EXTRA_MAX];
        let mut k = 0;
        let mut many: Vec<Extra> = Vec::new();
        scan_ready(t, app, room, |e| {
            if k < EXTRA_MAX {
                fixed[k].write(e);
                k += 1;
            } else {
                if many.is_empty() {
                    // SAFETY: all EXTRA_MAX entries were written (k reached it).
                    many.extend(fixed.iter().map(|x| x.assume_init()));
                }
                many.push(e);
            }
        });
        // SAFETY: the first k entries were written above.
        let extra: &[Extra] =
            if many.is_empty() { std::slice::from_raw_parts(fixed.as_ptr() as *const Extra, k) } else { &many };
        if extra.is_empty() {
            if !no_wait(ts) {
                before_sleep();
            }
            return real::ppoll(fds, n, ts, mask);
        }
        if extra.iter().any(|e| e.fd == NO_RING) {
            return poll_without_rings(t, fds, n, ts, mask, room, extra);
        }
        let ready_now = extra.iter().any(|e| e.ready != 0);
        if ready_now && !extra.iter().any(|e| e.ask) && may_skip_kernel(t) {
            for p in app.iter_mut() {
                p.revents = 0;
            }
            let mut count = 0;
            for e in extra {
                if e.ready != 0 {
                    count += c_int::from(app[e.at].revents == 0);
                    app[e.at].revents |= e.ready;
                }
            }
            return count;
        }
        kernel_checked(t);
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        let mut wait = if ready_now { &zero as *const _ } else { ts };
        if !ready_now {
            mark_sleep(t, ts);
        }
        let _polling = if ready_now || (!ts.is_null() && (*ts).tv_sec == 0 && (*ts).tv_nsec == 0) {
            Polling::default()
        } else {
            polling(t, app)
        };
        let deadline = (!ts.is_null()).then(|| Instant::now() + duration_of(&*ts));
        let mut left;
        loop {
            // A signal handler polling inside a poll gets its own array.
            let mut fresh = Vec::new();
            let mut guard = t.poll_all.try_borrow_mut().ok();
            let all: &mut Vec<libc::pollfd> = guard.as_deref_mut().unwrap_or(&mut fresh);
            all.clear();
            all.extend_from_slice(app);
            all.extend(extra.iter().map(|e| libc::pollfd { fd: e.fd, events: libc::POLLIN, revents: 0 }));
            let r = real::ppoll(all.as_mut_ptr(), all.len() as libc::nfds_t, wait, mask);
            if r < 0 {
                return r;
            }
            // An input descriptor was readable but brought no datagram.
            let mut empty = false;
            for (j, e) in extra.iter().enumerate() {
                if all[e.at].revents & libc::POLLERR != 0 && !claim_error(t, all[e.at].fd) {
                    // Not an error: the kernel's error queue held TX stamps of
                    // `eudp trace` (now read into the trace).
                    all[e.at].revents &= !libc::POLLERR;
                }
                all[e.at].revents |= e.ready;
                // The ring's eventfd or the backend's descriptor (POLLIN), or
                // the error flag (POLLERR).
                if all[app.len() + j].revents & (libc::POLLIN | libc::POLLERR) != 0 {
                    let ev = ring_events_of(t, all[e.at].fd);
                    empty |= ev == 0;
                    all[e.at].revents |= ev;
                }
            }
            let mut count = 0;
            for (i, p) in app.iter_mut().enumerate() {
                p.revents = all[i].revents;
                if p.revents != 0 {
                    count += 1;
                }
            }
            // Nothing ready after all (a partial frame, a spurious wake-up):
            // wait on for what is left of the caller's time, as the kernel
            // would, rather than report a timeout early. Yield first: the rest
            // of a partial frame keeps its descriptor readable until it comes.
            if count != 0 || !empty || ready_now {
                return count;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return 0;
            }
            std::thread::yield_now();
            left = deadline.map(|d| timespec_of(d.saturating_duration_since(now)));
            wait = left.as_ref().map_or(std::ptr::null(), |x| x as *const _);
        }
    }
}

/// The endpoints a sleeping poll watches for input on their kernel
/// sockets (kernel transport), announced to the engine for the call
/// (`Endpoint::app_poll_begin`): it stays off those sockets, so an arrival
/// wakes this thread alone, which reads the socket itself. The first is
/// held inline: a poll names one accelerated socket far more often than
/// several, and a heap list per sleeping poll was a third of its cost.
#[derive(Default)]
struct Polling {
    first: Option<Arc<Endpoint>>,
    more: Vec<Arc<Endpoint>>,
}

impl Polling {
    fn all(&self) -> impl Iterator<Item = &Arc<Endpoint>> {
        self.first.iter().chain(self.more.iter())
    }

    fn add(&mut self, ep: Arc<Endpoint>) {
        if self.first.is_none() {
            self.first = Some(ep);
        } else {
            self.more.push(ep);
        }
    }
}

impl Drop for Polling {
    fn drop(&mut self) {
        for ep in self.all() {
            ep.app_poll_end();
        }
    }
}

/// [`Polling`] for the accelerated sockets `app` asks for input (those
/// announced: see `Endpoint::app_poll_begin`).
fn polling(t: &Tls, app: &[libc::pollfd]) -> Polling {
    let mut v = Polling::default();
    if shim::bypass_transport() {
        return v;
    }
    for p in app {
        if p.events & libc::POLLIN == 0 || !shim::maybe(p.fd) {
            continue;
        }
        if let Some(ep) = with_sock_in(t, p.fd, |s| s.existing()).flatten() {
            if !v.all().any(|e| Arc::ptr_eq(e, &ep)) && ep.app_poll_begin() {
                v.add(ep);
            }
        }
    }
    v
}

/// Some polled sockets have no ring eventfd (the descriptor budget): they
/// move to the kernel path (out of the scan, which found them), then the
/// poll is made again.
#[cold]
#[inline(never)]
unsafe fn poll_without_rings(
    t: &Tls,
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    room: bool,
    extra: &[Extra],
) -> c_int {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let app = std::slice::from_raw_parts(fds, n as usize);
        for e in extra.iter().filter(|e| e.fd == NO_RING) {
            let fd = app[e.at].fd;
            if let Some(s) = lookup(fd) {
                s.fallback(fd, &shim::budget_reason("poll"));
            }
        }
        poll_input_once(t, fds, n, ts, mask, room)
    }
}

/// A poll timeout as a duration (negative fields count as zero).
pub(super) fn duration_of(ts: &libc::timespec) -> Duration {
    Duration::new(ts.tv_sec.max(0) as u64, ts.tv_nsec.clamp(0, 999_999_999) as u32)
}

pub(super) fn timespec_of(d: Duration) -> libc::timespec {
    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as _ }
}

fn ms_to_ts(ms: c_int) -> Option<libc::timespec> {
    (ms >= 0)
        .then(|| libc::timespec { tv_sec: (ms / 1000) as libc::time_t, tv_nsec: ((ms % 1000) as i64 * 1_000_000) as _ })
}

#[no_mangle]
pub unsafe extern "C" fn poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    guard(-1, "poll", Retry::Yes, || {
        // SAFETY: the caller passes `poll`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if !shim::any() {
                return real::poll(fds, n, timeout);
            }
            let ts = ms_to_ts(timeout);
            with_tls(|t| {
                poll_impl(t, fds, n, ts.as_ref().map_or(std::ptr::null(), |x| x as *const _), std::ptr::null())
            })
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __poll_chk(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int, _fdslen: size_t) -> c_int {
    guard(-1, "__poll_chk", Retry::Yes, || {
        // SAFETY: the caller passes `__poll_chk`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe { poll(fds, n, timeout) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ppoll(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    guard(-1, "ppoll", Retry::Yes, || {
        // SAFETY: the caller passes `ppoll`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if !shim::any() {
                return real::ppoll(fds, n, ts, mask);
            }
            with_tls(|t| poll_impl(t, fds, n, ts, mask))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut libc::pollfd,
    n: libc::nfds_t,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
    _l: size_t,
) -> c_int {
    guard(-1, "__ppoll_chk", Retry::Yes, || {
        // SAFETY: the caller passes `__ppoll_chk`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe { ppoll(fds, n, ts, mask) }
    })
}
