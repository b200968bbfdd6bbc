//! The streaming decoder of one connection's bytes.

use super::{parse_hello, FrameError, HEADER_LEN, HELLO_LEN, MAX_PAYLOAD, RUN_HEADER_LEN, RUN_MARK};

/// What the decoder found in the stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Event<'a> {
    /// The peer's hello, with its lane index.
    Hello(u8),
    /// One datagram.
    Frame { src: u16, dst: u16, payload: &'a [u8] },
}

enum Unit {
    Need(usize),
    Hello(u8, u8),
    /// A datagram: ports, header bytes before the payload (0 inside a run), length.
    Frame(u16, u16, usize, usize),
    /// A run header: ports, count, segment size.
    Run(u16, u16, u16, usize),
}

/// The run being decoded: its ports, segment size and datagrams left.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    src: u16,
    dst: u16,
    seg: usize,
    left: u16,
}

/// Incremental decoder for one connection's byte stream. Input is decoded
/// in place from the caller's read buffer (shared by all connections); only
/// a unit cut by the end of a read is kept here, so a connection holds at
/// most one partial frame ([`Decoder::max_buffer`] bytes); a run is decoded
/// one datagram at a time, never buffered whole.
#[derive(Debug, Default)]
pub struct Decoder {
    partial: Vec<u8>,
    lane: Option<u8>,
    version: u8,
    /// Header of the last complete frame (src, dst, len).
    last: Option<(u16, u16, usize)>,
    run: Option<Run>,
    /// Count of the last run header (None: the last datagram was a frame).
    last_run: Option<u16>,
}

impl Decoder {
    pub fn new() -> Self {
        Decoder::default()
    }

    /// Largest amount of input the decoder keeps between reads.
    pub fn max_buffer() -> usize {
        HEADER_LEN + MAX_PAYLOAD
    }

    /// The lane announced by the peer's hello, once seen.
    pub fn lane(&self) -> Option<u8> {
        self.lane
    }

    /// Bytes kept from a unit cut by the end of a read.
    pub fn pending(&self) -> usize {
        self.partial.len()
    }

    /// Header (src, dst, len) of the last complete frame: the reader's guess
    /// for the frames that follow.
    pub fn last_frame(&self) -> Option<(u16, u16, usize)> {
        self.last
    }

    /// The run being decoded: (src, dst, seg, datagrams left, counting one
    /// cut by the end of the previous read).
    pub fn in_run(&self) -> Option<(u16, u16, usize, u16)> {
        self.run.map(|r| (r.src, r.dst, r.seg, r.left))
    }

    /// Count of the last run header, while the datagrams come in runs.
    pub fn last_run(&self) -> Option<u16> {
        self.last_run
    }

    /// Bytes that complete the unit cut by the end of the previous read (0
    /// at a frame boundary). While the cut header itself is incomplete,
    /// only its rest is counted. None when the kept bytes are invalid.
    pub fn need(&self) -> Option<usize> {
        if self.partial.is_empty() {
            return Some(0);
        }
        match self.check(&self.partial) {
            Ok(Unit::Need(k)) => Some(k),
            _ => None,
        }
    }

    /// A datagram of `len` bytes that is next in the stream was read in
    /// place by the caller (the header before it, if any, went through
    /// [`Decoder::feed`] and is all that is kept): it is consumed without
    /// being handed out. Returns its ports, or None (nothing changes) when
    /// the stream does not continue with a datagram of exactly `len` bytes
    /// here.
    pub fn take_in_place(&mut self, len: usize) -> Option<(u16, u16)> {
        self.lane?;
        let (src, dst) = if let Some(r) = self.run.as_mut() {
            if !self.partial.is_empty() || r.seg != len {
                return None;
            }
            r.left -= 1;
            let p = (r.src, r.dst);
            if r.left == 0 {
                self.run = None;
            }
            p
        } else {
            match self.check(&self.partial) {
                Ok(Unit::Need(k)) if self.partial.len() == HEADER_LEN && k == len => {}
                _ => return None,
            }
            let b = &self.partial;
            let p = (u16::from_be_bytes([b[0], b[1]]), u16::from_be_bytes([b[2], b[3]]));
            self.partial.clear();
            self.last_run = None;
            p
        };
        self.last = Some((src, dst, len));
        Some((src, dst))
    }

    fn check(&self, b: &[u8]) -> Result<Unit, FrameError> {
        if self.lane.is_none() {
            if b.len() < HELLO_LEN {
                return Ok(Unit::Need(HELLO_LEN - b.len()));
            }
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&b[..HELLO_LEN]);
            return parse_hello(&h).map(|l| Unit::Hello(l, h[4]));
        }
        if let Some(r) = self.run {
            if b.len() < r.seg {
                return Ok(Unit::Need(r.seg - b.len()));
            }
            return Ok(Unit::Frame(r.src, r.dst, 0, r.seg));
        }
        if b.len() < HEADER_LEN {
            return Ok(Unit::Need(HEADER_LEN - b.len()));
        }
        let src = u16::from_be_bytes([b[0], b[1]]);
        let dst = u16::from_be_bytes([b[2], b[3]]);
        let len = u16::from_be_bytes([b[4], b[5]]);
        if len == RUN_MARK && self.version >= 2 {
            if dst == 0 {
                return Err(FrameError::Malformed);
            }
            if b.len() < RUN_HEADER_LEN {
                return Ok(Unit::Need(RUN_HEADER_LEN - b.len()));
            }
            let count = u16::from_be_bytes([b[6], b[7]]);
            let seg = u16::from_be_bytes([b[8], b[9]]) as usize;
            if seg > MAX_PAYLOAD {
                return Err(FrameError::Oversized);
            }
            if count == 0 || seg == 0 {
                return Err(FrameError::Malformed);
            }
            return Ok(Unit::Run(src, dst, count, seg));
        }
        let len = len as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::Oversized);
        }
        if dst == 0 {
            return Err(FrameError::Malformed);
        }
        if b.len() < HEADER_LEN + len {
            return Ok(Unit::Need(HEADER_LEN + len - b.len()));
        }
        Ok(Unit::Frame(src, dst, HEADER_LEN, len))
    }

    /// Applies a complete unit other than `Need`; returns the bytes it
    /// spans and, for a datagram, (src, dst, payload offset, len).
    fn apply(&mut self, u: Unit) -> (usize, Option<(u16, u16, usize, usize)>) {
        match u {
            Unit::Need(_) => unreachable!("not a complete unit"),
            Unit::Hello(l, v) => {
                self.lane = Some(l);
                self.version = v;
                (HELLO_LEN, None)
            }
            Unit::Run(src, dst, count, seg) => {
                self.run = Some(Run { src, dst, seg, left: count });
                self.last_run = Some(count);
                (RUN_HEADER_LEN, None)
            }
            Unit::Frame(src, dst, off, len) => {
                match self.run.as_mut() {
                    Some(r) if off == 0 => {
                        r.left -= 1;
                        if r.left == 0 {
                            self.run = None;
                        }
                    }
                    _ => self.last_run = None,
                }
                self.last = Some((src, dst, len));
                (off + len, Some((src, dst, off, len)))
            }
        }
    }

    /// Applies a complete unit found at the start of `bytes` and hands its
    /// hello or datagram to `f`; returns the bytes it used and the frames
    /// handed (0 or 1).
    fn apply_and_emit(&mut self, u: Unit, bytes: &[u8], f: &mut impl FnMut(Event<'_>)) -> (usize, usize) {
        let hello = matches!(u, Unit::Hello(..));
        let (used, d) = self.apply(u);
        if let Some((src, dst, off, len)) = d {
            f(Event::Frame { src, dst, payload: &bytes[off..off + len] });
            return (used, 1);
        }
        if hello {
            f(Event::Hello(self.lane.expect("hello sets the lane")));
        }
        (used, 0)
    }

    /// Decodes newly read bytes, handing the hello and every complete frame
    /// to `f`; returns the frames found. After an error the connection must
    /// be closed.
    pub fn feed(&mut self, mut input: &[u8], f: &mut impl FnMut(Event<'_>)) -> Result<usize, FrameError> {
        let mut n = 0;
        // First complete the unit the previous read cut.
        while !self.partial.is_empty() {
            match self.check(&self.partial)? {
                Unit::Need(k) => {
                    let take = k.min(input.len());
                    self.partial.extend_from_slice(&input[..take]);
                    input = &input[take..];
                    if take < k {
                        return Ok(n);
                    }
                }
                u => {
                    let mut partial = std::mem::take(&mut self.partial);
                    n += self.apply_and_emit(u, &partial, f).1;
                    partial.clear();
                    self.partial = partial;
                }
            }
        }
        // Then decode in place; keep a cut unit's bytes.
        loop {
            match self.check(input)? {
                Unit::Need(_) => {
                    self.partial.extend_from_slice(input);
                    if self.partial.capacity() > 2 * Self::max_buffer() {
                        self.partial.shrink_to(Self::max_buffer());
                    }
                    return Ok(n);
                }
                u => {
                    let (used, k) = self.apply_and_emit(u, input, f);
                    n += k;
                    input = &input[used..];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::uot::{header, hello, run_header};

    fn decode(d: &mut Decoder, bytes: &[u8], cut: usize) -> Result<Vec<(u16, u16, Vec<u8>)>, FrameError> {
        let mut got = Vec::new();
        for piece in bytes.chunks(cut.max(1)) {
            d.feed(piece, &mut |e| {
                if let Event::Frame { src, dst, payload } = e {
                    got.push((src, dst, payload.to_vec()));
                }
            })?;
            assert!(d.pending() <= Decoder::max_buffer());
        }
        Ok(got)
    }

    #[test]
    fn roundtrip_split_anywhere() {
        let mut wire = hello(3).to_vec();
        let sizes = [0usize, 1, 1472, 65_507, 7];
        for (i, &s) in sizes.iter().enumerate() {
            wire.extend_from_slice(&header(1000 + i as u16, 2000, s));
            wire.extend((0..s).map(|k| (k + i) as u8));
        }
        for cut in [1usize, 5, 6, 7, 8, 9, 999, 4096, 70_000, 1 << 20] {
            let mut d = Decoder::new();
            let got = decode(&mut d, &wire, cut).unwrap();
            assert_eq!(d.lane(), Some(3));
            assert_eq!(d.pending(), 0);
            assert_eq!(got.len(), sizes.len(), "cut {cut}");
            for (i, (s, t, p)) in got.iter().enumerate() {
                assert_eq!((*s, *t, p.len()), (1000 + i as u16, 2000, sizes[i]));
                assert!(p.iter().enumerate().all(|(k, &b)| b == (k + i) as u8));
            }
        }
    }

    #[test]
    fn hostile_input_is_rejected() {
        let mut d = Decoder::new();
        assert_eq!(decode(&mut d, b"GET / HTTP/1.1\r\n", 3), Err(FrameError::BadHello));
        let mut w = hello(0).to_vec();
        w.extend_from_slice(&[0, 1, 0, 2, 0xff, 0xf0]);
        assert_eq!(decode(&mut Decoder::new(), &w, 1), Err(FrameError::Oversized));
        let mut w = hello(0).to_vec();
        w.extend_from_slice(&header(1, 0, 4));
        assert_eq!(decode(&mut Decoder::new(), &w, 100), Err(FrameError::Malformed));
        let mut h = hello(0);
        h[7] = 1;
        assert_eq!(parse_hello(&h), Err(FrameError::BadHello));
    }

    fn v(version: u8) -> Vec<u8> {
        let mut h = hello(1).to_vec();
        h[4] = version;
        h
    }

    #[test]
    fn runs_roundtrip_split_anywhere_mixed_with_frames() {
        let mut wire = v(2);
        let mut want = Vec::new();
        let mut k = 0u8;
        for (count, seg) in [(44u16, 1472usize), (1, 9), (3, 65_507), (5, 1)] {
            wire.extend_from_slice(&run_header(7, 8, count, seg));
            for _ in 0..count {
                k = k.wrapping_add(1);
                wire.extend(std::iter::repeat_n(k, seg));
                want.push((7u16, 8u16, vec![k; seg]));
            }
            wire.extend_from_slice(&header(9, 10, 3));
            wire.extend_from_slice(b"abc");
            want.push((9, 10, b"abc".to_vec()));
        }
        for cut in [1usize, 6, 9, 10, 11, 1471, 1472, 1473, 65_536, 1 << 22] {
            let mut d = Decoder::new();
            let got = decode(&mut d, &wire, cut).unwrap();
            assert_eq!(got, want, "cut {cut}");
            assert_eq!((d.pending(), d.in_run()), (0, None));
        }
    }

    #[test]
    fn hostile_runs_are_rejected() {
        let bad = |h: [u8; RUN_HEADER_LEN]| {
            let mut w = v(2);
            w.extend_from_slice(&h);
            decode(&mut Decoder::new(), &w, 3)
        };
        let m = RUN_MARK.to_be_bytes();
        assert_eq!(bad([0, 1, 0, 2, m[0], m[1], 0, 0, 0, 5]), Err(FrameError::Malformed)); // 0 datagrams
        assert_eq!(bad([0, 1, 0, 2, m[0], m[1], 0, 5, 0, 0]), Err(FrameError::Malformed)); // empty ones
        assert_eq!(bad([0, 1, 0, 0, m[0], m[1], 0, 5, 0, 5]), Err(FrameError::Malformed)); // port 0
        assert_eq!(bad([0, 1, 0, 2, m[0], m[1], 0, 5, 0xff, 0xe4]), Err(FrameError::Oversized)); // 65 508

        // A version 1 stream has no runs: the marker is an oversized frame.
        let mut w = v(1);
        w.extend_from_slice(&run_header(1, 2, 3, 4));
        assert_eq!(decode(&mut Decoder::new(), &w, 100), Err(FrameError::Oversized));
        // A huge run is decoded one datagram at a time: nothing grows.
        let mut d = Decoder::new();
        let mut w = v(2);
        w.extend_from_slice(&run_header(1, 2, u16::MAX, MAX_PAYLOAD));
        w.extend(std::iter::repeat_n(0u8, 3 * MAX_PAYLOAD + 17));
        assert_eq!(decode(&mut d, &w, 1 << 16).unwrap().len(), 3);
        assert_eq!((d.pending(), d.in_run().map(|r| r.3)), (17, Some(u16::MAX - 3)));
    }

    #[test]
    fn take_in_place_follows_the_stream() {
        let mut d = Decoder::new();
        let mut w = v(2);
        w.extend_from_slice(&run_header(5, 6, 2, 4));
        d.feed(&w, &mut |_| {}).unwrap();
        assert_eq!(d.take_in_place(3), None);
        assert_eq!(d.take_in_place(4), Some((5, 6)));
        assert_eq!(d.take_in_place(4), Some((5, 6)));
        assert_eq!((d.in_run(), d.last_run(), d.last_frame()), (None, Some(2), Some((5, 6, 4))));
        // Next: a frame header alone, then its payload in place.
        assert_eq!(d.take_in_place(4), None);
        d.feed(&header(1, 2, 4), &mut |_| panic!("no frame yet")).unwrap();
        assert_eq!(d.take_in_place(5), None);
        assert_eq!(d.take_in_place(4), Some((1, 2)));
        assert_eq!((d.pending(), d.last_run()), (0, None));
    }
}
