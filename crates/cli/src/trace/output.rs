//! What `eudp trace` writes: the document of analysed runs, trace.json,
//! trace.svg and table.txt, and the summary it prints.

use super::analysis::Analysed;
use super::args::TraceArgs;
use eudp_trace::resolve;
use eudp_trace::{chart, table, StackPaths, TraceDoc};

/// Writes trace.json, trace.svg and table.txt.
pub fn write_outputs(dir: &std::path::Path, doc: &TraceDoc) -> Result<(), String> {
    let w = |name: &str, text: &str| std::fs::write(dir.join(name), text).map_err(|e| format!("{name}: {e}"));
    w("trace.json", &serde_json::to_string_pretty(doc).map_err(|e| e.to_string())?)?;
    let stacks: Vec<&str> = doc.stacks.iter().map(String::as_str).collect();
    let title = format!("{} datagrams of {} B, host a -> host b: {}", doc.packets, doc.size, doc.stacks.join(" | "));
    w("trace.svg", &chart::side_by_side(&title, &stacks, &doc.records))?;
    w("table.txt", &table::render(&doc.runs, &doc.fits, &doc.crossovers))
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
            // The first N traced packets: numbered up to the N-th sampled one.
            let charted = match a.packets {
                0 => 0,
                n => eudp_engine::tracepoint::nth_sampled(n - 1, a.view.sample) + 1,
            };
            doc.records.extend(r.records.into_iter().filter(|x| x.packet < charted));
            let paths = r.paths.into_iter().filter(|p| p.packet < charted).collect();
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

/// Prints the table, the notes and the problems of a document, and where
/// it was written.
pub fn print_summary(doc: &TraceDoc, out: &std::path::Path) {
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
    println!("wrote {0}/trace.json, {0}/trace.svg, {0}/table.txt", out.display());
}
