//! In-place reads: the datagrams of a bulk flow read straight into receive
//! blocks, by a guess at the frames that follow ([`Plan`]); the headers go
//! to a side array, and what a header the guess missed shifted is moved
//! into its slot ([`Scattered`]). Runs under `Conn::rx`, like every read.

use super::counters::Counters;
use super::demux::Deliver;
use super::pools::{RxItem, BIG_BUF, PACK_MIN, RX_OVERHEAD};
use super::state::{lock, Conn, Mgr};
use crate::backend::tcp::frame::{self, Decoder, FrameError, HEADER_LEN, RUN_HEADER_LEN};
use std::cell::Cell;
use std::io::{self, IoSliceMut, Read};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;

/// Why a read ended the connection's turn.
pub(super) enum ReadErr {
    Frame(FrameError),
    Io(io::Error),
}

/// A guess at the frames that follow (see [`Mgr::scatter_plan`]).
pub(super) struct Plan {
    pub(super) src: u16,
    pub(super) dst: u16,
    pub(super) len: usize,
    /// Datagrams of the current run that follow the cut unit (known).
    pub(super) left: usize,
    /// Count of the runs guessed to follow (None: single frames).
    pub(super) runs: Option<u16>,
    /// Bytes that complete the frame cut by the previous read.
    pub(super) need: usize,
    /// Room left in the receive queue of the guessed endpoint (bytes).
    pub(super) room: usize,
}

/// Receive blocks an in-place read of `len`-byte frames fills: at most
/// `blocks`, and no more than `room` bytes of the endpoint's queue hold
/// (each block charged as [`RxItem::cost`] charges it), but at least one,
/// so a full queue still drains the connection and drops, as UDP would.
/// A read larger than the queue holds would drop its excess at once even
/// while the endpoint's reader keeps up (a default-size receive buffer
/// holds fewer than four blocks of full-size datagrams).
fn blocks_for(len: usize, blocks: usize, room: usize) -> usize {
    let per_block = (BIG_BUF / len.max(1)).max(1);
    let cost = (per_block * (len + RX_OVERHEAD)).max(BIG_BUF);
    blocks.min(1000 / (2 * per_block)).min(room / cost).max(1)
}

/// Blocks one in-place read fills at most.
pub(super) const SCATTER_BLOCKS: usize = 8;
/// Bound on a frame's charge ([`RxItem::cost`]) over its wire bytes: an
/// empty datagram costs [`RX_OVERHEAD`] for a 6-byte header.
pub(super) const RX_MAX_RATIO: usize = RX_OVERHEAD.div_ceil(HEADER_LEN);

/// Where bytes of an in-place read went: a header array, or a receive block.
#[derive(Clone, Copy, Debug)]
pub(super) enum At {
    Arr(usize),
    Blk(usize),
}

/// The rest of an in-place read after the first miss, as one stream over
/// its pieces in stream order: (where, byte offset there, bytes). Block
/// bytes are addressed linearly (block `b`'s slot area starts at
/// `b * per_block * len`), which is also where slot `s` starts (`s * len`).
struct Scattered<'a> {
    pub(super) segs: &'a [(At, usize, usize)],
    pub(super) starts: Vec<usize>,
    /// The piece the last lookup found: lookups go a datagram at a time,
    /// so the next one is found a step or two away instead of by a search
    /// per lookup.
    pub(super) hint: Cell<usize>,
}

impl<'a> Scattered<'a> {
    pub(super) fn new(segs: &'a [(At, usize, usize)]) -> Self {
        let mut at = 0;
        let starts = segs
            .iter()
            .map(|s| {
                let a = at;
                at += s.2;
                a
            })
            .collect();
        Scattered { segs, starts, hint: Cell::new(0) }
    }

    /// The piece that holds stream byte `p` (the last one when `p` is past
    /// the end; 0 when there are none).
    fn seg_at(&self, p: usize) -> usize {
        let st = &self.starts;
        let mut i = self.hint.get().min(st.len().saturating_sub(1));
        for _ in 0..8 {
            if i > 0 && st[i] > p {
                i -= 1;
            } else if i + 1 < st.len() && st[i + 1] <= p {
                i += 1;
            } else {
                self.hint.set(i);
                return i;
            }
        }
        i = st.partition_point(|&s| s <= p).saturating_sub(1);
        self.hint.set(i);
        i
    }

    /// Calls `f` with each piece of stream bytes `[p, p + n)`, in stream order.
    fn each_piece(&self, p: usize, mut n: usize, mut f: impl FnMut(At, usize, usize)) {
        let mut i = self.seg_at(p);
        let mut off = p - self.starts.get(i).copied().unwrap_or(0);
        while n > 0 && i < self.segs.len() {
            let (w, o, l) = self.segs[i];
            let k = (l - off).min(n);
            if k > 0 {
                f(w, o + off, k);
            }
            n -= k;
            off = 0;
            i += 1;
        }
    }

    /// The pieces of stream bytes `[p, p + n)`, in stream order.
    pub(super) fn pieces(&self, p: usize, n: usize, out: &mut Vec<(At, usize, usize)>) {
        out.clear();
        self.each_piece(p, n, |w, o, k| out.push((w, o, k)));
    }

    fn copy_to(&self, hdrs: &[[u8; RUN_HEADER_LEN]], blocks: &[Vec<u8>], p: usize, dst: &mut [u8]) {
        let mut at = 0;
        self.each_piece(p, dst.len(), |w, o, k| {
            let src = match w {
                At::Arr(i) => &hdrs[i][o..o + k],
                At::Blk(b) => &blocks[b][o..o + k],
            };
            dst[at..at + k].copy_from_slice(src);
            at += k;
        });
    }

    /// How the datagram at stream offset `p` can be moved to `slot` in
    /// place, given that the datagrams before it are moved first:
    /// `Some(false)` when its slot ends before its bytes do (it moves
    /// back, and the moves of such a sequence go in stream order),
    /// `Some(true)` when its slot starts at or after its first block byte
    /// (it moves forward, such a sequence in reverse order), None when
    /// neither (its slot would cover bytes of a neighbour still to move).
    fn direction(&self, p: usize, len: usize, slot: usize, per_block: usize) -> Option<bool> {
        let lin = |b: usize, o: usize| b * per_block * len + o;
        // Linear block space: where its first block byte is, and where its
        // last one ends.
        let mut span: Option<(usize, usize)> = None;
        self.each_piece(p, len, |w, o, k| {
            if let At::Blk(b) = w {
                let a = lin(b, o);
                span = Some((span.map_or(a, |s| s.0), a + k));
            }
        });
        let (first, end) = span?;
        let d = slot * len;
        if d + len <= end {
            Some(false)
        } else if d >= first {
            Some(true)
        } else {
            None
        }
    }

    /// Moves each datagram (stream offset, slot, forward) to its slot. The
    /// sources of a datagram lie in linear block space between the end of
    /// the previous one's and the start of the next one's, so a backward
    /// move never covers bytes still to move after it, and a forward one
    /// never those before it: backward runs go in stream order, forward
    /// runs in reverse (the pieces of one datagram likewise).
    fn move_all(
        &self,
        hdrs: &[[u8; RUN_HEADER_LEN]],
        blocks: &mut [Vec<u8>],
        moves: &[(usize, usize, bool)],
        len: usize,
        per_block: usize,
    ) {
        let mut ps = Vec::new();
        let mut exec = |m: &(usize, usize, bool), blocks: &mut [Vec<u8>]| {
            let (p, slot, fwd) = *m;
            self.pieces(p, len, &mut ps);
            let (db, base) = (slot / per_block, slot % per_block * len);
            let mut one = |&(w, o, k): &(At, usize, usize), off: usize| {
                let d = base + off;
                match w {
                    At::Arr(i) => blocks[db][d..d + k].copy_from_slice(&hdrs[i][o..o + k]),
                    At::Blk(b) if b == db => {
                        if o != d {
                            blocks[db].copy_within(o..o + k, d);
                        }
                    }
                    At::Blk(b) if b < db => {
                        let (x, y) = blocks.split_at_mut(db);
                        y[0][d..d + k].copy_from_slice(&x[b][o..o + k]);
                    }
                    At::Blk(b) => {
                        let (x, y) = blocks.split_at_mut(b);
                        x[db][d..d + k].copy_from_slice(&y[0][o..o + k]);
                    }
                }
            };
            // Each piece goes to its offset within the datagram.
            if fwd {
                let mut off: usize = ps.iter().map(|pc| pc.2).sum();
                for pc in ps.iter().rev() {
                    off -= pc.2;
                    one(pc, off);
                }
            } else {
                let mut off = 0;
                for pc in ps.iter() {
                    one(pc, off);
                    off += pc.2;
                }
            }
        };
        let mut i = 0;
        while i < moves.len() {
            let fwd = moves[i].2;
            let j = moves[i..].iter().position(|m| m.2 != fwd).map_or(moves.len(), |k| i + k);
            if fwd {
                moves[i..j].iter().rev().for_each(|m| exec(m, blocks));
            } else {
                moves[i..j].iter().for_each(|m| exec(m, blocks));
            }
            i = j;
        }
    }
}

impl Mgr {
    /// The frames that follow are guessed to repeat the last ones (a bulk
    /// flow: the rest of the current run, then runs like the last one, or
    /// frames like the last one): when those are large enough to be
    /// packed for an endpoint that packs, they may be read straight into
    /// blocks.
    pub(super) fn scatter_plan(&self, dec: &Decoder, conn: &Conn) -> Option<Plan> {
        let need = dec.need()?;
        let ((src, dst, len), left) = match dec.in_run() {
            // The cut unit (if any) is one of the run's datagrams.
            Some((s, d, seg, l)) => ((s, d, seg), l as usize - usize::from(need > 0)),
            None => (dec.last_frame()?, 0),
        };
        if !(PACK_MIN..=BIG_BUF).contains(&len) {
            return None;
        }
        let q = Self::lookup(&lock(&self.ports), dst, conn.local_ip, SocketAddr::new(conn.peer.ip(), src)).0?;
        if !q.gro.load(Relaxed) {
            return None;
        }
        let room = q.room();
        Some(Plan { src, dst, len, left, runs: dec.last_run(), need, room })
    }

    /// One `readv` laid out for the guessed stream: the rest of a cut unit
    /// into `rbuf`, then each header into a small array and the payloads
    /// into their places in blocks (a run's payloads contiguously, one
    /// iovec per block). Payloads that arrive where the guess put them are
    /// handed over in their blocks without a copy; anything else (the first
    /// unexpected header on, a datagram cut by the end of the read) goes
    /// through the decoder as usual. Returns (bytes read, bytes the read
    /// could take).
    pub(super) fn read_in_place(
        &self,
        conn: &Conn,
        dec: &mut Decoder,
        rbuf: &mut [u8],
        plan: Plan,
        out: &mut Deliver<'_>,
        blocks: usize,
    ) -> Result<(usize, usize), ReadErr> {
        let len = plan.len;
        let per_block = BIG_BUF / len;
        let nblocks = blocks_for(len, blocks, plan.room);
        let slots = nblocks * per_block;
        let mut blocks: Vec<Vec<u8>> = (0..nblocks).map(|_| out.pools.block()).collect();
        // The layout: a header (its bytes) or `k` payload slots from slot `s`,
        // never across a block's end.
        enum Ent {
            Hdr([u8; RUN_HEADER_LEN], usize),
            Pay(usize, usize),
        }
        let mut ents: Vec<Ent> = Vec::new();
        let mut s = 0;
        let pays = |ents: &mut Vec<Ent>, s: &mut usize, mut k: usize| {
            while k > 0 && *s < slots {
                let n = k.min(per_block - *s % per_block);
                ents.push(Ent::Pay(*s, n));
                *s += n;
                k -= n;
            }
        };
        pays(&mut ents, &mut s, plan.left);
        while s < slots {
            match plan.runs {
                Some(c) => {
                    ents.push(Ent::Hdr(frame::run_header(plan.src, plan.dst, c, len), RUN_HEADER_LEN));
                    pays(&mut ents, &mut s, c as usize);
                }
                None => {
                    let mut h = [0u8; RUN_HEADER_LEN];
                    h[..HEADER_LEN].copy_from_slice(&frame::header(plan.src, plan.dst, len));
                    ents.push(Ent::Hdr(h, HEADER_LEN));
                    pays(&mut ents, &mut s, 1);
                }
            }
        }
        let mut hdrs: Vec<[u8; RUN_HEADER_LEN]> =
            vec![[0u8; RUN_HEADER_LEN]; ents.iter().filter(|e| matches!(e, Ent::Hdr(..))).count()];
        // No spare room after the slots: a fuller socket is read again in
        // place rather than into `rbuf` (which would cost a copy).
        let head = &mut rbuf[..plan.need];
        let room =
            plan.need + slots * len + ents.iter().map(|e| if let Ent::Hdr(_, l) = e { *l } else { 0 }).sum::<usize>();
        let n = {
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(1 + ents.len());
            iov.push(IoSliceMut::new(head));
            let mut hs = hdrs.iter_mut();
            let mut bs = blocks.iter_mut();
            let mut cur: &mut [u8] = &mut [];
            for e in &ents {
                match *e {
                    Ent::Hdr(_, l) => iov.push(IoSliceMut::new(&mut hs.next().expect("one array per header")[..l])),
                    Ent::Pay(at, k) => {
                        if at % per_block == 0 {
                            cur = &mut bs.next().expect("one block per per_block slots")[..per_block * len];
                        }
                        let (a, rest) = std::mem::take(&mut cur).split_at_mut(k * len);
                        cur = rest;
                        iov.push(IoSliceMut::new(a));
                    }
                }
            }
            match (&*conn.stream).read_vectored(&mut iov) {
                Ok(n) => n,
                Err(e) => {
                    blocks.into_iter().for_each(|b| out.pools.big.push(b));
                    return Err(ReadErr::Io(e));
                }
            }
        };
        let mut rest = n;
        let first = rest.min(plan.need);
        out.feed(dec, &rbuf[..first]).map_err(ReadErr::Frame)?;
        rest -= first;
        // Payloads in place, while the stream goes as guessed: an expected
        // header (read whole) goes through the decoder, and the decoder
        // must then expect a datagram of `len` bytes between these ports.
        let mut good: usize = 0;
        // Where the rest of the read starts: (entry, slots of it in place).
        let mut stop = (ents.len(), 0);
        let mut hi = 0;
        'walk: for (i, e) in ents.iter().enumerate() {
            match e {
                Ent::Hdr(want, l) => {
                    if rest < *l || hdrs[hi][..*l] != want[..*l] {
                        stop = (i, 0);
                        break;
                    }
                    out.feed(dec, &hdrs[hi][..*l]).map_err(ReadErr::Frame)?;
                    rest -= l;
                    hi += 1;
                }
                Ent::Pay(_, k) => {
                    for j in 0..*k {
                        if rest < len || dec.take_in_place(len) != Some((plan.src, plan.dst)) {
                            stop = (i, j);
                            break 'walk;
                        }
                        rest -= len;
                        good += 1;
                    }
                }
            }
        }
        // What follows them, in stream order (an unexpected header, or a
        // datagram cut by the end of the read): where its bytes are.
        let mut segs: Vec<(At, usize, usize)> = Vec::new();
        let mut left = rest;
        let mut hi = ents[..stop.0].iter().filter(|e| matches!(e, Ent::Hdr(..))).count();
        for (i, e) in ents.iter().enumerate().skip(stop.0) {
            if left == 0 {
                break;
            }
            match e {
                Ent::Hdr(_, l) => {
                    let k = (*l).min(left);
                    segs.push((At::Arr(hi), 0, k));
                    left -= k;
                    hi += 1;
                }
                Ent::Pay(at, k) => {
                    let skip = if i == stop.0 { stop.1 } else { 0 };
                    let (b, o) = ((at + skip) / per_block, (at + skip) % per_block * len);
                    let m = ((k - skip) * len).min(left);
                    segs.push((At::Blk(b), o, m));
                    left -= m;
                }
            }
        }
        debug_assert_eq!(left, 0);
        let rd = Scattered::new(&segs);
        // Repair: as long as the rest is made of runs (or frames) of the
        // guessed kind, only cut differently (a run count other than the
        // guess), each header goes through the decoder and each datagram is
        // moved to the next free slot (one copy; its bytes only shifted by
        // the headers the guess did not foresee). The first unit of another
        // kind, a datagram cut by the end of the read, or the end of the
        // slots stops it; the bytes from there go through the decoder.
        let mut moves: Vec<(usize, usize, bool)> = Vec::new();
        let mut p = 0;
        let mut slot = good;
        while p < rest {
            let avail = rest - p;
            if let Some((s, d, seg, _)) = dec.in_run() {
                if (s, d, seg) != (plan.src, plan.dst, len) || avail < len || slot >= slots {
                    break;
                }
                let Some(fwd) = rd.direction(p, len, slot, per_block) else { break };
                if dec.take_in_place(len).is_none() {
                    break;
                }
                moves.push((p, slot, fwd));
                p += len;
                slot += 1;
                continue;
            }
            let mut h = [0u8; RUN_HEADER_LEN];
            if avail < HEADER_LEN {
                break;
            }
            rd.copy_to(&hdrs, &blocks, p, &mut h[..HEADER_LEN]);
            let (s, d, l) =
                (u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]]), u16::from_be_bytes([h[4], h[5]]));
            if (s, d) != (plan.src, plan.dst) {
                break;
            }
            let hl = if l == frame::RUN_MARK {
                if avail < RUN_HEADER_LEN {
                    break;
                }
                rd.copy_to(&hdrs, &blocks, p, &mut h);
                if usize::from(u16::from_be_bytes([h[8], h[9]])) != len {
                    break;
                }
                RUN_HEADER_LEN
            } else {
                if usize::from(l) != len
                    || avail < HEADER_LEN + len
                    || slot >= slots
                    || rd.direction(p + HEADER_LEN, len, slot, per_block).is_none()
                {
                    break;
                }
                HEADER_LEN
            };
            out.feed(dec, &h[..hl]).map_err(ReadErr::Frame)?;
            p += hl;
            if hl == HEADER_LEN {
                if dec.take_in_place(len) != Some((plan.src, plan.dst)) {
                    // Unreachable for a well-formed header; the decoder
                    // keeps it and takes the payload below.
                    break;
                }
                let fwd = rd.direction(p, len, slot, per_block).expect("checked before the header was fed");
                moves.push((p, slot, fwd));
                p += len;
                slot += 1;
            }
        }
        // The rest is gathered before the moves overwrite its bytes.
        let mut spill: Vec<u8> = Vec::new();
        if p < rest {
            spill.resize(rest - p, 0);
            rd.copy_to(&hdrs, &blocks, p, &mut spill);
        }
        rd.move_all(&hdrs, &mut blocks, &moves, len, per_block);
        let filled = slot;
        let from = SocketAddr::new(conn.peer.ip(), plan.src);
        for (b, buf) in blocks.into_iter().enumerate() {
            let k = filled.saturating_sub(b * per_block).min(per_block);
            if k == 0 {
                out.pools.big.push(buf);
            } else {
                out.block(plan.dst, RxItem { buf, len: k * len, seg: len, n: k, src: from, big: true });
            }
        }
        if good > 0 {
            Counters::add(&self.c.frames_in_place, good as u64);
        }
        if !moves.is_empty() {
            Counters::add(&self.c.frames_shifted, moves.len() as u64);
        }
        out.feed(dec, &spill).map_err(ReadErr::Frame)?;
        Ok((n, room))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lays a stream of runs (`counts`, headers of `hl` bytes) out as an
    /// in-place read guessing runs of `guess` would, then moves every
    /// datagram the reader may move (as `read_in_place` does) and checks
    /// each slot. Returns (moved forward, moved back, stopped early).
    fn scatter_case(
        len: usize,
        per_block: usize,
        nblocks: usize,
        counts: &[usize],
        guess: usize,
        hl: usize,
    ) -> (usize, usize, bool) {
        let slots = per_block * nblocks;
        // The guessed layout: a header array, then `guess` slots, and so on.
        let mut segs: Vec<(At, usize, usize)> = Vec::new();
        let (mut s, mut a) = (0, 0);
        while s < slots {
            segs.push((At::Arr(a), 0, hl));
            a += 1;
            let mut k = guess;
            while k > 0 && s < slots {
                let n = k.min(per_block - s % per_block);
                segs.push((At::Blk(s / per_block), s % per_block * len, n * len));
                s += n;
                k -= n;
            }
        }
        // The real stream: headers (0xEE) and numbered payloads.
        let mut stream = Vec::new();
        let mut at = Vec::new();
        let mut d = 0u8;
        for &c in counts {
            stream.extend(std::iter::repeat_n(0xEE, hl));
            for _ in 0..c {
                at.push(stream.len());
                d = d.wrapping_add(1);
                stream.extend((0..len).map(|j| d ^ j as u8));
            }
        }
        // The read: as readv fills the layout.
        let mut hdrs = vec![[0u8; RUN_HEADER_LEN]; a];
        let mut blocks = vec![vec![0u8; per_block * len]; nblocks];
        let mut p = 0;
        for &(w, o, n) in &segs {
            let k = n.min(stream.len() - p);
            match w {
                At::Arr(i) => hdrs[i][o..o + k].copy_from_slice(&stream[p..p + k]),
                At::Blk(b) => blocks[b][o..o + k].copy_from_slice(&stream[p..p + k]),
            }
            p += k;
        }
        let rd = Scattered::new(&segs);
        let mut moves = Vec::new();
        let mut stopped = false;
        for (slot, &q) in at.iter().enumerate() {
            if slot >= slots || q + len > p {
                break;
            }
            match rd.direction(q, len, slot, per_block) {
                Some(f) => moves.push((q, slot, f)),
                None => {
                    stopped = true;
                    break;
                }
            }
        }
        rd.move_all(&hdrs, &mut blocks, &moves, len, per_block);
        for &(q, slot, _) in &moves {
            let got = &blocks[slot / per_block][slot % per_block * len..][..len];
            assert_eq!(got, &stream[q..q + len], "slot {slot}, counts {counts:?}, guess {guess}");
        }
        let fwd = moves.iter().filter(|m| m.2).count();
        (fwd, moves.len() - fwd, stopped)
    }

    #[test]
    fn shifted_datagrams_are_moved_into_their_slots_in_a_safe_order() {
        let (mut fwd, mut back, mut stops, mut cases) = (0, 0, 0, 0);
        let mut x = 7u32;
        for len in [16usize, 40] {
            for guess in [1usize, 3, 5, 8] {
                for _ in 0..200 {
                    let counts: Vec<usize> = (0..12)
                        .map(|_| {
                            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            (x >> 16) as usize % 9 + 1
                        })
                        .collect();
                    for hl in [HEADER_LEN, RUN_HEADER_LEN] {
                        let (f, b, s) = scatter_case(len, 4, 3, &counts, guess, hl);
                        fwd += f;
                        back += b;
                        stops += usize::from(s);
                        cases += 1;
                    }
                }
            }
        }
        // Both directions occur, and the reader rarely has to give up.
        assert!(fwd > 1000 && back > 1000, "forward {fwd}, back {back}");
        assert!(stops * 5 < cases, "{stops} of {cases} stopped");
    }
}
