//! [`TcpSocket`]: one endpoint's view of the UOE transport, behind the
//! engine's [`Backend`] trait.
//!
//! The UDP port namespace stays the kernel's: every `TcpSocket` binds a
//! kernel UDP socket it never sends on, so ports are unique per host (and
//! `EADDRINUSE`, ephemeral ports, `SO_REUSEADDR` behave as for UDP), and the
//! manager demultiplexes incoming frames by that port. `raw_fd` is an
//! eventfd readable while datagrams for this socket are queued.

use super::frame::MAX_PAYLOAD;
use super::manager::{
    lock, norm_ip, Caller, Counters, Lane, Mgr, RxQueue, BIG_BUF, BIG_FREE_MAX, FREE_MAX, FREE_MAX_CAP,
};
use super::room::Room;
use super::TcpTransport;
use crate::backend::kernel::{self, InMeta, OutMsg};
use crate::backend::{Backend, Capabilities};
use crate::sys::addr::unmap;
use crate::sys::poll::{poll_readable_or_shut, poll_writable};
use std::io::{self, IoSlice};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Largest buffer size SO_SNDBUF/SO_RCVBUF may ask for (after doubling).
const MAX_BUF: usize = 64 << 20;
/// Smallest, as the kernel's SOCK_MIN_RCVBUF-ish floor.
const MIN_BUF: usize = 4608;

#[derive(Debug)]
struct SockSt {
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    sndbuf: usize,
}

/// The last lane used, by (peer host, lane index).
type LaneRef = ((IpAddr, u8), Arc<Lane>);

/// A UDP endpoint carried over the UOE transport.
#[derive(Debug)]
pub struct TcpSocket {
    mgr: Arc<Mgr>,
    /// Shared with the receive queue, which the manager may send plain
    /// UDP from (DML (c)).
    udp: Arc<kernel::UdpSocket>,
    rxq: Arc<RxQueue>,
    st: Mutex<SockSt>,
    lane_cache: Mutex<Option<LaneRef>>,
    /// How the application sends (decides send coalescing).
    pace: Mutex<Pace>,
    /// recv_batch calls that returned datagrams.
    rx_count: AtomicU64,
    /// Where the engine waits for lane room ([`Room`]).
    room: Arc<Room>,
    /// The manager's token for `udp` (see `Mgr::watch_kernel`), if watched.
    ktok: Option<u64>,
    /// An error the kernel socket reported (ICMP to a connected socket),
    /// for `take_error`; 0: none.
    kerr: std::sync::atomic::AtomicI32,
    /// [`Backend::release_socket`] ran: the port, the watch and the kernel
    /// socket are let go already.
    released: std::sync::atomic::AtomicBool,
}

/// Back-to-back sends (with no receive between them) before coalescing starts.
const STREAM_AFTER: u32 = 8;

#[derive(Debug, Default)]
struct Pace {
    /// When the previous send returned.
    last: Option<Instant>,
    streak: u32,
    rx_seen: u64,
}

/// The buffer goes back to the manager for the next datagram (bounded).
fn recycle(free: &mut Vec<Vec<u8>>, b: Vec<u8>) {
    if free.len() < FREE_MAX && b.capacity() <= FREE_MAX_CAP {
        free.push(b);
    }
}

impl TcpSocket {
    pub(super) fn new(mgr: Arc<Mgr>, v6: bool) -> io::Result<TcpSocket> {
        Self::over(mgr, kernel::UdpSocket::new(v6)?)
    }

    /// Adopts an application's kernel UDP socket (the preload shim's path):
    /// it keeps reserving the port; a bound socket is registered at once,
    /// a connected one keeps its peer.
    pub(super) fn adopt(mgr: Arc<Mgr>, fd: std::os::fd::OwnedFd) -> io::Result<TcpSocket> {
        let s = Self::over(mgr, kernel::UdpSocket::from_owned_fd(fd)?)?;
        s.sync_bound()?;
        if let Ok(p) = s.udp.peer_addr() {
            lock(&s.st).peer = Some(p);
            lock(&s.rxq.inner).peer = Some(unmap(p));
        }
        Ok(s)
    }

    fn over(mgr: Arc<Mgr>, udp: kernel::UdpSocket) -> io::Result<TcpSocket> {
        if mgr.stopped() {
            return Err(err(libc::ENETDOWN));
        }
        let rxq = Arc::new(RxQueue::new(udp.is_v6(), mgr.cfg.rx_queue_bytes)?);
        let udp = Arc::new(udp);
        let _ = rxq.plain.set(Arc::downgrade(&udp));
        let sndbuf = mgr.cfg.tx_buffer_bytes;
        // Datagrams that reach the kernel socket itself are received too.
        let ktok = mgr.watch_kernel(udp.as_raw_fd(), &rxq).ok();
        Ok(TcpSocket {
            mgr,
            udp,
            rxq,
            st: Mutex::new(SockSt { local: None, peer: None, sndbuf }),
            lane_cache: Mutex::new(None),
            pace: Mutex::new(Pace::default()),
            rx_count: AtomicU64::new(0),
            room: Arc::new(Room::new()?),
            ktok,
            kerr: std::sync::atomic::AtomicI32::new(0),
            released: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Registers the kernel socket's port if it was bound behind our back
    /// (by the application before adoption, or by a kernel autobind).
    fn sync_bound(&self) -> io::Result<Option<SocketAddr>> {
        let mut st = lock(&self.st);
        if st.local.is_none() {
            if let Ok(a) = self.udp.local_addr() {
                if a.port() != 0 {
                    st.local = Some(a);
                    self.mgr.register_port(a, &self.rxq)?;
                }
            }
        }
        Ok(st.local)
    }

    /// Datagrams waiting in this socket's receive queue.
    pub fn queued(&self) -> usize {
        lock(&self.rxq.inner).dgrams
    }

    fn ensure_bound(&self) -> io::Result<SocketAddr> {
        if let Some(a) = lock(&self.st).local {
            return Ok(a);
        }
        if let Some(a) = self.sync_bound()? {
            return Ok(a);
        }
        let any = if self.udp.is_v6() { IpAddr::V6(Ipv6Addr::UNSPECIFIED) } else { IpAddr::V4(Ipv4Addr::UNSPECIFIED) };
        match self.bind(&SocketAddr::new(any, 0)) {
            Ok(()) => {}
            // Another thread bound it meanwhile.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            Err(e) => return Err(e),
        }
        lock(&self.st).local.ok_or_else(|| err(libc::EINVAL))
    }

    /// Where a datagram to `dst` goes: peer host and ports.
    fn target(&self, dst: Option<&SocketAddr>) -> io::Result<(IpAddr, u16, u16)> {
        let d = match dst {
            Some(d) => *d,
            None => lock(&self.st).peer.ok_or_else(|| err(libc::EDESTADDRREQ))?,
        };
        let d = unmap(d);
        if d.port() == 0 {
            return Err(err(libc::EINVAL));
        }
        let local = self.ensure_bound()?;
        // As for kernel UDP, the unspecified address means this host.
        let ip = match d.ip() {
            IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => norm_ip(ip),
        };
        Ok((ip, local.port(), d.port()))
    }

    /// An application send: `Stream` once this socket has sent
    /// [`STREAM_AFTER`] times back to back (each less than the coalescing
    /// delay after the previous one returned) without receiving in between (a
    /// request/response program never qualifies, so it never waits for the
    /// coalescing timer), else `App`.
    fn app_caller(&self) -> Caller {
        if self.mgr.cfg.cork.is_zero() {
            return Caller::App;
        }
        let now = Instant::now();
        let rx = self.rx_count.load(Relaxed);
        let mut p = lock(&self.pace);
        let quick = p.rx_seen == rx && p.last.is_some_and(|t| now.saturating_duration_since(t) < self.mgr.cfg.cork);
        p.streak = if quick { p.streak.saturating_add(1) } else { 0 };
        p.rx_seen = rx;
        if p.streak >= STREAM_AFTER {
            Caller::Stream
        } else {
            Caller::App
        }
    }

    fn lane(&self, ip: IpAddr, idx: u8, fresh: bool) -> io::Result<Option<Arc<Lane>>> {
        let mut c = lock(&self.lane_cache);
        if !fresh {
            if let Some((k, l)) = c.as_ref() {
                if *k == (ip, idx) {
                    return Ok(Some(l.clone()));
                }
            }
        }
        let l = self.mgr.lane(ip, idx)?;
        *c = l.as_ref().map(|l| ((ip, idx), l.clone()));
        Ok(l)
    }

    /// Hands items to their lane ([`Mgr::submit`]); `whole`: ends of
    /// messages taken whole. A full lane's `WouldBlock` records the room the
    /// send wanted, for `wait_writable`, and shuts [`Room`] until it is there.
    fn submit(
        &self,
        ip: IpAddr,
        idx: u8,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
        caller: Caller,
        whole: Option<&[usize]>,
    ) -> io::Result<usize> {
        let mut fresh = false;
        // Refusals the engine thread waited out in this call: at most 4, as
        // another sender on the lane may take the room first each time.
        let mut waits = 0;
        loop {
            let Some(lane) = self.lane(ip, idx, fresh)? else {
                // Lane cap reached: dropped, as a UDP datagram would be.
                self.mgr.c.drop_no_lane.fetch_add(items.len() as u64, Relaxed);
                self.rxq.lost.send.fetch_add(items.len() as u64, Relaxed);
                return Ok(items.len());
            };
            match self.mgr.submit(&lane, items, caller, whole, &self.udp, &self.room) {
                Err(e) if e.raw_os_error() == Some(libc::ESTALE) && !fresh => fresh = true,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && caller == Caller::Engine && lane.is_plain() => {
                    // A plain-UDP lane's full kernel socket (DML (c))
                    // leaves `room` open: wait for that socket here,
                    // bounded, as the engine did before it watched `room`,
                    // rather than have it retry at once.
                    let _ = poll_writable(self.udp.as_raw_fd(), Some(Duration::from_millis(10)));
                    return Err(e);
                }
                // While it has nothing else to do, the engine waits for
                // the room here, briefly ([`Mgr::engine_wait`]).
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && caller == Caller::Engine && waits < 4 => {
                    waits += 1;
                    if !self.mgr.engine_wait(&lane, self.room.need.load(Relaxed)) {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }
}

impl TcpSocket {
    /// Reads the kernel socket (nonblocking) into `bufs`; the count read.
    /// A full read leaves `kernel_pending` set (more may wait). After
    /// `shutdown(SHUT_RD)` (the manager reports it as input) one empty
    /// message without a source is passed on, as a blocking receive there
    /// returns 0.
    fn recv_kernel(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> usize {
        self.recv_kernel_once(bufs, meta, true)
    }

    /// One read of the kernel socket; `retry`: after an error, once more.
    fn recv_kernel_once(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], retry: bool) -> usize {
        match self.udp.recv_batch(bufs, meta) {
            Ok(k) => {
                if let Some(i) = meta[..k].iter().position(|m| m.src.is_none() && m.len == 0) {
                    return i + 1;
                }
                if k == bufs.len() {
                    self.rxq.kernel_pending.store(true, SeqCst);
                }
                let dgrams: usize =
                    meta[..k].iter().map(|m| m.segment.map_or(1, |s| m.len.div_ceil(s.max(1)).max(1))).sum();
                Counters::add(&self.mgr.c.kernel_received, dgrams as u64);
                k
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // A nonblocking read of a socket shut for reading finds
                // nothing; the kernel's blocking receive would return 0.
                if bufs.is_empty()
                    || !poll_readable_or_shut(&[self.udp.as_raw_fd()], Some(Duration::ZERO), false).unwrap_or(false)
                {
                    return 0;
                }
                meta[0] = InMeta { len: 0, src: None, segment: None, truncated: false, pktinfo: None };
                1
            }
            Err(e) => {
                // The kernel's asynchronous error (a port unreachable for
                // plain UDP, DML (c)), taken by this read. The kernel reports
                // it before any datagram queued behind it, whose arrival
                // already woke the reader: those are read now, or nobody
                // would until the next arrival.
                self.kerr.store(e.raw_os_error().unwrap_or(libc::EIO), SeqCst);
                if retry {
                    self.recv_kernel_once(bufs, meta, false)
                } else {
                    0
                }
            }
        }
    }
}

impl TcpSocket {
    /// Lets go of the port (and a connection this socket's readers read
    /// themselves, handed back to the manager), the watch on the kernel
    /// socket, and, with `socket`, the kernel socket itself. Once.
    fn let_go(&self, socket: bool) {
        if self.released.swap(true, SeqCst) {
            return;
        }
        if let Some(t) = self.ktok {
            self.mgr.unwatch_kernel(self.udp.as_raw_fd(), t);
        }
        if let Some(a) = lock(&self.st).local {
            self.mgr.unregister_port(a, &self.rxq, !socket);
        }
        if socket {
            self.udp.release_socket();
        }
    }
}

impl Drop for TcpSocket {
    fn drop(&mut self) {
        self.let_go(false);
    }
}

impl Backend for TcpSocket {
    /// A closed endpoint still held (its engine thread waiting for room on
    /// a lane, say) must not keep reading the connection that lane's data
    /// arrives on, nor hold its port: both go now, with the socket.
    fn transport_drops(&self) -> Option<crate::backend::TransportDrops> {
        Some(self.rxq.lost.snapshot())
    }

    fn release_socket(&self) {
        self.let_go(true)
    }
    /// The engine drains: an application thread writing the connection
    /// itself makes smaller writes and costs the sender more per datagram
    /// than an engine woken at once. `bypass_fd` is `raw_fd`; `writable_fd`
    /// is the [`Room`] eventfd: the engine thread leaves a batch a full
    /// lane refused in place and serves other endpoints until it polls
    /// writable, unless it waited the refusal out (`Mgr::engine_wait`).
    /// (Only a plain-UDP lane's full kernel socket does not shut it:
    /// `submit` then waits for that socket, bounded.)
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            drain_on_caller: false,
            input_reaches_raw_fd: false,
            bypass_fd: Some(crate::backend::Backend::raw_fd(self)),
            writable_fd: Some(self.room.raw_fd()),
        }
    }

    fn is_v6(&self) -> bool {
        self.udp.is_v6()
    }

    /// An epoll set: readable while datagrams are queued for this socket,
    /// or while the connection its readers read themselves has input.
    fn raw_fd(&self) -> RawFd {
        self.rxq.poll.as_raw_fd()
    }
    fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        let mut st = lock(&self.st);
        if st.local.is_some() {
            return Err(err(libc::EINVAL));
        }
        self.udp.bind(addr)?;
        let local = self.udp.local_addr()?;
        st.local = Some(local);
        self.mgr.register_port(local, &self.rxq)
    }

    fn connect(&self, addr: &SocketAddr) -> io::Result<()> {
        self.ensure_bound()?;
        // The kernel socket is connected too, so getpeername/getsockname on
        // it (an application's own fd under the preload shim) agree.
        self.udp.connect(addr)?;
        lock(&self.st).peer = Some(*addr);
        lock(&self.rxq.inner).peer = Some(unmap(*addr));
        Ok(())
    }

    fn disconnect(&self) -> io::Result<()> {
        self.udp.disconnect()?;
        lock(&self.st).peer = None;
        lock(&self.rxq.inner).peer = None;
        Ok(())
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.udp.local_addr()
    }

    fn peer_addr(&self) -> io::Result<SocketAddr> {
        lock(&self.st).peer.ok_or_else(|| err(libc::ENOTCONN))
    }

    fn send_one(&self, buf: &[u8], dst: Option<&SocketAddr>) -> io::Result<usize> {
        if buf.len() > MAX_PAYLOAD {
            return Err(err(libc::EMSGSIZE));
        }
        let (ip, src, dport) = self.target(dst)?;
        let idx = self.mgr.lane_index(src, dport);
        let iov = [IoSlice::new(buf)];
        let r = self.submit(ip, idx, &[(src, dport, &iov[..], buf.len())], self.app_caller(), None);
        if !self.mgr.cfg.cork.is_zero() {
            lock(&self.pace).last = Some(Instant::now());
        }
        r.map(|_| buf.len())
    }

    fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        let mut done = 0usize;
        let mut i = 0usize;
        while i < msgs.len() {
            let m = &msgs[i];
            let len: usize = m.iov.iter().map(|v| v.len()).sum();
            if let Some(seg) = m.segment.filter(|&s| (s as usize) < len && s > 0) {
                // A run of equal-size datagrams (the engine batches them like
                // GSO super-packets since `probe_gso` is true): one frame per
                // segment, taken whole or not at all. (Joining the runs of a
                // call into one `sendmsg` of up to 512 frames was measured
                // slower: docs/tcp.md, third round.)
                let seg = seg as usize;
                let (ip, src, dport) = match self.target(m.dst.as_ref()) {
                    Ok(t) => t,
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => return Ok(done),
                };
                let idx = self.mgr.lane_index(src, dport);
                let n = m.iov.len();
                let one_per_iov = m.iov.iter().enumerate().all(|(k, v)| {
                    if k + 1 < n {
                        v.len() == seg
                    } else {
                        v.len() <= seg && !v.is_empty()
                    }
                });
                let whole: Vec<u8>;
                let pieces: Vec<[IoSlice<'_>; 1]> = if one_per_iov {
                    m.iov.iter().map(|v| [IoSlice::new(v)]).collect()
                } else {
                    whole = m.iov.iter().flat_map(|v| v.iter().copied()).collect();
                    whole.chunks(seg).map(|c| [IoSlice::new(c)]).collect()
                };
                let items: Vec<(u16, u16, &[IoSlice<'_>], usize)> =
                    pieces.iter().map(|p| (src, dport, &p[..], p[0].len())).collect();
                match self.submit(ip, idx, &items, Caller::Engine, Some(&[items.len()])) {
                    Ok(_) => done += 1,
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => return Ok(done),
                }
                i += 1;
                continue;
            }
            if len > MAX_PAYLOAD {
                if done == 0 {
                    return Err(err(libc::EMSGSIZE));
                }
                return Ok(done);
            }
            let (ip, src, dport) = match self.target(m.dst.as_ref()) {
                Ok(t) => t,
                Err(e) if done == 0 => return Err(e),
                Err(_) => return Ok(done),
            };
            let idx = self.mgr.lane_index(src, dport);
            // The run of following messages to the same lane goes in one submit.
            let mut items: Vec<(u16, u16, &[IoSlice<'_>], usize)> = Vec::with_capacity(msgs.len() - i);
            items.push((src, dport, m.iov, len));
            let mut j = i + 1;
            while j < msgs.len() {
                let n = &msgs[j];
                if n.segment.is_some() || n.dst != m.dst {
                    break;
                }
                let l: usize = n.iov.iter().map(|v| v.len()).sum();
                if l > MAX_PAYLOAD {
                    break;
                }
                items.push((src, dport, n.iov, l));
                j += 1;
            }
            match self.submit(ip, idx, &items, Caller::Engine, None) {
                Ok(k) => {
                    done += k;
                    if k < items.len() {
                        return Ok(done);
                    }
                }
                Err(e) if done == 0 => return Err(e),
                Err(_) => return Ok(done),
            }
            i = j;
        }
        Ok(done)
    }

    fn recv_batch(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta]) -> io::Result<usize> {
        let want = bufs.len().min(meta.len());
        let gro = self.rxq.gro.load(Relaxed);
        if self.rxq.owns() && lock(&self.rxq.inner).items.is_empty() {
            // This socket's bulk connection is read here, about as many
            // blocks as the caller takes (see `Mgr::delegate`).
            self.mgr.read_owned(&self.rxq, want);
        }
        let mut q = lock(&self.rxq.inner);
        let mut n = 0;
        while n < want {
            let Some(it) = q.items.pop_front() else { break };
            q.bytes -= it.cost();
            q.dgrams -= it.n;
            if it.big {
                // A packed block: handed over by swapping buffers (no copy);
                // the caller's buffer goes back to the manager.
                let segment = (it.n > 1).then_some(it.seg);
                let old = std::mem::replace(&mut bufs[n], it.buf);
                if q.free_big.len() < BIG_FREE_MAX && old.len() == BIG_BUF {
                    q.free_big.push(old);
                }
                meta[n] = InMeta { len: it.len, src: Some(it.src), segment, truncated: false, pktinfo: None };
                n += 1;
                continue;
            }
            let (data, src, seg, len) = (it.buf, it.src, it.seg, it.len);
            if bufs[n].len() < len {
                bufs[n].resize(len, 0);
            }
            bufs[n][..len].copy_from_slice(&data[..len]);
            let mut end = len;
            recycle(&mut q.free, data);
            // Like UDP GRO: following datagrams of the same size from the
            // same source share the buffer (the last may be shorter); the
            // engine's ring cuts them apart at `segment` without copying.
            if gro && seg > 0 && len == it.n * seg {
                while let Some(next) = q.items.front() {
                    let l = next.len;
                    if next.big || next.n != 1 || next.src != src || l == 0 || l > seg || end + l > bufs[n].len() {
                        break;
                    }
                    let d = q.items.pop_front().expect("front exists");
                    q.bytes -= d.cost();
                    q.dgrams -= 1;
                    bufs[n][end..end + l].copy_from_slice(&d.buf);
                    end += l;
                    recycle(&mut q.free, d.buf);
                    if l < seg {
                        break;
                    }
                }
            }
            meta[n] = InMeta {
                len: end,
                src: Some(src),
                segment: (end > seg).then_some(seg),
                truncated: false,
                pktinfo: None,
            };
            n += 1;
        }
        if n < want && self.rxq.kernel_pending.swap(false, SeqCst) {
            drop(q);
            n += self.recv_kernel(&mut bufs[n..want], &mut meta[n..want]);
            q = lock(&self.rxq.inner);
        }
        if q.items.is_empty() && self.rxq.stalled.load(Relaxed) {
            // Caught up with what the manager queued while this socket's
            // program did not receive: its connection may be handed back.
            self.rxq.stalled.store(false, SeqCst);
        }
        if q.items.is_empty() && q.signalled && !self.rxq.kernel_pending.load(SeqCst) {
            q.signalled = false;
            self.rxq.ready.clear();
        } else if !q.items.is_empty() && !q.signalled {
            // Left over from a read of our own (not signalled when pushed).
            q.signalled = true;
            self.rxq.ready.set();
        }
        if n == 0 {
            return Err(err(libc::EAGAIN));
        }
        self.rx_count.fetch_add(1, Relaxed);
        Ok(n)
    }

    fn take_error(&self) -> Option<i32> {
        Some(self.kerr.swap(0, SeqCst)).filter(|&e| e != 0)
    }

    fn send_buffer_size(&self) -> usize {
        lock(&self.st).sndbuf
    }

    fn recv_buffer_size(&self) -> usize {
        lock(&self.rxq.inner).cap
    }

    /// True: the engine then hands over runs of equal-size datagrams as one
    /// message (fewer, larger calls); each run becomes one frame per
    /// datagram. Nothing is segmented by the kernel.
    fn probe_gso(&self) -> bool {
        true
    }

    /// Receive coalescing of equal-size datagrams (see `recv_batch`).
    fn enable_gro(&self) -> bool {
        self.rxq.gro.store(true, Relaxed);
        true
    }

    fn set_option(&self, level: i32, name: i32, val: i32) -> io::Result<()> {
        // As the kernel: the value is doubled for bookkeeping overhead.
        let size = (val.max(0) as usize).saturating_mul(2).clamp(MIN_BUF, MAX_BUF);
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_SNDBUF) | (libc::SOL_SOCKET, libc::SO_SNDBUFFORCE) => {
                lock(&self.st).sndbuf = size;
                Ok(())
            }
            (libc::SOL_SOCKET, libc::SO_RCVBUF) | (libc::SOL_SOCKET, libc::SO_RCVBUFFORCE) => {
                lock(&self.rxq.inner).cap = size;
                Ok(())
            }
            _ => self.udp.set_option(level, name, val),
        }
    }

    /// Waits for room on the lane this socket last sent on (its raw fd
    /// is the receive eventfd, always writable). A lane that is not
    /// connected never refuses a send (DML), so it counts as writable.
    fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        let lane = lock(&self.lane_cache).as_ref().map(|(_, l)| l.clone());
        match lane {
            // DML (c): plain UDP is sent from the kernel socket.
            Some(l) if l.is_plain() => poll_writable(self.udp.as_raw_fd(), Some(timeout)),
            Some(l) => Ok(self.mgr.wait_room(&l, timeout, self.room.need.load(Relaxed))),
            None => Ok(true),
        }
    }

    fn option(&self, level: i32, name: i32) -> io::Result<i32> {
        match (level, name) {
            (libc::SOL_SOCKET, libc::SO_SNDBUF) => Ok(self.send_buffer_size().min(i32::MAX as usize) as i32),
            (libc::SOL_SOCKET, libc::SO_RCVBUF) => Ok(self.recv_buffer_size().min(i32::MAX as usize) as i32),
            _ => self.udp.option(level, name),
        }
    }
}

/// Sockets and endpoints of a transport: here, not in the manager, so that
/// the manager never depends on its sockets.
impl TcpTransport {
    /// A backend socket for [`crate::Endpoint::with_backend`].
    pub fn socket(&self, v6: bool) -> io::Result<TcpSocket> {
        TcpSocket::new(self.mgr.clone(), v6)
    }

    /// An endpoint on `engine` over this transport.
    pub fn endpoint(&self, engine: &crate::Engine, v6: bool) -> io::Result<crate::Endpoint> {
        crate::Endpoint::with_backend(engine, Box::new(self.socket(v6)?))
    }

    /// A backend socket adopting an existing kernel UDP socket (which keeps
    /// reserving its port; its bound address and peer carry over).
    pub fn socket_from_kernel_fd(&self, fd: std::os::fd::OwnedFd) -> io::Result<TcpSocket> {
        TcpSocket::adopt(self.mgr.clone(), fd)
    }

    /// As [`crate::Endpoint::from_kernel_fd`], over this transport: the
    /// preload shim's way to put an application's UDP socket on the UOE.
    pub fn endpoint_from_kernel_fd(
        &self,
        engine: &crate::Engine,
        fd: std::os::fd::OwnedFd,
    ) -> io::Result<crate::Endpoint> {
        let sock = self.socket_from_kernel_fd(fd)?;
        let peer = crate::backend::Backend::peer_addr(&sock).ok();
        let ep = crate::Endpoint::with_backend(engine, Box::new(sock))?;
        if let Some(p) = peer {
            // Marks the endpoint connected (nothing is queued yet to flush).
            ep.connect(p)?;
        }
        Ok(ep)
    }
}
