//! `eudp run`, `eudp stat` and `eudp bench --apps`: unmodified programs on
//! the engine through `libeudp_preload.so` (crate `eudp-preload`).
//!
//! * `eudp run [OPTIONS] [--] PROGRAM ARGS…` ([`RunArgs`]) execs PROGRAM with the library in `LD_PRELOAD` and the profile's
//!   `EUDP_*` settings (variables already set win); profiles are built in
//!   or read from a TOML file (`crate::profiles`); `--list-profiles`
//!   prints them.
//! * `eudp stat [--dir D] [--all] [--json] [--clean] [PID…]` ([`StatArgs`]) prints the
//!   per-socket counters the shim writes to `D/<pid>.json` (default
//!   `/run/eudp`); `--clean` removes the reports of exited programs.
//! * `eudp bench --apps [--secs S] [--repeats N] [--out DIR]`: iperf3 and sockperf on a
//!   testbed, kernel and eudp side by side, JSON under `DIR`.
//!
//! Uses only std, libc, clap, serde_json, `crate::testbed`, `crate::profiles` and `crate::rss`,
//! so tests can include it with `#[path]`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::apps_baselines::{median_of, ratio};
use crate::profiles::ProfileFile;
pub use crate::profiles::{profile, PROFILES};

/// Where `libeudp_preload.so` is (`crate::shim_path` has the search order).
pub fn preload_lib() -> Result<PathBuf, String> {
    eudp_cli::shim_path::preload_lib()
}

/// Adds the shim and a built-in profile to a command (variables already
/// set in this environment are left alone).
pub fn preload(cmd: &mut Command, lib: &Path, profile_name: &str) -> Result<(), String> {
    let settings: Vec<(String, String)> =
        profile(profile_name)?.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    preload_settings(cmd, lib, &settings);
    Ok(())
}

/// Adds the shim and these settings to a command (variables already set in
/// this environment are left alone).
pub fn preload_settings(cmd: &mut Command, lib: &Path, settings: &[(String, String)]) {
    let mut pre = OsString::from(lib.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        pre.push(":");
        pre.push(old);
    }
    cmd.env("LD_PRELOAD", pre);
    for (k, v) in settings {
        if std::env::var_os(k).is_none() {
            cmd.env(k, v);
        }
    }
}

/// Prints every profile and its settings.
fn list_profiles(file: Option<&ProfileFile>) -> i32 {
    let mut names: Vec<String> = PROFILES.iter().map(|p| p.0.to_string()).collect();
    names.extend(file.map(|f| f.names().into_iter().map(String::from).collect::<Vec<_>>()).unwrap_or_default());
    for name in names {
        match crate::profiles::resolve(&name, file) {
            Ok(settings) => {
                let from = if PROFILES.iter().any(|p| p.0 == name) {
                    "built in".to_string()
                } else {
                    file.map_or(String::new(), |f| f.origin().to_string())
                };
                let list: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{name:<12} {from}: {}",
                    if list.is_empty() { "engine defaults".to_string() } else { list.join(" ") }
                );
            }
            Err(e) => {
                eprintln!("eudp run: {e}");
                return 2;
            }
        }
    }
    0
}

const RUN_EXAMPLES: &str = "Examples:
  eudp run --profile latency -- sockperf server -i 198.18.0.2
  eudp run --transport tcp iperf3 -c 198.18.0.2 -u -b 1G
  eudp run --profile-file my.toml --profile dns -- dnsmasq -d
  eudp run --list-profiles";

/// Run an unmodified program with its UDP sockets on the engine (LD_PRELOAD).
///
/// Options before PROGRAM are eudp's; the first word that is not one of
/// them starts PROGRAM, and every word after it is PROGRAM's. Variables
/// already set in the environment win over the profile's.
#[derive(clap::Args, Clone, Debug)]
#[command(after_help = RUN_EXAMPLES)]
pub struct RunArgs {
    /// Profile of engine settings: default, throughput, latency, or one of the profile file's.
    #[arg(short = 'p', long, value_name = "NAME", default_value = "default")]
    pub profile: String,
    /// TOML file of more profiles (default: $EUDP_PROFILE_FILE).
    #[arg(long, value_name = "FILE")]
    pub profile_file: Option<PathBuf>,
    /// Print every profile and its settings, and exit.
    #[arg(long)]
    pub list_profiles: bool,
    /// The engine's transport: kernel UDP (the default), UDP over TCP lanes, or AF_XDP.
    #[arg(long, value_name = "T", value_parser = ["kernel", "tcp", "xdp"])]
    pub transport: Option<String>,
    /// No start-up line on stderr (sets EUDP_QUIET=1 for the program).
    #[arg(short, long)]
    pub quiet: bool,
    /// The program to run and its arguments.
    #[arg(value_name = "PROGRAM [ARGS]", trailing_var_arg = true, required_unless_present = "list_profiles")]
    pub program: Vec<String>,
}

/// `eudp run`. Execs the program; returns only on error.
pub fn run_main(a: &RunArgs) -> i32 {
    let prof = a.profile.clone();
    let transport = a.transport.clone();
    let profile_file: Option<PathBuf> = a
        .profile_file
        .clone()
        .or_else(|| std::env::var_os("EUDP_PROFILE_FILE").filter(|v| !v.is_empty()).map(PathBuf::from));
    let list = a.list_profiles;
    let file = match profile_file.as_deref().map(ProfileFile::read).transpose() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("eudp run: {e}");
            return 2;
        }
    };
    if list {
        return list_profiles(file.as_ref());
    }
    let settings = match crate::profiles::resolve(&prof, file.as_ref()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("eudp run: {e}");
            return 2;
        }
    };
    let Some((prog, prog_args)) = a.program.split_first() else {
        eprintln!("eudp run: no PROGRAM given (see eudp run --help)");
        return 2;
    };
    let lib = match preload_lib() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("eudp run: {e}");
            return 1;
        }
    };
    let mut cmd = Command::new(prog);
    cmd.args(prog_args);
    preload_settings(&mut cmd, &lib, &settings);
    if let Some(t) = transport {
        // The engine's transport: kernel UDP (default), TCP lanes (UOE) or
        // AF_XDP.
        cmd.env("EUDP_TRANSPORT", t);
    }
    if a.quiet {
        cmd.env("EUDP_QUIET", "1");
    }
    if let Err(code) = crate::run_check::check(&mut cmd, &prof) {
        return code;
    }
    use std::os::unix::process::CommandExt;
    let e = cmd.exec();
    eprintln!("eudp run: {prog}: {e}");
    if e.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    }
}

// ----------------------------------------------------------- bench --apps

/// A background process killed (SIGINT, then SIGKILL) when dropped.
struct Bg(std::process::Child);

impl Bg {
    /// Waits up to `limit` for the process to end by itself: a server run
    /// for one test (`iperf3 -s -1`) writes its final shim report at exit,
    /// and killing it first would leave only the last periodic one.
    fn wait_exit(&mut self, limit: Duration) {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) -> String {
        crate::sys::interrupt(&self.0);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.0.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let mut s = String::new();
        if let Some(mut o) = self.0.stdout.take() {
            use std::io::Read;
            let _ = o.read_to_string(&mut s);
        }
        let _ = self.0.wait();
        s
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// How one side runs: on the kernel or under the shim with a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stack {
    Kernel,
    /// The shim on the transport `EUDP_TRANSPORT` of this process says
    /// (kernel UDP unless set).
    Eudp(&'static str),
    /// The shim on the `tcp` transport (UDP over TCP), as
    /// `eudp run --transport tcp` runs a program.
    EudpTcp(&'static str),
    /// The shim on the `xdp` transport (AF_XDP), as `eudp run --transport
    /// xdp` runs a program.
    EudpXdp(&'static str),
}

impl Stack {
    pub fn name(&self) -> String {
        match self {
            Stack::Kernel => "kernel".into(),
            Stack::Eudp("default") => "eudp".into(),
            Stack::Eudp(p) => format!("eudp-{p}"),
            Stack::EudpTcp("default") => "eudp-tcp".into(),
            Stack::EudpTcp(p) => format!("eudp-tcp-{p}"),
            Stack::EudpXdp("default") => "eudp-xdp".into(),
            Stack::EudpXdp(p) => format!("eudp-xdp-{p}"),
        }
    }
}

/// The `VAR=VALUE` words that put a program on `stack`: the shim and the
/// profile's settings, as `eudp run` sets them, and the stats directory.
pub fn stack_env(stack: Stack, lib: &Path, stat_dir: &Path) -> Vec<OsString> {
    let mut v = Vec::new();
    if let Stack::Eudp(p) | Stack::EudpTcp(p) | Stack::EudpXdp(p) = stack {
        match stack {
            Stack::EudpTcp(_) => v.push("EUDP_TRANSPORT=tcp".into()),
            Stack::EudpXdp(_) => v.push("EUDP_TRANSPORT=xdp".into()),
            _ => {}
        }
        let mut tmp = Command::new("true");
        let _ = preload(&mut tmp, lib, p);
        for (k, val) in tmp.get_envs() {
            if let Some(val) = val {
                let mut kv = OsString::from(k);
                kv.push("=");
                kv.push(val);
                v.push(kv);
            }
        }
        v.push(format!("EUDP_STAT_DIR={}", stat_dir.display()).into());
    }
    v
}

/// A command inside testbed host `host` on `stack`.
pub fn app_command(
    tb: &crate::testbed::Testbed,
    host: char,
    stack: Stack,
    lib: &Path,
    stat_dir: &Path,
    argv: &[&str],
) -> Command {
    let mut c = tb.command(host, "env");
    c.args(stack_env(stack, lib, stat_dir));
    c.args(argv);
    c.stdin(Stdio::null());
    c
}

/// As [`app_command`], with the program under the RSS wrapper
/// ([`crate::rss`]), which writes the program's peak RSS to `rss_out`.
/// Without a C compiler it is [`app_command`] (and no RSS is reported).
#[allow(clippy::too_many_arguments)]
pub fn measured_app_command(
    tb: &crate::testbed::Testbed,
    host: char,
    stack: Stack,
    lib: &Path,
    stat_dir: &Path,
    argv: &[&str],
    rss_out: &Path,
) -> Command {
    match crate::rss::wrapper() {
        Ok(w) => {
            let mut c = tb.command(host, &w.display().to_string());
            crate::rss::wrap_args(&mut c, rss_out, None, &stack_env(stack, lib, stat_dir), argv);
            c.stdin(Stdio::null());
            c
        }
        Err(e) => {
            eprintln!("bench: no peak RSS: {e}");
            app_command(tb, host, stack, lib, stat_dir, argv)
        }
    }
}

/// The peak RSS (KiB) in a wrapper report, as JSON (null when the
/// program did not finish under the wrapper).
fn peak_rss(path: &Path) -> serde_json::Value {
    crate::rss::take_usage(path).map(|u| u.max_rss_kib).into()
}

fn spawn_bg(mut c: Command) -> Result<Bg, String> {
    c.stdout(Stdio::piped()).stderr(Stdio::null());
    c.spawn().map(Bg).map_err(|e| e.to_string())
}

fn output(mut c: Command, limit: Duration) -> Result<String, String> {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ch = c.spawn().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    loop {
        if let Some(_st) = ch.try_wait().map_err(|e| e.to_string())? {
            break;
        }
        if t0.elapsed() > limit {
            let _ = ch.kill();
            let _ = ch.wait();
            return Err(format!("timed out after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = ch.wait_with_output().map_err(|e| e.to_string())?;
    let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
    s += &String::from_utf8_lossy(&o.stderr);
    Ok(s)
}

/// One iperf3 UDP run (`reverse`: -R) between host a (client) and b.
#[allow(clippy::too_many_arguments)]
pub fn iperf3_udp(
    tb: &crate::testbed::Testbed,
    stack: Stack,
    lib: &Path,
    stats: &Path,
    secs: u32,
    len: usize,
    rate: &str,
    reverse: bool,
) -> Result<serde_json::Value, String> {
    iperf3_udp_with(tb, stack, lib, stats, secs, len, rate, if reverse { &["-R"] } else { &[] })
}

/// As [`iperf3_udp`] with extra client options (`-R`, `--bidir`, `-P 4`).
#[allow(clippy::too_many_arguments)]
pub fn iperf3_udp_with(
    tb: &crate::testbed::Testbed,
    stack: Stack,
    lib: &Path,
    stats: &Path,
    secs: u32,
    len: usize,
    rate: &str,
    extra: &[&str],
) -> Result<serde_json::Value, String> {
    let reverse = extra.contains(&"-R");
    let l = len.to_string();
    let mut opts = vec!["-u", "-b", rate, "-l", &l];
    opts.extend_from_slice(extra);
    let (v, srv_rss, cli_rss) = iperf3_pair(tb, stack, lib, stats, "5301", "iperf3", secs, &opts)?;
    // iperf3 >= 3.9 reports the receiver's view in sum_received.
    let sum = if v["end"]["sum_received"].is_object() { &v["end"]["sum_received"] } else { &v["end"]["sum"] };
    let packets = sum["packets"].as_u64().unwrap_or(0);
    let lost = sum["lost_packets"].as_u64().unwrap_or(0);
    let secs_f = sum["seconds"].as_f64().unwrap_or(secs as f64).max(1e-9);
    let received = packets.saturating_sub(lost);
    // iperf3's CPU use (getrusage of the whole process, engine thread
    // included) per datagram; "host" is the client, the receiver under -R.
    let cpu = |k: &str| v["end"]["cpu_utilization_percent"][k].as_f64();
    let per = |pct: Option<f64>, n: u64| pct.filter(|_| n > 0).map(|p| p / 100.0 * secs_f * 1e9 / n as f64);
    let (tx_cpu, rx_cpu) =
        if reverse { (cpu("remote_total"), cpu("host_total")) } else { (cpu("host_total"), cpu("remote_total")) };
    Ok(serde_json::json!({
        "tool": "iperf3", "stack": stack.name(), "reverse": reverse, "options": extra.join(" "), "len": len, "rate": rate,
        "packets_sent": packets, "lost_packets": lost, "lost_percent": sum["lost_percent"],
        "received_pps": received as f64 / secs_f,
        "received_gbps": received as f64 * len as f64 * 8.0 / secs_f / 1e9,
        "jitter_ms": sum["jitter_ms"],
        "sender_cpu_ns_per_datagram": per(tx_cpu, packets),
        "receiver_cpu_ns_per_datagram": per(rx_cpu, received),
        // Peak RSS of each program (the client sends unless -R).
        "sender_peak_rss_kib": if reverse { &srv_rss } else { &cli_rss },
        "receiver_peak_rss_kib": if reverse { &cli_rss } else { &srv_rss },
    }))
}

/// One iperf3 run on the testbed: a one-shot server on b, the client on a
/// with `opts`, both on `stack`. Returns the client's JSON report and the
/// peak RSS of server and client.
#[allow(clippy::too_many_arguments)]
fn iperf3_pair(
    tb: &crate::testbed::Testbed,
    stack: Stack,
    lib: &Path,
    stats: &Path,
    port: &str,
    rss_tag: &str,
    secs: u32,
    opts: &[&str],
) -> Result<(serde_json::Value, serde_json::Value, serde_json::Value), String> {
    let (srv_rss, cli_rss) =
        (crate::rss::report_path(&format!("{rss_tag}-server")), crate::rss::report_path(&format!("{rss_tag}-client")));
    let mut srv =
        spawn_bg(measured_app_command(tb, 'b', stack, lib, stats, &["iperf3", "-s", "-1", "-p", port], &srv_rss))?;
    std::thread::sleep(Duration::from_millis(400));
    let t = secs.to_string();
    let mut argv = vec!["iperf3", "-c", crate::testbed::ADDR_B, "-p", port, "-t", &t, "--json"];
    argv.extend_from_slice(opts);
    let out = output(
        measured_app_command(tb, 'a', stack, lib, stats, &argv, &cli_rss),
        Duration::from_secs(secs as u64 + 20),
    );
    if out.is_ok() {
        srv.wait_exit(Duration::from_secs(5));
    }
    drop(srv);
    let (srv_rss, cli_rss) = (peak_rss(&srv_rss), peak_rss(&cli_rss));
    let out = out?;
    let start = out.find('{').ok_or_else(|| format!("iperf3: no JSON: {out}"))?;
    // iperf3 may print warnings after its JSON: read the first value only.
    let v: serde_json::Value = serde_json::Deserializer::from_str(&out[start..])
        .into_iter::<serde_json::Value>()
        .next()
        .ok_or_else(|| format!("iperf3: no JSON: {out}"))?
        .map_err(|e| format!("iperf3 JSON: {e}: {out}"))?;
    if let Some(e) = v["error"].as_str() {
        return Err(format!("iperf3: {e}"));
    }
    Ok((v, srv_rss, cli_rss))
}

/// Unmodified iperf3 in TCP mode on plain kernel sockets (its default
/// 128 KiB writes, `extra` as given): what this host's own TCP carries for
/// the same program, the ceiling of any UDP-over-TCP transport here.
/// CPU is per 1472 B of payload, to sit beside the UDP rows.
pub fn iperf3_kernel_tcp(
    tb: &crate::testbed::Testbed,
    lib: &Path,
    stats: &Path,
    secs: u32,
    extra: &[&str],
) -> Result<serde_json::Value, String> {
    let (v, srv_rss, cli_rss) = iperf3_pair(tb, Stack::Kernel, lib, stats, "5302", "iperf3-tcp", secs, extra)?;
    let sum = &v["end"]["sum_received"];
    let bytes = sum["bytes"].as_f64().ok_or_else(|| format!("iperf3: no sum_received: {v}"))?;
    let secs_f = sum["seconds"].as_f64().unwrap_or(secs as f64).max(1e-9);
    let units = bytes / 1472.0;
    let cpu = |k: &str| v["end"]["cpu_utilization_percent"][k].as_f64();
    let per = |pct: Option<f64>| pct.filter(|_| units > 0.0).map(|p| p / 100.0 * secs_f * 1e9 / units);
    Ok(serde_json::json!({
        "tool": "iperf3", "mode": "tcp", "stack": "kernel-tcp", "options": extra.join(" "),
        "received_bytes": bytes,
        "received_gbps": bytes * 8.0 / secs_f / 1e9,
        "retransmits": v["end"]["sum_sent"]["retransmits"],
        "sender_cpu_ns_per_datagram": per(cpu("host_total")),
        "receiver_cpu_ns_per_datagram": per(cpu("remote_total")),
        "sender_peak_rss_kib": cli_rss,
        "receiver_peak_rss_kib": srv_rss,
    }))
}

fn parse_after(s: &str, key: &str) -> Option<f64> {
    let i = s.find(key)? + key.len();
    let rest = s[i..].trim_start();
    let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// sockperf ping-pong, under-load or throughput (`mode`) from a to a server on b.
#[allow(clippy::too_many_arguments)]
pub fn sockperf(
    tb: &crate::testbed::Testbed,
    client: Stack,
    server: Stack,
    lib: &Path,
    stats: &Path,
    mode: &str,
    secs: u32,
    size: usize,
) -> Result<serde_json::Value, String> {
    // An AF_XDP run's processes report into a directory of their own, so
    // the row can show that the fast path carried the traffic.
    let xdp_dir = stats.join(format!(
        "xdp-{}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
    ));
    let xdp = matches!(client, Stack::EudpXdp(_)) || matches!(server, Stack::EudpXdp(_));
    let stats: &Path = if xdp { &xdp_dir } else { stats };
    let port = "11311";
    let (srv_rss, cli_rss) = (crate::rss::report_path("sockperf-server"), crate::rss::report_path("sockperf-client"));
    let mut srv = spawn_bg(measured_app_command(
        tb,
        'b',
        server,
        lib,
        stats,
        &["sockperf", "server", "-i", crate::testbed::ADDR_B, "-p", port],
        &srv_rss,
    ))?;
    std::thread::sleep(Duration::from_millis(400));
    let t = secs.to_string();
    let m = size.to_string();
    let out = output(
        measured_app_command(
            tb,
            'a',
            client,
            lib,
            stats,
            &["sockperf", mode, "-i", crate::testbed::ADDR_B, "-p", port, "-t", &t, "-m", &m],
            &cli_rss,
        ),
        Duration::from_secs(secs as u64 + 20),
    );
    let srv_out = srv.stop();
    let (srv_rss, cli_rss) = (peak_rss(&srv_rss), peak_rss(&cli_rss));
    let out = out?;
    let received = parse_after(&srv_out, "Total ").map(|v| v as u64);
    let mut v = serde_json::json!({
        "tool": "sockperf", "mode": mode, "client": client.name(), "server": server.name(), "size": size, "secs": secs,
        "client_peak_rss_kib": cli_rss, "server_peak_rss_kib": srv_rss,
    });
    if mode == "ping-pong" || mode == "under-load" {
        v["p50_us"] = parse_after(&out, "percentile 50.000 =").into();
        v["p99_us"] = parse_after(&out, "percentile 99.000 =").into();
        v["avg_us"] = parse_after(&out, "Latency is").into();
        v["dropped"] = parse_after(&out, "# dropped messages =").into();
        if v["p50_us"].is_null() {
            return Err(format!("sockperf {mode}: no percentiles: {out}"));
        }
    } else {
        let sent = parse_after(&out, "Total of").unwrap_or(0.0);
        v["sent_msgs"] = sent.into();
        v["sent_rate"] = parse_after(&out, "Message Rate is").into();
        v["server_received_msgs"] = received.into();
        // The server count includes the warm-up's few messages.
        v["received_rate"] = received.map(|r| r as f64 / secs as f64).into();
    }
    if xdp {
        let x = xdp_counters(stats);
        let _ = std::fs::remove_dir_all(stats);
        if x.tx_frames == 0 || x.rx_frames == 0 {
            return Err(format!(
                "sockperf {mode} on the xdp transport: the fast path carried nothing (tx {}, rx {} frames; {})",
                x.tx_frames,
                x.rx_frames,
                x.unavailable.join("; ")
            ));
        }
        v["xdp_tx_frames"] = x.tx_frames.into();
        v["xdp_rx_frames"] = x.rx_frames.into();
        v["xdp_kernel_path_datagrams"] = x.kernel_path.into();
    }
    Ok(v)
}

/// What the processes of one `--transport xdp` run said of their AF_XDP
/// transport (summed over their `eudp stat` reports in `dir`).
#[derive(Default)]
struct XdpCounters {
    tx_frames: u64,
    rx_frames: u64,
    /// Datagrams the kernel socket carried instead (both directions).
    kernel_path: u64,
    unavailable: Vec<String>,
}

fn xdp_counters(dir: &Path) -> XdpCounters {
    let mut c = XdpCounters::default();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else { continue };
        let Ok(j) = serde_json::from_str::<serde_json::Value>(&text) else { continue };
        let x = &j["xdp"];
        let n = |k: &str| x["stats"][k].as_u64().unwrap_or(0);
        c.tx_frames += n("tx_xdp");
        c.rx_frames += n("rx_xdp");
        c.kernel_path += n("tx_kernel") + n("rx_kernel");
        if let Some(u) = x["unavailable"].as_str() {
            c.unavailable.push(u.to_string());
        }
    }
    c
}

/// Runs the application bench and writes its JSON; returns the result.
/// Each stack runs `repeats` times, interleaved with the others, and the
/// targets compare medians.
pub fn bench_apps(secs: u32, repeats: u32, out_dir: &Path) -> Result<serde_json::Value, String> {
    let lib = preload_lib()?;
    let tb = crate::testbed::Testbed::up(&crate::testbed::unique_name("app"))?;
    let stats = std::env::temp_dir().join(format!("eudp-bench-apps-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&stats);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let load_before = crate::apps_baselines::loadavg();
    let pingpong = crate::apps_baselines::build_pingpong(&stats);
    let mut rows: Vec<serde_json::Value> = Vec::new();
    let mut targets = Vec::new();
    let push = |rows: &mut Vec<serde_json::Value>, mut r: serde_json::Value, rep: u32| {
        r["repeat"] = rep.into();
        eprintln!("{r}");
        rows.push(r);
    };

    // iperf3 -u -l 1472 -b 0, both directions.
    for reverse in [false, true] {
        for rep in 0..repeats {
            for stack in [Stack::Kernel, Stack::Eudp("throughput")] {
                let r = iperf3_udp(&tb, stack, &lib, &stats, secs, 1472, "0", reverse).unwrap_or_else(
                    |e| serde_json::json!({"tool": "iperf3", "stack": stack.name(), "reverse": reverse, "error": e}),
                );
                push(&mut rows, r, rep);
            }
            if !reverse {
                push(&mut rows, crate::apps_baselines::library_row(&tb, 1472, secs), rep);
            }
        }
        let is = |s: &'static str| {
            move |r: &serde_json::Value| r["tool"] == "iperf3" && r["reverse"] == reverse && r["stack"] == s
        };
        let k = median_of(&rows, &is("kernel"), "received_pps");
        let e = median_of(&rows, &is("eudp-throughput"), "received_pps");
        let kl = median_of(&rows, &is("kernel"), "lost_percent");
        let el = median_of(&rows, &is("eudp-throughput"), "lost_percent");
        let x = ratio(e, k);
        targets.push(serde_json::json!({
            "target": format!("iperf3 -u -l 1472 -b 0{} received throughput >= 5x kernel, loss <= kernel's", if reverse { " -R" } else { "" }),
            "ratio": x, "loss_kernel_percent": kl, "loss_eudp_percent": el,
            "receiver_cpu_ns_per_datagram": {"kernel": median_of(&rows, &is("kernel"), "receiver_cpu_ns_per_datagram"), "eudp": median_of(&rows, &is("eudp-throughput"), "receiver_cpu_ns_per_datagram")},
            "sender_cpu_ns_per_datagram": {"kernel": median_of(&rows, &is("kernel"), "sender_cpu_ns_per_datagram"), "eudp": median_of(&rows, &is("eudp-throughput"), "sender_cpu_ns_per_datagram")},
            "met": x.is_some_and(|x| x >= 5.0) && matches!((el, kl), (Some(e), Some(k)) if e <= k),
        }));
    }
    // sockperf throughput 64 B.
    for rep in 0..repeats {
        for stack in [Stack::Kernel, Stack::Eudp("throughput")] {
            let r = sockperf(&tb, stack, stack, &lib, &stats, "throughput", secs, 64).unwrap_or_else(
                |e| serde_json::json!({"tool": "sockperf", "mode": "throughput", "client": stack.name(), "error": e}),
            );
            push(&mut rows, r, rep);
        }
        push(&mut rows, crate::apps_baselines::library_row(&tb, 64, secs), rep);
    }
    let tp = |s: &'static str| {
        move |r: &serde_json::Value| r["tool"] == "sockperf" && r["mode"] == "throughput" && r["client"] == s
    };
    let x = ratio(
        median_of(&rows, &tp("eudp-throughput"), "received_rate"),
        median_of(&rows, &tp("kernel"), "received_rate"),
    );
    targets.push(serde_json::json!({"target": "sockperf throughput 64 B received message rate >= 5x kernel", "ratio": x, "met": x.is_some_and(|x| x >= 5.0)}));
    // sockperf ping-pong 64 B.
    for rep in 0..repeats {
        for stack in [
            Stack::Kernel,
            Stack::Eudp("default"),
            Stack::Eudp("latency"),
            Stack::EudpXdp("default"),
            Stack::EudpXdp("latency"),
        ] {
            let r = sockperf(&tb, stack, stack, &lib, &stats, "ping-pong", secs, 64).unwrap_or_else(
                |e| serde_json::json!({"tool": "sockperf", "mode": "ping-pong", "client": stack.name(), "error": e}),
            );
            push(&mut rows, r, rep);
        }
        let floor = match &pingpong {
            Ok(bin) => crate::apps_baselines::c_floor_row(&tb, bin, (secs * 20_000).clamp(10_000, 200_000)),
            Err(e) => serde_json::json!({"tool": "xdp_pingpong", "stack": "c-af_xdp", "error": e}),
        };
        push(&mut rows, floor, rep);
    }
    let pp = |s: &'static str| {
        move |r: &serde_json::Value| r["tool"] == "sockperf" && r["mode"] == "ping-pong" && r["client"] == s
    };
    let (k50, k99) = (median_of(&rows, &pp("kernel"), "p50_us"), median_of(&rows, &pp("kernel"), "p99_us"));
    let (e50, e99) = (median_of(&rows, &pp("eudp"), "p50_us"), median_of(&rows, &pp("eudp"), "p99_us"));
    let l50 = median_of(&rows, &pp("eudp-latency"), "p50_us");
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B default profile p50 <= kernel p50", "ratio": ratio(e50, k50), "met": ratio(e50, k50).is_some_and(|x| x <= 1.0)}));
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B default profile p99 <= 1.2x kernel p99", "ratio": ratio(e99, k99), "met": ratio(e99, k99).is_some_and(|x| x <= 1.2)}));
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B latency profile p50 <= 0.5x kernel p50", "ratio": ratio(l50, k50), "met": ratio(l50, k50).is_some_and(|x| x <= 0.5)}));
    // The same targets on the AF_XDP transport (`--transport xdp`), side by
    // side: the kernel's per-datagram path is what it removes.
    let (x50, x99) = (median_of(&rows, &pp("eudp-xdp"), "p50_us"), median_of(&rows, &pp("eudp-xdp"), "p99_us"));
    let xl50 = median_of(&rows, &pp("eudp-xdp-latency"), "p50_us");
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B default profile, xdp transport, p50 <= kernel p50", "ratio": ratio(x50, k50), "met": ratio(x50, k50).is_some_and(|x| x <= 1.0)}));
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B default profile, xdp transport, p99 <= 1.2x kernel p99", "ratio": ratio(x99, k99), "met": ratio(x99, k99).is_some_and(|x| x <= 1.2)}));
    targets.push(serde_json::json!({"target": "sockperf ping-pong 64 B latency profile, xdp transport, p50 <= 0.5x kernel p50", "ratio": ratio(xl50, k50), "met": ratio(xl50, k50).is_some_and(|x| x <= 0.5)}));

    targets.extend(crate::apps_baselines::side_by_side_targets(&rows));

    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let run_kind = |r: &serde_json::Value| match r["tool"].as_str() {
        Some("iperf3") => format!("iperf3 -u -l 1472 -b 0{}", if r["reverse"] == true { " -R" } else { "" }),
        _ => format!("sockperf {} 64 B", r["mode"].as_str().unwrap_or("?")),
    };
    let stack_of = |r: &serde_json::Value| r["stack"].as_str().or(r["client"].as_str()).unwrap_or("?").to_string();
    let programs: Vec<serde_json::Value> =
        rows.iter().filter(|r| matches!(r["tool"].as_str(), Some("iperf3" | "sockperf"))).cloned().collect();
    let rss = crate::rss::medians(&programs, &run_kind, &stack_of);
    let res = serde_json::json!({
        "schema": "eudp-bench-apps/4", "started_unix": started, "secs_per_run": secs, "repeats": repeats,
        "note": "targets compare medians over the repeats; kernel, eudp, library-path and C floor runs are interleaved",
        "loadavg_before": load_before, "loadavg_after": crate::apps_baselines::loadavg(),
        "host": {"kernel": kernel, "cpus": cpus}, "preload_lib": lib.display().to_string(),
        "rows": rows, "targets": targets, "peak_rss": rss,
    });
    println!("{:<72} {:>8}", "target", "ratio");
    for t in res["targets"].as_array().into_iter().flatten() {
        println!(
            "{:<72} {:>8}  {}",
            t["target"].as_str().unwrap_or(""),
            t["ratio"].as_f64().map(|r| format!("{r:.2}")).unwrap_or("-".into()),
            if t["met"] == true { "MET" } else { "MISSED" }
        );
    }
    print!("{}", crate::rss::table(res["peak_rss"].as_array().map(Vec::as_slice).unwrap_or_default()));
    std::fs::create_dir_all(out_dir).map_err(|e| e.to_string())?;
    let path = out_dir.join(format!("apps-{started}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&res).unwrap_or_default()).map_err(|e| e.to_string())?;
    println!("wrote {}", path.display());
    if let Some(svg) = eudp_cli::bench_chart::write_beside(&path, &res)? {
        println!("wrote {}", svg.display());
    }
    let _ = std::fs::remove_dir_all(&stats);
    Ok(res)
}
