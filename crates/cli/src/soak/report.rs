//! What the soak's raw results say: RSS over time and whether it stays
//! flat, every process's counters by workload, the balance of each
//! workload's datagrams, the longest stalls, and the targets.

use crate::stat_view::SOCKET_DROPS;
use serde_json::{json, Value};

/// A series is flat when its maximum after the first fifth of its samples
/// exceeds the maximum over that fifth by at most this fraction: later
/// growth that size is allocator noise, not a leak.
const FLAT_SLACK: f64 = 0.05;
/// Only a process that lives at least this fraction of the soak is judged:
/// one restarted more often (an iperf3 run, a restarted peer) says nothing
/// about growth over the soak, and iperf3 keeps every interval's results.
const JUDGED_LIFE: f64 = 0.5;
/// Nor is a series of fewer samples than this.
const MIN_SAMPLES: usize = 5;
/// A stall longer than this misses the target.
pub const STALL_TARGET_MS: f64 = 1000.0;
/// A gap within this many seconds of a fault aimed at the same workload is
/// that fault's doing (a query or child in flight when it began waits out
/// its own timeout).
const FAULT_MARGIN_S: f64 = 1.0;
/// The DNS loop and the fork program list every gap longer than this.
const GAP_LISTED_MS: f64 = 100.0;

/// Per series the maxima and flatness; overall the maximum and whether
/// every long enough series is flat.
pub fn rss(series: Vec<Value>, soak_secs: f64) -> Value {
    let mut out = Vec::new();
    let (mut max_kib, mut flat_all, mut judged) = (0.0f64, true, 0);
    for mut s in series {
        let samples: Vec<[f64; 3]> = serde_json::from_value(s["samples"].clone()).unwrap_or_default();
        let max = |v: &[[f64; 3]], i: usize| v.iter().map(|x| x[i]).fold(0.0, f64::max);
        s["max_rss_kib"] = max(&samples, 1).into();
        s["max_hwm_kib"] = max(&samples, 2).into();
        max_kib = max_kib.max(max(&samples, 1));
        let life = samples.last().map(|l| l[0]).unwrap_or(0.0) - samples.first().map(|f| f[0]).unwrap_or(0.0);
        if samples.len() >= MIN_SAMPLES && life + 1.0 >= soak_secs * JUDGED_LIFE {
            let cut = samples.len().div_ceil(5);
            let (first, rest) = (max(&samples[..cut], 1), max(&samples[cut..], 1));
            let flat = rest <= first * (1.0 + FLAT_SLACK);
            s["warmup_max_rss_kib"] = first.into();
            s["after_warmup_max_rss_kib"] = rest.into();
            s["flat"] = flat.into();
            flat_all &= flat;
            judged += 1;
        } else {
            s["flat"] = Value::Null;
        }
        out.push(s);
    }
    json!({
        "interval_s": 1, "flat_slack": FLAT_SLACK, "judged_life": JUDGED_LIFE, "min_samples": MIN_SAMPLES,
        "max_rss_kib": max_kib, "flat": flat_all && judged > 0, "series_judged": judged, "series": out,
    })
}

/// The workload a process of the run belongs to, by its name.
fn workload_of(name: &str) -> &'static str {
    match name.split(['-', '#']).next().unwrap_or("") {
        "iperf3" => "iperf3",
        "sockperf" => "sockperf",
        "dnsmasq" | "dns" => "dns",
        "fork" => "fork",
        _ => "other",
    }
}

/// The drops an `eudp stat` report counts over its open and closed sockets.
fn drops(report: &Value) -> u64 {
    ["sockets", "closed"]
        .iter()
        .flat_map(|k| report[*k].as_array().into_iter().flatten())
        .map(|s| SOCKET_DROPS.iter().map(|d| s["stats"][*d].as_u64().unwrap_or(0)).sum::<u64>())
        .sum()
}

/// Every report by workload: the named processes' reports whole, the fork
/// program's children summed (there are thousands), and each workload's
/// counted drops.
pub fn counters(reports: &[Value], started: &[(String, u32)]) -> Value {
    let mut named = Vec::new();
    let mut by_workload = serde_json::Map::new();
    let (mut children, mut child_drops, mut child_panics, mut child_fallbacks, mut child_final) = (0u64, 0, 0, 0, 0);
    let mut child_reasons = serde_json::Map::new();
    for r in reports {
        let pid = r["pid"].as_u64().unwrap_or(0);
        let is_fork = r["exe"].as_str().is_some_and(|e| e.ends_with("soakfork") || e.contains("/soakfork-"));
        // A pid the run named may have been reused by a fork child, whose
        // report then replaced the named process's file: the exe tells them apart.
        let owner = started.iter().find(|(n, p)| u64::from(*p) == pid && is_fork == n.starts_with("fork"));
        let w = match owner {
            Some((name, _)) => {
                let mut r = r.clone();
                r["soak_name"] = name.as_str().into();
                named.push(r);
                workload_of(name)
            }
            None if is_fork => {
                children += 1;
                child_drops += drops(r);
                child_panics += r["panics"].as_u64().unwrap_or(0);
                child_fallbacks += r["fallbacks"].as_u64().unwrap_or(0);
                child_final += u64::from(r["exited"] == true);
                for (reason, n) in r["fallback_reasons"].as_object().into_iter().flatten() {
                    let e = child_reasons.entry(reason.clone()).or_insert(0.into());
                    *e = (e.as_u64().unwrap_or(0) + n.as_u64().unwrap_or(0)).into();
                }
                "fork"
            }
            None => "other",
        };
        let e = by_workload.entry(w).or_insert_with(|| json!({ "reports": 0, "drops": 0, "panics": 0 }));
        e["reports"] = (e["reports"].as_u64().unwrap_or(0) + 1).into();
        e["drops"] = (e["drops"].as_u64().unwrap_or(0) + drops(r)).into();
        e["panics"] = (e["panics"].as_u64().unwrap_or(0) + r["panics"].as_u64().unwrap_or(0)).into();
    }
    let without: Vec<&str> = started
        .iter()
        .filter(|(n, p)| n != "cpu-hog" && !named.iter().any(|r| r["pid"].as_u64() == Some(u64::from(*p))))
        .map(|(n, _)| n.as_str())
        .collect();
    json!({
        "drop_counters": SOCKET_DROPS,
        "named_without_report": without,
        "by_workload": by_workload,
        "fork_children": { "reports": children, "final_reports": child_final, "drops": child_drops,
                           "panics": child_panics, "fallbacks": child_fallbacks,
                           "fallback_reasons": child_reasons },
        "reports": named,
    })
}

fn u(v: &Value) -> u64 {
    v.as_f64().map(|x| x as u64).unwrap_or(0)
}

/// sent = received + counted drops, per workload.
pub fn balance(w: &Value, counters: &Value) -> Vec<Value> {
    let counted = |k: &str| counters["by_workload"][k]["drops"].as_u64().unwrap_or(0);
    let row = |name: &str, sent: u64, received: u64, exact: bool, how: &str| {
        let drops = counted(name);
        json!({
            "workload": name, "sent": sent, "received": received, "missing": sent.saturating_sub(received),
            "counted_drops": drops, "exact": exact, "balanced": sent == received + drops, "how": how,
        })
    };
    let runs = w["iperf3"]["runs"].as_array().cloned().unwrap_or_default();
    let sum = |k: &str| runs.iter().map(|r| r[k].as_u64().unwrap_or(0)).sum::<u64>();
    let s = &w["sockperf"];
    // With GRO on, `socket_drops` counts kernel messages, and a GRO message
    // carries many datagrams: exact only when every server ran with GRO off
    // (the soak runs them so); otherwise an estimate in datagrams, scaled by
    // each server's datagrams per GRO message, goes beside.
    let gro_off = servers_gro_off(&runs, counters);
    let mut iperf3 = row(
        "iperf3",
        sum("sent"),
        sum("received"),
        gro_off,
        if gro_off {
            "client's datagrams sent against the server's received, every run; servers with GRO off (EUDP_GRO=0), so the kernel counts each dropped datagram"
        } else {
            "client's datagrams sent against the server's received, every run; a server had GRO on, so its kernel drops count messages (estimate beside)"
        },
    );
    if !gro_off {
        iperf3["socket_drops_in_datagrams_estimate"] = gro_scaled_drops(&runs, counters).into();
    }
    let mut sockperf = row(
        "sockperf",
        u(&s["sent"]),
        u(&s["server_received"]),
        true,
        "requests: the client's sent against the server's received (the replies beside)",
    );
    sockperf["replies_sent"] = s["server_received"].clone();
    sockperf["replies_received"] = s["received"].clone();
    let d = &w["dns"];
    let f = &w["fork"];
    vec![
        iperf3,
        sockperf,
        row("dns", u(&d["sent"]), u(&d["answered"]), false,
            "the client's view only: dnsmasq does not count, and a query dnsmasq dropped or ignored is not a datagram drop"),
        row("fork", u(&f["sent"]), u(&f["received"]), true,
            "datagrams the children and the parent sent against the echoes they got back (the echo server's counts beside)"),
    ]
}

/// The report of each run's iperf3 server.
fn server_reports<'a>(runs: &'a [Value], counters: &'a Value) -> impl Iterator<Item = Option<&'a Value>> + 'a {
    runs.iter().map(move |r| counters["reports"].as_array().into_iter().flatten().find(|x| x["pid"] == r["server_pid"]))
}

/// Every run's server reported its engine with GRO off.
fn servers_gro_off(runs: &[Value], counters: &Value) -> bool {
    !runs.is_empty() && server_reports(runs, counters).all(|rep| rep.is_some_and(|x| x["engine"]["gro"] == false))
}

/// Each iperf3 server's `socket_drops` times its datagrams per GRO message.
fn gro_scaled_drops(runs: &[Value], counters: &Value) -> f64 {
    let mut total = 0.0;
    for rep in server_reports(runs, counters).flatten() {
        for st in ["sockets", "closed"].iter().flat_map(|k| rep[*k].as_array().into_iter().flatten()) {
            let stats = &st["stats"];
            let (drops, got, msgs) = (
                stats["socket_drops"].as_f64().unwrap_or(0.0),
                stats["datagrams_received"].as_f64().unwrap_or(0.0),
                stats["gro_superpackets"].as_f64().unwrap_or(0.0),
            );
            total += drops * if msgs > 0.0 { got / msgs } else { 1.0 };
        }
    }
    total.round()
}

/// Whether `[a, b]` (seconds of the run) touches a fault aimed at `workload`.
fn own_fault(faults: &[Value], workload: &str, a: f64, b: f64) -> bool {
    faults.iter().any(|f| {
        let at = f["at_s"].as_f64().unwrap_or(0.0);
        let end = at + f["for_s"].as_f64().unwrap_or(0.0);
        f["workload"] == workload && a <= end + FAULT_MARGIN_S && b >= at - FAULT_MARGIN_S
    })
}

/// The longest stall each workload saw, and the longest not caused by a
/// fault aimed at that workload.
pub fn stalls(w: &Value, faults: &[Value]) -> Vec<Value> {
    let gaps = |v: &Value, name: &str, how: &str| {
        let start = v["client_start_s"].as_f64().unwrap_or(0.0);
        let mut other = 0.0f64;
        for g in v["gaps"].as_array().into_iter().flatten() {
            let (a, b) = (g[0].as_f64().unwrap_or(0.0) + start, g[1].as_f64().unwrap_or(0.0) + start);
            if !own_fault(faults, name, a, b) {
                other = other.max((b - a) * 1000.0);
            }
        }
        // The programs list the gaps over GAP_LISTED_MS only: without one
        // outside a fault, that is the bound.
        let longest = v["longest_gap_ms"].as_f64();
        let unexplained = longest
            .map(|l| if other > 0.0 { other.min(l) } else { l.min(GAP_LISTED_MS) })
            .or((other > 0.0).then_some(other));
        json!({ "workload": name, "longest_ms": longest, "longest_not_own_fault_ms": unexplained, "how": how })
    };
    let mut iperf_all = 0.0f64;
    let mut iperf_other = 0.0f64;
    for r in w["iperf3"]["runs"].as_array().into_iter().flatten() {
        let ms = r["longest_empty_interval_ms"].as_f64().unwrap_or(0.0);
        let a = r["start_s"].as_f64().unwrap_or(0.0);
        iperf_all = iperf_all.max(ms);
        if !own_fault(faults, "iperf3", a, a + r["secs"].as_f64().unwrap_or(0.0)) {
            iperf_other = iperf_other.max(ms);
        }
    }
    let max_us = w["sockperf"]["max_us"].as_f64();
    vec![
        json!({ "workload": "iperf3", "longest_ms": iperf_all, "longest_not_own_fault_ms": iperf_other,
                "how": "the receiver's one-second intervals without a datagram (1 s resolution)" }),
        json!({ "workload": "sockperf", "longest_ms": max_us.map(|x| x / 1000.0),
                "longest_not_own_fault_ms": max_us.map(|x| x / 1000.0), "how": "the longest round trip" }),
        gaps(&w["dns"], "dns", "the longest time between two answers"),
        gaps(&w["fork"], "fork", "the longest time between two children that got every echo"),
    ]
}

/// The targets, each with what was measured; never fitted.
pub fn targets(balance: &[Value], rss: &Value, stalls: &[Value]) -> Vec<Value> {
    let exact: Vec<&Value> = balance.iter().filter(|b| b["exact"] == true).collect();
    let unbalanced: Vec<&str> =
        exact.iter().filter(|b| b["balanced"] != true).filter_map(|b| b["workload"].as_str()).collect();
    let worst = stalls
        .iter()
        .filter_map(|s| s["longest_not_own_fault_ms"].as_f64().map(|m| (m, s["workload"].as_str().unwrap_or(""))))
        .fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a });
    vec![
        json!({ "target": "balance exact: sent = received + counted drops, every workload that counts both sides",
                "measured": if unbalanced.is_empty() { "all balanced".to_string() } else { format!("unbalanced: {}", unbalanced.join(", ")) },
                "met": !exact.is_empty() && unbalanced.is_empty() }),
        json!({ "target": "RSS flat after warm-up (max after the first fifth <= 1.05 x max of the first fifth, each program that lives half the soak or more)",
                "measured": rss["flat"], "met": rss["flat"] == true }),
        json!({ "target": "no stall > 1 s (besides a workload's own restart or pause)",
                "measured": format!("{:.0} ms ({})", worst.0, worst.1), "met": worst.0 <= STALL_TARGET_MS }),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iperf3(gro: bool) -> (Value, Value) {
        let w = json!({ "iperf3": { "runs": [{ "server_pid": 7, "sent": 100, "received": 90 }] } });
        let server = json!({ "pid": 7, "engine": { "gro": gro }, "closed": [{ "stats": {
            "socket_drops": 10, "datagrams_received": 90, "gro_superpackets": if gro { 9 } else { 0 } } }] });
        let counters = json!({ "reports": [server], "by_workload": { "iperf3": { "drops": 10 } } });
        (w, counters)
    }

    #[test]
    fn the_iperf3_balance_is_exact_only_with_gro_off_on_every_server() {
        let (w, c) = iperf3(false);
        let b = &balance(&w, &c)[0];
        assert_eq!((b["exact"].as_bool(), b["balanced"].as_bool()), (Some(true), Some(true)), "{b}");
        assert!(b.get("socket_drops_in_datagrams_estimate").is_none(), "{b}");
        let (w, c) = iperf3(true);
        let b = &balance(&w, &c)[0];
        assert_eq!(b["exact"].as_bool(), Some(false), "{b}");
        assert_eq!(b["socket_drops_in_datagrams_estimate"].as_f64(), Some(100.0), "{b}");
    }
}
