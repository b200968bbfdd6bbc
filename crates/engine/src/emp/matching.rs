//! Receive matching: posted receives (source or any, tag, ignore mask)
//! matched in posting order, and the opt-in bounded queue of unexpected
//! messages that a later posted receive matches first.

use crate::emp::peer::PeerId;
use crate::emp::recv_buffer::RecvBuffer;
use std::collections::VecDeque;

/// A pre-posted receive.
#[derive(Debug)]
pub struct PostedRecv {
    /// Only messages from this peer, or from any.
    pub source: Option<PeerId>,
    pub tag: u64,
    /// Tag bits that do not take part in matching.
    pub ignore: u64,
    pub context: u64,
    /// Where the message lands; a message longer than its capacity is
    /// truncated.
    pub buffer: RecvBuffer,
}

impl PostedRecv {
    /// The receive takes a message from `src` with `tag`.
    pub fn matches(&self, src: PeerId, tag: u64) -> bool {
        self.source.is_none_or(|s| s == src) && (self.tag ^ tag) & !self.ignore == 0
    }
}

/// A whole message that arrived before any receive matched it.
#[derive(Debug, PartialEq, Eq)]
pub struct Unexpected {
    pub src: PeerId,
    pub tag: u64,
    pub data: Vec<u8>,
}

/// The posted receives and the unexpected-message queue of an endpoint.
#[derive(Debug)]
pub struct Matcher {
    posted: VecDeque<PostedRecv>,
    unexpected: VecDeque<Unexpected>,
    max_messages: usize,
    max_bytes: usize,
    /// Messages and bytes held or reserved (arriving) in the queue.
    held: (usize, usize),
}

impl Matcher {
    /// A matcher whose unexpected queue holds up to `max_messages`
    /// messages and `max_bytes` bytes (0 messages: off).
    pub fn new(max_messages: usize, max_bytes: usize) -> Self {
        Matcher { posted: VecDeque::new(), unexpected: VecDeque::new(), max_messages, max_bytes, held: (0, 0) }
    }

    /// Posts a receive. When a queued unexpected message matches it, the
    /// first such is returned and the receive is not kept.
    pub fn post(&mut self, r: PostedRecv) -> Option<(PostedRecv, Unexpected)> {
        if let Some(i) = self.unexpected.iter().position(|u| r.matches(u.src, u.tag)) {
            let u = self.unexpected.remove(i).expect("index in range");
            self.unreserve(u.data.len());
            return Some((r, u));
        }
        self.posted.push_back(r);
        None
    }

    /// Posts a receive ahead of every other (one given back after its
    /// message was abandoned), or completes it from the unexpected queue.
    pub fn post_front(&mut self, r: PostedRecv) -> Option<(PostedRecv, Unexpected)> {
        let got = self.post(r);
        if got.is_none() {
            let back = self.posted.pop_back().expect("just posted");
            self.posted.push_front(back);
        }
        got
    }

    /// Takes the first posted receive, in posting order, that matches.
    pub fn take_match(&mut self, src: PeerId, tag: u64) -> Option<PostedRecv> {
        let i = self.posted.iter().position(|r| r.matches(src, tag))?;
        self.posted.remove(i)
    }

    /// Removes the posted receive with `context`, if still posted.
    pub fn cancel(&mut self, context: u64) -> Option<PostedRecv> {
        let i = self.posted.iter().position(|r| r.context == context)?;
        self.posted.remove(i)
    }

    /// Reserves room for an arriving unexpected message of `len` bytes;
    /// false when the queue is off or full.
    pub fn reserve(&mut self, len: usize) -> bool {
        if self.held.0 >= self.max_messages || self.held.1 + len > self.max_bytes {
            return false;
        }
        self.held = (self.held.0 + 1, self.held.1 + len);
        true
    }

    /// Gives back a reservation whose message will not arrive.
    pub fn unreserve(&mut self, len: usize) {
        self.held = (self.held.0.saturating_sub(1), self.held.1.saturating_sub(len));
    }

    /// A reserved message arrived whole: a receive posted since takes it,
    /// else it waits in the queue.
    pub fn arrived(&mut self, u: Unexpected) -> Option<(PostedRecv, Unexpected)> {
        match self.take_match(u.src, u.tag) {
            Some(r) => {
                self.unreserve(u.data.len());
                Some((r, u))
            }
            None => {
                self.unexpected.push_back(u);
                None
            }
        }
    }

    /// Drops the queued messages of `src` (a peer removed).
    pub fn forget(&mut self, src: PeerId) {
        let (keep, gone): (VecDeque<_>, VecDeque<_>) = self.unexpected.drain(..).partition(|u| u.src != src);
        self.unexpected = keep;
        for u in gone {
            self.unreserve(u.data.len());
        }
    }

    /// Every posted receive, removed (shutdown).
    pub fn drain_posted(&mut self) -> Vec<PostedRecv> {
        self.posted.drain(..).collect()
    }

    /// Unexpected messages queued.
    pub fn unexpected_len(&self) -> usize {
        self.unexpected.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recv(source: Option<u32>, tag: u64, ignore: u64, context: u64) -> PostedRecv {
        PostedRecv { source: source.map(PeerId), tag, ignore, context, buffer: RecvBuffer::alloc(100) }
    }

    #[test]
    fn posting_order_source_and_mask() {
        let mut m = Matcher::new(0, 0);
        assert!(m.post(recv(Some(2), 0x10, 0, 1)).is_none());
        assert!(m.post(recv(None, 0x10, 0x0f, 2)).is_none());
        assert!(m.post(recv(None, 0x10, 0x0f, 3)).is_none());
        assert_eq!(m.take_match(PeerId(1), 0x13).map(|r| r.context), Some(2));
        assert_eq!(m.take_match(PeerId(2), 0x10).map(|r| r.context), Some(1));
        assert!(m.take_match(PeerId(2), 0x20).is_none());
        assert_eq!(m.cancel(3).map(|r| r.context), Some(3));
        assert!(m.cancel(3).is_none());
    }

    #[test]
    fn unexpected_queue_is_bounded_and_matched_first() {
        let mut off = Matcher::new(0, 0);
        assert!(!off.reserve(0));
        let mut m = Matcher::new(2, 100);
        assert!(m.reserve(60) && !m.reserve(50) && m.reserve(40) && !m.reserve(0));
        assert!(m.arrived(Unexpected { src: PeerId(1), tag: 5, data: vec![1; 60] }).is_none());
        assert!(m.arrived(Unexpected { src: PeerId(1), tag: 6, data: vec![2; 40] }).is_none());
        let (r, u) = m.post(recv(None, 6, 0, 9)).expect("queued message matches");
        assert_eq!((r.context, u.tag), (9, 6));
        assert!(m.reserve(40));
    }
}
