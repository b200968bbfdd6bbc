//! The `tcp` (UDP over TCP) transport on the testbed: a worker that runs one
//! side of a transfer over the UOE, and a bench comparing it with kernel UDP
//! and eudp's kernel-UDP backend (same datagrams, same checks as
//! [`crate::worker`]).
//!
//! Workers are whatever program the caller names: `eudp worker-tcp ...`
//! once wired into `main.rs`, or a test binary re-executing itself (see
//! `crates/cli/tests/tcp_testbed.rs`). A worker reads its job from its
//! arguments (`key=value` words, see [`Job`]), prints `ready` when a
//! receiver is bound and one JSON [`Report`] line at the end.

use crate::testbed::{Testbed, ADDR_B};
use crate::worker::{self, pattern, Mode, Report};
use eudp_engine::backend::tcp::{TcpConfig, TcpTransport};
use eudp_engine::sys::clock::process_cpu_time;
use eudp_engine::{Config, Engine};
use serde::Serialize;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stacks of the tcp bench.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TcpMode {
    /// Kernel UDP, one `send`/`recv` per datagram.
    Kernel,
    /// eudp endpoint over the kernel-UDP backend.
    Eudp,
    /// eudp endpoint over the UOE (`tcp`) backend.
    Tcp,
}

impl TcpMode {
    pub fn name(self) -> &'static str {
        match self {
            TcpMode::Kernel => "kernel",
            TcpMode::Eudp => "eudp",
            TcpMode::Tcp => "tcp",
        }
    }
    fn parse(s: &str) -> Option<TcpMode> {
        Some(match s {
            "kernel" => TcpMode::Kernel,
            "eudp" => TcpMode::Eudp,
            "tcp" => TcpMode::Tcp,
            _ => return None,
        })
    }
}

/// One side of a transfer.
#[derive(Clone, Debug)]
pub struct Job {
    /// `send` or `recv`.
    pub role: String,
    pub mode: TcpMode,
    /// Receiver: bind address; sender: destination.
    pub addr: SocketAddr,
    pub size: usize,
    pub secs: f64,
    pub count: u64,
    pub pace_every: u64,
}

impl Job {
    /// The job as worker arguments.
    pub fn to_args(&self) -> Vec<String> {
        vec![
            format!("role={}", self.role),
            format!("mode={}", self.mode.name()),
            format!("addr={}", self.addr),
            format!("size={}", self.size),
            format!("secs={}", self.secs),
            format!("count={}", self.count),
            format!("pace={}", self.pace_every),
        ]
    }

    /// Parses worker arguments.
    pub fn from_args<S: AsRef<str>>(args: &[S]) -> Result<Job, String> {
        let mut j = Job {
            role: String::new(),
            mode: TcpMode::Tcp,
            addr: "0.0.0.0:0".parse().unwrap(),
            size: 1472,
            secs: 3.0,
            count: 0,
            pace_every: 0,
        };
        for a in args {
            let (k, v) = a.as_ref().split_once('=').ok_or_else(|| format!("bad worker argument {:?}", a.as_ref()))?;
            let bad = || format!("bad value for {k}: {v}");
            match k {
                "role" => j.role = v.to_string(),
                "mode" => j.mode = TcpMode::parse(v).ok_or_else(|| format!("unknown mode {v}"))?,
                "addr" => j.addr = v.parse().map_err(|_| format!("bad address {v}"))?,
                "size" => j.size = v.parse().map_err(|_| bad())?,
                "secs" => j.secs = v.parse().map_err(|_| bad())?,
                "count" => j.count = v.parse().map_err(|_| bad())?,
                "pace" => j.pace_every = v.parse().map_err(|_| bad())?,
                _ => return Err(format!("unknown worker argument {k}")),
            }
        }
        if j.role != "send" && j.role != "recv" {
            return Err("role must be send or recv".into());
        }
        if j.size > 65_507 {
            return Err("size above 65507".into());
        }
        Ok(j)
    }
}

/// Runs a worker job and prints its report line (`eudp worker-tcp`).
pub fn worker_main<S: AsRef<str>>(args: &[S]) -> i32 {
    let r = Job::from_args(args).and_then(|j| run_job(&j));
    match r {
        Ok(rep) => {
            println!("{}", serde_json::to_string(&rep).unwrap_or_default());
            let _ = std::io::stdout().flush();
            0
        }
        Err(e) => {
            eprintln!("worker: {e}");
            2
        }
    }
}

/// Runs one job; kernel and eudp modes are [`crate::worker`]'s own.
pub fn run_job(j: &Job) -> Result<Report, String> {
    match (j.mode, j.role.as_str()) {
        (TcpMode::Kernel | TcpMode::Eudp, "send") => worker::send(worker::SendArgs {
            mode: if j.mode == TcpMode::Kernel { Mode::Kernel } else { Mode::Eudp },
            dst: j.addr,
            size: j.size,
            secs: j.secs,
            count: j.count,
            pace_every: j.pace_every,
            rate_pps: 0.0,
        }),
        (TcpMode::Kernel | TcpMode::Eudp, _) => worker::recv(worker::RecvArgs {
            mode: if j.mode == TcpMode::Kernel { Mode::Kernel } else { Mode::Eudp },
            bind: j.addr,
            size: j.size,
            idle: Duration::from_secs(1),
            max: Duration::from_secs_f64(j.secs + 10.0),
            count: j.count,
        }),
        (TcpMode::Tcp, "send") => tcp_send(j),
        (TcpMode::Tcp, _) => tcp_recv(j),
    }
}

fn fill(buf: &mut [u8], seq: u64) {
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&seq.to_be_bytes()[8 - n..]);
}

fn transport() -> Result<TcpTransport, String> {
    let cfg = TcpConfig::from_env().map_err(|e| e.to_string())?;
    TcpTransport::start(cfg).map_err(|e| format!("tcp transport: {e}"))
}

fn stats_value(t: &TcpTransport, ep: &eudp_engine::Endpoint) -> serde_json::Value {
    serde_json::json!({ "endpoint": ep.stats(), "tcp": t.stats(), "queued_bytes": t.queued_bytes(), "threads": thread_stats() })
}

/// Per thread of this process, from `/proc/self/task`: name, CPU seconds
/// (user + system) and context switches (voluntary ones are sleeps, so
/// wake-ups; involuntary ones are preemptions). Shows where the CPU goes
/// and how often each stage of the pipeline sleeps.
pub fn thread_stats() -> Vec<serde_json::Value> {
    let tick = 100.0; // USER_HZ
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else { return Vec::new() };
    let mut v = Vec::new();
    for e in dir.flatten() {
        let p = e.path();
        let comm = std::fs::read_to_string(p.join("comm")).unwrap_or_default().trim().to_string();
        let stat = std::fs::read_to_string(p.join("stat")).unwrap_or_default();
        // Fields after the parenthesised name: state is field 3, utime 14, stime 15.
        let f: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        let ticks = |i: usize| f.get(i - 3).and_then(|x| x.parse::<f64>().ok()).unwrap_or(0.0);
        let status = std::fs::read_to_string(p.join("status")).unwrap_or_default();
        let field = |k: &str| {
            status.lines().find_map(|l| l.strip_prefix(k)).and_then(|x| x.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        v.push(serde_json::json!({
            "name": comm,
            "cpu_secs": (ticks(14) + ticks(15)) / tick,
            "voluntary_switches": field("voluntary_ctxt_switches:"),
            "involuntary_switches": field("nonvoluntary_ctxt_switches:"),
        }));
    }
    v
}

fn tcp_send(j: &Job) -> Result<Report, String> {
    let e = |x: std::io::Error| format!("send: {x}");
    let t = transport()?;
    let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
    let ep = t.endpoint(&engine, j.addr.is_ipv6()).map_err(e)?;
    ep.connect(j.addr).map_err(e)?;
    let _ = ep.set_send_buffer_size(4 << 20);
    let mut buf = pattern(j.size.max(8))[..j.size].to_vec();
    let deadline = Duration::from_secs_f64(j.secs);
    let count = if j.count == 0 { u64::MAX } else { j.count };
    let cpu0 = process_cpu_time();
    let t0 = Instant::now();
    let (mut seq, mut bytes) = (0u64, 0u64);
    while seq < count && (seq & 63 != 0 || t0.elapsed() < deadline) {
        fill(&mut buf, seq);
        match ep.send(&buf) {
            Ok(n) => bytes += n as u64,
            Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(x) => return Err(e(x)),
        }
        seq += 1;
        if j.pace_every > 0 && seq % j.pace_every == 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    ep.flush(Duration::from_secs(5));
    // What waits in the UOE queues still belongs to this transfer.
    let t1 = Instant::now();
    while t.queued_bytes() > 0 && t1.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    let cpu = (process_cpu_time() - cpu0).as_secs_f64();
    let stats = stats_value(&t, &ep);
    // Let the kernel deliver what sits in the socket buffer before exiting.
    std::thread::sleep(Duration::from_millis(300));
    Ok(Report {
        datagrams: seq,
        bytes,
        secs,
        cpu_secs: cpu,
        max_rss_kib: worker::max_rss_kib(),
        eudp: Some(stats),
        ..Report::default()
    })
}

fn tcp_recv(j: &Job) -> Result<Report, String> {
    let e = |x: std::io::Error| format!("recv: {x}");
    let t = transport()?;
    let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
    let ep = t.endpoint(&engine, j.addr.is_ipv6()).map_err(e)?;
    let _ = ep.set_recv_buffer_size(4 << 20);
    ep.bind_to(j.addr).map_err(e)?;
    ep.set_read_timeout(Some(Duration::from_millis(50)));
    println!("ready");
    let _ = std::io::stdout().flush();
    let pat = pattern(j.size.max(8));
    let count = if j.count == 0 { u64::MAX } else { j.count };
    let max = Duration::from_secs_f64(j.secs + 10.0);
    let idle = Duration::from_secs(1);
    let start = Instant::now();
    let cpu0 = process_cpu_time();
    let mut r = Report::default();
    let (mut first, mut last, mut next_seq) = (None::<Instant>, Instant::now(), 0u64);
    let mut buf = vec![0u8; 65_536];
    let mut i = 0u32;
    while r.datagrams < count {
        i = i.wrapping_add(1);
        match ep.recv(&mut buf) {
            Ok(n) => {
                if first.is_none() || r.datagrams % 32 == 0 {
                    let now = Instant::now();
                    first.get_or_insert(now);
                    last = now;
                }
                let d = &buf[..n];
                r.datagrams += 1;
                r.bytes += n as u64;
                let mut sb = [0u8; 8];
                let k = n.min(8);
                sb[8 - k..].copy_from_slice(&d[..k]);
                let seq = u64::from_be_bytes(sb);
                if n != j.size || n > 8 && d[8..] != pat[8..j.size] {
                    r.corrupt += 1;
                }
                if seq < next_seq {
                    r.reordered += 1;
                } else {
                    next_seq = seq + 1;
                }
                r.seq_span = r.seq_span.max(seq + 1);
            }
            Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => i = 0,
            Err(x) => return Err(e(x)),
        }
        if i.is_multiple_of(32) && (start.elapsed() > max || first.is_some_and(|_| last.elapsed() > idle)) {
            break;
        }
    }
    r.secs = first.map(|f| (last - f).as_secs_f64()).unwrap_or(0.0);
    r.cpu_secs = (process_cpu_time() - cpu0).as_secs_f64();
    r.max_rss_kib = worker::max_rss_kib();
    r.eudp = Some(stats_value(&t, &ep));
    Ok(r)
}

/// How to start a worker: program and leading arguments; the job's
/// arguments follow. Extra environment is passed through `ip netns exec`.
#[derive(Clone, Debug)]
pub struct WorkerCmd {
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// Starts a worker; with `rss_out`, under the RSS wrapper ([`crate::rss`]),
/// which writes the worker's peak RSS there.
fn spawn(tb: &Testbed, host: char, w: &WorkerCmd, j: &Job, rss_out: Option<&std::path::Path>) -> Result<Child, String> {
    let wrapper = rss_out
        .and_then(|o| crate::rss::wrapper().map_err(|e| eprintln!("bench: no peak RSS: {e}")).ok().map(|x| (x, o)));
    let mut c: Command = match &wrapper {
        Some((x, o)) => {
            let mut c = tb.command(host, &x.display().to_string());
            crate::rss::wrap_args(&mut c, o, None, &[], &[&w.program]);
            c
        }
        None => tb.command(host, &w.program),
    };
    c.args(&w.args).args(j.to_args()).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in &w.env {
        c.env(k, v);
    }
    c.spawn().map_err(|e| format!("cannot start worker: {e}"))
}

fn wait_report(mut child: Child, mut out: impl Read, what: &str, timeout: Duration) -> Result<Report, String> {
    let t0 = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none() {
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut s = String::new();
    let _ = out.read_to_string(&mut s);
    let line = s.lines().rev().find(|l| l.starts_with('{')).map(str::to_string);
    match line {
        Some(l) => serde_json::from_str(&l).map_err(|e| format!("{what}: bad report: {e}")),
        None => {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            Err(format!("{what} failed: {}", err.trim()))
        }
    }
}

/// One transfer from host a to host b; returns (sender, receiver).
pub fn transfer(
    tb: &Testbed,
    w: &WorkerCmd,
    mode: TcpMode,
    size: usize,
    secs: f64,
    count: u64,
    pace_every: u64,
) -> Result<(Report, Report), String> {
    transfer_measured(tb, w, mode, size, secs, count, pace_every).map(|(s, r, ..)| (s, r))
}

/// As [`transfer`], with each worker under the RSS wrapper; also returns
/// the sender's and receiver's peak RSS (KiB) as the wrapper saw it
/// (`None` without a C compiler or when a worker was killed).
#[allow(clippy::type_complexity)]
pub fn transfer_measured(
    tb: &Testbed,
    w: &WorkerCmd,
    mode: TcpMode,
    size: usize,
    secs: f64,
    count: u64,
    pace_every: u64,
) -> Result<(Report, Report, Option<u64>, Option<u64>), String> {
    let (tx_rss, rx_rss) = (crate::rss::report_path("tcp-sender"), crate::rss::report_path("tcp-receiver"));
    let r = transfer_with(tb, w, mode, size, secs, count, pace_every, &tx_rss, &rx_rss);
    let peak = |p: &std::path::Path| crate::rss::take_usage(p).map(|u| u.max_rss_kib);
    let (t, x) = (peak(&tx_rss), peak(&rx_rss));
    r.map(|(s, r)| (s, r, t, x))
}

#[allow(clippy::too_many_arguments)]
fn transfer_with(
    tb: &Testbed,
    w: &WorkerCmd,
    mode: TcpMode,
    size: usize,
    secs: f64,
    count: u64,
    pace_every: u64,
    tx_rss: &std::path::Path,
    rx_rss: &std::path::Path,
) -> Result<(Report, Report), String> {
    let port = 9400 + (size % 500) as u16;
    let rj = Job {
        role: "recv".into(),
        mode,
        addr: format!("0.0.0.0:{port}").parse().unwrap(),
        size,
        secs,
        count,
        pace_every,
    };
    let mut rx = spawn(tb, 'b', w, &rj, Some(rx_rss))?;
    let mut reader = BufReader::new(rx.stdout.take().ok_or("receiver has no stdout")?);
    // Skip whatever the worker program prints before `ready` (a test harness banner).
    let t0 = Instant::now();
    loop {
        let mut line = String::new();
        let n = reader.read_line(&mut line).map_err(|e| format!("receiver: {e}"))?;
        if line.trim() == "ready" {
            break;
        }
        if n == 0 || t0.elapsed() > Duration::from_secs(30) {
            let _ = rx.kill();
            let _ = rx.wait();
            let mut err = String::new();
            if let Some(mut e) = rx.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("receiver did not start: {}", err.trim()));
        }
    }
    let sj = Job { role: "send".into(), addr: format!("{ADDR_B}:{port}").parse().unwrap(), ..rj };
    let mut tx = spawn(tb, 'a', w, &sj, Some(tx_rss))?;
    let tx_out = tx.stdout.take().ok_or("sender has no stdout")?;
    let s = wait_report(tx, tx_out, "sender", Duration::from_secs_f64(secs + 40.0));
    let r = wait_report(rx, reader, "receiver", Duration::from_secs_f64(secs + 40.0));
    Ok((s?, r?))
}

/// One measured row.
#[derive(Debug, Clone, Serialize)]
pub struct TcpRow {
    pub mode: TcpMode,
    pub size: usize,
    /// Received payload throughput, Gbit/s (receiver's first-to-last window).
    pub rx_gbps: f64,
    pub rx_mpps: f64,
    pub loss: f64,
    /// Process CPU (all threads) per datagram, microseconds.
    pub tx_cpu_us_per_dgram: f64,
    pub rx_cpu_us_per_dgram: f64,
    pub corrupt: u64,
    pub reordered: u64,
    /// Peak RSS of the sender and receiver processes, KiB, from `wait4`
    /// under the RSS wrapper (null when not measured). `sender.max_rss_kib`
    /// is the worker's own VmHWM read before its report.
    pub tx_peak_rss_kib: Option<u64>,
    pub rx_peak_rss_kib: Option<u64>,
    pub sender: Report,
    pub receiver: Report,
}

/// A bench run's result (written as JSON).
#[derive(Debug, Clone, Serialize)]
pub struct TcpBench {
    pub kind: &'static str,
    pub unix_time: u64,
    pub size: usize,
    pub secs: f64,
    pub repeats: usize,
    pub rows: Vec<TcpRow>,
    /// tcp rx throughput / kernel rx throughput (medians), and the target.
    pub tcp_over_kernel: f64,
    pub tcp_over_eudp: f64,
    pub target: &'static str,
    pub target_met: bool,
    pub env: Vec<(String, String)>,
    /// Unmodified programs (see [`apps`]): iperf3 and sockperf ping-pong
    /// rows, interleaved, with their own ratios; null when skipped
    /// (`TCP_BENCH_APPS=0`) or when the preload library is missing.
    pub apps: serde_json::Value,
    /// /proc/loadavg before and after: other work on the machine skews
    /// every row (all stacks share the same cores).
    pub loadavg_before: String,
    pub loadavg_after: String,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").map(|s| s.trim().to_string()).unwrap_or_default()
}

pub fn row(mode: TcpMode, size: usize, s: Report, r: Report) -> TcpRow {
    let m = crate::bench::Rates::of(&s, &r);
    TcpRow {
        mode,
        size,
        rx_gbps: m.gbps,
        rx_mpps: m.mpps,
        loss: m.loss,
        tx_cpu_us_per_dgram: m.tx_cpu_per_m,
        rx_cpu_us_per_dgram: m.rx_cpu_per_m,
        corrupt: r.corrupt,
        reordered: r.reordered,
        tx_peak_rss_kib: None,
        rx_peak_rss_kib: None,
        sender: s,
        receiver: r,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    v[v.len() / 2]
}

/// Runs every mode `repeats` times (interleaved), unpaced, and writes
/// `tcp-<unix time>.json` under `out_dir`.
pub fn bench(
    tb: &Testbed,
    w: &WorkerCmd,
    size: usize,
    secs: f64,
    repeats: usize,
    out_dir: &str,
) -> Result<(TcpBench, String), String> {
    let loadavg_before = loadavg();
    let mut rows = Vec::new();
    // TCP_BENCH_MODES=tcp (comma list) runs a subset, e.g. under a profiler.
    let only = std::env::var("TCP_BENCH_MODES").unwrap_or_default();
    let modes: Vec<TcpMode> = [TcpMode::Kernel, TcpMode::Eudp, TcpMode::Tcp]
        .into_iter()
        .filter(|m| only.is_empty() || only.split(',').any(|w| w.trim() == m.name()))
        .collect();
    for _ in 0..repeats.max(1) {
        for &mode in &modes {
            let (s, r, tx_rss, rx_rss) = transfer_measured(tb, w, mode, size, secs, 0, 0)?;
            rows.push(TcpRow { tx_peak_rss_kib: tx_rss, rx_peak_rss_kib: rx_rss, ..row(mode, size, s, r) });
        }
    }
    let apps = if std::env::var("TCP_BENCH_APPS").is_ok_and(|v| v == "0") || !only.is_empty() {
        serde_json::Value::Null
    } else {
        apps(tb, (secs.ceil() as u32).max(1), repeats.max(1)).unwrap_or_else(|e| serde_json::json!({ "error": e }))
    };
    let med = |m: TcpMode| median(rows.iter().filter(|r| r.mode == m).map(|r| r.rx_gbps).collect());
    let (k, e, t) = (med(TcpMode::Kernel), med(TcpMode::Eudp), med(TcpMode::Tcp));
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    let unix_time =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let res = TcpBench {
        kind: "tcp-transport",
        unix_time,
        size,
        secs,
        repeats: repeats.max(1),
        rows,
        tcp_over_kernel: ratio(t, k),
        tcp_over_eudp: ratio(t, e),
        target: ">= 3x kernel UDP received throughput (issue 7, iperf3 1472 B; here the library-level transfer)",
        target_met: ratio(t, k) >= 3.0,
        env: w.env.clone(),
        apps,
        loadavg_before,
        loadavg_after: loadavg(),
    };
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{out_dir}: {e}"))?;
    let path = format!("{out_dir}/tcp-{unix_time}.json");
    std::fs::write(&path, serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?)
        .map_err(|e| format!("{path}: {e}"))?;
    let value = serde_json::to_value(&res).map_err(|e| e.to_string())?;
    crate::bench_chart::write_beside(std::path::Path::new(&path), &value)?;
    Ok((res, path))
}

/// The stacks of the application rows: kernel UDP, eudp over kernel UDP,
/// eudp over the UOE (`eudp run --transport tcp`, default profile).
const APP_STACKS: [(&str, Option<&str>); 3] = [("kernel", None), ("eudp", Some("kernel")), ("tcp", Some("tcp"))];

/// The ceiling row of the iperf3 rounds: the same iperf3 in TCP mode on
/// kernel sockets, so each round shows how much of the host's own TCP the
/// transport delivers, and how far above kernel UDP that TCP lies.
const KERNEL_TCP: &str = "kernel-tcp";

/// Runs `f` with `EUDP_TRANSPORT` set for the programs it starts (they
/// inherit this process's environment through `ip netns exec`); the
/// bench's own thread is the only one reading the environment here.
fn with_transport<R>(t: Option<&str>, f: impl FnOnce() -> R) -> R {
    let old = std::env::var_os("EUDP_TRANSPORT");
    match t {
        Some(t) => std::env::set_var("EUDP_TRANSPORT", t),
        None => std::env::remove_var("EUDP_TRANSPORT"),
    }
    let r = f();
    match old {
        Some(v) => std::env::set_var("EUDP_TRANSPORT", v),
        None => std::env::remove_var("EUDP_TRANSPORT"),
    }
    r
}

/// Sums the UOE counters that the programs of one run left in `dir`
/// (`<pid>.tcp.json`, written by the process-wide transport) and removes
/// every report, so the next run starts empty.
fn take_tcp_counters(dir: &std::path::Path) -> serde_json::Value {
    let mut sum = serde_json::Map::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("").to_string();
        let v: serde_json::Value =
            std::fs::read_to_string(&p).ok().and_then(|s| serde_json::from_str(&s).ok()).unwrap_or_default();
        let mut add = |k: &str, x: u64| {
            let prev = sum.get(k).and_then(|y| y.as_u64()).unwrap_or(0);
            sum.insert(k.to_string(), (prev + x).into());
        };
        if name.ends_with(".tcp.json") {
            for (k, x) in v["tcp"].as_object().into_iter().flatten() {
                add(k, x.as_u64().unwrap_or(0));
            }
        } else {
            // The shim's report: drops at the endpoints' rings (the engine
            // reading for an application that is not receiving).
            for x in v["sockets"].as_array().into_iter().chain(v["closed"].as_array()).flatten() {
                add("endpoint_drop_ring_full", x["stats"]["drop_ring_full"].as_u64().unwrap_or(0));
            }
        }
        if name.ends_with(".json") {
            let _ = std::fs::remove_file(&p);
        }
    }
    serde_json::Value::Object(sum)
}

fn median_key(rows: &[serde_json::Value], tool: &str, window: &str, stack: &str, key: &str) -> Option<f64> {
    let v: Vec<f64> = rows
        .iter()
        .filter(|r| r["tool"] == tool && r["window"] == window && r["bench_stack"] == stack)
        .filter_map(|r| r[key].as_f64())
        .collect();
    (!v.is_empty()).then(|| median(v))
}

/// iperf3 socket buffers of the application rows: the program's default
/// (212 992 B, where kernel UDP's receiver loses much of what it is sent)
/// and `-w 4M` (where it loses next to nothing).
const WINDOWS: [(&str, &[&str]); 2] = [("default", &[]), ("4M", &["-w", "4M"])];

/// Unmodified programs on the same testbed, interleaved over the stacks
/// (`repeats` rounds): `iperf3 -u -l 1472 -b 0` with each of [`WINDOWS`]
/// (received Gbit/s, loss, CPU per datagram of each process from
/// iperf3's own getrusage) and `sockperf ping-pong -m 64` (p50/p99). Rows
/// of the `tcp` stack carry the UOE counters of both processes, so a loss
/// is attributed (`drop_rx_full`, `drop_queue_full`, ...; ring drops of
/// the endpoint are in `eudp stat`).
pub fn apps(tb: &Testbed, secs: u32, repeats: usize) -> Result<serde_json::Value, String> {
    use crate::run::{iperf3_kernel_tcp, iperf3_udp_with, preload_lib, sockperf, Stack};
    let lib = preload_lib()?;
    let stats = std::env::temp_dir().join(format!("eudp-tcpbench-{}", std::process::id()));
    std::fs::create_dir_all(&stats).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    let runs = WINDOWS.iter().map(|&(w, o)| ("iperf3", w, o)).chain([("sockperf", "", &[][..])]);
    for (tool, window, opts) in runs {
        for rep in 0..repeats {
            // The ceiling runs with the iperf3 rounds only: ping-pong over
            // kernel TCP is not a UDP program's latency.
            let ceiling = (tool == "iperf3").then_some((KERNEL_TCP, None));
            for (name, transport) in APP_STACKS.into_iter().chain(ceiling) {
                let stack = if transport.is_some() { Stack::Eudp("default") } else { Stack::Kernel };
                let r = with_transport(transport, || match tool {
                    "iperf3" if name == KERNEL_TCP => iperf3_kernel_tcp(tb, &lib, &stats, secs, opts),
                    "iperf3" => iperf3_udp_with(tb, stack, &lib, &stats, secs, 1472, "0", opts),
                    _ => sockperf(tb, stack, stack, &lib, &stats, "ping-pong", secs, 64),
                });
                let mut r = r.unwrap_or_else(|e| serde_json::json!({ "tool": tool, "error": e }));
                r["bench_stack"] = name.into();
                r["window"] = window.into();
                r["repeat"] = rep.into();
                let uoe = take_tcp_counters(&stats);
                if transport.is_some() {
                    r["uoe"] = uoe;
                }
                eprintln!("{r}");
                rows.push(r);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&stats);
    let m = |tool: &str, w: &str, stack: &str, key: &str| median_key(&rows, tool, w, stack, key);
    let ratio = |a: Option<f64>, b: Option<f64>| a.zip(b).filter(|(_, b)| *b > 0.0).map(|(a, b)| a / b);
    let mut medians = serde_json::Map::new();
    for (name, _) in APP_STACKS.into_iter().chain([(KERNEL_TCP, None)]) {
        let mut v = serde_json::json!({ "pingpong_p50_us": m("sockperf", "", name, "p50_us"), "pingpong_p99_us": m("sockperf", "", name, "p99_us") });
        for (w, _) in WINDOWS {
            v[format!("iperf3_{w}")] = serde_json::json!({
                "received_gbps": m("iperf3", w, name, "received_gbps"),
                "lost_percent": m("iperf3", w, name, "lost_percent"),
                "sender_cpu_ns_per_datagram": m("iperf3", w, name, "sender_cpu_ns_per_datagram"),
                "receiver_cpu_ns_per_datagram": m("iperf3", w, name, "receiver_cpu_ns_per_datagram"),
            });
        }
        medians.insert(name.into(), v);
    }
    let run_kind = |r: &serde_json::Value| match r["tool"].as_str() {
        Some("iperf3") if r["mode"] == "tcp" => format!("iperf3 (TCP), window {}", r["window"].as_str().unwrap_or("?")),
        Some("iperf3") => format!("iperf3 -u -l 1472 -b 0, window {}", r["window"].as_str().unwrap_or("?")),
        _ => "sockperf ping-pong 64 B".to_string(),
    };
    let stack_of = |r: &serde_json::Value| r["bench_stack"].as_str().unwrap_or("?").to_string();
    let peak_rss = crate::rss::medians(&rows, &run_kind, &stack_of);
    let mut res = serde_json::json!({
        "rows": rows,
        "medians": medians,
        "peak_rss": peak_rss,
        "pingpong_p50_tcp_over_kernel": ratio(m("sockperf", "", "tcp", "p50_us"), m("sockperf", "", "kernel", "p50_us")),
        "pingpong_p99_tcp_over_kernel": ratio(m("sockperf", "", "tcp", "p99_us"), m("sockperf", "", "kernel", "p99_us")),
    });
    for (w, _) in WINDOWS {
        let gbps = |s: &str| m("iperf3", w, s, "received_gbps");
        let x = ratio(gbps("tcp"), gbps("kernel"));
        res[format!("iperf3_{w}_tcp_over_kernel")] = x.into();
        res[format!("iperf3_{w}_tcp_over_eudp")] = ratio(gbps("tcp"), gbps("eudp")).into();
        res[format!("iperf3_{w}_target_met")] = x.is_some_and(|x| x >= 3.0).into();
        // What the host allows: the transport's share of its own TCP, and
        // the TCP/UDP ratio that bounds tcp/kernel on this host.
        res[format!("iperf3_{w}_tcp_over_kernel_tcp")] = ratio(gbps("tcp"), gbps(KERNEL_TCP)).into();
        res[format!("iperf3_{w}_kernel_tcp_over_kernel")] = ratio(gbps(KERNEL_TCP), gbps("kernel")).into();
    }
    Ok(res)
}

/// A table of a bench result.
pub fn table(res: &TcpBench) -> String {
    let kib = |v: Option<u64>| v.map(|x| x.to_string()).unwrap_or_else(|| "-".into());
    let mut s = format!(
        "{:<7} {:>6} {:>9} {:>8} {:>8} {:>12} {:>12} {:>11} {:>11}\n",
        "mode", "size", "rx Gb/s", "Mpps", "loss", "tx us/dgram", "rx us/dgram", "tx RSS KiB", "rx RSS KiB"
    );
    for r in &res.rows {
        s += &format!(
            "{:<7} {:>6} {:>9.2} {:>8.3} {:>7.2}% {:>12.3} {:>12.3} {:>11} {:>11}\n",
            r.mode.name(),
            r.size,
            r.rx_gbps,
            r.rx_mpps,
            r.loss * 100.0,
            r.tx_cpu_us_per_dgram,
            r.rx_cpu_us_per_dgram,
            kib(r.tx_peak_rss_kib),
            kib(r.rx_peak_rss_kib)
        );
    }
    s += &format!(
        "tcp/kernel {:.2}x, tcp/eudp {:.2}x (medians); target >= 3x: {}\n",
        res.tcp_over_kernel,
        res.tcp_over_eudp,
        if res.target_met { "MET" } else { "MISSED" }
    );
    if let Some(m) = res.apps["medians"].as_object() {
        let f = |v: &serde_json::Value| v.as_f64().map(|x| format!("{x:.2}")).unwrap_or_else(|| "-".into());
        let r = |k: &str| res.apps[k].as_f64().map(|x| format!("{x:.2}x")).unwrap_or_else(|| "-".into());
        for (w, _) in WINDOWS {
            s += &format!(
                "{:<10} {:>9} {:>8} {:>12} {:>12}   (iperf3, window {w})\n",
                "apps", "rx Gb/s", "loss", "tx ns/dgram", "rx ns/dgram"
            );
            for (name, v) in m {
                let v = &v[format!("iperf3_{w}")];
                s += &format!(
                    "{:<10} {:>9} {:>7}% {:>12} {:>12}\n",
                    name,
                    f(&v["received_gbps"]),
                    f(&v["lost_percent"]),
                    f(&v["sender_cpu_ns_per_datagram"]),
                    f(&v["receiver_cpu_ns_per_datagram"])
                );
            }
            s += &format!(
                "iperf3 ({w}) tcp/kernel {}, tcp/eudp {}, tcp/kernel-tcp {}, kernel-tcp/kernel {}; target >= 3x: {}\n",
                r(&format!("iperf3_{w}_tcp_over_kernel")),
                r(&format!("iperf3_{w}_tcp_over_eudp")),
                r(&format!("iperf3_{w}_tcp_over_kernel_tcp")),
                r(&format!("iperf3_{w}_kernel_tcp_over_kernel")),
                if res.apps[format!("iperf3_{w}_target_met")] == true { "MET" } else { "MISSED" }
            );
        }
        for (name, v) in m.iter().filter(|(n, _)| *n != KERNEL_TCP) {
            s += &format!(
                "ping-pong 64 B {name:<7} p50 {:>8} us  p99 {:>8} us\n",
                f(&v["pingpong_p50_us"]),
                f(&v["pingpong_p99_us"])
            );
        }
        s += &format!(
            "ping-pong tcp/kernel p50 {}, p99 {}\n",
            r("pingpong_p50_tcp_over_kernel"),
            r("pingpong_p99_tcp_over_kernel")
        );
        s += &crate::rss::table(res.apps["peak_rss"].as_array().map(Vec::as_slice).unwrap_or_default());
    } else if !res.apps.is_null() {
        s += &format!("apps: {}\n", res.apps);
    }
    s += &format!("load average before/after: {} / {}\n", res.loadavg_before, res.loadavg_after);
    s
}
