//! The shim's and the engine's own descriptors, kept out of the program's
//! descriptor space.
//!
//! On the kernel a program's descriptors are numbered from the lowest free
//! number up to its soft `RLIMIT_NOFILE`. Every descriptor the shim or the
//! engine keeps for itself (the duplicate of each accelerated socket, the
//! ring eventfds, the engine's epoll set, eventfds and timerfds, the TCP
//! transport's sockets) is therefore moved to a *private* number at or
//! above the program's soft limit, by [`private_dup`], the one helper that
//! places them (the engine reaches it through
//! [`eudp_engine::fdspace::Placement`], installed at load time).
//!
//! The soft limit itself stays the program's: [`private_dup`] raises it to
//! the hard limit only around its own `F_DUPFD_CLOEXEC` and puts it back at
//! once (a process may hold descriptors above its soft limit). So the
//! program's own calls meet exactly its limit (EMFILE, `dup2` onto a number
//! beyond it fails with EBADF, `F_DUPFD` with EINVAL), and children and
//! executed programs inherit the limit the program set. The rlimit hooks
//! below serialize with that window and report the program's value during
//! it. When the hard limit leaves no room above the soft limit, private
//! descriptors go into a small region at the top of the program's space,
//! never under `FD_SETSIZE` when the space reaches well beyond it (logged
//! with `EUDP_LOG=debug`).
//!
//! The budget: private descriptors go only into that room (above the soft
//! limit, or the region below it), never at the program's lowest free
//! numbers. When none is left the placement fails, and the shim keeps the
//! socket that needed it on the plain kernel path (fallback reason
//! "descriptor budget"). Numbers below the soft limit are only lent: when
//! one of the program's own calls that makes a descriptor fails with
//! EMFILE while sockets hold private numbers below its soft limit
//! ([`reclaim`]), some of those sockets fall back, their numbers are given
//! back and the call is made again; from then on nothing more is placed
//! below the soft limit. The engine's own few descriptors (its epoll set,
//! doorbell, timer) stay where they are; its GRO key holder, which only
//! saves time, is closed.
//!
//! Private numbers are recorded in a bitmap: `close`, `close_range`,
//! `closefrom` and `dup2`/`dup3` onto one behave as the kernel does for a
//! number the program does not hold (EBADF, or skipped) and never close it.
//! The engine releases a number (`release`) just before closing it itself.
//! Private descriptors are close-on-exec; a fork child inherits them and
//! the bitmap with them.

use crate::log::dlog;
use crate::sys::errno::{errno, set_errno};
use crate::sys::fdspace::{
    close, close_range, closefrom, dup_cloexec_from, eventfd, is_open, nofile, own_new, set_nofile,
};
use crate::sys::process::{getpid, thread_name};
use libc::{c_int, c_uint};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::*};
use std::sync::OnceLock;

/// What the budget asks of the shim's socket table, which sits above this
/// module: the table registers it with its first socket. Until then the
/// table is empty and each of these would do nothing, which is what an
/// unregistered table does.
pub struct SocketTable {
    /// Forgets a descriptor number (closed, or now the engine's).
    pub remove: fn(c_int),
    /// Whether this thread is inside the shim's own work.
    pub inside: fn() -> bool,
    /// Sockets holding private descriptors below the limit fall back.
    pub give_back_below: fn(c_int),
}

static SOCKET_TABLE: OnceLock<SocketTable> = OnceLock::new();

/// Registers the socket table (once; later calls change nothing).
pub fn register_table(t: SocketTable) {
    let _ = SOCKET_TABLE.set(t);
}

fn table_remove(fd: c_int) {
    if let Some(t) = SOCKET_TABLE.get() {
        (t.remove)(fd);
    }
}

fn table_inside() -> bool {
    SOCKET_TABLE.get().is_some_and(|t| (t.inside)())
}

fn table_give_back_below(limit: c_int) {
    if let Some(t) = SOCKET_TABLE.get() {
        (t.give_back_below)(limit);
    }
}

/// Numbers below this are tracked (the kernel's `nr_open` default caps
/// descriptors at 2^20).
const TRACKED: usize = 1 << 20;
/// With less room than this between the soft and the hard limit, private
/// descriptors go below the limit instead.
const MIN_ROOM: u64 = 64;
/// Below the limit, they go no higher than this (the kernel's descriptor
/// table grows to the highest number in use)...
const TOP_CAP: u64 = 1 << 16;
/// ...and start this far below their top, an eighth of it at most.
const BELOW_MAX: u64 = 1024;

static PRIVATE: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];
/// Numbers released but perhaps not closed yet ([`release`] to [`closed`]):
/// still open, so a placement finding one below its duplicate must not take
/// it for a program's descriptor in the region lent below the soft limit.
static CLOSING: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];
static COUNT: AtomicUsize = AtomicUsize::new(0);

/// Odd while [`private_dup`] has the soft limit raised.
static WINDOW: AtomicU64 = AtomicU64::new(0);
/// The program's soft limit as the last window found it.
static PROGRAM_SOFT: AtomicU64 = AtomicU64::new(0);
/// Pid of the process holding the limits lock (0: free).
static HOLDER: AtomicI32 = AtomicI32::new(0);

fn slot(fd: c_int) -> Option<(usize, u64)> {
    let f = usize::try_from(fd).ok().filter(|&f| f < TRACKED)?;
    Some((f / 64, 1u64 << (f % 64)))
}

/// Whether `fd` is one of the shim's or the engine's own descriptors.
#[inline]
pub fn is_private(fd: c_int) -> bool {
    slot(fd).is_some_and(|(w, b)| PRIVATE[w].load(Relaxed) & b != 0)
}

fn mark(fd: c_int) {
    if let Some((w, b)) = slot(fd) {
        CLOSING[w].fetch_and(!b, SeqCst);
        if PRIVATE[w].fetch_or(b, SeqCst) & b == 0 {
            COUNT.fetch_add(1, SeqCst);
        }
    }
}

/// Forgets a private number whose descriptor is about to be closed: it
/// counts as closing until [`closed`].
fn release(fd: c_int) {
    if let Some((w, b)) = slot(fd) {
        CLOSING[w].fetch_or(b, SeqCst);
    }
    unmark(fd);
}

/// The number [`release`]d is closed now.
fn closed(fd: c_int) {
    if let Some((w, b)) = slot(fd) {
        CLOSING[w].fetch_and(!b, SeqCst);
    }
}

/// Closes one of the private descriptors, releasing its number first (it
/// counts as closing until the close has returned).
pub fn close_private(fd: c_int) {
    release(fd);
    close(fd);
    closed(fd);
}

/// In a fork child (one thread): a number the parent was closing at the
/// fork and had not closed yet stays open here, and nobody in the child
/// will close it, so it is private again; one closed already is free.
pub fn forked() {
    for (w, word) in CLOSING.iter().enumerate() {
        let mut bits = word.swap(0, SeqCst);
        while bits != 0 {
            let i = bits.trailing_zeros();
            bits &= bits - 1;
            let fd = (w * 64) as c_int + i as c_int;
            if is_open(fd) {
                mark(fd);
            }
        }
    }
}

/// Forgets a private number (its descriptor is about to be closed).
pub fn unmark(fd: c_int) {
    if let Some((w, b)) = slot(fd) {
        if PRIVATE[w].fetch_and(!b, SeqCst) & b != 0 {
            COUNT.fetch_sub(1, SeqCst);
        }
    }
}

// ------------------------------------------------------------ the limits

/// Serializes the program's changes of RLIMIT_NOFILE with the shim's
/// windows. A holder of another pid is a parent that forked while holding
/// it: the child takes the lock over.
pub(crate) struct Limits;

pub(crate) fn lock_limits() -> Limits {
    let me = getpid();
    for _ in 0..1_000_000 {
        match HOLDER.compare_exchange(0, me, Acquire, Relaxed) {
            Ok(_) => return Limits,
            Err(h) if h != me && HOLDER.compare_exchange(h, me, Acquire, Relaxed).is_ok() => return Limits,
            Err(_) => std::thread::yield_now(),
        }
    }
    dlog!("RLIMIT_NOFILE lock not released in time; going on without it");
    HOLDER.store(me, Relaxed);
    Limits
}

impl Drop for Limits {
    fn drop(&mut self) {
        HOLDER.store(0, Release);
    }
}

/// Set once a program's call found its space full while private
/// descriptors were lent numbers below its soft limit: no more go there.
static NO_BELOW: AtomicBool = AtomicBool::new(false);

/// Where private descriptors start for this soft and hard limit, whether
/// that is at or above the soft limit, and the soft limit needed meanwhile.
fn plan(soft: u64, hard: u64) -> (u64, bool, u64) {
    let hard = hard.min(TRACKED as u64);
    let soft = soft.min(hard);
    if hard - soft >= MIN_ROOM || NO_BELOW.load(Relaxed) {
        return (soft, true, hard);
    }
    let top = hard.min(TOP_CAP);
    let below = (top / 8).clamp(1, BELOW_MAX);
    let mut start = top.saturating_sub(below).max(3);
    if top >= libc::FD_SETSIZE as u64 + MIN_ROOM {
        // A program that uses select counts on its first FD_SETSIZE
        // numbers being its own.
        start = start.max(libc::FD_SETSIZE as u64);
    }
    (start.min(soft), false, hard)
}

/// Runs `f` with room for one more descriptor whatever the program holds:
/// the soft limit raised to the hard limit meanwhile (when it is lower),
/// serialized with the program's own changes of it. `f` gets where
/// private descriptors go ([`Room`]).
fn window<R>(f: impl FnOnce(Room) -> R) -> R {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    let _l = lock_limits();
    let (soft, hard) = nofile().map_or((0, 0), |r| (r.rlim_cur, r.rlim_max));
    let (min, above, need) = plan(soft, hard);
    let mut raised = false;
    if need > soft {
        PROGRAM_SOFT.store(soft, SeqCst);
        WINDOW.fetch_add(1, SeqCst);
        raised = set_nofile(need, hard);
        if !raised {
            WINDOW.fetch_add(1, SeqCst);
        }
    }
    if !LOGGED.swap(true, Relaxed) {
        if above {
            dlog!("private descriptors from {min}, above the program's soft RLIMIT_NOFILE {soft} (hard {hard})");
        } else {
            dlog!("the hard RLIMIT_NOFILE {hard} leaves no room above the soft limit {soft}: private descriptors from {min}, below it");
        }
    }
    let r = f(Room { min, lent: (!above).then_some(soft) });
    if raised {
        set_nofile(soft, hard);
        WINDOW.fetch_add(1, SeqCst);
    }
    r
}

/// Where private descriptors go: from `min`; `lent` is the program's soft
/// limit when that is below it (numbers lent by the program).
#[derive(Clone, Copy)]
struct Room {
    min: u64,
    lent: Option<u64>,
}

/// Whether no number in `[a, b)` is a program's descriptor: each is a
/// private one, one being closed by the engine or the shim (see
/// [`CLOSING`]), or closed by now. Called just after a duplicate landed at
/// `b`, so every number below it was open a moment ago; one that another
/// thread released and closed since then (its closing mark already gone)
/// was not the program's.
fn all_private(a: u64, b: u64) -> bool {
    (a..b).all(|n| {
        let Some((w, bit)) = slot(n as c_int) else { return false };
        (PRIVATE[w].load(SeqCst) | CLOSING[w].load(SeqCst)) & bit != 0 || !is_open(n as c_int)
    })
}

/// F_DUPFD_CLOEXEC of `fd` in `room`. Where that is full this fails
/// (EMFILE): the program's own numbers are never taken. Below the
/// program's soft limit, a number past one of the program's own in the
/// region means its descriptors have reached the region: it needs them, so
/// nothing more goes there.
fn dup_from(fd: c_int, room: Room) -> io::Result<c_int> {
    static LOGGED: AtomicBool = AtomicBool::new(false);
    let min = room.min;
    let full = || {
        if !LOGGED.swap(true, Relaxed) {
            dlog!("descriptor budget: no private descriptor number left at or above {min} (further ones show as fallbacks)");
        }
        Err(io::Error::from_raw_os_error(libc::EMFILE))
    };
    let d = match dup_cloexec_from(fd, min) {
        Ok(d) => d,
        Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::EINVAL)) => return full(),
        Err(e) => return Err(e),
    };
    if room.lent.is_some_and(|soft| (d as u64) < soft) && !all_private(min, d as u64) {
        // Just made here and nobody else's.
        close(d);
        if !NO_BELOW.swap(true, SeqCst) {
            dlog!("the program's descriptors reached the numbers lent below its soft RLIMIT_NOFILE: none placed there any more");
        }
        return full();
    }
    if room.lent.is_some_and(|soft| (d as u64) < soft) {
        LOWEST.fetch_min(d as usize, SeqCst);
    }
    mark(d);
    Ok(d)
}

/// A close-on-exec duplicate of `fd` at a private number (see the module
/// notes): the one helper that places the shim's and the engine's
/// descriptors.
pub fn private_dup(fd: c_int) -> io::Result<c_int> {
    window(|room| dup_from(fd, room))
}

/// Whether `k` more private descriptors could be placed now (each tried
/// with a duplicate of `fd`, closed again): a socket is put on the engine
/// only with room for the descriptors it will need, rather than attached
/// and dropped again at its first poll.
pub fn has_room(fd: c_int, k: usize) -> bool {
    window(|room| {
        let mut made = Vec::with_capacity(k);
        while made.len() < k {
            match dup_from(fd, room) {
                Ok(d) => made.push(d),
                Err(_) => break,
            }
        }
        let ok = made.len() == k;
        for d in made {
            // Released as any private number (a fork now leaves it open
            // in the child, which must not take it for the program's).
            close_private(d);
        }
        ok
    })
}

/// Private numbers from which [`pregrow`] leaves the table alone: below
/// it the grown table has at most 2^15 entries (256 KiB), a cost a program
/// that never opens a UDP socket pays for being preloaded.
const PREGROW_LIMIT: u64 = 1 << 15;

/// At load time, while the process has one thread: grows the descriptor
/// table to cover the private room, by placing one duplicate there and
/// closing it. The kernel waits for an RCU grace period (10-20 ms here,
/// 59 ms once on a loaded CI machine) before freeing the old table only
/// when the table is shared by several threads, which is the case by the
/// first socket's adoption; grown now, that first adoption finds the
/// table large enough.
pub fn pregrow() {
    let Some(r) = nofile() else { return };
    if plan(r.rlim_cur, r.rlim_max).0 >= PREGROW_LIMIT {
        return;
    }
    if let Some(fd) = eventfd() {
        has_room(fd, 1);
        close(fd);
    }
}

/// The engine's placement: the descriptor `make` creates (inside the
/// window, so even a program at its limit leaves room for it) moves to a
/// private number, the original closed; one already there stays. Without
/// a private number left it fails (the budget).
fn make(make: &mut dyn FnMut() -> io::Result<OwnedFd>) -> io::Result<OwnedFd> {
    window(|room| {
        let fd = make()?;
        let raw = fd.as_raw_fd();
        if is_private(raw) {
            return Ok(fd);
        }
        match dup_from(raw, room) {
            Ok(d) => {
                // The kernel may have handed the old number to a socket the
                // shim saw created: it is the engine's, not the program's.
                table_remove(raw);
                drop(fd);
                // Just returned by F_DUPFD_CLOEXEC: ours alone.
                Ok(own_new(d))
            }
            Err(e) => {
                // Left where it is it would take one of the program's
                // numbers: the engine does without it (see the budget).
                dlog!("fd {raw}: cannot move to a private number ({e}); closed");
                table_remove(raw);
                Err(e)
            }
        }
    })
}

/// Runs `f` (which opens and closes descriptors of the shim's own, such as
/// a stats file) with room for them even when the program is at its limit.
pub fn with_room<R>(f: impl FnOnce() -> R) -> R {
    window(|_| f())
}

/// The engine's `dup3` onto one of its own numbers (the hooked `dup3`
/// refuses private numbers).
fn dup3(from: RawFd, onto: RawFd, flags: i32) -> i32 {
    crate::sys::fdspace::dup3(from, onto, flags)
}

static PLACEMENT: eudp_engine::fdspace::Placement =
    eudp_engine::fdspace::Placement { make, release, closed, dup3, kept: is_private };

extern "C" fn install() {
    eudp_engine::fdspace::set_placement(&PLACEMENT);
}

// Installed at load time, before the engine can make a descriptor.
#[used]
#[link_section = ".init_array"]
static INSTALL: extern "C" fn() = install;

/// The soft limit the program should see, given what the kernel said and
/// the window counter before and after asking it.
pub(crate) fn program_view(cur: u64, before: u64, after: u64) -> u64 {
    if before & 1 == 1 || before != after {
        PROGRAM_SOFT.load(SeqCst)
    } else {
        cur
    }
}

pub(crate) fn is_self(pid: libc::pid_t) -> bool {
    pid == 0 || pid == getpid()
}

/// The window counter (odd while [`private_dup`] has the soft limit
/// raised): the rlimit hooks read it before and after asking the kernel.
pub(crate) fn window_count() -> u64 {
    WINDOW.load(SeqCst)
}

// ------------------------------------------------------------ reclaim

/// Private numbers held below `limit`.
fn count_below(limit: u64) -> usize {
    let end = (limit as usize).min(TRACKED);
    let mut n = 0;
    for (w, word) in PRIVATE.iter().enumerate().take(end.div_ceil(64)) {
        let mut bits = word.load(SeqCst);
        if (w + 1) * 64 > end {
            bits &= (1u64 << (end % 64)) - 1;
        }
        n += bits.count_ones() as usize;
    }
    n
}

/// At or below the lowest number lent at the top of the program's space
/// since the last [`reclaim`] (`usize::MAX`: none): a program descriptor
/// above it means the program's numbers reached that region. (Numbers
/// placed above the soft limit that a raise of it lent are given back at
/// the program's EMFILE only: far from the top they cost it nothing
/// before.)
static LOWEST: AtomicUsize = AtomicUsize::new(usize::MAX);

/// The program needs the numbers below its soft limit (one of its calls
/// got a number above a private one, or failed with EMFILE): every socket
/// holding private descriptors there falls back and gives them back, and
/// nothing more is placed there. True when numbers were given back. Never
/// from the shim's own calls (inside a window, or inside the shim).
pub fn reclaim() -> bool {
    if HOLDER.load(SeqCst) == getpid() || table_inside() || COUNT.load(SeqCst) == 0 || engine_thread() {
        return false;
    }
    let soft = {
        let _l = lock_limits();
        let was = NO_BELOW.swap(true, SeqCst);
        LOWEST.store(usize::MAX, SeqCst);
        match nofile() {
            Some(r) => (r.rlim_cur.min(TRACKED as u64), was),
            None => return false,
        }
    };
    let (soft, was) = soft;
    let before = count_below(soft);
    table_give_back_below(soft as c_int);
    // The engine's GRO key holder (`EUDP_GRO_HOLD`) is a spare: its number
    // goes back too, wherever it is (the keys then follow the sockets).
    eudp_engine::Engine::release_gro_holds();
    let after = count_below(soft);
    if after >= before {
        // Nothing the sockets held (what is there is the engine's own, for
        // one placed before the program raised its limit): the region at
        // the top of its space stays usable.
        if !was {
            NO_BELOW.store(false, SeqCst);
        }
        return false;
    }
    dlog!("descriptor budget: the program needs the numbers below its soft RLIMIT_NOFILE {soft}: {} private ones given back, {after} kept (the engine's own), none placed there any more", before - after);
    true
}

/// Whether this is one of the engine's threads (named `eudp-…`): its
/// calls (the TCP transport's `accept`) are not the program's, and a
/// fallback there would wait for the thread itself.
fn engine_thread() -> bool {
    thread_name().is_some_and(|name| name.starts_with(b"eudp-"))
}

/// One of the program's calls that makes descriptors (`-1` with errno on
/// failure, else the new descriptor or 0): when it got a number above one
/// lent to the shim, or failed with EMFILE, the lent numbers are given
/// back ([`reclaim`]); after an EMFILE the call is made once more.
pub fn program_fds(mut call: impl FnMut() -> c_int) -> c_int {
    let r = call();
    if r >= 0 {
        if r as usize > LOWEST.load(Relaxed) {
            reclaim();
        }
        return r;
    }
    if errno() == libc::EMFILE && reclaim() {
        return call();
    }
    r
}

// -------------------------------------------------------- closing ranges

/// `close_range` over `[first, last]` that spares private descriptors: the
/// stretches between them go to `f` (the kernel's close_range); returns
/// the first failure, else 0. CLOSE_RANGE_CLOEXEC ranges go through whole
/// (private descriptors are close-on-exec already).
pub fn close_range_sparing(
    first: c_uint,
    last: c_uint,
    flags: c_int,
    mut f: impl FnMut(c_uint, c_uint, c_int) -> c_int,
) -> c_int {
    if flags & libc::CLOSE_RANGE_CLOEXEC as c_int != 0
        || COUNT.load(SeqCst) == 0
        || first > last
        || first as usize >= TRACKED
    {
        return f(first, last, flags);
    }
    let end = (last as usize).min(TRACKED - 1);
    let mut from = first as usize; // the next number still to close
    let mut rc = 0;
    let mut err = 0;
    let mut run = |a: usize, b: usize, rc: &mut c_int, err: &mut c_int| {
        if f(a as c_uint, b as c_uint, flags) < 0 && *rc == 0 {
            *rc = -1;
            *err = errno();
        }
    };
    let lo = first as usize / 64;
    for (w, word) in PRIVATE.iter().enumerate().take(end / 64 + 1).skip(lo) {
        let mut bits = word.load(SeqCst);
        while bits != 0 {
            let p = w * 64 + bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if p < first as usize || p > end {
                continue;
            }
            if p > from {
                run(from, p - 1, &mut rc, &mut err);
            }
            from = p + 1;
        }
    }
    if from <= last as usize {
        run(from, last as usize, &mut rc, &mut err);
    }
    if rc < 0 {
        set_errno(err);
    }
    rc
}

/// `closefrom(first)` sparing private descriptors.
pub fn closefrom_sparing(first: c_int) {
    close_range_sparing(first.max(0) as c_uint, c_uint::MAX, 0, |a, b, fl| {
        // Numbers the program asked to close.
        let r = close_range(a, b, fl);
        if r < 0 && errno() == libc::ENOSYS {
            // Kernels without close_range: libc's own closefrom for the
            // open-ended stretch, single closes for the others.
            if b == c_uint::MAX {
                closefrom(a as c_int);
            } else {
                for n in a..=b {
                    close(n as c_int);
                }
            }
            return 0;
        }
        r
    });
}
