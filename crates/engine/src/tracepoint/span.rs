//! Spans: a piece of work with a start and an end on one thread, kept as
//! one event stamped at its end that carries its start. The EMP steps
//! (`emp::steptrace`) are spans.

use super::clock::stamp;
use super::record::{on, push_raw, word1, Kind};

/// A span's start on the hot-path clock, or 0 while tracing is off (the
/// only cost then is the switch's load).
#[inline(always)]
pub fn span_start() -> u64 {
    if on() {
        stamp().0.max(1)
    } else {
        0
    }
}

/// Records a span of `kind` that started at `start` ([`span_start`]) and
/// ends now; nothing when `start` is 0. `extra` keeps its low 40 bits.
#[inline]
pub fn span_end(kind: Kind, start: u64, extra: u64, b: u64) {
    if start == 0 {
        return;
    }
    let (t, tsc) = stamp();
    push_raw(word1(kind, 0, tsc, extra & ((1 << 40) - 1)), t, start, b);
}

/// Records a point event of `kind` now (a = `a`, b = 0), while tracing is on.
pub fn span_mark(kind: Kind, a: u64) {
    if on() {
        let (t, tsc) = stamp();
        push_raw(word1(kind, 0, tsc, 0), t, a, 0);
    }
}
