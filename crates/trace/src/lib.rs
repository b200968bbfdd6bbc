//! `eudp trace` analysis: per-packet paths on one clock, per-layer records,
//! time-flow charts, g + B·G fits, the dominant layer and crossovers.
//!
//! * [`resolve`]: raw tracepoint dumps (`eudp_engine::tracepoint`) of a
//!   sender and a receiver → one [`resolve::Path`] per packet → layer
//!   [`resolve::Record`]s.
//! * [`table`]: per-layer statistics, the dominant layer, fits and crossovers.
//! * [`chart`]: side-by-side SVG time-flow charts.
//! * [`perfetto`]: the records as Chrome Trace Event JSON (ui.perfetto.dev).
//! * [`TraceDoc`]: the JSON file `eudp trace` writes (docs/trace.md).

pub mod chart;
pub mod perfetto;
pub mod resolve;
pub mod table;

use serde::Serialize;

/// What `eudp trace` writes as JSON (schema `eudp-trace/1`, docs/trace.md).
/// `records` is readable by `eudp sim chart` too.
#[derive(Debug, Serialize)]
pub struct TraceDoc {
    pub schema: &'static str,
    pub clock: &'static str,
    /// Size of the charted burst (bytes) and its packets per stack.
    pub size: u64,
    pub packets: usize,
    pub stacks: Vec<String>,
    /// Layer rectangles of the charted burst, every stack.
    pub records: Vec<resolve::Record>,
    /// Per-packet points of the charted burst (absolute ns), per stack.
    pub paths: Vec<StackPaths>,
    /// One row per (stack, size) of the sweep.
    pub runs: Vec<table::RunRow>,
    pub fits: Vec<table::LayerFit>,
    pub crossovers: Vec<table::Crossover>,
    /// Problems found (missing layers, order violations); empty when clean.
    pub problems: Vec<String>,
    /// What the analysis left out, and why, when that is not a problem of
    /// the trace (a program's run cut at its first packet that a full
    /// buffer left incomplete).
    pub notes: Vec<String>,
}

/// The paths of one stack's charted burst.
#[derive(Debug, Serialize)]
pub struct StackPaths {
    pub stack: String,
    pub point_names: [&'static str; 11],
    pub paths: Vec<resolve::Path>,
}
