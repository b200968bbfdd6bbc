//! `eudp sim`: the simulator's runs, timelines, sweeps, charts, validation
//! table, preset list and speed.

use super::args::{PresetArgs, SimCmd, SizeList};
use super::io::{bw_path, default_sizes, load, write_file};
use crate::preset;
use crate::sim::{self, Workload};
use crate::{measure, perfetto, step_costs, svg, timeline, validation};
use std::fmt::Write as _;

/// The options of `eudp sim sweep`.
struct Sweep<'a> {
    preset: &'a str,
    stacks: &'a [String],
    sizes: Option<&'a SizeList>,
    buses: &'a [String],
    links: Option<&'a SizeList>,
    messages: usize,
    jobs: Option<usize>,
    csv: &'a str,
    svg: Option<&'a str>,
}

/// Runs one `eudp sim` subcommand.
pub fn sim(c: &SimCmd) -> Result<(), String> {
    match c {
        SimCmd::Run { preset, sizes, messages, bidir, pingpong, csv, svg } => {
            sim_run(preset, sizes.as_ref(), *messages, *bidir, *pingpong, csv.as_deref(), svg.as_deref())
        }
        SimCmd::Timeline { preset, size, messages, layers, json, svg, perfetto } => {
            let outs = [json.as_deref(), svg.as_deref(), perfetto.as_deref()];
            sim_timeline(preset, *size, *messages, layers.as_deref(), outs)
        }
        SimCmd::Chart { trace, svg, layers } => sim_chart(trace, svg, layers.as_deref()),
        SimCmd::Sweep { preset, stacks, sizes, buses, links, messages, jobs, csv, svg } => sim_sweep(&Sweep {
            preset,
            stacks,
            sizes: sizes.as_ref(),
            buses,
            links: links.as_ref(),
            messages: *messages,
            jobs: *jobs,
            csv,
            svg: svg.as_deref(),
        }),
        SimCmd::Validate { markdown } => {
            let rows = validation::validate()?;
            print!("{}", if *markdown { validation::markdown(&rows) } else { validation::text(&rows) });
            Ok(())
        }
        SimCmd::Presets { assumptions } => sim_presets(*assumptions),
        SimCmd::Schemes { preset, step_costs, size, latency_size, bus, link_mbps } => {
            let w = step_costs::Workload {
                bandwidth_bytes: *size,
                latency_bytes: *latency_size,
                bus: Some(bus.clone()),
                link_mbps: Some(*link_mbps),
                ..step_costs::Workload::default()
            };
            print!("{}", sim_schemes(preset, step_costs.as_deref(), &w)?);
            Ok(())
        }
        SimCmd::Bench { packets } => {
            let (ev, secs) = measure::bench(*packets)?;
            println!("{ev} events in {secs:.3} s = {:.2} M events/s", ev as f64 / secs / 1e6);
            Ok(())
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn sim_run(
    pa: &PresetArgs,
    sizes: Option<&SizeList>,
    n: usize,
    bidir: bool,
    pp: bool,
    csv_out: Option<&str>,
    svg_out: Option<&str>,
) -> Result<(), String> {
    let p = load(pa)?;
    let stack = pa.stack.as_str();
    let sizes = sizes.map(|s| s.0.clone()).unwrap_or_else(|| default_sizes(65536.0));
    let unit = p.mbit_bits.v;
    let how = if pp { "ping-pong latency (half round trip)" } else { "one-way latency (1 message)" };
    println!(
        "preset {} stack {stack}: {how} and bandwidth ({n} messages{})",
        p.name,
        if bidir { ", both directions" } else { "" }
    );
    println!("{:>8} {:>14} {:>16}", "bytes", "latency (us)", "bandwidth (Mbit/s)");
    let mut csv = String::from("bytes,latency_us,bandwidth_mbit\n");
    let mut lat = Vec::new();
    let mut bw = Vec::new();
    for &b in &sizes {
        let b = b as u64;
        let l_us = if pp {
            measure::pingpong_us(&p, stack, b)?
        } else {
            sim::run(&p, stack, &Workload { msg_bytes: b, messages: 1, bidirectional: false, timeline: false })?
                .latency_ns()
                / 1000.0
        };
        let s =
            sim::run(&p, stack, &Workload { msg_bytes: b, messages: n.max(1), bidirectional: bidir, timeline: false })?;
        let mb = s.total_bits_per_ns(b) * 1e9 / unit;
        println!("{b:>8} {l_us:>14.2} {mb:>16.1}");
        let _ = writeln!(csv, "{b},{l_us:.4},{mb:.3}");
        lat.push((b as f64, l_us));
        bw.push((b as f64, mb));
    }
    if let Some(f) = csv_out {
        write_file(f, &csv)?;
    }
    if let Some(f) = svg_out {
        write_file(
            f,
            &svg::line_plot(
                &format!("{} {stack}: latency", p.name),
                "message size (bytes)",
                "one-way latency (µs)",
                &[svg::Series { name: stack.into(), points: lat }],
                true,
            ),
        )?;
        write_file(
            &bw_path(f),
            &svg::line_plot(
                &format!("{} {stack}: bandwidth", p.name),
                "message size (bytes)",
                "bandwidth (Mbit/s)",
                &[svg::Series { name: stack.into(), points: bw }],
                true,
            ),
        )?;
    }
    Ok(())
}

fn sim_timeline(
    pa: &PresetArgs,
    size: f64,
    n: usize,
    layers: Option<&str>,
    [json_out, svg_out, perfetto_out]: [Option<&str>; 3],
) -> Result<(), String> {
    let p = load(pa)?;
    let stack = pa.stack.as_str();
    let size = size as u64;
    let r =
        sim::run(&p, stack, &Workload { msg_bytes: size, messages: n.max(1), bidirectional: false, timeline: true })?;
    let mut recs = timeline::from_sim(&r.records);
    filter_layers(&mut recs, layers);
    let idle = measure::link_idle(&r, "tx.link");
    println!(
        "preset {} stack {stack}: {n} x {size} B burst, done at {:.1} us, {} events",
        p.name,
        r.end_ns / 1000.0,
        r.events
    );
    if let Some((from0, active)) = idle {
        println!(
            "sender link idle: {:.1}% of [0, last byte], {:.1}% of [first byte, last byte]",
            from0 * 100.0,
            active * 100.0
        );
    }
    for ru in &r.resources {
        if ru.busy_ns > 0.0 {
            println!(
                "  {:<12} busy {:>10.1} us ({:>5.1}% of run)",
                ru.name,
                ru.busy_ns / 1000.0,
                ru.busy_ns / r.end_ns * 100.0
            );
        }
    }
    if let Some(f) = json_out {
        write_file(f, &timeline::to_json(&recs))?;
        eprintln!("wrote {f}");
    }
    if let Some(f) = svg_out {
        write_file(f, &svg::time_flow(&format!("{} {stack}: {n} x {size} B", p.name), &recs))?;
        eprintln!("wrote {f}");
    }
    if let Some(f) = perfetto_out {
        let slices = perfetto::from_timeline(&format!("sim {} {stack}", p.name), &recs);
        write_file(f, &perfetto::chrome_trace(&slices).to_string())?;
        eprintln!("wrote {f}");
    }
    Ok(())
}

/// Keeps records whose layer, host or host:layer is listed (comma-separated).
fn filter_layers(recs: &mut Vec<timeline::TraceRecord>, keep: Option<&str>) {
    if let Some(keep) = keep {
        let keep: Vec<&str> = keep.split(',').collect();
        recs.retain(|x| {
            keep.iter().any(|k| {
                *k == x.layer
                    || Some(*k) == x.host.as_deref()
                    || format!("{}:{}", x.host.as_deref().unwrap_or(""), x.layer) == *k
            })
        });
    }
}

fn sim_chart(f: &str, out: &str, layers: Option<&str>) -> Result<(), String> {
    let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
    let mut recs = timeline::parse(&text).map_err(|e| format!("{f}: {e}"))?;
    filter_layers(&mut recs, layers);
    if recs.is_empty() {
        return Err(format!("{f}: no records to draw"));
    }
    write_file(out, &svg::time_flow(f, &recs))?;
    eprintln!("wrote {out} ({} rectangles)", recs.len());
    Ok(())
}

fn sim_sweep(s: &Sweep) -> Result<(), String> {
    let base = preset::load(&preset::resolve(s.preset)?)?;
    let stacks = s.stacks;
    for s in stacks {
        if !base.stacks.contains_key(s) {
            return Err(format!("preset {} has no stack {s:?}", base.name));
        }
    }
    let sizes = s.sizes.as_ref().map(|l| l.0.clone()).unwrap_or_else(|| default_sizes(65536.0));
    let buses: Vec<Option<String>> =
        if s.buses.is_empty() { vec![None] } else { s.buses.iter().map(|b| Some(b.clone())).collect() };
    for b in buses.iter().flatten() {
        if preset::bus_rate(b).is_none() {
            return Err(format!("unknown bus {b:?} (known: {})", preset::BUS_NAMES.join(", ")));
        }
    }
    let links: Vec<Option<f64>> = match &s.links {
        Some(v) => v.0.iter().copied().map(Some).collect(),
        None => vec![None],
    };
    let n = s.messages;
    let jobs = s.jobs.unwrap_or_else(|| std::thread::available_parallelism().map(|x| x.get()).unwrap_or(1));
    let csv_path = s.csv;
    let mut grid = Vec::new();
    for s in stacks {
        for b in &buses {
            for l in &links {
                for &z in &sizes {
                    grid.push((s.clone(), b.clone(), *l, z as u64));
                }
            }
        }
    }
    let rows = measure::sweep(&base, &grid, n, jobs.max(1))?;
    let mut csv = String::from("stack,bus,link_mbps,bytes,latency_us,bandwidth_mbit\n");
    for r in &rows {
        let _ = writeln!(csv, "{},{},{},{},{:.4},{:.3}", r.stack, r.bus, r.link, r.bytes, r.latency_us, r.bandwidth);
    }
    write_file(csv_path, &csv)?;
    eprintln!("wrote {csv_path} ({} points)", rows.len());
    if let Some(f) = s.svg {
        let mut lat: Vec<svg::Series> = Vec::new();
        let mut bw: Vec<svg::Series> = Vec::new();
        for r in &rows {
            let key = format!("{} {} {}", r.stack, r.bus, r.link);
            match lat.iter().position(|s| s.name == key) {
                Some(i) => {
                    lat[i].points.push((r.bytes as f64, r.latency_us));
                    bw[i].points.push((r.bytes as f64, r.bandwidth));
                }
                None => {
                    lat.push(svg::Series { name: key.clone(), points: vec![(r.bytes as f64, r.latency_us)] });
                    bw.push(svg::Series { name: key, points: vec![(r.bytes as f64, r.bandwidth)] });
                }
            }
        }
        write_file(f, &svg::line_plot("sweep: latency", "message size (bytes)", "latency (µs)", &lat, true))?;
        write_file(
            &bw_path(f),
            &svg::line_plot("sweep: bandwidth", "message size (bytes)", "bandwidth (Mbit/s)", &bw, true),
        )?;
        eprintln!("wrote {f} and {}", bw_path(f));
    }
    Ok(())
}

fn sim_presets(assumptions: bool) -> Result<(), String> {
    let dir = preset::presets_dir();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot list {}: {e}", dir.display()))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("json"))
        .collect();
    files.sort();
    for f in files {
        let p = preset::load(&f.to_string_lossy())?;
        println!("{} ({}): {}", p.name, f.file_name().and_then(|s| s.to_str()).unwrap_or(""), p.title);
        for (n, s) in &p.stacks {
            println!("  {n:<10} {}", s.description);
        }
        if assumptions {
            let mut seen = std::collections::BTreeSet::new();
            for (field, c) in preset::cited_values(&p) {
                if c.is_assumption() && seen.insert(c.cite.clone()) {
                    println!("    assumed: {} = {} — {}", field, c.v, c.cite);
                }
            }
        }
    }
    Ok(())
}

/// The predicted order of EMP's schemes as text: a row per scheme, then
/// the three orders.
pub fn sim_schemes(preset: &str, costs: Option<&str>, w: &step_costs::Workload) -> Result<String, String> {
    let mut p = preset::load(&preset::resolve(preset)?)?;
    if let Some(f) = costs {
        step_costs::apply(&mut p, &step_costs::load(f)?, f);
    }
    let pr = step_costs::predict(&p, w)?;
    let mut out = format!(
        "preset {} ({}), {} B bandwidth, {} B ping-pong\n{:<6} {:>14} {:>14} {:>12}\n",
        p.name,
        costs.map_or("its own step costs".to_string(), |f| format!("step costs of {f}")),
        w.bandwidth_bytes,
        w.latency_bytes,
        "scheme",
        "uni Mbit/s",
        "bidir Mbit/s",
        "latency us"
    );
    for f in &pr.schemes {
        let _ =
            writeln!(out, "{:<6} {:>14.1} {:>14.1} {:>12.2}", f.scheme, f.unidir_mbit_s, f.bidir_mbit_s, f.latency_us);
    }
    let ranked = |key: fn(&step_costs::SchemeFigures) -> f64| {
        let pairs: Vec<(String, f64)> = pr.schemes.iter().map(|f| (f.scheme.clone(), key(f))).collect();
        step_costs::show(&step_costs::rank(&pairs))
    };
    let _ = writeln!(out, "unidirectional bandwidth: {}", ranked(|f| -f.unidir_mbit_s));
    let _ = writeln!(out, "bidirectional bandwidth:  {}", ranked(|f| -f.bidir_mbit_s));
    let _ = writeln!(out, "latency:                  {}", ranked(|f| f.latency_us));
    Ok(out)
}
