//! Multicast fan-out on the testbed: one sender on host `a`, four
//! receiving processes on host `b` sharing the group port, three groups
//! (`src/c/mcastfan.c`, compiled here). The testbed test checks what each
//! receiver got; `eudp bench --mcast` measures, per receiver, messages per
//! second, loss and the one-way latency (sender and receivers share the
//! host's monotonic clock) for the kernel and eudp's transports side by
//! side, and writes `bench/results/mcast-<time>.json`.

use crate::run::{app_command, Stack};
use crate::testbed::{Testbed, ADDR6_A, ADDR_A};
use serde::Serialize;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

const MCASTFAN_C: &str = include_str!("c/mcastfan.c");

/// The group port.
pub const PORT: u16 = 5301;

/// The three groups, IPv4 or IPv6 (organisation-local scope).
pub fn groups(v6: bool) -> [&'static str; 3] {
    if v6 {
        ["ff15::18:1", "ff15::18:2", "ff15::18:3"]
    } else {
        ["239.18.3.1", "239.18.3.2", "239.18.3.3"]
    }
}

/// Which groups (1-based) each of the four receivers joins: all three, or
/// distinct subsets, so each group has a different set of members.
pub fn memberships(subsets: bool) -> [Vec<usize>; 4] {
    if subsets {
        [vec![1, 2, 3], vec![1], vec![2, 3], vec![1, 3]]
    } else {
        [vec![1, 2, 3], vec![1, 2, 3], vec![1, 2, 3], vec![1, 2, 3]]
    }
}

/// One fan-out's plan.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub size: usize,
    /// Datagrams per group.
    pub count: u64,
    /// Pause `gap_us` after every `burst` datagrams (0: unpaced).
    pub burst: u64,
    pub gap_us: u64,
    pub v6: bool,
    pub subsets: bool,
    /// Datagrams the sender sends to one group before the next (a run a
    /// stack can send as one GSO batch).
    pub run: u64,
    /// The four receivers are sockets of one process rather than four
    /// processes (every one in every group: `subsets` must be false).
    pub one_process: bool,
    /// The receivers share the port by `SO_REUSEADDR` and `SO_REUSEPORT`
    /// (false: `SO_REUSEADDR` alone).
    pub reuseport: bool,
    /// xdp transport: the receivers' `EUDP_XDP_RING` (None: the default);
    /// the run's stack is then named `<stack>-ring<N>`.
    pub xdp_ring: Option<u32>,
}

impl Plan {
    /// Four receiving processes sharing the port by both options, the
    /// sender sending one datagram to each group in turn.
    pub fn new(size: usize, count: u64, burst: u64, gap_us: u64, v6: bool, subsets: bool) -> Plan {
        Plan { size, count, burst, gap_us, v6, subsets, run: 1, one_process: false, reuseport: true, xdp_ring: None }
    }
}

/// One receiver's result.
#[derive(Debug, Clone, Serialize)]
pub struct Receiver {
    /// Which receiving process it is (the sockets of one process share it).
    pub proc: usize,
    pub groups: Vec<usize>,
    /// What `mcastfan recv` printed.
    pub report: Value,
    /// Its shim's per-socket counters (eudp stacks).
    pub eudp: Option<Value>,
    /// Its shim's process report fields `accelerated`, `fallbacks`,
    /// `multicast_kernel`, `fallback_reasons` and `xdp` (the transport's
    /// counters). With `one_process`, every receiver has the same.
    pub process: Option<Value>,
}

/// One fan-out.
#[derive(Debug, Clone, Serialize)]
pub struct FanRun {
    pub stack: String,
    pub size: usize,
    pub v6: bool,
    /// What `mcastfan send` printed.
    pub sender: Value,
    pub sender_eudp: Option<Value>,
    pub sender_process: Option<Value>,
    pub receivers: Vec<Receiver>,
}

fn kill(children: &mut [Child]) {
    for c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// The one report of the (exited) process in `dir`: its process fields and
/// the counters of its socket that moved datagrams.
fn shim_report(dir: &Path) -> (Option<Value>, Option<Value>) {
    let Ok(rd) = std::fs::read_dir(dir) else { return (None, None) };
    for e in rd.flatten() {
        let p = e.path();
        if p.extension().is_none_or(|x| x != "json") {
            continue;
        }
        let Ok(v) =
            std::fs::read_to_string(&p).map_err(|_| ()).and_then(|s| serde_json::from_str::<Value>(&s).map_err(|_| ()))
        else {
            continue;
        };
        let proc = serde_json::json!({
            "accelerated": v["accelerated"], "fallbacks": v["fallbacks"],
            "multicast_kernel": v["multicast_kernel"], "fallback_reasons": v["fallback_reasons"],
            "xdp": v["xdp"],
        });
        let sock = ["sockets", "closed"]
            .iter()
            .flat_map(|k| v[*k].as_array().cloned().unwrap_or_default())
            .filter_map(|s| s.get("stats").cloned().filter(|x| x.is_object()))
            .max_by_key(|s| s["datagrams_received"].as_u64().unwrap_or(0) + s["datagrams_sent"].as_u64().unwrap_or(0));
        return (Some(proc), sock);
    }
    (None, None)
}

/// Waits until neither host has a tentative IPv6 address. The link-local
/// addresses of a fresh testbed are still in duplicate address detection
/// for about a second, and group datagrams sent meanwhile never reach the
/// members (the first IPv6 fan-out on a new testbed lost most of them).
fn ipv6_settled(tb: &Testbed) -> Result<(), String> {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut tentative = false;
        for host in ['a', 'b'] {
            let out = std::process::Command::new("ip")
                .args(["-n", &tb.netns(host), "-6", "addr", "show", "tentative"])
                .output()
                .map_err(|e| format!("ip -6 addr: {e}"))?;
            tentative |= !String::from_utf8_lossy(&out.stdout).trim().is_empty();
        }
        if !tentative {
            return Ok(());
        }
        if Instant::now() > until {
            return Err("IPv6 addresses still tentative after 10 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs one fan-out of `plan` on `stack` over `tb`.
pub fn fanout(tb: &Testbed, stack: Stack, lib: &Path, plan: Plan) -> Result<FanRun, String> {
    if plan.v6 {
        ipv6_settled(tb)?;
    }
    let exe = crate::rss::compile("mcastfan", MCASTFAN_C)?;
    let exe = exe.display().to_string();
    let fam = if plan.v6 { "6" } else { "4" };
    let port = PORT.to_string();
    let gs = groups(plan.v6);
    let base =
        std::env::temp_dir().join(format!("eudp-mcast-{}-{}", std::process::id(), crate::testbed::unique_name("s")));
    let dir = |what: &str| -> PathBuf {
        let d = base.join(what);
        let _ = std::fs::remove_dir_all(&d);
        let _ = std::fs::create_dir_all(&d);
        d
    };
    let members = memberships(plan.subsets);
    if plan.one_process && plan.subsets {
        return Err("one receiving process: every socket joins every group (no subsets)".into());
    }
    // (groups, sockets) of each receiving process.
    let procs: Vec<(Vec<usize>, usize)> =
        if plan.one_process { vec![(members[0].clone(), 4)] } else { members.iter().map(|m| (m.clone(), 1)).collect() };
    let mut children = Vec::new();
    let mut outs = Vec::new();
    let mut stat_dirs = Vec::new();
    for (i, (m, sockets)) in procs.iter().enumerate() {
        let sd = dir(&format!("r{i}"));
        let mut argv: Vec<String> = vec![format!("MCASTFAN_SOCKETS={sockets}")];
        if !plan.reuseport {
            argv.push("MCASTFAN_NO_REUSEPORT=1".into());
        }
        if let Some(r) = plan.xdp_ring {
            argv.push(format!("EUDP_XDP_RING={r}"));
        }
        argv.extend([exe.clone(), "recv".into(), fam.into(), tb.veth('b'), port.clone(), "1500".into()]);
        argv.extend(m.iter().map(|g| format!("{g}:{}", gs[g - 1])));
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let mut c = app_command(tb, 'b', stack, lib, &sd, &argv);
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = match c.spawn() {
            Ok(c) => c,
            Err(e) => {
                kill(&mut children);
                return Err(format!("mcastfan recv: {e}"));
            }
        };
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        children.push(child);
        let mut line = String::new();
        if out.read_line(&mut line).map_err(|e| e.to_string())? == 0 || line.trim() != "ready" {
            kill(&mut children);
            return Err(format!("receiver {i} did not start: {line}"));
        }
        outs.push(out);
        stat_dirs.push(sd);
    }
    if matches!(stack, Stack::EudpXdp(_)) {
        // The transport reads the host's sockets every 20 ms to decide
        // whether it holds a group's port alone: let it see the last
        // receiver before the first datagram.
        std::thread::sleep(Duration::from_millis(200));
    }
    let sd = dir("s");
    let mut argv: Vec<String> = vec![
        format!("MCASTFAN_RUN={}", plan.run),
        exe.clone(),
        "send".into(),
        fam.into(),
        tb.veth('a'),
        port.clone(),
        plan.size.to_string(),
        plan.count.to_string(),
        plan.burst.to_string(),
        plan.gap_us.to_string(),
    ];
    argv.extend(gs.iter().map(|g| g.to_string()));
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    let sent = app_command(tb, 'a', stack, lib, &sd, &argv).stderr(Stdio::piped()).output();
    let sent = match sent {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            kill(&mut children);
            return Err(format!("mcastfan send: {}", String::from_utf8_lossy(&o.stderr)));
        }
        Err(e) => {
            kill(&mut children);
            return Err(format!("mcastfan send: {e}"));
        }
    };
    let sender: Value = serde_json::from_slice(&sent.stdout).map_err(|e| format!("sender output: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut receivers = Vec::new();
    for (i, (mut out, mut child)) in outs.into_iter().zip(children.drain(..)).enumerate() {
        let (groups, sockets) = &procs[i];
        let mut lines = Vec::new();
        for _ in 0..*sockets {
            let mut line = String::new();
            let _ = out.read_line(&mut line);
            lines.push(line);
        }
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let st = child.wait().map_err(|e| e.to_string())?;
        let (process, eudp) = shim_report(&stat_dirs[i]);
        for line in lines {
            let report: Value =
                serde_json::from_str(line.trim()).map_err(|e| format!("receiver {i} ({st}): {e}: {line}"))?;
            receivers.push(Receiver {
                proc: i,
                groups: groups.clone(),
                report,
                eudp: eudp.clone(),
                process: process.clone(),
            });
        }
    }
    let (sender_process, sender_eudp) = shim_report(&sd);
    let _ = std::fs::remove_dir_all(&base);
    let name = match plan.xdp_ring {
        Some(r) => format!("{}-ring{r}", stack.name()),
        None => stack.name(),
    };
    Ok(FanRun { stack: name, size: plan.size, v6: plan.v6, sender, sender_eudp, sender_process, receivers })
}

/// The sender's address on the testbed (for reports).
pub fn sender_addr(v6: bool) -> &'static str {
    if v6 {
        ADDR6_A
    } else {
        ADDR_A
    }
}

/// One stack, one size, one plan of the bench: per receiver.
#[derive(Debug, Clone, Serialize)]
pub struct BenchRow {
    pub stack: String,
    pub size: usize,
    /// `rate` (unpaced: messages per second and loss) or `latency` (paced:
    /// the one-way latency without queueing).
    pub kind: &'static str,
    pub sender_sent: u64,
    pub sender_secs: f64,
    /// Per receiver: received messages per second (first to last), in millions.
    pub mpps: Vec<f64>,
    /// Per receiver: the share of its groups' datagrams it did not get.
    pub loss: Vec<f64>,
    pub p50_ns: Vec<u64>,
    pub p99_ns: Vec<u64>,
    /// Shim runs: sockets on the engine and moved to the kernel path over
    /// all five processes, and why.
    pub accelerated: u64,
    pub fallbacks: u64,
    pub multicast_kernel: u64,
    /// Shim runs: the sender's GSO messages and the receivers' GRO messages.
    pub gso_messages: u64,
    pub gro_superpackets: u64,
    /// xdp transport runs: where the receiving process's frames went, summed
    /// over the receiving processes (see [`XDP_FIELDS`]), so a row's loss has
    /// its cause beside it. `None` on other stacks.
    pub xdp: Option<Value>,
}

/// The xdp transport counters a row carries: frames taken from the RX ring
/// and copies delivered, datagrams read from the kernel sockets, drops at a
/// full socket inbox, groups found shared (left to the kernel), and the
/// kernel's `XDP_STATISTICS` of the AF_XDP socket (frames dropped, RX ring
/// full, fill ring empty).
pub const XDP_FIELDS: [&str; 8] = [
    "rx_xdp",
    "rx_group_copies",
    "rx_kernel",
    "rx_inbox_drops",
    "group_kernel",
    "xsk_rx_dropped",
    "xsk_rx_ring_full",
    "xsk_fill_ring_empty",
];

/// [`XDP_FIELDS`] summed over the distinct receiving processes of `run`
/// (the sockets of one process share one report).
fn xdp_counters(run: &FanRun) -> Option<Value> {
    let mut procs: Vec<usize> = Vec::new();
    let mut seen: Vec<&Value> = Vec::new();
    for x in &run.receivers {
        if let Some(v) = x.process.as_ref().map(|p| &p["xdp"]["stats"]).filter(|v| v.is_object()) {
            if !procs.contains(&x.proc) {
                procs.push(x.proc);
                seen.push(v);
            }
        }
    }
    if seen.is_empty() {
        return None;
    }
    let m: serde_json::Map<String, Value> = XDP_FIELDS
        .iter()
        .map(|f| (f.to_string(), seen.iter().map(|v| v[*f].as_u64().unwrap_or(0)).sum::<u64>().into()))
        .collect();
    Some(Value::Object(m))
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

fn median_u64(v: &[u64]) -> u64 {
    let mut s = v.to_vec();
    s.sort_unstable();
    s.get(s.len() / 2).copied().unwrap_or(0)
}

fn row(run: &FanRun, kind: &'static str, count: u64) -> BenchRow {
    let u = |v: &Value| v.as_u64().unwrap_or(0);
    let mut r = BenchRow {
        stack: run.stack.clone(),
        size: run.size,
        kind,
        sender_sent: u(&run.sender["sent"]),
        sender_secs: run.sender["secs"].as_f64().unwrap_or(0.0),
        mpps: Vec::new(),
        loss: Vec::new(),
        p50_ns: Vec::new(),
        p99_ns: Vec::new(),
        accelerated: 0,
        fallbacks: 0,
        multicast_kernel: 0,
        gso_messages: run.sender_eudp.as_ref().map(|s| u(&s["gso_messages"])).unwrap_or(0),
        gro_superpackets: 0,
        xdp: xdp_counters(run),
    };
    let procs = run.receivers.iter().filter_map(|x| x.process.as_ref()).chain(run.sender_process.as_ref());
    for p in procs {
        r.accelerated += u(&p["accelerated"]);
        r.fallbacks += u(&p["fallbacks"]);
        r.multicast_kernel += u(&p["multicast_kernel"]);
    }
    for x in &run.receivers {
        let rep = &x.report;
        r.mpps.push(rep["pps"].as_f64().unwrap_or(0.0) / 1e6);
        let want: u64 = rep["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|g| if g["ended"] == true { u(&g["end_total"]) } else { count })
            .sum();
        let got = u(&rep["received"]);
        r.loss.push(if want == 0 { 0.0 } else { want.saturating_sub(got) as f64 / want as f64 });
        r.p50_ns.push(u(&rep["lat_p50_ns"]));
        r.p99_ns.push(u(&rep["lat_p99_ns"]));
        r.gro_superpackets += x.eudp.as_ref().map(|s| u(&s["gro_superpackets"])).unwrap_or(0);
    }
    r
}

/// The stacks of `rows` at `size`, each once, in the order each first ran
/// (the rate and latency rows interleave).
fn stacks_of(rows: &[BenchRow], size: usize) -> Vec<&str> {
    let mut names: Vec<&str> = Vec::new();
    for r in rows.iter().filter(|r| r.size == size) {
        if !names.contains(&r.stack.as_str()) {
            names.push(r.stack.as_str());
        }
    }
    names
}

/// Runs the bench: for each size, an unpaced fan-out (rate, loss) and a
/// paced one (latency) per stack, on one testbed; the JSON result, and
/// where it was written.
pub fn bench(sizes: &[usize], out_dir: Option<&Path>) -> Result<(Value, Option<PathBuf>), String> {
    if !crate::testbed::is_root() {
        return Err("the multicast bench needs root (network namespaces)".into());
    }
    let lib = crate::run::preload_lib()?;
    let tb = Testbed::up(&crate::testbed::unique_name("mcb"))?;
    // The xdp transport twice: with its default rings, and with rings of
    // 16384 (twice as many UMEM frames), enough frames to ride out the
    // receiving process's stalls on a busy host, where the default's losses
    // are the kernel's drops for an empty fill ring (the rows' `xdp`).
    let xdp = Stack::EudpXdp("default");
    let stacks = [(Stack::Kernel, None), (Stack::Eudp("default"), None), (xdp, None), (xdp, Some(16384))];
    // Under xdp the four receivers are sockets of one process (sharing the
    // port by SO_REUSEADDR and SO_REUSEPORT, as the others): four processes
    // on one host share every group, which the transport leaves to the
    // kernel (docs/xdp.md, "Multicast").
    let shape = |p: Plan, stack: Stack, xdp_ring: Option<u32>| match stack {
        Stack::EudpXdp(_) => Plan { one_process: true, xdp_ring, ..p },
        _ => p,
    };
    let mut rows = Vec::new();
    for &size in sizes {
        // About a second of the kernel sender's stream.
        let count = if size <= 256 { 150_000 } else { 60_000 };
        // Runs of 16 datagrams per group, which a stack can send as one GSO batch.
        let rate = Plan { run: 16, ..Plan::new(size, count, 0, 0, false, false) };
        let paced = Plan::new(size, 2000, 3, 200, false, false);
        // The latency profile sends each datagram at once (no coalescing
        // interval), as a feed that wants latency over batching would run.
        let with_latency = [
            (Stack::Kernel, None),
            (Stack::Eudp("default"), None),
            (Stack::Eudp("latency"), None),
            (xdp, None),
            (xdp, Some(16384)),
        ];
        for (kind, plan, stacks) in [("rate", rate, &stacks[..]), ("latency", paced, &with_latency[..])] {
            for &(stack, ring) in stacks {
                let run = fanout(&tb, stack, &lib, shape(plan, stack, ring))?;
                let r = row(&run, kind, plan.count);
                eprintln!(
                    "mcast {:>5} B {kind:<7} {:<10} per receiver {:.3} Mpps, loss {:.4}, p50 {} ns",
                    size,
                    r.stack,
                    mean(&r.mpps),
                    r.loss.iter().cloned().fold(0.0, f64::max),
                    median_u64(&r.p50_ns)
                );
                rows.push(r);
            }
        }
    }
    let find = |stack: &str, size: usize, kind: &str| {
        rows.iter().find(|r| r.stack == stack && r.size == size && r.kind == kind)
    };
    let mut ratios = Vec::new();
    for &size in sizes {
        let Some(k) = find("kernel", size, "rate") else { continue };
        let kl = find("kernel", size, "latency");
        for name in stacks_of(&rows, size).into_iter().filter(|n| *n != "kernel") {
            let r = find(name, size, "rate");
            let lat = find(name, size, "latency");
            let p50 = |x: Option<&BenchRow>| x.map(|x| median_u64(&x.p50_ns));
            let max_loss = |x: &BenchRow| x.loss.iter().cloned().fold(0.0, f64::max);
            ratios.push(serde_json::json!({
                "stack": name, "size": size,
                "mpps_per_receiver_vs_kernel": r.map(|r| mean(&r.mpps) / mean(&k.mpps).max(1e-9)),
                "max_loss": r.map(max_loss), "kernel_max_loss": max_loss(k),
                "p50_ns": p50(lat), "kernel_p50_ns": p50(kl),
                "p50_vs_kernel": p50(lat).zip(p50(kl)).map(|(a, b)| a as f64 / b.max(1) as f64),
                "rate_xdp_counters": r.and_then(|r| r.xdp.clone()),
            }));
        }
    }
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let res = serde_json::json!({
        "bench": "mcast",
        "shape": "1 sender on host a (runs of 16 datagrams per group in the rate rows), 4 receiving processes on host b (eudp-xdp: 4 sockets of one process; -ring16384: EUDP_XDP_RING=16384), 3 groups (IPv4), every receiver in every group",
        "cpus": cpus,
        "loadavg": load.trim(),
        "rows": rows,
        "ratios": ratios,
    });
    let mut path = None;
    if let Some(d) = out_dir {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let p = d.join(format!("mcast-{t}.json"));
        std::fs::write(&p, serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        path = Some(p);
    }
    Ok((res, path))
}

/// The bench's ratios as a table.
pub fn table(res: &Value) -> String {
    let mut s = String::from("stack        size  Mpps/receiver vs kernel  max loss (kernel)   p50 ns (kernel)\n");
    for r in res["ratios"].as_array().into_iter().flatten() {
        let f =
            |v: &Value, w: usize, d: usize| v.as_f64().map(|x| format!("{x:>w$.d$}")).unwrap_or(format!("{:>w$}", "-"));
        s += &format!(
            "{:<12} {:>5}  {}x  {} ({})   {:>7} ({})\n",
            r["stack"].as_str().unwrap_or("?"),
            r["size"],
            f(&r["mpps_per_receiver_vs_kernel"], 22, 2),
            f(&r["max_loss"], 7, 4),
            f(&r["kernel_max_loss"], 0, 4),
            r["p50_ns"],
            r["kernel_p50_ns"]
        );
        if let Some(c) = r["rate_xdp_counters"].as_object() {
            let f: Vec<String> =
                XDP_FIELDS.iter().map(|k| format!("{k} {}", c.get(*k).unwrap_or(&Value::Null))).collect();
            s += &format!("  rate run's xdp counters: {}\n", f.join(", "));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn receiver(proc: usize, xdp: Option<Value>) -> Receiver {
        Receiver {
            proc,
            groups: vec![1, 2, 3],
            report: json!({"received": 10, "pps": 1.0e6, "groups": []}),
            eudp: None,
            process: xdp.map(|x| json!({"accelerated": 1, "xdp": {"stats": x}})),
        }
    }

    fn run(receivers: Vec<Receiver>) -> FanRun {
        FanRun {
            stack: "eudp-xdp".into(),
            size: 64,
            v6: false,
            sender: json!({"sent": 30, "secs": 0.1}),
            sender_eudp: None,
            sender_process: None,
            receivers,
        }
    }

    #[test]
    fn xdp_counters_count_each_receiving_process_once() {
        let a = json!({"rx_xdp": 100, "xsk_fill_ring_empty": 7, "xsk_rx_dropped": 7, "rx_inbox_drops": 1});
        let b = json!({"rx_xdp": 50, "xsk_fill_ring_empty": 0, "xsk_rx_dropped": 0, "rx_inbox_drops": 2});
        // Four sockets of process 0 share its report; process 1 has its own.
        let mut rs: Vec<Receiver> = (0..4).map(|_| receiver(0, Some(a.clone()))).collect();
        rs.push(receiver(1, Some(b)));
        let c = xdp_counters(&run(rs)).expect("xdp counters");
        assert_eq!(c["rx_xdp"], 150);
        assert_eq!(c["xsk_fill_ring_empty"], 7);
        assert_eq!(c["xsk_rx_dropped"], 7);
        assert_eq!(c["rx_inbox_drops"], 3);
        assert_eq!(c["xsk_rx_ring_full"], 0, "a counter a report lacks is 0");
        assert_eq!(c.as_object().unwrap().len(), XDP_FIELDS.len());
        let r = row(&run(vec![receiver(0, Some(a))]), "rate", 10);
        assert_eq!(r.xdp.as_ref().unwrap()["xsk_fill_ring_empty"], 7, "the row carries them");
    }

    #[test]
    fn rows_without_the_xdp_transport_carry_no_xdp_counters() {
        assert!(xdp_counters(&run(vec![receiver(0, None), receiver(1, None)])).is_none());
    }

    #[test]
    fn each_stack_is_listed_once_per_size() {
        let mk = |stack: &str, size: usize, kind: &'static str| BenchRow {
            stack: stack.into(),
            size,
            kind,
            sender_sent: 0,
            sender_secs: 0.0,
            mpps: vec![],
            loss: vec![],
            p50_ns: vec![],
            p99_ns: vec![],
            accelerated: 0,
            fallbacks: 0,
            multicast_kernel: 0,
            gso_messages: 0,
            gro_superpackets: 0,
            xdp: None,
        };
        let rows = vec![
            mk("kernel", 64, "rate"),
            mk("eudp", 64, "rate"),
            mk("eudp-xdp", 64, "rate"),
            mk("kernel", 64, "latency"),
            mk("eudp", 64, "latency"),
            mk("eudp-latency", 64, "latency"),
            mk("eudp-xdp", 64, "latency"),
            mk("kernel", 1472, "rate"),
        ];
        assert_eq!(stacks_of(&rows, 64), ["kernel", "eudp", "eudp-xdp", "eudp-latency"]);
        assert_eq!(stacks_of(&rows, 1472), ["kernel"]);
    }
}
