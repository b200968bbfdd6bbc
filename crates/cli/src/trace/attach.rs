//! `eudp trace --attach PID --for SECONDS`: traces a program already
//! running under `eudp run` for a while and writes the same outputs as a
//! traced PROGRAM.
//!
//! The request goes through the process's stats directory (the shim's
//! `live_trace`): this writes `trace-PID.request` there, the shim's stats
//! writer picks it up within one of its periods (`EUDP_STAT_MS`, 1 s by
//! default), opens the window at a moment when none of the process's
//! datagrams is on its way, traces every endpoint of the process for the
//! time asked, writes its dump to `DIR/raw-attach-PID.json` and then
//! `trace-PID.done`.

use super::args::TraceArgs;
use super::output::document;
use super::run::{analyse_dumps, finish, program_dumps};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The dumps' name prefix in the output directory.
const PREFIX: &str = "raw-attach-";

/// The stats directory holding process `pid`'s report.
fn stat_dir_of(pid: u32) -> Result<PathBuf, String> {
    let dirs = eudp_engine::stat_dir::readable();
    dirs.iter().find(|d| !eudp_engine::stat_dir::files_of(d, u64::from(pid), false).is_empty()).cloned().ok_or_else(|| {
        let tried: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
        format!(
            "no eudp stats report of process {pid} in {}: is it running under `eudp run` with a UDP socket (and EUDP_STAT_MS not 0)?",
            tried.join(", ")
        )
    })
}

fn write_atomically(path: &Path, text: &str) -> Result<(), String> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
    std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
}

/// Traces process `pid` for `a.view.attach_secs` and writes the outputs.
pub fn attach(a: &TraceArgs, pid: u32) -> Result<(), String> {
    if !a.target.is_empty() {
        return Err("--attach traces a running program: give no PROGRAM".into());
    }
    let secs = a.view.attach_secs;
    if !(secs.is_finite() && secs > 0.0) {
        return Err("--for must be a positive number of seconds".into());
    }
    let dir = stat_dir_of(pid)?;
    std::fs::create_dir_all(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    let out = std::fs::canonicalize(&a.out).map_err(|e| format!("{}: {e}", a.out.display()))?;
    for f in program_dumps(&out, PREFIX) {
        let _ = std::fs::remove_file(f);
    }
    let (req, done) = (dir.join(format!("trace-{pid}.request")), dir.join(format!("trace-{pid}.done")));
    let _ = std::fs::remove_file(&done);
    let pattern = out.join(format!("{PREFIX}%p.json"));
    let body = serde_json::json!({"dump": pattern.display().to_string(), "secs": secs, "sample": a.view.sample});
    write_atomically(&req, &body.to_string())?;
    eprintln!("eudp trace: asked process {pid} to trace for {secs} s");
    // The request waits for the writer's next period; then the window.
    let limit = Duration::from_secs_f64(secs) + Duration::from_secs(15);
    let t0 = Instant::now();
    while !done.exists() {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_file(&req);
            return Err(format!("process {pid} ended before its trace was written"));
        }
        if t0.elapsed() > limit {
            let _ = std::fs::remove_file(&req);
            return Err(format!(
                "process {pid} did not answer within {limit:?}: its shim may predate --attach, or its stats writer is off (EUDP_STAT_MS=0)"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    // The dump's path, then `busy` when the window opened with datagrams
    // on their way (the shim found no quiet moment).
    let busy = std::fs::read_to_string(&done).is_ok_and(|t| t.lines().nth(1) == Some("busy"));
    let _ = std::fs::remove_file(&done);
    let mut r = analyse_dumps(a, &out, PREFIX, "eudp", &format!("{} by process {pid}", pattern.display()), true)?;
    if busy {
        r.notes.push(format!(
            "process {pid} always had datagrams on their way, so the window opened with some: its first sends and receives may be paired apart"
        ));
    }
    let packets = r.paths.len() as u64;
    let args = TraceArgs {
        size: r.size,
        sizes: vec![r.size],
        stacks: vec!["eudp".into()],
        packets: a.packets.min(packets),
        ..a.clone()
    };
    let doc = document(&args, vec![r]);
    finish(&args, &doc)
}
