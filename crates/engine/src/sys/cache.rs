//! Cache hints.

/// Asks for the cache line holding `v` in a writable state, ahead of a
/// store to it. A hint only: nothing is read or written.
#[inline(always)]
pub fn prefetch_for_write<T>(v: &T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW (or PREFETCHT0 where the target lacks it) only
    // hints the cache; it reads nothing architecturally and never faults.
    // SSE, which `_mm_prefetch` needs, is part of every x86-64 CPU.
    unsafe {
        use core::arch::x86_64::{_mm_prefetch, _MM_HINT_ET0};
        _mm_prefetch::<_MM_HINT_ET0>(v as *const T as *const i8);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}
