//! The RX path: the socket's inbox and the shared RX ring drained into
//! the engine's buffers.

use super::addr::copy_checked;
use super::shared::{Inbox, Queued};
use super::socket::XdpSocket;
use crate::backend::kernel::{InMeta, PktInfo};
use crate::sys::sync::lock;
use eudp_wire::frame;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

impl XdpSocket {
    pub(super) fn meta_for(&self, m: &mut InMeta, len: usize, src: SocketAddrV4, dst: Ipv4Addr, tos: u8, ttl: u8) {
        let opts = self.rx_opts.load(Relaxed);
        m.len = len;
        m.src = Some(if self.v6 {
            SocketAddr::new(src.ip().to_ipv6_mapped().into(), src.port())
        } else {
            SocketAddr::V4(src)
        });
        m.segment = None;
        m.truncated = false;
        m.pktinfo = (opts != 0).then(|| PktInfo {
            v4: (opts & 1 != 0).then_some((self.t.iface.index, dst, dst)),
            v6: (opts & 8 != 0).then_some((dst.to_ipv6_mapped(), self.t.iface.index)),
            tos: (opts & 2 != 0).then_some(tos),
            ttl: (opts & 4 != 0).then_some(ttl),
            tclass: (opts & 16 != 0).then_some(tos),
            hoplimit: (opts & 32 != 0).then_some(ttl),
        });
    }

    /// Takes this socket's queued datagrams into `bufs` from index `at`.
    pub(super) fn take_inbox(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], mut at: usize) -> usize {
        let mut q = lock(&self.inbox.q);
        while at < bufs.len() {
            let Some(m) = q.pop_front() else { break };
            self.inbox.bytes.fetch_sub(m.data.len() as u64 + 256, Relaxed);
            let len = m.data.len();
            if bufs[at].len() < len {
                bufs[at].resize(len, 0);
            }
            bufs[at][..len].copy_from_slice(&m.data);
            self.meta_for(&mut meta[at], len, m.src, m.dst, m.tos, m.ttl);
            at += 1;
            // For a later group frame's copy (`take_group_frame`).
            self.t.recycle(m.data);
        }
        // Pushes set the eventfd under the same lock, so clearing it here
        // cannot hide a datagram queued meanwhile.
        if q.is_empty() && self.inbox.flagged.swap(false, Relaxed) {
            self.inbox.ready.clear();
        }
        at
    }

    /// Drains the shared RX ring: this socket's datagrams into `bufs` from
    /// `at`, the others' into their inboxes.
    pub(super) fn take_ring(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], mut at: usize) -> usize {
        let Ok(mut rx) = self.t.rx.try_lock() else { return at };
        let n = rx.rx.ready();
        let mut taken = 0;
        // The owner of the last frame's addresses: a burst of one flow
        // looks its socket up once.
        let mut last: Option<(SocketAddrV4, SocketAddrV4, Arc<Inbox>)> = None;
        while taken < n && at < bufs.len() {
            let d = rx.rx.take();
            taken += 1;
            let data = self.umem().frame(d.addr, d.len as usize);
            // The UDP checksum is checked while the payload is copied out of
            // the UMEM (one pass over the data, as on the send side).
            match frame::parse_udp4_unchecked(data) {
                Err(_) => {
                    self.t.c.rx_bad_frames.fetch_add(1, Relaxed);
                }
                Ok((f, pending)) if f.dst.ip().is_multicast() => {
                    at = self.take_group_frame(&f, pending, bufs, meta, at);
                }
                Ok((f, pending)) => match owner(&mut last, f.dst, f.src, || self.t.find_socket(f.dst, f.src)) {
                    Ok(inbox) if Arc::ptr_eq(&inbox, &self.inbox) => {
                        let b = &mut bufs[at];
                        if b.len() < f.payload.len() {
                            b.resize(f.payload.len(), 0);
                        }
                        if copy_checked(&mut b[..], f.payload, pending) {
                            self.meta_for(&mut meta[at], f.payload.len(), f.src, *f.dst.ip(), f.tos, f.ttl);
                            at += 1;
                            self.t.c.rx_xdp.fetch_add(1, Relaxed);
                        } else {
                            self.t.c.rx_bad_frames.fetch_add(1, Relaxed);
                        }
                    }
                    Ok(inbox) => {
                        let mut copy = vec![0u8; f.payload.len()];
                        if copy_checked(&mut copy, f.payload, pending) {
                            self.t.c.rx_xdp.fetch_add(1, Relaxed);
                            inbox.push(
                                &self.t.c,
                                Queued { data: copy, src: f.src, dst: *f.dst.ip(), tos: f.tos, ttl: f.ttl },
                            );
                        } else {
                            self.t.c.rx_bad_frames.fetch_add(1, Relaxed);
                        }
                    }
                    Err(true) => {
                        self.t.c.rx_not_peer.fetch_add(1, Relaxed);
                    }
                    Err(false) => {
                        self.t.c.rx_no_socket.fetch_add(1, Relaxed);
                    }
                },
            }
            rx.fill.push(d.addr - d.addr % self.umem().frame_size as u64);
        }
        if taken > 0 {
            rx.rx.release();
            rx.fill.publish();
            // Copy mode never asks; a zero-copy driver that ran out of
            // fill frames does, and takes the new ones only once woken.
            if rx.fill.needs_wakeup() {
                self.t.xsk.wake_rx();
            }
        }
        at
    }
}

/// The socket of frames from `src` to `dst`: `last`'s when the addresses
/// are the same, else `find`'s answer, kept in `last`.
fn owner(
    last: &mut Option<(SocketAddrV4, SocketAddrV4, Arc<Inbox>)>,
    dst: SocketAddrV4,
    src: SocketAddrV4,
    find: impl FnOnce() -> Result<Arc<Inbox>, bool>,
) -> Result<Arc<Inbox>, bool> {
    if let Some((d, s, i)) = last {
        if *d == dst && *s == src {
            return Ok(i.clone());
        }
    }
    let r = find();
    if let Ok(i) = &r {
        *last = Some((dst, src, i.clone()));
    }
    r
}
