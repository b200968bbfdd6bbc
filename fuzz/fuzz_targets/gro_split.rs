//! GRO super-packets into the receive ring and datagrams out of it: any
//! message length and segment size gives back exactly the message's bytes,
//! cut at the segment size (the last piece shorter), never past the ring's
//! byte bound, and a truncating read reports the datagram's full length.
#![no_main]

use eudp_engine::ring::RecvRing;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let capacity = usize::from(u16::from_le_bytes([data[0], data[1]])) * 4;
    let out_len = usize::from(data[2]) * 8;
    let mut ring = RecvRing::new(capacity);
    let mut expect: Vec<Vec<u8>> = Vec::new();
    let mut rest = &data[3..];
    // Messages: [segment byte, length byte, bytes...].
    while rest.len() >= 2 {
        let seg = usize::from(rest[0]) + 1;
        let len = usize::from(rest[1]).min(rest.len() - 2);
        let msg = rest[2..2 + len].to_vec();
        rest = &rest[2 + len..];
        let (before, was_empty) = (ring.datagrams(), ring.is_empty());
        match ring.push(msg.clone(), Some(seg), None) {
            Ok(n) => {
                assert_eq!(
                    n,
                    if msg.is_empty() { 1 } else { msg.len().div_ceil(seg) },
                    "datagrams cut from {len} at {seg}"
                );
                assert_eq!(ring.datagrams(), before + n);
                // The byte bound holds, but an empty ring takes any one message.
                assert!(was_empty || ring.charged() <= capacity, "over the bound");
                if msg.is_empty() {
                    expect.push(Vec::new());
                } else {
                    expect.extend(msg.chunks(seg).map(<[u8]>::to_vec));
                }
            }
            Err(_) => assert_eq!(ring.datagrams(), before, "a dropped message leaves the ring as it was"),
        }
    }
    let mut out = vec![0u8; out_len];
    for (i, want) in expect.iter().enumerate() {
        let d = ring.pop_into(&mut out, false, None).unwrap_or_else(|| panic!("datagram {i} missing"));
        assert_eq!(d.len, want.len(), "datagram {i}'s length");
        assert_eq!(&out[..d.copied], &want[..d.copied], "datagram {i}'s bytes");
        assert_eq!(d.copied, want.len().min(out_len));
    }
    assert!(ring.is_empty() && ring.pop_into(&mut out, false, None).is_none());
});
