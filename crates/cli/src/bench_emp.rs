//! `eudp bench --emp`: EMP beside its baselines in one invocation.
//!
//! Rows: kernel UDP ping-pong, kernel TCP stream and ping-pong
//! (`eudp worker kbase`), libfabric's `fi_pingpong` over `udp;ofi_rxd`, and
//! per scheme EMP ping-pong, stream and bidirectional (`eudp worker emp`),
//! all on the plain two-host testbed; then the EMP stream on the impairment
//! topology without and with 1% loss (nftables in host b). Every program
//! runs under the RSS wrapper, so each row carries both sides' peak RSS.
//! A side that fails makes its row an error with its stderr; nothing is
//! hidden or retried. Targets and the best scheme per measure are in
//! [`crate::bench_emp_targets`]; the JSON schema is in docs/bench.md.

use crate::bench_emp_targets::{best_schemes, targets, LARGE, SMALL};
use crate::impair::{nft_clear, nft_loss, ImpairBed, IMP_A, IMP_B};
use crate::rss;
use crate::testbed::{unique_name, Testbed, ADDR_A, ADDR_B};
use serde_json::{json, Value};
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// What `eudp bench --emp` runs.
pub struct EmpBenchArgs {
    /// Seconds per row.
    pub secs: f64,
    /// EMP schemes (`base`, `so`, `ro`, `dsr`, `sr`).
    pub schemes: Vec<String>,
    pub out_dir: Option<PathBuf>,
    /// The eudp executable the workers run.
    pub program: String,
}

/// Loss of the lossy row, percent.
pub const LOSS_PCT: u32 = 1;

/// The namespaces of a client (host a) and a server (host b).
struct Hosts {
    client_ns: String,
    server_ns: String,
    client_ip: &'static str,
    server_ip: &'static str,
    topology: &'static str,
}

/// How to tell that a server is ready to be talked to.
#[derive(Clone, Copy)]
enum Ready {
    Udp(u16),
    TcpListen(u16),
}

/// One side's end: exit status, stdout, stderr, usage.
struct Ended {
    status: Option<ExitStatus>,
    out: String,
    err: String,
    usage: Option<rss::Usage>,
}

/// The last JSON object line of a worker's output.
fn last_json(out: &str) -> Option<Value> {
    out.lines().rev().find_map(|l| serde_json::from_str::<Value>(l.trim()).ok().filter(Value::is_object))
}

impl Ended {
    fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
    fn why(&self, side: &str) -> String {
        let st = match self.status {
            Some(s) => s.to_string(),
            None => "killed after its time limit".into(),
        };
        format!("{side}: {st}: {}", self.err.trim())
    }
}

fn spawn(ns: &str, argv: &[String], tag: &str) -> Result<(Child, PathBuf), String> {
    let w = rss::wrapper()?;
    let out = rss::report_path(tag);
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(&w);
    let args: Vec<&str> = argv.iter().map(String::as_str).collect();
    rss::wrap_args(&mut c, &out, None, &[], &args);
    let child = c
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    Ok((child, out))
}

/// Waits at most `limit` for `child`, interrupting then killing it after;
/// collects its output.
fn finish(mut child: Child, usage: PathBuf, limit: Duration) -> Ended {
    let readers: Vec<_> = [
        child.stdout.take().map(|o| Box::new(o) as Box<dyn Read + Send>),
        child.stderr.take().map(|e| Box::new(e) as Box<dyn Read + Send>),
    ]
    .into_iter()
    .map(|r| {
        std::thread::spawn(move || {
            let mut s = String::new();
            if let Some(mut r) = r {
                let _ = r.read_to_string(&mut s);
            }
            s
        })
    })
    .collect();
    let t0 = Instant::now();
    let mut status = None;
    let mut interrupted = false;
    loop {
        if let Ok(Some(s)) = child.try_wait() {
            status = Some(s).filter(|_| !interrupted);
            break;
        }
        if t0.elapsed() > limit && !interrupted {
            crate::sys::interrupt(&child);
            interrupted = true;
        }
        if t0.elapsed() > limit + Duration::from_secs(2) {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut texts = readers.into_iter().map(|h| h.join().unwrap_or_default());
    let (out, err) = (texts.next().unwrap_or_default(), texts.next().unwrap_or_default());
    Ended { status, out, err, usage: rss::take_usage(&usage) }
}

/// Whether namespace of process `pid` has UDP port `port` bound, or TCP
/// port `port` listening.
fn port_ready(pid: u32, ready: Ready) -> bool {
    let (proto, port, state) = match ready {
        Ready::Udp(p) => ("udp", p, None),
        Ready::TcpListen(p) => ("tcp", p, Some("0A")),
    };
    let local = format!(":{port:04X}");
    [proto.to_string(), format!("{proto}6")].iter().any(|p| {
        std::fs::read_to_string(format!("/proc/{pid}/net/{p}")).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().take(4).collect();
                c.len() == 4 && c[1].ends_with(&local) && state.is_none_or(|s| c[3] == s)
            })
        })
    })
}

/// Runs a server in host b and a client in host a; returns the row's
/// fields: the client's JSON (`result`), the server's (`server`), both
/// peak RSS figures, or `error`. `parse` reads a side's stdout.
fn pair(
    h: &Hosts,
    server: &[String],
    client: &[String],
    ready: Ready,
    secs: f64,
    parse: &dyn Fn(&str) -> Option<Value>,
) -> Value {
    let mut row = json!({ "topology": h.topology });
    let (mut srv, srv_usage) = match spawn(&h.server_ns, server, "srv") {
        Ok(s) => s,
        Err(e) => {
            row["error"] = json!(format!("server: {e}"));
            return row;
        }
    };
    let t0 = Instant::now();
    while !port_ready(srv.id(), ready) {
        let exited = matches!(srv.try_wait(), Ok(Some(_)));
        if exited || t0.elapsed() > Duration::from_secs(10) {
            let e = finish(srv, srv_usage, Duration::ZERO);
            row["error"] = json!(e.why("server did not get ready"));
            return row;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = match spawn(&h.client_ns, client, "cli") {
        Ok((c, u)) => finish(c, u, Duration::from_secs_f64(secs + 30.0)),
        Err(e) => {
            crate::sys::interrupt(&srv);
            let _ = srv.kill();
            let _ = srv.wait();
            row["error"] = json!(format!("client: {e}"));
            return row;
        }
    };
    let s = finish(srv, srv_usage, Duration::from_secs(8));
    row["client_peak_rss_kib"] = json!(c.usage.as_ref().map(|u| u.max_rss_kib));
    row["server_peak_rss_kib"] = json!(s.usage.as_ref().map(|u| u.max_rss_kib));
    let result = parse(&c.out);
    row["server"] = json!(parse(&s.out));
    if !c.ok() || result.is_none() {
        row["error"] = json!(c.why("client"));
    } else if !s.ok() {
        row["error"] = json!(s.why("server"));
    }
    row["result"] = json!(result);
    row
}

fn words(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn kbase(a: &EmpBenchArgs, h: &Hosts, proto: &str, pattern: &str, size: usize, port: u16) -> Value {
    let side = |role: &str, local: String| {
        let mut w = words(&[&a.program, "worker", "kbase", "--proto", proto, "--role", role, "--local", &local]);
        w.extend(words(&["--pattern", pattern, "--size", &size.to_string(), "--secs", &a.secs.to_string()]));
        if role == "client" {
            w.extend(words(&["--peer", &format!("{}:{port}", h.server_ip)]));
        }
        w
    };
    let ready = if proto == "udp" { Ready::Udp(port) } else { Ready::TcpListen(port) };
    let server = side("server", format!("{}:{port}", h.server_ip));
    let client = side("client", format!("{}:0", h.client_ip));
    let mut row = pair(h, &server, &client, ready, a.secs, &last_json);
    row["stack"] = json!(format!("kernel-{proto}"));
    row["pattern"] = json!(pattern);
    row["size"] = json!(size);
    row
}

fn emp(a: &EmpBenchArgs, h: &Hosts, scheme: &str, pattern: &str, size: usize, port: u16) -> Value {
    let side = |role: &str, local: &str, peer: &str| {
        let mut w = words(&[&a.program, "worker", "emp", "--role", role, "--local", local, "--peer", peer]);
        w.extend(words(&["--pattern", pattern, "--size", &size.to_string(), "--secs", &a.secs.to_string()]));
        w.extend(words(&["--scheme", scheme]));
        w
    };
    let (sa, ca) = (format!("{}:{port}", h.server_ip), format!("{}:{port}", h.client_ip));
    let mut row = pair(h, &side("server", &sa, &ca), &side("client", &ca, &sa), Ready::Udp(port), a.secs, &last_json);
    row["stack"] = json!("emp");
    row["scheme"] = json!(scheme);
    row["pattern"] = json!(pattern);
    row["size"] = json!(size);
    row
}

/// System calls per message of a 10 B ping-pong, kernel UDP beside EMP's
/// base scheme: each side runs under `strace -f -c` (every thread), and its
/// call total is divided by the client's messages (start-up included, a few
/// hundred calls). Under strace each call is slower, so these rows' own
/// latencies are not the bench's.
fn syscall_rows(a: &EmpBenchArgs, h: &Hosts, port: u16) -> Vec<Value> {
    let secs = a.secs.min(2.0).to_string();
    let dir = std::env::temp_dir().join(format!("eudp-emp-strace-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&dir) {
        return vec![json!({ "topology": h.topology, "pattern": "pingpong", "error": e.to_string() })];
    }
    let traced = |side: &str, stack: &str, argv: Vec<String>| {
        let out = dir.join(format!("{stack}-{side}"));
        let mut w = words(&["strace", "-f", "-c", "-o", &out.to_string_lossy()]);
        w.extend(argv);
        (w, out)
    };
    let mut rows = Vec::new();
    for (i, stack) in ["kernel-udp", "emp"].into_iter().enumerate() {
        let port = port + i as u16;
        let (sa, ca) = (format!("{}:{port}", h.server_ip), format!("{}:{port}", h.client_ip));
        let worker = |role: &str, local: &str, peer: &str| {
            let mut w = if stack == "emp" {
                words(&[&a.program, "worker", "emp", "--role", role, "--local", local, "--peer", peer])
            } else {
                words(&[&a.program, "worker", "kbase", "--proto", "udp", "--role", role, "--local", local])
            };
            if stack != "emp" && role == "client" {
                w.extend(words(&["--peer", peer]));
            }
            w.extend(words(&["--pattern", "pingpong", "--size", &SMALL.to_string(), "--secs", &secs]));
            w
        };
        let (server, srv_out) = traced("server", stack, worker("server", &sa, &ca));
        let client_local = if stack == "emp" { ca.clone() } else { format!("{}:0", h.client_ip) };
        let (client, cli_out) = traced("client", stack, worker("client", &client_local, &sa));
        let mut row = pair(h, &server, &client, Ready::Udp(port), a.secs.min(2.0), &last_json);
        let messages = row["result"]["messages"].as_u64().filter(|&m| m > 0);
        for (side, out) in [("client", &cli_out), ("server", &srv_out)] {
            let calls = std::fs::read_to_string(out).ok().as_deref().and_then(strace_calls);
            row[format!("{side}_syscalls")] = json!(calls);
            row[format!("{side}_syscalls_per_message")] =
                json!(calls.zip(messages).map(|(c, m)| c["total"].as_f64().unwrap_or(0.0) / m as f64));
        }
        row["stack"] = json!(stack);
        row["scheme"] = json!((stack == "emp").then_some("base"));
        row["pattern"] = json!("pingpong");
        row["size"] = json!(SMALL);
        // Its own topology, so that the targets and the best schemes
        // never take these rows' (traced) latencies.
        row["topology"] = json!("testbed-strace");
        rows.push(row);
    }
    let _ = std::fs::remove_dir_all(&dir);
    rows
}

/// `strace -c`'s table: calls per system call and their `total`.
fn strace_calls(text: &str) -> Option<Value> {
    let mut calls = serde_json::Map::new();
    for l in text.lines() {
        let c: Vec<&str> = l.split_whitespace().collect();
        // "% time, seconds, usecs/call, calls, [errors,] name"
        if c.len() >= 5 && c[0].parse::<f64>().is_ok() {
            if let (Ok(n), Some(name)) = (c[3].parse::<u64>(), c.last()) {
                calls.insert(name.to_string(), json!(n));
            }
        }
    }
    calls.contains_key("total").then_some(Value::Object(calls))
}

/// `fi_pingpong`'s result line: `bytes #sent #ack total time MB/sec
/// usec/xfer Mxfers/sec`. Its usec/xfer is half a round trip (two
/// transfers per iteration).
pub fn parse_fi_pingpong(out: &str) -> Option<Value> {
    let mut lines = out.lines().skip_while(|l| !l.trim_start().starts_with("bytes"));
    lines.next()?;
    let c: Vec<&str> = lines.next()?.split_whitespace().collect();
    if c.len() < 8 {
        return None;
    }
    let usec: f64 = c[6].parse().ok()?;
    let mb_s: f64 = c[5].parse().ok()?;
    Some(json!({
        "line": c.join(" "), "usec_per_xfer": usec, "rtt_ns": usec * 2000.0, "mb_s": mb_s, "mbit_s": mb_s * 8.0,
    }))
}

fn fi_pingpong(a: &EmpBenchArgs, h: &Hosts, size: usize, port: u16) -> Value {
    // About `secs` of work at the round trips this host manages (under a ms).
    let iters = ((a.secs * if size > 1024 { 700.0 } else { 1400.0 }) as u64).clamp(50, 100_000).to_string();
    let common = words(&["fi_pingpong", "-p", "udp;ofi_rxd", "-e", "rdm", "-m", "tagged", "-S", &size.to_string()]);
    let mut server = common.clone();
    server.extend(words(&["-I", &iters, "-B", &port.to_string()]));
    let mut client = common;
    client.extend(words(&["-I", &iters, "-P", &port.to_string(), h.server_ip]));
    let mut row = pair(h, &server, &client, Ready::TcpListen(port), a.secs, &parse_fi_pingpong);
    row["stack"] = json!("libfabric-rxd");
    row["pattern"] = json!("pingpong");
    row["size"] = json!(size);
    row["iterations"] = json!(iters.parse::<u64>().ok());
    row
}

/// The host the numbers come from: kernel, CPUs, `EUDP_*` settings.
fn host() -> Value {
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let env: serde_json::Map<String, Value> =
        std::env::vars().filter(|(k, _)| k.starts_with("EUDP_")).map(|(k, v)| (k, json!(v))).collect();
    json!({
        "kernel": kernel.trim(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "env": env,
    })
}

/// Runs every row; returns the result and where it was written.
pub fn run(a: &EmpBenchArgs) -> Result<(Value, Option<PathBuf>), String> {
    if !crate::testbed::is_root() {
        return Err("eudp bench --emp needs root (network namespaces)".into());
    }
    let loadavg_before = crate::apps_baselines::loadavg();
    let started_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut rows = Vec::new();
    {
        let tb = Testbed::up(&unique_name("emp"))?;
        let h = Hosts {
            client_ns: tb.netns('a'),
            server_ns: tb.netns('b'),
            client_ip: ADDR_A,
            server_ip: ADDR_B,
            topology: "testbed",
        };
        rows.push(kbase(a, &h, "udp", "pingpong", SMALL, 47_100));
        rows.push(kbase(a, &h, "tcp", "stream", LARGE, 47_101));
        rows.push(kbase(a, &h, "tcp", "pingpong", SMALL, 47_102));
        rows.push(fi_pingpong(a, &h, SMALL, 47_103));
        rows.push(fi_pingpong(a, &h, LARGE, 47_104));
        for (i, s) in a.schemes.iter().enumerate() {
            let port = 47_200 + 10 * i as u16;
            rows.push(emp(a, &h, s, "pingpong", SMALL, port));
            rows.push(emp(a, &h, s, "stream", LARGE, port + 1));
            rows.push(emp(a, &h, s, "bidir", LARGE, port + 2));
        }
        rows.extend(syscall_rows(a, &h, 47_400));
    }
    let relay = {
        let mut bed = ImpairBed::up(&unique_name("emq"))?;
        bed.start_relay(&a.program, &["--secs", &(a.secs * 4.0 + 120.0).to_string()])?;
        let h = Hosts {
            client_ns: bed.netns('a'),
            server_ns: bed.netns('b'),
            client_ip: IMP_A,
            server_ip: IMP_B,
            topology: "impair",
        };
        let base = a.schemes.first().map_or("base", String::as_str);
        let mut lossless = emp(a, &h, base, "stream", LARGE, 47_300);
        lossless["loss_pct"] = json!(0);
        rows.push(lossless);
        match nft_loss(&h.server_ns, LOSS_PCT) {
            Ok(()) => {
                let mut lossy = emp(a, &h, base, "stream", LARGE, 47_301);
                lossy["loss_pct"] = json!(LOSS_PCT);
                lossy["nft_dropped"] = json!(crate::impair::nft_dropped(&h.server_ns).ok());
                rows.push(lossy);
                nft_clear(&h.server_ns);
            }
            Err(e) => rows.push(json!({ "topology": "impair", "stack": "emp", "scheme": base, "pattern": "stream",
                "size": LARGE, "loss_pct": LOSS_PCT, "error": e })),
        }
        bed.stop_relay().map(|s| json!(s)).unwrap_or_else(|e| json!({ "error": e }))
    };
    for r in rows.iter_mut() {
        r["ok"] = json!(r["error"].is_null());
    }
    let result = json!({
        "schema": "eudp-bench-emp/1",
        "kind": "emp",
        "started_unix": started_unix,
        "secs": a.secs,
        "loadavg_before": loadavg_before,
        "loadavg_after": crate::apps_baselines::loadavg(),
        "host": host(),
        "schemes": a.schemes,
        "rows": rows,
        "relay": relay,
        "targets": targets(&rows),
        "best": best_schemes(&rows),
    });
    let path = match &a.out_dir {
        Some(dir) => {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
            let p = dir.join(format!("emp-{started_unix}.json"));
            let text = serde_json::to_string_pretty(&result).map_err(|e| e.to_string())?;
            std::fs::write(&p, text + "\n").map_err(|e| format!("{}: {e}", p.display()))?;
            Some(p)
        }
        None => None,
    };
    Ok((result, path))
}
