//! The shim's state: the table of the application's UDP sockets, each
//! socket's mode (not yet accelerated, on the engine, or on the plain
//! kernel path), the engine of this process generation, fallbacks, the
//! signal policy and logging.
//!
//! Safe Rust except the fork hand-over of the table lock (see
//! [`ForkGuard`]); raw pointers stay in `hooks`, libc's own functions in
//! `real`.

use eudp_engine::backend::kernel::EventFd;
use eudp_engine::{Config, Endpoint, Engine, KeptDatagram, Received, RecvFlags, RingLen};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

/// File descriptors at or above this are never accelerated.
pub const MAX_FD: usize = 1 << 16;

/// The socket was created but has done no I/O yet: options and binds go
/// straight to the kernel, and an option the engine cannot honour costs
/// nothing to refuse.
pub const LAZY: u8 = 0;
/// On the engine.
pub const ACTIVE: u8 = 1;
/// On the plain kernel path (fallback, or inherited across fork).
pub const KERNEL: u8 = 2;

/// One application UDP socket (shared by every fd that `dup`s it).
#[derive(Debug)]
pub struct Sock {
    pub id: u64,
    pub v6: bool,
    /// O_NONBLOCK as the application set it (the shared file description
    /// carries the same; the engine's calls pass `MSG_DONTWAIT`).
    nonblock: AtomicBool,
    mode: AtomicU8,
    /// The endpoint belongs to the parent of a fork: never touched again.
    leaked: AtomicBool,
    /// Table entries (fds) naming this socket.
    refs: AtomicUsize,
    ep: Mutex<Option<Arc<Endpoint>>>,
    /// The endpoint `ep` owns, for lock-free borrowing (`crate::borrow`);
    /// null whenever `ep` does not own one.
    pub fast: AtomicPtr<Endpoint>,
    dup_fd: AtomicI32,
    poll_fd: AtomicI32,
    /// The endpoint's ring count, readable without the endpoint: a poll
    /// that finds datagrams waiting takes no lock and no reference.
    ring_len: std::sync::OnceLock<Arc<RingLen>>,
    /// Datagrams left in the ring when the socket fell back to the kernel.
    leftover: Mutex<VecDeque<KeptDatagram>>,
    has_leftover: AtomicBool,
    /// Held by a fallback while it hands the socket over; `handing_over`
    /// is set meanwhile (before the socket is marked `KERNEL`), so a
    /// receive on the kernel path waits for the hand-over instead of
    /// reading the kernel socket under it (ahead of what it keeps, or a
    /// GRO message before it is split).
    handover: Mutex<()>,
    handing_over: AtomicBool,
    /// The process (its id) in which a thread was left asleep inside its
    /// read of the kernel socket when the socket was handed over, or 0.
    /// What that read takes reaches the leftovers only when it ends (see
    /// [`Sock::after_hand_over`]); until then receives on the kernel path
    /// take the leftovers but leave the kernel socket to that read, so a
    /// GRO message it takes cannot be served after newer datagrams
    /// ([`Sock::await_reader`]). A fork child has no such thread.
    reader_out: AtomicI32,
    /// The endpoint that read belongs to, while `reader_out` is set: its
    /// end finishes the hand-over ([`Sock::after_hand_over`]).
    reader_ep: Mutex<Option<Arc<Endpoint>>>,
    /// The endpoint's error flag ([`Endpoint::error_fd`]) once made for an
    /// epoll registration, or -1.
    err_fd: AtomicI32,
    /// `IP_RECVTOS`/`IP_RECVTTL` (IPv6: `IPV6_RECVTCLASS`/`IPV6_RECVHOPLIMIT`)
    /// as the program set them, and whether the kernel socket has both on
    /// for the engine instead (see
    /// [`Sock::force_rx_opts`]).
    rx_opts: AtomicU8,
    /// The ring's readiness eventfd, kept from the endpoint while
    /// `leftover` holds datagrams and readable until it is empty: an epoll
    /// set the application registered the socket in while it was on the
    /// engine holds it too, and so reports the leftovers.
    leftover_ready: Mutex<Option<Arc<EventFd>>>,
    reason: Mutex<Option<String>>,
    /// First fd number (for stats).
    pub fd: i32,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Not an errno: a receive that began on the engine found the socket
/// handed over to the kernel path (fallback) and must be made again there.
pub const RETRY: i32 = -1;

pub fn errno_of(e: &io::Error) -> i32 {
    match e.raw_os_error() {
        Some(n) => n,
        None if eudp_engine::is_handed_over(e) => RETRY,
        None => libc::EIO,
    }
}

/// The options that make the kernel report each message's TOS (IPv6:
/// traffic class) and TTL (hop limit): (level, TOS name, TTL name).
fn rx_opt_names(v6: bool) -> (i32, i32, i32) {
    if v6 {
        (libc::IPPROTO_IPV6, libc::IPV6_RECVTCLASS, libc::IPV6_RECVHOPLIMIT)
    } else {
        (libc::IPPROTO_IP, libc::IP_RECVTOS, libc::IP_RECVTTL)
    }
}

/// For one of those options of a socket of the family `v6`: whether it
/// is the TOS one; `None` for any other option.
pub fn rx_opt_is_tos(v6: bool, level: i32, name: i32) -> Option<bool> {
    let (l, tos, ttl) = rx_opt_names(v6);
    (level == l && (name == tos || name == ttl)).then_some(name == tos)
}

/// `rx_opts` bits.
const RX_FORCED: u8 = 1;
const RX_WANT_TOS: u8 = 2;
const RX_WANT_TTL: u8 = 4;

// ---------------------------------------------------------------- logging

/// True when `EUDP_LOG=debug`.
pub fn debug() -> bool {
    eudp_engine::log::enabled(eudp_engine::log::Level::Debug)
}

static RACE_PAUSE: AtomicU64 = AtomicU64::new(u64::MAX);

/// `EUDP_TEST_RACE_PAUSE_US` (tests only; default 0): a receive that
/// found its socket on the engine and its ring empty pauses this long
/// before it takes the endpoint, so that a test can make another thread's
/// fallback land in that window every time instead of once in hundreds of
/// runs. Read once; a receive served from the ring never gets here.
#[cold]
pub fn race_pause() {
    let mut us = RACE_PAUSE.load(Relaxed);
    if us == u64::MAX {
        us = std::env::var("EUDP_TEST_RACE_PAUSE_US").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        RACE_PAUSE.store(us, Relaxed);
    }
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

macro_rules! dlog {
    ($($t:tt)*) => {
        if $crate::shim::debug() {
            eudp_engine::log::write(eudp_engine::log::Level::Debug, format_args!($($t)*));
        }
    };
}
pub(crate) use dlog;

// ------------------------------------------------------- the socket table

static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
static TABLE: RwLock<BTreeMap<i32, Arc<Sock>>> = RwLock::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);
/// Sockets that fell back to the kernel, and why.
pub static FALLBACKS: AtomicU64 = AtomicU64::new(0);
pub static ACCELERATED: AtomicU64 = AtomicU64::new(0);
/// Sockets put on the kernel backend because the xdp transport could not
/// start (`EUDP_TRANSPORT=xdp`).
pub static XDP_UNAVAILABLE: AtomicU64 = AtomicU64::new(0);

fn bit(fd: i32) -> Option<(usize, u64)> {
    let f = usize::try_from(fd).ok().filter(|&f| f < MAX_FD)?;
    Some((f / 64, 1u64 << (f % 64)))
}

/// Everything the shim keeps per thread, in one thread-local: in a
/// preloaded library every thread-local access is a `__tls_get_addr` call
/// and a state check, so a hook looks this up once and hands it down.
/// Only shared references exist (a signal handler calling in gets another
/// one to the same object): state is in `Cell`s, and `RefCell`s that a
/// nested call finds busy make it use its own storage.
pub struct Tls {
    /// Set while the shim itself calls into the engine (creating an
    /// endpoint): the engine's own libc calls then bypass the shim.
    inside: Cell<bool>,
    /// This thread's recent lookups (see [`with_sock`]).
    cache: RefCell<LookupCache>,
    /// This thread's hazard slot (`crate::borrow`): an index, or
    /// [`crate::borrow::UNCLAIMED`] / [`crate::borrow::NO_SLOT`].
    pub(crate) slot: Cell<usize>,
    /// Consecutive poll/select calls answered from the rings alone, and
    /// the coarse clock (ns) when the kernel was last asked.
    pub(crate) skipped: Cell<(u32, i64)>,
    /// Set by `select` while it runs: the first moment it may sleep (the
    /// time it writes back counts from there; until then it only computed).
    pub(crate) sleep_mark: Cell<(bool, Option<Instant>)>,
    /// The pollfd array handed to the kernel, reused across calls.
    pub(crate) poll_all: RefCell<Vec<libc::pollfd>>,
    /// select's pollfd array, reused across calls.
    pub(crate) select_fds: RefCell<Vec<libc::pollfd>>,
}

impl Tls {
    const fn new(slot: usize) -> Tls {
        Tls {
            inside: Cell::new(false),
            cache: RefCell::new(([const { None }; CACHE_WAYS], 0)),
            slot: Cell::new(slot),
            skipped: Cell::new((0, 0)),
            sleep_mark: Cell::new((false, None)),
            poll_all: RefCell::new(Vec::new()),
            select_fds: RefCell::new(Vec::new()),
        }
    }
}

impl Drop for Tls {
    fn drop(&mut self) {
        crate::borrow::release(self.slot.get());
    }
}

thread_local! {
    static TLS: Tls = const { Tls::new(crate::borrow::UNCLAIMED) };
}

/// Runs `f` with this thread's [`Tls`]; while the thread exits (its
/// thread-locals going away) with a fresh one that borrows no slot.
#[inline]
pub fn with_tls<R>(f: impl FnOnce(&Tls) -> R) -> R {
    let mut f = Some(f);
    match TLS.try_with(|t| (f.take().expect("unused"))(t)) {
        Ok(r) => r,
        Err(_) => (f.take().expect("not run"))(&Tls::new(crate::borrow::NO_SLOT)),
    }
}

struct Inside;
impl Inside {
    fn enter() -> Inside {
        let _ = TLS.try_with(|t| t.inside.set(true));
        Inside
    }
}
impl Drop for Inside {
    fn drop(&mut self) {
        let _ = TLS.try_with(|t| t.inside.set(false));
    }
}

/// Private descriptors a socket on the engine may need: the engine's
/// duplicate of it, its ring's eventfd and its error flag (the last two
/// for poll and epoll). A socket is attached only with room for them.
const PRIVATE_PER_SOCKET: usize = 3;

/// Whether this thread is inside the shim's own work (the calls it makes
/// then are not the program's).
pub fn inside() -> bool {
    TLS.try_with(|t| t.inside.get()).unwrap_or(false)
}

/// The fallback reason of a socket that needed a private descriptor when
/// none was left (see [`crate::fdspace`]'s budget); `stat` groups by the
/// part before the colon.
pub fn budget_reason(what: &str) -> String {
    format!("descriptor budget: no private descriptor number left ({what})")
}

/// Sockets on the engine that hold private descriptors below `limit` fall
/// back ([`crate::fdspace::reclaim`]).
pub fn give_back_below(limit: i32) {
    let mut seen = std::collections::HashSet::new();
    for (fd, s) in all() {
        if s.mode() != ACTIVE || !seen.insert(Arc::as_ptr(&s) as usize) {
            continue;
        }
        // (A duplicate of its ring's eventfd made for epoll may be there
        // too.)
        if ![&s.dup_fd, &s.poll_fd, &s.err_fd].iter().map(|f| f.load(SeqCst)).any(|f| f >= 0 && f < limit)
            && !crate::hooks::has_ring_dups(Arc::as_ptr(&s) as usize)
        {
            continue;
        }
        s.fallback(fd, "descriptor budget: the program needs the numbers below its limit");
        crate::hooks::forget_ring_dups(Arc::as_ptr(&s) as usize);
    }
}

/// The socket behind `fd`, when it is one of the application's UDP sockets.
#[inline]
pub fn lookup(fd: i32) -> Option<Arc<Sock>> {
    with_sock(fd, Arc::clone)
}

/// Bumped on every change of the table, so a cached lookup can tell it is
/// still what the table says.
static TABLE_GEN: AtomicU64 = AtomicU64::new(0);

/// Entries in each thread's lookup cache.
const CACHE_WAYS: usize = 4;

/// A thread's cached lookups: (fd, `TABLE_GEN` when looked up, socket),
/// and the way to replace next.
type LookupCache = ([Option<(i32, u64, Arc<Sock>)>; CACHE_WAYS], usize);

/// Runs `f` on the socket behind `fd` (see [`lookup`]) without taking the
/// table's lock or a reference when this thread looked it up recently
/// (each cached lookup is valid while `TABLE_GEN` is unchanged; an entry
/// only keeps the small `Sock` alive: its endpoint is released by `close`
/// and `fallback`, whoever still holds the `Sock`).
#[inline]
pub fn with_sock<R>(fd: i32, f: impl FnOnce(&Arc<Sock>) -> R) -> Option<R> {
    if !maybe(fd) {
        return None;
    }
    with_tls(|t| with_sock_in(t, fd, f))
}

/// [`with_sock`] with this thread's [`Tls`] in hand.
#[inline]
pub fn with_sock_in<R>(t: &Tls, fd: i32, f: impl FnOnce(&Arc<Sock>) -> R) -> Option<R> {
    if !maybe(fd) || t.inside.get() {
        return None;
    }
    let gen = TABLE_GEN.load(Acquire);
    // A signal handler calling in while `f` runs finds the cache busy
    // and takes the table path.
    let Ok(mut c) = t.cache.try_borrow_mut() else {
        let s = TABLE.read().unwrap_or_else(|e| e.into_inner()).get(&fd).cloned()?;
        return Some(f(&s));
    };
    let (ways, next) = &mut *c;
    if let Some(i) = ways.iter().position(|e| matches!(e, Some((k, g, _)) if *k == fd && *g == gen)) {
        let (_, _, s) = ways[i].as_ref().expect("matched");
        return Some(f(s));
    }
    let s = TABLE.read().unwrap_or_else(|e| e.into_inner()).get(&fd).cloned()?;
    let i = *next % CACHE_WAYS;
    *next = next.wrapping_add(1);
    // Stale entries of this fd go too, so one fd holds one way.
    for e in ways.iter_mut() {
        if matches!(e, Some((k, _, _)) if *k == fd) {
            *e = None;
        }
    }
    ways[i] = Some((fd, gen, s));
    let (_, _, s) = ways[i].as_ref().expect("just stored");
    Some(f(s))
}

/// True when `fd` may be in the table (one bit test).
#[inline]
pub fn maybe(fd: i32) -> bool {
    bit(fd).is_some_and(|(w, b)| BITS[w].load(Relaxed) & b != 0)
}

/// True when some fd in the table may be named (cheap pre-check).
pub fn any() -> bool {
    ACTIVE_FDS.load(Relaxed) > 0
}
static ACTIVE_FDS: AtomicUsize = AtomicUsize::new(0);

/// Set once the program has made a UDP socket the shim tracks: only then
/// can a thread be inside the engine's one-time set-up that `fork_prepare`
/// settles (a program that never does, such as a shell, pays nothing).
static UDP_SEEN: AtomicBool = AtomicBool::new(false);

/// Records a new UDP socket created by the application.
pub fn register_new(fd: i32, v6: bool, nonblock: bool) {
    if bit(fd).is_none() || disabled() {
        return;
    }
    UDP_SEEN.store(true, SeqCst);
    let s = Arc::new(Sock {
        id: NEXT_ID.fetch_add(1, Relaxed),
        v6,
        nonblock: AtomicBool::new(nonblock),
        mode: AtomicU8::new(LAZY),
        leaked: AtomicBool::new(false),
        refs: AtomicUsize::new(0),
        ep: Mutex::new(None),
        fast: AtomicPtr::new(std::ptr::null_mut()),
        dup_fd: AtomicI32::new(-1),
        poll_fd: AtomicI32::new(-1),
        ring_len: std::sync::OnceLock::new(),
        leftover: Mutex::new(VecDeque::new()),
        has_leftover: AtomicBool::new(false),
        handover: Mutex::new(()),
        handing_over: AtomicBool::new(false),
        reader_out: AtomicI32::new(0),
        reader_ep: Mutex::new(None),
        err_fd: AtomicI32::new(-1),
        rx_opts: AtomicU8::new(0),
        leftover_ready: Mutex::new(None),
        reason: Mutex::new(None),
        fd,
    });
    insert(fd, s);
    crate::stat::ensure_writer();
}

/// Makes `fd` name `s` too (dup and friends).
pub fn insert(fd: i32, s: Arc<Sock>) {
    let Some((w, b)) = bit(fd) else { return };
    s.refs.fetch_add(1, SeqCst);
    let old = {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        BITS[w].fetch_or(b, SeqCst);
        TABLE_GEN.fetch_add(1, Release);
        t.insert(fd, s)
    };
    match old {
        Some(o) => release(o),
        None => {
            ACTIVE_FDS.fetch_add(1, Relaxed);
        }
    }
}

/// Drops a table entry for a descriptor number that was reused after a
/// close the shim did not see.
pub fn forget_stale(fd: i32) {
    if let Some((w, b)) = bit(fd) {
        if BITS[w].load(Relaxed) & b != 0 {
            dlog!("fd {fd}: closed without close(): forgetting the socket");
            remove(fd);
        }
    }
}

/// Forgets `fd` (it is being closed); the socket's endpoint is closed with
/// the last fd naming it.
pub fn remove(fd: i32) {
    let Some((w, b)) = bit(fd) else { return };
    if BITS[w].load(Relaxed) & b == 0 {
        return;
    }
    let old = {
        let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
        let o = t.remove(&fd);
        TABLE_GEN.fetch_add(1, Release);
        if o.is_some() {
            BITS[w].fetch_and(!b, SeqCst);
        }
        o
    };
    if let Some(o) = old {
        ACTIVE_FDS.fetch_sub(1, Relaxed);
        release(o);
    }
}

fn release(s: Arc<Sock>) {
    if s.refs.fetch_sub(1, SeqCst) == 1 {
        s.close();
    }
}

/// Every socket in the table (one entry per fd).
pub fn all() -> Vec<(i32, Arc<Sock>)> {
    TABLE.read().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, v)| (*k, v.clone())).collect()
}

fn disabled() -> bool {
    if crate::ktrace::active() {
        // Tracing the program's kernel path: nothing is adopted.
        return true;
    }
    static D: AtomicU8 = AtomicU8::new(255);
    let v = D.load(Relaxed);
    if v != 255 {
        return v == 1;
    }
    let off = std::env::var("EUDP_PRELOAD").map(|v| v == "0" || v == "off").unwrap_or(false);
    D.store(off as u8, Relaxed);
    off
}

// ------------------------------------------- process generation and engine

/// Incremented in every fork child: endpoints of an older generation
/// belong to an engine thread that does not exist in this process.
static GEN: AtomicU32 = AtomicU32::new(0);
static ENGINE: AtomicPtr<Engine> = AtomicPtr::new(std::ptr::null_mut());
static ENGINE_GEN: AtomicU32 = AtomicU32::new(u32::MAX);
static ENGINE_INIT: Mutex<()> = Mutex::new(());

pub fn generation() -> u32 {
    GEN.load(SeqCst)
}

/// The engine of this process if it runs already (never starts one).
pub fn running_engine() -> Option<&'static Engine> {
    if ENGINE_GEN.load(SeqCst) != generation() {
        return None;
    }
    let p = ENGINE.load(SeqCst);
    (!p.is_null()).then(|| leaked(p))
}

/// The engine of this process (started on first use, again in a fork child).
pub fn engine() -> io::Result<&'static Engine> {
    let g = generation();
    if ENGINE_GEN.load(SeqCst) == g {
        // SAFETY-free: the pointer was leaked from a Box and is never freed.
        let p = ENGINE.load(SeqCst);
        if !p.is_null() {
            return Ok(leaked(p));
        }
    }
    let _l = lock(&ENGINE_INIT);
    if ENGINE_GEN.load(SeqCst) == g && !ENGINE.load(SeqCst).is_null() {
        return Ok(leaked(ENGINE.load(SeqCst)));
    }
    // Bad values are logged once and leave their defaults.
    let cfg = Config::from_env().unwrap_or_default();
    let e: &'static mut Engine = Box::leak(Box::new(Engine::start(cfg)?));
    ENGINE.store(e, SeqCst);
    ENGINE_GEN.store(g, SeqCst);
    drop(_l);
    crate::startup::announce();
    Ok(e)
}

fn leaked(p: *mut Engine) -> &'static Engine {
    // SAFETY: ENGINE only ever holds pointers from Box::leak, never freed.
    #[allow(unsafe_code)]
    unsafe {
        &*p
    }
}

/// `EUDP_SOCK_RCVBUF`: kernel receive buffer of adopted sockets, in bytes.
fn sock_rcvbuf() -> Option<i32> {
    std::env::var("EUDP_SOCK_RCVBUF").ok().and_then(|v| v.trim().parse().ok()).filter(|&b: &i32| b > 0)
}

/// `EUDP_TRANSPORT=tcp`: endpoints use the engine's TCP (UOE) backend.
/// The application's kernel socket then never becomes readable: sockets
/// are adopted as soon as they are waited on, and readiness includes the
/// backend's descriptor.
pub fn tcp_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() == "tcp"
}

/// `EUDP_TRANSPORT=xdp`: IPv4 endpoints use the engine's AF_XDP backend.
/// The program's kernel socket then gets only what the fast path does not
/// carry (see the engine's `backend::xdp`), so readiness includes the
/// backend's descriptor, as under the TCP transport.
pub fn xdp_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() == "xdp"
}

/// A transport whose datagrams do not reach the program's kernel socket
/// (`tcp` or `xdp`): sockets are adopted at bind and readiness includes the
/// backend's descriptor.
pub fn bypass_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() != "kernel"
}

/// Fallback reasons of a socket shared with a fork child: `fallback`
/// recognises them (GRO must go off at once, the child may read).
const FORK_REASON: &str = "fork(): socket shared with the child (EUDP_FORK_KEEP=1 keeps the parent accelerated)";
const VFORK_REASON: &str =
    "vfork(): socket inherited by the program the child executes (EUDP_FORK_KEEP=1 keeps the parent accelerated)";

fn fork_keep() -> bool {
    std::env::var("EUDP_FORK_KEEP").map(|v| v == "1").unwrap_or(false)
}

// ------------------------------------------------------------ per socket

impl Sock {
    pub fn mode(&self) -> u8 {
        self.mode.load(Acquire)
    }

    pub fn nonblock(&self) -> bool {
        self.nonblock.load(Relaxed)
    }

    pub fn has_leftover(&self) -> bool {
        self.has_leftover.load(Acquire)
    }

    /// On the kernel path: waits until a fallback in progress has handed
    /// the socket over (what it keeps is then in the leftovers).
    #[inline]
    pub fn await_hand_over(&self) {
        if self.handing_over.load(Acquire) {
            drop(lock(&self.handover));
        }
    }

    /// The endpoint's error flag for an epoll registration (made now if
    /// needed; see [`Endpoint::error_fd`]).
    pub fn err_fd(&self, ep: &Endpoint) -> Option<i32> {
        cached_fd(&self.err_fd, || ep.error_fd())
    }

    /// The error flag if one was made (for poll/select).
    #[inline]
    pub fn err_fd_made(&self) -> Option<i32> {
        Some(self.err_fd.load(Relaxed)).filter(|&f| f >= 0)
    }

    /// Sockets on the engine: the kernel socket gets `IP_RECVTOS` and
    /// `IP_RECVTTL` on (IPv6: `IPV6_RECVTCLASS` and `IPV6_RECVHOPLIMIT`), so
    /// every message the engine reads carries its TOS and TTL (traffic
    /// class and hop limit): the kernel reports them only while the option
    /// is on when a message is read, not when it arrived. The program's
    /// own settings are kept here: `getsockopt` reports them, the shim
    /// writes these control messages only when the program asked, and a
    /// fallback or an exec gives them back to the kernel socket.
    fn force_rx_opts(&self, fd: i32) {
        if tcp_transport() {
            return;
        }
        let (level, tos_name, ttl_name) = rx_opt_names(self.v6);
        let tos = crate::hooks::int_opt(fd, level, tos_name);
        let ttl = crate::hooks::int_opt(fd, level, ttl_name);
        let (Some(tos), Some(ttl)) = (tos, ttl) else { return };
        let bits = RX_FORCED | if tos != 0 { RX_WANT_TOS } else { 0 } | if ttl != 0 { RX_WANT_TTL } else { 0 };
        self.set_rx_opts(fd, true, true);
        self.rx_opts.store(bits, Release);
    }

    /// Sets the kernel socket's TOS and TTL options (traffic class and hop
    /// limit) to `tos` and `ttl`.
    fn set_rx_opts(&self, fd: i32, tos: bool, ttl: bool) {
        let (level, tos_name, ttl_name) = rx_opt_names(self.v6);
        crate::hooks::set_int_opt(fd, level, tos_name, i32::from(tos));
        crate::hooks::set_int_opt(fd, level, ttl_name, i32::from(ttl));
    }

    /// True while the kernel socket has those options on for the engine
    /// rather than as the program set them.
    pub fn rx_opts_forced(&self) -> bool {
        self.rx_opts.load(Acquire) & RX_FORCED != 0
    }

    /// Whether the program asked for the TOS/traffic class (`tos`) or the
    /// TTL/hop limit.
    pub fn wants_rx_opt(&self, tos: bool) -> bool {
        self.rx_opts.load(Acquire) & if tos { RX_WANT_TOS } else { RX_WANT_TTL } != 0
    }

    /// The program set one of those options (`name`) to `on` while the
    /// kernel socket has both on for the engine: recorded, and the kernel
    /// socket keeps both on.
    pub fn note_rx_opt(&self, fd: i32, name: i32, on: bool) {
        let (level, tos_name, _) = rx_opt_names(self.v6);
        let bit = if name == tos_name { RX_WANT_TOS } else { RX_WANT_TTL };
        if on {
            self.rx_opts.fetch_or(bit, AcqRel);
        } else {
            self.rx_opts.fetch_and(!bit, AcqRel);
        }
        crate::hooks::set_int_opt(fd, level, name, 1);
    }

    /// Gives the kernel socket back the program's settings (`keep`: they
    /// stay recorded as forced, for an exec that fails).
    pub fn restore_rx_opts(&self, fd: i32, keep: bool) {
        let bits = self.rx_opts.load(Acquire);
        if bits & RX_FORCED == 0 {
            return;
        }
        self.set_rx_opts(fd, bits & RX_WANT_TOS != 0, bits & RX_WANT_TTL != 0);
        if !keep {
            self.rx_opts.fetch_and(!RX_FORCED, AcqRel);
        }
    }

    /// After an exec that failed: the socket is still on the engine.
    pub fn reforce_rx_opts(&self, fd: i32) {
        if self.rx_opts_forced() {
            self.set_rx_opts(fd, true, true);
        }
    }

    pub fn reason(&self) -> Option<String> {
        lock(&self.reason).clone()
    }

    /// Records the application's O_NONBLOCK; the caller passes it on to
    /// the shared description too. The engine's own calls never block
    /// (`MSG_DONTWAIT`), and a blocking receive may then sleep inside its
    /// read as on a kernel socket.
    pub fn set_nonblock(&self, on: bool) {
        self.nonblock.store(on, Relaxed);
        if self.mode() == ACTIVE {
            if let Some(ep) = lock(&self.ep).as_ref() {
                ep.set_nonblocking(on);
            }
        }
    }

    /// The endpoint serving this socket, created on first use; `None` on the
    /// kernel path.
    #[inline]
    pub fn endpoint(&self, fd: i32) -> Option<Arc<Endpoint>> {
        match self.mode() {
            ACTIVE => lock(&self.ep).clone(),
            KERNEL => None,
            _ => self.activate(fd),
        }
    }

    /// The endpoint only if it already exists.
    pub fn existing(&self) -> Option<Arc<Endpoint>> {
        if self.mode() == ACTIVE {
            lock(&self.ep).clone()
        } else {
            None
        }
    }

    /// Runs `f`, which must not sleep for long, on the endpoint if the socket is on
    /// the engine: lock-free when it can (`crate::borrow`), else through
    /// the mutex.
    #[inline]
    pub fn with_existing<R>(&self, f: impl FnOnce(&Endpoint) -> R) -> Option<R> {
        if self.mode() != ACTIVE {
            return None;
        }
        with_tls(|t| self.with_existing_in(t, f))
    }

    /// [`Sock::with_existing`] with this thread's [`Tls`] in hand.
    #[inline]
    pub fn with_existing_in<R>(&self, t: &Tls, f: impl FnOnce(&Endpoint) -> R) -> Option<R> {
        if self.mode() != ACTIVE {
            return None;
        }
        match crate::borrow::borrow(t, self, f) {
            Ok(r) => Some(r),
            Err(f) => self.existing().map(|ep| f(&ep)),
        }
    }

    fn activate(&self, fd: i32) -> Option<Arc<Endpoint>> {
        let mut g = lock(&self.ep);
        match self.mode() {
            ACTIVE => return g.clone(),
            KERNEL => return None,
            _ => {}
        }
        let r = (|| -> io::Result<Endpoint> {
            let _inside = Inside::enter();
            if !crate::fdspace::has_room(fd, PRIVATE_PER_SOCKET) {
                return Err(io::Error::from_raw_os_error(libc::EMFILE));
            }
            let engine = engine()?;
            // SAFETY-free wrapper: real::fcntl is libc's fcntl.
            let d = crate::hooks::real_dup_cloexec(fd)?;
            // A number the kernel just handed out cannot name an application
            // socket: an entry for it is stale (closed behind the shim's back).
            forget_stale(d);
            // SAFETY: d was just returned by fcntl(F_DUPFD_CLOEXEC) and is ours.
            #[allow(unsafe_code)]
            let owned = unsafe { OwnedFd::from_raw_fd(d) };
            let ep = if tcp_transport() {
                // Paper 002's emulated UOE: datagrams travel over TCP lanes.
                eudp_engine::backend::tcp::endpoint_from_kernel_fd(engine, owned)?
            } else if xdp_transport() {
                // AF_XDP; without it (privileges, a queue another process
                // holds) the kernel backend, said once in the debug log.
                match eudp_engine::backend::xdp::XdpTransport::global() {
                    Ok(t) => t.endpoint_from_kernel_fd(engine, owned)?,
                    Err(e) => {
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| dlog!("xdp transport unavailable, kernel backend instead: {e}"));
                        XDP_UNAVAILABLE.fetch_add(1, Relaxed);
                        Endpoint::from_kernel_fd(engine, owned)?
                    }
                }
            } else {
                Endpoint::from_kernel_fd(engine, owned)?
            };
            ep.set_nonblocking(self.nonblock());
            if let Some(bytes) = sock_rcvbuf() {
                // Kernel-side room for bursts while the engine thread is not
                // running (the ring keeps the program's SO_RCVBUF size).
                crate::hooks::grow_kernel_rcvbuf(d, bytes);
            }
            let (rt, st) = crate::hooks::kernel_timeouts(fd);
            // The backend's socket is a duplicate of the program's: the
            // same socket, holding the same SO_RCVTIMEO.
            ep.set_read_timeout_in_socket(rt);
            ep.set_write_timeout(st);
            self.force_rx_opts(fd);
            ep.backend().option_changed();
            self.dup_fd.store(d, SeqCst);
            Ok(ep)
        })();
        match r {
            Ok(ep) => {
                let ep = Arc::new(ep);
                *g = Some(ep.clone());
                crate::borrow::init();
                self.fast.store(Arc::as_ptr(&ep) as *mut Endpoint, SeqCst);
                let _ = self.ring_len.set(ep.ring_len());
                self.mode.store(ACTIVE, Release);
                ACCELERATED.fetch_add(1, Relaxed);
                dlog!("fd {fd}: UDP socket on the engine (endpoint over fd {})", ep.raw_fd());
                Some(ep)
            }
            Err(e) => {
                drop(g);
                let reason = if e.raw_os_error() == Some(libc::EMFILE) {
                    budget_reason("attaching to the engine")
                } else {
                    format!("cannot attach to the engine: {e}")
                };
                self.fallback(fd, &reason);
                None
            }
        }
    }

    /// The ring's eventfd when the socket is on the engine and its ring
    /// holds a datagram now, found without touching the endpoint.
    pub fn ready_ring_fd(&self) -> Option<i32> {
        let fd = self.poll_fd.load(Relaxed);
        (fd >= 0 && self.mode() == ACTIVE && self.ring_len.get()?.get() > 0).then_some(fd)
    }

    /// True when the socket is on the engine and its ring holds a datagram.
    #[inline]
    pub fn ring_has_data(&self) -> bool {
        self.ring_len.get().is_some_and(|r| r.get() > 0)
    }

    /// The eventfd readable while the ring holds a datagram.
    pub fn ring_fd(&self, ep: &Endpoint) -> Option<i32> {
        // The endpoint creates its ready fd once and keeps it for life; the
        // cache is cleared when the endpoint goes (fallback, fork).
        cached_fd(&self.poll_fd, || ep.poll_fd())
    }

    /// Moves this socket to the plain kernel path for good: every datagram
    /// the kernel already accepted for it is kept for the application, in
    /// order (see [`hand_over`]), queued sends are flushed, the endpoint is
    /// closed and the kernel socket gets back the flags the application
    /// asked for.
    ///
    /// Receives serve the kept datagrams before the kernel's: recv,
    /// recvfrom, recvmsg, recvmmsg, read, readv (`MSG_PEEK` too), FIONREAD,
    /// poll and select. An epoll set the application registered the socket
    /// in while it was on the engine also holds the ring's readiness
    /// eventfd, which is kept readable while datagrams are kept (closed,
    /// and so out of every epoll set, with the last one); a socket added to
    /// an epoll set after the fallback gets it added as well. Kept
    /// datagrams keep what the kernel reported with them (destination,
    /// TOS, TTL).
    ///
    /// Receives wait while the hand-over runs (`handing_over`). A receive
    /// that began on the engine and waits there finds, when it wakes, the
    /// socket handed over: it is made again on the kernel path (kept
    /// datagrams first, see [`crate::hooks`]' `shim_recv`). A thread asleep
    /// inside its read of an empty socket is not waited for, as the
    /// kernel's own option call does not wait for it: it keeps sleeping
    /// there, takes the next message, as a plain receive of the kernel
    /// socket would, and returns it (see [`Endpoint::stop_receiving`]);
    /// until it has, receives on the kernel path leave the socket to it
    /// (`reader_out`). Not for a fork: the child may read the socket,
    /// whose GRO must then be off, so the read is waited for (boundedly).
    pub fn fallback(&self, fd: i32, reason: &str) {
        if self.mode() == KERNEL {
            return; // also keeps a fork child off locks the parent's threads held
        }
        // Receives that find the socket on the kernel path wait for this.
        let _handing = lock(&self.handover);
        let ep = {
            let mut g = lock(&self.ep);
            if self.mode() == KERNEL {
                return;
            }
            self.handing_over.store(true, SeqCst);
            self.mode.store(KERNEL, Release);
            self.fast.store(std::ptr::null_mut(), SeqCst);
            g.take()
        };
        *lock(&self.reason) = Some(reason.to_string());
        FALLBACKS.fetch_add(1, Relaxed);
        crate::stat::note_fallback(reason);
        dlog!("fd {fd}: UDP socket moved to the kernel path: {reason}");
        if let Some(ep) = ep {
            let mut keep = lock(&self.leftover);
            let before = keep.len();
            // A socket shared with a fork child must not keep UDP_GRO on
            // (see `hand_over`): the child may read it.
            let shared = reason == FORK_REASON || reason == VFORK_REASON;
            let asleep = hand_over(fd, &ep, &mut keep, !shared);
            // A connected socket's ring keeps no source: it is the peer.
            if let Ok(peer) = ep.peer_addr() {
                for (_, src, _) in keep.iter_mut().skip(before).filter(|(_, a, _)| a.port() == 0) {
                    *src = peer;
                }
            }
            let mut ready = ep.take_ready_fd();
            if asleep {
                // Wakes receives waiting for what the sleeping read keeps.
                if ready.is_none() {
                    ready = EventFd::new().ok().map(Arc::new);
                }
                *lock(&self.reader_ep) = Some(ep.clone());
                // SAFETY: getpid has no preconditions.
                #[allow(unsafe_code)]
                self.reader_out.store(unsafe { libc::getpid() }, Release);
            }
            if !keep.is_empty() {
                if let Some(r) = &ready {
                    r.set();
                }
                self.has_leftover.store(true, Release);
            }
            if !keep.is_empty() || asleep {
                *lock(&self.leftover_ready) = ready;
            }
            dlog!(
                "fd {fd}: {} datagrams kept for the kernel path{}",
                keep.len(),
                if asleep { "; a read asleep in the socket takes the next message" } else { "" }
            );
            // What was queued goes out now, ahead of the program's sends on
            // the kernel path, and before the final counters are taken so
            // they count it (the endpoint's drop would send it only after:
            // a burst then a fallback was reported short). With a read
            // asleep the endpoint lives on until that read returns.
            ep.flush(Duration::from_secs(5));
            drop(keep);
            crate::stat::retire(self, &ep);
            self.poll_fd.store(-1, Relaxed);
            self.dup_fd.store(-1, Relaxed);
            self.err_fd.store(-1, Relaxed);
            self.release(ep);
            if asleep {
                // GRO goes off when the sleeping read has ended.
                crate::hooks::restore_kernel_flags(fd, self.nonblock());
            } else {
                crate::hooks::restore_kernel_socket(fd, self.nonblock());
            }
            // Kept datagrams carry their TOS/TTL; new ones get them from
            // the kernel only if the program asked.
            self.restore_rx_opts(fd, false);
        }
        self.handing_over.store(false, SeqCst);
    }

    /// A datagram kept from the ring after a fallback.
    pub fn pop_leftover(&self, buf: &mut [u8], peek: bool, want: Info) -> Option<Received> {
        let mut g = lock(&self.leftover);
        let (d, src, info) = if peek { g.front().cloned()? } else { g.pop_front()? };
        if g.is_empty() && !peek {
            self.has_leftover.store(false, Release);
            let mut ready = lock(&self.leftover_ready);
            if self.reader_out.load(Acquire) == 0 {
                // Closed: the socket's own readiness is all there is now.
                ready.take();
            } else if let Some(r) = ready.as_ref() {
                // Still wanted for what the sleeping read keeps.
                r.clear();
            }
        }
        let n = d.len().min(buf.len());
        buf[..n].copy_from_slice(&d[..n]);
        if let Some(w) = want {
            *w = info;
        }
        Some(Received { copied: n, len: d.len(), src })
    }

    /// On the kernel path: a thread left asleep in its read of the socket
    /// at the hand-over has not returned yet (see `reader_out`).
    #[inline]
    pub fn reader_in_flight(&self) -> bool {
        let p = self.reader_out.load(Acquire);
        // SAFETY: getpid has no preconditions.
        #[allow(unsafe_code)]
        let here = p != 0 && p == unsafe { libc::getpid() };
        here
    }

    /// Called by every receive that went through the endpoint and found
    /// the socket `fd` handed over when it returned (the thread left asleep
    /// in its read among them): what that read brought and nobody took
    /// from the ring joins the leftovers, in order after them. Once that
    /// read has ended the hand-over is finished ([`hand_over`]: what
    /// arrived meanwhile, coalesced while GRO stayed on for that read, is
    /// kept too, and GRO goes off), and receives on the kernel path may
    /// read the kernel socket again.
    #[cold]
    #[inline(never)]
    pub fn after_hand_over(&self, fd: i32) {
        // `reader_out` is settled once the hand-over is.
        self.await_hand_over();
        let mut keep = lock(&self.leftover);
        if !self.reader_in_flight() {
            return;
        }
        let Some(ep) = lock(&self.reader_ep).clone() else { return };
        // Read first: once it is false the read's datagrams are in the ring.
        let asleep = ep.reader_asleep();
        let before = keep.len();
        if asleep {
            ep.take_received(0, Duration::ZERO, true, &mut keep);
        } else {
            hand_over(fd, &ep, &mut keep, false);
        }
        if let Ok(peer) = ep.peer_addr() {
            for (_, src, _) in keep.iter_mut().skip(before).filter(|(_, a, _)| a.port() == 0) {
                *src = peer;
            }
        }
        if keep.len() > before {
            dlog!("fd {fd}: {} more datagrams kept for the kernel path after the sleeping read", keep.len() - before);
            if let Some(r) = lock(&self.leftover_ready).as_ref() {
                r.set();
            }
            self.has_leftover.store(true, Release);
        }
        if !asleep {
            let ep = self.reader_gone(&keep);
            drop(keep);
            drop(ep);
        }
    }

    /// The read left asleep at the hand-over is over (the leftover lock is
    /// held: `keep` is what it guards). Returns the endpoint, for the
    /// caller to drop once that lock is released (closing it may wait for
    /// the engine).
    fn reader_gone(&self, keep: &VecDeque<KeptDatagram>) -> Option<Arc<Endpoint>> {
        self.reader_out.store(0, Release);
        if keep.is_empty() {
            lock(&self.leftover_ready).take();
        }
        lock(&self.reader_ep).take()
    }

    /// A receive on the kernel path while a thread left asleep in its read
    /// of the socket at the hand-over has not returned ([`Sock::reader_in_flight`]):
    /// the leftovers first; the kernel socket stays that read's. A datagram
    /// in the kernel socket is that read's to take (no other read of the
    /// socket runs meanwhile), which ends it within microseconds: this
    /// waits for it. With nothing queued a nonblocking receive reports
    /// `EAGAIN` and a blocking one sleeps until the socket or the
    /// leftovers are readable (honouring `SO_RCVTIMEO`, and failing with
    /// `EINTR` as [`ep_recv`] does). `None`: that read has ended; receive
    /// from the kernel socket.
    #[cold]
    #[inline(never)]
    pub fn await_reader(
        &self,
        fd: i32,
        buf: &mut [u8],
        peek: bool,
        blocking: bool,
        mut want: Info,
    ) -> Option<Result<Received, i32>> {
        // A read that does not take a queued datagram in this long is not
        // coming back (its thread stopped, or cancelled in the read).
        const TAKING: Duration = Duration::from_millis(50);
        let deadline = if blocking { crate::hooks::kernel_timeouts(fd).0.map(|t| Instant::now() + t) } else { None };
        let mut queued_since: Option<Instant> = None;
        loop {
            if let Some(r) = self.pop_leftover(buf, peek, want.as_deref_mut()) {
                return Some(Ok(r));
            }
            if !self.reader_in_flight() {
                return None;
            }
            if crate::hooks::kernel_has_data(fd) {
                let since = *queued_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= TAKING {
                    let mut keep = lock(&self.leftover);
                    let ep = lock(&self.reader_ep).clone();
                    if let (Some(ep), true) = (ep, keep.is_empty() && self.reader_in_flight()) {
                        dlog!("fd {fd}: the read asleep at the hand-over did not take a queued datagram; reading the kernel socket");
                        // It holds the socket: the ring is taken and GRO goes off.
                        hand_over(fd, &ep, &mut keep, false);
                        if !keep.is_empty() {
                            self.has_leftover.store(true, Release);
                        }
                        let ep = self.reader_gone(&keep);
                        drop(keep);
                        drop(ep);
                    }
                    continue;
                }
                std::thread::yield_now();
                continue;
            }
            queued_since = None;
            if !blocking {
                return Some(Err(libc::EAGAIN));
            }
            let left = match deadline {
                Some(d) => match d.checked_duration_since(Instant::now()) {
                    Some(l) if !l.is_zero() => Some(l),
                    _ => return Some(Err(libc::EAGAIN)),
                },
                None => None,
            };
            if crate::hooks::wait_readable(fd, self.leftover_ready_fd(), left) == Err(libc::EINTR)
                && crate::signals::eintr_wanted()
            {
                return Some(Err(libc::EINTR));
            }
        }
    }

    /// The readiness eventfd standing for the kept datagrams, if any.
    pub fn leftover_ready_fd(&self) -> Option<i32> {
        lock(&self.leftover_ready).as_ref().map(|e| e.as_raw_fd())
    }

    fn close(&self) {
        // The last fd is gone: nobody can receive what was kept, and the
        // eventfd must not report a closed socket in an epoll set.
        lock(&self.leftover).clear();
        self.has_leftover.store(false, Release);
        lock(&self.leftover_ready).take();
        if self.leaked.load(SeqCst) {
            return;
        }
        let ep = {
            let mut g = lock(&self.ep);
            self.fast.store(std::ptr::null_mut(), SeqCst);
            g.take()
        };
        if let Some(ep) = ep {
            // What was queued goes out first, as close(2) sends it too, so
            // that the final counters count it (a burst then close: logger).
            ep.flush(Duration::from_secs(5));
            crate::stat::retire(self, &ep);
            self.release(ep);
        }
    }

    /// Drops the endpoint taken from `ep` once no call borrows it (`fast`
    /// was cleared first). A borrower that does not finish in time keeps
    /// it alive for good: leaked, never freed under it.
    fn release(&self, ep: Arc<Endpoint>) {
        if crate::borrow::quiesce(self) {
            drop(ep);
        } else {
            dlog!("fd {}: endpoint still borrowed at close; left allocated", self.fd);
            std::mem::forget(ep);
        }
    }

    /// The endpoint's counters, for stats.
    pub fn snapshot(&self) -> Option<(eudp_engine::StatsSnapshot, Option<SocketAddr>, Option<SocketAddr>)> {
        if self.leaked.load(SeqCst) {
            return None;
        }
        let ep = self.existing()?;
        Some((ep.report(), ep.local_addr().ok(), ep.peer_addr().ok()))
    }
}

/// The descriptor cached in `slot` (-1: none yet), made by `make` and
/// cached on first use; `None` when it cannot be made.
fn cached_fd(slot: &AtomicI32, make: impl FnOnce() -> io::Result<i32>) -> Option<i32> {
    let cached = slot.load(Relaxed);
    if cached >= 0 {
        return Some(cached);
    }
    let fd = make().ok()?;
    slot.store(fd, Relaxed);
    Some(fd)
}

impl Drop for Sock {
    fn drop(&mut self) {
        crate::hooks::forget_ring_dups(self as *const Sock as usize);
        let out = *self.reader_out.get_mut();
        // SAFETY: getpid has no preconditions.
        #[allow(unsafe_code)]
        if out != 0 && out != unsafe { libc::getpid() } {
            // A fork child's: the endpoint's engine is the parent's.
            std::mem::forget(self.reader_ep.get_mut().unwrap_or_else(|e| e.into_inner()).take());
        }
        if self.leaked.load(SeqCst) {
            // The endpoint's engine is the parent's: dropping it would wait
            // for a thread that does not exist here.
            let ep = self.ep.get_mut().unwrap_or_else(|e| e.into_inner()).take();
            std::mem::forget(ep);
        }
    }
}

/// Moves everything the kernel already accepted for the socket of `fd`
/// into `keep`, in order, and leaves it on the plain kernel path with GRO
/// off and nothing coalesced in its queue. With `leave_asleep`, a thread
/// asleep inside its read of the empty socket is not waited for: the ring
/// is taken, the socket is left to that read with GRO still on (so what it
/// takes comes with its segment size and is split), and this returns true;
/// [`Sock::after_hand_over`] finishes the hand-over when the read ends.
///
/// While GRO was on the kernel may have queued several datagrams as one
/// coalesced message, which a plain receive would return glued together;
/// and the kernel reports a message's segment size only while GRO is on.
/// So the engine stops reading the socket, the ring and then the socket
/// are taken, split as the engine splits them
/// ([`Endpoint::take_received`]), with GRO on; then GRO goes off, after
/// which arrivals are queued as single datagrams. If the socket is empty
/// once GRO is off, nothing coalesced can be left (the queue is in
/// arrival order); if something arrived between the last read and the
/// option change, GRO goes on again for another round. Bounded: at most `ROUNDS`
/// rounds and the socket's `SO_RCVBUF` in bytes read (what the socket can
/// hold when GRO goes off); a sender that never lets the queue empty for
/// that long may leave a message coalesced before GRO went off (logged
/// with `EUDP_LOG=debug`).
fn hand_over(fd: i32, ep: &Endpoint, keep: &mut VecDeque<KeptDatagram>, leave_asleep: bool) -> bool {
    const ROUNDS: usize = 8;
    const WAIT: Duration = Duration::from_millis(200);
    ep.stop_receiving();
    let gro = crate::hooks::gro_enabled(fd);
    let mut left = crate::hooks::kernel_rcvbuf(fd).max(1 << 16);
    for round in 0..ROUNDS {
        let t = ep.take_received(left, WAIT, leave_asleep, keep);
        left = left.saturating_sub(t.socket_bytes);
        if t.reader_asleep {
            return true; // GRO stays on for it
        }
        if !gro {
            return false; // nothing coalesced was ever queued
        }
        crate::hooks::gro_set(fd, false);
        if !crate::hooks::kernel_has_data(fd) {
            return false;
        }
        let blocked = !t.socket_empty && t.socket_bytes == 0;
        if blocked || left == 0 || round + 1 == ROUNDS {
            dlog!("fd {fd}: the kernel queue did not empty while GRO went off (round {round}); a message may stay coalesced");
            return false;
        }
        crate::hooks::gro_set(fd, true);
    }
    false
}

// ------------------------------------------------------------- receiving

/// One receive on the engine path with the application's flags.
///
/// A blocking receive is the engine's own: it reads the socket on this
/// thread, keeps the engine off it while waiting (no second wake-up per
/// arrival), spins first under the latency profile (`EUDP_SPIN_US`, the
/// engine's `recv_spin`), honours SO_RCVTIMEO (mirrored into the endpoint
/// by `setsockopt`) and fails with `EINTR` when the program has a handler
/// without `SA_RESTART`, as the kernel would.
pub fn ep_recv(s: &Sock, ep: &Endpoint, buf: &mut [u8], flags: i32, mut info: Info) -> Result<Received, i32> {
    let peek = flags & libc::MSG_PEEK != 0;
    if flags & libc::MSG_DONTWAIT != 0 || s.nonblock() {
        return nonblocking_recv(s, ep, buf, peek, info);
    }
    let f = RecvFlags { peek, dont_wait: false, interruptible: crate::signals::eintr_wanted() };
    recv_info(ep, buf, f, &mut info).map_err(|e| errno_of(&e))
}

/// Where a receive writes the datagram's destination information
/// (`IP_PKTINFO` and the like): only `recvmsg` asks, so read/recv/recvfrom
/// do not carry it through the receive's layers.
pub type Info<'a> = Option<&'a mut Option<eudp_engine::backend::PktInfo>>;

/// One engine receive, with the destination information when asked for.
#[inline]
pub fn recv_info(ep: &Endpoint, buf: &mut [u8], f: RecvFlags, info: &mut Info) -> io::Result<Received> {
    match info {
        Some(i) => ep.recv_with_info(buf, f, i),
        None => ep.recv_with(buf, f),
    }
}

/// A nonblocking receive that never reports `EAGAIN` for a datagram that
/// is on its way into the ring. The engine takes a datagram off the socket
/// and pushes it into the ring a moment later; a receive in between finds
/// both empty, while the program was told (by the socket's readiness) that
/// a datagram is there — and some programs (libuv users such as dig) take
/// such an `EAGAIN` for end of stream. A receive that could not read the
/// socket itself (its `direct_recv_calls` did not move: the engine or
/// another thread holds the socket) waits briefly for the ring.
#[inline]
pub fn nonblocking_recv(s: &Sock, ep: &Endpoint, buf: &mut [u8], peek: bool, mut info: Info) -> Result<Received, i32> {
    let f = RecvFlags { peek, dont_wait: true, interruptible: false };
    let before = ep.socket_reads();
    match recv_info(ep, buf, f, &mut info) {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => nonblocking_recv_empty(s, ep, buf, f, info, before),
        r => r.map_err(|e| errno_of(&e)),
    }
}

/// [`nonblocking_recv`] once the ring was found empty, out of line so the
/// common case (a datagram waiting) stays small enough to inline. When the
/// socket was read during that receive (on this thread, or another's read
/// that began after this call did) it was found empty: `EAGAIN` at once,
/// as the kernel answers, with the one read the kernel would make. (This
/// used to read the socket a second time and take two full stats
/// snapshots, which made each `EAGAIN` of a read-until-empty event loop
/// cost about 9 times the kernel's.)
#[inline(never)]
fn nonblocking_recv_empty(
    s: &Sock,
    ep: &Endpoint,
    buf: &mut [u8],
    f: RecvFlags,
    mut info: Info,
    before: u64,
) -> Result<Received, i32> {
    if ep.socket_reads() != before {
        return Err(libc::EAGAIN); // the socket was read: really empty
    }
    let ring = s.ring_fd(ep);
    let deadline = Instant::now() + Duration::from_millis(2);
    loop {
        if let Some(r) = ring {
            let _ = crate::hooks::wait_readable(r, None, Some(Duration::from_millis(1)));
        }
        match recv_info(ep, buf, f, &mut info) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r.map_err(|e| errno_of(&e)),
        }
        if ep.socket_reads() != before || Instant::now() >= deadline {
            return Err(libc::EAGAIN);
        }
    }
}

/// One send on the engine path; `MSG_DONTWAIT` makes this call
/// nonblocking on a blocking socket, as the kernel does.
pub fn ep_send(ep: &Endpoint, data: &[u8], dst: Option<SocketAddr>, flags: i32) -> Result<usize, i32> {
    let f = eudp_engine::SendFlags { dont_wait: flags & libc::MSG_DONTWAIT != 0 };
    ep.send_with(data, dst, f).map_err(|e| errno_of(&e))
}

// ------------------------------------------------------------------ fork

/// Holds the table's write lock from the fork prepare handler to the
/// parent/child handler, so the child never inherits a lock held by a
/// thread that does not exist there.
type Held = (MutexGuard<'static, ()>, RwLockWriteGuard<'static, BTreeMap<i32, Arc<Sock>>>, crate::stat::Guards);
struct ForkGuard(std::cell::UnsafeCell<Option<Held>>);
// SAFETY: only the forking thread touches it, between prepare and
// parent/child, which run on that same thread.
#[allow(unsafe_code)]
unsafe impl Sync for ForkGuard {}
static FORK_GUARD: ForkGuard = ForkGuard(std::cell::UnsafeCell::new(None));

thread_local! {
    /// Set while this thread's `vfork` runs as `fork` (see [`vforking`]).
    static VFORKING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread's coming `fork` as standing for a `vfork`
/// (`crate::hooks::vfork`), whose child can only exec or exit.
pub fn vforking(on: bool) {
    // Not during the thread's exit (its locals gone): a plain fork then.
    let _ = VFORKING.try_with(|v| v.set(on));
}

/// Before fork: a socket both processes hold must be read by whichever
/// calls `recv`, as with the kernel, but the parent's engine would take
/// every arrival into a ring only the parent reads. So the parent's
/// sockets move to the kernel path first, unless `EUDP_FORK_KEEP=1` says
/// the children do not use them (the parent then stays accelerated and
/// the children see kernel sockets).
///
/// For a `vfork` (run as `fork`, see `crate::hooks::vfork`) the child can
/// only exec or exit: a socket every fd of which has `FD_CLOEXEC` (Python's
/// sockets, `SOCK_CLOEXEC` ones) vanishes at the exec and stays on the
/// engine in the parent; one the executed program inherits is handled as
/// for `fork`.
///
/// The kernel socket of a socket the parent keeps on the engine is shared
/// with the child, so the child leaves its options alone (see
/// [`fork_child`]).
#[allow(unsafe_code)]
pub fn fork_prepare() {
    let vfork = VFORKING.try_with(|v| v.get()).unwrap_or(false);
    if !fork_keep() {
        let table = all();
        for (fd, s) in &table {
            if s.mode() != ACTIVE {
                continue;
            }
            if !vfork {
                s.fallback(*fd, FORK_REASON);
                continue;
            }
            let inherited = table.iter().filter(|(_, o)| Arc::ptr_eq(o, s)).any(|(f, _)| !crate::hooks::cloexec(*f));
            if inherited {
                s.fallback(*fd, VFORK_REASON);
            }
        }
    }
    // One-time initializations another thread may be running (the first
    // endpoint probes GSO): a child would wait for them forever. Settled
    // here, before any lock, so the child finds them done; once done this
    // costs a load each (the probe runs at most once per process tree).
    // Only in a process with UDP sockets: the probe opens one, which would
    // otherwise make every forking shell count as a UDP program.
    if UDP_SEEN.load(SeqCst) {
        let _ = eudp_engine::backend::kernel::gso_max_segments();
        let _ = eudp_engine::backend::kernel::tsc();
        let _ = tcp_transport();
    }
    // Every lock the child may need, in one order (engine, table, stats).
    let e = lock(&ENGINE_INIT);
    let g = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let st = crate::stat::lock_all();
    // SAFETY: see ForkGuard.
    unsafe { *FORK_GUARD.0.get() = Some((e, g, st)) };
}

#[allow(unsafe_code)]
pub fn fork_parent() {
    // SAFETY: see ForkGuard.
    unsafe { *FORK_GUARD.0.get() = None };
}

/// In the child: the engine thread is gone. Every accelerated socket
/// becomes a kernel socket (its endpoint is abandoned, the shim's own fds
/// closed); new sockets get a new engine.
///
/// A socket still accelerated here is one the parent keeps on the engine
/// (`fork_prepare` moved the others to the kernel path). Its kernel socket
/// is the parent's too: its UDP_GRO stays on, since turning it off would
/// make the parent's engine read coalesced messages without their segment
/// size (datagrams glued together). A child that receives on such a socket
/// anyway (against `EUDP_FORK_KEEP=1`'s premise) may get coalesced
/// datagrams; after a `vfork` it cannot receive at all.
#[allow(unsafe_code)]
pub fn fork_child() {
    GEN.fetch_add(1, SeqCst);
    // The TCP transport's listener and connections are the parent's: given
    // up at once, lock-free (no-op when no transport ever started).
    eudp_engine::backend::tcp::forked_child();
    // The AF_XDP socket and its queue stay the parent's.
    eudp_engine::backend::xdp::XdpTransport::forked_child();
    // The trace buffers hold the parent's events: the child's own dump
    // (`EUDP_TRACE` with `%p`) starts empty.
    eudp_engine::tracepoint::forked_child();
    crate::ktrace::forked_child();
    // SAFETY: see ForkGuard.
    let g = unsafe { (*FORK_GUARD.0.get()).take() };
    if let Some((_, t, _)) = &g {
        for s in t.values() {
            if s.mode() == ACTIVE && !s.leaked.swap(true, SeqCst) {
                s.mode.store(KERNEL, Release);
                s.fast.store(std::ptr::null_mut(), SeqCst);
                for f in [s.dup_fd.swap(-1, SeqCst), s.poll_fd.swap(-1, SeqCst), s.err_fd.swap(-1, SeqCst)] {
                    if f >= 0 {
                        crate::hooks::real_close(f);
                    }
                }
            }
        }
    }
    drop(g);
    crate::fdspace::forked();
    crate::borrow::forked();
    crate::stat::forked();
}
