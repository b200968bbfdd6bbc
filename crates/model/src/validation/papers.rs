//! Headline rows of presets 001-004.

use super::row::{holds, row, Row};
use crate::measure::{bandwidth, latency_us, pingpong_us, shipped};
use crate::preset::Preset;
use crate::sim::{self, Workload};

/// Sizes of 001's Tables 1-2.
pub const SIZES_001: [u64; 9] = [32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

/// Per-layer time (µs) of one packet in the simulator: (host, hostTx).
pub fn sides_001(p: &Preset, stack: &str, b: u64) -> Result<(f64, f64), String> {
    let r = sim::run(p, stack, &Workload { msg_bytes: b, messages: 1, bidirectional: false, timeline: true })?;
    let dur = |layer: &str| {
        r.records.iter().filter(|x| x.layer == layer).map(|x| x.t_end_ns - x.t_start_ns).sum::<f64>() / 1000.0
    };
    Ok((dur("host"), dur("hostTx")))
}

/// Largest table size at which the NIC (hostTx) side still dominates
/// (Table 3 case (c) for BPI and enhanced BPI, whose boundaries are table
/// sizes); 0 when it never does.
fn nic_dominant_001(p: &Preset, stack: &str) -> Result<f64, String> {
    let mut last = 0.0;
    for &b in &SIZES_001 {
        let (h, n) = sides_001(p, stack, b)?;
        if n > h {
            last = b as f64;
        }
    }
    Ok(last)
}

/// Size (bytes) at which the host side stops dominating: the host and hostTx
/// latencies cross there (001 §4.1-4.2 read the UDP and Asynchronous UDP
/// boundaries of Table 3 as such a crossing, "near 5 KB" and "adjacent to
/// 3 KB", between the sizes of Tables 1-2). Found on the table sizes, then by
/// bisection on the simulated sides between the bracketing sizes (the preset
/// interpolates Tables 1-2); 0 when the host never dominates, the largest
/// table size when it always does.
pub fn host_crossing_001(p: &Preset, stack: &str) -> Result<f64, String> {
    let host_dom = |b: u64| sides_001(p, stack, b).map(|(h, n)| h >= n);
    let mut lo = None;
    for &b in &SIZES_001 {
        if host_dom(b)? {
            lo = Some(b);
        } else if let Some(mut l) = lo {
            let mut hi = b;
            while hi - l > 1 {
                let mid = (l + hi) / 2;
                if host_dom(mid)? {
                    l = mid;
                } else {
                    hi = mid;
                }
            }
            return Ok(l as f64);
        }
    }
    Ok(lo.map_or(0.0, |b| b as f64))
}

/// Paper 001 headline rows.
pub fn rows_001() -> Result<Vec<Row>, String> {
    let p = shipped("001")?;
    let mut out = vec![row(
        "001-udp-host-dom",
        "001 §4.1, Fig. 6, Table 3",
        "UDP: host/hostTx crossing, host side dominant below",
        5120.0,
        host_crossing_001(&p, "udp")?,
        "bytes",
    )];
    out.push(row(
        "001-audp-host-dom",
        "001 §4.2, Fig. 7, Table 3",
        "Async UDP: host/hostTx crossing, host side dominant below",
        3072.0,
        host_crossing_001(&p, "audp")?,
        "bytes",
    ));
    out.push(row(
        "001-bpi-nic-dom",
        "001 Table 3",
        "BPI: largest size with NIC side dominant",
        128.0,
        nic_dominant_001(&p, "bpi")?,
        "bytes",
    ));
    out.push(row(
        "001-ebpi-nic-dom",
        "001 Table 3",
        "enhanced BPI: largest size with NIC side dominant",
        64.0,
        nic_dominant_001(&p, "ebpi")?,
        "bytes",
    ));
    let b = 8192;
    let bw: Vec<f64> =
        ["udp", "audp", "bpi", "ebpi"].iter().map(|s| bandwidth(&p, s, b, 40, false)).collect::<Result<_, _>>()?;
    let small: Vec<f64> =
        ["udp", "audp", "ebpi"].iter().map(|s| bandwidth(&p, s, SIZES_001[0], 40, false)).collect::<Result<_, _>>()?;
    let conv = [bw[0], bw[1], bw[3]];
    let (lo, hi) = (min_of(&conv), max_of(&conv));
    // "Converge" is read as the table's ±10 % rule around the three
    // protocols' common value, and as a spread that narrows with size. Their
    // 8 kB figures are Tables 1-2's DMA times themselves (198.3, 212.1,
    // 192.8 us), whose max/min is 1.100: a max/min < 1.10 test would reject
    // the paper's own measurements.
    let mean = conv.iter().sum::<f64>() / 3.0;
    let within = conv.iter().all(|x| (x / mean - 1.0).abs() <= 0.10);
    let narrows = hi / lo < max_of(&small) / min_of(&small);
    out.push(holds(
        "001-converge",
        "001 §5.1, Fig. 12",
        format!(
            "8 kB throughput converges except BPI (UDP {:.0}, AUDP {:.0}, EBPI {:.0} within ±10% of their mean {:.0}; max/min {:.2} at 8 kB vs {:.2} at 32 B; BPI {:.0} Mbit/s)",
            bw[0], bw[1], bw[3], mean, hi / lo, max_of(&small) / min_of(&small), bw[2]
        ),
        within && narrows && bw[2] < 0.9 * lo,
    )
    .of_inputs("the 8 kB rates are Tables 1-2's DMA times"));
    let lb = latency_us(&p, "bpi", b)?;
    let le = latency_us(&p, "ebpi", b)?;
    out.push(row(
        "001-ebpi-faster",
        "001 §5.3, Fig. 15",
        "enhanced BPI overall latency lower than BPI, 8 kB",
        40.0,
        (1.0 - le / lb) * 100.0,
        "%",
    ));
    Ok(out)
}

fn min_of(v: &[f64]) -> f64 {
    v.iter().cloned().fold(f64::INFINITY, f64::min)
}

fn max_of(v: &[f64]) -> f64 {
    v.iter().cloned().fold(0.0, f64::max)
}

/// Paper 003 headline rows.
pub fn rows_003() -> Result<Vec<Row>, String> {
    let p = shipped("003")?;
    let mut out = Vec::new();
    let big = 16384;
    let n = 64;
    let ro = bandwidth(&p, "ro", big, n, false)?;
    let base = bandwidth(&p, "base", big, n, false)?;
    let so = bandwidth(&p, "so", big, n, false)?;
    out.push(row("003-ro-bw", "003 §1, §6.2", "RO unidirectional bandwidth, 16 kB messages", 964.0, ro, "Mbit/s"));
    out.push(row(
        "003-base-bw",
        "003 §1, §6.2",
        "base unidirectional bandwidth, 16 kB messages",
        840.0,
        base,
        "Mbit/s",
    ));
    out.push(row(
        "003-so-uni",
        "003 §6.2",
        "SO unidirectional bandwidth / base (same as base)",
        1.0,
        so / base,
        "ratio",
    ));
    let l10b = pingpong_us(&p, "base", 10)?;
    let l10r = pingpong_us(&p, "ro", 10)?;
    out.push(row("003-base-lat", "003 §1", "base latency, 10 B", 24.0, l10b, "us"));
    out.push(row("003-ro-lat", "003 §1", "RO latency, 10 B", 22.0, l10r, "us"));
    out.push(holds(
        "003-ro-lat-gain",
        "003 §1, §6.2",
        format!("RO 10 B latency below base ({l10r:.2} vs {l10b:.2} us)"),
        l10r < l10b,
    ));
    let l14b = pingpong_us(&p, "base", 14336)?;
    let l14r = pingpong_us(&p, "ro", 14336)?;
    out.push(row(
        "003-ro-lat14k",
        "003 §6.2",
        "RO latency improvement over base, 14 kB",
        8.3,
        (1.0 - l14r / l14b) * 100.0,
        "%",
    ));
    out.push(row(
        "003-so-bidir",
        "003 §1, §6.3",
        "SO bidirectional bandwidth (total), 16 kB",
        1100.0,
        bandwidth(&p, "so", big, n, true)?,
        "Mbit/s",
    ));
    out.push(row(
        "003-base-bidir",
        "003 §1, §6.3",
        "base bidirectional bandwidth (total), 16 kB",
        940.0,
        bandwidth(&p, "base", big, n, true)?,
        "Mbit/s",
    ));
    Ok(out)
}

/// Paper 002 headline rows.
pub fn rows_002() -> Result<Vec<Row>, String> {
    let p = shipped("002")?;
    let lu = latency_us(&p, "uoe", 1)?;
    let ld = latency_us(&p, "udp", 1)?;
    let bu = bandwidth(&p, "uoe", 65536, 64, false)?;
    let bd = bandwidth(&p, "udp", 65536, 64, false)?;
    Ok(vec![
        row("002-uoe-lat", "002 §4, Fig. 3a", "UOE one-way latency, 1 B", 26.0, lu, "us"),
        row("002-udp-lat", "002 §4, Fig. 3a", "host UDP one-way latency, 1 B", 32.0, ld, "us"),
        row("002-uoe-bw", "002 §4, Fig. 3b", "UOE peak throughput, 64 kB", 7400.0, bu, "Mbit/s"),
        row("002-udp-bw", "002 §4, Fig. 3b", "host UDP peak throughput, 64 kB", 5500.0, bd, "Mbit/s"),
        holds("002-uoe-faster", "002 §4", format!("UOE lower 1 B latency than UDP ({lu:.1} vs {ld:.1} us)"), lu < ld),
        holds(
            "002-uoe-more-bw",
            "002 §4",
            format!("UOE higher peak throughput than UDP ({bu:.0} vs {bd:.0} Mbit/s)"),
            bu > bd,
        ),
    ])
}

/// Paper 004 headline rows: reduction of user-to-user time, 64 B to 4 kB.
pub fn rows_004() -> Result<Vec<Row>, String> {
    let p = shipped("004")?;
    let mut red = Vec::new();
    for b in [64u64, 128, 256, 512, 1024, 2048, 4096] {
        let d = latency_us(&p, "dma", b)?;
        let e = latency_us(&p, "edt", b)?;
        red.push((1.0 - e / d) * 100.0);
    }
    let (lo, hi) = (min_of(&red), max_of(&red));
    Ok(vec![
        row(
            "004-edt-min",
            "004 abstract",
            "EDT reduction of user-to-user time, smallest over 64 B-4 kB",
            17.0,
            lo,
            "%",
        ),
        row("004-edt-max", "004 abstract", "EDT reduction of user-to-user time, largest over 64 B-4 kB", 38.0, hi, "%"),
    ])
}

/// Rows of the other papers' presets.
pub fn rows_other() -> Result<Vec<Row>, String> {
    let mut v = rows_001()?;
    v.extend(rows_002()?);
    v.extend(rows_003()?);
    v.extend(rows_004()?);
    Ok(v)
}
