//! Endpoints: the application's UDP sockets, served by the engine.
//!
//! Send: [`Endpoint::send_to`] posts directly on the caller's thread when the
//! two-level queue is idle, otherwise copies the datagram into L1 for the
//! engine to batch (see [`crate::queue`]). Receive: datagrams arrive in a
//! byte-bounded ring ([`crate::ring`]) filled by the engine with GRO; a
//! receive served from the ring costs no syscall, and when the ring is empty
//! the caller reads the socket itself before sleeping.

use crate::backend::kernel::{self, InMeta, OutMsg};
use crate::backend::{Backend, PktInfo};
use crate::batch::{group_calls, gso_batch, GsoLimits};
use crate::engine::{Engine, Shared};
use crate::machine::{QueueEvent, QueueState};
use crate::queue::{L1Queue, PostDecision, Recorder, SendState};
use crate::ring::RecvRing;
use crate::stats::{Stats, StatsSnapshot};
use crate::sys::error_flag::ErrorFlag;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{
    AtomicBool, AtomicI32, Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst,
};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Receive buffer per message: the largest UDP datagram or GRO super-packet.
pub(crate) const RX_BUF: usize = 1 << 16;
/// The most datagrams one received message carries: the kernel coalesces
/// up to 64 (`UDP_GRO_CNT_MAX`), and a local sender's GSO message, handed
/// over whole, up to 128 (`UDP_MAX_SEGMENTS`).
const GRO_MAX_SEGMENTS: usize = 128;
/// Messages received into a buffer smaller than this are copied into a
/// right-sized buffer so a small datagram does not pin 64 KiB.
const COPY_BELOW: usize = 8 << 10;
/// Receive rounds per readiness event before the engine moves on (fairness).
const RX_ROUNDS: usize = 4;
/// A spinning receive (`EUDP_SPIN_US`) yields its CPU after this many looks
/// that found nothing.
const SPIN_YIELD_EVERY: u32 = 4;

/// Receives between two sleeping polls of a socket up to which its input
/// counts as sparse for [`Endpoint::app_poll_begin`]: a server reading a
/// request, then `EAGAIN`, with room for a second request. A stream's
/// receiver drains a run of datagrams between polls.
const SPARSE_RECEIVES: u64 = 4;

/// `now + d`, or `None` when that is beyond what `Instant` can hold (a
/// timeout that large means "forever").
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// A deadline that never comes in practice (about 30 years away).
fn far_future() -> Instant {
    deadline_after(Duration::from_secs(1 << 30)).unwrap_or_else(Instant::now)
}

/// The lock if nobody holds it (a poisoned one too, as [`lock`] takes it);
/// `None` when it is held — by another thread, or by this one further up.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Buffers for one batched receive, owned by the receiving thread.
#[derive(Debug)]
pub(crate) struct RecvScratch {
    bufs: Vec<Vec<u8>>,
    meta: Vec<InMeta>,
}

impl RecvScratch {
    pub(crate) fn new(n: usize) -> Self {
        let n = n.clamp(1, 64);
        RecvScratch { bufs: (0..n).map(|_| vec![0u8; RX_BUF]).collect(), meta: vec![InMeta::default(); n] }
    }
}

thread_local! {
    static CALLER_SCRATCH: std::cell::RefCell<Option<RecvScratch>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this application thread's receive scratch buffers.
fn with_caller_scratch<R>(f: impl FnOnce(&mut RecvScratch) -> R) -> R {
    CALLER_SCRATCH.with(|c| f(c.borrow_mut().get_or_insert_with(|| RecvScratch::new(4))))
}

/// Receive-side state under one lock: the ring and the readiness flag.
#[derive(Debug)]
struct RecvSide {
    ring: RecvRing,
    /// Readable exactly when the ring holds a datagram; created on demand.
    ready: Option<Arc<EventFd>>,
    /// Whether `ready` is readable now: it is written only on a change, so
    /// a receive that fills and empties the ring itself costs no syscall.
    ready_set: bool,
    /// Raised while an asynchronous error is pending, once made
    /// ([`Endpoint::error_fd`]); from then on `ready` stands for datagrams
    /// only, so an epoll set holding both reports the error as `EPOLLERR`
    /// and not as input.
    err: Option<Arc<ErrorFlag>>,
}

impl RecvSide {
    /// Makes `ready` readable (one syscall, only on a change).
    fn signal(&mut self) {
        if let Some(fd) = &self.ready {
            if !self.ready_set {
                fd.set();
                self.ready_set = true;
            }
        }
    }

    /// An asynchronous error became pending: the error flag goes up when
    /// there is one, else `ready` stands for the error.
    fn error_ready(&mut self) {
        match &self.err {
            Some(f) => f.raise(),
            None => self.signal(),
        }
    }

    /// Makes `ready` unreadable (one syscall, only on a change).
    fn unsignal(&mut self) {
        if let Some(fd) = &self.ready {
            if self.ready_set {
                fd.clear();
                self.ready_set = false;
            }
        }
    }
}

/// What the engine and the application share about one endpoint.
#[derive(Debug)]
pub(crate) struct EpInner {
    pub(crate) id: u64,
    pub(crate) backend: Box<dyn Backend>,
    engine: Arc<Shared>,
    send: Mutex<SendState>,
    /// The arena an application thread stages L1 into when it sends a full
    /// batch itself (see [`EpInner::caller_flush`]).
    caller_staging: Mutex<L1Queue>,
    /// A caller's flush that met a full kernel send buffer left the rest
    /// of `caller_staging` to the engine, from this index + 1 (0: none):
    /// an application thread never waits for the kernel's room unless its
    /// own send blocks.
    caller_left: std::sync::atomic::AtomicUsize,
    /// The backend's [`crate::backend::Capabilities::writable_fd`]: where there is one, the
    /// engine leaves a batch the kernel's send buffer refused in
    /// `caller_staging` too and watches this descriptor for room rather
    /// than waiting (see [`EpInner::await_room`]).
    room_fd: Option<RawFd>,
    /// `room_fd` is in the engine's room set (written by the engine).
    pub(crate) room_watched: AtomicBool,
    /// The backend's [`crate::backend::Capabilities::drain_on_caller`], read once, and not
    /// turned off by `Config::tx_caller_drain`.
    caller_drains: bool,
    /// The backend's [`crate::backend::Capabilities::drain_on_caller`]: queued sends may wait to
    /// coalesce into whole batches. Without `caller_drains` the engine
    /// thread sends them, woken once L1 holds a batch (see
    /// [`EpInner::service_send`]).
    coalesces: bool,
    /// Signalled when L1 gains room or drains.
    send_cv: Condvar,
    /// Threads waiting on `send_cv` (changed under `send`): a notify with
    /// none is skipped, as std's `Condvar` makes a futex call per notify
    /// even without a waiter, and the engine notifies after every take.
    send_waiters: std::sync::atomic::AtomicU32,
    recv: Mutex<RecvSide>,
    /// Serialises reads from the socket together with their push into the
    /// ring, so datagrams enter the ring in socket order whoever reads them,
    /// while pops (which take only `recv`) never wait for a syscall.
    rx_sock: Mutex<()>,
    /// Datagrams in the ring (see [`RingLen`]).
    ring_len: Arc<RingLen>,
    /// Datagrams the last read of the socket added: a large one means a
    /// stream is arriving and the socket likely holds more already.
    last_fill: std::sync::atomic::AtomicUsize,
    /// Datagrams the last read that brought any added: one for a socket
    /// receiving now and then, more while a stream arrives (GRO batches,
    /// a backlog). See [`Endpoint::app_poll_begin`].
    last_batch: std::sync::atomic::AtomicUsize,
    /// The largest message the next read may bring, judged from the last
    /// one (see [`EpInner::read_budget`]).
    rx_msg_len: std::sync::atomic::AtomicUsize,
    /// Application threads blocked on this socket; while there are any, the
    /// engine leaves arrivals to them (one wake-up instead of two).
    rx_waiters: std::sync::atomic::AtomicU32,
    /// An application thread sleeps inside a read of the socket, holding
    /// `rx_sock`: others wait on the ring's readiness instead of the lock.
    rx_blocked: AtomicBool,
    /// Blocking inside the read is possible (the backend supports it and
    /// the file description is blocking); cleared for good on the first
    /// sign it is not.
    rx_blocking_ok: AtomicBool,
    /// The backend's socket holds the endpoint's receive timeout as its own
    /// `SO_RCVTIMEO` ([`Endpoint::set_read_timeout_in_socket`]), so a timed
    /// blocking receive may sleep inside the read too: the read ends by
    /// itself when the timeout does.
    rx_timeout_in_socket: AtomicBool,
    /// The engine's one-shot watch on the socket is armed.
    rx_armed: AtomicBool,
    /// The socket is out of the engine's epoll set while its watch is
    /// parked (see [`EpInner::detach_rx`]); changed under `rx_watch`.
    rx_detached: AtomicBool,
    /// Serialises changes to the socket's membership in the engine's epoll
    /// set: a detach on the engine thread, a re-arm by an application's
    /// poll, and the hand-backs that remove it for good.
    rx_watch: Mutex<()>,
    /// Traced: parked because a wake-up brought only TX timestamps (see
    /// [`EpInner::engine_receive`]).
    rx_stamp_parked: AtomicBool,
    /// The application took the socket back ([`Endpoint::stop_receiving`]):
    /// the engine never reads it again.
    rx_stopped: AtomicBool,
    /// The application waits on the socket itself
    /// ([`Endpoint::app_waits_on_socket`]): the engine no longer watches it
    /// for input; application threads read it.
    rx_app_waits: AtomicBool,
    /// Application threads asleep in a poll or select that watches the
    /// socket ([`Endpoint::app_poll_begin`]); each counts in `rx_waiters`
    /// too.
    rx_pollers: std::sync::atomic::AtomicU32,
    /// The engine let go of the socket while only polls waited on it (see
    /// [`EpInner::rx_idle_since_last_look`]): its watch stays off until a
    /// poll finds the socket streaming.
    rx_released: AtomicBool,
    /// `rx_calls` at the last [`Endpoint::app_poll_begin`].
    rx_calls_polled: std::sync::atomic::AtomicU64,
    /// `stats.send_calls` when the engine last looked at a detached socket.
    tx_seen: std::sync::atomic::AtomicU64,
    /// A direct post was made (set by the first).
    posted_once: AtomicBool,
    /// When the socket's first direct post was made, if its slot was left
    /// unreaped without scheduling the engine (see [`EpInner::send`]);
    /// `lone_pending` says there is one, read without the lock.
    lone_post: Mutex<Option<Instant>>,
    lone_pending: AtomicBool,
    /// The application dropped the endpoint; the engine lets go of it.
    pub(crate) closed: AtomicBool,
    /// Receive calls made by application threads (written by them only).
    rx_calls: std::sync::atomic::AtomicU64,
    /// `rx_calls` when the engine last looked (written by the engine only).
    rx_seen: std::sync::atomic::AtomicU64,
    gso: AtomicBool,
    gso_limits: GsoLimits,
    /// Largest segment size the path accepted (lowered on EMSGSIZE).
    gso_seg_cap: std::sync::atomic::AtomicUsize,
    /// An asynchronous error to report on the next call (like `sk_err`).
    pending_error: AtomicI32,
    connected: AtomicBool,
    nonblocking: AtomicBool,
    timeouts: Mutex<(Option<Duration>, Option<Duration>)>,
    recorder: Option<Recorder>,
    stats: Stats,
    pub(crate) trace: crate::tracepoint::EpTrace,
}

/// What a receive returns once [`Endpoint::stop_receiving`] handed the
/// socket back to its owner and the ring holds nothing for it: the caller
/// receives on the owner's path instead (see [`is_handed_over`]).
#[derive(Debug)]
struct HandedOver;

impl std::fmt::Display for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the socket was handed back to its owner")
    }
}

impl std::error::Error for HandedOver {}

fn handed_over() -> io::Error {
    io::Error::other(HandedOver)
}

/// True for the error a receive returns after [`Endpoint::stop_receiving`]
/// (a receive that began on the engine and must be made again on the
/// socket's owner's path: its kept datagrams first, then the kernel).
pub fn is_handed_over(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<HandedOver>())
}

/// One datagram handed back by [`Endpoint::take_received`]: payload,
/// source, and what the kernel reported with it (destination, TOS, TTL).
pub type KeptDatagram = (Vec<u8>, SocketAddr, Option<crate::backend::PktInfo>);

/// Flags for [`Endpoint::recv_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct RecvFlags {
    /// Leave the datagram queued (MSG_PEEK).
    pub peek: bool,
    /// Do not block for this call (MSG_DONTWAIT).
    pub dont_wait: bool,
    /// A signal handler that runs while this call is blocked fails it with
    /// `ErrorKind::Interrupted` (`EINTR`), as the kernel does for handlers
    /// installed without `SA_RESTART`; otherwise the wait resumes.
    pub interruptible: bool,
}

/// Flags for [`Endpoint::send_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct SendFlags {
    /// Do not block for this call (MSG_DONTWAIT): a full L1 or a full
    /// kernel send buffer fails it with `EAGAIN` even on a blocking endpoint.
    pub dont_wait: bool,
}

/// One datagram received by [`Endpoint::recv_with`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// Bytes copied into the buffer.
    pub copied: usize,
    /// Full datagram length; larger than `copied` means truncated.
    pub len: usize,
    /// Sender.
    pub src: SocketAddr,
}

/// How many datagrams an endpoint's ring holds, stored under the ring's
/// lock after every push and pop and read without it, so readiness checks
/// (poll, select) take no lock. A reader racing a pop may see a datagram
/// another thread is taking, as a second thread receiving on a kernel
/// socket may. It can be held apart from the endpoint (and outlive it).
#[derive(Debug)]
pub struct RingLen(std::sync::atomic::AtomicUsize);

impl RingLen {
    /// Datagrams waiting.
    pub fn get(&self) -> usize {
        self.0.load(Acquire)
    }
}

/// A UDP endpoint served by an eudp engine.
#[derive(Debug)]
pub struct Endpoint {
    inner: Arc<EpInner>,
}

impl Endpoint {
    /// An unbound endpoint on the process-wide engine (`v6` selects a
    /// dual-stack IPv6 socket).
    pub fn new(v6: bool) -> io::Result<Endpoint> {
        Self::with_engine(Engine::global()?, v6)
    }

    /// An endpoint bound to `addr` on the process-wide engine.
    pub fn bind(addr: SocketAddr) -> io::Result<Endpoint> {
        let ep = Self::new(addr.is_ipv6())?;
        ep.bind_to(addr)?;
        Ok(ep)
    }

    /// An unbound endpoint on a given engine.
    pub fn with_engine(engine: &Engine, v6: bool) -> io::Result<Endpoint> {
        engine.shared.hold_gro_key();
        let sock = kernel::UdpSocket::new(v6)?;
        // Every engine call passes MSG_DONTWAIT; a blocking description
        // lets a blocked receiver sleep inside its read.
        sock.set_description_blocking()?;
        Self::with_backend(engine, Box::new(sock))
    }

    /// An endpoint over an existing kernel UDP socket (the preload shim hands
    /// over a duplicate of the application's socket). The shared file
    /// description keeps its O_NONBLOCK; the endpoint keeps its own
    /// blocking mode.
    pub fn from_kernel_fd(engine: &Engine, fd: std::os::fd::OwnedFd) -> io::Result<Endpoint> {
        let sock = kernel::UdpSocket::from_owned_fd(fd)?;
        engine.shared.hold_gro_key();
        let ep = Self::with_backend(engine, Box::new(sock))?;
        // A socket connected before adoption keeps its peer.
        if ep.inner.backend.peer_addr().is_ok() {
            ep.inner.connected.store(true, SeqCst);
        }
        Ok(ep)
    }

    /// The backend socket's file descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.inner.backend.raw_fd()
    }

    /// The descriptor that stands for input the endpoint's kernel socket
    /// does not show ([`crate::backend::Capabilities::bypass_fd`]); `None` on a backend whose
    /// input all reaches the kernel socket.
    pub fn bypass_fd(&self) -> Option<RawFd> {
        self.inner.backend.capabilities().bypass_fd
    }

    /// True when the endpoint has a default destination (connected).
    pub fn is_connected(&self) -> bool {
        self.inner.connected.load(SeqCst)
    }

    /// True when the endpoint is in nonblocking mode.
    pub fn is_nonblocking(&self) -> bool {
        self.inner.nonblocking.load(SeqCst)
    }

    /// An endpoint over any backend.
    pub fn with_backend(engine: &Engine, backend: Box<dyn Backend>) -> io::Result<Endpoint> {
        let sh = engine.shared.clone();
        let cfg = &sh.config;
        let gso = cfg.gso && backend.probe_gso();
        if cfg.gro {
            backend.enable_gro();
        }
        let recorder: Option<Recorder> = cfg.record_transitions.then(Default::default);
        crate::tracepoint::setup_socket(|level, name, val| backend.set_option(level, name, val));
        let v6 = backend.is_v6();
        let rcvbuf = backend.recv_buffer_size();
        let trace = crate::tracepoint::EpTrace::new();
        trace.fit_stamps_to(rcvbuf);
        let inner = Arc::new(EpInner {
            id: sh.next_id(),
            send: Mutex::new(SendState::new(cfg.l2_depth, backend.send_buffer_size(), recorder.clone())),
            caller_staging: Mutex::new(L1Queue::default()),
            caller_left: std::sync::atomic::AtomicUsize::new(0),
            room_fd: backend.capabilities().writable_fd,
            room_watched: AtomicBool::new(false),
            caller_drains: cfg.tx_caller_drain && backend.capabilities().drain_on_caller,
            coalesces: backend.capabilities().drain_on_caller,
            send_cv: Condvar::new(),
            send_waiters: std::sync::atomic::AtomicU32::new(0),
            recv: Mutex::new(RecvSide { ring: RecvRing::new(rcvbuf), ready: None, ready_set: false, err: None }),
            rx_sock: Mutex::new(()),
            ring_len: Arc::new(RingLen(std::sync::atomic::AtomicUsize::new(0))),
            last_fill: std::sync::atomic::AtomicUsize::new(0),
            last_batch: std::sync::atomic::AtomicUsize::new(0),
            rx_msg_len: std::sync::atomic::AtomicUsize::new(RX_BUF),
            rx_waiters: std::sync::atomic::AtomicU32::new(0),
            rx_blocked: AtomicBool::new(false),
            rx_blocking_ok: AtomicBool::new(true),
            rx_timeout_in_socket: AtomicBool::new(false),
            rx_armed: AtomicBool::new(true),
            rx_detached: AtomicBool::new(false),
            rx_watch: Mutex::new(()),
            rx_stamp_parked: AtomicBool::new(false),
            rx_stopped: AtomicBool::new(false),
            rx_app_waits: AtomicBool::new(false),
            rx_pollers: std::sync::atomic::AtomicU32::new(0),
            rx_released: AtomicBool::new(false),
            rx_calls_polled: std::sync::atomic::AtomicU64::new(0),
            tx_seen: std::sync::atomic::AtomicU64::new(0),
            closed: AtomicBool::new(false),
            rx_calls: std::sync::atomic::AtomicU64::new(0),
            rx_seen: std::sync::atomic::AtomicU64::new(0),
            posted_once: AtomicBool::new(false),
            lone_post: Mutex::new(None),
            lone_pending: AtomicBool::new(false),
            gso: AtomicBool::new(gso),
            gso_limits: GsoLimits::ethernet(v6),
            gso_seg_cap: std::sync::atomic::AtomicUsize::new(usize::MAX),
            pending_error: AtomicI32::new(0),
            connected: AtomicBool::new(false),
            nonblocking: AtomicBool::new(false),
            timeouts: Mutex::new((None, None)),
            recorder,
            stats: Stats::default(),
            trace,
            backend,
            engine: sh,
        });
        inner.engine.register(&inner)?;
        Ok(Endpoint { inner })
    }

    /// Binds to a local address (port 0: an ephemeral port).
    pub fn bind_to(&self, addr: SocketAddr) -> io::Result<()> {
        let addr = self.family_addr(addr)?;
        self.inner.backend.bind(&addr)
    }

    /// Sets the default destination and accepts only that peer.
    pub fn connect(&self, addr: SocketAddr) -> io::Result<()> {
        let addr = self.family_addr(addr)?;
        // Datagrams already queued keep their explicit or previous destination;
        // flush them first so none is sent to the new peer by mistake.
        self.inner.flush(Instant::now() + Duration::from_secs(5));
        self.inner.backend.connect(&addr)?;
        self.inner.connected.store(true, SeqCst);
        Ok(())
    }

    /// Dissolves the association (`connect(AF_UNSPEC)`).
    pub fn disconnect(&self) -> io::Result<()> {
        self.inner.flush(Instant::now() + Duration::from_secs(5));
        self.inner.backend.disconnect()?;
        self.inner.connected.store(false, SeqCst);
        Ok(())
    }

    /// Local address (after bind or the first send). As with a kernel
    /// socket, an IPv6 endpoint reports IPv4 peers as `::ffff:a.b.c.d`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.backend.local_addr()
    }

    /// Connected peer.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.backend.peer_addr()
    }

    /// Nonblocking mode: calls that would wait fail with `WouldBlock` (EAGAIN).
    pub fn set_nonblocking(&self, on: bool) {
        self.inner.nonblocking.store(on, SeqCst);
    }

    /// Receive timeout (SO_RCVTIMEO); `None` waits forever.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        let mut g = lock(&self.inner.timeouts);
        g.0 = t;
        self.inner.rx_timeout_in_socket.store(false, Relaxed);
    }

    /// As [`Endpoint::set_read_timeout`], for a timeout that the backend's
    /// socket already holds as its own `SO_RCVTIMEO` (the shim mirrors the
    /// program's option this way). A blocking receive with a timeout may
    /// then sleep inside the socket's read, as one without does: one system
    /// call per datagram instead of a failed read, a `poll` and a read.
    pub fn set_read_timeout_in_socket(&self, t: Option<Duration>) {
        let mut g = lock(&self.inner.timeouts);
        g.0 = t;
        self.inner.rx_timeout_in_socket.store(true, Relaxed);
    }

    /// Send timeout for a full L1 (SO_SNDTIMEO); `None` waits forever.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        lock(&self.inner.timeouts).1 = t;
    }

    /// Sets SO_SNDBUF on the socket and sizes L1 from what the kernel grants.
    pub fn set_send_buffer_size(&self, bytes: usize) -> io::Result<()> {
        let b = &self.inner.backend;
        b.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, bytes.min(i32::MAX as usize) as i32)?;
        lock(&self.inner.send).capacity = b.send_buffer_size();
        Ok(())
    }

    /// Sets SO_RCVBUF on the socket and sizes the receive ring from what the
    /// kernel grants.
    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        let b = &self.inner.backend;
        b.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, bytes.min(i32::MAX as usize) as i32)?;
        let granted = b.recv_buffer_size();
        lock(&self.inner.recv).ring.set_capacity(granted);
        // Traced: the TX stamps waiting to be read share this buffer.
        self.inner.trace.fit_stamps_to(granted);
        Ok(())
    }

    /// Enables ICMP error reporting on an unconnected endpoint (IP_RECVERR).
    pub fn set_recv_err(&self, on: bool) -> io::Result<()> {
        let lvl_v4 = libc::IPPROTO_IP;
        if self.inner.backend.is_v6() {
            self.inner.backend.set_option(libc::IPPROTO_IPV6, libc::IPV6_RECVERR, on as i32)?;
            let _ = self.inner.backend.set_option(lvl_v4, libc::IP_RECVERR, on as i32);
            Ok(())
        } else {
            self.inner.backend.set_option(lvl_v4, libc::IP_RECVERR, on as i32)
        }
    }

    /// The underlying backend (for options the engine passes through).
    pub fn backend(&self) -> &dyn Backend {
        &*self.inner.backend
    }

    /// Counters of this endpoint.
    pub fn stats(&self) -> StatsSnapshot {
        let mut snap = self.inner.stats.snapshot();
        let c = lock(&self.inner.send).counts;
        snap.direct_posts = c.direct;
        snap.queued_posts = c.queued;
        snap.send_full = c.full;
        snap
    }

    /// [`Endpoint::stats`] with what only the kernel knows: the drops of
    /// the socket under the endpoint (one syscall; for reports, not for a
    /// hot path).
    pub fn report(&self) -> StatsSnapshot {
        let mut snap = self.stats();
        snap.socket_drops = self.inner.backend.socket_drops();
        snap
    }

    /// Queue transitions recorded so far (empty unless
    /// [`crate::Config::record_transitions`] is set).
    pub fn transitions(&self) -> Vec<(QueueEvent, QueueState)> {
        self.inner.recorder.as_ref().map(|r| lock(r).clone()).unwrap_or_default()
    }

    /// A file descriptor that is readable exactly while a datagram waits in
    /// the ring, for use with poll/epoll.
    pub fn poll_fd(&self) -> io::Result<RawFd> {
        let mut rs = lock(&self.inner.recv);
        Ok(self.inner.ready_fd(&mut rs)?.as_raw_fd())
    }

    /// A descriptor that reports `POLLERR` (and nothing else) exactly while
    /// an asynchronous error is pending (see [`ErrorFlag`]), made on first
    /// use. Once it exists, [`Endpoint::poll_fd`] stands for datagrams only:
    /// a poll or epoll set that holds the socket's input descriptors must
    /// hold this one too.
    pub fn error_fd(&self) -> io::Result<RawFd> {
        let i = &self.inner;
        let mut rs = lock(&i.recv);
        if rs.err.is_none() {
            let f = Arc::new(ErrorFlag::new()?);
            if i.pending_error.load(Relaxed) != 0 {
                f.raise();
                if rs.ring.is_empty() {
                    rs.unsignal();
                }
            }
            rs.err = Some(f);
        }
        Ok(rs.err.as_ref().expect("just made").as_raw_fd())
    }

    /// Whether a send would be accepted without waiting, as `POLLOUT` on a
    /// kernel socket reports it: L1 is less than half full.
    pub fn writable(&self) -> bool {
        lock(&self.inner.send).writable()
    }

    /// Waits at most `timeout` for [`Endpoint::writable`]; the engine wakes
    /// the wait as soon as it takes L1. Returns whether it became writable.
    pub fn wait_writable(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.inner.send);
        loop {
            if s.writable() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || self.inner.engine.is_stopped() {
                return false;
            }
            self.inner.kick(&mut s);
            s = self.inner.wait_send(s, deadline - now);
        }
    }

    /// Reads of the socket made on application threads so far (one relaxed
    /// load, unlike [`Endpoint::stats`]): a caller that finds it moved across
    /// a receive that found nothing knows the socket itself was found empty.
    pub fn socket_reads(&self) -> u64 {
        self.inner.stats.direct_recv_calls.load(Relaxed)
    }

    /// Datagrams waiting in the ring.
    pub fn pending_datagrams(&self) -> usize {
        self.inner.ring_len.get()
    }

    /// The ring's datagram count, as a handle that can be read without the
    /// endpoint (see [`RingLen`]).
    pub fn ring_len(&self) -> Arc<RingLen> {
        self.inner.ring_len.clone()
    }

    /// Readiness for input without waiting: true when the ring holds a
    /// datagram, after first reading the socket on the caller's thread if
    /// the ring is empty and the last read found a stream arriving (it then
    /// likely holds more). That read replaces the poll a readiness check
    /// would otherwise make before the receive; for sparse traffic (the
    /// last read found one datagram) nothing is read and the caller polls.
    pub fn ready_or_fill(&self) -> bool {
        let i = &self.inner;
        if i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0 {
            return true;
        }
        if i.last_fill.load(Relaxed) < 2 {
            return false;
        }
        let Ok(_g) = i.rx_sock.try_lock() else { return false };
        if i.rx_stopped.load(Relaxed) {
            return false;
        }
        i.fill_on_caller(true, usize::MAX);
        i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0
    }

    /// Readiness for input after a read of the socket on the spot, whatever
    /// the last read found: for a caller told by the backend's descriptor
    /// that input may wait. That descriptor does not promise a datagram
    /// (under the TCP transport it is readable for a partial frame, or
    /// for a wake-up with nothing queued), while a program told
    /// "readable" expects its next nonblocking receive to return one. A
    /// read under way on another thread is waited for (it lands in the
    /// ring), unless that thread sleeps inside its read.
    pub fn ready_after_read(&self) -> bool {
        let i = &self.inner;
        if i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0 {
            return true;
        }
        let g = loop {
            match i.rx_sock.try_lock() {
                Ok(g) => break Some(g),
                Err(_) if i.rx_blocked.load(SeqCst) => break None,
                Err(_) => std::thread::yield_now(),
            }
        };
        if g.is_some() && !i.rx_stopped.load(Relaxed) {
            i.fill_on_caller(true, usize::MAX);
        }
        i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0
    }

    /// True while an asynchronous error the socket reported (an ICMP port
    /// unreachable on a connected socket, say) waits for the application's
    /// next send or receive, as the kernel socket's `sk_err` would.
    pub fn has_pending_error(&self) -> bool {
        self.inner.pending_error.load(Relaxed) != 0
    }

    /// Takes that error, as `getsockopt(SO_ERROR)` does: its errno, 0 when
    /// none. Input readiness no longer stands for it afterwards.
    pub fn take_error(&self) -> i32 {
        let Some(e) = self.inner.take_pending_error() else { return 0 };
        self.inner.error_taken();
        e.raw_os_error().unwrap_or(libc::EIO)
    }

    /// Makes `code` the socket's pending error, for the next send or
    /// receive (or SO_ERROR) to report: an error taken off the kernel
    /// socket by someone other than the engine.
    pub fn note_error(&self, code: i32) {
        if code != 0 {
            self.inner.set_pending_error(code);
            lock(&self.inner.recv).error_ready();
        }
    }

    /// Size of the next waiting datagram (FIONREAD), 0 when none.
    pub fn next_datagram_len(&self) -> usize {
        lock(&self.inner.recv).ring.peek_len().unwrap_or(0)
    }

    fn family_addr(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let v6 = self.inner.backend.is_v6();
        if addr.is_ipv6() && !v6 {
            return Err(err(libc::EAFNOSUPPORT));
        }
        Ok(crate::sys::addr::to_family(addr, v6))
    }

    /// Sends on a connected endpoint.
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.send_with(data, None, SendFlags::default())
    }

    /// Sends one datagram to `dst`.
    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<usize> {
        self.send_with(data, Some(dst), SendFlags::default())
    }

    /// Sends one datagram to `dst` (`None`: the connected peer) with
    /// per-call flags.
    pub fn send_with(&self, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        let dst = match dst {
            Some(d) => {
                let d = self.family_addr(d)?;
                if d.port() == 0 {
                    return Err(err(libc::EINVAL));
                }
                Some(d)
            }
            None if !self.inner.connected.load(Relaxed) => return Err(err(libc::EDESTADDRREQ)),
            None => None,
        };
        self.inner.traced_send(data, dst, flags)
    }

    /// Sends several datagrams; returns how many were accepted. Stops at the
    /// first error, which is returned only if nothing was accepted.
    pub fn send_batch(&self, datagrams: &[(&[u8], Option<SocketAddr>)]) -> io::Result<usize> {
        for (i, (d, a)) in datagrams.iter().enumerate() {
            let r = match a {
                Some(a) => self.send_to(d, *a),
                None => self.send(d),
            };
            if let Err(e) = r {
                if i == 0 {
                    return Err(e);
                }
                // Report the error on the next call, as sendmmsg does.
                if let Some(code) = e.raw_os_error().filter(|&c| c != libc::EAGAIN) {
                    self.inner.set_pending_error(code);
                }
                return Ok(i);
            }
        }
        Ok(datagrams.len())
    }

    /// Receives one datagram; returns its length and sender. A datagram
    /// longer than `buf` is truncated (the rest is discarded, as recvfrom does).
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_with(buf, RecvFlags::default()).map(|r| (r.copied, r.src))
    }

    /// Receives on a connected endpoint.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|r| r.0)
    }

    /// Receives with flags (peek, don't-wait).
    #[inline]
    pub fn recv_with(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<Received> {
        self.inner.traced_recv(buf, flags, None)
    }

    /// [`Endpoint::recv_with`], also writing where the datagram was addressed
    /// (`IP_PKTINFO`/`IPV6_RECVPKTINFO` on the socket, as the kernel reported
    /// it; `None` when the socket did not ask) to `info`. Kept apart from
    /// [`Received`] so receives that do not want it do not copy it.
    #[inline]
    pub fn recv_with_info(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        info: &mut Option<crate::backend::PktInfo>,
    ) -> io::Result<Received> {
        *info = None;
        self.inner.traced_recv(buf, flags, Some(info))
    }

    /// Receives up to `bufs.len()` datagrams: blocks (per the endpoint's mode)
    /// for the first, then takes what is already waiting.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], out: &mut Vec<Received>) -> io::Result<usize> {
        out.clear();
        for (i, b) in bufs.iter_mut().enumerate() {
            let flags = RecvFlags { dont_wait: i > 0, ..RecvFlags::default() };
            match self.inner.traced_recv(b, flags, None) {
                Ok(r) => out.push(r),
                Err(e) if i > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if i == 0 => return Err(e),
                Err(e) => {
                    // Keep it for the next call, as recvmmsg does.
                    if let Some(code) = e.raw_os_error() {
                        self.inner.set_pending_error(code);
                    }
                    break;
                }
            }
        }
        Ok(out.len())
    }

    /// Waits until everything queued has been handed to the kernel (or the
    /// deadline passes). Returns true when drained.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.inner.flush(deadline_after(timeout).unwrap_or_else(far_future))
    }

    /// When tracing: reads the kernel's TX timestamps still waiting on the
    /// socket's error queue into the trace (as closing the endpoint does),
    /// for a process that writes its trace without closing its sockets
    /// (at exit).
    pub fn drain_trace(&self) {
        if crate::tracepoint::on() {
            self.inner.trace.drain_tx(self.inner.backend.raw_fd());
        }
    }

    /// Hands the socket's receive side back to its owner, who reads the
    /// kernel socket itself from now on (the preload shim's fallback): the
    /// engine stops watching and reading it for good. What was already
    /// taken off the socket stays in the ring for
    /// [`Endpoint::take_received`].
    ///
    /// Receives that find the ring empty from then on fail with the error
    /// [`is_handed_over`] recognises, for the caller to receive on its own
    /// path. A thread already asleep inside a read of the socket reads one
    /// message at most (see [`EpInner::block_in_read`]) and returns it.
    pub fn stop_receiving(&self) {
        let i = &self.inner;
        {
            let _w = lock(&i.rx_watch);
            i.rx_stopped.store(true, SeqCst);
            i.rx_armed.store(false, SeqCst);
            let _ = i.engine.epoll.remove(i.backend.raw_fd());
        }
        if !i.backend.capabilities().input_reaches_raw_fd {
            // A receive asleep in `recv_wait` polls the backend and the
            // ring, which input no longer reaches: woken, it finds
            // `rx_stopped` and is made again on the owner's path. (Under
            // the recv lock: one that takes it later sees `rx_stopped`.)
            lock(&i.recv).signal();
        }
    }

    /// The application waits for input on the socket itself (the preload
    /// shim: the socket is in one of the program's epoll sets, next to the
    /// ring's eventfd), so an arrival wakes an application thread, which
    /// reads the socket on its own (as [`Endpoint::recv_with`] does when
    /// the ring is empty). The engine then stops watching the socket for
    /// input: each arrival used to wake the engine thread as well, whose
    /// read raced the woken application thread (which then waited for that
    /// read and the ring, or found the datagram gone) and whose push wrote
    /// the ring's eventfd for a second report of the same datagram — for a
    /// socket that receives now and then (a DNS server's, a client's
    /// upstream query) a thread hop and several syscalls per datagram.
    /// What arrives while the application is busy waits in the kernel
    /// socket, as it would without the engine. Only for a backend whose
    /// socket becomes readable on input (not the TCP transport's). For good:
    /// the engine does not watch the socket again.
    pub fn app_waits_on_socket(&self) {
        let i = &self.inner;
        let _w = lock(&i.rx_watch);
        if i.rx_app_waits.swap(true, SeqCst) {
            return;
        }
        i.rx_armed.store(false, SeqCst);
        let _ = i.engine.epoll.remove(i.backend.raw_fd());
    }

    /// An application thread is about to sleep in a poll or select that
    /// watches the socket for input (and the ring's eventfd): until the
    /// matching [`Endpoint::app_poll_end`] the engine does not take the
    /// socket back, as for a thread blocked in a receive, and when such
    /// polls are all that waits on it the engine lets go of it at its next
    /// handoff check (no check every interval for an idle server). An
    /// arrival then wakes the application thread alone, which reads the
    /// socket itself; with the engine's watch re-armed after a handoff
    /// interval of quiet, each sparse arrival woke the engine too, whose
    /// read and eventfd write came between the arrival and the program's
    /// receive.
    ///
    /// Only for sparse input: the last read that brought anything brought
    /// a single datagram, and the program made at most
    /// [`SPARSE_RECEIVES`] receives since its previous sleeping poll (a
    /// request and the `EAGAIN` after it). Once a stream arrives (a read
    /// brought a GRO batch or a backlog, or receives drained a run of
    /// datagrams between polls) the engine keeps its part, so a receiver
    /// that falls behind keeps the ring as a second buffer: the first poll
    /// that finds the socket streaming re-arms the engine's watch if it had
    /// let go. Returns whether the poll was announced: only then is
    /// [`Endpoint::app_poll_end`] called.
    pub fn app_poll_begin(&self) -> bool {
        let i = &self.inner;
        let calls = i.rx_calls.load(Relaxed);
        let since = calls.wrapping_sub(i.rx_calls_polled.swap(calls, Relaxed));
        if i.last_batch.load(Relaxed) > 1 || since > SPARSE_RECEIVES {
            if i.rx_released.swap(false, SeqCst) {
                i.rearm_rx();
            }
            return false;
        }
        i.rx_waiters.fetch_add(1, SeqCst);
        i.rx_pollers.fetch_add(1, SeqCst);
        true
    }

    /// The poll that [`Endpoint::app_poll_begin`] announced returned.
    pub fn app_poll_end(&self) {
        let i = &self.inner;
        i.rx_pollers.fetch_sub(1, SeqCst);
        i.rx_waiters.fetch_sub(1, SeqCst);
    }

    /// After [`Endpoint::stop_receiving`]: moves what the ring holds, then
    /// what the socket holds — read and split exactly as the engine reads
    /// it (a GRO super-packet becomes its datagrams) — to the back of
    /// `out`, in arrival order. Reading the socket stops when it is found
    /// empty or after `max_bytes` (each datagram counting at least one
    /// byte), so a sender that keeps sending cannot hold the caller here.
    ///
    /// A thread sleeping inside a read of the socket (a blocking receive
    /// that began before the hand-over) keeps the socket. With `leave_asleep`
    /// and nothing in the socket that read is not waited for: only the ring
    /// is taken and `reader_asleep` says so (what the read brings later
    /// reaches the ring, see [`Endpoint::reader_asleep`]). Otherwise the
    /// read is waited for, at most `wait`; after that only the ring is
    /// taken and the socket is reported as not found empty.
    pub fn take_received(
        &self,
        max_bytes: usize,
        wait: Duration,
        leave_asleep: bool,
        out: &mut std::collections::VecDeque<KeptDatagram>,
    ) -> Taken {
        let i = &self.inner;
        let deadline = Instant::now() + wait;
        let mut asleep = false;
        let guard = loop {
            match i.rx_sock.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                // Asleep with nothing to read: it may sleep for good.
                Err(std::sync::TryLockError::WouldBlock)
                    if leave_asleep && i.rx_blocked.load(SeqCst) && !crate::sys::poll::has_data(i.backend.raw_fd()) =>
                {
                    asleep = true;
                    break None;
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        let mut buf = vec![0u8; RX_BUF];
        // Its own scratch, not the thread's: a fallback may run from an
        // exit handler, after this thread's locals are gone.
        let mut scratch = RecvScratch::new(4);
        let mut taken = Taken { datagrams: 0, socket_bytes: 0, socket_empty: false, reader_asleep: asleep };
        loop {
            {
                let mut rs = lock(&i.recv);
                let mut info = None;
                while let Some(r) = i.pop(&mut rs, &mut buf, false, Some(&mut info)) {
                    out.push_back((buf[..r.copied].to_vec(), r.src, info.take()));
                    taken.datagrams += 1;
                }
            }
            if guard.is_none() || taken.socket_bytes >= max_bytes {
                return taken;
            }
            let before = i.stats.bytes_received.load(Relaxed);
            let fill = i.fill_ring(&mut scratch, 1, false);
            if fill.added == 0 {
                // Nothing read: the socket is empty (or reported an error,
                // kept for the owner as the engine keeps it).
                taken.socket_empty = !fill.ring_full && i.pending_error.load(Relaxed) == 0;
                return taken;
            }
            let bytes = i.stats.bytes_received.load(Relaxed).wrapping_sub(before) as usize;
            taken.socket_bytes += bytes.max(fill.added);
        }
    }

    /// After [`Endpoint::stop_receiving`]: a thread is still inside the
    /// read of the socket it began before (see [`EpInner::block_in_read`]).
    /// Once this is false it stays false, and whatever that read brought is
    /// in the ring: the read pushes it there before it lets go.
    pub fn reader_asleep(&self) -> bool {
        self.inner.rx_blocked.load(SeqCst)
    }

    /// Takes the ring's readiness descriptor (when one was made) away from
    /// the endpoint, which never touches it again. After a fallback it
    /// stands for the datagrams [`Endpoint::take_received`] handed over:
    /// an epoll set the application registered it in keeps reporting them.
    pub fn take_ready_fd(&self) -> Option<Arc<EventFd>> {
        let mut rs = lock(&self.inner.recv);
        // The error flag (if any) reports nothing from now on: what the
        // owner's epoll sets hold of it must not stand for a stale error.
        if let Some(f) = rs.err.take() {
            f.clear();
        }
        rs.ready.take()
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        // Like close(2) on a kernel socket: what was accepted still goes out.
        let inner = &self.inner;
        {
            let mut s = lock(&inner.send);
            s.begin_shutdown();
        }
        inner.flush(Instant::now() + Duration::from_secs(5));
        if crate::tracepoint::on() {
            inner.trace.drain_tx(inner.backend.raw_fd());
            let _ = crate::tracepoint::finish();
        }
        let lost = {
            let s = lock(&inner.send);
            s.l1.len() as u64 + u64::from(s.staged)
        };
        Stats::add(&inner.stats.drop_shutdown, lost);
        inner.closed.store(true, SeqCst);
        inner.engine.deregister(inner);
        // The kernel socket must be closed when this returns, as close(2)
        // closes it — a program may bind the same port again at once, and
        // the shim's descriptor budget counts on its numbers being free.
        // The engine's lists let go of the endpoint here (`forget`), so
        // only a call in progress on it (an engine turn, another thread's
        // call) can still hold it: those are waited for, yielding first (an
        // engine turn takes microseconds), then sleeping. Taken off the
        // lists again each time, as a turn that ends may list it anew.
        let start = Instant::now();
        let deadline = start + Duration::from_millis(100);
        loop {
            inner.engine.forget(inner.id);
            if Arc::strong_count(inner) == 1 {
                break;
            }
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            if now - start < Duration::from_micros(200) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        if Arc::strong_count(inner) > 1 {
            // Still held (the engine thread or a call in flight, e.g. one
            // waiting on a full lane of the tcp backend): the socket is let
            // go now all the same, so its port is free when this returns.
            inner.backend.release_socket();
        }
    }
}

impl EpInner {
    fn take_pending_error(&self) -> Option<io::Error> {
        // A plain load first: the common case writes nothing shared.
        if self.pending_error.load(Relaxed) == 0 {
            return None;
        }
        match self.pending_error.swap(0, SeqCst) {
            0 => None,
            e => {
                Stats::add(&self.stats.errors_surfaced, 1);
                Some(err(e))
            }
        }
    }

    /// After a pending error was taken outside a receive (by a send or
    /// SO_ERROR): the ring's eventfd, set for the error, stands for
    /// nothing now unless the ring holds a datagram.
    fn error_taken(&self) {
        let mut rs = lock(&self.recv);
        if self.pending_error.load(Relaxed) == 0 {
            if let Some(f) = &rs.err {
                f.clear();
            }
            if rs.ring.is_empty() {
                rs.unsignal();
            }
        }
    }

    fn set_pending_error(&self, e: i32) {
        self.pending_error.store(e, SeqCst);
    }

    fn deadline(&self, send: bool) -> Option<Instant> {
        let t = lock(&self.timeouts);
        let d = if send { t.1 } else { t.0 };
        d.and_then(deadline_after)
    }

    /// Waits on `send_cv` at most `timeout`, counted in `send_waiters`.
    fn wait_send<'a>(&self, s: MutexGuard<'a, SendState>, timeout: Duration) -> MutexGuard<'a, SendState> {
        self.send_waiters.fetch_add(1, Relaxed);
        let s = self.send_cv.wait_timeout(s, timeout).unwrap_or_else(|e| e.into_inner()).0;
        self.send_waiters.fetch_sub(1, Relaxed);
        s
    }

    /// Wakes the threads waiting on `send_cv`, if any. Every change they
    /// wait for is made under `send`, where they counted themselves before
    /// looking, so a change made before this call cannot be missed.
    fn notify_send(&self) {
        if self.send_waiters.load(Relaxed) != 0 {
            self.send_cv.notify_all();
        }
    }

    /// Asks the engine to service this endpoint's send side now.
    fn kick(self: &Arc<Self>, s: &mut SendState) {
        if !s.scheduled || s.coalescing {
            s.scheduled = true;
            s.coalescing = false;
            self.engine.schedule(self.clone());
        }
    }

    /// Asks the engine to service this endpoint's send side within the
    /// coalescing interval: a streaming sender keeps queueing meanwhile and
    /// sends full batches itself, so the engine is not woken per batch.
    fn kick_later(self: &Arc<Self>, s: &mut SendState) {
        if self.engine.config.tx_coalesce.is_zero() || !self.coalesces {
            return self.kick(s);
        }
        let since = || s.l1_since.filter(|_| !s.l1.is_empty()).unwrap_or_else(Instant::now);
        if !s.scheduled {
            s.scheduled = true;
            s.coalescing = true;
            self.engine.schedule_coalesced(self, since());
        } else if s.coalescing && s.l1.len() == 1 {
            // The first datagram after this thread sent L1 itself: the
            // interval restarts from it.
            self.engine.schedule_coalesced(self, since());
        }
    }

    /// The program's thread that queued the newest datagram in L1 is about
    /// to sleep (see [`crate::Engine::send_coalesced_now`]): a remainder
    /// that waits in L1 for its coalescing interval goes now — on this thread when it may
    /// send itself, else the engine is asked at once — instead of when the
    /// interval is up: nothing more is coming from that thread to batch it
    /// with, and it may be waiting for an answer to it. (Another thread's
    /// sleep says nothing about the sender's next datagram, so it leaves
    /// the remainder alone.) Never waits for the send
    /// lock: when another thread holds it (the engine, or a call in this
    /// endpoint's send path), `None`, and the caller asks the engine
    /// ([`crate::engine::Shared::send_coalesced_now`]). Returns whether it
    /// sent or asked.
    pub(crate) fn send_remainder_now(self: &Arc<Self>) -> Option<bool> {
        let mut s = try_lock(&self.send)?;
        if !s.coalescing_remainder_of(crate::queue::thread_token()) {
            return Some(false);
        }
        Stats::add(&self.stats.sleep_flushes, 1);
        if self.caller_drains {
            self.caller_flush(s, false);
        } else {
            self.kick(&mut s);
        }
        Some(true)
    }

    /// On the engine thread, for an application thread (`token`, or any
    /// with `u64::MAX`) that went to sleep and could not send its
    /// remainder itself: whether L1 holds a remainder that thread queued
    /// and that waits out its interval. Counted as a sleep flush: the
    /// engine sends it now.
    pub(crate) fn remainder_of(&self, token: u64) -> bool {
        let mine = lock(&self.send).coalescing_remainder_of(token);
        if mine {
            Stats::add(&self.stats.sleep_flushes, 1);
        }
        mine
    }

    /// True when L1 holds what the caller's thread should send itself:
    /// `tx_flush_batches` full GSO super-packets, or one `sendmmsg` call's
    /// worth without GSO. A batch of the datagram just queued holds what
    /// [`gso_batch`] packs — the segment limit or as many as fit the byte
    /// limit — so a uniform stream flushes exactly k whole batches (a byte
    /// total against k × `max_bytes` let 1472 B flush at 89: 44 + 44 + 1).
    /// With more than one batch, L1 half full also counts, so a small
    /// SO_SNDBUF never makes the sender wait for the engine (nor a sender
    /// polling for POLLOUT). That flush sends all of L1: with the default
    /// 208 KiB it comes at 70 × 1472 B, as 44 + 26; flushing the 44 alone
    /// (keeping the 26, or flushing at 44) cut iperf3 on the testbed from
    /// 14–16 to 10–12 Gbit/s, fewer datagrams per call costing more than a
    /// short message.
    fn l1_holds_a_batch(&self, s: &SendState, last_len: usize) -> bool {
        let n = s.l1.len();
        let k = self.engine.config.tx_flush_batches;
        if 2 * s.l1.charged() >= s.capacity && k > 1 {
            return true;
        }
        if !self.gso.load(Relaxed) {
            return n >= self.engine.config.max_msgs;
        }
        let lim = &self.gso_limits;
        let per_batch = lim.max_segments.min(lim.max_bytes / last_len.max(1)).max(1);
        n >= k * per_batch || s.l1.payload_bytes() >= k * lim.max_bytes
    }

    /// The GSO limits a plan uses now: GSO on or off, the segment cap the
    /// path allowed, and for `connected_v4` IPv4's larger segments.
    fn plan_limits(&self, connected_v4: bool) -> GsoLimits {
        let mut lim = self.gso_limits;
        lim.enabled = self.gso.load(Relaxed);
        if connected_v4 {
            lim.max_segment_size = lim.max_segment_size_v4;
        }
        let cap = self.gso_seg_cap.load(Relaxed);
        lim.max_segment_size = lim.max_segment_size.min(cap);
        lim.max_segment_size_v4 = lim.max_segment_size_v4.min(cap);
        lim
    }

    /// Datagrams at the end of L1 that [`gso_batch`] would put in a run one
    /// more datagram like the last could still join: a batch not yet full.
    /// Planned as `send_staged` plans, except that a connected IPv6 socket
    /// with an IPv4-mapped peer keeps IPv6's smaller segment cap (no peer
    /// lookup under the lock): that can only make a run look closed, so at
    /// worst it is sent short, as before.
    fn open_tail(&self, l1: &L1Queue) -> usize {
        let mut items: Vec<(Option<SocketAddr>, usize)> = l1.slots().iter().map(|s| (s.dst, s.len as usize)).collect();
        let Some(&last) = items.last() else { return 0 };
        items.push(last);
        let runs = gso_batch(&items, &self.plan_limits(false));
        runs.last().map_or(0, |r| r.count - 1)
    }

    /// The caller's thread sends L1 itself as the engine would (reap the
    /// completed direct posts, take L1, hand it to the backend in batches):
    /// with a batch's worth queued there is nothing left to coalesce, and
    /// waking the engine would cost more than the send. Only whole batches
    /// leave when k whole batches triggered it: a trailing run short of one
    /// (a mixed stream) stays in L1 for the next flush or the engine's
    /// timer, unless it is all of L1 or would keep L1 half full. A flush at
    /// half full sends everything (see [`EpInner::l1_holds_a_batch`]).
    /// Falls back to [`EpInner::kick_later`] when another thread is
    /// staging or L2 is full.
    ///
    /// `keep_tail`: a stream's open run may stay for the next send (see
    /// below); false when everything must go now ([`EpInner::send_remainder_now`]).
    fn caller_flush(self: &Arc<Self>, mut s: MutexGuard<'_, SendState>, keep_tail: bool) {
        let staging = self.caller_staging.try_lock();
        s.reap();
        let mut staging = match staging {
            Ok(st) if s.l2_has_room() && s.staged == 0 => st,
            _ if keep_tail => return self.kick_later(&mut s),
            _ => return self.kick(&mut s),
        };
        let n = s.l1.len();
        let by_count = self.engine.config.tx_flush_batches == 1 || 2 * s.l1.charged() < s.capacity;
        let keep = match if by_count && keep_tail { self.open_tail(&s.l1) } else { 0 } {
            tail if tail > 0 && tail < n => {
                // Kept only if L1 then stays under half full with one more
                // datagram, or the next send would flush the short run alone.
                let charge = |d: &crate::queue::Slot| d.len as usize + crate::queue::DATAGRAM_OVERHEAD;
                let kept: usize = s.l1.slots()[n - tail..].iter().map(charge).sum();
                if 2 * (kept + charge(&s.l1.slots()[n - 1])) < s.capacity {
                    tail
                } else {
                    0
                }
            }
            _ => 0,
        };
        let carried = s.l1_carried;
        let took = s.take_l1_prefix(&mut staging, n - keep);
        self.trace.take(took);
        if keep > 0 && n - keep >= carried {
            // The kept run was queued after the previous own-thread flush
            // (only `carried` datagrams predate it): its interval may run
            // from there rather than from the oldest datagram just sent.
            s.l1_since = s.l1_since.max(s.caller_flushed.map(|(t, _)| t));
        }
        let now = Instant::now();
        s.caller_flushed = Some((now, self.rx_calls.load(Relaxed)));
        drop(s);
        Stats::add(&self.stats.caller_flushes, 1);
        self.notify_send();
        if let Some(at) = self.send_staged(&staging, 0, false) {
            // The kernel's send buffer is full: the engine sends the rest
            // (still staged, so nothing overtakes it) and waits for room.
            let mut s = lock(&self.send);
            s.rest = staging.charged_from(at);
            self.caller_left.store(at + 1, Release);
            drop(staging);
            return self.kick(&mut s);
        }
        staging.clear();
        drop(staging);
        let mut s = lock(&self.send);
        if !s.l1_empty() {
            if keep > 0 && s.scheduled && s.coalescing {
                // Move the engine's timer to the kept run's time.
                if let Some(since) = s.l1_since.filter(|_| !s.l1.is_empty()) {
                    self.engine.schedule_coalesced(self, since);
                }
            }
            self.kick_later(&mut s);
        } else if s.flushers > 0 {
            drop(s);
            self.notify_send();
        }
    }

    /// [`EpInner::send`] between the application-call tracepoints.
    fn traced_send(self: &Arc<Self>, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        if !crate::tracepoint::on() {
            return self.send(data, dst, flags);
        }
        let seq = self.trace.send_enter(data.len());
        let r = self.send(data, dst, flags);
        self.trace.send_return(seq);
        if r.is_ok() {
            self.trace.note_addrs(crate::tracepoint::SIDE_SEND, || {
                (self.backend.local_addr().ok(), dst.or_else(|| self.backend.peer_addr().ok()))
            });
        }
        r
    }

    /// [`EpInner::recv`] between the application-call tracepoints.
    #[inline]
    fn traced_recv(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        info: Option<&mut Option<PktInfo>>,
    ) -> io::Result<Received> {
        if !crate::tracepoint::on() {
            return self.recv(buf, flags, info);
        }
        let t = self.trace.recv_enter();
        let r = self.recv(buf, flags, info);
        if r.is_ok() && !flags.peek {
            self.trace.recv_return(t);
        }
        r
    }

    fn send(self: &Arc<Self>, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        let nonblocking = flags.dont_wait || self.nonblocking.load(Relaxed);
        // The limit follows the destination's family: an IPv4 (or
        // IPv4-mapped) peer of a dual-stack socket gets IPv4's limit. Only
        // lengths between the two limits need the (syscall) peer lookup.
        if data.len() > eudp_wire::limits::MAX_UDP_PAYLOAD_V4 {
            let v6_dst = match dst {
                Some(SocketAddr::V6(a)) => a.ip().to_ipv4_mapped().is_none(),
                Some(SocketAddr::V4(_)) => false,
                None => match self.backend.peer_addr() {
                    Ok(SocketAddr::V6(a)) => a.ip().to_ipv4_mapped().is_none(),
                    Ok(SocketAddr::V4(_)) => false,
                    Err(_) => self.backend.is_v6(),
                },
            };
            if data.len() > eudp_wire::limits::max_payload(v6_dst) {
                return Err(err(libc::EMSGSIZE));
            }
        }
        if let Some(e) = self.take_pending_error() {
            self.error_taken();
            return Err(e);
        }
        if self.engine.is_stopped() {
            return self.direct_send(data, dst.as_ref(), nonblocking);
        }
        let mut deadline: Option<Option<Instant>> = None;
        // Bounds the retries after room was made on this thread (see
        // `room_from_kernel`), which other threads may take first.
        let mut room_tries = 0;
        let mut drain_tries = 0;
        loop {
            let mut s = lock(&self.send);
            if self.lone_pending.load(Relaxed) {
                self.reap_lone_post(&mut s);
            }
            if s.l1_empty() && !s.l2_has_room() && self.rx_calls.load(Relaxed) != s.rx_mark {
                s = self.await_slot(s);
            }
            let decision = if self.streaming(&s) { s.post_streaming(dst, data) } else { s.post(dst, data) };
            match decision {
                PostDecision::Direct => {
                    self.trace.direct();
                    drop(s);
                    let r = self.direct_send(data, dst.as_ref(), nonblocking);
                    let mut s = lock(&self.send);
                    let rx = self.rx_calls.load(Relaxed);
                    let responsive = std::mem::replace(&mut s.rx_mark, rx) != rx;
                    let first = !self.posted_once.swap(true, Relaxed);
                    // The kernel's send buffer is full (the engine's last GSO
                    // message is still charged to it): rather than fail a
                    // send that L1 has room for, queue it while this post
                    // still holds L2 (this caller's earlier datagrams are all
                    // out, so its order holds) and let the engine send it once
                    // the kernel has room — a kernel socket with this
                    // SO_SNDBUF would have accepted it.
                    if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                        // Queue or full, never direct again (with L2 deeper
                        // than one, `post` would choose direct once more).
                        let queued = s.post_streaming(dst, data) == PostDecision::Queued;
                        s.direct_done(false);
                        self.kick(&mut s);
                        if queued {
                            self.trace.enqueue();
                            return Ok(data.len());
                        }
                        return r;
                    }
                    if !s.direct_done(responsive) {
                        if first && s.l1_empty() {
                            // Nothing was sent before it to batch with:
                            // the slot is left for whoever comes next
                            // rather than the engine, scheduled through
                            // its coalescing timer (arming it cost a send
                            // 11–16 µs on the test VM). A socket used for
                            // one query (a resolver's upstream socket)
                            // then never involves the engine thread: its
                            // close reaps the post (`EpInner::flush`).
                            *lock(&self.lone_post) = Some(Instant::now());
                            self.lone_pending.store(true, Relaxed);
                        } else {
                            self.kick_later(&mut s);
                        }
                    }
                    // Flushers, and a thread in `await_slot`, wait for L2.
                    self.notify_send();
                    return r;
                }
                PostDecision::Queued => {
                    self.trace.enqueue();
                    if s.l1.len() == 1 && self.coalesces {
                        s.l1_since = Some(Instant::now());
                    }
                    if self.coalesces && self.l1_holds_a_batch(&s, data.len()) {
                        if self.caller_drains {
                            self.caller_flush(s, true);
                        } else {
                            // The engine thread sends it (woken only if it
                            // sleeps); this thread goes on queueing.
                            self.kick(&mut s);
                        }
                    } else {
                        self.kick_later(&mut s);
                    }
                    return Ok(data.len());
                }
                PostDecision::Closed => return Err(err(libc::EPIPE)),
                PostDecision::Full => {
                    if room_tries < 64 {
                        room_tries += 1;
                        match self.room_from_kernel(s, data.len()) {
                            None => continue,
                            Some(g) => s = g,
                        }
                    }
                    if nonblocking && drain_tries < 64 {
                        drain_tries += 1;
                        match self.drain_full_l1(s, data.len()) {
                            None => continue,
                            Some(g) => s = g,
                        }
                    }
                    self.kick(&mut s);
                    if nonblocking {
                        return Err(err(libc::EAGAIN));
                    }
                    let dl = *deadline.get_or_insert_with(|| self.deadline(true));
                    let wait = match dl {
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => w,
                            _ => return Err(err(libc::EAGAIN)),
                        },
                        // Bounded slices so a lost wake-up cannot hang a sender.
                        None => Duration::from_millis(100),
                    };
                    drop(self.wait_send(s, wait.min(Duration::from_millis(100))));
                }
            }
        }
    }

    /// The socket's first direct post was left unreaped (see
    /// [`EpInner::send`]). A send within the coalescing interval after it
    /// leaves it so (the send queues and schedules the engine, which reaps
    /// it then, as it would have); a later one reaps it — when the engine
    /// would have — and posts directly. So a stream batches exactly as
    /// before, without the engine being woken for the lone post.
    fn reap_lone_post(&self, s: &mut SendState) {
        let mut lp = lock(&self.lone_post);
        if matches!(*lp, Some(t) if t.elapsed() < self.engine.config.tx_coalesce) {
            return;
        }
        if s.reap() > 0 {
            self.notify_send();
        }
        *lp = None;
        self.lone_pending.store(false, Relaxed);
    }

    /// A send found L1 and the rest a full kernel send buffer refused full
    /// together. Where the kernel socket polls writable again — what
    /// `EPOLLOUT` tells a program about it — this thread sends the rest
    /// itself rather than wait for the engine thread to notice the room: a
    /// send after `EPOLLOUT` is then accepted however late the engine
    /// runs, in order (the rest still goes first). Without a rest (L1 full
    /// only because the engine has not taken it yet) nothing changes.
    /// Returns the send lock back when the kernel has no room or took
    /// nothing; else (`None`) the caller posts again (a datagram of `len`
    /// bytes fits, or may soon).
    fn room_from_kernel<'a>(
        self: &'a Arc<Self>,
        s: MutexGuard<'a, SendState>,
        len: usize,
    ) -> Option<MutexGuard<'a, SendState>> {
        let Some(fd) = self.room_fd else { return Some(s) };
        if s.shutdown || s.rest == 0 {
            return Some(s);
        }
        // The staging first (the engine's lock order): a send of the rest
        // in flight on another thread ends, and its rest is counted,
        // before this one looks at the kernel (which that send may have
        // just filled, making room in the rest).
        drop(s);
        let mut st = lock(&self.caller_staging);
        let s = lock(&self.send);
        if s.fits(len) {
            return None;
        }
        if !crate::sys::poll::poll_writable(fd, Some(Duration::ZERO)).unwrap_or(false) {
            drop(st);
            return Some(s);
        }
        let left = self.caller_left.swap(0, Acquire);
        if left == 0 {
            if !st.is_empty() || s.staged != 0 {
                // The engine is sending this socket's queue right now (or
                // about to take up its rest): it makes the room.
                drop(st);
                drop(self.wait_send(s, Duration::from_millis(1)));
            }
            return None; // else the rest is gone: look again
        }
        drop(s);
        let from = left - 1;
        let at = self.send_staged(&st, from, false);
        lock(&self.send).rest = at.map_or(0, |at| st.charged_from(at));
        self.notify_send();
        match at {
            None => {
                st.clear();
                None
            }
            Some(at) => {
                drop(st);
                self.await_room(at);
                if at > from {
                    None
                } else {
                    Some(lock(&self.send))
                }
            }
        }
    }

    /// A nonblocking send found L1 full (and [`EpInner::room_from_kernel`]
    /// made no room), on a backend whose callers may send L1 themselves
    /// ([`crate::backend::Capabilities::drain_on_caller`]). Without a rest refused by the
    /// kernel, what is missing is only the engine's turn, which on a busy
    /// host may be milliseconds away, and a kernel socket would have taken the
    /// datagram (20 000 nonblocking sends of 1400 B through a 4.5 KiB
    /// SO_SNDBUF over loopback: the kernel refuses none; with three busy
    /// loops beside it, 3 runs in 10 lost 20–30% to EAGAIN here). This
    /// thread then sends L1 itself, as a streaming caller's flush does
    /// ([`EpInner::caller_flush`]), so that such a send fails only where the
    /// kernel's send buffer is full too (the flush leaves a rest, and
    /// [`EpInner::room_from_kernel`] finds the socket unwritable). A backend
    /// call already in flight (the engine's, or another thread's post) ends
    /// within one syscall: it is waited for, within a bound. Room that came
    /// meanwhile (the engine sent L1 behind a rest the kernel took after
    /// all) is posted into: with three busy loops, 1–2 sends in 20 000 were
    /// refused in 3 runs of 15 before that check. Returns the send lock
    /// when nothing was sent; `None` when the caller posts again.
    fn drain_full_l1<'a>(
        self: &'a Arc<Self>,
        mut s: MutexGuard<'a, SendState>,
        len: usize,
    ) -> Option<MutexGuard<'a, SendState>> {
        const SPIN: Duration = Duration::from_micros(20);
        const BOUND: Duration = Duration::from_millis(20);
        if !self.coalesces {
            // The engine drains this backend's queue (`tcp`): a full L1
            // is its back-pressure (a lane still connecting takes datagrams
            // into its bounded queue and drops past the bound, so a caller
            // sending L1 there would turn refusals into drops).
            return Some(s);
        }
        let start = Instant::now();
        loop {
            if s.shutdown {
                return Some(s);
            }
            if s.fits(len) {
                // Room came while the rest was looked after.
                return None;
            }
            if s.rest != 0 {
                return Some(s);
            }
            s.reap();
            if s.l2_has_room() && s.staged == 0 && self.caller_left.load(Acquire) == 0 {
                self.caller_flush(s, false);
                return None;
            }
            let waited = start.elapsed();
            if waited > BOUND {
                return Some(s);
            }
            if waited < SPIN {
                drop(s);
                std::thread::yield_now();
                s = lock(&self.send);
            } else {
                s = self.wait_send(s, (BOUND - waited).min(Duration::from_millis(1)));
            }
        }
    }

    /// True when this send continues a stream: L1 is empty only because
    /// the caller's thread sent it itself less than a coalescing interval
    /// ago, and nothing was received since (a request/response caller
    /// still posts directly). Posting it directly would send it alone —
    /// one more syscall, and one more wake-up of the receiver, per batch.
    fn streaming(&self, s: &SendState) -> bool {
        let interval = self.engine.config.tx_coalesce;
        match s.caller_flushed {
            Some((at, rx)) if s.l1_empty() && !interval.is_zero() => {
                rx == self.rx_calls.load(Relaxed) && at.elapsed() < interval
            }
            _ => false,
        }
    }

    /// A request/response caller (it received since its last direct post)
    /// found L1 empty and L2 held — by the engine's descriptor, whose
    /// syscall woke this caller's peer before it returned, or (a
    /// multi-threaded server) by another thread's direct post, whose
    /// syscall woke the peer whose next request this thread now answers.
    /// Queueing would put an engine hop on the latency path, and make the
    /// other thread's completion find L1 non-empty (so it cannot retire its
    /// slot and the engine must reap it, after the coalescing interval):
    /// wait for the slot instead and post directly. The slot frees within
    /// one syscall of its holder, unless the holder was preempted: yield
    /// for a while, then sleep on the send condition (the holder's completion
    /// notifies it). A completed post left for the engine to reap is reaped
    /// here (an application thread may take Reap). Bounded: past it, the
    /// caller queues as before.
    fn await_slot<'a>(&'a self, mut s: MutexGuard<'a, SendState>) -> MutexGuard<'a, SendState> {
        const SPIN: Duration = Duration::from_micros(20);
        const BOUND: Duration = Duration::from_millis(2);
        let start = Instant::now();
        loop {
            s.reap();
            if !s.l1_empty() || s.l2_has_room() || s.shutdown {
                return s;
            }
            let waited = start.elapsed();
            if waited > BOUND {
                return s;
            }
            if waited < SPIN {
                // Yield rather than spin: on a busy machine the holder may
                // be waiting for this CPU.
                drop(s);
                std::thread::yield_now();
                s = lock(&self.send);
            } else {
                s = self.wait_send(s, BOUND - waited);
            }
        }
    }

    /// One datagram on the caller's thread. A full kernel send buffer makes
    /// a blocking endpoint wait for room, as a blocking socket would.
    fn direct_send(&self, data: &[u8], dst: Option<&SocketAddr>, nonblocking: bool) -> io::Result<usize> {
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            Stats::add(&self.stats.send_calls, 1);
            self.trace.sys_enter();
            match self.backend.send_one(data, dst) {
                Ok(n) => {
                    self.trace.sys_return_direct();
                    // Traced: the stamps of direct posts are read by the
                    // sending thread too (the engine's watch may be off).
                    if crate::tracepoint::on() && self.trace.drain_due() {
                        self.trace.drain_tx(self.backend.raw_fd());
                    }
                    Stats::add(&self.stats.datagrams_sent, 1);
                    Stats::add(&self.stats.bytes_sent, n as u64);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !nonblocking => {
                    let dl = *deadline.get_or_insert_with(|| self.deadline(true));
                    let wait = match dl {
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => w,
                            _ => return Err(e),
                        },
                        None => Duration::from_millis(100),
                    };
                    // Queued stamps would end the wait at once (POLLERR).
                    self.trace.drain_tx(self.backend.raw_fd());
                    self.backend.wait_writable(wait.min(Duration::from_millis(100)))?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Engine side: reap completions, drain L1 in batches while L2 has room.
    ///
    /// Where the engine sends a stream's batches (`coalesces` without
    /// `caller_drains`), each take marks the stream on (as the caller's own
    /// flush does: its next sends queue rather than post directly), and
    /// after the first take the engine takes L1 again only once it holds a
    /// batch: a shorter remainder waits for the sender to complete it (its
    /// send then kicks the engine) or for the coalescing interval.
    pub(crate) fn service_send(self: &Arc<Self>, staging: &mut L1Queue) {
        self.service(staging, false)
    }

    /// [`EpInner::service_send`] once the socket the engine's send found
    /// full has room again (`Shared::await_room`).
    pub(crate) fn resume_send(self: &Arc<Self>, staging: &mut L1Queue) {
        self.service(staging, true)
    }

    fn service(self: &Arc<Self>, staging: &mut L1Queue, mut room: bool) {
        let engine_streams = self.coalesces && !self.caller_drains && !self.engine.config.tx_coalesce.is_zero();
        // Without a descriptor to watch for room, the engine waits for it.
        let wait = self.room_fd.is_none();
        let mut first = true;
        loop {
            let left = self.caller_left.swap(0, Acquire);
            if left != 0 {
                let mut st = lock(&self.caller_staging);
                if std::mem::take(&mut room) {
                    // The socket has room: L1 joins the rest (behind it, so
                    // in order) before the first send, so that L1 has room
                    // again the moment the socket has, as a kernel socket's
                    // queue would (a program that polled for room must find
                    // it, not race the engine's send).
                    let mut s = lock(&self.send);
                    let n = s.l1.len();
                    if n > 0 {
                        s.rest += s.l1.charged();
                        s.l1.move_tail(0, &mut st);
                        s.staged += n as u32;
                        s.l1_carried = 0;
                        drop(s);
                        self.trace.take(n);
                        self.notify_send();
                    }
                }
                let at = self.send_staged(&st, left - 1, wait);
                lock(&self.send).rest = at.map_or(0, |at| st.charged_from(at));
                if let Some(at) = at {
                    // Still no room: the rest stays where it is.
                    drop(st);
                    return self.await_room(at);
                }
                st.clear();
                drop(st);
                self.notify_send();
            }
            {
                let mut s = lock(&self.send);
                s.reap();
                let batch = engine_streams
                    && s.staged == 0
                    && s.l1.slots().last().is_some_and(|d| self.l1_holds_a_batch(&s, d.len as usize));
                if engine_streams
                    && !first
                    && !batch
                    && !s.l1.is_empty()
                    && s.staged == 0
                    && s.flushers == 0
                    && !s.shutdown
                {
                    s.scheduled = true;
                    s.coalescing = true;
                    let since = s.l1_since.unwrap_or_else(Instant::now);
                    self.engine.schedule_coalesced(self, since);
                    drop(s);
                    self.notify_send();
                    return;
                }
                first = false;
                // A caller's flush whose last call is still in flight may
                // yet leave a rest (its send buffer full) that must go
                // before L1: L1 stays for that caller, which kicks the
                // engine again once its flush is over.
                let flushing = self.caller_staging.try_lock().is_err();
                let took = if flushing { 0 } else { s.take_l1(staging) };
                if batch && took > 0 {
                    // A whole batch left: the stream is on.
                    s.caller_flushed = Some((Instant::now(), self.rx_calls.load(Relaxed)));
                }
                if took == 0 && self.caller_left.load(Acquire) != 0 {
                    continue; // left by a caller's flush since the check above
                }
                if took == 0 {
                    s.scheduled = false;
                    s.coalescing = false;
                    self.notify_send();
                    return;
                }
                self.trace.take(took);
            }
            // L1 has room again.
            self.notify_send();
            if let Some(at) = self.send_staged(staging, 0, wait) {
                // The kernel's send buffer is full. The rest stays staged
                // (nothing overtakes it) in this endpoint's own arena, the
                // engine's serving every endpoint.
                let mut st = lock(&self.caller_staging);
                debug_assert!(st.is_empty());
                std::mem::swap(&mut *st, staging);
                lock(&self.send).rest = st.charged_from(at);
                drop(st);
                return self.await_room(at);
            }
            staging.clear();
        }
    }

    /// The engine's send met a full kernel send buffer at `caller_staging`
    /// index `at`: the rest waits there, and the engine services this
    /// endpoint again once the socket is writable, going on with other
    /// endpoints meanwhile. The endpoint stays marked scheduled so that
    /// its callers' kicks do not bring it back before then.
    fn await_room(self: &Arc<Self>, at: usize) {
        self.caller_left.store(at + 1, Release);
        {
            let mut s = lock(&self.send);
            s.scheduled = true;
            s.coalescing = false;
        }
        self.notify_send();
        let fd = self.room_fd.expect("only endpoints with a writable fd stop at a full send buffer");
        if self.engine.await_room(self, fd).is_err() {
            // Not watchable (it should be): look again in a moment.
            let _ = self.backend.wait_writable(Duration::from_millis(10));
            self.engine.schedule(self.clone());
        }
    }

    /// Hands the staged datagrams from index `from` on to the backend, one
    /// descriptor per call. Unless told to `wait` for room, it stops where
    /// the kernel's send buffer is full and returns that index: the
    /// datagrams from there on count as staged again.
    fn send_staged(&self, staging: &L1Queue, from: usize, wait: bool) -> Option<usize> {
        let items: Vec<(Option<SocketAddr>, usize)> = staging.slots().iter().map(|s| (s.dst, s.len as usize)).collect();
        // Connected sends carry no destination: their segment limit follows
        // the peer's family (an IPv4-mapped peer of a dual-stack socket
        // takes IPv4's larger segments). One lookup per staging.
        let connected_v4 = self.backend.is_v6()
            && items.iter().any(|(d, _)| d.is_none())
            && matches!(self.backend.peer_addr(), Ok(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_some());
        let mut done = from;
        // Plan once per staging; plan again only when a GSO fallback changed
        // the limits (planning per call would be quadratic in L1's length).
        while done < items.len() {
            let lim = self.plan_limits(connected_v4);
            let base = done;
            let runs = gso_batch(&items[base..], &lim);
            let fallbacks = self.stats.gso_fallbacks.load(Relaxed);
            for (first, n) in group_calls(&runs, self.engine.config.max_msgs, 1024) {
                let call_runs: Vec<crate::batch::Run> = runs[first..first + n]
                    .iter()
                    .map(|r| crate::batch::Run { start: r.start + base - done, ..*r })
                    .collect();
                let datagrams: usize = call_runs.iter().map(|r| r.count).sum();
                self.trace.batch(done, datagrams);
                self.wait_l2_room_and_begin(datagrams as u32);
                let sent = self.send_call(staging, done, &call_runs, wait);
                let mut s = lock(&self.send);
                s.end_batch();
                if sent < datagrams {
                    s.staged += (datagrams - sent) as u32;
                    return Some(done + sent);
                }
                drop(s);
                done += datagrams;
                if self.stats.gso_fallbacks.load(Relaxed) != fallbacks {
                    break;
                }
            }
        }
        None
    }

    fn wait_l2_room_and_begin(&self, datagrams: u32) {
        let mut spins = 0u32;
        loop {
            let mut s = lock(&self.send);
            s.reap();
            if s.l2_has_room() {
                s.begin_batch(datagrams);
                return;
            }
            drop(s);
            // Only a direct post that started before we staged can hold L2;
            // it finishes within one syscall.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Hands one descriptor's datagrams (`runs`, relative to `base`) to the
    /// backend. Partial acceptance is retried; a GSO rejection (EIO/EINVAL)
    /// turns GSO off for this socket and resends the rest as plain
    /// datagrams; other errors drop that message and are reported on the
    /// caller's next call, as `sk_err` would be. Returns the datagrams
    /// done (sent or dropped): all of them, unless the kernel's send buffer
    /// is full and not `wait` (then the rest is the caller's to send later;
    /// that may start inside a GSO message the backend split).
    fn send_call(&self, staging: &L1Queue, base: usize, runs: &[crate::batch::Run], wait: bool) -> usize {
        let slots = &staging.slots()[base..];
        let mut runs: Vec<crate::batch::Run> = runs.to_vec();
        let mut m = 0; // runs done
        let mut done = 0; // their datagrams, and those of runs[m] a split message sent
        while m < runs.len() {
            let pending = &runs[m..];
            let mut iovs: Vec<IoSlice<'_>> = Vec::with_capacity(pending.iter().map(|r| r.count).sum());
            for r in pending {
                for s in &slots[r.start..r.start + r.count] {
                    iovs.push(IoSlice::new(staging.payload(s)));
                }
            }
            let mut msgs: Vec<OutMsg<'_>> = Vec::with_capacity(pending.len());
            let mut at = 0;
            for r in pending {
                msgs.push(OutMsg { dst: slots[r.start].dst, iov: &iovs[at..at + r.count], segment: r.segment });
                at += r.count;
            }
            Stats::add(&self.stats.send_calls, 1);
            self.trace.sys_enter();
            match self.backend.send_batch(&msgs) {
                Ok(k) => {
                    if crate::tracepoint::on() {
                        self.trace.sys_return_batch(&mut pending[..k].iter().map(|r| (base + r.start, r.count)));
                        if self.trace.drain_due() {
                            self.trace.drain_tx(self.backend.raw_fd());
                        }
                    }
                    Stats::add(&self.stats.engine_batches, 1);
                    let mut dg = 0u64;
                    for (msg, r) in msgs[..k].iter().zip(pending) {
                        dg += r.count as u64;
                        let bytes: usize = msg.iov.iter().map(|v| v.len()).sum();
                        Stats::add(&self.stats.bytes_sent, bytes as u64);
                        if r.segment.is_some() {
                            Stats::add(&self.stats.gso_messages, 1);
                        }
                    }
                    self.stats.record_batch(dg);
                    Stats::add(&self.stats.datagrams_sent, dg);
                    done += dg as usize;
                    m += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(k) = crate::backend::partly_sent(&e).filter(|&k| k > 0 && k < runs[m].count) {
                        // The first k datagrams of runs[m] went out.
                        let r = runs[m];
                        if crate::tracepoint::on() {
                            self.trace.sys_return_batch(&mut std::iter::once((base + r.start, k)));
                        }
                        let bytes: usize = slots[r.start..r.start + k].iter().map(|s| s.len as usize).sum();
                        Stats::add(&self.stats.bytes_sent, bytes as u64);
                        Stats::add(&self.stats.datagrams_sent, k as u64);
                        let rest = r.count - k;
                        runs[m] = crate::batch::Run {
                            start: r.start + k,
                            count: rest,
                            segment: r.segment.filter(|_| rest > 1),
                        };
                        done += k;
                    }
                    if !wait {
                        return done;
                    }
                    self.trace.drain_tx(self.backend.raw_fd());
                    let _ = self.backend.wait_writable(Duration::from_millis(10));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let code = e.raw_os_error().unwrap_or(libc::EIO);
                    let r = runs[m];
                    if let Some(seg) = r.segment.filter(|_| matches!(code, libc::EIO | libc::EINVAL | libc::EMSGSIZE)) {
                        // The kernel will not segment this: EIO/EINVAL (no
                        // checksum offload, unsupported) turns GSO off for the
                        // socket; EMSGSIZE (segment larger than the path MTU
                        // allows) lowers the segment cap below this size. The
                        // rest of this descriptor goes out as plain datagrams.
                        if code == libc::EMSGSIZE && seg > 1 {
                            self.gso_seg_cap.fetch_min(seg as usize - 1, Relaxed);
                        } else {
                            self.gso.store(false, Relaxed);
                        }
                        Stats::add(&self.stats.gso_fallbacks, 1);
                        let rest: Vec<_> = runs[m..]
                            .iter()
                            .flat_map(|x| {
                                (x.start..x.start + x.count).map(|i| crate::batch::Run {
                                    start: i,
                                    count: 1,
                                    segment: None,
                                })
                            })
                            .collect();
                        runs.truncate(m);
                        runs.extend(rest);
                        continue;
                    }
                    Stats::add(&self.stats.drop_send_error, r.count as u64);
                    self.set_pending_error(code);
                    done += r.count;
                    m += 1;
                }
            }
        }
        done
    }

    /// Waits until L1 and L2 are empty or the deadline passes.
    pub(crate) fn flush(self: &Arc<Self>, deadline: Instant) -> bool {
        let mut s = lock(&self.send);
        s.flushers += 1;
        let drained = loop {
            // Completed direct posts are reaped here rather than waited
            // for: the engine would only do the same at its next turn
            // (after the coalescing interval), and a flusher sends nothing
            // more that their slots could make queue for a batch.
            if s.reap() > 0 {
                self.notify_send();
            }
            if s.drained() {
                break true;
            }
            if self.engine.is_stopped() {
                break false;
            }
            self.kick(&mut s);
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            s = self.wait_send(s, wait);
        };
        s.flushers -= 1;
        drained
    }

    fn ready_fd<'a>(&self, rs: &'a mut RecvSide) -> io::Result<&'a Arc<EventFd>> {
        if rs.ready.is_none() {
            rs.ready = Some(Arc::new(EventFd::new()?));
            rs.ready_set = false;
            if !rs.ring.is_empty() || (self.pending_error.load(Relaxed) != 0 && rs.err.is_none()) {
                rs.signal();
            }
        }
        Ok(rs.ready.as_ref().expect("just created"))
    }

    /// One read of the socket into the ring on an application thread, with
    /// that thread's scratch buffers. The caller holds `rx_sock`.
    fn fill_on_caller(&self, signal: bool, max_msgs: usize) {
        with_caller_scratch(|sc| {
            let n = sc.bufs.len().min(max_msgs.max(1));
            self.fill_ring_upto(sc, n, 1, signal)
        });
    }

    /// Moves what the socket holds into the ring, as far as the ring has
    /// room. The caller holds `rx_sock`; the ring lock is taken only to
    /// size a read and to push.
    /// `signal`: make the ready fd readable on an empty→non-empty push (the
    /// engine); a receiving thread that pops next passes false and settles
    /// readiness after its pop.
    fn fill_ring(&self, scratch: &mut RecvScratch, rounds: usize, signal: bool) -> Fill {
        self.fill_ring_upto(scratch, scratch.bufs.len(), rounds, signal)
    }

    /// [`EpInner::fill_ring`] reading at most `msgs` messages per round.
    fn fill_ring_upto(&self, scratch: &mut RecvScratch, msgs: usize, rounds: usize, signal: bool) -> Fill {
        let mut added = 0;
        for round in 0..rounds {
            let budget = self.read_budget(msgs);
            if budget == 0 {
                return Fill { added, more: false, ring_full: true };
            }
            Stats::add(&self.stats.recv_calls, 1);
            self.trace.rx_enter();
            let got = match self.backend.recv_batch(&mut scratch.bufs[..budget], &mut scratch.meta[..budget]) {
                Ok(n) => n,
                Err(e) => {
                    self.read_failed(&e, added);
                    break;
                }
            };
            added += self.push_read(scratch, got, signal);
            self.last_fill.store(added, Relaxed);
            if added > 0 {
                self.last_batch.store(added, Relaxed);
            }
            if got < budget {
                break;
            }
            if round + 1 == rounds {
                return Fill { added, more: true, ring_full: false };
            }
        }
        Fill { added, more: false, ring_full: false }
    }

    /// Messages the next read of the socket may bring (at most `bufs`):
    /// no more than the ring has room for, each counted as the largest
    /// message a stream of the last read's datagrams can form. A read that
    /// brought more would take datagrams off the socket only to drop them,
    /// while the socket's own buffer would have kept them until the
    /// application caught up; so with the ring full nothing is read and
    /// arrivals wait (or overflow) in the kernel, as on a plain socket.
    fn read_budget(&self, bufs: usize) -> usize {
        let per = self.rx_msg_len.load(Relaxed);
        lock(&self.recv).ring.room_for(per).min(bufs)
    }

    /// A read of the socket failed: `EAGAIN`/`EINTR` leave nothing to do;
    /// an asynchronous error (e.g. ICMP port unreachable) is kept for the
    /// caller and the error queue drained, so level-triggered readiness does
    /// not spin.
    fn read_failed(&self, e: &io::Error, added: usize) {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                if added == 0 {
                    self.last_fill.store(0, Relaxed);
                }
            }
            _ => {
                let code = e.raw_os_error().unwrap_or(libc::EIO);
                self.set_pending_error(code);
                while self.backend.take_error().is_some() {}
                lock(&self.recv).error_ready();
            }
        }
    }

    /// One blocking receive with an empty ring, made inside the read: when
    /// no other thread is reading the socket, this thread takes `rx_sock`
    /// and sleeps in the kernel until the first message (one syscall, as on
    /// a kernel socket, instead of a failed read, a wait and a read). Holding
    /// the lock keeps the engine and other threads off the socket, so no
    /// datagram can reach the ring behind a sleeping reader's back.
    ///
    /// `None`: not tried (another thread reads, or the ring filled
    /// meanwhile) or not possible (the backend cannot, the description is
    /// nonblocking): wait on readiness instead. `Some(Err)`: `EINTR`, for
    /// the caller to report.
    ///
    /// `timed`: the receive has a timeout, which the socket holds as its
    /// own `SO_RCVTIMEO` (see `rx_timeout_in_socket`), so the read ends by
    /// itself with `EAGAIN` when it expires. The kernel counts that timeout
    /// in scheduler ticks and may end the read up to one tick before the
    /// receive's deadline, so such an `EAGAIN`, and an interruption that
    /// does not end the receive, give `None`: the caller waits out what is
    /// left of its deadline on readiness, exactly.
    fn block_in_read(&self, interruptible: bool, timed: bool) -> Option<io::Result<()>> {
        if !self.rx_blocking_ok.load(Relaxed) {
            return None;
        }
        let _g = self.rx_sock.try_lock().ok()?;
        if self.rx_stopped.load(Relaxed) {
            return Some(Err(handed_over()));
        }
        if self.ring_len.get() > 0 || self.pending_error.load(Relaxed) != 0 {
            return None;
        }
        self.rx_blocked.store(true, SeqCst);
        self.rx_waiters.fetch_add(1, SeqCst);
        let r = with_caller_scratch(|sc| {
            loop {
                Stats::add(&self.stats.recv_calls, 1);
                Stats::add(&self.stats.direct_recv_calls, 1);
                self.trace.rx_enter();
                // One message: a hand-over may begin while this thread
                // sleeps, and after it the socket is its owner's; the one
                // message this read takes then is what a plain receive of
                // the kernel socket would have taken, and it is returned
                // at once (more would be left behind in a ring nobody
                // reads). Under a stream the ring is seldom empty, and a
                // message may hold a whole GRO batch.
                let budget = self.read_budget(1);
                match self.backend.recv_batch_wait(&mut sc.bufs[..budget], &mut sc.meta[..budget]) {
                    // A shut-down socket reads nothing without waiting.
                    Ok(0) => return None,
                    Ok(got) => {
                        let added = self.push_read(sc, got, false);
                        self.last_fill.store(added, Relaxed);
                        if added > 0 {
                            self.last_batch.store(added, Relaxed);
                        }
                        return Some(Ok(()));
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                        if interruptible {
                            return Some(Err(e));
                        }
                        if timed {
                            return None;
                        }
                    }
                    // The socket's timeout expired (or very nearly).
                    Err(e) if timed && e.kind() == io::ErrorKind::WouldBlock => return None,
                    // Without a timeout this is a nonblocking description
                    // (the owner's setting, or another process's): wait on
                    // readiness from now on.
                    Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Unsupported) => {
                        self.rx_blocking_ok.store(false, Relaxed);
                        return None;
                    }
                    Err(e) => {
                        self.read_failed(&e, 0);
                        return Some(Ok(()));
                    }
                }
            }
        });
        self.rx_waiters.fetch_sub(1, SeqCst);
        self.rx_blocked.store(false, SeqCst);
        r
    }

    /// Pushes the `got` messages of a read into the ring; returns datagrams
    /// added. The caller holds `rx_sock`.
    fn push_read(&self, scratch: &mut RecvScratch, got: usize, signal: bool) -> usize {
        let mut added = 0;
        // A message is one datagram or a GRO super-packet of at most
        // `GRO_MAX_SEGMENTS` datagrams of one size, within RX_BUF; so the
        // largest datagram seen bounds the next messages.
        if let Some(dgram) = scratch.meta[..got].iter().map(|m| m.segment.unwrap_or(m.len).min(m.len)).max() {
            self.rx_msg_len.store((dgram.max(1) * GRO_MAX_SEGMENTS).min(RX_BUF), Relaxed);
        }
        {
            let mut rs = lock(&self.recv);
            for i in 0..got {
                let m = scratch.meta[i];
                if m.truncated {
                    Stats::add(&self.stats.drop_truncated, 1);
                    continue;
                }
                let buf = if m.len < COPY_BELOW {
                    scratch.bufs[i][..m.len].to_vec()
                } else {
                    let spare = rs.ring.take_buffer(RX_BUF);
                    std::mem::replace(&mut scratch.bufs[i], spare)
                };
                if m.segment.is_some_and(|s| s < m.len) {
                    Stats::add(&self.stats.gro_superpackets, 1);
                }
                let was_empty = rs.ring.is_empty();
                let len = m.len.min(buf.len());
                match rs.ring.push_message(buf, len, m.segment, m.src, m.pktinfo) {
                    Ok(n) => {
                        self.trace.rx_push(i, n);
                        self.trace.note_addrs(crate::tracepoint::SIDE_RECV, || (self.backend.local_addr().ok(), m.src));
                        added += n;
                        Stats::add(&self.stats.datagrams_received, n as u64);
                        Stats::add(&self.stats.bytes_received, m.len as u64);
                        if was_empty && signal {
                            rs.signal();
                        }
                    }
                    Err(n) => Stats::add(&self.stats.drop_ring_full, n as u64),
                }
            }
            self.ring_len.0.store(rs.ring.datagrams(), Release);
        }
        added
    }

    /// Engine side: the socket had an arrival (its one-shot watch fired) or
    /// still holds data from a bounded read.
    ///
    /// The engine reads only for an application that is away. While an
    /// application thread keeps calling receive it reads the socket itself —
    /// batched and GRO-coalesced like the engine would — so on a machine
    /// with few cores the engine does not compete with it for the CPU and
    /// no arrival wakes two threads. Such an endpoint is parked with its
    /// watch off until [`EpInner::rx_idle_since_last_look`] finds the
    /// application gone for a handoff interval.
    ///
    /// A parked socket also leaves the engine's epoll set
    /// ([`EpInner::detach_rx`]).
    pub(crate) fn engine_receive(&self, scratch: &mut RecvScratch) -> RxOutcome {
        let outcome = self.engine_receive_once(scratch);
        if outcome == RxOutcome::Parked {
            self.detach_rx();
        }
        outcome
    }

    fn engine_receive_once(&self, scratch: &mut RecvScratch) -> RxOutcome {
        self.rx_armed.store(false, SeqCst);
        if self.rx_app_waits.load(SeqCst) {
            return RxOutcome::Done; // the application reads it; never re-armed
        }
        let stamps = if crate::tracepoint::on() { self.trace.drain_tx(self.backend.raw_fd()) } else { 0 };
        let calls = self.rx_calls.load(Relaxed);
        if self.rx_waiters.load(SeqCst) > 0 || calls != self.rx_seen.swap(calls, Relaxed) {
            return RxOutcome::Parked;
        }
        let fill = match self.rx_sock.try_lock() {
            // Checked under the lock: a hand-over holds it while it drains.
            Ok(_g) if self.rx_stopped.load(SeqCst) => return RxOutcome::Done,
            Ok(_g) => self.fill_ring(scratch, RX_ROUNDS, true),
            // An application thread is reading the socket right now.
            Err(_) => return RxOutcome::Parked,
        };
        if fill.more {
            return RxOutcome::More;
        }
        // The watch stays off until the handoff check when:
        // * the ring is full: the application is behind, and what arrives
        //   waits in the socket; its next receives drain the ring and read
        //   the socket themselves;
        // * traced, the wake-up brought TX timestamps and no data: stamps
        //   report EPOLLERR, which epoll cannot mask, so a re-armed watch
        //   would wake the engine after every send syscall of the
        //   application's thread only to read them. The socket leaves the
        //   epoll set altogether while its application keeps sending: with
        //   no waiter on the socket the kernel skips the wake-up call of
        //   every stamp queued and dequeued, and the sending thread reads
        //   the stamps itself (every 16 kernel messages, STAMP_READ_MESSAGES).
        //   Data arriving meanwhile for an application that does not
        //   receive waits up to DETACHED_CHECK handoff intervals; only
        //   while tracing.
        if fill.ring_full {
            return RxOutcome::Parked;
        }
        if stamps > 0 && fill.added == 0 {
            self.engine.stamp_wakes.fetch_add(1, Relaxed);
            self.tx_seen.store(self.stats.send_calls.load(Relaxed), Relaxed);
            self.rx_stamp_parked.store(true, Relaxed);
            return RxOutcome::Parked;
        }
        self.rearm_rx();
        RxOutcome::Done
    }

    /// Engine side, for a parked endpoint: true (and the watch re-armed)
    /// when no application thread received since the engine last looked and
    /// none is blocked receiving; true with the watch left off (released)
    /// when only sparse polls wait on the socket
    /// ([`Endpoint::app_poll_begin`]).
    pub(crate) fn rx_idle_since_last_look(&self) -> bool {
        if self.rx_stopped.load(SeqCst) || self.rx_app_waits.load(SeqCst) {
            return true; // let go, never re-armed
        }
        if self.rx_stamp_parked.load(Relaxed) && !self.closed.load(SeqCst) {
            // Bounded: a sender that went quiet leaves no stamps behind.
            self.trace.drain_tx(self.backend.raw_fd());
            let sent = self.stats.send_calls.load(Relaxed);
            let sending = sent != self.tx_seen.swap(sent, Relaxed);
            if sending && !crate::sys::poll::has_data(self.backend.raw_fd()) {
                return false;
            }
        }
        let calls = self.rx_calls.load(Relaxed);
        if calls != self.rx_seen.swap(calls, Relaxed) {
            return false;
        }
        let waiters = self.rx_waiters.load(SeqCst);
        if waiters == 0 {
            self.rearm_rx();
            return true;
        }
        // Only sparse polls wait on the socket: let go, watch off (the
        // next poll that finds it streaming re-arms it).
        let pollers = self.rx_pollers.load(SeqCst);
        if pollers > 0 && pollers == waiters {
            self.rx_released.store(true, SeqCst);
            return true;
        }
        false
    }

    /// The application's receive calls as of the engine's last look (see
    /// [`EpInner::rx_idle_since_last_look`]): a look that moved it found
    /// the application receiving.
    pub(crate) fn rx_calls_seen(&self) -> u64 {
        self.rx_seen.load(Relaxed)
    }

    /// A parked socket leaves the engine's epoll set (its one-shot watch is
    /// off already); [`EpInner::rearm_rx`] adds it back. A disarmed one-shot
    /// watch still hangs on the socket's wait queue, so every datagram the
    /// socket sends or receives would run the epoll callback under an
    /// IRQ-safe lock — measured: 4.3 against 4.6 µs per send + receive pair
    /// on loopback — while the application thread does all the reading.
    /// One `epoll_ctl` per park, and an add instead of a modify at the
    /// re-arm a handoff interval or more later.
    fn detach_rx(&self) {
        let _w = lock(&self.rx_watch);
        if !self.rx_armed.load(SeqCst) && !self.rx_detached.swap(true, SeqCst) {
            let _ = self.engine.epoll.remove(self.backend.raw_fd());
        }
    }

    /// Traced: parked for TX timestamps alone (its checks drain them).
    pub(crate) fn rx_stamp_parked(&self) -> bool {
        self.rx_stamp_parked.load(Relaxed)
    }

    /// Re-arms the engine's watch on the socket if it is off.
    fn rearm_rx(&self) {
        if !self.rx_stamp_parked.load(Relaxed) && self.rx_armed.load(SeqCst) {
            return; // armed already (no lock on the common path)
        }
        let _w = lock(&self.rx_watch);
        if self.closed.load(SeqCst) || self.rx_stopped.load(SeqCst) || self.rx_app_waits.load(SeqCst) {
            return;
        }
        self.rx_stamp_parked.store(false, Relaxed);
        if !self.rx_armed.swap(true, SeqCst) {
            let fd = self.backend.raw_fd();
            let r = if self.rx_detached.swap(false, SeqCst) {
                self.engine.epoll.add_readable_oneshot(fd, self.id)
            } else {
                self.engine.epoll.rearm(fd, self.id)
            };
            if let Err(e) = r {
                self.rx_armed.store(false, SeqCst);
                // ENOENT/EBADF: the endpoint is being closed; nothing to watch.
                if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EBADF)) {
                    eprintln!("eudp: cannot re-arm receive watch: {e}");
                }
            }
        }
    }

    #[inline]
    fn pop(
        &self,
        rs: &mut RecvSide,
        buf: &mut [u8],
        peek: bool,
        info: Option<&mut Option<PktInfo>>,
    ) -> Option<Received> {
        let d = rs.ring.pop_into(buf, peek, info)?;
        self.ring_len.0.store(rs.ring.datagrams(), Release);
        if !peek {
            self.trace.pop();
        }
        if rs.ring.is_empty() && (self.pending_error.load(Relaxed) == 0 || rs.err.is_some()) {
            rs.unsignal();
        }
        let src = d.src.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        Some(Received { copied: d.copied, len: d.len, src })
    }

    /// A receive: a datagram already in the ring is taken here, inlined into
    /// the caller (the shim), so its record is written where the caller
    /// keeps it; returned through a call it was copied again, and a copy of
    /// freshly written fields stalls on store forwarding. Everything else is
    /// [`EpInner::recv_wait`].
    #[inline]
    fn recv(&self, buf: &mut [u8], flags: RecvFlags, mut info: Option<&mut Option<PktInfo>>) -> io::Result<Received> {
        // Only this thread writes it: a plain load/store pair, no locked op.
        self.rx_calls.store(self.rx_calls.load(Relaxed).wrapping_add(1), Relaxed);
        {
            let mut rs = lock(&self.recv);
            if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                return Ok(r);
            }
        }
        self.recv_wait(buf, flags, info)
    }

    /// [`EpInner::recv`] once the ring was found empty.
    #[inline(never)]
    fn recv_wait(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        mut info: Option<&mut Option<PktInfo>>,
    ) -> io::Result<Received> {
        let nonblocking = flags.dont_wait || self.nonblocking.load(Relaxed);
        let mut deadline: Option<Option<Instant>> = None;
        let mut spin_until: Option<Instant> = None;
        // A receive that a signal must end with EINTR holds the signals
        // blocked from its first spinning look to its return, and waits
        // after the spin only in a `ppoll` that puts the caller's mask back
        // for the wait: a handler run between two looks (in user space)
        // would otherwise leave nothing for that wait to fail for, and the
        // receive would wait past the signal. Not sleeping inside the read
        // then (it would sleep through a pending signal).
        let mut signals: Option<crate::sys::process::AsyncSignalsBlocked> = None;
        // A timed receive sleeps inside the read at most once: that read
        // waits the socket's whole timeout, which is only right while
        // (almost) none of it has passed. Later waits take the remaining
        // time on the readiness path below.
        let mut timed_read_left = self.rx_timeout_in_socket.load(Relaxed);
        // Spin rounds that found nothing (latency profile).
        let mut spins: u32 = 0;
        // The ring was just found empty by `recv`.
        let mut looked = true;
        loop {
            if !std::mem::take(&mut looked) {
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    return Ok(r);
                }
            }
            if self.rx_stopped.load(Relaxed) {
                return Err(handed_over());
            }
            // Ring empty. A blocking receive without a timeout (and past its
            // spin) sleeps inside the read itself when it can.
            let dl = if nonblocking { None } else { *deadline.get_or_insert_with(|| self.deadline(false)) };
            let spinning = {
                let spin = self.engine.config.recv_spin;
                !spin.is_zero() && spin_until.is_none_or(|t| t > Instant::now())
            };
            if spinning && flags.interruptible && signals.is_none() {
                signals = Some(crate::sys::process::AsyncSignalsBlocked::new());
            }
            let timed = dl.is_some();
            let blocked =
                if nonblocking || spinning || signals.is_some() || (timed && !std::mem::take(&mut timed_read_left)) {
                    None
                } else {
                    // About to sleep in the read: what waits to be coalesced
                    // goes first (an answer to it may be what this waits for).
                    self.engine.send_coalesced_now();
                    self.block_in_read(flags.interruptible, timed)
                };
            match blocked {
                Some(Err(e)) => return Err(e),
                Some(Ok(())) => {}
                // Read the socket on this thread (no hop), unless the engine
                // is reading it right now — then its push will wake us.
                None => match self.rx_sock.try_lock() {
                    // Handed over while this thread got here: the socket is
                    // the owner's (and what the hand-over left, its own).
                    Ok(_g) if self.rx_stopped.load(Relaxed) => return Err(handed_over()),
                    Ok(_g) => {
                        Stats::add(&self.stats.direct_recv_calls, 1);
                        // Readiness is settled after this thread's pop below.
                        // A spin that found nothing looks for one message
                        // (`recvmsg`, the cheapest look): it waits for the
                        // next datagram, not a batch.
                        self.fill_on_caller(false, if spins > 0 { 1 } else { usize::MAX });
                    }
                    // The engine is reading the socket right now: wait for
                    // that read to land in the ring (one syscall) rather than
                    // report EAGAIN for data that is already on its way — a
                    // program told "readable" must not see EAGAIN. Unless
                    // another thread sleeps inside a read (it may have just
                    // taken the lock): what that read brings beyond its own
                    // datagram reaches the ring and wakes us.
                    Err(_) => loop {
                        if self.rx_blocked.load(SeqCst) || self.rx_sock.try_lock().is_ok() {
                            break;
                        }
                        std::thread::yield_now();
                    },
                },
            }
            let ready = {
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    if !rs.ring.is_empty() {
                        rs.signal();
                    }
                    return Ok(r);
                }
                if let Some(e) = self.take_pending_error() {
                    rs.unsignal();
                    if let Some(f) = &rs.err {
                        f.clear();
                    }
                    return Err(e);
                }
                if nonblocking {
                    return Err(err(libc::EAGAIN));
                }
                if self.rx_stopped.load(SeqCst) {
                    // Handed over since the loop's check: `stop_receiving`
                    // may have signalled before this thread's eventfd
                    // existed, and nothing else would wake it.
                    return Err(handed_over());
                }
                let now = Instant::now();
                if dl.is_some_and(|d| now >= d) {
                    return Err(err(libc::EAGAIN));
                }
                let spin = self.engine.config.recv_spin;
                if !spin.is_zero() && *spin_until.get_or_insert(now + spin) > now {
                    None
                } else {
                    Some((self.ready_fd(&mut rs)?.clone(), rs.err.clone(), now))
                }
            };
            let Some((ready, errs, now)) = ready else {
                // Polite spinning: on a machine with fewer cores than busy
                // threads the peer this receive waits for may need this
                // CPU, so it is given up regularly — but not after every
                // look, since a yield with nobody else to run still costs
                // a trip through the scheduler (about half a microsecond
                // on a VM), which used to double each look's cost.
                spins += 1;
                #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
                if spins % SPIN_YIELD_EVERY == 0 {
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
                continue;
            };
            let remaining = dl.map(|d| d - now);
            // Wake on data in the socket (we read it ourselves) or in the ring
            // (the engine got there first).
            self.engine.send_coalesced_now();
            self.rx_waiters.fetch_add(1, SeqCst);
            let fds = [self.backend.raw_fd(), ready.as_raw_fd(), errs.as_ref().map_or(-1, |f| f.as_raw_fd())];
            let r = match &signals {
                Some(b) => crate::sys::poll::poll_readable_or_shut_masked(&fds, remaining, b.mask_before()),
                None => crate::sys::poll::poll_readable_or_shut(&fds, remaining, flags.interruptible),
            };
            self.rx_waiters.fetch_sub(1, SeqCst);
            if r? {
                // The socket's reading side was shut down (shutdown(SHUT_RD)
                // on it): as on the kernel, a blocking receive returns what
                // is still queued, then an empty read, rather than waiting
                // on a socket that stays readable with nothing to read.
                if let Ok(_g) = self.rx_sock.try_lock() {
                    if !self.rx_stopped.load(Relaxed) {
                        self.fill_on_caller(false, usize::MAX);
                    }
                }
                let mut rs = lock(&self.recv);
                if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                    return Ok(r);
                }
                return Ok(Received { copied: 0, len: 0, src: SocketAddr::from(([0, 0, 0, 0], 0)) });
            }
        }
    }
}

/// What [`Endpoint::take_received`] moved out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Datagrams appended (from the ring and the socket).
    pub datagrams: usize,
    /// Bytes read from the socket (each datagram counting at least one).
    pub socket_bytes: usize,
    /// The last read found the socket empty.
    pub socket_empty: bool,
    /// The socket was left to a thread asleep inside its read, with nothing
    /// queued: what that read takes reaches the ring afterwards.
    pub reader_asleep: bool,
}

/// What one fill of the ring from the socket did.
#[derive(Clone, Copy, Debug)]
struct Fill {
    /// Datagrams added to the ring.
    added: usize,
    /// Every read came back full: the socket likely holds more.
    more: bool,
    /// Stopped because the ring had no room for another message.
    ring_full: bool,
}

/// What the engine did with a socket that had an arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxOutcome {
    /// Read, and the socket may still hold data: read again soon.
    More,
    /// Read dry; the watch is re-armed.
    Done,
    /// An application thread is receiving itself; the watch stays off.
    Parked,
}
