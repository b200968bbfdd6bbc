//! Coalescing queued sends into batches: when the engine is asked to send
//! L1, and when the caller's thread sends a batch's worth itself.

use super::{lock, EpInner};
use crate::batch::{gso_batch, GsoLimits};
use crate::queue::{L1Queue, SendState};
use crate::stats::Stats;
use crate::sys::sync::try_lock;
use std::net::SocketAddr;
use std::sync::atomic::{Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

impl EpInner {
    /// Waits on `send_cv` at most `timeout`, counted in `send_waiters`.
    pub(super) fn wait_send<'a>(&self, s: MutexGuard<'a, SendState>, timeout: Duration) -> MutexGuard<'a, SendState> {
        self.send_waiters.fetch_add(1, Relaxed);
        let s = self.send_cv.wait_timeout(s, timeout).unwrap_or_else(|e| e.into_inner()).0;
        self.send_waiters.fetch_sub(1, Relaxed);
        s
    }

    /// Wakes the threads waiting on `send_cv`, if any. Every change they
    /// wait for is made under `send`, where they counted themselves before
    /// looking, so a change made before this call cannot be missed.
    pub(super) fn notify_send(&self) {
        if self.send_waiters.load(Relaxed) != 0 {
            self.send_cv.notify_all();
        }
    }

    /// Asks the engine to service this endpoint's send side now.
    pub(super) fn kick(self: &Arc<Self>, s: &mut SendState) {
        if !s.scheduled || s.coalescing {
            s.scheduled = true;
            s.coalescing = false;
            self.engine.schedule(self.clone());
        }
    }

    /// Asks the engine to service this endpoint's send side within the
    /// coalescing interval: a streaming sender keeps queueing meanwhile and
    /// sends full batches itself, so the engine is not woken per batch.
    pub(super) fn kick_later(self: &Arc<Self>, s: &mut SendState) {
        if self.engine.config.tx_coalesce.is_zero() || !self.coalesces {
            return self.kick(s);
        }
        let since = || s.l1_since.filter(|_| !s.l1.is_empty()).unwrap_or_else(Instant::now);
        if !s.scheduled {
            s.scheduled = true;
            s.coalescing = true;
            self.engine.schedule_coalesced(self, since());
        } else if s.coalescing && s.l1.len() == 1 {
            // The first datagram after this thread sent L1 itself: the
            // interval restarts from it.
            self.engine.schedule_coalesced(self, since());
        }
    }

    /// The program's thread that queued the newest datagram in L1 is about
    /// to sleep (see [`crate::Engine::send_coalesced_now`]): a remainder
    /// that waits in L1 for its coalescing interval goes now — on this thread when it may
    /// send itself, else the engine is asked at once — instead of when the
    /// interval is up: nothing more is coming from that thread to batch it
    /// with, and it may be waiting for an answer to it. (Another thread's
    /// sleep says nothing about the sender's next datagram, so it leaves
    /// the remainder alone.) Never waits for the send
    /// lock: when another thread holds it (the engine, or a call in this
    /// endpoint's send path), `None`, and the caller asks the engine
    /// ([`crate::engine::Shared::send_coalesced_now`]). Returns whether it
    /// sent or asked.
    pub(crate) fn send_remainder_now(self: &Arc<Self>) -> Option<bool> {
        let mut s = try_lock(&self.send)?;
        if !s.coalescing_remainder_of(crate::queue::thread_token()) {
            return Some(false);
        }
        Stats::add(&self.stats.sleep_flushes, 1);
        if self.caller_drains {
            self.caller_flush(s, false);
        } else {
            self.kick(&mut s);
        }
        Some(true)
    }

    /// On the engine thread, for an application thread (`token`, or any
    /// with `u64::MAX`) that went to sleep and could not send its
    /// remainder itself: whether L1 holds a remainder that thread queued
    /// and that waits out its interval. Counted as a sleep flush: the
    /// engine sends it now.
    pub(crate) fn remainder_of(&self, token: u64) -> bool {
        let mine = lock(&self.send).coalescing_remainder_of(token);
        if mine {
            Stats::add(&self.stats.sleep_flushes, 1);
        }
        mine
    }

    /// True when L1 holds what the caller's thread should send itself:
    /// `tx_flush_batches` full GSO super-packets, or one `sendmmsg` call's
    /// worth without GSO. A batch of the datagram just queued holds what
    /// [`gso_batch`] packs — the segment limit or as many as fit the byte
    /// limit — so a uniform stream flushes exactly k whole batches (a byte
    /// total against k × `max_bytes` would flush a batch's worth plus one
    /// short straggler). With more than one batch, L1 half full also
    /// counts, so a small SO_SNDBUF never makes the sender wait for the
    /// engine (nor a sender polling for POLLOUT). That flush sends all of
    /// L1, a short last batch included: fewer datagrams per call cost more
    /// throughput than one short message does.
    pub(super) fn l1_holds_a_batch(&self, s: &SendState, last_len: usize) -> bool {
        let n = s.l1.len();
        let k = self.engine.config.tx_flush_batches;
        if 2 * s.l1.charged() >= s.capacity && k > 1 {
            return true;
        }
        if !self.gso.load(Relaxed) {
            return n >= self.engine.config.max_msgs;
        }
        let lim = &self.gso_limits;
        let per_batch = lim.max_segments.min(lim.max_bytes / last_len.max(1)).max(1);
        n >= k * per_batch || s.l1.payload_bytes() >= k * lim.max_bytes
    }

    /// The GSO limits a plan uses now: GSO on or off, the segment cap the
    /// path allowed, and for `connected_v4` IPv4's larger segments.
    pub(super) fn plan_limits(&self, connected_v4: bool) -> GsoLimits {
        let mut lim = self.gso_limits;
        lim.enabled = self.gso.load(Relaxed);
        if connected_v4 {
            lim.max_segment_size = lim.max_segment_size_v4;
        }
        let cap = self.gso_seg_cap.load(Relaxed);
        lim.max_segment_size = lim.max_segment_size.min(cap);
        lim.max_segment_size_v4 = lim.max_segment_size_v4.min(cap);
        lim
    }

    /// Datagrams at the end of L1 that [`gso_batch`] would put in a run one
    /// more datagram like the last could still join: a batch not yet full.
    /// Planned as `send_staged` plans, except that a connected IPv6 socket
    /// with an IPv4-mapped peer keeps IPv6's smaller segment cap (no peer
    /// lookup under the lock): that can only make a run look closed, so at
    /// worst it is sent short.
    fn open_tail(&self, l1: &L1Queue) -> usize {
        let mut items: Vec<(Option<SocketAddr>, usize)> = l1.slots().iter().map(|s| (s.dst, s.len as usize)).collect();
        let Some(&last) = items.last() else { return 0 };
        items.push(last);
        let runs = gso_batch(&items, &self.plan_limits(false));
        runs.last().map_or(0, |r| r.count - 1)
    }

    /// The caller's thread sends L1 itself as the engine would (reap the
    /// completed direct posts, take L1, hand it to the backend in batches):
    /// with a batch's worth queued there is nothing left to coalesce, and
    /// waking the engine would cost more than the send. Only whole batches
    /// leave when k whole batches triggered it: a trailing run short of one
    /// (a mixed stream) stays in L1 for the next flush or the engine's
    /// timer, unless it is all of L1 or would keep L1 half full. A flush at
    /// half full sends everything (see [`EpInner::l1_holds_a_batch`]).
    /// Falls back to [`EpInner::kick_later`] when another thread is
    /// staging or L2 is full.
    ///
    /// `keep_tail`: a stream's open run may stay for the next send (see
    /// below); false when everything must go now ([`EpInner::send_remainder_now`]).
    pub(super) fn caller_flush(self: &Arc<Self>, mut s: MutexGuard<'_, SendState>, keep_tail: bool) {
        let staging = self.caller_staging.try_lock();
        s.reap();
        let mut staging = match staging {
            Ok(st) if s.l2_has_room() && s.staged == 0 => st,
            _ if keep_tail => return self.kick_later(&mut s),
            _ => return self.kick(&mut s),
        };
        let n = s.l1.len();
        let by_count = self.engine.config.tx_flush_batches == 1 || 2 * s.l1.charged() < s.capacity;
        let keep = match if by_count && keep_tail { self.open_tail(&s.l1) } else { 0 } {
            tail if tail > 0 && tail < n => {
                // Kept only if L1 then stays under half full with one more
                // datagram, or the next send would flush the short run alone.
                let charge = |d: &crate::queue::Slot| d.len as usize + crate::queue::DATAGRAM_OVERHEAD;
                let kept: usize = s.l1.slots()[n - tail..].iter().map(charge).sum();
                if 2 * (kept + charge(&s.l1.slots()[n - 1])) < s.capacity {
                    tail
                } else {
                    0
                }
            }
            _ => 0,
        };
        let carried = s.l1_carried;
        let took = s.take_l1_prefix(&mut staging, n - keep);
        self.trace.take(took);
        if keep > 0 && n - keep >= carried {
            // The kept run was queued after the previous own-thread flush
            // (only `carried` datagrams predate it): its interval may run
            // from there rather than from the oldest datagram just sent.
            s.l1_since = s.l1_since.max(s.caller_flushed.map(|(t, _)| t));
        }
        let now = Instant::now();
        s.caller_flushed = Some((now, self.rx_calls.load(Relaxed)));
        drop(s);
        Stats::add(&self.stats.caller_flushes, 1);
        self.notify_send();
        if let Some(at) = self.send_staged(&staging, 0, false) {
            // The kernel's send buffer is full: the engine sends the rest
            // (still staged, so nothing overtakes it) and waits for room.
            let mut s = lock(&self.send);
            s.rest = staging.charged_from(at);
            self.caller_left.store(at + 1, Release);
            drop(staging);
            return self.kick(&mut s);
        }
        staging.clear();
        drop(staging);
        let mut s = lock(&self.send);
        if !s.l1_empty() {
            if keep > 0 && s.scheduled && s.coalescing {
                // Move the engine's timer to the kept run's time.
                if let Some(since) = s.l1_since.filter(|_| !s.l1.is_empty()) {
                    self.engine.schedule_coalesced(self, since);
                }
            }
            self.kick_later(&mut s);
        } else if s.flushers > 0 {
            drop(s);
            self.notify_send();
        }
    }
}
