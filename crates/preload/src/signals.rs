//! Which signal handlers restart system calls.
//!
//! The kernel restarts a blocked `recv` after a handler installed with
//! `SA_RESTART` and fails it with `EINTR` otherwise. The shim's blocked
//! receive cannot learn which signal interrupted it, so it tracks the
//! handlers the program installs (`sigaction`, `signal`): while every
//! installed handler restarts, an interrupted wait is resumed; once any
//! handler does not, `EINTR` is returned, as the kernel would for that
//! handler (a program that retries on `EINTR`, as well-written ones and
//! Python do, sees no difference).
//!
//! SIGTERM and SIGINT at their default action would end the program with
//! datagrams still in L1. While the program leaves them so, the shim's
//! handler ([`crate::sys::sigflush`]) has the flusher thread send what L1
//! holds and write the final stats report, then ends the process with the
//! signal as the default action would. The program does not see that
//! handler: `sigaction` and `signal` report the default action for it, a
//! program setting the default keeps it, and a handler of the program's
//! own replaces it.

use crate::sys::sigflush;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::OnceLock;

/// Bit n: signal n has a handler without SA_RESTART.
static NO_RESTART: AtomicU64 = AtomicU64::new(0);

/// Records the disposition of `sig`: a handler (not SIG_DFL/SIG_IGN) and
/// whether it restarts.
pub fn record(sig: i32, handler: usize, flags: i32) {
    if !(1..64).contains(&sig) {
        return;
    }
    let b = 1u64 << sig;
    let is_handler = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
    if is_handler && flags & libc::SA_RESTART == 0 {
        NO_RESTART.fetch_or(b, Relaxed);
    } else {
        NO_RESTART.fetch_and(!b, Relaxed);
    }
}

/// True when an interrupted blocking receive must fail with EINTR.
/// `EUDP_EINTR=0` treats every handler as restarting (the engine's own
/// blocking receive is then used: one wake-up less per datagram).
pub fn eintr_wanted() -> bool {
    NO_RESTART.load(Relaxed) != 0 && !never()
}

fn never() -> bool {
    use std::sync::atomic::AtomicU8;
    static N: AtomicU8 = AtomicU8::new(255);
    let v = N.load(Relaxed);
    if v != 255 {
        return v == 1;
    }
    let n = std::env::var("EUDP_EINTR").map(|v| v == "0").unwrap_or(false);
    N.store(n as u8, Relaxed);
    n
}

/// The signals whose default action the shim's flush-first handler stands for.
pub const FLUSHED: [i32; 2] = [libc::SIGTERM, libc::SIGINT];

/// Bit n: the shim's handler is installed for signal n.
static OWNED: AtomicU64 = AtomicU64::new(0);
/// What the flusher thread runs for a signal (set by `hooks` at load).
static FLUSH: OnceLock<fn()> = OnceLock::new();
/// The process whose flusher thread was started.
static FLUSHER: AtomicI32 = AtomicI32::new(0);

/// Sets what a deadly signal runs before the process ends: the flush of
/// every socket and the final stats report.
pub fn set_flush(f: fn()) {
    let _ = FLUSH.set(f);
}

/// True while the shim's handler stands for the default action of `sig`.
pub fn owned(sig: i32) -> bool {
    (1..64).contains(&sig) && OWNED.load(SeqCst) & (1u64 << sig) != 0
}

/// The program installed a handler of its own (or ignores `sig`): the
/// shim's is gone.
pub fn released(sig: i32) {
    if (1..64).contains(&sig) {
        OWNED.fetch_and(!(1u64 << sig), SeqCst);
    }
}

/// At engine start (once per process generation): starts this process's
/// flusher thread and installs the shim's handler for each of [`FLUSHED`]
/// left at its default action.
pub fn arm() {
    let Some(&flush) = FLUSH.get() else { return };
    let pid = crate::sys::getpid();
    if FLUSHER.swap(pid, SeqCst) == pid {
        return;
    }
    let started = std::thread::Builder::new().name("eudp-sigflush".into()).spawn(move || {
        eudp_engine::sys::process::block_async_signals();
        sigflush::serve(flush)
    });
    if started.is_err() {
        FLUSHER.store(0, SeqCst);
        return;
    }
    sigflush::flusher_started();
    for sig in FLUSHED {
        if owned(sig) {
            continue; // inherited from the parent of a fork
        }
        if sigflush::disposition(sig) == Some(libc::SIG_DFL) && sigflush::install(sig) {
            OWNED.fetch_or(1u64 << sig, SeqCst);
        }
    }
}
