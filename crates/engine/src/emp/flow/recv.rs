//! The receiver's half of a flow: the next expected sequence number, the
//! frames held above it (selective repeat: a frame that arrives early,
//! within the window, is kept until the ones before it arrive), and the
//! acknowledgments it owes: an ACK per group of accepted or held frames,
//! on a message's last frame and while frames are held, a re-ACK on a
//! duplicate, one NAK per gap episode. Every acknowledgment carries the
//! held frames as its selective part. The acknowledgment of a message's
//! last frame alone may be delayed ([`RecvFlow::park_control`]): it waits
//! for a data frame of the reverse flow to carry it.
//!
//! Matching a message's first frame against posted receives is the
//! caller's: [`RecvFlow::classify`] says whether a frame is the expected
//! one, and the caller then calls [`RecvFlow::accept`] or
//! [`RecvFlow::unmatched`]; after an accept, [`RecvFlow::take_ready`]
//! hands back a held frame that has become the expected one, to go the
//! same way.

use super::seq::{before, distance};
use crate::emp::config::EmpConfig;
use crate::emp::event::FlowEvent;
use eudp_wire::emp::{Control, DataHeader};
use std::collections::VecDeque;

/// What a data frame is to the flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The expected frame: the caller accepts it or drops it as unmatched.
    /// `restarted`: the sender started a new incarnation with this frame,
    /// so any message partly received from it is void.
    Expected { restarted: bool },
    /// Below the expected frame, or above it and held already: dropped
    /// (re-acknowledged).
    Duplicate,
    /// Above the expected frame within the window: held until the frames
    /// before it arrive (a NAK names the expected one).
    Held,
    /// Above the expected frame beyond the window: dropped.
    Gap,
    /// Of another incarnation than the one received, and not the start of
    /// a new one: dropped without an answer.
    Stale,
}

/// Counters of the receiving side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvCounters {
    pub accepted: u64,
    pub duplicates: u64,
    pub gaps: u64,
    pub unmatched: u64,
    pub stale: u64,
    pub acks_sent: u64,
    pub naks_sent: u64,
    /// Frames held above the expected one (received out of order).
    pub held: u64,
}

/// An acknowledgment owed to the sender. It names the expected frame as of
/// the moment it is sent, which may be later than the moment it became owed
/// (the acknowledgment stage runs once per batch of received frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    Ack,
    Nak,
    /// An ACK for a message's last frame only: it may wait for a reverse
    /// data frame to carry it.
    Delayed,
}

/// The receiver's state of one flow.
#[derive(Debug)]
pub struct RecvFlow {
    window: u32,
    ack_group: u32,
    /// Acknowledgments of a message's last frame may be delayed.
    delay: bool,
    epoch: Option<u32>,
    expected: u32,
    since_ack: u32,
    /// The expected number a NAK was sent for in this gap episode.
    nak_for: Option<u32>,
    owed: Option<Owed>,
    /// Frames held since the last acknowledgment.
    since_hold: u32,
    /// Slot `i` holds frame `expected + i` when it arrived early; slot 0
    /// is the expected frame, filled only between [`RecvFlow::take_ready`]
    /// and its accept. At most `window` slots.
    ring: VecDeque<Option<HeldFrame>>,
    holding: u32,
    events: Option<Vec<FlowEvent>>,
    counters: RecvCounters,
}

/// A data frame held until the frames before it arrive.
#[derive(Debug)]
pub struct HeldFrame {
    pub header: DataHeader,
    pub payload: Vec<u8>,
}

impl RecvFlow {
    pub fn new(cfg: &EmpConfig) -> Self {
        let cfg = cfg.normalised();
        RecvFlow {
            window: cfg.window,
            ack_group: cfg.ack_group,
            delay: !cfg.ack_delay.is_zero(),
            epoch: None,
            expected: 0,
            since_ack: 0,
            nak_for: None,
            owed: None,
            since_hold: 0,
            ring: VecDeque::new(),
            holding: 0,
            events: cfg.record_events.then(Vec::new),
            counters: RecvCounters::default(),
        }
    }

    pub fn counters(&self) -> RecvCounters {
        self.counters
    }

    /// The next sequence number the flow accepts.
    pub fn expected(&self) -> u32 {
        self.expected
    }

    /// Frames held above the expected one now.
    pub fn holding(&self) -> u32 {
        self.holding
    }

    /// Classifies a data frame; a duplicate, a gap or a stale frame is
    /// dealt with here (counted, answered as the protocol says), and a
    /// frame above the expected one within the window is kept.
    pub fn classify(&mut self, h: &DataHeader, payload: &[u8]) -> Verdict {
        let mut restarted = false;
        if self.epoch != Some(h.epoch) {
            if h.seq != 0 || h.offset != 0 {
                self.counters.stale += 1;
                return Verdict::Stale;
            }
            // Sequence 0 of a message's first frame starts an incarnation.
            self.epoch = Some(h.epoch);
            (self.expected, self.since_ack, self.nak_for, self.owed) = (0, 0, None, None);
            (self.since_hold, self.holding) = (0, 0);
            self.ring.clear();
            restarted = true;
        }
        if h.seq == self.expected {
            return Verdict::Expected { restarted };
        }
        let ahead = distance(self.expected, h.seq);
        let held_already = self.ring.get(ahead as usize).is_some_and(|s| s.is_some());
        if before(h.seq, self.expected) || held_already {
            self.counters.duplicates += 1;
            // A copy of a held frame lies above the expected one: to the
            // transition table it is a frame of the gap, dropped.
            self.record(if held_already { FlowEvent::Gap { seq: h.seq } } else { FlowEvent::Duplicate { seq: h.seq } });
            if self.owed != Some(Owed::Nak) {
                self.owed = Some(Owed::Ack);
            }
            return Verdict::Duplicate;
        }
        if ahead >= self.window {
            // No sender within the window sends it: dropped, answered by
            // nothing it could act on but the NAK of the gap.
            self.counters.gaps += 1;
            self.record(FlowEvent::Gap { seq: h.seq });
            self.owe_nak();
            return Verdict::Gap;
        }
        self.counters.held += 1;
        self.record(FlowEvent::Hold { seq: h.seq });
        if self.ring.len() <= ahead as usize {
            self.ring.resize_with(ahead as usize + 1, || None);
        }
        self.ring[ahead as usize] = Some(HeldFrame { header: *h, payload: payload.to_vec() });
        self.holding += 1;
        self.since_hold += 1;
        self.owe_nak();
        if self.owed.is_none() && self.since_hold >= self.ack_group {
            self.owed = Some(Owed::Ack);
        }
        Verdict::Held
    }

    /// A NAK for the expected frame, once per gap episode.
    fn owe_nak(&mut self) {
        if self.nak_for != Some(self.expected) {
            self.nak_for = Some(self.expected);
            self.owed = Some(Owed::Nak);
        }
    }

    /// The held frame that is now the expected one, if any: the caller
    /// takes it as if it had just arrived (matching, then accept).
    pub fn take_ready(&mut self) -> Option<HeldFrame> {
        let f = self.ring.front_mut()?.take()?;
        self.holding -= 1;
        Some(f)
    }

    /// The selective part of an acknowledgment: bit `k` for frame
    /// `expected + 1 + k` held.
    fn sack(&self) -> u64 {
        self.ring.iter().skip(1).take(64).enumerate().filter(|(_, s)| s.is_some()).fold(0, |b, (k, _)| b | 1 << k)
    }

    /// Accepts the expected frame; `last` when it ends its message.
    pub fn accept(&mut self, h: &DataHeader, last: bool) {
        debug_assert_eq!(h.seq, self.expected);
        self.counters.accepted += 1;
        self.record(FlowEvent::Accept { seq: h.seq });
        self.expected = self.expected.wrapping_add(1);
        self.ring.pop_front();
        self.nak_for = None;
        self.since_ack += 1;
        // A NAK still owed names a frame that has now arrived: the answer
        // becomes an ack of everything accepted. While frames are held the
        // sender learns at once which ones are still missing.
        if self.since_ack >= self.ack_group || self.owed == Some(Owed::Nak) || self.holding > 0 {
            self.owed = Some(Owed::Ack);
        } else if last && self.owed.is_none() {
            self.owed = Some(if self.delay { Owed::Delayed } else { Owed::Ack });
        }
    }

    /// Drops the expected frame, a message's first, that matches no posted
    /// receive: counted, not acknowledged.
    pub fn unmatched(&mut self, h: &DataHeader) {
        self.counters.unmatched += 1;
        self.record(FlowEvent::Unmatched { seq: h.seq });
    }

    /// True when the acknowledgment owed is one that may wait for a data
    /// frame of the reverse flow.
    pub fn owes_delayed(&self) -> bool {
        self.owed == Some(Owed::Delayed)
    }

    /// The delayed acknowledgment owed, taken to wait for a data frame of
    /// the reverse flow (or the end of the delay). It names the expected
    /// number as of now; the group keeps counting from the last
    /// acknowledgment sent at once, so a stream of short messages is still
    /// acknowledged every `ack_group` frames. It is counted as sent when it
    /// leaves alone ([`RecvFlow::parked_sent`]); the sender counts those
    /// that ride on data.
    pub fn park_control(&mut self) -> Option<Control> {
        if self.owed != Some(Owed::Delayed) {
            return None;
        }
        self.owed = None;
        let epoch = self.epoch?;
        let next = self.expected;
        self.record(FlowEvent::AckDelayed { next });
        Some(Control { epoch, next, window: self.window, sack: self.sack() })
    }

    /// A delayed acknowledgment left alone: no data frame carried it.
    pub fn parked_sent(&mut self) {
        self.counters.acks_sent += 1;
    }

    /// The acknowledgment to send now, if one is owed: `(fields, nak)`.
    pub fn take_control(&mut self) -> Option<(Control, bool)> {
        let o = self.owed.take()?;
        let epoch = self.epoch?;
        let next = self.expected;
        // Both are cumulative: the group counts from the last one sent.
        (self.since_ack, self.since_hold) = (0, 0);
        let nak = o == Owed::Nak;
        if nak {
            self.counters.naks_sent += 1;
            self.record(FlowEvent::NakOut { next });
        } else {
            self.counters.acks_sent += 1;
            self.record(FlowEvent::AckOut { next });
        }
        Some((Control { epoch, next, window: self.window, sack: self.sack() }, nak))
    }

    /// True when an acknowledgment is owed.
    pub fn owes_control(&self) -> bool {
        self.owed.is_some()
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
