//! Per-process statistics for `eudp stat`: a JSON file per process,
//! `$EUDP_STAT_DIR/<pid>.json` (default `/run/eudp`), rewritten every
//! `EUDP_STAT_MS` milliseconds (default 1000) while the program runs and
//! once more at exit. Schema: see `docs/preload.md`.
//!
//! The shim's socket table sits above this module: it hands its open
//! sockets' entries and its process generation in as a [`Source`] when its
//! first socket starts the writer.

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Sockets that fell back to the kernel.
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);
/// Sockets adopted by the engine.
pub static ACCELERATED: AtomicU64 = AtomicU64::new(0);
/// Sockets put on the kernel backend because the xdp transport could not
/// start (`EUDP_TRANSPORT=xdp`).
pub static XDP_UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

/// Takes one socket's report entry.
pub type EntrySink<'a> = dyn FnMut(&SockReport) + 'a;

/// What the report asks of the socket table.
#[derive(Clone, Copy)]
pub struct Source {
    /// Hands `f` the entry of each open socket, once per socket.
    pub open_sockets: fn(f: &mut EntrySink<'_>),
    /// The current process generation (bumped in a fork child).
    pub generation: fn() -> u32,
}

static SOURCE: OnceLock<Source> = OnceLock::new();

static CLOSED: Mutex<Vec<SockReport>> = Mutex::new(Vec::new());
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

/// One socket's entry in the report. Built and written one socket at a
/// time: a program with 10,000 sockets must not pay megabytes of JSON
/// trees every second (a `serde_json::Value` per socket cost about 9 KiB).
#[derive(Clone, Serialize)]
pub struct SockReport {
    pub id: u64,
    pub fd: i32,
    pub open: bool,
    pub mode: &'static str,
    pub v6: bool,
    pub local: Option<String>,
    pub peer: Option<String>,
    pub fallback_reason: Option<String>,
    pub stats: Option<eudp_engine::StatsSnapshot>,
}

/// Records the final counters of an endpoint being closed or abandoned.
pub fn retire(v: SockReport) {
    let mut c = lock(&CLOSED);
    if c.len() >= KEEP_CLOSED {
        c.remove(0);
    }
    c.push(v);
}

/// The open sockets, each entry made as it is written.
struct OpenSockets(Option<Source>);

impl Serialize for OpenSockets {
    fn serialize<S: Serializer>(&self, ser: S) -> Result<S::Ok, S::Error> {
        let mut seq = ser.serialize_seq(None)?;
        let mut failed = None;
        if let Some(src) = self.0 {
            (src.open_sockets)(&mut |r| {
                if failed.is_none() {
                    failed = seq.serialize_element(r).err();
                }
            });
        }
        match failed {
            Some(e) => Err(e),
            None => seq.end(),
        }
    }
}

/// The whole report of this process (schema: docs/preload.md).
#[derive(Serialize)]
struct Report<'a> {
    pid: u32,
    exe: String,
    time: f64,
    exited: bool,
    accelerated: u64,
    fallbacks: u64,
    fallback_reasons: &'a BTreeMap<String, u64>,
    sockets: OpenSockets,
    closed: &'a [SockReport],
    /// Under `EUDP_TRANSPORT=xdp`: the AF_XDP transport's counters, or why
    /// it could not start (its sockets then use the kernel backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    xdp: Option<XdpReport>,
}

#[derive(Serialize)]
struct XdpReport {
    #[serde(skip_serializing_if = "Option::is_none")]
    stats: Option<eudp_engine::backend::xdp::XdpStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    unavailable: Option<String>,
    /// Sockets adopted on the kernel backend because it was unavailable.
    kernel_backend_sockets: u64,
}

fn xdp_report() -> Option<XdpReport> {
    if eudp_engine::backend::tcp::transport_from_env() != "xdp" {
        return None;
    }
    let (stats, unavailable) = match eudp_engine::backend::xdp::XdpTransport::global_started()? {
        Ok(t) => (Some(t.stats()), None),
        Err(e) => (None, Some(e)),
    };
    Some(XdpReport { stats, unavailable, kernel_backend_sockets: XDP_UNAVAILABLE.load(Relaxed) })
}

/// Writes the report of this process to `out`, socket by socket.
fn write_report(out: &mut impl Write, exited: bool) -> std::io::Result<()> {
    let socks = OpenSockets(SOURCE.get().copied());
    let exe = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_default();
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0);
    let reasons = lock(&REASONS).clone();
    let closed = lock(&CLOSED).clone();
    let r = Report {
        pid: std::process::id(),
        exe,
        time: now,
        exited,
        accelerated: ACCELERATED.load(Relaxed),
        fallbacks: FALLBACKS.load(Relaxed),
        fallback_reasons: &reasons,
        sockets: socks,
        closed: &closed,
        xdp: xdp_report(),
    };
    serde_json::to_writer_pretty(&mut *out, &r).map_err(std::io::Error::other)?;
    out.flush()
}

/// Set once this process created a UDP socket: processes without one
/// (shells, helpers started under `eudp run`) write no report.
pub static HAD_SOCKET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes the report now (atomically: temporary file, then rename).
///
/// The periodic writer and the exit path may both get here at once: each
/// streams into its own temporary file outside [`FILE`], the rename
/// happens under it, and a periodic report never replaces a final one.
pub fn write_now(exited: bool) {
    if interval().is_none() || !HAD_SOCKET.load(Relaxed) {
        return;
    }
    let d = dir();
    if std::fs::create_dir_all(&d).is_err() {
        return;
    }
    let pid = std::process::id();
    let fin = d.join(format!("{pid}.json"));
    // Streamed into a file of this write's own (the periodic writer and
    // the exit path may write at once) without holding any stats lock:
    // taking the socket table and the endpoints' counters under `FILE`
    // would invert the order `lock_all` takes them in at fork.
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let tmp = d.join(format!(".{pid}.{}.json.tmp", SEQ.fetch_add(1, Relaxed)));
    let wrote = crate::fdspace::with_room(|| std::fs::File::create(&tmp))
        .and_then(|f| write_report(&mut std::io::BufWriter::with_capacity(16 << 10, f), exited));
    let mut final_written = lock(&FILE);
    if wrote.is_err() || (*final_written && !exited) {
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    if std::fs::rename(&tmp, &fin).is_ok() && exited {
        *final_written = true;
    }
}

/// Starts this process generation's writer thread once; `src` is kept
/// from the first call on.
pub fn ensure_writer(src: Source) {
    let src = *SOURCE.get_or_init(|| src);
    HAD_SOCKET.store(true, Relaxed);
    let g = (src.generation)();
    if WRITER_GEN.load(Relaxed) == g {
        return;
    }
    if WRITER_GEN.swap(g, SeqCst) == g {
        return;
    }
    let Some(every) = interval() else { return };
    let r = std::thread::Builder::new().name("eudp-stat".into()).spawn(move || {
        eudp_engine::sys::process::block_async_signals();
        loop {
            std::thread::sleep(every);
            if (src.generation)() != g {
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
pub type Guards = (
    std::sync::MutexGuard<'static, Vec<SockReport>>,
    std::sync::MutexGuard<'static, BTreeMap<String, u64>>,
    std::sync::MutexGuard<'static, bool>,
);

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
