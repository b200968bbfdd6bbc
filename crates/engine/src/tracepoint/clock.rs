//! The hot-path clock: the invariant TSC where there is one, else
//! `CLOCK_MONOTONIC_RAW`; mapped onto the raw clock when events are read.

use crate::sys::clock;
use std::cell::Cell;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

/// Hot-path clock ticks within which a realtime-to-raw offset is reused:
/// about a millisecond (TSC at 1–4 GHz: 2.1–0.5 ms; the raw clock: 2.1 ms).
pub(super) const OFFSET_TICKS: u64 = 1 << 21;

thread_local! {
    /// Realtime-to-raw offset and when it was sampled (hot-path clock).
    static OFFSET: Cell<(i64, u64)> = const { Cell::new((0, 0)) };
}

/// `CLOCK_MONOTONIC_RAW` now, in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    clock::monotonic_raw_ns()
}

/// The hot-path clock, chosen when tracing is enabled: [`CLOCK_TSC`],
/// [`CLOCK_RAW`] or [`CLOCK_NONE`]; 0 before the first [`enable`].
pub(super) static CLOCK: AtomicU8 = AtomicU8::new(0);
/// The invariant TSC (mapped onto `CLOCK_MONOTONIC_RAW` when events are read).
pub(super) const CLOCK_TSC: u8 = 1;
/// `CLOCK_MONOTONIC_RAW` itself (no invariant TSC).
pub(super) const CLOCK_RAW: u8 = 2;
/// Measurement only (`EUDP_TRACE_CLOCK=none`): no clock is read and every
/// hot-path time is 1, so `eudp trace --overhead` can tell the cost of the
/// clock reads from the rest of the tracing. Such a trace has no timing.
pub(super) const CLOCK_NONE: u8 = 3;

/// Picks the hot-path clock (once per process: events of one buffer must
/// share it); enabling a trace does, and so does a measurement of
/// [`hot_clock`] before it.
pub fn choose_clock() {
    if CLOCK.load(Relaxed) != 0 {
        return;
    }
    let c = if std::env::var("EUDP_TRACE_CLOCK").as_deref() == Ok("none") {
        CLOCK_NONE
    } else if clock::tsc().is_some() {
        CLOCK_TSC
    } else {
        CLOCK_RAW
    };
    CLOCK.store(c, Relaxed);
}

/// The hot-path clock: one relaxed load selects it (no lazy check per read).
#[inline]
pub(super) fn stamp() -> (u64, bool) {
    match CLOCK.load(Relaxed) {
        // Only chosen where clock::tsc found an invariant TSC.
        CLOCK_TSC => (clock::tsc_unchecked(), true),
        CLOCK_NONE => (1, false),
        _ => (now_ns(), false),
    }
}

/// One read of the hot-path clock as a traced call makes it, in the
/// clock's own units (TSC ticks or nanoseconds): for measuring what a read
/// costs, after [`choose_clock`].
#[inline]
pub fn hot_clock() -> u64 {
    stamp().0
}

/// A (TSC, raw ns) pair sampled at one instant, for the linear mapping.
pub(super) fn tsc_pair() -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..5 {
        let a = clock::tsc()?;
        let n = now_ns();
        let b = clock::tsc()?;
        if !matches!(best, Some(x) if x.0 <= b - a) {
            best = Some((b - a, a / 2 + b / 2, n));
        }
    }
    best.map(|x| (x.1, x.2))
}

pub(super) static CAL: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Maps TSC ticks to raw ns: the pair taken when tracing was enabled and
/// one taken now (at least 2 ms apart).
pub(super) fn tsc_map() -> Option<(u64, u64, f64)> {
    let p0 = (*CAL.lock().unwrap_or_else(|e| e.into_inner()))?;
    let mut p1 = tsc_pair()?;
    if p1.1.saturating_sub(p0.1) < 2_000_000 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        p1 = tsc_pair()?;
    }
    let slope = (p1.1 - p0.1) as f64 / (p1.0.wrapping_sub(p0.0)) as f64;
    Some((p0.0, p0.1, slope))
}

/// Offset to add to a `CLOCK_REALTIME` nanosecond stamp to put it on
/// `CLOCK_MONOTONIC_RAW`, from the tightest of three bracketed samples.
pub fn realtime_to_raw_offset() -> i64 {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..3 {
        let a = clock::monotonic_raw_ns();
        let r = clock::realtime_ns();
        let b = clock::monotonic_raw_ns();
        let width = b.saturating_sub(a);
        if width < best.0 {
            best = (width, (a / 2 + b / 2) as i64 - r as i64);
        }
    }
    best.1
}

/// The offset, re-sampled about every millisecond per thread (the age is
/// checked on the hot-path clock, so a cached offset costs no syscall).
pub(super) fn offset_cached() -> i64 {
    offset_cached_at(stamp().0)
}

/// [`offset_cached`] with the hot-path clock already read (`now`).
pub(super) fn offset_cached_at(now: u64) -> i64 {
    let (off, at) = OFFSET.with(Cell::get);
    if at != 0 && now.wrapping_sub(at) < OFFSET_TICKS {
        return off;
    }
    let off = realtime_to_raw_offset();
    OFFSET.with(|c| c.set((off, now)));
    off
}
