//! The send path on the application's thread: the public send calls, the
//! choice between a direct post and L1, and what a send does when L1 is full.

use super::{deadline_after, err, far_future, lock, Endpoint, EpInner, SendFlags};
use crate::queue::{PostDecision, SendState};
use crate::stats::Stats;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{Ordering::Acquire, Ordering::Relaxed};
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};

impl Endpoint {
    /// Sends on a connected endpoint.
    pub fn send(&self, data: &[u8]) -> io::Result<usize> {
        self.send_with(data, None, SendFlags::default())
    }

    /// Sends one datagram to `dst`.
    pub fn send_to(&self, data: &[u8], dst: SocketAddr) -> io::Result<usize> {
        self.send_with(data, Some(dst), SendFlags::default())
    }

    /// Sends one datagram to `dst` (`None`: the connected peer) with
    /// per-call flags.
    pub fn send_with(&self, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        let dst = match dst {
            Some(d) => {
                let d = self.family_addr(d)?;
                if d.port() == 0 {
                    return Err(err(libc::EINVAL));
                }
                Some(d)
            }
            None if !self.inner.connected.load(Relaxed) => return Err(err(libc::EDESTADDRREQ)),
            None => None,
        };
        self.inner.traced_send(data, dst, flags)
    }

    /// Sends several datagrams; returns how many were accepted. Stops at the
    /// first error, which is returned only if nothing was accepted.
    pub fn send_batch(&self, datagrams: &[(&[u8], Option<SocketAddr>)]) -> io::Result<usize> {
        for (i, (d, a)) in datagrams.iter().enumerate() {
            let r = match a {
                Some(a) => self.send_to(d, *a),
                None => self.send(d),
            };
            if let Err(e) = r {
                if i == 0 {
                    return Err(e);
                }
                // Report the error on the next call, as sendmmsg does.
                if let Some(code) = e.raw_os_error().filter(|&c| c != libc::EAGAIN) {
                    self.inner.set_pending_error(code);
                }
                return Ok(i);
            }
        }
        Ok(datagrams.len())
    }

    /// How many times the socket's error queue was read for the kernel's
    /// TX stamps while tracing (sampled tracing stamps, and so reads after
    /// its sends, only the messages of sampled datagrams).
    pub fn tx_stamp_reads(&self) -> crate::tracepoint::StampReads {
        self.inner.trace.stamp_reads()
    }

    /// Waits until everything queued has been handed to the kernel (or the
    /// deadline passes). Returns true when drained.
    pub fn flush(&self, timeout: Duration) -> bool {
        self.inner.flush(deadline_after(timeout).unwrap_or_else(far_future))
    }

    /// When tracing: reads the kernel's TX timestamps still waiting on the
    /// socket's error queue into the trace (as closing the endpoint does),
    /// for a process that writes its trace without closing its sockets
    /// (at exit).
    pub fn drain_trace(&self) {
        if crate::tracepoint::on() {
            self.inner.trace.drain_tx(self.inner.backend.raw_fd());
        }
    }
}

impl EpInner {
    /// [`EpInner::send`] between the application-call tracepoints.
    fn traced_send(self: &Arc<Self>, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        if !crate::tracepoint::on() {
            return self.send(data, dst, flags);
        }
        let seq = self.trace.send_enter(data.len());
        let r = self.send(data, dst, flags);
        self.trace.send_return(seq);
        if r.is_ok() {
            self.trace.note_addrs(crate::tracepoint::SIDE_SEND, || {
                (self.backend.local_addr().ok(), dst.or_else(|| self.backend.peer_addr().ok()))
            });
        }
        r
    }

    fn send(self: &Arc<Self>, data: &[u8], dst: Option<SocketAddr>, flags: SendFlags) -> io::Result<usize> {
        let nonblocking = flags.dont_wait || self.nonblocking.load(Relaxed);
        // The limit follows the destination's family: an IPv4 (or
        // IPv4-mapped) peer of a dual-stack socket gets IPv4's limit. Only
        // lengths between the two limits need the (syscall) peer lookup.
        if data.len() > eudp_wire::limits::MAX_UDP_PAYLOAD_V4 {
            let v6_dst = match dst {
                Some(SocketAddr::V6(a)) => a.ip().to_ipv4_mapped().is_none(),
                Some(SocketAddr::V4(_)) => false,
                None => match self.backend.peer_addr() {
                    Ok(SocketAddr::V6(a)) => a.ip().to_ipv4_mapped().is_none(),
                    Ok(SocketAddr::V4(_)) => false,
                    Err(_) => self.backend.is_v6(),
                },
            };
            if data.len() > eudp_wire::limits::max_payload(v6_dst) {
                return Err(err(libc::EMSGSIZE));
            }
        }
        if let Some(e) = self.take_pending_error() {
            self.error_taken();
            return Err(e);
        }
        if self.engine.is_stopped() {
            return self.direct_send(data, dst.as_ref(), nonblocking);
        }
        let mut deadline: Option<Option<Instant>> = None;
        // Bounds the retries after room was made on this thread (see
        // `room_from_kernel`), which other threads may take first.
        let mut room_tries = 0;
        let mut drain_tries = 0;
        loop {
            let mut s = lock(&self.send);
            if self.lone_pending.load(Relaxed) {
                self.reap_lone_post(&mut s);
            }
            if s.l1_empty() && !s.l2_has_room() && self.rx_calls.load(Relaxed) != s.rx_mark {
                s = self.await_slot(s);
            }
            let decision = if self.streaming(&s) { s.post_streaming(dst, data) } else { s.post(dst, data) };
            match decision {
                PostDecision::Direct => {
                    let seq = self.trace.direct();
                    drop(s);
                    let r = self.direct_send(data, dst.as_ref(), nonblocking);
                    let mut s = lock(&self.send);
                    let rx = self.rx_calls.load(Relaxed);
                    let responsive = std::mem::replace(&mut s.rx_mark, rx) != rx;
                    let first = !self.posted_once.swap(true, Relaxed);
                    // The kernel's send buffer is full (the engine's last GSO
                    // message is still charged to it): rather than fail a
                    // send that L1 has room for, queue it while this post
                    // still holds L2 (this caller's earlier datagrams are all
                    // out, so its order holds) and let the engine send it once
                    // the kernel has room — a kernel socket with this
                    // SO_SNDBUF would have accepted it.
                    if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
                        // Queue or full, never direct again (with L2 deeper
                        // than one, `post` would choose direct once more).
                        let queued = s.post_streaming(dst, data) == PostDecision::Queued;
                        s.direct_done(false);
                        self.kick(&mut s);
                        if queued {
                            // The same datagram: it keeps its send seq.
                            if self.trace.requeue_direct(seq) {
                                s.l1.mark_last_stamped();
                            }
                            return Ok(data.len());
                        }
                        return r;
                    }
                    if !s.direct_done(responsive) {
                        if first && s.l1_empty() {
                            // Nothing was sent before it to batch with:
                            // the slot is left for whoever comes next
                            // rather than the engine, scheduled through
                            // its coalescing timer (arming it is costly on
                            // the send's latency path). A socket used for
                            // one query (a resolver's upstream socket)
                            // then never involves the engine thread: its
                            // close reaps the post (`EpInner::flush`).
                            *lock(&self.lone_post) = Some(Instant::now());
                            self.lone_pending.store(true, Relaxed);
                        } else {
                            self.kick_later(&mut s);
                        }
                    }
                    // Flushers, and a thread in `await_slot`, wait for L2.
                    self.notify_send();
                    return r;
                }
                PostDecision::Queued => {
                    if self.trace.enqueue() {
                        s.l1.mark_last_stamped();
                    }
                    if s.l1.len() == 1 && self.coalesces {
                        s.l1_since = Some(Instant::now());
                    }
                    if self.coalesces && self.l1_holds_a_batch(&s, data.len()) {
                        if self.caller_drains {
                            self.caller_flush(s, true);
                        } else {
                            // The engine thread sends it (woken only if it
                            // sleeps); this thread goes on queueing.
                            self.kick(&mut s);
                        }
                    } else {
                        self.kick_later(&mut s);
                    }
                    return Ok(data.len());
                }
                PostDecision::Closed => return Err(err(libc::EPIPE)),
                PostDecision::Full => {
                    if room_tries < 64 {
                        room_tries += 1;
                        match self.room_from_kernel(s, data.len()) {
                            None => continue,
                            Some(g) => s = g,
                        }
                    }
                    if nonblocking && drain_tries < 64 {
                        drain_tries += 1;
                        match self.drain_full_l1(s, data.len()) {
                            None => continue,
                            Some(g) => s = g,
                        }
                    }
                    self.kick(&mut s);
                    if nonblocking {
                        return Err(err(libc::EAGAIN));
                    }
                    let dl = *deadline.get_or_insert_with(|| self.deadline(true));
                    let wait = match dl {
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => w,
                            _ => return Err(err(libc::EAGAIN)),
                        },
                        // Bounded slices so a lost wake-up cannot hang a sender.
                        None => Duration::from_millis(100),
                    };
                    drop(self.wait_send(s, wait.min(Duration::from_millis(100))));
                }
            }
        }
    }

    /// The socket's first direct post was left unreaped (see
    /// [`EpInner::send`]). A send within the coalescing interval after it
    /// leaves it so (the send queues and schedules the engine, which reaps
    /// it then); a later one reaps it — when the engine's timer would — and
    /// posts directly. So a stream batches as it would with the engine
    /// scheduled for the post, without the engine being woken for it.
    fn reap_lone_post(&self, s: &mut SendState) {
        let mut lp = lock(&self.lone_post);
        if matches!(*lp, Some(t) if t.elapsed() < self.engine.config.tx_coalesce) {
            return;
        }
        if s.reap() > 0 {
            self.notify_send();
        }
        *lp = None;
        self.lone_pending.store(false, Relaxed);
    }

    /// A send found L1 and the rest a full kernel send buffer refused full
    /// together. Where the kernel socket polls writable again — what
    /// `EPOLLOUT` tells a program about it — this thread sends the rest
    /// itself rather than wait for the engine thread to notice the room: a
    /// send after `EPOLLOUT` is then accepted however late the engine
    /// runs, in order (the rest still goes first). Without a rest (L1 full
    /// only because the engine has not taken it yet) nothing changes.
    /// Returns the send lock back when the kernel has no room or took
    /// nothing; else (`None`) the caller posts again (a datagram of `len`
    /// bytes fits, or may soon).
    fn room_from_kernel<'a>(
        self: &'a Arc<Self>,
        s: MutexGuard<'a, SendState>,
        len: usize,
    ) -> Option<MutexGuard<'a, SendState>> {
        let Some(fd) = self.room_fd else { return Some(s) };
        if s.shutdown || s.rest == 0 {
            return Some(s);
        }
        // The staging first (the engine's lock order): a send of the rest
        // in flight on another thread ends, and its rest is counted,
        // before this one looks at the kernel (which that send may have
        // just filled, making room in the rest).
        drop(s);
        let mut st = lock(&self.caller_staging);
        let s = lock(&self.send);
        if s.fits(len) {
            return None;
        }
        if !crate::sys::poll::poll_writable(fd, Some(Duration::ZERO)).unwrap_or(false) {
            drop(st);
            return Some(s);
        }
        let left = self.caller_left.swap(0, Acquire);
        if left == 0 {
            if !st.is_empty() || s.staged != 0 {
                // The engine is sending this socket's queue right now (or
                // about to take up its rest): it makes the room.
                drop(st);
                drop(self.wait_send(s, Duration::from_millis(1)));
            }
            return None; // else the rest is gone: look again
        }
        drop(s);
        let from = left - 1;
        let at = self.send_staged(&st, from, false);
        lock(&self.send).rest = at.map_or(0, |at| st.charged_from(at));
        self.notify_send();
        match at {
            None => {
                st.clear();
                None
            }
            Some(at) => {
                drop(st);
                self.await_room(at);
                if at > from {
                    None
                } else {
                    Some(lock(&self.send))
                }
            }
        }
    }

    /// A nonblocking send found L1 full (and [`EpInner::room_from_kernel`]
    /// made no room), on a backend whose callers may send L1 themselves
    /// ([`crate::backend::Backend::drain_on_caller`]). Without a rest refused by the
    /// kernel, what is missing is only the engine's turn, which on a busy
    /// host may be milliseconds away, and a kernel socket would have taken the
    /// datagram (with a small SO_SNDBUF over loopback the kernel refuses
    /// no send, so none should fail here for want of the engine's turn). This
    /// thread then sends L1 itself, as a streaming caller's flush does
    /// ([`EpInner::caller_flush`]), so that such a send fails only where the
    /// kernel's send buffer is full too (the flush leaves a rest, and
    /// [`EpInner::room_from_kernel`] finds the socket unwritable). A backend
    /// call already in flight (the engine's, or another thread's post) ends
    /// within one syscall: it is waited for, within a bound. Room that came
    /// meanwhile (the engine sent L1 behind a rest the kernel took after
    /// all) is posted into, so that room is not refused for want of a
    /// look. Returns the send lock
    /// when nothing was sent; `None` when the caller posts again.
    fn drain_full_l1<'a>(
        self: &'a Arc<Self>,
        mut s: MutexGuard<'a, SendState>,
        len: usize,
    ) -> Option<MutexGuard<'a, SendState>> {
        const SPIN: Duration = Duration::from_micros(20);
        const BOUND: Duration = Duration::from_millis(20);
        if !self.coalesces {
            // The engine drains this backend's queue (`tcp`): a full L1
            // is its back-pressure (a lane still connecting takes datagrams
            // into its bounded queue and drops past the bound, so a caller
            // sending L1 there would turn refusals into drops).
            return Some(s);
        }
        let start = Instant::now();
        loop {
            if s.shutdown {
                return Some(s);
            }
            if s.fits(len) {
                // Room came while the rest was looked after.
                return None;
            }
            if s.rest != 0 {
                return Some(s);
            }
            s.reap();
            if s.l2_has_room() && s.staged == 0 && self.caller_left.load(Acquire) == 0 {
                self.caller_flush(s, false);
                return None;
            }
            let waited = start.elapsed();
            if waited > BOUND {
                return Some(s);
            }
            if waited < SPIN {
                drop(s);
                std::thread::yield_now();
                s = lock(&self.send);
            } else {
                s = self.wait_send(s, (BOUND - waited).min(Duration::from_millis(1)));
            }
        }
    }

    /// True when this send continues a stream: L1 is empty only because
    /// the caller's thread sent it itself less than a coalescing interval
    /// ago, and nothing was received since (a request/response caller
    /// still posts directly). Posting it directly would send it alone —
    /// one more syscall, and one more wake-up of the receiver, per batch.
    fn streaming(&self, s: &SendState) -> bool {
        let interval = self.engine.config.tx_coalesce;
        match s.caller_flushed {
            Some((at, rx)) if s.l1_empty() && !interval.is_zero() => {
                rx == self.rx_calls.load(Relaxed) && at.elapsed() < interval
            }
            _ => false,
        }
    }

    /// A request/response caller (it received since its last direct post)
    /// found L1 empty and L2 held — by the engine's descriptor, whose
    /// syscall woke this caller's peer before it returned, or (a
    /// multi-threaded server) by another thread's direct post, whose
    /// syscall woke the peer whose next request this thread now answers.
    /// Queueing would put an engine hop on the latency path, and make the
    /// other thread's completion find L1 non-empty (so it cannot retire its
    /// slot and the engine must reap it, after the coalescing interval):
    /// wait for the slot instead and post directly. The slot frees within
    /// one syscall of its holder, unless the holder was preempted: yield
    /// for a while, then sleep on the send condition (the holder's completion
    /// notifies it). A completed post left for the engine to reap is reaped
    /// here (an application thread may take Reap). Bounded: past it, the
    /// caller queues.
    fn await_slot<'a>(&'a self, mut s: MutexGuard<'a, SendState>) -> MutexGuard<'a, SendState> {
        const SPIN: Duration = Duration::from_micros(20);
        const BOUND: Duration = Duration::from_millis(2);
        let start = Instant::now();
        loop {
            s.reap();
            if !s.l1_empty() || s.l2_has_room() || s.shutdown {
                return s;
            }
            let waited = start.elapsed();
            if waited > BOUND {
                return s;
            }
            if waited < SPIN {
                // Yield rather than spin: on a busy machine the holder may
                // be waiting for this CPU.
                drop(s);
                std::thread::yield_now();
                s = lock(&self.send);
            } else {
                s = self.wait_send(s, BOUND - waited);
            }
        }
    }

    /// One datagram on the caller's thread. A full kernel send buffer makes
    /// a blocking endpoint wait for room, as a blocking socket would.
    fn direct_send(&self, data: &[u8], dst: Option<&SocketAddr>, nonblocking: bool) -> io::Result<usize> {
        let mut deadline: Option<Option<Instant>> = None;
        loop {
            Stats::add(&self.stats.send_calls, 1);
            // Sampled tracing: only a sampled datagram asks for TX stamps.
            let stamp = self.trace.direct_stamp();
            self.trace.sys_enter(stamp || !self.trace.stamps_per_message());
            let sent = if stamp { self.backend.send_one_stamped(data, dst) } else { self.backend.send_one(data, dst) };
            match sent {
                Ok(n) => {
                    self.trace.sys_return_direct();
                    // Traced: the stamps of direct posts are read by the
                    // sending thread too (the engine's watch may be off).
                    if crate::tracepoint::on() {
                        self.trace.after_send(self.backend.raw_fd());
                    }
                    Stats::add(&self.stats.datagrams_sent, 1);
                    Stats::add(&self.stats.bytes_sent, n as u64);
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !nonblocking => {
                    let dl = *deadline.get_or_insert_with(|| self.deadline(true));
                    let wait = match dl {
                        Some(d) => match d.checked_duration_since(Instant::now()) {
                            Some(w) if !w.is_zero() => w,
                            _ => return Err(e),
                        },
                        None => Duration::from_millis(100),
                    };
                    // Queued stamps would end the wait at once (POLLERR).
                    self.trace.drain_tx(self.backend.raw_fd());
                    self.backend.wait_writable(wait.min(Duration::from_millis(100)))?;
                }
                Err(e) => return Err(e),
            }
        }
    }
}
