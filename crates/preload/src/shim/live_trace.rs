//! `eudp trace --attach PID`: tracing a running program for a while.
//!
//! The tool writes a request file, `trace-PID.request` in this process's
//! stats directory: JSON with `dump` (the dump's path, `%p` for the pid),
//! `secs` (how long) and `sample` (one datagram in N). The stats writer
//! thread looks for it on each of its periods ([`poll`]); a thread of its
//! own then turns tracing on for every open endpoint (and those opened
//! meanwhile) at a moment when no datagram is on its way (see
//! `eudp_engine::endpoint::live_trace`), waits, turns it off, writes the
//! dump, and writes `trace-PID.done` beside the request: the dump's path,
//! and on a second line `busy` when no quiet moment came and the window
//! opened with datagrams on their way.

use crate::log::dlog;
use eudp_engine::endpoint::live_trace;
use eudp_engine::{tracepoint, Endpoint};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;

/// A window is open (requests that arrive meanwhile wait for it to end).
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// The request file for process `pid` in stats directory `dir`.
pub fn request_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("trace-{pid}.request"))
}

/// The file written when the window's dump is complete.
pub fn done_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("trace-{pid}.done"))
}

/// What a request asks for.
struct Request {
    dump: String,
    secs: f64,
    sample: u64,
}

fn parse(text: &str) -> Option<Request> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    Some(Request {
        dump: v["dump"].as_str()?.to_string(),
        secs: v["secs"].as_f64().filter(|s| s.is_finite() && *s >= 0.0)?,
        sample: v["sample"].as_u64().unwrap_or(1).max(1),
    })
}

/// The endpoints of the open sockets (the socket table's, handed in).
pub type Endpoints = fn() -> Vec<Arc<Endpoint>>;

/// Looks for a request and starts its window (called by the stats writer
/// thread on each period).
pub fn poll(endpoints: Endpoints) {
    if ACTIVE.load(SeqCst) {
        return;
    }
    let Some(dir) = crate::stat::dir() else { return };
    let pid = std::process::id();
    let req = request_path(&dir, pid);
    let Ok(text) = crate::fdspace::with_room(|| std::fs::read_to_string(&req)) else { return };
    let _ = std::fs::remove_file(&req);
    let Some(r) = parse(&text) else {
        dlog!("trace attach: ignoring a malformed request {}", req.display());
        return;
    };
    if ACTIVE.swap(true, SeqCst) {
        return;
    }
    let started = std::thread::Builder::new().name("eudp-trace".into()).spawn(move || {
        eudp_engine::sys::process::block_async_signals();
        let quiet = window(&r, endpoints);
        let done = if quiet { r.dump.clone() } else { format!("{}\nbusy", r.dump) };
        let _ = crate::fdspace::with_room(|| std::fs::write(done_path(&dir, pid), done));
        ACTIVE.store(false, SeqCst);
    });
    if started.is_err() {
        ACTIVE.store(false, SeqCst);
    }
}

/// Traces for the time asked; returns whether the window opened at a
/// quiet moment.
fn window(r: &Request, endpoints: Endpoints) -> bool {
    tracepoint::set_sample(r.sample);
    tracepoint::set_path(&r.dump);
    let eps = endpoints();
    let quiet = live_trace::start(&eps.iter().map(|e| &**e).collect::<Vec<_>>());
    if !quiet {
        dlog!("trace attach: no moment without datagrams on their way came; the window opened with some");
    }
    std::thread::sleep(Duration::from_secs_f64(r.secs));
    let eps = endpoints();
    live_trace::stop(&eps.iter().map(|e| &**e).collect::<Vec<_>>());
    if let Err(e) = crate::fdspace::with_room(tracepoint::finish) {
        dlog!("trace attach: writing {}: {e}", r.dump);
    }
    quiet
}
