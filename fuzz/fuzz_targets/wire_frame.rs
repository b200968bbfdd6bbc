//! An AF_XDP frame as the xdp transport receives it: any bytes parse to a
//! frame or an error, never a panic; a frame that parses is rebuilt with
//! the same fields and parses back to itself.
#![no_main]

use eudp_wire::frame::{self, Udp4Params, UdpChecksum};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let checked = frame::parse_udp4(data);
    let port = frame::udp4_port(data);
    let Ok((f, pending)) = frame::parse_udp4_unchecked(data) else {
        assert!(checked.is_err(), "the checked parse accepted what the unchecked one refused");
        return;
    };
    assert_eq!(port, Some(f.dst.port()));
    // The fused copy-and-verify agrees with verifying in place.
    let mut copy = vec![0u8; f.payload.len()];
    let fused = match pending {
        Some(p) => p.copy(&mut copy, f.payload),
        None => {
            copy.copy_from_slice(f.payload);
            Ok(UdpChecksum::Absent)
        }
    };
    assert_eq!(copy, f.payload);
    assert_eq!(fused, checked.map(|c| c.checksum));
    if fused.is_err() {
        return;
    }
    // Rebuilt with the parsed fields, the frame parses back to them with a full checksum.
    let params =
        Udp4Params { src_mac: f.src_mac, dst_mac: f.dst_mac, src: f.src, dst: f.dst, tos: f.tos, ttl: f.ttl, ident: 1 };
    let mut out = vec![0u8; data.len() + 64];
    let n = frame::build_udp4(&mut out, &params, f.payload).expect("a parsed payload fits a frame again");
    let back = frame::parse_udp4(&out[..n]).expect("a built frame parses");
    assert_eq!(back.payload, f.payload);
    assert_eq!((back.src, back.dst, back.tos, back.ttl), (f.src, f.dst, f.tos, f.ttl));
    assert_eq!(back.checksum, UdpChecksum::Verified);
});
