//! `eudp bench --soak MINUTES`: every workload at once under the shim, for
//! minutes, with faults on a schedule, on one testbed.
//!
//! iperf3 UDP (rate-limited, restarted every ≤ 30 s), sockperf ping-pong,
//! dnsmasq queried by a loop and a fork-heavy program run side by side
//! ([`workloads`]). Faults: dnsmasq is killed and started again at 30 % of
//! the run, a CPU hog takes the receivers' CPU at 50 % (20 s at most) and
//! the iperf3 receiver is stopped for 2 s at 70 %. Each second the RSS of
//! every program is sampled ([`procs`]); at the end the programs' `eudp
//! stat` reports are read, and [`report`] judges the targets. The JSON
//! goes to `soak-<unix time>.json` (docs/bench.md). Every process is killed
//! and reaped, and the testbed torn down, whatever happens.

pub mod kernel;
pub mod memory;
pub mod procs;
pub mod report;
pub mod workloads;

use procs::{Plan, Registry};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use workloads::Env;

const SOAKFORK_C: &str = include_str!("../c/soakfork.c");
const DNSLOOP_PY: &str = include_str!("dnsloop.py");

/// The programs the soak runs.
const TOOLS: &[&str] = &["iperf3", "sockperf", "dnsmasq", "taskset"];

/// Faults at fractions of the run, and how long each lasts at most.
const RESTART_AT: f64 = 0.3;
const HOG_AT: f64 = 0.5;
const HOG_SECS: f64 = 20.0;
const PAUSE_AT: f64 = 0.7;
const PAUSE_SECS: f64 = 2.0;
/// The paused iperf3 run has at least this long left after the pause
/// (a twentieth of the soak when shorter).
const PAUSE_ROOM_SECS: f64 = 3.0;

fn missing_tools() -> Vec<&'static str> {
    let on_path =
        |t: &str| std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(t).is_file()));
    let mut m: Vec<&str> = TOOLS.iter().copied().filter(|t| !on_path(t)).collect();
    if !Path::new("/usr/bin/python3").exists() {
        m.push("/usr/bin/python3");
    }
    m
}

/// The CPU hog and the receivers' pause, on schedule; what was done.
fn faults(env: &Env) -> Vec<Value> {
    let plan = &env.plan;
    let mut done = Vec::new();
    let hog_secs = HOG_SECS.min(plan.secs * 0.1);
    if plan.sleep_until(plan.secs * HOG_AT) {
        let at = plan.now();
        let r = workloads::cpu_hog(env, hog_secs);
        done.push(json!({ "fault": "cpu hog", "workload": "all", "cpu": env.cpu, "at_s": at,
                          "for_s": plan.now() - at, "error": r.err() }));
    }
    let pause = PAUSE_SECS.min(plan.secs * 0.1);
    if plan.sleep_until(plan.secs * PAUSE_AT) {
        // A server whose run ends inside the pause would close with its
        // socket full, which tests a close, not a pause: the pause waits
        // for a run with room left (between two runs, for the next), and
        // takes any running server once the soak has no time to wait.
        let room = PAUSE_ROOM_SECS.min(plan.secs * 0.05);
        let last_chance = (plan.now() + 40.0).min(plan.secs - pause - 1.0);
        let mut target = None;
        let mut left_after = None;
        while target.is_none() && plan.now() < plan.secs && !plan.stopped() {
            let now = *env.iperf3_now.lock().unwrap_or_else(|e| e.into_inner());
            let t = plan.now();
            if let Some((pid, end)) = now.filter(|(_, end)| end - t >= pause + room || t >= last_chance) {
                if env.reg.signal_pid(pid, libc::SIGSTOP) {
                    target = Some(pid);
                    left_after = Some(end - t - pause);
                }
            }
            if target.is_none() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        }
        let at = plan.now();
        if let Some(pid) = target {
            std::thread::sleep(std::time::Duration::from_secs_f64(pause));
            env.reg.signal_pid(pid, libc::SIGCONT);
        }
        done.push(json!({ "fault": "receiver paused (SIGSTOP, SIGCONT)", "workload": "iperf3", "pid": target,
                          "at_s": at, "for_s": plan.now() - at, "run_left_after_pause_s": left_after,
                          "error": target.is_none().then_some("no iperf3 receiver to pause") }));
    }
    done
}

/// Runs the soak for `minutes` and writes its JSON into `out_dir`; the
/// result and the file.
pub fn run(minutes: f64, out_dir: &Path) -> Result<(Value, PathBuf), String> {
    if !(minutes > 0.0 && minutes <= 24.0 * 60.0) {
        return Err(format!("--soak {minutes}: give minutes between 0 and 1440"));
    }
    if !crate::testbed::is_root() {
        return Err("the soak needs root (network namespaces)".into());
    }
    let missing = missing_tools();
    if !missing.is_empty() {
        return Err(format!("the soak needs {} (scripts/deps.sh installs them)", missing.join(", ")));
    }
    let lib = crate::run::preload_lib()?;
    let soakfork = crate::rss::compile("soakfork", SOAKFORK_C)?;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let work = std::env::temp_dir().join(format!("eudp-soak-{}-{started}", std::process::id()));
    let stat_dir = work.join("stat");
    std::fs::create_dir_all(&stat_dir).map_err(|e| format!("{}: {e}", stat_dir.display()))?;
    let dnsloop = work.join("dnsloop.py");
    std::fs::write(&dnsloop, DNSLOOP_PY).map_err(|e| format!("{}: {e}", dnsloop.display()))?;
    let result = soak(minutes, lib, stat_dir, soakfork, dnsloop, started);
    let _ = std::fs::remove_dir_all(&work);
    let res = result?;
    print!("{}", summary(&res));
    std::fs::create_dir_all(out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    let path = out_dir.join(format!("soak-{started}.json"));
    std::fs::write(&path, serde_json::to_vec_pretty(&res).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((res, path))
}

fn soak(
    minutes: f64,
    lib: PathBuf,
    stat_dir: PathBuf,
    soakfork: PathBuf,
    dnsloop: PathBuf,
    started: u64,
) -> Result<Value, String> {
    let base = crate::testbed::unique_name("sk");
    let mut beds = Vec::new();
    for (w, letter) in workloads::WORKLOADS {
        beds.push((*w, crate::testbed::Testbed::up(&format!("{base}-{letter}"))?));
    }
    let cpus = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let reg = Arc::new(Registry::default());
    let plan = Plan::new(minutes * 60.0);
    let env = Env {
        beds,
        lib,
        stat_dir,
        reg: reg.clone(),
        plan: plan.clone(),
        cpu: cpus - 1,
        soakfork,
        dnsloop,
        iperf3_now: Default::default(),
    };
    eprintln!("soak: {:.0} s on testbeds {base}-*", plan.secs);
    let before: Vec<kernel::Snapshot> = env.beds.iter().map(|(_, tb)| kernel::snapshot(tb)).collect();
    let (iperf3, sockperf, dns, fork, (control, control_dns, control_fork), faults) = std::thread::scope(|s| {
        let sampler = procs::sampler(reg.clone(), plan.clone());
        let i = s.spawn(|| workloads::iperf3(&env));
        let p = s.spawn(|| workloads::sockperf(&env));
        let c = s.spawn(|| workloads::control(&env));
        let d = s.spawn(|| workloads::dns(&env, plan.secs * RESTART_AT, ""));
        let f = s.spawn(|| workloads::fork(&env, ""));
        // The same DNS and fork programs without the shim: the stalls the
        // loaded host causes by itself.
        let cd = s.spawn(|| workloads::dns(&env, plan.secs * RESTART_AT, "control-"));
        let cf = s.spawn(|| workloads::fork(&env, "control-"));
        let x = s.spawn(|| faults(&env));
        let join = |h: std::thread::ScopedJoinHandle<'_, Value>| {
            h.join().unwrap_or_else(|_| json!({ "error": "the workload's thread panicked" }))
        };
        let control = (join(c), join(cd), join(cf));
        let r = (join(i), join(p), join(d), join(f), control, x.join().unwrap_or_default());
        plan.stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        r
    });
    let secs = plan.now();
    reg.sample_loadavg(secs);
    // Each workload's counters over the whole run, in its own namespaces.
    let mut kernel_run = serde_json::Map::new();
    for ((w, tb), b) in env.beds.iter().zip(&before) {
        kernel_run.insert(
            w.to_string(),
            json!({ "testbed": tb.name, "delta": kernel::to_json(&kernel::delta(b, &kernel::snapshot(tb)), false) }),
        );
    }
    let kernel_run = Value::Object(kernel_run);
    let mut fault_log = faults;
    for (w, name) in [(&control_dns, "control-dns"), (&dns, "dns")] {
        if w["restart"].is_object() {
            let mut r = w["restart"].clone();
            r["workload"] = name.into();
            fault_log.insert(0, r);
        }
    }
    let reports = crate::stat_report::read_reports(&env.stat_dir, true, &[]);
    drop(env);
    let workloads = json!({ "iperf3": iperf3, "sockperf": sockperf, "dns": dns, "fork": fork, "control": control,
                            "control_dns": control_dns, "control_fork": control_fork });
    let counters = report::counters(&reports, &reg.started());
    let balance = report::balance(&workloads, &counters, &kernel_run);
    let rss = memory::rss(reg.series_json(), plan.secs);
    let stalls = report::stalls(&workloads, &fault_log);
    let targets = report::targets(&balance, &rss, &stalls);
    let osrelease = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_string();
    Ok(json!({
        "schema": "eudp-bench-soak/2", "started_unix": started, "minutes": minutes, "secs": secs,
        "host": { "kernel": osrelease, "cpus": cpus }, "testbed": base, "stack": "eudp (default profile), every program but the control",
        "receivers_cpu": cpus - 1, "loadavg": memory::loadavg(reg.loadavg()),
        "kernel_counters": kernel_run,
        "faults": fault_log, "workloads": workloads, "balance": balance, "stalls": stalls, "rss": rss,
        "counters": counters, "targets": targets,
    }))
}

/// The outcome in a few lines: per workload what moved, then the targets.
pub fn summary(res: &Value) -> String {
    let mut s = String::new();
    for b in res["balance"].as_array().into_iter().flatten() {
        s += &format!(
            "soak {:<9} sent {:>10} received {:>10} counted drops {:>8}  {}{}\n",
            b["workload"].as_str().unwrap_or(""),
            b["sent"],
            b["received"],
            b["counted_drops"],
            if b["balanced"] == true { "balanced" } else { "unbalanced" },
            if b["exact"] == true { "" } else { " (not exact, see its \"how\")" }
        );
        if b["balanced"] != true {
            s += &format!(
                "soak {:<9} off by {}: {}; kernel, own namespaces {}, host-wide {}\n",
                "",
                b["kernel"]["off_by"],
                b["kernel"]["verdict"].as_str().unwrap_or(""),
                b["kernel"]["own_namespaces"],
                b["kernel"]["shared_host_wide"]
            );
        }
    }
    for st in res["stalls"].as_array().into_iter().flatten() {
        let ms = |v: &Value| v.as_f64().map(|x| format!("{x:.0} ms")).unwrap_or("-".into());
        s += &format!(
            "soak {:<9} longest stall {:>9} (for the verdict, besides its own faults {:>9})\n",
            st["workload"].as_str().unwrap_or(""),
            ms(&st["longest_ms"]),
            ms(&st["longest_not_own_fault_ms"])
        );
    }
    s += &format!("soak peak RSS {} KiB\n", res["rss"]["max_rss_kib"]);
    for t in res["targets"].as_array().into_iter().flatten() {
        s += &format!(
            "target {:<100} {}  {}\n",
            t["target"].as_str().unwrap_or(""),
            t["measured"],
            if t["met"] == true { "MET" } else { "MISSED" }
        );
    }
    s
}
