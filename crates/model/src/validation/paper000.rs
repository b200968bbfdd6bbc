//! Paper 000 headline rows.

use super::row::{holds, row, Row};
use crate::measure::{bandwidth, latency_us, link_idle, shipped};
use crate::preset::apply_overrides;
use crate::sim::{self, Workload};

/// Paper 000 headline figures.
pub fn rows_000() -> Result<Vec<Row>, String> {
    let p = shipped("000")?;
    let mut out = Vec::new();
    let big = 32768u64;
    let n = 40;
    let bw_e = bandwidth(&p, "eudp", big, n, false)?;
    out.push(row("000-eudp-peak", "000 §5.2, Fig. 11", "E-UDP peak bandwidth, 32 kB", 951.0, bw_e, "Mbit/s (2^20)"));
    let pci = p.resources["tx.bus"].rate().unwrap_or(f64::NAN) * 8e9 / p.mbit_bits.v;
    out.push(row("000-eudp-pci-frac", "000 §5.2, abstract", "E-UDP peak / PCI limit", 94.0, bw_e / pci * 100.0, "%"));
    let r = sim::run(&p, "udp", &Workload { msg_bytes: big, messages: 10, bidirectional: false, timeline: false })?;
    let (idle0, _) = link_idle(&r, "tx.link").ok_or("udp run did not use tx.link")?;
    out.push(row(
        "000-udp-link-idle",
        "000 §3.2.4, Fig. 4",
        "traditional UDP: link idle in 10 x 32 kB burst",
        50.0,
        idle0 * 100.0,
        "%",
    ));
    let le = latency_us(&p, "eudp", big)?;
    let theo = big as f64 / p.resources["tx.bus"].rate().unwrap_or(f64::NAN) / 1000.0;
    out.push(row(
        "000-eudp-lat-min",
        "000 §5.2, Fig. 10a",
        "E-UDP 32 kB latency / theoretical minimum (32 kB at the PCI rate, the bottleneck named in §5.2)",
        1.0,
        le / theo,
        "ratio",
    ));
    let lg = latency_us(&p, "gm", big)?;
    out.push(holds(
        "000-eudp-below-gm",
        "000 §5.2, Fig. 10a",
        format!("E-UDP 32 kB latency below GM ({le:.1} vs {lg:.1} us)"),
        le < lg,
    ));
    let small: Vec<(String, f64)> = ["udp", "coarse", "eudp", "gm", "bvia"]
        .iter()
        .map(|s| latency_us(&p, s, 1).map(|l| (s.to_string(), l)))
        .collect::<Result<_, _>>()?;
    let best = small.iter().cloned().fold(("".to_string(), f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    out.push(holds(
        "000-gm-small-best",
        "000 §5.2, Fig. 10b",
        format!("GM lowest 1 B latency (best: {} {:.1} us)", best.0, best.1),
        best.0 == "gm",
    ));
    let bw_g = bandwidth(&p, "gm", big, n, false)?;
    let bw_v = bandwidth(&p, "bvia", big, n, false)?;
    let bw_u = bandwidth(&p, "udp", big, n, false)?;
    out.push(holds(
        "000-gm-below-eudp",
        "000 §5.2, Fig. 11",
        format!("GM bandwidth below E-UDP ({bw_g:.0} vs {bw_e:.0})"),
        bw_g < bw_e,
    ));
    out.push(holds(
        "000-bvia-lowest",
        "000 §5.2, Fig. 11",
        format!("Berkeley-VIA-like lowest 32 kB bandwidth ({bw_v:.0}; UDP {bw_u:.0}, GM {bw_g:.0})"),
        bw_v < bw_g && bw_v < bw_e && bw_v < bw_u,
    ));
    // projections (000 §5.3, Figs. 13-14)
    let mut p2 = p.clone();
    apply_overrides(&mut p2, Some("pci64/66"), Some(2000.0))?;
    let link2 = 2000e6 / p2.mbit_bits.v;
    let bw2 = bandwidth(&p2, "eudp", big, n, false)?;
    out.push(row(
        "000-2g-bw",
        "000 §5.3, Fig. 13b",
        "2 Gbps + PCI 64/66: E-UDP bandwidth / link (near physical)",
        100.0,
        bw2 / link2 * 100.0,
        "%",
    ));
    let l16 = latency_us(&p2, "eudp", 16384)?;
    let l32 = latency_us(&p2, "eudp", 32768)?;
    let slope = (l32 - l16) * 1000.0 / 16384.0;
    let link_ns = 8.0 / 2.0; // ns per byte at 2 Gbit/s
    out.push(row(
        "000-2g-slope",
        "000 §5.3, Fig. 13a",
        "2 Gbps + PCI 64/66: E-UDP latency slope / link per-byte time",
        1.0,
        slope / link_ns,
        "ratio",
    ));
    let c16 = latency_us(&p2, "coarse", 16384)?;
    let c32 = latency_us(&p2, "coarse", 32768)?;
    out.push(holds("000-2g-fine-hides", "000 §5.3, Fig. 13a", format!("2 Gbps: fine-grained 32 kB latency well below coarse ({l32:.1} vs {c32:.1} us, 16 kB {l16:.1} vs {c16:.1})"), l32 < 0.8 * c32));
    // store-and-forward switch (000 §6): pipelining across the switch is lost
    let le_sf = latency_us(&p, "eudp_sf", big)?;
    let lc_sf = latency_us(&p, "coarse_sf", big)?;
    let lc = latency_us(&p, "coarse", big)?;
    out.push(holds(
        "000-sf-switch",
        "000 §6",
        format!(
            "store-and-forward switch shrinks the fine-grained gain at 32 kB ({:.0} us with, {:.0} us without)",
            lc_sf - le_sf,
            lc - le
        ),
        lc_sf - le_sf < lc - le,
    ));
    let mut p10 = p.clone();
    apply_overrides(&mut p10, Some("pci64/133"), Some(10000.0))?;
    let bw10 = bandwidth(&p10, "eudp", big, n, false)?;
    let link10 = 10000e6 / p10.mbit_bits.v;
    out.push(holds(
        "000-10g-short",
        "000 §5.3, Fig. 14b",
        format!("10 Gbps + PCI 64/133: E-UDP cannot fill the link ({:.0}% of link)", bw10 / link10 * 100.0),
        bw10 < 0.9 * link10,
    ));
    Ok(out)
}
