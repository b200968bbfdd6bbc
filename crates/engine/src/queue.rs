//! The two-level send queue of paper 000 §4.2, adapted to a kernel backend.
//!
//! * **L1** ([`L1Queue`]) is a byte arena in user memory holding datagrams
//!   the caller could not post at once. Its capacity is charged like the
//!   kernel charges a socket send buffer: payload plus a fixed per-datagram
//!   overhead, against `SO_SNDBUF`.
//! * **L2** is the bound on backend operations (descriptors) in flight. A
//!   direct post by the caller occupies one L2 slot until the engine — our
//!   completion handler — reaps its completion; that deferred reap is what
//!   makes the queue self-clocking: a caller posting faster than the engine
//!   completes finds L2 full and queues instead, and the engine then drains
//!   L1 in batches.
//!
//! Every state change goes through [`SendState::apply`], which also records
//! the [`QueueEvent`] (when recording is on) so the running engine can be
//! checked against the model in [`crate::machine`].

use crate::machine::{QueueEvent, QueueState};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

/// Per-datagram bookkeeping charged against the send buffer, in bytes. The
/// kernel charges an skb's truesize; a fixed charge keeps small datagrams
/// from queueing without bound.
pub const DATAGRAM_OVERHEAD: usize = 64;

/// One queued datagram: where it goes and where its bytes are in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub dst: Option<SocketAddr>,
    pub off: u32,
    pub len: u32,
    /// The kernel is to stamp the message carrying it (sampled tracing,
    /// see `OutMsg::stamp`).
    pub stamp: bool,
}

/// L1: datagrams queued in host memory, in FIFO order.
///
/// The engine takes the whole queue at once with [`std::mem::swap`] against
/// an empty arena it recycles, so a take is O(1) under the lock and needs no
/// allocation in steady state.
#[derive(Debug, Default)]
pub struct L1Queue {
    slots: Vec<Slot>,
    bytes: Vec<u8>,
    /// Bytes charged against the capacity.
    charged: usize,
}

impl L1Queue {
    /// Number of datagrams queued.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes charged (payload + per-datagram overhead).
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// Appends a datagram if it fits in `capacity` bytes. An empty queue
    /// always accepts one datagram, so a datagram larger than the capacity is
    /// still sendable (as the kernel does for a single oversized skb).
    pub fn push(&mut self, dst: Option<SocketAddr>, data: &[u8], capacity: usize) -> bool {
        let charge = data.len() + DATAGRAM_OVERHEAD;
        if !self.slots.is_empty() && self.charged + charge > capacity {
            return false;
        }
        let off = self.bytes.len() as u32;
        self.bytes.extend_from_slice(data);
        self.slots.push(Slot { dst, off, len: data.len() as u32, stamp: false });
        self.charged += charge;
        true
    }

    /// Marks the datagram pushed last as one whose message the kernel is
    /// to stamp.
    pub fn mark_last_stamped(&mut self) {
        if let Some(s) = self.slots.last_mut() {
            s.stamp = true;
        }
    }

    /// Payload bytes queued (without the per-datagram charge).
    pub fn payload_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Queued slots in order.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// The payload of a slot.
    pub fn payload(&self, s: &Slot) -> &[u8] {
        &self.bytes[s.off as usize..(s.off + s.len) as usize]
    }

    /// Moves the datagrams from index `at` on to the end of `to`, in order,
    /// with their charge: the part of a take that is not sent yet goes back.
    pub fn move_tail(&mut self, at: usize, to: &mut L1Queue) {
        let Some(first) = self.slots.get(at) else { return };
        let cut = first.off as usize;
        let base = to.bytes.len() as u32;
        to.bytes.extend_from_slice(&self.bytes[cut..]);
        for s in &self.slots[at..] {
            to.slots.push(Slot { dst: s.dst, off: s.off - cut as u32 + base, len: s.len, stamp: s.stamp });
            let charge = s.len as usize + DATAGRAM_OVERHEAD;
            to.charged += charge;
            self.charged -= charge;
        }
        self.slots.truncate(at);
        self.bytes.truncate(cut);
    }

    /// Bytes charged for the datagrams from index `at` on.
    pub fn charged_from(&self, at: usize) -> usize {
        self.slots.get(at..).map_or(0, |s| s.iter().map(|d| d.len as usize + DATAGRAM_OVERHEAD).sum())
    }

    /// Empties the queue, keeping its allocations for reuse.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.bytes.clear();
        self.charged = 0;
    }
}

/// What a caller's send should do, decided under the queue lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostDecision {
    /// Post on the caller's thread now (one L2 slot reserved).
    Direct,
    /// Queued in L1; the engine will send it.
    Queued,
    /// L1 is full: wait for room or return EAGAIN.
    Full,
    /// The endpoint is shutting down.
    Closed,
}

/// Shared transition log, present only when recording is enabled.
pub type Recorder = Arc<Mutex<Vec<(QueueEvent, QueueState)>>>;

/// The lock-protected state of one endpoint's send side.
#[derive(Debug)]
pub struct SendState {
    /// L1 in host memory.
    pub l1: L1Queue,
    /// Datagrams the engine took from L1 but has not yet handed to the
    /// backend. Logically still part of L1: a direct post must not overtake
    /// them.
    pub staged: u32,
    /// Descriptors in L2 (posted, not reaped).
    pub l2: u32,
    /// Of those, completed but not yet reaped by the engine.
    pub done_unreaped: u32,
    /// Of those, batches whose backend call has not returned. While one is
    /// in the backend no other call may start (see [`SendState::l2_has_room`]).
    pub batches: u32,
    /// L2 bound (descriptors).
    pub l2_depth: u32,
    /// L1 capacity in bytes (from SO_SNDBUF).
    pub capacity: usize,
    /// No new posts accepted; the engine flushes what is queued.
    pub shutdown: bool,
    /// The engine has this endpoint on its work list.
    pub scheduled: bool,
    /// ... on its coalescing list (serviced when the interval is up).
    pub coalescing: bool,
    /// When the oldest datagram now in `l1` was queued (set by the caller
    /// that queues into an empty L1): the coalescing interval runs from
    /// here, so a take by the caller's own thread restarts it.
    pub l1_since: Option<std::time::Instant>,
    /// Threads waiting in a flush for the queue to drain (they sleep on the
    /// endpoint's condition variable; a caller retiring the last slot wakes
    /// them).
    pub flushers: u32,
    /// The endpoint's receive-call count at the last direct completion: a
    /// change means the caller waited on its peer in between.
    pub rx_mark: u64,
    /// When a caller's thread last sent L1 itself (a stream is on), and the
    /// receive-call count then. Where the engine sends a stream's batches
    /// (`Config::tx_caller_drain` off), when the engine last took a whole
    /// batch.
    pub caller_flushed: Option<(std::time::Instant, u64)>,
    /// Datagrams at the front of `l1` that a caller's flush took and put
    /// back (a GSO run short of a batch): all of L1 after them was queued
    /// after that flush, which bounds when they were queued.
    pub l1_carried: usize,
    /// Bytes charged for the datagrams a full kernel send buffer refused,
    /// now waiting for room in the endpoint's staging. Still this socket's
    /// queue: they count against `capacity` with L1, so L1 and that rest
    /// together stay within a send buffer's worth however often the
    /// socket's room comes and goes.
    pub rest: usize,
    /// Post outcomes, counted under the lock the caller already holds so the
    /// hot path touches no shared counter cache line.
    pub counts: PostCounts,
    /// The thread that queued the newest datagram in `l1` (a
    /// [`thread_token`]): when that thread goes to sleep, what it left to
    /// be coalesced is sent at once (`EpInner::send_remainder_now`).
    pub queued_by: u64,
    recorder: Option<Recorder>,
}

/// A number naming the calling thread, unique in the process; 0 only for
/// a thread past its thread-locals' end (which then matches no queue).
pub fn thread_token() -> u64 {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local!(static TOKEN: Cell<u64> = const { Cell::new(0) });
    TOKEN
        .try_with(|t| {
            if t.get() == 0 {
                t.set(NEXT.fetch_add(1, Relaxed));
            }
            t.get()
        })
        .unwrap_or(0)
}

/// How callers' sends were decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PostCounts {
    pub direct: u64,
    pub queued: u64,
    pub full: u64,
}

impl SendState {
    /// A fresh send side with the given L2 bound and L1 capacity.
    pub fn new(l2_depth: u32, capacity: usize, recorder: Option<Recorder>) -> Self {
        SendState {
            l1: L1Queue::default(),
            staged: 0,
            l2: 0,
            done_unreaped: 0,
            batches: 0,
            l2_depth: l2_depth.max(1),
            capacity,
            shutdown: false,
            scheduled: false,
            coalescing: false,
            l1_since: None,
            flushers: 0,
            rx_mark: 0,
            caller_flushed: None,
            l1_carried: 0,
            rest: 0,
            counts: PostCounts::default(),
            queued_by: 0,
            recorder,
        }
    }

    /// The abstract state the model speaks of.
    pub fn abstract_state(&self) -> QueueState {
        QueueState {
            l1: self.l1.len() as u32 + self.staged,
            l2: self.l2,
            done_unreaped: self.done_unreaped,
            shutdown: self.shutdown,
        }
    }

    /// Applies one event's effect and records it. Effects are exactly those
    /// documented on [`QueueEvent`]; [`SendState::post`] and the engine call
    /// this only when the guard holds.
    fn apply(&mut self, ev: QueueEvent) {
        match ev {
            QueueEvent::DirectPost => self.l2 += 1,
            QueueEvent::Enqueue | QueueEvent::Refuse => {}
            QueueEvent::DirectDone => self.done_unreaped += 1,
            QueueEvent::Reap { n } => {
                self.l2 -= n;
                self.done_unreaped -= n;
            }
            QueueEvent::TakeBatch { datagrams } => {
                self.staged -= datagrams;
                self.l2 += 1;
                self.batches += 1;
            }
            QueueEvent::BatchDone => {
                self.l2 -= 1;
                self.batches -= 1;
            }
            QueueEvent::DirectRetire => self.l2 -= 1,
            QueueEvent::Shutdown => self.shutdown = true,
        }
        if let Some(r) = &self.recorder {
            let st = self.abstract_state();
            r.lock().unwrap_or_else(|e| e.into_inner()).push((ev, st));
        }
    }

    /// True when L1 (including staged datagrams) is empty.
    pub fn l1_empty(&self) -> bool {
        self.l1.is_empty() && self.staged == 0
    }

    /// True when L1 holds a remainder waiting out its coalescing interval
    /// that thread `token` queued last (any thread's for `u64::MAX`; none
    /// for 0, a thread past its thread-locals' end).
    pub fn coalescing_remainder_of(&self, token: u64) -> bool {
        !self.l1_empty()
            && self.scheduled
            && self.coalescing
            && token != 0
            && (token == u64::MAX || self.queued_by == token)
    }

    /// Decides a caller's send: direct when nothing is queued and L2 has
    /// room, else queue in L1 (copying `data`), else full.
    pub fn post(&mut self, dst: Option<SocketAddr>, data: &[u8]) -> PostDecision {
        self.post_with(dst, data, true)
    }

    /// As [`SendState::post`] for a streaming caller (it sent L1 itself a
    /// moment ago): never direct, so the datagram waits in L1 for the rest
    /// of the next batch rather than leaving alone, one extra syscall and
    /// receiver wake-up per batch.
    pub fn post_streaming(&mut self, dst: Option<SocketAddr>, data: &[u8]) -> PostDecision {
        self.post_with(dst, data, false)
    }

    /// Whether L1 takes a datagram of `len` bytes now (what
    /// [`SendState::post`] checks before it queues).
    pub fn fits(&self, len: usize) -> bool {
        let charge = len + DATAGRAM_OVERHEAD;
        if self.rest == 0 {
            self.l1.is_empty() || self.l1.charged() + charge <= self.capacity
        } else {
            self.l1.charged() + self.rest + charge <= self.capacity
        }
    }

    fn post_with(&mut self, dst: Option<SocketAddr>, data: &[u8], direct_ok: bool) -> PostDecision {
        if self.shutdown {
            self.apply(QueueEvent::Refuse);
            return PostDecision::Closed;
        }
        if direct_ok && self.l1_empty() && self.l2_has_room() {
            self.apply(QueueEvent::DirectPost);
            self.counts.direct += 1;
            return PostDecision::Direct;
        }
        // The refused rest takes its share of the capacity; L1's "an empty
        // queue takes one datagram" holds only without a rest.
        if self.fits(data.len()) && self.l1.push(dst, data, usize::MAX) {
            self.apply(QueueEvent::Enqueue);
            self.counts.queued += 1;
            self.queued_by = thread_token();
            PostDecision::Queued
        } else {
            self.apply(QueueEvent::Refuse);
            self.counts.full += 1;
            PostDecision::Full
        }
    }

    /// A direct post's backend call returned (successfully or not).
    ///
    /// Normally the slot stays taken until the engine reaps it, so a
    /// sender's next posts queue and leave in batches (returns false: the
    /// engine must run). A caller that is waiting on its peer between sends
    /// (`responsive`: it received since its previous direct post) gains
    /// nothing from batching; with L1 empty nobody waits for the slot and
    /// the caller frees it itself (returns true), so a request/response
    /// exchange never wakes the engine.
    pub fn direct_done(&mut self, responsive: bool) -> bool {
        if responsive && self.l1_empty() {
            self.apply(QueueEvent::DirectRetire);
            true
        } else {
            self.apply(QueueEvent::DirectDone);
            false
        }
    }

    /// The engine reaps all completed direct posts. Returns how many.
    pub fn reap(&mut self) -> u32 {
        let n = self.done_unreaped;
        if n > 0 {
            self.apply(QueueEvent::Reap { n });
        }
        n
    }

    /// The engine takes all of L1 into `into` (which must be empty) when L2
    /// has room and nothing is staged. Returns the datagram count taken.
    pub fn take_l1(&mut self, into: &mut L1Queue) -> usize {
        debug_assert!(into.is_empty());
        if self.staged != 0 || self.l1.is_empty() {
            return 0;
        }
        std::mem::swap(&mut self.l1, into);
        self.staged = into.len() as u32;
        self.l1_carried = 0;
        into.len()
    }

    /// As [`SendState::take_l1`], but only the first `n` datagrams (all when
    /// `n` is 0 or covers L1): the rest is copied back into L1, still ahead
    /// of anything queued later, and counted in `l1_carried`.
    pub fn take_l1_prefix(&mut self, into: &mut L1Queue, n: usize) -> usize {
        let took = self.take_l1(into);
        if n > 0 && n < took {
            debug_assert!(self.l1.is_empty());
            into.move_tail(n, &mut self.l1);
            self.staged = n as u32;
            self.l1_carried = took - n;
            return n;
        }
        took
    }

    /// True when another backend call may start: L2 has room and no batch
    /// is in the backend. With `EUDP_L2_DEPTH` above 1 a direct post or a
    /// caller's batch begun beside the engine's batch left in either order
    /// (499-2601 datagrams of a one-thread stream out of order per 2 s run
    /// at depth 4); one call at a time keeps each flow's order, while L2
    /// still holds completed posts until they are reaped.
    pub fn l2_has_room(&self) -> bool {
        self.l2 < self.l2_depth && self.batches == 0
    }

    /// The engine hands `datagrams` staged datagrams to the backend as one
    /// descriptor.
    pub fn begin_batch(&mut self, datagrams: u32) {
        debug_assert!(self.l2_has_room() && datagrams >= 1 && datagrams <= self.staged);
        self.apply(QueueEvent::TakeBatch { datagrams });
    }

    /// The engine's backend call returned.
    pub fn end_batch(&mut self) {
        self.apply(QueueEvent::BatchDone);
    }

    /// Marks the queue shut down (idempotent).
    pub fn begin_shutdown(&mut self) {
        if !self.shutdown {
            self.apply(QueueEvent::Shutdown);
        }
    }

    /// Room for more sends, judged as the kernel judges a socket writable:
    /// less than half of the capacity charged (L1 and the refused rest;
    /// datagrams the engine is handing to the kernel have left it).
    pub fn writable(&self) -> bool {
        !self.shutdown && (self.l1.charged() + self.rest) * 2 < self.capacity.max(1)
    }

    /// Everything sent and reaped: the flush after shutdown is complete.
    pub fn drained(&self) -> bool {
        self.l1_empty() && self.l2 == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn responsive_direct_post_is_retired_by_its_caller() {
        let mut s = SendState::new(1, 10_000, None);
        for _ in 0..3 {
            assert_eq!(s.post(None, b"a"), PostDecision::Direct);
            assert!(s.direct_done(true));
            assert_eq!(s.reap(), 0);
            assert!(s.drained());
        }
        // A streaming sender keeps the slot until the engine reaps it.
        assert_eq!(s.post(None, b"a"), PostDecision::Direct);
        assert!(!s.direct_done(false));
        assert_eq!(s.post(None, b"b"), PostDecision::Queued);
        assert_eq!(s.reap(), 1);
    }

    #[test]
    fn refused_rest_counts_against_the_capacity() {
        let charge = 100 + DATAGRAM_OVERHEAD;
        let mut s = SendState::new(1, 3 * charge, None);
        // Two datagrams a full kernel send buffer refused wait staged.
        s.staged = 2;
        s.rest = 2 * charge;
        assert!(!s.writable());
        assert_eq!(s.post(None, &[0; 100]), PostDecision::Queued);
        assert_eq!(s.post(None, &[0; 100]), PostDecision::Full);
        // Without a rest, an empty L1 takes even an oversized datagram; with
        // one, not (the rest is sent first).
        let mut t = SendState::new(1, 3 * charge, None);
        t.staged = 1;
        t.rest = charge;
        assert_eq!(t.post(None, &[0; 400]), PostDecision::Full);
        t.rest = 0;
        assert_eq!(t.post(None, &[0; 400]), PostDecision::Queued);
        assert!(!t.writable());
    }

    #[test]
    fn direct_when_idle_then_queue_until_reaped() {
        let mut s = SendState::new(1, 10_000, None);
        assert_eq!(s.post(None, b"a"), PostDecision::Direct);
        // "a" is in flight and holds the only L2 slot.
        assert_eq!(s.post(None, b"b"), PostDecision::Queued);
        // L1 is busy: the slot stays occupied until the engine reaps it.
        assert!(!s.direct_done(true));
        assert_eq!(s.post(None, b"c"), PostDecision::Queued);
        assert_eq!(s.reap(), 1);
        // L1 is not empty, so even with L2 room the next send queues (order).
        assert_eq!(s.post(None, b"d"), PostDecision::Queued);
        let mut taken = L1Queue::default();
        assert_eq!(s.take_l1(&mut taken), 3);
        // Staged datagrams still block direct posts.
        assert_eq!(s.post(None, b"e"), PostDecision::Queued);
        s.begin_batch(3);
        assert!(!s.l2_has_room());
        s.end_batch();
        assert_eq!(s.staged, 0);
        let payloads: Vec<&[u8]> = taken.slots().iter().map(|sl| taken.payload(sl)).collect();
        assert_eq!(payloads, vec![&b"b"[..], b"c", b"d"]);
    }

    #[test]
    fn a_prefix_take_puts_the_rest_back_in_order() {
        let mut s = SendState::new(1, 10_000, None);
        assert_eq!(s.post(None, b"a"), PostDecision::Direct);
        for d in [&b"b"[..], b"cc", b"ddd", b"e"] {
            assert_eq!(s.post(None, d), PostDecision::Queued);
        }
        let charged = s.l1.charged();
        let mut taken = L1Queue::default();
        assert_eq!(s.take_l1_prefix(&mut taken, 2), 2);
        assert_eq!((s.staged, s.l1_carried, s.abstract_state().l1), (2, 2, 4));
        assert_eq!(taken.charged() + s.l1.charged(), charged);
        assert_eq!(s.post(None, b"f"), PostDecision::Queued);
        let rest: Vec<&[u8]> = s.l1.slots().iter().map(|sl| s.l1.payload(sl)).collect();
        assert_eq!(rest, vec![&b"ddd"[..], b"e", b"f"]);
        let head: Vec<&[u8]> = taken.slots().iter().map(|sl| taken.payload(sl)).collect();
        assert_eq!(head, vec![&b"b"[..], b"cc"]);
        // All (n = 0 or n >= len) is a plain take.
        let mut s2 = SendState::new(1, 10_000, None);
        s2.post(None, b"x");
        s2.post(None, b"y");
        let mut t2 = L1Queue::default();
        assert_eq!(s2.take_l1_prefix(&mut t2, 5), 1);
        assert_eq!(s2.l1_carried, 0);
    }

    #[test]
    fn capacity_is_charged_per_datagram() {
        let cap = 3 * (100 + DATAGRAM_OVERHEAD);
        let mut s = SendState::new(1, cap, None);
        assert_eq!(s.post(None, &[0; 100]), PostDecision::Direct);
        for _ in 0..3 {
            assert_eq!(s.post(None, &[0; 100]), PostDecision::Queued);
        }
        assert_eq!(s.post(None, &[0; 100]), PostDecision::Full);
        assert_eq!(s.l1.charged(), cap);
    }

    #[test]
    fn oversized_datagram_accepted_into_empty_l1() {
        let mut s = SendState::new(1, 100, None);
        assert_eq!(s.post(None, b"x"), PostDecision::Direct);
        assert_eq!(s.post(None, &[1; 1000]), PostDecision::Queued);
        assert_eq!(s.post(None, b"y"), PostDecision::Full);
    }

    #[test]
    fn shutdown_refuses_and_drains() {
        let mut s = SendState::new(2, 10_000, None);
        assert_eq!(s.post(None, b"a"), PostDecision::Direct);
        s.begin_shutdown();
        assert_eq!(s.post(None, b"b"), PostDecision::Closed);
        assert!(!s.drained());
        assert!(!s.direct_done(false));
        s.reap();
        assert!(s.drained());
    }
}
