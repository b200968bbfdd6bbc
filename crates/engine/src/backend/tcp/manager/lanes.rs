//! Lanes, the send side: the lane map, queueing datagrams and writing
//! them under the lane's lock, the DML bound and (b)'s blocking, DML (c)'s
//! plain UDP, and backpressure through the senders' rooms.
//!
//! Owns `Lane::st` (inside `Mgr::rbuf`/`Mgr::pool` of a reader that
//! delivers, outside `Mgr::conns`, `Mgr::lanes` and `Mgr::ports`) and
//! `Mgr::lanes`.

use super::counters::Counters;
use super::outbuf::OutBuf;
use super::state::{err, lock, norm_ip, Lane, LaneSt, Mgr, Phase};
use crate::backend::tcp::frame::{self, HEADER_LEN, MAX_PAYLOAD, RUN_HEADER_LEN};
use crate::backend::tcp::room::Room;
use crate::backend::tcp::{sys, Dml, CORK_BYTES};
use crate::sys::addr::to_family;
use std::io::{self, IoSlice};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsRawFd;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// User-space queue bound of a connected lane (the DML bound,
/// `cfg.queue_bytes`, applies while it is not connected).
const UP_QUEUE_BYTES: usize = 2 * CORK_BYTES;
/// Longest the engine thread waits on a full lane, while it has nothing
/// else to do, before it leaves the refused batch to the room descriptor
/// ([`Mgr::engine_wait`]).
const ENGINE_WAIT: Duration = Duration::from_millis(10);
/// Between two looks of [`Mgr::engine_wait`] at the engine's other work.
const ENGINE_WAIT_SLICE: Duration = Duration::from_micros(250);
/// A lane with nothing queued and no connection is forgotten after this.
pub(super) const LANE_IDLE: Duration = Duration::from_secs(30);

/// How long a sender may wait, by caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::backend::tcp) enum Caller {
    /// An application thread (direct post): DML (b) may block it.
    App,
    /// An application thread sending back to back: as `App`, and its
    /// datagrams may be coalesced (see [`TcpConfig::cork`]).
    Stream,
    /// The engine thread (queued batches): never blocked by DML.
    Engine,
}

impl Mgr {
    /// A kernel UDP socket that holds local port `port` (to send plain
    /// UDP from it).
    fn sender_of(&self, port: u16) -> Option<Arc<crate::backend::kernel::UdpSocket>> {
        let ports = lock(&self.ports);
        ports.get(&port)?.iter().filter_map(|(_, w)| w.upgrade()).find_map(|q| q.plain.get().and_then(Weak::upgrade))
    }

    /// Sends `items` to `ip` as plain UDP datagrams from `udp` (DML (c)),
    /// as the kernel path would: a full send buffer is waited on briefly,
    /// then the rest is dropped and counted. Returns the items taken (all,
    /// unless the first found the buffer full: `EAGAIN`).
    pub(in crate::backend::tcp) fn send_plain(
        &self,
        udp: &crate::backend::kernel::UdpSocket,
        ip: IpAddr,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
    ) -> io::Result<usize> {
        use crate::backend::kernel::OutMsg;
        use crate::sys::poll::poll_writable;
        let msgs: Vec<OutMsg<'_>> = items
            .iter()
            .map(|it| OutMsg {
                dst: Some(to_family(SocketAddr::new(ip, it.1), udp.is_v6())),
                iov: it.2,
                segment: None,
                stamp: false,
            })
            .collect();
        let mut i = 0;
        let mut waited = false;
        while i < msgs.len() {
            match udp.send_batch(&msgs[i..]) {
                Ok(n) => {
                    i += n.max(1);
                    waited = false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && i == 0 => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !waited => {
                    waited = true;
                    let _ = poll_writable(udp.as_raw_fd(), Some(Duration::from_millis(20)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if i == 0 && items.len() == 1 => return Err(e),
                Err(_) => {
                    // As a UDP send that fails: this datagram is lost.
                    Counters::inc(&self.c.plain_lost);
                    self.lost_by(items[i].0, 1, |d| &d.send);
                    i += 1;
                    waited = false;
                }
            }
        }
        Counters::add(&self.c.plain_sent, i as u64);
        Ok(i)
    }

    /// The process ends and its exit drain's bound has passed: what the
    /// lanes still hold cannot leave; it is dropped and counted
    /// (`drop_exit`, and per endpoint).
    pub(in crate::backend::tcp) fn drop_queued_at_exit(&self) {
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        for lane in lanes {
            let mut st = lock(&lane.st);
            let before = st.out.queued();
            if before == 0 {
                continue;
            }
            let n = st.out.clear(&mut |src, k| self.lost_by(src, k, |d| &d.exit));
            Counters::add(&self.c.drop_exit, n);
            self.settle(&lane, &mut st, before);
        }
    }

    /// DML (c): the lane's peer refused the UOE port. The datagrams waiting
    /// in the lane go out as plain UDP, each from its own source port's
    /// kernel socket, and so do later sends until a probe connects.
    pub(super) fn go_plain(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        st.plain = true;
        let before = st.out.queued();
        if before == 0 {
            return;
        }
        let mut lost = 0u64;
        frame::each_queued(st.out.unwritten(), |src, dst, payload| {
            let iov = [IoSlice::new(payload)];
            let item = [(src, dst, &iov[..], payload.len())];
            let sent = self.sender_of(src).is_some_and(|u| {
                let r = self.send_plain(&u, lane.key.0, &item);
                if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                    let _ = crate::sys::poll::poll_writable(u.as_raw_fd(), Some(Duration::from_millis(20)));
                    return self.send_plain(&u, lane.key.0, &item).is_ok();
                }
                r.is_ok()
            });
            if !sent {
                lost += 1;
                self.lost_by(src, 1, |d| &d.send);
            }
        });
        Counters::add(&self.c.plain_lost, lost);
        // Each went out as plain UDP or was counted just above.
        st.out.clear(&mut |_, _| {});
        self.settle(lane, st, before);
    }

    /// The lane for `(peer, idx)`, created on first use; None at the cap.
    pub(in crate::backend::tcp) fn lane(&self, peer: IpAddr, idx: u8) -> io::Result<Option<Arc<Lane>>> {
        if self.stopped() {
            return Err(err(libc::ENETDOWN));
        }
        let key = (norm_ip(peer), idx);
        let mut lanes = lock(&self.lanes);
        if let Some(l) = lanes.get(&key) {
            return Ok(Some(l.clone()));
        }
        if lanes.len() >= self.cfg.max_conns {
            return Ok(None);
        }
        let l = Arc::new(Lane {
            key,
            st: Mutex::new(LaneSt {
                phase: Phase::Idle,
                conn: None,
                out: OutBuf::default(),
                attempts: 0,
                retry_at: None,
                fallback: false,
                was_up: false,
                waiters: 0,
                last_used: Instant::now(),
                retired: false,
                closed: false,
                corked_at: None,
                plain: false,
                rooms: Vec::new(),
            }),
            cv: Condvar::new(),
        });
        lanes.insert(key, l.clone());
        Ok(Some(l))
    }

    /// Lane index of a flow.
    pub(in crate::backend::tcp) fn lane_index(&self, src: u16, dst: u16) -> u8 {
        let n = u32::from(self.cfg.conns_per_peer.max(1));
        if n == 1 {
            return 0;
        }
        let h = ((u32::from(src) << 16) | u32::from(dst)).wrapping_mul(0x9E37_79B1);
        ((h >> 16) % n) as u8
    }

    /// Queues datagrams `(src port, dst port, payload pieces, length)` on a
    /// lane and pushes them out. Returns how many were taken (sent, queued
    /// or dropped with a counter, as UDP would), or `WouldBlock` when a
    /// connected lane is full: `room` is then shut until the lane has the
    /// `room.need` bytes the send wanted ([`Mgr::shut_room`]), where the
    /// engine thread watches for it, and an application thread waits with
    /// [`Mgr::wait_room`] (through `Backend::wait_writable`), as a full
    /// kernel socket returns `EAGAIN` and its owner polls for `POLLOUT`.
    ///
    /// `whole`: the exclusive ends of messages (GSO-style runs from the
    /// engine) whose items are taken completely or not at all, as
    /// `sendmmsg` takes messages; the count returned then ends on a
    /// message boundary.
    pub(in crate::backend::tcp) fn submit(
        &self,
        lane: &Arc<Lane>,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
        caller: Caller,
        whole: Option<&[usize]>,
        udp: &crate::backend::kernel::UdpSocket,
        room: &Arc<Room>,
    ) -> io::Result<usize> {
        let now = Instant::now();
        let mut st = lock(&lane.st);
        if st.closed || self.stopped() {
            return Err(err(libc::ENETDOWN));
        }
        if st.retired {
            return Err(err(libc::ESTALE)); // the caller fetches the lane again
        }
        st.last_used = now;
        if st.plain {
            // DML (c): the peer has no UOE. A lane that stopped probing
            // probes again now; until a probe connects, plain UDP.
            if st.phase == Phase::Idle {
                self.start_connect(lane, &mut st);
            }
            if st.plain {
                drop(st);
                return self.send_plain(udp, lane.key.0, items);
            }
        }
        let mut taken = 0;
        let mut i = 0;
        // Bytes queued by this call not yet added to `queued_total` (one
        // shared atomic update per call, not per datagram).
        let mut added = 0usize;
        if items.iter().any(|it| it.3 > MAX_PAYLOAD) && (whole.is_some() || items[0].3 > MAX_PAYLOAD) {
            return Err(err(libc::EMSGSIZE));
        }
        // The end of the message that item `i` starts (a datagram alone
        // unless `whole` groups it).
        let group_end =
            |i: usize| whole.and_then(|e| e.iter().copied().find(|&e| e > i)).unwrap_or(i + 1).min(items.len());
        // Items before this index belong to a message already admitted.
        let mut admitted = 0;
        // A streaming sender's datagrams are gathered in the queue instead
        // (one write per block, below).
        let cork = caller == Caller::Stream && !self.cfg.cork.is_zero();
        if st.phase == Phase::Up && st.out.queued() == 0 && !cork && items.iter().all(|it| it.3 <= MAX_PAYLOAD) {
            // Connected and nothing waits: write the frames straight from the
            // caller's buffers (no copy into the queue). What the socket does
            // not take is queued below as usual; so is the rest of a message
            // it took in part.
            i = self.write_direct(lane, &mut st, items, now, &mut added);
            taken = i;
            if i > 0 && whole.is_some() {
                admitted = group_end(i - 1);
            }
        }
        while i < items.len() {
            let (src, dst, parts, len) = items[i];
            if len > MAX_PAYLOAD {
                break;
            }
            // On a connected lane a whole message is admitted at once (the
            // engine retries what is not taken, so no part may be taken
            // twice); while unconnected, datagrams are queued or dropped one
            // by one and all count as taken.
            if i >= admitted {
                let atomic = whole.is_some() && st.phase == Phase::Up;
                let end = if atomic { group_end(i) } else { i + 1 };
                let size: usize = items[i..end].iter().map(|it| HEADER_LEN + it.3).sum();
                // The bound admits one datagram (or message) of any size into
                // an empty queue. On a connected lane the kernel's socket
                // buffer is the queue: a sender that finds it full gets
                // `WouldBlock` rather than copying megabytes into user space
                // for the manager to write later.
                let bound =
                    if st.phase == Phase::Up { self.cfg.queue_bytes.min(UP_QUEUE_BYTES) } else { self.cfg.queue_bytes };
                // So does the process-wide bound: a lane with nothing queued
                // may always queue one, or the other lanes' queues (a peer
                // that does not listen) would stop it for good.
                let total = self.cfg.total_queue_bytes;
                let fits = |q: usize, all: usize| q == 0 || (q + size <= bound && all + size <= total);
                if !fits(st.out.queued(), self.queued_total.load(Relaxed) + added) {
                    self.queued_total.fetch_add(std::mem::take(&mut added), Relaxed);
                    if st.phase == Phase::Up {
                        // Connected but the socket is full: push what we have;
                        // if that made no room, the caller waits for it.
                        let b = st.out.queued();
                        self.flush_lane(lane, &mut st);
                        self.settle_partial(&mut st, b);
                        if fits(st.out.queued(), self.queued_total.load(Relaxed)) {
                            continue;
                        }
                        Counters::inc(&self.c.backpressure_waits);
                        Self::shut_room(&mut st, room, size);
                        break;
                    }
                    // DML: the bounded queue is full while not connected.
                    Counters::inc(&self.c.drop_queue_full);
                    self.lost_by(items[i].0, 1, |d| &d.send);
                    taken += 1;
                    i += 1;
                    continue;
                }
                admitted = end;
            }
            st.out.push(src, dst, parts, len, now);
            added += HEADER_LEN + len;
            taken += 1;
            i += 1;
        }
        self.queued_total.fetch_add(added, Relaxed);
        match st.phase {
            Phase::Up if cork && st.out.queued() < CORK_BYTES => {
                Counters::add(&self.c.coalesced_sends, taken as u64);
                if st.corked_at.is_none() && st.out.queued() > 0 {
                    st.corked_at = Some(now);
                    // Lane lock held: the manager's scan sees this lane or
                    // we see its disarm and ring.
                    if !self.cork_armed.swap(true, SeqCst) {
                        self.ring();
                    }
                }
            }
            Phase::Up => {
                if cork {
                    Counters::add(&self.c.coalesced_sends, taken as u64);
                }
                let b = st.out.queued();
                self.flush_lane(lane, &mut st);
                self.settle_partial(&mut st, b);
            }
            Phase::Idle => self.start_connect(lane, &mut st),
            Phase::Connecting | Phase::Backoff => {}
        }
        if matches!(caller, Caller::App | Caller::Stream)
            && self.cfg.dml == Dml::Block
            && st.phase != Phase::Up
            && !st.fallback
            && st.out.queued() > 0
        {
            // DML (b): block while the transport retries, then fall back to (a).
            Counters::inc(&self.c.block_waits);
            let dl = Instant::now() + self.cfg.block_timeout;
            while st.phase != Phase::Up && !st.closed {
                let left = dl.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    st.fallback = true;
                    Counters::inc(&self.c.block_timeouts);
                    break;
                }
                st.waiters += 1;
                st = lane.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
                st.waiters -= 1;
            }
        }
        if taken == 0 && !items.is_empty() {
            return Err(err(libc::EAGAIN));
        }
        Ok(taken)
    }

    /// A send of `room`'s socket found the lane full, wanting `need` bytes:
    /// shuts `room` and enrolls it (once; the smallest need counts), under
    /// the lane's lock, so the drain that makes the room opens it.
    fn shut_room(st: &mut LaneSt, room: &Arc<Room>, need: usize) {
        room.need.store(need, Relaxed);
        room.shut();
        st.rooms.retain(|(r, _)| r.strong_count() > 0);
        match st.rooms.iter_mut().find(|(r, _)| std::ptr::eq(r.as_ptr(), Arc::as_ptr(room))) {
            Some(e) => e.1 = e.1.min(need),
            None => st.rooms.push((Arc::downgrade(room), need)),
        }
    }

    /// Opens the enrolled rooms whose send would no longer find the lane
    /// full, by the test [`Mgr::wait_room`] makes (a lane not connected, or
    /// closed, takes or fails every send). Called wherever the lane's
    /// queue shrinks or its connection changes.
    pub(super) fn open_rooms(&self, st: &mut LaneSt) {
        if st.rooms.is_empty() {
            return;
        }
        let q = st.out.queued();
        let all = st.closed || st.retired || st.phase != Phase::Up || q == 0;
        st.rooms.retain(|(r, need)| {
            if !all && !self.up_room(q, *need) {
                return r.strong_count() > 0;
            }
            if let Some(r) = r.upgrade() {
                r.open();
            }
            false
        });
    }

    /// The engine thread's send of `need` bytes was refused by `lane`:
    /// whether to wait for the room on the thread (true once it is there)
    /// rather than return `EAGAIN` for the endpoint to watch the room
    /// descriptor.
    ///
    /// The watch keeps a full lane from holding up the engine's other work,
    /// but on a lane to a peer that keeps up each refusal then costs the
    /// endpoint a watch and a wake-up through the engine's room set (a few
    /// syscalls) and splits its next send in two (the refused rest, then
    /// what its program queued meanwhile). Such a
    /// lane refuses every few megabytes and its room comes back within
    /// milliseconds, so while nothing else waits for the engine (no kicked
    /// endpoint, nothing ready in its epoll set: `engine::others_waiting`,
    /// looked at every [`ENGINE_WAIT_SLICE`]) it waits here, for at most
    /// [`ENGINE_WAIT`]. Work that comes meanwhile waits at most one slice;
    /// a stopped peer costs one such wait, after which its room is watched.
    pub(in crate::backend::tcp) fn engine_wait(&self, lane: &Arc<Lane>, need: usize) -> bool {
        let start = Instant::now();
        let mut begun = false;
        loop {
            if crate::engine::others_waiting() != Some(false) {
                if begun {
                    Counters::inc(&self.c.engine_wait_yields);
                }
                return false;
            }
            if !std::mem::replace(&mut begun, true) {
                Counters::inc(&self.c.engine_waits);
            }
            let left = ENGINE_WAIT.saturating_sub(start.elapsed());
            if left.is_zero() {
                Counters::inc(&self.c.engine_wait_timeouts);
                return false;
            }
            if self.wait_room(lane, left.min(ENGINE_WAIT_SLICE), need) {
                return true;
            }
        }
    }

    /// Whether `need` more bytes fit a connected lane holding `q` (the test
    /// [`Mgr::submit`] makes): its own bound and the process-wide one. A
    /// lane that drains to empty always has room, so a wait on it ends even
    /// while other lanes hold the process-wide queue.
    fn up_room(&self, q: usize, need: usize) -> bool {
        q + need <= self.cfg.queue_bytes.min(UP_QUEUE_BYTES)
            && self.queued_total.load(Relaxed) + need <= self.cfg.total_queue_bytes
    }

    /// Waits at most `timeout` until a send on `lane` would not find it
    /// full: true when any datagram fits (or the lane is not connected, where
    /// the DML takes every datagram, or closed, where a send fails at once).
    ///
    /// `need`: the bytes the refused send wanted (a whole message may be
    /// larger than a datagram); 0 means room for a datagram of any size,
    /// as POLLOUT means room for one.
    pub(in crate::backend::tcp) fn wait_room(&self, lane: &Arc<Lane>, timeout: Duration, need: usize) -> bool {
        let deadline = Instant::now() + timeout;
        let need = if need == 0 { HEADER_LEN + MAX_PAYLOAD } else { need };
        let mut st = lock(&lane.st);
        loop {
            let q = st.out.queued();
            let room = q == 0 || self.up_room(q, need);
            if st.closed || st.retired || st.phase != Phase::Up || room {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // The manager's EPOLLOUT flush wakes waiters (`settle`).
            st.waiters += 1;
            st = lane.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
            st.waiters -= 1;
        }
    }

    /// The direct path of [`Mgr::submit`]: one `sendmsg` of headers and
    /// payloads; returns the items taken (written, or partly written with
    /// the rest queued, adding the queued bytes to `added`). Consecutive
    /// datagrams of one size between the same ports (an engine run) go as
    /// one run (`frame::run_header`): one header, and payloads that a
    /// receiver reads contiguously.
    fn write_direct(
        &self,
        lane: &Arc<Lane>,
        st: &mut LaneSt,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
        now: Instant,
        added: &mut usize,
    ) -> usize {
        let Some(conn) = st.conn.clone() else { return 0 };
        // Units: (first item, end, header, header bytes); at most 1024
        // iovecs (IOV_MAX) per call.
        let mut units: Vec<(usize, usize, [u8; RUN_HEADER_LEN], usize)> = Vec::new();
        let mut n_iov = 0;
        let mut i = 0;
        while i < items.len() {
            let (src, dst, parts, len) = items[i];
            if n_iov + 1 + parts.len() > 1024 {
                break;
            }
            n_iov += 1 + parts.len();
            let mut j = i + 1;
            if len > 0 {
                while j < items.len()
                    && j - i < u16::MAX as usize
                    && (items[j].0, items[j].1, items[j].3) == (src, dst, len)
                    && n_iov + items[j].2.len() <= 1024
                {
                    n_iov += items[j].2.len();
                    j += 1;
                }
            }
            let mut h = [0u8; RUN_HEADER_LEN];
            let hl = if j - i > 1 {
                h = frame::run_header(src, dst, (j - i) as u16, len);
                RUN_HEADER_LEN
            } else {
                h[..HEADER_LEN].copy_from_slice(&frame::header(src, dst, len));
                HEADER_LEN
            };
            units.push((i, j, h, hl));
            i = j;
        }
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(n_iov);
        for (a, b, h, hl) in &units {
            iov.push(IoSlice::new(&h[..*hl]));
            for it in &items[*a..*b] {
                iov.extend_from_slice(it.2);
            }
        }
        loop {
            match sys::sendv_nosignal(conn.fd(), &iov) {
                Ok(w) => {
                    Counters::inc(&self.c.writes);
                    Counters::add(&self.c.bytes_sent, w as u64);
                    st.out.wrote_direct(w);
                    let mut left = w;
                    let mut taken = 0;
                    for (a, b, h, hl) in &units {
                        if left == 0 {
                            break;
                        }
                        let size: usize = hl + items[*a..*b].iter().map(|it| it.3).sum::<usize>();
                        taken = *b;
                        if left >= size {
                            left -= size;
                            Counters::add(&self.c.frames_sent, (b - a) as u64);
                            continue;
                        }
                        // Cut inside this unit: the rest of it is queued
                        // (a run cannot be cut into frames).
                        let len = items[*a].3.max(1);
                        let full = if b - a > 1 { left.saturating_sub(*hl) / len } else { 0 };
                        Counters::add(&self.c.frames_sent, full as u64);
                        let pieces = std::iter::once(&h[..*hl])
                            .chain(items[*a..*b].iter().flat_map(|it| it.2.iter().map(|p| &p[..])));
                        st.out.push_rest(pieces, left, (b - a - full) as u32, items[*a].0, now);
                        *added += size - left;
                        break;
                    }
                    return taken;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return 0,
                Err(_) => {
                    self.detach(lane, st, &conn);
                    self.close_socket(&conn);
                    return 0;
                }
            }
        }
    }

    /// Accounts bytes that left the queue since it held `before` and wakes
    /// senders waiting for room.
    pub(super) fn settle(&self, lane: &Lane, st: &mut LaneSt, before: usize) {
        self.settle_partial(st, before);
        if st.waiters > 0 {
            lane.cv.notify_all();
        }
    }

    pub(super) fn settle_partial(&self, st: &mut LaneSt, before: usize) {
        let now = st.out.queued();
        if now < before {
            self.queued_total.fetch_sub(before - now, Relaxed);
        }
        self.open_rooms(st);
    }

    /// Writes what the lane holds to its connection until the socket is full.
    /// The caller accounts the bytes (`settle`).
    pub(super) fn flush_lane(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        let Some(conn) = st.conn.clone() else { return };
        if st.phase != Phase::Up {
            return;
        }
        // What the socket does not take now is finished on EPOLLOUT.
        st.corked_at = None;
        loop {
            let data = st.out.unwritten();
            if data.is_empty() {
                break;
            }
            match sys::send_nosignal(conn.fd(), data) {
                Ok(n) => {
                    Counters::inc(&self.c.writes);
                    let f = st.out.advance(n);
                    Counters::add(&self.c.frames_sent, f);
                    Counters::add(&self.c.bytes_sent, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.detach(lane, st, &conn);
                    self.close_socket(&conn);
                    break;
                }
            }
        }
    }
}
