//! The soak's child processes and its clock.
//!
//! Every process starts through [`Proc::spawn`]: it is registered by name
//! and pid while it runs (for the RSS sampler and the faults), its stdout
//! is collected by a thread (a full pipe never blocks it), and the guard
//! kills and reaps it when dropped, so an error or a panic anywhere leaves
//! no process behind.

use serde_json::{json, Value};
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The run's clock: its start and length, and the flag that ends it early.
#[derive(Clone)]
pub struct Plan {
    pub t0: Instant,
    pub secs: f64,
    pub stop: Arc<AtomicBool>,
}

impl Plan {
    pub fn new(secs: f64) -> Plan {
        Plan { t0: Instant::now(), secs, stop: Arc::new(AtomicBool::new(false)) }
    }

    /// Seconds since the start.
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Seconds left of the run (0 once stopped).
    pub fn left(&self) -> f64 {
        if self.stopped() {
            0.0
        } else {
            (self.secs - self.now()).max(0.0)
        }
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Sleeps until `at` seconds after the start, in short steps so a stop
    /// is seen; false when the run stopped first.
    pub fn sleep_until(&self, at: f64) -> bool {
        while self.now() < at {
            if self.stopped() {
                return false;
            }
            std::thread::sleep(Duration::from_secs_f64((at - self.now()).clamp(0.0, 0.05)));
        }
        !self.stopped()
    }
}

/// One process's resident-set samples: `[seconds since start, VmRSS KiB, VmHWM KiB]`.
#[derive(Default)]
struct Series {
    pid: u32,
    samples: Vec<[f64; 3]>,
}

/// The processes running now (name, pid, sampled) and every sample taken.
#[derive(Default)]
pub struct Registry {
    live: Mutex<Vec<(String, u32, bool)>>,
    started: Mutex<Vec<(String, u32)>>,
    series: Mutex<Vec<(String, Series)>>,
    /// `[seconds since start, 1-, 5-, 15-minute load average]`.
    loadavg: Mutex<Vec<[f64; 4]>>,
}

impl Registry {
    /// Sends `sig` to the newest live process whose name starts with
    /// `prefix`; its pid, or None. Under the lock the process is not reaped.
    pub fn signal_newest(&self, prefix: &str, sig: i32) -> Option<u32> {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let (_, pid, _) = live.iter().rev().find(|(n, _, _)| n.starts_with(prefix))?;
        crate::sys::signal(*pid, sig).then_some(*pid)
    }

    /// Sends `sig` to `pid` if it is still a live process of the run.
    pub fn signal_pid(&self, pid: u32, sig: i32) -> bool {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        live.iter().any(|(_, p, _)| *p == pid) && crate::sys::signal(pid, sig)
    }

    /// Every process started, by name and pid, in order.
    pub fn started(&self) -> Vec<(String, u32)> {
        self.started.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Samples VmRSS and VmHWM of every sampled live process.
    pub fn sample(&self, t: f64) {
        let live = self.live.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (name, pid, sampled) in live {
            let Some((rss, hwm)) = sampled.then(|| vm_kib(pid)).flatten() else { continue };
            match series.iter_mut().find(|(n, s)| *n == name && s.pid == pid) {
                Some((_, s)) => s.samples.push([t, rss as f64, hwm as f64]),
                None => series.push((name, Series { pid, samples: vec![[t, rss as f64, hwm as f64]] })),
            }
        }
    }

    /// Samples `/proc/loadavg`: the machine is shared, and every figure of
    /// the run reads beside it.
    pub fn sample_loadavg(&self, t: f64) {
        let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
        let l: Vec<f64> = text.split_whitespace().take(3).filter_map(|x| x.parse().ok()).collect();
        if l.len() == 3 {
            self.loadavg.lock().unwrap_or_else(|e| e.into_inner()).push([t, l[0], l[1], l[2]]);
        }
    }

    /// The load averages sampled.
    pub fn loadavg(&self) -> Vec<[f64; 4]> {
        self.loadavg.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The samples as JSON, one object per process.
    pub fn series_json(&self) -> Vec<Value> {
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        series.iter().map(|(n, s)| json!({ "name": n, "pid": s.pid, "samples": s.samples })).collect()
    }
}

/// VmRSS and VmHWM of `pid`, KiB.
fn vm_kib(pid: u32) -> Option<(u64, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |k: &str| {
        text.lines().find_map(|l| l.strip_prefix(k)).and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Samples RSS every second and the load average every 10 s until the
/// plan stops (the caller's thread).
pub fn sampler(reg: Arc<Registry>, plan: Plan) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut next = 0.0;
        while !plan.stopped() {
            let now = plan.now();
            reg.sample(now);
            if (next as u64).is_multiple_of(10) {
                reg.sample_loadavg(now);
            }
            next += 1.0;
            plan.sleep_until(next);
        }
    })
}

/// A child process of the run (see the module docs).
pub struct Proc {
    child: Child,
    name: String,
    reg: Arc<Registry>,
    out: Option<JoinHandle<String>>,
    /// Seconds after the run's start it was spawned.
    pub at: f64,
}

impl Proc {
    /// Starts `cmd` as `name`; `sampled`: its RSS is sampled.
    pub fn spawn(
        reg: &Arc<Registry>,
        plan: &Plan,
        name: &str,
        mut cmd: Command,
        sampled: bool,
    ) -> Result<Proc, String> {
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
        let mut child = cmd.spawn().map_err(|e| format!("{name}: cannot start: {e}"))?;
        let pid = child.id();
        let out = child.stdout.take().map(|mut o| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = o.read_to_string(&mut s);
                s
            })
        });
        reg.live.lock().unwrap_or_else(|e| e.into_inner()).push((name.to_string(), pid, sampled));
        reg.started.lock().unwrap_or_else(|e| e.into_inner()).push((name.to_string(), pid));
        Ok(Proc { child, name: name.to_string(), reg: reg.clone(), out, at: plan.now() })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `limit` for the process to exit by itself; true if it did.
    pub fn wait_exit(&mut self, limit: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            if t0.elapsed() >= limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends the process: `sig` (0: none), up to `grace` to exit, then
    /// SIGKILL; returns what it wrote to stdout.
    pub fn stop(mut self, sig: i32, grace: Duration) -> String {
        if sig != 0 && !self.wait_exit(Duration::ZERO) {
            self.reg.signal_pid(self.pid(), sig);
        }
        self.wait_exit(grace);
        self.reap();
        self.out.take().and_then(|h| h.join().ok()).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to finish by itself (then kills
    /// it); its stdout, or an error naming it when it had to be killed.
    pub fn finish(self, limit: Duration) -> Result<String, String> {
        let name = self.name.clone();
        let mut me = self;
        let done = me.wait_exit(limit);
        let out = me.stop(0, Duration::ZERO);
        if done {
            Ok(out)
        } else {
            Err(format!("{name} did not finish within {limit:?}"))
        }
    }

    /// Deregisters, kills (a no-op once it exited) and reaps.
    fn reap(&mut self) {
        let pid = self.pid();
        self.reg.live.lock().unwrap_or_else(|e| e.into_inner()).retain(|(_, p, _)| *p != pid);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.reap();
    }
}
