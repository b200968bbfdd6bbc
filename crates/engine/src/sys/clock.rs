//! Clocks: the time-stamp counter, the trace and timestamp clocks, CPU time.

use std::time::Duration;

/// CPU time consumed by the whole process so far (user + system).
pub fn process_cpu_time() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

/// CPU time consumed by the calling thread so far.
pub fn thread_cpu_time() -> Duration {
    clock(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// The time-stamp counter, where it is invariant (x86-64 with
/// `constant_tsc` and `nonstop_tsc`); `None` elsewhere.
#[inline]
pub fn tsc() -> Option<u64> {
    #[cfg(target_arch = "x86_64")]
    {
        static OK: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if *OK.get_or_init(|| {
            let c = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
            c.contains(" constant_tsc") && c.contains(" nonstop_tsc")
        }) {
            // SAFETY: RDTSC has no memory effects; it is available on every x86-64 CPU.
            return Some(unsafe { core::arch::x86_64::_rdtsc() });
        }
    }
    None
}

/// The time-stamp counter without [`tsc`]'s check, for a caller that made
/// that check once (the tracer's hot path); 0 where there is none.
#[inline(always)]
pub fn tsc_unchecked() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: RDTSC has no memory effects; it is available on every x86-64 CPU.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

/// `CLOCK_MONOTONIC_RAW` in nanoseconds (the trace clock).
pub fn monotonic_raw_ns() -> u64 {
    clock(libc::CLOCK_MONOTONIC_RAW).as_nanos() as u64
}

/// `CLOCK_REALTIME` in nanoseconds (the clock of kernel software timestamps).
pub fn realtime_ns() -> u64 {
    clock(libc::CLOCK_REALTIME).as_nanos() as u64
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: pointer to a live timespec.
    unsafe { libc::clock_gettime(id, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}
