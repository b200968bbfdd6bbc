//! The rounds of the two-thread schemes (SO, RO, DSR, SR): each engine
//! thread runs the stages [`crate::emp::scheme::Scheme::placement`] gives
//! it. The send side and the receive side stay separate structures; the
//! threads meet in the runtime's one lock, where the hand-off queues
//! ([`crate::emp::handoff`]) carry frames from one thread's stage to the
//! other's, and each thread sleeps on its own eventfd until the other
//! leaves it work. An application thread's round runs every stage, the
//! queues first, so that it continues the pipeline where the engine
//! threads left it.

use super::{
    datagrams, earliest, lock_for, Round, Runtime, BLOCKED_RETRY, DOORBELL, RX_BATCH, RX_ROUNDS, SOCKET, TIMER,
};
use crate::emp::scheme::{Stage, StageSet};
use crate::emp::shared::Shared;
use crate::emp::stages::{self, Incoming};
use crate::sys::epoll::{Epoll, EDGE, EV_IN};
use crate::sys::poll::poll_writable;
use crate::sys::sync::lock;
use eudp_wire::emp::{self, Frame};
use std::io;
use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WAKE: u64 = 3;
/// Datagrams one receive batch can carry (GRO super-packets of up to 64
/// segments each).
const RX_BATCH_FRAMES: usize = RX_BATCH * 64;

impl Runtime {
    /// One round of the stages in `set` at `now`. `me` is the engine
    /// thread's index in `threads` (`None`: an application thread, which
    /// runs every stage). The other threads are woken when the round
    /// leaves work for their stages.
    pub fn staged_round(
        &mut self,
        now: Instant,
        set: StageSet,
        me: Option<usize>,
        threads: &[StageSet],
        read: bool,
    ) -> Round {
        if set.has(Stage::SendBookkeeping) {
            self.take_commands(now);
            if self.send.wake_at().is_some_and(|w| w <= now) {
                stages::send_timers(&mut self.send, now, &mut self.done);
            }
        }
        let more_rx = read && set.has(Stage::ReceiveFrame) && self.receive_staged();
        self.drain_queues(set, now);
        let more_tx = self.transmit(now, set);
        let busy = more_rx || more_tx;
        self.shared.cq.push_all(&mut self.done);
        let timers = if set.has(Stage::SendBookkeeping) { self.send.wake_at() } else { None };
        // The thread sending acknowledgments, or the one running timers,
        // wakes for a parked acknowledgment's end of delay.
        let acks = if set.has(Stage::SendAcknowledgment) || set.has(Stage::SendBookkeeping) {
            self.recv.ack_due()
        } else {
            None
        };
        let r = Round { busy, wake_at: earliest(timers, acks) };
        self.next_timer = earliest(self.send.wake_at(), self.recv.ack_due());
        for (i, &other) in threads.iter().enumerate() {
            if Some(i) != me && self.pending(other, now) {
                self.shared.wake[i].set();
            }
        }
        if me == Some(0) {
            self.planned = if busy { Some(now) } else { r.wake_at };
        } else if me.is_none() {
            if busy || self.blocked {
                self.shared.wake[0].set();
                self.shared.wake[1].set();
            } else if let Some(w) = r.wake_at {
                self.plan_wake(w, now);
            }
        }
        r
    }

    /// True when the stages of `set` have work waiting that another
    /// thread left them.
    fn pending(&self, set: StageSet, now: Instant) -> bool {
        let h = &self.handoff;
        (set.has(Stage::Transmission) && !self.blocked && self.send.has_frame())
            || (set.has(Stage::ReceiveAcknowledgment) && !h.acks.is_empty())
            || (set.has(Stage::ReceiveBookkeeping) && !h.data.is_empty())
            || (set.has(Stage::ReceiveFrame) && h.rx_stalled && h.has_room(RX_BATCH_FRAMES))
            || (set.has(Stage::Receiving) && !h.accepted.is_empty())
            || (set.has(Stage::SendAcknowledgment) && !self.blocked && self.recv.owes(now))
    }

    /// Step 5: reads what the socket holds into the hand-off queues while
    /// they have room; true when a full batch suggests more is waiting.
    fn receive_staged(&mut self) -> bool {
        self.shared.forget_missed();
        for _ in 0..RX_ROUNDS {
            if !self.handoff.has_room(RX_BATCH_FRAMES) {
                self.handoff.rx_stalled = true;
                return false;
            }
            self.handoff.rx_stalled = false;
            let n = match self.sock.recv_batch(&mut self.rx_bufs, &mut self.rx_meta) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                // A socket error (an ICMP report) is consumed by the call
                // that returns it, and datagrams may wait behind it: the
                // engine's edge-triggered wait would not wake for them.
                Err(_) => continue,
            };
            for i in 0..n {
                let m = self.rx_meta[i];
                let Some(src) = m.src else { continue };
                for dgram in datagrams(&self.rx_bufs[i], m) {
                    match stages::receive_frame(&mut self.recv, src, dgram) {
                        Some(Incoming::Data(peer, d)) => {
                            if let Some(c) = d.ack {
                                self.handoff.acks.push_back((peer, c, false));
                            }
                            self.handoff.data.push_back((peer, dgram.to_vec()))
                        }
                        Some(Incoming::Control(peer, c, nak)) => self.handoff.acks.push_back((peer, c, nak)),
                        None => {}
                    }
                }
            }
            if n < RX_BATCH {
                return false;
            }
        }
        true
    }

    /// Steps 3, 4 and 6 (those of `set`) over the queues, in pipeline
    /// order: step 4 holds a peer's next frame back while step 6 has one
    /// of that peer's frames still to take.
    fn drain_queues(&mut self, set: StageSet, now: Instant) {
        if set.has(Stage::ReceiveAcknowledgment) {
            while let Some((peer, c, nak)) = self.handoff.acks.pop_front() {
                stages::receive_acknowledgment(&mut self.send, peer, c, nak, now, &mut self.done);
            }
        }
        loop {
            let mut progress = false;
            if set.has(Stage::Receiving) {
                while let Some((peer, bytes)) = self.handoff.accepted.pop_front() {
                    progress = true;
                    if let Ok(Frame::Data(d)) = emp::parse(&bytes) {
                        stages::receiving(&mut self.recv, peer, &d, &mut self.done);
                    }
                }
            }
            if set.has(Stage::ReceiveBookkeeping) {
                while let Some(&(peer, _)) = self.handoff.data.front() {
                    if self.handoff.accepting(peer) {
                        break;
                    }
                    let (peer, bytes) = self.handoff.data.pop_front().expect("present above");
                    progress = true;
                    let taken = match emp::parse(&bytes) {
                        Ok(Frame::Data(d)) => stages::receive_bookkeeping(&mut self.recv, peer, &d, &mut self.done),
                        _ => false,
                    };
                    if taken {
                        self.handoff.accepted.push_back((peer, bytes));
                    }
                }
            }
            if !progress || !set.has(Stage::Receiving) || !set.has(Stage::ReceiveBookkeeping) {
                return;
            }
        }
    }
}

/// Engine thread `me` of a two-thread scheme: rounds of its stages until
/// the endpoint stops. The endpoint closes the runtime once every engine
/// thread has returned.
pub fn drive_staged(shared: &Shared, rt: &Mutex<Runtime>, me: usize, threads: &[StageSet]) -> io::Result<()> {
    let set = threads[me];
    let epoll = Epoll::new()?;
    let fd = lock(rt).socket_fd();
    if set.has(Stage::ReceiveFrame) {
        epoll.add(fd, SOCKET, EV_IN | super::EV_EXCLUSIVE | EDGE)?;
    }
    let reader = threads.iter().position(|t| t.has(Stage::ReceiveFrame)).unwrap_or(me);
    if set.has(Stage::SendBookkeeping) {
        epoll.add_readable(shared.doorbell.as_raw_fd(), DOORBELL)?;
        epoll.add_readable(shared.timer.as_raw_fd(), TIMER)?;
    }
    epoll.add_readable(shared.wake[me].as_raw_fd(), WAKE)?;
    let writes = set.has(Stage::Transmission) || set.has(Stage::SendAcknowledgment);
    let mut ready: Vec<(u64, u32)> = Vec::new();
    let mut wake_at = None;
    loop {
        if ready.iter().any(|&(t, _)| t == TIMER) {
            shared.timer.clear();
        }
        if ready.iter().any(|&(t, _)| t == DOORBELL) {
            shared.doorbell.drain();
        }
        if ready.iter().any(|&(t, _)| t == WAKE) {
            shared.wake[me].drain();
        }
        let Some(mut g) = lock_for(shared, rt, &ready) else {
            let timeout = wake_at.map(|w: Instant| w.saturating_duration_since(Instant::now()));
            let _ = epoll.wait_events(&mut ready, timeout);
            continue;
        };
        shared.wake[me].clear();
        let r = g.staged_round(Instant::now(), set, Some(me), threads, true);
        let blocked = g.blocked();
        drop(g);
        wake_at = r.wake_at;
        // Frames the socket's thread left while this one held the runtime.
        if reader != me && shared.take_missed() {
            shared.wake[reader].set();
        }
        if shared.stopping() {
            break;
        }
        let mut timeout =
            if r.busy { Some(Duration::ZERO) } else { r.wake_at.map(|w| w.saturating_duration_since(Instant::now())) };
        if blocked && writes {
            let t = timeout.map_or(BLOCKED_RETRY, |t| t.min(BLOCKED_RETRY));
            if poll_writable(fd, Some(t)).unwrap_or(false) {
                lock(rt).writable();
            }
            timeout = Some(Duration::ZERO);
        }
        let _ = epoll.wait_events(&mut ready, timeout);
    }
    Ok(())
}
