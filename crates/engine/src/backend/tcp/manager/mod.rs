//! The UOE manager: Connection Management Layer (lazy connections, the
//! listener, demultiplexing) and Data Management Layer (bounded queues,
//! background retry, deadlines, reconnect) for one process.
//!
//! Threads: the manager thread owns the epoll set (listener, doorbell, every
//! connection, edge-triggered) and does all reads, accepts, connect
//! completions, retries and deadline drops. Senders (application threads
//! for direct posts, the engine thread for batches) append frames to a
//! lane's queue and write them to the connection themselves, under the
//! lane's lock, so an idle path costs one `send(2)` and a busy one batches
//! many frames per call. The manager finishes writes the socket refused
//! (EPOLLOUT).
//!
//! Locks, in the order they may nest: `Conn::rx` → `Mgr::rbuf` →
//! `Mgr::pool` → `Lane::st` → `Mgr::conns` / `Mgr::lanes` / `Mgr::ports`
//! → `RxQueue::inner`; and `Conn::rx` → `Conn::owner` → `RxQueue::owned`
//! → `RxQueue::inner`; and `Mgr::listener` → `Mgr::listen_st`. `rbuf`
//! and `pool` are the manager thread's own. Each part's header names the
//! locks it owns:
//!
//! * `state.rs`: the types the parts share, [`Mgr`] and the connections,
//!   lanes and receive queues with their locks (`Conn::rx`, `Conn::owner`,
//!   `Lane::st`, `RxQueue::inner`/`owned`);
//! * `listener.rs`: the listener and the port (`listener`, `listen_st`,
//!   `accept_paused`);
//! * `lanes.rs` and `connect.rs`: the send side (`lanes`, `Lane::st`);
//! * `rx.rs` and `in_place.rs`: the receive path (`Conn::rx`, `rbuf`,
//!   `pool`, the hand-over of a connection to an endpoint's readers);
//! * `demux.rs`: the bound ports and hand-over to kernel sockets (`ports`,
//!   `kernel_socks`, `bound`);
//! * `transport.rs`: starting, the process-wide transport, shutting down;
//! * this file: the manager thread's loop, its events and its timer.
//!
//! Below them: `counters.rs`, `pools.rs` (received datagrams' buffers) and
//! `outbuf.rs` (a lane's send queue), which hold no lock of their own.

mod connect;
mod counters;
mod demux;
mod in_place;
mod lanes;
mod listener;
mod outbuf;
mod pools;
mod rx;
mod state;
mod transport;

pub(super) use counters::Counters;
pub use counters::TcpStats;
pub(super) use lanes::Caller;
pub(super) use pools::{BIG_BUF, BIG_FREE_MAX, FREE_MAX, FREE_MAX_CAP};
pub(super) use state::{lock, norm_ip, Lane, Mgr, RxQueue};
pub use transport::TcpTransport;

use lanes::LANE_IDLE;
use state::{Conn, Phase, DOORBELL, LISTENER};
use transport::{current, stats_path, write_stats};

use super::fork;
use super::sys::{self, EV_ERR, EV_IN, EV_OUT};
use super::Dml;
use std::os::fd::AsRawFd;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

impl Mgr {
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Relaxed) || self.abandoned()
    }

    /// Inherited across fork: no manager thread here, its descriptors given
    /// up (`fork.rs`), its locks possibly held by threads that do not exist
    /// here. Nothing of it is touched again.
    pub(super) fn abandoned(&self) -> bool {
        self.gen != fork::generation()
    }

    fn ring(&self) {
        self.doorbell.set();
    }

    fn run(self: Arc<Self>) {
        let mut events: Vec<(u64, u32)> = Vec::with_capacity(128);
        let mut again: Vec<u64> = Vec::new();
        let mut next_tick = Instant::now();
        // Latency profile: after activity, poll without sleeping this long
        // (EUDP_TCP_SPIN_US), so an arrival costs no manager wake-up.
        let spin = self.cfg.spin;
        let mut busy_until = Instant::now();
        while !self.stopped() {
            crate::testpanic::point("tcp", "");
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + self.tick(now);
            }
            let mut timeout = if !again.is_empty() || (!spin.is_zero() && now < busy_until) {
                Duration::ZERO
            } else {
                next_tick.saturating_duration_since(now)
            };
            if self.cork_armed.load(SeqCst) {
                if let Some(d) = self.flush_corked(now) {
                    timeout = timeout.min(d);
                }
            }
            let r = self.poller.wait(&mut events, Some(timeout));
            if !spin.is_zero() && (!events.is_empty() || !again.is_empty()) {
                busy_until = Instant::now() + spin;
            }
            if let Err(e) = r {
                crate::log::write(crate::log::Level::Error, format_args!("uoe epoll_wait failed: {e}"));
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut work: Vec<(u64, u32)> = again.drain(..).map(|t| (t, EV_IN)).collect();
            work.extend(events.iter().copied());
            for (tok, flags) in work {
                match tok {
                    DOORBELL => {
                        self.doorbell.clear();
                        next_tick = Instant::now();
                    }
                    LISTENER => again.extend(self.accept_all()),
                    _ => {
                        let conn = lock(&self.conns).get(&tok).cloned();
                        if let Some(conn) = conn {
                            if self.conn_event(&conn, flags) {
                                again.push(tok);
                            }
                        } else if let Some(q) = lock(&self.kernel_socks).get(&tok).and_then(Weak::upgrade) {
                            q.kernel_ready();
                        }
                    }
                }
            }
        }
    }

    /// Writes coalesced datagrams that waited `cfg.cork`; returns the time
    /// until the next lane is due (None: nothing is coalesced, timer off).
    fn flush_corked(&self, now: Instant) -> Option<Duration> {
        // Disarm before the scan: a lane corked after its scan re-arms and rings.
        self.cork_armed.store(false, SeqCst);
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        let mut next: Option<Duration> = None;
        for lane in lanes {
            let mut st = lock(&lane.st);
            let Some(t) = st.corked_at else { continue };
            let due = t + self.cfg.cork;
            if due <= now {
                Counters::inc(&self.c.cork_timer_flushes);
                let b = st.out.queued();
                self.flush_lane(&lane, &mut st);
                self.settle(&lane, &mut st, b);
            } else {
                next = Some(next.map_or(due - now, |n: Duration| n.min(due - now)));
            }
        }
        if next.is_some() {
            self.cork_armed.store(true, SeqCst);
        }
        next
    }

    /// Handles readiness of one connection; true when it may hold more input.
    fn conn_event(&self, conn: &Arc<Conn>, flags: u32) -> bool {
        let lane = lock(&conn.lane).as_ref().and_then(Weak::upgrade);
        if let Some(lane) = &lane {
            let mut st = lock(&lane.st);
            let mine = st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
            if mine && st.phase == Phase::Connecting {
                if flags & (EV_OUT | EV_ERR) == 0 {
                    return false;
                }
                let error = conn.stream.take_error();
                let failed = !matches!(error, Ok(None)) || conn.stream.peer_addr().is_err();
                if failed {
                    self.close_socket(conn);
                    *lock(&conn.lane) = None;
                    if self.cfg.dml == Dml::Udp
                        && matches!(&error, Ok(Some(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED))
                    {
                        self.go_plain(lane, &mut st);
                    }
                    self.connect_failed(&mut st);
                    return false;
                }
                self.conn_up(lane, &mut st, conn);
            } else if mine && flags & EV_OUT != 0 {
                let b = st.out.queued();
                self.flush_lane(lane, &mut st);
                self.settle(lane, &mut st, b);
            }
        }
        if flags & (EV_IN | EV_ERR) != 0 && !conn.dead.load(SeqCst) {
            let more = self.read_conn(conn);
            // The peer's FIN came with this edge's data: the short read
            // took the data, and no later edge reports the end, so one
            // more read sees it (before, such a connection stayed open and
            // took frames until the peer's reset).
            if !more && flags & sys::EV_RDHUP != 0 && !conn.dead.load(SeqCst) {
                return self.read_conn(conn);
            }
            return more;
        }
        false
    }

    /// Timers: retries, deadlines, hello timeouts, idle lanes. Returns the
    /// time until the next tick.
    fn tick(&self, now: Instant) -> Duration {
        let mut next = Duration::from_secs(1);
        if let Some(Ok(t)) = current() {
            // The process-wide transport keeps `<pid>-<start>.tcp.json` current for
            // `eudp stat` (the atexit hook writes the final counters).
            if std::ptr::eq(&*t.mgr, self) && stats_path().is_some() {
                let mut last = lock(&self.stats_written);
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                    *last = Some(now);
                    write_stats(&self.c.snapshot(), self.queued_total.load(Relaxed));
                }
            }
        }
        if let Some(d) = self.listen_tick(now) {
            next = next.min(d);
        }
        let paused = *lock(&self.accept_paused);
        if let Some(t) = paused {
            if t <= now {
                *lock(&self.accept_paused) = None;
                if let Some(l) = lock(&self.listener).as_ref() {
                    let _ = self.poller.add_level(l.as_raw_fd(), LISTENER);
                }
            } else {
                next = next.min(t - now);
            }
        }
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        let mut idle = Vec::new();
        for lane in lanes {
            let mut st = lock(&lane.st);
            if st.phase == Phase::Backoff && st.plain && now.duration_since(st.last_used) > self.cfg.retry_max {
                // A plain UDP lane not used lately stops probing (the next
                // send probes again, see `submit`).
                st.phase = Phase::Idle;
            }
            if st.phase == Phase::Backoff {
                match st.retry_at {
                    Some(t) if t > now => next = next.min(t - now),
                    _ => self.start_connect(&lane, &mut st),
                }
            }
            if st.out.queued() > 0 {
                let (bound, ctr) = if st.phase == Phase::Up {
                    (self.cfg.max_wait, &self.c.drop_max_wait)
                } else {
                    (self.cfg.queue_deadline, &self.c.drop_deadline)
                };
                if let Some(cutoff) = now.checked_sub(bound) {
                    let b = st.out.queued();
                    let n = st.out.drop_older(cutoff, &mut |src, k| self.lost_by(src, k, |d| &d.send));
                    if n > 0 {
                        Counters::add(ctr, n);
                        self.settle(&lane, &mut st, b);
                    }
                }
                next = next.min(Duration::from_millis(20));
            }
            if st.out.queued() == 0 && st.out.buf.capacity() > (1 << 20) {
                // A burst grew the queue; give the memory back once drained.
                st.out.buf = Vec::new();
                st.out.head = 0;
            }
            if st.phase == Phase::Idle
                && st.conn.is_none()
                && st.out.queued() == 0
                && now.duration_since(st.last_used) > LANE_IDLE
            {
                st.retired = true;
                idle.push(lane.key);
            }
        }
        if !idle.is_empty() {
            let mut lanes = lock(&self.lanes);
            for k in idle {
                lanes.remove(&k);
            }
        }
        let owned: Vec<Arc<Conn>> = lock(&self.conns).values().filter(|c| c.delegated.load(Relaxed)).cloned().collect();
        for c in owned {
            if self.watch_owned(&c, now) {
                next = next.min(self.cfg.rx_stall / 2);
            }
        }
        let conns: Vec<Arc<Conn>> =
            lock(&self.conns).values().filter(|c| !c.hello_seen.load(SeqCst)).cloned().collect();
        for c in conns {
            let age = now.saturating_duration_since(c.created);
            if age >= self.cfg.hello_timeout {
                Counters::inc(&self.c.hello_timeouts);
                self.close_conn(&c);
            } else {
                next = next.min(self.cfg.hello_timeout - age);
            }
        }
        next.max(Duration::from_millis(1))
    }
}
