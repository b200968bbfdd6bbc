//! Who reads the socket in the base scheme: the engine thread, or an
//! application thread that waits for completions. While an application
//! thread keeps waiting (it renews the lease each time it waits), the
//! engine thread takes the socket out of its epoll set and the waiter
//! sleeps in a blocking receive on the socket itself, so a message costs
//! it one system call to sleep and wake with the frame, and the engine
//! thread no wake-up for it. The engine thread still wakes every [`CHECK`]
//! and runs the flow timers that came due while no one waited; a lease
//! that is not renewed returns the socket to it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// How long a waiting application thread holds the socket after it last
/// waited: long enough that a loaded host's scheduling delays between two
/// waits do not hand the socket back and forth.
pub const LEASE: Duration = Duration::from_millis(5);
/// While a lease holds, the engine thread wakes this often for the flow
/// timers. Timers due while no one waits run up to this late, inside the
/// smallest retransmission timeout (a parked acknowledgment goes out by
/// `ack_delay + CHECK`).
pub const CHECK: Duration = Duration::from_millis(1);
/// The longest blocking receive of a waiter: well under [`LEASE`], so that
/// the waiter renews its lease before the engine thread takes the socket
/// back, and short enough that completions other threads produce (a
/// cancel, a timer's) are seen soon.
pub const BLOCK: Duration = Duration::from_micros(400);

#[derive(Debug)]
pub struct Lease {
    epoch: Instant,
    /// Nanoseconds after `epoch` when the lease ends.
    until: AtomicU64,
    /// The engine thread has the socket out of its epoll set: a waiter may
    /// block on it. Changed by the engine thread under the runtime's lock.
    engine_off: AtomicBool,
    /// Threads inside `wait`: while none is, the engine thread reads the
    /// socket when it wakes for the timers, so that frames (and the
    /// acknowledgments they owe) wait at most `CHECK` for a thread that
    /// went on to other work.
    waiters: AtomicUsize,
}

/// A thread inside `wait` (see [`Lease::enter`]).
#[derive(Debug)]
pub struct Waiting<'a>(&'a Lease);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Relaxed);
    }
}

impl Default for Lease {
    fn default() -> Self {
        Lease {
            epoch: Instant::now(),
            until: AtomicU64::new(0),
            engine_off: AtomicBool::new(false),
            waiters: AtomicUsize::new(0),
        }
    }
}

impl Lease {
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX)
    }

    /// An application thread is waiting: it holds the socket until `LEASE`
    /// after `now`.
    pub fn renew(&self, now: Instant) {
        self.until.fetch_max(self.nanos(now + LEASE), Relaxed);
    }

    /// When the lease ends, or `None` when it ended by `now`.
    pub fn until(&self, now: Instant) -> Option<Instant> {
        let u = self.until.load(Relaxed);
        (u > self.nanos(now)).then(|| self.epoch + Duration::from_nanos(u))
    }

    /// A thread enters `wait`; it leaves when the guard drops.
    pub fn enter(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, Relaxed);
        Waiting(self)
    }

    /// True while some thread is inside `wait`.
    pub fn waiting(&self) -> bool {
        self.waiters.load(Relaxed) > 0
    }

    /// True while the engine thread leaves the socket to waiters.
    pub fn engine_off(&self) -> bool {
        self.engine_off.load(Relaxed)
    }

    /// The engine thread leaves the socket (`true`) or takes it back.
    pub fn set_engine_off(&self, off: bool) {
        self.engine_off.store(off, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ends_lease_after_its_last_renewal() {
        let l = Lease::default();
        let now = Instant::now();
        assert!(l.until(now).is_none());
        l.renew(now);
        assert!(l.until(now + LEASE / 2).is_some());
        assert!(l.until(now + LEASE).is_none());
        // An earlier renewal does not shorten it.
        l.renew(now + LEASE / 2);
        l.renew(now);
        assert!(l.until(now + LEASE).is_some());
    }
}
