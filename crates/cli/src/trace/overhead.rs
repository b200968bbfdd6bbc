//! `eudp trace --overhead`: untraced and traced transfers interleaved,
//! their rates and CPU per datagram side by side, and the floor.

use super::analysis::{analyse_lossy, analyse_sampled};
use super::args::TraceArgs;
use super::floor::{app_thread_msg_share, floor_report, AppThread, Floor};
use super::transfer::{transfer_variant, Variant};
use super::verdict::{report_verdicts, round_order};
use crate::testbed::Testbed;
use eudp_trace::resolve;

/// Receive rates of untraced and traced transfers, interleaved, with the
/// median of each and their ratio; also written to DIR/overhead.txt. Each
/// repetition runs one untraced transfer and one per traced setting
/// (`--overhead-modes`), in an order that changes from one repetition to
/// the next ([`round_order`]), so drift of the shared machine, and whatever
/// one transfer leaves to the next, falls on every setting alike.
/// On a shared machine the rates swing with other jobs, so the CPU time
/// each side spent per datagram (sender: per datagram sent, receiver: per
/// datagram received) is reported too, a steadier measure of the same
/// cost, as well as the median of the per-repetition (paired) ratios.
/// Every `full` transfer is analysed: a rate counts as fully traced only
/// if its trace has every layer of every packet that arrived.
pub fn overhead(tb: &Testbed, a: &TraceArgs) -> Result<(), String> {
    use std::fmt::Write as _;
    let mut vars = vec![Variant::named("off")?];
    for m in &a.overhead_modes {
        vars.push(Variant::named(m)?);
    }
    let mut out = format!(
        "{} datagrams per transfer, {} repetitions; each runs untraced and {} once, interleaved (a Williams order: each setting in each position and after each other equally); medians (ranges)\n\
         rate: Gbit/s at the receiver; cpu: ns of CPU per datagram, sender (per sent) + receiver (per received)\n\
         on/off: ratio of the medians; paired: median of the per-repetition ratios\n",
        a.run_packets,
        a.overhead_reps,
        a.overhead_modes.join(", ")
    );
    for v in &vars[1..] {
        let _ = writeln!(out, "  {}: {}", v.name, v.what);
    }
    let _ = writeln!(out, "app: ns of CPU per datagram of the sender's, the receiver's application thread alone; busy%: its CPU over the wall time its side's CPU was counted");
    let _ = writeln!(out, "switches: times the sender's, the receiver's threads were switched in, per 1000 datagrams");
    // The unit costs of the points a full trace records, measured before
    // the transfers and again after them; the lower of each is used, so the
    // floor stays a lower bound.
    let uc_before = crate::trace_costs::unit_costs().map_err(|e| format!("measuring unit costs: {e}"))?;
    let _ = writeln!(
        out,
        "{:<7} {:>6} {:<9} {:>8} {:>7} {:>7} {:>6} {:>7} {:>7} {:>7} {:>7} {:>7} {:>9}  ranges",
        "stack",
        "size",
        "mode",
        "rate",
        "on/off",
        "paired",
        "cpu",
        "off/on",
        "paired",
        "tx,rx",
        "app",
        "busy%",
        "switches"
    );
    let load_start = loadavg();
    let mut json_runs = Vec::new();
    let mut json_verdicts = Vec::new();
    let mut floors: Vec<Floor> = Vec::new();
    for &size in &a.sizes {
        for stack in &a.stacks {
            // Per setting: rates, CPU ns per datagram (total, sender, receiver), datagrams lost.
            let n = vars.len();
            let (mut rate, mut cpu, mut tx_cpu, mut rx_cpu) =
                (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
            let mut lost = vec![0u64; n];
            let (mut tx_sw, mut rx_sw) = (vec![vec![]; n], vec![vec![]; n]);
            // Application threads: CPU ns per datagram, busy share, each side.
            let (mut tx_app, mut rx_app, mut tx_busy, mut rx_busy) =
                (vec![vec![]; n], vec![vec![]; n], vec![vec![]; n], vec![vec![]; n]);
            // Kernel TX stamps per datagram sent, and the share of kernel
            // messages the sender's application thread sent, in each
            // complete trace.
            let (mut stamps_per_dgram, mut app_msgs) = (Vec::new(), Vec::new());
            let mut problems = Vec::new();
            for r in 0..a.overhead_reps as usize {
                let load = loadavg();
                for k in round_order(n, r) {
                    let (tx, rx, rep) = transfer_variant(tb, stack, size, a.run_packets, &a.out, &vars[k], false)?;
                    lost[k] += a.run_packets.saturating_sub(rep.received);
                    rate[k].push(rep.gbps);
                    let (t, x) = (
                        rep.tx_cpu_ns as f64 / a.run_packets as f64,
                        rep.rx_cpu_ns as f64 / rep.received.max(1) as f64,
                    );
                    tx_cpu[k].push(t);
                    rx_cpu[k].push(x);
                    cpu[k].push(t + x);
                    tx_sw[k].push(1000.0 * rep.tx_switches as f64 / a.run_packets as f64);
                    rx_sw[k].push(1000.0 * rep.rx_switches as f64 / rep.received.max(1) as f64);
                    let (ta, xa) = (
                        rep.tx_app_cpu_ns as f64 / a.run_packets as f64,
                        rep.rx_app_cpu_ns as f64 / rep.received.max(1) as f64,
                    );
                    let busy = |cpu: u64, wall: u64| if wall > 0 { cpu as f64 / wall as f64 } else { f64::NAN };
                    let (tb_, xb) = (busy(rep.tx_app_cpu_ns, rep.tx_wall_ns), busy(rep.rx_app_cpu_ns, rep.rx_wall_ns));
                    tx_app[k].push(ta);
                    rx_app[k].push(xa);
                    tx_busy[k].push(tb_);
                    rx_busy[k].push(xb);
                    json_runs.push(serde_json::json!({"stack": stack, "size": size, "rep": r, "mode": vars[k].name, "gbps": rep.gbps, "received": rep.received,
                        "tx_cpu_ns_per_dgram": t, "rx_cpu_ns_per_dgram": x, "tx_switches": rep.tx_switches, "rx_switches": rep.rx_switches,
                        "tx_app_cpu_ns_per_dgram": ta, "rx_app_cpu_ns_per_dgram": xa, "tx_app_busy": tb_, "rx_app_busy": xb, "loadavg": load}));
                    if vars[k].complete && vars[k].sample > 1 {
                        let v = &vars[k];
                        problems.extend(analyse_sampled(stack, size, &tx, &rx, rep.received, v.sample).problems);
                    } else if vars[k].complete {
                        let stamps = tx
                            .events
                            .iter()
                            .filter(|e| e.1 == resolve::kind::TX_SCHED || e.1 == resolve::kind::TX_SOFT)
                            .count();
                        stamps_per_dgram.push(stamps as f64 / a.run_packets.max(1) as f64);
                        if let Some(share) = app_thread_msg_share(&tx) {
                            app_msgs.push(share);
                        }
                        problems.extend(analyse_lossy(stack, size, &tx, &rx, rep.received).problems);
                    }
                }
            }
            let total = (a.run_packets * u64::from(a.overhead_reps)).max(1) as f64;
            let (r0, rr0) = summary(&rate[0]);
            let (c0, cr0) = summary(&cpu[0]);
            let _ = writeln!(
                out,
                "{stack:<7} {size:>6} {:<9} {r0:>8.3} {:>7} {:>7} {c0:>6.0} {:>7} {:>7} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>4.0},{:<4.0}  rate {rr0}, cpu {cr0}, lost {:.1}%",
                "off",
                "",
                "",
                "",
                "",
                summary(&tx_cpu[0]).0,
                summary(&rx_cpu[0]).0,
                summary(&tx_app[0]).0,
                summary(&rx_app[0]).0,
                100.0 * summary(&tx_busy[0]).0,
                100.0 * summary(&rx_busy[0]).0,
                summary(&tx_sw[0]).0,
                summary(&rx_sw[0]).0,
                100.0 * lost[0] as f64 / total
            );
            for k in 1..n {
                let (r1, rr1) = summary(&rate[k]);
                let (c1, cr1) = summary(&cpu[k]);
                let paired = |v: &[f64], base: &[f64], inv: bool| {
                    summary(&v.iter().zip(base).map(|(x, b)| if inv { b / x } else { x / b }).collect::<Vec<_>>()).0
                };
                let _ = writeln!(
                    out,
                    "{stack:<7} {size:>6} {:<9} {r1:>8.3} {:>7.3} {:>7.3} {c1:>6.0} {:>7.3} {:>7.3} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>3.0},{:<3.0} {:>4.0},{:<4.0}  rate {rr1}, cpu {cr1}, lost {:.1}%",
                    vars[k].name,
                    r1 / r0,
                    paired(&rate[k], &rate[0], false),
                    c0 / c1,
                    paired(&cpu[k], &cpu[0], true),
                    summary(&tx_cpu[k]).0,
                    summary(&rx_cpu[k]).0,
                    summary(&tx_app[k]).0,
                    summary(&rx_app[k]).0,
                    100.0 * summary(&tx_busy[k]).0,
                    100.0 * summary(&rx_busy[k]).0,
                    summary(&tx_sw[k]).0,
                    summary(&rx_sw[k]).0,
                    100.0 * lost[k] as f64 / total
                );
            }
            // Per round, the setting's rate over the untraced one of the same
            // round, and the untraced CPU per datagram over the setting's.
            for k in 1..n {
                let (v, label) = (&vars[k], format!("{stack} {size} {}", vars[k].name));
                let rows = report_verdicts(&mut out, &label, (&rate[k], &rate[0]), (&cpu[k], &cpu[0]));
                for mut row in rows {
                    row["stack"] = stack.as_str().into();
                    row["size"] = size.into();
                    row["mode"] = v.name.as_str().into();
                    row["sample"] = v.sample.into();
                    json_verdicts.push(row);
                }
            }
            if !stamps_per_dgram.is_empty() {
                floors.push(Floor {
                    stack: stack.clone(),
                    size,
                    stamps: summary(&stamps_per_dgram).0,
                    cpu: c0,
                    tx_cpu: summary(&tx_cpu[0]).0,
                    rx_cpu: summary(&rx_cpu[0]).0,
                    app: AppThread {
                        cpu: summary(&tx_app[0]).0,
                        busy: summary(&tx_busy[0]).0,
                        msg_share: if app_msgs.is_empty() { 0.0 } else { summary(&app_msgs).0 },
                    },
                });
            }
            if vars.iter().any(|v| v.complete) {
                let complete = if problems.is_empty() {
                    "every full- or sample-traced run complete (every layer of every traced packet that arrived)"
                        .to_string()
                } else {
                    format!("INCOMPLETE traces: {}", problems.join("; "))
                };
                let _ = writeln!(out, "        {complete}");
            }
            print_tail(&out, 3 * n - 1);
        }
    }
    let uc_after = crate::trace_costs::unit_costs().map_err(|e| format!("measuring unit costs: {e}"))?;
    let floor_json = floor_report(&mut out, &uc_before, &uc_after, &floors);
    print_tail(&out, floors.len() + 1);
    std::fs::write(a.out.join("overhead.txt"), &out).map_err(|e| e.to_string())?;
    let doc = serde_json::json!({"command": std::env::args().collect::<Vec<_>>(), "load_avg_start": load_start, "load_avg_end": loadavg(),
        "run_packets": a.run_packets, "reps": a.overhead_reps, "modes": a.overhead_modes, "table": out, "runs": json_runs, "verdicts": json_verdicts, "floor": floor_json});
    std::fs::write(a.out.join("overhead.json"), serde_json::to_string_pretty(&doc).map_err(|e| e.to_string())? + "\n")
        .map_err(|e| e.to_string())?;
    println!("wrote {0}/overhead.txt, {0}/overhead.json", a.out.display());
    Ok(())
}

/// Prints the last `n` lines of `out` (the report's part just written).
fn print_tail(out: &str, n: usize) {
    let lines: Vec<&str> = out.lines().collect();
    for l in &lines[lines.len().saturating_sub(n)..] {
        println!("{l}");
    }
}

/// `/proc/loadavg` as it reads (1, 5 and 15 minute averages first).
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// Median and range of a sample.
fn summary(v: &[f64]) -> (f64, String) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => (f64::NAN, "-".into()),
        n => (v[n / 2], format!("{:.2}-{:.2}", v[0], v[n - 1])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_is_median_and_range() {
        assert_eq!(summary(&[3.0, 1.0, 2.0]), (2.0, "1.00-3.00".to_string()));
        assert!(summary(&[]).0.is_nan());
    }
}
