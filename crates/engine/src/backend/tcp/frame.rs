//! The UOE wire format: a connection preamble, then length-prefixed frames.
//!
//! Every connection, in each direction, starts with an 8-byte **hello**:
//! `"EUT1"`, version (1), lane index, two reserved zero bytes. After it
//! comes a stream of **frames**, each a 6-byte header — source UDP port,
//! destination UDP port, payload length, all big-endian `u16` — and the
//! payload. A length above 65 507 (the largest UDP payload), a destination
//! port 0, or a bad hello is a protocol violation: the reader closes the
//! connection. Pure code, no I/O.

/// Preamble magic.
pub const MAGIC: [u8; 4] = *b"EUT1";
/// Wire format version carried in the hello.
pub const VERSION: u8 = 1;
/// Bytes of the hello.
pub const HELLO_LEN: usize = 8;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 6;
/// Largest payload a frame may carry (the IPv4 UDP maximum).
pub const MAX_PAYLOAD: usize = 65_507;
/// Per-datagram overhead on the wire, for accounting.
pub const FRAME_OVERHEAD: usize = HEADER_LEN;

/// The hello for `lane`.
pub fn hello(lane: u8) -> [u8; HELLO_LEN] {
    [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], VERSION, lane, 0, 0]
}

/// Parses a hello; returns the lane.
pub fn parse_hello(b: &[u8; HELLO_LEN]) -> Result<u8, FrameError> {
    if b[..4] != MAGIC || b[4] != VERSION || b[6] != 0 || b[7] != 0 {
        return Err(FrameError::BadHello);
    }
    Ok(b[5])
}

/// A frame header.
pub fn header(src: u16, dst: u16, len: usize) -> [u8; HEADER_LEN] {
    debug_assert!(len <= MAX_PAYLOAD);
    let l = len as u16;
    let (s, d, l) = (src.to_be_bytes(), dst.to_be_bytes(), l.to_be_bytes());
    [s[0], s[1], d[0], d[1], l[0], l[1]]
}

/// Why a connection's input was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The first 8 bytes were not a valid hello.
    BadHello,
    /// A frame announced more than [`MAX_PAYLOAD`] bytes.
    Oversized,
    /// A frame header is invalid (destination port 0).
    Malformed,
}

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
    Hello(u8),
    Frame(u16, u16, usize),
}

/// Incremental decoder for one connection's byte stream. Input is decoded
/// in place from the caller's read buffer (shared by all connections); only
/// a unit cut by the end of a read is kept here, so a connection holds at
/// most one partial frame ([`Decoder::max_buffer`] bytes).
#[derive(Debug, Default)]
pub struct Decoder {
    partial: Vec<u8>,
    lane: Option<u8>,
    /// Header of the last complete frame (src, dst, len).
    last: Option<(u16, u16, usize)>,
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

    /// Records a frame decoded outside the decoder (read in place).
    pub fn note_frame(&mut self, src: u16, dst: u16, len: usize) {
        self.last = Some((src, dst, len));
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

    fn check(&self, b: &[u8]) -> Result<Unit, FrameError> {
        if self.lane.is_none() {
            if b.len() < HELLO_LEN {
                return Ok(Unit::Need(HELLO_LEN - b.len()));
            }
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&b[..HELLO_LEN]);
            return parse_hello(&h).map(Unit::Hello);
        }
        if b.len() < HEADER_LEN {
            return Ok(Unit::Need(HEADER_LEN - b.len()));
        }
        let src = u16::from_be_bytes([b[0], b[1]]);
        let dst = u16::from_be_bytes([b[2], b[3]]);
        let len = u16::from_be_bytes([b[4], b[5]]) as usize;
        if len > MAX_PAYLOAD {
            return Err(FrameError::Oversized);
        }
        if dst == 0 {
            return Err(FrameError::Malformed);
        }
        if b.len() < HEADER_LEN + len {
            return Ok(Unit::Need(HEADER_LEN + len - b.len()));
        }
        Ok(Unit::Frame(src, dst, len))
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
                Unit::Hello(l) => {
                    self.lane = Some(l);
                    self.partial.clear();
                    f(Event::Hello(l));
                }
                Unit::Frame(src, dst, len) => {
                    f(Event::Frame { src, dst, payload: &self.partial[HEADER_LEN..HEADER_LEN + len] });
                    self.last = Some((src, dst, len));
                    self.partial.clear();
                    n += 1;
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
                Unit::Hello(l) => {
                    self.lane = Some(l);
                    input = &input[HELLO_LEN..];
                    f(Event::Hello(l));
                }
                Unit::Frame(src, dst, len) => {
                    f(Event::Frame { src, dst, payload: &input[HEADER_LEN..HEADER_LEN + len] });
                    self.last = Some((src, dst, len));
                    input = &input[HEADER_LEN + len..];
                    n += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        w.extend_from_slice(&[0, 1, 0, 2, 0xff, 0xff]);
        assert_eq!(decode(&mut Decoder::new(), &w, 1), Err(FrameError::Oversized));
        let mut w = hello(0).to_vec();
        w.extend_from_slice(&header(1, 0, 4));
        assert_eq!(decode(&mut Decoder::new(), &w, 100), Err(FrameError::Malformed));
        let mut h = hello(0);
        h[7] = 1;
        assert_eq!(parse_hello(&h), Err(FrameError::BadHello));
    }
}
