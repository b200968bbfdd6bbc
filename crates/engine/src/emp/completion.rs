//! Completions and the completion queue: the engine thread pushes, the
//! application polls (or waits in [`crate::emp::EmpEndpoint::wait`]); an
//! eventfd is readable while any is pending, once its descriptor was handed
//! out or while a thread sleeps on it. Until then nobody could see it, so
//! a thread that produces and takes its own completions makes no system
//! call for them.

use crate::emp::peer::PeerId;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
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
    q: Mutex<Queue>,
    ready: EventFd,
}

#[derive(Debug, Default)]
struct Queue {
    items: VecDeque<Completion>,
    /// The eventfd is readable.
    rung: bool,
    /// The descriptor was handed out: it follows the queue from then on.
    exported: bool,
    /// Threads about to sleep on the descriptor.
    sleepers: usize,
}

impl Queue {
    /// Makes the descriptor readable when someone could be looking at it.
    fn ring(&mut self, fd: &EventFd) {
        if !self.rung && !self.items.is_empty() && (self.exported || self.sleepers > 0) {
            fd.set();
            self.rung = true;
        }
    }
}

/// The bound on operations posted and not yet taken back as completions:
/// every post is admitted here first and every completion the application
/// takes lets one more in, so what waits in the queue (and in the engine
/// for a completion) stays within the limit however long nobody reads.
#[derive(Debug)]
pub struct Admission {
    posted: AtomicUsize,
    limit: usize,
}

impl Admission {
    pub fn new(limit: usize) -> Self {
        Admission { posted: AtomicUsize::new(0), limit: limit.max(1) }
    }

    /// Admits one post, or refuses it with `WouldBlock` at the limit.
    pub fn admit(&self) -> io::Result<()> {
        self.posted
            .fetch_update(Relaxed, Relaxed, |n| (n < self.limit).then_some(n + 1))
            .map(drop)
            .map_err(|_| io::Error::new(io::ErrorKind::WouldBlock, "EMP completion queue full: read completions"))
    }

    /// A post admitted and then refused, or a completion taken.
    pub fn release(&self) {
        let _ = self.posted.fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1));
    }

    /// Operations posted and not yet taken back.
    pub fn outstanding(&self) -> usize {
        self.posted.load(Relaxed)
    }
}

impl CompletionQueue {
    pub fn new() -> io::Result<Self> {
        Ok(CompletionQueue { q: Mutex::new(Queue::default()), ready: EventFd::new()? })
    }

    /// Appends completions (a round, once).
    pub fn push_all(&self, done: &mut Vec<Completion>) {
        if done.is_empty() {
            return;
        }
        let mut q = lock(&self.q);
        q.items.extend(done.drain(..));
        q.ring(&self.ready);
    }

    /// The oldest completion, if any.
    pub fn poll(&self) -> Option<Completion> {
        let mut q = lock(&self.q);
        let c = q.items.pop_front();
        if q.rung && q.items.is_empty() {
            self.ready.clear();
            q.rung = false;
        }
        c
    }

    /// A thread is about to sleep on the descriptor: false (and nothing
    /// changes) when completions are pending already.
    pub fn sleep(&self) -> bool {
        let mut q = lock(&self.q);
        if !q.items.is_empty() {
            return false;
        }
        q.sleepers += 1;
        true
    }

    /// The thread that slept (after [`CompletionQueue::sleep`]) woke.
    pub fn woke(&self) {
        lock(&self.q).sleepers -= 1;
    }

    /// Completions pending.
    pub fn len(&self) -> usize {
        lock(&self.q).items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A descriptor readable while completions are pending.
    pub fn fd(&self) -> RawFd {
        let mut q = lock(&self.q);
        q.exported = true;
        q.ring(&self.ready);
        self.ready.as_raw_fd()
    }

    /// The descriptor, for the endpoint's own waiters (which announce
    /// themselves with [`CompletionQueue::sleep`]).
    pub fn own_fd(&self) -> RawFd {
        self.ready.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::Admission;

    #[test]
    fn admission_refuses_at_the_limit_and_reopens_per_release() {
        let a = Admission::new(3);
        for _ in 0..3 {
            a.admit().unwrap();
        }
        assert_eq!(a.admit().unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
        assert_eq!(a.outstanding(), 3);
        a.release();
        a.admit().unwrap();
        assert!(a.admit().is_err());
        for _ in 0..5 {
            a.release();
        }
        assert_eq!(a.outstanding(), 0, "a release never goes below zero");
        assert_eq!(Admission::new(0).limit, 1);
    }
}
