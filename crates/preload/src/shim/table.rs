//! The table of the application's UDP sockets by descriptor, with a
//! per-thread lookup cache and the sockets' registration and removal.

use super::generation::generation;
use super::sock::{lock, Sock, ACTIVE, LAZY, MAX_FD};
use super::tls::{inside, with_tls, Tls, CACHE_WAYS};
use crate::log::dlog;
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, RwLock};

static BITS: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];
pub(super) static TABLE: RwLock<BTreeMap<i32, Arc<Sock>>> = RwLock::new(BTreeMap::new());
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

pub(super) fn bit(fd: i32) -> Option<(usize, u64)> {
    let f = usize::try_from(fd).ok().filter(|&f| f < MAX_FD)?;
    Some((f / 64, 1u64 << (f % 64)))
}

/// Private descriptors a socket on the engine may need: the engine's
/// duplicate of it, its ring's eventfd and its error flag (the last two
/// for poll and epoll). A socket is attached only with room for them.
pub(super) const PRIVATE_PER_SOCKET: usize = 3;

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
            && !crate::ringdup::has_ring_dups(Arc::as_ptr(&s) as usize)
        {
            continue;
        }
        s.fallback(fd, "descriptor budget: the program needs the numbers below its limit");
        crate::ringdup::forget_ring_dups(Arc::as_ptr(&s) as usize);
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
pub(super) static UDP_SEEN: AtomicBool = AtomicBool::new(false);

/// Records a new UDP socket created by the application.
pub fn register_new(fd: i32, v6: bool, nonblock: bool) {
    if bit(fd).is_none() || disabled() {
        return;
    }
    if !UDP_SEEN.swap(true, SeqCst) {
        crate::fdspace::register_table(crate::fdspace::SocketTable { remove, inside, give_back_below });
    }
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
        kernel_path: Mutex::new(None),
        fd,
    });
    insert(fd, s);
    crate::stat::ensure_writer(crate::stat::Source {
        open_sockets: open_reports,
        generation,
        engine_config: || crate::shim::running_engine().map(|e| e.config().clone()),
        tick: || super::live_trace::poll(open_endpoints),
    });
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
        Some(o) => release(o, fd),
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
        release(o, fd);
    }
}

/// `fd` named `s` (it may name another file by now).
pub(super) fn release(s: Arc<Sock>, fd: i32) {
    if s.refs.fetch_sub(1, SeqCst) == 1 {
        s.close(fd);
    }
}

/// Every socket in the table (one entry per fd).
/// Hands `f` the report entry of each open socket, once per socket.
fn open_reports(f: &mut crate::stat::EntrySink<'_>) {
    let mut seen = std::collections::HashSet::new();
    for (fd, s) in all() {
        if seen.insert(s.id) {
            let entry = match s.snapshot(crate::stat::EXITING.load(SeqCst)) {
                Some(st) => s.report_entry(fd, Some(st), true),
                None => s.kernel_path_entry(fd).unwrap_or_else(|| s.report_entry(fd, None, true)),
            };
            f(&entry);
        }
    }
}

/// The endpoints of the open sockets that have one.
fn open_endpoints() -> Vec<Arc<eudp_engine::Endpoint>> {
    all().into_iter().filter_map(|(_, s)| lock(&s.ep).clone()).collect()
}

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
