//! The receiver's half of a flow: the next expected sequence number
//! (go-back-N: only that frame is accepted), and the acknowledgments it
//! owes: an ACK per group of accepted frames and on a message's last
//! frame, a re-ACK on a duplicate, one NAK per gap episode.
//!
//! Matching a message's first frame against posted receives is the
//! caller's: [`RecvFlow::classify`] says whether a frame is the expected
//! one, and the caller then calls [`RecvFlow::accept`] or
//! [`RecvFlow::unmatched`].

use super::seq::before;
use crate::emp::config::EmpConfig;
use crate::emp::event::FlowEvent;
use eudp_wire::emp::{Control, DataHeader};

/// What a data frame is to the flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The expected frame: the caller accepts it or drops it as unmatched.
    /// `restarted`: the sender started a new incarnation with this frame,
    /// so any message partly received from it is void.
    Expected { restarted: bool },
    /// Below the expected frame: dropped (re-acknowledged).
    Duplicate,
    /// Above the expected frame: dropped (a NAK names the expected one).
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
}

/// An acknowledgment owed to the sender. It names the expected frame as of
/// the moment it is sent, which may be later than the moment it became owed
/// (the acknowledgment stage runs once per batch of received frames).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owed {
    Ack,
    Nak,
}

/// The receiver's state of one flow.
#[derive(Debug)]
pub struct RecvFlow {
    window: u32,
    ack_group: u32,
    epoch: Option<u32>,
    expected: u32,
    since_ack: u32,
    /// The expected number a NAK was sent for in this gap episode.
    nak_for: Option<u32>,
    owed: Option<Owed>,
    events: Option<Vec<FlowEvent>>,
    counters: RecvCounters,
}

impl RecvFlow {
    pub fn new(cfg: &EmpConfig) -> Self {
        let cfg = cfg.normalised();
        RecvFlow {
            window: cfg.window,
            ack_group: cfg.ack_group,
            epoch: None,
            expected: 0,
            since_ack: 0,
            nak_for: None,
            owed: None,
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

    /// Classifies a data frame; a duplicate, a gap or a stale frame is
    /// dealt with here (counted, answered as the protocol says).
    pub fn classify(&mut self, h: &DataHeader) -> Verdict {
        let mut restarted = false;
        if self.epoch != Some(h.epoch) {
            if h.seq != 0 || h.offset != 0 {
                self.counters.stale += 1;
                return Verdict::Stale;
            }
            // Sequence 0 of a message's first frame starts an incarnation.
            self.epoch = Some(h.epoch);
            (self.expected, self.since_ack, self.nak_for, self.owed) = (0, 0, None, None);
            restarted = true;
        }
        if h.seq == self.expected {
            return Verdict::Expected { restarted };
        }
        if before(h.seq, self.expected) {
            self.counters.duplicates += 1;
            self.record(FlowEvent::Duplicate { seq: h.seq });
            if self.owed != Some(Owed::Nak) {
                self.owed = Some(Owed::Ack);
            }
            Verdict::Duplicate
        } else {
            self.counters.gaps += 1;
            self.record(FlowEvent::Gap { seq: h.seq });
            if self.nak_for != Some(self.expected) {
                self.nak_for = Some(self.expected);
                self.owed = Some(Owed::Nak);
            }
            Verdict::Gap
        }
    }

    /// Accepts the expected frame; `last` when it ends its message.
    pub fn accept(&mut self, h: &DataHeader, last: bool) {
        debug_assert_eq!(h.seq, self.expected);
        self.counters.accepted += 1;
        self.record(FlowEvent::Accept { seq: h.seq });
        self.expected = self.expected.wrapping_add(1);
        self.nak_for = None;
        self.since_ack += 1;
        // A NAK still owed names a frame that has now arrived: the gap is
        // closed, and the answer becomes an ack of everything accepted.
        if last || self.since_ack >= self.ack_group || self.owed == Some(Owed::Nak) {
            self.owed = Some(Owed::Ack);
        }
    }

    /// Drops the expected frame, a message's first, that matches no posted
    /// receive: counted, not acknowledged.
    pub fn unmatched(&mut self, h: &DataHeader) {
        self.counters.unmatched += 1;
        self.record(FlowEvent::Unmatched { seq: h.seq });
    }

    /// The acknowledgment to send now, if one is owed: `(fields, nak)`.
    pub fn take_control(&mut self) -> Option<(Control, bool)> {
        let o = self.owed.take()?;
        let epoch = self.epoch?;
        let next = self.expected;
        // Both are cumulative: the group counts from the last one sent.
        self.since_ack = 0;
        let nak = o == Owed::Nak;
        if nak {
            self.counters.naks_sent += 1;
            self.record(FlowEvent::NakOut { next });
        } else {
            self.counters.acks_sent += 1;
            self.record(FlowEvent::AckOut { next });
        }
        Some((Control { epoch, next, window: self.window }, nak))
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
