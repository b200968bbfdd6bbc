//! What `eudp trace --emp` reports: per scheme, a table in the shape of
//! paper 003's Table 1 (each step's cost per message and per frame, and
//! the threads that ran it); the step costs handed to the simulator; the
//! predicted and measured orders of the schemes. The JSON document's
//! schema is in docs/trace.md.

use super::drive::Traced;
use super::measure::{Measured, BANDWIDTH_BYTES, LATENCY_BYTES};
use super::steps::{row_name, ACK_FRAME_ROW, ROWS};
use super::EmpTraceOptions;
use eudp_engine::emp::Scheme;
use eudp_model::step_costs::{self, StepCosts};
use eudp_model::timeline::TraceRecord;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::Path;

/// Rows whose unit is the frame (the others are per message).
const PER_FRAME: [usize; 4] = [1, 3, 4, 5];
/// Records the chart draws (the run's first, by start).
const CHART_RECORDS: usize = 400;
/// Messages the document lists one by one per scheme (the run's first).
pub const LISTED: usize = 200;

/// Mean, median and 99th percentile (µs) of `v` (ns).
fn stats(mut v: Vec<f64>) -> Value {
    if v.is_empty() {
        return Value::Null;
    }
    v.sort_by(f64::total_cmp);
    let q = |p: f64| v[((v.len() as f64 * p) as usize).min(v.len() - 1)] / 1000.0;
    let mean = v.iter().sum::<f64>() / v.len() as f64 / 1000.0;
    json!({"n": v.len(), "mean": mean, "p50": q(0.5), "p99": q(0.99)})
}

/// A thread role's label: the engine thread's letter, or `app`.
fn role_label(scheme: Scheme, role: u64) -> String {
    match role {
        0 => "app".into(),
        r if scheme == Scheme::Base => format!("engine{}", if r > 1 { format!(" {r}") } else { String::new() }),
        r => ((b'A' + (r - 1) as u8) as char).to_string(),
    }
}

/// One scheme's table and checks as JSON.
fn scheme_doc(t: &Traced) -> Value {
    let j = &t.joined;
    let mut rows = Vec::new();
    for row in 0..ROWS {
        let per_msg: Vec<f64> = j.messages.iter().filter_map(|m| m.steps[row].map(|s| s.total_ns)).collect();
        let recs: Vec<_> = j.recs.iter().filter(|r| r.row == row).collect();
        let per_frame =
            PER_FRAME.contains(&row).then(|| stats(recs.iter().map(|r| (r.end - r.start) as f64).collect()));
        let mut threads = serde_json::Map::new();
        for r in &recs {
            let e = threads.entry(role_label(t.scheme, r.role)).or_insert(json!(0));
            *e = json!(e.as_u64().unwrap_or(0) + 1);
        }
        rows.push(json!({
            "step": if row == ACK_FRAME_ROW { Value::Null } else { json!(row + 1) },
            "name": row_name(row),
            "unit": if PER_FRAME.contains(&row) { "frame" } else { "message" },
            "records": recs.len(),
            "per_message_us": stats(per_msg),
            "per_frame_us": per_frame.unwrap_or(Value::Null),
            "threads": threads,
        }));
    }
    let placement: Vec<Vec<&str>> =
        t.scheme.placement().iter().map(|th| th.iter().map(|s| s.name()).collect()).collect();
    let messages: Vec<Value> = j
        .messages
        .iter()
        .take(LISTED)
        .map(|m| {
            let steps: Vec<Value> = m
                .steps
                .iter()
                .map(|s| match s {
                    Some(s) => json!([s.first_start - t.t0, s.last_end - t.t0, s.total_ns.round(), s.records]),
                    None => Value::Null,
                })
                .collect();
            json!({"flow": m.flow, "first_seq": m.first_seq, "frames": m.frames, "steps": steps})
        })
        .collect();
    let c = &t.checks;
    json!({
        "scheme": t.scheme.name(),
        "placement": placement,
        "messages_traced": j.messages.len(),
        "messages_listed": j.messages.len().min(LISTED),
        "records": j.recs.len(),
        "unplaced": j.unplaced,
        "earlier_records": j.earlier,
        "dropped_events": t.dropped,
        "steps": rows,
        "checks": {"ok": c.ok(), "missing_steps": c.missing_steps, "reversed": c.reversed,
                   "out_of_order": c.out_of_order, "misplaced": c.misplaced, "notes": c.notes},
        "messages": messages,
    })
}

/// The mean over the schemes' documents of a row's median: medians, as
/// the other threads of a shared host preempt a step now and then and one
/// such step would outweigh hundreds in a mean.
fn mean_of(schemes: &[&Value], row: usize, field: &str) -> f64 {
    let v: Vec<f64> = schemes.iter().filter_map(|s| s["steps"][row][field]["p50"].as_f64()).collect();
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// The step costs for the simulator: the base scheme's when traced (one
/// thread, no hand-off between threads), else the mean over the schemes.
fn model_costs(docs: &[Value]) -> (StepCosts, String) {
    let base: Vec<&Value> = docs.iter().filter(|d| d["scheme"] == "base").collect();
    let (from, label) = if base.is_empty() {
        (docs.iter().collect::<Vec<_>>(), "mean of the traced schemes".to_string())
    } else {
        (base, "base".to_string())
    };
    let m = |row: usize| mean_of(&from, row, "per_message_us");
    let f = |row: usize| mean_of(&from, row, "per_frame_us");
    let c = StepCosts {
        send_bookkeeping_us: m(0),
        transmission_us: f(1),
        receive_acknowledgment_us: m(2) + m(ACK_FRAME_ROW),
        receive_bookkeeping_us: f(3),
        receive_frame_us: f(4),
        receiving_us: f(5),
        send_acknowledgment_us: m(6),
    };
    (c, label)
}

fn ranked(pairs: Vec<(String, f64)>) -> Value {
    let r = step_costs::rank(&pairs);
    json!({"order": r.iter().map(|x| x.0.clone()).collect::<Vec<_>>(), "text": step_costs::show(&r)})
}

/// The whole document.
pub fn document(o: &EmpTraceOptions, size: u64, traced: &[Traced], measured: &[Measured]) -> Result<Value, String> {
    let docs: Vec<Value> = traced.iter().map(scheme_doc).collect();
    let (costs, costs_from) = model_costs(&docs);
    let mut preset = eudp_model::preset::load(&eudp_model::preset::resolve("003")?)?;
    step_costs::apply(&mut preset, &costs, "eudp trace --emp");
    let w = step_costs::Workload::default();
    let pr = step_costs::predict(&preset, &w)?;
    let traced_names: Vec<&str> = traced.iter().map(|t| t.scheme.name()).collect();
    let figs: Vec<_> = pr.schemes.iter().filter(|f| traced_names.contains(&f.scheme.as_str())).collect();
    let pick =
        |key: fn(&step_costs::SchemeFigures) -> f64| ranked(figs.iter().map(|f| (f.scheme.clone(), key(f))).collect());
    let predicted = json!({
        "figures": figs,
        "unidir": pick(|f| -f.unidir_mbit_s),
        "bidir": pick(|f| -f.bidir_mbit_s),
        "latency": pick(|f| f.latency_us),
        "bus": w.bus, "link_mbps": w.link_mbps, "bandwidth_bytes": w.bandwidth_bytes, "latency_bytes": w.latency_bytes,
    });
    let measured_doc = if measured.is_empty() {
        Value::Null
    } else {
        let pick =
            |key: fn(&Measured) -> f64| ranked(measured.iter().map(|m| (m.scheme.name().into(), key(m))).collect());
        json!({
            "figures": measured.iter().map(|m| json!({"scheme": m.scheme.name(), "unidir_mbit_s": m.unidir_mbit_s,
                "bidir_mbit_s": m.bidir_mbit_s, "latency_us": m.latency_us, "latency_p50_rtt_us": m.latency_p50_rtt_us}))
                .collect::<Vec<_>>(),
            "unidir": pick(|m| -m.unidir_mbit_s),
            "bidir": pick(|m| -m.bidir_mbit_s),
            "latency": pick(|m| m.latency_us),
            "bandwidth_bytes": BANDWIDTH_BYTES, "latency_bytes": LATENCY_BYTES, "secs": o.measure_secs,
        })
    };
    Ok(json!({
        "kind": "emp-steps",
        "clock": "CLOCK_MONOTONIC_RAW",
        "unix_time": std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        "pattern": o.pattern.name(),
        "hosts": o.emp_hosts.name(),
        "size": size,
        "messages": o.messages,
        "schemes": docs,
        "model_costs": costs,
        "model_costs_from": costs_from,
        "predicted": predicted,
        "measured": measured_doc,
    }))
}

/// The document as text: a Table 1 per scheme, the costs, the orders.
pub fn text(doc: &Value) -> String {
    let mut out = String::new();
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
    for s in doc["schemes"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "\nscheme {}: {} messages of {} B ({}), µs per step",
            s["scheme"].as_str().unwrap_or("?"),
            s["messages_traced"],
            doc["size"],
            doc["pattern"].as_str().unwrap_or("?")
        );
        let _ = writeln!(
            out,
            "{:<2} {:<24} {:>9} {:>9} {:>9} {:>10} {:>9}  threads",
            "#", "step", "msg mean", "msg p50", "msg p99", "frame mean", "frame p99"
        );
        for r in s["steps"].as_array().into_iter().flatten() {
            let threads: Vec<String> = r["threads"]
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| format!("{k} {}", v.as_u64().unwrap_or(0)))
                .collect();
            let _ = writeln!(
                out,
                "{:<2} {:<24} {:>9} {:>9} {:>9} {:>10} {:>9}  {}",
                r["step"].as_u64().map_or(String::new(), |x| x.to_string()),
                r["name"].as_str().unwrap_or("?"),
                f(&r["per_message_us"]["mean"]),
                f(&r["per_message_us"]["p50"]),
                f(&r["per_message_us"]["p99"]),
                f(&r["per_frame_us"]["mean"]),
                f(&r["per_frame_us"]["p99"]),
                threads.join(", ")
            );
        }
        let c = &s["checks"];
        let _ = writeln!(
            out,
            "checks: {} (missing steps {}, reversed {}, out of order {}, misplaced {}){}",
            if c["ok"] == true { "ok" } else { "FAILED" },
            c["missing_steps"],
            c["reversed"],
            c["out_of_order"],
            c["misplaced"],
            c["notes"].as_array().filter(|n| !n.is_empty()).map_or(String::new(), |n| format!(": {n:?}"))
        );
    }
    let _ = writeln!(
        out,
        "\nstep costs for the simulator (from {}): {}",
        doc["model_costs_from"].as_str().unwrap_or("?"),
        doc["model_costs"]
    );
    let p = &doc["predicted"];
    let m = &doc["measured"];
    let _ = writeln!(out, "{:<26} {:<36} measured", "order (best first)", "predicted (sim 003 preset)");
    for (k, name) in
        [("unidir", "16 KiB bandwidth one way"), ("bidir", "16 KiB bandwidth both ways"), ("latency", "10 B latency")]
    {
        let (pt, mt) = (p[k]["text"].as_str().unwrap_or("-"), m[k]["text"].as_str().unwrap_or("not measured"));
        let agree = if m.is_null() {
            ""
        } else if p[k]["order"] == m[k]["order"] {
            "  (same)"
        } else {
            "  (differ)"
        };
        let _ = writeln!(out, "{name:<26} {pt:<36} {mt}{agree}");
    }
    out
}

/// Writes `emp-steps.json`, `emp-table.txt` and, per scheme, a chart of
/// its first records with a lane per thread and step (`emp-<scheme>.svg`,
/// and its records as trace JSON `emp-<scheme>-chart.json`).
pub fn write(out: &Path, doc: &Value, traced: &[Traced]) -> Result<(), String> {
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    let put = |name: &str, text: &str| {
        let p = out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    put("emp-steps.json", &serde_json::to_string(doc).unwrap_or_default())?;
    put("emp-table.txt", &text(doc))?;
    for t in traced {
        let recs: Vec<TraceRecord> = t
            .joined
            .recs
            .iter()
            .take(CHART_RECORDS)
            .enumerate()
            .map(|(i, r)| TraceRecord {
                layer: row_name(r.row).to_string(),
                packet: i,
                bytes: 0,
                t_start_ns: (r.start - t.t0) as f64,
                t_end_ns: (r.end.max(r.start) - t.t0) as f64,
                host: Some(format!("thread {} {}", r.thread, role_label(t.scheme, r.role))),
            })
            .collect();
        let title = format!("EMP {} steps per thread", t.scheme);
        put(&format!("emp-{}.svg", t.scheme), &eudp_model::svg::time_flow(&title, &recs))?;
        put(&format!("emp-{}-chart.json", t.scheme), &eudp_model::timeline::to_json(&recs))?;
    }
    eprintln!("wrote {}/emp-steps.json, emp-table.txt and a chart per scheme", out.display());
    Ok(())
}
