//! The EMP frame parser over any bytes: an error, or a frame that encodes
//! back to the bytes it came from.
#![no_main]

use eudp_wire::emp;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = emp::parse(data) {
        let mut out = vec![0u8; data.len()];
        let n = emp::encode(&f, &mut out).expect("a parsed frame encodes");
        assert_eq!(&out[..n], data);
        assert_eq!(emp::parse(&out[..n]), Ok(f));
    }
});
