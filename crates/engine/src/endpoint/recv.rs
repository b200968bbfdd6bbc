//! The receive calls: a datagram already in the ring is taken without a
//! system call; an empty ring leads to [`EpInner::recv_wait`].

use super::readiness::RecvSide;
use super::{lock, Endpoint, EpInner, Received, RecvFlags};
use crate::backend::PktInfo;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{Ordering::Relaxed, Ordering::Release};

impl Endpoint {
    /// Receives one datagram; returns its length and sender. A datagram
    /// longer than `buf` is truncated (the rest is discarded, as recvfrom does).
    pub fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.recv_with(buf, RecvFlags::default()).map(|r| (r.copied, r.src))
    }

    /// Receives on a connected endpoint.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).map(|r| r.0)
    }

    /// Receives with flags (peek, don't-wait).
    #[inline]
    pub fn recv_with(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<Received> {
        self.inner.traced_recv(buf, flags, None)
    }

    /// [`Endpoint::recv_with`], also writing where the datagram was addressed
    /// (`IP_PKTINFO`/`IPV6_RECVPKTINFO` on the socket, as the kernel reported
    /// it; `None` when the socket did not ask) to `info`. Kept apart from
    /// [`Received`] so receives that do not want it do not copy it.
    #[inline]
    pub fn recv_with_info(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        info: &mut Option<crate::backend::PktInfo>,
    ) -> io::Result<Received> {
        *info = None;
        self.inner.traced_recv(buf, flags, Some(info))
    }

    /// Takes the next datagram if the ring holds one, never waiting or
    /// reading the socket: the receive of a stream whose caller saw the
    /// ring's count ([`Endpoint::ring_len`]) above zero, without the layers
    /// of [`Endpoint::recv_with`] (flags, `io::Result`, the wait path) that
    /// a receive served from the ring does not use. `None`: the ring was
    /// empty after all, or tracing is on (the traced call records its
    /// steps); the caller then makes the full receive.
    #[inline]
    pub fn recv_ready(&self, buf: &mut [u8]) -> Option<Received> {
        if crate::tracepoint::on() {
            return None;
        }
        let i = &self.inner;
        let r = i.pop(&mut lock(&i.recv), buf, false, None)?;
        // Only this thread writes it: a plain load/store pair, no locked op.
        i.rx_calls.store(i.rx_calls.load(Relaxed).wrapping_add(1), Relaxed);
        Some(r)
    }

    /// Receives up to `bufs.len()` datagrams: blocks (per the endpoint's mode)
    /// for the first, then takes what is already waiting.
    pub fn recv_batch(&self, bufs: &mut [&mut [u8]], out: &mut Vec<Received>) -> io::Result<usize> {
        out.clear();
        for (i, b) in bufs.iter_mut().enumerate() {
            let flags = RecvFlags { dont_wait: i > 0, ..RecvFlags::default() };
            match self.inner.traced_recv(b, flags, None) {
                Ok(r) => out.push(r),
                Err(e) if i > 0 && e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if i == 0 => return Err(e),
                Err(e) => {
                    // Keep it for the next call, as recvmmsg does.
                    if let Some(code) = e.raw_os_error() {
                        self.inner.set_pending_error(code);
                    }
                    break;
                }
            }
        }
        Ok(out.len())
    }
}

impl EpInner {
    /// [`EpInner::recv`] between the application-call tracepoints.
    #[inline]
    fn traced_recv(
        &self,
        buf: &mut [u8],
        flags: RecvFlags,
        info: Option<&mut Option<PktInfo>>,
    ) -> io::Result<Received> {
        if !crate::tracepoint::on() {
            return self.recv(buf, flags, info);
        }
        let t = self.trace.recv_enter();
        let r = self.recv(buf, flags, info);
        if r.is_ok() && !flags.peek {
            self.trace.recv_return(t);
        }
        r
    }

    #[inline]
    pub(super) fn pop(
        &self,
        rs: &mut RecvSide,
        buf: &mut [u8],
        peek: bool,
        info: Option<&mut Option<PktInfo>>,
    ) -> Option<Received> {
        let d = rs.ring.pop_into(buf, peek, info)?;
        self.ring_len.0.store(rs.ring.datagrams(), Release);
        if !peek {
            self.trace.pop();
        }
        if rs.ring.is_empty() && (self.pending_error.load(Relaxed) == 0 || rs.err.is_some()) {
            rs.unsignal();
        }
        let src = d.src.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0)));
        Some(Received { copied: d.copied, len: d.len, src })
    }

    /// A receive: a datagram already in the ring is taken here, inlined into
    /// the caller (the shim), so its record is written where the caller
    /// keeps it; returned through a call it was copied again, and a copy of
    /// freshly written fields stalls on store forwarding. Everything else is
    /// [`EpInner::recv_wait`].
    #[inline]
    fn recv(&self, buf: &mut [u8], flags: RecvFlags, mut info: Option<&mut Option<PktInfo>>) -> io::Result<Received> {
        // Only this thread writes it: a plain load/store pair, no locked op.
        self.rx_calls.store(self.rx_calls.load(Relaxed).wrapping_add(1), Relaxed);
        {
            let mut rs = lock(&self.recv);
            if let Some(r) = self.pop(&mut rs, buf, flags.peek, info.as_deref_mut()) {
                return Ok(r);
            }
        }
        self.recv_wait(buf, flags, info)
    }
}
