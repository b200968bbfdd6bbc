//! Locking that survives a panic elsewhere.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking it over when a thread panicked while holding it: the
/// engine's shared state stays usable (each holder leaves it consistent
/// between statements), and one failed call must not stop every later one.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
