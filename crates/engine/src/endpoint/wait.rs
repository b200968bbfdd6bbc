//! A receive that found the ring empty: reading the socket on the caller's
//! thread, spinning, sleeping inside the read or on readiness, timeouts.

use super::fill::with_caller_scratch;
use super::handover::handed_over;
use super::{err, lock, EpInner, Received, RecvFlags};

use crate::backend::PktInfo;
use crate::stats::Stats;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::time::Instant;

/// A spinning receive (`EUDP_SPIN_US`) yields its CPU after this many looks
/// that found nothing. By count, not by time: on a loaded two-CPU host the
/// peer a ping-pong waits for often shares this CPU, and every microsecond
/// the spin keeps it is a microsecond added to the round trip (a yield
/// once per 10 µs added about 10 µs to sockperf's p50 under the latency
/// profile, on both transports).
const SPIN_YIELD_EVERY: u32 = 4;

impl EpInner {
    /// [`EpInner::recv`] once the ring was found empty.
    #[inline(never)]
    pub(super) fn recv_wait(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        mut info: Option<&mut Option<PktInfo>>,
    ) -> io::Result<Received> {
        let nonblocking = flags.dont_wait || self.nonblocking.load(Relaxed);
        let mut deadline: Option<Option<Instant>> = None;
        let mut spin_until: Option<Instant> = None;
        // A receive that a signal must end with EINTR spins with the
        // signals unblocked and compares, after each look, the thread's
        // count of handlers without SA_RESTART run (`process::interrupts`,
        // kept by the shim's relay of such handlers): a change ends it with
        // EINTR, as the kernel would, and a restarting handler lets it go
        // on. Only from its last look to its return does it hold the
        // signals blocked, and it sleeps only in a `ppoll` that puts the
        // caller's mask back for the wait: a handler run between that look
        // and the sleep would otherwise leave nothing for the sleep to fail
        // for. Not sleeping inside the read then (it would sleep through a
        // pending signal).
        let spin_cfg = self.engine.config.recv_spin;
        let masked_sleep = flags.interruptible && !spin_cfg.is_zero();
        let interrupts_at = crate::sys::process::interrupts();
        let interrupted = || masked_sleep && crate::sys::process::interrupts() != interrupts_at;
        let mut signals: Option<crate::sys::process::AsyncSignalsBlocked> = None;
        // A timed receive sleeps inside the read at most once: that read
        // waits the socket's whole timeout, which is only right while
        // (almost) none of it has passed. Later waits take the remaining
        // time on the readiness path below.
        let mut timed_read_left = self.rx_timeout_in_socket.load(Relaxed);
        // Spin rounds that found nothing (latency profile).
        let mut spins: u32 = 0;
        // The ring was just found empty by `recv`.
        let mut looked = true;
        // A sleep on readiness below ended (the socket or the ring became
        // readable, or a spurious wake-up).
        let mut woken = false;
        loop {
            if !std::mem::take(&mut looked) {
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    return Ok(r);
                }
            }
            if interrupted() {
                return Err(err(libc::EINTR));
            }
            if self.rx_stopped.load(Relaxed) {
                return Err(handed_over());
            }
            if crate::failure::failed() {
                // The engine may have died holding the socket: no wait here
                // would end.
                return Err(crate::failure::failed_error());
            }
            // Ring empty. A blocking receive without a timeout (and past its
            // spin) sleeps inside the read itself when it can.
            let dl = if nonblocking { None } else { *deadline.get_or_insert_with(|| self.deadline(false)) };
            let spinning = !spin_cfg.is_zero() && spin_until.is_none_or(|t| t > Instant::now());
            let timed = dl.is_some();
            let blocked = if nonblocking || spinning || masked_sleep || (timed && !std::mem::take(&mut timed_read_left))
            {
                None
            } else {
                // About to sleep in the read: what waits to be coalesced
                // goes first (an answer to it may be what this waits for).
                self.engine.send_coalesced_now();
                self.block_in_read(flags.interruptible, timed)
            };
            match blocked {
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
                // Read the socket on this thread (no hop), unless the engine
                // is reading it right now — then its push will wake us.
                None => match self.rx_sock.try_lock() {
                    // Handed over while this thread got here: the socket is
                    // the owner's (and what the hand-over left, its own).
                    Ok(_g) if self.rx_stopped.load(Relaxed) => return Err(handed_over()),
                    Ok(_g) => {
                        Stats::add(&self.stats.direct_recv_calls, 1);
                        // Readiness is settled after this thread's pop below.
                        // After a sleep on readiness: a full read (the kernel
                        // socket's readiness may be what woke it). A spin
                        // that found nothing looks for one message
                        // (`recvmsg`, the cheapest look): it waits for the
                        // next datagram, not a batch. The first look of a
                        // blocking receive reads a batch, as a spinning look:
                        // a backend whose look is cheaper than a read of its
                        // socket (xdp) then makes no system call for it, and
                        // a datagram on its kernel path wakes the sleep below
                        // (the kernel socket is in `raw_fd`). A nonblocking
                        // receive reads everything, as the kernel's would.
                        if woken {
                            self.fill_on_caller(false, usize::MAX);
                        } else if spins > 0 {
                            self.spin_look_on_caller();
                        } else if !nonblocking {
                            self.first_spin_look_on_caller();
                        } else {
                            self.fill_on_caller(false, usize::MAX);
                        }
                    }
                    // The engine is reading the socket right now: wait for
                    // that read to land in the ring (one syscall) rather than
                    // report EAGAIN for data that is already on its way — a
                    // program told "readable" must not see EAGAIN. Unless
                    // another thread sleeps inside a read (it may have just
                    // taken the lock): what that read brings beyond its own
                    // datagram reaches the ring and wakes us.
                    Err(_) => loop {
                        if self.rx_blocked.load(SeqCst) || self.rx_sock.try_lock().is_ok() || crate::failure::failed() {
                            break;
                        }
                        std::thread::yield_now();
                    },
                },
            }
            let ready = {
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    if !rs.ring.is_empty() {
                        rs.signal();
                    }
                    return Ok(r);
                }
                if let Some(e) = self.take_pending_error() {
                    rs.unsignal();
                    if let Some(f) = &rs.err {
                        f.clear();
                    }
                    return Err(e);
                }
                if nonblocking {
                    return Err(err(libc::EAGAIN));
                }
                if self.rx_stopped.load(SeqCst) {
                    // Handed over since the loop's check: `stop_receiving`
                    // may have signalled before this thread's eventfd
                    // existed, and nothing else would wake it.
                    return Err(handed_over());
                }
                let now = Instant::now();
                if dl.is_some_and(|d| now >= d) {
                    return Err(err(libc::EAGAIN));
                }
                if !spin_cfg.is_zero() && *spin_until.get_or_insert(now + spin_cfg) > now {
                    None
                } else {
                    Some((self.ready_fd(&mut rs)?.clone(), rs.err.clone(), now))
                }
            };
            let Some((ready, errs, now)) = ready else {
                // Polite spinning: on a machine with fewer cores than busy
                // threads the peer this receive waits for may need this
                // CPU, so it is given up regularly — but not after every
                // look, since a yield with nobody else to run still costs
                // a trip through the scheduler, as much as a look costs.
                spins += 1;
                #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
                if spins % SPIN_YIELD_EVERY == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            };
            if masked_sleep && signals.is_none() {
                signals = Some(crate::sys::process::AsyncSignalsBlocked::new());
                // A handler that ran since the last look: none can run now.
                if interrupted() {
                    return Err(err(libc::EINTR));
                }
            }
            let remaining = dl.map(|d| d - now);
            // Wake on data in the socket (we read it ourselves) or in the ring
            // (the engine got there first).
            self.engine.send_coalesced_now();
            self.rx_waiters.fetch_add(1, SeqCst);
            let fds = [self.backend.raw_fd(), ready.as_raw_fd(), errs.as_ref().map_or(-1, |f| f.as_raw_fd())];
            let r = match &signals {
                Some(b) => crate::sys::poll::poll_readable_or_shut_masked(&fds, remaining, b.mask_before()),
                None => crate::sys::poll::poll_readable_or_shut(&fds, remaining, flags.interruptible),
            };
            self.rx_waiters.fetch_sub(1, SeqCst);
            let r = match r {
                // The ppoll took a signal whose handler restarts (it counted
                // none without SA_RESTART): the receive goes on, as the
                // kernel's would.
                Err(e) if e.kind() == io::ErrorKind::Interrupted && signals.is_some() && !interrupted() => Ok(false),
                r => r,
            };
            if r? {
                // The socket's reading side was shut down (shutdown(SHUT_RD)
                // on it): as on the kernel, a blocking receive returns what
                // is still queued, then an empty read, rather than waiting
                // on a socket that stays readable with nothing to read.
                if let Ok(_g) = self.rx_sock.try_lock() {
                    if !self.rx_stopped.load(Relaxed) {
                        self.fill_on_caller(false, usize::MAX);
                    }
                }
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    return Ok(r);
                }
                return Ok(Received { copied: 0, len: 0, src: SocketAddr::from(([0, 0, 0, 0], 0)) });
            }
            woken = true;
        }
    }

    /// One blocking receive with an empty ring, made inside the read: when
    /// no other thread is reading the socket, this thread takes `rx_sock`
    /// and sleeps in the kernel until the first message (one syscall, as on
    /// a kernel socket, instead of a failed read, a wait and a read). Holding
    /// the lock keeps the engine and other threads off the socket, so no
    /// datagram can reach the ring behind a sleeping reader's back.
    ///
    /// `None`: not tried (another thread reads, or the ring filled
    /// meanwhile) or not possible (the backend cannot, the description is
    /// nonblocking): wait on readiness instead. `Some(Err)`: `EINTR`, for
    /// the caller to report.
    ///
    /// `timed`: the receive has a timeout, which the socket holds as its
    /// own `SO_RCVTIMEO` (see `rx_timeout_in_socket`), so the read ends by
    /// itself with `EAGAIN` when it expires. The kernel counts that timeout
    /// in scheduler ticks and may end the read up to one tick before the
    /// receive's deadline, so such an `EAGAIN`, and an interruption that
    /// does not end the receive, give `None`: the caller waits out what is
    /// left of its deadline on readiness, exactly.
    fn block_in_read(&self, interruptible: bool, timed: bool) -> Option<io::Result<()>> {
        if !self.rx_blocking_ok.load(Relaxed) {
            return None;
        }
        let _g = self.rx_sock.try_lock().ok()?;
        if self.rx_stopped.load(Relaxed) {
            return Some(Err(handed_over()));
        }
        if self.ring_len.get() > 0 || self.pending_error.load(Relaxed) != 0 {
            return None;
        }
        self.rx_blocked.store(true, SeqCst);
        self.rx_waiters.fetch_add(1, SeqCst);
        let r = with_caller_scratch(|sc| {
            loop {
                Stats::add(&self.stats.recv_calls, 1);
                Stats::add(&self.stats.direct_recv_calls, 1);
                self.trace.rx_enter();
                // One message: a hand-over may begin while this thread
                // sleeps, and after it the socket is its owner's; the one
                // message this read takes then is what a plain receive of
                // the kernel socket would have taken, and it is returned
                // at once (more would be left behind in a ring nobody
                // reads). Under a stream the ring is seldom empty, and a
                // message may hold a whole GRO batch.
                let budget = self.read_budget(1);
                match self.backend.recv_batch_wait(&mut sc.bufs[..budget], &mut sc.meta[..budget]) {
                    // A shut-down socket reads nothing without waiting.
                    Ok(0) => return None,
                    Ok(got) => {
                        let added = self.push_read(sc, got, false);
                        self.last_fill.store(added, Relaxed);
                        if added > 0 {
                            self.last_batch.store(added, Relaxed);
                        }
                        return Some(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        if interruptible {
                            return Some(Err(e));
                        }
                        if timed {
                            return None;
                        }
                    }
                    // The socket's timeout expired (or very nearly).
                    Err(e) if timed && e.kind() == io::ErrorKind::WouldBlock => return None,
                    // Without a timeout this is a nonblocking description
                    // (the owner's setting, or another process's): wait on
                    // readiness from now on.
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Unsupported) => {
                        self.rx_blocking_ok.store(false, Relaxed);
                        return None;
                    }
                    Err(e) => {
                        self.read_failed(&e, 0);
                        return Some(Ok(()));
                    }
                }
            }
        });
        self.rx_waiters.fetch_sub(1, SeqCst);
        self.rx_blocked.store(false, SeqCst);
        r
    }
}
