//! The sender's half of a flow: queued messages with their transmission
//! records, the window of frames in flight, selective repeat (only frames
//! the receiver reports missing are sent again, and on a timeout only the
//! oldest unacknowledged one), the retransmission timer with exponential
//! backoff, and the deadline after which the flow gives up.

use super::rtt::Rtt;
use super::scoreboard::Scoreboard;
use super::seq::{before, before_eq, distance};
use crate::emp::config::EmpConfig;
use crate::emp::event::FlowEvent;
use eudp_wire::emp::{Control, DataHeader, MAX_MESSAGE};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How a queued message ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The flow made no progress within its deadline.
    TimedOut,
    /// The flow closed (peer removed, endpoint shut down) first.
    Closed,
}

/// Why a message was not queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueError {
    /// The flow's queue is at its byte bound: try again after completions.
    Full,
    /// Longer than the largest EMP message.
    TooLong,
}

/// A message that left the flow, acknowledged or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendDone {
    pub token: u64,
    pub tag: u64,
    pub len: usize,
    pub result: Result<(), SendError>,
}

/// One data frame to transmit: its header and its payload in the message.
#[derive(Debug)]
pub struct FrameOut<'a> {
    pub header: DataHeader,
    pub payload: &'a [u8],
    /// Sent before (a retransmission).
    pub resend: bool,
}

/// Counters of the sending side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendCounters {
    pub frames_sent: u64,
    pub retransmits: u64,
    pub acks_received: u64,
    pub naks_received: u64,
    /// Acknowledgments of the reverse flow its data frames carried.
    pub acks_piggybacked: u64,
    /// Acknowledgments of another incarnation of the flow, or overtaken by
    /// a later one, ignored.
    pub stale_acks: u64,
    pub timeouts: u64,
    /// Times frames handed to the socket were not taken and went back.
    pub go_backs: u64,
    pub give_ups: u64,
    pub messages_acked: u64,
    pub messages_failed: u64,
}

/// A queued message and where its frames lie in the flow's sequence space.
#[derive(Debug)]
struct Record {
    tag: u64,
    data: Vec<u8>,
    token: u64,
    first_seq: u32,
    frames: u32,
}

/// The sender's state of one flow.
#[derive(Debug)]
pub struct SendFlow {
    payload: usize,
    window: u32,
    deadline: Duration,
    queue_bytes: usize,
    epoch: u32,
    records: VecDeque<Record>,
    queued: usize,
    /// Oldest unacknowledged sequence number.
    una: u32,
    /// Next sequence number to transmit in order (below `high` only after
    /// the socket did not take frames).
    nxt: u32,
    /// One past the highest sequence number ever transmitted.
    high: u32,
    /// One past the last sequence number assigned to a queued message.
    end: u32,
    /// Index of the record holding `nxt`.
    cursor: usize,
    peer_window: u32,
    board: Scoreboard,
    /// After a timeout, until `una` passes it: each acknowledgment that
    /// leaves `una` missing repairs it (frames lost at the window's end
    /// have no held frames above them to report them).
    recover: Option<u32>,
    rtt: Rtt,
    timer: Option<Instant>,
    last_progress: Instant,
    /// `last_progress + deadline`, kept with it: `wake_at` runs several
    /// times a round, and an `Instant` sum is not free.
    give_up_at: Instant,
    done: VecDeque<SendDone>,
    events: Option<Vec<FlowEvent>>,
    counters: SendCounters,
}

impl SendFlow {
    /// An empty flow of incarnation `epoch`.
    pub fn new(cfg: &EmpConfig, epoch: u32, now: Instant) -> Self {
        let cfg = cfg.normalised();
        SendFlow {
            payload: cfg.frame_payload,
            window: cfg.window,
            deadline: cfg.deadline,
            queue_bytes: cfg.send_queue_bytes,
            epoch,
            records: VecDeque::new(),
            queued: 0,
            una: 0,
            nxt: 0,
            high: 0,
            end: 0,
            cursor: 0,
            peer_window: cfg.window,
            board: Scoreboard::default(),
            recover: None,
            rtt: Rtt::new(cfg.rto_initial, cfg.rto_min, cfg.rto_max),
            timer: None,
            last_progress: now,
            give_up_at: now + cfg.deadline,
            done: VecDeque::new(),
            events: cfg.record_events.then(Vec::new),
            counters: SendCounters::default(),
        }
    }

    /// The flow's current incarnation.
    pub fn epoch(&self) -> u32 {
        self.epoch
    }

    pub fn counters(&self) -> SendCounters {
        self.counters
    }

    /// Bytes of messages queued and not yet completed.
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// True when no message is queued.
    pub fn is_idle(&self) -> bool {
        self.records.is_empty()
    }

    /// Queues a message. A flow holding nothing takes a message of any
    /// length up to the maximum, so that a message larger than the bound
    /// still goes out alone.
    pub fn queue(&mut self, tag: u64, data: Vec<u8>, token: u64) -> Result<(), (QueueError, Vec<u8>)> {
        if data.len() > MAX_MESSAGE as usize {
            return Err((QueueError::TooLong, data));
        }
        if self.queued > 0 && self.queued + data.len() > self.queue_bytes {
            return Err((QueueError::Full, data));
        }
        let frames = data.len().div_ceil(self.payload).max(1) as u32;
        self.queued += data.len();
        self.records.push_back(Record { tag, data, token, first_seq: self.end, frames });
        self.end = self.end.wrapping_add(frames);
        Ok(())
    }

    /// Frames the window allows in flight now.
    fn allowed(&self) -> u32 {
        self.window.min(self.peer_window.max(1))
    }

    /// True when [`SendFlow::next_frame`] would give a frame.
    pub fn has_frame(&self) -> bool {
        self.board.has_repair(self.nxt) || self.has_in_order()
    }

    fn has_in_order(&self) -> bool {
        self.nxt != self.end && distance(self.una, self.nxt) < self.allowed()
    }

    /// The next frame to transmit: a repair first, else the next in order
    /// (new, or again after the socket refused it) if the window allows.
    pub fn next_frame(&mut self, now: Instant) -> Option<FrameOut<'_>> {
        if let Some(seq) = self.board.next_repair(self.nxt) {
            self.counters.retransmits += 1;
            self.counters.frames_sent += 1;
            self.record(FlowEvent::Repair { seq });
            self.board.sent_again(seq, true);
            self.rtt.sent_again(seq);
            if self.timer.is_none() {
                self.timer = Some(now + self.rtt.rto());
            }
            let i = self.records.partition_point(|r| before_eq(r.first_seq.wrapping_add(r.frames), seq));
            return Some(self.frame_of(i, seq, true));
        }
        if !self.has_in_order() {
            return None;
        }
        let seq = self.nxt;
        let resend = before(seq, self.high);
        let i = self.cursor;
        let idx = distance(self.records[i].first_seq, seq);
        let last_of_record = idx + 1 == self.records[i].frames;
        if self.una == self.high {
            // The flow was idle: the deadline counts from now.
            self.progressed(now);
        }
        if resend {
            self.counters.retransmits += 1;
            self.record(FlowEvent::Resend { seq });
            self.board.sent_again(seq, false);
            self.rtt.sent_again(seq);
        } else {
            self.high = seq.wrapping_add(1);
            self.record(FlowEvent::SendNew { seq });
            self.board.sent_new(seq);
            self.rtt.sent_new(seq, now);
        }
        self.counters.frames_sent += 1;
        if self.timer.is_none() {
            self.timer = Some(now + self.rtt.rto());
        }
        self.nxt = seq.wrapping_add(1);
        if last_of_record {
            self.cursor += 1;
        }
        Some(self.frame_of(i, seq, resend))
    }

    /// Frame `seq` of record `i`.
    fn frame_of(&self, i: usize, seq: u32, resend: bool) -> FrameOut<'_> {
        let r = &self.records[i];
        let idx = distance(r.first_seq, seq);
        let offset = idx as usize * self.payload;
        let len = self.payload.min(r.data.len() - offset);
        let header =
            DataHeader { epoch: self.epoch, seq, tag: r.tag, msg_len: r.data.len() as u32, offset: offset as u32 };
        FrameOut { header, payload: &r.data[offset..offset + len], resend }
    }

    /// Frame `seq` did not reach the wire (a full socket buffer): a repair
    /// is due again; a frame sent in order goes back, with those after it.
    pub fn unsend(&mut self, seq: u32) {
        if before_eq(self.una, seq) && before(seq, self.nxt) && self.board.via_repair(seq) {
            self.board.requeue(seq);
            return;
        }
        if before_eq(self.una, seq) && before(seq, self.nxt) {
            self.counters.go_backs += 1;
            self.record(FlowEvent::GoBack { seq });
            self.go_back(seq);
        }
    }

    fn go_back(&mut self, seq: u32) {
        self.nxt = seq;
        self.cursor = self
            .records
            .iter()
            .position(|r| before(seq, r.first_seq.wrapping_add(r.frames)))
            .unwrap_or(self.records.len());
    }

    /// Takes an ACK (`nak` false) or a NAK from the receiver.
    pub fn on_control(&mut self, c: Control, nak: bool, now: Instant) {
        // An ack from another incarnation, or one overtaken by a later ack
        // (the channel reorders), says nothing new: it is counted, not acted on.
        if c.epoch != self.epoch || !(before_eq(self.una, c.next) && before_eq(c.next, self.high)) {
            self.counters.stale_acks += 1;
            return;
        }
        if nak {
            self.counters.naks_received += 1;
            self.record(FlowEvent::NakIn { next: c.next });
        } else {
            self.counters.acks_received += 1;
            self.record(FlowEvent::AckIn { next: c.next });
        }
        self.peer_window = c.window;
        let advanced = before(self.una, c.next);
        if advanced {
            self.release(c.next, now);
        }
        self.board.on_sack(c.next, c.sack, self.nxt);
        let recovering = self.recover.is_some_and(|r| before(self.una, r));
        if nak || (advanced && recovering) {
            self.board.missing(self.una);
        }
    }

    /// Frames below `next` are acknowledged: complete the messages they end.
    fn release(&mut self, next: u32, now: Instant) {
        while let Some(r) = self.records.front() {
            if !before_eq(r.first_seq.wrapping_add(r.frames), next) {
                break;
            }
            let r = self.records.pop_front().expect("front exists");
            self.cursor = self.cursor.saturating_sub(1);
            self.queued -= r.data.len();
            self.counters.messages_acked += 1;
            self.done.push_back(SendDone { token: r.token, tag: r.tag, len: r.data.len(), result: Ok(()) });
        }
        self.una = next;
        self.board.release(next);
        if self.recover.is_some_and(|r| !before(next, r)) {
            self.recover = None;
        }
        if before(self.nxt, next) {
            self.go_back(next);
        }
        self.rtt.acked(next, now);
        self.progressed(now);
        self.timer = (self.una != self.high).then(|| now + self.rtt.rto());
    }

    /// The smoothed round trip, once measured.
    pub fn srtt(&self) -> Option<Duration> {
        self.rtt.srtt()
    }

    /// The retransmission timeout armed next.
    pub fn rto(&self) -> Duration {
        self.rtt.rto()
    }

    /// When [`SendFlow::on_timer`] has work: the retransmission timer or
    /// the deadline, whichever is first.
    pub fn wake_at(&self) -> Option<Instant> {
        self.timer.map(|t| t.min(self.give_up_at))
    }

    fn progressed(&mut self, now: Instant) {
        self.last_progress = now;
        self.give_up_at = now + self.deadline;
    }

    /// Runs the timers due at `now`: past the deadline the flow gives up;
    /// else a timeout repairs the oldest unacknowledged frame (the
    /// acknowledgments it draws report the rest) and doubles the timeout
    /// (up to the maximum).
    pub fn on_timer(&mut self, now: Instant) {
        let Some(at) = self.wake_at() else { return };
        if now < at {
            return;
        }
        if self.una == self.high {
            self.timer = None;
            return;
        }
        if now.duration_since(self.last_progress) >= self.deadline {
            self.record(FlowEvent::GiveUp);
            self.counters.give_ups += 1;
            self.close(SendError::TimedOut);
            return;
        }
        self.record(FlowEvent::Timeout);
        self.counters.timeouts += 1;
        self.board.forget_repairs();
        self.board.missing(self.una);
        self.recover = Some(self.high);
        self.rtt.backoff();
        self.timer = Some(now + self.rtt.rto());
    }

    /// Completes every queued message with `err` and starts the next
    /// incarnation of the flow (a new epoch, sequence numbers from 0), so
    /// that the receiver cannot mistake its frames for the old ones.
    pub fn close(&mut self, err: SendError) {
        for r in self.records.drain(..) {
            self.counters.messages_failed += 1;
            self.done.push_back(SendDone { token: r.token, tag: r.tag, len: r.data.len(), result: Err(err) });
        }
        self.epoch = self.epoch.wrapping_add(1);
        (self.una, self.nxt, self.high, self.end, self.cursor, self.queued) = (0, 0, 0, 0, 0, 0);
        self.board.reset(0);
        self.recover = None;
        self.timer = None;
        self.rtt.restart();
        self.peer_window = self.window;
    }

    /// The frame just taken from [`SendFlow::next_frame`] carries an
    /// acknowledgment of the reverse flow.
    pub fn carried_ack(&mut self) {
        self.counters.acks_piggybacked += 1;
    }

    /// The next completed message.
    pub fn pop_done(&mut self) -> Option<SendDone> {
        self.done.pop_front()
    }

    fn record(&mut self, e: FlowEvent) {
        if let Some(ev) = self.events.as_mut() {
            ev.push(e);
        }
    }

    /// The events recorded so far (recording on), emptied.
    pub fn take_events(&mut self) -> Vec<FlowEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }
}
