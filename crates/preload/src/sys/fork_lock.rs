//! Locks held across `fork`: taken in the prepare handler and released in
//! the parent or child handler, so the child never inherits a lock held by
//! a thread that does not exist there.

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::*};

/// Holds guards (not `Send`, so no `Mutex` can) from the prepare handler
/// to the parent/child handler. The pthread_atfork handlers of one fork run
/// on the forking thread; a busy flag keeps a second, concurrent fork from
/// touching the cell while another thread uses it.
pub struct ForkHeld<T> {
    busy: AtomicBool,
    held: UnsafeCell<Option<T>>,
}

// SAFETY: the cell is touched only inside `with`, which the busy flag makes
// exclusive; its guards are put and taken by the forking thread's handlers.
unsafe impl<T> Sync for ForkHeld<T> {}

impl<T> ForkHeld<T> {
    pub const fn new() -> Self {
        ForkHeld { busy: AtomicBool::new(false), held: UnsafeCell::new(None) }
    }

    fn with<R>(&self, f: impl FnOnce(&mut Option<T>) -> R) -> R {
        while self.busy.swap(true, Acquire) {
            std::thread::yield_now();
        }
        // SAFETY: the busy flag gives this call the only access.
        let r = f(unsafe { &mut *self.held.get() });
        self.busy.store(false, Release);
        r
    }

    /// In the prepare handler: keeps `v` until [`ForkHeld::take`].
    pub fn hold(&self, v: T) {
        self.with(|h| *h = Some(v));
    }

    /// In the parent or child handler: what the prepare handler held.
    pub fn take(&self) -> Option<T> {
        self.with(|h| h.take())
    }
}

impl<T> Default for ForkHeld<T> {
    fn default() -> Self {
        Self::new()
    }
}
