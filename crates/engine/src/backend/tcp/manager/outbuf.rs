//! A lane's send queue as the bytes that go on the wire ([`OutBuf`]), with
//! the enqueue time of every frame for the deadlines. No locks of its own:
//! it lives under `Lane::st`.

use crate::backend::tcp::frame::{self, HEADER_LEN};
use std::collections::VecDeque;
use std::io::IoSlice;
use std::time::Instant;

/// Datagrams queued for one lane, as the bytes that go on the wire, with
/// the enqueue time of every frame (for the deadlines).
#[derive(Debug, Default)]
pub(super) struct OutBuf {
    pub(super) buf: Vec<u8>,
    pub(super) head: usize,
    /// Stream position of `buf[head]`.
    pub(super) pos: u64,
    /// (start, end, enqueued, datagrams, source port) of every frame not
    /// completely written; the rest of a run counts its unwritten datagrams.
    pub(super) frames: VecDeque<(u64, u64, Instant, u32, u16)>,
}

impl OutBuf {
    pub(super) fn queued(&self) -> usize {
        self.buf.len() - self.head
    }

    pub(super) fn push(&mut self, src: u16, dst: u16, parts: &[IoSlice<'_>], len: usize, now: Instant) {
        let start = self.pos + self.queued() as u64;
        self.buf.extend_from_slice(&frame::header(src, dst, len));
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.frames.push_back((start, start + (HEADER_LEN + len) as u64, now, 1, src));
    }

    /// `n` bytes went to the socket without passing through the (empty)
    /// queue: the stream position moves on.
    pub(super) fn wrote_direct(&mut self, n: usize) {
        debug_assert_eq!(self.queued(), 0);
        self.pos += n as u64;
    }

    /// Queues the rest of a frame or run (`pieces`, `datagrams` of them
    /// not completely written) whose first `written` bytes went to the
    /// socket directly (just before, with the queue empty); `src` is the
    /// source port of its datagrams.
    pub(super) fn push_rest<'a>(
        &mut self,
        pieces: impl Iterator<Item = &'a [u8]>,
        written: usize,
        datagrams: u32,
        src: u16,
        now: Instant,
    ) {
        debug_assert_eq!(self.queued(), 0);
        let start = self.pos - written as u64;
        let mut skip = written;
        for piece in pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            self.buf.extend_from_slice(&piece[skip..]);
            skip = 0;
        }
        self.frames.push_back((start, self.pos + self.queued() as u64, now, datagrams, src));
    }

    pub(super) fn unwritten(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// `n` bytes were written; returns frames completed.
    pub(super) fn advance(&mut self, n: usize) -> u64 {
        self.skip(n);
        let mut done = 0;
        while self.frames.front().is_some_and(|f| f.1 <= self.pos) {
            done += self.frames.pop_front().map_or(0, |f| f.3 as u64);
        }
        done
    }

    pub(super) fn skip(&mut self, n: usize) {
        self.head += n;
        self.pos += n as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if self.head >= (1 << 20) && self.head * 2 >= self.buf.len() {
            self.buf.drain(..self.head);
            self.head = 0;
        }
    }

    /// The connection died mid-frame: the rest of that frame (or run) is
    /// useless; returns its datagrams and their source port.
    pub(super) fn discard_partial(&mut self) -> (u64, u16) {
        match self.frames.front().copied() {
            Some((s, e, _, n, src)) if s < self.pos => {
                self.skip((e - self.pos) as usize);
                self.frames.pop_front();
                (n as u64, src)
            }
            _ => (0, 0),
        }
    }

    /// Drops whole, unwritten frames at the head enqueued before `cutoff`;
    /// `lost` is told the datagrams of each, by source port.
    pub(super) fn drop_older(&mut self, cutoff: Instant, lost: &mut dyn FnMut(u16, u64)) -> u64 {
        let mut n = 0;
        while let Some(&(s, e, t, k, src)) = self.frames.front() {
            if s != self.pos || t >= cutoff {
                break;
            }
            self.skip((e - s) as usize);
            self.frames.pop_front();
            n += k as u64;
            lost(src, k as u64);
        }
        n
    }

    /// Drops everything queued; `lost` is told the datagrams of each
    /// frame, by source port.
    pub(super) fn clear(&mut self, lost: &mut dyn FnMut(u16, u64)) -> u64 {
        let mut n = 0;
        for f in &self.frames {
            n += f.3 as u64;
            lost(f.4, f.3 as u64);
        }
        let q = self.queued();
        self.skip(q);
        self.frames.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tcp::frame::RUN_HEADER_LEN;
    use std::time::Duration;

    #[test]
    fn outbuf_partial_frames_and_deadlines() {
        let t0 = Instant::now();
        let mut o = OutBuf::default();
        let a = [1u8; 10];
        let b = [2u8; 20];
        // A frame half written directly, then one queued whole.
        o.wrote_direct(7);
        o.push_rest([&frame::header(1, 2, 10)[..], &a[..]].into_iter(), 7, 1, 1, t0);
        assert_eq!(o.queued(), HEADER_LEN + 10 - 7);
        o.push(1, 2, &[IoSlice::new(&b)], 20, t0 + Duration::from_millis(5));
        // The half-written frame is never dropped by a deadline...
        assert_eq!(o.drop_older(t0 + Duration::from_secs(1), &mut |_, _| {}), 0);
        // ...but cut when its connection dies; the next one is intact.
        assert_eq!(o.discard_partial(), (1, 1));
        assert_eq!(o.unwritten(), &[&frame::header(1, 2, 20)[..], &b[..]].concat()[..]);
        assert_eq!(o.drop_older(t0 + Duration::from_millis(1), &mut |_, _| {}), 0);
        assert_eq!(o.drop_older(t0 + Duration::from_millis(6), &mut |_, _| {}), 1);
        assert_eq!(o.queued(), 0);
        // Writes complete frames as they pass their end.
        o.push(1, 2, &[IoSlice::new(&a)], 10, t0);
        o.push(1, 2, &[IoSlice::new(&b)], 20, t0);
        assert_eq!(o.advance(HEADER_LEN + 10 + 3), 1);
        assert_eq!(o.discard_partial(), (1, 1));
        assert_eq!((o.queued(), o.clear(&mut |_, _| {})), (0, 0));
        // The rest of a run of 3 cut in its second datagram: 2 datagrams.
        let run = frame::run_header(1, 2, 3, 10);
        o.wrote_direct(RUN_HEADER_LEN + 15);
        o.push_rest([&run[..], &a[..], &a[..], &a[..]].into_iter(), RUN_HEADER_LEN + 15, 2, 1, t0);
        assert_eq!(o.queued(), 15);
        assert_eq!(o.drop_older(t0 + Duration::from_secs(1), &mut |_, _| {}), 0);
        assert_eq!(o.advance(15), 2);
        o.wrote_direct(RUN_HEADER_LEN + 5);
        o.push_rest([&run[..], &a[..], &a[..], &a[..]].into_iter(), RUN_HEADER_LEN + 5, 3, 1, t0);
        assert_eq!((o.discard_partial(), o.queued()), ((3, 1), 0));
    }
}
