//! The Internet checksum (RFC 1071) and the fused copy-with-checksum.
//!
//! Paper 000 removes a separate pass over the data by computing the checksum
//! while the data is moved. [`copy_with_checksum`] is that fusion in software:
//! one pass reads each byte once, writes it to the destination and folds it
//! into the sum.

/// One's-complement accumulator over 16-bit big-endian words.
///
/// Sums are kept unfolded in a `u64` so long inputs need no carry handling in
/// the inner loop; [`Checksum::finish`] folds and complements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checksum {
    sum: u64,
    /// True when an odd number of bytes has been added so far: the next byte
    /// is the low half of a 16-bit word.
    odd: bool,
}

impl Checksum {
    /// An empty accumulator.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds bytes to the sum; may be called repeatedly with arbitrary splits.
    pub fn add(&mut self, mut data: &[u8]) {
        if data.is_empty() {
            return;
        }
        if self.odd {
            self.sum += u64::from(data[0]);
            data = &data[1..];
            self.odd = false;
        }
        let mut chunks = data.chunks_exact(8);
        for c in &mut chunks {
            let w = u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
            // Add the four 16-bit words of `w`; split into 32-bit halves so the
            // u64 accumulator cannot overflow for any input below 2^32 bytes.
            self.sum += (w >> 32) as u32 as u64 >> 16;
            self.sum += (w >> 32) as u16 as u64;
            self.sum += (w as u32 as u64) >> 16;
            self.sum += w as u16 as u64;
        }
        let mut rest = chunks.remainder();
        while rest.len() >= 2 {
            self.sum += u64::from(u16::from_be_bytes([rest[0], rest[1]]));
            rest = &rest[2..];
        }
        if let Some(&b) = rest.first() {
            self.sum += u64::from(b) << 8;
            self.odd = true;
        }
    }

    /// Adds a 16-bit word (used for pseudo-header fields). Must be called on a
    /// word boundary.
    pub fn add_u16(&mut self, w: u16) {
        debug_assert!(!self.odd, "add_u16 on an odd boundary");
        self.sum += u64::from(w);
    }

    /// Folds carries and returns the one's-complement sum (not complemented).
    pub fn fold(&self) -> u16 {
        let mut s = self.sum;
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        s as u16
    }

    /// The checksum field value: the complement of the folded sum.
    pub fn finish(&self) -> u16 {
        !self.fold()
    }
}

/// Internet checksum of `data` (complemented, ready for a header field).
pub fn checksum(data: &[u8]) -> u16 {
    let mut c = Checksum::new();
    c.add(data);
    c.finish()
}

/// Copies `src` into `dst[..src.len()]` and returns the running sum of the
/// copied bytes, in a single pass over the data.
///
/// # Panics
/// If `dst` is shorter than `src`.
pub fn copy_with_checksum(dst: &mut [u8], src: &[u8], acc: &mut Checksum) {
    assert!(dst.len() >= src.len(), "copy_with_checksum: destination too short");
    // Work in cache-sized blocks: copy a block, then sum it while it is hot.
    // This keeps one pass over memory without per-byte branches.
    const BLOCK: usize = 1024;
    for (d, s) in dst[..src.len()].chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        d.copy_from_slice(s);
        acc.add(d);
    }
}

/// A copy of `src` into `dst[..src.len()]` (ordinary or non-temporal stores).
pub type CopyFn = fn(&mut [u8], &[u8]);

/// [`copy_with_checksum`] with the copy itself supplied: `copy(dst, src)`
/// moves each block (ordinary or non-temporal stores, say), and the sum is
/// taken over the source block, which the copy has just brought into the
/// cache, so that a copy that writes around the cache is not read back.
///
/// # Panics
/// If `dst` is shorter than `src`.
pub fn copy_with_checksum_via(dst: &mut [u8], src: &[u8], acc: &mut Checksum, copy: CopyFn) {
    assert!(dst.len() >= src.len(), "copy_with_checksum_via: destination too short");
    const BLOCK: usize = 1024;
    for (d, s) in dst[..src.len()].chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        copy(d, s);
        acc.add(s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Straightforward reference: 16-bit words, fold at the end.
    fn reference(data: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from(c[0]) << 8 };
            sum += u32::from(w);
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !(sum as u16)
    }

    #[test]
    fn rfc1071_example() {
        // Example words from RFC 1071 §3: 0001 f203 f4f5 f6f7 sum to ddf2.
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        let mut c = Checksum::new();
        c.add(&data);
        assert_eq!(c.fold(), 0xddf2);
        assert_eq!(checksum(&data), !0xddf2);
    }

    #[test]
    fn empty_is_all_ones() {
        assert_eq!(checksum(&[]), 0xffff);
    }

    proptest! {
        #[test]
        fn matches_reference(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
            prop_assert_eq!(checksum(&data), reference(&data));
        }

        #[test]
        fn split_anywhere(data in proptest::collection::vec(any::<u8>(), 0..600), cut in 0usize..600) {
            let cut = cut.min(data.len());
            let mut c = Checksum::new();
            c.add(&data[..cut]);
            c.add(&data[cut..]);
            prop_assert_eq!(c.finish(), reference(&data));
        }

        #[test]
        fn supplied_copy_equals_fused_copy(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let (mut a, mut b) = (vec![0u8; data.len()], vec![0u8; data.len()]);
            let (mut ca, mut cb) = (Checksum::new(), Checksum::new());
            copy_with_checksum(&mut a, &data, &mut ca);
            copy_with_checksum_via(&mut b, &data, &mut cb, |d, s| d.copy_from_slice(s));
            prop_assert_eq!(a, b);
            prop_assert_eq!(ca.finish(), cb.finish());
        }

        #[test]
        fn fused_copy_equals_copy_then_sum(data in proptest::collection::vec(any::<u8>(), 0..5000)) {
            let mut dst = vec![0u8; data.len() + 3];
            let mut c = Checksum::new();
            copy_with_checksum(&mut dst, &data, &mut c);
            prop_assert_eq!(&dst[..data.len()], &data[..]);
            prop_assert_eq!(c.finish(), reference(&data));
        }
    }
}
