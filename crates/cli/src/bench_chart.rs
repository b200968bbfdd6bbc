//! An SVG chart beside each bench result (`bench-*.json` → `bench-*.svg`,
//! also for `--apps` and `--tcp`): received throughput and CPU per datagram
//! (sender plus receiver) as grouped bars, one group per size or workload,
//! one bar per mode, the median over repeated rows. The ceiling (the GSO/GRO
//! row, or iperf3 over kernel TCP) is drawn hatched and named so in the
//! legend, so each bar reads against what the host allows.
//!
//! Reads the result's JSON value, so every bench kind shares one chart; the
//! drawing is the project's SVG writer's (`eudp_model::svg::bar_chart`).

use serde_json::Value;
use std::path::{Path, PathBuf};

pub use eudp_model::svg::{bar_chart as render, BarChart as Chart, BarPoint as Point};

fn num(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn sum(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

fn rows(v: &Value) -> &[Value] {
    v["rows"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// iperf3 rows of `eudp run` results (`--apps` and the `--tcp` program
/// rows): received Gbit/s and both processes' CPU per datagram.
fn iperf3_point(r: &Value, group: String, series: &str) -> Point {
    let ns = sum(num(&r["sender_cpu_ns_per_datagram"]), num(&r["receiver_cpu_ns_per_datagram"]));
    Point { group, series: series.to_string(), gbps: num(&r["received_gbps"]), cpu_us: ns.map(|n| n / 1e3) }
}

/// The chart of a result of any bench kind, or `None` for a kind it does
/// not know.
pub fn chart_of(v: &Value) -> Option<Chart> {
    let schema = v["schema"].as_str().unwrap_or("");
    if schema.starts_with("eudp-bench/") {
        let points = rows(v)
            .iter()
            .filter(|r| num(&r["offered_pps"]).unwrap_or(0.0) == 0.0)
            .map(|r| Point {
                group: format!("{} B", r["size"]),
                series: r["mode"].as_str().unwrap_or("?").to_string(),
                gbps: num(&r["gbps"]),
                cpu_us: sum(num(&r["tx_cpu_s_per_m"]), num(&r["rx_cpu_s_per_m"])),
            })
            .collect();
        return Some(Chart { title: "eudp bench: stacks side by side".into(), points, ceiling: Some("gso".into()) });
    }
    if schema.starts_with("eudp-bench-apps/") {
        let mut points = Vec::new();
        for r in rows(v) {
            let stack = r["stack"].as_str().or(r["client"].as_str()).unwrap_or("?");
            match r["tool"].as_str() {
                Some("iperf3") => {
                    let group = format!("iperf3 -u 1472 B{}", if r["reverse"] == true { " -R" } else { "" });
                    points.push(iperf3_point(r, group, stack));
                }
                Some("sockperf") if r["mode"] == "throughput" => points.push(Point {
                    group: "sockperf 64 B".into(),
                    series: stack.to_string(),
                    gbps: num(&r["received_rate"]).map(|m| m * 64.0 * 8.0 / 1e9),
                    cpu_us: None,
                }),
                _ => {}
            }
        }
        return Some(Chart { title: "eudp bench --apps: unmodified programs".into(), points, ceiling: None });
    }
    if v["kind"] == "tcp-transport" {
        let mut points: Vec<Point> = rows(v)
            .iter()
            .map(|r| Point {
                group: format!("transfer {} B", r["size"]),
                series: r["mode"].as_str().unwrap_or("?").to_string(),
                gbps: num(&r["rx_gbps"]),
                cpu_us: sum(num(&r["tx_cpu_us_per_dgram"]), num(&r["rx_cpu_us_per_dgram"])),
            })
            .collect();
        for r in rows(&v["apps"]).iter().filter(|r| r["tool"] == "iperf3") {
            let group = format!("iperf3, window {}", r["window"].as_str().unwrap_or("?"));
            points.push(iperf3_point(r, group, r["bench_stack"].as_str().unwrap_or("?")));
        }
        return Some(Chart {
            title: "eudp bench --tcp: UDP over TCP".into(),
            points,
            ceiling: Some("kernel-tcp".into()),
        });
    }
    None
}

/// Writes the chart of `result` beside `json_path` (same base name,
/// `.svg`); returns its path, or `None` for a kind without a chart.
pub fn write_beside(json_path: &Path, result: &Value) -> Result<Option<PathBuf>, String> {
    let Some(chart) = chart_of(result) else { return Ok(None) };
    let path = json_path.with_extension("svg");
    std::fs::write(&path, render(&chart)).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(Some(path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bench_fixture() -> Value {
        let row = |mode: &str, size: u64, gbps: f64, tx: f64, rx: f64, offered: f64| json!({"mode": mode, "size": size, "gbps": gbps, "tx_cpu_s_per_m": tx, "rx_cpu_s_per_m": rx, "offered_pps": offered});
        json!({"schema": "eudp-bench/1", "rows": [
            row("kernel", 64, 0.3, 1.5, 1.0, 0.0),
            row("gso", 64, 1.2, 0.4, 0.3, 0.0),
            row("eudp", 64, 1.0, 0.5, 0.3, 0.0),
            row("eudp", 64, 0.1, 0.5, 0.3, 5e6),
            row("kernel", 1472, 4.0, 2.0, 1.5, 0.0),
            row("gso", 1472, 20.0, 0.5, 0.5, 0.0),
            row("eudp", 1472, 18.0, 0.6, 0.5, 0.0),
        ]})
    }

    /// Every `<name` opens and closes in order (self-closing counts); enough
    /// to catch a broken writer, with no XML parser in the dependencies.
    fn well_formed(svg: &str) {
        let mut stack: Vec<String> = Vec::new();
        let mut rest = svg;
        while let Some(i) = rest.find('<') {
            let end = rest[i..].find('>').expect("unclosed tag") + i;
            let tag = &rest[i + 1..end];
            if let Some(name) = tag.strip_prefix('/') {
                assert_eq!(stack.pop().as_deref(), Some(name.trim()), "closing {name}");
            } else if !tag.ends_with('/') {
                stack.push(tag.split_whitespace().next().unwrap_or("").to_string());
            }
            rest = &rest[end + 1..];
        }
        assert!(stack.is_empty(), "left open: {stack:?}");
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    }

    #[test]
    fn bench_chart_has_every_bar_and_marks_the_ceiling() {
        let chart = chart_of(&bench_fixture()).unwrap();
        // The paced row is left out.
        assert_eq!(chart.points.len(), 6);
        let svg = render(&chart);
        well_formed(&svg);
        // Two panels of 2 sizes x 3 modes.
        assert_eq!(svg.matches(r#"class="bar""#).count(), 12);
        assert_eq!(svg.matches(r#"class="value""#).count(), 12);
        assert_eq!(svg.matches(r#"class="key""#).count(), 3);
        assert!(svg.contains("gso (ceiling)"));
        assert_eq!(svg.matches(r#"fill="url(#ceiling)""#).count(), 2 + 2 + 1);
        for label in ["64 B", "1472 B", "Gbit/s", "CPU per datagram", "eudp 1472 B: 18", "kernel 64 B: 2.5"] {
            assert!(svg.contains(label), "{label}");
        }
    }

    #[test]
    fn medians_over_repeats() {
        let mut v = bench_fixture();
        let extra = json!({"mode": "eudp", "size": 1472, "gbps": 10.0, "tx_cpu_s_per_m": 1.0, "rx_cpu_s_per_m": 1.0, "offered_pps": 0.0});
        v["rows"].as_array_mut().unwrap().push(extra.clone());
        v["rows"].as_array_mut().unwrap().push(extra);
        let svg = render(&chart_of(&v).unwrap());
        assert!(svg.contains("eudp 1472 B: 10<"), "{svg}");
    }

    #[test]
    fn tcp_and_apps_kinds() {
        let tcp = json!({"kind": "tcp-transport", "rows": [
            {"mode": "kernel", "size": 1472, "rx_gbps": 2.0, "tx_cpu_us_per_dgram": 5.9, "rx_cpu_us_per_dgram": 2.0},
            {"mode": "tcp", "size": 1472, "rx_gbps": 13.0, "tx_cpu_us_per_dgram": 0.9, "rx_cpu_us_per_dgram": 0.8},
        ], "apps": {"rows": [
            {"tool": "iperf3", "window": "default", "bench_stack": "kernel-tcp", "received_gbps": 20.0,
             "sender_cpu_ns_per_datagram": 500.0, "receiver_cpu_ns_per_datagram": 700.0},
            {"tool": "sockperf", "bench_stack": "kernel", "p50_us": 20.0},
        ]}});
        let svg = render(&chart_of(&tcp).unwrap());
        well_formed(&svg);
        assert!(svg.contains("kernel-tcp (ceiling)"));
        assert!(svg.contains("kernel-tcp iperf3, window default: 1.2<"));
        let apps = json!({"schema": "eudp-bench-apps/3", "rows": [
            {"tool": "iperf3", "stack": "kernel", "reverse": false, "received_gbps": 1.0},
            {"tool": "iperf3", "stack": "eudp-throughput", "reverse": true, "received_gbps": 6.0},
            {"tool": "sockperf", "mode": "ping-pong", "client": "kernel", "p50_us": 20.0},
        ]});
        let svg = render(&chart_of(&apps).unwrap());
        well_formed(&svg);
        assert!(svg.contains("iperf3 -u 1472 B -R"));
        assert!(!svg.contains("ceiling)"));
        assert!(chart_of(&json!({"schema": "other"})).is_none());
    }

    #[test]
    fn writes_beside_the_json() {
        let dir = std::env::temp_dir().join(format!("eudp-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json_path = dir.join("bench-1.json");
        let path = write_beside(&json_path, &bench_fixture()).unwrap().unwrap();
        assert_eq!(path, dir.join("bench-1.svg"));
        well_formed(&std::fs::read_to_string(&path).unwrap());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
