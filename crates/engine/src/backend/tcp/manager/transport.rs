//! [`TcpTransport`]: starting a transport and its manager thread, the
//! process-wide transport (one per fork generation) with its counters
//! file, and shutting down. Owns `TcpTransport::thread`; shutting down
//! takes `Mgr::listener`, `Mgr::listen_st`, `Mgr::lanes` → `Lane::st` and
//! `Mgr::conns` one after the other.

use super::counters::{Counters, TcpStats};
use super::listener::{bind_port, LISTEN_RETRY_MIN};
use super::pools::Pools;
use super::state::{err, lock, Conn, ConnInfo, Lane, ListenSt, Mgr, DOORBELL};
use crate::backend::tcp::fork::{self, Tracked};
use crate::backend::tcp::sys::{self, Poller, SockOpts};
use crate::backend::tcp::TcpConfig;
use crate::sys::fdevents::EventFd;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest a process's end waits for its peers to close the
/// connections it half-closed (see [`Mgr::leave`]).
const EXIT_DRAIN: Duration = Duration::from_millis(250);

/// A UOE transport: the manager thread and its state. Dropping it closes
/// the listener and every connection (in tests: a peer "restart").
#[derive(Debug)]
pub struct TcpTransport {
    pub(in crate::backend::tcp) mgr: Arc<Mgr>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
}

/// The process-wide transport and the fork generation it was started in.
struct Global {
    pub(super) gen: u32,
    pub(super) t: Result<TcpTransport, i32>,
}

/// Leaked, never freed: a fork child abandons its parent's transport
/// (whose manager thread it does not have, and whose descriptors it gave
/// up, see `fork.rs`) and starts its own. No lock: a fork child must not
/// inherit one held by a thread it does not have.
static GLOBAL: sys::Leaked<Global> = sys::Leaked::new();
/// Some transport was started in this process or an ancestor.
static GLOBAL_STARTED: AtomicBool = AtomicBool::new(false);

/// This process's transport, if started here (not inherited across fork).
pub(super) fn current() -> Option<&'static Result<TcpTransport, i32>> {
    GLOBAL.get().filter(|g| g.gen == fork::generation()).map(|g| &g.t)
}

/// Holds [`fork::STARTING`] while it lives.
struct InitGuard;

impl InitGuard {
    /// Waits for a start under way in another thread; None once a
    /// transport of this process exists.
    pub(super) fn take() -> Option<InitGuard> {
        loop {
            if current().is_some() {
                return None;
            }
            if fork::STARTING.compare_exchange(false, true, SeqCst, SeqCst).is_ok() {
                return Some(InitGuard);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        fork::STARTING.store(false, SeqCst);
    }
}

/// Where the process-wide transport writes its counters:
/// `<dir>/<pid>-<start>.tcp.json`, next to the shim's `<pid>-<start>.json`
/// that `eudp stat` reads (`crate::stat_dir`). None: no directory shared
/// by the shim nor `EUDP_STAT_DIR`, or `EUDP_STAT_MS=0`.
pub(super) fn stats_path() -> Option<std::path::PathBuf> {
    let dir = crate::stat_dir::shared()?;
    if std::env::var("EUDP_STAT_MS").ok().and_then(|v| v.trim().parse::<u64>().ok()) == Some(0) {
        return None;
    }
    Some(std::path::Path::new(&dir).join(format!("{}.tcp.json", crate::stat_dir::own_stem())))
}

/// Writes `stats` of the transport to [`stats_path`] (temporary file, then rename).
pub(super) fn write_stats(stats: &TcpStats, queued: usize) {
    let Some(path) = stats_path() else { return };
    let fields: Vec<String> = stats.fields().iter().map(|(k, v)| format!("    \"{k}\": {v}")).collect();
    let body = format!(
        "{{\n  \"pid\": {},\n  \"queued_bytes\": {queued},\n  \"tcp\": {{\n{}\n  }}\n}}\n",
        std::process::id(),
        fields.join(",\n")
    );
    let tmp = path.with_extension("json.tmp");
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// atexit hook of the process-wide transport: the final counters.
extern "C" fn dump_global_stats() {
    if let Some(Ok(t)) = current() {
        write_stats(&t.stats(), t.queued_bytes());
    }
}

impl TcpTransport {
    /// Starts a transport: binds the listener (unless `cfg.listen` is off)
    /// and the manager thread.
    pub fn start(cfg: TcpConfig) -> io::Result<TcpTransport> {
        let wants = cfg.listen;
        TcpTransport::start_with(cfg, wants)
    }

    /// As [`TcpTransport::start`]; `wants_port`: a transport started
    /// without a listener (`cfg.listen` off because the port was taken)
    /// takes the port once it is free (see [`Mgr::listen_tick`]).
    fn start_with(cfg: TcpConfig, wants_port: bool) -> io::Result<TcpTransport> {
        let opts = SockOpts { sndbuf: cfg.sndbuf, rcvbuf: cfg.rcvbuf };
        let wants_port = wants_port && cfg.port != 0;
        fork::install();
        let poller = Tracked::new(Poller::new()?);
        let doorbell = Tracked::new(EventFd::new()?);
        poller.add_level(doorbell.as_raw_fd(), DOORBELL)?;
        let mut listener = None;
        if cfg.listen {
            // Bound now (the port is ours), listening from the first bound
            // endpoint on: until then peers are refused, as a UDP port
            // nobody has opened, and their DML keeps the datagrams.
            listener = Some(Tracked::new(bind_port(&cfg, &opts)?));
        }
        let mut listen_st = ListenSt::default();
        if wants_port && listener.is_none() {
            listen_st.retry = Some((Instant::now() + LISTEN_RETRY_MIN, LISTEN_RETRY_MIN));
        }
        let mgr = Arc::new(Mgr {
            cfg,
            opts,
            poller,
            doorbell,
            stop: AtomicBool::new(false),
            gen: fork::generation(),
            listener: Mutex::new(listener),
            listening: AtomicBool::new(false),
            wants_port,
            listen_st: Mutex::new(listen_st),
            bound_once: AtomicBool::new(false),
            accept_paused: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
            ports: Mutex::new(HashMap::new()),
            queued_total: AtomicUsize::new(0),
            pool: Mutex::new(Pools::default()),
            rbuf: Mutex::new(Vec::new()),
            next_token: AtomicU64::new(2),
            cc_warned: AtomicBool::new(false),
            cork_armed: AtomicBool::new(false),
            stats_written: Mutex::new(None),
            kernel_socks: Mutex::new(HashMap::new()),
            raw: OnceLock::new(),
            bound: Mutex::new(HashMap::new()),
            c: Counters::default(),
        });
        let m2 = mgr.clone();
        let thread = std::thread::Builder::new().name(fork::THREAD_NAME.into()).spawn(move || {
            crate::sys::process::block_async_signals();
            crate::failure::contain_thread("eudp tcp manager", move || m2.run());
        })?;
        Ok(TcpTransport { mgr, thread: Mutex::new(Some(thread)) })
    }

    /// Waits (bounded by `timeout`) until this process's transport, if it
    /// has one, holds no queued datagram: what waits for a connection
    /// (one a fork child opens to its parent's listener, say) is written
    /// before the process ends (`_exit`). False: still queued at the bound;
    /// what is still queued then is dropped and counted (`drop_exit`, and
    /// per endpoint), since the process ends. After a wait the final
    /// counters are written again: the transport's atexit hook, registered
    /// after the preload shim's, ran before this.
    ///
    /// Then the transport leaves its connections and the port in order
    /// ([`Mgr::leave`], bounded by [`EXIT_DRAIN`]), so that what peers
    /// wrote to it for other processes' ports is handed over, not lost.
    pub fn wait_global_sent(timeout: Duration) -> bool {
        let Some(Ok(t)) = current() else { return true };
        let end = Instant::now() + timeout;
        let mut sent = true;
        while t.queued_bytes() > 0 {
            if Instant::now() >= end {
                sent = false;
                break;
            }
            t.mgr.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        if !sent {
            t.mgr.drop_queued_at_exit();
        }
        t.mgr.leave(end.saturating_duration_since(Instant::now()).min(EXIT_DRAIN));
        dump_global_stats();
        sent
    }

    /// The process-wide transport, from `EUDP_TCP_*` (see [`TcpConfig`]).
    /// When the pre-decided port is taken on this host (another UOE process
    /// listens), it runs without a listener, says so on stderr, and takes
    /// the port once it is free (`Mgr::listen_tick`).
    ///
    /// A fork child starts its own on first use: the one it inherited has
    /// no manager thread there, and its descriptors were given up at the
    /// fork (`fork.rs`). While the parent listens, the port is the
    /// parent's, so the child runs without a listener (replies reach it
    /// over the connections it opens, and datagrams for its ports through
    /// the listening process's hand-over to their kernel sockets, see
    /// `Mgr::forward`); once the parent is gone, the child's transport
    /// takes the port.
    pub fn global() -> io::Result<&'static TcpTransport> {
        // Before the start lock: a fork while it is held then resets it.
        fork::install();
        let Some(_init) = InitGuard::take() else {
            return current().expect("set before the start is released").as_ref().map_err(|&c| err(c));
        };
        if let Some(r) = current() {
            return r.as_ref().map_err(|&c| err(c));
        }
        // Before anything is bound: a fork from here on leaves the port to
        // this process (see `fork::Ancestor::listens`).
        let ancestor = fork::begin_start();
        let mut cfg = TcpConfig::from_env().unwrap_or_else(|e| {
            crate::log::write(crate::log::Level::Warn, format_args!("{e}; using tcp defaults"));
            TcpConfig::default()
        });
        let defer = cfg.listen && ancestor.listens(cfg.port);
        if defer {
            // The ancestor's claim stays, for this process's children too.
            cfg.listen = false;
            ancestor.restore();
        } else {
            fork::claim_listener(cfg.port, cfg.listen);
        }
        let first = !GLOBAL_STARTED.swap(true, SeqCst);
        // A transport that defers or finds the port taken still wants it:
        // it takes the port once its holder has ended (`Mgr::listen_tick`).
        let r = match TcpTransport::start_with(cfg.clone(), cfg.listen || defer) {
            Ok(t) => Ok(t),
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && cfg.listen => {
                if first {
                    crate::log::write(
                        crate::log::Level::Warn,
                        format_args!(
                            "tcp port {} is in use; this process will accept UOE connections once it is free",
                            cfg.port
                        ),
                    );
                }
                TcpTransport::start_with(TcpConfig { listen: false, ..cfg }, true)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
            }
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        if !defer && !r.as_ref().is_ok_and(|t| t.mgr.cfg.listen) {
            fork::claim_listener(cfg.port, false);
        }
        // atexit handlers are inherited across fork: one registration serves all.
        if first && r.is_ok() && stats_path().is_some() {
            sys::at_exit(dump_global_stats);
        }
        let g = GLOBAL.set(Global { gen: fork::generation(), t: r });
        g.t.as_ref().map_err(|&c| err(c))
    }

    /// The transport's settings.
    pub fn config(&self) -> &TcpConfig {
        &self.mgr.cfg
    }

    /// Where the listener is bound (None when not listening).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        lock(&self.mgr.listener).as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Counters.
    pub fn stats(&self) -> TcpStats {
        self.mgr.c.snapshot()
    }

    /// Live connections.
    pub fn connections(&self) -> Vec<ConnInfo> {
        let conns: Vec<Arc<Conn>> = lock(&self.mgr.conns).values().cloned().collect();
        conns
            .iter()
            .map(|c| ConnInfo {
                peer: c.peer,
                inbound: c.inbound,
                lane: lock(&c.lane).as_ref().and_then(Weak::upgrade).map(|l| l.key.1),
                congestion: sys::congestion(c.fd()).unwrap_or_default(),
                nodelay: c.stream.nodelay().unwrap_or(false),
            })
            .collect()
    }

    /// Bytes waiting in user-space lane queues.
    pub fn queued_bytes(&self) -> usize {
        self.mgr.queued_total.load(SeqCst)
    }

    /// Stops the manager, closes the listener and every connection, and
    /// drops what is queued. Sockets of this transport then fail with
    /// ENETDOWN.
    pub fn shutdown(&self) {
        let m = &self.mgr;
        if m.abandoned() {
            // Inherited across fork: its thread is not ours to join, and
            // its locks may be held by threads that do not exist here.
            if let Ok(mut t) = self.thread.try_lock() {
                std::mem::forget(t.take());
            }
            return;
        }
        m.stop.store(true, SeqCst);
        m.doorbell.set();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        if let Some(l) = lock(&m.listener).take() {
            m.poller.remove(l.as_raw_fd());
        }
        lock(&m.listen_st).retry = None;
        let lanes: Vec<Arc<Lane>> = lock(&m.lanes).drain().map(|(_, l)| l).collect();
        for lane in lanes {
            let mut st = lock(&lane.st);
            st.closed = true;
            st.retired = true;
            st.conn = None;
            let before = st.out.queued();
            let n = st.out.clear(&mut |src, k| m.lost_by(src, k, |d| &d.exit));
            Counters::add(&m.c.drop_exit, n);
            m.queued_total.fetch_sub(before, SeqCst);
            m.open_rooms(&mut st);
            lane.cv.notify_all();
        }
        let conns: Vec<Arc<Conn>> = lock(&m.conns).drain().map(|(_, c)| c).collect();
        for c in conns {
            m.poller.remove(c.fd());
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            c.dead.store(true, SeqCst);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Mgr {
    /// This transport is the process-wide one (whose claim on the port
    /// fork children inherit, see `fork.rs`).
    pub(super) fn is_global(&self) -> bool {
        current().is_some_and(|r| r.as_ref().is_ok_and(|t| std::ptr::eq(&*t.mgr, self)))
    }
}
