//! The relay that stands for the program's signal handlers (see
//! `crate::signals`).
//!
//! A wait that spins in user space cannot see a signal the way a kernel
//! wait does: the handler runs between two looks and the spin goes on. So
//! the shim installs [`relay`] in place of each handler the program
//! installs: it counts the run for the thread it runs on, and calls the
//! program's handler with the arguments the kernel gave. Two counts: every
//! run ([`handlers_run`]), which a spinning `poll`, `select` or
//! `epoll_wait` compares after each look (the kernel ends those with
//! `EINTR` after any handler), and the runs of handlers without
//! `SA_RESTART` (`eudp_engine::sys::process::note_interrupt`), which a
//! spinning receive compares (the kernel restarts a receive after the
//! others). The program does not see the relay: `sigaction` and `signal`
//! report its own handler and flags.
//!
//! The relay does only what is async-signal-safe: atomic loads, thread-local
//! counters, the call.

use crate::real;
use libc::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::SeqCst};

const SIGNALS: usize = 65;

/// Per signal: the program's handler the relay calls (0: none).
static HANDLERS: [AtomicUsize; SIGNALS] = [const { AtomicUsize::new(0) }; SIGNALS];
/// Per signal: the flags the program gave with that handler.
static FLAGS: [AtomicI32; SIGNALS] = [const { AtomicI32::new(0) }; SIGNALS];

type Handler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

thread_local! {
    /// Runs of the program's handlers on this thread (through [`relay`]).
    static HANDLED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// The calling thread's count of the program's handler runs: a spinning
/// `poll`, `select` or `epoll_wait` fails with `EINTR` once it changes, as
/// the kernel's call would after any handler (it never restarts them).
/// Handlers installed behind the shim's back (a raw `rt_sigaction` system
/// call, `sigset`, `sysv_signal`) are not counted.
pub fn handlers_run() -> u32 {
    HANDLED.with(|n| n.get())
}

extern "C" fn relay(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let Some(slot) = usize::try_from(sig).ok().filter(|&s| s < SIGNALS) else { return };
    HANDLED.with(|n| n.set(n.get().wrapping_add(1)));
    if FLAGS[slot].load(SeqCst) & libc::SA_RESTART == 0 {
        eudp_engine::sys::process::note_interrupt();
    }
    let h = HANDLERS[slot].load(SeqCst);
    if h == 0 || h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    // SAFETY: `h` is a handler the program installed for `sig` (a function
    // of one or three arguments: C passes the extra two harmlessly to one
    // that takes one); the relay is installed with SA_SIGINFO, so `info`
    // and `ctx` are the kernel's, valid for this call.
    unsafe { std::mem::transmute::<usize, Handler>(h)(sig, info, ctx) }
}

fn relay_address() -> usize {
    relay as Handler as usize
}

/// `sigaction(sig, act, old)` with the relay standing for a handler in
/// `act`, and the program's handler and flags reported in `old` where the
/// relay is installed.
///
/// # Safety
/// `act` and `old` are null or valid, as `sigaction(2)` requires.
pub unsafe fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    let slot = usize::try_from(sig).ok().filter(|&s| s > 0 && s < SIGNALS);
    let before = slot.map(|s| (HANDLERS[s].load(SeqCst), FLAGS[s].load(SeqCst)));
    let mut relayed: libc::sigaction;
    let mut act = act;
    if let (Some(s), false) = (slot, act.is_null()) {
        // SAFETY: `act` is valid (the caller's contract).
        let a = unsafe { &*act };
        let handler = a.sa_sigaction != libc::SIG_DFL && a.sa_sigaction != libc::SIG_IGN;
        if handler {
            // The handler first, so the relay finds it from the moment it
            // is installed.
            HANDLERS[s].store(a.sa_sigaction, SeqCst);
            FLAGS[s].store(a.sa_flags, SeqCst);
            relayed = *a;
            relayed.sa_sigaction = relay_address();
            relayed.sa_flags |= libc::SA_SIGINFO;
            act = &relayed;
        }
    }
    // SAFETY: `act` is the caller's or a local copy of it; `old` the caller's.
    let r = unsafe { real::sigaction(sig, act, old) };
    if let Some(s) = slot {
        if r != 0 {
            if let Some((h, f)) = before {
                HANDLERS[s].store(h, SeqCst);
                FLAGS[s].store(f, SeqCst);
            }
        } else if !old.is_null() {
            // SAFETY: `old` is valid and was just written by the call.
            let o = unsafe { &mut *old };
            if o.sa_sigaction == relay_address() {
                let (h, f) = before.unwrap_or_default();
                o.sa_sigaction = h;
                if f & libc::SA_SIGINFO == 0 {
                    o.sa_flags &= !libc::SA_SIGINFO;
                }
            }
        }
    }
    r
}

/// The handler `signal()` returns for a previous disposition: the
/// program's own where the relay stood for it.
pub fn reported(sig: c_int, previous: libc::sighandler_t) -> libc::sighandler_t {
    match usize::try_from(sig).ok().filter(|&s| s < SIGNALS) {
        Some(s) if previous == relay_address() => HANDLERS[s].load(SeqCst),
        _ => previous,
    }
}

/// `signal(sig, handler)` as glibc's (BSD semantics: the handler restarts
/// system calls and blocks `sig` while it runs), made through [`sigaction`]
/// so the relay stands for the handler: glibc's own `signal` calls its
/// internal `sigaction`, which the shim does not see. Returns the previous
/// handler as the program knows it, or `SIG_ERR` with `errno` set.
pub fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    if handler == libc::SIG_ERR {
        crate::sys::set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: sigaction is plain data; every field is set below or zero.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = libc::SA_RESTART;
    // SAFETY: `act.sa_mask` is a valid set to write; an invalid `sig` makes
    // sigaddset fail, and the sigaction below reports EINVAL for it.
    unsafe {
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaddset(&mut act.sa_mask, sig);
    }
    // SAFETY: zeroed plain data for the call to fill in.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to locals, valid for the call.
    if unsafe { sigaction(sig, &act, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}
