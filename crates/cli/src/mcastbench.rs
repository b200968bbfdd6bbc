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
}

/// One receiver's result.
#[derive(Debug, Clone, Serialize)]
pub struct Receiver {
    pub groups: Vec<usize>,
    /// What `mcastfan recv` printed.
    pub report: Value,
    /// Its shim's per-socket counters (eudp stacks).
    pub eudp: Option<Value>,
    /// Its shim's process report fields `accelerated`, `fallbacks`, `multicast_kernel`.
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

/// Runs one fan-out of `plan` on `stack` over `tb`.
pub fn fanout(tb: &Testbed, stack: Stack, lib: &Path, plan: Plan) -> Result<FanRun, String> {
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
    let mut children = Vec::new();
    let mut outs = Vec::new();
    let mut stat_dirs = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let sd = dir(&format!("r{i}"));
        let mut argv: Vec<String> =
            vec![exe.clone(), "recv".into(), fam.into(), tb.veth('b'), port.clone(), "1500".into()];
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
    let sd = dir("s");
    let mut argv: Vec<String> = vec![
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
        let mut line = String::new();
        let _ = out.read_line(&mut line);
        while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let st = child.wait().map_err(|e| e.to_string())?;
        let report: Value =
            serde_json::from_str(line.trim()).map_err(|e| format!("receiver {i} ({st}): {e}: {line}"))?;
        let (process, eudp) = shim_report(&stat_dirs[i]);
        receivers.push(Receiver { groups: members[i].clone(), report, eudp, process });
    }
    let (sender_process, sender_eudp) = shim_report(&sd);
    let _ = std::fs::remove_dir_all(&base);
    Ok(FanRun { stack: stack.name(), size: plan.size, v6: plan.v6, sender, sender_eudp, sender_process, receivers })
}

/// The sender's address on the testbed (for reports).
pub fn sender_addr(v6: bool) -> &'static str {
    if v6 {
        ADDR6_A
    } else {
        ADDR_A
    }
}
