//! `eudp bench`: the stacks side by side, in one run, on one testbed.
//!
//! For each datagram size every mode ([`Mode`]) runs the same transfer from
//! host `a` to host `b`: an unpaced sender for a fixed time and a receiver
//! that verifies every datagram. Ratios are computed only between results of
//! the same invocation. The JSON schema is documented in `docs/bench.md`.

use crate::testbed::{Testbed, ADDR_B};
use crate::worker::{Mode, Report};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

/// One mode at one size.
#[derive(Debug, Serialize, Clone)]
pub struct Row {
    pub mode: Mode,
    pub size: usize,
    /// Received payload throughput, Gbit/s.
    pub gbps: f64,
    /// Received datagrams per second, millions.
    pub mpps: f64,
    /// Fraction of sent datagrams that did not arrive.
    pub loss: f64,
    /// Sender CPU seconds per million datagrams sent.
    pub tx_cpu_s_per_m: f64,
    /// Receiver CPU seconds per million datagrams received.
    pub rx_cpu_s_per_m: f64,
    /// Offered load of a paced run in datagrams/s; 0 for an unpaced run.
    pub offered_pps: f64,
    /// Datagrams whose bytes did not match, and that arrived out of order.
    pub corrupt: u64,
    pub reordered: u64,
    pub sender: Report,
    pub receiver: Report,
}

/// Ratios and targets for one size.
#[derive(Debug, Serialize, Clone)]
pub struct Summary {
    pub size: usize,
    pub eudp_over_kernel_mpps: Option<f64>,
    pub eudp_over_ceiling_gbps: Option<f64>,
    pub targets: Vec<Target>,
}

/// A target from the issue, with what was measured.
#[derive(Debug, Serialize, Clone)]
pub struct Target {
    pub name: String,
    pub wanted: String,
    pub measured: f64,
    pub met: bool,
}

/// The whole result file.
#[derive(Debug, Serialize)]
pub struct BenchResult {
    pub schema: &'static str,
    pub started_unix: u64,
    pub host: HostInfo,
    pub secs_per_run: f64,
    pub rows: Vec<Row>,
    pub summaries: Vec<Summary>,
}

#[derive(Debug, Serialize)]
pub struct HostInfo {
    pub kernel: String,
    pub cpus: usize,
    pub eudp_env: Vec<(String, String)>,
}

pub struct BenchArgs {
    pub sizes: Vec<usize>,
    pub modes: Vec<Mode>,
    pub secs: f64,
    pub out_dir: Option<std::path::PathBuf>,
}

static WORKER_EXE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Sets the `eudp` binary that runs workers (tests pass the built binary;
/// by default it is the running executable).
pub fn set_worker_exe(path: &str) {
    let _ = WORKER_EXE.set(path.to_string());
}

fn exe() -> String {
    if let Some(p) = WORKER_EXE.get() {
        return p.clone();
    }
    std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "eudp".into())
}

fn spawn_worker(tb: &Testbed, host: char, args: &[String]) -> Result<Child, String> {
    let mut c = tb.command(host, &exe());
    c.arg("worker").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.spawn().map_err(|e| format!("cannot start worker: {e}"))
}

fn finish(mut child: Child, what: &str, timeout: Duration) -> Result<Report, String> {
    let t0 = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if t0.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what} did not finish within {timeout:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let line =
        out.lines().rev().find(|l| l.starts_with('{')).ok_or_else(|| format!("{what} failed: {}", err.trim()))?;
    serde_json::from_str(line).map_err(|e| format!("{what}: bad report: {e}"))
}

/// Runs one transfer of `mode` at `size`; returns (sender, receiver).
pub fn transfer(
    tb: &Testbed,
    mode: Mode,
    size: usize,
    secs: f64,
    count: u64,
    pace_every: u64,
    v6: bool,
) -> Result<(Report, Report), String> {
    transfer_at(tb, mode, size, secs, count, pace_every, 0.0, v6)
}

/// As [`transfer`] with the sender paced to `rate_pps` datagrams/s (0: unpaced).
#[allow(clippy::too_many_arguments)]
pub fn transfer_at(
    tb: &Testbed,
    mode: Mode,
    size: usize,
    secs: f64,
    count: u64,
    pace_every: u64,
    rate_pps: f64,
    v6: bool,
) -> Result<(Report, Report), String> {
    let port = 9000 + (size % 1000) as u16;
    let (bind, dst) = if v6 {
        (format!("[::]:{port}"), format!("[{}]:{port}", crate::testbed::ADDR6_B))
    } else {
        (format!("0.0.0.0:{port}"), format!("{ADDR_B}:{port}"))
    };
    let m = mode.name().to_string();
    let max = secs + 10.0;
    let mut rx = spawn_worker(
        tb,
        'b',
        &[
            "recv".into(),
            "--mode".into(),
            m.clone(),
            "--bind".into(),
            bind,
            "--size".into(),
            size.to_string(),
            "--count".into(),
            count.to_string(),
            "--max-secs".into(),
            max.to_string(),
        ],
    )?;
    // Wait for the receiver to be bound before sending.
    let mut reader = await_ready(&mut rx, "receiver")?;
    let tx = spawn_worker(
        tb,
        'a',
        &[
            "send".into(),
            "--mode".into(),
            m,
            "--dst".into(),
            dst,
            "--size".into(),
            size.to_string(),
            "--secs".into(),
            secs.to_string(),
            "--count".into(),
            count.to_string(),
            "--pace-every".into(),
            pace_every.to_string(),
            "--rate-pps".into(),
            rate_pps.to_string(),
        ],
    )?;
    let s = finish(tx, "sender", Duration::from_secs_f64(secs + 30.0));
    // Reattach the remaining stdout for the final report.
    let mut rest = String::new();
    let r = (|| {
        let t0 = Instant::now();
        while rx.try_wait().map_err(|e| e.to_string())?.is_none() {
            if t0.elapsed() > Duration::from_secs_f64(max + 5.0) {
                let _ = rx.kill();
                let _ = rx.wait();
                return Err("receiver did not finish".to_string());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        reader.read_to_string(&mut rest).map_err(|e| e.to_string())?;
        let line = rest.lines().rev().find(|l| l.starts_with('{')).ok_or_else(|| {
            let mut err = String::new();
            if let Some(mut e) = rx.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            format!("receiver failed: {}", err.trim())
        })?;
        serde_json::from_str::<Report>(line).map_err(|e| format!("receiver: bad report: {e}"))
    })();
    Ok((s?, r?))
}

/// Waits for a receiver worker's `ready` line (it is bound); on anything
/// else kills it and returns its stderr. The reader keeps the rest of stdout.
pub fn await_ready(rx: &mut Child, what: &str) -> Result<BufReader<std::process::ChildStdout>, String> {
    let stdout = rx.stdout.take().ok_or_else(|| format!("{what} has no stdout"))?;
    let mut reader = BufReader::new(stdout);
    let mut line = String::new();
    reader.read_line(&mut line).map_err(|e| format!("{what}: {e}"))?;
    if line.trim() != "ready" {
        let _ = rx.kill();
        let mut err = String::new();
        if let Some(mut e) = rx.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        let _ = rx.wait();
        return Err(format!("{what} did not start: {} {}", line.trim(), err.trim()));
    }
    Ok(reader)
}

/// What a sender/receiver report pair says about the transfer.
#[derive(Debug, Clone, Copy)]
pub struct Rates {
    /// Received payload Gbit/s and million datagrams/s, over the receiver's window.
    pub gbps: f64,
    pub mpps: f64,
    /// 1 − received / sent.
    pub loss: f64,
    /// CPU seconds per million datagrams (= µs per datagram), sender and receiver.
    pub tx_cpu_per_m: f64,
    pub rx_cpu_per_m: f64,
}

impl Rates {
    pub fn of(s: &Report, r: &Report) -> Rates {
        let secs = if r.secs > 0.0 { r.secs } else { s.secs.max(1e-9) };
        let per_m = |cpu: f64, n: u64| if n == 0 { 0.0 } else { cpu / n as f64 * 1e6 };
        Rates {
            gbps: r.bytes as f64 * 8.0 / secs / 1e9,
            mpps: r.datagrams as f64 / secs / 1e6,
            loss: if s.datagrams == 0 { 0.0 } else { 1.0 - (r.datagrams as f64 / s.datagrams as f64).min(1.0) },
            tx_cpu_per_m: per_m(s.cpu_secs, s.datagrams),
            rx_cpu_per_m: per_m(r.cpu_secs, r.datagrams),
        }
    }
}

fn row(mode: Mode, size: usize, s: Report, r: Report) -> Row {
    let m = Rates::of(&s, &r);
    Row {
        mode,
        size,
        gbps: m.gbps,
        mpps: m.mpps,
        loss: m.loss,
        tx_cpu_s_per_m: m.tx_cpu_per_m,
        rx_cpu_s_per_m: m.rx_cpu_per_m,
        offered_pps: 0.0,
        corrupt: r.corrupt,
        reordered: r.reordered,
        sender: s,
        receiver: r,
    }
}

fn summarize(size: usize, rows: &[Row]) -> Summary {
    let get = |m: Mode| rows.iter().find(|r| r.mode == m && r.size == size && r.offered_pps == 0.0);
    let paced = |m: Mode| rows.iter().find(|r| r.mode == m && r.size == size && r.offered_pps > 0.0);
    let (k, g, e) = (get(Mode::Kernel), get(Mode::Gso), get(Mode::Eudp));
    let ratio = |a: f64, b: f64| if b > 0.0 { Some(a / b) } else { None };
    let over_k = match (e, k) {
        (Some(e), Some(k)) => ratio(e.mpps, k.mpps),
        _ => None,
    };
    let over_c = match (e, g) {
        (Some(e), Some(g)) => ratio(e.gbps, g.gbps),
        _ => None,
    };
    let mut targets = Vec::new();
    if size >= 1024 {
        if let Some(v) = over_c {
            targets.push(Target {
                name: format!("eudp/ceiling Gbit/s at {size} B"),
                wanted: ">= 0.80".into(),
                measured: v,
                met: v >= 0.8,
            });
        }
    } else if let Some(v) = over_k {
        targets.push(Target {
            name: format!("eudp/kernel Mpps at {size} B"),
            wanted: ">= 10".into(),
            measured: v,
            met: v >= 10.0,
        });
    }
    // The comparison: the unpaced runs' losses.
    if let (Some(e), Some(g)) = (e, g) {
        targets.push(Target {
            name: format!("eudp loss vs ceiling loss at {size} B, unpaced"),
            wanted: format!("<= {:.4}", g.loss),
            measured: e.loss,
            met: e.loss <= g.loss,
        });
    }
    // Stricter: unpaced senders of different speeds overrun the receiver by
    // different amounts, so also compare at equal offered load.
    if let (Some(e), Some(g)) = (paced(Mode::Eudp), paced(Mode::Gso)) {
        targets.push(Target {
            name: format!("eudp loss vs ceiling loss at {size} B, {:.2} Mpps offered", e.offered_pps / 1e6),
            wanted: format!("<= {:.4}", g.loss),
            measured: e.loss,
            met: e.loss <= g.loss,
        });
    }
    xdp_targets(size, get(Mode::Xdp), e, &mut targets);
    Summary { size, eudp_over_kernel_mpps: over_k, eudp_over_ceiling_gbps: over_c, targets }
}

/// The xdp transport's targets (docs/xdp.md): 64 B datagrams at 1 Mpps or
/// more received, and bulk at the kernel transport's library-path rate.
fn xdp_targets(size: usize, x: Option<&Row>, e: Option<&Row>, targets: &mut Vec<Target>) {
    let Some(x) = x else { return };
    if size <= 64 {
        targets.push(Target {
            name: format!("xdp Mpps received at {size} B"),
            wanted: ">= 1".into(),
            measured: x.mpps,
            met: x.mpps >= 1.0,
        });
    } else if let Some(e) = e.filter(|e| e.gbps > 0.0) {
        targets.push(Target {
            name: format!("xdp/eudp (kernel transport) Gbit/s at {size} B"),
            wanted: ">= 1".into(),
            measured: x.gbps / e.gbps,
            met: x.gbps >= e.gbps,
        });
    }
}

/// Prints the table of rows and the targets.
pub fn print_table(res: &BenchResult) {
    println!(
        "{:<7} {:>6} {:>9} {:>8} {:>8} {:>12} {:>12} {:>8} {:>11} {:>11}",
        "mode", "size", "Gbit/s", "Mpps", "loss%", "tx cpu-s/M", "rx cpu-s/M", "errors", "tx RSS KiB", "rx RSS KiB"
    );
    for r in &res.rows {
        let name = if r.offered_pps > 0.0 {
            format!("{}@{:.1}M", r.mode.name(), r.offered_pps / 1e6)
        } else {
            r.mode.name().to_string()
        };
        println!(
            "{:<7} {:>6} {:>9.2} {:>8.3} {:>8.2} {:>12.3} {:>12.3} {:>8} {:>11} {:>11}",
            name,
            r.size,
            r.gbps,
            r.mpps,
            r.loss * 100.0,
            r.tx_cpu_s_per_m,
            r.rx_cpu_s_per_m,
            r.corrupt + r.reordered,
            r.sender.max_rss_kib,
            r.receiver.max_rss_kib
        );
    }
    for s in &res.summaries {
        for t in &s.targets {
            println!(
                "target {:<40} wanted {:>10}  measured {:>8.3}  {}",
                t.name,
                t.wanted,
                t.measured,
                if t.met { "MET" } else { "MISSED" }
            );
        }
    }
}

/// Runs the whole bench on a fresh testbed.
pub fn run(args: &BenchArgs) -> Result<BenchResult, String> {
    let tb = Testbed::up(&crate::testbed::unique_name("bn"))?;
    let started_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut rows = Vec::new();
    for &size in &args.sizes {
        for &mode in &args.modes {
            eprint!("bench: {} {} B ... ", mode.name(), size);
            let (s, r) = transfer(&tb, mode, size, args.secs, 0, 0, false)?;
            let row = row(mode, size, s, r);
            eprintln!("{:.2} Gbit/s, {:.3} Mpps, loss {:.2}%", row.gbps, row.mpps, row.loss * 100.0);
            rows.push(row);
        }
        // Equal-load runs: the ceiling and eudp both offered 80% of the
        // ceiling's unpaced receive rate, to compare their losses.
        let ceiling = rows.iter().find(|r| r.mode == Mode::Gso && r.size == size).map(|r| r.mpps * 1e6);
        if let (Some(rate), true) = (ceiling, args.modes.contains(&Mode::Eudp)) {
            let rate = 0.8 * rate;
            for mode in [Mode::Gso, Mode::Eudp] {
                eprint!("bench: {} {} B at {:.2} Mpps offered ... ", mode.name(), size, rate / 1e6);
                let (s, r) = transfer_at(&tb, mode, size, args.secs, 0, 0, rate, false)?;
                let mut row = row(mode, size, s, r);
                row.offered_pps = rate;
                eprintln!("{:.3} Mpps, loss {:.2}%", row.mpps, row.loss * 100.0);
                rows.push(row);
            }
        }
    }
    drop(tb);
    let summaries = args.sizes.iter().map(|&s| summarize(s, &rows)).collect();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let eudp_env = std::env::vars().filter(|(k, _)| k.starts_with("EUDP_")).collect();
    let res = BenchResult {
        schema: "eudp-bench/1",
        started_unix,
        host: HostInfo { kernel, cpus, eudp_env },
        secs_per_run: args.secs,
        rows,
        summaries,
    };
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(format!("bench-{started_unix}.json"));
        let json = serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?;
        std::fs::write(&path, json).map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("bench: wrote {}", path.display());
        let value = serde_json::to_value(&res).map_err(|e| e.to_string())?;
        if let Some(svg) = crate::bench_chart::write_beside(&path, &value)? {
            eprintln!("bench: wrote {}", svg.display());
        }
    }
    Ok(res)
}
