//! The copy block's choice (paper 001 §5.3, cached against uncached): the
//! fused copy-and-checksum of a payload into UMEM-like memory with
//! ordinary stores and with non-temporal stores, 64 B to 64 KiB.
//!
//! The destination rotates through 64 MiB of frames (more than a last-level
//! cache holds, as a UMEM under traffic is), the source is one hot buffer
//! (an application's send buffer). Both variants run interleaved, twice
//! each; the faster run of each counts, the one least disturbed by load.

use eudp_engine::sys::nt_copy::{copy_cached, copy_nontemporal};
use eudp_wire::checksum::{copy_with_checksum_via, Checksum};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Payload sizes measured.
pub const SIZES: [usize; 6] = [64, 256, 1024, 4096, 16_384, 65_536];
const REGION: usize = 64 << 20;
const PER_RUN: Duration = Duration::from_millis(150);

/// Nanoseconds per byte of one run of `copy` at `size`.
fn run(region: &mut [u8], src: &[u8], copy: fn(&mut [u8], &[u8])) -> f64 {
    let stride = src.len().div_ceil(4096) * 4096;
    let frames = region.len() / stride;
    let (mut bytes, mut i, mut sink) = (0u64, 0usize, 0u16);
    let t0 = Instant::now();
    while t0.elapsed() < PER_RUN {
        for _ in 0..64 {
            let at = (i % frames) * stride;
            let mut acc = Checksum::new();
            copy_with_checksum_via(&mut region[at..at + src.len()], src, &mut acc, copy);
            sink ^= acc.finish();
            i += 1;
            bytes += src.len() as u64;
        }
    }
    std::hint::black_box(sink);
    t0.elapsed().as_nanos() as f64 / bytes as f64
}

/// One row per size: `cached_ns_per_byte`, `nontemporal_ns_per_byte` and
/// their ratio (non-temporal over cached).
pub fn measure() -> Vec<Value> {
    let mut region = vec![0u8; REGION];
    let src: Vec<u8> = (0..65_536u32).map(|i| (i * 131 + 7) as u8).collect();
    SIZES
        .iter()
        .map(|&size| {
            let s = &src[..size];
            let mut cached = f64::MAX;
            let mut nt = f64::MAX;
            for _ in 0..2 {
                cached = cached.min(run(&mut region, s, copy_cached));
                nt = nt.min(run(&mut region, s, copy_nontemporal));
            }
            json!({
                "size": size,
                "cached_ns_per_byte": cached,
                "nontemporal_ns_per_byte": nt,
                "nontemporal_over_cached": nt / cached,
            })
        })
        .collect()
}
