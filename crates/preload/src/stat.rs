//! Per-process statistics for `eudp stat`: a JSON file per process,
//! `$EUDP_STAT_DIR/<pid>.json` (default `/run/eudp`), rewritten every
//! `EUDP_STAT_MS` milliseconds (default 1000) while the program runs and
//! once more at exit. Schema: see `docs/preload.md`.

use crate::shim::{self, Sock, ACTIVE, KERNEL};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::Mutex;
use std::time::Duration;

static CLOSED: Mutex<Vec<Value>> = Mutex::new(Vec::new());
static REASONS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
/// Generation whose writer thread runs (u32::MAX: none).
static WRITER_GEN: AtomicU32 = AtomicU32::new(u32::MAX);
/// Serializes writes of the report file; true once a final (exit) report
/// was written, after which the periodic writer must not replace it.
static FILE: Mutex<bool> = Mutex::new(false);
const KEEP_CLOSED: usize = 256;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn dir() -> PathBuf {
    std::env::var_os("EUDP_STAT_DIR").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/run/eudp"))
}

fn interval() -> Option<Duration> {
    let ms: u64 = std::env::var("EUDP_STAT_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(1000);
    (ms > 0).then(|| Duration::from_millis(ms))
}

pub fn note_fallback(reason: &str) {
    // Group by the reason's first clause so counts stay readable.
    let key = reason.split(':').next().unwrap_or(reason).trim().to_string();
    *lock(&REASONS).entry(key).or_insert(0) += 1;
}

fn sock_json(fd: i32, s: &Sock, stats: Option<(eudp_engine::StatsSnapshot, Option<std::net::SocketAddr>, Option<std::net::SocketAddr>)>, open: bool) -> Value {
    let mode = match s.mode() {
        ACTIVE => "eudp",
        KERNEL => "kernel",
        _ => "idle",
    };
    let (st, local, peer) = match stats {
        Some((st, l, p)) => (serde_json::to_value(st).unwrap_or(Value::Null), l, p),
        None => (Value::Null, None, None),
    };
    json!({
        "id": s.id, "fd": fd, "open": open, "mode": mode, "v6": s.v6,
        "local": local.map(|a| a.to_string()), "peer": peer.map(|a| a.to_string()),
        "fallback_reason": s.reason(), "stats": st,
    })
}

/// Records the final counters of an endpoint being closed or abandoned.
pub fn retire(s: &Sock, ep: &eudp_engine::Endpoint) {
    let v = sock_json(s.fd, s, Some((ep.report(), ep.local_addr().ok(), ep.peer_addr().ok())), false);
    let mut c = lock(&CLOSED);
    if c.len() >= KEEP_CLOSED {
        c.remove(0);
    }
    c.push(v);
}

/// The whole report of this process.
pub fn report(exited: bool) -> Value {
    let mut seen = std::collections::HashSet::new();
    let mut socks = Vec::new();
    for (fd, s) in shim::all() {
        if !seen.insert(s.id) {
            continue;
        }
        let snap = s.snapshot();
        socks.push(sock_json(fd, &s, snap, true));
    }
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    json!({
        "pid": std::process::id(), "exe": exe, "time": now, "exited": exited,
        "accelerated": shim::ACCELERATED.load(Relaxed),
        "fallbacks": shim::FALLBACKS.load(Relaxed),
        "fallback_reasons": *lock(&REASONS),
        "sockets": socks,
        "closed": *lock(&CLOSED),
    })
}

/// Set once this process created a UDP socket: processes without one
/// (shells, helpers started under `eudp run`) write no report.
pub static HAD_SOCKET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes the report now (atomically: temporary file, then rename).
///
/// The periodic writer and the exit path may both get here at once: the
/// report is built outside [`FILE`] (it takes the socket table's lock),
/// the file is written under it, and a periodic report never replaces a
/// final one.
pub fn write_now(exited: bool) {
    if interval().is_none() || !HAD_SOCKET.load(Relaxed) {
        return;
    }
    let d = dir();
    if std::fs::create_dir_all(&d).is_err() {
        return;
    }
    let pid = std::process::id();
    let tmp = d.join(format!(".{pid}.json.tmp"));
    let fin = d.join(format!("{pid}.json"));
    let body = serde_json::to_vec_pretty(&report(exited)).unwrap_or_default();
    let mut final_written = lock(&FILE);
    if *final_written && !exited {
        return;
    }
    // The file's descriptor is the shim's: room for it even when the
    // program holds all its limit allows.
    if crate::fdspace::with_room(|| std::fs::write(&tmp, body)).is_ok() && std::fs::rename(&tmp, &fin).is_ok() && exited {
        *final_written = true;
    }
}

/// Starts this process generation's writer thread once.
pub fn ensure_writer() {
    HAD_SOCKET.store(true, Relaxed);
    let g = shim::generation();
    if WRITER_GEN.load(Relaxed) == g {
        return;
    }
    if WRITER_GEN.swap(g, SeqCst) == g {
        return;
    }
    let Some(every) = interval() else { return };
    let r = std::thread::Builder::new().name("eudp-stat".into()).spawn(move || {
        eudp_engine::backend::kernel::block_async_signals();
        loop {
            std::thread::sleep(every);
            if shim::generation() != g {
                return;
            }
            write_now(false);
        }
    });
    if r.is_err() {
        WRITER_GEN.store(u32::MAX, SeqCst);
    }
}

/// The stats locks, held across fork (see `shim::fork_prepare`). The file
/// lock comes last: its holder takes no other lock.
pub type Guards = (std::sync::MutexGuard<'static, Vec<Value>>, std::sync::MutexGuard<'static, BTreeMap<String, u64>>, std::sync::MutexGuard<'static, bool>);

pub fn lock_all() -> Guards {
    (lock(&CLOSED), lock(&REASONS), lock(&FILE))
}

/// In a fork child (stats locks released just before): the writer thread
/// did not survive, the parent's closed sockets are not ours.
pub fn forked() {
    WRITER_GEN.store(u32::MAX, SeqCst);
    lock(&CLOSED).clear();
    *lock(&FILE) = false;
}
