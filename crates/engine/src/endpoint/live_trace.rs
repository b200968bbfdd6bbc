//! Tracing started and stopped while endpoints are open (`eudp trace
//! --attach`): their sockets get the kernel's timestamps for the window
//! only, and their trace counters start again from zero so the engine's
//! message numbers match the kernel's `OPT_ID` keys, which restart when
//! the option is set.

use super::{lock, Endpoint};
use crate::sys::timestamp::{self, SO_TIMESTAMPING};
use crate::tracepoint;

/// Turns tracing on for `eps` and for endpoints opened from now on.
///
/// While every endpoint's send lock is held (so no send is numbered
/// meanwhile), each socket gets its timestamping flags, each trace restarts
/// its counters — datagrams already in L1 or in the ring are counted as
/// there, without events — the events of an earlier window are forgotten,
/// and then the global switch goes on. A datagram
/// whose send syscall is under way outside the lock at that instant can
/// still shift the kernel's keys of that socket by one.
pub fn start(eps: &[&Endpoint]) {
    let flags = tracepoint::timestamping_flags();
    // May wait up to 200 ms for the kernel's RX stamping: before any lock.
    tracepoint::rx_stamps_ready(flags);
    let rx: Vec<_> = eps.iter().map(|e| (lock(&e.inner.rx_sock), lock(&e.inner.recv))).collect();
    let tx: Vec<_> = eps.iter().map(|e| lock(&e.inner.send)).collect();
    for ((e, (_, r)), s) in eps.iter().zip(&rx).zip(&tx) {
        // Stamps an earlier window left queued carry keys this one reuses.
        timestamp::read_tx_timestamps(e.inner.backend.raw_fd(), &mut |_, _, _| {});
        if let Err(err) = e.inner.backend.set_option(libc::SOL_SOCKET, SO_TIMESTAMPING, flags) {
            crate::log::write(crate::log::Level::Warn, format_args!("trace: SO_TIMESTAMPING: {err}"));
        }
        e.inner.trace.restart(s.l1.len() as u64 + u64::from(s.staged), r.ring.datagrams() as u64);
    }
    // Events of an earlier window use the same numbers: each window's dump
    // holds its own only (tracing is off, so no thread records now).
    tracepoint::reset();
    tracepoint::enable();
    drop(tx);
    drop(rx);
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
