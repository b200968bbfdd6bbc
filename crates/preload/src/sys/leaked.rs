//! A value put in once per process generation and kept for the rest of the
//! process: leaked from a box, so every reference to it is `'static`.

use std::sync::atomic::{AtomicPtr, Ordering::SeqCst};

/// A slot for leaked values: each [`Leaked::put`] leaks a new one (a value
/// put earlier stays alive, as references to it may still be held).
pub struct Leaked<T>(AtomicPtr<T>);

impl<T> Leaked<T> {
    pub const fn new() -> Self {
        Leaked(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// The value put last, if any.
    pub fn get(&self) -> Option<&'static T> {
        let p = self.0.load(SeqCst);
        // SAFETY: the slot only ever holds null or a pointer from
        // `Box::leak`, which is never freed.
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Leaks `v` and makes it the value this slot hands out.
    pub fn put(&self, v: T) -> &'static T {
        let r: &'static mut T = Box::leak(Box::new(v));
        self.0.store(r, SeqCst);
        r
    }
}

impl<T> Default for Leaked<T> {
    fn default() -> Self {
        Self::new()
    }
}
