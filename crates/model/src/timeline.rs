//! Trace/timeline JSON shared by the simulator output and the model's fitter.
//!
//! Schema (also written by `eudp sim --timeline`):
//!
//! ```json
//! { "records": [
//!     { "layer": "NIC", "packet": 0, "bytes": 32768,
//!       "t_start_ns": 0.0, "t_end_ns": 260000.0, "host": "sender" } ] }
//! ```
//!
//! `host` (`sender`/`receiver`) is optional; other fields are ignored, so a
//! richer trace from `eudp trace` can be read as long as it has these.

use serde::{Deserialize, Serialize};

/// One rectangle of a time-flow chart.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TraceRecord {
    pub layer: String,
    pub packet: usize,
    #[serde(alias = "size")]
    pub bytes: u64,
    pub t_start_ns: f64,
    pub t_end_ns: f64,
    #[serde(default)]
    pub host: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct Doc {
    records: Vec<TraceRecord>,
}

/// Parses a trace document (`{"records": [...]}` or a bare array).
pub fn parse(text: &str) -> Result<Vec<TraceRecord>, String> {
    let recs = match serde_json::from_str::<Doc>(text) {
        Ok(d) => d.records,
        Err(e1) => serde_json::from_str::<Vec<TraceRecord>>(text).map_err(|_| format!("invalid trace JSON: {e1}"))?,
    };
    for (i, r) in recs.iter().enumerate() {
        if !(r.t_start_ns.is_finite() && r.t_end_ns.is_finite()) || r.t_end_ns < r.t_start_ns {
            return Err(format!("record {i} (layer {}): need finite t_start_ns <= t_end_ns", r.layer));
        }
    }
    Ok(recs)
}

/// Serialises records as a trace document.
pub fn to_json(recs: &[TraceRecord]) -> String {
    serde_json::to_string_pretty(&Doc { records: recs.to_vec() }).unwrap_or_default()
}

/// Converts simulator records to trace records; the layer label gets the host
/// side prefixed so both hosts can share one chart.
pub fn from_sim(recs: &[crate::sim::Record]) -> Vec<TraceRecord> {
    recs.iter()
        .map(|r| TraceRecord {
            layer: r.layer.clone(),
            packet: r.packet,
            bytes: r.bytes,
            t_start_ns: r.t_start_ns,
            t_end_ns: r.t_end_ns,
            host: Some(r.host.clone()),
        })
        .collect()
}
