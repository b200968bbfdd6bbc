//! The per-endpoint receive ring the engine delivers into.
//!
//! Each entry is one received message — a single datagram or a GRO
//! super-packet — kept whole; datagrams are cut from it at the segment size
//! as the caller consumes them, so a super-packet is split without copying.
//! The ring is bounded in bytes like a kernel receive buffer (`SO_RCVBUF`):
//! a message that does not fit is dropped and counted, never silently.

use crate::backend::PktInfo;
use std::collections::VecDeque;
use std::net::SocketAddr;

/// Bytes charged per ring entry on top of its payload.
pub const ENTRY_OVERHEAD: usize = 256;

/// Small (single-datagram) buffers kept for reuse: as many as one batched
/// read of the throughput profile brings (`EUDP_MAX_MSGS=64`), so a stream
/// of datagrams that GRO did not coalesce reuses its buffers instead of
/// allocating each on the engine thread and freeing it on the program's
/// (glibc's cross-thread free was the largest item of a receive from the
/// ring). Each is under [`SMALL_MAX`] bytes, so at most 512 KiB.
pub const SMALL_SPARES: usize = 64;

/// The largest buffer kept as a small spare.
pub const SMALL_MAX: usize = 8 << 10;

/// One received message.
#[derive(Debug)]
struct Entry {
    /// Storage; only `buf[..end]` holds the message (buffers are reused at
    /// full length so recycling never re-zeroes 64 KiB).
    buf: Vec<u8>,
    end: usize,
    src: Option<SocketAddr>,
    pktinfo: Option<PktInfo>,
    /// Segment size (the whole message when not coalesced).
    segment: usize,
    /// Offset of the next undelivered datagram.
    pos: usize,
}

/// A datagram handed to the caller.
#[derive(Debug, PartialEq, Eq)]
pub struct Delivered {
    /// Bytes copied into the caller's buffer.
    pub copied: usize,
    /// The datagram's full length (larger than `copied` when truncated).
    pub len: usize,
    pub src: Option<SocketAddr>,
}

/// Bounded FIFO of received messages.
#[derive(Debug)]
pub struct RecvRing {
    entries: VecDeque<Entry>,
    charged: usize,
    capacity: usize,
    datagrams: usize,
    /// Emptied 64 KiB buffers kept for the next receive (bounded).
    spare: Vec<Vec<u8>>,
    /// Emptied small buffers kept for the next small message (at most
    /// [`SMALL_SPARES`]); taken and returned under the ring's lock, which
    /// both sides hold anyway.
    small: Vec<Vec<u8>>,
}

impl RecvRing {
    /// A ring that holds up to `capacity` charged bytes.
    pub fn new(capacity: usize) -> Self {
        RecvRing { entries: VecDeque::new(), charged: 0, capacity, datagrams: 0, spare: Vec::new(), small: Vec::new() }
    }

    /// Changes the byte bound (SO_RCVBUF changed); what is queued stays.
    pub fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity;
    }

    /// Datagrams waiting.
    pub fn datagrams(&self) -> usize {
        self.datagrams
    }

    /// True when no datagram is waiting.
    pub fn is_empty(&self) -> bool {
        self.datagrams == 0
    }

    /// Size of the next datagram, if any (for FIONREAD-like queries).
    pub fn peek_len(&self) -> Option<usize> {
        self.entries.front().map(|e| e.segment.min(e.end - e.pos))
    }

    /// Bytes charged against the capacity.
    pub fn charged(&self) -> usize {
        self.charged
    }

    /// How many messages of up to `msg_len` bytes a read may bring without
    /// one of them being dropped for want of room: the free bytes over
    /// each message's charge, and one into an empty ring (which takes any
    /// message).
    pub fn room_for(&self, msg_len: usize) -> usize {
        let fit = self.capacity.saturating_sub(self.charged) / (msg_len + ENTRY_OVERHEAD).max(1);
        if self.entries.is_empty() {
            fit.max(1)
        } else {
            fit
        }
    }

    /// Adds a message of `buf.len()` bytes cut at `segment`. Returns the
    /// number of datagrams it carries, or `Err(n)` with that number when the
    /// ring is full and the message was dropped (its buffer is kept as spare).
    pub fn push(&mut self, buf: Vec<u8>, segment: Option<usize>, src: Option<SocketAddr>) -> Result<usize, usize> {
        let len = buf.len();
        self.push_prefix(buf, len, segment, src)
    }

    /// As [`RecvRing::push`] for a message held in `buf[..len]`.
    pub fn push_prefix(
        &mut self,
        buf: Vec<u8>,
        len: usize,
        segment: Option<usize>,
        src: Option<SocketAddr>,
    ) -> Result<usize, usize> {
        self.push_message(buf, len, segment, src, None)
    }

    /// As [`RecvRing::push_prefix`], keeping the message's destination
    /// information for every datagram cut from it.
    pub fn push_message(
        &mut self,
        buf: Vec<u8>,
        len: usize,
        segment: Option<usize>,
        src: Option<SocketAddr>,
        pktinfo: Option<PktInfo>,
    ) -> Result<usize, usize> {
        debug_assert!(len <= buf.len());
        let segment = match segment {
            Some(s) if s > 0 && s < len => s,
            _ => len.max(1),
        };
        let n = if len == 0 { 1 } else { len.div_ceil(segment) };
        let charge = len + ENTRY_OVERHEAD;
        if self.charged + charge > self.capacity && !self.entries.is_empty() {
            self.recycle(buf);
            return Err(n);
        }
        self.charged += charge;
        self.datagrams += n;
        self.entries.push_back(Entry { buf, end: len, src, pktinfo, segment, pos: 0 });
        Ok(n)
    }

    /// Copies the next datagram into `out` and consumes it (unless `peek`);
    /// its destination information goes to `info` only when asked for, so
    /// the common receive does not carry it (copying the larger record
    /// through the receive's layers cost ~10 ns per datagram).
    #[inline]
    pub fn pop_into(&mut self, out: &mut [u8], peek: bool, info: Option<&mut Option<PktInfo>>) -> Option<Delivered> {
        let e = self.entries.front_mut()?;
        let end = (e.pos + e.segment).min(e.end);
        let dgram = &e.buf[e.pos..end];
        let copied = dgram.len().min(out.len());
        out[..copied].copy_from_slice(&dgram[..copied]);
        let d = Delivered { copied, len: dgram.len(), src: e.src };
        if let Some(i) = info {
            *i = e.pktinfo;
        }
        if !peek {
            e.pos = end;
            self.datagrams -= 1;
            if e.pos >= e.end {
                // Only the buffer is taken out: moving the whole entry out
                // of the deque copied its addresses too.
                let buf = std::mem::take(&mut e.buf);
                self.charged -= e.end + ENTRY_OVERHEAD;
                self.entries.pop_front();
                self.recycle(buf);
            }
        }
        Some(d)
    }

    /// A buffer of `size` bytes for the next receive, reusing spares.
    pub fn take_buffer(&mut self, size: usize) -> Vec<u8> {
        match self.spare.pop() {
            Some(b) if b.len() == size => b,
            _ => vec![0u8; size],
        }
    }

    /// A copy of `data` (under [`SMALL_MAX`] bytes) in a small spare
    /// buffer when the last one returned is big enough, else in a new one
    /// sized to the next power of two, so datagrams of a stream whose sizes
    /// vary a little fit the buffers of the ones before.
    pub fn copy_small(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = match self.small.pop() {
            Some(b) if b.capacity() >= data.len() => b,
            _ => Vec::with_capacity(data.len().next_power_of_two().clamp(64, SMALL_MAX)),
        };
        b.clear();
        b.extend_from_slice(data);
        b
    }

    /// Returns an emptied buffer: a full-size one to the spare list (at
    /// most a few are kept), a small one to the small spares.
    #[inline]
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if buf.len() >= 1 << 16 {
            if self.spare.len() < 4 {
                self.spare.push(buf);
            }
        } else if buf.capacity() <= SMALL_MAX && self.small.len() < SMALL_SPARES {
            self.small.push(buf);
        }
    }

    /// Small spare buffers held (for tests and bounds checks).
    pub fn small_spares(&self) -> usize {
        self.small.len()
    }

    /// Drops everything queued (used on close).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.charged = 0;
        self.datagrams = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn room_counts_whole_messages_and_an_empty_ring_takes_one() {
        let mut r = RecvRing::new(3 * (1000 + ENTRY_OVERHEAD));
        assert_eq!(r.room_for(1000), 3);
        assert_eq!(r.room_for(1 << 20), 1, "an empty ring takes any one message");
        r.push(vec![0; 1000], None, None).unwrap();
        assert_eq!(r.room_for(1000), 2);
        r.push(vec![0; 1000], None, None).unwrap();
        r.push(vec![0; 1000], None, None).unwrap();
        assert_eq!(r.room_for(1000), 0);
        assert_eq!(r.room_for(1), 0);
    }

    #[test]
    fn gro_split_with_short_tail() {
        let mut r = RecvRing::new(1 << 20);
        let buf: Vec<u8> = (0..2500u32).map(|i| i as u8).collect();
        assert_eq!(r.push(buf.clone(), Some(1000), None), Ok(3));
        let mut out = vec![0u8; 2000];
        let lens: Vec<usize> = (0..3).map(|_| r.pop_into(&mut out, false, None).unwrap().len).collect();
        assert_eq!(lens, vec![1000, 1000, 500]);
        assert!(r.pop_into(&mut out, false, None).is_none());
        assert_eq!(r.charged(), 0);
    }

    #[test]
    fn odd_segment_sizes_byte_exact() {
        for seg in [1usize, 7, 333, 1471] {
            let mut r = RecvRing::new(1 << 20);
            let buf: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
            r.push(buf.clone(), Some(seg), None).unwrap();
            let mut got = Vec::new();
            let mut out = vec![0u8; seg];
            while let Some(d) = r.pop_into(&mut out, false, None) {
                assert!(d.len <= seg);
                got.extend_from_slice(&out[..d.copied]);
            }
            assert_eq!(got, buf);
        }
    }

    #[test]
    fn peek_and_truncate() {
        let mut r = RecvRing::new(1 << 20);
        r.push(b"hello".to_vec(), None, None).unwrap();
        let mut out = [0u8; 3];
        let d = r.pop_into(&mut out, true, None).unwrap();
        assert_eq!((d.copied, d.len), (3, 5));
        assert_eq!(r.datagrams(), 1);
        let d = r.pop_into(&mut out, false, None).unwrap();
        assert_eq!((d.copied, d.len, &out), (3, 5, b"hel"));
        assert!(r.is_empty());
    }

    #[test]
    fn full_ring_drops_and_counts() {
        let mut r = RecvRing::new(2 * (100 + ENTRY_OVERHEAD));
        assert!(r.push(vec![0; 100], None, None).is_ok());
        assert!(r.push(vec![0; 100], None, None).is_ok());
        assert_eq!(r.push(vec![0; 300], Some(100), None), Err(3));
        assert_eq!(r.datagrams(), 2);
    }

    #[test]
    fn empty_datagram_is_one_datagram() {
        let mut r = RecvRing::new(1 << 20);
        assert_eq!(r.push(Vec::new(), None, None), Ok(1));
        let d = r.pop_into(&mut [0u8; 4], false, None).unwrap();
        assert_eq!(d.len, 0);
        assert!(r.is_empty());
    }

    #[test]
    fn small_buffers_come_back_for_the_next_message() {
        let mut r = RecvRing::new(1 << 20);
        let b = r.copy_small(&[1u8; 1472]);
        let first = b.as_ptr();
        r.push(b, None, None).unwrap();
        let mut out = [0u8; 2048];
        assert_eq!(r.pop_into(&mut out, false, None).unwrap().len, 1472);
        assert_eq!(r.small_spares(), 1, "the emptied buffer is kept");
        let b = r.copy_small(&[2u8; 1400]);
        assert_eq!(b.as_ptr(), first, "the next message reuses it");
        assert_eq!((b.len(), b[0]), (1400, 2));
        assert_eq!(r.small_spares(), 0);
        // A message the full ring drops gives its buffer back as well.
        let mut r = RecvRing::new(2 * (100 + ENTRY_OVERHEAD));
        for _ in 0..3 {
            let b = r.copy_small(&[0u8; 100]);
            let _ = r.push(b, None, None);
        }
        assert_eq!((r.datagrams(), r.small_spares()), (2, 1));
    }

    #[test]
    fn big_buffers_are_not_small_spares() {
        let mut r = RecvRing::new(1 << 20);
        r.push(vec![0u8; SMALL_MAX * 2], None, None).unwrap();
        r.pop_into(&mut [0u8; 64], false, None).unwrap();
        assert_eq!(r.small_spares(), 0, "a buffer over SMALL_MAX is freed, not kept");
    }

    /// One step of the model test: a message of `len` bytes cut at
    /// `segment`, a pop, or a peek.
    #[derive(Debug, Clone)]
    enum Op {
        Push { len: usize, segment: Option<usize> },
        Pop,
        Peek,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            (0usize..3000, proptest::option::of(1usize..1500)).prop_map(|(len, segment)| Op::Push { len, segment }),
            Just(Op::Pop),
            Just(Op::Peek),
        ]
    }

    proptest::proptest! {
        /// Reused small buffers never mix datagrams up: every datagram
        /// comes out whole and in order, what the ring drops is counted,
        /// the spares stay within their bound, and a drained ring is
        /// charged nothing.
        #[test]
        fn reused_buffers_keep_every_datagram_in_order(ops in proptest::collection::vec(op(), 1..400)) {
            let mut r = RecvRing::new(16 * (1500 + ENTRY_OVERHEAD));
            let mut model: VecDeque<Vec<u8>> = VecDeque::new();
            let mut stamp = 0u8;
            let mut out = vec![0u8; 4096];
            for op in ops {
                match op {
                    Op::Push { len, segment } => {
                        stamp = stamp.wrapping_add(1);
                        let data: Vec<u8> = (0..len).map(|i| stamp ^ (i as u8)).collect();
                        let buf = r.copy_small(&data);
                        let before = r.datagrams();
                        match r.push(buf, segment, None) {
                            Ok(n) => {
                                let seg = match segment { Some(s) if s < len => s, _ => len.max(1) };
                                let cut: Vec<Vec<u8>> =
                                    if len == 0 { vec![Vec::new()] } else { data.chunks(seg).map(<[u8]>::to_vec).collect() };
                                proptest::prop_assert_eq!(n, cut.len());
                                model.extend(cut);
                            }
                            Err(_) => proptest::prop_assert_eq!(r.datagrams(), before),
                        }
                    }
                    Op::Pop | Op::Peek => {
                        let peek = matches!(op, Op::Peek);
                        match r.pop_into(&mut out, peek, None) {
                            Some(d) => {
                                let want = if peek { model.front().cloned() } else { model.pop_front() };
                                let want = want.expect("the model holds it too");
                                proptest::prop_assert_eq!(&out[..d.copied], &want[..]);
                            }
                            None => proptest::prop_assert!(model.is_empty()),
                        }
                    }
                }
                proptest::prop_assert_eq!(r.datagrams(), model.len());
                proptest::prop_assert!(r.small_spares() <= SMALL_SPARES);
            }
            while r.pop_into(&mut out, false, None).is_some() {}
            proptest::prop_assert_eq!(r.charged(), 0);
        }
    }
}
