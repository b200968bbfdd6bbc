//! The engine thread: eudp's "NIC processor".
//!
//! One thread per [`Engine`] (one engine per process by default, see
//! [`Engine::global`]) does the work the application's thread would
//! otherwise do per packet: it reaps send completions, drains L1 queues into
//! GSO batches, and receives with GRO into each endpoint's ring. It sleeps in
//! `epoll_wait` when idle (or spins in busy-poll mode); application threads
//! ring a doorbell only when it sleeps.

use crate::backend::kernel::UdpSocket;
use crate::config::Config;
use crate::serve::{RecvScratch, RxOutcome, Served};
use crate::sys::epoll::Epoll;
use crate::sys::fdevents::{EventFd, TimerFd};
use crate::sys::process::pin_current_thread;
use crate::sys::sync::try_lock;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Relaxed, SeqCst},
};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Token of the doorbell in the engine's epoll set.
const DOORBELL: u64 = 0;
/// Token of the coalescing timer (endpoint tokens count up from 1).
const TIMER: u64 = u64::MAX;
/// Token of the set of sockets waiting for send room (`Shared::room`).
const ROOM: u64 = u64::MAX - 1;

thread_local! {
    /// The engine this thread runs (set by [`run`]), for [`others_waiting`].
    static CURRENT: std::cell::RefCell<Weak<Shared>> = const { std::cell::RefCell::new(Weak::new()) };
}

/// On an engine thread, whether other work waits for it
/// (`Shared::others_waiting`); `None` on any other thread. A backend whose
/// send was refused may wait for room on the engine thread only while
/// this is `Some(false)`, and briefly: the engine otherwise watches the
/// socket's room descriptor and goes on (see [`Shared::await_room`]).
pub(crate) fn others_waiting() -> Option<bool> {
    CURRENT.with(|c| c.borrow().upgrade()).map(|sh| sh.others_waiting())
}

/// Endpoints whose queued sends may wait, and the coalescing timer's
/// setting.
#[derive(Debug, Default)]
struct Coalescing {
    /// Each endpoint with the time its oldest queued datagram was queued.
    list: Vec<(Arc<dyn Served>, Instant)>,
    /// When the timer is set to fire (`None`: never set, or fired since).
    armed: Option<Instant>,
}

impl Coalescing {
    /// The listed endpoints, to visit after the list's lock is let go.
    fn endpoints(&self) -> Vec<Arc<dyn Served>> {
        self.list.iter().map(|(e, _)| e.clone()).collect()
    }
}

/// The engine's receive-side lists of endpoints. Shared, not local to the
/// engine thread, so that a closing endpoint can take itself off them (see
/// [`Shared::forget`]).
#[derive(Debug, Default)]
struct RxLists {
    /// Endpoints whose socket may still hold data after a bounded read.
    more: Vec<Arc<dyn Served>>,
    /// Endpoints whose application thread is receiving itself: the engine
    /// stays off their socket until the thread has been away for a handoff
    /// interval (see `EpInner::engine_receive`). Each is looked at when its
    /// [`ParkCheck`] is due.
    parked: Vec<(Arc<dyn Served>, ParkCheck)>,
}

/// When a parked endpoint is looked at next. A look that finds its
/// application waiting in a receive of the socket and nothing received
/// since the last look doubles the interval, up to [`PARK_BACKOFF_MAX`]
/// handoff intervals: a program asleep in `recv` for minutes no longer
/// wakes the engine every handoff interval (about 1 000 times a second
/// with the default 1 ms). A look that finds receives since the last one
/// goes back to one interval: growing it for an active ping-pong was tried
/// and cost its p50 on hosts where the 1 ms wake-up keeps the vCPUs
/// responsive (docs/preload.md, "The parked check's interval"). The price
/// of the growth: a program that wakes after a long sleep in `recv` and
/// then leaves is noticed up to that many intervals later, and its
/// arrivals wait in the kernel socket meanwhile, as they would without
/// the engine. Traced senders parked for their TX stamps keep their interval
/// (their checks drain the kernel's transmit stamps).
#[derive(Clone, Copy, Debug)]
struct ParkCheck {
    due: std::time::Instant,
    /// The interval in handoff intervals.
    every: u32,
}

/// Largest interval between two looks at a parked endpoint whose
/// application stays, in handoff intervals (32 ms with the default 1 ms).
const PARK_BACKOFF_MAX: u32 = 32;

impl ParkCheck {
    /// A newly parked endpoint: looked at after one handoff interval (or
    /// DETACHED_CHECK of them for a traced sender parked for its stamps).
    fn new(ep: &dyn Served, handoff: Duration, now: std::time::Instant) -> ParkCheck {
        let every = if ep.rx_stamp_parked() { DETACHED_CHECK } else { 1 };
        ParkCheck { due: now + handoff * every, every }
    }

    /// Looked at and still parked: `receiving` (receive calls since the
    /// last look) keeps one interval; a receiver asleep all along, twice
    /// the last one.
    fn stayed(&mut self, ep: &dyn Served, receiving: bool, handoff: Duration, now: std::time::Instant) {
        self.every = if ep.rx_stamp_parked() {
            DETACHED_CHECK
        } else if receiving {
            1
        } else {
            (self.every * 2).min(PARK_BACKOFF_MAX)
        };
        self.due = now + handoff * self.every;
    }
}

/// State shared between the engine thread and application threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    work: Mutex<VecDeque<Arc<dyn Served>>>,
    /// Endpoints whose queued sends may wait up to `config.tx_coalesce`:
    /// the engine sends what is left of their L1 when that time is up,
    /// unless their own thread did first.
    coalescing: Mutex<Coalescing>,
    /// Length of `coalescing.list`, kept beside it for a lock-free look
    /// ([`Shared::send_coalesced_now`] runs before every sleep).
    coalescing_len: AtomicUsize,
    /// Remainders sent early because a program's thread went to sleep.
    pub(crate) sleep_flushes: AtomicU64,
    /// A thread about to sleep that found a lock held (the list's, or an
    /// endpoint's send lock) leaves its remainders to the engine: its
    /// thread token, `u64::MAX` for several threads, 0 for none.
    flush_for: AtomicU64,
    rx: Mutex<RxLists>,
    /// Fires when the earliest of those is due, or earlier (see
    /// [`Shared::set_timer`]): a streaming sender whose own thread sends
    /// every batch has the engine woken at most once per interval.
    timer: TimerFd,
    sleeping: AtomicBool,
    stop: AtomicBool,
    stopped: AtomicBool,
    doorbell: EventFd,
    pub(crate) epoll: Epoll,
    /// Sockets whose send buffer refused the engine's batch, watched once
    /// for writability each (tokens are endpoint ids); itself in `epoll`
    /// under [`ROOM`]. A separate set, so the watch leaves the receive
    /// side's one-shot registration of the same socket alone.
    room: Epoll,
    endpoints: Mutex<HashMap<u64, Weak<dyn Served>>>,
    next_id: AtomicU64,
    /// Engine thread wake-ups (diagnostics).
    pub(crate) wakeups: AtomicU64,
    /// Looks at parked endpoints (see [`ParkCheck`]).
    park_looks: AtomicU64,
    /// Coalescing timer settings (`timerfd_settime` calls; diagnostics).
    pub(crate) timer_sets: AtomicU64,
    /// Wake-ups on a traced socket that found TX stamps and no data.
    pub(crate) stamp_wakes: AtomicU64,
    /// The engine's own GRO socket holding the kernel's static keys on
    /// (`Config::gro_hold`, [`Shared::hold_gro_key`]); closed with the
    /// engine, or at once by [`Engine::release_gro_hold`].
    gro_hold: Mutex<Option<UdpSocket>>,
    /// The holder was opened or tried once: it is never opened again.
    gro_hold_tried: AtomicBool,
}

impl Shared {
    /// Puts an endpoint on the work list and wakes the engine if it sleeps.
    /// Callers set the endpoint's `scheduled` flag first so an endpoint is
    /// listed at most once.
    pub(crate) fn schedule(&self, ep: Arc<dyn Served>) {
        self.work.lock().unwrap_or_else(|e| e.into_inner()).push_back(ep);
        if self.sleeping.load(SeqCst) {
            self.doorbell.set();
        }
    }

    /// Lists an endpoint whose oldest queued datagram was queued at `since`
    /// and may wait up to `config.tx_coalesce`, or moves its time forward
    /// when it is listed already (its own thread sent what was queued
    /// before). The timer follows the earliest listing.
    pub(crate) fn schedule_coalesced<E: Served + 'static>(&self, ep: &Arc<E>, since: Instant) {
        let mut c = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        // (The same endpoint is the same allocation: no call through the
        // listed endpoints on this path of every queued send.)
        match c.list.iter_mut().find(|(e, _)| std::ptr::addr_eq(Arc::as_ptr(e), Arc::as_ptr(ep))) {
            Some(entry) => entry.1 = entry.1.max(since),
            None => c.list.push((ep.clone(), since)),
        }
        self.coalescing_len.store(c.list.len(), Relaxed);
        self.set_timer(&mut c);
    }

    /// An application thread is about to sleep (in a blocking receive, or
    /// in `poll`, `select` or `epoll_wait` with nothing ready): every
    /// remainder it queued that waits out its coalescing interval is sent
    /// now (see
    /// [`Served::send_remainder_now`]). The interval exists so that a
    /// streaming sender's next datagrams join the batch; a thread that goes
    /// to sleep sends none, and a program that sent a burst and now waits
    /// for the answers would otherwise wait the interval for its last
    /// datagrams to leave. One relaxed load when nothing waits; never on an
    /// engine thread, and never waits for a lock. Returns how many
    /// endpoints sent or asked the engine.
    pub(crate) fn send_coalesced_now(&self) -> usize {
        // (`try_with`: a thread past its thread-locals' end — a program's
        // destructor that polls — counts as an engine thread and skips.)
        if self.coalescing_len.load(Relaxed) == 0 || CURRENT.try_with(|c| c.borrow().strong_count() > 0).unwrap_or(true)
        {
            return 0;
        }
        // A lock another thread holds (the engine looking at the list or
        // sending, a call in a send path; held longer when that thread is
        // preempted) must not leave the remainder to its interval: the
        // engine is asked to send it instead.
        let Some(c) = try_lock(&self.coalescing) else {
            self.ask_engine_flush();
            return 0;
        };
        let eps = c.endpoints();
        drop(c);
        let mut sent = 0;
        let mut held = false;
        for ep in eps {
            match ep.send_remainder_now() {
                Some(true) => sent += 1,
                Some(false) => {}
                None => held = true,
            }
        }
        self.sleep_flushes.fetch_add(sent as u64, Relaxed);
        if held {
            self.ask_engine_flush();
        }
        sent
    }

    /// Has the engine send, on its next turn, the remainders this thread
    /// queued ([`Shared::send_flushes_asked`]).
    fn ask_engine_flush(&self) {
        let me = crate::queue::thread_token();
        if me == 0 {
            return;
        }
        if let Err(other) = self.flush_for.compare_exchange(0, me, SeqCst, SeqCst) {
            if other != me {
                self.flush_for.store(u64::MAX, SeqCst);
            }
        }
        self.doorbell.set();
    }

    /// On the engine thread: sends the remainders of the threads that
    /// asked ([`Shared::ask_engine_flush`]) before their interval is up.
    /// (Their listings stay: a listing whose L1 was sent finds nothing.)
    fn send_flushes_asked(&self, staging: &mut crate::queue::L1Queue) {
        // A load first: a swap on every turn would dirty a line the
        // application threads read.
        if self.flush_for.load(Relaxed) == 0 {
            return;
        }
        let token = self.flush_for.swap(0, SeqCst);
        let eps = self.coalescing.lock().unwrap_or_else(|e| e.into_inner()).endpoints();
        for ep in eps {
            if ep.remainder_of(token) {
                self.sleep_flushes.fetch_add(1, Relaxed);
                ep.service_send(staging);
            }
        }
    }

    /// Sets the timer to the earliest listing's due time when that is
    /// earlier than its setting (or it is not set). A later due time leaves
    /// it as set: it then fires early, once, and the engine sets it for what
    /// is due. Moving it on every batch cost a streaming sender one
    /// `timerfd_settime` per batch, and on the test VM one that makes the
    /// timer the CPU's next event costs 15–27 µs (the clock event is
    /// reprogrammed), against 0.5 µs for one past the next tick: iperf3's
    /// sender spent ~290 ns per 1472 B datagram on it (docs/preload.md).
    fn set_timer(&self, c: &mut Coalescing) {
        let due = c.list.iter().map(|(_, since)| *since).min().map(|t| t + self.config.tx_coalesce);
        if let Some(d) = due.filter(|d| c.armed.is_none_or(|a| *d < a)) {
            c.armed = Some(d);
            self.timer_sets.fetch_add(1, SeqCst);
            self.timer.set(Some(d.saturating_duration_since(Instant::now())));
        }
    }

    /// Services the coalescing endpoints whose time is up, then sets the
    /// timer for the rest. `fired`: the timer expired (it is disarmed now).
    fn service_coalesced(&self, staging: &mut crate::queue::L1Queue, fired: bool) {
        let wait = self.config.tx_coalesce;
        let now = Instant::now();
        let due: Vec<Arc<dyn Served>> = {
            let mut c = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
            if fired {
                c.armed = None;
            }
            let mut due = Vec::new();
            c.list.retain(|(ep, since)| {
                if now.duration_since(*since) >= wait {
                    due.push(ep.clone());
                    false
                } else {
                    true
                }
            });
            self.coalescing_len.store(c.list.len(), Relaxed);
            if due.is_empty() {
                self.set_timer(&mut c);
                return;
            }
            due
        };
        // (A listing is never older than L1's oldest datagram: the sending
        // thread moves it forward when it queues after sending L1 itself.)
        for ep in due {
            ep.service_send(staging);
        }
        let mut c = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        self.set_timer(&mut c);
    }

    /// Lists `ep`, whose socket is `fd`, and watches the socket for input.
    pub(crate) fn register<E: Served + 'static>(&self, ep: &Arc<E>, fd: std::os::fd::RawFd) -> io::Result<()> {
        let weak = Arc::downgrade(ep);
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).insert(ep.id(), weak);
        // One-shot: after a report the watch stays off until re-armed — by
        // the engine once it has read the socket dry, or by an application
        // thread that was blocked on the socket itself (then the engine is
        // not woken for arrivals that thread will read).
        self.epoll.add_readable_oneshot(fd, ep.id())
    }

    /// Has the engine service endpoint `id`'s send side again once `fd`
    /// (its [`crate::backend::Capabilities::writable_fd`]) has room: the
    /// engine thread never waits for one socket while others have work.
    /// `rearm`: `fd` is in the room set already.
    pub(crate) fn await_room(&self, id: u64, fd: std::os::fd::RawFd, rearm: bool) -> io::Result<()> {
        match self.room.watch_writable_once(fd, id, rearm) {
            Err(e) if !rearm && e.raw_os_error() == Some(libc::EEXIST) => self.room.watch_writable_once(fd, id, true),
            r => r,
        }
    }

    /// Whether anything besides the send in hand waits for this engine: a
    /// kicked endpoint, or a descriptor ready in its epoll set (looked at
    /// with `poll`, so a one-shot watch is not used up).
    fn others_waiting(&self) -> bool {
        !self.work.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
            || crate::sys::poll::poll_readable(&[std::os::fd::AsRawFd::as_raw_fd(&self.epoll)], Some(Duration::ZERO))
                .unwrap_or(true)
    }

    /// Takes endpoint `id` off the map and its socket `fd` out of the
    /// epoll sets; `room_fd`: the descriptor it has in the room set.
    pub(crate) fn deregister(&self, id: u64, fd: std::os::fd::RawFd, room_fd: Option<std::os::fd::RawFd>) {
        let _ = self.epoll.remove(fd);
        if let Some(fd) = room_fd {
            let _ = self.room.remove(fd);
        }
        self.endpoints.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }

    /// Takes a closing endpoint off the work, coalescing and receive lists,
    /// the only places the engine keeps it between turns: once the engine
    /// is not in the middle of a call on it, the closer holds the last
    /// reference and the kernel socket closes with it, without waiting for
    /// the engine's next turn (up to the coalescing interval after a send).
    /// Nothing can take a new reference after that: the endpoint map holds
    /// weak ones and the endpoint left it first.
    pub(crate) fn forget(&self, id: u64) {
        self.work.lock().unwrap_or_else(|e| e.into_inner()).retain(|e| e.id() != id);
        {
            let mut rx = self.rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.more.retain(|e| e.id() != id);
            rx.parked.retain(|(e, _)| e.id() != id);
        }
        // The timer is left as it is: disarming it cost the closer 11–16 µs
        // (measured); a timer that fires with nothing due costs the engine
        // one turn, which it took for this endpoint before anyway.
        let mut c = self.coalescing.lock().unwrap_or_else(|e| e.into_inner());
        c.list.retain(|(e, _)| e.id() != id);
        self.coalescing_len.store(c.list.len(), Relaxed);
    }

    /// Opens the engine's GRO key holder ([`UdpSocket::gro_key_holder`])
    /// the first time a kernel UDP endpoint is made, when `gro` and
    /// `gro_hold` are on; after that a load. Opened on the first endpoint
    /// rather than at start, so that an engine serving no kernel UDP socket
    /// (the tcp transport) leaves the kernel's keys alone. A failure (no
    /// descriptor left in the shim's budget, no GRO in the kernel) leaves
    /// sockets to raise the keys themselves, as without the setting.
    pub(crate) fn hold_gro_key(self: &Arc<Self>) {
        if !self.config.gro || !self.config.gro_hold || self.gro_hold_tried.load(Relaxed) {
            return;
        }
        {
            let mut h = self.gro_hold.lock().unwrap_or_else(|e| e.into_inner());
            if self.gro_hold_tried.swap(true, SeqCst) || GRO_HOLD_OFF.load(SeqCst) {
                return;
            }
            *h = UdpSocket::gro_key_holder().ok();
            if h.is_none() {
                return;
            }
        }
        let mut all = GRO_HOLDERS.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(self));
        drop(all);
        // (A release of all holders that ran meanwhile did not see this one.)
        if GRO_HOLD_OFF.load(SeqCst) {
            self.gro_hold.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
    }

    pub(crate) fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, SeqCst)
    }

    /// True once the engine thread has exited; endpoints then post directly.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stopped.load(SeqCst)
    }
}

/// Handle to an engine and its thread. Dropping it flushes every endpoint
/// and stops the thread.
#[derive(Debug)]
pub struct Engine {
    pub(crate) shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

static GLOBAL: OnceLock<Result<Engine, i32>> = OnceLock::new();

/// Engines that opened a GRO key holder, for [`Engine::release_gro_holds`].
static GRO_HOLDERS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
/// Set by [`Engine::release_gro_holds`]: no holder is opened any more.
static GRO_HOLD_OFF: AtomicBool = AtomicBool::new(false);

impl Engine {
    /// Starts an engine thread with the given settings.
    pub fn start(config: Config) -> io::Result<Engine> {
        let shared = Arc::new(Shared {
            config,
            work: Mutex::new(VecDeque::new()),
            coalescing: Mutex::new(Coalescing::default()),
            coalescing_len: AtomicUsize::new(0),
            sleep_flushes: AtomicU64::new(0),
            flush_for: AtomicU64::new(0),
            rx: Mutex::new(RxLists::default()),
            timer: TimerFd::new()?,
            sleeping: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            doorbell: EventFd::new()?,
            epoll: Epoll::new()?,
            room: Epoll::new()?,
            endpoints: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            wakeups: AtomicU64::new(0),
            park_looks: AtomicU64::new(0),
            timer_sets: AtomicU64::new(0),
            stamp_wakes: AtomicU64::new(0),
            gro_hold: Mutex::new(None),
            gro_hold_tried: AtomicBool::new(false),
        });
        shared.epoll.add_readable(std::os::fd::AsRawFd::as_raw_fd(&shared.doorbell), DOORBELL)?;
        shared.epoll.add_readable(std::os::fd::AsRawFd::as_raw_fd(&shared.timer), TIMER)?;
        shared.epoll.add_readable(std::os::fd::AsRawFd::as_raw_fd(&shared.room), ROOM)?;
        let s2 = shared.clone();
        let thread = std::thread::Builder::new().name("eudp-engine".into()).spawn(move || {
            crate::sys::process::block_async_signals();
            let sh = s2.clone();
            if crate::failure::contain_thread("eudp engine", move || run(s2)) {
                // Endpoints post directly from now on and stop waiting for it.
                sh.stopped.store(true, SeqCst);
            }
        })?;
        Ok(Engine { shared, thread: Mutex::new(Some(thread)) })
    }

    /// The process-wide engine, started on first use with settings from the
    /// `EUDP_*` environment (see [`Config::from_env`]). Invalid variables are
    /// reported on stderr once and replaced by defaults.
    pub fn global() -> io::Result<&'static Engine> {
        let r = GLOBAL.get_or_init(|| {
            let cfg = Config::from_env().unwrap_or_else(|e| {
                crate::log::write(crate::log::Level::Warn, format_args!("{e}; using defaults"));
                Config::default()
            });
            Engine::start(cfg).map_err(|e| e.raw_os_error().unwrap_or(libc::EAGAIN))
        });
        r.as_ref().map_err(|&code| io::Error::from_raw_os_error(code))
    }

    /// The engine's settings.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// The descriptor of the engine's GRO key holder while it holds one
    /// (see `Config::gro_hold`).
    pub fn gro_key_holder_fd(&self) -> Option<std::os::fd::RawFd> {
        self.shared.gro_hold.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(std::os::fd::AsRawFd::as_raw_fd)
    }

    /// Whether the holder is open with `UDP_GRO` on, i.e. holding the
    /// kernel's keys.
    pub fn gro_key_held(&self) -> bool {
        self.shared.gro_hold.lock().unwrap_or_else(|e| e.into_inner()).as_ref().is_some_and(UdpSocket::gro_enabled)
    }

    /// Closes the GRO key holder, for good. Returns whether one was open.
    pub fn release_gro_hold(&self) -> bool {
        self.shared.gro_hold_tried.store(true, SeqCst);
        self.shared.gro_hold.lock().unwrap_or_else(|e| e.into_inner()).take().is_some()
    }

    /// Closes every engine's GRO key holder in this process, and no engine
    /// opens one from then on: the preload shim gives the descriptor
    /// numbers back when the program needs the numbers below its limit.
    /// Returns how many were open.
    pub fn release_gro_holds() -> usize {
        GRO_HOLD_OFF.store(true, SeqCst);
        let all: Vec<Arc<Shared>> =
            GRO_HOLDERS.lock().unwrap_or_else(|e| e.into_inner()).drain(..).filter_map(|w| w.upgrade()).collect();
        all.iter().filter(|sh| sh.gro_hold.lock().unwrap_or_else(|e| e.into_inner()).take().is_some()).count()
    }

    /// Times the engine thread woke from sleep.
    pub fn wakeups(&self) -> u64 {
        self.shared.wakeups.load(SeqCst)
    }

    /// Times the engine looked at a parked endpoint to see whether its
    /// application had stopped receiving.
    pub fn park_looks(&self) -> u64 {
        self.shared.park_looks.load(SeqCst)
    }

    /// The calling thread is about to sleep: sends every remainder it
    /// queued that waits out its coalescing interval now (see `EUDP_TX_COALESCE_US`),
    /// on this thread where it can. The engine's own blocking receive calls
    /// it; a program or shim that sleeps elsewhere (`poll`, `select`,
    /// `epoll_wait`) calls it before sleeping. Costs one atomic load when
    /// nothing waits. Returns how many endpoints had a remainder sent.
    pub fn send_coalesced_now(&self) -> usize {
        self.shared.send_coalesced_now()
    }

    /// Whether some endpoint's queued sends wait out a coalescing interval
    /// (a lock-free look; [`Engine::send_coalesced_now`] would send them).
    pub fn coalesced_pending(&self) -> bool {
        self.shared.coalescing_len.load(Relaxed) > 0
    }

    /// Remainders sent early by [`Engine::send_coalesced_now`].
    pub fn sleep_flushes(&self) -> u64 {
        self.shared.sleep_flushes.load(Relaxed)
    }

    /// Times the coalescing timer was set (each a `timerfd_settime`).
    pub fn timer_sets(&self) -> u64 {
        self.shared.timer_sets.load(SeqCst)
    }

    /// Times the engine's watch on a traced socket reported only TX
    /// timestamps (no data) — the watch is then taken off that socket.
    pub fn stamp_wakes(&self) -> u64 {
        self.shared.stamp_wakes.load(SeqCst)
    }

    /// Flushes every endpoint's queues (waiting up to `timeout`) and stops the
    /// thread. Endpoints that outlive the engine send directly afterwards.
    pub fn shutdown(&self, timeout: Duration) {
        let eps: Vec<Arc<dyn Served>> = {
            let m = self.shared.endpoints.lock().unwrap_or_else(|e| e.into_inner());
            m.values().filter_map(Weak::upgrade).collect()
        };
        let deadline =
            Instant::now().checked_add(timeout).unwrap_or_else(|| Instant::now() + Duration::from_secs(1 << 30));
        for ep in eps {
            ep.flush(deadline);
        }
        self.shared.stop.store(true, SeqCst);
        self.shared.doorbell.set();
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.shutdown(Duration::from_secs(5));
    }
}

/// Traced sending sockets parked for their TX stamps (see
/// `EpInner::engine_receive`) are checked this many handoff intervals apart.
const DETACHED_CHECK: u32 = 4;

/// How long the engine may sleep before a parked endpoint is due a look.
fn next_park_check(parked: &[(Arc<dyn Served>, ParkCheck)]) -> Option<Duration> {
    let now = std::time::Instant::now();
    parked.iter().map(|(_, c)| c.due.saturating_duration_since(now)).min()
}

/// The engine thread's main loop.
fn run(sh: Arc<Shared>) {
    if let Some(cpu) = sh.config.cpu {
        if let Err(e) = pin_current_thread(cpu) {
            crate::log::write(crate::log::Level::Warn, format_args!("cannot pin the engine to CPU {cpu}: {e}"));
        }
    }
    crate::tracepoint::init_from_env();
    crate::tracepoint::prepare_thread();
    CURRENT.with(|c| *c.borrow_mut() = Arc::downgrade(&sh));
    let mut scratch = RecvScratch::new(sh.config.max_msgs);
    let mut staging = crate::queue::L1Queue::default();
    let mut ready: Vec<u64> = Vec::with_capacity(64);
    let mut room_ready: Vec<u64> = Vec::with_capacity(64);
    let mut more_next: Vec<Arc<dyn Served>> = Vec::new();
    let mut parked_next: Vec<Arc<dyn Served>> = Vec::new();
    let handoff = sh.config.rx_handoff;
    let mut timer_fired = false;
    loop {
        crate::testpanic::point("engine", "");
        // Send side: every endpoint that asked for service.
        loop {
            let next = sh.work.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            match next {
                Some(ep) => ep.service_send(&mut staging),
                None => break,
            }
        }
        if sh.stop.load(SeqCst) {
            break;
        }
        sh.send_flushes_asked(&mut staging);
        sh.service_coalesced(&mut staging, std::mem::take(&mut timer_fired));
        // Receive side, and sleep when idle (the coalescing timer is in the
        // epoll set).
        let timeout = if sh.config.busy_poll {
            Some(Duration::ZERO)
        } else {
            sh.sleeping.store(true, SeqCst);
            let rx = sh.rx.lock().unwrap_or_else(|e| e.into_inner());
            if !rx.more.is_empty() || !sh.work.lock().unwrap_or_else(|e| e.into_inner()).is_empty() {
                Some(Duration::ZERO)
            } else if !rx.parked.is_empty() {
                next_park_check(&rx.parked)
            } else {
                None
            }
        };
        let r = sh.epoll.wait(&mut ready, timeout);
        if sh.config.busy_poll && matches!(r, Ok(())) && ready.is_empty() {
            // A spinning engine that never gives up its CPU keeps a woken
            // application thread off it until the next preemption (~2 ms a
            // message on 2 cores: tests/busy_poll.rs).
            std::thread::yield_now();
        }
        if sh.sleeping.swap(false, SeqCst) && timeout.is_none() {
            sh.wakeups.fetch_add(1, SeqCst);
        }
        if let Err(e) = r {
            crate::log::write(crate::log::Level::Error, format_args!("engine epoll_wait failed: {e}"));
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        // Let go of endpoints the application has dropped.
        let mut todo = {
            let mut rx = sh.rx.lock().unwrap_or_else(|e| e.into_inner());
            rx.parked.retain(|(ep, _)| !ep.is_closed());
            std::mem::take(&mut rx.more)
        };
        todo.retain(|ep| !ep.is_closed());
        for &tok in &ready {
            if tok == DOORBELL {
                sh.doorbell.clear();
                continue;
            }
            if tok == TIMER {
                sh.timer.clear();
                timer_fired = true;
                continue;
            }
            if tok == ROOM {
                // Sockets with send room again (their endpoints are still
                // marked scheduled): serviced at once, as a sender blocked
                // on the socket would be woken.
                if sh.room.wait(&mut room_ready, Some(Duration::ZERO)).is_ok() {
                    for &id in &room_ready {
                        let ep =
                            sh.endpoints.lock().unwrap_or_else(|e| e.into_inner()).get(&id).and_then(Weak::upgrade);
                        if let Some(ep) = ep {
                            ep.resume_send(&mut staging);
                        }
                    }
                }
                continue;
            }
            let ep = sh.endpoints.lock().unwrap_or_else(|e| e.into_inner()).get(&tok).and_then(Weak::upgrade);
            if let Some(ep) = ep {
                if !todo.iter().any(|e| e.id() == tok) {
                    todo.push(ep);
                }
            }
        }
        for ep in todo {
            match ep.engine_receive(&mut scratch) {
                RxOutcome::More => more_next.push(ep),
                RxOutcome::Done => {}
                RxOutcome::Parked => parked_next.push(ep),
            }
        }
        let mut rx = sh.rx.lock().unwrap_or_else(|e| e.into_inner());
        // (An endpoint closed meanwhile is not listed again: its closer
        // waits for these references to go.)
        rx.more.extend(more_next.drain(..).filter(|ep| !ep.is_closed()));
        // (No clock read on a turn without parked endpoints.)
        if !parked_next.is_empty() || !rx.parked.is_empty() {
            let now = std::time::Instant::now();
            for ep in parked_next.drain(..) {
                if !ep.is_closed() && !rx.parked.iter().any(|(e, _)| e.id() == ep.id()) {
                    let c = ParkCheck::new(&*ep, handoff, now);
                    rx.parked.push((ep, c));
                }
            }
            // Re-arm the endpoints whose application stopped receiving; the
            // others are looked at again later.
            rx.parked.retain_mut(|(ep, c)| {
                if c.due > now {
                    return true;
                }
                sh.park_looks.fetch_add(1, Relaxed);
                let seen = ep.rx_calls_seen();
                if ep.rx_idle_since_last_look() {
                    return false;
                }
                c.stayed(&**ep, ep.rx_calls_seen() != seen, handoff, now);
                true
            });
        }
        drop(rx);
    }
    sh.stopped.store(true, SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread that queued a remainder goes to sleep while another
    /// thread holds the coalescing list (as the engine does when it looks
    /// at it, for longer when it is preempted there): the engine sends the
    /// remainder at once instead of when its 3 s interval is up.
    #[test]
    fn a_sleep_that_finds_the_list_held_has_the_engine_send_the_remainder() {
        let engine = Engine::start(Config { tx_coalesce: Duration::from_secs(3), ..Config::default() }).unwrap();
        let ep = crate::Endpoint::with_engine(&engine, false).unwrap();
        ep.bind_to("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_send_buffer_size(1 << 20).unwrap();
        let rx = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        let to = rx.local_addr().unwrap();
        for i in 0..100u8 {
            ep.send_to(&[i; 100], to).unwrap();
        }
        assert!(ep.stats().datagrams_sent < 100, "nothing left to coalesce: the case tests nothing");
        let start = Instant::now();
        {
            let _held = engine.shared.coalescing.lock().unwrap();
            assert_eq!(engine.send_coalesced_now(), 0, "the list is held: nothing sent on this thread");
        }
        let mut buf = [0u8; 200];
        for i in 0..100u8 {
            let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {i}: {e}"));
            assert_eq!((n, buf[0]), (100, i));
        }
        assert!(start.elapsed() < Duration::from_secs(1), "the remainder waited {:?}", start.elapsed());
        assert_eq!(ep.stats().sleep_flushes, 1);
        assert_eq!(engine.sleep_flushes(), 1);
    }
}
