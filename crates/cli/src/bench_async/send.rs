//! The send rows: copying, `MSG_ZEROCOPY` and io_uring `SEND_ZC` transfers
//! of one [`eudp_engine::async_udp::AsyncSender`] per path and size, in
//! interleaved rounds whose order rotates, so that no mode always runs first
//! (or last) in a window the host's other work may crowd. Each row reports
//! per mode the median and range over the rounds, and the ratios against
//! copying as the median and range of the per-round ratios.

use super::measure::{transfer, Ends, Sample, SendMode};
use super::spread::{ratio, spread};
use serde_json::{json, Map, Value};

/// The modes, by their JSON names.
const MODES: [(&str, SendMode); 3] =
    [("copy", SendMode::Copy), ("zerocopy", SendMode::MsgZerocopy), ("uring_fixed", SendMode::UringFixed)];

/// Metrics that get a median and range per mode, and (all but the last) a
/// ratio against copying.
const METRICS: [&str; 4] = ["received_gbps", "sender_cpu_ns_per_byte", "process_cpu_ns_per_byte", "zero_copy_fraction"];

fn per_byte_ns(cpu: std::time::Duration, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu.as_nanos() as f64 / bytes as f64)
}

fn sample_json(s: &Sample) -> Value {
    let gbps = |b: u64| if s.secs > 0.0 { b as f64 * 8.0 / s.secs / 1e9 } else { 0.0 };
    json!({
        "zerocopy_in_use": s.zerocopy,
        "secs": s.secs,
        "sent_datagrams": s.sent_datagrams,
        "sent_bytes": s.sent_bytes,
        "received_bytes": s.received_bytes,
        "sent_gbps": gbps(s.sent_bytes),
        "received_gbps": gbps(s.received_bytes),
        "failed": s.failed,
        "enobufs": s.errors.get(&libc::ENOBUFS).copied().unwrap_or(0),
        "failed_by_error": s.errors.iter().map(|(e, n)| (std::io::Error::from_raw_os_error(*e).to_string(), json!(n))).collect::<Map<_, _>>(),
        "zero_copy_fraction": if s.sent_datagrams > 0 { s.zero_copied as f64 / s.sent_datagrams as f64 } else { 0.0 },
        "sender_cpu_ns_per_byte": per_byte_ns(s.sender_cpu, s.sent_bytes),
        "process_cpu_ns_per_byte": per_byte_ns(s.process_cpu, s.received_bytes),
    })
}

/// The order of the modes in round `round`: rotated by one each round.
fn order(round: usize) -> Vec<(&'static str, SendMode)> {
    (0..MODES.len()).map(|i| MODES[(i + round) % MODES.len()]).collect()
}

/// One mode over the rounds: medians and ranges, the datagrams that failed
/// (ENOBUFS apart) summed, and how many rounds measured it.
fn mode_summary(rounds: &[Value], mode: &str) -> Value {
    let ok: Vec<&Value> = rounds.iter().map(|r| &r[mode]).filter(|s| s["error"].is_null()).collect();
    let mut out = Map::new();
    for k in METRICS {
        out.insert(k.into(), spread(ok.iter().map(|s| s[k].as_f64())));
    }
    let sum = |k: &str| ok.iter().filter_map(|s| s[k].as_u64()).sum::<u64>();
    let mut by_error = Map::new();
    for (e, n) in ok.iter().filter_map(|s| s["failed_by_error"].as_object()).flatten() {
        let total = by_error.get(e).and_then(Value::as_u64).unwrap_or(0) + n.as_u64().unwrap_or(0);
        by_error.insert(e.clone(), json!(total));
    }
    out.insert("failed".into(), json!(sum("failed")));
    out.insert("enobufs".into(), json!(sum("enobufs")));
    out.insert("failed_by_error".into(), Value::Object(by_error));
    out.insert("zerocopy_in_use".into(), json!(ok.iter().any(|s| s["zerocopy_in_use"] == true)));
    out.insert("rounds_ok".into(), json!(ok.len()));
    Value::Object(out)
}

/// `mode` against copying: per metric, the median and range of the
/// per-round ratios (rounds where either transfer failed left out).
fn over_copy(rounds: &[Value], mode: &str) -> Value {
    METRICS[..3]
        .iter()
        .map(|&k| (k.to_string(), spread(rounds.iter().map(|r| ratio(r[mode][k].as_f64(), r["copy"][k].as_f64())))))
        .collect::<Map<_, _>>()
        .into()
}

/// The row of one path and size from its rounds (each an object of the
/// three modes' samples, or their `error`s, and the `order` they ran in).
fn row(path: &str, size: usize, rounds: Vec<Value>) -> Value {
    let mut row = json!({ "path": path, "size": size, "rounds": rounds.len() });
    for (name, _) in MODES {
        row[name] = mode_summary(&rounds, name);
    }
    if row["copy"]["rounds_ok"] == 0 {
        let errors: Vec<&str> = rounds.iter().filter_map(|r| r["copy"]["error"].as_str()).collect();
        row["error"] = json!(errors.join("; "));
    }
    row["zerocopy_over_copy"] = over_copy(&rounds, "zerocopy");
    row["uring_fixed_over_copy"] = over_copy(&rounds, "uring_fixed");
    row["per_round"] = Value::Array(rounds);
    row
}

/// The send rows of one path: per size, `rounds` interleaved rounds of the
/// three modes.
pub fn measure_path(path: &str, ends: &Ends, sizes: &[usize], secs: f64, rounds: usize, rows: &mut Vec<Value>) {
    for &size in sizes {
        let per_round = (0..rounds)
            .map(|round| {
                let mut r = Map::new();
                let order = order(round);
                r.insert("order".into(), json!(order.iter().map(|(n, _)| *n).collect::<Vec<_>>()));
                for (name, mode) in order {
                    let s =
                        transfer(ends, size, mode, secs).map_or_else(|e| json!({ "error": e }), |s| sample_json(&s));
                    r.insert(name.into(), s);
                }
                Value::Object(r)
            })
            .collect();
        rows.push(row(path, size, per_round));
    }
}

/// The send rows as text: medians, and the CPU ratios' per-round ranges.
pub fn table(rows: &Value) -> String {
    let rows: Vec<&Value> = rows.as_array().into_iter().flatten().collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "send (medians over rounds; ratios: median [min-max] of per-round ratios)\n{:<13} {:>6} {:>3} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>17} {:>17} {:>5} {:>8}\n",
        "path", "size", "rnd", "copy Gb/s", "zc Gb/s", "uzc Gb/s", "copy ns/B", "zc ns/B", "uzc ns/B", "zc/copy ns/B", "uzc/copy ns/B", "zc %", "ENOBUFS"
    );
    for r in rows {
        let path = r["path"].as_str().unwrap_or("?");
        let size = r["size"].as_u64().unwrap_or(0);
        if let Some(e) = r["error"].as_str() {
            out += &format!("{path:<13} {size:>6} error: {e}\n");
            continue;
        }
        let g = |m: &str, k: &str| r[m][k]["median"].as_f64().unwrap_or(f64::NAN);
        let range = |m: &str| {
            let s = &r[m]["sender_cpu_ns_per_byte"];
            let f = |k: &str| s[k].as_f64().unwrap_or(f64::NAN);
            format!("{:.2} [{:.2}-{:.2}]", f("median"), f("min"), f("max"))
        };
        let enobufs = MODES.iter().map(|(m, _)| r[m]["enobufs"].as_u64().unwrap_or(0)).sum::<u64>();
        out += &format!(
            "{path:<13} {size:>6} {:>3} {:>9.2} {:>9.2} {:>9.2} {:>9.3} {:>9.3} {:>9.3} {:>17} {:>17} {:>4.0}% {:>8}\n",
            r["rounds"].as_u64().unwrap_or(0),
            g("copy", "received_gbps"),
            g("zerocopy", "received_gbps"),
            g("uring_fixed", "received_gbps"),
            g("copy", "sender_cpu_ns_per_byte"),
            g("zerocopy", "sender_cpu_ns_per_byte"),
            g("uring_fixed", "sender_cpu_ns_per_byte"),
            range("zerocopy_over_copy"),
            range("uring_fixed_over_copy"),
            g("zerocopy", "zero_copy_fraction") * 100.0,
            enobufs,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(gbps: f64, cpu: f64) -> Value {
        json!({ "received_gbps": gbps, "sender_cpu_ns_per_byte": cpu, "process_cpu_ns_per_byte": cpu * 2.0,
                "zero_copy_fraction": 0.0, "failed": 1, "enobufs": 1, "zerocopy_in_use": false,
                "failed_by_error": { "No buffer space available (os error 105)": 1 } })
    }

    #[test]
    fn order_rotates_through_every_position() {
        let names = |r| order(r).iter().map(|(n, _)| *n).collect::<Vec<_>>();
        assert_eq!(names(0), ["copy", "zerocopy", "uring_fixed"]);
        assert_eq!(names(1), ["zerocopy", "uring_fixed", "copy"]);
        assert_eq!(names(2), ["uring_fixed", "copy", "zerocopy"]);
        assert_eq!(names(3), names(0));
    }

    #[test]
    fn ratios_are_medians_of_per_round_ratios() {
        // Per-round CPU ratios 0.5, 2.0, 1.0: their median is 1.0, while the
        // ratio of the medians (2 / 2) would hide the range.
        let rounds = vec![
            json!({ "copy": sample(10.0, 2.0), "zerocopy": sample(5.0, 1.0), "uring_fixed": { "error": "no io_uring" } }),
            json!({ "copy": sample(20.0, 1.0), "zerocopy": sample(10.0, 2.0), "uring_fixed": sample(1.0, 1.0) }),
            json!({ "copy": sample(30.0, 3.0), "zerocopy": sample(15.0, 3.0), "uring_fixed": sample(3.0, 3.0) }),
        ];
        let r = row("loopback", 1472, rounds);
        assert_eq!(r["rounds"], 3);
        assert_eq!(
            r["zerocopy_over_copy"]["sender_cpu_ns_per_byte"],
            json!({ "median": 1.0, "min": 0.5, "max": 2.0, "n": 3 })
        );
        assert_eq!(r["zerocopy_over_copy"]["received_gbps"]["median"], 0.5);
        // The failed round is left out of the io_uring figures and counted.
        assert_eq!(r["uring_fixed"]["rounds_ok"], 2);
        assert_eq!(
            r["uring_fixed_over_copy"]["sender_cpu_ns_per_byte"],
            json!({ "median": 1.0, "min": 1.0, "max": 1.0, "n": 2 })
        );
        assert_eq!(r["copy"]["received_gbps"], json!({ "median": 20.0, "min": 10.0, "max": 30.0, "n": 3 }));
        assert_eq!(r["zerocopy"]["enobufs"], 3);
        assert_eq!(r["zerocopy"]["failed_by_error"]["No buffer space available (os error 105)"], 3);
        assert!(r["error"].is_null());
    }

    #[test]
    fn a_row_without_a_copy_round_is_an_error() {
        let rounds = vec![
            json!({ "copy": { "error": "bind" }, "zerocopy": { "error": "bind" }, "uring_fixed": { "error": "bind" } }),
        ];
        let r = row("loopback", 1472, rounds);
        assert_eq!(r["error"], "bind");
        assert!(r["zerocopy_over_copy"]["sender_cpu_ns_per_byte"].is_null());
    }
}
