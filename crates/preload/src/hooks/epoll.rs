//! epoll_wait and friends are the kernel's (accelerated sockets stand in an
//! epoll set through their rings' eventfds, see `epoll_ctl`); they are
//! interposed only to send what this thread left to be coalesced before the
//! program sleeps in them (`before_sleep`).

use super::guard::{guard, Retry};
use super::poll::{duration_of, spin_then_wait, timespec_of};
use super::ready::{before_sleep, no_wait};
use crate::real;
use crate::ringdup::ring_dup;
use crate::shim::{self, lookup, Sock, ACTIVE};
use crate::sys::{errno, set_errno};
use eudp_engine::Endpoint;
use libc::c_int;
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Epoll sets (by descriptor number) that an accelerated socket was added
/// to: under a spinning profile only these spin. A number that another
/// epoll set takes after a close keeps the mark (it then spins for
/// nothing, under that profile only).
static SPIN_EPOLLS: Mutex<BTreeSet<c_int>> = Mutex::new(BTreeSet::new());

fn mark_spin_epoll(epfd: c_int) {
    SPIN_EPOLLS.lock().unwrap_or_else(|e| e.into_inner()).insert(epfd);
}

/// A wait of an epoll set under a spinning profile (`EUDP_SPIN_US`, the
/// latency profile), as `poll_input` spins: the set is looked at without
/// sleeping (a zero-timeout `ppoll` of the epoll descriptor), the CPU
/// given up every fourth look, until something is ready or the spin is
/// over, and only then does the call sleep, for what is left of its timeout. A
/// signal ends the call with `EINTR` as it would the kernel's wait (see
/// `spin_then_wait`). `None`: no spin here (not spinning, a zero timeout,
/// or a set without an accelerated socket).
unsafe fn epoll_spin(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: Option<Duration>,
    mask: *const libc::sigset_t,
    pwait2: bool,
) -> Option<c_int> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let spin = match shim::running_engine() {
            Some(e) => e.config().recv_spin.min(timeout.unwrap_or(Duration::MAX)),
            None => Duration::ZERO,
        };
        if spin.is_zero() || !SPIN_EPOLLS.lock().unwrap_or_else(|e| e.into_inner()).contains(&epfd) {
            return None;
        }
        before_sleep();
        let zero = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        Some(spin_then_wait(
            spin,
            mask,
            |during| {
                // A look is a `ppoll` of the epoll descriptor itself (readable
                // while the set has events): unlike `epoll_pwait` with a zero
                // timeout, which returns 0 with a signal pending, it takes the
                // signal and fails with EINTR. The events are then collected.
                let mut set = libc::pollfd { fd: epfd, events: libc::POLLIN, revents: 0 };
                match real::ppoll(&mut set, 1, &zero, during) {
                    0 => 0,
                    r if r < 0 => r,
                    _ => real::epoll_pwait(epfd, evs, max, 0, during),
                }
            },
            |during, spent| {
                let left = timeout.map(|t| t.saturating_sub(spent));
                if pwait2 {
                    let ts = left.map(timespec_of);
                    real::epoll_pwait2(epfd, evs, max, ts.as_ref().map_or(std::ptr::null(), |x| x as *const _), during)
                } else {
                    // Rounded up, as the kernel rounds a wait's milliseconds.
                    let ms = left.map_or(-1, |l| l.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as c_int);
                    real::epoll_pwait(epfd, evs, max, ms, during)
                }
            },
        ))
    }
}

fn ms_duration(timeout: c_int) -> Option<Duration> {
    (timeout >= 0).then(|| Duration::from_millis(timeout as u64))
}

#[no_mangle]
pub unsafe extern "C" fn epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int {
    guard(-1, "epoll_wait", Retry::Yes, || {
        // SAFETY: the caller passes `epoll_wait`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if timeout != 0 && shim::any() {
                if let Some(r) = epoll_spin(epfd, evs, max, ms_duration(timeout), std::ptr::null(), false) {
                    return r;
                }
                before_sleep();
            }
            real::epoll_wait(epfd, evs, max, timeout)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const libc::sigset_t,
) -> c_int {
    guard(-1, "epoll_pwait", Retry::Yes, || {
        // SAFETY: the caller passes `epoll_pwait`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if timeout != 0 && shim::any() {
                if let Some(r) = epoll_spin(epfd, evs, max, ms_duration(timeout), mask, false) {
                    return r;
                }
                before_sleep();
            }
            real::epoll_pwait(epfd, evs, max, timeout, mask)
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    evs: *mut libc::epoll_event,
    max: c_int,
    ts: *const libc::timespec,
    mask: *const libc::sigset_t,
) -> c_int {
    guard(-1, "epoll_pwait2", Retry::Yes, || {
        // SAFETY: the caller passes `epoll_pwait2`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if !no_wait(ts) && shim::any() {
                if let Some(r) = epoll_spin(epfd, evs, max, (!ts.is_null()).then(|| duration_of(&*ts)), mask, true) {
                    return r;
                }
                before_sleep();
            }
            real::epoll_pwait2(epfd, evs, max, ts, mask)
        }
    })
}

/// Events of the ring's eventfd registration for an application epoll
/// registration `ev` (`None`: the application does not want input).
fn ring_events(ev: u32) -> Option<u32> {
    if ev & (libc::EPOLLIN | libc::EPOLLRDNORM) as u32 == 0 {
        return None;
    }
    let mut keep = (libc::EPOLLET | libc::EPOLLONESHOT | libc::EPOLLWAKEUP | libc::EPOLLEXCLUSIVE) as u32;
    if shim::bypass_transport() {
        // Datagrams reach the ring after the program may already wait; an
        // exclusive wake-up would then go to one waiting epoll set only,
        // and a set not waiting at that moment would never report them,
        // where a loopback kernel socket had the datagram before any wait.
        // Waking every set is within EPOLLEXCLUSIVE's promise (one or
        // more). The backend's descriptor, an epoll set, cannot take the
        // flag anyway (EINVAL).
        keep &= !(libc::EPOLLEXCLUSIVE as u32);
    }
    Some(libc::EPOLLIN as u32 | (ev & keep))
}

/// Descriptors whose readability means input for an accelerated socket,
/// besides the socket itself: the ring's eventfd, and under the TCP
/// transport the backend's descriptor; and whether all of them could be
/// made (a private descriptor may be out of the budget, see
/// [`crate::fdspace`]).
fn ready_fds(s: &Sock, ep: &Endpoint) -> (Vec<c_int>, bool) {
    let ring = s.ring_fd(ep);
    // An asynchronous error the engine took off the kernel socket: the
    // error flag reports it as EPOLLERR, as the kernel socket would have
    // (the ring's eventfd then stands for datagrams only).
    let err = s.err_fd(ep);
    let complete = ring.is_some() && err.is_some();
    let mut v: Vec<c_int> = ring.into_iter().chain(err).collect();
    if let Some(fd) = ep.bypass_fd().filter(|_| shim::bypass_transport()) {
        v.push(fd);
    }
    (v, complete)
}

/// MOD or DEL of the ring registration made through `fd`'s own duplicate
/// of the ring's eventfd, if it has one in this epoll. `false`: it has
/// none there; the eventfd itself is the key.
unsafe fn ring_ctl_dup(
    s: &Arc<Sock>,
    fd: c_int,
    rfd: c_int,
    epfd: c_int,
    op: c_int,
    ev: &mut libc::epoll_event,
) -> bool {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        match ring_dup(s, fd, rfd, false) {
            Some(d) => real::epoll_ctl(epfd, op, d, ev) == 0,
            None => false,
        }
    }
}

/// epoll: an accelerated socket is registered twice under the application's
/// event data — the kernel socket (output, errors, and input still in the
/// socket) and the ring's eventfd (input in the ring). Each report stands
/// for at least one distinct datagram, so a duplicate report never makes a
/// receive block.
#[no_mangle]
pub unsafe extern "C" fn epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int {
    guard(fd, "epoll_ctl", Retry::Yes, || {
        // SAFETY: the caller passes `epoll_ctl`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let Some(s) = lookup(fd) else { return real::epoll_ctl(epfd, op, fd, ev) };
            if matches!(op, libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD)
                && !ev.is_null()
                && (*ev).events & libc::EPOLLONESHOT as u32 != 0
                && (*ev).events & libc::EPOLLEXCLUSIVE as u32 == 0
                && s.mode() != shim::KERNEL
            {
                // One report per arming cannot span two registrations (the kernel
                // socket and the ring's eventfd each report once): kernel path.
                // (With EPOLLEXCLUSIVE the kernel refuses the registration.)
                s.fallback(fd, "epoll_ctl EPOLLONESHOT");
            }
            let r = real::epoll_ctl(epfd, op, fd, ev);
            if r != 0 {
                return r;
            }
            let saved = errno();
            // After a fallback that kept datagrams, their readiness eventfd stands
            // in for the ring's (see `Sock::fallback`). A socket whose descriptors
            // for this cannot all be made (the descriptor budget) falls back: an
            // epoll set that missed its ring would miss its datagrams.
            let extra = |ep: Option<Arc<Endpoint>>, need: bool| -> Vec<c_int> {
                if let Some(ep) = ep {
                    let (v, complete) = ready_fds(&s, &ep);
                    if complete || !need {
                        return v;
                    }
                    drop(ep);
                    s.fallback(fd, &shim::budget_reason("epoll_ctl"));
                }
                s.leftover_ready_fd().into_iter().collect()
            };
            match op {
                libc::EPOLL_CTL_ADD if !ev.is_null() => {
                    if let Some(events) = ring_events((*ev).events) {
                        if s.mode() != shim::KERNEL {
                            mark_spin_epoll(epfd);
                        }
                        for rfd in extra(s.endpoint(fd), true) {
                            let mut e2 = libc::epoll_event { events, u64: (*ev).u64 };
                            if real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, rfd, &mut e2) != 0 && errno() == libc::EEXIST
                            {
                                // Another descriptor of this socket has the ring
                                // in this epoll: this one gets its own key.
                                match ring_dup(&s, fd, rfd, true) {
                                    Some(d) => {
                                        real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, d, &mut e2);
                                    }
                                    None if s.mode() == ACTIVE => {
                                        s.fallback(fd, &shim::budget_reason("epoll_ctl of a duplicate"));
                                        break;
                                    }
                                    None => {}
                                }
                            }
                        }
                    }
                }
                libc::EPOLL_CTL_MOD if !ev.is_null() => {
                    let need = ring_events((*ev).events).is_some();
                    for rfd in extra(s.existing(), need) {
                        match ring_events((*ev).events) {
                            Some(events) => {
                                let mut e2 = libc::epoll_event {
                                    events: events & !(libc::EPOLLEXCLUSIVE as u32),
                                    u64: (*ev).u64,
                                };
                                if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_MOD, &mut e2)
                                    && real::epoll_ctl(epfd, libc::EPOLL_CTL_MOD, rfd, &mut e2) != 0
                                {
                                    real::epoll_ctl(epfd, libc::EPOLL_CTL_ADD, rfd, &mut e2);
                                }
                            }
                            None => {
                                let mut e2 = libc::epoll_event { events: 0, u64: 0 };
                                if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_DEL, &mut e2) {
                                    real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, rfd, &mut e2);
                                }
                            }
                        }
                    }
                }
                libc::EPOLL_CTL_DEL => {
                    for rfd in extra(s.existing(), false) {
                        let mut e2 = libc::epoll_event { events: 0, u64: 0 };
                        if !ring_ctl_dup(&s, fd, rfd, epfd, libc::EPOLL_CTL_DEL, &mut e2) {
                            real::epoll_ctl(epfd, libc::EPOLL_CTL_DEL, rfd, &mut e2);
                        }
                    }
                }
                _ => {}
            }
            // The program now waits for this socket's input in its epoll set, which
            // watches the kernel socket: its threads read arrivals themselves, and
            // the engine stops watching the socket (`Endpoint::app_waits_on_socket`;
            // not under the TCP transport, whose socket never becomes readable).
            if matches!(op, libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD)
                && !ev.is_null()
                && (*ev).events & libc::EPOLLIN as u32 != 0
                && s.mode() == ACTIVE
                && !shim::bypass_transport()
            {
                s.with_existing(|ep| ep.app_waits_on_socket());
            }
            set_errno(saved);
            0
        }
    })
}
