//! Borrowing a socket's endpoint for one call without a lock or a
//! reference count: the lookup every send and receive makes.
//!
//! Taking the socket's endpoint mutex and cloning its `Arc` costs four
//! locked instructions per call, about a fifth of a 64-byte send's CPU.
//! Instead a socket (`crate::shim::Sock`) publishes a pointer to the
//! endpoint its mutex owns (its `fast` field), and each thread has a hazard
//! slot here:
//!
//! * a call writes the socket's address into its slot, then re-reads
//!   `fast`; null means the socket is leaving the engine, and the call
//!   takes the locked path instead;
//! * a closer (close, fallback) clears `fast`, then [`quiesce`] waits
//!   until no slot names the socket before the endpoint is dropped.
//!
//! Either the call sees `fast` cleared or the closer sees the slot. The
//! fence that makes this so is paid by the rare side: the closer issues
//! `membarrier(2)` (private expedited), which runs a full barrier on every
//! CPU running one of this process's threads, so a call needs only plain
//! loads and stores — no locked instruction at all. Where `membarrier` is
//! unavailable, calls swap their slot with a sequentially consistent
//! exchange instead. A receive borrows only when it will not sleep (a
//! datagram is in the ring, or the call is non-blocking); a send may wait
//! for room in L1, which the engine frees within a batch's time. So a
//! closer waits microseconds, and [`quiesce`] bounds the wait anyway.
//!
//! Slots are a fixed array claimed once per thread and freed at thread
//! exit; a thread that finds none uses the locked path. This module knows
//! a socket only by its address (the hazard) and its `fast` pointer, and a
//! thread only by its slot index, so it sits below the shim's socket and
//! thread state.

use crate::sys::hazard::{
    self, membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED,
};
use eudp_engine::Endpoint;
use std::cell::Cell;
use std::ptr::{dangling_mut, null_mut};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicPtr, AtomicU8, Ordering::*};
use std::time::{Duration, Instant};

const NSLOTS: usize = 1024;

/// What a slot names: the address of the socket a borrow is using.
type Owner = *mut ();

/// An unclaimed slot. No socket lives at this address.
const FREE: Owner = dangling_mut::<()>();

/// Per thread: null while claimed and idle, the socket in use during a
/// borrow, [`FREE`] when no thread owns the slot.
static SLOTS: [AtomicPtr<()>; NSLOTS] = [const { AtomicPtr::new(FREE) }; NSLOTS];

/// A thread's slot (kept in the shim's per-thread state) before it asked
/// for one.
pub const UNCLAIMED: usize = usize::MAX;
/// A thread's slot when it has none (all taken, or it is exiting):
/// its calls take the locked path.
pub const NO_SLOT: usize = usize::MAX - 1;

/// Frees a thread's slot (its per-thread state is going away).
pub fn release(slot: usize) {
    if slot < NSLOTS {
        SLOTS[slot].store(FREE, Release);
    }
}

fn claim() -> Option<usize> {
    SLOTS.iter().position(|s| s.compare_exchange(FREE, null_mut(), AcqRel, Relaxed).is_ok())
}

/// This thread's slot, claimed on first use and kept in `slot`, the
/// thread's own cell (released when the thread exits).
#[inline]
fn slot_of(slot: &Cell<usize>) -> Option<usize> {
    match slot.get() {
        UNCLAIMED => {
            let i = claim();
            slot.set(i.unwrap_or(NO_SLOT));
            i
        }
        NO_SLOT => None,
        i => Some(i),
    }
}

/// The index of a thread's slot value, when it holds one.
fn claimed(slot: usize) -> Option<usize> {
    (slot < NSLOTS).then_some(slot)
}

/// 0: not asked yet, 1: closers fence with `membarrier`, 2: calls fence.
static ASYMMETRIC: AtomicU8 = AtomicU8::new(0);
static REGISTERING: AtomicBool = AtomicBool::new(false);

/// Whether calls may skip their fence. Decided (registering with the
/// kernel) before the first socket is published, and never changes after.
/// Every caller returns only once it is decided, so a closer of any
/// published socket and every call on it agree on who fences.
pub fn init() {
    if ASYMMETRIC.load(Acquire) != 0 {
        return;
    }
    if REGISTERING.swap(true, AcqRel) {
        // Another thread is registering: one syscall away.
        while ASYMMETRIC.load(Acquire) == 0 {
            std::thread::yield_now();
        }
        return;
    }
    ASYMMETRIC.store(if register() == 0 { 1 } else { 2 }, Release);
}

fn register() -> libc::c_long {
    membarrier(MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED)
}

/// Makes a closer's clearing of `fast` visible to every call, and every
/// call's slot visible to the closer.
fn heavy_fence() {
    if ASYMMETRIC.load(Acquire) == 1 {
        if membarrier(MEMBARRIER_CMD_PRIVATE_EXPEDITED) == 0 {
            return;
        }
        // Cannot fail once registered; if it did, calls fence from now on
        // and this closer falls through to the plain fence.
        ASYMMETRIC.store(2, SeqCst);
    }
    std::sync::atomic::fence(SeqCst);
}

/// Runs `f` on the endpoint `fast` points to while the socket at `owner`
/// (whose `fast` it is) is on the engine; `slot` is this thread's slot cell.
/// `Err(f)` hands `f` back when it cannot (no endpoint, the socket is
/// leaving the engine, or this thread has no slot). `f` must not sleep
/// for long: a closer waits for it.
#[inline]
pub fn borrow<R, F: FnOnce(&Endpoint) -> R>(
    slot: &Cell<usize>,
    owner: *const (),
    fast: &AtomicPtr<Endpoint>,
    f: F,
) -> Result<R, F> {
    let Some(i) = slot_of(slot) else { return Err(f) };
    let me = owner as Owner;
    // Nested borrows (a signal handler calling in) restore the outer one.
    let outer = SLOTS[i].load(Relaxed);
    if ASYMMETRIC.load(Relaxed) == 1 {
        SLOTS[i].store(me, Relaxed);
        compiler_fence(SeqCst);
    } else {
        SLOTS[i].swap(me, SeqCst);
    }
    // `fast` is non-null only while the socket's mutex owns the endpoint,
    // and a closer that clears it waits in `quiesce` until this slot no
    // longer names the socket before dropping it.
    let r = hazard::with_published(fast, f);
    SLOTS[i].store(outer, Release);
    r
}

/// After the `fast` pointer of the socket at `owner` was cleared (with
/// `SeqCst`): waits until no call borrows the socket's endpoint; `my_slot`
/// is this thread's slot value. False when that did not happen within a bound (the caller
/// must then leak the endpoint rather than drop it), including when this
/// very thread borrows it (a signal handler closing the socket it
/// interrupted).
pub fn quiesce(owner: *const (), my_slot: usize) -> bool {
    heavy_fence();
    let me = owner as Owner;
    let mine = claimed(my_slot);
    let deadline = Instant::now() + Duration::from_secs(2);
    for (i, slot) in SLOTS.iter().enumerate() {
        while slot.load(SeqCst) == me {
            if Some(i) == mine || Instant::now() >= deadline {
                return false;
            }
            std::thread::yield_now();
        }
    }
    true
}

/// In a fork child: only the forking thread exists, and it was not
/// inside a borrow (fork is an application call), so every other slot is
/// free. The child is a new process for `membarrier`: it registers again
/// (or, alone and so safely, switches calls to fencing themselves).
/// `my_slot` is the forking thread's slot value.
pub fn forked(my_slot: usize) {
    match ASYMMETRIC.load(Acquire) {
        // A registration the parent had under way died with its thread.
        0 => REGISTERING.store(false, SeqCst),
        1 if register() != 0 => ASYMMETRIC.store(2, SeqCst),
        _ => {}
    }
    let mine = claimed(my_slot);
    for (i, slot) in SLOTS.iter().enumerate() {
        if Some(i) != mine {
            slot.store(FREE, Relaxed);
        }
    }
}
