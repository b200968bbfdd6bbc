//! Grouped bar charts over categories (sizes, workloads): the benches'
//! throughput and CPU per datagram, with the ceiling's series hatched.

use super::{esc, COLORS};
use std::fmt::Write;

/// One bar's values: its group (a size, a workload), its series (a mode) and
/// the two quantities the chart's panels show.
#[derive(Debug, Clone, PartialEq)]
pub struct BarPoint {
    pub group: String,
    pub series: String,
    pub gbps: Option<f64>,
    pub cpu_us: Option<f64>,
}

/// What a bar chart shows: the bars and the name of the ceiling series, if
/// any (drawn hatched and named so in the legend).
#[derive(Debug, Clone)]
pub struct BarChart {
    pub title: String,
    pub points: Vec<BarPoint>,
    pub ceiling: Option<String>,
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// Names in first-seen order.
fn order<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for n in names {
        if !out.contains(n) {
            out.push(n.clone());
        }
    }
    out
}

/// A tick step near `hi / 5` of the form 1, 2 or 5 times a power of ten.
fn step(hi: f64) -> f64 {
    let raw = (hi / 5.0).max(1e-12);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw)
}

fn label(x: f64) -> String {
    if x >= 100.0 || x.fract() == 0.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.2}")
    }
}

/// Geometry shared by both panels.
const WIDTH: f64 = 760.0;
const PANEL_H: f64 = 250.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 40.0;

/// One panel of bars at vertical offset `y0`.
fn panel(
    s: &mut String,
    y0: f64,
    ylabel: &str,
    groups: &[String],
    series: &[String],
    value: &dyn Fn(&str, &str) -> Option<f64>,
    ceiling: Option<&str>,
) {
    let (pw, ph) = (WIDTH - LEFT - RIGHT, PANEL_H - TOP - BOTTOM);
    let top = y0 + TOP;
    let hi = groups.iter().flat_map(|g| series.iter().filter_map(move |m| value(g, m))).fold(0.0, f64::max);
    let _ = writeln!(s, r#"<text x="{LEFT}" y="{:.1}" font-size="13">{}</text>"#, top - 8.0, esc(ylabel));
    let _ =
        writeln!(s, r##"<rect x="{LEFT}" y="{top:.1}" width="{pw:.1}" height="{ph:.1}" fill="none" stroke="#333"/>"##);
    if hi <= 0.0 {
        let _ = writeln!(s, r#"<text x="{:.1}" y="{:.1}">no data</text>"#, LEFT + 10.0, top + 20.0);
        return;
    }
    let st = step(hi * 1.05);
    let ymax = (hi * 1.05 / st).ceil() * st;
    let py = |y: f64| top + ph - y / ymax * ph;
    let mut t = 0.0;
    while t <= ymax + st * 1e-9 {
        let y = py(t);
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" x2="{:.1}" y1="{y:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 5.0,
            y + 4.0,
            label(t)
        );
        t += st;
    }
    let gw = pw / groups.len() as f64;
    let bw = gw * 0.8 / series.len() as f64;
    for (gi, g) in groups.iter().enumerate() {
        let gx = LEFT + gi as f64 * gw + gw * 0.1;
        for (si, m) in series.iter().enumerate() {
            let Some(v) = value(g, m) else { continue };
            let (x, y) = (gx + si as f64 * bw, py(v));
            let fill = if ceiling == Some(m.as_str()) {
                "url(#ceiling)".to_string()
            } else {
                COLORS[si % COLORS.len()].to_string()
            };
            let _ = writeln!(
                s,
                r##"<rect class="bar" data-group="{}" data-series="{}" x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="#333" stroke-width="0.5"><title>{} {}: {}</title></rect>"##,
                esc(g),
                esc(m),
                (bw - 2.0).max(1.0),
                top + ph - y,
                esc(m),
                esc(g),
                label(v)
            );
            // The value over its bar: small bars beside a tall ceiling stay readable.
            let _ = writeln!(
                s,
                r#"<text class="value" x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                x + (bw - 2.0).max(1.0) / 2.0,
                y - 3.0,
                label(v)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            LEFT + gi as f64 * gw + gw / 2.0,
            top + ph + 16.0,
            esc(g)
        );
    }
}

/// The chart as an SVG document: received throughput above, CPU per
/// datagram below, one group of bars per category, the median of each
/// group's and series' values.
pub fn bar_chart(c: &BarChart) -> String {
    let groups = order(c.points.iter().map(|p| &p.group));
    let series = order(c.points.iter().map(|p| &p.series));
    let pick = |f: fn(&BarPoint) -> Option<f64>| {
        move |g: &str, m: &str| {
            median(c.points.iter().filter(|p| p.group == g && p.series == m).filter_map(f).collect())
        }
    };
    let height = 40.0 + 2.0 * PANEL_H;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        s,
        r##"<defs><pattern id="ceiling" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#bbb"/><line x1="0" y1="0" x2="0" y2="6" stroke="#555" stroke-width="3"/></pattern></defs>"##
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{:.1}" y="22" font-size="15" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        esc(&c.title)
    );
    let ceiling = c.ceiling.as_deref();
    panel(&mut s, 30.0, "received throughput, Gbit/s (median)", &groups, &series, &pick(|p| p.gbps), ceiling);
    panel(
        &mut s,
        30.0 + PANEL_H,
        "CPU per datagram, µs (sender + receiver, median)",
        &groups,
        &series,
        &pick(|p| p.cpu_us),
        ceiling,
    );
    let lx = WIDTH - RIGHT + 15.0;
    for (i, m) in series.iter().enumerate() {
        let y = 30.0 + TOP + i as f64 * 20.0;
        let is_ceiling = ceiling == Some(m.as_str());
        let fill = if is_ceiling { "url(#ceiling)" } else { COLORS[i % COLORS.len()] };
        let name = if is_ceiling { format!("{m} (ceiling)") } else { m.clone() };
        let _ = writeln!(
            s,
            r##"<rect class="key" x="{lx:.1}" y="{y:.1}" width="14" height="14" fill="{fill}" stroke="#333" stroke-width="0.5"/><text x="{:.1}" y="{:.1}">{}</text>"##,
            lx + 20.0,
            y + 11.0,
            esc(&name)
        );
    }
    s.push_str("</svg>\n");
    s
}
