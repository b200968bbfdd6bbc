//! The relay that stands for the program's signal handlers installed
//! without `SA_RESTART` (see `crate::signals`).
//!
//! A receive that spins in user space cannot see a signal the way a
//! kernel wait does: the handler runs between two looks and the spin goes
//! on. So the shim installs [`relay`] in place of such a handler: it counts
//! the run for the thread it runs on
//! (`eudp_engine::sys::process::note_interrupt`), which the spin compares
//! after each look, and calls the program's handler with the arguments the
//! kernel gave. The program does not see the relay: `sigaction` and
//! `signal` report its own handler and flags. Handlers with `SA_RESTART`
//! are installed as they are (a restarted wait needs no news of them).
//!
//! The relay does only what is async-signal-safe: atomic loads, a
//! thread-local counter, the call.

use crate::real;
use libc::{c_int, c_void};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::SeqCst};

const SIGNALS: usize = 65;

/// Per signal: the program's handler the relay calls (0: none).
static HANDLERS: [AtomicUsize; SIGNALS] = [const { AtomicUsize::new(0) }; SIGNALS];
/// Per signal: the flags the program gave with that handler.
static FLAGS: [AtomicI32; SIGNALS] = [const { AtomicI32::new(0) }; SIGNALS];

type Handler = extern "C" fn(c_int, *mut libc::siginfo_t, *mut c_void);

extern "C" fn relay(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let Some(slot) = usize::try_from(sig).ok().filter(|&s| s < SIGNALS) else { return };
    eudp_engine::sys::process::note_interrupt();
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
/// `act` that does not restart, and the program's handler and flags
/// reported in `old` where the relay is installed.
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
        if handler && a.sa_flags & libc::SA_RESTART == 0 {
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
