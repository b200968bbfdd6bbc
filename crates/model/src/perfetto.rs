//! Time-flow records as Chrome Trace Event JSON, which ui.perfetto.dev and
//! chrome://tracing open, and a checker of such files.
//!
//! Layout: one process per (group, host) — a group is a compared stack or a
//! simulated run — and one track per layer inside it. Every packet's time in
//! a layer is one async slice (`ph` `b`/`e`, its own `id`), so packets that
//! overlap in a layer stay on that layer's track, stacked. A flow (`ph`
//! `s`, `t`..., `f`) follows each packet through its layers in time order,
//! from the sender's application call to the receiving application. All
//! groups share one time axis: each group's times are as given (ns from its
//! own start), written in µs with fractional nanoseconds.

use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// One packet's time in one layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    /// The stack or run it belongs to (`eudp`, `kernel`, `sim 000 eudp`).
    pub group: String,
    /// `sender`, `wire`, `receiver` (or empty).
    pub host: String,
    pub layer: String,
    pub packet: u64,
    pub bytes: u64,
    pub start_ns: f64,
    pub end_ns: f64,
}

/// Category of the layer slices.
pub const LAYER_CAT: &str = "layer";
/// Category of the packet flows.
pub const FLOW_CAT: &str = "packet";

fn us(ns: f64) -> f64 {
    ns.round() / 1000.0
}

/// The process name of a (group, host) pair.
pub fn process_name(group: &str, host: &str) -> String {
    if host.is_empty() {
        group.to_string()
    } else {
        format!("{group} {host}")
    }
}

/// The Trace Event document of `slices`. Processes and tracks are numbered
/// in the order their first slice appears, so a caller that lists layers in
/// path order gets tracks in path order.
pub fn chrome_trace(slices: &[Slice]) -> Value {
    let mut procs: Vec<(String, String)> = Vec::new();
    let mut tracks: Vec<Vec<String>> = Vec::new();
    let mut place = Vec::with_capacity(slices.len());
    for s in slices {
        let p = match procs.iter().position(|x| x.0 == s.group && x.1 == s.host) {
            Some(p) => p,
            None => {
                procs.push((s.group.clone(), s.host.clone()));
                tracks.push(Vec::new());
                procs.len() - 1
            }
        };
        let t = match tracks[p].iter().position(|l| *l == s.layer) {
            Some(t) => t,
            None => {
                tracks[p].push(s.layer.clone());
                tracks[p].len() - 1
            }
        };
        place.push((p as u64 + 1, t as u64 + 1));
    }
    let mut ev = Vec::new();
    for (i, (g, h)) in procs.iter().enumerate() {
        let pid = i as u64 + 1;
        ev.push(json!({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": process_name(g, h)}}));
        ev.push(json!({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}));
        for (j, l) in tracks[i].iter().enumerate() {
            let tid = j as u64 + 1;
            ev.push(json!({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": l}}));
            ev.push(
                json!({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": tid}}),
            );
        }
    }
    for (i, (s, &(pid, tid))) in slices.iter().zip(&place).enumerate() {
        let (b, e) = (us(s.start_ns), us(s.end_ns.max(s.start_ns)));
        let args = json!({"packet": s.packet, "bytes": s.bytes, "ns": (s.end_ns - s.start_ns).max(0.0)});
        let common = |ph: &str, ts: f64| json!({"ph": ph, "name": s.layer, "cat": LAYER_CAT, "id": i as u64 + 1, "pid": pid, "tid": tid, "ts": ts});
        let mut begin = common("b", b);
        begin["args"] = args;
        ev.push(begin);
        ev.push(common("e", e));
    }
    // Flows: per (group, packet), its slices by start time, ties in track
    // order (the order the caller listed the layers in).
    let mut packets: BTreeMap<(usize, u64), Vec<usize>> = BTreeMap::new();
    for (i, s) in slices.iter().enumerate() {
        let g = procs.iter().position(|x| x.0 == s.group).unwrap_or(0);
        packets.entry((g, s.packet)).or_default().push(i);
    }
    let rank = |i: usize| (place[i].0, place[i].1);
    for (flow, ((_, packet), mut idx)) in packets.into_iter().enumerate() {
        if idx.len() < 2 {
            continue;
        }
        idx.sort_by(|&x, &y| slices[x].start_ns.total_cmp(&slices[y].start_ns).then(rank(x).cmp(&rank(y))));
        let last = idx.len() - 1;
        for (k, &i) in idx.iter().enumerate() {
            let ph = if k == 0 {
                "s"
            } else if k == last {
                "f"
            } else {
                "t"
            };
            let (pid, tid) = place[i];
            let mut f = json!({"ph": ph, "name": format!("packet {packet}"), "cat": FLOW_CAT, "id": flow as u64 + 1,
                "pid": pid, "tid": tid, "ts": us(slices[i].start_ns)});
            if k > 0 {
                // Bind to the slice that begins here, not the next one.
                f["bp"] = json!("e");
            }
            ev.push(f);
        }
    }
    json!({"traceEvents": ev, "displayTimeUnit": "ns"})
}

/// What [`check`] found in a valid file.
#[derive(Debug, Default, PartialEq)]
pub struct Checked {
    /// Async slices per (process name, track name).
    pub slices: BTreeMap<(String, String), usize>,
    /// Complete flows (one start, one finish).
    pub flows: usize,
}

/// Checks a Trace Event document: every event has the fields its phase
/// needs; every async begin has one end with the same category, name and id
/// in the same process, not earlier; every flow id has exactly one start
/// and one finish, its steps and finish not before its start. Returns the
/// async slices per track and the flows.
pub fn check(doc: &Value) -> Result<Checked, String> {
    let ev = doc.get("traceEvents").and_then(Value::as_array).ok_or("no traceEvents array")?;
    let mut pname: HashMap<u64, String> = HashMap::new();
    let mut tname: HashMap<(u64, u64), String> = HashMap::new();
    let mut open: HashMap<(u64, String, String, String), f64> = HashMap::new();
    let mut flows: HashMap<String, (usize, usize, f64, f64)> = HashMap::new();
    let mut out = Checked::default();
    let num =
        |e: &Value, k: &str, i: usize| e.get(k).and_then(Value::as_f64).ok_or(format!("event {i}: no numeric {k}"));
    let text = |e: &Value, k: &str, i: usize| {
        e.get(k).and_then(Value::as_str).map(str::to_string).ok_or(format!("event {i}: no {k} string"))
    };
    let ident = |e: &Value, i: usize| match e.get("id") {
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(format!("event {i}: no id")),
    };
    let mut slices: Vec<(u64, u64, String)> = Vec::new();
    for (i, e) in ev.iter().enumerate() {
        let ph = text(e, "ph", i)?;
        let name = text(e, "name", i)?;
        let pid = num(e, "pid", i)? as u64;
        let tid = num(e, "tid", i)? as u64;
        if ph == "M" {
            let arg = e.pointer("/args/name").and_then(Value::as_str).map(str::to_string);
            match (name.as_str(), arg) {
                ("process_name", Some(n)) => {
                    pname.insert(pid, n);
                }
                ("thread_name", Some(n)) => {
                    tname.insert((pid, tid), n);
                }
                ("process_name" | "thread_name", None) => return Err(format!("event {i}: {name} without args.name")),
                _ => {}
            }
            continue;
        }
        let ts = num(e, "ts", i)?;
        if !ts.is_finite() || ts < 0.0 {
            return Err(format!("event {i}: bad ts {ts}"));
        }
        let cat = text(e, "cat", i)?;
        match ph.as_str() {
            "b" => {
                let key = (pid, cat, name.clone(), ident(e, i)?);
                if open.insert(key, ts).is_some() {
                    return Err(format!("event {i}: async {name} begun twice"));
                }
                slices.push((pid, tid, name));
            }
            "e" => {
                let key = (pid, cat, name.clone(), ident(e, i)?);
                let b = open.remove(&key).ok_or(format!("event {i}: async end of {name} without its begin"))?;
                if ts < b {
                    return Err(format!("event {i}: async {name} ends at {ts} before it begins at {b}"));
                }
            }
            "s" | "t" | "f" => {
                let f = flows.entry(format!("{cat}/{}", ident(e, i)?)).or_insert((0, 0, f64::NAN, f64::MIN));
                match ph.as_str() {
                    "s" => {
                        f.0 += 1;
                        f.2 = ts;
                    }
                    "f" => f.1 += 1,
                    _ => {}
                }
                f.3 = f.3.max(ts);
            }
            other => return Err(format!("event {i}: phase {other:?} is not written here")),
        }
    }
    if let Some(k) = open.keys().next() {
        return Err(format!("async {} (id {}) begun and never ended", k.2, k.3));
    }
    for (id, (s, f, start, latest)) in &flows {
        if *s != 1 || *f != 1 {
            return Err(format!("flow {id}: {s} starts and {f} finishes (need one of each)"));
        }
        // Events may be listed in any order, so the latest step or finish
        // is what is compared with the start.
        if latest < start {
            return Err(format!("flow {id} finishes before it starts"));
        }
    }
    out.flows = flows.len();
    for (pid, tid, name) in slices {
        let p = pname.get(&pid).cloned().ok_or(format!("process {pid} has no name"))?;
        let t = tname.get(&(pid, tid)).cloned().unwrap_or(name);
        *out.slices.entry((p, t)).or_default() += 1;
    }
    Ok(out)
}

/// Counts slices per (process name, layer) the way [`check`] reports them.
pub fn expected_counts(slices: &[Slice]) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for s in slices {
        *m.entry((process_name(&s.group, &s.host), s.layer.clone())).or_default() += 1;
    }
    m
}

/// The model's timeline records as slices of one group.
pub fn from_timeline(group: &str, recs: &[crate::timeline::TraceRecord]) -> Vec<Slice> {
    recs.iter()
        .map(|r| Slice {
            group: group.to_string(),
            host: r.host.clone().unwrap_or_default(),
            layer: r.layer.clone(),
            packet: r.packet as u64,
            bytes: r.bytes,
            start_ns: r.t_start_ns,
            end_ns: r.t_end_ns,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sl(group: &str, host: &str, layer: &str, packet: u64, s: f64, e: f64) -> Slice {
        Slice { group: group.into(), host: host.into(), layer: layer.into(), packet, bytes: 64, start_ns: s, end_ns: e }
    }

    #[test]
    fn overlapping_packets_share_a_track_and_flows_pair() {
        let v = vec![
            sl("eudp", "sender", "app.send", 0, 0.0, 100.0),
            sl("eudp", "sender", "app.send", 1, 50.0, 150.0),
            sl("eudp", "sender", "kernel.tx", 0, 100.0, 300.5),
            sl("eudp", "sender", "kernel.tx", 1, 100.0, 300.5),
            sl("eudp", "receiver", "app.recv", 0, 400.0, 410.0),
            sl("eudp", "receiver", "app.recv", 1, 410.0, 420.0),
            sl("kernel", "sender", "app.send", 0, 0.0, 2000.0),
        ];
        let doc = chrome_trace(&v);
        let c = check(&doc).unwrap();
        assert_eq!(c.slices, expected_counts(&v));
        assert_eq!(c.slices[&("eudp sender".to_string(), "app.send".to_string())], 2);
        // Two eudp packets of three layers each; the kernel's lone slice has no flow.
        assert_eq!(c.flows, 2);
        let ev = doc["traceEvents"].as_array().unwrap();
        let steps = ev.iter().filter(|e| e["ph"] == "t").count();
        assert_eq!(steps, 2);
        // Fractional nanoseconds survive as µs.
        assert!(ev.iter().any(|e| e["ph"] == "e" && e["ts"].as_f64() == Some(0.301)));
    }

    #[test]
    fn the_checker_rejects_broken_files() {
        let good = chrome_trace(&[sl("g", "h", "l", 0, 0.0, 10.0), sl("g", "h", "m", 0, 10.0, 20.0)]);
        assert!(check(&good).is_ok());
        let drop_where = |ph: &str| {
            let mut d = good.clone();
            let ev = d["traceEvents"].as_array_mut().unwrap();
            let i = ev.iter().position(|e| e["ph"] == ph).unwrap();
            ev.remove(i);
            d
        };
        assert!(check(&drop_where("e")).unwrap_err().contains("never ended"));
        assert!(check(&drop_where("b")).unwrap_err().contains("without its begin"));
        assert!(check(&drop_where("f")).unwrap_err().contains("finishes"));
        let mut no_ts = good.clone();
        let ev = no_ts["traceEvents"].as_array_mut().unwrap();
        let i = ev.iter().position(|e| e["ph"] == "b").unwrap();
        ev[i].as_object_mut().unwrap().remove("ts");
        assert!(check(&no_ts).unwrap_err().contains("ts"));
    }
}
