//! Properties of the UDP-over-TCP stream format: what a sender encodes the
//! decoder gives back, however the stream is cut into reads, and no input
//! makes it panic.

use eudp_wire::uot::{self, Decoder, Event, FrameError, HEADER_LEN, MAX_PAYLOAD, RUN_HEADER_LEN};
use proptest::prelude::*;

/// One unit a sender writes: a frame, or a run of equal-size datagrams.
#[derive(Clone, Debug)]
enum Unit {
    Frame { src: u16, dst: u16, payload: Vec<u8> },
    Run { src: u16, dst: u16, seg: usize, data: Vec<u8> },
}

fn unit() -> impl Strategy<Value = Unit> {
    let frame = (any::<u16>(), 1..=u16::MAX, prop::collection::vec(any::<u8>(), 0..300))
        .prop_map(|(src, dst, payload)| Unit::Frame { src, dst, payload });
    let run = (any::<u16>(), 1..=u16::MAX, 1usize..200, 1usize..6).prop_flat_map(|(src, dst, seg, count)| {
        prop::collection::vec(any::<u8>(), seg * count).prop_map(move |data| Unit::Run { src, dst, seg, data })
    });
    prop_oneof![frame, run]
}

/// A large frame now and then, so that a unit outgrows a read.
fn big_unit() -> impl Strategy<Value = Unit> {
    (any::<u16>(), 1..=u16::MAX, prop_oneof![Just(MAX_PAYLOAD), 1000usize..5000])
        .prop_map(|(src, dst, n)| Unit::Frame { src, dst, payload: (0..n).map(|i| i as u8).collect() })
}

type Datagram = (u16, u16, Vec<u8>);

/// The bytes of `units` (no hello) and the datagrams they carry.
fn encode(units: &[Unit]) -> (Vec<u8>, Vec<Datagram>) {
    let (mut wire, mut want) = (Vec::new(), Vec::new());
    for u in units {
        match u {
            Unit::Frame { src, dst, payload } => {
                wire.extend_from_slice(&uot::header(*src, *dst, payload.len()));
                wire.extend_from_slice(payload);
                want.push((*src, *dst, payload.clone()));
            }
            Unit::Run { src, dst, seg, data } => {
                let count = (data.len() / seg) as u16;
                wire.extend_from_slice(&uot::run_header(*src, *dst, count, *seg));
                wire.extend_from_slice(data);
                want.extend(data.chunks(*seg).map(|d| (*src, *dst, d.to_vec())));
            }
        }
    }
    (wire, want)
}

/// What the decoder yields for `bytes` cut at `cuts` (positions in any
/// order; out of range ones are ignored): the datagrams, the hello's lane,
/// and the error that ended the stream, if any.
fn decode_cut(bytes: &[u8], cuts: &[usize]) -> (Vec<Datagram>, Option<u8>, Option<FrameError>) {
    let mut at: Vec<usize> = cuts.iter().copied().filter(|&c| c <= bytes.len()).collect();
    at.push(0);
    at.push(bytes.len());
    at.sort_unstable();
    at.dedup();
    let mut d = Decoder::new();
    let (mut got, mut lane) = (Vec::new(), None);
    for w in at.windows(2) {
        let r = d.feed(&bytes[w[0]..w[1]], &mut |e| match e {
            Event::Hello(l) => lane = Some(l),
            Event::Frame { src, dst, payload } => got.push((src, dst, payload.to_vec())),
        });
        if let Err(e) = r {
            return (got, lane, Some(e));
        }
        assert!(d.pending() <= Decoder::max_buffer());
    }
    (got, lane, None)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn hello_round_trips(lane in any::<u8>()) {
        prop_assert_eq!(uot::parse_hello(&uot::hello(lane)), Ok(lane));
    }

    #[test]
    fn every_unit_round_trips(lane in any::<u8>(), units in prop::collection::vec(unit(), 0..12)) {
        let (body, want) = encode(&units);
        let mut wire = uot::hello(lane).to_vec();
        wire.extend_from_slice(&body);
        let (got, seen, e) = decode_cut(&wire, &[]);
        prop_assert_eq!(e, None);
        prop_assert_eq!(seen, Some(lane));
        prop_assert_eq!(&got, &want);
        // What a sender queued is walked back the same way.
        let mut walked = Vec::new();
        prop_assert_eq!(uot::each_queued(&body, |s, d, p| walked.push((s, d, p.to_vec()))), body.len());
        prop_assert_eq!(walked, want);
    }

    #[test]
    fn any_cut_gives_the_same_events(
        lane in any::<u8>(),
        units in prop::collection::vec(prop_oneof![8 => unit(), 1 => big_unit()], 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..40),
    ) {
        let (body, want) = encode(&units);
        let mut wire = uot::hello(lane).to_vec();
        wire.extend_from_slice(&body);
        let cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        let (got, seen, e) = decode_cut(&wire, &cuts);
        prop_assert_eq!(e, None);
        prop_assert_eq!(seen, Some(lane));
        prop_assert_eq!(got, want);
    }

    #[test]
    fn a_cut_stream_yields_whole_datagrams_only(
        units in prop::collection::vec(unit(), 1..6),
        keep in any::<prop::sample::Index>(),
    ) {
        let (body, want) = encode(&units);
        let mut wire = uot::hello(0).to_vec();
        wire.extend_from_slice(&body);
        let end = keep.index(wire.len());
        let (got, _, e) = decode_cut(&wire[..end], &[]);
        prop_assert_eq!(e, None);
        prop_assert!(got.len() <= want.len());
        prop_assert_eq!(&got[..], &want[..got.len()]);
    }

    #[test]
    fn garbage_never_panics(
        hello in any::<bool>(),
        junk in prop::collection::vec(any::<u8>(), 0..2000),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..20),
    ) {
        let mut wire = if hello { uot::hello(1).to_vec() } else { Vec::new() };
        wire.extend_from_slice(&junk);
        let cuts: Vec<usize> = cuts.iter().map(|i| i.index(wire.len() + 1)).collect();
        // An error, or datagrams and a need for more; the kept bytes stay
        // bounded (checked in `decode_cut`).
        let (got, lane, e) = decode_cut(&wire, &cuts);
        for (_, dst, p) in &got {
            prop_assert!(*dst != 0 && p.len() <= MAX_PAYLOAD);
        }
        prop_assert!(got.is_empty() || lane.is_some());
        if hello {
            prop_assert_eq!(lane, Some(1));
        }
        if !hello && e.is_none() {
            prop_assert!(wire.len() < uot::HELLO_LEN || lane.is_some());
        }
    }

    #[test]
    fn garbage_headers_are_refused_or_awaited(
        src in any::<u16>(),
        dst in any::<u16>(),
        len in any::<u16>(),
        tail in prop::collection::vec(any::<u8>(), 0..RUN_HEADER_LEN),
    ) {
        let mut wire = uot::hello(0).to_vec();
        wire.extend_from_slice(&src.to_be_bytes());
        wire.extend_from_slice(&dst.to_be_bytes());
        wire.extend_from_slice(&len.to_be_bytes());
        wire.extend_from_slice(&tail);
        let (got, _, e) = decode_cut(&wire, &[uot::HELLO_LEN + HEADER_LEN / 2]);
        match e {
            Some(FrameError::Malformed) => prop_assert!(dst == 0 || len == uot::RUN_MARK),
            Some(FrameError::Oversized) => prop_assert!(len as usize > MAX_PAYLOAD),
            Some(FrameError::BadHello) => prop_assert!(false, "the hello is valid"),
            None => prop_assert!(dst != 0 && got.iter().all(|g| g.0 == src && g.1 == dst)),
        }
    }
}
