//! The queues between stages that run on different engine threads (the
//! two-thread schemes): receive frame → receive acknowledgment (acks and
//! NAKs), receive frame → receive bookkeeping (data frames), receive
//! bookkeeping → receiving (frames a message takes). They live beside the
//! send and receive state under the runtime's lock and are bounded: the
//! thread reading the socket stops reading (the kernel buffers) while the
//! queues are full.

use crate::emp::peer::PeerId;
use eudp_wire::emp::Control;
use std::collections::VecDeque;

/// Frames the data and control queues hold together before the socket
/// reader stops.
pub const CAPACITY: usize = 8192;

/// The hand-off queues.
#[derive(Debug, Default)]
pub struct Handoff {
    /// Acknowledgments (and NAKs, `true`) for step 3.
    pub acks: VecDeque<(PeerId, Control, bool)>,
    /// Data datagrams for step 4.
    pub data: VecDeque<(PeerId, Vec<u8>)>,
    /// Data datagrams step 4 accepted, for step 6.
    pub accepted: VecDeque<(PeerId, Vec<u8>)>,
    /// The socket reader stopped on full queues.
    pub rx_stalled: bool,
}

impl Handoff {
    /// True when the socket reader may read another batch.
    pub fn has_room(&self, batch: usize) -> bool {
        self.acks.len() + self.data.len() + self.accepted.len() + batch <= CAPACITY
    }

    /// True when step 6 has a frame of `peer` still to take: step 4 must
    /// wait, because a flow accepts its frames only in order.
    pub fn accepting(&self, peer: PeerId) -> bool {
        self.accepted.iter().any(|(p, _)| *p == peer)
    }
}
