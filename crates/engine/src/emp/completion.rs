//! Completions and the completion queue: the engine thread pushes, the
//! application polls (or waits in [`crate::emp::EmpEndpoint::wait`]); an
//! eventfd is readable while any is pending.

use crate::emp::peer::PeerId;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;

/// Which operation completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Send,
    Recv,
}

/// How it completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// A send whose flow made no progress within the deadline.
    TimedOut,
    /// A receive whose message was longer than its capacity: `data` holds
    /// the first `capacity` bytes, `len` the message's length.
    Truncated,
    /// A receive removed by `cancel`.
    Canceled,
    /// The peer was removed or the endpoint shut down first.
    Closed,
    /// A send longer than the largest EMP message.
    TooLong,
}

/// One finished send or receive.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completion {
    pub op: Op,
    pub status: Status,
    /// The context the operation was posted with.
    pub context: u64,
    /// The peer sent to or received from (none for a receive canceled or
    /// closed before a message matched it).
    pub peer: Option<PeerId>,
    pub tag: u64,
    /// The message's length.
    pub len: usize,
    /// A receive's bytes (empty for a send).
    pub data: Vec<u8>,
}

/// The completion queue of an endpoint.
#[derive(Debug)]
pub struct CompletionQueue {
    q: Mutex<VecDeque<Completion>>,
    ready: EventFd,
}

impl CompletionQueue {
    pub fn new() -> io::Result<Self> {
        Ok(CompletionQueue { q: Mutex::new(VecDeque::new()), ready: EventFd::new()? })
    }

    /// Appends completions (the engine thread, once per round).
    pub fn push_all(&self, done: &mut Vec<Completion>) {
        if done.is_empty() {
            return;
        }
        let mut q = lock(&self.q);
        let was_empty = q.is_empty();
        q.extend(done.drain(..));
        if was_empty {
            self.ready.set();
        }
    }

    /// The oldest completion, if any.
    pub fn poll(&self) -> Option<Completion> {
        let mut q = lock(&self.q);
        let c = q.pop_front();
        if c.is_some() && q.is_empty() {
            self.ready.clear();
        }
        c
    }

    /// Completions pending.
    pub fn len(&self) -> usize {
        lock(&self.q).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A descriptor readable while completions are pending.
    pub fn fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}
