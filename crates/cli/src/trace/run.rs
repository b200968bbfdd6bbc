//! The runs of `eudp trace`: the burst scenario on a testbed, a traced
//! PROGRAM, or the overhead harness.

use super::analysis::{analyse_paths, analyse_sampled, sample_note, Analysed};
use super::args::TraceArgs;
use super::output::{document, print_summary, write_outputs};
use super::overhead::overhead;
use super::transfer::{transfer_variant, Variant};
use crate::testbed::{unique_name, Testbed};
use eudp_trace::resolve::{self, Dump, Path};
use eudp_trace::TraceDoc;
use std::process::Command;

/// Runs `eudp trace` with resolved settings.
pub fn run(a: &TraceArgs) -> Result<(), String> {
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let doc = match a.target.first().map(String::as_str) {
        None | Some("burst") => {
            let tb = match &a.testbed {
                Some(n) => Testbed::existing(n)?,
                None => Testbed::up(&unique_name("trc"))?,
            };
            if a.overhead_reps > 0 {
                return overhead(&tb, a);
            }
            burst(&tb, a)?
        }
        Some(_) => program(a)?,
    };
    finish(a, &doc)
}

/// Writes and prints what a run produced.
pub(super) fn finish(a: &TraceArgs, doc: &TraceDoc) -> Result<(), String> {
    write_outputs(&a.out, doc)?;
    print_summary(doc, &a.out);
    if let Some(f) = &a.view.perfetto {
        std::fs::write(f, eudp_trace::perfetto::to_json(&doc.records)).map_err(|e| format!("{}: {e}", f.display()))?;
        println!("wrote {} (Chrome Trace Event JSON: ui.perfetto.dev)", f.display());
    }
    Ok(())
}

fn burst(tb: &Testbed, a: &TraceArgs) -> Result<TraceDoc, String> {
    let mut runs = Vec::new();
    for &size in &a.sizes {
        for stack in &a.stacks {
            let v = Variant::traced(a.view.sample)?;
            let (tx, rx, rep) = transfer_variant(tb, stack, size, a.run_packets, &a.out, &v, true)?;
            let mut r = analyse_sampled(stack, size, &tx, &rx, u64::MAX, v.sample);
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
    cmd.args(&a.target[1..]).env("EUDP_TRACE", &pattern).env("EUDP_TRACE_SAMPLE", a.view.sample.to_string());
    if stack == "kernel" {
        cmd.env("EUDP_TRACE_STACK", "kernel");
    } else {
        cmd.env_remove("EUDP_TRACE_STACK");
    }
    let st = cmd.status().map_err(|e| format!("{}: {e}", a.target[0]))?;
    if !st.success() {
        return Err(format!("{} exited with {st} ({stack} run)", a.target[0]));
    }
    let hint = "the program's sockets must go through eudp: run it under `eudp run`";
    analyse_dumps(a, out, &prefix, stack, &format!("{} ({stack} run); {hint}", pattern.display()), false)
}

/// The analysis of the dumps in `out` whose names start with `prefix`
/// (one per process): the flow [`resolve::pick_flow`] picks, its paths
/// (the sampled ones), cut where a buffer filled. `where_` says where the
/// dumps were expected, for the error when there are none. `window`: the
/// trace is a window of a running program (`--attach`), whose end cuts the
/// paths of the datagrams then on their way.
pub(super) fn analyse_dumps(
    a: &TraceArgs,
    out: &std::path::Path,
    prefix: &str,
    stack: &str,
    where_: &str,
    window: bool,
) -> Result<Analysed, String> {
    let mut dumps = Vec::new();
    for f in program_dumps(out, prefix) {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        dumps.push(resolve::parse_dump(&text).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    if dumps.is_empty() {
        return Err(format!("no trace written to {where_}"));
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
    let mut paths = resolve::sampled(resolve::join_eps(tx, Some(flow.tx_ep), rx, Some(flow.rx_ep)), a.view.sample);
    let in_flight = if window { drop_in_flight(stack, &mut paths) } else { 0 };
    let begun = if window { drop_begun_before(&mut paths) } else { 0 };
    let (paths, note) = cut_at_full_buffer(stack, size, paths, tx, rx);
    if note.is_some() && paths.is_empty() {
        return Err(format!("{stack} run: a trace buffer filled before the first datagram had all its layers ({} events dropped); raise EUDP_TRACE_EVENTS", tx.dropped.max(rx.dropped)));
    }
    // Drops (always with a note here) are said by the note: what was
    // dropped came after the cut.
    let mut r = analyse_paths(stack, size, paths, u64::MAX);
    r.notes.extend(note);
    if in_flight > 0 {
        r.notes.push(format!(
            "{stack} {size} B: the window closed with {in_flight} traced datagrams on their way; they are left out"
        ));
    }
    if begun > 0 {
        r.notes.push(format!(
            "{stack} {size} B: {begun} send calls began before the window opened and were numbered in it; they are left out"
        ));
    }
    if a.view.sample > 1 {
        r.notes.push(sample_note(stack, size, a.view.sample));
    }
    Ok(r)
}

/// Drops the last paths while they lack a layer (datagrams a trace window
/// closed on); returns how many.
fn drop_in_flight(stack: &str, paths: &mut Vec<Path>) -> usize {
    let holes: std::collections::HashSet<u64> = resolve::records(stack, paths).1.iter().map(|&(p, _)| p).collect();
    let before = paths.len();
    while paths.last().is_some_and(|p| holes.contains(&p.packet)) {
        paths.pop();
    }
    before - paths.len()
}

/// Drops the first paths while they lack the application's send call: a
/// call that was waiting for the endpoint's send lock while the window
/// opened gets its number in the window but no call event. Returns how
/// many.
fn drop_begun_before(paths: &mut Vec<Path>) -> usize {
    let n = paths.iter().take_while(|p| p.points[0].is_none()).count();
    paths.drain(..n);
    n
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
pub(super) fn program_dumps(dir: &std::path::Path, prefix: &str) -> Vec<std::path::PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else { return Vec::new() };
    let prefix = if prefix.is_empty() { "raw-program" } else { prefix };
    rd.filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .collect()
}
