//! The TX path: the route of a datagram and frames onto the TX ring.

use super::addr::{as_v4, broadcast_of, same_subnet};
use super::config::CopyBlock;
use super::shared::{Route, TxBatch};
use super::socket::XdpSocket;
use crate::backend::kernel::OutMsg;
use crate::backend::partly::partly_sent_error;
use crate::sys::nt_copy::copy_nontemporal;
use crate::sys::sync::lock;
use eudp_wire::ether::MacAddr;
use eudp_wire::frame::{self, Udp4Params};
use std::io;
use std::net::{SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;

impl XdpSocket {
    pub(super) fn route(&self, dst: SocketAddrV4, len: usize) -> io::Result<Route> {
        let c = &self.t.c;
        let Some(local) = self.local()? else {
            c.tx_kernel_off_link.fetch_add(1, Relaxed);
            return Ok(Route::Kernel);
        };
        let on_link = self.t.iface.v4.iter().find(|(a, p)| same_subnet(*a, *dst.ip(), *p));
        let Some(&(ifaddr, prefix)) = on_link else {
            c.tx_kernel_off_link.fetch_add(1, Relaxed);
            return Ok(Route::Kernel);
        };
        let d = *dst.ip();
        if d.is_broadcast()
            || d.is_multicast()
            || d == broadcast_of(ifaddr, prefix)
            || d.is_loopback()
            || self.t.iface.v4.iter().any(|(a, _)| *a == d)
        {
            c.tx_kernel_off_link.fetch_add(1, Relaxed);
            return Ok(Route::Kernel);
        }
        let src_ip = if local.ip().is_unspecified() { ifaddr } else { *local.ip() };
        if !self.t.iface.v4.iter().any(|(a, _)| *a == src_ip) {
            c.tx_kernel_off_link.fetch_add(1, Relaxed);
            return Ok(Route::Kernel);
        }
        if !self.fits_frame(len) {
            c.tx_kernel_too_big.fetch_add(1, Relaxed);
            return Ok(Route::Kernel);
        }
        match self.t.neighbour(d) {
            Some(mac) => Ok(Route::Xdp { src: SocketAddrV4::new(src_ip, local.port()), dst, mac }),
            None => {
                c.tx_kernel_no_neigh.fetch_add(1, Relaxed);
                Ok(Route::Kernel)
            }
        }
    }

    /// Whether a datagram of `len` bytes goes unfragmented in one frame.
    fn fits_frame(&self, len: usize) -> bool {
        len + 28 <= self.t.iface.mtu as usize && len + frame::UDP4_OVERHEAD <= self.umem().frame_size
    }

    pub(super) fn dst_of(&self, dst: Option<&SocketAddr>) -> io::Result<Option<SocketAddrV4>> {
        match dst {
            Some(d) => Ok(as_v4(d)),
            None => match lock(&self.state).peer {
                Some(p) => Ok(Some(p)),
                None => Err(io::Error::from_raw_os_error(libc::EDESTADDRREQ)),
            },
        }
    }

    /// Puts `payloads` (each one datagram) to `dst` on the TX ring as
    /// frames, or sends them through the kernel socket where the fast path
    /// cannot take them. Returns how many were accepted. Frames wait on the
    /// ring until the caller flushes `tx` (one kick for a whole batch); a
    /// datagram taking the kernel path flushes first, to keep the order.
    pub(super) fn send_datagrams(
        &self,
        tx: &mut TxBatch<'_>,
        payloads: &mut dyn Iterator<Item = &[u8]>,
        dst: Option<&SocketAddr>,
        kernel_dst: Option<&SocketAddr>,
    ) -> io::Result<usize> {
        let Some(d) = self.dst_of(dst)? else {
            // An IPv6 destination on an IPv4 socket: the kernel's answer.
            let mut n = 0;
            for p in payloads {
                self.kernel.send_to(p, kernel_dst)?;
                n += 1;
            }
            return Ok(n);
        };
        let (tos, ttl) = {
            let v = self.tos_ttl.load(Relaxed);
            ((v >> 8) as u8, v as u8)
        };
        let mut sent = 0;
        for p in payloads {
            // The route found for the send's first frame to `d` holds for
            // every later one that fits a frame too, without the neighbour
            // lookup and address checks again.
            let route = match tx.route {
                Some((to, r)) if to == d && self.fits_frame(p.len()) => r,
                _ => self.route(d, p.len())?,
            };
            let Route::Xdp { src, dst, mac } = route else {
                tx.flush(&self.t)?;
                match self.kernel.send_to(p, kernel_dst) {
                    Ok(_) => {
                        self.t.c.tx_kernel.fetch_add(1, Relaxed);
                        sent += 1;
                        continue;
                    }
                    Err(e) if sent > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(sent),
                    Err(e) => return Err(e),
                }
            };
            if tx.side.free.is_empty() || tx.side.tx.free() == 0 {
                tx.side.reap();
            }
            if tx.side.free.is_empty() || tx.side.tx.free() == 0 {
                tx.flush(&self.t)?;
                tx.side.reap();
                if tx.side.free.is_empty() || tx.side.tx.free() == 0 {
                    if sent > 0 {
                        return Ok(sent);
                    }
                    return Err(io::ErrorKind::WouldBlock.into());
                }
            }
            let addr = tx.side.free.pop().expect("a free frame");
            let buf = self.umem().frame_mut(addr);
            let params = Udp4Params {
                src_mac: MacAddr(self.t.iface.mac),
                dst_mac: MacAddr(mac),
                src,
                dst,
                tos,
                ttl,
                ident: self.ident.fetch_add(1, Relaxed),
            };
            let copy = match self.t.cfg.copy {
                CopyBlock::Cached => None,
                CopyBlock::NonTemporal => Some(copy_nontemporal as fn(&mut [u8], &[u8])),
            };
            let len = match frame::build_udp4_with(buf, &params, p, copy) {
                Ok(n) => n,
                Err(e) => {
                    tx.side.free.push(addr);
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()));
                }
            };
            tx.route = Some((d, route));
            tx.side.tx.push(libc::xdp_desc { addr, len: len as u32, options: 0 });
            tx.queued += 1;
            sent += 1;
            self.t.c.tx_xdp.fetch_add(1, Relaxed);
        }
        Ok(sent)
    }

    /// `send_batch`'s messages onto the ring (see [`XdpSocket::send_datagrams`]).
    pub(super) fn send_msgs(&self, tx: &mut TxBatch<'_>, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        let mut done = 0;
        let mut joined = Vec::new();
        for m in msgs {
            let whole: &[u8] = if m.iov.len() == 1 {
                &m.iov[0]
            } else {
                joined.clear();
                for v in m.iov {
                    joined.extend_from_slice(v);
                }
                &joined
            };
            let seg = m.segment.map_or(whole.len().max(1), |s| usize::from(s).max(1));
            let mut parts: Box<dyn Iterator<Item = &[u8]>> =
                if whole.is_empty() { Box::new(std::iter::once(whole)) } else { Box::new(whole.chunks(seg)) };
            let want = if whole.is_empty() { 1 } else { whole.len().div_ceil(seg) };
            match self.send_datagrams(tx, &mut parts, m.dst.as_ref(), m.dst.as_ref()) {
                Ok(n) if n == want => done += 1,
                Ok(n) if done == 0 && m.segment.is_some() => return Err(partly_sent_error(n)),
                Ok(_) => return Ok(done),
                Err(e) if done > 0 && e.kind() == io::ErrorKind::WouldBlock => return Ok(done),
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
}
