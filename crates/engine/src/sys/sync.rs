//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it over when a thread panicked while holding it: the
/// engine's shared state stays usable (each holder leaves it consistent
/// between statements), and one failed call must not stop every later one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The lock if nobody holds it (a poisoned one too, as [`lock`] takes it);
/// `None` when it is held — by another thread, or by this one further up.
pub fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}
