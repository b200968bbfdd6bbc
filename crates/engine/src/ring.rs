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
    /// Emptied buffers kept for the next receive (bounded).
    spare: Vec<Vec<u8>>,
}

impl RecvRing {
    /// A ring that holds up to `capacity` charged bytes.
    pub fn new(capacity: usize) -> Self {
        RecvRing { entries: VecDeque::new(), charged: 0, capacity, datagrams: 0, spare: Vec::new() }
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
                let e = self.entries.pop_front().expect("front exists");
                self.charged -= e.end + ENTRY_OVERHEAD;
                self.recycle(e.buf);
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

    /// Returns a full-size buffer to the spare list (at most a few are kept).
    pub fn recycle(&mut self, buf: Vec<u8>) {
        if self.spare.len() < 4 && buf.len() >= 1 << 16 {
            self.spare.push(buf);
        }
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
}
