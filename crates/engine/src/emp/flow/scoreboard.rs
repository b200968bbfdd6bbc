//! The sender's view of each frame in flight, for selective repeat: which
//! ones the receiver reports held (the selective part of its
//! acknowledgments), which ones were repaired since the last timeout, and
//! the queue of repairs due. A frame below the highest held one is taken
//! as lost once [`DUP_THRESH`] frames above it are held: fewer may just be
//! reordering.

use super::seq::{before, distance};
use std::collections::VecDeque;

/// Held frames above a missing one that make it lost.
pub const DUP_THRESH: u32 = 3;

const HELD: u8 = 1;
/// Repaired since the last timeout: a report does not repair it again.
const REPAIRED: u8 = 2;
/// Its latest transmission was a repair (rewound to the repair queue when
/// the socket does not take it).
const VIA_REPAIR: u8 = 4;

/// Frames `[base, base + flags.len())`: the flow's unacknowledged ones.
#[derive(Debug, Default)]
pub struct Scoreboard {
    base: u32,
    flags: VecDeque<u8>,
    repairs: VecDeque<u32>,
}

impl Scoreboard {
    /// An empty board whose next frame is `base`.
    pub fn reset(&mut self, base: u32) {
        self.base = base;
        self.flags.clear();
        self.repairs.clear();
    }

    fn slot(&self, seq: u32) -> Option<usize> {
        let i = distance(self.base, seq) as usize;
        (i < self.flags.len()).then_some(i)
    }

    fn has(&self, seq: u32, f: u8) -> bool {
        self.slot(seq).is_some_and(|i| self.flags[i] & f != 0)
    }

    fn set(&mut self, seq: u32, f: u8, on: bool) {
        if let Some(i) = self.slot(seq) {
            if on {
                self.flags[i] |= f;
            } else {
                self.flags[i] &= !f;
            }
        }
    }

    /// Frame `seq`, the next new one, went out.
    pub fn sent_new(&mut self, seq: u32) {
        debug_assert_eq!(distance(self.base, seq) as usize, self.flags.len());
        self.flags.push_back(0);
    }

    /// Frame `seq` went out again; `repair` when as a repair.
    pub fn sent_again(&mut self, seq: u32, repair: bool) {
        self.set(seq, VIA_REPAIR, repair);
    }

    /// True when the latest transmission of `seq` was a repair.
    pub fn via_repair(&self, seq: u32) -> bool {
        self.has(seq, VIA_REPAIR)
    }

    /// Frames below `next` are acknowledged.
    pub fn release(&mut self, next: u32) {
        let n = (distance(self.base, next) as usize).min(self.flags.len());
        self.flags.drain(..n);
        self.base = next;
        self.prune();
    }

    /// Drops repairs no longer due (acknowledged, or held by the receiver).
    fn prune(&mut self) {
        let mut r = std::mem::take(&mut self.repairs);
        r.retain(|&s| self.slot(s).is_some() && !self.has(s, HELD));
        self.repairs = r;
    }

    /// Takes an acknowledgment's selective part (bit `k`: frame `next + 1 +
    /// k` held) and queues the repair of each frame below `sent` it shows
    /// lost.
    pub fn on_sack(&mut self, next: u32, sack: u64, sent: u32) {
        // The report is the receiver's word for the frames it covers: one
        // held before may have been dropped since (a held first frame that
        // finds no posted receive), and `next` itself is never held.
        let start = distance(self.base, next) as usize;
        if start <= self.flags.len() {
            // Only frames on the board: none after a full acknowledgment.
            let end = self.flags.len().min(start + 65);
            for (k, f) in self.flags.range_mut(start..end).enumerate() {
                let held = k > 0 && sack & (1 << (k - 1)) != 0;
                *f = if held { *f | HELD } else { *f & !HELD };
            }
        } else {
            self.set(next, HELD, false);
            for k in 0..64 {
                self.set(next.wrapping_add(1 + k), HELD, sack & (1 << k) != 0);
            }
        }
        if sack == 0 {
            return;
        }
        let top = next.wrapping_add(65 - sack.leading_zeros());
        let mut above = 0;
        let mut lost = Vec::new();
        let mut seq = top;
        while seq != self.base {
            seq = seq.wrapping_sub(1);
            if self.has(seq, HELD) {
                above += 1;
            } else if above >= DUP_THRESH && before(seq, sent) && self.slot(seq).is_some() && !self.has(seq, REPAIRED) {
                lost.push(seq);
            }
        }
        for &s in lost.iter().rev() {
            self.set(s, REPAIRED, true);
            self.repairs.push_back(s);
        }
        self.prune();
    }

    /// Frame `seq` is reported missing (a NAK names it, a timeout or a
    /// partial acknowledgment after one finds it oldest): repaired next,
    /// once until the next timeout.
    pub fn missing(&mut self, seq: u32) {
        if self.slot(seq).is_some() && !self.has(seq, HELD | REPAIRED) {
            self.set(seq, REPAIRED, true);
            self.repairs.push_front(seq);
        }
    }

    /// A timeout: every frame may be repaired again on the next report.
    pub fn forget_repairs(&mut self) {
        for f in self.flags.iter_mut() {
            *f &= !REPAIRED;
        }
        self.repairs.clear();
    }

    /// A repair the socket did not take: due again first.
    pub fn requeue(&mut self, seq: u32) {
        if self.slot(seq).is_some() && !self.repairs.contains(&seq) {
            self.repairs.push_front(seq);
        }
    }

    /// True when a repair below `sent` is due.
    pub fn has_repair(&self, sent: u32) -> bool {
        self.repairs.iter().any(|&s| before(s, sent))
    }

    /// The next repair due below `sent` (frames from `sent` on go out in
    /// order anyway).
    pub fn next_repair(&mut self, sent: u32) -> Option<u32> {
        while let Some(s) = self.repairs.pop_front() {
            if before(s, sent) && self.slot(s).is_some() && !self.has(s, HELD) {
                return Some(s);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board(n: u32) -> Scoreboard {
        let mut b = Scoreboard::default();
        b.reset(10);
        for s in 10..10 + n {
            b.sent_new(s);
        }
        b
    }

    /// The held flags after `on_sack` match a frame-by-frame update over
    /// every sequence number the report names, for boards shorter and
    /// longer than the report and reports above the board's base.
    #[test]
    fn the_selective_update_matches_a_frame_by_frame_one() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2_000 {
            let n = (rand() % 100) as u32;
            let mut fast = board(n);
            for s in 10..10 + n {
                fast.set(s, HELD, rand() % 2 == 0);
            }
            let mut slow = Scoreboard { base: fast.base, flags: fast.flags.clone(), repairs: VecDeque::new() };
            let next = 10 + (rand() % (u64::from(n) + 3)) as u32;
            let sack = rand() & rand();
            fast.on_sack(next, sack, 10 + n);
            slow.set(next, HELD, false);
            for k in 0..64 {
                slow.set(next.wrapping_add(1 + k), HELD, sack & (1 << k) != 0);
            }
            let held = |b: &Scoreboard| (10..10 + n).map(|s| b.has(s, HELD)).collect::<Vec<_>>();
            assert_eq!(held(&fast), held(&slow), "n {n} next {next} sack {sack:#x}");
        }
    }

    #[test]
    fn a_hole_below_three_held_frames_is_repaired_once() {
        let mut b = board(8);
        // next = 10; frames 12, 13 held: 10 and 11 not yet lost.
        b.on_sack(10, 0b110, 18);
        assert_eq!(b.next_repair(18), None);
        // 14 held as well: 10 and 11 have three held above them.
        b.on_sack(10, 0b1110, 18);
        assert_eq!((b.next_repair(18), b.next_repair(18), b.next_repair(18)), (Some(10), Some(11), None));
        b.on_sack(10, 0b11110, 18);
        assert_eq!(b.next_repair(18), None, "repaired once until a timeout");
        b.forget_repairs();
        b.missing(10);
        assert_eq!(b.next_repair(18), Some(10));
    }

    #[test]
    fn released_and_held_frames_are_not_repaired() {
        let mut b = board(6);
        b.missing(11);
        b.missing(12);
        b.release(12);
        assert_eq!(b.next_repair(16), Some(12));
        b.missing(13);
        b.on_sack(12, 0b1, 16);
        assert_eq!(b.next_repair(16), None, "13 is held");
        assert!(!b.has_repair(16));
    }

    #[test]
    fn wraps_around_the_sequence_space() {
        let mut b = Scoreboard::default();
        b.reset(u32::MAX - 1);
        for k in 0..6u32 {
            b.sent_new((u32::MAX - 1).wrapping_add(k));
        }
        b.on_sack(u32::MAX - 1, 0b1110, 4);
        assert_eq!(b.next_repair(4), Some(u32::MAX - 1));
        assert_eq!(b.next_repair(4), Some(u32::MAX));
    }
}
