//! Fork: the child gives up the transport's descriptors.
//!
//! A fork child inherits the listener and every connection of the parent's
//! transports, but not their manager threads. Holding them, it would keep
//! the listening port taken after the parent ends (and let peers connect to
//! a listener nobody accepts on), keep the peer of a connection the parent
//! closes from ever seeing its FIN, and could write into the parent's
//! connections. So the transport records its own descriptors (listener,
//! connections, epoll set, doorbell) in a lock-free bitmap, and a
//! `pthread_atfork` child handler points each recorded number at
//! `/dev/null` (`sys::fork_replace`) without taking any lock: the sockets
//! are released (FIN, port free), and the numbers stay taken until the
//! transport objects that name them go, so nothing later opened under the
//! same number is ever closed or written by them. The child's inherited
//! transports are abandoned ([`generation`]); its first socket starts a
//! fresh one (`TcpTransport::global`).
//!
//! A descriptor is recorded after it is made and forgotten before it is
//! closed: a fork in between leaves that one descriptor open in the child
//! (as before), never a number the child uses for something else.
//! Every descriptor of the transport is also close-on-exec.
//!
//! The pre-decided port stays with the process that started its transport
//! first: a child forked while its parent's listener is bound but not yet
//! listening (or before the parent's start) leaves the port to the parent
//! while it runs ([`Ancestor`], [`parent_runs`]), and gives it back to a
//! parent whose transport started later still ([`parent_waits_for_port`]);
//! docs/tcp.md, "Fork".

use super::sys;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// Numbers below this are recorded (the kernel's default `nr_open`).
const TRACKED: usize = 1 << 20;

static FDS: [AtomicU64; TRACKED / 64] = [const { AtomicU64::new(0) }; TRACKED / 64];
/// One past the highest word ever used (the child scans up to it).
static WORDS: AtomicUsize = AtomicUsize::new(0);
/// Forks this process's line has gone through since a transport started.
static GEN: AtomicU32 = AtomicU32::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Held (true) while a thread starts the process-wide transport
/// (`TcpTransport::global`); a fork child lets go of it in [`forked_child`].
pub(super) static STARTING: AtomicBool = AtomicBool::new(false);

/// The fork generation: a transport started in an earlier one belongs to an
/// ancestor process and is abandoned here.
#[inline]
pub(super) fn generation() -> u32 {
    GEN.load(Relaxed)
}

/// Registers the child handler (once per process line; inherited).
pub(super) fn install() {
    if !INSTALLED.load(Relaxed) && !INSTALLED.swap(true, SeqCst) {
        sys::at_fork_child(child);
    }
}

fn track(fd: RawFd) {
    let Ok(i) = usize::try_from(fd) else { return };
    if i < TRACKED {
        WORDS.fetch_max(i / 64 + 1, SeqCst);
        FDS[i / 64].fetch_or(1 << (i % 64), SeqCst);
    }
}

fn untrack(fd: RawFd) {
    let Ok(i) = usize::try_from(fd) else { return };
    if i < TRACKED {
        FDS[i / 64].fetch_and(!(1 << (i % 64)), SeqCst);
    }
}

/// A descriptor of the transport's, given up in fork children (see the
/// module notes): recorded while this value lives.
#[derive(Debug)]
pub(super) struct Tracked<T: AsRawFd>(T);

impl<T: AsRawFd> Tracked<T> {
    pub(super) fn new(t: T) -> Self {
        track(t.as_raw_fd());
        Tracked(t)
    }
}

impl<T: AsRawFd> std::ops::Deref for Tracked<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: AsRawFd> AsRawFd for Tracked<T> {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl<T: AsRawFd> Drop for Tracked<T> {
    // Runs before the field's own drop closes the descriptor.
    fn drop(&mut self) {
        untrack(self.0.as_raw_fd());
    }
}

/// Records a descriptor held by something other than a [`Tracked`] (a
/// connection); [`forget`] it before it closes.
pub(super) fn record(fd: RawFd) {
    track(fd);
}

pub(super) fn forget(fd: RawFd) {
    untrack(fd);
}

/// The process whose process-wide transport start is under way or done
/// with a listener, and its port: `pid << 16 | port` (port 0: not known
/// yet); 0: none. Inherited by fork children, which leave the port to
/// that process while it lives (see [`Ancestor::listens`]).
static LISTENER: AtomicU64 = AtomicU64::new(0);
/// That process's start time (`/proc/<pid>/stat`, field 22), so a reused
/// pid is not taken for it; 0: not known.
static LISTENER_START: AtomicU64 = AtomicU64::new(0);

use crate::stat_dir::proc_start;

/// This process begins to start its process-wide transport: from here on
/// a fork child leaves the pre-decided port to it (see [`Ancestor`]),
/// since its listener may be bound and not yet listening at the fork
/// (it listens from its first bound endpoint on). Returns the claim this
/// process inherited, if any.
pub(super) fn begin_start() -> Ancestor {
    let pid = std::process::id();
    // Start time unknown (0) first: a fork in between then trusts the pid.
    let start = LISTENER_START.swap(0, SeqCst);
    let before = Ancestor(LISTENER.swap(u64::from(pid) << 16, SeqCst), start);
    LISTENER_START.store(proc_start(pid).map_or(0, |(t, _)| t), SeqCst);
    before
}

/// The port is known (`listen`: this process's transport listens on it);
/// otherwise the claim is withdrawn.
pub(super) fn claim_listener(port: u16, listen: bool) {
    let v = if listen { u64::from(std::process::id()) << 16 | u64::from(port) } else { 0 };
    LISTENER.store(v, SeqCst);
}

/// A claim inherited from an ancestor process ([`begin_start`]).
#[derive(Debug)]
pub(super) struct Ancestor(u64, u64);

impl Ancestor {
    /// The ancestor's process-wide transport had started (or was
    /// starting) with a listener on `port` when this process was forked,
    /// and that process still runs. Its listener may not listen yet, so
    /// this process's bind could succeed (both use `SO_REUSEADDR`) and,
    /// listening first, take the port: connections the ancestor opens to
    /// itself would then reach this process (lost when it ends), and the
    /// ancestor would have no listener for good. So this process runs
    /// without one, as when the ancestor already listens.
    pub(super) fn listens(&self, port: u16) -> bool {
        let (pid, p) = ((self.0 >> 16) as u32, self.0 as u16);
        if self.0 == 0 || pid == std::process::id() || (p != 0 && p != port) {
            return false;
        }
        matches!(proc_start(pid), Some((t, false)) if self.1 == 0 || t == self.1)
    }

    /// Puts the inherited claim back (this process leaves the port to
    /// that ancestor, and so do its own children).
    pub(super) fn restore(&self) {
        LISTENER_START.store(0, SeqCst);
        LISTENER.store(self.0, SeqCst);
        LISTENER_START.store(self.1, SeqCst);
    }
}

/// The claim this process holds now (its own, an ancestor's it defers to,
/// or none) names another process that still runs, with a listener on
/// `port` or on its way to one: this process leaves the port to it.
pub(super) fn claimed_elsewhere(port: u16) -> bool {
    let start = LISTENER_START.load(SeqCst);
    Ancestor(LISTENER.load(SeqCst), start).listens(port)
}

/// Records `pid` (start time `start`, 0: unknown) as the process that
/// holds `port`, for this process and the children it forks from now on.
fn claim_for(pid: u32, start: u64, port: u16) {
    LISTENER_START.store(0, SeqCst);
    LISTENER.store(u64::from(pid) << 16 | u64::from(port), SeqCst);
    LISTENER_START.store(start, SeqCst);
}

/// This process took `port` later (its holder had ended): children forked
/// from now on leave it to this process.
pub(super) fn claim_own(port: u16) {
    let pid = std::process::id();
    claim_for(pid, proc_start(pid).map_or(0, |(t, _)| t), port);
}

/// This process gives `port` back to its parent (which wants it, see
/// [`parent_waits_for_port`]) and leaves it to the parent while it runs.
pub(super) fn defer_to_parent(port: u16) {
    let ppid = std::os::unix::process::parent_id();
    claim_for(ppid, proc_start(ppid).map_or(0, |(t, _)| t), port);
}

/// The name of a transport's manager thread.
pub(super) const THREAD_NAME: &str = "eudp-uoe";
/// Its name while the transport wants the pre-decided port and nothing of
/// its own keeps it from taking it (it retries): a fork child that took
/// the port while this process had not started its transport yet sees
/// this in `/proc/<ppid>/task/*/comm` and gives the port back.
pub(super) const WAIT_NAME: &str = "eudp-uoe-wait";

/// The parent of this fork child runs a transport that waits for the port
/// (its manager thread is named [`WAIT_NAME`]). Reads the parent's thread
/// names: one directory and a small file per thread.
pub(super) fn parent_waits_for_port() -> bool {
    let ppid = FORK_PARENT.load(SeqCst);
    if ppid == 0 || ppid != std::os::unix::process::parent_id() {
        return false;
    }
    let Ok(dir) = std::fs::read_dir(format!("/proc/{ppid}/task")) else { return false };
    dir.flatten().any(|t| std::fs::read_to_string(t.path().join("comm")).is_ok_and(|n| n.trim_end() == WAIT_NAME))
}

/// The process this one was forked from, recorded in the child (0: not
/// a fork child; an exec clears it).
static FORK_PARENT: AtomicU32 = AtomicU32::new(0);

/// This process is a fork child whose parent has not exited (a child is
/// reparented when its parent exits).
pub(super) fn parent_runs() -> bool {
    let p = FORK_PARENT.load(SeqCst);
    p != 0 && p == std::os::unix::process::parent_id()
}

extern "C" fn child() {
    forked_child();
}

/// In a fork child, before anything else uses the transport: gives up the
/// inherited descriptors and abandons the inherited transports. Atomics
/// and async-signal-safe calls only, no lock, no allocation. Run by the
/// child handler [`install`] registers, and by the preload shim's own
/// child handler, registered at load time: a handler registered by one
/// thread while another forks may miss that fork (the preload tests'
/// `race` case). Running twice in one child is harmless.
pub fn forked_child() {
    GEN.fetch_add(1, SeqCst);
    // getppid: async-signal-safe.
    FORK_PARENT.store(std::os::unix::process::parent_id(), SeqCst);
    // A start under way in the parent has no thread here to finish it.
    STARTING.store(false, SeqCst);
    let words = WORDS.load(SeqCst).min(FDS.len());
    let mut placeholder = -1;
    for (w, slot) in FDS.iter().enumerate().take(words) {
        let mut bits = slot.swap(0, SeqCst);
        while bits != 0 {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            if placeholder < 0 {
                placeholder = sys::fork_placeholder();
            }
            sys::fork_replace((w * 64 + b) as RawFd, placeholder);
        }
    }
    if placeholder >= 0 {
        sys::fork_close(placeholder);
    }
}
