//! One transfer between two trace workers on a testbed, in a setting
//! ([`Variant`]): traced or not, and how.

use crate::testbed::{Testbed, ADDR_B};
use eudp_trace::resolve::{self, Dump};
use std::io::Read;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

fn exe() -> String {
    std::env::var("EUDP_TRACE_EXE")
        .ok()
        .or_else(|| std::env::current_exe().ok().map(|p| p.display().to_string()))
        .unwrap_or_else(|| "eudp".into())
}

fn spawn(tb: &Testbed, host: char, args: &[String], env: &[(&str, &str)]) -> Result<Child, String> {
    let mut c = tb.command(host, &exe());
    c.arg("trace").arg("worker").args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    c.env_remove("EUDP_TRACE");
    c.envs(env.iter().copied());
    c.spawn().map_err(|e| format!("cannot start trace worker: {e}"))
}

fn wait(mut c: Child, what: &str, limit: Duration) -> Result<String, String> {
    let t0 = Instant::now();
    while c.try_wait().map_err(|e| e.to_string())?.is_none() {
        if t0.elapsed() > limit {
            let _ = c.kill();
            let _ = c.wait();
            return Err(format!("{what} did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut out = String::new();
    let mut err = String::new();
    if let Some(mut o) = c.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = c.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    if !c.wait().map(|s| s.success()).unwrap_or(false) {
        return Err(format!("{what} failed: {}", err.trim()));
    }
    Ok(out)
}

/// What the receiver of a transfer saw.
#[derive(Clone, Copy, Debug, Default)]
pub struct RxReport {
    pub received: u64,
    pub out_of_order: u64,
    pub gbps: f64,
    /// CPU time (ns, all threads) the sender spent sending and the receiver
    /// receiving (their dumps excluded).
    pub tx_cpu_ns: u64,
    pub rx_cpu_ns: u64,
    /// Times the sender's and the receiver's threads were switched in.
    pub tx_switches: u64,
    pub rx_switches: u64,
    /// CPU time (ns) of the sender's and the receiver's application thread
    /// alone, and the wall time (ns) over which each side's CPU was counted
    /// (its busy share: CPU / wall).
    pub tx_app_cpu_ns: u64,
    pub rx_app_cpu_ns: u64,
    pub tx_wall_ns: u64,
    pub rx_wall_ns: u64,
}

/// One transfer of `packets` datagrams of `size` bytes with `stack` on the
/// testbed; returns the sender's and the receiver's dumps. `trace` turns
/// the tracepoints on, `tag` has the receiver tag each datagram with its
/// payload sequence number.
pub fn transfer(
    tb: &Testbed,
    stack: &str,
    size: u64,
    packets: u64,
    dir: &std::path::Path,
    trace: bool,
    tag: bool,
) -> Result<(Dump, Dump, RxReport), String> {
    let v = if trace { Variant::named("full")? } else { Variant::named("off")? };
    transfer_variant(tb, stack, size, packets, dir, &v, tag)
}

/// A setting of `eudp trace --overhead`: traced or not, and the
/// environment its workers run with.
#[derive(Clone, Debug)]
pub struct Variant {
    pub name: String,
    pub trace: bool,
    pub env: Vec<(&'static str, &'static str)>,
    /// Its traces must be complete (every layer of every traced packet, in order).
    pub complete: bool,
    /// One datagram in this many is traced (`EUDP_TRACE_SAMPLE`); 1: all.
    pub sample: u64,
    /// What it records, for the report.
    pub what: &'static str,
}

impl Variant {
    /// `off`; `full` (every layer of every packet, the setting);
    /// `user` (no kernel stamps); `txstamps`, `rxstamps` (only the kernel's
    /// TX stamps, only its RX stamps); `noclock` (every event, no clock read:
    /// a measurement of what the clock reads cost, its times are
    /// meaningless); `recvmmsg` (as `full`, the TX stamps read without
    /// io_uring); `sampleN` (every layer of one datagram in N: one run of 64
    /// consecutive sequence numbers in N);
    /// `control` (untraced again: an A/A control, whose ratio to `off` is
    /// the harness's own bias and spread, so a traced ratio can be read
    /// against it).
    /// `full`, or `sampleN` for `sample` > 1.
    pub fn traced(sample: u64) -> Result<Variant, String> {
        Variant::named(&if sample > 1 { format!("sample{sample}") } else { "full".into() })
    }

    pub fn named(name: &str) -> Result<Variant, String> {
        let v = |trace, env: Vec<(&'static str, &'static str)>, complete, what| Variant {
            name: name.into(),
            trace,
            env,
            complete,
            what,
            sample: 1,
        };
        Ok(match name {
            "off" => v(false, vec![], false, "untraced"),
            "control" => v(false, vec![], false, "untraced again (A/A control: the harness's own bias and spread)"),
            "full" => v(true, vec![], true, "every layer of every packet, kernel stamps included"),
            "user" => v(true, vec![("EUDP_TRACE_KERNEL", "0")], false, "user-space points only (no SO_TIMESTAMPING)"),
            "txstamps" => v(true, vec![("EUDP_TRACE_KERNEL", "tx")], false, "user-space points and kernel TX stamps (no RX_SOFTWARE)"),
            "rxstamps" => v(true, vec![("EUDP_TRACE_KERNEL", "rx")], false, "user-space points and kernel RX stamps (no TX stamps)"),
            "noclock" => v(true, vec![("EUDP_TRACE_CLOCK", "none")], false, "every event, no clock read (experiment: no timing)"),
            "recvmmsg" => v(true, vec![("EUDP_TRACE_STAMP_READER", "recvmmsg")], true, "as full, TX stamps read with recvmmsg only (no io_uring)"),
            s if s.starts_with("sample") => {
                let k: u64 = s["sample".len()..].parse().map_err(|_| format!("--overhead-modes: bad mode {s:?}"))?;
                let k: &'static str = Box::leak(k.to_string().into_boxed_str());
                Variant {
                    sample: k.parse().unwrap_or(1),
                    ..v(true, vec![("EUDP_TRACE_SAMPLE", k)], true, "every layer of one datagram in N")
                }
            }
            s => return Err(format!("--overhead-modes: unknown mode {s:?} (full, user, txstamps, rxstamps, noclock, recvmmsg, sampleN, control)")),
        })
    }
}

/// As [`transfer`], in a given setting (the dumps are read only when its
/// traces are to be checked).
pub fn transfer_variant(
    tb: &Testbed,
    stack: &str,
    size: u64,
    packets: u64,
    dir: &std::path::Path,
    v: &Variant,
    tag: bool,
) -> Result<(Dump, Dump, RxReport), String> {
    let trace = v.trace;
    let port = 9400 + (size % 500) as u16;
    let rx_file = dir.join(format!("raw-{stack}-{size}-rx.json"));
    let tx_file = dir.join(format!("raw-{stack}-{size}-tx.json"));
    let common = |role: &str, f: &std::path::Path| -> Vec<String> {
        let mut v = vec![
            role.into(),
            "--stack".into(),
            stack.into(),
            "--size".into(),
            size.to_string(),
            "--count".into(),
            packets.to_string(),
            "--out".into(),
            f.display().to_string(),
        ];
        if !trace {
            v.push("--off".into());
        }
        if !tag {
            v.push("--no-tag".into());
        }
        v
    };
    let mut ra = common("recv", &rx_file);
    ra.extend(["--addr".into(), format!("0.0.0.0:{port}")]);
    let mut rx = spawn(tb, 'b', &ra, &v.env)?;
    let mut reader = crate::bench::await_ready(&mut rx, "trace receiver")?;
    let mut sa = common("send", &tx_file);
    sa.extend(["--addr".into(), format!("{ADDR_B}:{port}")]);
    let tx = spawn(tb, 'a', &sa, &v.env)?;
    let limit = Duration::from_secs(30 + packets / 10_000);
    let txout = wait(tx, "trace sender", limit)?;
    let mut rest = String::new();
    let rxout = wait(rx, "trace receiver", limit);
    let _ = reader.read_to_string(&mut rest);
    rxout?;
    let report: serde_json::Value = rest
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or("trace receiver printed no report")?;
    let tx_report =
        txout.lines().rev().find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()).unwrap_or_default();
    let rep = RxReport {
        received: report["received"].as_u64().unwrap_or(0),
        out_of_order: report["out_of_order"].as_u64().unwrap_or(0),
        gbps: report["gbps"].as_f64().unwrap_or(0.0),
        tx_cpu_ns: tx_report["cpu_ns"].as_u64().unwrap_or(0),
        rx_cpu_ns: report["cpu_ns"].as_u64().unwrap_or(0),
        tx_switches: tx_report["switches"].as_u64().unwrap_or(0),
        rx_switches: report["switches"].as_u64().unwrap_or(0),
        tx_app_cpu_ns: tx_report["app_cpu_ns"].as_u64().unwrap_or(0),
        rx_app_cpu_ns: report["app_cpu_ns"].as_u64().unwrap_or(0),
        tx_wall_ns: tx_report["wall_ns"].as_u64().unwrap_or(0),
        rx_wall_ns: report["wall_ns"].as_u64().unwrap_or(0),
    };
    let load = |f: &std::path::Path| -> Result<Dump, String> {
        resolve::parse_dump(&std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?)
    };
    if !trace || !v.complete {
        return Ok((Dump::default(), Dump::default(), rep));
    }
    Ok((load(&tx_file)?, load(&rx_file)?, rep))
}
