//! Demultiplexing: the bound ports (`Mgr::ports`), the endpoint a datagram
//! goes to ([`Mgr::lookup`]), handing one read's datagrams to their queues
//! ([`Deliver`]), and datagrams for a port no endpoint holds to the kernel
//! socket bound there ([`Mgr::forward`]); endpoints' kernel UDP sockets in
//! the manager's epoll set.
//!
//! Owns `Mgr::ports` (inside `Lane::st`, outside `RxQueue::inner`), and
//! `Mgr::kernel_socks` and `Mgr::bound` (taken alone).

use super::counters::{Counters, SockDrops};
use super::pools::{Pools, RxItem};
use super::state::{lock, norm_ip, Conn, Mgr, Ports, RxQueue};
use crate::backend::tcp::frame::{Decoder, Event, FrameError};
use crate::backend::tcp::sys;
use crate::sys::addr::unmap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

impl Mgr {
    /// The endpoint bound to `port` lost `n` of its datagrams: counted in
    /// the drop counter `which` picks of its own. Taken under `Lane::st`
    /// at most (`ports` nests inside it).
    pub(super) fn lost_by(&self, port: u16, n: u64, which: fn(&SockDrops) -> &AtomicU64) {
        if n == 0 {
            return;
        }
        let ports = lock(&self.ports);
        if let Some(q) = ports.get(&port).into_iter().flatten().find_map(|(_, w)| w.upgrade()) {
            which(&q.lost).fetch_add(n, Relaxed);
        }
    }

    pub(in crate::backend::tcp) fn register_port(&self, addr: SocketAddr, q: &Arc<RxQueue>) -> io::Result<()> {
        {
            let mut p = lock(&self.ports);
            let v = p.entry(addr.port()).or_default();
            v.retain(|(_, w)| w.strong_count() > 0);
            v.push((norm_ip(addr.ip()), Arc::downgrade(q)));
        }
        self.start_listening(!self.bound_once.swap(true, SeqCst))
    }

    /// The endpoint on `addr` lets go of its port. With `hand_over` (the
    /// socket stays the program's, on the kernel path: a fallback), what
    /// readers delivered to its queue after the endpoint's last read, and
    /// what they deliver from now on, goes to the kernel socket
    /// ([`Mgr::forward`]) rather than into a queue nobody reads.
    pub(in crate::backend::tcp) fn unregister_port(&self, addr: SocketAddr, q: &Arc<RxQueue>, hand_over: bool) {
        if self.abandoned() {
            return;
        }
        let owned = lock(&q.owned).clone();
        if let Some(c) = owned {
            self.revoke(&c);
        }
        if let Some(peer) = lock(&q.inner).peer {
            left_connected_insert(addr.port(), unmap(peer));
        }
        {
            let mut p = lock(&self.ports);
            if let Some(v) = p.get_mut(&addr.port()) {
                v.retain(|(_, w)| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(q)));
                if v.is_empty() {
                    p.remove(&addr.port());
                }
            }
        }
        if !hand_over {
            return;
        }
        // No reader finds the queue from here on; one that found it before
        // sees `left` under the queue's lock and forwards instead.
        let late: Vec<RxItem> = {
            let mut i = lock(&q.inner);
            i.left = true;
            i.bytes = 0;
            i.dgrams = 0;
            i.items.drain(..).collect()
        };
        for it in late {
            // Bound to a wildcard: which of the host's addresses the datagram
            // came to is not kept; loopback reaches the socket alike.
            let local = match addr.ip() {
                ip if !ip.is_unspecified() => ip,
                _ if unmap(it.src).is_ipv4() => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
                _ => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            };
            self.forward_item(&it, local, addr.port());
        }
    }

    /// Every datagram of `it` to the kernel socket on `local:dst` ([`Mgr::forward`]).
    fn forward_item(&self, it: &RxItem, local: IpAddr, dst: u16) {
        for i in 0..it.n {
            let d = &it.buf[(i * it.seg).min(it.len)..((i + 1) * it.seg).min(it.len)];
            if !self.forward(it.src, local, dst, d) {
                Counters::inc(&self.c.drop_no_port);
            }
        }
    }

    /// The endpoint a datagram from `src` to `local:port` goes to. With
    /// several endpoints on the port (`SO_REUSEADDR`; a UDP server that
    /// connects one socket per client, as iperf3 does for each stream),
    /// as the kernel: one connected to `src` first, never one connected
    /// to another peer, and an exact local address before the wildcard.
    /// Second: when none matches, an endpoint connected to another peer
    /// (which filters the datagram and counts it).
    pub(super) fn lookup(
        ports: &Ports,
        port: u16,
        local: IpAddr,
        src: SocketAddr,
    ) -> (Option<Arc<RxQueue>>, Option<Arc<RxQueue>>) {
        let Some(v) = ports.get(&port) else { return (None, None) };
        let mut best: Option<(u8, Arc<RxQueue>)> = None;
        let mut other = None;
        for (ip, w) in v {
            let at = if *ip == local {
                2
            } else if ip.is_unspecified() {
                1
            } else {
                continue;
            };
            let Some(q) = w.upgrade() else { continue };
            let peer = lock(&q.inner).peer;
            let score = match peer {
                Some(p) if unmap(p) == src => 4 + at,
                Some(_) => {
                    other.get_or_insert(q);
                    continue;
                }
                None => at,
            };
            if best.as_ref().is_none_or(|b| score > b.0) {
                best = Some((score, q));
            }
        }
        match best {
            Some((_, q)) => (Some(q), None),
            None => (None, other),
        }
    }

    /// Whether an unconnected kernel UDP socket holds local port `port` in
    /// this network namespace (`/proc/net/udp{,6}`, answers cached 20 ms):
    /// one the preload shim has not adopted yet (a UDP server's socket for
    /// its next client, opened just after it connected the last one, as
    /// iperf3 does per stream), or another process's. The kernel would
    /// deliver a datagram that the port's connected endpoints do not
    /// match there, so [`Mgr::forward`] hands it over.
    fn unconnected_kernel_socket(port: u16) -> bool {
        static SEEN: Mutex<Option<(u16, bool, Instant)>> = Mutex::new(None);
        let now = Instant::now();
        if let Some((p, b, at)) = *lock(&SEEN) {
            if p == port && now.duration_since(at) < Duration::from_millis(20) {
                return b;
            }
        }
        let want = format!(":{port:04X}");
        // Columns: sl, local_address, rem_address, st (07: unconnected).
        let found = ["/proc/net/udp", "/proc/net/udp6"].iter().any(|f| {
            std::fs::read_to_string(f).is_ok_and(|t| {
                t.lines().skip(1).any(|l| {
                    let c: Vec<&str> = l.split_whitespace().take(4).collect();
                    c.len() == 4 && c[1].ends_with(&want) && c[3] == "07"
                })
            })
        });
        *lock(&SEEN) = Some((port, found, now));
        found
    }

    /// Watches an endpoint's kernel UDP socket `fd`: each arrival there
    /// (from a sender not on this transport, or handed over by
    /// [`Mgr::forward`] of the process that listens) wakes the endpoint's
    /// reader, which reads the socket too. Costs nothing while nothing
    /// arrives. Returns the token for [`Mgr::unwatch_kernel`].
    pub(in crate::backend::tcp) fn watch_kernel(&self, fd: RawFd, q: &Arc<RxQueue>) -> io::Result<u64> {
        let tok = self.next_token.fetch_add(1, SeqCst);
        lock(&self.kernel_socks).insert(tok, Arc::downgrade(q));
        if let Err(e) = self.poller.add_edge(fd, tok) {
            lock(&self.kernel_socks).remove(&tok);
            return Err(e);
        }
        Ok(tok)
    }

    /// Before the kernel socket's descriptor closes (the application may
    /// keep the socket open through its own descriptor).
    pub(in crate::backend::tcp) fn unwatch_kernel(&self, fd: RawFd, tok: u64) {
        if self.abandoned() {
            return;
        }
        self.poller.remove(fd);
        lock(&self.kernel_socks).remove(&tok);
    }

    /// A datagram from `src` for `local:dst`, a port no endpoint of this
    /// transport is bound to: if a kernel UDP socket of this host holds it
    /// (a socket on the kernel path in this process, one of another
    /// process, or an endpoint of a UOE process that does not listen), it
    /// is sent there over raw IP with `src` as its source, so the receiver
    /// sees the original sender as with UDP. False: dropped (not bound, or
    /// no `CAP_NET_RAW`).
    pub(super) fn forward(&self, src: SocketAddr, local: IpAddr, dst: u16, payload: &[u8]) -> bool {
        const BOUND_FOR: Duration = Duration::from_millis(1000);
        const FREE_FOR: Duration = Duration::from_millis(20);
        let raw = self.raw.get_or_init(sys::RawUdp::open);
        if !raw.any() {
            return false;
        }
        let now = Instant::now();
        let key = (norm_ip(local), dst);
        let cached = lock(&self.bound)
            .get(&key)
            .copied()
            .filter(|&(b, at)| now.duration_since(at) < if b { BOUND_FOR } else { FREE_FOR });
        let bound = match cached {
            Some((b, _)) => b,
            None => {
                let b = sys::udp_port_bound(key.0, dst);
                let mut m = lock(&self.bound);
                if m.len() >= 4096 {
                    m.retain(|_, &mut (b, at)| now.duration_since(at) < if b { BOUND_FOR } else { FREE_FOR });
                }
                m.insert(key, (b, now));
                b
            }
        };
        if !bound {
            return false;
        }
        let ok = raw.send(src, SocketAddr::new(key.0, dst), payload).is_ok();
        if ok {
            Counters::inc(&self.c.forwarded_kernel);
        }
        ok
    }
}

/// The queue of the last (source, destination port) a read delivered to.
type Route = ((SocketAddr, u16), Option<Arc<RxQueue>>);

/// Local ports and peers of connected endpoints that let go of their port
/// (closed, or moved to the kernel path, where the kernel socket stays
/// connected): frames from such a peer are checked against the kernel's
/// sockets before an unconnected endpoint on the port takes them.
static LEFT_CONNECTED: Mutex<Vec<(u16, SocketAddr)>> = Mutex::new(Vec::new());

fn left_connected_insert(port: u16, peer: SocketAddr) {
    let mut v = lock(&LEFT_CONNECTED);
    if !v.contains(&(port, peer)) {
        if v.len() >= 256 {
            v.remove(0);
        }
        v.push((port, peer));
    }
}

/// Whether a kernel UDP socket connected to `src` still holds local port
/// `port` after a connected endpoint there left (`/proc/net/udp{,6}`, read
/// only for such a pair; a pair whose socket is gone is forgotten). An
/// iperf (v2) server connects its socket to the client, then moves it to
/// the kernel path (`SO_TIMESTAMP`) and opens the next client's socket on
/// the same port: the kernel delivers the client's datagrams to the
/// connected one, and so must the hand-over.
fn left_connected_holds(port: u16, src: SocketAddr) -> bool {
    let src = unmap(src);
    if !lock(&LEFT_CONNECTED).contains(&(port, src)) {
        return false;
    }
    static SEEN: Mutex<Option<(u16, SocketAddr, bool, Instant)>> = Mutex::new(None);
    let now = Instant::now();
    if let Some((p, a, b, at)) = *lock(&SEEN) {
        if p == port && a == src && now.duration_since(at) < Duration::from_millis(20) {
            return b;
        }
    }
    // The kernel prints each 32-bit word of an address as a host-order hex number.
    let words = |o: &[u8]| {
        o.chunks(4).map(|c| format!("{:08X}", u32::from_ne_bytes([c[0], c[1], c[2], c[3]]))).collect::<String>()
    };
    let (v4, v6) = match src.ip() {
        IpAddr::V4(ip) => (Some(words(&ip.octets())), words(&ip.to_ipv6_mapped().octets())),
        IpAddr::V6(ip) => (None, words(&ip.octets())),
    };
    let local = format!(":{port:04X}");
    let rem = |a: &str| format!("{a}:{:04X}", src.port());
    // Columns: sl, local_address, rem_address, st (01: connected).
    let holds = |f: &str, a: &str| {
        let want = rem(a);
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let c: Vec<&str> = l.split_whitespace().take(4).collect();
                c.len() == 4 && c[1].ends_with(&local) && c[2] == want && c[3] == "01"
            })
        })
    };
    let found = v4.is_some_and(|a| holds("/proc/net/udp", &a)) || holds("/proc/net/udp6", &v6);
    if !found {
        lock(&LEFT_CONNECTED).retain(|&x| x != (port, src));
    }
    *lock(&SEEN) = Some((port, src, found, now));
    found
}

/// Hands one read's datagrams to their endpoints' queues, one run per
/// destination (one lock and one wake-up per run).
pub(super) struct Deliver<'a> {
    pub(super) mgr: &'a Mgr,
    pub(super) conn: &'a Arc<Conn>,
    pub(super) pools: &'a mut Pools,
    pub(super) cache: Option<Route>,
    pub(super) batch: Vec<RxItem>,
    pub(super) frames: u64,
    pub(super) bytes: u64,
    /// Frames of this read (not reset by `flush`).
    pub(super) frames_seen: u64,
    /// The queue whose reader reads (not signalled, it pops next).
    pub(super) quiet: Option<&'a RxQueue>,
    /// The first queue frames went to, and whether any went elsewhere.
    pub(super) first: Option<Arc<RxQueue>>,
    pub(super) mixed: bool,
}

impl Deliver<'_> {
    /// Switches to the queue for `src` → `dst`, handing over what was gathered for the previous one.
    pub(super) fn to(&mut self, src: SocketAddr, dst: u16) {
        if self.cache.as_ref().map(|c| c.0) != Some((src, dst)) {
            self.flush();
            let (q, other) = Mgr::lookup(&lock(&self.mgr.ports), dst, self.conn.local_ip, src);
            // Only endpoints connected elsewhere: the kernel's socket for
            // the port gets it if there is one, else they filter it.
            let q = q.or_else(|| other.filter(|_| !Mgr::unconnected_kernel_socket(dst)));
            // An unconnected endpoint matched, but a socket connected to
            // `src` that left the transport (moved to the kernel path) may
            // still hold the port: the kernel picks it, so it is handed over.
            let q = q.filter(|q| lock(&q.inner).peer.is_some() || !left_connected_holds(dst, src));
            match (&self.first, &q) {
                (_, None) => self.mixed = true,
                (None, Some(q)) => self.first = Some(q.clone()),
                (Some(f), Some(q)) if !Arc::ptr_eq(f, q) => self.mixed = true,
                _ => {}
            }
            self.cache = Some(((src, dst), q));
        }
    }

    /// Decodes bytes of the stream. The hello comes first: an accepted
    /// connection carries replies to its peer before any datagram is handed up.
    pub(super) fn feed(&mut self, dec: &mut Decoder, bytes: &[u8]) -> Result<usize, FrameError> {
        dec.feed(bytes, &mut |ev| match ev {
            Event::Hello(idx) => {
                self.conn.hello_seen.store(true, SeqCst);
                if self.conn.inbound {
                    self.mgr.attach_inbound(self.conn, idx);
                }
            }
            Event::Frame { src, dst, payload } => {
                self.frames += 1;
                self.frames_seen += 1;
                self.bytes += payload.len() as u64;
                self.to(SocketAddr::new(self.conn.peer.ip(), src), dst);
                match self.cache.as_ref().and_then(|c| c.1.as_ref()) {
                    None => {
                        if !self.mgr.forward(
                            SocketAddr::new(self.conn.peer.ip(), src),
                            self.conn.local_ip,
                            dst,
                            payload,
                        ) {
                            Counters::inc(&self.mgr.c.drop_no_port);
                        }
                    }
                    Some(q) => self.pools.add(
                        &mut self.batch,
                        q.gro.load(Relaxed),
                        SocketAddr::new(self.conn.peer.ip(), src),
                        payload,
                    ),
                }
            }
        })
    }

    /// A block of frames read in place.
    pub(super) fn block(&mut self, dst: u16, it: RxItem) {
        self.frames += it.n as u64;
        self.frames_seen += it.n as u64;
        self.bytes += it.len as u64;
        self.to(it.src, dst);
        if self.cache.as_ref().and_then(|c| c.1.as_ref()).is_some() {
            self.batch.push(it);
        } else {
            self.mgr.forward_item(&it, self.conn.local_ip, dst);
            self.pools.big.push(it.buf);
        }
    }

    pub(super) fn flush(&mut self) {
        // Counted before the hand-over wakes a reader.
        Counters::add(&self.mgr.c.frames_received, std::mem::take(&mut self.frames));
        Counters::add(&self.mgr.c.bytes_received, std::mem::take(&mut self.bytes));
        if let Some(((_, dst), Some(q))) = self.cache.as_ref() {
            let signal = !self.quiet.is_some_and(|r| std::ptr::eq(r, Arc::as_ptr(q)));
            if !q.push_many(&mut self.batch, &self.mgr.c, self.pools, signal) {
                // The endpoint fell back to the kernel path since the lookup.
                for it in self.batch.drain(..) {
                    self.mgr.forward_item(&it, self.conn.local_ip, *dst);
                    self.pools.give(it.buf, it.big);
                }
            }
        }
    }
}
