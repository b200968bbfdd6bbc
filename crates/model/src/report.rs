//! Headline figures: simulated values next to the published ones.
//!
//! The published numbers live only here, as the yardstick; the presets and
//! the simulator never read them.

use crate::cli::apply_overrides;
use crate::preset::{self, Preset};
use crate::sim::{self, SimResult, Workload};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// How a row is judged.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// |simulated − published| ≤ 10 % of published.
    Within10,
    /// A qualitative statement of the paper; `simulated` is 1 when it holds.
    Holds,
}

/// One line of the published-vs-simulated table.
#[derive(Debug, Clone)]
pub struct Row {
    pub id: &'static str,
    pub source: &'static str,
    pub what: String,
    pub published: f64,
    pub simulated: f64,
    pub unit: &'static str,
    pub check: Check,
}

impl Row {
    /// Relative error (Within10 rows).
    pub fn error(&self) -> f64 {
        (self.simulated - self.published) / self.published
    }
    /// Whether the row meets its check.
    pub fn pass(&self) -> bool {
        match self.check {
            Check::Within10 => self.simulated.is_finite() && self.error().abs() <= 0.10,
            Check::Holds => self.simulated == 1.0,
        }
    }
}

/// Loads a shipped preset by id.
pub fn shipped(id: &str) -> Result<Preset, String> {
    preset::load(&preset::resolve(id)?)
}

/// One-way latency of one message (µs).
pub fn latency_us(p: &Preset, stack: &str, b: u64) -> Result<f64, String> {
    Ok(sim::run(p, stack, &Workload { msg_bytes: b, messages: 1, bidirectional: false, timeline: false })?.latency_ns()
        / 1000.0)
}

/// Round trips a ping-pong latency averages over.
pub const PINGPONG_ROUNDS: usize = 8;

/// Ping-pong latency: half the mean round-trip time (µs), as 000 §5.2 and
/// 003 §6.2 measure it.
pub fn pingpong_us(p: &Preset, stack: &str, b: u64) -> Result<f64, String> {
    Ok(sim::pingpong(p, stack, b, PINGPONG_ROUNDS)?.1 / 1000.0)
}

/// Steady bandwidth of `n` back-to-back messages, in the preset's Mbit unit.
pub fn bandwidth(p: &Preset, stack: &str, b: u64, n: usize, bidir: bool) -> Result<f64, String> {
    let r = sim::run(p, stack, &Workload { msg_bytes: b, messages: n, bidirectional: bidir, timeline: false })?;
    Ok(r.total_bits_per_ns(b) * 1e9 / p.mbit_bits.v)
}

/// Idle fraction of a link: (over [0, last use], over [first use, last use]).
pub fn link_idle(r: &SimResult, link: &str) -> Option<(f64, f64)> {
    let u = r.resource(link)?;
    if u.last_ns <= 0.0 {
        return None;
    }
    Some((1.0 - u.busy_ns / u.last_ns, 1.0 - u.busy_ns / (u.last_ns - u.first_ns)))
}

/// A row judged within ±10 %.
pub fn row(
    id: &'static str,
    source: &'static str,
    what: &str,
    published: f64,
    simulated: f64,
    unit: &'static str,
) -> Row {
    Row { id, source, what: what.to_string(), published, simulated, unit, check: Check::Within10 }
}

/// A row for a qualitative statement.
pub fn holds(id: &'static str, source: &'static str, what: String, ok: bool) -> Row {
    Row { id, source, what, published: 1.0, simulated: if ok { 1.0 } else { 0.0 }, unit: "", check: Check::Holds }
}

/// Paper 000 headline figures.
pub fn rows_000() -> Result<Vec<Row>, String> {
    let p = shipped("000")?;
    let mut out = Vec::new();
    let big = 32768u64;
    let n = 40;
    let bw_e = bandwidth(&p, "eudp", big, n, false)?;
    out.push(row("000-eudp-peak", "000 §5.2, Fig. 11", "E-UDP peak bandwidth, 32 kB", 951.0, bw_e, "Mbit/s (2^20)"));
    let pci = p.resources["tx.bus"].rate().unwrap_or(f64::NAN) * 8e9 / p.mbit_bits.v;
    out.push(row("000-eudp-pci-frac", "000 §5.2, abstract", "E-UDP peak / PCI limit", 94.0, bw_e / pci * 100.0, "%"));
    let r = sim::run(&p, "udp", &Workload { msg_bytes: big, messages: 10, bidirectional: false, timeline: false })?;
    let (idle0, _) = link_idle(&r, "tx.link").ok_or("udp run did not use tx.link")?;
    out.push(row(
        "000-udp-link-idle",
        "000 §3.2.4, Fig. 4",
        "traditional UDP: link idle in 10 x 32 kB burst",
        50.0,
        idle0 * 100.0,
        "%",
    ));
    let le = latency_us(&p, "eudp", big)?;
    let theo = big as f64 / p.resources["tx.bus"].rate().unwrap_or(f64::NAN) / 1000.0;
    out.push(row(
        "000-eudp-lat-min",
        "000 §5.2, Fig. 10a",
        "E-UDP 32 kB latency / theoretical minimum (32 kB at the PCI rate, the bottleneck named in §5.2)",
        1.0,
        le / theo,
        "ratio",
    ));
    let lg = latency_us(&p, "gm", big)?;
    out.push(holds(
        "000-eudp-below-gm",
        "000 §5.2, Fig. 10a",
        format!("E-UDP 32 kB latency below GM ({le:.1} vs {lg:.1} us)"),
        le < lg,
    ));
    let small: Vec<(String, f64)> = ["udp", "coarse", "eudp", "gm", "bvia"]
        .iter()
        .map(|s| latency_us(&p, s, 1).map(|l| (s.to_string(), l)))
        .collect::<Result<_, _>>()?;
    let best = small.iter().cloned().fold(("".to_string(), f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    out.push(holds(
        "000-gm-small-best",
        "000 §5.2, Fig. 10b",
        format!("GM lowest 1 B latency (best: {} {:.1} us)", best.0, best.1),
        best.0 == "gm",
    ));
    let bw_g = bandwidth(&p, "gm", big, n, false)?;
    let bw_v = bandwidth(&p, "bvia", big, n, false)?;
    let bw_u = bandwidth(&p, "udp", big, n, false)?;
    out.push(holds(
        "000-gm-below-eudp",
        "000 §5.2, Fig. 11",
        format!("GM bandwidth below E-UDP ({bw_g:.0} vs {bw_e:.0})"),
        bw_g < bw_e,
    ));
    out.push(holds(
        "000-bvia-lowest",
        "000 §5.2, Fig. 11",
        format!("Berkeley-VIA-like lowest 32 kB bandwidth ({bw_v:.0}; UDP {bw_u:.0}, GM {bw_g:.0})"),
        bw_v < bw_g && bw_v < bw_e && bw_v < bw_u,
    ));
    // projections (000 §5.3, Figs. 13-14)
    let mut p2 = p.clone();
    apply_overrides(&mut p2, Some("pci64/66"), Some(2000.0))?;
    let link2 = 2000e6 / p2.mbit_bits.v;
    let bw2 = bandwidth(&p2, "eudp", big, n, false)?;
    out.push(row(
        "000-2g-bw",
        "000 §5.3, Fig. 13b",
        "2 Gbps + PCI 64/66: E-UDP bandwidth / link (near physical)",
        100.0,
        bw2 / link2 * 100.0,
        "%",
    ));
    let l16 = latency_us(&p2, "eudp", 16384)?;
    let l32 = latency_us(&p2, "eudp", 32768)?;
    let slope = (l32 - l16) * 1000.0 / 16384.0;
    let link_ns = 8.0 / 2.0; // ns per byte at 2 Gbit/s
    out.push(row(
        "000-2g-slope",
        "000 §5.3, Fig. 13a",
        "2 Gbps + PCI 64/66: E-UDP latency slope / link per-byte time",
        1.0,
        slope / link_ns,
        "ratio",
    ));
    let c16 = latency_us(&p2, "coarse", 16384)?;
    let c32 = latency_us(&p2, "coarse", 32768)?;
    out.push(holds("000-2g-fine-hides", "000 §5.3, Fig. 13a", format!("2 Gbps: fine-grained 32 kB latency well below coarse ({l32:.1} vs {c32:.1} us, 16 kB {l16:.1} vs {c16:.1})"), l32 < 0.8 * c32));
    // store-and-forward switch (000 §6): pipelining across the switch is lost
    let le_sf = latency_us(&p, "eudp_sf", big)?;
    let lc_sf = latency_us(&p, "coarse_sf", big)?;
    let lc = latency_us(&p, "coarse", big)?;
    out.push(holds(
        "000-sf-switch",
        "000 §6",
        format!(
            "store-and-forward switch shrinks the fine-grained gain at 32 kB ({:.0} us with, {:.0} us without)",
            lc_sf - le_sf,
            lc - le
        ),
        lc_sf - le_sf < lc - le,
    ));
    let mut p10 = p.clone();
    apply_overrides(&mut p10, Some("pci64/133"), Some(10000.0))?;
    let bw10 = bandwidth(&p10, "eudp", big, n, false)?;
    let link10 = 10000e6 / p10.mbit_bits.v;
    out.push(holds(
        "000-10g-short",
        "000 §5.3, Fig. 14b",
        format!("10 Gbps + PCI 64/133: E-UDP cannot fill the link ({:.0}% of link)", bw10 / link10 * 100.0),
        bw10 < 0.9 * link10,
    ));
    Ok(out)
}

/// Every headline row of every preset that is available.
pub fn validate() -> Result<Vec<Row>, String> {
    let mut rows = rows_000()?;
    rows.extend(crate::report_more::rows_other()?);
    Ok(rows)
}

/// Plain-text table.
pub fn text(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<20} {:<22} {:>10} {:>10} {:>8} {:<5} {}\n",
        "id", "source", "published", "simulated", "error", "ok", "what"
    );
    for r in rows {
        let (p, m, e) = fmt_row(r);
        s.push_str(&format!(
            "{:<20} {:<22} {:>10} {:>10} {:>8} {:<5} {} [{}]\n",
            r.id,
            r.source,
            p,
            m,
            e,
            if r.pass() { "PASS" } else { "MISS" },
            r.what,
            r.unit
        ));
    }
    let pass = rows.iter().filter(|r| r.pass()).count();
    s.push_str(&format!("{pass}/{} within tolerance\n", rows.len()));
    s
}

fn fmt_row(r: &Row) -> (String, String, String) {
    match r.check {
        Check::Within10 => (
            format!("{:.3}", r.published).trim_end_matches('0').trim_end_matches('.').to_string(),
            format!("{:.2}", r.simulated),
            format!("{:+.1}%", r.error() * 100.0),
        ),
        Check::Holds => ("holds".into(), if r.pass() { "holds".into() } else { "fails".into() }, "".into()),
    }
}

/// Markdown table.
pub fn markdown(rows: &[Row]) -> String {
    let mut s = String::from(
        "| id | source | figure | published | simulated | error | ±10% |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let (p, m, e) = fmt_row(r);
        let unit = if r.unit.is_empty() { String::new() } else { format!(" ({})", r.unit) };
        s.push_str(&format!(
            "| {} | {} | {}{} | {} | {} | {} | {} |\n",
            r.id,
            r.source,
            r.what,
            unit,
            p,
            m,
            e,
            if r.pass() { "pass" } else { "**miss**" }
        ));
    }
    s
}

/// Simulator speed: runs E-UDP of preset 000 on `packets` 4 kB messages.
pub fn bench(packets: usize) -> Result<(u64, f64), String> {
    let p = shipped("000")?;
    let t = std::time::Instant::now();
    let r = sim::run(
        &p,
        "eudp",
        &Workload { msg_bytes: 4096, messages: packets.max(1), bidirectional: false, timeline: false },
    )?;
    Ok((r.events, t.elapsed().as_secs_f64().max(1e-9)))
}

/// One point of a sweep.
#[derive(Debug, Clone)]
pub struct SweepRow {
    pub stack: String,
    pub bus: String,
    pub link: String,
    pub bytes: u64,
    pub latency_us: f64,
    pub bandwidth: f64,
}

/// Runs the grid on `jobs` threads, drawing a progress bar on stderr.
pub fn sweep(
    base: &Preset,
    grid: &[(String, Option<String>, Option<f64>, u64)],
    n: usize,
    jobs: usize,
) -> Result<Vec<SweepRow>, String> {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<Result<SweepRow, String>>>> = Mutex::new(vec![None; grid.len()]);
    std::thread::scope(|sc| {
        for _ in 0..jobs.min(grid.len().max(1)) {
            sc.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= grid.len() {
                    break;
                }
                let (stack, bus, link, b) = &grid[i];
                let res = (|| {
                    let mut p = base.clone();
                    apply_overrides(&mut p, bus.as_deref(), *link)?;
                    Ok(SweepRow {
                        stack: stack.clone(),
                        bus: bus.clone().unwrap_or_else(|| "preset".into()),
                        link: link.map(|l| format!("{l}")).unwrap_or_else(|| "preset".into()),
                        bytes: *b,
                        latency_us: latency_us(&p, stack, *b)?,
                        bandwidth: bandwidth(&p, stack, *b, n, false)?,
                    })
                })();
                out.lock().map(|mut o| o[i] = Some(res)).ok();
                let d = done.fetch_add(1, Ordering::SeqCst) + 1;
                let w = 30;
                let fill = d * w / grid.len();
                eprint!("\r[{}{}] {d}/{}", "#".repeat(fill), " ".repeat(w - fill), grid.len());
            });
        }
    });
    eprintln!();
    let v = out.into_inner().map_err(|_| "sweep worker panicked".to_string())?;
    v.into_iter().map(|x| x.unwrap_or_else(|| Err("missing sweep point".into()))).collect()
}
