//! What the application side of an endpoint and its engine thread share:
//! the command queue with its doorbell, the completion queue, the stop
//! flag; and what the send and receive sides
//! of one peer share, its [`PeerLink`].

use crate::emp::completion::CompletionQueue;
use crate::emp::lease::Lease;
use crate::emp::matching::PostedRecv;
use crate::emp::peer::PeerId;
use crate::sys::fdevents::{EventFd, TimerFd};
use crate::sys::sync::lock;
use eudp_wire::emp::Control;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::{Release, SeqCst};
use std::sync::atomic::{fence, AtomicBool, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A request of the application, carried out on the engine thread in order.
#[derive(Debug)]
pub enum Command {
    /// A peer joins the address vector; `queued` counts its flow's bytes
    /// queued (the application adds, the engine subtracts on completion).
    Insert {
        peer: PeerId,
        addr: SocketAddr,
        queued: Arc<AtomicUsize>,
    },
    /// A peer leaves: its sends complete as closed.
    Remove {
        peer: PeerId,
    },
    Send {
        peer: PeerId,
        tag: u64,
        data: Vec<u8>,
        context: u64,
    },
    Recv(PostedRecv),
}

/// The state both sides of an endpoint hold.
#[derive(Debug)]
pub struct Shared {
    commands: Mutex<Vec<Command>>,
    /// `commands` is not empty (changed under its lock): a round with no
    /// command to take skips the lock.
    queued: AtomicBool,
    /// Rung when a command is queued or the endpoint stops.
    pub doorbell: Doorbell,
    /// Set by a round on another thread to an earlier flow timer, so the
    /// engine thread wakes for it without being woken now.
    pub timer: TimerFd,
    pub cq: CompletionQueue,
    pub stop: AtomicBool,
    /// One doorbell per engine thread of a two-thread scheme: rung when
    /// the other thread leaves work for its stages.
    pub wake: [Doorbell; 2],
    /// An engine thread woke for the socket while another thread held the
    /// runtime and left the frames to it (see [`Shared::note_missed`]).
    missed: AtomicBool,
    /// Whether a waiting application thread holds the socket (base scheme).
    pub lease: Lease,
}

/// An eventfd doorbell that skips the system calls that would change
/// nothing: ringing a bell already rung, quieting a quiet one. Its owner
/// quiets it before it looks for work, so a ring after that wakes it again.
#[derive(Debug)]
pub struct Doorbell {
    fd: EventFd,
    rung: AtomicBool,
}

impl Doorbell {
    pub fn new() -> io::Result<Self> {
        Ok(Doorbell { fd: EventFd::new()?, rung: AtomicBool::new(false) })
    }

    /// Makes the descriptor readable unless it already is.
    pub fn set(&self) {
        if !self.rung.swap(true, AcqRel) {
            self.fd.set();
        }
    }

    /// Quiets the bell (before its owner takes its work).
    pub fn clear(&self) {
        if self.rung.swap(false, AcqRel) {
            self.fd.clear();
        }
    }

    /// Drains the descriptor whatever the flag says; for an owner that
    /// woke on it and clears it next. A ring racing a clear can write the
    /// descriptor after the flag went down, which would leave it readable.
    pub fn drain(&self) {
        self.fd.clear();
    }
}

impl AsRawFd for Doorbell {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Shared {
    pub fn new() -> io::Result<Self> {
        Ok(Shared {
            commands: Mutex::new(Vec::new()),
            queued: AtomicBool::new(false),
            doorbell: Doorbell::new()?,
            timer: TimerFd::new()?,
            cq: CompletionQueue::new()?,
            stop: AtomicBool::new(false),
            wake: [Doorbell::new()?, Doorbell::new()?],
            missed: AtomicBool::new(false),
            lease: Lease::default(),
        })
    }

    /// Queues a command and wakes the engine thread (once per batch of
    /// commands it has not taken yet).
    pub fn command(&self, c: Command) {
        let mut q = lock(&self.commands);
        let first = q.is_empty();
        q.push(c);
        self.queued.store(true, Release);
        drop(q);
        if first {
            self.doorbell.set();
        }
    }

    /// Queues a command without waking the engine thread: the caller runs
    /// a round itself, or rings the doorbell when it cannot.
    pub fn command_quiet(&self, c: Command) {
        let mut q = lock(&self.commands);
        q.push(c);
        self.queued.store(true, Release);
    }

    /// Takes every queued command, in order.
    pub fn take_commands(&self, out: &mut Vec<Command>) {
        self.doorbell.clear();
        // A command queued after this look rings the doorbell, or its
        // thread runs a round itself.
        if !self.queued.load(Acquire) {
            return;
        }
        let mut q = lock(&self.commands);
        std::mem::swap(&mut *q, out);
        self.queued.store(false, Release);
    }

    /// Asks the engine thread to stop.
    pub fn request_stop(&self) {
        self.stop.store(true, Relaxed);
        self.doorbell.set();
        for w in &self.wake {
            w.set();
        }
    }

    /// An engine thread woke for the socket and is about to try the
    /// runtime's lock; if the lock is held, the holder reads the socket
    /// instead. The fence pairs with the one in [`Shared::take_missed`]:
    /// either the holder sees this flag after it unlocks, or this thread's
    /// try finds the lock free.
    pub fn note_missed(&self) {
        self.missed.store(true, Relaxed);
        fence(SeqCst);
    }

    /// The socket is about to be read to its end: earlier misses are
    /// covered by that read.
    pub fn forget_missed(&self) {
        self.missed.store(false, Relaxed);
    }

    /// After unlocking the runtime: true when an engine thread left frames
    /// that arrived after this thread's read of the socket.
    pub fn take_missed(&self) -> bool {
        fence(SeqCst);
        self.missed.swap(false, Relaxed)
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

/// What the two sides of one peer meet in: the acknowledgment the receive
/// side parked (step 7) for the send side to carry on its next data frame
/// to that peer (step 2). The receive side sends it alone once `due`
/// passes, and replaces it by any later acknowledgment it sends.
#[derive(Debug, Default)]
pub struct PeerLink {
    /// Whether an acknowledgment is parked: lets step 2 skip the lock.
    any: AtomicBool,
    parked: Mutex<Option<Parked>>,
}

#[derive(Clone, Copy, Debug)]
struct Parked {
    control: Control,
    due: Instant,
}

impl PeerLink {
    /// Parks `c`; a parked one it replaces keeps its due time, so that a
    /// stream of short messages is still acknowledged once per delay.
    /// Returns when the parked acknowledgment is due.
    pub fn park(&self, c: Control, due: Instant) -> Instant {
        let mut p = lock(&self.parked);
        let due = p.map_or(due, |old| old.due.min(due));
        *p = Some(Parked { control: c, due });
        self.any.store(true, Relaxed);
        due
    }

    /// Whether an acknowledgment is parked (one atomic load).
    pub fn is_parked(&self) -> bool {
        self.any.load(Relaxed)
    }

    /// The parked acknowledgment, taken to ride on a data frame.
    pub fn take(&self) -> Option<Control> {
        if !self.any.load(Relaxed) {
            return None;
        }
        self.any.store(false, Relaxed);
        lock(&self.parked).take().map(|p| p.control)
    }

    /// The parked acknowledgment if its delay has ended by `now`.
    pub fn take_due(&self, now: Instant) -> Option<Control> {
        if !self.any.load(Relaxed) {
            return None;
        }
        let mut p = lock(&self.parked);
        if p.is_some_and(|p| p.due <= now) {
            self.any.store(false, Relaxed);
            return p.take().map(|p| p.control);
        }
        None
    }

    /// Drops the parked acknowledgment: a later one went out.
    pub fn clear(&self) {
        if self.any.swap(false, Relaxed) {
            *lock(&self.parked) = None;
        }
    }
}
