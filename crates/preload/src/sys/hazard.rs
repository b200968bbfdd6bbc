//! The raw side of `crate::borrow`'s hazard slots: `membarrier(2)` and the
//! dereference of a pointer a hazard slot protects.

use std::sync::atomic::{AtomicPtr, Ordering::Acquire};

pub const MEMBARRIER_CMD_PRIVATE_EXPEDITED: libc::c_long = 1 << 3;
pub const MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_long = 1 << 4;

/// `membarrier(cmd, 0, 0)`: 0 on success, -1 with errno.
pub fn membarrier(cmd: libc::c_long) -> libc::c_long {
    // SAFETY: membarrier takes integer arguments only.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0, 0) }
}

/// Runs `f` on what `fast` points to, or hands `f` back when it is null.
///
/// `fast` must follow `crate::borrow`'s protocol, which every caller is
/// inside: non-null only while its pointee lives, and cleared before the
/// pointee is dropped, by a closer that then waits until the calling
/// thread's hazard slot (set before this load) no longer names the owner.
pub fn with_published<T, R, F: FnOnce(&T) -> R>(fast: &AtomicPtr<T>, f: F) -> Result<R, F> {
    let p = fast.load(Acquire);
    if p.is_null() {
        return Err(f);
    }
    // SAFETY: per the protocol above, the pointee outlives this call.
    Ok(f(unsafe { &*p }))
}
