//! The reports the shim writes for `eudp stat` (one JSON file per
//! process): reading them back and the human-readable table.

use eudp_engine::stat_dir::{parse_name, runs};
use std::path::Path;

/// Reports found in `dir` (of live processes unless `all`), by pid.
///
/// Files are named by pid and start time (`eudp_engine::stat_dir`), so a
/// process whose pid was reused keeps its report; each report gets its
/// process's start time as `start_ticks` when its name has one. The UOE
/// counters a process's `tcp` transport writes next to its report
/// (`<pid>-<start>.tcp.json`) go under `"uoe"`; a process with only those
/// gets a report of its own.
pub fn read_reports(dir: &Path, all: bool, pids: &[u64]) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut uoe = std::collections::BTreeMap::new();
    let Ok(rd) = std::fs::read_dir(dir) else { return out };
    for e in rd.flatten() {
        let p = e.path();
        let Some((pid, start, tcp)) = p.file_name().and_then(|n| n.to_str()).and_then(parse_name) else { continue };
        if !pids.is_empty() && !pids.contains(&pid) {
            continue;
        }
        if !all && pids.is_empty() && !runs(pid, start) {
            continue;
        }
        if let Ok(s) = std::fs::read_to_string(&p) {
            if let Ok(mut v) = serde_json::from_str::<serde_json::Value>(&s) {
                if let (Some(t), Some(m)) = (start, v.as_object_mut()) {
                    m.insert("start_ticks".into(), t.into());
                }
                if tcp {
                    uoe.insert((pid, start), v);
                } else if all || !pids.is_empty() || v["exited"] != true {
                    // A final report of a live pid without a start time is
                    // another process's: the pid was reused.
                    out.push(v);
                }
            }
        }
    }
    for ((pid, start), v) in uoe {
        let same = |r: &serde_json::Value| r["pid"].as_u64() == Some(pid) && r["start_ticks"].as_u64() == start;
        match out.iter_mut().find(|r| same(r)) {
            Some(r) => r["uoe"] = v,
            None => {
                let mut r = serde_json::json!({ "pid": pid, "uoe": v });
                if let Some(t) = start {
                    r["start_ticks"] = t.into();
                }
                out.push(r)
            }
        }
    }
    out.sort_by_key(|v| (v["pid"].as_u64().unwrap_or(0), v["start_ticks"].as_u64().unwrap_or(0)));
    out
}

/// Every drop counter of a socket (`eudp_engine::StatsSnapshot`): the
/// endpoint's, the kernel socket's own, its kernel path's after a fallback
/// and the `tcp` transport's for it.
pub const SOCKET_DROPS: &[&str] = &[
    "drop_ring_full",
    "drop_truncated",
    "drop_send_error",
    "drop_shutdown",
    "drop_close",
    "socket_drops",
    "drop_fallback_close",
    "drop_kernel_rcvbuf",
    "drop_tcp_send",
    "drop_tcp_receive",
    "drop_tcp_exit",
];

/// The socket's non-zero drop counters, as a suffix of its row.
fn drop_suffix(x: &serde_json::Value) -> String {
    let v: Vec<String> = SOCKET_DROPS
        .iter()
        .filter(|k| u(x, k) > 0)
        .map(|k| format!("{} {}", k.trim_start_matches("drop_"), u(x, k)))
        .collect();
    if v.is_empty() {
        String::new()
    } else {
        format!("  drops: {}", v.join(", "))
    }
}

fn u(v: &serde_json::Value, k: &str) -> u64 {
    v["stats"][k].as_u64().unwrap_or(0)
}

/// Mean engine batch size from the histogram (bucket i: 2^i..2^(i+1)-1).
fn mean_batch(v: &serde_json::Value) -> f64 {
    let batches = u(v, "engine_batches");
    if batches == 0 {
        return 0.0;
    }
    let queued_sent = u(v, "datagrams_sent").saturating_sub(u(v, "direct_posts"));
    queued_sent as f64 / batches as f64
}

/// A table of the reports.
pub fn format_reports(reports: &[serde_json::Value]) -> String {
    let mut s = String::new();
    for r in reports {
        s += &format!(
            "pid {} {}{}: {} socket(s) accelerated, {} fallback(s)",
            r["pid"],
            r["exe"].as_str().unwrap_or("?"),
            if r["exited"].as_bool() == Some(true) { " (exited)" } else { "" },
            r["accelerated"].as_u64().unwrap_or(0),
            r["fallbacks"].as_u64().unwrap_or(0)
        );
        if let Some(n) = r["multicast_kernel"].as_u64().filter(|&n| n > 0) {
            s += &format!(", {n} multicast on the kernel path");
        }
        if let Some(m) = r["fallback_reasons"].as_object().filter(|m| !m.is_empty()) {
            let why: Vec<String> = m.iter().map(|(k, v)| format!("{k} ×{v}")).collect();
            s += &format!(" [{}]", why.join("; "));
        }
        s += "\n";
        s += &format!(
            "  {:>4} {:>6} {:<22} {:<22} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>8} {:>8}\n",
            "fd",
            "mode",
            "local",
            "peer",
            "sent",
            "direct",
            "queued",
            "batch",
            "received",
            "ring_drop",
            "sock_drop",
            "gro"
        );
        for key in ["sockets", "closed"] {
            for x in r[key].as_array().into_iter().flatten() {
                s += &format!(
                    "  {:>4} {:>6} {:<22} {:<22} {:>10} {:>10} {:>10} {:>8.1} {:>10} {:>8} {:>8} {:>8}{}{}{}\n",
                    x["fd"].as_i64().unwrap_or(-1),
                    x["mode"].as_str().unwrap_or("?"),
                    x["local"].as_str().unwrap_or("-"),
                    x["peer"].as_str().unwrap_or("-"),
                    u(x, "datagrams_sent"),
                    u(x, "direct_posts"),
                    u(x, "queued_posts"),
                    mean_batch(x),
                    u(x, "datagrams_received"),
                    u(x, "drop_ring_full"),
                    u(x, "socket_drops"),
                    u(x, "gro_superpackets"),
                    if key == "closed" { "  (closed)" } else { "" },
                    drop_suffix(x),
                    x["fallback_reason"].as_str().map(|r| format!("  fallback: {r}")).unwrap_or_default(),
                );
            }
        }
        if let Some(t) = r["uoe"]["tcp"].as_object() {
            s += &format_uoe(t, r["uoe"]["queued_bytes"].as_u64().unwrap_or(0));
        }
        s += &format_xdp(&r["xdp"]);
    }
    s
}

/// The AF_XDP (`--transport xdp`) counters of a process, or why the
/// transport did not start; empty for other transports.
fn format_xdp(x: &serde_json::Value) -> String {
    if let Some(why) = x["unavailable"].as_str() {
        return format!(
            "  xdp: unavailable ({why}); {} socket(s) on the kernel backend\n",
            x["kernel_backend_sockets"].as_u64().unwrap_or(0)
        );
    }
    let Some(t) = x["stats"].as_object() else { return String::new() };
    let c = |k: &str| t.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let nonzero = |keys: &[&str]| {
        let v: Vec<String> = keys.iter().filter(|k| c(k) > 0).map(|k| format!("{k} {}", c(k))).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    format!(
        "  xdp ({} hook): frames {} sent ({} kicks), {} received; kernel path {} sent ({}), {} received\n  xdp drops: {}\n",
        t.get("attach").and_then(|v| v.as_str()).unwrap_or("?"),
        c("tx_xdp"),
        c("tx_kicks"),
        c("rx_xdp"),
        c("tx_kernel"),
        nonzero(&["tx_kernel_no_neigh", "tx_kernel_off_link", "tx_kernel_too_big"]),
        c("rx_kernel"),
        nonzero(&["rx_bad_frames", "rx_no_socket", "rx_not_peer", "rx_inbox_drops", "xsk_rx_dropped", "xsk_rx_ring_full", "xsk_fill_ring_empty"]),
    )
}

/// The UOE (`--transport tcp`) counters of a process: connections,
/// frames, and drops and closed connections by reason (the non-zero ones).
fn format_uoe(t: &serde_json::Map<String, serde_json::Value>, queued: u64) -> String {
    let c = |k: &str| t.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    let reasons = |keys: &mut dyn Iterator<Item = &str>| {
        let v: Vec<String> =
            keys.filter(|k| c(k) > 0).map(|k| format!("{} {}", k.trim_start_matches("drop_"), c(k))).collect();
        if v.is_empty() {
            "none".to_string()
        } else {
            v.join(", ")
        }
    };
    let drops = reasons(
        &mut t
            .keys()
            .map(|k| k.as_str())
            .filter(|k| k.starts_with("drop_") || *k == "lost_partial" || *k == "plain_lost"),
    );
    let closed = reasons(&mut ["bad_hello", "malformed", "oversized", "hello_timeouts", "rejected_conns"].into_iter());
    format!(
        "  uoe: connections {} opened, {} accepted, {} closed, {} failed, {} reconnects; frames {} sent ({} writes), {} received ({} in place); {} plain UDP sent; {queued} B queued\n  uoe drops: {drops}\n  uoe refused/closed input: {closed}\n",
        c("conns_opened"),
        c("conns_accepted"),
        c("conns_closed"),
        c("connect_failures"),
        c("reconnects"),
        c("frames_sent"),
        c("writes"),
        c("frames_received"),
        c("frames_in_place"),
        c("plain_sent"),
    )
}
