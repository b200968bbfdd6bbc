//! Reading the socket into the receive ring: batched reads, GRO split, and
//! an application thread's scratch buffers.

use super::{lock, EpInner};
use crate::serve::{RecvScratch, RX_BUF};
use crate::stats::Stats;
use std::io;
use std::sync::atomic::{Ordering::Relaxed, Ordering::Release};

/// The most datagrams one received message carries: the kernel coalesces
/// up to 64 (`UDP_GRO_CNT_MAX`), and a local sender's GSO message, handed
/// over whole, up to 128 (`UDP_MAX_SEGMENTS`).
const GRO_MAX_SEGMENTS: usize = 128;

/// Messages received into a buffer smaller than this are copied into a
/// small buffer (reused through the ring's small spares) so a small
/// datagram does not pin 64 KiB.
const COPY_BELOW: usize = crate::ring::SMALL_MAX;

thread_local! {
    static CALLER_SCRATCH: std::cell::RefCell<Option<RecvScratch>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` with this application thread's receive scratch buffers.
pub(super) fn with_caller_scratch<R>(f: impl FnOnce(&mut RecvScratch) -> R) -> R {
    CALLER_SCRATCH.with(|c| f(c.borrow_mut().get_or_insert_with(|| RecvScratch::new(4))))
}

/// What one fill of the ring from the socket did.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fill {
    /// Datagrams added to the ring.
    pub(super) added: usize,
    /// Every read came back full: the socket likely holds more.
    pub(super) more: bool,
    /// Stopped because the ring had no room for another message.
    pub(super) ring_full: bool,
}

impl EpInner {
    /// One read of the socket into the ring on an application thread, with
    /// that thread's scratch buffers. The caller holds `rx_sock`.
    pub(super) fn fill_on_caller(&self, signal: bool, max_msgs: usize) {
        with_caller_scratch(|sc| {
            let n = sc.bufs.len().min(max_msgs.max(1));
            self.fill_ring_upto(sc, n, 1, signal, false)
        });
    }

    /// The first look of a blocking receive that spins, on its own thread:
    /// a batch, as [`EpInner::fill_on_caller`] reads, but read as
    /// [`crate::backend::Backend::recv_spinning`] reads. The caller holds
    /// `rx_sock` and settles readiness after its pop.
    pub(super) fn first_spin_look_on_caller(&self) {
        with_caller_scratch(|sc| {
            let n = sc.bufs.len();
            self.fill_ring_upto(sc, n, 1, false, true)
        });
    }

    /// A later look of a spinning receive on its own thread: one message,
    /// read as [`crate::backend::Backend::recv_spinning`] reads. The caller
    /// holds `rx_sock` and settles readiness after its pop.
    pub(super) fn spin_look_on_caller(&self) {
        with_caller_scratch(|sc| self.fill_ring_upto(sc, 1, 1, false, true));
    }

    /// Moves what the socket holds into the ring, as far as the ring has
    /// room. The caller holds `rx_sock`; the ring lock is taken only to
    /// size a read and to push.
    /// `signal`: make the ready fd readable on an empty→non-empty push (the
    /// engine); a receiving thread that pops next passes false and settles
    /// readiness after its pop.
    pub(super) fn fill_ring(&self, scratch: &mut RecvScratch, rounds: usize, signal: bool) -> Fill {
        self.fill_ring_upto(scratch, scratch.bufs.len(), rounds, signal, false)
    }

    /// [`EpInner::fill_ring`] reading at most `msgs` messages per round.
    fn fill_ring_upto(&self, scratch: &mut RecvScratch, msgs: usize, rounds: usize, signal: bool, spin: bool) -> Fill {
        let mut added = 0;
        for round in 0..rounds {
            let budget = self.read_budget(msgs);
            if budget == 0 {
                return Fill { added, more: false, ring_full: true };
            }
            Stats::add(&self.stats.recv_calls, 1);
            self.trace.rx_enter();
            let (bufs, meta) = (&mut scratch.bufs[..budget], &mut scratch.meta[..budget]);
            let read = if spin { self.backend.recv_spinning(bufs, meta) } else { self.backend.recv_batch(bufs, meta) };
            let got = match read {
                Ok(n) => n,
                Err(e) => {
                    self.read_failed(&e, added);
                    break;
                }
            };
            added += self.push_read(scratch, got, signal);
            self.last_fill.store(added, Relaxed);
            if added > 0 {
                self.last_batch.store(added, Relaxed);
            }
            if got < budget {
                break;
            }
            if round + 1 == rounds {
                return Fill { added, more: true, ring_full: false };
            }
        }
        Fill { added, more: false, ring_full: false }
    }

    /// Messages the next read of the socket may bring (at most `bufs`):
    /// no more than the ring has room for, each counted as the largest
    /// message a stream of the last read's datagrams can form. A read that
    /// brought more would take datagrams off the socket only to drop them,
    /// while the socket's own buffer would have kept them until the
    /// application caught up; so with the ring full nothing is read and
    /// arrivals wait (or overflow) in the kernel, as on a plain socket.
    pub(super) fn read_budget(&self, bufs: usize) -> usize {
        let per = self.rx_msg_len.load(Relaxed);
        lock(&self.recv).ring.room_for(per).min(bufs)
    }

    /// A read of the socket failed: `EAGAIN`/`EINTR` leave nothing to do;
    /// an asynchronous error (e.g. ICMP port unreachable) is kept for the
    /// caller and the error queue drained, so level-triggered readiness does
    /// not spin.
    pub(super) fn read_failed(&self, e: &io::Error, added: usize) {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => {
                if added == 0 {
                    self.last_fill.store(0, Relaxed);
                }
            }
            _ => {
                let code = e.raw_os_error().unwrap_or(libc::EIO);
                self.set_pending_error(code);
                while self.backend.take_error().is_some() {}
                lock(&self.recv).error_ready();
            }
        }
    }

    /// Pushes the `got` messages of a read into the ring; returns datagrams
    /// added. The caller holds `rx_sock`.
    pub(super) fn push_read(&self, scratch: &mut RecvScratch, got: usize, signal: bool) -> usize {
        let mut added = 0;
        // A message is one datagram or a GRO super-packet of at most
        // `GRO_MAX_SEGMENTS` datagrams of one size, within RX_BUF; so the
        // largest datagram seen bounds the next messages.
        if let Some(dgram) = scratch.meta[..got].iter().map(|m| m.segment.unwrap_or(m.len).min(m.len)).max() {
            self.rx_msg_len.store((dgram.max(1) * GRO_MAX_SEGMENTS).min(RX_BUF), Relaxed);
        }
        {
            let mut rs = lock(&self.recv);
            for i in 0..got {
                let m = scratch.meta[i];
                if m.truncated {
                    Stats::add(&self.stats.drop_truncated, 1);
                    continue;
                }
                let buf = if m.len < COPY_BELOW {
                    rs.ring.copy_small(&scratch.bufs[i][..m.len])
                } else {
                    let spare = rs.ring.take_buffer(RX_BUF);
                    std::mem::replace(&mut scratch.bufs[i], spare)
                };
                if m.segment.is_some_and(|s| s < m.len) {
                    Stats::add(&self.stats.gro_superpackets, 1);
                }
                let was_empty = rs.ring.is_empty();
                let len = m.len.min(buf.len());
                match rs.ring.push_message(buf, len, m.segment, m.src, m.pktinfo) {
                    Ok(n) => {
                        self.trace.rx_push(i, n);
                        self.trace.note_addrs(crate::tracepoint::SIDE_RECV, || (self.backend.local_addr().ok(), m.src));
                        added += n;
                        Stats::add(&self.stats.datagrams_received, n as u64);
                        Stats::add(&self.stats.bytes_received, m.len as u64);
                        if was_empty && signal {
                            rs.signal();
                        }
                    }
                    Err(n) => Stats::add(&self.stats.drop_ring_full, n as u64),
                }
            }
            self.ring_len.0.store(rs.ring.datagrams(), Release);
        }
        added
    }
}
