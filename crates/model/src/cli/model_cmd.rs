//! `eudp model`: the analytical model's table, CSV and plots.

use super::args::ModelArgs;
use super::io::{bw_path, default_sizes, load_preset, write_file};
use crate::analytic::{self, Layer};
use crate::{fit, svg, timeline};
use std::fmt::Write as _;

pub fn model(a: &ModelArgs) -> Result<(), String> {
    if let Some(r) = a.ratemax.as_deref() {
        let v: Vec<f64> = r
            .split(',')
            .map(|s| s.trim().parse::<f64>())
            .collect::<Result<_, _>>()
            .map_err(|_| "--ratemax wants N,L2,T_US")?;
        if v.len() != 3 || v[2] <= 0.0 {
            return Err("--ratemax wants N,L2,T_US with T_US > 0".into());
        }
        let rate = analytic::ratemax(v[0], v[1], v[2] * 1000.0);
        println!(
            "Ratemax = (n + sizeof(L2)) / t = ({} + {}) / {} us = {:.4} posts/us = {:.0} posts/s",
            v[0],
            v[1],
            v[2],
            rate * 1000.0,
            rate * 1e9
        );
        if a.preset.is_none() && a.layers.is_none() && a.trace.is_none() {
            return Ok(());
        }
    }
    let mut mbit = 1e6;
    let mut mtu = 65536.0;
    let mut thr = 2048.0;
    // A source gives layers as a function of packet size.
    let source: Box<dyn Fn(f64) -> Result<Vec<Layer>, String>> = if let Some(name) = &a.preset {
        let p = load_preset(name, a.bus.as_deref(), a.link_mbps)?;
        let stack = a.stack.clone().ok_or("--stack is required with --preset")?;
        let st = p.stacks.get(&stack).ok_or_else(|| {
            format!(
                "preset {} has no stack {stack:?} (stacks: {})",
                p.name,
                p.stacks.keys().cloned().collect::<Vec<_>>().join(", ")
            )
        })?;
        mbit = p.mbit_bits.v;
        mtu = st.segment_bytes.as_ref().map(|c| c.v).unwrap_or(st.mtu_bytes.v).min(st.mtu_bytes.v);
        thr = analytic::stack_threshold(&p, &stack).unwrap_or(thr);
        Box::new(move |b| analytic::layers_from_stack(&p, &stack, b))
    } else if let Some(f) = a.layers.as_deref() {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
        let layers: Vec<Layer> = serde_json::from_str(&text).map_err(|e| format!("{f}: invalid layers JSON: {e}"))?;
        if layers.is_empty() {
            return Err(format!("{f}: no layers"));
        }
        Box::new(move |_| Ok(layers.clone()))
    } else if let Some(f) = a.trace.as_deref() {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
        let recs = timeline::parse(&text).map_err(|e| format!("{f}: {e}"))?;
        let fitted = fit::fit(&recs)?;
        println!("fitted layers (least squares, duration = g + bytes*G):");
        println!("{:<28} {:>8} {:>12} {:>14} {:>10}", "layer", "samples", "g (us)", "G (ns/byte)", "rms (us)");
        for f in &fitted {
            println!(
                "{:<28} {:>8} {:>12.3} {:>14.4} {:>10.3}{}",
                f.layer.name,
                f.samples,
                f.layer.g_ns / 1000.0,
                f.layer.big_g_ns,
                f.rms_ns / 1000.0,
                f.note.as_ref().map(|n| format!("  ({n})")).unwrap_or_default()
            );
        }
        mtu = recs.iter().map(|r| r.bytes as f64).fold(1.0, f64::max);
        let layers: Vec<Layer> = fitted.into_iter().map(|f| f.layer).collect();
        Box::new(move |_| Ok(layers.clone()))
    } else {
        return Err("need --preset/--stack, --layers or --trace (see eudp model --help)".into());
    };
    let thr = a.threshold.unwrap_or(thr);
    let m = a.packets;
    if m == 0 {
        return Err("--packets must be >= 1".into());
    }
    let sizes = a.sizes.clone().map(|s| s.0).unwrap_or_else(|| default_sizes(mtu));
    if sizes.iter().any(|&s| s < 1.0) {
        return Err("--sizes must be >= 1 byte".into());
    }
    let mut csv = String::new();
    let mut lat_c = Vec::new();
    let mut lat_f = Vec::new();
    let mut bw_c = Vec::new();
    let mut bw_f = Vec::new();
    if a.dominant {
        let first = source(sizes[0])?;
        print!("{:>8}", "bytes");
        csv.push_str("bytes");
        for l in &first {
            print!(" {:>12}", trunc(&l.name, 12));
            let _ = write!(csv, ",{}_us", l.name);
        }
        println!(" {:>12} {:>14}", "dominant", "Mbit/s");
        csv.push_str(",dominant,mbit_s\n");
        for &b in &sizes {
            let layers = source(b)?;
            let lats: Vec<f64> = layers.iter().map(|l| l.cost(b)).collect();
            let (bw, d) = analytic::dominant_throughput(&lats, b);
            print!("{b:>8}");
            let _ = write!(csv, "{b}");
            for l in &lats {
                print!(" {:>12.2}", l / 1000.0);
                let _ = write!(csv, ",{:.4}", l / 1000.0);
            }
            let mb = bw * 8e9 / mbit;
            println!(" {:>12} {:>14.1}", trunc(&layers[d].name, 12), mb);
            let _ = writeln!(csv, ",{},{mb:.3}", layers[d].name);
            lat_c.push((b, lats[d] / 1000.0));
            bw_c.push((b, mb));
        }
    } else {
        println!(
            "{:>8} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>4}",
            "bytes", "lat_coarse", "lat_fine", "bw_coarse_m", "bw_fine_m", "bw_limit", "bottleneck", "u"
        );
        println!(
            "{:>8} {:>12} {:>12} {:>12} {:>12} {:>12}",
            "", "(us) eq1", "(us) eq3", "(Mbit/s) eq2", "(Mbit/s) eq4", "(Mbit/s)"
        );
        csv.push_str(
            "bytes,latency_coarse_us,latency_fine_us,bw_coarse_m_mbit,bw_fine_m_mbit,bw_limit_mbit,bottleneck,u\n",
        );
        for &b in &sizes {
            let layers = source(b)?;
            let lc = analytic::latency_coarse(&layers, b) / 1000.0;
            let lf = analytic::latency_fine(&layers, b, thr) / 1000.0;
            let k = 8e9 / mbit;
            let bc = analytic::bandwidth_coarse_m(&layers, b, m) * k;
            let bf = analytic::bandwidth_fine_m(&layers, b, thr, m.min(2000)) * k;
            let bl = analytic::bandwidth_limit(&layers, b) * k;
            let sch = analytic::fine_schedule(&layers, b, thr, m.min(50));
            let bn = &layers[sch.bottleneck].name;
            println!(
                "{b:>8} {lc:>12.2} {lf:>12.2} {bc:>12.1} {bf:>12.1} {bl:>12.1} {:>12} {:>4}",
                trunc(bn, 12),
                sch.u
            );
            let _ = writeln!(csv, "{b},{lc:.4},{lf:.4},{bc:.3},{bf:.3},{bl:.3},{bn},{}", sch.u);
            lat_c.push((b, lc));
            lat_f.push((b, lf));
            bw_c.push((b, bc));
            bw_f.push((b, bf));
        }
    }
    if let Some(f) = a.csv.as_deref() {
        write_file(f, &csv)?;
        eprintln!("wrote {f}");
    }
    if let Some(f) = a.svg.as_deref() {
        let (ls, bs) = if a.dominant {
            (
                vec![svg::Series { name: "dominant latency".into(), points: lat_c }],
                vec![svg::Series { name: "size / dominant".into(), points: bw_c }],
            )
        } else {
            (
                vec![
                    svg::Series { name: "coarse (eq 1)".into(), points: lat_c },
                    svg::Series { name: "fine (eq 3)".into(), points: lat_f },
                ],
                vec![
                    svg::Series { name: "coarse (eq 2)".into(), points: bw_c },
                    svg::Series { name: "fine (eq 4)".into(), points: bw_f },
                ],
            )
        };
        write_file(f, &svg::line_plot("latency", "packet size (bytes)", "latency (µs)", &ls, true))?;
        let f2 = bw_path(f);
        write_file(&f2, &svg::line_plot("bandwidth", "packet size (bytes)", "bandwidth (Mbit/s)", &bs, true))?;
        eprintln!("wrote {f} and {f2}");
    }
    Ok(())
}

fn trunc(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}
