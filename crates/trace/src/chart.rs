//! Time-flow charts in the style of paper 000 Fig. 2: layers on the y axis
//! (sender at the top, then the wire, then the receiver), one rectangle per
//! packet per layer in alternating shades, one time axis; compared stacks in
//! panels side by side on the same time scale.
//!
//! A single stack can also be drawn by the model's renderer
//! ([`eudp_model::svg::time_flow`], `eudp sim chart`) from the same records;
//! this renderer adds the side-by-side panels, the shared axis and per-host
//! colours.

use crate::resolve::{layers_of, Record};
use eudp_model::svg::esc;
use std::fmt::Write;

fn shades(host: &str) -> (&'static str, &'static str) {
    match host {
        "sender" => ("#2f5d9a", "#9dbbe3"),
        "wire" => ("#555555", "#bbbbbb"),
        _ => ("#2e7d32", "#a5d6a7"),
    }
}

fn tick_step(span: f64) -> f64 {
    let raw = span / 6.0;
    let mag = 10f64.powf(raw.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(raw)
}

/// Draws the stacks' records side by side. `stacks` gives the panel order;
/// every panel uses the same time scale (µs from the stack's first send).
pub fn side_by_side(title: &str, stacks: &[&str], recs: &[Record]) -> String {
    let tmax_ns = recs.iter().map(|r| r.t_end_ns).fold(0.0, f64::max).max(1.0);
    let tmax = tmax_ns / 1000.0;
    let (label_w, panel_w, gap, mt, rowh) = (110.0, 520.0, 30.0, 58.0, 22.0);
    let nrows = stacks.iter().map(|s| layers_of(s).len()).max().unwrap_or(1) as f64;
    let w = stacks.len().max(1) as f64 * (label_w + panel_w + gap) + 10.0;
    let h = mt + nrows * rowh + 70.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{}" y="20" font-size="14" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    let step = tick_step(tmax);
    for (pi, stack) in stacks.iter().enumerate() {
        let x0 = pi as f64 * (label_w + panel_w + gap) + label_w;
        let px = |t_ns: f64| x0 + t_ns / 1000.0 / tmax * panel_w;
        let layers = layers_of(stack);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="42" font-size="13" font-weight="bold" text-anchor="middle">{}</text>"#,
            x0 + panel_w / 2.0,
            esc(stack)
        );
        for (i, l) in layers.iter().enumerate() {
            let y = mt + i as f64 * rowh;
            let _ = writeln!(
                s,
                r##"<text x="{}" y="{:.1}" text-anchor="end">{}: {}</text><line x1="{x0}" x2="{}" y1="{:.1}" y2="{:.1}" stroke="#eee"/>"##,
                x0 - 5.0,
                y + rowh * 0.68,
                l.host,
                l.name,
                x0 + panel_w,
                y + rowh,
                y + rowh
            );
        }
        let yb = mt + layers.len() as f64 * rowh;
        let mut t = 0.0;
        while t <= tmax + step * 1e-9 {
            let x = x0 + t / tmax * panel_w;
            let _ = writeln!(
                s,
                r##"<line x1="{x:.1}" x2="{x:.1}" y1="{mt}" y2="{yb}" stroke="#ccc" stroke-dasharray="2,3"/><text x="{x:.1}" y="{}" text-anchor="middle">{}</text>"##,
                yb + 14.0,
                fmt(t)
            );
            t += step;
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">time (µs, CLOCK_MONOTONIC_RAW, from the first send)</text>"#,
            x0 + panel_w / 2.0,
            yb + 32.0
        );
        for r in recs.iter().filter(|r| r.stack == *stack) {
            let Some(i) = layers.iter().position(|l| l.name == r.layer) else { continue };
            let y = mt + i as f64 * rowh + 3.0;
            let (dark, light) = shades(&r.host);
            let fill = if r.packet % 2 == 0 { dark } else { light };
            let x = px(r.t_start_ns);
            let wd = (px(r.t_end_ns) - x).max(0.6);
            let _ = writeln!(
                s,
                r##"<rect x="{x:.2}" y="{y:.1}" width="{wd:.2}" height="{}" fill="{fill}" fill-opacity="0.85" stroke="#222" stroke-width="0.25"><title>{} {} packet {}: {:.2}-{:.2} µs</title></rect>"##,
                rowh - 6.0,
                esc(stack),
                r.layer,
                r.packet,
                r.t_start_ns / 1000.0,
                r.t_end_ns / 1000.0
            );
        }
    }
    let _ = writeln!(
        s,
        r##"<text x="10" y="{}" fill="#555">one rectangle per packet per layer; shades alternate by packet; blue: sender, grey: wire, green: receiver</text></svg>"##,
        h - 8.0
    );
    s
}

fn fmt(t: f64) -> String {
    if (t - t.round()).abs() < 1e-9 {
        format!("{t:.0}")
    } else {
        format!("{t:.1}")
    }
}
