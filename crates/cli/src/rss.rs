//! Peak RSS of the programs the benches run.
//!
//! A program started through `ip netns exec`, `env` or `eudp run` is the
//! last of several images in one process, and the kernel's peak RSS of a
//! process (`ru_maxrss`) is the largest over all of them, including the
//! launcher's and, after a `vfork`, the parent's. So the benches start
//! each measured program under a small C wrapper (`src/c/rsswrap.c`,
//! compiled here with `cc`) that forks it and reports `wait4`'s usage of
//! that child only. The wrapper also sets the program's environment (in
//! place of `env`) and, when asked, its `RLIMIT_NOFILE`.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

const RSSWRAP_C: &str = include_str!("c/rsswrap.c");

/// What the wrapper reports for its program.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Usage {
    /// Peak resident set size of the program, KiB (`ru_maxrss`).
    pub max_rss_kib: u64,
    pub user_secs: f64,
    pub sys_secs: f64,
    pub wall_secs: f64,
    /// Exit code, or -1 when a signal ended it (`signal`).
    pub exit_code: i32,
    pub signal: i32,
}

/// Compiles C `source` once per content into a per-user cache directory
/// under the temporary directory; returns the executable.
pub fn compile(name: &str, source: &str) -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    source.hash(&mut h);
    let uid = std::fs::metadata("/proc/self").map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("eudp-cbin-{uid}"));
    let exe = dir.join(format!("{name}-{:016x}", h.finish()));
    if exe.exists() {
        return Ok(exe);
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // Threads of one process (a test binary's tests) compile at once too: the private
    // names carry a per-call number beside the pid.
    static CALL: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let me = format!("{}-{}", std::process::id(), CALL.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let src = dir.join(format!("{name}-{me}.c"));
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    // Build under a private name and rename: concurrent callers never run a half-written file.
    let tmp = dir.join(format!("{name}-{me}.tmp"));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-Wall", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .map_err(|e| format!("{cc}: {e} (a C compiler is needed for {name})"))?;
    let _ = std::fs::remove_file(&src);
    if !out.status.success() {
        return Err(format!("{cc} {name}: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    std::fs::rename(&tmp, &exe).map_err(|e| format!("{}: {e}", exe.display()))?;
    Ok(exe)
}

/// The wrapper executable.
pub fn wrapper() -> Result<PathBuf, String> {
    compile("rsswrap", RSSWRAP_C)
}

/// A fresh path for one wrapper report.
pub fn report_path(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    std::env::temp_dir().join(format!("eudp-rss-{}-{tag}-{n}.json", std::process::id()))
}

/// Reads and removes a wrapper report; `None` when the wrapper did not
/// finish (killed) or wrote an error.
pub fn take_usage(path: &Path) -> Option<Usage> {
    let s = std::fs::read_to_string(path).ok();
    let _ = std::fs::remove_file(path);
    serde_json::from_str(s?.trim()).ok()
}

/// Appends the wrapper's arguments, `OUT [-n SOFT:HARD] VAR=VALUE... argv...`,
/// to `cmd`, a command whose program is the wrapper (directly or behind a
/// launcher such as `ip netns exec NS`).
/// `nofile`: the program's RLIMIT_NOFILE, soft and hard.
pub fn wrap_args(cmd: &mut Command, out: &Path, nofile: Option<(u64, u64)>, env: &[std::ffi::OsString], argv: &[&str]) {
    cmd.arg(out);
    if let Some((soft, hard)) = nofile {
        cmd.args(["-n", &format!("{soft}:{hard}")]);
    }
    cmd.args(env);
    cmd.args(argv);
}

/// Median peak RSS per run kind and stack over the rows of an
/// application bench: each result has `run`, `stack`, `a_kib`, `b_kib`
/// and `n` (rows with a value), in first-seen order. `a` is the
/// sender's or client's `*_peak_rss_kib`, `b` the receiver's or server's.
pub fn medians(
    rows: &[serde_json::Value],
    run: &dyn Fn(&serde_json::Value) -> String,
    stack: &dyn Fn(&serde_json::Value) -> String,
) -> Vec<serde_json::Value> {
    let pick = |r: &serde_json::Value, keys: [&str; 2]| keys.iter().find_map(|k| r[*k].as_f64());
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in rows {
        let k = (run(r), stack(r));
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let m = v.len() / 2;
        match v.len() {
            0 => None,
            n if n % 2 == 1 => Some(v[m]),
            _ => Some((v[m - 1] + v[m]) / 2.0),
        }
    };
    keys.into_iter()
        .map(|(ru, st)| {
            let sel: Vec<&serde_json::Value> = rows.iter().filter(|r| run(r) == ru && stack(r) == st).collect();
            let a: Vec<f64> =
                sel.iter().filter_map(|r| pick(r, ["sender_peak_rss_kib", "client_peak_rss_kib"])).collect();
            let b: Vec<f64> =
                sel.iter().filter_map(|r| pick(r, ["receiver_peak_rss_kib", "server_peak_rss_kib"])).collect();
            serde_json::json!({ "run": ru, "stack": st, "a_kib": median(a.clone()), "b_kib": median(b), "n": a.len() })
        })
        .collect()
}

/// A table of [`medians`].
pub fn table(meds: &[serde_json::Value]) -> String {
    let f = |v: &serde_json::Value| v.as_f64().map(|x| format!("{x:.0}")).unwrap_or_else(|| "-".into());
    let mut s =
        format!("{:<40} {:<16} {:>16} {:>18}\n", "peak RSS, KiB (median)", "stack", "sender/client", "receiver/server");
    for m in meds {
        s += &format!(
            "{:<40} {:<16} {:>16} {:>18}\n",
            m["run"].as_str().unwrap_or(""),
            m["stack"].as_str().unwrap_or(""),
            f(&m["a_kib"]),
            f(&m["b_kib"])
        );
    }
    s
}
