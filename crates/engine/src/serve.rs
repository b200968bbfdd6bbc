//! What the engine thread needs of an endpoint, below both.
//!
//! The engine thread (`crate::engine`) keeps endpoints on its lists and
//! calls into them once per turn; endpoints (`crate::endpoint`) hold the
//! engine they are registered with. So that the engine does not depend on
//! the endpoint type, it sees endpoints only through [`Served`], and the
//! types that cross between the two (the receive scratch buffers, the
//! outcome of a receive) live here. The calls are per endpoint and turn,
//! never per datagram, so the dynamic dispatch costs nothing that counts.

use crate::backend::kernel::InMeta;
use crate::queue::L1Queue;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Instant;

/// Receive buffer per message: the largest UDP datagram or GRO super-packet.
pub(crate) const RX_BUF: usize = 1 << 16;

/// Buffers for one batched receive, owned by the receiving thread.
#[derive(Debug)]
pub(crate) struct RecvScratch {
    pub(crate) bufs: Vec<Vec<u8>>,
    pub(crate) meta: Vec<InMeta>,
}

impl RecvScratch {
    pub(crate) fn new(n: usize) -> Self {
        let n = n.clamp(1, 64);
        RecvScratch { bufs: (0..n).map(|_| vec![0u8; RX_BUF]).collect(), meta: vec![InMeta::default(); n] }
    }
}

/// What the engine did with a socket that had an arrival.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RxOutcome {
    /// Read, and the socket may still hold data: read again soon.
    More,
    /// Read dry; the watch is re-armed.
    Done,
    /// An application thread is receiving itself; the watch stays off.
    Parked,
}

/// An endpoint as the engine thread serves it. The methods that may have
/// the endpoint scheduled again take it by `Arc`: the engine owns the
/// reference it calls through at those points.
pub(crate) trait Served: Debug + Send + Sync {
    /// The endpoint's id, unique within its engine (its token in the
    /// engine's epoll sets).
    fn id(&self) -> u64;

    /// The application dropped the endpoint: the engine lets go of it.
    fn is_closed(&self) -> bool;

    /// Reaps completions and drains the send queue through `staging`.
    fn service_send(self: Arc<Self>, staging: &mut L1Queue);

    /// [`Served::service_send`] once the socket the engine's send found
    /// full has room again.
    fn resume_send(self: Arc<Self>, staging: &mut L1Queue);

    /// A thread about to sleep sends the remainder it queued; `None` when
    /// the send lock is held (the engine is asked instead).
    fn send_remainder_now(self: Arc<Self>) -> Option<bool>;

    /// Whether the send queue holds a remainder that thread `token` queued
    /// and that waits out its coalescing interval.
    fn remainder_of(&self, token: u64) -> bool;

    /// Waits until the send queues are empty or `deadline` passes.
    fn flush(self: Arc<Self>, deadline: Instant) -> bool;

    /// The socket had an arrival or may still hold data.
    fn engine_receive(&self, scratch: &mut RecvScratch) -> RxOutcome;

    /// Parked for TX timestamps alone (checked less often).
    fn rx_stamp_parked(&self) -> bool;

    /// The application's receive calls as of the engine's last look.
    fn rx_calls_seen(&self) -> u64;

    /// For a parked endpoint: whether the engine may let go of it.
    fn rx_idle_since_last_look(&self) -> bool;
}
