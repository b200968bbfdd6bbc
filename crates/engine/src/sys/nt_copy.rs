//! The copy block's non-temporal stores.
//!
//! Paper 001 §5.3 finds BPI's copy block faster when its target memory is
//! cacheable. On a host the choice is the other way round: ordinary stores
//! pull the destination's lines into the cache (reading them first), while
//! non-temporal stores write around it. For a UMEM frame that the device,
//! not this CPU, reads next, the latter keeps the cache for the
//! application's own data. Which wins depends on the size and the machine,
//! so the `xdp` transport offers both and `eudp bench --async` measures them.

/// Copies `src` into `dst[..src.len()]` with non-temporal stores where the
/// CPU has them (x86-64: 16-byte `movntdq` after an ordinary head that
/// aligns the destination), then fences so that the bytes are visible to
/// whoever is told about them next. Elsewhere an ordinary copy.
///
/// # Panics
/// If `dst` is shorter than `src`.
pub fn copy_nontemporal(dst: &mut [u8], src: &[u8]) {
    let dst = &mut dst[..src.len()];
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        let head = dst.as_ptr().align_offset(16).min(src.len());
        dst[..head].copy_from_slice(&src[..head]);
        let body = (src.len() - head) / 16 * 16;
        let (d, s) = (&mut dst[head..head + body], &src[head..head + body]);
        for (dc, sc) in d.chunks_exact_mut(16).zip(s.chunks_exact(16)) {
            // SAFETY: SSE2 is part of x86-64. `sc` is 16 readable bytes
            // (an unaligned load); `dc` is 16 writable bytes, 16-aligned
            // because the head above aligned `d`'s start.
            unsafe {
                _mm_stream_si128(dc.as_mut_ptr() as *mut __m128i, _mm_loadu_si128(sc.as_ptr() as *const __m128i))
            };
        }
        dst[head + body..].copy_from_slice(&src[head + body..]);
        // SAFETY: a store fence; no memory operands.
        unsafe { _mm_sfence() };
    }
    #[cfg(not(target_arch = "x86_64"))]
    dst.copy_from_slice(src);
}

/// Copies with ordinary stores (the cached copy block).
pub fn copy_cached(dst: &mut [u8], src: &[u8]) {
    dst[..src.len()].copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nontemporal_copy_equals_copy_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for off in 0..17 {
            for len in [0, 1, 15, 16, 17, 31, 32, 33, 100, 255] {
                let mut a = vec![0xAAu8; 320];
                let mut b = vec![0xAAu8; 320];
                copy_nontemporal(&mut a[off..], &src[..len]);
                b[off..off + len].copy_from_slice(&src[..len]);
                assert_eq!(a, b, "offset {off} length {len}");
            }
        }
    }
}
