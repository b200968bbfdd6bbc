//! The soak's workloads, each on its own thread for the whole run, every
//! program under the shim (as `eudp run` starts it) and every receiver
//! pinned to one CPU (the one the CPU hog takes): iperf3 UDP runs one
//! after another, sockperf ping-pong, dnsmasq queried by a loop, and a
//! program that forks children which each exchange a few datagrams.
//! Each returns its programs' own reports as JSON.

use super::kernel;
use super::procs::{Plan, Proc, Registry};
use crate::run::{app_command, Stack};
use crate::testbed::{Testbed, ADDR_B};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What every workload needs.
pub struct Env {
    /// One testbed per workload, by [`workload_of`] name: the kernel's
    /// per-namespace counters of each are that workload's own.
    pub beds: Vec<(&'static str, Testbed)>,
    pub lib: PathBuf,
    pub stat_dir: PathBuf,
    pub reg: Arc<Registry>,
    pub plan: Plan,
    /// The CPU the receivers are pinned to.
    pub cpu: usize,
    pub soakfork: PathBuf,
    pub dnsloop: PathBuf,
    /// The running iperf3 run's server pid and when its client stops
    /// sending (seconds of the run): the pause picks a run it ends inside.
    pub iperf3_now: std::sync::Mutex<Option<(u32, f64)>>,
}

/// The workloads, each on its own testbed; `control` runs sockperf as the
/// `sockperf` workload does, without the shim, for its RSS.
pub const WORKLOADS: &[(&str, char)] =
    &[("iperf3", 'i'), ("sockperf", 'p'), ("dns", 'd'), ("fork", 'f'), ("control", 'c')];

/// The workload a process of the run belongs to, by its name.
pub fn workload_of(name: &str) -> &'static str {
    match name.split(['-', '#']).next().unwrap_or("") {
        "iperf3" => "iperf3",
        "sockperf" => "sockperf",
        "dnsmasq" | "dns" => "dns",
        "fork" => "fork",
        "control" => "control",
        _ => "other",
    }
}

/// The ports of the workloads on host b.
pub const IPERF3_PORT: &str = "5401";
pub const SOCKPERF_PORT: &str = "11411";
pub const DNS_PORT: u16 = 5353;
pub const ECHO_PORT: &str = "5402";
/// The name the DNS workload asks for, and its address.
pub const DNS_NAME: &str = "www.soak.test";
const DNS_ADDR: &str = "198.18.0.99";

impl Env {
    /// The testbed of `workload` (the first one for a process of none).
    pub fn bed(&self, workload: &str) -> &Testbed {
        &self.beds.iter().find(|(w, _)| *w == workload).unwrap_or(&self.beds[0]).1
    }

    /// Process `name`'s `argv` in host `host` of its workload's testbed,
    /// under the shim (the control without); on b pinned to the receivers' CPU.
    fn command(&self, name: &str, host: char, argv: &[&str]) -> std::process::Command {
        let cpu = self.cpu.to_string();
        let mut full: Vec<&str> = Vec::new();
        if host == 'b' {
            full.extend(["taskset", "-c", &cpu]);
        }
        full.extend_from_slice(argv);
        let workload = workload_of(name);
        let stack = if workload == "control" { Stack::Kernel } else { Stack::Eudp("default") };
        app_command(self.bed(workload), host, stack, &self.lib, &self.stat_dir, &full)
    }

    fn spawn(&self, name: &str, host: char, argv: &[&str]) -> Result<Proc, String> {
        Proc::spawn(&self.reg, &self.plan, name, self.command(name, host, argv), true)
    }

    fn wait_udp(&self, p: &Proc, port: u16) -> Result<(), String> {
        crate::testbed::wait_udp_server(p.pid(), port, false, Duration::from_secs(10))
    }
}

/// Waits (at most 10 s) until process `pid`'s namespace has a TCP listener
/// on `port`: an iperf3 server takes its control connection there, and a
/// client that comes first fails its run.
fn wait_tcp_listen(pid: u32, port: &str) -> Result<(), String> {
    let local = format!(":{:04X}", port.parse::<u16>().unwrap_or(0));
    let t0 = std::time::Instant::now();
    loop {
        // Columns of /proc/net/tcp{,6}: sl, local_address, rem_address, st (0A: listening).
        let listening = ["tcp", "tcp6"].iter().any(|f| {
            std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let c: Vec<&str> = l.split_whitespace().take(4).collect();
                    c.len() == 4 && c[1].ends_with(&local) && c[3] == "0A"
                })
            })
        });
        if listening {
            return Ok(());
        }
        if t0.elapsed() > Duration::from_secs(10) {
            return Err(format!("process {pid} did not listen on TCP port {port} in 10 s"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The first JSON object in `out` (programs may print more after it).
fn first_json(out: &str) -> Option<Value> {
    let start = out.find('{')?;
    serde_json::Deserializer::from_str(&out[start..]).into_iter::<Value>().next()?.ok()
}

/// iperf3 `-u -b 200M` runs back to back, each at most 30 s with a new
/// one-shot server; per run the client's and the server's counts.
pub fn iperf3(env: &Env) -> Value {
    let run_secs = (env.plan.secs / 3.0).clamp(1.0, 30.0).floor() as u64;
    let mut runs = Vec::new();
    let mut n = 0;
    while env.plan.left() >= 2.0 {
        let secs = run_secs.min(env.plan.left().floor() as u64).max(1);
        n += 1;
        runs.push(iperf3_run(env, n, secs).unwrap_or_else(|e| json!({ "run": n, "error": e })));
    }
    json!({ "tool": "iperf3", "options": "-u -b 200M -l 1400", "server_env": "EUDP_GRO=0", "runs": runs })
}

fn iperf3_run(env: &Env, n: usize, secs: u64) -> Result<Value, String> {
    let start = env.plan.now();
    let before = kernel::snapshot(env.bed("iperf3"));
    // GRO off on the server (`EUDP_GRO=0`): the kernel then counts each
    // datagram it drops at the server's socket, and the balance is exact.
    let srv =
        env.spawn(&format!("iperf3-server#{n}"), 'b', &["env", "EUDP_GRO=0", "iperf3", "-s", "-1", "-p", IPERF3_PORT])?;
    wait_tcp_listen(srv.pid(), IPERF3_PORT)?;
    let t = secs.to_string();
    let cli = env.spawn(
        &format!("iperf3-client#{n}"),
        'a',
        &[
            "iperf3",
            "-c",
            ADDR_B,
            "-p",
            IPERF3_PORT,
            "-t",
            &t,
            "-u",
            "-b",
            "200M",
            "-l",
            "1400",
            "--json",
            "--get-server-output",
        ],
    )?;
    let (srv_pid, cli_pid) = (srv.pid(), cli.pid());
    *env.iperf3_now.lock().unwrap_or_else(|e| e.into_inner()) = Some((srv_pid, env.plan.now() + secs as f64));
    let out = cli.finish(Duration::from_secs(secs + 20));
    *env.iperf3_now.lock().unwrap_or_else(|e| e.into_inner()) = None;
    let _ = srv.stop(libc::SIGINT, Duration::from_secs(5));
    // Datagrams still in flight when the server closed meet a closed port
    // (NoPorts) within moments, before the next server binds.
    std::thread::sleep(Duration::from_millis(100));
    let kernel = kernel::to_json(&kernel::delta(&before, &kernel::snapshot(env.bed("iperf3"))), true);
    let v = first_json(&out?).ok_or("iperf3: no JSON")?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("iperf3: {e}"));
    }
    let end = &v["end"];
    let recv = if end["sum_received"].is_object() { &end["sum_received"] } else { &end["sum"] };
    let sent = end["sum_sent"]["packets"].as_u64().or(end["sum"]["packets"].as_u64()).unwrap_or(0);
    let (expected, lost) = (recv["packets"].as_u64().unwrap_or(0), recv["lost_packets"].as_u64().unwrap_or(0));
    // The receiver's one-second intervals: the longest run without a datagram.
    let mut longest_empty = 0.0f64;
    let mut empty = 0.0;
    for i in v["server_output_json"]["intervals"].as_array().into_iter().flatten() {
        let s = &i["sum"];
        if s["packets"].as_u64() == Some(0) {
            empty += s["seconds"].as_f64().unwrap_or(0.0);
            longest_empty = longest_empty.max(empty);
        } else {
            empty = 0.0;
        }
    }
    Ok(json!({
        "run": n, "start_s": start, "secs": secs, "client_pid": cli_pid, "server_pid": srv_pid,
        "sent": sent, "received": expected.saturating_sub(lost), "lost": lost,
        "server_expected": expected, "sent_after_the_servers_last": sent.saturating_sub(expected),
        "kernel": kernel,
        "lost_percent": recv["lost_percent"], "out_of_order": recv["out_of_order"],
        "longest_empty_interval_ms": longest_empty * 1000.0,
    }))
}

/// sockperf ping-pong at 1000 messages/s for the whole run.
pub fn sockperf(env: &Env) -> Value {
    sockperf_run(env, "").unwrap_or_else(|e| json!({ "tool": "sockperf", "error": e }))
}

/// The same sockperf pair without the shim, on its own testbed: what the
/// programs' RSS does by itself.
pub fn control(env: &Env) -> Value {
    let mut v = sockperf_run(env, "control-").unwrap_or_else(|e| json!({ "tool": "sockperf", "error": e }));
    v["stack"] = "kernel (no shim)".into();
    v
}

fn parse_after(s: &str, key: &str) -> Option<f64> {
    let i = s.find(key)? + key.len();
    let rest = s[i..].trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

fn sockperf_run(env: &Env, prefix: &str) -> Result<Value, String> {
    let srv = env.spawn(
        &format!("{prefix}sockperf-server"),
        'b',
        &["sockperf", "server", "-i", ADDR_B, "-p", SOCKPERF_PORT],
    )?;
    env.wait_udp(&srv, SOCKPERF_PORT.parse().unwrap_or(0))?;
    let secs = env.plan.left().floor().max(1.0) as u64;
    let t = secs.to_string();
    let cli = env.spawn(
        &format!("{prefix}sockperf-client"),
        'a',
        &["sockperf", "ping-pong", "-i", ADDR_B, "-p", SOCKPERF_PORT, "-t", &t, "-m", "64", "--mps", "1000"],
    )?;
    let (srv_pid, cli_pid) = (srv.pid(), cli.pid());
    let out = cli.finish(Duration::from_secs(secs + 30));
    let srv_out = srv.stop(libc::SIGINT, Duration::from_secs(3));
    let out = out?;
    let max_us = parse_after(&out, "<MAX> observation =").ok_or_else(|| format!("sockperf: no latency: {out}"))?;
    Ok(json!({
        "tool": "sockperf", "mode": "ping-pong", "size": 64, "mps": 1000, "secs": secs,
        "client_pid": cli_pid, "server_pid": srv_pid,
        "sent": parse_after(&out, "SentMessages="), "received": parse_after(&out, "ReceivedMessages="),
        "dropped": parse_after(&out, "# dropped messages ="),
        "server_received": parse_after(&srv_out, "Total "),
        "p50_us": parse_after(&out, "percentile 50.000 ="), "p99_us": parse_after(&out, "percentile 99.000 ="),
        "max_us": max_us,
    }))
}

/// dnsmasq serving a local name on b, restarted (SIGKILL, then a new one)
/// at `restart_at` seconds, queried by a loop on a. `prefix` names the
/// processes: `control-` runs them without the shim, on the control's
/// testbed.
pub fn dns(env: &Env, restart_at: f64, prefix: &str) -> Value {
    let mut v = dns_run(env, restart_at, prefix).unwrap_or_else(|e| json!({ "error": e }));
    v["tool"] = "dnsmasq + query loop".into();
    stack_of(&mut v, prefix);
    v
}

/// Marks a control's result as run without the shim.
fn stack_of(v: &mut Value, prefix: &str) {
    if workload_of(prefix) == "control" {
        v["stack"] = "kernel (no shim)".into();
    }
}

fn dnsmasq(env: &Env, n: usize, prefix: &str) -> Result<Proc, String> {
    let port = DNS_PORT.to_string();
    let record = format!("--address=/soak.test/{DNS_ADDR}");
    let p = env.spawn(
        &format!("{prefix}dnsmasq#{n}"),
        'b',
        &[
            "dnsmasq",
            "-k",
            "-C",
            "/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--user=root",
            "--pid-file=",
            "--bind-interfaces",
            "--listen-address",
            ADDR_B,
            "-p",
            &port,
            &record,
        ],
    )?;
    env.wait_udp(&p, DNS_PORT)?;
    Ok(p)
}

fn dns_run(env: &Env, restart_at: f64, prefix: &str) -> Result<Value, String> {
    let mut server = dnsmasq(env, 1, prefix)?;
    let mut pids = vec![server.pid()];
    let secs = format!("{:.1}", env.plan.left().max(1.0));
    let script = env.dnsloop.display().to_string();
    let port = DNS_PORT.to_string();
    let client = env.spawn(
        &format!("{prefix}dns-client"),
        'a',
        &["/usr/bin/python3", &script, ADDR_B, &port, DNS_NAME, &secs, "20", "500"],
    )?;
    let client_at = client.at;
    let mut restart = Value::Null;
    if env.plan.sleep_until(restart_at) {
        let t = env.plan.now();
        let _ = server.stop(libc::SIGKILL, Duration::from_secs(2));
        server = dnsmasq(env, 2, prefix)?;
        pids.push(server.pid());
        restart = json!({ "fault": "peer restart", "target": "dnsmasq", "at_s": t, "for_s": env.plan.now() - t });
    }
    let client_pid = client.pid();
    let out = client.finish(Duration::from_secs_f64(env.plan.left() + 20.0));
    // SIGTERM: dnsmasq exits through exit(), and the shim writes its final report.
    let _ = server.stop(libc::SIGTERM, Duration::from_secs(3));
    let mut v = first_json(&out?).ok_or("dns client: no JSON")?;
    v["client_start_s"] = client_at.into();
    v["client_pid"] = client_pid.into();
    v["server_pids"] = pids.into();
    v["restart"] = restart;
    Ok(v)
}

/// The fork-heavy program on a against an echo server on b (`prefix` as
/// for [`dns`]).
pub fn fork(env: &Env, prefix: &str) -> Value {
    let mut v = fork_run(env, prefix).unwrap_or_else(|e| json!({ "error": e }));
    v["tool"] = "soakfork".into();
    stack_of(&mut v, prefix);
    v
}

fn fork_run(env: &Env, prefix: &str) -> Result<Value, String> {
    let prog = env.soakfork.display().to_string();
    let echo = env.spawn(&format!("{prefix}fork-echo"), 'b', &[&prog, "echo", ECHO_PORT])?;
    env.wait_udp(&echo, ECHO_PORT.parse().unwrap_or(0))?;
    let secs = format!("{:.1}", env.plan.left().max(1.0));
    let client = env.spawn(&format!("{prefix}fork-client"), 'a', &[&prog, "client", ADDR_B, ECHO_PORT, &secs, "50"])?;
    let (client_at, client_pid, echo_pid) = (client.at, client.pid(), echo.pid());
    let out = client.finish(Duration::from_secs_f64(env.plan.left() + 20.0));
    let echo_out = echo.stop(libc::SIGTERM, Duration::from_secs(3));
    let mut v = first_json(&out?).ok_or("fork client: no JSON")?;
    v["client_start_s"] = client_at.into();
    v["client_pid"] = client_pid.into();
    v["echo_pid"] = echo_pid.into();
    v["echo"] = first_json(&echo_out).unwrap_or(Value::Null);
    Ok(v)
}

/// A busy loop on the receivers' CPU for `secs` (not under the shim).
pub fn cpu_hog(env: &Env, secs: f64) -> Result<(), String> {
    let cpu = env.cpu.to_string();
    let mut c = env.bed("iperf3").command('b', "taskset");
    c.args(["-c", &cpu, "sh", "-c", "while :; do :; done"]);
    let hog = Proc::spawn(&env.reg, &env.plan, "cpu-hog", c, false)?;
    env.plan.sleep_until(env.plan.now() + secs);
    drop(hog);
    Ok(())
}
