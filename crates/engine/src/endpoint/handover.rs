//! Handing the socket's receive side back to its owner (the preload shim's
//! fallback) and the datagrams that go with it.

use super::{lock, Endpoint};
use crate::serve::{RecvScratch, RX_BUF};
use crate::sys::fdevents::EventFd;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a receive returns once [`Endpoint::stop_receiving`] handed the
/// socket back to its owner and the ring holds nothing for it: the caller
/// receives on the owner's path instead (see [`is_handed_over`]).
#[derive(Debug)]
struct HandedOver;

impl std::fmt::Display for HandedOver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the socket was handed back to its owner")
    }
}

impl std::error::Error for HandedOver {}

pub(super) fn handed_over() -> io::Error {
    io::Error::other(HandedOver)
}

/// True for the error a receive returns after [`Endpoint::stop_receiving`]
/// (a receive that began on the engine and must be made again on the
/// socket's owner's path: its kept datagrams first, then the kernel).
pub fn is_handed_over(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|x| x.is::<HandedOver>())
}

/// One datagram handed back by [`Endpoint::take_received`]: payload,
/// source, and what the kernel reported with it (destination, TOS, TTL).
pub type KeptDatagram = (Vec<u8>, SocketAddr, Option<crate::backend::PktInfo>);

/// What [`Endpoint::take_received`] moved out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Taken {
    /// Datagrams appended (from the ring and the socket).
    pub datagrams: usize,
    /// Bytes read from the socket (each datagram counting at least one).
    pub socket_bytes: usize,
    /// The last read found the socket empty.
    pub socket_empty: bool,
    /// The socket was left to a thread asleep inside its read, with nothing
    /// queued: what that read takes reaches the ring afterwards.
    pub reader_asleep: bool,
}

impl Endpoint {
    /// Hands the socket's receive side back to its owner, who reads the
    /// kernel socket itself from now on (the preload shim's fallback): the
    /// engine stops watching and reading it for good. What was already
    /// taken off the socket stays in the ring for
    /// [`Endpoint::take_received`].
    ///
    /// Receives that find the ring empty from then on fail with the error
    /// [`is_handed_over`] recognises, for the caller to receive on its own
    /// path. A thread already asleep inside a read of the socket reads one
    /// message at most (see [`EpInner::block_in_read`]) and returns it.
    pub fn stop_receiving(&self) {
        let i = &self.inner;
        {
            let _w = lock(&i.rx_watch);
            i.rx_stopped.store(true, SeqCst);
            i.rx_armed.store(false, SeqCst);
            let _ = i.engine.epoll.remove(i.backend.raw_fd());
        }
        if !i.backend.capabilities().input_reaches_raw_fd {
            // A receive asleep in `recv_wait` polls the backend and the
            // ring, which input no longer reaches: woken, it finds
            // `rx_stopped` and is made again on the owner's path. (Under
            // the recv lock: one that takes it later sees `rx_stopped`.)
            lock(&i.recv).signal();
        }
    }

    /// After [`Endpoint::stop_receiving`]: moves what the ring holds, then
    /// what the socket holds — read and split exactly as the engine reads
    /// it (a GRO super-packet becomes its datagrams) — to the back of
    /// `out`, in arrival order. Reading the socket stops when it is found
    /// empty or after `max_bytes` (each datagram counting at least one
    /// byte), so a sender that keeps sending cannot hold the caller here.
    ///
    /// A thread sleeping inside a read of the socket (a blocking receive
    /// that began before the hand-over) keeps the socket. With `leave_asleep`
    /// and nothing in the socket that read is not waited for: only the ring
    /// is taken and `reader_asleep` says so (what the read brings later
    /// reaches the ring, see [`Endpoint::reader_asleep`]). Otherwise the
    /// read is waited for, at most `wait`; after that only the ring is
    /// taken and the socket is reported as not found empty.
    pub fn take_received(
        &self,
        max_bytes: usize,
        wait: Duration,
        leave_asleep: bool,
        out: &mut std::collections::VecDeque<KeptDatagram>,
    ) -> Taken {
        let i = &self.inner;
        let deadline = Instant::now() + wait;
        let mut asleep = false;
        let guard = loop {
            match i.rx_sock.try_lock() {
                Ok(g) => break Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => break Some(p.into_inner()),
                // Asleep with nothing to read: it may sleep for good.
                Err(std::sync::TryLockError::WouldBlock)
                    if leave_asleep && i.rx_blocked.load(SeqCst) && !crate::sys::poll::has_data(i.backend.raw_fd()) =>
                {
                    asleep = true;
                    break None;
                }
                Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Err(std::sync::TryLockError::WouldBlock) => break None,
            }
        };
        let mut buf = vec![0u8; RX_BUF];
        // Its own scratch, not the thread's: a fallback may run from an
        // exit handler, after this thread's locals are gone.
        let mut scratch = RecvScratch::new(4);
        let mut taken = Taken { datagrams: 0, socket_bytes: 0, socket_empty: false, reader_asleep: asleep };
        loop {
            {
                let mut rs = lock(&i.recv);
                let mut info = None;
                while let Some(r) = i.pop(&mut rs, &mut buf, false, Some(&mut info)) {
                    out.push_back((buf[..r.copied].to_vec(), r.src, info.take()));
                    taken.datagrams += 1;
                }
            }
            if guard.is_none() || taken.socket_bytes >= max_bytes {
                return taken;
            }
            let before = i.stats.bytes_received.load(Relaxed);
            let fill = i.fill_ring(&mut scratch, 1, false);
            if fill.added == 0 {
                // Nothing read: the socket is empty (or reported an error,
                // kept for the owner as the engine keeps it).
                taken.socket_empty = !fill.ring_full && i.pending_error.load(Relaxed) == 0;
                return taken;
            }
            let bytes = i.stats.bytes_received.load(Relaxed).wrapping_sub(before) as usize;
            taken.socket_bytes += bytes.max(fill.added);
        }
    }

    /// After [`Endpoint::stop_receiving`]: a thread is still inside the
    /// read of the socket it began before (see [`EpInner::block_in_read`]).
    /// Once this is false it stays false, and whatever that read brought is
    /// in the ring: the read pushes it there before it lets go.
    pub fn reader_asleep(&self) -> bool {
        self.inner.rx_blocked.load(SeqCst)
    }

    /// Takes the ring's readiness descriptor (when one was made) away from
    /// the endpoint, which never touches it again. After a fallback it
    /// stands for the datagrams [`Endpoint::take_received`] handed over:
    /// an epoll set the application registered it in keeps reporting them.
    pub fn take_ready_fd(&self) -> Option<Arc<EventFd>> {
        let mut rs = lock(&self.inner.recv);
        // The error flag (if any) reports nothing from now on: what the
        // owner's epoll sets hold of it must not stand for a stale error.
        if let Some(f) = rs.err.take() {
            f.clear();
        }
        rs.ready.take()
    }
}
