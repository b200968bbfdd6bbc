//! Whole Ethernet + IPv4 + UDP frames, as an AF_XDP backend sends and
//! receives them.
//!
//! With the kernel bypassed, user space must produce frames the peer's stack
//! accepts and must reject frames the kernel would drop. Building fuses the
//! UDP checksum into the payload copy ([`crate::udp::build`]); parsing checks
//! every header and the UDP checksum before exposing the payload.

use crate::checksum::Checksum;
use crate::ether::{self, EtherError, EthernetHeader, MacAddr, ETHERTYPE_IPV4};
use crate::ipv4::{self, Ipv4Error, Ipv4Header, PROTO_UDP};
use crate::udp;
use std::fmt;
use std::net::{IpAddr, SocketAddrV4};

/// Bytes a frame adds to a UDP payload: Ethernet, IPv4 without options, UDP.
pub const UDP4_OVERHEAD: usize = ether::HEADER_LEN + ipv4::MIN_HEADER_LEN + udp::HEADER_LEN;

/// How the UDP checksum of a received frame was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UdpChecksum {
    /// The full checksum verifies.
    Verified,
    /// The field is 0: the sender computed none (allowed over IPv4).
    Absent,
    /// The field holds only the pseudo-header sum that a sender using
    /// checksum offload leaves for the device to complete
    /// (`CHECKSUM_PARTIAL`). The payload is unverified; see [`parse_udp4`].
    Partial,
    /// Not checked yet: [`parse_udp4_unchecked`] leaves it to a
    /// [`PendingChecksum`], checked while the payload is copied.
    Pending,
}

/// A UDP checksum still to be checked: the sum of the pseudo-header and the
/// UDP header (its checksum field included), to which the payload's sum is
/// added, and the pseudo-header's sum alone (for [`UdpChecksum::Partial`]).
#[derive(Debug, Clone, Copy)]
pub struct PendingChecksum {
    acc: Checksum,
    field: u16,
    pseudo: u16,
}

impl PendingChecksum {
    /// Checks the checksum over `payload`, reading it once.
    pub fn verify(mut self, payload: &[u8]) -> Result<UdpChecksum, FrameError> {
        self.acc.add(payload);
        self.finish()
    }

    /// Copies `payload` into `dst` and checks the checksum in the same pass
    /// over the data: paper 000's fusion of the checksum with data
    /// movement, on the receive side. On `Err` the bytes were copied all the
    /// same and must not be delivered.
    ///
    /// # Panics
    /// If `dst` is shorter than `payload`.
    pub fn copy(mut self, dst: &mut [u8], payload: &[u8]) -> Result<UdpChecksum, FrameError> {
        crate::checksum::copy_with_checksum(dst, payload, &mut self.acc);
        self.finish()
    }

    fn finish(&self) -> Result<UdpChecksum, FrameError> {
        if self.acc.fold() == 0xffff {
            Ok(UdpChecksum::Verified)
        } else if self.field == self.pseudo {
            Ok(UdpChecksum::Partial)
        } else {
            Err(FrameError::BadChecksum)
        }
    }
}

/// A parsed Ethernet + IPv4 + UDP frame, borrowing its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp4Frame<'a> {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub tos: u8,
    pub ttl: u8,
    /// What the UDP checksum check found.
    pub checksum: UdpChecksum,
    /// Exactly the UDP payload (Ethernet padding excluded).
    pub payload: &'a [u8],
}

/// Addresses and header fields of a frame to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Udp4Params {
    pub src_mac: MacAddr,
    pub dst_mac: MacAddr,
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub tos: u8,
    pub ttl: u8,
    /// IPv4 identification. With DF set it is not used for reassembly, but
    /// RFC 6864 still asks senders to vary it.
    pub ident: u16,
}

/// Why a frame cannot be built or is not a valid UDP-over-IPv4 frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Build: the payload would make the IPv4 total length exceed 65535.
    TooLarge { payload: usize },
    /// Build: the output buffer cannot hold the frame.
    BufferTooSmall { need: usize, have: usize },
    /// Parse: shorter than the Ethernet header.
    Truncated,
    /// Parse: the ethertype (carried here) is not IPv4.
    NotIpv4(u16),
    /// Parse: the IPv4 header is invalid.
    Ipv4(Ipv4Error),
    /// Parse: the packet is an IPv4 fragment (not reassembled).
    Fragment,
    /// Parse: the IPv4 protocol (carried here) is not UDP.
    NotUdp(u8),
    /// Parse: the IPv4 payload is shorter than a UDP header, or the UDP
    /// length field differs from the IPv4 payload length.
    BadUdpLength,
    /// Parse: the UDP checksum neither verifies nor is absent or partial.
    BadChecksum,
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::TooLarge { payload } => {
                write!(f, "UDP payload of {payload} bytes exceeds the IPv4 maximum")
            }
            FrameError::BufferTooSmall { need, have } => {
                write!(f, "frame needs {need} bytes, buffer has {have}")
            }
            FrameError::Truncated => write!(f, "frame shorter than the Ethernet header"),
            FrameError::NotIpv4(t) => write!(f, "ethertype {t:#06x} is not IPv4"),
            FrameError::Ipv4(e) => write!(f, "bad IPv4 header: {e}"),
            FrameError::Fragment => write!(f, "IPv4 fragment"),
            FrameError::NotUdp(p) => write!(f, "IPv4 protocol {p} is not UDP"),
            FrameError::BadUdpLength => {
                write!(f, "UDP length field inconsistent with the IPv4 payload length")
            }
            FrameError::BadChecksum => write!(f, "UDP checksum does not verify"),
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Ipv4(e) => Some(e),
            _ => None,
        }
    }
}

impl From<Ipv4Error> for FrameError {
    fn from(e: Ipv4Error) -> Self {
        FrameError::Ipv4(e)
    }
}

impl From<EtherError> for FrameError {
    fn from(e: EtherError) -> Self {
        match e {
            EtherError::Truncated => FrameError::Truncated,
        }
    }
}

/// Writes an Ethernet + IPv4 + UDP frame carrying `payload` into `out` and
/// returns its length (`UDP4_OVERHEAD + payload.len()`).
///
/// The IPv4 header has DF set and no options; the UDP checksum is complete,
/// summed during the payload copy. Short frames are not padded to the
/// Ethernet minimum of 60 bytes: the kernel or NIC pads.
pub fn build_udp4(out: &mut [u8], p: &Udp4Params, payload: &[u8]) -> Result<usize, FrameError> {
    build_udp4_with(out, p, payload, None)
}

/// [`build_udp4`] with the payload's copy supplied (the copy block's
/// choice of stores, [`crate::checksum::copy_with_checksum_via`]); `None`
/// is the ordinary fused copy.
pub fn build_udp4_with(
    out: &mut [u8],
    p: &Udp4Params,
    payload: &[u8],
    copy: Option<crate::checksum::CopyFn>,
) -> Result<usize, FrameError> {
    let ip_len = ipv4::MIN_HEADER_LEN + udp::HEADER_LEN + payload.len();
    if ip_len > usize::from(u16::MAX) {
        return Err(FrameError::TooLarge { payload: payload.len() });
    }
    let need = ether::HEADER_LEN + ip_len;
    if out.len() < need {
        return Err(FrameError::BufferTooSmall { need, have: out.len() });
    }
    let (eth, rest) = out.split_at_mut(ether::HEADER_LEN);
    let (ip, udp_out) = rest.split_at_mut(ipv4::MIN_HEADER_LEN);
    EthernetHeader { dst: p.dst_mac, src: p.src_mac, ethertype: ETHERTYPE_IPV4 }.emit(eth);
    Ipv4Header {
        header_len: ipv4::MIN_HEADER_LEN,
        tos: p.tos,
        total_len: ip_len as u16,
        ident: p.ident,
        dont_fragment: true,
        more_fragments: false,
        frag_offset: 0,
        ttl: p.ttl,
        protocol: PROTO_UDP,
        src: *p.src.ip(),
        dst: *p.dst.ip(),
    }
    .emit(ip);
    udp::build_with(
        udp_out,
        (IpAddr::V4(*p.src.ip()), p.src.port()),
        (IpAddr::V4(*p.dst.ip()), p.dst.port()),
        payload,
        copy,
    );
    Ok(need)
}

/// Parses and validates an Ethernet + IPv4 + UDP frame.
///
/// IPv4 options are skipped; fragments are rejected. Bytes after the IPv4
/// total length (Ethernet padding) are ignored.
///
/// A frame whose UDP checksum field holds exactly the folded pseudo-header
/// sum is accepted as [`UdpChecksum::Partial`], unverified. That is what a
/// Linux sender using checksum offload leaves in the field (`CHECKSUM_PARTIAL`,
/// `~csum_tcpudp_magic(saddr, daddr, len, IPPROTO_UDP, 0)`) for the device to
/// complete; a virtual device such as veth hands such kernel-built frames over
/// as they are, since they never cross a wire. Accepting them is safe enough:
/// a frame corrupted in transit would have to carry that exact value, and the
/// pseudo-header it depends on is itself covered by the IPv4 header checksum.
pub fn parse_udp4(frame: &[u8]) -> Result<Udp4Frame<'_>, FrameError> {
    let (mut f, pending) = parse_udp4_unchecked(frame)?;
    if let Some(p) = pending {
        f.checksum = p.verify(f.payload)?;
    }
    Ok(f)
}

/// As [`parse_udp4`], but the UDP checksum is left to the returned
/// [`PendingChecksum`] (`None`: the field is 0, [`UdpChecksum::Absent`]),
/// so that it can be checked while the payload is copied
/// ([`PendingChecksum::copy`]) instead of in a pass of its own. The frame's
/// `checksum` says [`UdpChecksum::Pending`] until then.
pub fn parse_udp4_unchecked(frame: &[u8]) -> Result<(Udp4Frame<'_>, Option<PendingChecksum>), FrameError> {
    let eth = EthernetHeader::parse(frame)?;
    if eth.ethertype != ETHERTYPE_IPV4 {
        return Err(FrameError::NotIpv4(eth.ethertype));
    }
    let packet = &frame[ether::HEADER_LEN..];
    let ip = Ipv4Header::parse(packet)?;
    if ip.is_fragment() {
        return Err(FrameError::Fragment);
    }
    if ip.protocol != PROTO_UDP {
        return Err(FrameError::NotUdp(ip.protocol));
    }
    let datagram = &packet[ip.header_len..usize::from(ip.total_len)];
    if datagram.len() < udp::HEADER_LEN {
        return Err(FrameError::BadUdpLength);
    }
    let h = udp::UdpHeader::parse(datagram).map_err(|_| FrameError::BadUdpLength)?;
    // A length shorter than the IPv4 payload trims the datagram, as the
    // kernel's UDP receive does; a longer one cannot be right.
    if usize::from(h.length) < udp::HEADER_LEN || usize::from(h.length) > datagram.len() {
        return Err(FrameError::BadUdpLength);
    }
    let datagram = &datagram[..usize::from(h.length)];
    let pending = (h.checksum != 0).then(|| {
        let mut pseudo = Checksum::new();
        udp::add_pseudo_header(&mut pseudo, IpAddr::V4(ip.src), IpAddr::V4(ip.dst), u32::from(h.length));
        let mut acc = pseudo;
        acc.add(&datagram[..udp::HEADER_LEN]);
        PendingChecksum { acc, field: h.checksum, pseudo: pseudo.fold() }
    });
    let checksum = if pending.is_some() { UdpChecksum::Pending } else { UdpChecksum::Absent };
    let f = Udp4Frame {
        src_mac: eth.src,
        dst_mac: eth.dst,
        src: SocketAddrV4::new(ip.src, h.src_port),
        dst: SocketAddrV4::new(ip.dst, h.dst_port),
        tos: ip.tos,
        ttl: ip.ttl,
        checksum,
        payload: &datagram[udp::HEADER_LEN..],
    };
    Ok((f, pending))
}

/// The UDP destination port of an IPv4 frame, for demultiplexing before the
/// full [`parse_udp4`].
///
/// Checks only what reading the port needs: ethertype IPv4, version 4, a
/// sane IHL, protocol UDP, not a fragment, and bounds. No checksum or length
/// field is validated. Returns `None` otherwise.
pub fn udp4_port(frame: &[u8]) -> Option<u16> {
    let packet = frame.get(ether::HEADER_LEN..)?;
    if frame[12..14] != ETHERTYPE_IPV4.to_be_bytes() || packet.len() < ipv4::MIN_HEADER_LEN {
        return None;
    }
    let header_len = usize::from(packet[0] & 0x0f) * 4;
    if packet[0] >> 4 != 4 || header_len < ipv4::MIN_HEADER_LEN || packet[9] != PROTO_UDP {
        return None;
    }
    let flags_frag = u16::from_be_bytes([packet[6], packet[7]]);
    if flags_frag & (ipv4::FLAG_MF | ipv4::FRAG_OFFSET_MASK) != 0 {
        return None;
    }
    let port = packet.get(header_len + 2..header_len + 4)?;
    Some(u16::from_be_bytes([port[0], port[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAX_UDP_PAYLOAD_V4;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    const ETH: usize = ether::HEADER_LEN;
    const IP: usize = ETH + ipv4::MIN_HEADER_LEN;

    fn params() -> Udp4Params {
        Udp4Params {
            src_mac: MacAddr([0x02, 0, 0, 0, 0, 0x01]),
            dst_mac: MacAddr([0x02, 0, 0, 0, 0, 0x02]),
            src: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 5000),
            dst: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 6000),
            tos: 0,
            ttl: 64,
            ident: 0x1234,
        }
    }

    /// Deterministic filler (xorshift), so payloads are not all one value.
    fn filler(n: usize, seed: u32) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect()
    }

    fn build(p: &Udp4Params, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; UDP4_OVERHEAD + payload.len()];
        let n = build_udp4(&mut out, p, payload).unwrap();
        assert_eq!(n, out.len());
        out
    }

    /// Straightforward RFC 1071 sum, independent of `crate::checksum`:
    /// 16-bit big-endian words, odd byte padded with zero, folded.
    fn rfc1071_fold(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            let hi = u32::from(c[0]) << 8;
            let lo = c.get(1).map_or(0, |&b| u32::from(b));
            sum += hi | lo;
        }
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// The IPv4 pseudo-header of a UDP datagram, as bytes.
    fn pseudo_header(f: &[u8]) -> Vec<u8> {
        let ihl = usize::from(f[ETH] & 0x0f) * 4;
        let udp_len = &f[ETH + ihl + 4..ETH + ihl + 6];
        let mut p = f[ETH + 12..ETH + 20].to_vec();
        p.extend_from_slice(&[0, 17]);
        p.extend_from_slice(udp_len);
        p
    }

    /// Recomputes the IPv4 header checksum after a test edits the header.
    fn fix_ip_checksum(f: &mut [u8]) {
        let ihl = usize::from(f[ETH] & 0x0f) * 4;
        f[ETH + 10] = 0;
        f[ETH + 11] = 0;
        let c = !rfc1071_fold(&f[ETH..ETH + ihl]);
        f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
    }

    /// Recomputes the UDP checksum after a test edits the datagram.
    fn fix_udp_checksum(f: &mut [u8]) {
        let ihl = usize::from(f[ETH] & 0x0f) * 4;
        let u = ETH + ihl;
        let total = usize::from(u16::from_be_bytes([f[ETH + 2], f[ETH + 3]]));
        f[u + 6] = 0;
        f[u + 7] = 0;
        let mut all = pseudo_header(f);
        all.extend_from_slice(&f[u..ETH + total]);
        let c = !rfc1071_fold(&all);
        f[u + 6..u + 8].copy_from_slice(&(if c == 0 { 0xffff } else { c }).to_be_bytes());
    }

    fn check_round_trip(p: &Udp4Params, payload: &[u8]) -> Result<(), TestCaseError> {
        let f = build(p, payload);
        let parsed = parse_udp4(&f).unwrap();
        prop_assert_eq!(parsed.src_mac, p.src_mac);
        prop_assert_eq!(parsed.dst_mac, p.dst_mac);
        prop_assert_eq!(parsed.src, p.src);
        prop_assert_eq!(parsed.dst, p.dst);
        prop_assert_eq!(parsed.tos, p.tos);
        prop_assert_eq!(parsed.ttl, p.ttl);
        prop_assert_eq!(parsed.checksum, UdpChecksum::Verified);
        prop_assert_eq!(parsed.payload, payload);
        prop_assert_eq!(udp4_port(&f), Some(p.dst.port()));
        // The header fields build_udp4 fixes: DF, no fragment, UDP.
        prop_assert_eq!(&f[ETH + 6..ETH + 8], &[0x40, 0][..]);
        prop_assert_eq!(f[ETH + 9], 17);
        prop_assert_eq!(u16::from_be_bytes([f[ETH + 4], f[ETH + 5]]), p.ident);
        Ok(())
    }

    #[test]
    fn round_trip_sizes() {
        for (i, n) in [0, 1, 7, 1472, 8972, MAX_UDP_PAYLOAD_V4].into_iter().enumerate() {
            check_round_trip(&params(), &filler(n, i as u32 + 7)).unwrap();
        }
        assert_eq!(MAX_UDP_PAYLOAD_V4, 65535 - 28);
    }

    #[test]
    fn build_errors() {
        let p = params();
        let big = vec![0u8; MAX_UDP_PAYLOAD_V4 + 1];
        let mut out = vec![0u8; UDP4_OVERHEAD + big.len()];
        assert_eq!(build_udp4(&mut out, &p, &big), Err(FrameError::TooLarge { payload: MAX_UDP_PAYLOAD_V4 + 1 }));
        let mut short = [0u8; UDP4_OVERHEAD + 4];
        assert_eq!(
            build_udp4(&mut short, &p, b"hello"),
            Err(FrameError::BufferTooSmall { need: UDP4_OVERHEAD + 5, have: UDP4_OVERHEAD + 4 })
        );
        // A larger buffer is fine; the frame length is returned.
        let mut roomy = [0xaau8; 100];
        assert_eq!(build_udp4(&mut roomy, &p, b"hello"), Ok(UDP4_OVERHEAD + 5));
        assert_eq!(roomy[UDP4_OVERHEAD + 5], 0xaa);
    }

    #[test]
    fn known_frame() {
        let f = build(&params(), b"hello");
        #[rustfmt::skip]
        let expected: [u8; 47] = [
            // Ethernet: dst, src, ethertype IPv4.
            0x02, 0, 0, 0, 0, 0x02,  0x02, 0, 0, 0, 0, 0x01,  0x08, 0x00,
            // IPv4: version/IHL, TOS, total length 33, ident, DF, TTL 64,
            // UDP, checksum (hand-computed), 198.18.0.1, 198.18.0.2.
            0x45, 0x00, 0x00, 0x21,  0x12, 0x34, 0x40, 0x00,
            0x40, 0x11, 0x9c, 0x70,  198, 18, 0, 1,  198, 18, 0, 2,
            // UDP: 5000, 6000, length 13, checksum (hand-computed), "hello".
            0x13, 0x88, 0x17, 0x70,  0x00, 0x0d, 0x04, 0xe2,
            b'h', b'e', b'l', b'l', b'o',
        ];
        assert_eq!(f[..], expected[..]);
        // Both checksums verify with the independent sum.
        assert_eq!(rfc1071_fold(&f[ETH..IP]), 0xffff);
        let mut udp_sum = pseudo_header(&f);
        udp_sum.extend_from_slice(&f[IP..]);
        assert_eq!(rfc1071_fold(&udp_sum), 0xffff);
        // The pseudo-header alone folds to 0x8c46 (used by the Partial test).
        assert_eq!(rfc1071_fold(&pseudo_header(&f)), 0x8c46);
        let parsed = parse_udp4(&f).unwrap();
        assert_eq!(parsed.payload, b"hello");
        assert_eq!(parsed.checksum, UdpChecksum::Verified);
    }

    #[test]
    fn truncated_at_every_length() {
        let f = build(&params(), b"hello");
        for n in 0..f.len() {
            let want = if n < ETH {
                FrameError::Truncated
            } else if n < IP {
                FrameError::Ipv4(Ipv4Error::Truncated)
            } else {
                // The total length field (33) runs past the buffer.
                FrameError::Ipv4(Ipv4Error::BadTotalLen)
            };
            assert_eq!(parse_udp4(&f[..n]), Err(want), "length {n}");
            if n < IP + 4 {
                assert_eq!(udp4_port(&f[..n]), None, "length {n}");
            }
        }
    }

    #[test]
    fn not_ipv4() {
        for t in [ether::ETHERTYPE_IPV6, ether::ETHERTYPE_ARP, 0x8100] {
            let mut f = build(&params(), b"hello");
            f[12..14].copy_from_slice(&t.to_be_bytes());
            assert_eq!(parse_udp4(&f), Err(FrameError::NotIpv4(t)));
            assert_eq!(udp4_port(&f), None);
        }
    }

    #[test]
    fn ipv4_header_errors() {
        let good = build(&params(), b"hello");
        let mut v6 = good.clone();
        v6[ETH] = 0x65;
        assert_eq!(parse_udp4(&v6), Err(FrameError::Ipv4(Ipv4Error::NotVersion4)));
        assert_eq!(udp4_port(&v6), None);
        let mut short_ihl = good.clone();
        short_ihl[ETH] = 0x44;
        fix_ip_checksum(&mut short_ihl);
        assert_eq!(parse_udp4(&short_ihl), Err(FrameError::Ipv4(Ipv4Error::BadHeaderLen)));
        assert_eq!(udp4_port(&short_ihl), None);
        let mut long_ihl = good.clone();
        long_ihl[ETH] = 0x4f; // 60 bytes; the packet has 33
        assert_eq!(parse_udp4(&long_ihl), Err(FrameError::Ipv4(Ipv4Error::BadHeaderLen)));
        let mut total = good.clone();
        total[ETH + 3] = 19;
        fix_ip_checksum(&mut total);
        assert_eq!(parse_udp4(&total), Err(FrameError::Ipv4(Ipv4Error::BadTotalLen)));
        let mut sum = good.clone();
        sum[ETH + 8] -= 1; // TTL changed, checksum not updated
        assert_eq!(parse_udp4(&sum), Err(FrameError::Ipv4(Ipv4Error::BadChecksum)));
    }

    #[test]
    fn ip_options_accepted() {
        let f = build(&params(), b"hello");
        let mut o = f[..IP].to_vec();
        o.extend_from_slice(&[1, 1, 1, 0]); // NOP, NOP, NOP, end of options
        o.extend_from_slice(&f[IP..]);
        o[ETH] = 0x46;
        o[ETH + 3] += 4;
        fix_ip_checksum(&mut o);
        // The pseudo-header excludes options, so the UDP checksum still holds.
        let parsed = parse_udp4(&o).unwrap();
        assert_eq!(parsed.payload, b"hello");
        assert_eq!(parsed.checksum, UdpChecksum::Verified);
        assert_eq!(parsed.dst, params().dst);
        assert_eq!(udp4_port(&o), Some(6000));
    }

    #[test]
    fn fragments_rejected() {
        let good = build(&params(), b"hello");
        let mut mf = good.clone();
        mf[ETH + 6] |= 0x20;
        fix_ip_checksum(&mut mf);
        assert_eq!(parse_udp4(&mf), Err(FrameError::Fragment));
        assert_eq!(udp4_port(&mf), None);
        let mut off = good.clone();
        off[ETH + 6] = 0x00;
        off[ETH + 7] = 0x01;
        fix_ip_checksum(&mut off);
        assert_eq!(parse_udp4(&off), Err(FrameError::Fragment));
        assert_eq!(udp4_port(&off), None);
        // DF alone, or cleared, is not a fragment.
        let mut no_df = good;
        no_df[ETH + 6] = 0;
        fix_ip_checksum(&mut no_df);
        assert!(parse_udp4(&no_df).is_ok());
    }

    #[test]
    fn not_udp() {
        let mut f = build(&params(), b"hello");
        f[ETH + 9] = 6;
        fix_ip_checksum(&mut f);
        assert_eq!(parse_udp4(&f), Err(FrameError::NotUdp(6)));
        assert_eq!(udp4_port(&f), None);
    }

    #[test]
    fn udp_length_errors() {
        let good = build(&params(), b"hello");
        // A length field shorter than the IPv4 payload (13) trims it, as
        // the kernel does (checksum 0: none to verify).
        for l in [8u16, 12] {
            let mut f = good.clone();
            f[IP + 4..IP + 6].copy_from_slice(&l.to_be_bytes());
            f[IP + 6..IP + 8].copy_from_slice(&[0, 0]);
            let p = parse_udp4(&f).expect("trimmed");
            assert_eq!(p.payload, &b"hello"[..usize::from(l) - 8], "length {l}");
            assert_eq!(p.checksum, UdpChecksum::Absent);
        }
        // Longer than the payload, or shorter than the header.
        for l in [14u16, 7, 0] {
            let mut f = good.clone();
            f[IP + 4..IP + 6].copy_from_slice(&l.to_be_bytes());
            fix_udp_checksum(&mut f);
            assert_eq!(parse_udp4(&f), Err(FrameError::BadUdpLength), "length {l}");
        }
        // An IPv4 payload too short for the UDP header.
        let mut tiny = good[..IP + 4].to_vec();
        tiny[ETH + 3] = 24;
        fix_ip_checksum(&mut tiny);
        assert_eq!(parse_udp4(&tiny), Err(FrameError::BadUdpLength));
        assert_eq!(udp4_port(&tiny), Some(6000), "the peek checks bounds only");
    }

    #[test]
    fn udp_checksum_states() {
        let good = build(&params(), b"hello");
        let mut flipped = good.clone();
        flipped[UDP4_OVERHEAD + 2] ^= 0x04;
        assert_eq!(parse_udp4(&flipped), Err(FrameError::BadChecksum));

        let mut absent = flipped.clone();
        absent[IP + 6..IP + 8].copy_from_slice(&[0, 0]);
        assert_eq!(parse_udp4(&absent).unwrap().checksum, UdpChecksum::Absent);

        // CHECKSUM_PARTIAL: the field holds the folded pseudo-header sum,
        // uncomplemented (0x8c46 here, derived by hand in `known_frame`).
        let mut partial = good.clone();
        partial[IP + 6..IP + 8].copy_from_slice(&0x8c46u16.to_be_bytes());
        let p = parse_udp4(&partial).unwrap();
        assert_eq!(p.checksum, UdpChecksum::Partial);
        assert_eq!(p.payload, b"hello");
        // Its complement, or any other value, is rejected.
        for v in [!0x8c46u16, 0x8c47, 0x8c45] {
            let mut f = good.clone();
            f[IP + 6..IP + 8].copy_from_slice(&v.to_be_bytes());
            assert_eq!(parse_udp4(&f), Err(FrameError::BadChecksum), "field {v:#06x}");
        }
    }

    #[test]
    fn partial_for_other_frames() {
        for (i, n) in [0usize, 1, 2, 3, 999, 1472].into_iter().enumerate() {
            let mut p = params();
            p.src = SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, i as u8), 40000 + i as u16);
            let mut f = build(&p, &filler(n, 99 + i as u32));
            let v = rfc1071_fold(&pseudo_header(&f));
            f[IP + 6..IP + 8].copy_from_slice(&v.to_be_bytes());
            assert_eq!(parse_udp4(&f).unwrap().checksum, UdpChecksum::Partial, "payload {n}");
        }
    }

    #[test]
    fn padding_ignored() {
        let f = build(&params(), b"h");
        assert_eq!(f.len(), 43);
        let mut padded = f.clone();
        padded.resize(60, 0xee);
        let p = parse_udp4(&padded).unwrap();
        assert_eq!(p.payload, b"h");
        assert_eq!(p.checksum, UdpChecksum::Verified);
        assert_eq!(udp4_port(&padded), Some(6000));
    }

    #[test]
    fn error_display() {
        let e = FrameError::Ipv4(Ipv4Error::BadChecksum);
        assert!(e.to_string().contains("IPv4"));
        assert!(std::error::Error::source(&e).is_some());
        assert_eq!(FrameError::NotIpv4(0x86dd).to_string(), "ethertype 0x86dd is not IPv4");
        let small = FrameError::BufferTooSmall { need: 47, have: 46 };
        assert_eq!(small.to_string(), "frame needs 47 bytes, buffer has 46");
    }

    fn arb_params() -> impl Strategy<Value = Udp4Params> {
        (any::<[u8; 6]>(), any::<[u8; 6]>(), any::<(u32, u16)>(), any::<(u32, u16)>(), any::<(u8, u8, u16)>()).prop_map(
            |(sm, dm, s, d, (tos, ttl, ident))| Udp4Params {
                src_mac: MacAddr(sm),
                dst_mac: MacAddr(dm),
                src: SocketAddrV4::new(Ipv4Addr::from(s.0), s.1),
                dst: SocketAddrV4::new(Ipv4Addr::from(d.0), d.1),
                tos,
                ttl,
                ident,
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn round_trip(p in arb_params(), payload in proptest::collection::vec(any::<u8>(), 0..2000)) {
            check_round_trip(&p, &payload)?;
        }

        #[test]
        fn never_panics_on_arbitrary_bytes(b in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = parse_udp4(&b);
            let _ = udp4_port(&b);
        }

        #[test]
        fn never_panics_on_mutations(
            p in arb_params(),
            payload in proptest::collection::vec(any::<u8>(), 0..64),
            flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..6),
            cut in any::<prop::sample::Index>(),
            truncate: bool,
            pad in 0usize..20,
        ) {
            let mut f = build(&p, &payload);
            for (at, x) in &flips {
                let i = at.index(f.len());
                f[i] ^= x;
            }
            if truncate {
                f.truncate(cut.index(f.len() + 1));
            }
            f.resize(f.len() + pad, 0);
            let parsed = parse_udp4(&f);
            let port = udp4_port(&f);
            // The peek agrees with the full parse whenever the parse succeeds.
            if let Ok(u) = parsed {
                prop_assert_eq!(port, Some(u.dst.port()));
            }
            // Checking while copying gives the same verdict and the payload.
            let fused = parse_udp4_unchecked(&f).and_then(|(u, pending)| {
                let mut dst = vec![0u8; u.payload.len()];
                let c = match pending {
                    Some(p) => p.copy(&mut dst, u.payload)?,
                    None => UdpChecksum::Absent,
                };
                assert_copied(&dst, u.payload);
                Ok(Udp4Frame { checksum: c, ..u })
            });
            prop_assert_eq!(fused, parse_udp4(&f));
        }
    }

    /// The copy of a payload equals the payload (a panic is a failure).
    fn assert_copied(a: &[u8], b: &[u8]) {
        assert_eq!(a, b, "copied payload differs");
    }

    #[test]
    fn a_bad_checksum_is_found_while_copying() {
        let mut f = build(&params(), b"hello, fused world");
        let (u, pending) = parse_udp4_unchecked(&f).unwrap();
        assert_eq!(u.checksum, UdpChecksum::Pending);
        let mut dst = [0u8; 32];
        assert_eq!(pending.unwrap().copy(&mut dst, u.payload), Ok(UdpChecksum::Verified));
        let last = f.len() - 1;
        f[last] ^= 0x40;
        let (u, pending) = parse_udp4_unchecked(&f).unwrap();
        assert_eq!(pending.unwrap().copy(&mut dst, u.payload), Err(FrameError::BadChecksum));
        assert_eq!(parse_udp4(&f), Err(FrameError::BadChecksum));
    }
}
