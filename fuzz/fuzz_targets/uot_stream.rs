//! A UDP-over-TCP connection's bytes as the listener reads them from any
//! peer: the decoder never panics, keeps at most one frame buffered, and
//! finds the same datagrams however the stream is cut into reads.
#![no_main]

use eudp_wire::uot::{Decoder, Event};
use libfuzzer_sys::fuzz_target;

/// Every event of `chunks` fed in order, and the first error (as text).
fn decode<'a>(chunks: impl Iterator<Item = &'a [u8]>) -> (Vec<(u16, u16, Vec<u8>)>, Vec<u8>, Option<String>) {
    let mut d = Decoder::new();
    let (mut frames, mut hellos) = (Vec::new(), Vec::new());
    for c in chunks {
        let r = d.feed(c, &mut |e| match e {
            Event::Hello(l) => hellos.push(l),
            Event::Frame { src, dst, payload } => frames.push((src, dst, payload.to_vec())),
        });
        assert!(d.pending() <= Decoder::max_buffer(), "buffered {} bytes", d.pending());
        if let Err(e) = r {
            return (frames, hellos, Some(format!("{e:?}")));
        }
    }
    (frames, hellos, None)
}

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else { return };
    let whole = decode(std::iter::once(stream));
    let step = usize::from(step) % 97 + 1;
    let cut = decode(stream.chunks(step));
    // The same datagrams, hellos and verdict whether read at once or in pieces.
    assert_eq!(whole, cut, "read in {step}-byte pieces");
});
