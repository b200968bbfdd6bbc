//! Counters of an EMP endpoint and of each of its peers.

use crate::emp::flow::recv::RecvCounters;
use crate::emp::flow::send::SendCounters;
use serde::Serialize;

/// Frames and messages of one peer, or of a whole endpoint (the sum over
/// its peers, past and present, plus what no peer can be charged with).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EmpCounters {
    /// Data, ACK and NAK frames sent.
    pub frames_sent: u64,
    /// Frames received and parsed (from a known peer).
    pub frames_received: u64,
    /// Data frames sent again.
    pub retransmits: u64,
    /// ACK frames sent alone.
    pub acks_sent: u64,
    /// Acknowledgments sent on a data frame of the reverse flow.
    pub acks_piggybacked: u64,
    /// Acknowledgments received, alone or on a data frame.
    pub acks_received: u64,
    pub naks_sent: u64,
    pub naks_received: u64,
    /// Data frames received below the expected one, and copies of held ones.
    pub duplicates: u64,
    /// Data frames received above the expected one beyond the window.
    pub gaps: u64,
    /// Data frames received above the expected one within the window and
    /// held until the frames before them arrive (selective repeat).
    pub held: u64,
    /// First frames dropped for want of a posted receive.
    pub unmatched: u64,
    /// Messages taken into the unexpected-message queue.
    pub unexpected: u64,
    /// Messages longer than the receive that took them.
    pub truncated: u64,
    /// Frames of another incarnation of a flow, ignored.
    pub stale: u64,
    /// Retransmission timeouts.
    pub timeouts: u64,
    /// Flows that gave up at their deadline.
    pub give_ups: u64,
    /// Times frames handed to the socket were not taken (a full buffer)
    /// and the flow went back to send them again.
    pub go_backs: u64,
    /// Messages acknowledged whole.
    pub messages_sent: u64,
    /// Messages sent that completed with an error.
    pub messages_failed: u64,
    /// Messages received whole.
    pub messages_received: u64,
    /// Datagrams that are not EMP frames (endpoint only).
    pub malformed: u64,
    /// Frames from addresses not in the address vector (endpoint only).
    pub unknown_peer: u64,
}

impl EmpCounters {
    /// Folds in a flow's sending counters (`frames_sent` counts data only
    /// there; control frames are added by the receiving side).
    pub fn add_send(&mut self, s: &SendCounters) {
        self.frames_sent += s.frames_sent;
        self.retransmits += s.retransmits;
        self.acks_piggybacked += s.acks_piggybacked;
        self.acks_received += s.acks_received;
        self.naks_received += s.naks_received;
        self.stale += s.stale_acks;
        self.timeouts += s.timeouts;
        self.give_ups += s.give_ups;
        self.go_backs += s.go_backs;
        self.messages_sent += s.messages_acked;
        self.messages_failed += s.messages_failed;
    }

    /// Folds in a flow's receiving counters.
    pub fn add_recv(&mut self, r: &RecvCounters) {
        self.frames_sent += r.acks_sent + r.naks_sent;
        self.acks_sent += r.acks_sent;
        self.naks_sent += r.naks_sent;
        self.duplicates += r.duplicates;
        self.gaps += r.gaps;
        self.held += r.held;
        self.unmatched += r.unmatched;
        self.stale += r.stale;
    }

    /// Adds every field of `o`.
    pub fn add(&mut self, o: &EmpCounters) {
        let f = [
            (&mut self.frames_sent, o.frames_sent),
            (&mut self.frames_received, o.frames_received),
            (&mut self.retransmits, o.retransmits),
            (&mut self.acks_sent, o.acks_sent),
            (&mut self.acks_piggybacked, o.acks_piggybacked),
            (&mut self.acks_received, o.acks_received),
            (&mut self.naks_sent, o.naks_sent),
            (&mut self.naks_received, o.naks_received),
            (&mut self.duplicates, o.duplicates),
            (&mut self.gaps, o.gaps),
            (&mut self.held, o.held),
            (&mut self.unmatched, o.unmatched),
            (&mut self.unexpected, o.unexpected),
            (&mut self.truncated, o.truncated),
            (&mut self.stale, o.stale),
            (&mut self.timeouts, o.timeouts),
            (&mut self.give_ups, o.give_ups),
            (&mut self.go_backs, o.go_backs),
            (&mut self.messages_sent, o.messages_sent),
            (&mut self.messages_failed, o.messages_failed),
            (&mut self.messages_received, o.messages_received),
            (&mut self.malformed, o.malformed),
            (&mut self.unknown_peer, o.unknown_peer),
        ];
        for (a, b) in f {
            *a += b;
        }
    }
}
