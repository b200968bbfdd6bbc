//! [`XdpSocket`] as the engine's [`Backend`].

use super::addr::as_v4;
use super::shared::TxBatch;
use super::socket::XdpSocket;
use crate::backend::kernel::{InMeta, OutMsg};
use crate::backend::{Backend, Capabilities};
use crate::sys::sync::lock;
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

/// One spinning look in this many (a power of two) reads the kernel socket
/// ([`Backend::recv_spinning`]).
const KERNEL_LOOK_EVERY: u32 = 16;

impl XdpSocket {
    /// This socket's datagrams from its inbox, then from the shared RX ring.
    fn take_fast(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> usize {
        let at = self.take_inbox(bufs, meta, 0);
        if at < bufs.len() {
            self.take_ring(bufs, meta, at)
        } else {
            at
        }
    }

    fn recv_kernel(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        let n = self.kernel.recv_batch(bufs, meta)?;
        self.t.c.rx_kernel.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
}

impl Backend for XdpSocket {
    fn is_v6(&self) -> bool {
        self.v6
    }
    fn raw_fd(&self) -> RawFd {
        self.epoll.as_raw_fd()
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities { bypass_fd: Some(self.fast.as_raw_fd()), ..Capabilities::default() }
    }
    fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        self.kernel.bind(addr)?;
        let mut st = lock(&self.state);
        self.register(&mut st)
    }
    fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        self.kernel.connect(addr)?;
        let mut st = lock(&self.state);
        st.peer = as_v4(addr);
        *lock(&self.inbox.peer) = st.peer;
        // A connect picks the source address: a wildcard key becomes that
        // address's (as the kernel's connected socket stops taking others').
        self.drop_key(&mut st);
        self.register(&mut st)
    }
    fn disconnect(&self) -> io::Result<()> {
        self.kernel.disconnect()?;
        let mut st = lock(&self.state);
        st.peer = None;
        *lock(&self.inbox.peer) = None;
        self.drop_key(&mut st);
        st.local = None;
        self.register(&mut st)
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.kernel.local_addr()
    }
    fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.kernel.peer_addr()
    }
    fn send_one(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        if buf.len() > eudp_wire::limits::max_payload(self.v6) {
            return Err(io::Error::from_raw_os_error(libc::EMSGSIZE));
        }
        let mut tx = TxBatch::new(lock(&self.t.tx));
        let r = self.send_datagrams(&mut tx, &mut std::iter::once(buf), dst, dst);
        tx.flush(&self.t)?;
        r.map(|_| buf.len())
    }
    fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        // One kick for the whole batch: the AF_XDP counterpart of a GSO send.
        let mut tx = TxBatch::new(lock(&self.t.tx));
        let r = self.send_msgs(&mut tx, msgs);
        tx.flush(&self.t)?;
        r
    }
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        let end = Instant::now() + timeout;
        loop {
            {
                let mut tx = lock(&self.t.tx);
                tx.reap();
                if !tx.free.is_empty() && tx.tx.free() > 0 {
                    return Ok(true);
                }
                let _ = self.t.xsk_kick();
            }
            if Instant::now() >= end {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        match self.take_fast(bufs, meta) {
            // When the fast path had nothing: what came through the kernel
            // (another interface, loopback, fragments, arrivals before the
            // bind). Every such look reads it, as a kernel socket's receive
            // would find it, so a datagram just sent over loopback is there
            // for a nonblocking receive right after the send.
            0 => self.recv_kernel(bufs, meta),
            at => Ok(at),
        }
    }
    fn recv_spinning(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        match self.take_fast(bufs, meta) {
            // A look at the rings is a few loads from user memory; a read
            // of the kernel socket is a system call that would set the pace
            // of the spin and delay every frame it overlaps. Only every
            // `KERNEL_LOOK_EVERY`th spinning look reads it: a datagram on the
            // kernel path is found that many looks later. A nonblocking
            // receive (a `recv_batch`) always reads it.
            0 if self.spin_looks.fetch_add(1, Relaxed) & (KERNEL_LOOK_EVERY - 1) == 0 => self.recv_kernel(bufs, meta),
            0 => Err(io::ErrorKind::WouldBlock.into()),
            at => Ok(at),
        }
    }
    fn take_error(&self) -> Option<i32> {
        if let Ok(Some((e, _))) = self.kernel.take_queued_error() {
            let _ = self.kernel.take_socket_error();
            return Some(e);
        }
        match self.kernel.take_socket_error() {
            0 => None,
            e => Some(e),
        }
    }
    fn send_buffer_size(&self) -> usize {
        self.kernel.send_buffer_size().unwrap_or(212_992)
    }
    fn recv_buffer_size(&self) -> usize {
        self.kernel.recv_buffer_size().unwrap_or(212_992)
    }
    fn socket_drops(&self) -> Option<u64> {
        Some(self.kernel.drops().unwrap_or(0) + self.inbox.drops.load(Relaxed))
    }
    fn probe_gso(&self) -> bool {
        // Each datagram is its own frame; a batch costs one kick anyway.
        false
    }
    fn enable_gro(&self) -> bool {
        false
    }
    fn set_option(&self, level: i32, name: i32, val: i32) -> io::Result<()> {
        self.kernel.set_option(level, name, val)?;
        if level == libc::IPPROTO_IP || level == libc::IPPROTO_IPV6 {
            self.option_changed();
        }
        if level == libc::SOL_SOCKET && name == libc::SO_RCVBUF {
            self.inbox.capacity.store(self.kernel.recv_buffer_size().unwrap_or(212_992) as u64, Relaxed);
        }
        Ok(())
    }
    fn option(&self, level: i32, name: i32) -> io::Result<i32> {
        self.kernel.option(level, name)
    }
    fn option_changed(&self) {
        let get = |name, default| self.kernel.option(libc::IPPROTO_IP, name).unwrap_or(default);
        let on = |name, bit| if get(name, 0) != 0 { bit } else { 0 };
        let mut opts = on(libc::IP_PKTINFO, 1) | on(libc::IP_RECVTOS, 2) | on(libc::IP_RECVTTL, 4);
        if self.v6 {
            let on6 = |name, bit| if self.kernel.option(libc::IPPROTO_IPV6, name).unwrap_or(0) != 0 { bit } else { 0 };
            opts |= on6(libc::IPV6_RECVPKTINFO, 8) | on6(libc::IPV6_RECVTCLASS, 16) | on6(libc::IPV6_RECVHOPLIMIT, 32);
        }
        self.rx_opts.store(opts, Relaxed);
        let (tos, ttl) = (get(libc::IP_TOS, 0) as u32 & 0xff, get(libc::IP_TTL, 64) as u32 & 0xff);
        self.tos_ttl.store(tos << 8 | ttl, Relaxed);
        self.group_options_changed();
    }
    fn release_socket(&self) {
        self.unregister();
        self.kernel.release_socket();
    }
}
