//! Per-layer tables: latency, occupancy, g + B·G fits over a size sweep
//! (paper 000 §4.4), the dominant layer and the throughput it predicts
//! (size / dominant per-packet time, paper 001 §5.1), and crossover sizes
//! where the dominant layer changes (paper 001 Table 3).

use crate::resolve::{layers_of, Record};
use eudp_model::timeline::TraceRecord;
use serde::Serialize;

/// One layer in one run (stack, size).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LayerStat {
    pub layer: String,
    pub host: String,
    pub service: bool,
    pub packets: usize,
    /// Mean time a packet spends in the layer (latency), ns.
    pub mean_ns: f64,
    /// Median latency, ns.
    pub p50_ns: f64,
    /// Busy time per packet, ns: overlapping intervals (a batch, a GSO
    /// message) are merged and their length shared by their packets; the
    /// median of these shares. What bounds throughput.
    pub per_packet_ns: f64,
    /// The union of the layer's intervals divided by the packets, ns
    /// (sensitive to warm-up and preemption; the median above is not).
    pub union_per_packet_ns: f64,
}

/// Each packet's share of its layer's busy time: intervals that overlap
/// (strictly) are merged and the merged length divided by their packets.
/// Returns the shares in the order of `iv` (ns).
pub fn shares(iv: &[(f64, f64)]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..iv.len()).collect();
    order.sort_by(|&a, &b| iv[a].0.total_cmp(&iv[b].0));
    let mut out = vec![0.0; iv.len()];
    let mut group: Vec<usize> = Vec::new();
    let (mut g_start, mut g_end) = (0.0, f64::NEG_INFINITY);
    let flush = |group: &mut Vec<usize>, s: f64, e: f64, out: &mut Vec<f64>| {
        for &i in group.iter() {
            out[i] = (e - s) / group.len() as f64;
        }
        group.clear();
    };
    for i in order {
        let (s, e) = iv[i];
        if group.is_empty() || s >= g_end {
            if !group.is_empty() {
                flush(&mut group, g_start, g_end, &mut out);
            }
            g_start = s;
            g_end = e;
        } else {
            g_end = g_end.max(e);
        }
        group.push(i);
    }
    if !group.is_empty() {
        flush(&mut group, g_start, g_end, &mut out);
    }
    out
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Union length of intervals (ns).
pub fn union_ns(iv: &mut [(f64, f64)]) -> f64 {
    iv.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut total = 0.0;
    let mut cur: Option<(f64, f64)> = None;
    for &(s, e) in iv.iter() {
        match cur {
            Some((cs, ce)) if s <= ce => cur = Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                cur = Some((s, e));
            }
            None => cur = Some((s, e)),
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// Per-layer statistics of one run's records, in layer order.
pub fn layer_stats(stack: &str, recs: &[Record]) -> Vec<LayerStat> {
    let mut out = Vec::new();
    for l in layers_of(stack) {
        let mine: Vec<&Record> = recs.iter().filter(|r| r.layer == l.name).collect();
        if mine.is_empty() {
            continue;
        }
        let mut d: Vec<f64> = mine.iter().map(|r| r.t_end_ns - r.t_start_ns).collect();
        d.sort_by(f64::total_cmp);
        let n = d.len();
        let mut iv: Vec<(f64, f64)> = mine.iter().map(|r| (r.t_start_ns, r.t_end_ns)).collect();
        let mut sh = shares(&iv);
        let packets = {
            let mut p: Vec<u64> = mine.iter().map(|r| r.packet).collect();
            p.sort_unstable();
            p.dedup();
            p.len()
        };
        out.push(LayerStat {
            layer: l.name.into(),
            host: l.host.into(),
            service: l.service,
            packets,
            mean_ns: d.iter().sum::<f64>() / n as f64,
            p50_ns: d[n / 2],
            per_packet_ns: median(&mut sh),
            union_per_packet_ns: union_ns(&mut iv) / packets.max(1) as f64,
        });
    }
    out
}

/// The dominant layer of a run: the service layer with the largest busy
/// time per packet.
pub fn dominant(stats: &[LayerStat]) -> Option<&LayerStat> {
    stats.iter().filter(|s| s.service).max_by(|a, b| a.per_packet_ns.total_cmp(&b.per_packet_ns))
}

/// Throughput in Gbit/s of `bytes` every `ns`.
pub fn gbps(bytes: f64, ns: f64) -> f64 {
    if ns > 0.0 {
        bytes * 8.0 / ns
    } else {
        f64::INFINITY
    }
}

/// One run's summary row.
#[derive(Clone, Debug, Serialize)]
pub struct RunRow {
    pub stack: String,
    pub size: u64,
    pub packets: usize,
    pub dominant: String,
    pub dominant_ns: f64,
    /// size / dominant busy time per packet.
    pub predicted_gbps: f64,
    /// Received bytes over the receive span of the traced burst.
    pub measured_gbps: f64,
    pub layers: Vec<LayerStat>,
}

/// Summarises a run. `measured_gbps` comes from the caller (it knows the
/// receive span).
pub fn run_row(stack: &str, size: u64, recs: &[Record], measured_gbps: f64) -> RunRow {
    let layers = layer_stats(stack, recs);
    let (dname, dns) = dominant(&layers).map(|d| (d.layer.clone(), d.per_packet_ns)).unwrap_or_default();
    let packets = layers.iter().map(|l| l.packets).max().unwrap_or(0);
    RunRow {
        stack: stack.into(),
        size,
        packets,
        dominant: dname,
        dominant_ns: dns,
        predicted_gbps: gbps(size as f64, dns),
        measured_gbps,
        layers,
    }
}

/// Measured throughput of a burst from its records: bytes after the first
/// delivered over the span of application receive returns.
pub fn measured_gbps(recs: &[Record]) -> f64 {
    let mut ends: Vec<(f64, u64)> =
        recs.iter().filter(|r| r.layer == "app.recv").map(|r| (r.t_end_ns, r.bytes)).collect();
    if ends.len() < 2 {
        return 0.0;
    }
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let bytes: u64 = ends[1..].iter().map(|e| e.1).sum();
    gbps(bytes as f64, ends[ends.len() - 1].0 - ends[0].0)
}

/// A layer's per-packet cost g (ns) and per-byte cost G (ns/B).
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct LayerFit {
    pub stack: String,
    pub layer: String,
    pub service: bool,
    pub g_ns: f64,
    pub big_g_ns_per_byte: f64,
    pub rms_ns: f64,
    pub sizes: usize,
}

/// Fits `busy time per packet = g + B·G` for every layer of a stack over the
/// runs of a size sweep (the model's least-squares fitter, one point per size).
pub fn fit_layers(stack: &str, runs: &[RunRow]) -> Vec<LayerFit> {
    let mut pts: Vec<TraceRecord> = Vec::new();
    for r in runs.iter().filter(|r| r.stack == stack) {
        for (i, l) in r.layers.iter().enumerate() {
            pts.push(TraceRecord {
                layer: l.layer.clone(),
                packet: i,
                bytes: r.size,
                t_start_ns: 0.0,
                t_end_ns: l.per_packet_ns,
                host: None,
            });
        }
    }
    let service = |name: &str| layers_of(stack).iter().find(|l| l.name == name).map(|l| l.service).unwrap_or(false);
    let n_sizes = runs.iter().filter(|r| r.stack == stack).count();
    eudp_model::fit::fit(&pts)
        .map(|f| {
            f.into_iter()
                .map(|x| LayerFit {
                    stack: stack.into(),
                    service: service(&x.layer.name),
                    layer: x.layer.name,
                    g_ns: x.layer.g_ns,
                    big_g_ns_per_byte: x.layer.big_g_ns,
                    rms_ns: x.rms_ns,
                    sizes: n_sizes,
                })
                .collect()
        })
        .unwrap_or_default()
}

/// A size where the dominant layer (by the fitted lines) changes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Crossover {
    pub stack: String,
    pub below: String,
    pub above: String,
    pub bytes: f64,
}

/// The dominant fitted service layer at `b` bytes.
pub fn fitted_dominant(fits: &[LayerFit], b: f64) -> Option<&LayerFit> {
    fits.iter()
        .filter(|f| f.service)
        .max_by(|x, y| (x.g_ns + b * x.big_g_ns_per_byte).total_cmp(&(y.g_ns + b * y.big_g_ns_per_byte)))
}

/// Crossovers of the fitted lines between `lo` and `hi` bytes: where the
/// dominant service layer changes, found exactly as line intersections.
pub fn crossovers(stack: &str, fits: &[LayerFit], lo: f64, hi: f64) -> Vec<Crossover> {
    let mut out = Vec::new();
    let mut b = lo;
    while b < hi {
        let Some(cur) = fitted_dominant(fits, b) else { break };
        // The nearest intersection above b with a line that overtakes cur.
        let mut next: Option<(f64, &LayerFit)> = None;
        for f in fits.iter().filter(|f| f.service && f.layer != cur.layer) {
            let dg = f.big_g_ns_per_byte - cur.big_g_ns_per_byte;
            if dg <= 0.0 {
                continue;
            }
            let x = (cur.g_ns - f.g_ns) / dg;
            if x > b && x < hi && !matches!(next, Some((nx, _)) if nx <= x) {
                next = Some((x, f));
            }
        }
        match next {
            Some((x, f)) => {
                out.push(Crossover { stack: stack.into(), below: cur.layer.clone(), above: f.layer.clone(), bytes: x });
                b = x * (1.0 + 1e-9) + 1e-9;
            }
            None => break,
        }
    }
    out
}

/// The table as text.
pub fn render(runs: &[RunRow], fits: &[LayerFit], cross: &[Crossover]) -> String {
    use std::fmt::Write;
    let mut s = String::new();
    let _ = writeln!(s, "per layer (busy ns/pkt = median share of the layer's busy time, overlapping intervals shared; latency = time in layer)");
    for r in runs {
        let _ = writeln!(s, "\n{} {} B, {} packets", r.stack, r.size, r.packets);
        let _ = writeln!(
            s,
            "  {:<10} {:<8} {:>12} {:>14} {:>12}",
            "layer", "host", "busy ns/pkt", "mean lat. ns", "p50 lat. ns"
        );
        for l in &r.layers {
            let mark = if l.layer == r.dominant {
                " <- dominant"
            } else if !l.service {
                " (queue)"
            } else {
                ""
            };
            let _ = writeln!(
                s,
                "  {:<10} {:<8} {:>12.0} {:>14.0} {:>12.0}{mark}",
                l.layer, l.host, l.per_packet_ns, l.mean_ns, l.p50_ns
            );
        }
    }
    let _ =
        writeln!(s, "\ndominant layer per size: predicted = size / dominant busy time, measured = burst receive rate");
    let _ = writeln!(
        s,
        "  {:<7} {:>6} {:<10} {:>12} {:>14} {:>14}",
        "stack", "size", "dominant", "ns/pkt", "predicted Gb/s", "measured Gb/s"
    );
    for r in runs {
        let _ = writeln!(
            s,
            "  {:<7} {:>6} {:<10} {:>12.0} {:>14.3} {:>14.3}",
            r.stack, r.size, r.dominant, r.dominant_ns, r.predicted_gbps, r.measured_gbps
        );
    }
    if !fits.is_empty() {
        let _ = writeln!(s, "\nfits over the sizes: busy time per packet = g + B·G");
        let _ = writeln!(s, "  {:<7} {:<10} {:>10} {:>12} {:>10}", "stack", "layer", "g ns", "G ns/B", "rms ns");
        for f in fits {
            let _ = writeln!(
                s,
                "  {:<7} {:<10} {:>10.0} {:>12.4} {:>10.0}{}",
                f.stack,
                f.layer,
                f.g_ns,
                f.big_g_ns_per_byte,
                f.rms_ns,
                if f.service { "" } else { " (queue)" }
            );
        }
    }
    let _ = writeln!(s, "\ncrossovers (fitted dominant layer changes)");
    if cross.is_empty() {
        let _ = writeln!(s, "  none within the swept sizes");
    }
    for c in cross {
        let _ = writeln!(s, "  {:<7} {} -> {} at {:.0} B", c.stack, c.below, c.above, c.bytes);
    }
    s
}
