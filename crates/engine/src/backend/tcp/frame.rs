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

/// Incremental decoder for one connection's byte stream. Memory is bounded:
/// the buffer never holds more than one partial frame plus one read chunk.
#[derive(Debug)]
pub struct Decoder {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    lane: Option<u8>,
    chunk: usize,
}

impl Decoder {
    /// A decoder reading up to `chunk` bytes per read.
    pub fn new(chunk: usize) -> Self {
        let chunk = chunk.max(HEADER_LEN + MAX_PAYLOAD);
        Decoder { buf: Vec::new(), start: 0, end: 0, lane: None, chunk }
    }

    /// Largest buffer the decoder will ever hold.
    pub fn max_buffer(&self) -> usize {
        self.chunk + HEADER_LEN + MAX_PAYLOAD
    }

    /// The lane announced by the peer's hello, once seen.
    pub fn lane(&self) -> Option<u8> {
        self.lane
    }

    /// Free space to read into (at least one chunk); call [`Decoder::commit`]
    /// with the bytes read.
    pub fn spare(&mut self) -> &mut [u8] {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.start > 0 && self.buf.len() - self.end < self.chunk {
            // Keep the partial frame, move it to the front.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() < self.end + self.chunk {
            self.buf.resize(self.end + self.chunk, 0);
        }
        &mut self.buf[self.end..]
    }

    /// Records `n` bytes read into [`Decoder::spare`].
    pub fn commit(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// Bytes buffered but not yet decoded (a partial frame).
    pub fn pending(&self) -> usize {
        self.end - self.start
    }

    /// Parses the hello once enough bytes are buffered; returns the lane.
    pub fn take_hello(&mut self) -> Result<Option<u8>, FrameError> {
        if self.lane.is_none() {
            if self.end - self.start < HELLO_LEN {
                return Ok(None);
            }
            let mut h = [0u8; HELLO_LEN];
            h.copy_from_slice(&self.buf[self.start..self.start + HELLO_LEN]);
            self.lane = Some(parse_hello(&h)?);
            self.start += HELLO_LEN;
        }
        Ok(self.lane)
    }

    /// Hands every complete frame to `f(src_port, dst_port, payload)`
    /// (after the hello).
    pub fn drain(&mut self, mut f: impl FnMut(u16, u16, &[u8])) -> Result<usize, FrameError> {
        let mut n = 0;
        if self.take_hello()?.is_none() {
            return Ok(0);
        }
        loop {
            let avail = self.end - self.start;
            if avail < HEADER_LEN {
                return Ok(n);
            }
            let h = &self.buf[self.start..self.start + HEADER_LEN];
            let src = u16::from_be_bytes([h[0], h[1]]);
            let dst = u16::from_be_bytes([h[2], h[3]]);
            let len = u16::from_be_bytes([h[4], h[5]]) as usize;
            if len > MAX_PAYLOAD {
                return Err(FrameError::Oversized);
            }
            if dst == 0 {
                return Err(FrameError::Malformed);
            }
            if avail < HEADER_LEN + len {
                return Ok(n);
            }
            let p = self.start + HEADER_LEN;
            f(src, dst, &self.buf[p..p + len]);
            self.start = p + len;
            n += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feed(d: &mut Decoder, bytes: &[u8]) {
        let mut at = 0;
        while at < bytes.len() {
            let s = d.spare();
            let k = s.len().min(bytes.len() - at).min(1000);
            s[..k].copy_from_slice(&bytes[at..at + k]);
            d.commit(k);
            at += k;
        }
    }

    #[test]
    fn roundtrip_split_anywhere() {
        let mut wire = hello(3).to_vec();
        let sizes = [0usize, 1, 1472, 65_507, 7];
        for (i, &s) in sizes.iter().enumerate() {
            wire.extend_from_slice(&header(1000 + i as u16, 2000, s));
            wire.extend((0..s).map(|k| (k + i) as u8));
        }
        for cut in [1usize, 5, 6, 7, 999, 4096] {
            let mut d = Decoder::new(1 << 16);
            let mut got = Vec::new();
            for piece in wire.chunks(cut) {
                feed(&mut d, piece);
                d.drain(|s, t, p| got.push((s, t, p.to_vec()))).unwrap();
                assert!(d.pending() <= d.max_buffer());
            }
            assert_eq!(d.lane(), Some(3));
            assert_eq!(got.len(), sizes.len());
            for (i, (s, t, p)) in got.iter().enumerate() {
                assert_eq!((*s, *t, p.len()), (1000 + i as u16, 2000, sizes[i]));
                assert!(p.iter().enumerate().all(|(k, &b)| b == (k + i) as u8));
            }
        }
    }

    #[test]
    fn hostile_input_is_rejected() {
        let mut d = Decoder::new(0);
        feed(&mut d, b"GET / HTTP/1.1\r\n");
        assert_eq!(d.drain(|_, _, _| {}), Err(FrameError::BadHello));
        let mut d = Decoder::new(0);
        let mut w = hello(0).to_vec();
        w.extend_from_slice(&[0, 1, 0, 2, 0xff, 0xff]);
        feed(&mut d, &w);
        assert_eq!(d.drain(|_, _, _| {}), Err(FrameError::Oversized));
        let mut d = Decoder::new(0);
        let mut w = hello(0).to_vec();
        w.extend_from_slice(&header(1, 0, 4));
        feed(&mut d, &w);
        assert_eq!(d.drain(|_, _, _| {}), Err(FrameError::Malformed));
        let mut h = hello(0);
        h[7] = 1;
        assert_eq!(parse_hello(&h), Err(FrameError::BadHello));
    }
}
