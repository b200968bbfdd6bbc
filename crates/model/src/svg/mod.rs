//! The project's SVG writer: line plots, time-flow charts and grouped bar
//! charts, written by hand (no drawing dependency for a few shapes).

mod bars;
pub use bars::{bar_chart, BarChart, BarPoint};

use crate::timeline::TraceRecord;
use std::fmt::Write;

const COLORS: &[&str] =
    &["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"];

/// Escapes text for SVG text content and attribute values.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

fn nice_ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    if hi.is_nan() || lo.is_nan() || hi <= lo {
        return vec![lo];
    }
    let raw = (hi - lo) / n as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw);
    let mut v = Vec::new();
    let mut x = (lo / step).ceil() * step;
    while x <= hi + step * 1e-9 {
        v.push(x);
        x += step;
    }
    v
}

fn fmt_num(x: f64) -> String {
    if x.abs() >= 1e6 {
        format!("{:.0}M", x / 1e6)
    } else if x.abs() >= 1e4 {
        format!("{:.0}k", x / 1e3)
    } else if x.fract().abs() < 1e-9 {
        format!("{x:.0}")
    } else {
        format!("{x:.2}")
    }
}

/// Line plot; `log_x` uses a base-2 log scale for the x axis.
pub fn line_plot(title: &str, xlabel: &str, ylabel: &str, series: &[Series], log_x: bool) -> String {
    let (w, h, ml, mr, mt, mb) = (720.0, 440.0, 70.0, 180.0, 40.0, 50.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let tx = |x: f64| if log_x { x.max(1e-12).log2() } else { x };
    let all: Vec<(f64, f64)> =
        series.iter().flat_map(|s| s.points.iter().copied()).filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        esc(title)
    );
    if all.is_empty() {
        let _ = writeln!(s, r#"<text x="{}" y="{}">no data</text></svg>"#, ml, mt + 20.0);
        return s;
    }
    let x0 = all.iter().map(|p| tx(p.0)).fold(f64::INFINITY, f64::min);
    let x1 = all.iter().map(|p| tx(p.0)).fold(f64::NEG_INFINITY, f64::max);
    let y1 = all.iter().map(|p| p.1).fold(0.0, f64::max) * 1.05;
    let (x1, y1) = (if x1 > x0 { x1 } else { x0 + 1.0 }, if y1 > 0.0 { y1 } else { 1.0 });
    let px = |x: f64| ml + (tx(x) - x0) / (x1 - x0) * pw;
    let py = |y: f64| mt + ph - y / y1 * ph;
    let _ = writeln!(s, r##"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>"##);
    for yt in nice_ticks(0.0, y1, 6) {
        let y = py(yt);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            ml + pw,
            ml - 5.0,
            y + 4.0,
            fmt_num(yt)
        );
    }
    let xt: Vec<f64> = if log_x {
        (x0.floor() as i64..=x1.ceil() as i64)
            .map(|e| 2f64.powi(e as i32))
            .filter(|&v| tx(v) >= x0 - 1e-9 && tx(v) <= x1 + 1e-9)
            .collect()
    } else {
        nice_ticks(x0, x1, 8)
    };
    for v in xt {
        let x = px(v);
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{mt}" y2="{}" stroke="#eee"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            mt + ph,
            mt + ph + 16.0,
            fmt_num(v)
        );
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#, ml + pw / 2.0, h - 10.0, esc(xlabel));
    let _ = writeln!(
        s,
        r#"<text transform="translate(16,{}) rotate(-90)" text-anchor="middle">{}</text>"#,
        mt + ph / 2.0,
        esc(ylabel)
    );
    for (i, se) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<String> = se
            .points
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|p| format!("{:.1},{:.1}", px(p.0), py(p.1)))
            .collect();
        let _ = writeln!(s, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, pts.join(" "));
        for p in &pts {
            let (a, b) = p.split_once(',').unwrap_or(("0", "0"));
            let _ = writeln!(s, r#"<circle cx="{a}" cy="{b}" r="2.5" fill="{c}"/>"#);
        }
        let ly = mt + 14.0 + i as f64 * 18.0;
        let _ = writeln!(
            s,
            r#"<line x1="{}" x2="{}" y1="{ly}" y2="{ly}" stroke="{c}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            ml + pw + 10.0,
            ml + pw + 30.0,
            ml + pw + 35.0,
            ly + 4.0,
            esc(&se.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Time-flow chart: one row per (host, layer) in order of first appearance,
/// one rectangle per packet, alternating shades, time in µs on the x axis.
pub fn time_flow(title: &str, recs: &[TraceRecord]) -> String {
    let mut rows: Vec<String> = Vec::new();
    for r in recs {
        let key = row_key(r);
        if !rows.contains(&key) {
            rows.push(key);
        }
    }
    let (w, ml, mr, mt, rowh) = (900.0, 190.0, 20.0, 40.0, 26.0);
    let h = mt + rows.len() as f64 * rowh + 50.0;
    let pw = w - ml - mr;
    let tmax = recs.iter().map(|r| r.t_end_ns).fold(0.0, f64::max).max(1.0) / 1000.0;
    let px = |t_ns: f64| ml + t_ns / 1000.0 / tmax * pw;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    for (i, row) in rows.iter().enumerate() {
        let y = mt + i as f64 * rowh;
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" text-anchor="end">{}</text><line x1="{ml}" x2="{}" y1="{}" y2="{}" stroke="#eee"/>"##,
            ml - 6.0,
            y + rowh * 0.65,
            esc(row),
            ml + pw,
            y + rowh,
            y + rowh
        );
    }
    for r in recs {
        let i = rows.iter().position(|k| *k == row_key(r)).unwrap_or(0);
        let y = mt + i as f64 * rowh + 3.0;
        let fill = if r.packet % 2 == 0 { "#4a6fa5" } else { "#a9c1e0" };
        let x = px(r.t_start_ns);
        let wd = (px(r.t_end_ns) - x).max(0.5);
        let _ = writeln!(
            s,
            r##"<rect x="{x:.2}" y="{y:.1}" width="{wd:.2}" height="{}" fill="{fill}" stroke="#223" stroke-width="0.3"><title>packet {} {:.1}-{:.1} us</title></rect>"##,
            rowh - 6.0,
            r.packet,
            r.t_start_ns / 1000.0,
            r.t_end_ns / 1000.0
        );
    }
    let yb = mt + rows.len() as f64 * rowh;
    for t in nice_ticks(0.0, tmax, 8) {
        let x = ml + t / tmax * pw;
        let _ = writeln!(
            s,
            r##"<line x1="{x:.1}" x2="{x:.1}" y1="{mt}" y2="{yb}" stroke="#ccc" stroke-dasharray="2,3"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
            yb + 16.0,
            fmt_num(t)
        );
    }
    let _ = writeln!(s, r#"<text x="{}" y="{}" text-anchor="middle">time (µs)</text></svg>"#, ml + pw / 2.0, yb + 36.0);
    s
}

fn row_key(r: &TraceRecord) -> String {
    match &r.host {
        Some(h) => format!("{h}: {}", r.layer),
        None => r.layer.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_are_svg() {
        let s =
            line_plot("t", "x", "y", &[Series { name: "a<b".into(), points: vec![(1.0, 2.0), (1024.0, 3.0)] }], true);
        assert!(s.starts_with("<svg") && s.contains("polyline") && s.contains("a&lt;b"));
        let r = TraceRecord {
            layer: "NIC".into(),
            packet: 1,
            bytes: 10,
            t_start_ns: 0.0,
            t_end_ns: 5000.0,
            host: Some("sender".into()),
        };
        let t = time_flow("flow", &[r]);
        assert!(t.contains("<rect x=") && t.contains("sender: NIC"));
    }
}
