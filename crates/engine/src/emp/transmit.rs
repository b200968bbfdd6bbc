//! The transmit batch: frames written into fixed-size slots of one buffer,
//! sent with one `sendmmsg` per batch, and consecutive full frames to one
//! peer coalesced into a GSO super-packet where the socket allows it. A
//! batch of one frame (a ping-pong's request, reply or acknowledgment)
//! goes out with one `sendto`, without the batch's header arrays.

use crate::backend::kernel::{gso_segment_cap, OutMsg, UdpSocket};
use crate::emp::peer::PeerId;
use eudp_wire::limits::{GSO_MAX_BYTES_V4, GSO_MAX_SEGMENTS};
use std::io::{self, IoSlice};
use std::net::SocketAddr;

/// One frame in the batch.
#[derive(Clone, Copy, Debug)]
struct Slot {
    dst: SocketAddr,
    len: usize,
    /// The data frame's flow and sequence number, to rewind on a full
    /// socket; `None` for an acknowledgment (lost then, as on the wire).
    data: Option<(PeerId, u32)>,
}

/// What a flush did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// The socket's buffer is full: wait until it is writable.
    pub blocked: bool,
    /// The kernel refused a GSO message: send plain datagrams from now on.
    pub gso_refused: bool,
}

/// Frames waiting to be sent, in slots of `stride` bytes.
#[derive(Debug)]
pub struct TxBatch {
    stride: usize,
    buf: Vec<u8>,
    slots: Vec<Slot>,
    cap: usize,
}

impl TxBatch {
    /// A batch of `cap` slots of `stride` bytes (the largest frame).
    pub fn new(stride: usize, cap: usize) -> Self {
        TxBatch { stride, buf: vec![0; stride * cap], slots: Vec::with_capacity(cap), cap }
    }

    pub fn is_full(&self) -> bool {
        self.slots.len() == self.cap
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The free slot to write the next frame into.
    pub fn slot(&mut self) -> &mut [u8] {
        let at = self.slots.len() * self.stride;
        &mut self.buf[at..at + self.stride]
    }

    /// The frame written into the free slot is `len` bytes for `dst`.
    pub fn commit(&mut self, dst: SocketAddr, len: usize, data: Option<(PeerId, u32)>) {
        debug_assert!(len <= self.stride && !self.is_full());
        self.slots.push(Slot { dst, len, data });
    }

    /// Sends every frame; those the kernel did not take are rewound into
    /// `unsent` (data frames) or dropped (acknowledgments). Returns what
    /// happened, and the number of datagrams handed to the kernel.
    pub fn flush(&mut self, sock: &UdpSocket, gso: bool, unsent: &mut Vec<(PeerId, u32)>) -> (Flushed, usize) {
        let mut out = Flushed::default();
        if self.slots.is_empty() {
            return (out, 0);
        }
        if let [one] = self.slots[..] {
            return self.flush_one(sock, one, unsent);
        }
        // Runs of slots: [start, end) per message.
        let max_segs = if gso { GSO_MAX_SEGMENTS.min(gso_segment_cap()) } else { 1 };
        let mut runs: Vec<(usize, usize)> = Vec::new();
        let mut i = 0;
        while i < self.slots.len() {
            let mut j = i + 1;
            let mut bytes = self.slots[i].len;
            while j < self.slots.len()
                && j - i < max_segs
                && self.slots[j - 1].len == self.stride
                && self.slots[j].dst == self.slots[i].dst
                && bytes + self.slots[j].len <= GSO_MAX_BYTES_V4
            {
                bytes += self.slots[j].len;
                j += 1;
            }
            runs.push((i, j));
            i = j;
        }
        let iovs: Vec<IoSlice<'_>> = runs
            .iter()
            .map(|&(a, b)| {
                let end = (b - 1) * self.stride + self.slots[b - 1].len;
                IoSlice::new(&self.buf[a * self.stride..end])
            })
            .collect();
        let msgs: Vec<OutMsg<'_>> = runs
            .iter()
            .zip(&iovs)
            .map(|(&(a, b), iov)| OutMsg {
                dst: Some(self.slots[a].dst),
                iov: std::slice::from_ref(iov),
                segment: (b - a > 1).then_some(self.stride as u16),
                stamp: false,
            })
            .collect();
        let mut done = 0;
        while done < msgs.len() {
            match sock.send_batch_nowait(&msgs[done..]) {
                Ok(n) => done += n.max(1),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    out.blocked = true;
                    break;
                }
                Err(e)
                    if msgs[done].segment.is_some() && matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EIO)) =>
                {
                    out.gso_refused = true;
                    break;
                }
                // Another refusal (no route, no buffer) loses this message
                // as the network would; retransmission recovers it.
                Err(_) => done += 1,
            }
        }
        let sent_slots = runs.get(done).map_or(self.slots.len(), |r| r.0);
        for s in &self.slots[sent_slots..] {
            if let Some(d) = s.data {
                unsent.push(d);
            }
        }
        self.slots.clear();
        (out, sent_slots)
    }

    /// [`TxBatch::flush`] of the one frame `s`, the batch's only slot.
    fn flush_one(&mut self, sock: &UdpSocket, s: Slot, unsent: &mut Vec<(PeerId, u32)>) -> (Flushed, usize) {
        let mut out = Flushed::default();
        let sent = loop {
            match sock.send_to(&self.buf[..s.len], Some(&s.dst)) {
                Ok(_) => break 1,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    out.blocked = true;
                    break 0;
                }
                // Lost as the network would lose it, as in a batch.
                Err(_) => break 1,
            }
        };
        if sent == 0 {
            unsent.extend(s.data);
        }
        self.slots.clear();
        (out, sent)
    }
}
