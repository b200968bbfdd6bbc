//! The harness: runs this binary as the program under test (libc, then
//! the shim) on each transport, takes criterion's median per call and
//! callgrind's instruction count per call, and writes them side by side.

use super::fixture::HOOKS;
use super::COUNTED;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

/// A namespace with a veth whose peer is in a second namespace, for the xdp
/// transport to attach to (never a host interface); removed on drop.
struct Ns {
    name: String,
    peer: String,
    dev: String,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip").args(args).output().map_err(|e| format!("ip(8): {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr).trim()))
    }
}

impl Ns {
    fn new() -> Result<Ns, String> {
        let id = std::process::id() % 100_000;
        let n = Ns { name: format!("hbx{id}"), peer: format!("hby{id}"), dev: format!("vhx{id}") };
        for ns in [&n.name, &n.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ip(&["netns", "add", ns])?;
        }
        let peer_dev = format!("vhy{id}");
        ip(&["link", "add", &n.dev, "netns", &n.name, "type", "veth", "peer", "name", &peer_dev, "netns", &n.peer])?;
        ip(&["-n", &n.name, "addr", "add", "198.18.0.1/24", "dev", &n.dev])?;
        ip(&["-n", &n.name, "link", "set", &n.dev, "up"])?;
        ip(&["-n", &n.peer, "link", "set", &peer_dev, "up"])?;
        ip(&["-n", &n.name, "link", "set", "lo", "up"])?;
        Ok(n)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        for ns in [&self.name, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

struct Target<'a> {
    transport: &'a str,
    ns: Option<&'a Ns>,
    lib: Option<&'a Path>,
}

impl Target<'_> {
    /// This binary in `role` (under `tool`, e.g. valgrind, when given),
    /// with the shim preloaded when `lib` is set; stats go to `stats`.
    fn command(&self, role: &str, tool: &[String], stats: &Path) -> Command {
        let mut argv: Vec<String> = Vec::new();
        if let Some(ns) = self.ns {
            argv.extend(["ip", "netns", "exec", &ns.name].map(String::from));
        }
        argv.push("env".into());
        if let Some(lib) = self.lib {
            argv.push(format!("LD_PRELOAD={}", lib.display()));
            argv.push("EUDP_HOOKS_SHIM=1".into());
        }
        argv.extend(tool.iter().cloned());
        argv.push(std::env::current_exe().expect("own path").display().to_string());
        let mut c = Command::new(&argv[0]);
        c.args(&argv[1..])
            .env("EUDP_HOOKS_ROLE", role)
            .env("EUDP_STAT_DIR", stats)
            .env("EUDP_STAT_MS", "200")
            .env("EUDP_TRANSPORT", self.transport);
        if let Some(ns) = self.ns {
            c.env("EUDP_XDP_IFACE", &ns.dev);
        }
        c
    }

    /// Criterion's median ns per call of every hook.
    fn times(&self, scratch: &Path) -> Result<Value, String> {
        let home = scratch.join("criterion");
        let out = self
            .command("time", &[], scratch)
            .env("CRITERION_HOME", &home)
            .status()
            .map_err(|e| format!("spawn: {e}"))?;
        if !out.success() {
            return Err(format!("timing run: {out}"));
        }
        let mut v = serde_json::Map::new();
        for hook in HOOKS {
            let p = home.join("hooks").join(hook).join("new/estimates.json");
            let e: Value = std::fs::read_to_string(&p)
                .ok()
                .and_then(|s| serde_json::from_str(&s).ok())
                .ok_or(format!("no estimate at {}", p.display()))?;
            v.insert(hook.to_string(), e["median"]["point_estimate"].clone());
        }
        Ok(Value::Object(v))
    }

    /// Callgrind's instructions per call of `hook` (the measuring thread's
    /// only, inside the measured loop).
    /// Also the loads the engine had not taken off the socket in time
    /// (then some counted receives read the socket themselves).
    fn instructions(&self, hook: &str, scratch: &Path) -> Result<(f64, u64), String> {
        let file = scratch.join(format!("callgrind.{hook}.out"));
        let tool: Vec<String> = [
            "valgrind",
            "--tool=callgrind",
            "--collect-atstart=no",
            "--toggle-collect=eudp_hooks_measured",
            &format!("--callgrind-out-file={}", file.display()),
        ]
        .map(String::from)
        .to_vec();
        let o = self
            .command("count", &tool, scratch)
            .env("EUDP_HOOKS_HOOK", hook)
            .output()
            .map_err(|e| format!("spawn valgrind: {e}"))?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(format!("callgrind run: {}: {}", o.status, err.lines().last().unwrap_or("")));
        }
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let total = text
            .lines()
            .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
            .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
            .ok_or("no totals line in the callgrind output")?;
        let unsettled = String::from_utf8_lossy(&o.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("unsettled ")?.trim().parse().ok())
            .unwrap_or(0);
        Ok((total / COUNTED as f64, unsettled))
    }
}

/// What the shim's reports under `stats` say: sockets on the engine, and
/// why the xdp transport did not start, if it did not.
fn shim_state(stats: &Path) -> Value {
    let mut accelerated = 0;
    let mut unavailable = Vec::new();
    for e in std::fs::read_dir(stats).into_iter().flatten().flatten() {
        let Some(r) = std::fs::read_to_string(e.path()).ok().and_then(|s| serde_json::from_str::<Value>(&s).ok())
        else {
            continue;
        };
        accelerated += r["accelerated"].as_u64().unwrap_or(0);
        if let Some(u) = r["xdp"]["unavailable"].as_str() {
            unavailable.push(u.to_string());
        }
    }
    json!({"accelerated_sockets": accelerated, "xdp_unavailable": unavailable})
}

fn scratch(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eudp-hooks-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

pub fn run() {
    let root = workspace();
    let lib = std::env::var_os("EUDP_PRELOAD_LIB")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/libeudp_preload.so"));
    assert!(lib.exists(), "{} not built (cargo build --release -p eudp-preload)", lib.display());
    let out = std::env::var_os("EUDP_HOOKS_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("bench/results/shim-hooks.json"));
    let counting = Command::new("valgrind").arg("--version").output().is_ok_and(|o| o.status.success());
    let load_before = loadavg();
    let mut rows = Vec::new();
    let mut skipped = Vec::new();
    for transport in ["kernel", "xdp"] {
        let ns = match transport {
            "xdp" => match Ns::new() {
                Ok(ns) => Some(ns),
                Err(e) => {
                    eprintln!("xdp transport skipped: {e}");
                    skipped.push(json!({"transport": transport, "reason": e}));
                    continue;
                }
            },
            _ => None,
        };
        let mut per_mode = Vec::new();
        for preload in [None, Some(lib.as_path())] {
            let t = Target { transport, ns: ns.as_ref(), lib: preload };
            let dir = scratch(&format!("{transport}-{}", if preload.is_some() { "shim" } else { "libc" }));
            let times = t.times(&dir).unwrap_or_else(|e| json!({"error": e}));
            let state = if preload.is_some() { shim_state(&dir) } else { Value::Null };
            let mut ir = serde_json::Map::new();
            for hook in HOOKS.iter().filter(|_| counting) {
                let (v, late) = match t.instructions(hook, &dir) {
                    Ok((v, late)) => (Value::from(v), late),
                    Err(e) => (json!({"error": e}), 0),
                };
                eprintln!("{transport} {} {hook}: {v} Ir/call", if preload.is_some() { "shim" } else { "libc" });
                ir.insert(hook.to_string(), v);
                ir.insert(format!("{hook}.unsettled"), late.into());
            }
            per_mode.push((times, Value::Object(ir), state));
            let _ = std::fs::remove_dir_all(&dir);
        }
        let Ok::<[_; 2], _>([(lt, li, _), (st, si, state)]) = per_mode.try_into() else { unreachable!("two modes") };
        for hook in HOOKS {
            let (a, b) = (&lt[hook], &st[hook]);
            let (x, y) = (&li[hook], &si[hook]);
            rows.push(json!({
                "transport": transport,
                "hook": hook,
                "ns_per_call": {"libc": a, "shim": b},
                "ns_ratio_shim_to_libc": a.as_f64().zip(b.as_f64()).map(|(a, b)| b / a),
                "ir_per_call": {"libc": x, "shim": y},
                "ir_added_by_shim": x.as_f64().zip(y.as_f64()).map(|(x, y)| y - x),
                "ir_unsettled_loads": si[format!("{hook}.unsettled")],
            }));
        }
        rows.push(
            json!({"transport": transport, "shim": state, "timing_errors": {"libc": lt["error"], "shim": st["error"]}}),
        );
    }
    let report = json!({
        "what": "per-call cost of the shim's hot hooks against plain libc: 64 B datagrams over loopback \
                 (inside a namespace whose veth the xdp transport attaches to, for the xdp rows); \
                 waits on a socket with a datagram ready; ns = criterion median; Ir = callgrind \
                 user-space instructions per call of the calling thread (the kernel's work is not counted)",
        "label": std::env::var("EUDP_HOOKS_LABEL").unwrap_or_default(),
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "counted_calls": COUNTED,
        "instructions_counted": counting,
        "skipped": skipped,
        "rows": rows,
    });
    if let Some(d) = out.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    std::fs::write(&out, serde_json::to_string_pretty(&report).expect("json") + "\n").expect("write report");
    eprintln!("wrote {}", out.display());
}
