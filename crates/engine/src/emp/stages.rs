//! The seven steps of paper 003's Table 1, each a function over either the
//! send-side or the receive-side state, so that a scheme can place them on
//! different threads:
//!
//! | step                     | function                     | state |
//! |--------------------------|------------------------------|-------|
//! | 1 send bookkeeping       | [`send_bookkeeping`], [`send_timers`] | send |
//! | 2 transmission           | [`transmission`]             | send  |
//! | 3 receive acknowledgment | [`receive_acknowledgment`]   | send  |
//! | 4 receive bookkeeping    | [`receive_bookkeeping`]      | recv  |
//! | 5 receive frame          | [`receive_frame`]            | recv  |
//! | 6 receiving              | [`receiving`]                | recv  |
//! | 7 send acknowledgment    | [`send_acknowledgment`]      | recv  |
//!
//! Step 5 hands acknowledgments to step 3 as [`Incoming::Control`] (or on
//! a data frame, [`Data::ack`]). Step 7 parks an acknowledgment that may
//! wait in the peer's [`PeerLink`], where step 2 takes it onto a data
//! frame to that peer; the send and receive sides share nothing else.

use crate::emp::completion::{Completion, Op, Status};
use crate::emp::config::EmpConfig;
use crate::emp::counters::EmpCounters;
use crate::emp::flow::recv::{RecvFlow, Verdict};
use crate::emp::flow::send::{QueueError, SendError, SendFlow};
use crate::emp::matching::{Matcher, PostedRecv, Unexpected};
use crate::emp::peer::PeerId;
use crate::emp::peermap::PeerMap;
use crate::emp::recv_buffer;
use crate::emp::scheme::Stage;
use crate::emp::shared::PeerLink;
use crate::emp::steptrace::Step;
use crate::emp::transmit::TxBatch;
use eudp_wire::emp::{self, Control, Data, Frame, PIGGYBACK_SACK_LEN};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One peer's sending flow.
#[derive(Debug)]
struct SendPeer {
    addr: SocketAddr,
    flow: SendFlow,
    queued: Arc<AtomicUsize>,
    link: Arc<PeerLink>,
}

/// The send side: every peer's sending flow.
#[derive(Debug)]
pub struct SendSide {
    cfg: EmpConfig,
    peers: PeerMap<SendPeer>,
    /// Counters of removed peers.
    retired: EmpCounters,
    /// Where the next transmission round starts, for fairness among peers.
    turn: u32,
}

/// A message being received.
#[derive(Debug)]
struct Assembly {
    /// The receive it goes to (its bytes land in the receive's buffer);
    /// `None` for the unexpected-message queue.
    posted: Option<PostedRecv>,
    tag: u64,
    msg_len: usize,
    /// The bytes of a message for the unexpected-message queue.
    data: Vec<u8>,
}

/// One peer's receiving flow.
#[derive(Debug)]
struct RecvPeer {
    addr: SocketAddr,
    flow: RecvFlow,
    assembly: Option<Assembly>,
    counters: EmpCounters,
    link: Arc<PeerLink>,
}

/// The receive side: every peer's receiving flow, the matcher, and the
/// address-to-peer map of incoming frames (ordered: a lookup by
/// comparison costs less than SipHash's).
#[derive(Debug)]
pub struct RecvSide {
    cfg: EmpConfig,
    peers: PeerMap<RecvPeer>,
    by_addr: BTreeMap<SocketAddr, PeerId>,
    matcher: Matcher,
    /// Peers owing an acknowledgment.
    owing: Vec<PeerId>,
    /// Acknowledgments this side parked, with when each is due: a
    /// look at the links' flags, not their locks, tells which are still
    /// parked (step 2 takes them).
    parked: Vec<ParkedAck>,
    ack_delay: Duration,
    /// Malformed and unknown-peer frames, and removed peers' counters.
    own: EmpCounters,
}

/// An acknowledgment parked in a peer's link, as the receive side
/// remembers it.
#[derive(Debug)]
struct ParkedAck {
    peer: PeerId,
    link: Arc<PeerLink>,
    due: Instant,
}

/// A frame from a known peer, as step 5 sorts it.
#[derive(Debug)]
pub enum Incoming<'a> {
    Data(PeerId, Data<'a>),
    Control(PeerId, Control, bool),
}

/// A random 32-bit number for a flow's epoch (std's per-process random
/// hash keys, mixed with the clock).
pub fn random_epoch() -> u32 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.finish() as u32
}

fn send_completion(peer: PeerId, d: crate::emp::flow::send::SendDone) -> Completion {
    let status = match d.result {
        Ok(()) => Status::Ok,
        Err(SendError::TimedOut) => Status::TimedOut,
        Err(SendError::Closed) => Status::Closed,
    };
    Completion { op: Op::Send, status, context: d.token, peer: Some(peer), tag: d.tag, len: d.len, data: Vec::new() }
}

impl SendSide {
    pub fn new(cfg: &EmpConfig) -> Self {
        SendSide { cfg: cfg.normalised(), peers: PeerMap::new(), retired: EmpCounters::default(), turn: 0 }
    }

    pub fn insert(
        &mut self,
        peer: PeerId,
        addr: SocketAddr,
        queued: Arc<AtomicUsize>,
        link: Arc<PeerLink>,
        now: Instant,
    ) {
        let flow = SendFlow::new(&self.cfg, random_epoch(), now);
        self.peers.insert(peer, SendPeer { addr, flow, queued, link });
    }

    pub fn remove(&mut self, peer: PeerId, done: &mut Vec<Completion>) {
        if let Some(mut p) = self.peers.remove(&peer) {
            p.flow.close(SendError::Closed);
            drain_done(peer, &mut p, done);
            self.retired.add_send(&p.flow.counters());
        }
    }

    /// Closes every flow (shutdown).
    pub fn close_all(&mut self, done: &mut Vec<Completion>) {
        let ids: Vec<PeerId> = self.peers.keys().copied().collect();
        for id in ids {
            self.remove(id, done);
        }
    }

    /// This side's counters of `peer`.
    pub fn counters(&self, peer: PeerId) -> EmpCounters {
        let mut c = EmpCounters::default();
        if let Some(p) = self.peers.get(&peer) {
            c.add_send(&p.flow.counters());
        }
        c
    }

    /// Counters of removed peers.
    pub fn retired(&self) -> EmpCounters {
        self.retired
    }

    /// The earliest timer of any flow.
    pub fn wake_at(&self) -> Option<Instant> {
        self.peers.values().filter_map(|p| p.flow.wake_at()).min()
    }

    /// True when some flow has a frame its window allows.
    pub fn has_frame(&self) -> bool {
        self.peers.values().any(|p| p.flow.has_frame())
    }

    /// A frame the socket did not take: send it again next.
    pub fn unsend(&mut self, peer: PeerId, seq: u32) {
        if let Some(p) = self.peers.get_mut(&peer) {
            p.flow.unsend(seq);
        }
    }
}

fn drain_done(peer: PeerId, p: &mut SendPeer, done: &mut Vec<Completion>) {
    while let Some(d) = p.flow.pop_done() {
        p.queued.fetch_sub(d.len, Relaxed);
        done.push(send_completion(peer, d));
    }
}

/// Step 1: a posted send becomes a transmission record of its peer's flow.
pub fn send_bookkeeping(
    s: &mut SendSide,
    peer: PeerId,
    tag: u64,
    data: Vec<u8>,
    context: u64,
    done: &mut Vec<Completion>,
) {
    let mut step = Step::begin(Stage::SendBookkeeping);
    let len = data.len();
    let refused = match s.peers.get_mut(&peer) {
        None => Some(Status::Closed),
        Some(p) => match p.flow.queue(tag, data, context) {
            Ok(()) => None,
            Err((QueueError::TooLong, _)) => Some(Status::TooLong),
            Err((QueueError::Full, _)) => Some(Status::Closed),
        },
    };
    if let Some(status) = refused {
        if let Some(p) = s.peers.get(&peer) {
            p.queued.fetch_sub(len, Relaxed);
        }
        done.push(Completion { op: Op::Send, status, context, peer: Some(peer), tag, len, data: Vec::new() });
    }
    step.message(|| s.peers.get(&peer).map(|p| p.addr), len);
}

/// Step 1, timers: retransmission timeouts and deadlines due at `now`.
pub fn send_timers(s: &mut SendSide, now: Instant, done: &mut Vec<Completion>) {
    for (&id, p) in s.peers.iter_mut() {
        if p.flow.wake_at().is_some_and(|w| w <= now) {
            p.flow.on_timer(now);
            drain_done(id, p, done);
        }
    }
}

/// Step 2: frames the windows allow, into the batch, round-robin over peers.
pub fn transmission(s: &mut SendSide, tx: &mut TxBatch, now: Instant) {
    let n = s.peers.len();
    if n == 0 {
        return;
    }
    let start = s.turn as usize % n;
    s.turn = s.turn.wrapping_add(1);
    let cap = s.cfg.frame_payload;
    let mut progress = true;
    while progress && !tx.is_full() {
        progress = false;
        for (id, p) in s.peers.iter_mut().skip(start) {
            progress |= transmit_one(*id, p, tx, cap, now);
        }
        for (id, p) in s.peers.iter_mut().take(start) {
            progress |= transmit_one(*id, p, tx, cap, now);
        }
    }
}

/// One frame of one flow into the batch, if the window allows and there is
/// room; true when one went in. A frame short enough to stay within a
/// full frame's size takes the acknowledgment parked for its peer along.
fn transmit_one(id: PeerId, p: &mut SendPeer, tx: &mut TxBatch, cap: usize, now: Instant) -> bool {
    if tx.is_full() {
        return false;
    }
    let mut step = Step::begin(Stage::Transmission);
    let Some(f) = p.flow.next_frame(now) else { return false };
    step.data(p.addr, &f.header, f.payload.len());
    let ack = if f.payload.len() + PIGGYBACK_SACK_LEN <= cap { p.link.take() } else { None };
    let slot = tx.slot();
    let head = emp::encode_data_header_with(&f.header, ack.as_ref(), f.payload.len(), slot)
        .expect("a slot holds the largest frame");
    let len = head + f.payload.len();
    slot[head..len].copy_from_slice(f.payload);
    let seq = f.header.seq;
    tx.commit(p.addr, len, Some((id, seq)));
    if ack.is_some() {
        p.flow.carried_ack();
    }
    true
}

/// Step 3: an acknowledgment releases transmission records (or sends the
/// flow back, for a NAK).
pub fn receive_acknowledgment(
    s: &mut SendSide,
    peer: PeerId,
    c: Control,
    nak: bool,
    now: Instant,
    done: &mut Vec<Completion>,
) {
    let mut step = Step::begin(Stage::ReceiveAcknowledgment);
    if let Some(p) = s.peers.get_mut(&peer) {
        step.control(p.addr, &c, nak);
        p.flow.on_control(c, nak, now);
        drain_done(peer, p, done);
    }
}

impl RecvSide {
    pub fn new(cfg: &EmpConfig) -> Self {
        let cfg = cfg.normalised();
        RecvSide {
            matcher: Matcher::new(cfg.unexpected_messages, cfg.unexpected_bytes),
            ack_delay: cfg.ack_delay,
            cfg,
            peers: PeerMap::new(),
            by_addr: BTreeMap::new(),
            owing: Vec::new(),
            parked: Vec::new(),
            own: EmpCounters::default(),
        }
    }

    pub fn insert(&mut self, peer: PeerId, addr: SocketAddr, link: Arc<PeerLink>) {
        self.by_addr.insert(addr, peer);
        let flow = RecvFlow::new(&self.cfg);
        self.peers.insert(peer, RecvPeer { addr, flow, assembly: None, counters: EmpCounters::default(), link });
    }

    pub fn remove(&mut self, peer: PeerId, done: &mut Vec<Completion>) {
        self.by_addr.retain(|_, p| *p != peer);
        if let Some(mut p) = self.peers.remove(&peer) {
            if let Some(a) = p.assembly.take() {
                self.abandon(a, done);
            }
            let c = peer_counters(&p);
            self.own.add(&c);
        }
        self.matcher.forget(peer);
    }

    /// Gives a half-received message's receive back to the matcher, first
    /// in line; a reservation in the unexpected queue is released.
    fn abandon(&mut self, a: Assembly, done: &mut Vec<Completion>) {
        match a.posted {
            Some(r) => {
                if let Some((r, u)) = self.matcher.post_front(r) {
                    done.push(recv_completion(r, u));
                }
            }
            None => self.matcher.unreserve(a.msg_len),
        }
    }

    /// Completes every posted receive as closed (shutdown).
    pub fn close_all(&mut self, done: &mut Vec<Completion>) {
        for r in self.matcher.drain_posted() {
            done.push(closed_recv(r, Status::Closed));
        }
        for p in self.peers.values_mut() {
            if let Some(a) = p.assembly.take() {
                if let Some(r) = a.posted {
                    done.push(closed_recv(r, Status::Closed));
                }
            }
        }
    }

    /// Posts a receive; a queued unexpected message completes it at once.
    pub fn post(&mut self, r: PostedRecv, done: &mut Vec<Completion>) {
        if let Some((r, u)) = self.matcher.post(r) {
            done.push(recv_completion(r, u));
        }
    }

    /// Cancels a posted receive; it completes as canceled. False when no
    /// posted receive has `context` (none was, or it matched a message).
    pub fn cancel(&mut self, context: u64, done: &mut Vec<Completion>) -> bool {
        let Some(r) = self.matcher.cancel(context) else { return false };
        done.push(closed_recv(r, Status::Canceled));
        true
    }

    /// This side's counters of `peer`.
    pub fn counters(&self, peer: PeerId) -> EmpCounters {
        self.peers.get(&peer).map(peer_counters).unwrap_or_default()
    }

    /// Malformed and unknown-peer frames, and removed peers' counters.
    pub fn own(&self) -> EmpCounters {
        self.own
    }

    pub fn peer_ids(&self) -> impl Iterator<Item = PeerId> + '_ {
        self.peers.keys().copied()
    }

    /// True when some peer owes an acknowledgment to send or park now, or
    /// a parked one is due by `now`.
    pub fn owes(&self, now: Instant) -> bool {
        !self.owing.is_empty() || self.ack_due().is_some_and(|d| d <= now)
    }

    /// When the first parked acknowledgment is due alone.
    pub fn ack_due(&self) -> Option<Instant> {
        self.parked.iter().filter(|e| e.link.is_parked()).map(|e| e.due).min()
    }
}

fn peer_counters(p: &RecvPeer) -> EmpCounters {
    let mut c = p.counters;
    c.add_recv(&p.flow.counters());
    c
}

fn closed_recv(r: PostedRecv, status: Status) -> Completion {
    recv_buffer::unmatched(r.context, r.buffer, r.tag, status)
}

/// A queued unexpected message handed to the receive that matched it.
fn recv_completion(r: PostedRecv, u: Unexpected) -> Completion {
    recv_buffer::received_whole(r.context, r.buffer, u.src, u.tag, u.data)
}

/// Step 5: a datagram from `src`, parsed and charged to its peer.
/// Malformed frames and frames of unknown peers are counted and dropped.
pub fn receive_frame<'a>(r: &mut RecvSide, src: SocketAddr, bytes: &'a [u8]) -> Option<Incoming<'a>> {
    let mut step = Step::begin(Stage::ReceiveFrame);
    let Some(&peer) = r.by_addr.get(&src) else {
        r.own.unknown_peer += 1;
        return None;
    };
    let frame = match emp::parse(bytes) {
        Ok(f) => f,
        Err(_) => {
            r.own.malformed += 1;
            return None;
        }
    };
    if let Some(p) = r.peers.get_mut(&peer) {
        p.counters.frames_received += 1;
    }
    step.frame(src, &frame);
    Some(match frame {
        Frame::Data(d) => Incoming::Data(peer, d),
        Frame::Ack(c) => Incoming::Control(peer, c, false),
        Frame::Nak(c) => Incoming::Control(peer, c, true),
    })
}

/// Step 4: the flow's verdict on a data frame and, for the expected first
/// frame of a message, its match: a posted receive, a slot of the
/// unexpected queue, or EMP's drop. True when step 6 takes the frame.
pub fn receive_bookkeeping(r: &mut RecvSide, peer: PeerId, d: &Data<'_>, done: &mut Vec<Completion>) -> bool {
    let mut step = Step::begin(Stage::ReceiveBookkeeping);
    let Some(p) = r.peers.get_mut(&peer) else { return false };
    step.data(p.addr, &d.header, d.payload.len());
    let owed = p.flow.owes_control();
    let verdict = p.flow.classify(&d.header, d.payload);
    if !owed && p.flow.owes_control() {
        r.owing.push(peer);
    }
    let Verdict::Expected { restarted } = verdict else { return false };
    if restarted {
        if let Some(a) = p.assembly.take() {
            r.abandon(a, done);
        }
    }
    let p = r.peers.get_mut(&peer).expect("present above");
    if !d.first() {
        // In order, a message's later frames follow its first; without
        // one the frame cannot be placed.
        return p.assembly.is_some();
    }
    let msg_len = d.header.msg_len as usize;
    let mut posted = r.matcher.take_match(peer, d.header.tag);
    if posted.is_none() && !r.matcher.reserve(msg_len) {
        p.flow.unmatched(&d.header);
        return false;
    }
    let data = match posted.as_mut() {
        Some(r) => {
            r.buffer.start(msg_len);
            Vec::new()
        }
        None => Vec::with_capacity(msg_len),
    };
    p.assembly = Some(Assembly { posted, tag: d.header.tag, msg_len, data });
    true
}

/// Step 6: the frame's bytes into the message; its last frame completes
/// the receive (or queues the unexpected message). Frames held above it
/// that it makes the expected ones follow it, each through step 4 again.
pub fn receiving(r: &mut RecvSide, peer: PeerId, d: &Data<'_>, done: &mut Vec<Completion>) {
    receive_one(r, peer, d, done);
    loop {
        let Some(held) = r.peers.get_mut(&peer).and_then(|p| p.flow.take_ready()) else { return };
        let d = Data { header: held.header, ack: None, payload: &held.payload };
        if !receive_bookkeeping(r, peer, &d, done) {
            return;
        }
        receive_one(r, peer, &d, done);
    }
}

fn receive_one(r: &mut RecvSide, peer: PeerId, d: &Data<'_>, done: &mut Vec<Completion>) {
    let mut step = Step::begin(Stage::Receiving);
    let Some(p) = r.peers.get_mut(&peer) else { return };
    step.data(p.addr, &d.header, d.payload.len());
    let Some(a) = p.assembly.as_mut() else { return };
    match a.posted.as_mut() {
        Some(r) => r.buffer.place(d.header.offset as usize, d.payload),
        // Frames arrive in order: `data` ends at this frame's offset.
        None => a.data.extend_from_slice(d.payload),
    }
    let owed = p.flow.owes_control();
    p.flow.accept(&d.header, d.last());
    if !owed && p.flow.owes_control() {
        r.owing.push(peer);
    }
    if !d.last() {
        return;
    }
    let a = p.assembly.take().expect("present above");
    p.counters.messages_received += 1;
    match a.posted {
        Some(posted) => {
            if a.msg_len > posted.buffer.capacity() {
                p.counters.truncated += 1;
            }
            done.push(recv_buffer::received(posted.context, posted.buffer, peer, a.tag, a.msg_len));
        }
        None => {
            p.counters.unexpected += 1;
            if let Some((posted, u)) = r.matcher.arrived(Unexpected { src: peer, tag: a.tag, data: a.data }) {
                if u.data.len() > posted.buffer.capacity() {
                    if let Some(p) = r.peers.get_mut(&peer) {
                        p.counters.truncated += 1;
                    }
                }
                done.push(recv_completion(posted, u));
            }
        }
    }
}

/// Step 7: the acknowledgments owed, into the batch; one that may wait is
/// parked in the peer's link for step 2 instead, and sent alone here once
/// its delay ends.
pub fn send_acknowledgment(r: &mut RecvSide, tx: &mut TxBatch, now: Instant) {
    while let Some(&peer) = r.owing.last() {
        if tx.is_full() {
            return;
        }
        r.owing.pop();
        let mut step = Step::begin(Stage::SendAcknowledgment);
        let Some(p) = r.peers.get_mut(&peer) else { continue };
        if p.flow.owes_delayed() {
            if let Some(c) = p.flow.park_control() {
                step.control(p.addr, &c, false);
                let due = p.link.park(c, now + r.ack_delay);
                match r.parked.iter_mut().find(|e| e.peer == peer) {
                    Some(e) => e.due = due,
                    None => r.parked.push(ParkedAck { peer, link: p.link.clone(), due }),
                }
            }
            continue;
        }
        if let Some((c, nak)) = p.flow.take_control() {
            step.control(p.addr, &c, nak);
            p.link.clear();
            let n = emp::encode_control(&c, nak, tx.slot()).expect("a slot holds a control frame");
            tx.commit(p.addr, n, None);
        }
    }
    let mut i = 0;
    while i < r.parked.len() && !tx.is_full() {
        let e = &r.parked[i];
        if !e.link.is_parked() {
            r.parked.swap_remove(i);
            continue;
        }
        if e.due > now {
            i += 1;
            continue;
        }
        let Some(p) = r.peers.get_mut(&e.peer) else {
            r.parked.swap_remove(i);
            continue;
        };
        if let Some(c) = p.link.take_due(now) {
            p.flow.parked_sent();
            let n = emp::encode_control(&c, false, tx.slot()).expect("a slot holds a control frame");
            tx.commit(p.addr, n, None);
        }
        if p.link.is_parked() {
            i += 1;
        } else {
            r.parked.swap_remove(i);
        }
    }
}

/// The recorded traces of one peer's flows, for the transition table's checker.
impl SendSide {
    /// The events the flow to `peer` recorded so far, emptied.
    pub fn take_events(&mut self, peer: PeerId) -> Vec<crate::emp::event::FlowEvent> {
        self.peers.get_mut(&peer).map(|p| p.flow.take_events()).unwrap_or_default()
    }
}

impl RecvSide {
    /// The events the flow from `peer` recorded so far, emptied.
    pub fn take_events(&mut self, peer: PeerId) -> Vec<crate::emp::event::FlowEvent> {
        self.peers.get_mut(&peer).map(|p| p.flow.take_events()).unwrap_or_default()
    }
}
