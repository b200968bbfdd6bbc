//! What the soak's raw results say: every process's counters by workload,
//! the balance of each workload's datagrams beside the kernel's counters,
//! the longest stalls, and the targets.

use super::kernel;
use super::workloads::workload_of;
use crate::stat_view::SOCKET_DROPS;
use serde_json::{json, Value};

/// A stall longer than this misses the target.
pub const STALL_TARGET_MS: f64 = 1000.0;
/// A gap within this many seconds of a fault aimed at the same workload is
/// that fault's doing (a query or child in flight when it began waits out
/// its own timeout).
const FAULT_MARGIN_S: f64 = 1.0;
/// The DNS loop and the fork program list every gap longer than this.
const GAP_LISTED_MS: f64 = 100.0;

/// The drops an `eudp stat` report counts over its open and closed sockets.
fn drops(report: &Value) -> u64 {
    ["sockets", "closed"]
        .iter()
        .flat_map(|k| report[*k].as_array().into_iter().flatten())
        .map(|s| SOCKET_DROPS.iter().map(|d| s["stats"][*d].as_u64().unwrap_or(0)).sum::<u64>())
        .sum()
}

/// What a report's sockets counted from the kernel socket itself
/// (`socket_drops`, `drop_kernel_rcvbuf`): the kernel's `RcvbufErrors`
/// counts the same datagrams.
fn socket_level(report: &Value) -> u64 {
    ["sockets", "closed"]
        .iter()
        .flat_map(|k| report[*k].as_array().into_iter().flatten())
        .map(|s| {
            ["socket_drops", "drop_kernel_rcvbuf"].iter().map(|d| s["stats"][*d].as_u64().unwrap_or(0)).sum::<u64>()
        })
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
        let e = by_workload
            .entry(w)
            .or_insert_with(|| json!({ "reports": 0, "drops": 0, "socket_level_drops": 0, "panics": 0 }));
        e["reports"] = (e["reports"].as_u64().unwrap_or(0) + 1).into();
        e["drops"] = (e["drops"].as_u64().unwrap_or(0) + drops(r)).into();
        e["socket_level_drops"] = (e["socket_level_drops"].as_u64().unwrap_or(0) + socket_level(r)).into();
        e["panics"] = (e["panics"].as_u64().unwrap_or(0) + r["panics"].as_u64().unwrap_or(0)).into();
    }
    let without: Vec<&str> = started
        .iter()
        .filter(|(n, p)| {
            n != "cpu-hog"
                && workload_of(n) != "control"
                && !named.iter().any(|r| r["pid"].as_u64() == Some(u64::from(*p)))
        })
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

/// The hosts of each workload's testbed whose arriving datagrams its
/// balance row counts: iperf3's row is one way, a to b.
fn receiving_hosts(workload: &str) -> &'static [char] {
    match workload {
        "iperf3" => &['b'],
        _ => &['a', 'b'],
    }
}

/// sent = received + counted drops, per workload; beside it the kernel's
/// counters in the workload's own namespaces (`kernel_run`, by workload)
/// and whether they explain a difference. They are never added to the
/// counted drops: `balanced` is eudp's count alone, and
/// `balanced_with_kernel_counters` adds what the kernel counted in the
/// workload's own namespaces beyond eudp's counters.
pub fn balance(w: &Value, counters: &Value, kernel_run: &Value) -> Vec<Value> {
    let counted = |k: &str| counters["by_workload"][k]["drops"].as_u64().unwrap_or(0);
    let row = |name: &str, sent: u64, received: u64, exact: bool, how: &str| {
        let drops = counted(name);
        let off = sent as i64 - received as i64 - drops as i64;
        let level = counters["by_workload"][name]["socket_level_drops"].as_u64().unwrap_or(0);
        let k = kernel::explain(off, &kernel_run[name]["delta"], receiving_hosts(name), level);
        json!({
            "workload": name, "sent": sent, "received": received, "missing": sent.saturating_sub(received),
            "counted_drops": drops, "exact": exact, "balanced": off == 0,
            "balanced_with_kernel_counters": off == 0 || k["own_sum"].as_i64() == Some(off),
            "kernel": k, "how": how,
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
    let per_run = iperf3_runs(&runs, counters);
    let off_runs: Vec<&Value> = per_run.iter().filter(|r| r["off_by"].as_i64() != Some(0)).collect();
    let off_with_tail: i64 = off_runs
        .iter()
        .filter(|r| r["sent_after_the_servers_last"].as_u64() > Some(0))
        .map(|r| r["off_by"].as_i64().unwrap_or(0))
        .sum();
    iperf3["runs_off"] = off_runs.iter().map(|r| r["run"].clone()).collect::<Vec<_>>().into();
    iperf3["off_in_runs_whose_server_closed_with_datagrams_in_flight"] = off_with_tail.into();
    iperf3["per_run"] = per_run.into();
    // Both ways, since each side's drops are counted together: a reply the
    // client's ring held at its close is a counted drop of the replies.
    let mut sockperf = row(
        "sockperf",
        u(&s["sent"]) + u(&s["server_received"]),
        u(&s["server_received"]) + u(&s["received"]),
        true,
        "both ways: the client's requests against the server's received, and the server's replies \
         (one per request it read) against the client's received",
    );
    sockperf["requests_sent"] = s["sent"].clone();
    sockperf["requests_received"] = s["server_received"].clone();
    sockperf["replies_sent"] = s["server_received"].clone();
    sockperf["replies_received"] = s["received"].clone();
    let d = &w["dns"];
    let f = &w["fork"];
    vec![
        iperf3,
        sockperf,
        row("dns", u(&d["sent"]), u(&d["answered"]) + u(&d["late"]), false,
            "the client's queries against the answers it read (in time, or late: after it gave their query up); \
             the client's view only: dnsmasq does not count, and a query dnsmasq dropped or ignored is not a datagram drop"),
        row("fork", u(&f["sent"]), u(&f["received"]), true,
            "datagrams the children and the parent sent against the echoes they got back (the echo server's counts beside)"),
    ]
}

/// Counter `name` summed over a report's open and closed sockets.
fn counter(report: &Value, name: &str) -> u64 {
    ["sockets", "closed"]
        .iter()
        .flat_map(|k| report[*k].as_array().into_iter().flatten())
        .map(|s| s["stats"][name].as_u64().unwrap_or(0))
        .sum()
}

/// The datagrams a report's sockets took off their kernel sockets into
/// eudp's rings (`datagrams_received`), open and closed.
fn taken(report: &Value) -> u64 {
    counter(report, "datagrams_received")
}

/// Each iperf3 run's own balance: the run's client and server reports'
/// drops, the datagrams sent after the last one the server saw (in
/// flight when it closed), and the kernel's counters over the run.
///
/// A server that closes with datagrams in flight discards what its
/// socket still holds. What eudp's ring held is counted (`drop_close`);
/// beside it, what the ring held beyond that count (it should be none):
/// the datagrams eudp took off the kernel socket less those iperf3 read,
/// its one hello and `drop_close`. What the kernel socket held has no
/// counter.
fn iperf3_runs(runs: &[Value], counters: &Value) -> Vec<Value> {
    let report = |pid: &Value| counters["reports"].as_array().into_iter().flatten().find(|x| x["pid"] == *pid);
    runs.iter()
        .map(|r| {
            let (srv, cli) = (report(&r["server_pid"]), report(&r["client_pid"]));
            let counted = srv.map(drops).unwrap_or(0) + cli.map(drops).unwrap_or(0);
            let level = srv.map(socket_level).unwrap_or(0) + cli.map(socket_level).unwrap_or(0);
            let received = r["received"].as_i64().unwrap_or(0);
            let off = r["sent"].as_i64().unwrap_or(0) - received - counted as i64;
            let k = kernel::explain(off, &r["kernel"], &['b'], level);
            // What the ring held and no counter took (`drop_close` counts it).
            let ring_unread = srv.map(|x| taken(x) as i64 - received - 1 - counter(x, "drop_close") as i64);
            let tail = r["sent_after_the_servers_last"].as_u64().unwrap_or(0);
            let mut verdict = k["verdict"].as_str().unwrap_or("").to_string();
            let own = k["own_sum"].as_i64().unwrap_or(0);
            if off > 0 && ring_unread.is_some_and(|r| r + own == off) {
                verdict = format!(
                    "explained exactly: eudp's ring held {} datagrams no drop_close counted when the server closed{}",
                    ring_unread.unwrap_or(0),
                    if own > 0 { ", the rest by the kernel's counters" } else { "" }
                );
            } else if off > 0 && tail > 0 && own < off {
                verdict += &format!(
                    "; the server closed with {tail} datagrams sent after the last it read: what its socket held \
                     at the close is discarded (eudp's ring held {} beyond drop_close, the rest was in the kernel \
                     socket, which has no counter for it)",
                    ring_unread.map(|x| x.to_string()).unwrap_or("?".into())
                );
            }
            json!({ "run": r["run"], "off_by": off, "counted_drops": counted,
                    "sent_after_the_servers_last": tail, "ring_unread_uncounted_at_close": ring_unread,
                    "reports": [srv.is_some(), cli.is_some()], "kernel_own": k["own_namespaces"],
                    "kernel_shared": k["shared_host_wide"], "verdict": verdict })
        })
        .collect()
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

/// The faults `[a, b]` (seconds of the run) touches, within the margin.
fn touched<'a>(faults: &'a [Value], a: f64, b: f64) -> impl Iterator<Item = &'a Value> + 'a {
    faults.iter().filter(move |f| {
        let at = f["at_s"].as_f64().unwrap_or(0.0);
        let end = at + f["for_s"].as_f64().unwrap_or(0.0);
        a <= end + FAULT_MARGIN_S && b >= at - FAULT_MARGIN_S
    })
}

/// Whether `[a, b]` touches a fault aimed at `workload`.
fn own_fault(faults: &[Value], workload: &str, a: f64, b: f64) -> bool {
    touched(faults, a, b).any(|f| f["workload"] == workload)
}

/// The verdict's rule for the stall target, as the JSON states it.
pub const STALL_RULE: &str = "the verdict takes the longest gap that does not touch (within 1 s) a fault aimed at \
     that workload (dnsmasq's restart for dns, the receiver's pause for iperf3); the CPU hog is aimed at all \
     workloads and excuses none; the programs list every gap over 100 ms (the longest ones when there are more \
     than they keep), so with no listed gap outside its own faults a workload's bound is 100 ms. A workload with a \
     control (the same programs without the shim, side by side on the same host, with the same faults: sockperf, \
     dns, fork) misses only when its gap is longer than both 1 s and the control's longest by the same rule: what \
     the loaded host does to the program without eudp is the host's. iperf3 has no control (a second 200 Mbit/s \
     stream would take the CPU the others share) and is judged against 1 s alone";

/// The longest stall each workload saw (raw), the one its verdict takes
/// (see [`STALL_RULE`]), and the faults the raw one touched.
pub fn stalls(w: &Value, faults: &[Value]) -> Vec<Value> {
    let gaps = |v: &Value, name: &str, how: &str| {
        let start = v["client_start_s"].as_f64().unwrap_or(0.0);
        let (mut verdict, mut raw, mut in_hog) = (None::<f64>, None::<(f64, f64, f64)>, 0.0f64);
        for g in v["gaps"].as_array().into_iter().flatten() {
            let (a, b) = (g[0].as_f64().unwrap_or(0.0) + start, g[1].as_f64().unwrap_or(0.0) + start);
            let ms = (b - a) * 1000.0;
            if !own_fault(faults, name, a, b) {
                verdict = Some(verdict.unwrap_or(0.0).max(ms));
            }
            if raw.is_none_or(|r| ms > r.0) {
                raw = Some((ms, a, b));
            }
            if touched(faults, a, b).any(|f| f["fault"] == "cpu hog") {
                in_hog = in_hog.max(ms);
            }
        }
        let longest = v["longest_gap_ms"].as_f64();
        // Nothing listed outside the own faults: every such gap is at most the listing's threshold.
        let verdict = verdict.or(longest.map(|l| l.min(GAP_LISTED_MS)));
        let at = raw.map(|(_, a, b)| json!([a, b]));
        let during: Vec<&Value> =
            raw.map(|(_, a, b)| touched(faults, a, b).map(|f| &f["fault"]).collect()).unwrap_or_default();
        json!({ "workload": name, "longest_ms": longest, "longest_not_own_fault_ms": verdict,
                "longest_at_s": at, "longest_touches_faults": during, "longest_touching_cpu_hog_ms": in_hog,
                "gaps_listed": v["gaps"].as_array().map(Vec::len), "how": how })
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
    let max_us = |v: &Value| v["max_us"].as_f64().map(|x| x / 1000.0);
    vec![
        json!({ "workload": "iperf3", "longest_ms": iperf_all, "longest_not_own_fault_ms": iperf_other,
                "how": "the receiver's one-second intervals without a datagram (1 s resolution)",
                "bound_ms": STALL_TARGET_MS, "control": "none: a second 200 Mbit/s stream would take the CPU the others share" }),
        judged(
            json!({ "workload": "sockperf", "longest_ms": max_us(&w["sockperf"]),
                       "longest_not_own_fault_ms": max_us(&w["sockperf"]), "how": "the longest round trip" }),
            max_us(&w["control"]),
            Value::Null,
        ),
        with_control(
            gaps(&w["dns"], "dns", "the longest time between two answers"),
            gaps(&w["control_dns"], "control-dns", ""),
        ),
        with_control(
            gaps(&w["fork"], "fork", "the longest time between two children that got every echo"),
            gaps(&w["control_fork"], "control-fork", ""),
        ),
    ]
}

/// A stall row with its control's longest gap (by the same rule) beside,
/// and its bound: 1 s, or the control's longest when that is longer.
fn with_control(row: Value, control: Value) -> Value {
    let at = control["longest_at_s"].clone();
    judged(row, control["longest_not_own_fault_ms"].as_f64(), at)
}

fn judged(mut row: Value, control_ms: Option<f64>, control_at: Value) -> Value {
    let bound = control_ms.map_or(STALL_TARGET_MS, |c| c.max(STALL_TARGET_MS));
    row["control_longest_ms"] = control_ms.into();
    if !control_at.is_null() {
        row["control_longest_raw_at_s"] = control_at;
    }
    row["bound_ms"] = bound.into();
    row
}

/// One stall row in words: its verdict's gap, and its control's beside.
fn stall_text(s: &Value) -> String {
    let ms = |k: &str| s[k].as_f64().map_or("-".into(), |x| format!("{x:.0} ms"));
    format!(
        "{} {} (control {}, bound {})",
        s["workload"].as_str().unwrap_or(""),
        ms("longest_not_own_fault_ms"),
        ms("control_longest_ms"),
        ms("bound_ms")
    )
}

/// The targets, each with what was measured; never fitted.
pub fn targets(balance: &[Value], rss: &Value, stalls: &[Value]) -> Vec<Value> {
    let exact: Vec<&Value> = balance.iter().filter(|b| b["exact"] == true).collect();
    let rows: Vec<String> = exact
        .iter()
        .map(|b| {
            let name = b["workload"].as_str().unwrap_or("");
            match b["kernel"]["off_by"].as_i64().unwrap_or(0) {
                0 => format!("{name} exact"),
                k => format!("{name} off by {k} ({})", b["kernel"]["verdict"].as_str().unwrap_or("")),
            }
        })
        .collect();
    let with_kernel = exact.iter().all(|b| b["balanced_with_kernel_counters"] == true);
    let worst = |key: &str| {
        stalls
            .iter()
            .filter_map(|s| s[key].as_f64().map(|m| (m, s["workload"].as_str().unwrap_or(""))))
            .fold((0.0, ""), |a, b| if b.0 > a.0 { b } else { a })
    };
    let raw = worst("longest_ms");
    let over: Vec<String> = stalls
        .iter()
        .filter(|s| {
            s["longest_not_own_fault_ms"].as_f64().unwrap_or(0.0) > s["bound_ms"].as_f64().unwrap_or(STALL_TARGET_MS)
        })
        .map(stall_text)
        .collect();
    let each: Vec<String> = stalls.iter().map(stall_text).collect();
    let series: Vec<String> = rss["series"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["judged"] == true && s["flat"] != true)
        .map(|s| {
            format!(
                "{} grew {:.0} KiB{}",
                s["name"].as_str().unwrap_or(""),
                s["growth_kib"].as_f64().unwrap_or(0.0),
                s["eudp_share_of_growth_kib"]
                    .as_f64()
                    .map(|x| format!(", eudp's share {x:.0} KiB"))
                    .unwrap_or_default()
            )
        })
        .collect();
    vec![
        json!({ "target": "balance exact: sent = received + counted drops (+ the kernel's own counters, in the workload's own namespaces, where the kernel dropped), every workload that counts both sides",
                "measured": rows.join("; "), "met": !exact.is_empty() && with_kernel,
                "met_by_eudp_counters_alone": !exact.is_empty() && exact.iter().all(|b| b["balanced"] == true) }),
        json!({ "target": "RSS flat after warm-up, eudp's share where a control ran", "rule": super::memory::RULE,
                "measured": if series.is_empty() { "every judged program flat".to_string() } else { series.join("; ") },
                "met": rss["flat"] == true }),
        json!({ "target": "no stall > 1 s (besides a workload's own restart or pause, and besides what the host does to the same programs without eudp)",
                "rule": STALL_RULE,
                "measured": format!("{}; raw longest {:.0} ms ({})", each.join("; "), raw.0, raw.1),
                "over_bound": over, "met": over.is_empty() }),
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
        let b = &balance(&w, &c, &Value::Null)[0];
        assert_eq!((b["exact"].as_bool(), b["balanced"].as_bool()), (Some(true), Some(true)), "{b}");
        assert!(b.get("socket_drops_in_datagrams_estimate").is_none(), "{b}");
        let (w, c) = iperf3(true);
        let b = &balance(&w, &c, &Value::Null)[0];
        assert_eq!(b["exact"].as_bool(), Some(false), "{b}");
        assert_eq!(b["socket_drops_in_datagrams_estimate"].as_f64(), Some(100.0), "{b}");
    }

    /// The iperf3 row of a run of 100 datagrams: 90 read, 8 dropped at the
    /// socket, 2 in the ring at the close (taken: 90 + 2 + the hello),
    /// `drop_close` of them counted.
    fn closed_with_two_in_the_ring(drop_close: u64) -> Value {
        let w = json!({ "iperf3": { "runs": [{ "run": 1, "server_pid": 7, "client_pid": 8, "sent": 100, "received": 90,
                                               "sent_after_the_servers_last": 2, "kernel": {} }] } });
        let server = json!({ "pid": 7, "engine": { "gro": false }, "closed": [{ "stats": {
            "socket_drops": 8, "drop_close": drop_close, "datagrams_received": 93 } }] });
        let drops = 8 + drop_close;
        let c =
            json!({ "reports": [server], "by_workload": { "iperf3": { "drops": drops, "socket_level_drops": 8 } } });
        balance(&w, &c, &Value::Null).swap_remove(0)
    }

    #[test]
    fn a_run_whose_server_closed_with_its_ring_holding_datagrams_is_explained_by_them() {
        let b = &closed_with_two_in_the_ring(0);
        let run = &b["per_run"][0];
        assert_eq!(
            (run["off_by"].as_i64(), run["ring_unread_uncounted_at_close"].as_i64()),
            (Some(2), Some(2)),
            "{run}"
        );
        assert!(run["verdict"].as_str().unwrap().starts_with("explained exactly: eudp's ring held 2"), "{run}");
        assert_eq!(b["balanced"], false, "never folded into the counted drops: {b}");
        assert_eq!(b["off_in_runs_whose_server_closed_with_datagrams_in_flight"], 2);
    }

    #[test]
    fn a_run_whose_server_counted_its_unread_ring_at_close_balances() {
        let b = &closed_with_two_in_the_ring(2);
        let run = &b["per_run"][0];
        assert_eq!(
            (run["off_by"].as_i64(), run["ring_unread_uncounted_at_close"].as_i64()),
            (Some(0), Some(0)),
            "{run}"
        );
        assert_eq!(b["balanced"], true, "{b}");
    }

    #[test]
    fn late_dns_answers_count_as_received() {
        let w = json!({ "dns": { "sent": 10, "answered": 7, "late": 2, "unanswered": 3 } });
        let b = &balance(&w, &json!({}), &Value::Null)[2];
        assert_eq!((b["workload"].as_str(), b["received"].as_u64()), (Some("dns"), Some(9)), "{b}");
        assert_eq!(b["kernel"]["off_by"].as_i64(), Some(1), "{b}");
    }

    #[test]
    fn a_reply_the_client_held_at_its_exit_balances_the_sockperf_row() {
        // Every request read and answered; the last reply was in the client's
        // ring when it exited, counted as its drop_close.
        let w = json!({ "sockperf": { "sent": 100, "server_received": 100, "received": 99 } });
        let c = json!({ "by_workload": { "sockperf": { "drops": 1, "socket_level_drops": 0 } } });
        let b = &balance(&w, &c, &Value::Null)[1];
        assert_eq!(
            (b["workload"].as_str(), b["sent"].as_u64(), b["received"].as_u64()),
            (Some("sockperf"), Some(200), Some(199)),
            "{b}"
        );
        assert_eq!(b["balanced"], true, "{b}");
        // The same reply lost uncounted leaves the row off by one.
        let c = json!({ "by_workload": { "sockperf": { "drops": 0, "socket_level_drops": 0 } } });
        assert_eq!(balance(&w, &c, &Value::Null)[1]["kernel"]["off_by"].as_i64(), Some(1));
    }

    /// Stall rows of a run whose dns and fork programs saw a longest gap
    /// of `dns` and `fork` ms, and their controls `cdns` and `cfork`.
    fn stalls_of(dns: f64, cdns: f64, fork: f64, cfork: f64) -> Vec<Value> {
        let g = |ms: f64| json!({ "client_start_s": 0.0, "gaps": [[10.0, 10.0 + ms / 1000.0]], "longest_gap_ms": ms });
        let w = json!({ "sockperf": { "max_us": 5000.0 }, "control": { "max_us": 7000.0 },
                        "dns": g(dns), "control_dns": g(cdns), "fork": g(fork), "control_fork": g(cfork) });
        stalls(&w, &[])
    }

    fn stall_met(st: &[Value]) -> bool {
        let rss = json!({ "flat": true, "series": [] });
        targets(&[], &rss, st)[2]["met"] == true
    }

    #[test]
    fn a_stall_the_control_saw_as_long_is_the_hosts() {
        let st = stalls_of(2193.0, 2500.0, 300.0, 100.0);
        assert_eq!(st[2]["control_longest_ms"].as_f64(), Some(2500.0), "{}", st[2]);
        assert_eq!(st[2]["bound_ms"].as_f64(), Some(2500.0), "{}", st[2]);
        assert_eq!(st[3]["bound_ms"].as_f64(), Some(STALL_TARGET_MS), "{}", st[3]);
        assert!(stall_met(&st), "{st:?}");
    }

    #[test]
    fn a_stall_longer_than_its_controls_and_than_a_second_misses() {
        // fork stalls 2.2 s where its control saw 0.4 s: eudp's.
        let st = stalls_of(300.0, 200.0, 2200.0, 400.0);
        assert!(!stall_met(&st), "{st:?}");
        let t = targets(&[], &json!({ "flat": true, "series": [] }), &st);
        assert!(t[2]["over_bound"][0].as_str().unwrap().starts_with("fork 2200 ms (control 400 ms"), "{}", t[2]);
        // Without a control (it failed to run) the bound is 1 s.
        let mut w = json!({ "dns": { "client_start_s": 0.0, "gaps": [[1.0, 2.5]], "longest_gap_ms": 1500.0 },
                            "control_dns": { "error": "no dnsmasq" } });
        w["fork"] = w["dns"].clone();
        let st = stalls(&w, &[]);
        assert_eq!(st[2]["bound_ms"].as_f64(), Some(STALL_TARGET_MS), "{}", st[2]);
        assert!(!stall_met(&st), "{st:?}");
    }
}
