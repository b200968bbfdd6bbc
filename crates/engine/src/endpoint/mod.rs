//! Endpoints: the application's UDP sockets, served by the engine.
//!
//! Send: [`Endpoint::send_to`] posts directly on the caller's thread when the
//! two-level queue is idle, otherwise copies the datagram into L1 for the
//! engine to batch (see [`crate::queue`]). Receive: datagrams arrive in a
//! byte-bounded ring ([`crate::ring`]) filled by the engine with GRO; a
//! receive served from the ring costs no syscall, and when the ring is empty
//! the caller reads the socket itself before sleeping.
//!
//! This module holds the [`Endpoint`] type, its construction, addressing
//! and counters, and the state the engine and the application share
//! (`EpInner`); the rest is by concern:
//!
//! * `send` — the send calls on the caller's thread: direct post or L1, a
//!   full L1;
//! * `coalesce` — when queued sends go: the engine's timer, or a batch's
//!   worth sent by the caller's thread;
//! * `drain` — handing staged datagrams to the kernel in GSO batches, a full
//!   send buffer, flush;
//! * `fill` — reading the socket into the ring;
//! * `recv` — the receive calls and the ring's fast path;
//! * `wait` — a receive that finds the ring empty: spinning, sleeping,
//!   timeouts;
//! * `watch` — the engine's watch on a socket's input, and its hand-off to
//!   application threads;
//! * `readiness` — what poll, select and epoll see;
//! * `options` — socket options;
//! * `handover` — giving the socket's receive side back to its owner;
//! * `live_trace` — tracing started and stopped while endpoints are open;
//! * `served` — the endpoint as the engine thread sees it (the trait in
//!   `crate::serve`).

mod coalesce;
mod drain;
mod fill;
mod handover;
pub mod live_trace;
mod options;
mod readiness;
mod recv;
mod send;
mod served;
mod wait;
mod watch;

pub use handover::{is_handed_over, KeptDatagram, Taken};
use readiness::RecvSide;
pub use readiness::RingLen;

use crate::backend::kernel;
use crate::backend::Backend;
use crate::batch::GsoLimits;
use crate::engine::{Engine, Shared};
use crate::machine::{QueueEvent, QueueState};
use crate::queue::{L1Queue, Recorder, SendState};
use crate::ring::RecvRing;
use crate::serve::RX_BUF;
use crate::stats::{Stats, StatsSnapshot};
use crate::sys::sync::lock;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// `now + d`, or `None` when that is beyond what `Instant` can hold (a
/// timeout that large means "forever").
fn deadline_after(d: Duration) -> Option<Instant> {
    Instant::now().checked_add(d)
}

/// A deadline that never comes in practice (about 30 years away).
fn far_future() -> Instant {
    deadline_after(Duration::from_secs(1 << 30)).unwrap_or_else(Instant::now)
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
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
    room_watched: AtomicBool,
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
    closed: AtomicBool,
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

/// A UDP endpoint served by an eudp engine.
#[derive(Debug)]
pub struct Endpoint {
    inner: Arc<EpInner>,
    closed: FinalCounters,
}

/// Where a dropped endpoint leaves its final counters
/// ([`Endpoint::final_counters`]).
pub type FinalCounters = Arc<Mutex<Option<StatsSnapshot>>>;

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
        let trace = crate::tracepoint::EpTrace::new();
        trace.setup_socket(|level, name, val| backend.set_option(level, name, val));
        let v6 = backend.is_v6();
        let rcvbuf = backend.recv_buffer_size();
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
        inner.engine.register(&inner, inner.backend.raw_fd())?;
        Ok(Endpoint { inner, closed: FinalCounters::default() })
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

    fn family_addr(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let v6 = self.inner.backend.is_v6();
        if addr.is_ipv6() && !v6 {
            return Err(err(libc::EAFNOSUPPORT));
        }
        Ok(crate::sys::addr::to_family(addr, v6))
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
        if let Some(t) = self.inner.backend.transport_drops() {
            snap.drop_tcp_send = t.send;
            snap.drop_tcp_receive = t.receive;
            snap.drop_tcp_exit = t.exit;
        }
        snap
    }

    /// Filled with this endpoint's final counters when it is dropped: what
    /// the drop's own flush sent counted, what it could not send counted in
    /// `drop_shutdown`. For a caller that took the counters before the last
    /// reference went and must correct them.
    pub fn final_counters(&self) -> FinalCounters {
        self.closed.clone()
    }

    /// Datagrams waiting in the ring, unread.
    pub fn unread(&self) -> u64 {
        lock(&self.inner.recv).ring.datagrams() as u64
    }

    /// Queue transitions recorded so far (empty unless
    /// [`crate::Config::record_transitions`] is set).
    pub fn transitions(&self) -> Vec<(QueueEvent, QueueState)> {
        self.inner.recorder.as_ref().map(|r| lock(r).clone()).unwrap_or_default()
    }
}

impl EpInner {
    /// At the endpoint's drop: the socket is read no more, and what the
    /// ring holds is discarded unread; returns how many datagrams that is.
    /// A read of the socket in progress pushes what it took before the
    /// count (it holds `rx_sock`, and every read checks `rx_stopped` under
    /// it); one asleep in the socket (the shim's endpoint left to a
    /// borrower) is not waited for past a bound.
    fn stop_and_count_unread(&self) -> u64 {
        self.rx_stopped.store(true, SeqCst);
        let deadline = Instant::now() + Duration::from_millis(100);
        let _g = loop {
            match self.rx_sock.try_lock() {
                Ok(g) => break Some(g),
                Err(_) if self.rx_blocked.load(SeqCst) || Instant::now() >= deadline => break None,
                Err(_) => std::thread::yield_now(),
            }
        };
        let mut r = lock(&self.recv);
        let n = r.ring.datagrams() as u64;
        r.ring.clear();
        n
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
        Stats::add(&inner.stats.drop_close, inner.stop_and_count_unread());
        *lock(&self.closed) = Some(self.report());
        inner.closed.store(true, SeqCst);
        let room_fd = inner.backend.capabilities().writable_fd.filter(|_| inner.room_watched.load(SeqCst));
        inner.engine.deregister(inner.id, inner.backend.raw_fd(), room_fd);
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
