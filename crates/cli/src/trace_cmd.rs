//! `eudp trace`: per-packet, per-layer time flow on one clock (issue 4).
//!
//! ```text
//! eudp trace [--packets N] [--run-packets M] [--size S] [--sizes A,B,..] [--compare kernel,eudp]
//!            [--out DIR] [--testbed NAME] [-- SCENARIO|PROGRAM ARGS...]
//! ```
//!
//! SCENARIO `burst` (the default): on a fresh testbed, for every stack and
//! every size of the sweep, a receiver on host b and a sender on host a that
//! sends N datagrams back to back (payloads carry their sequence number; the
//! receiver checks order and loss). Each worker records tracepoints
//! (`eudp_engine::tracepoint`) and dumps them; the parent joins the dumps into
//! one path per packet, writes `trace.json`, `trace.svg` and `table.txt` to
//! DIR and prints the table. A PROGRAM is run with `EUDP_TRACE` set; each of
//! its processes that uses eudp endpoints writes its own dump, and the
//! busiest flow among them (one process sending to itself, or a client and
//! its server) is analysed the same way. With `--compare kernel,...` it runs
//! once more with `EUDP_TRACE_STACK=kernel`: the shim then leaves the
//! sockets on the kernel and traces them (`eudp_preload::ktrace`).
//!
//! Hidden: `eudp trace worker send|recv ...` is one side of a transfer.

use crate::testbed::{unique_name, Testbed, ADDR_B};
use crate::trace_costs;
use eudp_engine::backend::kernel::{InMeta, UdpSocket};
use eudp_engine::sys::poll::{poll_readable, poll_writable};
use eudp_engine::tracepoint::{self, EpTrace};
use eudp_engine::{Config, Endpoint, Engine};
use eudp_trace::resolve::{self, Dump, Path};
use eudp_trace::{chart, table, StackPaths, TraceDoc};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "usage: eudp trace [--packets N] [--run-packets M] [--size S] [--sizes A,B,..] [--compare kernel,eudp] [--out DIR] [--testbed NAME] [--overhead REPS [--overhead-modes full,user,noclock,sample16,control]] [-- burst | PROGRAM ARGS...]";

/// Entry point of `eudp trace`.
pub fn trace_main(args: &[String]) -> i32 {
    let r = if args.first().map(String::as_str) == Some("worker") { worker(&args[1..]) } else { run(args) };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("eudp trace: {e}");
            1
        }
    }
}

/// Options of `eudp trace`.
#[derive(Clone, Debug)]
pub struct TraceArgs {
    /// Packets charted (the first N of each run).
    pub packets: u64,
    /// Packets per run (at least `packets`); the table uses all of them.
    pub run_packets: u64,
    pub size: u64,
    pub sizes: Vec<u64>,
    pub stacks: Vec<String>,
    pub out: std::path::PathBuf,
    pub testbed: Option<String>,
    /// Empty or `burst`: the built-in scenario; otherwise a program.
    pub target: Vec<String>,
    /// Instead of tracing: this many alternating untraced/traced transfers
    /// per stack and size, comparing their receive rates.
    pub overhead_reps: u32,
    /// The traced settings `--overhead` compares with untraced runs
    /// ([`Variant::named`]); default `full`.
    pub overhead_modes: Vec<String>,
    /// `--compare` was given (a PROGRAM runs once per stack only then).
    pub stacks_given: bool,
}

impl Default for TraceArgs {
    fn default() -> Self {
        TraceArgs {
            packets: 32,
            run_packets: 512,
            size: 1472,
            sizes: vec![64, 256, 512, 1024, 1472],
            stacks: vec!["kernel".into(), "eudp".into()],
            out: "trace-out".into(),
            testbed: None,
            target: Vec::new(),
            overhead_reps: 0,
            overhead_modes: vec!["full".into()],
            stacks_given: false,
        }
    }
}

fn parse_list<T: std::str::FromStr>(v: &str, what: &str) -> Result<Vec<T>, String> {
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| s.trim().parse().map_err(|_| format!("{what}: bad value {s:?}")))
        .collect()
}

/// Parses the command line (without the `trace` word).
pub fn parse_args(args: &[String]) -> Result<TraceArgs, String> {
    let mut a = TraceArgs::default();
    let mut i = 0;
    let mut sizes_given = false;
    while i < args.len() {
        let k = args[i].as_str();
        let val = |i: usize| args.get(i + 1).cloned().ok_or_else(|| format!("{k} needs a value\n{USAGE}"));
        match k {
            "--" => {
                a.target = args[i + 1..].to_vec();
                break;
            }
            "--packets" => a.packets = val(i)?.parse().map_err(|_| "--packets: bad number")?,
            "--run-packets" => a.run_packets = val(i)?.parse().map_err(|_| "--run-packets: bad number")?,
            "--size" => a.size = val(i)?.parse().map_err(|_| "--size: bad number")?,
            "--sizes" => {
                a.sizes = parse_list(&val(i)?, "--sizes")?;
                sizes_given = true;
            }
            "--compare" | "--stacks" => {
                a.stacks = parse_list(&val(i)?, "--compare")?;
                a.stacks_given = true;
            }
            "--out" => a.out = val(i)?.into(),
            "--testbed" => a.testbed = Some(val(i)?),
            "--overhead" => a.overhead_reps = val(i)?.parse().map_err(|_| "--overhead: bad number")?,
            "--overhead-modes" => a.overhead_modes = parse_list(&val(i)?, "--overhead-modes")?,
            "-h" | "--help" => return Err(USAGE.into()),
            s if s.starts_with("--") => return Err(format!("unknown option {s}\n{USAGE}")),
            _ => {
                a.target = args[i..].to_vec();
                break;
            }
        }
        i += if k.starts_with("--") { 2 } else { 1 };
    }
    if a.packets == 0 || a.size == 0 {
        return Err("--packets and --size must be positive".into());
    }
    for m in &a.overhead_modes {
        Variant::named(m)?;
    }
    for s in &a.stacks {
        if s != "kernel" && s != "eudp" {
            return Err(format!("--compare: unknown stack {s:?} (kernel, eudp)"));
        }
    }
    // The charted size joins the sweep, except where nothing is charted:
    // `--overhead` measures the sizes it is given and no others.
    let charted = !(sizes_given && a.overhead_reps > 0);
    if charted && !a.sizes.contains(&a.size) {
        a.sizes.push(a.size);
    }
    a.sizes.sort_unstable();
    a.sizes.dedup();
    a.run_packets = a.run_packets.max(a.packets);
    Ok(a)
}

fn run(args: &[String]) -> Result<(), String> {
    let a = parse_args(args)?;
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let doc = match a.target.first().map(String::as_str) {
        None | Some("burst") => {
            let tb = match &a.testbed {
                Some(n) => Testbed::existing(n)?,
                None => Testbed::up(&unique_name("trc"))?,
            };
            if a.overhead_reps > 0 {
                return overhead(&tb, &a);
            }
            burst(&tb, &a)?
        }
        Some(_) => program(&a)?,
    };
    write_outputs(&a.out, &doc)?;
    println!("{}", table::render(&doc.runs, &doc.fits, &doc.crossovers));
    if !doc.notes.is_empty() {
        println!("notes:");
        for n in &doc.notes {
            println!("  {n}");
        }
    }
    if !doc.problems.is_empty() {
        println!("problems:");
        for p in &doc.problems {
            println!("  {p}");
        }
    }
    println!("wrote {0}/trace.json, {0}/trace.svg, {0}/table.txt", a.out.display());
    Ok(())
}

/// Writes trace.json, trace.svg and table.txt.
pub fn write_outputs(dir: &std::path::Path, doc: &TraceDoc) -> Result<(), String> {
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"));
    w("trace.json", &serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?)?;
    let stacks: Vec<&str> = doc.stacks.iter().map(String::as_str).collect();
    let title = format!("{} datagrams of {} B, host a -> host b: {}", doc.packets, doc.size, doc.stacks.join(" | "));
    w("trace.svg", &chart::side_by_side(&title, &stacks, &doc.records))?;
    w("table.txt", &table::render(&doc.runs, &doc.fits, &doc.crossovers))
}

/// The analysis of one traced run.
pub struct Analysed {
    pub stack: String,
    pub size: u64,
    pub paths: Vec<Path>,
    pub records: Vec<resolve::Record>,
    pub row: table::RunRow,
    pub problems: Vec<String>,
    pub notes: Vec<String>,
}

/// Cross-clock tolerance of the path-order check (kernel stamps are mapped
/// from CLOCK_REALTIME).
pub const ORDER_TOLERANCE_NS: u64 = 1_000;

/// Joins dumps and summarises one run.
pub fn analyse(stack: &str, size: u64, sender: &Dump, receiver: &Dump) -> Analysed {
    analyse_lossy(stack, size, sender, receiver, u64::MAX)
}

/// As [`analyse`] for a run whose receiver got only its first `received`
/// arrivals (matched by order): the receiver's layers of the packets that
/// never arrived are not holes; every sender layer of every packet and
/// every layer of each arrival still must be there.
pub fn analyse_lossy(stack: &str, size: u64, sender: &Dump, receiver: &Dump, received: u64) -> Analysed {
    let mut r = analyse_paths(stack, size, resolve::join(sender, receiver), received);
    for (d, who) in [(sender, "sender"), (receiver, "receiver")] {
        if d.dropped > 0 {
            r.problems.push(format!(
                "{stack} {size} B: {who} dropped {} events (buffer full; raise EUDP_TRACE_EVENTS)",
                d.dropped
            ));
        }
    }
    r
}

/// The summary of joined `paths` (see [`analyse_lossy`]).
fn analyse_paths(stack: &str, size: u64, paths: Vec<Path>, received: u64) -> Analysed {
    let (records, mut missing) = resolve::records(stack, &paths);
    let host = |l: &str| resolve::LAYERS.iter().find(|d| d.name == l).map_or("", |d| d.host);
    missing.retain(|&(p, l)| p < received || host(l) == "sender");
    let mut problems = Vec::new();
    if !missing.is_empty() {
        let (p, l) = missing[0];
        problems.push(format!(
            "{stack} {size} B: {} (packet, layer) pairs missing, first packet {p} layer {l}",
            missing.len()
        ));
    }
    let v = resolve::order_violations(&paths, ORDER_TOLERANCE_NS);
    if let Some((p, x, y, d)) = v.first() {
        problems.push(format!(
            "{stack} {size} B: {} path-order violations, first packet {p}: {x} is {d} ns after {y}",
            v.len()
        ));
    }
    let row = table::run_row(stack, size, &records, table::measured_gbps(&records));
    Analysed { stack: stack.into(), size, paths, records, row, problems, notes: Vec::new() }
}

/// Builds the document from analysed runs.
pub fn document(a: &TraceArgs, runs: Vec<Analysed>) -> TraceDoc {
    let mut doc = TraceDoc {
        schema: "eudp-trace/1",
        clock: "CLOCK_MONOTONIC_RAW",
        size: a.size,
        packets: a.packets as usize,
        stacks: a.stacks.clone(),
        records: Vec::new(),
        paths: Vec::new(),
        runs: Vec::new(),
        fits: Vec::new(),
        crossovers: Vec::new(),
        problems: Vec::new(),
        notes: Vec::new(),
    };
    for r in runs {
        doc.problems.extend(r.problems);
        doc.notes.extend(r.notes);
        if r.size == a.size {
            doc.records.extend(r.records.into_iter().filter(|x| x.packet < a.packets));
            let paths = r.paths.into_iter().filter(|p| p.packet < a.packets).collect();
            doc.paths.push(StackPaths { stack: r.stack.clone(), point_names: resolve::POINTS, paths });
        }
        doc.runs.push(r.row);
    }
    let (lo, hi) =
        (a.sizes.iter().min().copied().unwrap_or(1) as f64, a.sizes.iter().max().copied().unwrap_or(1) as f64);
    for s in &a.stacks {
        if a.sizes.len() >= 2 {
            let fits = table::fit_layers(s, &doc.runs);
            doc.crossovers.extend(table::crossovers(s, &fits, lo, hi));
            doc.fits.extend(fits);
        }
    }
    doc
}

fn exe() -> String {
    std::env::var("EUDP_TRACE_EXE")
        .ok()
        .or_else(|| std::env::current_exe().ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| "eudp".into())
}

fn spawn(tb: &Testbed, host: char, args: &[String], env: &[(&str, &str)]) -> Result<Child, String> {
    let mut c = tb.command(host, &exe());
    c.arg("trace").arg("worker").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.env_remove("EUDP_TRACE");
    c.envs(env.iter().copied());
    c.spawn().map_err(|e| format!("cannot start trace worker: {e}"))
}

fn wait(mut c: Child, what: &str, limit: Duration) -> Result<String, String> {
    let t0 = Instant::now();
    while c.try_wait().map_err(|e| e.to_string())?.is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return Err(format!("{what} did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !c.wait().map(|s| s.success()).unwrap_or(false) {
        return Err(format!("{what} failed: {}", err.trim()));
    }
    Ok(out)
}

/// One traced transfer of `packets` datagrams of `size` bytes with `stack`
/// on the testbed; returns the sender's and the receiver's dumps.
/// What the receiver of a transfer saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct RxReport {
    pub received: u64,
    pub out_of_order: u64,
    pub gbps: f64,
    /// CPU time (ns, all threads) the sender spent sending and the receiver
    /// receiving (their dumps excluded).
    pub tx_cpu_ns: u64,
    pub rx_cpu_ns: u64,
    /// Times the sender's and the receiver's threads were switched in.
    pub tx_switches: u64,
    pub rx_switches: u64,
    /// CPU time (ns) of the sender's and the receiver's application thread
    /// alone, and the wall time (ns) over which each side's CPU was counted
    /// (its busy share: CPU / wall).
    pub tx_app_cpu_ns: u64,
    pub rx_app_cpu_ns: u64,
    pub tx_wall_ns: u64,
    pub rx_wall_ns: u64,
}

/// One transfer; `trace` turns the tracepoints on, `tag` has the receiver
/// tag each datagram with its payload sequence number.
pub fn transfer(
    tb: &Testbed,
    stack: &str,
    size: u64,
    packets: u64,
    dir: &std::path::Path,
    trace: bool,
    tag: bool,
) -> Result<(Dump, Dump, RxReport), String> {
    let v = if trace { Variant::named("full")? } else { Variant::named("off")? };
    transfer_variant(tb, stack, size, packets, dir, &v, tag)
}

/// A setting of `eudp trace --overhead`: traced or not, and the
/// environment its workers run with.
#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    pub trace: bool,
    pub env: Vec<(&'static str, &'static str)>,
    /// Its traces must be complete (every layer of every packet, in order).
    pub complete: bool,
    /// What it records, for the report.
    pub what: &'static str,
}

impl Variant {
    /// `off`; `full` (every layer of every packet, the issue's setting);
    /// `user` (no kernel stamps); `txstamps`, `rxstamps` (only the kernel's
    /// TX stamps, only its RX stamps); `noclock` (every event, no clock read:
    /// a measurement of what the clock reads cost, its times are
    /// meaningless); `recvmmsg` (as `full`, the TX stamps read without
    /// io_uring); `sampleN` (application calls of one packet in N);
    /// `control` (untraced again: an A/A control, whose ratio to `off` is
    /// the harness's own bias and spread, so a traced ratio can be read
    /// against it).
    pub fn named(name: &str) -> Result<Variant, String> {
        let v = |trace, env: Vec<(&'static str, &'static str)>, complete, what| Variant {
            name: name.into(),
            trace,
            env,
            complete,
            what,
        };
        Ok(match name {
            "off" => v(false, vec![], false, "untraced"),
            "control" => v(false, vec![], false, "untraced again (A/A control: the harness's own bias and spread)"),
            "full" => v(true, vec![], true, "every layer of every packet, kernel stamps included"),
            "user" => v(true, vec![("EUDP_TRACE_KERNEL", "0")], false, "user-space points only (no SO_TIMESTAMPING)"),
            "txstamps" => v(true, vec![("EUDP_TRACE_KERNEL", "tx")], false, "user-space points and kernel TX stamps (no RX_SOFTWARE)"),
            "rxstamps" => v(true, vec![("EUDP_TRACE_KERNEL", "rx")], false, "user-space points and kernel RX stamps (no TX stamps)"),
            "noclock" => v(true, vec![("EUDP_TRACE_CLOCK", "none")], false, "every event, no clock read (experiment: no timing)"),
            "recvmmsg" => v(true, vec![("EUDP_TRACE_STAMP_READER", "recvmmsg")], true, "as full, TX stamps read with recvmmsg only (no io_uring)"),
            s if s.starts_with("sample") => {
                let k: u64 = s["sample".len()..].parse().map_err(|_| format!("--overhead-modes: bad mode {s:?}"))?;
                let k: &'static str = Box::leak(k.to_string().into_boxed_str());
                v(true, vec![("EUDP_TRACE_SAMPLE", k)], false, "application calls of one packet in N")
            }
            s => return Err(format!("--overhead-modes: unknown mode {s:?} (full, user, txstamps, rxstamps, noclock, recvmmsg, sampleN, control)")),
        })
    }
}

/// As [`transfer`], in a given setting (the dumps are read only when its
/// traces are to be checked).
pub fn transfer_variant(
    tb: &Testbed,
    stack: &str,
    size: u64,
    packets: u64,
    dir: &std::path::Path,
    v: &Variant,
    tag: bool,
) -> Result<(Dump, Dump, RxReport), String> {
    let trace = v.trace;
    let port = 9400 + (size % 500) as u16;
    let rx_file = dir.join(format!("raw-{stack}-{size}-rx.json"));
    let tx_file = dir.join(format!("raw-{stack}-{size}-tx.json"));
    let common = |role: &str, f: &std::path::Path| -> Vec<String> {
        let mut v = vec![
            role.into(),
            "--stack".into(),
            stack.into(),
            "--size".into(),
            size.to_string(),
            "--count".into(),
            packets.to_string(),
            "--out".into(),
            f.display().to_string(),
        ];
        if !trace {
            v.push("--off".into());
        }
        if !tag {
            v.push("--no-tag".into());
        }
        v
    };
    let mut ra = common("recv", &rx_file);
    ra.extend(["--addr".into(), format!("0.0.0.0:{port}")]);
    let mut rx = spawn(tb, 'b', &ra, &v.env)?;
    let mut reader = crate::bench::await_ready(&mut rx, "trace receiver")?;
    let mut sa = common("send", &tx_file);
    sa.extend(["--addr".into(), format!("{ADDR_B}:{port}")]);
    let tx = spawn(tb, 'a', &sa, &v.env)?;
    let limit = Duration::from_secs(30 + packets / 10_000);
    let txout = wait(tx, "trace sender", limit)?;
    let mut rest = String::new();
    let rxout = wait(rx, "trace receiver", limit);
    let _ = reader.read_to_string(&mut rest);
    rxout?;
    let report: serde_json::Value = rest
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or("trace receiver printed no report")?;
    let tx_report =
        txout.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).unwrap_or_default();
    let rep = RxReport {
        received: report["received"].as_u64().unwrap_or(0),
        out_of_order: report["out_of_order"].as_u64().unwrap_or(0),
        gbps: report["gbps"].as_f64().unwrap_or(0.0),
        tx_cpu_ns: tx_report["cpu_ns"].as_u64().unwrap_or(0),
        rx_cpu_ns: report["cpu_ns"].as_u64().unwrap_or(0),
        tx_switches: tx_report["switches"].as_u64().unwrap_or(0),
        rx_switches: report["switches"].as_u64().unwrap_or(0),
        tx_app_cpu_ns: tx_report["app_cpu_ns"].as_u64().unwrap_or(0),
        rx_app_cpu_ns: report["app_cpu_ns"].as_u64().unwrap_or(0),
        tx_wall_ns: tx_report["wall_ns"].as_u64().unwrap_or(0),
        rx_wall_ns: report["wall_ns"].as_u64().unwrap_or(0),
    };
    let load = |f: &std::path::Path| -> Result<Dump, String> {
        resolve::parse_dump(&std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?)
    };
    if !trace || !v.complete {
        return Ok((Dump::default(), Dump::default(), rep));
    }
    Ok((load(&tx_file)?, load(&rx_file)?, rep))
}

fn burst(tb: &Testbed, a: &TraceArgs) -> Result<TraceDoc, String> {
    let mut runs = Vec::new();
    for &size in &a.sizes {
        for stack in &a.stacks {
            let (tx, rx, rep) = transfer(tb, stack, size, a.run_packets, &a.out, true, true)?;
            let mut r = analyse(stack, size, &tx, &rx);
            if rep.received != a.run_packets || rep.out_of_order != 0 {
                r.problems.push(format!(
                    "{stack} {size} B: {} of {} datagrams received, {} out of order",
                    rep.received, a.run_packets, rep.out_of_order
                ));
            }
            runs.push(r);
        }
    }
    Ok(document(a, runs))
}

/// Receive rates of untraced and traced transfers, interleaved, with the
/// median of each and their ratio; also written to DIR/overhead.txt. Each
/// repetition runs one untraced transfer and one per traced setting
/// (`--overhead-modes`), in an order that rotates from one repetition to
/// the next, so drift of the shared machine falls on every setting alike.
/// On a shared machine the rates swing with other jobs, so the CPU time
/// each side spent per datagram (sender: per datagram sent, receiver: per
/// datagram received) is reported too, a steadier measure of the same
/// cost, as well as the median of the per-repetition (paired) ratios.
/// Every `full` transfer is analysed: a rate counts as fully traced only
/// if its trace has every layer of every packet that arrived.
fn overhead(tb: &Testbed, a: &TraceArgs) -> Result<(), String> {
    use std::fmt::Write as _;
    let mut vars = vec![Variant::named("off")?];
    for m in &a.overhead_modes {
        vars.push(Variant::named(m)?);
    }
    let mut out = format!(
        "{} datagrams per transfer, {} repetitions; each runs untraced and {} once, interleaved (order rotating); medians (ranges)\n\
         rate: Gbit/s at the receiver; cpu: ns of CPU per datagram, sender (per sent) + receiver (per received)\n\
         on/off: ratio of the medians; paired: median of the per-repetition ratios\n",
        a.run_packets,
        a.overhead_reps,
        a.overhead_modes.join(", ")
    );
    for v in &vars[1..] {
        let _ = writeln!(out, "  {}: {}", v.name, v.what);
    }
    let _ = writeln!(out, "app: ns of CPU per datagram of the sender's, the receiver's application thread alone; busy%: its CPU over the wall time its side's CPU was counted");
    let _ = writeln!(out, "switches: times the sender's, the receiver's threads were switched in, per 1000 datagrams");
    // The unit costs of the points a full trace records, measured before
    // the transfers and again after them; the lower of each is used, so the
    // floor stays a lower bound.
    let uc_before = trace_costs::unit_costs().map_err(|e| format!("measuring unit costs: {e}"))?;
    let _ = writeln!(
        out,
        "{:<7} {:>6} {:<9} {:>8} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  ranges",
        "stack",
        "size",
        "mode",
        "rate",
        "on/off",
        "paired",
        "cpu",
        "off/on",
        "paired",
        "tx,rx",
        "app",
        "busy%",
        "switches"
    );
    let mut json_runs = Vec::new();
    let mut floors: Vec<Floor> = Vec::new();
    for &size in &a.sizes {
        for stack in &a.stacks {
            // Per setting: rates, CPU ns per datagram (total, sender, receiver), datagrams lost.
            let n = vars.len();
            let (mut rate, mut cpu, mut tx_cpu, mut rx_cpu) =
                (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
            let mut lost = vec![0u64; n];
            let (mut tx_sw, mut rx_sw) = (vec![vec![]; n], vec![vec![]; n]);
            // Application threads: CPU ns per datagram, busy share, each side.
            let (mut tx_app, mut rx_app, mut tx_busy, mut rx_busy) =
                (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
            // Kernel TX stamps per datagram sent, and the share of kernel
            // messages the sender's application thread sent, in each
            // complete trace.
            let (mut stamps_per_dgram, mut app_msgs) = (Vec::new(), Vec::new());
            let mut problems = Vec::new();
            for r in 0..a.overhead_reps as usize {
                for j in 0..n {
                    let k = (r + j) % n;
                    let (tx, rx, rep) = transfer_variant(tb, stack, size, a.run_packets, &a.out, &vars[k], false)?;
                    lost[k] += a.run_packets.saturating_sub(rep.received);
                    rate[k].push(rep.gbps);
                    let (t, x) = (
                        rep.tx_cpu_ns as f64 / a.run_packets as f64,
                        rep.rx_cpu_ns as f64 / rep.received.max(1) as f64,
                    );
                    tx_cpu[k].push(t);
                    rx_cpu[k].push(x);
                    cpu[k].push(t + x);
                    tx_sw[k].push(1000.0 * rep.tx_switches as f64 / a.run_packets as f64);
                    rx_sw[k].push(1000.0 * rep.rx_switches as f64 / rep.received.max(1) as f64);
                    let (ta, xa) = (
                        rep.tx_app_cpu_ns as f64 / a.run_packets as f64,
                        rep.rx_app_cpu_ns as f64 / rep.received.max(1) as f64,
                    );
                    let busy = |cpu: u64, wall: u64| if wall > 0 { cpu as f64 / wall as f64 } else { f64::NAN };
                    let (tb_, xb) = (busy(rep.tx_app_cpu_ns, rep.tx_wall_ns), busy(rep.rx_app_cpu_ns, rep.rx_wall_ns));
                    tx_app[k].push(ta);
                    rx_app[k].push(xa);
                    tx_busy[k].push(tb_);
                    rx_busy[k].push(xb);
                    json_runs.push(serde_json::json!({"stack": stack, "size": size, "rep": r, "mode": vars[k].name, "gbps": rep.gbps, "received": rep.received,
                        "tx_cpu_ns_per_dgram": t, "rx_cpu_ns_per_dgram": x, "tx_switches": rep.tx_switches, "rx_switches": rep.rx_switches,
                        "tx_app_cpu_ns_per_dgram": ta, "rx_app_cpu_ns_per_dgram": xa, "tx_app_busy": tb_, "rx_app_busy": xb}));
                    if vars[k].complete {
                        let stamps = tx
                            .events
                            .iter()
                            .filter(|e| e.1 == resolve::kind::TX_SCHED || e.1 == resolve::kind::TX_SOFT)
                            .count();
                        stamps_per_dgram.push(stamps as f64 / a.run_packets.max(1) as f64);
                        if let Some(share) = app_thread_msg_share(&tx) {
                            app_msgs.push(share);
                        }
                        problems.extend(analyse_lossy(stack, size, &tx, &rx, rep.received).problems);
                    }
                }
            }
            let total = (a.run_packets * u64::from(a.overhead_reps)).max(1) as f64;
            let (r0, rr0) = summary(&rate[0]);
            let (c0, cr0) = summary(&cpu[0]);
            let _ = writeln!(
                out,
                "{stack:<7} {size:>6} {:<9} {r0:>8.3} {:>7} {:>7} {c0:>6.0} {:>7} {:>7} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>4.0},{:<4.0}  rate {rr0}, cpu {cr0}, lost {:.1}%",
                "off",
                "",
                "",
                "",
                "",
                summary(&tx_cpu[0]).0,
                summary(&rx_cpu[0]).0,
                summary(&tx_app[0]).0,
                summary(&rx_app[0]).0,
                100.0 * summary(&tx_busy[0]).0,
                100.0 * summary(&rx_busy[0]).0,
                summary(&tx_sw[0]).0,
                summary(&rx_sw[0]).0,
                100.0 * lost[0] as f64 / total
            );
            for k in 1..n {
                let (r1, rr1) = summary(&rate[k]);
                let (c1, cr1) = summary(&cpu[k]);
                let paired = |v: &[f64], base: &[f64], inv: bool| {
                    summary(&v.iter().zip(base).map(|(x, b)| if inv { b / x } else { x / b }).collect::<Vec<_>>()).0
                };
                let _ = writeln!(
                    out,
                    "{stack:<7} {size:>6} {:<9} {r1:>8.3} {:>7.3} {:>7.3} {c1:>6.0} {:>7.3} {:>7.3} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>4.0},{:<4.0}  rate {rr1}, cpu {cr1}, lost {:.1}%",
                    vars[k].name,
                    r1 / r0,
                    paired(&rate[k], &rate[0], false),
                    c0 / c1,
                    paired(&cpu[k], &cpu[0], true),
                    summary(&tx_cpu[k]).0,
                    summary(&rx_cpu[k]).0,
                    summary(&tx_app[k]).0,
                    summary(&rx_app[k]).0,
                    100.0 * summary(&tx_busy[k]).0,
                    100.0 * summary(&rx_busy[k]).0,
                    summary(&tx_sw[k]).0,
                    summary(&rx_sw[k]).0,
                    100.0 * lost[k] as f64 / total
                );
            }
            if !stamps_per_dgram.is_empty() {
                floors.push(Floor {
                    stack: stack.clone(),
                    size,
                    stamps: summary(&stamps_per_dgram).0,
                    cpu: c0,
                    tx_cpu: summary(&tx_cpu[0]).0,
                    rx_cpu: summary(&rx_cpu[0]).0,
                    app: AppThread {
                        cpu: summary(&tx_app[0]).0,
                        busy: summary(&tx_busy[0]).0,
                        msg_share: if app_msgs.is_empty() { 0.0 } else { summary(&app_msgs).0 },
                    },
                });
            }
            if vars.iter().any(|v| v.complete) {
                let complete = if problems.is_empty() {
                    "every full-traced run complete (every layer of every packet that arrived)".to_string()
                } else {
                    format!("INCOMPLETE traces: {}", problems.join("; "))
                };
                let _ = writeln!(out, "        {complete}");
            }
            print_tail(&out, n + 1);
        }
    }
    let uc_after = trace_costs::unit_costs().map_err(|e| format!("measuring unit costs: {e}"))?;
    let floor_json = floor_report(&mut out, &uc_before, &uc_after, &floors);
    print_tail(&out, floors.len() + 1);
    std::fs::write(a.out.join("overhead.txt"), &out).map_err(|e| e.to_string())?;
    let doc = serde_json::json!({"command": std::env::args().collect::<Vec<_>>(), "load_avg_end": std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim(),
        "run_packets": a.run_packets, "reps": a.overhead_reps, "modes": a.overhead_modes, "table": out, "runs": json_runs, "floor": floor_json});
    std::fs::write(a.out.join("overhead.json"), serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| e.to_string())?;
    println!("wrote {0}/overhead.txt, {0}/overhead.json", a.out.display());
    Ok(())
}

/// Prints the last `n` lines of `out` (the report's part just written).
fn print_tail(out: &str, n: usize) {
    let lines: Vec<&str> = out.lines().collect();
    for l in &lines[lines.len().saturating_sub(n)..] {
        println!("{l}");
    }
}

/// What `--overhead` keeps of a traced (stack, size) for its floor.
#[derive(Clone, Debug)]
struct Floor {
    stack: String,
    size: u64,
    /// Kernel TX stamps per datagram sent in the full traces (median).
    stamps: f64,
    /// Untraced CPU ns per datagram: both sides, the sender, the receiver (medians).
    cpu: f64,
    tx_cpu: f64,
    rx_cpu: f64,
    /// The sender's application thread, untraced (medians).
    app: AppThread,
}

/// The sender's application thread: it makes the send calls, and with the
/// default policy (`EUDP_TX_CALLER_DRAIN`) also the send syscalls of a
/// stream. Busy nearly all the time, it bounds the rate, so what tracing
/// adds to it sets the traced rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct AppThread {
    /// CPU ns per datagram.
    cpu: f64,
    /// Its CPU over the wall time of the sending (0-1).
    busy: f64,
    /// Share of the kernel messages it sent itself (from the full traces;
    /// the engine thread sent the rest), hence of the TX stamps it made.
    msg_share: f64,
}

/// A thread this busy (CPU over wall time) or more is taken to bound its
/// side's rate (a streaming sender's application thread runs 88-92% of the
/// time on the test VM; the rest it waits for room).
const BOUND_BUSY: f64 = 0.85;

/// The share of a full trace's kernel messages sent by its application
/// thread (the thread that recorded the send calls); `None` without any.
fn app_thread_msg_share(tx: &Dump) -> Option<f64> {
    let mut calls: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for e in tx.events.iter().filter(|e| e.1 == resolve::kind::SEND_CALL) {
        *calls.entry(e.3).or_default() += 1;
    }
    let app = calls.into_iter().max_by_key(|&(_, n)| n)?.0;
    let (mut total, mut mine) = (0u64, 0u64);
    for e in tx.events.iter().filter(|e| e.1 == resolve::kind::KMSG) {
        total += 1;
        mine += u64::from(e.3 == app);
    }
    (total > 0).then(|| mine as f64 / total as f64)
}

/// A [`Floor`] at given unit costs: the least CPU a full trace adds per
/// datagram on each side, and its share of that side's untraced CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
struct FloorShares {
    /// Sender: its application thread's two clock reads and the stamps its
    /// sends make; receiver: its two clock reads (ns per datagram).
    tx_floor: f64,
    rx_floor: f64,
    /// Shares of the untraced CPU per datagram: sender, receiver, both.
    tx: f64,
    rx: f64,
    total: f64,
    /// The sender's application thread: its send call's two clock reads
    /// and the stamps of the messages it sent (ns per datagram), and their
    /// share of its untraced CPU.
    app_floor: f64,
    app: f64,
}

impl FloorShares {
    /// The smallest of the three shares: above 10%, no side can be traced
    /// in full for 10% more CPU.
    fn least(&self) -> f64 {
        self.total.min(self.tx).min(self.rx)
    }
}

impl Floor {
    fn shares(&self, uc: &trace_costs::UnitCosts) -> FloorShares {
        let (tx_floor, rx_floor) = trace_costs::floor_by_side(uc, self.stamps);
        // The sender's floor, with only the stamps of its own messages.
        let app_floor = trace_costs::floor_by_side(uc, self.stamps * self.app.msg_share).0;
        FloorShares {
            tx_floor,
            rx_floor,
            tx: tx_floor / self.tx_cpu,
            rx: rx_floor / self.rx_cpu,
            total: (tx_floor + rx_floor) / self.cpu,
            app_floor,
            app: app_floor / self.app.cpu,
        }
    }

    /// About the traced/untraced rate the floor alone would allow when the
    /// sender's application thread bounds the rate (busy [`BOUND_BUSY`] or
    /// more): its time per datagram grows by the floor. An estimate, not a
    /// bound: the thread may overlap part of a clock read with its other
    /// work, or with the time it waits. `None` when it does not bound it.
    fn rate_at_floor(&self, s: &FloorShares) -> Option<f64> {
        (self.app.busy >= BOUND_BUSY).then(|| 1.0 / (1.0 + s.app))
    }
}

/// Appends the overhead floor to `out`: for each traced (stack, size), the
/// least CPU per datagram a full trace adds on each side at this host's
/// unit costs (`trace_costs::floor_ns_per_datagram`), as a share of that
/// side's untraced CPU per datagram. Where CPU bounds a transfer's rate (a
/// side's, or the CPUs the testbed's two hosts share), the rate falls by at
/// least about that share. Returns the same as JSON.
fn floor_report(
    out: &mut String,
    before: &trace_costs::UnitCosts,
    after: &trace_costs::UnitCosts,
    floors: &[Floor],
) -> serde_json::Value {
    use std::fmt::Write as _;
    let uc = trace_costs::UnitCosts {
        clock_read_ns: before.clock_read_ns.min(after.clock_read_ns),
        clock_in_context_ns: before.clock_in_context_ns.min(after.clock_in_context_ns),
        stamp_make_ns: before.stamp_make_ns.min(after.stamp_make_ns),
        stamp_read_ns: before.stamp_read_ns.min(after.stamp_read_ns),
        stamped_sends: before.stamped_sends + after.stamped_sends,
        stamps_read: before.stamps_read + after.stamps_read,
    };
    let _ = writeln!(
        out,
        "floor: unit costs on this host (lower of two measurements): clock read {:.1} ns back to back, {:.1} ns among a send's work (the floor counts {:.1}), making a kernel TX stamp {:.0} ns, reading one back {:.0} ns ({} of {} stamps read)",
        uc.clock_read_ns,
        uc.clock_in_context_ns,
        uc.clock_floor_ns(),
        uc.stamp_make_ns,
        uc.stamp_read_ns,
        uc.stamps_read,
        2 * uc.stamped_sends
    );
    let mut rows = Vec::new();
    for f in floors {
        let b = f.shares(&uc);
        let _ = writeln!(
            out,
            "{:<7} {:>6} floor: sender 2 x {:.1} + {:.4} stamps/dgram x {:.0} = {:.0} ns/dgram ({:.1}% of its untraced {:.0}), receiver 2 x {:.1} = {:.0} ({:.1}% of {:.0}), both {:.1}% of {:.0}{}",
            f.stack,
            f.size,
            uc.clock_floor_ns(),
            f.stamps,
            uc.stamp_make_ns.max(0.0),
            b.tx_floor,
            100.0 * b.tx,
            f.tx_cpu,
            uc.clock_floor_ns(),
            b.rx_floor,
            100.0 * b.rx,
            f.rx_cpu,
            100.0 * b.total,
            f.cpu,
            if b.least() > 0.1 { ": the floor alone is over 10% of each side's CPU" } else { "" }
        );
        let _ = writeln!(out, "{}", app_floor_line(f, &b, &uc));
        rows.push(serde_json::json!({"stack": f.stack, "size": f.size, "stamps_per_datagram": f.stamps, "sender_floor_ns": b.tx_floor, "receiver_floor_ns": b.rx_floor,
            "untraced_cpu_ns_per_datagram": f.cpu, "untraced_sender_cpu_ns": f.tx_cpu, "untraced_receiver_cpu_ns": f.rx_cpu,
            "floor_share": {"sender": b.tx, "receiver": b.rx, "both": b.total},
            "app_thread": {"untraced_cpu_ns": f.app.cpu, "untraced_busy": f.app.busy, "kernel_message_share": f.app.msg_share, "floor_ns": b.app_floor, "floor_share": b.app, "rate_on_off_bound": f.rate_at_floor(&b)}}));
    }
    serde_json::json!({"clock_read_ns": uc.clock_read_ns, "clock_in_context_ns": uc.clock_in_context_ns, "clock_floor_ns": uc.clock_floor_ns(), "stamp_make_ns": uc.stamp_make_ns, "stamp_read_ns": uc.stamp_read_ns,
        "before": format!("{before:?}"), "after": format!("{after:?}"), "rows": rows})
}

/// The floor report's line for the sender's application thread.
fn app_floor_line(f: &Floor, b: &FloorShares, uc: &trace_costs::UnitCosts) -> String {
    let bound = match f.rate_at_floor(b) {
        Some(r) => format!(": busy most of the time, it bounds the rate: at these unit costs the floor alone would hold rate on/off to about {r:.3}{}", if r < 0.9 { ", under the 10% budget's 0.9" } else { "" }),
        None => String::new(),
    };
    let head = format!("{:<7} {:>6} floor on the sender's application thread ({:.0}% busy untraced, sent {:.0}% of the kernel messages)", f.stack, f.size, 100.0 * f.app.busy, 100.0 * f.app.msg_share);
    let sum = format!(
        "2 x {:.1} + {:.4} x {:.2} x {:.0} = {:.0} ns/dgram",
        uc.clock_floor_ns(),
        f.stamps,
        f.app.msg_share,
        uc.stamp_make_ns.max(0.0),
        b.app_floor
    );
    format!("{head}: {sum} ({:.1}% of its untraced {:.0}){bound}", 100.0 * b.app, f.app.cpu)
}

/// Median and range of a sample.
fn summary(v: &[f64]) -> (f64, String) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, "-".into()),
        n => (v[n / 2], format!("{:.2}-{:.2}", v[0], v[n - 1])),
    }
}

/// Runs PROGRAM once per stack (`eudp` only, unless `--compare` names
/// stacks) with `EUDP_TRACE=DIR/raw-program-STACK-%p.json`, so every process
/// of it under the shim (`eudp run`) or using the library writes its own
/// dump, and analyses the flow [`resolve::pick_flow`] picks in each run. For
/// the `kernel` stack the shim is told (`EUDP_TRACE_STACK=kernel`) to
/// accelerate nothing and trace the program's kernel sockets instead.
fn program(a: &TraceArgs) -> Result<TraceDoc, String> {
    let out = std::fs::canonicalize(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    for f in program_dumps(&out, "") {
        let _ = std::fs::remove_file(f);
    }
    let stacks: Vec<String> = if a.stacks_given { a.stacks.clone() } else { vec!["eudp".into()] };
    let mut runs = Vec::new();
    let mut size = a.size;
    for stack in &stacks {
        let r = program_run(a, &out, stack)?;
        size = r.size;
        runs.push(r);
    }
    let packets = runs.iter().map(|r| r.paths.len() as u64).min().unwrap_or(0);
    let args = TraceArgs { size, sizes: vec![size], stacks, packets: a.packets.min(packets), ..a.clone() };
    if let Some(r) = runs.iter().find(|r| r.size != size) {
        return Err(format!(
            "the {} run's datagrams were {} B, the others' {size} B: runs of different sizes are not charted together",
            r.stack, r.size
        ));
    }
    Ok(document(&args, runs))
}

/// One run of PROGRAM traced on `stack`.
fn program_run(a: &TraceArgs, out: &std::path::Path, stack: &str) -> Result<Analysed, String> {
    let prefix = format!("raw-program-{stack}-");
    let pattern = out.join(format!("{prefix}%p.json"));
    let mut cmd = Command::new(&a.target[0]);
    cmd.args(&a.target[1..]).env("EUDP_TRACE", &pattern);
    if stack == "kernel" {
        cmd.env("EUDP_TRACE_STACK", "kernel");
    } else {
        cmd.env_remove("EUDP_TRACE_STACK");
    }
    let st = cmd.status().map_err(|e| format!("{}: {e}", a.target[0]))?;
    if !st.success() {
        return Err(format!("{} exited with {st} ({stack} run)", a.target[0]));
    }
    let mut dumps = Vec::new();
    for f in program_dumps(out, &prefix) {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        dumps.push(resolve::parse_dump(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    if dumps.is_empty() {
        return Err(format!(
            "no trace written to {} ({stack} run); the program's sockets must go through eudp: run it under `eudp run`",
            pattern.display()
        ));
    }
    dumps.sort_by_key(|d| d.pid);
    let calls = |d: &Dump| {
        format!(
            "pid {}: {} sends, {} receives",
            d.pid,
            resolve::main_ep_calls(d, resolve::kind::SEND_CALL),
            resolve::main_ep_calls(d, resolve::kind::RECV_CALL)
        )
    };
    let Some(flow) = resolve::pick_flow(&dumps) else {
        let all: Vec<String> = dumps.iter().map(calls).collect();
        return Err(format!(
            "{stack} run: no flow to chart: no datagram was both sent and received through traced sockets, or its receiver left no trace (a process killed by a signal writes none: stop a server with SIGINT or let it exit) ({})",
            all.join("; ")
        ));
    };
    let (tx, rx) = (&dumps[flow.tx], &dumps[flow.rx]);
    if dumps.len() > 1 {
        eprintln!(
            "eudp trace: {stack} run: {} process dumps; charting the flow from {} to {}",
            dumps.len(),
            calls(tx),
            calls(rx)
        );
    }
    let size = tx
        .events
        .iter()
        .find(|e| e.1 == resolve::kind::SEND_CALL && e.2 == flow.tx_ep)
        .map(|e| (e.5 >> 40) & 0x7f_ffff)
        .unwrap_or(a.size);
    let paths = resolve::join_eps(tx, Some(flow.tx_ep), rx, Some(flow.rx_ep));
    let (paths, note) = cut_at_full_buffer(stack, size, paths, tx, rx);
    if note.is_some() && paths.is_empty() {
        return Err(format!("{stack} run: a trace buffer filled before the first datagram had all its layers ({} events dropped); raise EUDP_TRACE_EVENTS", tx.dropped.max(rx.dropped)));
    }
    // Drops (always with a note here) are said by the note: what was
    // dropped came after the cut.
    let mut r = analyse_paths(stack, size, paths, u64::MAX);
    r.notes.extend(note);
    Ok(r)
}

/// A program runs as long as it likes, and a thread's trace buffer keeps
/// its first `EUDP_TRACE_EVENTS` events: once one is full, later packets
/// lack layers only because their events were not kept. When either dump
/// dropped events, the paths are cut before the first packet with a
/// missing point, and the note says how many datagrams that leaves.
/// Without drops nothing is cut, so a real hole stays a problem.
fn cut_at_full_buffer(
    stack: &str,
    size: u64,
    mut paths: Vec<Path>,
    tx: &Dump,
    rx: &Dump,
) -> (Vec<Path>, Option<String>) {
    let dropped = tx.dropped + if std::ptr::eq(tx, rx) { 0 } else { rx.dropped };
    if dropped == 0 {
        return (paths, None);
    }
    let first_hole = resolve::records(stack, &paths).1.iter().map(|&(p, _)| p).min();
    if let Some(k) = first_hole {
        paths.retain(|p| p.packet < k);
    }
    let kept = paths.len();
    let note = format!(
        "{stack} {size} B: a trace buffer filled ({dropped} events dropped): the analysis covers the first {kept} datagrams, whose every layer was kept; later ones lost some or all of their events (raise EUDP_TRACE_EVENTS, events per thread, or trace a shorter run to cover more)"
    );
    (paths, Some(note))
}

/// The per-process dumps of a PROGRAM run in `dir` whose names start with
/// `prefix` (all of them, `raw-program*.json`, with an empty one).
fn program_dumps(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let prefix = if prefix.is_empty() { "raw-program" } else { prefix };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .collect()
}

// ---------------------------------------------------------------- workers

fn fill(buf: &mut [u8], seq: u64) {
    let b = seq.to_be_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&b[8 - n..]);
}

fn seq_of(d: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = d.len().min(8);
    b[8 - n..].copy_from_slice(&d[..n]);
    u64::from_be_bytes(b)
}

struct WorkerArgs {
    role: String,
    stack: String,
    size: usize,
    count: u64,
    addr: SocketAddr,
    out: String,
    trace: bool,
    tag: bool,
}

fn worker_args(args: &[String]) -> Result<WorkerArgs, String> {
    let mut w = WorkerArgs {
        role: args.first().cloned().unwrap_or_default(),
        stack: "eudp".into(),
        size: 64,
        count: 1,
        addr: "0.0.0.0:9400".parse().unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 9400))),
        out: String::new(),
        trace: true,
        tag: true,
    };
    let mut i = 1;
    while i < args.len() {
        let v = args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--stack" => w.stack = v,
            "--size" => w.size = v.parse().map_err(|_| "--size")?,
            "--count" => w.count = v.parse().map_err(|_| "--count")?,
            "--addr" => w.addr = v.parse().map_err(|_| "--addr")?,
            "--out" => w.out = v,
            "--off" => {
                w.trace = false;
                i += 1;
                continue;
            }
            "--no-tag" => {
                w.tag = false;
                i += 1;
                continue;
            }
            o => return Err(format!("worker: unknown option {o}")),
        }
        i += 2;
    }
    Ok(w)
}

fn worker(args: &[String]) -> Result<(), String> {
    let w = worker_args(args)?;
    if w.trace {
        // Room for every event of the transfer on each thread, so nothing
        // is dropped: an eudp application thread records one or two per
        // datagram, a plain-socket worker up to six (its syscalls and
        // kernel stamps are per datagram).
        let per = if w.stack == "kernel" { 7 } else { 2 };
        tracepoint::set_capacity(w.count as usize * per + (1 << 16));
        tracepoint::enable();
        tracepoint::prepare_thread();
    }
    let e = |x: std::io::Error| format!("{} {}: {x}", w.role, w.stack);
    match (w.role.as_str(), w.stack.as_str()) {
        ("send", "eudp") => {
            let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
            let ep = Endpoint::with_engine(&engine, w.addr.is_ipv6()).map_err(e)?;
            ep.connect(w.addr).map_err(e)?;
            settle(w.trace);
            let _ = ep.set_send_buffer_size(4 << 20);
            let mut buf = vec![0xa5u8; w.size];
            let cpu0 = usage();
            for seq in 0..w.count {
                fill(&mut buf, seq);
                loop {
                    match ep.send(&buf) {
                        Ok(_) => break,
                        Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                        Err(x) => return Err(e(x)),
                    }
                }
            }
            ep.flush(Duration::from_secs(5));
            println!("{}", used(cpu0));
            std::thread::sleep(Duration::from_millis(20));
            drop(ep);
            drop(engine);
        }
        ("send", "kernel") => {
            let s = UdpSocket::new(w.addr.is_ipv6()).map_err(e)?;
            if w.trace {
                s.set_option(
                    libc::SOL_SOCKET,
                    eudp_engine::sys::timestamp::SO_TIMESTAMPING,
                    tracepoint::timestamping_flags(),
                )
                .map_err(e)?;
            }
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
            s.connect(&w.addr).map_err(e)?;
            let tr = EpTrace::new();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            let mut buf = vec![0xa5u8; w.size];
            let cpu0 = usage();
            for seq in 0..w.count {
                fill(&mut buf, seq);
                let tok = tracepoint::on().then(|| tr.send_enter(w.size));
                tr.direct();
                loop {
                    tr.sys_enter();
                    match s.send_to(&buf, None) {
                        Ok(_) => {
                            tr.sys_return_direct();
                            break;
                        }
                        Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                            let _ = poll_writable(fd, Some(Duration::from_millis(10)));
                        }
                        Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                        Err(x) => return Err(e(x)),
                    }
                }
                if let Some(t) = tok {
                    tr.send_return(t);
                }
                // Keep the error queue short: it is charged to the receive buffer.
                if seq % 64 == 63 {
                    tr.drain_tx(fd);
                }
            }
            let sent = Instant::now();
            std::thread::sleep(Duration::from_millis(20));
            tr.drain_tx(fd);
            // CPU includes the last stamp read; the wall time (for the busy
            // share) ends with the last send, not the wait before that read.
            let mut u = used(cpu0);
            u["wall_ns"] = ((sent - cpu0.at).as_nanos() as u64).into();
            println!("{u}");
        }
        ("recv", stack) => return receive(&w, stack == "eudp"),
        (r, s) => return Err(format!("worker: unknown role/stack {r}/{s}")),
    }
    // Format the dump only once the receiver is done, so it does not take
    // the CPU from the receiver's tail.
    std::thread::sleep(Duration::from_millis(300 + w.count / 1000));
    if w.trace {
        std::fs::write(&w.out, tracepoint::dump_json()).map_err(|x| format!("{}: {x}", w.out))?;
    }
    Ok(())
}

/// Lets a new engine settle before a transfer is timed: when tracing, its
/// thread has allocated and touched its trace buffer (this thread's was
/// prepared already), which would otherwise be charged to the transfer.
fn settle(trace: bool) {
    let t0 = Instant::now();
    while trace && tracepoint::thread_buffers() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
}

/// A worker's resource reading: CPU time all of this process's threads
/// have run (ns) and how many times they were switched in (the first and
/// third fields of each thread's `schedstat`: wakeups and preemptions
/// alike; 0 where the kernel does not report them), the calling thread's
/// own CPU time (the application thread's: the one that bounds a
/// streaming sender's rate), and when it was taken.
#[derive(Clone, Copy, Debug)]
struct Usage {
    cpu_ns: u64,
    switches: u64,
    app_ns: u64,
    at: Instant,
}

/// The calling thread's CPU time is its CPU clock's, which is exact: a
/// running thread's `schedstat` lags by up to a scheduler tick (4 ms at
/// 250 Hz), a share of a short transfer worth correcting.
fn usage() -> Usage {
    let app_ns = eudp_engine::sys::clock::thread_cpu_time().as_nanos() as u64;
    // This thread's directory under /proc/self/task ("PID/task/TID").
    let me = std::fs::read_link("/proc/thread-self").ok().and_then(|p| p.file_name().map(|n| n.to_owned()));
    let (mut cpu_ns, mut switches) = (0, 0);
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            if let Ok(st) = std::fs::read_to_string(t.path().join("schedstat")) {
                let (run, sw) = parse_schedstat(&st);
                cpu_ns += if Some(t.file_name()) == me { app_ns } else { run };
                switches += sw;
            }
        }
    }
    Usage { cpu_ns, switches, app_ns, at: Instant::now() }
}

/// (run time ns, times switched in) from one `schedstat` line.
fn parse_schedstat(s: &str) -> (u64, u64) {
    let f: Vec<u64> = s.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
    (f.first().copied().unwrap_or(0), f.get(2).copied().unwrap_or(0))
}

/// What a worker used between two [`usage`] readings, as its report's
/// fields: all threads' CPU, switches, the application thread's CPU and
/// the wall time between the readings (ns).
fn used(u0: Usage) -> serde_json::Value {
    let u = usage();
    serde_json::json!({"cpu_ns": u.cpu_ns - u0.cpu_ns, "switches": u.switches - u0.switches, "app_cpu_ns": u.app_ns - u0.app_ns, "wall_ns": (u.at - u0.at).as_nanos() as u64})
}

/// The receive loop's clock: read once per [`Arrivals::EVERY`] datagrams,
/// not per datagram (three clock reads per datagram would be a large share
/// of a small datagram's cost and hide the tracing overhead being measured).
struct Arrivals {
    start: Instant,
    max: Duration,
    first: Option<Instant>,
    /// The latest clock read on an arrival and how many had arrived then.
    last: (Instant, u64),
}

impl Arrivals {
    const EVERY: u64 = 64;

    fn new(max: Duration) -> Self {
        let now = Instant::now();
        Arrivals { start: now, max, first: None, last: (now, 0) }
    }

    /// The `got`-th datagram arrived; true when the loop should look at the
    /// clock now (see [`Arrivals::over`]).
    #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
    fn arrived(&mut self, got: u64) -> bool {
        if got == 1 || got % Self::EVERY == 0 {
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = (now, got);
            return true;
        }
        false
    }

    /// Time is up, or data arrived and then nothing for a while (the rest
    /// was lost).
    fn over(&self) -> bool {
        self.start.elapsed() > self.max || (self.first.is_some() && self.last.0.elapsed() > Duration::from_millis(500))
    }

    /// The loop ended with `got` datagrams: the last one's arrival is now
    /// if all came, else the last clock read on an arrival.
    fn end(&mut self, got: u64, all: bool) {
        if all && got > 0 {
            self.last = (Instant::now(), got);
        }
    }

    /// Receive span (s) and rate (Gbit/s) from the first arrival to the
    /// last timed one.
    fn rate(&self, size: usize) -> (f64, f64) {
        let secs = self.first.map(|f| (self.last.0 - f).as_secs_f64()).unwrap_or(0.0);
        let gbps =
            if secs > 0.0 { (self.last.1.saturating_sub(1) * size as u64) as f64 * 8.0 / secs / 1e9 } else { 0.0 };
        (secs, gbps)
    }
}

fn receive(w: &WorkerArgs, eudp: bool) -> Result<(), String> {
    let e = |x: std::io::Error| format!("recv: {x}");
    let ready = || {
        println!("ready");
        let _ = std::io::stdout().flush();
    };
    let mut buf = vec![0u8; 65_536];
    let (mut got, mut bad) = (0u64, 0u64);
    let mut t = Arrivals::new(Duration::from_secs(20 + w.count / 10_000));
    // CPU is counted from the first arrival: before it the receiver only
    // waits for the sender to start, which takes longer when the sender is
    // traced (its buffers), and an idle receiver still uses 1-2 ms of CPU
    // per second (its engine's timed checks, the read timeouts).
    let (mut cpu0, cpu);
    let mut next = 0u64;
    // Counts one datagram; true when the loop should check the clock.
    let mut tally = |d: &[u8], got: &mut u64, t: &mut Arrivals| {
        let seq = seq_of(d);
        if w.tag {
            tracepoint::tag_received(seq);
        }
        if seq < next || d.len() != w.size {
            bad += 1;
        }
        next = next.max(seq + 1);
        *got += 1;
        t.arrived(*got)
    };
    if eudp {
        let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
        let ep = Endpoint::with_engine(&engine, w.addr.is_ipv6()).map_err(e)?;
        let _ = ep.set_recv_buffer_size(4 << 20);
        ep.bind_to(w.addr).map_err(e)?;
        ep.set_read_timeout(Some(Duration::from_millis(50)));
        settle(w.trace);
        ready();
        cpu0 = usage();
        while got < w.count {
            let look = match ep.recv(&mut buf) {
                Ok(n) => {
                    let look = tally(&buf[..n], &mut got, &mut t);
                    if got == 1 {
                        cpu0 = usage();
                    }
                    look
                }
                Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => true,
                Err(x) => return Err(e(x)),
            };
            if look && t.over() {
                break;
            }
        }
        t.end(got, got == w.count);
        cpu = used(cpu0);
        drop(ep);
        drop(engine);
    } else {
        let s = UdpSocket::new(w.addr.is_ipv6()).map_err(e)?;
        if w.trace {
            s.set_option(
                libc::SOL_SOCKET,
                eudp_engine::sys::timestamp::SO_TIMESTAMPING,
                tracepoint::timestamping_flags(),
            )
            .map_err(e)?;
            tracepoint::rx_stamps_ready(tracepoint::timestamping_flags());
        }
        let _ = s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        s.bind(&w.addr).map_err(e)?;
        ready();
        cpu0 = usage();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        let tr = EpTrace::new();
        let mut bufs = vec![vec![0u8; 65_536]];
        let mut meta = vec![InMeta::default()];
        let on = tracepoint::on();
        'outer: while got < w.count {
            let enter = on.then(|| tr.recv_enter());
            loop {
                tr.rx_enter();
                match s.recv_batch(&mut bufs, &mut meta) {
                    Ok(1) => {
                        tr.rx_push(0, 1);
                        tr.pop();
                        break;
                    }
                    Ok(_) => {}
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                        poll_readable(&[fd], Some(Duration::from_millis(50))).map_err(e)?;
                        if t.over() {
                            break 'outer;
                        }
                    }
                    Err(x) => return Err(e(x)),
                }
            }
            if let Some(x) = enter {
                tr.recv_return(x);
            }
            let n = meta[0].len;
            let look = tally(&bufs[0][..n], &mut got, &mut t);
            if got == 1 {
                cpu0 = usage();
            }
            if look && t.over() {
                break;
            }
        }
        t.end(got, got == w.count);
        cpu = used(cpu0);
    }
    if w.trace {
        std::fs::write(&w.out, tracepoint::dump_json()).map_err(|x| format!("{}: {x}", w.out))?;
    }
    let (secs, gbps) = t.rate(w.size);
    println!(
        "{}",
        serde_json::json!({"received": got, "out_of_order": bad, "secs": secs, "gbps": gbps, "cpu_ns": cpu["cpu_ns"], "switches": cpu["switches"], "app_cpu_ns": cpu["app_cpu_ns"], "wall_ns": cpu["wall_ns"]})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_modes_parse() {
        let a = parse_args(&[
            "--overhead".into(),
            "3".into(),
            "--overhead-modes".into(),
            "full,user,noclock,sample16".into(),
        ])
        .unwrap();
        assert_eq!(a.overhead_reps, 3);
        assert_eq!(a.overhead_modes, ["full", "user", "noclock", "sample16"]);
        assert_eq!(parse_args(&[]).unwrap().overhead_modes, ["full"]);
        // `--overhead` runs the sizes it is given, not the charted size too.
        let args = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        assert_eq!(args(&["--overhead", "2", "--sizes", "64"]).sizes, [64]);
        assert_eq!(args(&["--sizes", "64"]).sizes, [64, 1472]);
        assert_eq!(args(&["--sizes", "64", "--size", "256"]).sizes, [64, 256]);
        assert!(parse_args(&["--overhead-modes".into(), "fast".into()]).is_err());
        assert!(parse_args(&["--overhead-modes".into(), "samplex".into()]).is_err());
        let full = Variant::named("full").unwrap();
        assert!(full.trace && full.complete && full.env.is_empty());
        let off = Variant::named("off").unwrap();
        assert!(!off.trace && !off.complete);
        // The control runs exactly what `off` runs.
        let control = Variant::named("control").unwrap();
        assert!(!control.trace && !control.complete && control.env == off.env);
        // These leave layers out (user, sampleN) or have no timing
        // (noclock): their traces are not held to be complete.
        for (m, var, val) in [
            ("user", "EUDP_TRACE_KERNEL", "0"),
            ("txstamps", "EUDP_TRACE_KERNEL", "tx"),
            ("rxstamps", "EUDP_TRACE_KERNEL", "rx"),
            ("noclock", "EUDP_TRACE_CLOCK", "none"),
            ("sample16", "EUDP_TRACE_SAMPLE", "16"),
        ] {
            let v = Variant::named(m).unwrap();
            assert!(v.trace && !v.complete, "{m}");
            assert_eq!(v.env, [(var, val)], "{m}");
        }
        // Another stamp reader records the same points: held to complete traces.
        let r = Variant::named("recvmmsg").unwrap();
        assert!(r.trace && r.complete);
        assert_eq!(r.env, [("EUDP_TRACE_STAMP_READER", "recvmmsg")]);
    }

    #[test]
    fn floor_shares_count_clock_reads_and_stamps_on_the_right_side() {
        let uc = trace_costs::UnitCosts {
            clock_read_ns: 10.0,
            clock_in_context_ns: 12.0,
            stamp_make_ns: 300.0,
            stamp_read_ns: 600.0,
            stamped_sends: 1,
            stamps_read: 2,
        };
        // 2 stamps per 40 datagrams: 15 ns per datagram on the sender.
        let f = Floor {
            stack: "eudp".into(),
            size: 1472,
            stamps: 0.05,
            cpu: 700.0,
            tx_cpu: 500.0,
            rx_cpu: 200.0,
            app: AppThread { cpu: 400.0, busy: 0.5, msg_share: 0.5 },
        };
        let s = f.shares(&uc);
        assert_eq!((s.tx_floor, s.rx_floor), (35.0, 20.0));
        assert_eq!((s.tx, s.rx), (0.07, 0.1));
        assert!((s.total - 55.0 / 700.0).abs() < 1e-12);
        assert_eq!(s.least(), s.tx);
        // A cheap pipeline: every side's floor is over 10 %.
        let small = Floor {
            stack: "eudp".into(),
            size: 64,
            stamps: 0.016,
            cpu: 250.0,
            tx_cpu: 170.0,
            rx_cpu: 80.0,
            app: AppThread::default(),
        };
        assert!(small.shares(&uc).least() > 0.1);
        // The stamp cost is never counted negative (a noisy measurement).
        let neg = trace_costs::UnitCosts { stamp_make_ns: -5.0, ..uc };
        assert_eq!(f.shares(&neg).tx_floor, 20.0);
        // Reads that cost less among other work count at that cost.
        let hidden = trace_costs::UnitCosts { clock_in_context_ns: 4.0, ..uc };
        assert_eq!((f.shares(&hidden).tx_floor, f.shares(&hidden).rx_floor), (23.0, 8.0));
    }

    #[test]
    fn the_application_threads_floor_counts_the_stamps_of_its_own_messages() {
        let uc = trace_costs::UnitCosts {
            clock_read_ns: 10.0,
            clock_in_context_ns: 12.0,
            stamp_make_ns: 300.0,
            stamp_read_ns: 600.0,
            stamped_sends: 1,
            stamps_read: 2,
        };
        // Half the kernel messages sent by the application thread: half of
        // the 0.05 stamps per datagram made on it.
        let mut f = Floor {
            stack: "eudp".into(),
            size: 1472,
            stamps: 0.05,
            cpu: 700.0,
            tx_cpu: 500.0,
            rx_cpu: 200.0,
            app: AppThread { cpu: 400.0, busy: 0.5, msg_share: 0.5 },
        };
        let s = f.shares(&uc);
        assert_eq!(s.app_floor, 27.5);
        assert_eq!(s.app, 27.5 / 400.0);
        // Half busy, it does not bound the rate: no estimate is made.
        assert_eq!(f.rate_at_floor(&s), None);
        f.app.busy = 0.95;
        assert_eq!(f.rate_at_floor(&s), Some(400.0 / 427.5));
        // The engine thread sent every message: only the clock reads.
        f.app.msg_share = 0.0;
        assert_eq!(f.shares(&uc).app_floor, 20.0);
    }

    #[test]
    fn the_application_thread_is_the_one_that_made_the_send_calls() {
        use resolve::{kind, RawEvent};
        let ev = |k: u8, thread: u64| RawEvent(1, k, 0, thread, 0, 0, 0);
        let mut d = Dump {
            events: vec![
                ev(kind::SEND_CALL, 7),
                ev(kind::SEND_CALL, 7),
                ev(kind::SEND_CALL, 9),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 9),
            ],
            ..Dump::default()
        };
        assert_eq!(app_thread_msg_share(&d), Some(0.75));
        d.events.retain(|e| e.1 != kind::KMSG);
        assert_eq!(app_thread_msg_share(&d), None);
        d.events.clear();
        assert_eq!(app_thread_msg_share(&d), None);
    }

    #[test]
    fn a_workers_usage_counts_its_own_thread_and_the_wall_time() {
        let u0 = usage();
        let t0 = Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(20) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let u = used(u0);
        let (app, all, wall) =
            (u["app_cpu_ns"].as_u64().unwrap(), u["cpu_ns"].as_u64().unwrap(), u["wall_ns"].as_u64().unwrap());
        assert!(wall >= 20_000_000, "{u}");
        // Busy the whole time (less what the host took away), never more
        // than the wall time.
        assert!(app > 5_000_000 && app <= wall + 1_000_000, "{u}");
        // All threads' CPU (0 where the kernel has no schedstat) counts
        // this thread's at its CPU clock: never less than it.
        assert!(all == 0 || all >= app, "{u}");
    }

    #[test]
    fn summary_is_median_and_range() {
        assert_eq!(summary(&[3.0, 1.0, 2.0]), (2.0, "1.00-3.00".to_string()));
        assert!(summary(&[]).0.is_nan());
    }
}
