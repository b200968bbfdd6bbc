//! Tracing started and stopped while endpoints are open (`eudp trace
//! --attach`): their sockets get the kernel's timestamps for the window
//! only, and their trace counters start again from zero so the engine's
//! message numbers match the kernel's `OPT_ID` keys, which restart when
//! the option is set.
//!
//! A trace pairs the n-th traced send with the n-th traced arrival, so the
//! window opens at a quiet moment: no datagram between its send and its
//! receive anywhere in the process. A datagram sent before the window and
//! received in it would otherwise take the first arrival index and pair
//! every later receive with the send before its own.

use super::{lock, Endpoint};
use crate::queue::SendState;
use crate::sys::timestamp::{self, SO_TIMESTAMPING};
use crate::tracepoint;
use std::time::{Duration, Instant};

/// How long [`start`] looks for a quiet moment before it opens the window
/// anyway (a program that always has datagrams on their way has none).
pub const QUIET_WAIT: Duration = Duration::from_secs(1);

/// How long [`start`] waits for the kernel to stamp arriving packets.
const RX_STAMPS_WAIT: Duration = Duration::from_secs(2);

/// The pause between two looks: short against the gaps between a
/// request/response program's exchanges.
const QUIET_RETRY: Duration = Duration::from_micros(200);

/// Nothing of this endpoint is on its way: nothing queued, staged or in a
/// send call, nothing in its ring or its kernel receive queue.
fn idle(e: &Endpoint, ring_empty: bool, s: &SendState) -> bool {
    // Descriptors in L2 that are neither completed nor batches: direct
    // posts whose send call is under way.
    let posting = s.l2 != s.done_unreaped + s.batches;
    s.l1_empty() && s.batches == 0 && !posting && ring_empty && !crate::sys::poll::has_data(e.inner.backend.raw_fd())
}

/// Turns tracing on for `eps` and for endpoints opened from now on;
/// returns whether the window opened at a quiet moment (within
/// [`QUIET_WAIT`]; if not, datagrams on their way at the start may be
/// paired one or more apart).
///
/// While every endpoint's send and receive locks are held (so no send is
/// numbered and nothing is read meanwhile), each socket gets its
/// timestamping flags, each trace restarts its counters — datagrams still
/// in L1 or in the ring (none at a quiet moment) are counted as there,
/// without events — the events of an earlier window are forgotten, and
/// then the global switch goes on.
pub fn start(eps: &[&Endpoint]) -> bool {
    let flags = tracepoint::timestamping_flags();
    // May wait for the kernel's RX stamping: before any lock.
    if !tracepoint::rx_stamps_confirmed(flags, RX_STAMPS_WAIT) {
        crate::log::write(
            crate::log::Level::Warn,
            format_args!("trace: kernel RX stamping not confirmed; the first packets may lack RX_SOFTWARE"),
        );
    }
    let deadline = Instant::now() + QUIET_WAIT;
    loop {
        let rx: Vec<_> = eps.iter().map(|e| (lock(&e.inner.rx_sock), lock(&e.inner.recv))).collect();
        let tx: Vec<_> = eps.iter().map(|e| lock(&e.inner.send)).collect();
        let quiet = eps.iter().zip(&rx).zip(&tx).all(|((e, (_, r)), s)| idle(e, r.ring.is_empty(), s));
        if !quiet && Instant::now() < deadline {
            drop(tx);
            drop(rx);
            std::thread::sleep(QUIET_RETRY);
            continue;
        }
        for ((e, (_, r)), s) in eps.iter().zip(&rx).zip(&tx) {
            // Stamps an earlier window left queued carry keys this one reuses.
            timestamp::read_tx_timestamps(e.inner.backend.raw_fd(), &mut |_, _, _| {});
            if let Err(err) =
                e.inner.backend.set_option(libc::SOL_SOCKET, SO_TIMESTAMPING, e.inner.trace.socket_flags(flags))
            {
                crate::log::write(crate::log::Level::Warn, format_args!("trace: SO_TIMESTAMPING: {err}"));
            }
            e.inner.trace.restart(s.l1.len() as u64 + u64::from(s.staged), r.ring.datagrams() as u64);
        }
        // Events of an earlier window use the same numbers: each window's
        // dump holds its own only (tracing is off, so no thread records now).
        tracepoint::reset();
        tracepoint::enable();
        return quiet;
    }
}

/// Ends the window: reads the TX stamps still queued on each socket, turns
/// its timestamps off, then turns tracing off. The events stay for
/// [`tracepoint::finish`].
pub fn stop(eps: &[&Endpoint]) {
    for e in eps {
        let _s = lock(&e.inner.send);
        e.inner.trace.drain_tx(e.inner.backend.raw_fd());
        let _ = e.inner.backend.set_option(libc::SOL_SOCKET, SO_TIMESTAMPING, 0);
    }
    tracepoint::disable();
}
