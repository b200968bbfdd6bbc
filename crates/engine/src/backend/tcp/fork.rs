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
    super::manager::forked();
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
