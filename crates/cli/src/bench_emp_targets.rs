//! The targets of `eudp bench --emp`, judged from its rows as measured
//! (never fitted), the best scheme per measure beside the paper's finding,
//! and the printed table.

use serde_json::{json, Value};

/// Message sizes of the issue: 10 B ping-pong, 16 KiB bandwidth.
pub const SMALL: usize = 10;
pub const LARGE: usize = 16 << 10;

/// The row of `stack`/`pattern`/`size` (and `scheme`, `loss_pct`,
/// `topology` when given).
fn find<'a>(rows: &'a [Value], want: &[(&str, Value)]) -> Option<&'a Value> {
    rows.iter().find(|r| want.iter().all(|(k, v)| &r[*k] == v))
}

/// A row's measure: `p50`/`p99` round trip in ns or `mbit_s`; `None` for
/// an error row.
pub fn measure(r: &Value, what: &str) -> Option<f64> {
    if !r["error"].is_null() {
        return None;
    }
    let res = &r["result"];
    match what {
        "p50" | "p99" if r["stack"] == "libfabric-rxd" => res["rtt_ns"].as_f64(),
        "p50" | "p99" => res["lat_ns"][what].as_f64(),
        _ => res["mbit_s"].as_f64(),
    }
}

fn verdict(value: Option<f64>, limit: Option<f64>, at_least: bool, extra_ok: bool) -> Value {
    let result = match (value, limit) {
        (Some(v), Some(l)) if extra_ok && (if at_least { v >= l } else { v <= l }) => "pass",
        (Some(_), Some(_)) => "miss",
        _ => "n/a",
    };
    json!({ "value": value, "limit": limit, "result": result })
}

fn emp_row<'a>(rows: &'a [Value], scheme: &str, pattern: &str, topology: &str) -> Option<&'a Value> {
    rows.iter()
        .find(|r| r["stack"] == "emp" && r["scheme"] == scheme && r["pattern"] == pattern && r["topology"] == topology)
}

/// Whether a stream row lost nothing: no client error, the server checked
/// every byte and received every message the client counted.
fn no_loss(r: &Value) -> bool {
    let (c, s) = (&r["result"], &r["server"]);
    c["errors"].as_u64() == Some(0)
        && s["corrupt"].as_u64() == Some(0)
        && s["messages_received"].as_u64().is_some_and(|n| Some(n) >= c["messages"].as_u64())
}

/// The targets, per EMP scheme that has rows: 16 KiB stream ≥ 0.9×
/// kernel TCP with no message lost; 10 B p50 ≤ kernel UDP p50 and ≤ 0.5×
/// fi_pingpong's round trip; stream under 1% loss ≥ 0.5× lossless (on the
/// impairment topology).
pub fn targets(rows: &[Value]) -> Vec<Value> {
    let base = |stack: &str, pattern: &str, size: usize| {
        find(rows, &[("stack", json!(stack)), ("pattern", json!(pattern)), ("size", json!(size))])
    };
    let tcp = base("kernel-tcp", "stream", LARGE).and_then(|r| measure(r, "mbit_s"));
    let udp = base("kernel-udp", "pingpong", SMALL).and_then(|r| measure(r, "p50"));
    let fi = base("libfabric-rxd", "pingpong", SMALL).and_then(|r| measure(r, "p50"));
    // Each scheme once, in the order of its first row (the loss rows come last).
    let mut schemes: Vec<&str> = Vec::new();
    for s in rows.iter().filter(|r| r["stack"] == "emp").filter_map(|r| r["scheme"].as_str()) {
        if !schemes.contains(&s) {
            schemes.push(s);
        }
    }
    let mut out = Vec::new();
    for s in schemes {
        let stream = emp_row(rows, s, "stream", "testbed");
        let v = stream.and_then(|r| measure(r, "mbit_s"));
        let mut t = verdict(v, tcp.map(|x| 0.9 * x), true, stream.is_some_and(no_loss));
        t["name"] = json!("16 KiB stream >= 0.9x kernel TCP, no message lost");
        t["scheme"] = json!(s);
        out.push(t);
        let p50 = emp_row(rows, s, "pingpong", "testbed").and_then(|r| measure(r, "p50"));
        let mut t = verdict(p50, udp, false, true);
        t["name"] = json!("10 B p50 <= kernel UDP ping-pong p50 (ns)");
        t["scheme"] = json!(s);
        out.push(t);
        let mut t = verdict(p50, fi.map(|x| 0.5 * x), false, true);
        t["name"] = json!("10 B p50 <= 0.5x fi_pingpong udp;ofi_rxd round trip (ns)");
        t["scheme"] = json!(s);
        out.push(t);
        let lossy = rows.iter().find(|r| r["stack"] == "emp" && r["scheme"] == s && r["loss_pct"].as_u64() > Some(0));
        let lossless = rows.iter().find(|r| r["stack"] == "emp" && r["scheme"] == s && r["loss_pct"] == 0);
        if lossy.is_some() || lossless.is_some() {
            let (l, f) = (lossy.and_then(|r| measure(r, "mbit_s")), lossless.and_then(|r| measure(r, "mbit_s")));
            let ratio = l.zip(f).map(|(l, f)| l / f);
            let mut t = verdict(ratio, Some(0.5), true, lossy.is_some_and(no_loss));
            t["name"] = json!("16 KiB stream under 1% loss / lossless >= 0.5, no message lost");
            t["scheme"] = json!(s);
            out.push(t);
        }
    }
    out
}

/// Per measure, the scheme that did best on the testbed, beside the
/// paper's finding (RO for unidirectional bandwidth and latency, SO for
/// bidirectional bandwidth).
pub fn best_schemes(rows: &[Value]) -> Vec<Value> {
    let pick = |pattern: &str, what: &str, lower: bool| {
        rows.iter()
            .filter(|r| r["stack"] == "emp" && r["pattern"] == pattern && r["topology"] == "testbed")
            .filter_map(|r| Some((r["scheme"].as_str()?, measure(r, what)?)))
            .reduce(|a, b| if (b.1 < a.1) == lower { b } else { a })
    };
    [
        ("10 B p50 latency", "pingpong", "p50", true, "ro"),
        ("16 KiB unidirectional", "stream", "mbit_s", false, "ro"),
        ("16 KiB bidirectional", "bidir", "mbit_s", false, "so"),
    ]
    .iter()
    .map(|(name, pattern, what, lower, paper)| {
        let b = pick(pattern, what, *lower);
        json!({ "measure": name, "best": b.map(|x| x.0), "value": b.map(|x| x.1), "paper": paper })
    })
    .collect()
}

/// The rows, targets and best schemes as text.
pub fn table(res: &Value) -> String {
    let none = Vec::new();
    let arr = |k: &str| res[k].as_array().unwrap_or(&none).clone();
    let f = |v: Option<f64>, div: f64| v.map_or("-".to_string(), |x| format!("{:.1}", x / div));
    let f2 = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.2}"));
    let mut s = format!(
        "{:<14} {:<6} {:<9} {:>6} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9}  {}\n",
        "stack",
        "scheme",
        "pattern",
        "size",
        "topology",
        "p50 us",
        "p99 us",
        "Mbit/s",
        "rss a KiB",
        "rss b KiB",
        "status"
    );
    for r in arr("rows") {
        let topo = match r["loss_pct"].as_u64() {
            Some(l) if l > 0 => format!("loss{l}%"),
            _ => r["topology"].as_str().unwrap_or("").to_string(),
        };
        let status = match r["error"].as_str() {
            None => "ok".to_string(),
            Some(e) => format!("error: {}", e.lines().next().unwrap_or("").chars().take(100).collect::<String>()),
        };
        s += &format!(
            "{:<14} {:<6} {:<9} {:>6} {:<8} {:>9} {:>9} {:>9} {:>9} {:>9}  {}\n",
            r["stack"].as_str().unwrap_or(""),
            r["scheme"].as_str().unwrap_or("-"),
            r["pattern"].as_str().unwrap_or(""),
            r["size"].as_u64().unwrap_or(0),
            topo,
            f(measure(&r, "p50").filter(|_| r["pattern"] == "pingpong"), 1e3),
            f(measure(&r, "p99").filter(|_| r["pattern"] == "pingpong" && r["stack"] != "libfabric-rxd"), 1e3),
            f(measure(&r, "mbit_s"), 1.0),
            f(r["client_peak_rss_kib"].as_f64(), 1.0),
            f(r["server_peak_rss_kib"].as_f64(), 1.0),
            status
        );
    }
    s += "\ntargets:\n";
    for t in arr("targets") {
        s += &format!(
            "  {:<4} [{}] {}: {} (limit {})\n",
            t["result"].as_str().unwrap_or(""),
            t["scheme"].as_str().unwrap_or(""),
            t["name"].as_str().unwrap_or(""),
            f(t["value"].as_f64(), 1.0),
            f(t["limit"].as_f64(), 1.0)
        );
    }
    s += "10 B ping-pong system calls per message (strace -f, every thread, start-up included):\n";
    for r in arr("rows").iter().filter(|r| r["topology"] == "testbed-strace") {
        s += &format!(
            "  {:<14} client {} server {}\n",
            r["stack"].as_str().unwrap_or(""),
            f2(r["client_syscalls_per_message"].as_f64()),
            f2(r["server_syscalls_per_message"].as_f64()),
        );
    }
    s += "best scheme per measure (paper's finding beside):\n";
    for b in arr("best") {
        s += &format!(
            "  {:<24} {:<6} paper: {}\n",
            b["measure"].as_str().unwrap_or(""),
            b["best"].as_str().unwrap_or("-"),
            b["paper"].as_str().unwrap_or("")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream row; the impairment topology's rows carry their loss.
    fn row(scheme: &str, pattern: &str, topology: &str, loss: u64) -> Value {
        let mut r = json!({"stack": "emp", "scheme": scheme, "pattern": pattern, "topology": topology,
               "result": {"mbit_s": 100.0, "errors": 0}, "server": {"corrupt": 0, "messages_received": 1}});
        if topology == "impair" {
            r["loss_pct"] = json!(loss);
        }
        r
    }

    #[test]
    fn each_scheme_is_judged_once_even_when_its_loss_rows_come_last() {
        let rows = vec![
            row("base", "stream", "testbed", 0),
            row("so", "stream", "testbed", 0),
            row("base", "stream", "impair", 0),
            row("base", "stream", "impair", 1),
        ];
        let t = targets(&rows);
        let of = |s: &str| t.iter().filter(|v| v["scheme"] == s).count();
        // base: three targets and the loss ratio; so: three (no loss rows).
        assert_eq!((of("base"), of("so")), (4, 3), "{t:#?}");
    }
}
