//! The raw side of the flush on a deadly signal (see `crate::signals`):
//! the handler the shim installs for SIGTERM and SIGINT while the program
//! leaves them at their default action, and the futex pair it wakes the
//! flusher thread with.
//!
//! The handler does only what is async-signal-safe: atomics, `futex`,
//! `clock_gettime`, `sigaction` and `tgkill`. It asks the flusher thread
//! (which never takes these signals: eudp's threads block them) for one
//! flush and waits for it at most [`WAIT`]; then the default action is
//! back and the signal is raised again, so the process ends as it would
//! have, with the signal's status. The signal is blocked while its handler
//! runs: the raised one is taken as the handler returns.

use crate::real;
use libc::c_int;
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering::SeqCst};
use std::time::Duration;

/// The longest the handler waits for the flush: a thread the signal
/// stopped in the middle of a send may hold what the flush needs.
pub const WAIT: Duration = Duration::from_secs(3);

/// Flushes asked for by handlers.
static ASKED: AtomicU32 = AtomicU32::new(0);
/// Flushes done (the value of `ASKED` each one served).
static DONE: AtomicU32 = AtomicU32::new(0);
/// The process whose flusher thread runs (0: none). A fork child has
/// none until its own engine starts one.
static FLUSHER_PID: AtomicI32 = AtomicI32::new(0);

fn futex_wait(word: &AtomicU32, seen: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec { tv_sec: t.as_secs() as _, tv_nsec: t.subsec_nanos() as _ });
    let tp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: the futex word is a live static; FUTEX_WAIT reads it and the
    // optional timeout, a local valid for the call.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG, seen, tp);
    }
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: the futex word is a live static; FUTEX_WAKE only reads its address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG, i32::MAX);
    }
}

fn now() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid out pointer; clock_gettime is async-signal-safe.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The flusher thread's loop: waits for a handler's request, runs `flush`,
/// says it is done. Never returns.
pub fn serve(flush: fn()) -> ! {
    loop {
        let asked = ASKED.load(SeqCst);
        if asked == DONE.load(SeqCst) {
            futex_wait(&ASKED, asked, None);
            continue;
        }
        flush();
        DONE.store(asked, SeqCst);
        futex_wake(&DONE);
    }
}

/// The flusher thread of this process runs: handlers wait for it.
pub fn flusher_started() {
    FLUSHER_PID.store(super::getpid(), SeqCst);
}

extern "C" fn on_deadly(sig: c_int) {
    let errno = super::errno();
    let pid = super::getpid();
    if FLUSHER_PID.load(SeqCst) == pid {
        let ticket = ASKED.fetch_add(1, SeqCst).wrapping_add(1);
        futex_wake(&ASKED);
        let deadline = now() + WAIT;
        loop {
            let done = DONE.load(SeqCst);
            if done.wrapping_sub(ticket) as i32 >= 0 {
                break;
            }
            let Some(left) = deadline.checked_sub(now()).filter(|l| !l.is_zero()) else { break };
            futex_wait(&DONE, done, Some(left));
        }
    }
    set_default(sig);
    // SAFETY: gettid and tgkill take integers; the signal goes to this
    // thread, which blocks it until this handler returns.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid);
        libc::syscall(libc::SYS_tgkill, pid, tid, sig);
    }
    super::set_errno(errno);
}

/// The address of the shim's handler, as `sigaction` reports it.
pub fn handler() -> usize {
    on_deadly as extern "C" fn(c_int) as usize
}

/// The handler now installed for `sig` (SIG_DFL, SIG_IGN or a function).
pub fn disposition(sig: c_int) -> Option<usize> {
    // SAFETY: sigaction is plain data; the call only writes `old`.
    let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: a null new action only reads the disposition into `old`.
    let r = unsafe { real::sigaction(sig, std::ptr::null(), &mut old) };
    (r == 0).then_some(old.sa_sigaction)
}

fn set(sig: c_int, handler: usize, flags: c_int) -> bool {
    // SAFETY: sigaction is plain data; every field is set below or zero.
    let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
    act.sa_sigaction = handler;
    act.sa_flags = flags;
    // SAFETY: a valid action, read for the call; the old one is not asked for.
    unsafe { real::sigaction(sig, &act, std::ptr::null_mut()) == 0 }
}

/// Installs the shim's handler for `sig`.
pub fn install(sig: c_int) -> bool {
    set(sig, handler(), libc::SA_RESTART)
}

/// Puts `sig` back to its default action.
pub fn set_default(sig: c_int) -> bool {
    set(sig, libc::SIG_DFL, 0)
}
