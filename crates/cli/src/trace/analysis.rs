//! Joining a run's dumps into per-packet paths and summarising them.

use eudp_trace::resolve::{self, Dump, Path};
use eudp_trace::table;

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
    analyse_sampled(stack, size, sender, receiver, received, 1)
}

/// As [`analyse_lossy`] for a trace of one datagram in `sample`: the
/// sampled datagrams must have every layer, the others are left out.
pub fn analyse_sampled(stack: &str, size: u64, sender: &Dump, receiver: &Dump, received: u64, sample: u64) -> Analysed {
    let mut r = analyse_paths(stack, size, resolve::sampled(resolve::join(sender, receiver), sample), received);
    if sample > 1 {
        r.notes.push(sample_note(stack, size, sample));
    }
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

/// What a table of a sampled trace counts.
pub(super) fn sample_note(stack: &str, size: u64, sample: u64) -> String {
    format!(
        "{stack} {size} B: one datagram in {sample} traced; the table counts those only, so a batched layer's busy time per datagram (engine, kernel, veth) is shared among the traced datagrams of a batch and reads up to {sample} times high"
    )
}

/// The summary of joined `paths` (see [`analyse_lossy`]).
pub(super) fn analyse_paths(stack: &str, size: u64, paths: Vec<Path>, received: u64) -> Analysed {
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
