//! Received datagrams as readers hand them to endpoints ([`RxItem`]), and
//! the buffers a reader reuses for them ([`Pools`]). No locks of its own: a
//! `Pools` lives under `Mgr::pool` (the manager thread's) or under a queue's
//! `RxQueue::rd` (its readers').

use std::net::SocketAddr;

/// Accounting overhead per queued received datagram (like skb truesize).
pub(in crate::backend::tcp) const RX_OVERHEAD: usize = 64;

/// Buffers kept for reuse per receive queue (the manager's pool keeps
/// twice as many).
pub(in crate::backend::tcp) const FREE_MAX: usize = 4096;
/// Larger buffers are not kept for reuse (bounded memory).
pub(in crate::backend::tcp) const FREE_MAX_CAP: usize = 16 << 10;
/// Size of a packed block: the engine's receive buffer size, so its ring
/// keeps the block for reuse.
pub(in crate::backend::tcp) const BIG_BUF: usize = 1 << 16;
/// Blocks kept for reuse per receive queue (the manager keeps twice as many).
pub(in crate::backend::tcp) const BIG_FREE_MAX: usize = 64;

/// them. A `big` item is a [`BIG_BUF`] block, handed to the engine whole
/// (the buffers are swapped, nothing is copied); others are exact-size
/// buffers that are copied. The engine's ring cuts a run at `seg`.
#[derive(Debug)]
pub(in crate::backend::tcp) struct RxItem {
    pub(in crate::backend::tcp) buf: Vec<u8>,
    pub(in crate::backend::tcp) len: usize,
    pub(in crate::backend::tcp) seg: usize,
    pub(in crate::backend::tcp) n: usize,
    pub(in crate::backend::tcp) src: SocketAddr,
    pub(in crate::backend::tcp) big: bool,
}

impl RxItem {
    /// Charged against the queue bound: payload plus per-datagram overhead,
    /// and at least the block's memory (like skb truesize).
    pub(in crate::backend::tcp) fn cost(&self) -> usize {
        let c = self.len + self.n * RX_OVERHEAD;
        if self.big {
            c.max(self.buf.len())
        } else {
            c
        }
    }

    /// Whether a `len`-byte datagram from `src` continues this block.
    fn extends(&self, src: SocketAddr, len: usize) -> bool {
        self.big
            && self.src == src
            && len > 0
            && len <= self.seg
            && self.len == self.n * self.seg
            && self.len + len <= self.buf.len()
    }
}

/// Smaller datagrams are not packed into blocks (a block charges its memory).
pub(super) const PACK_MIN: usize = 1024;

/// The manager thread's buffers for received payloads.
#[derive(Debug, Default)]
pub(super) struct Pools {
    pub(super) small: Vec<Vec<u8>>,
    pub(super) big: Vec<Vec<u8>>,
}

impl Pools {
    pub(super) fn give(&mut self, buf: Vec<u8>, big: bool) {
        if big {
            self.big.push(buf);
        } else {
            self.small.push(buf);
        }
    }

    pub(super) fn small_copy(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = self.small.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(data);
        b
    }

    pub(super) fn block(&mut self) -> Vec<u8> {
        match self.big.pop() {
            Some(b) if b.len() == BIG_BUF => b,
            _ => vec![0u8; BIG_BUF],
        }
    }

    /// Appends a datagram to `batch`, continuing the last block if it can.
    pub(super) fn add(&mut self, batch: &mut Vec<RxItem>, pack: bool, src: SocketAddr, payload: &[u8]) {
        let len = payload.len();
        if let Some(last) = batch.last_mut().filter(|l| l.extends(src, len)) {
            last.buf[last.len..last.len + len].copy_from_slice(payload);
            last.len += len;
            last.n += 1;
            return;
        }
        if pack && len >= PACK_MIN {
            let mut buf = self.block();
            buf[..len].copy_from_slice(payload);
            batch.push(RxItem { buf, len, seg: len, n: 1, src, big: true });
        } else {
            batch.push(RxItem { buf: self.small_copy(payload), len, seg: len, n: 1, src, big: false });
        }
    }

    pub(super) fn trim(&mut self) {
        self.small.retain(|b| b.capacity() <= FREE_MAX_CAP);
        self.small.truncate(2 * FREE_MAX);
        self.big.truncate(2 * BIG_FREE_MAX);
    }
}
