//! `eudp trace --perfetto`: a document's layer records as Chrome Trace Event
//! JSON (`eudp_model::perfetto`), one process per stack and host, one track
//! per layer, one async slice per packet per layer and a flow per packet.

use crate::resolve::Record;
pub use eudp_model::perfetto::{check, chrome_trace, expected_counts, Checked, Slice};

/// The records as slices; `records` lists layers in path order per stack
/// (as [`crate::resolve::records`] makes them), which becomes track order.
pub fn slices(records: &[Record]) -> Vec<Slice> {
    records
        .iter()
        .map(|r| Slice {
            group: r.stack.clone(),
            host: r.host.clone(),
            layer: r.layer.clone(),
            packet: r.packet,
            bytes: r.bytes,
            start_ns: r.t_start_ns,
            end_ns: r.t_end_ns,
        })
        .collect()
}

/// The Trace Event JSON text of `records`.
pub fn to_json(records: &[Record]) -> String {
    chrome_trace(&slices(records)).to_string()
}
