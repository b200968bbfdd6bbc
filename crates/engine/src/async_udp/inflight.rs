//! The sends the kernel still holds, keyed by zero-copy notification id.
//!
//! Every successful zero-copy `sendmsg` of a socket takes the next id, so
//! the held sends form a window of consecutive ids: slot `i` of the window
//! is id `base + i` (wrapping). A notification empties the slots of its
//! range, in any order; emptied slots at the front leave the window.

use std::collections::VecDeque;

/// The datagrams of one send (one, or a GSO run), as `(token, buffer, length)`.
pub(crate) type Held<B> = Vec<(u64, B, usize)>;

pub(crate) struct InFlight<B> {
    base: u32,
    slots: VecDeque<Option<Held<B>>>,
    datagrams: usize,
}

impl<B> InFlight<B> {
    pub(crate) fn new() -> Self {
        InFlight { base: 0, slots: VecDeque::new(), datagrams: 0 }
    }

    /// Datagrams whose buffers the kernel may still read.
    pub(crate) fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// Records the send that just took the next id.
    pub(crate) fn push(&mut self, held: Held<B>) {
        self.datagrams += held.len();
        self.slots.push_back(Some(held));
    }

    /// Takes the sends of ids `lo..=hi` (wrapping), passing each to `done`.
    /// Ids outside the window (never sent, or already done) are skipped.
    pub(crate) fn complete(&mut self, lo: u32, hi: u32, mut done: impl FnMut(Held<B>)) {
        let span = hi.wrapping_sub(lo) as usize;
        let window = self.slots.len();
        for k in 0..=span {
            let off = lo.wrapping_add(k as u32).wrapping_sub(self.base) as usize;
            if off >= window {
                continue;
            }
            if let Some(held) = self.slots[off].take() {
                self.datagrams -= held.len();
                done(held);
            }
        }
        while matches!(self.slots.front(), Some(None)) {
            self.slots.pop_front();
            self.base = self.base.wrapping_add(1);
        }
    }

    /// Empties the window without completing anything; the kernel may still
    /// read these buffers, so the caller must never free them.
    pub(crate) fn abandon(&mut self) -> Vec<Held<B>> {
        self.datagrams = 0;
        self.slots.drain(..).flatten().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one(t: u64) -> Held<()> {
        vec![(t, (), 1)]
    }

    fn tokens(f: &mut InFlight<()>, lo: u32, hi: u32) -> Vec<u64> {
        let mut v = Vec::new();
        f.complete(lo, hi, |h| v.extend(h.iter().map(|d| d.0)));
        v
    }

    #[test]
    fn ranges_complete_in_any_order() {
        let mut f = InFlight::new();
        for t in 0..5 {
            f.push(one(t));
        }
        f.push(vec![(5, (), 1), (6, (), 1)]);
        assert_eq!(f.datagrams(), 7);
        assert_eq!(tokens(&mut f, 2, 3), vec![2, 3]);
        assert_eq!(tokens(&mut f, 0, 0), vec![0]);
        assert_eq!(tokens(&mut f, 0, 3), vec![1], "done ids are not completed twice");
        assert_eq!(tokens(&mut f, 4, 5), vec![4, 5, 6]);
        assert_eq!(f.datagrams(), 0);
        f.push(one(9));
        assert_eq!(tokens(&mut f, 6, 6), vec![9], "ids continue after the window empties");
    }

    #[test]
    fn ids_wrap() {
        let mut f: InFlight<()> = InFlight { base: u32::MAX - 1, slots: VecDeque::new(), datagrams: 0 };
        for t in 0..4 {
            f.push(one(t));
        }
        assert_eq!(tokens(&mut f, u32::MAX - 1, 1), vec![0, 1, 2, 3]);
        assert_eq!(tokens(&mut f, 7, 9), Vec::<u64>::new());
    }
}
