//! The UOE wire format: a connection preamble, then length-prefixed frames.
//!
//! Every connection, in each direction, starts with an 8-byte **hello**:
//! `"EUT1"`, version, lane index, two reserved zero bytes. After it comes
//! a stream of **frames**, each a 6-byte header — source UDP port,
//! destination UDP port, payload length, all big-endian `u16` — and the
//! payload. Version 2 adds **runs**: a 10-byte header — source port,
//! destination port, the marker `0xFFFF` where a frame has its length,
//! a count and a segment size (`u16` each) — followed by `count`
//! datagrams of `seg` bytes back to back, with no header between them (so
//! a receiver can read a run's payloads contiguously into one buffer, and
//! a sender writes one header per run instead of one per datagram).
//! Frames and runs mix freely in a version 2 stream; a version 1 stream
//! has frames only (its hello is still accepted). A length above 65 507
//! (the largest UDP payload), a destination port 0, a run of 0 datagrams or
//! of empty ones, or a bad hello is a protocol violation: the reader closes
//! the connection.
//!
//! Pure code, no I/O: [`Decoder`] turns a connection's bytes into events,
//! the functions here build what a sender writes.

mod decoder;

pub use decoder::{Decoder, Event};

/// Preamble magic.
pub const MAGIC: [u8; 4] = *b"EUT1";
/// Wire format version this side sends (runs allowed).
pub const VERSION: u8 = 2;
/// Oldest version accepted (frames only).
pub const MIN_VERSION: u8 = 1;
/// Bytes of the hello.
pub const HELLO_LEN: usize = 8;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 6;
/// Bytes of a run header.
pub const RUN_HEADER_LEN: usize = 10;
/// The length field of a run header.
pub const RUN_MARK: u16 = 0xFFFF;
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
    if b[..4] != MAGIC || !(MIN_VERSION..=VERSION).contains(&b[4]) || b[6] != 0 || b[7] != 0 {
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

/// A run header: `count` datagrams of `seg` bytes follow.
pub fn run_header(src: u16, dst: u16, count: u16, seg: usize) -> [u8; RUN_HEADER_LEN] {
    debug_assert!(count > 0 && seg > 0 && seg <= MAX_PAYLOAD);
    let (s, d, m, c, g) =
        (src.to_be_bytes(), dst.to_be_bytes(), RUN_MARK.to_be_bytes(), count.to_be_bytes(), (seg as u16).to_be_bytes());
    [s[0], s[1], d[0], d[1], m[0], m[1], c[0], c[1], g[0], g[1]]
}

/// Walks whole frames and runs that this side queued for sending (no
/// hello): `f(src, dst, payload)` for each datagram, in order. Used when a
/// lane's peer turns out to have no UOE and its queue goes out as plain
/// UDP instead. Stops at the first incomplete or invalid unit; returns the
/// bytes walked.
pub fn each_queued(bytes: &[u8], mut f: impl FnMut(u16, u16, &[u8])) -> usize {
    let be = |b: &[u8], i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
    let mut at = 0;
    while bytes.len() - at >= HEADER_LEN {
        let h = &bytes[at..];
        let (src, dst, len) = (be(h, 0), be(h, 2), be(h, 4));
        if len == RUN_MARK {
            if h.len() < RUN_HEADER_LEN {
                break;
            }
            let (count, seg) = (be(h, 6) as usize, be(h, 8) as usize);
            let end = RUN_HEADER_LEN + count * seg;
            if count == 0 || seg == 0 || h.len() < end {
                break;
            }
            for d in h[RUN_HEADER_LEN..end].chunks(seg) {
                f(src, dst, d);
            }
            at += end;
        } else {
            let end = HEADER_LEN + len as usize;
            if h.len() < end {
                break;
            }
            f(src, dst, &h[HEADER_LEN..end]);
            at += end;
        }
    }
    at
}

/// Why a connection's input was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// The first 8 bytes were not a valid hello.
    BadHello,
    /// A frame announced more than [`MAX_PAYLOAD`] bytes.
    Oversized,
    /// A frame header is invalid (destination port 0, an empty run).
    Malformed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_frames_and_runs_are_walked_in_order() {
        let mut b = Vec::new();
        b.extend_from_slice(&header(1, 2, 3));
        b.extend_from_slice(b"abc");
        b.extend_from_slice(&run_header(4, 5, 2, 2));
        b.extend_from_slice(b"dEfG");
        b.extend_from_slice(&header(6, 7, 0));
        let whole = b.len();
        b.extend_from_slice(&header(8, 9, 5));
        b.extend_from_slice(b"hi");
        let mut got = Vec::new();
        assert_eq!(each_queued(&b, |s, d, p| got.push((s, d, p.to_vec()))), whole);
        let want: Vec<(u16, u16, Vec<u8>)> =
            vec![(1, 2, b"abc".to_vec()), (4, 5, b"dE".to_vec()), (4, 5, b"fG".to_vec()), (6, 7, vec![])];
        assert_eq!(got, want);
    }
}
