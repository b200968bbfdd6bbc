//! The two-level send queue as a state machine: the single source of truth
//! shared by the engine (which records the events it performs) and
//! `eudp verify` (which emits the Promela model from the same table).
//!
//! Contract with `queue.rs`: the variants of [`QueueEvent`] and the fields of
//! [`QueueState`] are what the engine records; they may be extended, not
//! renamed or removed.

/// Abstract state of one endpoint's two-level send queue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QueueState {
    /// Datagrams waiting in L1 (host memory).
    pub l1: u32,
    /// Descriptors (backend operations) in L2: posted and not yet reaped.
    pub l2: u32,
    /// Of those, descriptors whose backend operation has returned but whose
    /// completion the engine has not reaped yet.
    pub done_unreaped: u32,
    /// Shutdown requested: no new posts are accepted, the engine flushes.
    pub shutdown: bool,
}

/// One step the engine or an application thread takes on a send queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueEvent {
    /// Caller found L1 empty and L2 below its bound and posted the datagram
    /// on its own thread: `l2 += 1`.
    DirectPost,
    /// Caller queued a datagram in L1: `l1 += 1`.
    Enqueue,
    /// Caller found L1 full (or the queue shut down) and was refused; no change.
    Refuse,
    /// A direct post's backend operation returned: `done_unreaped += 1`.
    DirectDone,
    /// The engine (completion handler) reaped `n` completions:
    /// `l2 -= n`, `done_unreaped -= n`.
    Reap { n: u32 },
    /// The engine moved `datagrams` (≥ 1) from L1 into one backend
    /// descriptor: `l1 -= datagrams`, `l2 += 1`.
    TakeBatch { datagrams: u32 },
    /// The engine's own backend operation returned; it reaps it at once:
    /// `l2 -= 1`.
    BatchDone,
    /// Shutdown requested.
    Shutdown,
}
