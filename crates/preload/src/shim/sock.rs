//! One application UDP socket's shared state ([`Sock`]), its modes and
//! the small accessors every layer reads.

use eudp_engine::sys::fdevents::EventFd;
use eudp_engine::{Endpoint, KeptDatagram, RingLen};
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU8, AtomicUsize, Ordering::*};
use std::sync::{Arc, Mutex, MutexGuard};

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
    pub(super) nonblock: AtomicBool,
    pub(super) mode: AtomicU8,
    /// The endpoint belongs to the parent of a fork: never touched again.
    pub(super) leaked: AtomicBool,
    /// Table entries (fds) naming this socket.
    pub(super) refs: AtomicUsize,
    pub(super) ep: Mutex<Option<Arc<Endpoint>>>,
    /// The endpoint `ep` owns, for lock-free borrowing (`crate::borrow`);
    /// null whenever `ep` does not own one.
    pub fast: AtomicPtr<Endpoint>,
    pub(super) dup_fd: AtomicI32,
    pub(super) poll_fd: AtomicI32,
    /// The endpoint's ring count, readable without the endpoint: a poll
    /// that finds datagrams waiting takes no lock and no reference.
    pub(super) ring_len: std::sync::OnceLock<Arc<RingLen>>,
    /// Datagrams left in the ring when the socket fell back to the kernel.
    pub(super) leftover: Mutex<VecDeque<KeptDatagram>>,
    pub(super) has_leftover: AtomicBool,
    /// Held by a fallback while it hands the socket over; `handing_over`
    /// is set meanwhile (before the socket is marked `KERNEL`), so a
    /// receive on the kernel path waits for the hand-over instead of
    /// reading the kernel socket under it (ahead of what it keeps, or a
    /// GRO message before it is split).
    pub(super) handover: Mutex<()>,
    pub(super) handing_over: AtomicBool,
    /// The process (its id) in which a thread was left asleep inside its
    /// read of the kernel socket when the socket was handed over, or 0.
    /// What that read takes reaches the leftovers only when it ends (see
    /// [`Sock::after_hand_over`]); until then receives on the kernel path
    /// take the leftovers but leave the kernel socket to that read, so a
    /// GRO message it takes cannot be served after newer datagrams
    /// ([`Sock::await_reader`]). A fork child has no such thread.
    pub(super) reader_out: AtomicI32,
    /// The endpoint that read belongs to, while `reader_out` is set: its
    /// end finishes the hand-over ([`Sock::after_hand_over`]).
    pub(super) reader_ep: Mutex<Option<Arc<Endpoint>>>,
    /// The endpoint's error flag ([`Endpoint::error_fd`]) once made for an
    /// epoll registration, or -1.
    pub(super) err_fd: AtomicI32,
    /// `IP_RECVTOS`/`IP_RECVTTL` (IPv6: `IPV6_RECVTCLASS`/`IPV6_RECVHOPLIMIT`)
    /// as the program set them, and whether the kernel socket has both on
    /// for the engine instead (see
    /// [`Sock::force_rx_opts`]).
    pub(super) rx_opts: AtomicU8,
    /// The ring's readiness eventfd, kept from the endpoint while
    /// `leftover` holds datagrams and readable until it is empty: an epoll
    /// set the application registered the socket in while it was on the
    /// engine holds it too, and so reports the leftovers.
    pub(super) leftover_ready: Mutex<Option<Arc<EventFd>>>,
    pub(super) reason: Mutex<Option<String>>,
    /// After a hand-over: the kernel socket's drop count then (see `lost`).
    pub(super) kernel_path: Mutex<Option<KernelPath>>,
    /// First fd number (for stats).
    pub fd: i32,
}

/// The kernel socket of a socket as its hand-over to the kernel path left
/// it (what it loses from then on is counted in `lost`).
#[derive(Debug, Clone, Copy)]
pub(super) struct KernelPath {
    /// Which socket (a descriptor number may name another file later).
    pub(super) ino: u64,
    /// Its drop count at the hand-over.
    pub(super) base: u64,
    /// Its drop count when last read.
    pub(super) seen: u64,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
pub(super) fn rx_opt_names(v6: bool) -> (i32, i32, i32) {
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
pub(super) const RX_FORCED: u8 = 1;
pub(super) const RX_WANT_TOS: u8 = 2;
pub(super) const RX_WANT_TTL: u8 = 4;

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
}
