//! Each header parser alone over any bytes: an error or a header that
//! emits back to the bytes it came from.
#![no_main]

use eudp_wire::ether::{self, EthernetHeader};
use eudp_wire::ipv4::Ipv4Header;
use eudp_wire::udp::{self, UdpHeader};
use libfuzzer_sys::fuzz_target;
use std::net::{IpAddr, Ipv4Addr};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = EthernetHeader::parse(data) {
        let mut out = [0u8; ether::HEADER_LEN];
        h.emit(&mut out);
        assert_eq!(&out[..], &data[..ether::HEADER_LEN]);
    }
    if let Ok(h) = Ipv4Header::parse(data) {
        assert!(h.header_len >= 20 && h.header_len <= data.len());
        assert!(usize::from(h.total_len) <= data.len() && usize::from(h.total_len) >= h.header_len);
        if h.header_len == 20 {
            // The parser checks the total length against the buffer: give it the whole packet.
            let mut out = data[..usize::from(h.total_len)].to_vec();
            h.emit(&mut out);
            assert_eq!(
                Ipv4Header::parse(&out).as_ref().map(|b| (b.src, b.dst, b.total_len, b.protocol)).ok(),
                Some((h.src, h.dst, h.total_len, h.protocol))
            );
        }
    }
    if let Ok(h) = UdpHeader::parse(data) {
        let mut out = [0u8; udp::HEADER_LEN];
        h.emit(&mut out);
        assert_eq!(&out[..], &data[..udp::HEADER_LEN]);
    }
    // A datagram built around these bytes verifies; one flipped bit does not.
    let (src, dst) = (IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), IpAddr::V4(Ipv4Addr::new(198, 18, 0, 2)));
    let payload = &data[..data.len().min(2048)];
    let mut dgram = vec![0u8; udp::HEADER_LEN + payload.len()];
    let n = udp::build(&mut dgram, (src, 1), (dst, 2), payload);
    assert_eq!(udp::verify(&dgram[..n], src, dst), Ok(true));
    if !payload.is_empty() {
        dgram[udp::HEADER_LEN] ^= 0x01;
        assert_ne!(udp::verify(&dgram[..n], src, dst), Ok(true));
    }
});
