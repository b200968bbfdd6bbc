//! Discrete-event core: a binary-heap event queue with a stable tie-break.
//!
//! Times are integer picoseconds so that runs are bit-for-bit reproducible;
//! events at the same time fire in the order they were scheduled.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Picoseconds per nanosecond.
pub const PS_PER_NS: f64 = 1000.0;

/// Converts ns (float) to the queue's integer time.
pub fn ps(ns: f64) -> u64 {
    if ns <= 0.0 {
        0
    } else {
        (ns * PS_PER_NS).round() as u64
    }
}

/// Converts queue time back to ns.
pub fn ns(ps: u64) -> f64 {
    ps as f64 / PS_PER_NS
}

/// An event queue holding payloads of type `E`.
pub struct Queue<E> {
    heap: BinaryHeap<Reverse<(u64, u64, usize)>>,
    slab: Vec<Option<E>>,
    free: Vec<usize>,
    seq: u64,
    now: u64,
    fired: u64,
}

impl<E> Default for Queue<E> {
    fn default() -> Self {
        Self::new()
    }
}

impl<E> Queue<E> {
    /// An empty queue at time 0.
    pub fn new() -> Self {
        Queue { heap: BinaryHeap::new(), slab: Vec::new(), free: Vec::new(), seq: 0, now: 0, fired: 0 }
    }

    /// Current simulated time (ps).
    pub fn now(&self) -> u64 {
        self.now
    }

    /// Number of events delivered so far.
    pub fn fired(&self) -> u64 {
        self.fired
    }

    /// Number of pending events.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// True when nothing is pending.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Schedules `e` at absolute time `at` (never before now).
    pub fn at(&mut self, at: u64, e: E) {
        let at = at.max(self.now);
        let slot = match self.free.pop() {
            Some(i) => {
                self.slab[i] = Some(e);
                i
            }
            None => {
                self.slab.push(Some(e));
                self.slab.len() - 1
            }
        };
        self.heap.push(Reverse((at, self.seq, slot)));
        self.seq += 1;
    }

    /// Schedules `e` after `delay` ps.
    pub fn after(&mut self, delay: u64, e: E) {
        self.at(self.now.saturating_add(delay), e);
    }

    /// Removes the earliest event, advancing the clock.
    pub fn pop(&mut self) -> Option<(u64, E)> {
        let Reverse((t, _, slot)) = self.heap.pop()?;
        self.now = t;
        self.fired += 1;
        let e = self.slab[slot].take().expect("event slot filled");
        self.free.push(slot);
        Some((t, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordered_and_stable() {
        let mut q = Queue::new();
        q.at(5, 'b');
        q.at(1, 'a');
        q.at(5, 'c');
        let got: Vec<_> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(got, vec![(1, 'a'), (5, 'b'), (5, 'c')]);
        assert_eq!(q.fired(), 3);
    }

    #[test]
    fn never_schedules_in_the_past() {
        let mut q = Queue::new();
        q.at(10, 1);
        q.pop();
        q.at(3, 2);
        assert_eq!(q.pop(), Some((10, 2)));
    }
}
