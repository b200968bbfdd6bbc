//! Several threads waiting on one asynchronous handle.
//!
//! A handle's check reads the kernel's notifications into the handle, which
//! clears its fd: a second thread polling that fd could then sleep through
//! what the first one took in. So one waiter polls and the others sleep on
//! a condition variable that the poller wakes whenever its poll ends.

use eudp_engine::sys::poll::poll_readable;
use eudp_engine::sys::sync::lock;
use libc::{c_int, EIO};
use std::os::fd::RawFd;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

/// Who polls, and how many polls have ended.
#[derive(Default)]
struct Turn {
    polling: bool,
    ended: u64,
}

/// The waiters of one handle.
#[derive(Default)]
pub(crate) struct Waiters {
    turn: Mutex<Turn>,
    ended: Condvar,
}

impl Waiters {
    /// Runs `check` until it gives something or `deadline` passes (`None`),
    /// waiting in between for `fd` to become readable. `check` must not
    /// block.
    pub(crate) fn wait<T>(
        &self,
        fd: RawFd,
        deadline: Instant,
        mut check: impl FnMut() -> Result<Option<T>, c_int>,
    ) -> Result<Option<T>, c_int> {
        loop {
            // Read before the check: a poll that ends after it changes
            // `ended`, so nothing it took in is slept through.
            let seen = lock(&self.turn).ended;
            if let Some(v) = check()? {
                return Ok(Some(v));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut t = lock(&self.turn);
            if t.ended != seen {
                continue;
            }
            if t.polling {
                // The poller wakes this thread when its poll ends.
                let _t = self.ended.wait_timeout_while(t, left, |t| t.ended == seen).map_err(|_| EIO)?;
                continue;
            }
            // This thread polls, outside every lock; the fd is
            // level-triggered, so what arrived since the check still wakes it.
            t.polling = true;
            drop(t);
            let r = poll_readable(&[fd], Some(left));
            let mut t = lock(&self.turn);
            t.polling = false;
            t.ended += 1;
            drop(t);
            self.ended.notify_all();
            r.map_err(|e| e.raw_os_error().unwrap_or(EIO))?;
        }
    }
}
