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

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

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
