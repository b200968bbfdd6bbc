//! Properties of the EMP frame format: what is encoded parses back to the
//! same frame, and no input makes the parser panic.

use eudp_wire::emp::{self, Control, Data, DataHeader, Frame, DATA_HEADER_LEN, MAX_MESSAGE};
use proptest::prelude::*;

/// A valid DATA frame: a payload placed somewhere inside a message.
fn data() -> impl Strategy<Value = (DataHeader, Vec<u8>)> {
    (
        any::<u32>(),
        any::<u32>(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 1..600),
        0u32..MAX_MESSAGE,
        any::<u32>(),
    )
        .prop_map(|(epoch, seq, tag, payload, offset, extra)| {
            let offset = offset.min(MAX_MESSAGE - payload.len() as u32);
            let end = offset + payload.len() as u32;
            let msg_len = end + extra % (MAX_MESSAGE - end + 1);
            (DataHeader { epoch, seq, tag, msg_len, offset }, payload)
        })
}

proptest! {
    #[test]
    fn data_round_trips((h, payload) in data()) {
        let mut buf = vec![0u8; DATA_HEADER_LEN + payload.len()];
        let n = emp::encode(&Frame::Data(Data { header: h, ack: None, payload: &payload }), &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(emp::parse(&buf), Ok(Frame::Data(Data { header: h, ack: None, payload: &payload })));
    }

    #[test]
    fn data_with_an_acknowledgment_round_trips(
        (h, payload) in data(),
        epoch in any::<u32>(),
        next in any::<u32>(),
        window in any::<u32>(),
        sack in prop_oneof![Just(0u64), any::<u64>()],
    ) {
        let ack = Some(Control { epoch, next, window, sack });
        let frame = Frame::Data(Data { header: h, ack, payload: &payload });
        let mut buf = vec![0u8; DATA_HEADER_LEN + emp::piggyback_len(ack.as_ref()) + payload.len()];
        let n = emp::encode(&frame, &mut buf).unwrap();
        prop_assert_eq!(n, buf.len());
        prop_assert_eq!(emp::parse(&buf), Ok(frame));
    }

    #[test]
    fn control_round_trips(
        epoch in any::<u32>(),
        next in any::<u32>(),
        window in any::<u32>(),
        nak in any::<bool>(),
        sack in prop_oneof![Just(0u64), any::<u64>()],
    ) {
        let c = Control { epoch, next, window, sack };
        let mut buf = [0u8; 64];
        let n = emp::encode_control(&c, nak, &mut buf).unwrap();
        prop_assert_eq!(n, emp::control_len(&c));
        let want = if nak { Frame::Nak(c) } else { Frame::Ack(c) };
        prop_assert_eq!(emp::parse(&buf[..n]), Ok(want));
    }

    #[test]
    fn any_bytes_parse_or_fail_without_panic(bytes in prop::collection::vec(any::<u8>(), 0..100), head in any::<bool>()) {
        let mut b = bytes;
        if head && b.len() >= 4 {
            // Past the magic and version, so the deeper checks are reached.
            b[..3].copy_from_slice(b"EM\x01");
            b[3] %= 4;
            // Flags that a control frame may carry, now and then; a data
            // frame's acknowledgment flags other times.
            if b.len() >= 5 && b[4] % 2 == 0 {
                b[4] &= 4;
            } else if b.len() >= 5 && b[4] % 3 == 0 {
                b[4] &= 15;
            }
        }
        if let Ok(f) = emp::parse(&b) {
            let mut out = vec![0u8; b.len()];
            let n = emp::encode(&f, &mut out).unwrap();
            prop_assert_eq!(&out[..n], &b[..]);
        }
    }
}

#[test]
fn the_empty_message_is_one_first_and_last_frame() {
    let h = DataHeader { epoch: 1, seq: 0, tag: 5, msg_len: 0, offset: 0 };
    let mut buf = [0u8; DATA_HEADER_LEN];
    emp::encode_data_header(&h, 0, &mut buf).unwrap();
    let Ok(Frame::Data(d)) = emp::parse(&buf) else { panic!("not data") };
    assert!(d.first() && d.last() && d.payload.is_empty());
}
