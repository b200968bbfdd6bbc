//! A socket's move to the plain kernel path: the hand-over, the datagrams
//! kept from its ring, a read left asleep in the kernel socket, and close.

use super::generation::{FORK_REASON, VFORK_REASON};
use super::io::Info;
use super::sock::{lock, Sock, KERNEL};
use super::tls::with_tls;
use crate::log::dlog;
use eudp_engine::sys::fdevents::EventFd;
use eudp_engine::{Endpoint, KeptDatagram, Received};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

impl Drop for Sock {
    fn drop(&mut self) {
        crate::ringdup::forget_ring_dups(self as *const Sock as usize);
        let out = *self.reader_out.get_mut();
        if out != 0 && out != crate::sys::getpid() {
            // A fork child's: the endpoint's engine is the parent's.
            std::mem::forget(self.reader_ep.get_mut().unwrap_or_else(|e| e.into_inner()).take());
        }
        if self.leaked.load(SeqCst) {
            // The endpoint's engine is the parent's: dropping it would wait
            // for a thread that does not exist here.
            let ep = self.ep.get_mut().unwrap_or_else(|e| e.into_inner()).take();
            std::mem::forget(ep);
        }
    }
}

/// Moves everything the kernel already accepted for the socket of `fd`
/// into `keep`, in order, and leaves it on the plain kernel path with GRO
/// off and nothing coalesced in its queue. With `leave_asleep`, a thread
/// asleep inside its read of the empty socket is not waited for: the ring
/// is taken, the socket is left to that read with GRO still on (so what it
/// takes comes with its segment size and is split), and this returns true;
/// [`Sock::after_hand_over`] finishes the hand-over when the read ends.
///
/// While GRO was on the kernel may have queued several datagrams as one
/// coalesced message, which a plain receive would return glued together;
/// and the kernel reports a message's segment size only while GRO is on.
/// So the engine stops reading the socket, the ring and then the socket
/// are taken, split as the engine splits them
/// ([`Endpoint::take_received`]), with GRO on; then GRO goes off, after
/// which arrivals are queued as single datagrams. If the socket is empty
/// once GRO is off, nothing coalesced can be left (the queue is in
/// arrival order); if something arrived between the last read and the
/// option change, GRO goes on again for another round. Bounded: at most `ROUNDS`
/// rounds and the socket's `SO_RCVBUF` in bytes read (what the socket can
/// hold when GRO goes off); a sender that never lets the queue empty for
/// that long may leave a message coalesced before GRO went off (logged
/// with `EUDP_LOG=debug`).
fn hand_over(fd: i32, ep: &Endpoint, keep: &mut VecDeque<KeptDatagram>, leave_asleep: bool) -> bool {
    const ROUNDS: usize = 8;
    const WAIT: Duration = Duration::from_millis(200);
    ep.stop_receiving();
    let gro = crate::sys::gro_enabled(fd);
    let mut left = crate::sys::kernel_rcvbuf(fd).max(1 << 16);
    for round in 0..ROUNDS {
        let t = ep.take_received(left, WAIT, leave_asleep, keep);
        left = left.saturating_sub(t.socket_bytes);
        if t.reader_asleep {
            return true; // GRO stays on for it
        }
        if !gro {
            return false; // nothing coalesced was ever queued
        }
        crate::sys::gro_set(fd, false);
        if !crate::sys::kernel_has_data(fd) {
            return false;
        }
        let blocked = !t.socket_empty && t.socket_bytes == 0;
        if blocked || left == 0 || round + 1 == ROUNDS {
            dlog!("fd {fd}: the kernel queue did not empty while GRO went off (round {round}); a message may stay coalesced");
            return false;
        }
        crate::sys::gro_set(fd, true);
    }
    false
}

impl Sock {
    /// Moves this socket to the plain kernel path for good: every datagram
    /// the kernel already accepted for it is kept for the application, in
    /// order (see [`hand_over`]), queued sends are flushed, the endpoint is
    /// closed and the kernel socket gets back the flags the application
    /// asked for.
    ///
    /// Receives serve the kept datagrams before the kernel's: recv,
    /// recvfrom, recvmsg, recvmmsg, read, readv (`MSG_PEEK` too), FIONREAD,
    /// poll and select. An epoll set the application registered the socket
    /// in while it was on the engine also holds the ring's readiness
    /// eventfd, which is kept readable while datagrams are kept (closed,
    /// and so out of every epoll set, with the last one); a socket added to
    /// an epoll set after the fallback gets it added as well. Kept
    /// datagrams keep what the kernel reported with them (destination,
    /// TOS, TTL).
    ///
    /// Receives wait while the hand-over runs (`handing_over`). A receive
    /// that began on the engine and waits there finds, when it wakes, the
    /// socket handed over: it is made again on the kernel path (kept
    /// datagrams first, see `crate::hooks`' `shim_recv`). A thread asleep
    /// inside its read of an empty socket is not waited for, as the
    /// kernel's own option call does not wait for it: it keeps sleeping
    /// there, takes the next message, as a plain receive of the kernel
    /// socket would, and returns it (see [`Endpoint::stop_receiving`]);
    /// until it has, receives on the kernel path leave the socket to it
    /// (`reader_out`). Not for a fork: the child may read the socket,
    /// whose GRO must then be off, so the read is waited for (boundedly).
    pub fn fallback(&self, fd: i32, reason: &str) {
        if self.mode() == KERNEL {
            return; // also keeps a fork child off locks the parent's threads held
        }
        // Receives that find the socket on the kernel path wait for this.
        let _handing = lock(&self.handover);
        let ep = {
            let mut g = lock(&self.ep);
            if self.mode() == KERNEL {
                return;
            }
            self.handing_over.store(true, SeqCst);
            self.mode.store(KERNEL, Release);
            self.fast.store(std::ptr::null_mut(), SeqCst);
            g.take()
        };
        *lock(&self.reason) = Some(reason.to_string());
        crate::stat::FALLBACKS.fetch_add(1, Relaxed);
        crate::stat::note_fallback(reason);
        dlog!("fd {fd}: UDP socket moved to the kernel path: {reason}");
        if let Some(ep) = ep {
            let mut keep = lock(&self.leftover);
            let before = keep.len();
            // A socket shared with a fork child must not keep UDP_GRO on
            // (see `hand_over`): the child may read it.
            let shared = reason == FORK_REASON || reason == VFORK_REASON;
            let asleep = hand_over(fd, &ep, &mut keep, !shared);
            // A connected socket's ring keeps no source: it is the peer.
            if let Ok(peer) = ep.peer_addr() {
                for (_, src, _) in keep.iter_mut().skip(before).filter(|(_, a, _)| a.port() == 0) {
                    *src = peer;
                }
            }
            let mut ready = ep.take_ready_fd();
            if asleep {
                // Wakes receives waiting for what the sleeping read keeps.
                if ready.is_none() {
                    ready = EventFd::new().ok().map(Arc::new);
                }
                *lock(&self.reader_ep) = Some(ep.clone());
                self.reader_out.store(crate::sys::getpid(), Release);
            }
            if !keep.is_empty() {
                if let Some(r) = &ready {
                    r.set();
                }
                self.has_leftover.store(true, Release);
            }
            if !keep.is_empty() || asleep {
                *lock(&self.leftover_ready) = ready;
            }
            dlog!(
                "fd {fd}: {} datagrams kept for the kernel path{}",
                keep.len(),
                if asleep { "; a read asleep in the socket takes the next message" } else { "" }
            );
            // What was queued goes out now, ahead of the program's sends on
            // the kernel path, and before the final counters are taken so
            // they count it (the endpoint's drop would send it only after:
            // a burst then a fallback was reported short). With a read
            // asleep the endpoint lives on until that read returns.
            let flushed = ep.flush(flush_bound());
            drop(keep);
            let entry = self.closing_entry(&ep);
            let last = (!flushed).then(|| ep.final_counters());
            self.note_kernel_path(fd);
            self.poll_fd.store(-1, Relaxed);
            self.dup_fd.store(-1, Relaxed);
            self.err_fd.store(-1, Relaxed);
            self.release(ep);
            retire_final(entry, last);
            if asleep {
                // GRO goes off when the sleeping read has ended.
                crate::sys::restore_kernel_flags(fd, self.nonblock());
            } else {
                crate::sys::restore_kernel_socket(fd, self.nonblock());
            }
            // Kept datagrams carry their TOS/TTL; new ones get them from
            // the kernel only if the program asked.
            self.restore_rx_opts(fd, false);
        }
        self.handing_over.store(false, SeqCst);
    }

    /// A datagram kept from the ring after a fallback.
    pub fn pop_leftover(&self, buf: &mut [u8], peek: bool, want: Info) -> Option<Received> {
        let mut g = lock(&self.leftover);
        let (d, src, info) = if peek { g.front().cloned()? } else { g.pop_front()? };
        if g.is_empty() && !peek {
            self.has_leftover.store(false, Release);
            let mut ready = lock(&self.leftover_ready);
            if self.reader_out.load(Acquire) == 0 {
                // Closed: the socket's own readiness is all there is now.
                ready.take();
            } else if let Some(r) = ready.as_ref() {
                // Still wanted for what the sleeping read keeps.
                r.clear();
            }
        }
        let n = d.len().min(buf.len());
        buf[..n].copy_from_slice(&d[..n]);
        if let Some(w) = want {
            *w = info;
        }
        Some(Received { copied: n, len: d.len(), src })
    }

    /// On the kernel path: a thread left asleep in its read of the socket
    /// at the hand-over has not returned yet (see `reader_out`).
    #[inline]
    pub fn reader_in_flight(&self) -> bool {
        let p = self.reader_out.load(Acquire);
        p != 0 && p == crate::sys::getpid()
    }

    /// Called by every receive that went through the endpoint and found
    /// the socket `fd` handed over when it returned (the thread left asleep
    /// in its read among them): what that read brought and nobody took
    /// from the ring joins the leftovers, in order after them. Once that
    /// read has ended the hand-over is finished ([`hand_over`]: what
    /// arrived meanwhile, coalesced while GRO stayed on for that read, is
    /// kept too, and GRO goes off), and receives on the kernel path may
    /// read the kernel socket again.
    #[cold]
    #[inline(never)]
    pub fn after_hand_over(&self, fd: i32) {
        // `reader_out` is settled once the hand-over is.
        self.await_hand_over();
        let mut keep = lock(&self.leftover);
        if !self.reader_in_flight() {
            return;
        }
        let Some(ep) = lock(&self.reader_ep).clone() else { return };
        // Read first: once it is false the read's datagrams are in the ring.
        let asleep = ep.reader_asleep();
        let before = keep.len();
        if asleep {
            ep.take_received(0, Duration::ZERO, true, &mut keep);
        } else {
            hand_over(fd, &ep, &mut keep, false);
        }
        if let Ok(peer) = ep.peer_addr() {
            for (_, src, _) in keep.iter_mut().skip(before).filter(|(_, a, _)| a.port() == 0) {
                *src = peer;
            }
        }
        if keep.len() > before {
            dlog!("fd {fd}: {} more datagrams kept for the kernel path after the sleeping read", keep.len() - before);
            if let Some(r) = lock(&self.leftover_ready).as_ref() {
                r.set();
            }
            self.has_leftover.store(true, Release);
        }
        if !asleep {
            let ep = self.reader_gone(&keep);
            drop(keep);
            drop(ep);
        }
    }

    /// The read left asleep at the hand-over is over (the leftover lock is
    /// held: `keep` is what it guards). Returns the endpoint, for the
    /// caller to drop once that lock is released (closing it may wait for
    /// the engine).
    fn reader_gone(&self, keep: &VecDeque<KeptDatagram>) -> Option<Arc<Endpoint>> {
        self.reader_out.store(0, Release);
        if keep.is_empty() {
            lock(&self.leftover_ready).take();
        }
        lock(&self.reader_ep).take()
    }

    /// A receive on the kernel path while a thread left asleep in its read
    /// of the socket at the hand-over has not returned ([`Sock::reader_in_flight`]):
    /// the leftovers first; the kernel socket stays that read's. A datagram
    /// in the kernel socket is that read's to take (no other read of the
    /// socket runs meanwhile), which ends it within microseconds: this
    /// waits for it. With nothing queued a nonblocking receive reports
    /// `EAGAIN` and a blocking one sleeps until the socket or the
    /// leftovers are readable (honouring `SO_RCVTIMEO`, and failing with
    /// `EINTR` as [`ep_recv`] does). `None`: that read has ended; receive
    /// from the kernel socket.
    #[cold]
    #[inline(never)]
    pub fn await_reader(
        &self,
        fd: i32,
        buf: &mut [u8],
        peek: bool,
        blocking: bool,
        mut want: Info,
    ) -> Option<Result<Received, i32>> {
        // A read that does not take a queued datagram in this long is not
        // coming back (its thread stopped, or cancelled in the read).
        const TAKING: Duration = Duration::from_millis(50);
        let deadline = if blocking { crate::sys::kernel_timeouts(fd).0.map(|t| Instant::now() + t) } else { None };
        let mut queued_since: Option<Instant> = None;
        loop {
            if let Some(r) = self.pop_leftover(buf, peek, want.as_deref_mut()) {
                return Some(Ok(r));
            }
            if !self.reader_in_flight() {
                return None;
            }
            if crate::sys::kernel_has_data(fd) {
                let since = *queued_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= TAKING {
                    let mut keep = lock(&self.leftover);
                    let ep = lock(&self.reader_ep).clone();
                    if let (Some(ep), true) = (ep, keep.is_empty() && self.reader_in_flight()) {
                        dlog!("fd {fd}: the read asleep at the hand-over did not take a queued datagram; reading the kernel socket");
                        // It holds the socket: the ring is taken and GRO goes off.
                        hand_over(fd, &ep, &mut keep, false);
                        if !keep.is_empty() {
                            self.has_leftover.store(true, Release);
                        }
                        let ep = self.reader_gone(&keep);
                        drop(keep);
                        drop(ep);
                    }
                    continue;
                }
                std::thread::yield_now();
                continue;
            }
            queued_since = None;
            if !blocking {
                return Some(Err(libc::EAGAIN));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Some(Err(libc::EAGAIN)),
                },
                None => None,
            };
            if crate::sys::wait_readable(fd, self.leftover_ready_fd(), left) == Err(libc::EINTR)
                && crate::signals::eintr_wanted()
            {
                return Some(Err(libc::EINTR));
            }
        }
    }

    /// The readiness eventfd standing for the kept datagrams, if any.
    pub fn leftover_ready_fd(&self) -> Option<i32> {
        lock(&self.leftover_ready).as_ref().map(|e| e.as_raw_fd())
    }

    /// The last descriptor naming the socket, `fd`, is being closed.
    pub(super) fn close(&self, fd: i32) {
        // The last fd is gone: nobody can receive what was kept (counted),
        // and the eventfd must not report a closed socket in an epoll set.
        let discarded = {
            let mut keep = lock(&self.leftover);
            let n = keep.len();
            keep.clear();
            n
        };
        self.has_leftover.store(false, Release);
        lock(&self.leftover_ready).take();
        if self.leaked.load(SeqCst) {
            return;
        }
        if self.mode() == KERNEL {
            self.retire_kernel_path(fd, discarded as u64);
        }
        let ep = {
            let mut g = lock(&self.ep);
            self.fast.store(std::ptr::null_mut(), SeqCst);
            g.take()
        };
        if let Some(ep) = ep {
            // What was queued goes out first, as close(2) sends it too, so
            // that the final counters count it (a burst then close: logger).
            ep.flush(flush_bound());
            let entry = self.closing_entry(&ep);
            // The drop's own counters are final: what its flush could not
            // send (`drop_shutdown`) and what the ring held unread
            // (`drop_close`).
            let last = Some(ep.final_counters());
            self.release(ep);
            retire_final(entry, last);
        }
    }

    /// Drops the endpoint taken from `ep` once no call borrows it (`fast`
    /// was cleared first). A borrower that does not finish in time keeps
    /// it alive for good: leaked, never freed under it.
    fn release(&self, ep: Arc<Endpoint>) {
        if crate::borrow::quiesce(self as *const Sock as *const (), with_tls(|t| t.slot.get())) {
            drop(ep);
        } else {
            dlog!("fd {}: endpoint still borrowed at close; left allocated", self.fd);
            std::mem::forget(ep);
        }
    }

    /// The endpoint's counters, for stats; `at_exit`: the process is
    /// ending, and what the ring holds unread counts in `drop_close`.
    pub fn snapshot(
        &self,
        at_exit: bool,
    ) -> Option<(eudp_engine::StatsSnapshot, Option<SocketAddr>, Option<SocketAddr>)> {
        if self.leaked.load(SeqCst) {
            return None;
        }
        let ep = self.existing()?;
        let mut st = ep.report();
        if at_exit {
            st.drop_close += ep.unread();
        }
        Some((st, ep.local_addr().ok(), ep.peer_addr().ok()))
    }
}

/// How long a fallback or a close waits for the endpoint's queued sends:
/// 5 s, or `EUDP_TEST_FLUSH_MS` (tests only).
fn flush_bound() -> Duration {
    let ms = std::env::var("EUDP_TEST_FLUSH_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(5000);
    Duration::from_millis(ms)
}

/// Records a closing endpoint's entry. With `last` given, the endpoint's
/// drop took its final counters (what a flush that ran out of time could
/// not send, `drop_shutdown`; what the ring held unread at a close,
/// `drop_close`): the entry takes them, if the drop has happened (a call
/// still borrowing the endpoint keeps it).
fn retire_final(mut entry: crate::stat::SockReport, last: Option<eudp_engine::FinalCounters>) {
    if let Some(fin) = last.and_then(|l| lock(&l).take()) {
        entry.stats = Some(fin);
    }
    crate::stat::retire(entry);
}

/// Runs (on a thread of its own) once an eudp thread panicked: every
/// socket moves to the kernel path, so that the program goes on without
/// the engine.
pub fn engine_failed(why: &str) {
    dlog!("moving every socket to the kernel path: {why}");
    for (fd, s) in super::table::all() {
        let moved =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| s.fallback(fd, "eudp engine thread failed")));
        if moved.is_err() {
            eudp_engine::failure::PANICS.fetch_add(1, Relaxed);
        }
    }
}
