//! The UDP header (RFC 768) and its checksum over the IPv4/IPv6 pseudo-header.

use crate::checksum::Checksum;
use std::net::IpAddr;

/// Length of the UDP header in bytes.
pub const HEADER_LEN: usize = 8;

/// A parsed UDP header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpHeader {
    pub src_port: u16,
    pub dst_port: u16,
    /// Header plus payload length, as carried on the wire.
    pub length: u16,
    pub checksum: u16,
}

/// Why a buffer is not a valid UDP datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UdpError {
    /// Fewer than 8 bytes.
    Truncated,
    /// The length field is below 8 or beyond the buffer.
    BadLength,
}

impl std::fmt::Display for UdpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UdpError::Truncated => write!(f, "UDP datagram shorter than its 8-byte header"),
            UdpError::BadLength => write!(f, "UDP length field inconsistent with the buffer"),
        }
    }
}

impl std::error::Error for UdpError {}

impl UdpHeader {
    /// Parses the header at the start of `buf` and checks the length field.
    pub fn parse(buf: &[u8]) -> Result<Self, UdpError> {
        if buf.len() < HEADER_LEN {
            return Err(UdpError::Truncated);
        }
        let h = UdpHeader {
            src_port: u16::from_be_bytes([buf[0], buf[1]]),
            dst_port: u16::from_be_bytes([buf[2], buf[3]]),
            length: u16::from_be_bytes([buf[4], buf[5]]),
            checksum: u16::from_be_bytes([buf[6], buf[7]]),
        };
        if (h.length as usize) < HEADER_LEN || h.length as usize > buf.len() {
            return Err(UdpError::BadLength);
        }
        Ok(h)
    }

    /// Writes the header into `buf[..8]`.
    pub fn emit(&self, buf: &mut [u8]) {
        buf[0..2].copy_from_slice(&self.src_port.to_be_bytes());
        buf[2..4].copy_from_slice(&self.dst_port.to_be_bytes());
        buf[4..6].copy_from_slice(&self.length.to_be_bytes());
        buf[6..8].copy_from_slice(&self.checksum.to_be_bytes());
    }
}

/// Adds the IPv4 or IPv6 pseudo-header for a UDP datagram of `udp_len` bytes.
pub fn add_pseudo_header(acc: &mut Checksum, src: IpAddr, dst: IpAddr, udp_len: u32) {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            acc.add(&s.octets());
            acc.add(&d.octets());
            acc.add_u16(17);
            acc.add_u16(udp_len as u16);
        }
        (s, d) => {
            let s6 = match s {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            let d6 = match d {
                IpAddr::V4(a) => a.to_ipv6_mapped(),
                IpAddr::V6(a) => a,
            };
            acc.add(&s6.octets());
            acc.add(&d6.octets());
            acc.add_u16((udp_len >> 16) as u16);
            acc.add_u16(udp_len as u16);
            acc.add_u16(0);
            acc.add_u16(17);
        }
    }
}

/// Builds a complete UDP datagram (header + payload) with a valid checksum,
/// computing the payload's sum while copying it (one pass).
///
/// Returns the number of bytes written. A computed checksum of zero is sent as
/// 0xffff, as RFC 768 requires.
pub fn build(out: &mut [u8], src: (IpAddr, u16), dst: (IpAddr, u16), payload: &[u8]) -> usize {
    build_with(out, src, dst, payload, None)
}

/// [`build`] with the payload's copy supplied (see
/// [`crate::checksum::copy_with_checksum_via`]); `None` is the ordinary fused copy.
pub fn build_with(
    out: &mut [u8],
    src: (IpAddr, u16),
    dst: (IpAddr, u16),
    payload: &[u8],
    copy: Option<crate::checksum::CopyFn>,
) -> usize {
    let total = HEADER_LEN + payload.len();
    assert!(out.len() >= total && total <= u16::MAX as usize, "udp::build: bad lengths");
    // Pseudo-header and header first so they stay on 16-bit boundaries; the
    // payload (possibly odd-length) is summed last, during the copy.
    let mut acc = Checksum::new();
    add_pseudo_header(&mut acc, src.0, dst.0, total as u32);
    let mut h = UdpHeader { src_port: src.1, dst_port: dst.1, length: total as u16, checksum: 0 };
    let mut hb = [0u8; HEADER_LEN];
    h.emit(&mut hb);
    acc.add(&hb);
    match copy {
        Some(f) => crate::checksum::copy_with_checksum_via(&mut out[HEADER_LEN..], payload, &mut acc, f),
        None => crate::checksum::copy_with_checksum(&mut out[HEADER_LEN..], payload, &mut acc),
    }
    let c = acc.finish();
    h.checksum = if c == 0 { 0xffff } else { c };
    h.emit(&mut out[..HEADER_LEN]);
    total
}

/// True when the datagram's checksum verifies (or is 0 over IPv4, "none").
pub fn verify(datagram: &[u8], src: IpAddr, dst: IpAddr) -> Result<bool, UdpError> {
    let h = UdpHeader::parse(datagram)?;
    if h.checksum == 0 && src.is_ipv4() {
        return Ok(true);
    }
    let mut acc = Checksum::new();
    add_pseudo_header(&mut acc, src, dst, u32::from(h.length));
    acc.add(&datagram[..h.length as usize]);
    Ok(acc.fold() == 0xffff)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn truncated_and_bad_length() {
        assert_eq!(UdpHeader::parse(&[0; 7]), Err(UdpError::Truncated));
        let mut b = [0u8; 8];
        b[5] = 4;
        assert_eq!(UdpHeader::parse(&b), Err(UdpError::BadLength));
        b[5] = 9;
        assert_eq!(UdpHeader::parse(&b), Err(UdpError::BadLength));
    }

    proptest! {
        #[test]
        fn build_then_verify_v4(payload in proptest::collection::vec(any::<u8>(), 0..1600), sp: u16, dp: u16) {
            let s = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1));
            let d = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2));
            let mut out = vec![0u8; payload.len() + 8];
            let n = build(&mut out, (s, sp), (d, dp), &payload);
            prop_assert_eq!(n, out.len());
            prop_assert!(verify(&out, s, d).unwrap());
            // Any single bit flip in the payload is detected.
            if !payload.is_empty() {
                out[8] ^= 0x01;
                prop_assert!(!verify(&out, s, d).unwrap());
            }
        }

        #[test]
        fn build_then_verify_v6(payload in proptest::collection::vec(any::<u8>(), 0..1600)) {
            let s = IpAddr::V6(Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 1));
            let d = IpAddr::V6(Ipv6Addr::new(0x2001, 0x2, 0, 0, 0, 0, 0, 2));
            let mut out = vec![0u8; payload.len() + 8];
            build(&mut out, (s, 1), (d, 2), &payload);
            prop_assert!(verify(&out, s, d).unwrap());
        }
    }
}
