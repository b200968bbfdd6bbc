//! The steps of one EMP flow: the frames one endpoint sends to one peer, and
//! the acknowledgments that come back.
//!
//! Every data frame of a flow carries a sequence number, counted across the
//! messages the flow carries; the receiver accepts only the next expected
//! sequence number and holds frames that arrive early within the window
//! (selective repeat), so messages arrive whole and in order per peer.
//! Acknowledgments are cumulative: `next` is the first sequence number the
//! receiver has not accepted; their selective part names the held frames,
//! and the sender repairs only the frames reported missing.
//!
//! This vocabulary is shared by the protocol code, which records the events
//! it performs when recording is on, and by the transition table, which
//! checks recorded traces and emits the Promela model `eudp verify` checks.
//! Variants may be added, not renamed or removed.

/// One step of one flow, on the side (sender or receiver) that performs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FlowEvent {
    /// Sender: transmitted data frame `seq` for the first time (`seq` is
    /// the next new sequence number and lies within the window).
    SendNew { seq: u32 },
    /// Sender: transmitted data frame `seq` again (sent before, not yet
    /// acknowledged), after a negative acknowledgment or a timeout.
    Resend { seq: u32 },
    /// Sender: received a cumulative acknowledgment; frames below `next`
    /// are released.
    AckIn { next: u32 },
    /// Sender: received a negative acknowledgment; the receiver expects
    /// `next`, so the sender goes back to it.
    NakIn { next: u32 },
    /// Sender: the retransmission timer fired with frames unacknowledged.
    Timeout,
    /// Sender: frames from `seq` on were not transmitted after all (the
    /// socket's buffer was full) and are sent again next.
    GoBack { seq: u32 },
    /// Sender: gave up on the flow after its deadline; unacknowledged
    /// messages complete with an error.
    GiveUp,
    /// Receiver: accepted data frame `seq`, the one it expected.
    Accept { seq: u32 },
    /// Receiver: dropped frame `seq` below the expected one (a duplicate).
    Duplicate { seq: u32 },
    /// Receiver: dropped frame `seq` above the expected one (a gap before
    /// it): beyond the window, or a copy of a frame held already.
    Gap { seq: u32 },
    /// Receiver: dropped frame `seq`, the expected first frame of a message,
    /// because no posted receive matches it (and no unexpected-message slot
    /// is free); it is not acknowledged, so the sender sends it again.
    Unmatched { seq: u32 },
    /// Receiver: sent a cumulative acknowledgment of every frame below `next`.
    AckOut { next: u32 },
    /// Receiver: sent a negative acknowledgment: it expects `next`.
    NakOut { next: u32 },
    /// Sender: transmitted data frame `seq` again, alone (selective
    /// repeat): reported missing by the receiver, or the oldest
    /// unacknowledged one after a timeout.
    Repair { seq: u32 },
    /// Receiver: kept data frame `seq`, above the expected one within the
    /// window, until the frames before it arrive; it is accepted then.
    Hold { seq: u32 },
    /// Receiver: took the acknowledgment owed for a message's last frame,
    /// naming `next`, to ride on a data frame of the reverse flow, or to
    /// leave alone when the delay ends; a later acknowledgment replaces it
    /// if it is still waiting.
    AckDelayed { next: u32 },
}
