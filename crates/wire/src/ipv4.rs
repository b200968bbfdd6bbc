//! The IPv4 header (RFC 791) and its header checksum.
//!
//! A kernel-bypass backend builds and checks the IP header itself. Emitting is
//! limited to the 20-byte header without options, which is all eudp sends;
//! parsing accepts and skips options, since peers may send them.

use crate::checksum::Checksum;
use std::fmt;
use std::net::Ipv4Addr;

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;
/// Protocol number of UDP.
pub const PROTO_UDP: u8 = 17;

/// "Don't fragment" in the flags/fragment-offset word.
pub(crate) const FLAG_DF: u16 = 0x4000;
/// "More fragments" in the flags/fragment-offset word.
pub(crate) const FLAG_MF: u16 = 0x2000;
/// Fragment offset (8-byte units) in the flags/fragment-offset word.
pub(crate) const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A parsed IPv4 header. Options, if any, are counted in `header_len` but not
/// decoded; the reserved flag bit is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Header {
    /// Header length in bytes (IHL × 4), options included.
    pub header_len: usize,
    /// Type of service (DSCP and ECN).
    pub tos: u8,
    /// Header plus payload length, as carried on the wire.
    pub total_len: u16,
    /// Identification, for reassembly.
    pub ident: u16,
    pub dont_fragment: bool,
    pub more_fragments: bool,
    /// Fragment offset in 8-byte units (13 bits).
    pub frag_offset: u16,
    pub ttl: u8,
    /// Payload protocol number (e.g. [`PROTO_UDP`]).
    pub protocol: u8,
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
}

/// Why a buffer does not hold a valid IPv4 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv4Error {
    /// Fewer than 20 bytes.
    Truncated,
    /// The version field is not 4.
    NotVersion4,
    /// IHL below 5, or the header runs past the buffer.
    BadHeaderLen,
    /// Total length below the header length or beyond the buffer.
    BadTotalLen,
    /// The header checksum does not verify.
    BadChecksum,
}

impl fmt::Display for Ipv4Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ipv4Error::Truncated => write!(f, "IPv4 packet shorter than its 20-byte header"),
            Ipv4Error::NotVersion4 => write!(f, "IP version field is not 4"),
            Ipv4Error::BadHeaderLen => {
                write!(f, "IPv4 header length below 20 or beyond the buffer")
            }
            Ipv4Error::BadTotalLen => {
                write!(f, "IPv4 total length below the header length or beyond the buffer")
            }
            Ipv4Error::BadChecksum => write!(f, "IPv4 header checksum does not verify"),
        }
    }
}

impl std::error::Error for Ipv4Error {}

impl Ipv4Header {
    /// Parses and validates the header at the start of `buf`.
    ///
    /// `buf` may extend past `total_len` (Ethernet pads short frames); the
    /// packet is `buf[..total_len]`.
    pub fn parse(buf: &[u8]) -> Result<Self, Ipv4Error> {
        if buf.len() < MIN_HEADER_LEN {
            return Err(Ipv4Error::Truncated);
        }
        if buf[0] >> 4 != 4 {
            return Err(Ipv4Error::NotVersion4);
        }
        let header_len = usize::from(buf[0] & 0x0f) * 4;
        if header_len < MIN_HEADER_LEN || header_len > buf.len() {
            return Err(Ipv4Error::BadHeaderLen);
        }
        let total_len = u16::from_be_bytes([buf[2], buf[3]]);
        if usize::from(total_len) < header_len || usize::from(total_len) > buf.len() {
            return Err(Ipv4Error::BadTotalLen);
        }
        let mut acc = Checksum::new();
        acc.add(&buf[..header_len]);
        if acc.fold() != 0xffff {
            return Err(Ipv4Error::BadChecksum);
        }
        let flags_frag = u16::from_be_bytes([buf[6], buf[7]]);
        Ok(Ipv4Header {
            header_len,
            tos: buf[1],
            total_len,
            ident: u16::from_be_bytes([buf[4], buf[5]]),
            dont_fragment: flags_frag & FLAG_DF != 0,
            more_fragments: flags_frag & FLAG_MF != 0,
            frag_offset: flags_frag & FRAG_OFFSET_MASK,
            ttl: buf[8],
            protocol: buf[9],
            src: Ipv4Addr::new(buf[12], buf[13], buf[14], buf[15]),
            dst: Ipv4Addr::new(buf[16], buf[17], buf[18], buf[19]),
        })
    }

    /// Writes the 20-byte header, checksum included, into `buf[..20]`.
    ///
    /// # Panics
    /// If `header_len` is not 20 (options are not emitted), `frag_offset` does
    /// not fit 13 bits, or `buf` is shorter than 20 bytes.
    pub fn emit(&self, buf: &mut [u8]) {
        assert_eq!(self.header_len, MIN_HEADER_LEN, "Ipv4Header::emit: options not supported");
        assert!(self.frag_offset <= FRAG_OFFSET_MASK, "Ipv4Header::emit: fragment offset too large");
        let h = &mut buf[..MIN_HEADER_LEN];
        let mut flags_frag = self.frag_offset;
        if self.dont_fragment {
            flags_frag |= FLAG_DF;
        }
        if self.more_fragments {
            flags_frag |= FLAG_MF;
        }
        h[0] = 0x45;
        h[1] = self.tos;
        h[2..4].copy_from_slice(&self.total_len.to_be_bytes());
        h[4..6].copy_from_slice(&self.ident.to_be_bytes());
        h[6..8].copy_from_slice(&flags_frag.to_be_bytes());
        h[8] = self.ttl;
        h[9] = self.protocol;
        h[10..12].copy_from_slice(&[0, 0]);
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        let c = crate::checksum::checksum(h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
    }

    /// True when the packet is one fragment of a larger datagram.
    pub fn is_fragment(&self) -> bool {
        self.more_fragments || self.frag_offset != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Ipv4Header {
        Ipv4Header {
            header_len: MIN_HEADER_LEN,
            tos: 0xb8,
            total_len: 28,
            ident: 0xbeef,
            dont_fragment: true,
            more_fragments: false,
            frag_offset: 0,
            ttl: 64,
            protocol: PROTO_UDP,
            src: Ipv4Addr::new(10, 0, 0, 1),
            dst: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    /// Recomputes the header checksum of `buf[..header_len]` in place.
    fn fix_checksum(buf: &mut [u8]) {
        let hl = usize::from(buf[0] & 0x0f) * 4;
        buf[10] = 0;
        buf[11] = 0;
        let c = crate::checksum::checksum(&buf[..hl]);
        buf[10..12].copy_from_slice(&c.to_be_bytes());
    }

    #[test]
    fn emit_then_parse() {
        let h = sample();
        let mut b = [0u8; 28];
        h.emit(&mut b);
        assert_eq!(&b[..12], &[0x45, 0xb8, 0, 28, 0xbe, 0xef, 0x40, 0, 64, 17, b[10], b[11]]);
        assert_eq!(Ipv4Header::parse(&b), Ok(h));
        assert!(!h.is_fragment());
    }

    #[test]
    fn errors() {
        let mut b = [0u8; 28];
        sample().emit(&mut b);
        for n in 0..MIN_HEADER_LEN {
            assert_eq!(Ipv4Header::parse(&b[..n]), Err(Ipv4Error::Truncated));
        }
        let mut v6 = b;
        v6[0] = 0x65;
        assert_eq!(Ipv4Header::parse(&v6), Err(Ipv4Error::NotVersion4));
        let mut short_ihl = b;
        short_ihl[0] = 0x44;
        fix_checksum(&mut short_ihl);
        assert_eq!(Ipv4Header::parse(&short_ihl), Err(Ipv4Error::BadHeaderLen));
        let mut long_ihl = b;
        long_ihl[0] = 0x48; // 32 bytes, buffer is 28
        assert_eq!(Ipv4Header::parse(&long_ihl), Err(Ipv4Error::BadHeaderLen));
        let mut total = b;
        total[3] = 19;
        fix_checksum(&mut total);
        assert_eq!(Ipv4Header::parse(&total), Err(Ipv4Error::BadTotalLen));
        total[3] = 29;
        fix_checksum(&mut total);
        assert_eq!(Ipv4Header::parse(&total), Err(Ipv4Error::BadTotalLen));
        let mut sum = b;
        sum[8] ^= 1;
        assert_eq!(Ipv4Header::parse(&sum), Err(Ipv4Error::BadChecksum));
        for e in [Ipv4Error::Truncated, Ipv4Error::BadChecksum] {
            assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn options_and_padding_accepted() {
        let mut h = sample();
        h.total_len = 32;
        let mut b = [0u8; 40];
        h.emit(&mut b);
        // Move to a 24-byte header: NOP, NOP, NOP, end of options.
        b[0] = 0x46;
        b.copy_within(20..28, 24);
        b[20..24].copy_from_slice(&[1, 1, 1, 0]);
        fix_checksum(&mut b);
        let p = Ipv4Header::parse(&b).unwrap();
        assert_eq!(p.header_len, 24);
        assert_eq!(p.total_len, 32);
        assert_eq!((p.src, p.dst, p.ttl), (h.src, h.dst, h.ttl));
    }

    #[test]
    fn fragment_fields() {
        let mut h = sample();
        h.dont_fragment = false;
        h.more_fragments = true;
        h.frag_offset = 0x1fff;
        let mut b = [0u8; 28];
        h.emit(&mut b);
        assert_eq!(&b[6..8], &[0x3f, 0xff]);
        let p = Ipv4Header::parse(&b).unwrap();
        assert_eq!(p, h);
        assert!(p.is_fragment());
        h.more_fragments = false;
        assert!(h.is_fragment());
        h.frag_offset = 0;
        assert!(!h.is_fragment());
    }

    #[test]
    #[should_panic(expected = "options not supported")]
    fn emit_rejects_options() {
        let mut h = sample();
        h.header_len = 24;
        h.emit(&mut [0u8; 24]);
    }

    proptest! {
        #[test]
        fn round_trip(tos: u8, ident: u16, df: bool, mf: bool, off in 0u16..0x2000, ttl: u8, proto: u8,
                      src: u32, dst: u32, extra in 0u16..100) {
            let h = Ipv4Header {
                header_len: MIN_HEADER_LEN,
                tos,
                total_len: 20 + extra,
                ident,
                dont_fragment: df,
                more_fragments: mf,
                frag_offset: off,
                ttl,
                protocol: proto,
                src: Ipv4Addr::from(src),
                dst: Ipv4Addr::from(dst),
            };
            let mut b = vec![0u8; 20 + usize::from(extra)];
            h.emit(&mut b);
            prop_assert_eq!(Ipv4Header::parse(&b), Ok(h));
        }

        #[test]
        fn parse_never_panics(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = Ipv4Header::parse(&b);
        }
    }
}
