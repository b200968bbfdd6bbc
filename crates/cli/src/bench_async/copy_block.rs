//! The copy block's choice (paper 001 §5.3, cached against uncached): the
//! fused copy-and-checksum of a payload into UMEM-like memory with
//! ordinary stores and with non-temporal stores, 64 B to 64 KiB.
//!
//! The destination rotates through frames of a region, the source is one
//! hot buffer (an application's send buffer). Two regions: 8 MiB of 2 KiB
//! frames, the xdp transport's UMEM at a 1500-byte MTU (4096 frames), which
//! the last-level cache can hold, and 64 MiB, which it cannot. Each region
//! is written once before timing, so that no variant pays its first-touch
//! page faults. The two variants run in `ROUNDS` interleaved rounds (the
//! order alternating), each timed by the thread's CPU time, which a loaded
//! host's preemptions do not inflate as they do wall time; the median round
//! stands for the row and every round's ratio is kept.

use super::spread::median;
use eudp_engine::sys::clock::thread_cpu_time;
use eudp_engine::sys::nt_copy::{copy_cached, copy_nontemporal};
use eudp_wire::checksum::{copy_with_checksum_via, Checksum};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// Payload sizes measured.
pub const SIZES: [usize; 6] = [64, 256, 1024, 4096, 16_384, 65_536];
/// (name, bytes, frame size): the rotating sets.
const REGIONS: [(&str, usize, usize); 2] = [("umem_8mib", 8 << 20, 2048), ("region_64mib", 64 << 20, 4096)];
const PER_RUN: Duration = Duration::from_millis(100);
const ROUNDS: usize = 5;

/// Nanoseconds per byte of one run of `copy` at `src.len()`: the thread's
/// CPU time, and wall time.
fn run(region: &mut [u8], frame: usize, src: &[u8], copy: fn(&mut [u8], &[u8])) -> (f64, f64) {
    let stride = src.len().div_ceil(frame) * frame;
    let frames = region.len() / stride;
    let (mut bytes, mut i, mut sink) = (0u64, 0usize, 0u16);
    let (t0, cpu0) = (Instant::now(), thread_cpu_time());
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
    let per_byte = |d: Duration| d.as_nanos() as f64 / bytes as f64;
    (per_byte(thread_cpu_time() - cpu0), per_byte(t0.elapsed()))
}

/// One row per region and size: the median `cached_ns_per_byte` and
/// `nontemporal_ns_per_byte` (thread CPU), their ratio (non-temporal over
/// cached), and each round's ratio by CPU time and by wall time.
pub fn measure() -> Vec<Value> {
    let src: Vec<u8> = (0..65_536u32).map(|i| (i * 131 + 7) as u8).collect();
    let mut rows = Vec::new();
    for (name, bytes, frame) in REGIONS {
        let mut region = vec![0u8; bytes];
        // First touch here, not in whichever variant runs first.
        region.iter_mut().step_by(4096).for_each(|b| *b = 1);
        for &size in &SIZES {
            let s = &src[..size];
            let (mut cached, mut nt, mut ratios, mut wall_ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for round in 0..ROUNDS {
                let (c, n) = if round % 2 == 0 {
                    let c = run(&mut region, frame, s, copy_cached);
                    (c, run(&mut region, frame, s, copy_nontemporal))
                } else {
                    let n = run(&mut region, frame, s, copy_nontemporal);
                    (run(&mut region, frame, s, copy_cached), n)
                };
                cached.push(c.0);
                nt.push(n.0);
                ratios.push(n.0 / c.0);
                wall_ratios.push(n.1 / c.1);
            }
            let med = |v: &mut [f64]| median(v).expect("ROUNDS > 0");
            let (c, n) = (med(&mut cached), med(&mut nt));
            let mut sorted = ratios.clone();
            sorted.sort_by(f64::total_cmp);
            rows.push(json!({
                "region": name,
                "region_bytes": bytes,
                "frame": frame,
                "size": size,
                "cached_ns_per_byte": c,
                "nontemporal_ns_per_byte": n,
                "nontemporal_over_cached": n / c,
                "rounds_nontemporal_over_cached": ratios,
                "rounds_ratio_min_max": [sorted[0], sorted[sorted.len() - 1]],
                // The same rounds timed by the wall clock, as the bench once
                // did: on a loaded host each run's share of the CPU varies.
                "rounds_wall_nontemporal_over_cached": wall_ratios,
            }));
        }
    }
    rows
}

/// The rows as text.
pub fn table(rows: &Value) -> String {
    let Some(rows) = rows.as_array() else { return String::new() };
    let mut out = format!(
        "\ncopy block alone (thread CPU, median of {ROUNDS} rounds)\n{:<13} {:>6} {:>10} {:>10} {:>8} {:>15}\n",
        "region", "size", "cach ns/B", "nt ns/B", "nt/cach", "rounds min-max"
    );
    for r in rows {
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let mm = |i: usize| r["rounds_ratio_min_max"][i].as_f64().unwrap_or(f64::NAN);
        out += &format!(
            "{:<13} {:>6} {:>10.3} {:>10.3} {:>8.2} {:>7.2}-{:<7.2}\n",
            r["region"].as_str().unwrap_or("?"),
            r["size"].as_u64().unwrap_or(0),
            f("cached_ns_per_byte"),
            f("nontemporal_ns_per_byte"),
            f("nontemporal_over_cached"),
            mm(0),
            mm(1),
        );
    }
    out
}
