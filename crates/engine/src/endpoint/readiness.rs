//! Readiness for poll, select and epoll: the ring's eventfd, the error
//! flag, writability, and the pending asynchronous error.

use super::{err, lock, Endpoint, EpInner};
use crate::ring::RecvRing;
use crate::stats::Stats;
use crate::sys::error_flag::ErrorFlag;
use crate::sys::fdevents::EventFd;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{Ordering::Acquire, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Receive-side state under one lock: the ring and the readiness flag.
#[derive(Debug)]
pub(super) struct RecvSide {
    pub(super) ring: RecvRing,
    /// Readable exactly when the ring holds a datagram; created on demand.
    pub(super) ready: Option<Arc<EventFd>>,
    /// Whether `ready` is readable now: it is written only on a change, so
    /// a receive that fills and empties the ring itself costs no syscall.
    pub(super) ready_set: bool,
    /// Raised while an asynchronous error is pending, once made
    /// ([`Endpoint::error_fd`]); from then on `ready` stands for datagrams
    /// only, so an epoll set holding both reports the error as `EPOLLERR`
    /// and not as input.
    pub(super) err: Option<Arc<ErrorFlag>>,
}

impl RecvSide {
    /// Makes `ready` readable (one syscall, only on a change).
    pub(super) fn signal(&mut self) {
        if let Some(fd) = &self.ready {
            if !self.ready_set {
                fd.set();
                self.ready_set = true;
            }
        }
    }

    /// An asynchronous error became pending: the error flag goes up when
    /// there is one, else `ready` stands for the error.
    pub(super) fn error_ready(&mut self) {
        match &self.err {
            Some(f) => f.raise(),
            None => self.signal(),
        }
    }

    /// Makes `ready` unreadable (one syscall, only on a change).
    pub(super) fn unsignal(&mut self) {
        if let Some(fd) = &self.ready {
            if self.ready_set {
                fd.clear();
                self.ready_set = false;
            }
        }
    }
}

/// How many datagrams an endpoint's ring holds, stored under the ring's
/// lock after every push and pop and read without it, so readiness checks
/// (poll, select) take no lock. A reader racing a pop may see a datagram
/// another thread is taking, as a second thread receiving on a kernel
/// socket may. It can be held apart from the endpoint (and outlive it).
#[derive(Debug)]
pub struct RingLen(pub(super) std::sync::atomic::AtomicUsize);

impl RingLen {
    /// Datagrams waiting.
    pub fn get(&self) -> usize {
        self.0.load(Acquire)
    }
}

impl Endpoint {
    /// A file descriptor that is readable exactly while a datagram waits in
    /// the ring, for use with poll/epoll.
    pub fn poll_fd(&self) -> io::Result<RawFd> {
        let mut rs = lock(&self.inner.recv);
        Ok(self.inner.ready_fd(&mut rs)?.as_raw_fd())
    }

    /// A descriptor that reports `POLLERR` (and nothing else) exactly while
    /// an asynchronous error is pending (see [`ErrorFlag`]), made on first
    /// use. Once it exists, [`Endpoint::poll_fd`] stands for datagrams only:
    /// a poll or epoll set that holds the socket's input descriptors must
    /// hold this one too.
    pub fn error_fd(&self) -> io::Result<RawFd> {
        let i = &self.inner;
        let mut rs = lock(&i.recv);
        if rs.err.is_none() {
            let f = Arc::new(ErrorFlag::new()?);
            if i.pending_error.load(Relaxed) != 0 {
                f.raise();
                if rs.ring.is_empty() {
                    rs.unsignal();
                }
            }
            rs.err = Some(f);
        }
        Ok(rs.err.as_ref().expect("just made").as_raw_fd())
    }

    /// Whether a send would be accepted without waiting, as `POLLOUT` on a
    /// kernel socket reports it: L1 is less than half full.
    pub fn writable(&self) -> bool {
        lock(&self.inner.send).writable()
    }

    /// Waits at most `timeout` for [`Endpoint::writable`]; the engine wakes
    /// the wait as soon as it takes L1. Returns whether it became writable.
    pub fn wait_writable(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut s = lock(&self.inner.send);
        loop {
            if s.writable() {
                return true;
            }
            let now = Instant::now();
            if now >= deadline || self.inner.engine.is_stopped() {
                return false;
            }
            self.inner.kick(&mut s);
            s = self.inner.wait_send(s, deadline - now);
        }
    }

    /// Reads of the socket made on application threads so far (one relaxed
    /// load, unlike [`Endpoint::stats`]): a caller that finds it moved across
    /// a receive that found nothing knows the socket itself was found empty.
    pub fn socket_reads(&self) -> u64 {
        self.inner.stats.direct_recv_calls.load(Relaxed)
    }

    /// Datagrams waiting in the ring.
    pub fn pending_datagrams(&self) -> usize {
        self.inner.ring_len.get()
    }

    /// The ring's datagram count, as a handle that can be read without the
    /// endpoint (see [`RingLen`]).
    pub fn ring_len(&self) -> Arc<RingLen> {
        self.inner.ring_len.clone()
    }

    /// Readiness for input without waiting: true when the ring holds a
    /// datagram, after first reading the socket on the caller's thread if
    /// the ring is empty and the last read found a stream arriving (it then
    /// likely holds more). That read replaces the poll a readiness check
    /// would otherwise make before the receive; for sparse traffic (the
    /// last read found one datagram) nothing is read and the caller polls.
    pub fn ready_or_fill(&self) -> bool {
        let i = &self.inner;
        if i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0 {
            return true;
        }
        if i.last_fill.load(Relaxed) < 2 {
            return false;
        }
        let Ok(_g) = i.rx_sock.try_lock() else { return false };
        if i.rx_stopped.load(Relaxed) {
            return false;
        }
        i.fill_on_caller(true, usize::MAX);
        i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0
    }

    /// Readiness for input after a read of the socket on the spot, whatever
    /// the last read found: for a caller told by the backend's descriptor
    /// that input may wait. That descriptor does not promise a datagram
    /// (under the TCP transport it is readable for a partial frame, or
    /// for a wake-up with nothing queued), while a program told
    /// "readable" expects its next nonblocking receive to return one. A
    /// read under way on another thread is waited for (it lands in the
    /// ring), unless that thread sleeps inside its read.
    pub fn ready_after_read(&self) -> bool {
        let i = &self.inner;
        if i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0 {
            return true;
        }
        let g = loop {
            match i.rx_sock.try_lock() {
                Ok(g) => break Some(g),
                Err(_) if i.rx_blocked.load(SeqCst) => break None,
                Err(_) => std::thread::yield_now(),
            }
        };
        if g.is_some() && !i.rx_stopped.load(Relaxed) {
            i.fill_on_caller(true, usize::MAX);
        }
        i.ring_len.get() > 0 || i.pending_error.load(Relaxed) != 0
    }

    /// True while an asynchronous error the socket reported (an ICMP port
    /// unreachable on a connected socket, say) waits for the application's
    /// next send or receive, as the kernel socket's `sk_err` would.
    pub fn has_pending_error(&self) -> bool {
        self.inner.pending_error.load(Relaxed) != 0
    }

    /// Takes that error, as `getsockopt(SO_ERROR)` does: its errno, 0 when
    /// none. Input readiness no longer stands for it afterwards.
    pub fn take_error(&self) -> i32 {
        let Some(e) = self.inner.take_pending_error() else { return 0 };
        self.inner.error_taken();
        e.raw_os_error().unwrap_or(libc::EIO)
    }

    /// Makes `code` the socket's pending error, for the next send or
    /// receive (or SO_ERROR) to report: an error taken off the kernel
    /// socket by someone other than the engine.
    pub fn note_error(&self, code: i32) {
        if code != 0 {
            self.inner.set_pending_error(code);
            lock(&self.inner.recv).error_ready();
        }
    }

    /// Size of the next waiting datagram (FIONREAD), 0 when none.
    pub fn next_datagram_len(&self) -> usize {
        lock(&self.inner.recv).ring.peek_len().unwrap_or(0)
    }
}

impl EpInner {
    pub(super) fn take_pending_error(&self) -> Option<io::Error> {
        // A plain load first: the common case writes nothing shared.
        if self.pending_error.load(Relaxed) == 0 {
            return None;
        }
        match self.pending_error.swap(0, SeqCst) {
            0 => None,
            e => {
                Stats::add(&self.stats.errors_surfaced, 1);
                Some(err(e))
            }
        }
    }

    /// After a pending error was taken outside a receive (by a send or
    /// SO_ERROR): the ring's eventfd, set for the error, stands for
    /// nothing now unless the ring holds a datagram.
    pub(super) fn error_taken(&self) {
        let mut rs = lock(&self.recv);
        if self.pending_error.load(Relaxed) == 0 {
            if let Some(f) = &rs.err {
                f.clear();
            }
            if rs.ring.is_empty() {
                rs.unsignal();
            }
        }
    }

    pub(super) fn set_pending_error(&self, e: i32) {
        self.pending_error.store(e, SeqCst);
    }

    pub(super) fn ready_fd<'a>(&self, rs: &'a mut RecvSide) -> io::Result<&'a Arc<EventFd>> {
        if rs.ready.is_none() {
            rs.ready = Some(Arc::new(EventFd::new()?));
            rs.ready_set = false;
            if !rs.ring.is_empty() || (self.pending_error.load(Relaxed) != 0 && rs.err.is_none()) {
                rs.signal();
            }
        }
        Ok(rs.ready.as_ref().expect("just created"))
    }
}
