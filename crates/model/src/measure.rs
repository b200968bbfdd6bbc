//! Simulated measurements as the papers take them: one-way and ping-pong
//! latency, steady bandwidth, link idle time, the simulator's own speed and
//! parameter sweeps.

use crate::preset::{self, apply_overrides, Preset};
use crate::sim::{self, SimResult, Workload};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
