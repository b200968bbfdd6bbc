//! [`EmpEndpoint`]: the application's side of EMP. An endpoint binds one
//! UDP socket, keeps an address vector of peers, takes tagged sends and
//! pre-posted tagged receives, and reports their ends in a completion
//! queue; its engine thread ([`crate::emp::runtime`]) does the protocol,
//! and a thread that sends or waits does a round of it itself when the
//! engine thread is not in one.

use crate::backend::kernel::UdpSocket;
use crate::emp::completion::{Admission, Completion};
use crate::emp::config::EmpConfig;
use crate::emp::counters::EmpCounters;
use crate::emp::matching::PostedRecv;
use crate::emp::peer::PeerId;
use crate::emp::recv_buffer::RecvBuffer;
use crate::emp::runtime::staged::drive_staged;
use crate::emp::runtime::{drive, Runtime, EV_EXCLUSIVE};
use crate::emp::scheme::{Scheme, Stage, StageSet};
use crate::emp::shared::{Command, Shared};
use crate::emp::waiter::{receive_blocking, Blocking, RxBuffers};
use crate::sys::epoll::{Epoll, EDGE, EV_IN};
use crate::sys::sync::{lock, try_lock};
use eudp_wire::emp::MAX_MESSAGE;
use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Rounds an application thread runs in a row for frames an engine
/// thread left to it, before it hands them to the engine thread.
const MISSED_ROUNDS: usize = 4;
/// Longest sleep of a waiting thread between looks at the queue, should
/// an event go to another waiter.
const MAX_NAP: Duration = Duration::from_millis(10);

/// A peer as the application side knows it.
#[derive(Debug)]
struct PeerSlot {
    /// In the socket's family (see [`EmpEndpoint::try_insert`]).
    addr: SocketAddr,
    /// Inserts not yet undone by a remove.
    refs: u32,
    /// Bytes of this peer's sends not yet completed.
    queued: Arc<AtomicUsize>,
}

/// An EMP endpoint: one UDP socket and its engine thread.
#[derive(Debug)]
pub struct EmpEndpoint {
    shared: Arc<Shared>,
    rt: Arc<Mutex<Runtime>>,
    /// What a waiting thread sleeps on: the socket (one waiter woken per
    /// event, edge-triggered) and the completion queue's descriptor.
    waiter: Epoll,
    threads: Vec<JoinHandle<()>>,
    scheme: Scheme,
    /// The stages of each engine thread.
    placement: Vec<StageSet>,
    local: SocketAddr,
    peers: Mutex<HashMap<PeerId, PeerSlot>>,
    next_peer: AtomicU32,
    queue_bytes: usize,
    /// How long a waiting thread polls before it sleeps.
    spin: Duration,
    /// The socket, for a waiter's blocking receive (base scheme).
    sock: Arc<UdpSocket>,
    /// The blocking waiter's buffers.
    rx: Mutex<RxBuffers>,
    /// Waiters lease the socket and block on it ([`EmpConfig::blocking_wait`]).
    blocking: bool,
    /// Posts not yet taken back as completions ([`EmpConfig::completion_queue`]).
    admission: Admission,
}

impl EmpEndpoint {
    /// Binds `local` and starts the engine thread.
    pub fn bind(local: SocketAddr, cfg: EmpConfig) -> io::Result<Self> {
        let cfg = if local.is_ipv6() { cfg.for_ipv6() } else { cfg.normalised() };
        let sock = UdpSocket::new(local.is_ipv6())?;
        let buffer = i32::try_from(cfg.socket_buffer).unwrap_or(i32::MAX);
        for (force, plain) in [(libc::SO_RCVBUFFORCE, libc::SO_RCVBUF), (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF)] {
            if sock.set_option(libc::SOL_SOCKET, force, buffer).is_err() {
                let _ = sock.set_option(libc::SOL_SOCKET, plain, buffer);
            }
        }
        if local.is_ipv6() {
            // Dual stack whatever the host's default: IPv4 peers of an
            // endpoint bound to `[::]` arrive as `::ffff:a.b.c.d`.
            sock.set_option(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, 0)?;
        }
        sock.bind(&local)?;
        let local = sock.local_addr()?;
        let blocking = cfg.scheme == Scheme::Base && cfg.blocking_wait;
        if blocking {
            // Every other call on the socket passes MSG_DONTWAIT; only a
            // waiter's blocking receive sleeps, for at most BLOCK.
            sock.set_description_blocking()?;
            sock.set_receive_timeout(crate::emp::lease::BLOCK)?;
        }
        let shared = Arc::new(Shared::new()?);
        let rt = Runtime::new(shared.clone(), sock, &cfg)?;
        let waiter = Epoll::new()?;
        waiter.add(rt.socket_fd(), 0, EV_IN | EV_EXCLUSIVE | EDGE)?;
        waiter.add_readable(shared.cq.own_fd(), 1)?;
        let sock = rt.socket();
        let rt = Arc::new(Mutex::new(rt));
        let placement = cfg.scheme.threads();
        let mut threads = Vec::new();
        for me in 0..placement.len() {
            let (stopper, engine_rt, sets) = (shared.clone(), rt.clone(), placement.clone());
            let scheme = cfg.scheme;
            let name = if scheme == Scheme::Base { "eudp-emp".to_string() } else { format!("eudp-emp-{scheme}-{me}") };
            let spawned = std::thread::Builder::new().name(name).spawn(move || {
                let body = || {
                    if scheme == Scheme::Base {
                        drive(&stopper, &engine_rt)
                    } else {
                        drive_staged(&stopper, &engine_rt, me, &sets)
                    }
                };
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body));
                if let Ok(Err(e)) = &r {
                    crate::log::write(crate::log::Level::Error, format_args!("EMP engine thread failed: {e}"));
                    stopper.request_stop();
                }
                if let Err(p) = r {
                    let msg = p.downcast_ref::<&str>().copied().or(p.downcast_ref::<String>().map(|s| s.as_str()));
                    crate::log::write(
                        crate::log::Level::Error,
                        format_args!("EMP engine thread panicked: {}", msg.unwrap_or("?")),
                    );
                    stopper.request_stop();
                }
            });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    shared.request_stop();
                    for t in threads.drain(..) {
                        let _ = t.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(EmpEndpoint {
            shared,
            rt,
            waiter,
            threads,
            scheme: cfg.scheme,
            placement,
            local,
            peers: Mutex::new(HashMap::new()),
            next_peer: AtomicU32::new(0),
            queue_bytes: cfg.send_queue_bytes,
            spin: cfg.poll_spin,
            sock,
            rx: Mutex::new(RxBuffers::default()),
            blocking,
            admission: Admission::new(cfg.completion_queue),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Adds a peer to the address vector; see [`EmpEndpoint::try_insert`].
    /// An address the socket cannot reach (IPv6 on an IPv4 endpoint) is
    /// kept as given, and frames to it fail at the socket.
    pub fn insert(&self, addr: SocketAddr) -> PeerId {
        let addr = self.peer_form(addr).unwrap_or(addr);
        self.insert_as(addr)
    }

    /// Adds a peer to the address vector, in the socket's family: an
    /// endpoint bound to IPv6 takes `a.b.c.d` as `::ffff:a.b.c.d` (the
    /// form its socket reports IPv4 senders in), an IPv4 one takes
    /// `::ffff:a.b.c.d` as `a.b.c.d`, so both forms name one peer. An
    /// address already present (in either form) gives its peer again, and
    /// each insert is undone by one [`EmpEndpoint::remove`], as libfabric's
    /// address vectors count them. `InvalidInput` for an IPv6 address on an
    /// IPv4 endpoint.
    pub fn try_insert(&self, addr: SocketAddr) -> io::Result<PeerId> {
        let addr = self.peer_form(addr)?;
        Ok(self.insert_as(addr))
    }

    /// `addr` in the family of this endpoint's socket.
    fn peer_form(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let addr = crate::sys::addr::to_family(crate::sys::addr::unmap(addr), self.local.is_ipv6());
        if addr.is_ipv6() && !self.local.is_ipv6() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "an IPv6 peer of an IPv4 EMP endpoint"));
        }
        Ok(addr)
    }

    fn insert_as(&self, addr: SocketAddr) -> PeerId {
        let mut peers = lock(&self.peers);
        if let Some((&peer, slot)) = peers.iter_mut().find(|(_, p)| p.addr == addr) {
            slot.refs += 1;
            return peer;
        }
        let peer = PeerId(self.next_peer.fetch_add(1, Relaxed));
        let queued = Arc::new(AtomicUsize::new(0));
        peers.insert(peer, PeerSlot { addr, refs: 1, queued: queued.clone() });
        // Queued under the lock, so that a remove of this peer follows it.
        self.shared.command(Command::Insert { peer, addr, queued });
        peer
    }

    /// Undoes one insert of a peer; the last one removes it: its pending
    /// sends complete as closed, frames from its address count as from an
    /// unknown peer. False if not present.
    pub fn remove(&self, peer: PeerId) -> bool {
        let mut peers = lock(&self.peers);
        let Some(slot) = peers.get_mut(&peer) else { return false };
        slot.refs -= 1;
        if slot.refs == 0 {
            peers.remove(&peer);
            self.shared.command(Command::Remove { peer });
        }
        true
    }

    /// The address of a peer in the address vector.
    pub fn peer_addr(&self, peer: PeerId) -> Option<SocketAddr> {
        lock(&self.peers).get(&peer).map(|p| p.addr)
    }

    fn alive(&self) -> io::Result<()> {
        if self.shared.stopping() {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "EMP endpoint stopped"));
        }
        Ok(())
    }

    /// Sends a tagged message; its completion carries `context`. Refused
    /// with `WouldBlock` while the peer's queue holds its bound of bytes
    /// (a message of any length goes into an empty queue).
    pub fn send(&self, peer: PeerId, tag: u64, data: impl Into<Vec<u8>>, context: u64) -> io::Result<()> {
        self.alive()?;
        let data = data.into();
        if data.len() > MAX_MESSAGE as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "EMP message over 16 MiB"));
        }
        let queued = match lock(&self.peers).get(&peer) {
            Some(p) => p.queued.clone(),
            None => return Err(io::Error::new(io::ErrorKind::NotFound, "no such EMP peer")),
        };
        let len = data.len();
        let bound = self.queue_bytes;
        self.admission.admit()?;
        if queued.fetch_update(Relaxed, Relaxed, |q| (q == 0 || q + len <= bound).then_some(q + len)).is_err() {
            self.admission.release();
            return Err(io::Error::from(io::ErrorKind::WouldBlock));
        }
        self.shared.command_quiet(Command::Send { peer, tag, data, context });
        self.progress(false);
        Ok(())
    }

    /// Pre-posts a receive for a message from `source` (or any peer) whose
    /// tag equals `tag` in the bits `ignore` leaves; up to `capacity`
    /// bytes are kept (a longer message completes as truncated).
    pub fn recv(&self, source: Option<PeerId>, tag: u64, ignore: u64, capacity: usize, context: u64) -> io::Result<()> {
        self.recv_buffer(source, tag, ignore, RecvBuffer::alloc(capacity), context)
    }

    /// [`EmpEndpoint::recv`] into the caller's buffer, as libfabric's
    /// `fi_trecv` does: the frames are copied straight into `buf`, up to
    /// its length, and the completion's `data` hands it back, shortened to
    /// the bytes received (a longer message completes `Truncated`, with
    /// its true length in `len`); a receive canceled or closed first hands
    /// it back as posted. On error it is dropped.
    pub fn recv_into(
        &self,
        source: Option<PeerId>,
        tag: u64,
        ignore: u64,
        buf: Vec<u8>,
        context: u64,
    ) -> io::Result<()> {
        self.recv_buffer(source, tag, ignore, RecvBuffer::Vec(buf), context)
    }

    /// [`EmpEndpoint::recv`] into any [`RecvBuffer`] (the C ABI posts
    /// caller memory by address).
    pub fn recv_buffer(
        &self,
        source: Option<PeerId>,
        tag: u64,
        ignore: u64,
        buffer: RecvBuffer,
        context: u64,
    ) -> io::Result<()> {
        self.alive()?;
        self.admission.admit()?;
        self.shared.command_quiet(Command::Recv(PostedRecv { source, tag, ignore, context, buffer }));
        self.progress(false);
        Ok(())
    }

    /// Cancels the posted receive with `context`: it completes as
    /// canceled. False when nothing was canceled: no receive has this
    /// context, or it matched a message already (it completes normally).
    /// Receives posted before the call count; the call waits for a round
    /// of an engine thread in progress.
    pub fn cancel(&self, context: u64) -> bool {
        lock(&self.rt).cancel(context)
    }

    /// True once the endpoint stopped (shut down, or its engine thread
    /// failed): sends and receives are refused from then on.
    pub fn stopped(&self) -> bool {
        self.shared.stopping()
    }

    /// Runs a round on this thread when the engine thread is not in one
    /// (it takes the commands just queued); else wakes the engine thread.
    /// `read`: the round reads the socket. A thread that posts a send or a
    /// receive leaves the socket to the threads its events wake (an
    /// application thread in `wait`, else the engine thread), unless one of
    /// them left frames to this thread.
    fn progress(&self, read: bool) -> bool {
        let mut read = read;
        for _ in 0..MISSED_ROUNDS {
            let Some(mut rt) = try_lock(&self.rt) else {
                self.shared.doorbell.set();
                return false;
            };
            if self.scheme == Scheme::Base {
                rt.round(Instant::now(), false, read);
            } else {
                rt.staged_round(Instant::now(), StageSet::ALL, None, &self.placement, read);
            }
            drop(rt);
            read = true;
            // Frames came after this round read the socket, and an engine
            // thread woke for them but left them to this thread, which is
            // awake already.
            if !self.shared.take_missed() {
                return true;
            }
        }
        match self.placement.iter().position(|t| t.has(Stage::ReceiveFrame)) {
            Some(i) if self.scheme != Scheme::Base => self.shared.wake[i].set(),
            _ => self.shared.doorbell.set(),
        }
        true
    }

    /// The oldest completion, if any (after a round of progress).
    pub fn poll(&self) -> Option<Completion> {
        self.take().or_else(|| if self.progress(true) { self.take() } else { None })
    }

    /// The oldest completion in the queue; taking it lets one more post in.
    fn take(&self) -> Option<Completion> {
        let c = self.shared.cq.poll();
        if c.is_some() {
            self.admission.release();
        }
        c
    }

    /// The oldest completion, waiting up to `timeout` (`None`: until one
    /// comes). The waiting thread makes progress itself: for the
    /// configured spin it polls the socket and runs rounds, so an answer
    /// that comes quickly is taken on this thread without a wake-up; then
    /// it sleeps on the socket and the queue and runs the rounds it wakes
    /// for, spinning again after each. Before its first sleep it only looks
    /// at the queue: frames that came earlier woke another thread, or were
    /// left to the thread that held the runtime, which reads them. In the
    /// base scheme it leases the socket and sleeps in a blocking receive on
    /// it ([`crate::emp::waiter`]) where it can, else in epoll.
    pub fn wait(&self, timeout: Option<Duration>) -> Option<Completion> {
        let until = timeout.map(|t| Instant::now() + t);
        let _waiting = self.shared.lease.enter();
        // Allocated only by a sleep in epoll; without a spin, no clock is
        // read for it.
        let mut ready = Vec::new();
        let spinning = !self.spin.is_zero();
        let mut spin_until = spinning.then(|| Instant::now() + self.spin);
        let mut round = spinning;
        loop {
            let c = if round { self.poll() } else { self.take() };
            if c.is_some() {
                return c;
            }
            if self.shared.stopping() {
                return None;
            }
            let now = Instant::now();
            let left = until.map(|u| u.saturating_duration_since(now));
            if left.is_some_and(|l| l.is_zero()) {
                return None;
            }
            if spin_until.is_some_and(|s| now < s) {
                std::hint::spin_loop();
                continue;
            }
            let mut nap = left.map_or(MAX_NAP, |l| l.min(MAX_NAP));
            if self.blocking {
                match receive_blocking(&self.shared, &self.rt, &self.rx, &self.sock, now, left) {
                    Blocking::Received => {
                        round = false;
                        spin_until = spinning.then(|| Instant::now() + self.spin);
                        continue;
                    }
                    Blocking::Empty => {
                        round = true;
                        continue;
                    }
                    Blocking::Declined(timer) => {
                        if let Some(t) = timer {
                            nap = nap.min(t.saturating_duration_since(now).max(Duration::from_micros(1)));
                        }
                    }
                }
            }
            if self.shared.cq.sleep() {
                let _ = self.waiter.wait_events(&mut ready, Some(nap));
                self.shared.cq.woke();
            }
            // The socket's event, or a nap's end (an event may have gone
            // to another waiter): a round. The queue's own event: a look.
            round = ready.iter().any(|&(t, _)| t == 0) || ready.is_empty();
            spin_until = spinning.then(|| Instant::now() + self.spin);
        }
    }

    /// Counters of the whole endpoint (as of the last round; waits for a
    /// round in progress).
    pub fn counters(&self) -> EmpCounters {
        lock(&self.rt).counters()
    }

    /// Counters of one peer (zero until the engine first accounts for
    /// it); `None` for a peer not in the address vector.
    pub fn peer_counters(&self, peer: PeerId) -> Option<EmpCounters> {
        let known = lock(&self.peers).contains_key(&peer);
        known.then(|| lock(&self.rt).peer_counters(peer))
    }

    /// The events recorded (with [`EmpConfig::record_events`]) by the flows
    /// to and from `peer` since the last call: (sender side, receiver side).
    pub fn take_flow_events(&self, peer: PeerId) -> crate::emp::runtime::FlowTraces {
        lock(&self.rt).take_flow_events(peer)
    }

    /// Stops the engine thread and joins it; pending sends and posted
    /// receives complete as closed (still readable with `poll`).
    pub fn shutdown(&mut self) {
        if self.threads.is_empty() {
            return;
        }
        self.shared.request_stop();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The base scheme's thread closes the runtime as it leaves; with
        // two threads, neither may close while the other still runs.
        if self.scheme != Scheme::Base {
            lock(&self.rt).close();
        }
    }

    /// Where this endpoint runs the protocol's steps.
    pub fn scheme(&self) -> Scheme {
        self.scheme
    }
}

impl AsRawFd for EmpEndpoint {
    /// Readable while completions are pending.
    fn as_raw_fd(&self) -> RawFd {
        self.shared.cq.fd()
    }
}

impl Drop for EmpEndpoint {
    fn drop(&mut self) {
        self.shutdown();
    }
}
