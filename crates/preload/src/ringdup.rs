//! Duplicates of a ring's eventfd for epoll registrations made through
//! several descriptors of one socket. The table knows a socket only as a
//! weak reference and an address, so it sits below the socket table that
//! drops its entries.

use crate::sys::{real_close, real_dup_cloexec};
use libc::c_int;
use std::any::Any;
use std::sync::Arc;
use std::sync::Weak;

/// A duplicate of a ring's eventfd `rfd` standing for it in the epoll
/// registrations made through descriptor `fd` of socket `s`.
struct RingDup {
    sock: Weak<dyn Any + Send + Sync>,
    ring: c_int,
    dup: c_int,
}

/// epoll keys a registration by descriptor number and file, so two
/// descriptors of one socket (dup) registered in one epoll need two
/// descriptors of its ring's eventfd (and of its error flag, and under the
/// TCP transport of the backend's descriptor): the first uses the
/// descriptor itself, the next a duplicate, made then and kept while the
/// socket and its ring last.
/// Key: (socket address, application descriptor, descriptor duplicated).
type DupKey = (usize, c_int, c_int);
static RING_DUPS: std::sync::Mutex<Option<std::collections::HashMap<DupKey, RingDup>>> = std::sync::Mutex::new(None);

/// The duplicate of `rfd` for `(s, fd)`: made when `create`, else only
/// one already made. A stale one (another socket at that address, or
/// another ring) is closed.
pub(crate) fn ring_dup<S: Send + Sync + 'static>(s: &Arc<S>, fd: c_int, rfd: c_int, create: bool) -> Option<c_int> {
    let mut g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    if g.is_none() && !create {
        return None;
    }
    let map = g.get_or_insert_with(Default::default);
    let key = (Arc::as_ptr(s) as usize, fd, rfd);
    if let Some(d) = map.get(&key) {
        if d.ring == rfd && std::ptr::addr_eq(d.sock.as_ptr(), Arc::as_ptr(s)) && d.sock.strong_count() > 0 {
            return Some(d.dup);
        }
        let old = map.remove(&key).expect("just found");
        real_close(old.dup);
    }
    if !create {
        return None;
    }
    let dup = real_dup_cloexec(rfd).ok()?;
    RING_DUPS_MADE.store(true, std::sync::atomic::Ordering::Relaxed);
    let sock: Weak<dyn Any + Send + Sync> = Arc::downgrade(s) as Weak<S>;
    map.insert(key, RingDup { sock, ring: rfd, dup });
    Some(dup)
}

/// Set once a duplicate was ever made: sockets of programs that never
/// register two descriptors of one socket skip the table at drop.
static RING_DUPS_MADE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether duplicates were made for the socket at `addr`.
pub(crate) fn has_ring_dups(addr: usize) -> bool {
    if !RING_DUPS_MADE.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    let g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    g.as_ref().is_some_and(|m| m.keys().any(|&(a, _, _)| a == addr))
}

/// The socket at `addr` is gone: the duplicates made for it close too, so
/// the epoll registrations made through them end with the socket, as the
/// kernel's end when the socket's last descriptor closes (a duplicate left
/// open could keep reporting a readable ring for a closed socket).
pub(crate) fn forget_ring_dups(addr: usize) {
    if !RING_DUPS_MADE.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let mut g = RING_DUPS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(map) = g.as_mut() {
        map.retain(|&(a, _, _), d| {
            if a == addr {
                real_close(d.dup);
            }
            a != addr
        });
    }
}
