//! Entry points for `eudp model` and `eudp sim` (arguments parsed here).

use crate::analytic::{self, Layer};
use crate::preset::{self, Preset, ResourceSpec};
use crate::sim::{self, Workload};
use crate::{fit, report, svg, timeline};
use std::collections::HashMap;
use std::fmt::Write as _;

/// Parsed `--key value` options and bare flags.
struct Args {
    opts: HashMap<String, String>,
    flags: Vec<String>,
    positional: Vec<String>,
}

fn parse_args(args: &[String], with_value: &[&str], flags: &[&str]) -> Result<Args, String> {
    let mut a = Args { opts: HashMap::new(), flags: Vec::new(), positional: Vec::new() };
    let mut i = 0;
    while i < args.len() {
        let s = &args[i];
        if let Some(k) = s.strip_prefix("--") {
            let (k, inline) = match k.split_once('=') {
                Some((k, v)) => (k, Some(v.to_string())),
                None => (k, None),
            };
            if with_value.contains(&k) {
                let v = match inline {
                    Some(v) => v,
                    None => {
                        i += 1;
                        args.get(i).cloned().ok_or_else(|| format!("--{k} needs a value"))?
                    }
                };
                a.opts.insert(k.to_string(), v);
            } else if flags.contains(&k) {
                a.flags.push(k.to_string());
            } else {
                return Err(format!("unknown option --{k}"));
            }
        } else {
            a.positional.push(s.clone());
        }
        i += 1;
    }
    Ok(a)
}

impl Args {
    fn get(&self, k: &str) -> Option<&str> {
        self.opts.get(k).map(|s| s.as_str())
    }
    fn flag(&self, k: &str) -> bool {
        self.flags.iter().any(|f| f == k)
    }
    fn num<T: std::str::FromStr>(&self, k: &str, default: T) -> Result<T, String> {
        match self.get(k) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|_| format!("--{k}: cannot parse {v:?} as a number")),
        }
    }
    fn list<T: std::str::FromStr>(&self, k: &str) -> Result<Option<Vec<T>>, String> {
        match self.get(k) {
            None => Ok(None),
            Some(v) => v
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    parse_size(s)
                        .and_then(|x| x.to_string().parse::<T>().map_err(|_| ()))
                        .map_err(|_| format!("--{k}: bad list item {s:?}"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
        }
    }
}

/// Parses `1024`, `4k`, `32K`, `1M` (k = 1024).
fn parse_size(s: &str) -> Result<f64, ()> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k') | Some('K') => (&s[..s.len() - 1], 1024.0),
        Some('m') | Some('M') => (&s[..s.len() - 1], 1024.0 * 1024.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>().map(|v| v * mul).map_err(|_| ())
}

fn default_sizes(max: f64) -> Vec<f64> {
    let mut v = vec![1.0];
    let mut x = 2.0;
    while x <= max {
        v.push(x);
        x *= 2.0;
    }
    v
}

fn write_file(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))
}

fn run_main(f: impl FnOnce() -> Result<(), String>, what: &str) -> i32 {
    match f() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("eudp {what}: error: {e}");
            2
        }
    }
}

const MODEL_HELP: &str = "usage: eudp model [SOURCE] [OPTIONS]
  analytical model of 000 §4.4 (eqs. 1-4), Ratemax (000 §4.2) and 001 §5.1

SOURCE (one of):
  --preset NAME|FILE --stack S   layers from a preset stack (g = per-packet + S, G = per-byte)
  --layers FILE                  JSON [{\"name\":..,\"g_ns\":..,\"big_g_ns\":..,\"s_ns\":..}]
  --trace FILE                   fit g + B*G per layer from a trace JSON (records with layer,
                                 packet, bytes, t_start_ns, t_end_ns[, host])
OPTIONS:
  --sizes LIST      packet sizes, e.g. 1,1k,4k,32k (default powers of two up to the MTU/64k)
  --threshold T     fine-grained threshold t in bytes (default: the stack's, else 2048)
  --packets M       packets for finite-m bandwidth (default 1000)
  --bus NAME        override every bus resource (pci32/33, pci64/66, pci64/133, pcie3x8, ...)
  --link-mbps X     override every link rate
  --dominant        001 §5.1 view: per-layer latency, dominant layer, size/dominant latency
  --ratemax N,L2,T_US   print Ratemax = (N + L2) / T
  --csv FILE        write the table as CSV
  --svg FILE        write latency and bandwidth plots (FILE, FILE with -bw before .svg)
";

/// `eudp model ARGS`: returns the process exit code.
pub fn model_main(args: &[String]) -> i32 {
    run_main(|| model(args), "model")
}

fn load_preset(a: &Args) -> Result<Preset, String> {
    let name = a.get("preset").ok_or("--preset is required")?;
    let mut p = preset::load(&preset::resolve(name)?)?;
    apply_overrides(
        &mut p,
        a.get("bus"),
        a.get("link-mbps")
            .map(|s| s.parse::<f64>().map_err(|_| format!("--link-mbps: bad number {s:?}")))
            .transpose()?,
    )?;
    Ok(p)
}

/// Replaces every bus by a named parameter set and/or every link rate.
pub fn apply_overrides(p: &mut Preset, bus: Option<&str>, link_mbps: Option<f64>) -> Result<(), String> {
    if let Some(b) = bus {
        if preset::bus_rate(b).is_none() {
            return Err(format!("unknown bus {b:?} (known: {})", preset::BUS_NAMES.join(", ")));
        }
        for r in p.resources.values_mut() {
            if let ResourceSpec::Bus { .. } = r {
                *r = ResourceSpec::Bus {
                    bus: Some(b.to_string()),
                    width_bits: None,
                    clock_mhz: None,
                    cite: Some("override".into()),
                };
            }
        }
    }
    if let Some(l) = link_mbps {
        if l.is_nan() || l <= 0.0 {
            return Err("--link-mbps must be positive".into());
        }
        for r in p.resources.values_mut() {
            if let ResourceSpec::Link { mbps } = r {
                mbps.v = l;
                mbps.cite = "override".into();
            }
        }
    }
    Ok(())
}

fn model(args: &[String]) -> Result<(), String> {
    let a = parse_args(
        args,
        &[
            "preset",
            "stack",
            "layers",
            "trace",
            "sizes",
            "threshold",
            "packets",
            "csv",
            "svg",
            "ratemax",
            "bus",
            "link-mbps",
        ],
        &["dominant", "help"],
    )?;
    if a.flag("help") || args.is_empty() {
        print!("{MODEL_HELP}");
        return Ok(());
    }
    if !a.positional.is_empty() {
        return Err(format!("unexpected argument {:?}\n{MODEL_HELP}", a.positional[0]));
    }
    if let Some(r) = a.get("ratemax") {
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
        if a.get("preset").is_none() && a.get("layers").is_none() && a.get("trace").is_none() {
            return Ok(());
        }
    }
    let mut mbit = 1e6;
    let mut mtu = 65536.0;
    let mut thr = 2048.0;
    // A source gives layers as a function of packet size.
    let source: Box<dyn Fn(f64) -> Result<Vec<Layer>, String>> = if a.get("preset").is_some() {
        let p = load_preset(&a)?;
        let stack = a.get("stack").ok_or("--stack is required with --preset")?.to_string();
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
    } else if let Some(f) = a.get("layers") {
        let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
        let layers: Vec<Layer> = serde_json::from_str(&text).map_err(|e| format!("{f}: invalid layers JSON: {e}"))?;
        if layers.is_empty() {
            return Err(format!("{f}: no layers"));
        }
        Box::new(move |_| Ok(layers.clone()))
    } else if let Some(f) = a.get("trace") {
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
        return Err(format!("need --preset/--stack, --layers or --trace\n{MODEL_HELP}"));
    };
    let thr = a.num("threshold", thr)?;
    let m: usize = a.num("packets", 1000usize)?;
    if m == 0 {
        return Err("--packets must be >= 1".into());
    }
    let sizes = a.list::<f64>("sizes")?.unwrap_or_else(|| default_sizes(mtu));
    if sizes.iter().any(|&s| s < 1.0) {
        return Err("--sizes must be >= 1 byte".into());
    }
    let mut csv = String::new();
    let mut lat_c = Vec::new();
    let mut lat_f = Vec::new();
    let mut bw_c = Vec::new();
    let mut bw_f = Vec::new();
    if a.flag("dominant") {
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
    if let Some(f) = a.get("csv") {
        write_file(f, &csv)?;
        eprintln!("wrote {f}");
    }
    if let Some(f) = a.get("svg") {
        let (ls, bs) = if a.flag("dominant") {
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

fn bw_path(f: &str) -> String {
    match f.strip_suffix(".svg") {
        Some(s) => format!("{s}-bw.svg"),
        None => format!("{f}-bw.svg"),
    }
}

fn trunc(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

const SIM_HELP: &str = "usage: eudp sim COMMAND [OPTIONS]
commands:
  run       --preset P --stack S [--sizes LIST] [--messages N] [--bidir] [--pingpong] [--bus B]
            [--link-mbps X] [--csv FILE] [--svg FILE]   one-way latency (1 message; with
            --pingpong half the mean round trip of 8 exchanges, as 000 §5.2 and 003 §6.2
            measure it) and steady bandwidth (N messages, default 64) per size
  timeline  --preset P --stack S [--size B] [--messages N] [--bus B] [--link-mbps X]
            [--layers L1,L2] [--json FILE] [--svg FILE]   time-flow chart of a burst (default ten
            32 KB packets); --layers keeps layers by name, host (sender/receiver) or host:layer
  sweep     --preset P --stacks S1,S2 [--sizes LIST] [--buses B1,B2] [--links X1,X2]
            [--messages N] [--jobs J] --csv FILE [--svg FILE]   parameter grid, in parallel
  chart     --trace FILE --svg OUT [--layers L1,L2]   draw any trace JSON (simulated or from
            `eudp trace`) as a time-flow chart
  validate  [--markdown]   published vs simulated headline figures of all presets
  presets   [--assumptions] list presets, stacks and (optionally) every assumed input
  bench     [--packets N]  measure simulator speed (events/s)
";

/// `eudp sim ARGS`: returns the process exit code.
pub fn sim_main(args: &[String]) -> i32 {
    run_main(|| sim_cmd(args), "sim")
}

fn sim_cmd(args: &[String]) -> Result<(), String> {
    let Some(cmd) = args.first() else {
        print!("{SIM_HELP}");
        return Ok(());
    };
    let rest = &args[1..];
    let a = parse_args(
        rest,
        &[
            "preset",
            "stack",
            "stacks",
            "sizes",
            "size",
            "messages",
            "layers",
            "trace",
            "bus",
            "buses",
            "link-mbps",
            "links",
            "csv",
            "svg",
            "json",
            "jobs",
            "packets",
        ],
        &["bidir", "pingpong", "markdown", "assumptions", "help"],
    )?;
    if let Some(p) = a.positional.first() {
        return Err(format!("unexpected argument {p:?}\n{SIM_HELP}"));
    }
    match cmd.as_str() {
        "run" => sim_run(&a),
        "timeline" => sim_timeline(&a),
        "chart" => sim_chart(&a),
        "sweep" => sim_sweep(&a),
        "validate" => {
            let rows = report::validate()?;
            print!("{}", if a.flag("markdown") { report::markdown(&rows) } else { report::text(&rows) });
            Ok(())
        }
        "presets" => sim_presets(&a),
        "bench" => {
            let n: usize = a.num("packets", 200_000usize)?;
            let (ev, secs) = report::bench(n)?;
            println!("{ev} events in {secs:.3} s = {:.2} M events/s", ev as f64 / secs / 1e6);
            Ok(())
        }
        "help" | "--help" | "-h" => {
            print!("{SIM_HELP}");
            Ok(())
        }
        other => Err(format!("unknown command {other:?}\n{SIM_HELP}")),
    }
}

fn sim_run(a: &Args) -> Result<(), String> {
    let p = load_preset(a)?;
    let stack = a.get("stack").ok_or("--stack is required")?;
    let sizes = a.list::<f64>("sizes")?.unwrap_or_else(|| default_sizes(65536.0));
    let n: usize = a.num("messages", 64usize)?;
    let bidir = a.flag("bidir");
    let pp = a.flag("pingpong");
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
            report::pingpong_us(&p, stack, b)?
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
    if let Some(f) = a.get("csv") {
        write_file(f, &csv)?;
    }
    if let Some(f) = a.get("svg") {
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

fn sim_timeline(a: &Args) -> Result<(), String> {
    let p = load_preset(a)?;
    let stack = a.get("stack").ok_or("--stack is required")?;
    let size = a
        .get("size")
        .map(|s| parse_size(s).map_err(|_| format!("--size: bad size {s:?}")))
        .transpose()?
        .unwrap_or(32768.0) as u64;
    let n: usize = a.num("messages", 10usize)?;
    let r =
        sim::run(&p, stack, &Workload { msg_bytes: size, messages: n.max(1), bidirectional: false, timeline: true })?;
    let mut recs = timeline::from_sim(&r.records);
    filter_layers(&mut recs, a.get("layers"));
    let idle = report::link_idle(&r, "tx.link");
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
    if let Some(f) = a.get("json") {
        write_file(f, &timeline::to_json(&recs))?;
        eprintln!("wrote {f}");
    }
    if let Some(f) = a.get("svg") {
        write_file(f, &svg::time_flow(&format!("{} {stack}: {n} x {size} B", p.name), &recs))?;
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

fn sim_chart(a: &Args) -> Result<(), String> {
    let f = a.get("trace").ok_or("--trace FILE is required")?;
    let out = a.get("svg").ok_or("--svg FILE is required")?;
    let text = std::fs::read_to_string(f).map_err(|e| format!("cannot read {f}: {e}"))?;
    let mut recs = timeline::parse(&text).map_err(|e| format!("{f}: {e}"))?;
    filter_layers(&mut recs, a.get("layers"));
    if recs.is_empty() {
        return Err(format!("{f}: no records to draw"));
    }
    write_file(out, &svg::time_flow(f, &recs))?;
    eprintln!("wrote {out} ({} rectangles)", recs.len());
    Ok(())
}

fn sim_sweep(a: &Args) -> Result<(), String> {
    let base = {
        let name = a.get("preset").ok_or("--preset is required")?;
        preset::load(&preset::resolve(name)?)?
    };
    let stacks: Vec<String> =
        a.get("stacks").or(a.get("stack")).ok_or("--stacks is required")?.split(',').map(String::from).collect();
    for s in &stacks {
        if !base.stacks.contains_key(s) {
            return Err(format!("preset {} has no stack {s:?}", base.name));
        }
    }
    let sizes = a.list::<f64>("sizes")?.unwrap_or_else(|| default_sizes(65536.0));
    let buses: Vec<Option<String>> = match a.get("buses") {
        Some(b) => b.split(',').map(|s| Some(s.to_string())).collect(),
        None => vec![None],
    };
    for b in buses.iter().flatten() {
        if preset::bus_rate(b).is_none() {
            return Err(format!("unknown bus {b:?} (known: {})", preset::BUS_NAMES.join(", ")));
        }
    }
    let links: Vec<Option<f64>> = match a.list::<f64>("links")? {
        Some(v) => v.into_iter().map(Some).collect(),
        None => vec![None],
    };
    let n: usize = a.num("messages", 32usize)?;
    let jobs: usize = a.num("jobs", std::thread::available_parallelism().map(|x| x.get()).unwrap_or(1))?;
    let csv_path = a.get("csv").ok_or("--csv FILE is required")?;
    let mut grid = Vec::new();
    for s in &stacks {
        for b in &buses {
            for l in &links {
                for &z in &sizes {
                    grid.push((s.clone(), b.clone(), *l, z as u64));
                }
            }
        }
    }
    let rows = report::sweep(&base, &grid, n, jobs.max(1))?;
    let mut csv = String::from("stack,bus,link_mbps,bytes,latency_us,bandwidth_mbit\n");
    for r in &rows {
        let _ = writeln!(csv, "{},{},{},{},{:.4},{:.3}", r.stack, r.bus, r.link, r.bytes, r.latency_us, r.bandwidth);
    }
    write_file(csv_path, &csv)?;
    eprintln!("wrote {csv_path} ({} points)", rows.len());
    if let Some(f) = a.get("svg") {
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

fn sim_presets(a: &Args) -> Result<(), String> {
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
        if a.flag("assumptions") {
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
