//! Per-packet, per-layer tracepoints on one clock (`eudp trace`).
//!
//! Off by default. Every hook on the hot path is one relaxed load of a
//! global flag ([`on`]); the recording itself is out of line. When on, each
//! thread appends fixed-size events to its own bounded buffer of atomics (no
//! locks, no allocation after the buffer exists; a full buffer counts the
//! events it drops). Timestamps are `CLOCK_MONOTONIC_RAW` nanoseconds; kernel
//! timestamps (`SO_TIMESTAMPING`, reported in `CLOCK_REALTIME`) are mapped
//! onto that clock when read, with an offset sampled at that moment.
//!
//! Packets are identified per endpoint: a send gets the endpoint's next send
//! sequence number, a queued datagram its L1 index, a kernel message the
//! index the kernel's `SOF_TIMESTAMPING_OPT_ID` counter gives it, and a
//! received datagram its arrival index. `eudp-trace` joins these into one
//! path per packet. Nothing sent on the wire changes.
//!
//! Enable with the environment variable `EUDP_TRACE=PATH` (the events are
//! written to PATH when an endpoint closes and by [`finish`]) or with
//! [`enable`]. A `%p` in PATH stands for the writing process's pid, so the
//! processes of one program (a client and its server, fork children) each
//! write their own file instead of overwriting one another's.
//!
//! Files: `record` (the switch, the per-thread event buffers, the dump),
//! `clock` (the hot-path clock and its mapping onto
//! `CLOCK_MONOTONIC_RAW`), `ep` (an endpoint's trace and the kernel's
//! timestamps), `span` (work with a start and an end, one event each).

mod clock;
mod ep;
mod record;
mod span;
#[cfg(test)]
mod tests;

pub use clock::{choose_clock, hot_clock, now_ns, realtime_to_raw_offset};
pub use ep::*;
pub use record::*;
pub use span::{span_end, span_mark, span_start};
