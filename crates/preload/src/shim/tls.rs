//! The shim's per-thread state ([`Tls`]), looked up once per hook.

use super::sock::Sock;
use std::cell::{Cell, RefCell};
use std::sync::Arc;
use std::time::Instant;

/// Everything the shim keeps per thread, in one thread-local: in a
/// preloaded library every thread-local access is a `__tls_get_addr` call
/// and a state check, so a hook looks this up once and hands it down.
/// Only shared references exist (a signal handler calling in gets another
/// one to the same object): state is in `Cell`s, and `RefCell`s that a
/// nested call finds busy make it use its own storage.
pub struct Tls {
    /// Set while the shim itself calls into the engine (creating an
    /// endpoint): the engine's own libc calls then bypass the shim.
    pub(super) inside: Cell<bool>,
    /// This thread's recent lookups (see [`with_sock`]).
    pub(super) cache: RefCell<LookupCache>,
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
    pub(super) const fn new(slot: usize) -> Tls {
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

pub(super) struct Inside;
impl Inside {
    pub(super) fn enter() -> Inside {
        let _ = TLS.try_with(|t| t.inside.set(true));
        Inside
    }
}
impl Drop for Inside {
    fn drop(&mut self) {
        let _ = TLS.try_with(|t| t.inside.set(false));
    }
}

/// Whether this thread is inside the shim's own work (the calls it makes
/// then are not the program's).
pub fn inside() -> bool {
    TLS.try_with(|t| t.inside.get()).unwrap_or(false)
}

/// Entries in each thread's lookup cache.
pub(super) const CACHE_WAYS: usize = 4;

/// A thread's cached lookups: (fd, `TABLE_GEN` when looked up, socket),
/// and the way to replace next.
type LookupCache = ([Option<(i32, u64, Arc<Sock>)>; CACHE_WAYS], usize);
