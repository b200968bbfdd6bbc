//! Per-process statistics for `eudp stat`: a JSON file per process,
//! `<dir>/<pid>.json`, rewritten every `EUDP_STAT_MS` milliseconds (default
//! 1000) while the program runs and once more at exit. The directory is
//! `EUDP_STAT_DIR`, else the first of `/run/eudp`, `$XDG_RUNTIME_DIR/eudp`
//! and `/tmp/eudp-$UID` this process may write (`eudp_engine::stat_dir`),
//! so that a program of an unprivileged user has its stats too.
//! Schema: see `docs/stat-json.md`.
//!
//! The shim's socket table sits above this module: it hands its open
//! sockets' entries and its process generation in as a [`Source`] when its
//! first socket starts the writer.

use serde::ser::{SerializeSeq, Serializer};
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// Sockets that fell back to the kernel.
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);
/// Sockets adopted by the engine.
pub static ACCELERATED: AtomicU64 = AtomicU64::new(0);
/// Sockets moved to the kernel path because they joined a multicast group
/// under the tcp transport, and joins whose group the xdp transport leaves
/// to the kernel for good (IPv6, another interface, a socket not on the
/// engine yet).
pub static MULTICAST_KERNEL: AtomicU64 = AtomicU64::new(0);
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
    /// The configuration of the engine, once one runs.
    pub engine_config: fn() -> Option<eudp_engine::Config>,
    /// Run on each period of the writer (`eudp trace --attach` requests).
    pub tick: fn(),
}

static SOURCE: OnceLock<Source> = OnceLock::new();

static CLOSED: Mutex<Vec<SockReport>> = Mutex::new(Vec::new());
static REASONS: Mutex<BTreeMap<String, u64>> = Mutex::new(BTreeMap::new());
/// Generation whose writer thread runs (u32::MAX: none).
static WRITER_GEN: AtomicU32 = AtomicU32::new(u32::MAX);
/// Held while a report file is renamed into place, so that a periodic
/// report never replaces a final one. Not held across fork, unlike the
/// other stats locks: a rename that replaces the previous report may wait
/// for the disk (ext4 first writes out the new file's data), and a fork
/// must not wait for that. A fork child, where no thread holds it, frees it
/// ([`forked`]).
static RENAMING: AtomicBool = AtomicBool::new(false);
/// A final (exit) report was written: the periodic writer must not replace it.
static FINAL: AtomicBool = AtomicBool::new(false);
const KEEP_CLOSED: usize = 256;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The directory of this process's stats files (None: none is writable).
pub fn dir() -> Option<PathBuf> {
    crate::fdspace::with_room(eudp_engine::stat_dir::writable).map(PathBuf::from)
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

/// The version of the report's layout (docs/stat-json.md).
pub const SCHEMA_VERSION: u32 = 1;

/// The whole report of this process (schema: docs/stat-json.md).
#[derive(Serialize)]
struct Report<'a> {
    schema_version: u32,
    /// The shim's version.
    version: &'static str,
    pid: u32,
    exe: String,
    time: f64,
    exited: bool,
    accelerated: u64,
    fallbacks: u64,
    /// Panics of the shim's calls and of eudp's threads, contained.
    panics: u64,
    fallback_reasons: &'a BTreeMap<String, u64>,
    /// Multicast left on the kernel path: under tcp, sockets that joined a
    /// group (of `fallbacks`); under xdp, joins left to the kernel for good
    /// and the times the transport found a joined group shared with another
    /// socket of the host (`xdp.stats.group_kernel`).
    multicast_kernel: u64,
    sockets: OpenSockets,
    closed: &'a [SockReport],
    /// Under `EUDP_TRANSPORT=xdp`: the AF_XDP transport's counters, or why
    /// it could not start (its sockets then use the kernel backend).
    #[serde(skip_serializing_if = "Option::is_none")]
    xdp: Option<XdpReport>,
    /// The transport in effect (and why not the one asked for).
    transport: String,
    /// The profile `eudp run` applied.
    profile: Option<String>,
    settings: &'a Settings,
    /// The engine's configuration as it runs (None: no engine started).
    engine: Option<EngineReport>,
}

/// The configuration the engine runs with.
#[derive(Serialize)]
struct EngineReport {
    l2_depth: u32,
    busy_poll: bool,
    cpu: Option<usize>,
    gso: bool,
    gro: bool,
    gro_hold: bool,
    max_msgs: usize,
    spin_us: u64,
    rx_handoff_us: u64,
    tx_coalesce_us: u64,
    tx_flush_batches: usize,
    tx_caller_drain: bool,
}

fn engine_report() -> Option<EngineReport> {
    let c = (SOURCE.get()?.engine_config)()?;
    Some(EngineReport {
        l2_depth: c.l2_depth,
        busy_poll: c.busy_poll,
        cpu: c.cpu,
        gso: c.gso,
        gro: c.gro,
        gro_hold: c.gro_hold,
        max_msgs: c.max_msgs,
        spin_us: c.recv_spin.as_micros() as u64,
        rx_handoff_us: c.rx_handoff.as_micros() as u64,
        tx_coalesce_us: c.tx_coalesce.as_micros() as u64,
        tx_flush_batches: c.tx_flush_batches,
        tx_caller_drain: c.tx_caller_drain,
    })
}

/// The `EUDP_*` settings in effect: each variable set with its value, a
/// bad value shown as the default used instead, and why.
#[derive(Serialize)]
struct Settings {
    values: BTreeMap<String, String>,
    ignored: Vec<String>,
    unknown: Vec<String>,
}

fn settings() -> &'static Settings {
    use eudp_engine::settings::{validate, Problem};
    static S: std::sync::OnceLock<Settings> = std::sync::OnceLock::new();
    // Built outside the lock, as in `eudp_engine::stat_dir::writable`: a
    // fork child must not wait on its parent's initialization.
    if let Some(s) = S.get() {
        return s;
    }
    let built = {
        let env = eudp_engine::settings::env_vars();
        let mut s = Settings { values: env.iter().cloned().collect(), ignored: Vec::new(), unknown: Vec::new() };
        for p in validate(env, &[]) {
            match p {
                Problem::Bad(e) => {
                    s.values.insert(e.var.to_string(), e.setting.default.to_string());
                    s.ignored.push(e.ignored());
                }
                Problem::Unknown { var, .. } => {
                    s.values.remove(&var);
                    s.unknown.push(var);
                }
            }
        }
        s
    };
    let _ = S.set(built);
    S.get().expect("set just above")
}

/// The transport in effect, without starting one.
fn transport() -> String {
    let asked = eudp_engine::backend::tcp::transport_from_env();
    if asked != "xdp" {
        return asked.to_string();
    }
    match eudp_engine::backend::xdp::XdpTransport::global_started() {
        Some(Ok(t)) => format!("xdp on {}", t.ifname()),
        Some(Err(_)) => "kernel (xdp unavailable)".to_string(),
        None => "xdp".to_string(),
    }
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

/// The xdp transport's `group_kernel`, 0 without the transport.
fn xdp_group_kernel() -> u64 {
    match eudp_engine::backend::xdp::XdpTransport::global_started() {
        Some(Ok(t)) => t.stats().group_kernel,
        _ => 0,
    }
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
        schema_version: SCHEMA_VERSION,
        version: env!("CARGO_PKG_VERSION"),
        pid: std::process::id(),
        exe,
        time: now,
        exited,
        accelerated: ACCELERATED.load(Relaxed),
        fallbacks: FALLBACKS.load(Relaxed),
        panics: eudp_engine::failure::PANICS.load(Relaxed),
        fallback_reasons: &reasons,
        multicast_kernel: MULTICAST_KERNEL.load(Relaxed) + xdp_group_kernel(),
        sockets: socks,
        closed: &closed,
        xdp: xdp_report(),
        transport: transport(),
        profile: crate::startup::profile(),
        settings: settings(),
        engine: engine_report(),
    };
    serde_json::to_writer_pretty(&mut *out, &r).map_err(std::io::Error::other)?;
    out.flush()
}

/// Set once this process created a UDP socket: processes without one
/// (shells, helpers started under `eudp run`) write no report.
pub static HAD_SOCKET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Set when the exit's report is being written: an open socket's entry
/// then counts what its ring holds unread in `drop_close`, as the
/// process's end discards it.
pub static EXITING: AtomicBool = AtomicBool::new(false);

/// Writes the report now (atomically: temporary file, then rename).
///
/// The periodic writer and the exit path may both get here at once: each
/// streams into its own temporary file outside [`RENAMING`], the rename
/// happens under it, and a periodic report never replaces a final one.
pub fn write_now(exited: bool) {
    if interval().is_none() || !HAD_SOCKET.load(Relaxed) {
        return;
    }
    let Some(d) = dir() else { return };
    if exited {
        EXITING.store(true, SeqCst);
    }
    // Named by pid and start time: a later process with this pid writes
    // a file of its own (`eudp_engine::stat_dir`).
    let stem = eudp_engine::stat_dir::own_stem();
    let fin = d.join(format!("{stem}.json"));
    // Streamed into a file of this write's own (the periodic writer and
    // the exit path may write at once) without holding any stats lock:
    // `RENAMING` covers the rename alone.
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let tmp = d.join(format!(".{stem}.{}.json.tmp", SEQ.fetch_add(1, Relaxed)));
    let wrote = crate::fdspace::with_room(|| std::fs::File::create(&tmp))
        .and_then(|f| write_report(&mut std::io::BufWriter::with_capacity(16 << 10, f), exited));
    let _r = Renaming::hold();
    if !exited {
        rename_pause();
    }
    if wrote.is_err() || (FINAL.load(SeqCst) && !exited) {
        let _ = std::fs::remove_file(&tmp);
        return;
    }
    if std::fs::rename(&tmp, &fin).is_ok() && exited {
        FINAL.store(true, SeqCst);
    }
}

/// [`RENAMING`] held by this thread until dropped.
struct Renaming;

impl Renaming {
    fn hold() -> Renaming {
        while RENAMING.swap(true, Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        Renaming
    }
}

impl Drop for Renaming {
    fn drop(&mut self) {
        RENAMING.store(false, Release);
    }
}

/// `EUDP_TEST_STAT_RENAME_MS` (tests only; default 0): the periodic writer
/// holds [`RENAMING`] this long before its rename, as a rename waiting for a
/// busy disk does.
fn rename_pause() {
    let ms = std::env::var("EUDP_TEST_STAT_RENAME_MS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
    if ms > 0 {
        std::thread::sleep(Duration::from_millis(ms));
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
        // Here, not in the caller: a socket the engine makes inside a
        // descriptor window must not open another one (`dir` opens one).
        if let Some(d) = dir() {
            // The transports' own stats files go next to this process's.
            eudp_engine::stat_dir::share(&d);
        }
        loop {
            std::thread::sleep(every);
            if (src.generation)() != g {
                return;
            }
            write_now(false);
            (src.tick)();
        }
    });
    if r.is_err() {
        WRITER_GEN.store(u32::MAX, SeqCst);
    }
}

/// The stats locks held across fork (see `shim::fork_prepare`); not
/// [`RENAMING`] (see there).
pub type Guards =
    (std::sync::MutexGuard<'static, Vec<SockReport>>, std::sync::MutexGuard<'static, BTreeMap<String, u64>>);

pub fn lock_all() -> Guards {
    (lock(&CLOSED), lock(&REASONS))
}

/// In a fork child (stats locks released just before): the writer thread
/// did not survive, the parent's closed sockets are not ours.
pub fn forked() {
    WRITER_GEN.store(u32::MAX, SeqCst);
    lock(&CLOSED).clear();
    // Only this thread runs here: a parent's thread that held it is gone.
    RENAMING.store(false, SeqCst);
    FINAL.store(false, SeqCst);
}
