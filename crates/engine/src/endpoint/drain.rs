//! Draining staged datagrams into the kernel: the engine's service of an
//! endpoint's send side, GSO batches per call, a full send buffer, flush.

use super::{lock, EpInner};
use crate::backend::kernel::OutMsg;
use crate::batch::{group_calls, gso_batch};
use crate::queue::L1Queue;
use crate::stats::Stats;
use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::sync::atomic::{Ordering::Acquire, Ordering::Relaxed, Ordering::Release, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

impl EpInner {
    /// Engine side: reap completions, drain L1 in batches while L2 has room.
    ///
    /// Where the engine sends a stream's batches (`coalesces` without
    /// `caller_drains`), each take marks the stream on (as the caller's own
    /// flush does: its next sends queue rather than post directly), and
    /// after the first take the engine takes L1 again only once it holds a
    /// batch: a shorter remainder waits for the sender to complete it (its
    /// send then kicks the engine) or for the coalescing interval.
    pub(crate) fn service_send(self: &Arc<Self>, staging: &mut L1Queue) {
        self.service(staging, false)
    }

    /// [`EpInner::service_send`] once the socket the engine's send found
    /// full has room again (`Shared::await_room`).
    pub(crate) fn resume_send(self: &Arc<Self>, staging: &mut L1Queue) {
        self.service(staging, true)
    }

    fn service(self: &Arc<Self>, staging: &mut L1Queue, mut room: bool) {
        let engine_streams = self.coalesces && !self.caller_drains && !self.engine.config.tx_coalesce.is_zero();
        // Without a descriptor to watch for room, the engine waits for it.
        let wait = self.room_fd.is_none();
        let mut first = true;
        loop {
            let left = self.caller_left.swap(0, Acquire);
            if left != 0 {
                let mut st = lock(&self.caller_staging);
                if std::mem::take(&mut room) {
                    // The socket has room: L1 joins the rest (behind it, so
                    // in order) before the first send, so that L1 has room
                    // again the moment the socket has, as a kernel socket's
                    // queue would (a program that polled for room must find
                    // it, not race the engine's send).
                    let mut s = lock(&self.send);
                    let n = s.l1.len();
                    if n > 0 {
                        s.rest += s.l1.charged();
                        s.l1.move_tail(0, &mut st);
                        s.staged += n as u32;
                        s.l1_carried = 0;
                        drop(s);
                        self.trace.take(n);
                        self.notify_send();
                    }
                }
                let at = self.send_staged(&st, left - 1, wait);
                lock(&self.send).rest = at.map_or(0, |at| st.charged_from(at));
                if let Some(at) = at {
                    // Still no room: the rest stays where it is.
                    drop(st);
                    return self.await_room(at);
                }
                st.clear();
                drop(st);
                self.notify_send();
            }
            {
                let mut s = lock(&self.send);
                s.reap();
                let batch = engine_streams
                    && s.staged == 0
                    && s.l1.slots().last().is_some_and(|d| self.l1_holds_a_batch(&s, d.len as usize));
                if engine_streams
                    && !first
                    && !batch
                    && !s.l1.is_empty()
                    && s.staged == 0
                    && s.flushers == 0
                    && !s.shutdown
                {
                    s.scheduled = true;
                    s.coalescing = true;
                    let since = s.l1_since.unwrap_or_else(Instant::now);
                    self.engine.schedule_coalesced(self, since);
                    drop(s);
                    self.notify_send();
                    return;
                }
                first = false;
                // A caller's flush whose last call is still in flight may
                // yet leave a rest (its send buffer full) that must go
                // before L1: L1 stays for that caller, which kicks the
                // engine again once its flush is over.
                let flushing = self.caller_staging.try_lock().is_err();
                let took = if flushing { 0 } else { s.take_l1(staging) };
                if batch && took > 0 {
                    // A whole batch left: the stream is on.
                    s.caller_flushed = Some((Instant::now(), self.rx_calls.load(Relaxed)));
                }
                if took == 0 && self.caller_left.load(Acquire) != 0 {
                    continue; // left by a caller's flush since the check above
                }
                if took == 0 {
                    s.scheduled = false;
                    s.coalescing = false;
                    self.notify_send();
                    return;
                }
                self.trace.take(took);
            }
            // L1 has room again.
            self.notify_send();
            if let Some(at) = self.send_staged(staging, 0, wait) {
                // The kernel's send buffer is full. The rest stays staged
                // (nothing overtakes it) in this endpoint's own arena, the
                // engine's serving every endpoint.
                let mut st = lock(&self.caller_staging);
                debug_assert!(st.is_empty());
                std::mem::swap(&mut *st, staging);
                lock(&self.send).rest = st.charged_from(at);
                drop(st);
                return self.await_room(at);
            }
            staging.clear();
        }
    }

    /// The engine's send met a full kernel send buffer at `caller_staging`
    /// index `at`: the rest waits there, and the engine services this
    /// endpoint again once the socket is writable, going on with other
    /// endpoints meanwhile. The endpoint stays marked scheduled so that
    /// its callers' kicks do not bring it back before then.
    pub(super) fn await_room(self: &Arc<Self>, at: usize) {
        self.caller_left.store(at + 1, Release);
        {
            let mut s = lock(&self.send);
            s.scheduled = true;
            s.coalescing = false;
        }
        self.notify_send();
        let fd = self.room_fd.expect("only endpoints with a writable fd stop at a full send buffer");
        let rearm = self.room_watched.swap(true, SeqCst);
        if self.engine.await_room(self.id, fd, rearm).is_err() {
            // Not watchable (it should be): look again in a moment.
            let _ = self.backend.wait_writable(Duration::from_millis(10));
            self.engine.schedule(self.clone());
        }
    }

    /// Hands the staged datagrams from index `from` on to the backend, one
    /// descriptor per call. Unless told to `wait` for room, it stops where
    /// the kernel's send buffer is full and returns that index: the
    /// datagrams from there on count as staged again.
    pub(super) fn send_staged(&self, staging: &L1Queue, from: usize, wait: bool) -> Option<usize> {
        let items: Vec<(Option<SocketAddr>, usize)> = staging.slots().iter().map(|s| (s.dst, s.len as usize)).collect();
        // Connected sends carry no destination: their segment limit follows
        // the peer's family (an IPv4-mapped peer of a dual-stack socket
        // takes IPv4's larger segments). One lookup per staging.
        let connected_v4 = self.backend.is_v6()
            && items.iter().any(|(d, _)| d.is_none())
            && matches!(self.backend.peer_addr(), Ok(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_some());
        let mut done = from;
        // Plan once per staging; plan again only when a GSO fallback changed
        // the limits (planning per call would be quadratic in L1's length).
        while done < items.len() {
            let lim = self.plan_limits(connected_v4);
            let base = done;
            let runs = gso_batch(&items[base..], &lim);
            let fallbacks = self.stats.gso_fallbacks.load(Relaxed);
            for (first, n) in group_calls(&runs, self.engine.config.max_msgs, 1024) {
                let call_runs: Vec<crate::batch::Run> = runs[first..first + n]
                    .iter()
                    .map(|r| crate::batch::Run { start: r.start + base - done, ..*r })
                    .collect();
                let datagrams: usize = call_runs.iter().map(|r| r.count).sum();
                self.trace.batch(done, datagrams);
                self.wait_l2_room_and_begin(datagrams as u32);
                let sent = self.send_call(staging, done, &call_runs, wait);
                let mut s = lock(&self.send);
                s.end_batch();
                if sent < datagrams {
                    s.staged += (datagrams - sent) as u32;
                    return Some(done + sent);
                }
                drop(s);
                done += datagrams;
                if self.stats.gso_fallbacks.load(Relaxed) != fallbacks {
                    break;
                }
            }
        }
        None
    }

    fn wait_l2_room_and_begin(&self, datagrams: u32) {
        let mut spins = 0u32;
        loop {
            let mut s = lock(&self.send);
            s.reap();
            if s.l2_has_room() {
                s.begin_batch(datagrams);
                return;
            }
            drop(s);
            // Only a direct post that started before we staged can hold L2;
            // it finishes within one syscall.
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Hands one descriptor's datagrams (`runs`, relative to `base`) to the
    /// backend. Partial acceptance is retried; a GSO rejection (EIO/EINVAL)
    /// turns GSO off for this socket and resends the rest as plain
    /// datagrams; other errors drop that message and are reported on the
    /// caller's next call, as `sk_err` would be. Returns the datagrams
    /// done (sent or dropped): all of them, unless the kernel's send buffer
    /// is full and not `wait` (then the rest is the caller's to send later;
    /// that may start inside a GSO message the backend split).
    fn send_call(&self, staging: &L1Queue, base: usize, runs: &[crate::batch::Run], wait: bool) -> usize {
        let slots = &staging.slots()[base..];
        let mut runs: Vec<crate::batch::Run> = runs.to_vec();
        let mut m = 0; // runs done
        let mut done = 0; // their datagrams, and those of runs[m] a split message sent
        while m < runs.len() {
            let pending = &runs[m..];
            let mut iovs: Vec<IoSlice<'_>> = Vec::with_capacity(pending.iter().map(|r| r.count).sum());
            for r in pending {
                for s in &slots[r.start..r.start + r.count] {
                    iovs.push(IoSlice::new(staging.payload(s)));
                }
            }
            let per_msg = self.trace.stamps_per_message();
            let mut msgs: Vec<OutMsg<'_>> = Vec::with_capacity(pending.len());
            let mut at = 0;
            for r in pending {
                // Sampled tracing: a message carrying a sampled datagram
                // asks for its TX stamps.
                let stamp = per_msg && slots[r.start..r.start + r.count].iter().any(|s| s.stamp);
                msgs.push(OutMsg { dst: slots[r.start].dst, iov: &iovs[at..at + r.count], segment: r.segment, stamp });
                at += r.count;
            }
            Stats::add(&self.stats.send_calls, 1);
            self.trace.sys_enter(!per_msg || msgs.iter().any(|m| m.stamp));
            match self.backend.send_batch(&msgs) {
                Ok(k) => {
                    if crate::tracepoint::on() {
                        let split = self.backend.take_split_pieces();
                        if split.is_empty() {
                            self.trace.sys_return_batch(
                                &mut pending[..k].iter().zip(&msgs).map(|(r, m)| (base + r.start, r.count, m.stamp)),
                            );
                        } else {
                            // The first message went out as these kernel messages.
                            self.trace.sys_return_batch(&mut pieces_of(base + pending[0].start, &split, msgs[0].stamp));
                        }
                        self.trace.after_send(self.backend.raw_fd());
                    }
                    Stats::add(&self.stats.engine_batches, 1);
                    let mut dg = 0u64;
                    for (msg, r) in msgs[..k].iter().zip(pending) {
                        dg += r.count as u64;
                        let bytes: usize = msg.iov.iter().map(|v| v.len()).sum();
                        Stats::add(&self.stats.bytes_sent, bytes as u64);
                        if r.segment.is_some() {
                            Stats::add(&self.stats.gso_messages, 1);
                        }
                    }
                    self.stats.record_batch(dg);
                    Stats::add(&self.stats.datagrams_sent, dg);
                    done += dg as usize;
                    m += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if let Some(k) = crate::backend::partly_sent(&e).filter(|&k| k > 0 && k < runs[m].count) {
                        // The first k datagrams of runs[m] went out.
                        let r = runs[m];
                        if crate::tracepoint::on() {
                            let split = self.backend.take_split_pieces();
                            if split.is_empty() {
                                self.trace.sys_return_batch(&mut std::iter::once((base + r.start, k, msgs[0].stamp)));
                            } else {
                                self.trace.sys_return_batch(&mut pieces_of(base + r.start, &split, msgs[0].stamp));
                            }
                        }
                        let bytes: usize = slots[r.start..r.start + k].iter().map(|s| s.len as usize).sum();
                        Stats::add(&self.stats.bytes_sent, bytes as u64);
                        Stats::add(&self.stats.datagrams_sent, k as u64);
                        let rest = r.count - k;
                        runs[m] = crate::batch::Run {
                            start: r.start + k,
                            count: rest,
                            segment: r.segment.filter(|_| rest > 1),
                        };
                        done += k;
                    }
                    if !wait {
                        return done;
                    }
                    self.trace.drain_tx(self.backend.raw_fd());
                    let _ = self.backend.wait_writable(Duration::from_millis(10));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    let code = e.raw_os_error().unwrap_or(libc::EIO);
                    let r = runs[m];
                    if let Some(seg) = r.segment.filter(|_| matches!(code, libc::EIO | libc::EINVAL | libc::EMSGSIZE)) {
                        // The kernel will not segment this: EIO/EINVAL (no
                        // checksum offload, unsupported) turns GSO off for the
                        // socket; EMSGSIZE (segment larger than the path MTU
                        // allows) lowers the segment cap below this size. The
                        // rest of this descriptor goes out as plain datagrams.
                        if code == libc::EMSGSIZE && seg > 1 {
                            self.gso_seg_cap.fetch_min(seg as usize - 1, Relaxed);
                        } else {
                            self.gso.store(false, Relaxed);
                        }
                        Stats::add(&self.stats.gso_fallbacks, 1);
                        let rest: Vec<_> = runs[m..]
                            .iter()
                            .flat_map(|x| {
                                (x.start..x.start + x.count).map(|i| crate::batch::Run {
                                    start: i,
                                    count: 1,
                                    segment: None,
                                })
                            })
                            .collect();
                        runs.truncate(m);
                        runs.extend(rest);
                        continue;
                    }
                    Stats::add(&self.stats.drop_send_error, r.count as u64);
                    self.set_pending_error(code);
                    done += r.count;
                    m += 1;
                }
            }
        }
        done
    }

    /// Waits until L1 and L2 are empty or the deadline passes.
    pub(crate) fn flush(self: &Arc<Self>, deadline: Instant) -> bool {
        let mut s = lock(&self.send);
        s.flushers += 1;
        let drained = loop {
            // Completed direct posts are reaped here rather than waited
            // for: the engine would only do the same at its next turn
            // (after the coalescing interval), and a flusher sends nothing
            // more that their slots could make queue for a batch.
            if s.reap() > 0 {
                self.notify_send();
            }
            if s.drained() {
                break true;
            }
            if self.engine.is_stopped() {
                break false;
            }
            self.kick(&mut s);
            let now = Instant::now();
            if now >= deadline {
                break false;
            }
            let wait = (deadline - now).min(Duration::from_millis(20));
            s = self.wait_send(s, wait);
        };
        s.flushers -= 1;
        drained
    }
}

/// The (first staging index, datagrams, stamped) of each kernel message a
/// split message starting at `first` was sent as (`pieces`: their datagrams).
fn pieces_of(first: usize, pieces: &[usize], stamped: bool) -> impl Iterator<Item = (usize, usize, bool)> + '_ {
    pieces.iter().scan(first, move |at, &n| {
        let piece = (*at, n, stamped);
        *at += n;
        Some(piece)
    })
}
