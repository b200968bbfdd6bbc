//! The engine's watch on a socket's input: reading for an application that
//! is away, parking while the application reads itself, and handing the
//! reading to application threads that wait on the socket.

use super::{lock, Endpoint, EpInner};
use crate::serve::{RecvScratch, RxOutcome};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};

/// Receive rounds per readiness event before the engine moves on (fairness).
const RX_ROUNDS: usize = 4;

/// Receives between two sleeping polls of a socket up to which its input
/// counts as sparse for [`Endpoint::app_poll_begin`]: a server reading a
/// request, then `EAGAIN`, with room for a second request. A stream's
/// receiver drains a run of datagrams between polls.
const SPARSE_RECEIVES: u64 = 4;

impl Endpoint {
    /// The application waits for input on the socket itself (the preload
    /// shim: the socket is in one of the program's epoll sets, next to the
    /// ring's eventfd), so an arrival wakes an application thread, which
    /// reads the socket on its own (as [`Endpoint::recv_with`] does when
    /// the ring is empty). The engine then stops watching the socket for
    /// input: otherwise each arrival wakes the engine thread as well, whose
    /// read races the woken application thread (which then waits for that
    /// read and the ring, or finds the datagram gone) and whose push writes
    /// the ring's eventfd for a second report of the same datagram — for a
    /// socket that receives now and then (a DNS server's, a client's
    /// upstream query) a thread hop and several syscalls per datagram.
    /// What arrives while the application is busy waits in the kernel
    /// socket, as it would without the engine. Only for a backend whose
    /// socket becomes readable on input (not the TCP transport's). For good:
    /// the engine does not watch the socket again.
    pub fn app_waits_on_socket(&self) {
        let i = &self.inner;
        let _w = lock(&i.rx_watch);
        if i.rx_app_waits.swap(true, SeqCst) {
            return;
        }
        i.rx_armed.store(false, SeqCst);
        let _ = i.engine.epoll.remove(i.backend.raw_fd());
    }

    /// An application thread is about to sleep in a poll or select that
    /// watches the socket for input (and the ring's eventfd): until the
    /// matching [`Endpoint::app_poll_end`] the engine does not take the
    /// socket back, as for a thread blocked in a receive, and when such
    /// polls are all that waits on it the engine lets go of it at its next
    /// handoff check (no check every interval for an idle server). An
    /// arrival then wakes the application thread alone, which reads the
    /// socket itself; were the engine's watch re-armed after a handoff
    /// interval of quiet, each sparse arrival would wake the engine too,
    /// whose read and eventfd write would come between the arrival and the
    /// program's receive.
    ///
    /// Only for sparse input: the last read that brought anything brought
    /// a single datagram, and the program made at most
    /// [`SPARSE_RECEIVES`] receives since its previous sleeping poll (a
    /// request and the `EAGAIN` after it). Once a stream arrives (a read
    /// brought a GRO batch or a backlog, or receives drained a run of
    /// datagrams between polls) the engine keeps its part, so a receiver
    /// that falls behind keeps the ring as a second buffer: the first poll
    /// that finds the socket streaming re-arms the engine's watch if it had
    /// let go. Returns whether the poll was announced: only then is
    /// [`Endpoint::app_poll_end`] called.
    pub fn app_poll_begin(&self) -> bool {
        let i = &self.inner;
        let calls = i.rx_calls.load(Relaxed);
        let since = calls.wrapping_sub(i.rx_calls_polled.swap(calls, Relaxed));
        if i.last_batch.load(Relaxed) > 1 || since > SPARSE_RECEIVES {
            if i.rx_released.swap(false, SeqCst) {
                i.rearm_rx();
            }
            return false;
        }
        i.rx_waiters.fetch_add(1, SeqCst);
        i.rx_pollers.fetch_add(1, SeqCst);
        true
    }

    /// The poll that [`Endpoint::app_poll_begin`] announced returned.
    pub fn app_poll_end(&self) {
        let i = &self.inner;
        i.rx_pollers.fetch_sub(1, SeqCst);
        i.rx_waiters.fetch_sub(1, SeqCst);
    }
}

impl EpInner {
    /// Engine side: the socket had an arrival (its one-shot watch fired) or
    /// still holds data from a bounded read.
    ///
    /// The engine reads only for an application that is away. While an
    /// application thread keeps calling receive it reads the socket itself —
    /// batched and GRO-coalesced like the engine would — so on a machine
    /// with few cores the engine does not compete with it for the CPU and
    /// no arrival wakes two threads. Such an endpoint is parked with its
    /// watch off until [`EpInner::rx_idle_since_last_look`] finds the
    /// application gone for a handoff interval.
    ///
    /// A parked socket also leaves the engine's epoll set
    /// ([`EpInner::detach_rx`]).
    pub(crate) fn engine_receive(&self, scratch: &mut RecvScratch) -> RxOutcome {
        let outcome = self.engine_receive_once(scratch);
        if outcome == RxOutcome::Parked {
            self.detach_rx();
        }
        outcome
    }

    fn engine_receive_once(&self, scratch: &mut RecvScratch) -> RxOutcome {
        self.rx_armed.store(false, SeqCst);
        if self.rx_app_waits.load(SeqCst) {
            return RxOutcome::Done; // the application reads it; never re-armed
        }
        // Sampled tracing: with no stamped message since the last read the
        // error queue is read only if the wake-up finds no datagram (below).
        let traced = crate::tracepoint::on();
        let read_now = traced && self.trace.stamps_may_wait();
        let mut stamps = if read_now { self.trace.drain_tx(self.backend.raw_fd()) } else { 0 };
        let calls = self.rx_calls.load(Relaxed);
        if self.rx_waiters.load(SeqCst) > 0 || calls != self.rx_seen.swap(calls, Relaxed) {
            return RxOutcome::Parked;
        }
        let fill = match self.rx_sock.try_lock() {
            // Checked under the lock: a hand-over holds it while it drains.
            Ok(_g) if self.rx_stopped.load(SeqCst) => return RxOutcome::Done,
            Ok(_g) => self.fill_ring(scratch, RX_ROUNDS, true),
            // An application thread is reading the socket right now.
            Err(_) => return RxOutcome::Parked,
        };
        if traced && !read_now && fill.added == 0 {
            stamps = self.trace.drain_tx(self.backend.raw_fd());
        }
        if fill.more {
            return RxOutcome::More;
        }
        // The watch stays off until the handoff check when:
        // * the ring is full: the application is behind, and what arrives
        //   waits in the socket; its next receives drain the ring and read
        //   the socket themselves;
        // * traced, the wake-up brought TX timestamps and no data: stamps
        //   report EPOLLERR, which epoll cannot mask, so a re-armed watch
        //   would wake the engine after every send syscall of the
        //   application's thread only to read them. The socket leaves the
        //   epoll set altogether while its application keeps sending: with
        //   no waiter on the socket the kernel skips the wake-up call of
        //   every stamp queued and dequeued, and the sending thread reads
        //   the stamps itself (every 16 kernel messages, STAMP_READ_MESSAGES).
        //   Data arriving meanwhile for an application that does not
        //   receive waits up to DETACHED_CHECK handoff intervals; only
        //   while tracing.
        if fill.ring_full {
            return RxOutcome::Parked;
        }
        if stamps > 0 && fill.added == 0 {
            self.engine.stamp_wakes.fetch_add(1, Relaxed);
            self.tx_seen.store(self.stats.send_calls.load(Relaxed), Relaxed);
            self.rx_stamp_parked.store(true, Relaxed);
            return RxOutcome::Parked;
        }
        self.rearm_rx();
        RxOutcome::Done
    }

    /// Engine side, for a parked endpoint: true (and the watch re-armed)
    /// when no application thread received since the engine last looked and
    /// none is blocked receiving; true with the watch left off (released)
    /// when only sparse polls wait on the socket
    /// ([`Endpoint::app_poll_begin`]).
    pub(crate) fn rx_idle_since_last_look(&self) -> bool {
        if self.rx_stopped.load(SeqCst) || self.rx_app_waits.load(SeqCst) {
            return true; // let go, never re-armed
        }
        if self.rx_stamp_parked.load(Relaxed) && !self.closed.load(SeqCst) {
            // Bounded: a sender that went quiet leaves no stamps behind.
            self.trace.drain_tx(self.backend.raw_fd());
            let sent = self.stats.send_calls.load(Relaxed);
            let sending = sent != self.tx_seen.swap(sent, Relaxed);
            if sending && !crate::sys::poll::has_data(self.backend.raw_fd()) {
                return false;
            }
        }
        let calls = self.rx_calls.load(Relaxed);
        if calls != self.rx_seen.swap(calls, Relaxed) {
            return false;
        }
        let waiters = self.rx_waiters.load(SeqCst);
        if waiters == 0 {
            self.rearm_rx();
            return true;
        }
        // Only sparse polls wait on the socket: let go, watch off (the
        // next poll that finds it streaming re-arms it).
        let pollers = self.rx_pollers.load(SeqCst);
        if pollers > 0 && pollers == waiters {
            self.rx_released.store(true, SeqCst);
            return true;
        }
        false
    }

    /// The application's receive calls as of the engine's last look (see
    /// [`EpInner::rx_idle_since_last_look`]): a look that moved it found
    /// the application receiving.
    pub(crate) fn rx_calls_seen(&self) -> u64 {
        self.rx_seen.load(Relaxed)
    }

    /// A parked socket leaves the engine's epoll set (its one-shot watch is
    /// off already); [`EpInner::rearm_rx`] adds it back. A disarmed one-shot
    /// watch still hangs on the socket's wait queue, so every datagram the
    /// socket sends or receives would run the epoll callback under an
    /// IRQ-safe lock, a cost on every send and receive, while the
    /// application thread does all the reading.
    /// One `epoll_ctl` per park, and an add instead of a modify at the
    /// re-arm a handoff interval or more later.
    fn detach_rx(&self) {
        let _w = lock(&self.rx_watch);
        if !self.rx_armed.load(SeqCst) && !self.rx_detached.swap(true, SeqCst) {
            let _ = self.engine.epoll.remove(self.backend.raw_fd());
        }
    }

    /// Traced: parked for TX timestamps alone (its checks drain them).
    pub(crate) fn rx_stamp_parked(&self) -> bool {
        self.rx_stamp_parked.load(Relaxed)
    }

    /// Re-arms the engine's watch on the socket if it is off.
    fn rearm_rx(&self) {
        if !self.rx_stamp_parked.load(Relaxed) && self.rx_armed.load(SeqCst) {
            return; // armed already (no lock on the common path)
        }
        let _w = lock(&self.rx_watch);
        if self.closed.load(SeqCst) || self.rx_stopped.load(SeqCst) || self.rx_app_waits.load(SeqCst) {
            return;
        }
        self.rx_stamp_parked.store(false, Relaxed);
        if !self.rx_armed.swap(true, SeqCst) {
            let fd = self.backend.raw_fd();
            let r = if self.rx_detached.swap(false, SeqCst) {
                self.engine.epoll.add_readable_oneshot(fd, self.id)
            } else {
                self.engine.epoll.rearm(fd, self.id)
            };
            if let Err(e) = r {
                self.rx_armed.store(false, SeqCst);
                // ENOENT/EBADF: the endpoint is being closed; nothing to watch.
                if !matches!(e.raw_os_error(), Some(libc::ENOENT) | Some(libc::EBADF)) {
                    crate::log::write(crate::log::Level::Error, format_args!("cannot re-arm receive watch: {e}"));
                }
            }
        }
    }
}
