//! The fused copy-with-checksum gives the bytes and the sum that a copy
//! followed by a separate checksum gives, at any length and split point.
#![no_main]

use eudp_wire::checksum::{checksum, copy_with_checksum, Checksum};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else { return };
    // An even split keeps the 16-bit words of the two parts aligned.
    let cut = (usize::from(split) * 2).min(rest.len() & !1);
    let mut dst = vec![0u8; rest.len()];
    let mut acc = Checksum::new();
    copy_with_checksum(&mut dst[..cut], &rest[..cut], &mut acc);
    copy_with_checksum(&mut dst[cut..], &rest[cut..], &mut acc);
    assert_eq!(dst, rest);
    assert_eq!(acc.finish(), checksum(rest));
});
