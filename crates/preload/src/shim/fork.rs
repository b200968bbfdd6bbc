//! The socket table across fork and vfork.

use super::generation::{fork_keep, tcp_transport, ENGINE_INIT, FORK_REASON, GEN, VFORK_REASON};
use super::sock::{lock, Sock, ACTIVE, KERNEL};
use super::table::{all, TABLE, UDP_SEEN};
use super::tls::with_tls;
use crate::sys::fork_lock::ForkHeld;
use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering::*;
use std::sync::{Arc, MutexGuard, RwLockWriteGuard};

/// Holds the table's write lock from the fork prepare handler to the
/// parent/child handler, so the child never inherits a lock held by a
/// thread that does not exist there.
type Held = (MutexGuard<'static, ()>, RwLockWriteGuard<'static, BTreeMap<i32, Arc<Sock>>>, crate::stat::Guards);
static FORK_GUARD: ForkHeld<Held> = ForkHeld::new();

thread_local! {
    /// Set while this thread's `vfork` runs as `fork` (see [`vforking`]).
    static VFORKING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread's coming `fork` as standing for a `vfork`
/// (`crate::hooks` `vfork`), whose child can only exec or exit.
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
/// For a `vfork` (run as `fork`, see `crate::hooks` `vfork`) the child can
/// only exec or exit: a socket every fd of which has `FD_CLOEXEC` (Python's
/// sockets, `SOCK_CLOEXEC` ones) vanishes at the exec and stays on the
/// engine in the parent; one the executed program inherits is handled as
/// for `fork`.
///
/// The kernel socket of a socket the parent keeps on the engine is shared
/// with the child, so the child leaves its options alone (see
/// [`fork_child`]).
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
            let inherited = table.iter().filter(|(_, o)| Arc::ptr_eq(o, s)).any(|(f, _)| !crate::sys::cloexec(*f));
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
        let _ = eudp_engine::sys::clock::tsc();
        let _ = tcp_transport();
    }
    // Every lock the child may need, in one order (engine, table, stats).
    let e = lock(&ENGINE_INIT);
    let g = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let st = crate::stat::lock_all();
    FORK_GUARD.hold((e, g, st));
}

pub fn fork_parent() {
    drop(FORK_GUARD.take());
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
    let g = FORK_GUARD.take();
    if let Some((_, t, _)) = &g {
        for s in t.values() {
            if s.mode() == ACTIVE && !s.leaked.swap(true, SeqCst) {
                s.mode.store(KERNEL, Release);
                s.fast.store(std::ptr::null_mut(), SeqCst);
                for f in [s.dup_fd.swap(-1, SeqCst), s.poll_fd.swap(-1, SeqCst), s.err_fd.swap(-1, SeqCst)] {
                    if f >= 0 {
                        crate::sys::real_close(f);
                    }
                }
            }
        }
    }
    drop(g);
    crate::fdspace::forked();
    crate::borrow::forked(with_tls(|t| t.slot.get()));
    crate::stat::forked();
}
