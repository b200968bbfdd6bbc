//! `eudp bench --sockets [--count N]`: one program with N UDP sockets (a
//! DNS server's shape), on the kernel and under the shim, side by side.
//!
//! The server (`src/c/dnsd.c`, compiled here) binds N sockets on
//! 127.0.0.1, registers them in one epoll set and answers one query per
//! socket from a client on the kernel stack, which checks that each answer
//! came from the socket it asked. The server runs under the RSS wrapper
//! ([`crate::rss`]), which sets its `RLIMIT_NOFILE` so the result does not
//! depend on the caller's limits, and reports its peak RSS. The soft limit
//! is what the kernel run needs plus headroom, for every run. The kernel
//! and `eudp` runs have hard = soft: the shim has no descriptor to spare
//! and must keep sockets on the kernel path rather than fail. The
//! `eudp-room` run (when this process's own hard limit is higher) keeps
//! that hard limit, as a service's usual limits (soft low, hard high) do,
//! so the shim places its descriptors above the soft limit. Each shim run
//! also reports how many sockets the engine carried (its stat report). A stack that cannot open, register or answer every socket is
//! reported with the error, never skipped. Schema: `docs/bench.md`.

use crate::rss;
use serde::Serialize;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DNSD_C: &str = include_str!("c/dnsd.c");

/// Descriptors the server needs besides its sockets: stdin/out/err, the
/// epoll set, the port file, and `/proc/self/fd` and `/proc/self/status`
/// for its own figures.
pub const BASE_FDS: u64 = 7;

/// One stack's run.
#[derive(Debug, Clone, Serialize)]
pub struct StackRun {
    /// `kernel`, `eudp` (the environment `eudp run` sets, default profile)
    /// or `eudp-room` (the same with a higher hard limit).
    pub stack: String,
    /// The server's RLIMIT_NOFILE, soft and hard.
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    /// Shim runs: sockets the engine carried, sockets left on (or moved to)
    /// the kernel path, and why (the shim's final stat report).
    pub accelerated: Option<u64>,
    pub fallbacks: Option<u64>,
    pub fallback_reasons: serde_json::Value,
    /// Every socket opened, registered and answered its query.
    pub success: bool,
    /// Why not, when not.
    pub error: Option<String>,
    pub opened: u64,
    /// Sockets whose answer the client received and checked.
    pub answered: u64,
    /// Server: socket + bind + epoll_ctl of all sockets, seconds.
    pub open_secs: Option<f64>,
    /// Client: first query sent to last answer received, seconds.
    pub answer_secs: Option<f64>,
    /// Peak RSS of the server process (wait4 ru_maxrss), KiB.
    pub peak_rss_kib: Option<u64>,
    /// The server's own VmHWM read just before it printed its result, KiB.
    pub vmhwm_kib: Option<u64>,
    /// Descriptors open in the server once every socket is open (or at the
    /// failure), its own two /proc files not counted.
    pub fds_in_use: Option<u64>,
    /// Server CPU seconds (user + system), whole run.
    pub cpu_secs: Option<f64>,
    /// The server's and the client's result lines, as printed.
    pub server: serde_json::Value,
    pub client: serde_json::Value,
}

/// eudp / kernel of each figure (null unless both ran and are non-zero).
#[derive(Debug, Clone, Serialize)]
pub struct Ratios {
    pub open_secs: Option<f64>,
    pub answer_secs: Option<f64>,
    pub peak_rss_kib: Option<f64>,
    pub fds_in_use: Option<f64>,
}

/// The result file.
#[derive(Debug, Clone, Serialize)]
pub struct SocketsBench {
    pub schema: &'static str,
    pub started_unix: u64,
    pub count: u64,
    /// The server's soft RLIMIT_NOFILE in every run (hard: per run).
    pub nofile_limit: u64,
    /// Queries the client has outstanding at a time.
    pub window: u64,
    pub host: serde_json::Value,
    pub preload_lib: Option<String>,
    pub runs: Vec<StackRun>,
    pub eudp_over_kernel: Ratios,
    /// The same for the `eudp-room` run (null when it did not run).
    pub eudp_room_over_kernel: Option<Ratios>,
}

pub struct SocketsArgs {
    pub count: u64,
    pub out_dir: Option<PathBuf>,
    /// The shim; `None` finds it as `eudp run` does.
    pub lib: Option<PathBuf>,
    /// RLIMIT_NOFILE of the server; `None`: what the kernel run needs
    /// plus headroom ([`nofile_for`]).
    pub nofile: Option<u64>,
}

/// The server's RLIMIT_NOFILE for `count` sockets: its sockets and other
/// descriptors ([`BASE_FDS`]) plus 64 or 2%, whichever is more.
pub fn nofile_for(count: u64) -> u64 {
    count + BASE_FDS + 64.max(count / 50)
}

/// Kills and reaps the server if the bench returns early.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn num(v: &serde_json::Value, k: &str) -> Option<f64> {
    v[k].as_f64()
}

/// One stack: server under the wrapper with `env`, then the client.
fn run_stack(
    stack: &str,
    env: Result<Vec<std::ffi::OsString>, String>,
    dnsd: &Path,
    wrapper: &Path,
    count: u64,
    nofile: (u64, u64),
    window: u64,
) -> StackRun {
    let mut r = StackRun {
        stack: stack.into(),
        nofile_soft: nofile.0,
        nofile_hard: nofile.1,
        accelerated: None,
        fallbacks: None,
        fallback_reasons: serde_json::Value::Null,
        success: false,
        error: None,
        opened: 0,
        answered: 0,
        open_secs: None,
        answer_secs: None,
        peak_rss_kib: None,
        vmhwm_kib: None,
        fds_in_use: None,
        cpu_secs: None,
        server: serde_json::Value::Null,
        client: serde_json::Value::Null,
    };
    let env = match env {
        Ok(e) => e,
        Err(e) => {
            r.error = Some(e);
            return r;
        }
    };
    let ports = std::env::temp_dir().join(format!("eudp-sockbench-{}-{stack}.ports", std::process::id()));
    let usage = rss::report_path(&format!("sockets-{stack}"));
    let _ = std::fs::remove_file(&ports);
    // Time bounds grow with the count (opening 10 000 sockets under a slow
    // stack takes seconds), and are only there to end a hung run.
    let secs = 30.0 + count as f64 / 200.0;
    let mut c = Command::new(wrapper);
    rss::wrap_args(
        &mut c,
        &usage,
        Some(nofile),
        &env,
        &[&dnsd.display().to_string(), "serve", &count.to_string(), &ports.display().to_string(), &format!("{secs}")],
    );
    // stderr to a file: a program that writes much there must not block on a pipe nobody reads yet.
    let errf = std::env::temp_dir().join(format!("eudp-sockbench-{}-{stack}.err", std::process::id()));
    let errw = match std::fs::File::create(&errf) {
        Ok(f) => f,
        Err(e) => {
            r.error = Some(format!("{}: {e}", errf.display()));
            return r;
        }
    };
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(errw);
    let child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            r.error = Some(format!("cannot start the server: {e}"));
            return r;
        }
    };
    let mut srv = Server(child);
    let mut out = BufReader::new(srv.0.stdout.take().expect("piped stdout"));
    let mut first = String::new();
    let _ = out.read_line(&mut first);
    if first.trim() == "ready" {
        let cl = Command::new(dnsd)
            .args(["query", &ports.display().to_string(), &window.to_string(), &format!("{secs}")])
            .env_remove("LD_PRELOAD")
            .stdin(Stdio::null())
            .output();
        match cl {
            Ok(o) => {
                r.client = serde_json::from_slice(String::from_utf8_lossy(&o.stdout).trim().as_bytes())
                    .unwrap_or(serde_json::Value::Null)
            }
            Err(e) => r.error = Some(format!("cannot start the client: {e}")),
        }
    }
    // The server exits once every socket has answered, or at its deadline.
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    let t0 = Instant::now();
    while srv.0.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(srv);
    let err = std::fs::read_to_string(&errf).unwrap_or_default();
    let _ = std::fs::remove_file(&errf);
    // The last lines are enough to say why.
    let err: String = err.lines().rev().take(5).collect::<Vec<_>>().into_iter().rev().collect::<Vec<_>>().join(" | ");
    let _ = std::fs::remove_file(&ports);
    let line =
        [first.as_str(), rest.as_str()].iter().flat_map(|s| s.lines()).find(|l| l.starts_with('{')).map(str::to_string);
    r.server = line.as_deref().and_then(|l| serde_json::from_str(l).ok()).unwrap_or(serde_json::Value::Null);
    let u = rss::take_usage(&usage);
    r.peak_rss_kib = u.as_ref().map(|u| u.max_rss_kib);
    r.cpu_secs = u.as_ref().map(|u| u.user_secs + u.sys_secs);
    let s = &r.server;
    r.opened = num(s, "opened").unwrap_or(0.0) as u64;
    r.open_secs = num(s, "open_secs");
    r.fds_in_use = num(s, "fds_in_use").filter(|&x| x >= 0.0).map(|x| x as u64);
    r.vmhwm_kib = num(s, "vmhwm_kib").filter(|&x| x > 0.0).map(|x| x as u64);
    r.answered = num(&r.client, "answered").unwrap_or(0.0) as u64;
    r.answer_secs = num(&r.client, "secs").filter(|_| r.answered > 0);
    if r.error.is_none() {
        r.error = s["error"].as_str().map(str::to_string).or_else(|| {
            if s.is_null() {
                let how = u.as_ref().map(|u| {
                    if u.signal != 0 {
                        format!("killed by signal {}", u.signal)
                    } else {
                        format!("exit code {}", u.exit_code)
                    }
                });
                Some(format!(
                    "server gave no result ({}): {}",
                    how.unwrap_or_else(|| "did not finish".into()),
                    err.trim()
                ))
            } else if r.answered < count {
                Some(format!(
                    "{} of {count} sockets answered (server counted {})",
                    r.answered,
                    num(s, "answered").unwrap_or(0.0)
                ))
            } else {
                None
            }
        });
    }
    r.success = r.error.is_none() && r.opened == count && r.answered == count;
    r
}

/// Runs the bench: kernel, then the shim; writes `sockets-<time>.json`.
pub fn run(args: &SocketsArgs) -> Result<(SocketsBench, Option<PathBuf>), String> {
    let count = args.count.max(1);
    let dnsd = rss::compile("dnsd", DNSD_C)?;
    let wrapper = rss::wrapper()?;
    let nofile = args.nofile.unwrap_or_else(|| nofile_for(count));
    let window = 64;
    let started_unix =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let lib = match &args.lib {
        Some(l) => Ok(l.clone()),
        None => crate::run::preload_lib(),
    };
    let own_hard = own_hard_nofile();
    let mut plan: Vec<(&str, bool, (u64, u64))> =
        vec![("kernel", false, (nofile, nofile)), ("eudp", true, (nofile, nofile))];
    if own_hard > nofile {
        plan.push(("eudp-room", true, (nofile, own_hard)));
    }
    let mut runs = Vec::new();
    for (stack, shim, limits) in plan {
        let stat_dir = std::env::temp_dir().join(format!("eudp-sockbench-stat-{}-{stack}", std::process::id()));
        let _ = std::fs::remove_dir_all(&stat_dir);
        let _ = std::fs::create_dir_all(&stat_dir);
        let env = if shim {
            lib.clone().map(|l| crate::run::stack_env(crate::run::Stack::Eudp("default"), &l, &stat_dir))
        } else {
            Ok(Vec::new())
        };
        eprint!("bench: {count} sockets on {stack} (RLIMIT_NOFILE {}:{}) ... ", limits.0, limits.1);
        let mut r = run_stack(stack, env, &dnsd, &wrapper, count, limits, window);
        if shim {
            shim_report(&stat_dir, &mut r);
        }
        let _ = std::fs::remove_dir_all(&stat_dir);
        let carried = r.accelerated.map(|a| format!(", {a} on the engine")).unwrap_or_default();
        match &r.error {
            None => eprintln!(
                "{} answered, open {:.3} s, answer {:.3} s, peak RSS {} KiB{carried}",
                r.answered,
                r.open_secs.unwrap_or(0.0),
                r.answer_secs.unwrap_or(0.0),
                r.peak_rss_kib.unwrap_or(0)
            ),
            Some(e) => eprintln!("FAILED: {e}{carried}"),
        }
        runs.push(r);
    }
    let ratios = |stack: &str| {
        let ratio = |f: &dyn Fn(&StackRun) -> Option<f64>| match (
            runs.iter().find(|r| r.stack == stack),
            runs.iter().find(|r| r.stack == "kernel"),
        ) {
            (Some(e), Some(k)) if e.success && k.success => {
                f(e).zip(f(k)).filter(|(_, k)| *k > 0.0).map(|(e, k)| e / k)
            }
            _ => None,
        };
        Ratios {
            open_secs: ratio(&|r| r.open_secs),
            answer_secs: ratio(&|r| r.answer_secs),
            peak_rss_kib: ratio(&|r| r.peak_rss_kib.map(|x| x as f64)),
            fds_in_use: ratio(&|r| r.fds_in_use.map(|x| x as f64)),
        }
    };
    let eudp_over_kernel = ratios("eudp");
    let eudp_room_over_kernel = runs.iter().any(|r| r.stack == "eudp-room").then(|| ratios("eudp-room"));
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let env: Vec<(String, String)> = std::env::vars().filter(|(k, _)| k.starts_with("EUDP_")).collect();
    let res = SocketsBench {
        schema: "eudp-bench-sockets/2",
        started_unix,
        count,
        nofile_limit: nofile,
        window,
        host: serde_json::json!({ "kernel": kernel, "cpus": cpus, "eudp_env": env }),
        preload_lib: lib.ok().map(|l| l.display().to_string()),
        runs,
        eudp_over_kernel,
        eudp_room_over_kernel,
    };
    let mut path = None;
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let p = dir.join(format!("sockets-{started_unix}.json"));
        std::fs::write(&p, serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?)
            .map_err(|e| format!("{}: {e}", p.display()))?;
        path = Some(p);
    }
    Ok((res, path))
}

/// This process's hard RLIMIT_NOFILE (the most a child can be given).
fn own_hard_nofile() -> u64 {
    let s = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(4))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Reads the shim's final stat report of the server (the only process
/// under the shim: the client runs without it) into `r`.
fn shim_report(dir: &Path, r: &mut StackRun) {
    if let Some(v) = crate::stat_report::read_reports(dir, true, &[]).into_iter().find(|v| v["accelerated"].is_u64()) {
        r.accelerated = v["accelerated"].as_u64();
        r.fallbacks = v["fallbacks"].as_u64();
        r.fallback_reasons = v["fallback_reasons"].clone();
    }
}

/// The printed table.
pub fn table(res: &SocketsBench) -> String {
    let f = |v: Option<f64>, p: usize| v.map(|x| format!("{x:.p$}")).unwrap_or_else(|| "-".into());
    let mut s = format!("{} UDP sockets in one epoll set, RLIMIT_NOFILE soft {}\n", res.count, res.nofile_limit);
    s += &format!(
        "{:<9} {:>7} {:>7} {:>9} {:>9} {:>10} {:>12} {:>13} {:>9}  {}\n",
        "stack", "hard", "opened", "answered", "on engine", "open s", "answer s", "peak RSS KiB", "fds", "result"
    );
    for r in &res.runs {
        s += &format!(
            "{:<9} {:>7} {:>7} {:>9} {:>9} {:>10} {:>12} {:>13} {:>9}  {}\n",
            r.stack,
            r.nofile_hard,
            r.opened,
            r.answered,
            r.accelerated.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            f(r.open_secs, 4),
            f(r.answer_secs, 4),
            r.peak_rss_kib.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            r.fds_in_use.map(|x| x.to_string()).unwrap_or_else(|| "-".into()),
            r.error.as_deref().map(|e| format!("FAILED: {e}")).unwrap_or_else(|| "ok".into())
        );
    }
    for (name, q) in [("eudp", Some(&res.eudp_over_kernel)), ("eudp-room", res.eudp_room_over_kernel.as_ref())] {
        let Some(q) = q else { continue };
        s += &format!(
            "{name}/kernel: open {}x, answer {}x, peak RSS {}x, fds {}x\n",
            f(q.open_secs, 2),
            f(q.answer_secs, 2),
            f(q.peak_rss_kib, 2),
            f(q.fds_in_use, 2)
        );
    }
    s
}
