//! The receive path: reading a connection (the manager thread, or the
//! readers of the endpoint its bulk flow goes to), decoding it, and handing
//! a connection to an endpoint's readers and back.
//!
//! Owns `Conn::rx` → `Mgr::rbuf` → `Mgr::pool` (a reader's order; what it
//! delivers then takes `Lane::st`, `Mgr::ports` and `RxQueue::inner`), and
//! `Conn::rx` → `Conn::owner` → `RxQueue::owned` for the hand-over.

use super::counters::Counters;
use super::demux::Deliver;
use super::in_place::{ReadErr, RX_MAX_RATIO, SCATTER_BLOCKS};
use super::pools::Pools;
use super::state::{lock, Conn, Mgr, Owner, RdCtx, RxQueue};
use crate::backend::tcp::frame::{Decoder, FrameError};
use crate::backend::tcp::sys;
use std::io::{self, Read};
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// Bytes per read from a connection (one buffer shared by all).
const READ_CHUNK: usize = 512 << 10;
/// Bytes read from one connection per readiness event before others get a turn.
const READ_BUDGET: usize = 4 << 20;

/// Smallest plain read by an endpoint's reader.
const PLAIN_MIN: usize = 4096;
/// Consecutive in-place manager reads to one endpoint before its readers
/// read the connection themselves ([`Mgr::delegate`]).
const DELEGATE_AFTER: u32 = 4;

/// How one read of a connection ended.
enum Step {
    /// EOF, error or bad input: the connection is to be closed.
    Closed,
    /// Interrupted: read again.
    Again,
    /// A short read (the socket is drained) of this many bytes.
    Drained(usize),
    /// The read filled its room: more may wait.
    Full(usize),
}

impl Mgr {
    /// Reads and delivers; closes the connection on EOF, error or bad input.
    pub(super) fn read_conn(&self, conn: &Arc<Conn>) -> bool {
        if conn.delegated.load(SeqCst) {
            // Its endpoint's readers read it; input after an idle spell
            // restarts the manager's watch.
            self.input_arrived(conn);
            return false;
        }
        let mut dec = lock(&conn.rx);
        // One read buffer for all connections (only this thread reads).
        let mut rbuf = lock(&self.rbuf);
        if rbuf.len() < READ_CHUNK {
            rbuf.resize(READ_CHUNK, 0);
        }
        let mut pools = lock(&self.pool);
        let mut budget = READ_BUDGET;
        loop {
            let (step, only) = self.read_step(conn, &mut dec, &mut rbuf, &mut pools, None, SCATTER_BLOCKS);
            let n = match step {
                Step::Closed => {
                    drop((dec, rbuf, pools));
                    self.close_conn(conn);
                    return false;
                }
                Step::Again => continue,
                Step::Drained(n) | Step::Full(n) => n,
            };
            if let Some(q) = only.filter(|_| self.cfg.rx_direct) {
                // Reads to one and the same endpoint: a stalled endpoint's
                // reads must not count for another's first one.
                let id = Arc::as_ptr(&q) as usize;
                let run = if conn.bulk_q.swap(id, Relaxed) == id {
                    conn.bulk.fetch_add(1, Relaxed) + 1
                } else {
                    conn.bulk.store(1, Relaxed);
                    1
                };
                if run >= DELEGATE_AFTER && self.delegate(conn, &q) {
                    return false;
                }
            } else {
                conn.bulk.store(0, Relaxed);
            }
            budget = budget.saturating_sub(n);
            match step {
                // Short read: the socket is drained; any later arrival (or
                // FIN) raises a new edge-triggered event.
                Step::Drained(_) => return false,
                _ if budget == 0 => return true,
                _ => {}
            }
        }
    }

    /// One read of `conn`, delivered (`quiet`: the queue whose reader reads,
    /// not signalled). Also returns the queue every frame went to in place,
    /// if there was one (a bulk flow to one endpoint).
    fn read_step(
        &self,
        conn: &Arc<Conn>,
        dec: &mut Decoder,
        rbuf: &mut [u8],
        pools: &mut Pools,
        quiet: Option<&RxQueue>,
        blocks: usize,
    ) -> (Step, Option<Arc<RxQueue>>) {
        let mut out = Deliver {
            mgr: self,
            conn,
            pools,
            cache: None,
            batch: Vec::new(),
            frames: 0,
            bytes: 0,
            frames_seen: 0,
            quiet,
            first: None,
            mixed: false,
        };
        let r = match self.scatter_plan(dec, conn) {
            Some(plan) => self.read_in_place(conn, dec, rbuf, plan, &mut out, blocks),
            None => {
                // An endpoint's reader reads no more than its queue holds
                // (a frame costs at most RX_MAX_RATIO times its wire bytes);
                // the manager reads for every endpoint at once.
                let lim = quiet.map_or(rbuf.len(), |q| (q.room() / RX_MAX_RATIO).clamp(PLAIN_MIN, rbuf.len()));
                match (&*conn.stream).read(&mut rbuf[..lim]) {
                    Ok(0) => Ok((0, lim)),
                    Ok(n) => out.feed(dec, &rbuf[..n]).map(|_| (n, lim)).map_err(ReadErr::Frame),
                    Err(e) => Err(ReadErr::Io(e)),
                }
            }
        };
        out.flush();
        // Every frame of this read went to one endpoint: a bulk flow read in
        // place, or a request/response flow of small datagrams (whose
        // endpoint, once it reads the connection itself, is woken by the
        // connection directly: no manager wake-up and hand-over per message).
        let only = if !out.mixed && out.frames_seen > 0 { out.first.take() } else { None };
        drop(out);
        pools.trim();
        let step = match r {
            Ok((0, _)) => {
                if dec.pending() > 0 {
                    Counters::inc(&self.c.lost_partial);
                }
                Step::Closed
            }
            Ok((n, room)) if n < room => Step::Drained(n),
            Ok((n, _)) => Step::Full(n),
            Err(ReadErr::Frame(e)) => {
                Counters::inc(match e {
                    FrameError::BadHello => &self.c.bad_hello,
                    FrameError::Oversized => &self.c.oversized,
                    FrameError::Malformed => &self.c.malformed,
                });
                Step::Closed
            }
            Err(ReadErr::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => Step::Drained(0),
            Err(ReadErr::Io(e)) if e.kind() == io::ErrorKind::Interrupted => Step::Again,
            Err(ReadErr::Io(_)) => Step::Closed,
        };
        (step, only)
    }

    /// Hands `conn` to the readers of `q`, the endpoint all of its recent
    /// reads went to: its receiving thread (or its engine, while no thread
    /// receives) reads the connection itself in `recv_batch`, woken through
    /// `q.poll`, and the manager keeps only the connection's writes. This
    /// takes the manager's wake-up and the hand-over off the path of a
    /// bulk flow. Frames for other endpoints are still delivered to them,
    /// and the first such read gives the connection back ([`Mgr::revoke`]).
    /// The manager keeps watching that the endpoint reads
    /// ([`Mgr::watch_owned`]); one that stopped gets none until it receives
    /// again.
    pub(super) fn delegate(&self, conn: &Arc<Conn>, q: &Arc<RxQueue>) -> bool {
        if q.stalled.load(SeqCst) {
            return false;
        }
        let mut owner = lock(&conn.owner);
        let mut owned = lock(&q.owned);
        if owned.is_some() || conn.dead.load(SeqCst) || q.poll.add_level(conn.fd(), 1).is_err() {
            return false;
        }
        if self.poller.conn_out_only(conn.fd(), conn.token).is_err() {
            q.poll.remove(conn.fd());
            return false;
        }
        *owned = Some(conn.clone());
        *owner = Owner {
            q: Some(Arc::downgrade(q)),
            reads: conn.direct_reads.load(SeqCst),
            since: Instant::now(),
            armed: false,
        };
        conn.delegated.store(true, SeqCst);
        Counters::inc(&self.c.rx_delegations);
        // The next tick comes soon and starts the watch.
        self.ring();
        // Input already waiting on the connection needs no wake-up of its
        // own: the connection just joined `q.poll` level-triggered, and an
        // epoll set that gains a ready descriptor wakes its waiters. Frames
        // already queued have signalled when they were pushed; a wake-up
        // with nothing queued would leave the readiness flag up with
        // nothing to read until the next receive (seen as a spurious event
        // in `udp_surface`'s `epoll_dup` under load).
        let mut i = lock(&q.inner);
        if !i.signalled && !i.items.is_empty() {
            i.signalled = true;
            q.ready.set();
        }
        true
    }

    /// The manager reads `conn` again (its owner went away, other endpoints
    /// have frames on it, or it closes).
    pub(super) fn revoke(&self, conn: &Arc<Conn>) {
        self.revoke_locked(conn, &mut lock(&conn.owner));
    }

    /// [`Mgr::revoke`] with `conn.owner` held.
    fn revoke_locked(&self, conn: &Arc<Conn>, owner: &mut Owner) {
        owner.armed = false;
        if let Some(q) = owner.q.take().and_then(|w| w.upgrade()) {
            let mut owned = lock(&q.owned);
            if owned.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                *owned = None;
                q.poll.remove(conn.fd());
            }
        }
        conn.bulk.store(0, Relaxed);
        if conn.delegated.swap(false, SeqCst) && !conn.dead.load(SeqCst) {
            // Reports input that already waits, so nothing is stranded.
            let _ = self.poller.conn_all(conn.fd(), conn.token);
        }
    }

    /// The manager's watch on a delegated connection (each tick, every
    /// `cfg.rx_stall / 2` while one is delegated): its endpoint's program
    /// may stop receiving (its engine stops reading once its ring is
    /// full), and then nobody would read the connection, and every flow
    /// sharing it would wait. When the endpoint has made no read for
    /// `cfg.rx_stall` while input waits, the manager takes the connection
    /// back: it reads it for every endpoint again and drops what the full
    /// queue cannot take (`drop_rx_full`), as a full UDP socket does.
    /// Reads are counted per connection, so a busy endpoint costs this
    /// watch no syscall; a connection found idle is watched by the epoll
    /// set instead (no tick while nothing arrives). Returns whether this
    /// connection needs the next tick.
    pub(super) fn watch_owned(&self, conn: &Arc<Conn>, now: Instant) -> bool {
        let mut owner = lock(&conn.owner);
        if !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) || owner.armed {
            return false;
        }
        let reads = conn.direct_reads.load(SeqCst);
        if reads != owner.reads {
            (owner.reads, owner.since) = (reads, now);
            return true;
        }
        if now.saturating_duration_since(owner.since) < self.cfg.rx_stall {
            return true;
        }
        if sys::input_waits(conn.fd()) {
            if let Some(q) = owner.q.as_ref().and_then(Weak::upgrade) {
                q.stalled.store(true, SeqCst);
            }
            Counters::inc(&self.c.rx_stall_revokes);
            // The manager reads what waits (the revoke reports it) after
            // any read of the endpoint still under way: both take the
            // connection's decoder lock, so no frame is split or reordered.
            self.revoke_locked(conn, &mut owner);
            return false;
        }
        // Idle: the next arrival is reported (at once if one came since the
        // look above), and restarts the watch (`Mgr::input_arrived`).
        if self.poller.conn_all(conn.fd(), conn.token).is_ok() {
            owner.armed = true;
            return false;
        }
        true
    }

    /// Input on a delegated connection whose watch was idle: its endpoint
    /// has `cfg.rx_stall` from now to read it. The manager's epoll set
    /// goes back to write readiness only (no wake-up per arrival).
    fn input_arrived(&self, conn: &Arc<Conn>) {
        let mut owner = lock(&conn.owner);
        if !owner.armed || !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) {
            return;
        }
        if self.poller.conn_out_only(conn.fd(), conn.token).is_ok() {
            (owner.armed, owner.reads, owner.since) = (false, conn.direct_reads.load(SeqCst), Instant::now());
            drop(owner);
            // Its next tick comes within the watch's period.
            self.ring();
        }
    }

    /// A reader of `q` reads the connection handed to it (one read of at
    /// most `blocks` receive blocks, about what the caller takes at once),
    /// unless another reader is at it.
    pub(in crate::backend::tcp) fn read_owned(&self, q: &Arc<RxQueue>, blocks: usize) {
        if self.abandoned() {
            return;
        }
        let Some(conn) = lock(&q.owned).clone() else { return };
        let Ok(mut dec) = conn.rx.try_lock() else { return };
        if !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) {
            return;
        }
        conn.direct_reads.fetch_add(1, Relaxed);
        let mut ctx = lock(&q.rd);
        let RdCtx { rbuf, pools } = &mut *ctx;
        if rbuf.len() < READ_CHUNK {
            rbuf.resize(READ_CHUNK, 0);
        }
        Counters::inc(&self.c.rx_direct_reads);
        let (step, only) = self.read_step(&conn, &mut dec, rbuf, pools, Some(q), blocks.clamp(1, SCATTER_BLOCKS));
        drop((dec, ctx));
        match step {
            Step::Closed => self.close_conn(&conn),
            // Frames for another endpoint (or a break in the pattern): the
            // manager reads this connection again.
            Step::Drained(n) | Step::Full(n) if n > 0 && !only.as_ref().is_some_and(|o| Arc::ptr_eq(o, q)) => {
                self.revoke(&conn)
            }
            _ => {}
        }
    }
}
