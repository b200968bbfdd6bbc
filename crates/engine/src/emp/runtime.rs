//! The rounds of an EMP endpoint in the base scheme: one round runs all
//! seven steps of [`crate::emp::stages`] — commands, receive, timers,
//! acknowledgments and transmission, completions. The engine thread
//! ([`drive`]) runs rounds and sleeps in epoll until a frame, a command or
//! the earliest flow timer is due; an application thread that sends or
//! waits runs a round itself when no one else is, so that a message does
//! not wait for the engine thread to wake.

use crate::backend::kernel::{InMeta, UdpSocket};
use crate::emp::completion::Completion;
use crate::emp::counters::EmpCounters;
use crate::emp::handoff::Handoff;
use crate::emp::lease::CHECK;
use crate::emp::peer::PeerId;
use crate::emp::scheme::{Stage, StageSet};
use crate::emp::shared::{Command, PeerLink, Shared};
use crate::emp::stages::{self, Incoming, RecvSide, SendSide};
use crate::emp::transmit::TxBatch;
use crate::sys::epoll::{Epoll, EDGE, EV_IN};
use crate::sys::poll::poll_writable;
use crate::sys::sync::{lock, try_lock};
use eudp_wire::emp::Data;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Epoll flag: of the waiters on one socket, wake one per event (the
/// engine thread or an application thread waiting for completions).
pub const EV_EXCLUSIVE: u32 = libc::EPOLLEXCLUSIVE as u32;
/// While the socket's buffer is full, the engine retries this often.
const BLOCKED_RETRY: Duration = Duration::from_micros(200);

pub mod staged;

const SOCKET: u64 = 0;
const DOORBELL: u64 = 1;
const TIMER: u64 = 2;
/// Receive buffers per `recvmmsg`; each holds a GRO super-packet.
const RX_BATCH: usize = 32;
const RX_BUF: usize = 65_536;
/// Frames per transmit batch.
const TX_BATCH: usize = 128;
/// Receive batches per round before the round moves on to transmission.
const RX_ROUNDS: usize = 8;

/// The engine thread's state.
#[derive(Debug)]
pub struct Runtime {
    shared: Arc<Shared>,
    sock: Arc<UdpSocket>,
    send: SendSide,
    recv: RecvSide,
    tx: TxBatch,
    gso: bool,
    /// The socket's buffer was full: transmission waits for writability.
    blocked: bool,
    rx_bufs: Vec<Vec<u8>>,
    rx_meta: Vec<InMeta>,
    commands: Vec<Command>,
    done: Vec<Completion>,
    unsent: Vec<(PeerId, u32)>,
    /// When the engine thread wakes next by itself (`None`: only on an event).
    planned: Option<Instant>,
    /// When the timer descriptor, armed by a round of another thread,
    /// fires.
    armed: Option<Instant>,
    /// Frames between the stages of two engine threads (two-thread schemes).
    handoff: Handoff,
    /// The earliest flow timer as of the end of the last round: nothing
    /// outside a round changes the timers.
    next_timer: Option<Instant>,
}

/// What a round leaves: more to do at once, or the next timer.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub busy: bool,
    pub wake_at: Option<Instant>,
}

impl Runtime {
    /// The thread's state over a bound socket.
    pub fn new(shared: Arc<Shared>, sock: UdpSocket, cfg: &crate::emp::config::EmpConfig) -> io::Result<Self> {
        let cfg = cfg.normalised();
        let gso = sock.probe_gso();
        sock.enable_gro();
        Ok(Runtime {
            send: SendSide::new(&cfg),
            recv: RecvSide::new(&cfg),
            tx: TxBatch::new(eudp_wire::emp::DATA_HEADER_LEN + cfg.frame_payload, TX_BATCH),
            shared,
            sock: Arc::new(sock),
            gso,
            blocked: false,
            rx_bufs: vec![vec![0; RX_BUF]; RX_BATCH],
            rx_meta: vec![InMeta::default(); RX_BATCH],
            commands: Vec::new(),
            done: Vec::new(),
            unsent: Vec::new(),
            planned: None,
            armed: None,
            handoff: Handoff::default(),
            next_timer: None,
        })
    }

    /// The socket, for the waiters' epoll sets.
    pub fn socket_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// The socket, for a waiter that receives on it outside the lock.
    pub fn socket(&self) -> Arc<UdpSocket> {
        self.sock.clone()
    }

    /// When the next flow timer (retransmission, deadline, parked
    /// acknowledgment) is due.
    pub fn next_timer(&self) -> Option<Instant> {
        self.next_timer
    }

    /// A round at `now` for the first `n` messages of `bufs`, which a
    /// waiter received on the socket outside the lock: their steps, then
    /// the rest of a round, which reads the socket again only when the
    /// batch was full (more may wait).
    pub fn round_received(&mut self, now: Instant, bufs: &[Vec<u8>], meta: &[InMeta], n: usize) -> Round {
        self.take_commands(now);
        for (buf, &m) in bufs.iter().zip(meta).take(n) {
            let Some(src) = m.src else { continue };
            for dgram in datagrams(buf, m) {
                on_datagram(&mut self.send, &mut self.recv, src, dgram, now, &mut self.done);
            }
        }
        self.round(now, false, n == bufs.len().min(meta.len()))
    }

    /// One round at `now`. `engine` is true on the engine thread; a round
    /// of another thread rings the engine's doorbell when it leaves work
    /// to do now (more to send, a full socket), and moves the engine's
    /// timer when it armed an earlier flow timer. `read`: the round reads
    /// the socket.
    pub fn round(&mut self, now: Instant, engine: bool, read: bool) -> Round {
        self.take_commands(now);
        let more_rx = read && self.receive(now);
        // The last round's earliest timer: timers armed since lie past
        // `now` (a timeout from now), so only a due one needs the look.
        if self.next_timer.is_some_and(|w| w <= now) && self.send.wake_at().is_some_and(|w| w <= now) {
            stages::send_timers(&mut self.send, now, &mut self.done);
        }
        let more_tx = self.transmit(now, StageSet::ALL);
        let busy = more_rx || more_tx;
        self.shared.cq.push_all(&mut self.done);
        self.next_timer = earliest(self.send.wake_at(), self.recv.ack_due());
        let r = Round { busy, wake_at: self.next_timer };
        if engine {
            self.planned = if busy { Some(now) } else { r.wake_at };
        } else if busy || self.blocked {
            self.planned = Some(now);
            self.shared.doorbell.set();
        } else if let Some(w) = r.wake_at {
            self.plan_wake(w, now);
        }
        r
    }

    /// Makes the engine thread wake by `w` for a flow timer a round of
    /// another thread armed. Nothing is done when the engine already
    /// plans to wake by then, or when the timer descriptor fires by then
    /// (the engine plans again when it wakes): most sends need no system
    /// call for their timer.
    fn plan_wake(&mut self, w: Instant, now: Instant) {
        // Under a lease the engine thread wakes every CHECK and runs the
        // timers then (emp::lease).
        if self.shared.lease.engine_off() {
            return;
        }
        if self.planned.is_some_and(|p| p <= w) || self.armed.is_some_and(|a| a > now && a <= w) {
            return;
        }
        self.planned = Some(w);
        self.armed = Some(w);
        self.shared.timer.set(Some(w.saturating_duration_since(now)));
    }

    /// Cancels the posted receive with `context` now, after the commands
    /// queued before it; true when it was posted and had matched nothing.
    pub fn cancel(&mut self, context: u64) -> bool {
        self.take_commands(Instant::now());
        let acted = self.recv.cancel(context, &mut self.done);
        self.shared.cq.push_all(&mut self.done);
        acted
    }

    /// True while the socket's buffer is full.
    pub fn blocked(&self) -> bool {
        self.blocked
    }

    /// The socket has room again.
    pub fn writable(&mut self) {
        self.blocked = false;
    }

    /// Completes every pending operation as closed (the endpoint stops).
    pub fn close(&mut self) {
        self.send.close_all(&mut self.done);
        self.recv.close_all(&mut self.done);
        self.shared.cq.push_all(&mut self.done);
    }

    fn take_commands(&mut self, now: Instant) {
        self.shared.take_commands(&mut self.commands);
        for c in self.commands.drain(..) {
            match c {
                Command::Insert { peer, addr, queued } => {
                    let link = Arc::new(PeerLink::default());
                    self.send.insert(peer, addr, queued, link.clone(), now);
                    self.recv.insert(peer, addr, link);
                }
                Command::Remove { peer } => {
                    self.send.remove(peer, &mut self.done);
                    self.recv.remove(peer, &mut self.done);
                }
                Command::Send { peer, tag, data, context } => {
                    stages::send_bookkeeping(&mut self.send, peer, tag, data, context, &mut self.done)
                }
                Command::Recv(r) => self.recv.post(r, &mut self.done),
            }
        }
    }

    /// Reads what the socket holds (a few batches); true when a full batch
    /// suggests more is waiting.
    fn receive(&mut self, now: Instant) -> bool {
        self.shared.forget_missed();
        for _ in 0..RX_ROUNDS {
            let n = match self.sock.recv_batch(&mut self.rx_bufs, &mut self.rx_meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                // A socket error (an ICMP report) is consumed by the call
                // that returns it, and datagrams may wait behind it: the
                // engine's edge-triggered wait would not wake for them.
                Err(_) => continue,
            };
            for i in 0..n {
                let m = self.rx_meta[i];
                let Some(src) = m.src else { continue };
                for dgram in datagrams(&self.rx_bufs[i], m) {
                    on_datagram(&mut self.send, &mut self.recv, src, dgram, now, &mut self.done);
                }
            }
            if n < RX_BATCH {
                return false;
            }
        }
        true
    }

    /// Steps 7 and 2 (those of `set`) into batches, flushed until nothing
    /// is left to send or the socket is full; true when frames remain that
    /// could go now.
    fn transmit(&mut self, now: Instant, set: StageSet) -> bool {
        let (acks, frames) = (set.has(Stage::SendAcknowledgment), set.has(Stage::Transmission));
        for _ in 0..64 {
            if acks {
                stages::send_acknowledgment(&mut self.recv, &mut self.tx, now);
            }
            // A round for a receive post has no frame to send: the look
            // costs less than a pass over the flows.
            if frames && !self.blocked && self.send.has_frame() {
                stages::transmission(&mut self.send, &mut self.tx, now);
            }
            if self.tx.is_empty() || self.blocked {
                return false;
            }
            let (f, _) = self.tx.flush(&self.sock, self.gso, &mut self.unsent);
            for (peer, seq) in self.unsent.drain(..) {
                self.send.unsend(peer, seq);
            }
            if f.gso_refused {
                self.gso = false;
            }
            if f.blocked {
                self.blocked = true;
                return false;
            }
            if !((frames && self.send.has_frame()) || (acks && self.recv.owes(now))) {
                return false;
            }
        }
        true
    }

    /// The endpoint's counters as of now: every peer's, removed peers',
    /// and frames no peer accounts for. Computed when asked rather than
    /// published per round: a round stays free of the per-peer sums.
    pub fn counters(&self) -> EmpCounters {
        let mut total = EmpCounters::default();
        for id in self.recv.peer_ids() {
            total.add(&self.peer_counters(id));
        }
        total.add(&self.send.retired());
        total.add(&self.recv.own());
        total
    }

    /// One peer's counters as of now (zeros for a peer the runtime has
    /// not taken in yet).
    pub fn peer_counters(&self, id: PeerId) -> EmpCounters {
        let mut c = self.send.counters(id);
        c.add(&self.recv.counters(id));
        c
    }
}

/// The engine thread: rounds until the endpoint stops, then every pending
/// operation completes as closed.
pub fn drive(shared: &Shared, rt: &Mutex<Runtime>) -> io::Result<()> {
    let epoll = Epoll::new()?;
    let sock = lock(rt).socket_fd();
    epoll.add(sock, SOCKET, EV_IN | EV_EXCLUSIVE | EDGE)?;
    epoll.add_readable(shared.doorbell.as_raw_fd(), DOORBELL)?;
    epoll.add_readable(shared.timer.as_raw_fd(), TIMER)?;
    let mut ready: Vec<(u64, u32)> = Vec::new();
    let mut wake_at = None;
    // The socket is in this thread's epoll set (no waiter holds a lease).
    let mut watching = true;
    loop {
        if ready.iter().any(|&(t, _)| t == TIMER) {
            shared.timer.clear();
        }
        if ready.iter().any(|&(t, _)| t == DOORBELL) {
            shared.doorbell.drain();
        }
        let Some(mut g) = lock_for(shared, rt, &ready) else {
            let now = Instant::now();
            // Woken for the timers while a waiter runs a round (which runs
            // them): sleep again.
            let timeout = match (ready.is_empty(), shared.lease.until(now)) {
                (true, Some(u)) => Some(u.saturating_duration_since(now).min(CHECK)),
                (true, None) => Some(Duration::ZERO),
                _ => wake_at.map(|w: Instant| w.saturating_duration_since(now)),
            };
            let _ = epoll.wait_events(&mut ready, timeout);
            continue;
        };
        let now = Instant::now();
        // Decided under the lock, which rounds of other threads hold when
        // they decide whether to arm the timer (`Runtime::plan_wake`).
        let lease = shared.lease.until(now);
        shared.lease.set_engine_off(lease.is_some());
        let r = g.round(now, true, watching || lease.is_none() || !shared.lease.waiting());
        let (blocked, fd) = (g.blocked(), g.socket_fd());
        drop(g);
        if shared.stopping() {
            break;
        }
        // The socket leaves the epoll set while a waiter holds it, so its
        // frames wake the waiter's blocking receive and not this thread;
        // adding it back reports frames already queued.
        if lease.is_some() && watching {
            epoll.remove(sock)?;
            watching = false;
        } else if lease.is_none() && !watching {
            epoll.add(sock, SOCKET, EV_IN | EV_EXCLUSIVE | EDGE)?;
            watching = true;
        }
        wake_at = earliest(r.wake_at, lease.map(|u| u.min(now + CHECK)));
        let mut timeout =
            if r.busy { Some(Duration::ZERO) } else { wake_at.map(|w| w.saturating_duration_since(Instant::now())) };
        if blocked {
            let t = timeout.map_or(BLOCKED_RETRY, |t| t.min(BLOCKED_RETRY));
            if poll_writable(fd, Some(t)).unwrap_or(false) {
                lock(rt).writable();
            }
            timeout = Some(Duration::ZERO);
        }
        let _ = epoll.wait_events(&mut ready, timeout);
    }
    lock(rt).close();
    Ok(())
}

/// The runtime for an engine thread's round. A thread woken only by the
/// socket does not queue behind an application thread that holds the
/// runtime (that thread reads the socket, and its unlock would pay a
/// wake-up): it notes the miss and sleeps again (`None`). Nor does one
/// woken by its timeout while a waiter holds the socket's lease: the
/// waiter's round runs the timers.
pub(crate) fn lock_for<'a>(
    shared: &Shared,
    rt: &'a Mutex<Runtime>,
    ready: &[(u64, u32)],
) -> Option<std::sync::MutexGuard<'a, Runtime>> {
    if ready.is_empty() && shared.lease.until(Instant::now()).is_some() {
        return try_lock(rt);
    }
    if ready.is_empty() || ready.iter().any(|&(t, _)| t != SOCKET) {
        return Some(lock(rt));
    }
    shared.note_missed();
    try_lock(rt)
}

/// The datagrams of one received buffer: a GRO super-packet split at its
/// segment size, or the one datagram (an empty one too).
pub(crate) fn datagrams(buf: &[u8], m: InMeta) -> impl Iterator<Item = &[u8]> {
    let bytes = &buf[..m.len.min(buf.len())];
    let seg = m.segment.filter(|&s| s > 0).unwrap_or(bytes.len().max(1));
    let empty = bytes.is_empty().then_some(bytes);
    bytes.chunks(seg).chain(empty)
}

/// The earlier of two optional instants.
pub(crate) fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Steps 5, 4, 6 for a data frame (3 first for the acknowledgment it
/// carries); 5 then 3 for an acknowledgment.
fn on_datagram(
    send: &mut SendSide,
    recv: &mut RecvSide,
    src: SocketAddr,
    bytes: &[u8],
    now: Instant,
    done: &mut Vec<Completion>,
) {
    let incoming = stages::receive_frame(recv, src, bytes);
    if let Some(Incoming::Data(peer, Data { ack: Some(c), .. })) = &incoming {
        stages::receive_acknowledgment(send, *peer, *c, false, now, done);
    }
    match incoming {
        Some(Incoming::Data(peer, d)) if stages::receive_bookkeeping(recv, peer, &d, done) => {
            stages::receiving(recv, peer, &d, done)
        }
        Some(Incoming::Control(peer, c, nak)) => stages::receive_acknowledgment(send, peer, c, nak, now, done),
        Some(Incoming::Data(..)) | None => {}
    }
}

impl Runtime {
    /// The recorded events of the flows to and from `peer`: (sender side,
    /// receiver side), emptied.
    pub fn take_flow_events(&mut self, peer: PeerId) -> FlowTraces {
        (self.send.take_events(peer), self.recv.take_events(peer))
    }
}

/// One peer's recorded traces: the sender side's, the receiver side's.
pub type FlowTraces = (Vec<crate::emp::event::FlowEvent>, Vec<crate::emp::event::FlowEvent>);
