//! `xdp`: UDP over AF_XDP — the kernel's network stack bypassed on the data
//! path, as E-UDP (paper 000) moves per-packet work off the host's path.
//!
//! * One [`XdpTransport`] per interface and process: an XDP program
//!   (hand-assembled, [`sys::load_redirect_prog`]) attached to the
//!   interface redirects IPv4 UDP frames whose destination address and
//!   port belong to one of the transport's sockets into an AF_XDP socket
//!   (copy mode, queue [`XdpConfig::queue`]); every other frame (ARP, ICMP,
//!   other ports, IP options, fragments) goes on to the kernel as before.
//! * Each endpoint gets an [`XdpSocket`] (the [`Backend`]). It keeps a
//!   kernel UDP socket, which reserves its port, holds its options and
//!   carries everything the fast path does not: destinations that are not
//!   on the interface's subnets or whose MAC address the kernel's neighbour
//!   table does not know yet (the kernel's send resolves it), datagrams
//!   larger than the MTU (the kernel fragments), broadcast and multicast,
//!   IPv6, and whatever arrives through another interface.
//! * Send: the frame (Ethernet, IPv4, UDP with its checksum computed while
//!   the payload is copied into the UMEM frame) goes on the TX ring, and one
//!   kick per batch transmits it; no socket, no routing, no qdisc.
//! * Receive: whichever socket reads drains the shared RX ring, copying its
//!   own datagrams straight into the engine's buffers and queueing the
//!   others' in their bounded inboxes (sized by their `SO_RCVBUF`, drops
//!   counted as the kernel counts them).
//!
//! Limits (see docs/xdp.md): one process per interface queue (an AF_XDP
//! socket owns its queue; a second process falls back to the kernel
//! backend); root or `CAP_NET_ADMIN` + `CAP_BPF`; IPv4 only.
//!
//! All `unsafe` code of this backend is in `sys.rs`.

pub mod sys;

use super::kernel::{InMeta, OutMsg, PktInfo, UdpSocket};
use super::partly::partly_sent_error;
use super::{Backend, Capabilities};
use crate::sys::epoll::Epoll;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use eudp_wire::ether::MacAddr;
use eudp_wire::frame::{self, Udp4Params};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock};
use std::time::{Duration, Instant};

use crate::fdspace::Private;

/// How the XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// The driver's hook, else the generic one.
    Auto,
    /// The driver's hook only (`XDP_FLAGS_DRV_MODE`).
    Driver,
    /// The generic hook only (`XDP_FLAGS_SKB_MODE`), which every device has.
    Generic,
}

/// Settings of one transport.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// The interface whose traffic the transport takes over.
    pub ifname: String,
    /// The receive queue the AF_XDP socket binds to.
    pub queue: u32,
    /// UMEM frames: half receive (fill ring), half transmit.
    pub frames: usize,
    /// Entries of each of the four rings (a power of two).
    pub ring: u32,
    pub attach: AttachMode,
    /// How long a neighbour-table answer is trusted.
    pub neigh_ttl: Duration,
}

impl XdpConfig {
    pub fn new(ifname: &str) -> XdpConfig {
        XdpConfig {
            ifname: ifname.to_string(),
            queue: 0,
            frames: 4096,
            ring: 2048,
            attach: AttachMode::Auto,
            neigh_ttl: Duration::from_secs(1),
        }
    }
}

/// Counters of one transport (all sockets).
#[derive(Debug, Default)]
struct Counters {
    tx_xdp: AtomicU64,
    tx_kernel: AtomicU64,
    tx_kernel_no_neigh: AtomicU64,
    tx_kernel_off_link: AtomicU64,
    tx_kernel_too_big: AtomicU64,
    tx_kicks: AtomicU64,
    rx_xdp: AtomicU64,
    rx_kernel: AtomicU64,
    rx_bad_frames: AtomicU64,
    rx_no_socket: AtomicU64,
    rx_not_peer: AtomicU64,
    rx_inbox_drops: AtomicU64,
}

/// A snapshot of the transport's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpStats {
    /// Datagrams sent as AF_XDP frames.
    pub tx_xdp: u64,
    /// Datagrams sent through the kernel socket instead, in all…
    pub tx_kernel: u64,
    /// …because the neighbour table had no MAC address for the next hop,
    pub tx_kernel_no_neigh: u64,
    /// …because the destination is not on the interface's subnets (or is
    /// broadcast, multicast, or the socket's source is not the interface's),
    pub tx_kernel_off_link: u64,
    /// …because the datagram is larger than the MTU allows unfragmented.
    pub tx_kernel_too_big: u64,
    /// TX kicks (`sendto` on the AF_XDP socket).
    pub tx_kicks: u64,
    /// Datagrams taken from the RX ring for a socket.
    pub rx_xdp: u64,
    /// Datagrams read from the sockets' kernel sockets.
    pub rx_kernel: u64,
    /// Frames the redirect let through that were not valid IPv4 UDP
    /// (bad checksum, bad lengths): dropped, as the kernel drops them.
    pub rx_bad_frames: u64,
    /// Frames for an address no socket holds any more (it closed while
    /// they were in flight).
    pub rx_no_socket: u64,
    /// Frames to a connected socket from another source (the kernel would
    /// not deliver them to it either).
    pub rx_not_peer: u64,
    /// Datagrams dropped because the receiving socket's inbox was full.
    pub rx_inbox_drops: u64,
    /// The kernel's own AF_XDP drop counters (`XDP_STATISTICS`).
    pub xsk_rx_dropped: u64,
    pub xsk_rx_ring_full: u64,
    pub xsk_fill_ring_empty: u64,
    /// `"driver"` or `"generic"`.
    pub attach: String,
}

/// One queued datagram of a socket that was not the one reading the ring.
struct Queued {
    data: Vec<u8>,
    src: SocketAddrV4,
    dst: Ipv4Addr,
    tos: u8,
    ttl: u8,
}

/// The datagrams waiting for one socket, bounded by its receive buffer.
struct Inbox {
    q: Mutex<VecDeque<Queued>>,
    bytes: AtomicU64,
    capacity: AtomicU64,
    ready: EventFd,
    drops: AtomicU64,
    /// The socket's connected peer: frames from others are not its own.
    peer: Mutex<Option<SocketAddrV4>>,
}

impl Inbox {
    fn push(&self, c: &Counters, m: Queued) {
        let charge = m.data.len() as u64 + 256;
        if self.bytes.load(Relaxed) + charge > self.capacity.load(Relaxed) {
            self.drops.fetch_add(1, Relaxed);
            c.rx_inbox_drops.fetch_add(1, Relaxed);
            return;
        }
        self.bytes.fetch_add(charge, Relaxed);
        lock(&self.q).push_back(m);
        self.ready.set();
    }
}

/// The receive side: RX ring in, frames back to the fill ring.
struct RxSide {
    rx: sys::Ring<libc::xdp_desc>,
    fill: sys::Ring<u64>,
}

/// The transmit side: TX ring out, completions back to the free list.
struct TxSide {
    tx: sys::Ring<libc::xdp_desc>,
    completion: sys::Ring<u64>,
    free: Vec<u64>,
}

impl TxSide {
    fn reap(&mut self) {
        let n = self.completion.ready();
        for _ in 0..n {
            let a = self.completion.take();
            self.free.push(a);
        }
        if n > 0 {
            self.completion.release();
        }
    }
}

/// The transmit side held for one send call, and the frames it put on the
/// TX ring since the last kick.
struct TxBatch<'a> {
    side: MutexGuard<'a, TxSide>,
    queued: usize,
}

impl TxBatch<'_> {
    /// Publishes the frames put on the ring and kicks the kernel to send
    /// them.
    fn flush(&mut self, t: &Shared) -> io::Result<()> {
        let n = std::mem::take(&mut self.queued);
        t.flush(&mut self.side, n)
    }
}

/// Neighbour answers, from the kernel's table.
#[derive(Default)]
struct Neighbours {
    map: HashMap<Ipv4Addr, ([u8; 6], Instant)>,
    /// Addresses the table did not have: when to look again, and the
    /// wait after that (doubling from 50 µs up to 100 ms, so an answer the
    /// kernel gets within a round trip is seen at once, and an address that
    /// never answers costs a read of the table at most ten times a second).
    missing: HashMap<Ipv4Addr, (Instant, Duration)>,
}

/// (local address or UNSPECIFIED, port) → the inboxes of the sockets there.
type SocketTable = HashMap<(Ipv4Addr, u16), Vec<Arc<Inbox>>>;

struct Shared {
    cfg: XdpConfig,
    iface: sys::IfaceInfo,
    c: Counters,
    rx: Mutex<RxSide>,
    tx: Mutex<TxSide>,
    /// Demultiplexing: (local address or UNSPECIFIED, port) → the inboxes
    /// of the sockets bound there (several when they are connected to
    /// different peers). The same keys are in the XDP program's `ports` map.
    sockets: RwLock<SocketTable>,
    neigh: Mutex<Neighbours>,
    attach: &'static str,
    ports: sys::Map,
    // Drop order: the link detaches the program before the socket goes.
    _link: Private<OwnedFd>,
    _prog: Private<OwnedFd>,
    _xsks: sys::Map,
    /// The socket and its UMEM; dropped after the rings and the link.
    xsk: sys::Xsk,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTransport").field("ifname", &self.cfg.ifname).field("attach", &self.attach).finish()
    }
}

fn key_bytes(addr: Ipv4Addr, port: u16) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&addr.octets());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k
}

/// The transport of one interface: the attached program, the AF_XDP socket
/// and the sockets it demultiplexes to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct XdpTransport {
    shared: Arc<Shared>,
}

impl XdpConfig {
    /// The settings of a transport on `ifname` from `EUDP_XDP_QUEUE` and
    /// `EUDP_XDP_MODE`; a bad value leaves its default, logged once.
    pub fn from_env(ifname: &str) -> XdpConfig {
        use crate::settings::lookup;
        let get: &dyn Fn(&str) -> Option<String> = &|k| std::env::var(k).ok();
        let mut errs = Vec::new();
        let mut cfg = XdpConfig::new(ifname);
        if let Some(q) = lookup(get, "EUDP_XDP_QUEUE", &mut errs, |s, v| s.int(v)) {
            cfg.queue = q as u32;
        }
        if let Some(m) = lookup(get, "EUDP_XDP_MODE", &mut errs, |s, v| s.check(v).map(|_| v.trim().to_string())) {
            cfg.attach = match m.as_str() {
                "driver" => AttachMode::Driver,
                "generic" => AttachMode::Generic,
                _ => AttachMode::Auto,
            };
        }
        crate::log::report_ignored(&errs);
        cfg
    }
}

impl XdpTransport {
    /// Loads and attaches the program to `cfg.ifname` and opens the AF_XDP
    /// socket. Fails (for the caller to fall back to the kernel backend)
    /// without privileges, without AF_XDP or when another process holds
    /// the interface's XDP hook or the queue.
    pub fn start(cfg: XdpConfig) -> io::Result<XdpTransport> {
        let iface = sys::iface_info(&cfg.ifname)?;
        // A received frame lands after the kernel's headroom (256 bytes,
        // `XDP_PACKET_HEADROOM`) in its UMEM frame; a longer one is passed
        // to the kernel by the program rather than dropped by the socket.
        let frame_size = if iface.mtu as usize + 14 + sys::RX_HEADROOM <= 2048 { 2048 } else { 4096 };
        let xsks = sys::Map::xsk(cfg.queue + 1)?;
        let ports = sys::Map::hash8(65_536, "eudp_ports")?;
        let prog = sys::load_redirect_prog(&xsks, &ports, (frame_size - sys::RX_HEADROOM) as u32)?;
        let (link, attach) = match cfg.attach {
            AttachMode::Driver => (sys::attach_xdp(&prog, iface.index, sys::XDP_FLAGS_DRV_MODE)?, "driver"),
            AttachMode::Generic => (sys::attach_xdp(&prog, iface.index, sys::XDP_FLAGS_SKB_MODE)?, "generic"),
            AttachMode::Auto => match sys::attach_xdp(&prog, iface.index, sys::XDP_FLAGS_DRV_MODE) {
                Ok(l) => (l, "driver"),
                Err(_) => (sys::attach_xdp(&prog, iface.index, sys::XDP_FLAGS_SKB_MODE)?, "generic"),
            },
        };
        let (xsk, rings) = sys::Xsk::open(iface.index, cfg.queue, cfg.frames, frame_size, cfg.ring)?;
        sys::xskmap_set(&xsks, cfg.queue, &xsk)?;
        let sys::XskRings { mut fill, completion, rx, tx } = rings;
        // Half the frames to the fill ring (receive), half to transmit.
        let half = cfg.frames / 2;
        let to_fill = half.min(fill.free() as usize);
        for i in 0..to_fill {
            fill.push((i * frame_size) as u64);
        }
        fill.publish();
        let free: Vec<u64> = (to_fill..cfg.frames).map(|i| (i * frame_size) as u64).collect();
        Ok(XdpTransport {
            shared: Arc::new(Shared {
                iface,
                c: Counters::default(),
                rx: Mutex::new(RxSide { rx, fill }),
                tx: Mutex::new(TxSide { tx, completion, free }),
                sockets: RwLock::new(HashMap::new()),
                neigh: Mutex::new(Neighbours::default()),
                attach,
                ports,
                _link: link,
                _prog: prog,
                _xsks: xsks,
                xsk,
                cfg,
            }),
        })
    }

    /// A new endpoint on this transport. An IPv6 one carries IPv4 (v4-mapped)
    /// datagrams on the fast path and IPv6 ones through its kernel socket.
    pub fn endpoint(&self, engine: &crate::Engine, v6: bool) -> io::Result<crate::Endpoint> {
        crate::Endpoint::with_backend(engine, Box::new(self.socket(v6)?))
    }

    /// A new unbound socket of this transport.
    pub fn socket(&self, v6: bool) -> io::Result<XdpSocket> {
        self.socket_over(UdpSocket::new(v6)?)
    }

    /// An endpoint over an existing kernel UDP socket (the preload shim
    /// hands over a duplicate of the program's): a bound one takes its
    /// address's datagrams at once, a connected one keeps its peer. An IPv6
    /// one carries its IPv4 (v4-mapped) peers' datagrams as frames.
    pub fn endpoint_from_kernel_fd(&self, engine: &crate::Engine, fd: OwnedFd) -> io::Result<crate::Endpoint> {
        let kernel = UdpSocket::from_owned_fd(fd)?;
        let sock = self.socket_over(kernel)?;
        {
            let mut st = lock(&sock.state);
            sock.register(&mut st)?;
            if let Some(p) = sock.kernel.peer_addr().ok().as_ref().and_then(as_v4) {
                st.peer = Some(p);
                *lock(&sock.inbox.peer) = Some(p);
            }
        }
        let peer = sock.kernel.peer_addr().ok();
        let ep = crate::Endpoint::with_backend(engine, Box::new(sock))?;
        if let Some(p) = peer {
            ep.connect(p)?;
        }
        Ok(ep)
    }

    fn socket_over(&self, kernel: UdpSocket) -> io::Result<XdpSocket> {
        let inbox = Arc::new(Inbox {
            q: Mutex::new(VecDeque::new()),
            bytes: AtomicU64::new(0),
            capacity: AtomicU64::new(kernel.recv_buffer_size().unwrap_or(212_992) as u64),
            ready: EventFd::new()?,
            drops: AtomicU64::new(0),
            peer: Mutex::new(None),
        });
        let fast = Epoll::new()?;
        fast.add_readable(self.shared.xsk.raw_fd(), 1)?;
        fast.add_readable(inbox.ready.as_raw_fd(), 2)?;
        let epoll = Epoll::new()?;
        epoll.add_readable(kernel.as_raw_fd(), 0)?;
        epoll.add_readable(fast.as_raw_fd(), 1)?;
        let s = XdpSocket {
            v6: kernel.is_v6(),
            t: self.shared.clone(),
            kernel,
            inbox,
            epoll,
            fast,
            state: Mutex::new(SockState::default()),
            tos_ttl: AtomicU32::new(64),
            rx_opts: AtomicU32::new(0),
            ident: AtomicU16::new(std::process::id() as u16),
        };
        s.option_changed();
        Ok(s)
    }

    /// The counters of all sockets of this transport.
    pub fn stats(&self) -> XdpStats {
        let c = &self.shared.c;
        let g = |a: &AtomicU64| a.load(Relaxed);
        let k = self.shared.xsk.statistics().unwrap_or(libc::xdp_statistics {
            rx_dropped: 0,
            rx_invalid_descs: 0,
            tx_invalid_descs: 0,
            rx_ring_full: 0,
            rx_fill_ring_empty_descs: 0,
            tx_ring_empty_descs: 0,
        });
        XdpStats {
            tx_xdp: g(&c.tx_xdp),
            tx_kernel: g(&c.tx_kernel),
            tx_kernel_no_neigh: g(&c.tx_kernel_no_neigh),
            tx_kernel_off_link: g(&c.tx_kernel_off_link),
            tx_kernel_too_big: g(&c.tx_kernel_too_big),
            tx_kicks: g(&c.tx_kicks),
            rx_xdp: g(&c.rx_xdp),
            rx_kernel: g(&c.rx_kernel),
            rx_bad_frames: g(&c.rx_bad_frames),
            rx_no_socket: g(&c.rx_no_socket),
            rx_not_peer: g(&c.rx_not_peer),
            rx_inbox_drops: g(&c.rx_inbox_drops),
            xsk_rx_dropped: k.rx_dropped,
            xsk_rx_ring_full: k.rx_ring_full,
            xsk_fill_ring_empty: k.rx_fill_ring_empty_descs,
            attach: self.shared.attach.to_string(),
        }
    }

    /// The interface the transport serves.
    pub fn ifname(&self) -> &str {
        &self.shared.cfg.ifname
    }

    /// The process-wide transport (`EUDP_TRANSPORT=xdp`), started on first
    /// use on `EUDP_XDP_IFACE`, or on the one interface that is up, not
    /// loopback and has an IPv4 address. An error (no privileges, no such
    /// interface, another process holds the hook or the queue) is kept: the
    /// caller falls back to the kernel backend. A fork child gets an error
    /// too: the AF_XDP socket and its queue stay the parent's.
    pub fn global() -> io::Result<XdpTransport> {
        if FORKED.load(Relaxed) {
            return Err(io::Error::other(AFTER_FORK));
        }
        let r = GLOBAL.get_or_init(|| {
            let ifname = match std::env::var("EUDP_XDP_IFACE") {
                Ok(n) if !n.is_empty() => n,
                _ => sys::default_interface().map_err(|e| e.to_string())?,
            };
            let cfg = XdpConfig::from_env(&ifname);
            XdpTransport::start(cfg).map_err(|e| format!("AF_XDP on {ifname}: {e}"))
        });
        if let Ok(t) = r {
            // Seen by `forked_child`, which must not touch the OnceLock.
            GLOBAL_FDS.get_or_init(|| (t.shared._link.as_raw_fd(), t.shared.xsk.raw_fd()));
        }
        r.clone().map_err(io::Error::other)
    }

    /// In a fork child (from an atfork handler; no locks, no allocation):
    /// the process-wide transport is the parent's. Its bpf link and AF_XDP
    /// socket are closed here, so that the program does not stay attached
    /// (redirecting to a socket nobody reads) for as long as the child
    /// lives after its parent.
    pub fn forked_child() {
        FORKED.store(true, Relaxed);
        if let Some(&(link, xsk)) = GLOBAL_FDS.get() {
            sys::close_inherited(link);
            sys::close_inherited(xsk);
        }
    }

    /// The process-wide transport if [`XdpTransport::global`] was called:
    /// the transport, or why it could not start. Starts nothing.
    pub fn global_started() -> Option<Result<XdpTransport, String>> {
        let g = GLOBAL.get()?;
        if FORKED.load(Relaxed) {
            // The parent's counters, copied at the fork, are not this process's.
            return Some(Err(AFTER_FORK.into()));
        }
        Some(g.clone())
    }
}

static GLOBAL: OnceLock<Result<XdpTransport, String>> = OnceLock::new();
const AFTER_FORK: &str = "the AF_XDP socket belongs to the parent process (after fork)";
static FORKED: AtomicBool = AtomicBool::new(false);
static GLOBAL_FDS: OnceLock<(RawFd, RawFd)> = OnceLock::new();

/// `EUDP_TRANSPORT=xdp`: an endpoint over an adopted kernel socket on the
/// process-wide transport ([`XdpTransport::global`]).
pub fn endpoint_from_kernel_fd(engine: &crate::Engine, fd: OwnedFd) -> io::Result<crate::Endpoint> {
    XdpTransport::global()?.endpoint_from_kernel_fd(engine, fd)
}

#[derive(Debug, Default)]
struct SockState {
    /// The demultiplexing key this socket holds, once bound.
    key: Option<(Ipv4Addr, u16)>,
    local: Option<SocketAddrV4>,
    peer: Option<SocketAddrV4>,
}

/// One UDP socket on the `xdp` transport (see the module docs).
pub struct XdpSocket {
    t: Arc<Shared>,
    kernel: UdpSocket,
    inbox: Arc<Inbox>,
    /// Readable when the kernel socket or `fast` is.
    epoll: Epoll,
    /// Readable when the shared RX ring or the inbox is: the input the
    /// kernel socket does not show ([`Capabilities::bypass_fd`]).
    fast: Epoll,
    state: Mutex<SockState>,
    /// `IP_TOS << 8 | IP_TTL` as the socket has them set.
    tos_ttl: AtomicU32,
    /// Receive options on: 1 `IP_PKTINFO`, 2 `IP_RECVTOS`, 4 `IP_RECVTTL`;
    /// IPv6 sockets also 8 `IPV6_RECVPKTINFO`, 16 `IPV6_RECVTCLASS`, 32
    /// `IPV6_RECVHOPLIMIT` (v4-mapped for IPv4 datagrams, as the kernel).
    rx_opts: AtomicU32,
    ident: AtomicU16,
    /// An IPv6 socket (its IPv4 peers are v4-mapped addresses).
    v6: bool,
}

impl std::fmt::Debug for XdpSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpSocket").field("state", &*lock(&self.state)).finish()
    }
}

/// Where one datagram goes out.
enum Route {
    Xdp { src: SocketAddrV4, dst: SocketAddrV4, mac: [u8; 6] },
    Kernel,
}

impl XdpSocket {
    /// Takes the demultiplexing key for the kernel socket's address, when
    /// that address is the interface's (or the wildcard).
    fn register(&self, st: &mut SockState) -> io::Result<()> {
        // An IPv6 socket takes IPv4 datagrams at a v4-mapped address, or at
        // the wildcard unless it is IPV6_V6ONLY.
        let local = match self.kernel.local_addr()? {
            SocketAddr::V4(l) => l,
            SocketAddr::V6(l)
                if l.ip().is_unspecified()
                    && self.kernel.option(libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(1) == 0 =>
            {
                SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, l.port())
            }
            SocketAddr::V6(l) => match l.ip().to_ipv4_mapped() {
                Some(ip) => SocketAddrV4::new(ip, l.port()),
                None => return Ok(()),
            },
        };
        st.local = Some(local);
        if st.key.is_some() || local.port() == 0 {
            return Ok(());
        }
        let ip = *local.ip();
        if !ip.is_unspecified() && !self.t.iface.v4.iter().any(|(a, _)| *a == ip) {
            return Ok(());
        }
        let key = (ip, local.port());
        self.t.add_socket(key, &self.inbox)?;
        st.key = Some(key);
        Ok(())
    }

    fn unregister(&self) {
        self.drop_key(&mut lock(&self.state));
    }

    /// Gives up the demultiplexing key, if the socket holds one.
    fn drop_key(&self, st: &mut SockState) {
        if let Some(key) = st.key.take() {
            self.t.remove_socket(key, &self.inbox);
        }
    }

    /// The socket's local address, binding it to an ephemeral port first if
    /// it has none (as the kernel does on a first send); `None` when it has
    /// no IPv4 form (an IPv6 address, or `IPV6_V6ONLY`).
    fn local(&self) -> io::Result<Option<SocketAddrV4>> {
        let mut st = lock(&self.state);
        if let Some(l) = st.local.filter(|l| l.port() != 0) {
            return Ok(Some(l));
        }
        let l = self.kernel.local_addr()?;
        if l.port() == 0 {
            let any = if self.v6 {
                SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), 0)
            } else {
                SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0)
            };
            self.kernel.bind(&any)?;
        }
        self.register(&mut st)?;
        Ok(st.local)
    }

    fn route(&self, dst: SocketAddrV4, len: usize) -> io::Result<Route> {
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
        if len + 28 > self.t.iface.mtu as usize || len + frame::UDP4_OVERHEAD > self.umem().frame_size {
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

    fn dst_of(&self, dst: Option<&SocketAddr>) -> io::Result<Option<SocketAddrV4>> {
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
    fn send_datagrams(
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
            let route = self.route(d, p.len())?;
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
            let len = match frame::build_udp4(buf, &params, p) {
                Ok(n) => n,
                Err(e) => {
                    tx.side.free.push(addr);
                    return Err(io::Error::new(io::ErrorKind::InvalidInput, e.to_string()));
                }
            };
            tx.side.tx.push(libc::xdp_desc { addr, len: len as u32, options: 0 });
            tx.queued += 1;
            sent += 1;
            self.t.c.tx_xdp.fetch_add(1, Relaxed);
        }
        Ok(sent)
    }

    /// `send_batch`'s messages onto the ring (see [`XdpSocket::send_datagrams`]).
    fn send_msgs(&self, tx: &mut TxBatch<'_>, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
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

    fn umem(&self) -> &sys::Umem {
        self.t.umem()
    }

    fn meta_for(&self, m: &mut InMeta, len: usize, src: SocketAddrV4, dst: Ipv4Addr, tos: u8, ttl: u8) {
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
    fn take_inbox(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], mut at: usize) -> usize {
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
        }
        if q.is_empty() {
            self.inbox.ready.clear();
            // A push between the check and the clear set it again after
            // queueing, so a datagram is never left without the flag.
            if !q.is_empty() {
                self.inbox.ready.set();
            }
        }
        at
    }

    /// Drains the shared RX ring: this socket's datagrams into `bufs` from
    /// `at`, the others' into their inboxes.
    fn take_ring(&self, bufs: &mut [Vec<u8>], meta: &mut [InMeta], mut at: usize) -> usize {
        let Ok(mut rx) = self.t.rx.try_lock() else { return at };
        let n = rx.rx.ready();
        let mut taken = 0;
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
                Ok((f, pending)) => match self.t.find_socket(f.dst, f.src) {
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
        }
        at
    }
}

impl Shared {
    fn umem(&self) -> &sys::Umem {
        self.xsk.umem()
    }

    /// Publishes `queued` TX descriptors and kicks until the kernel took
    /// them (copy mode transmits a bounded batch per kick).
    fn flush(&self, tx: &mut TxSide, queued: usize) -> io::Result<()> {
        if queued == 0 {
            return Ok(());
        }
        tx.tx.publish();
        // Until the kernel has consumed every descriptor (bounded: a device
        // that stops taking frames leaves them for the next flush).
        for _ in 0..64 {
            self.c.tx_kicks.fetch_add(1, Relaxed);
            self.xsk_kick()?;
            tx.reap();
            if tx.tx.free() == tx.tx.size() {
                break;
            }
        }
        Ok(())
    }

    fn xsk_kick(&self) -> io::Result<bool> {
        self.xsk.kick_tx()
    }

    /// Adds a socket's inbox under `key`; the first one there puts the key
    /// into the program's map.
    fn add_socket(&self, key: (Ipv4Addr, u16), inbox: &Arc<Inbox>) -> io::Result<()> {
        let mut map = self.sockets.write().unwrap_or_else(|e| e.into_inner());
        let v = map.entry(key).or_default();
        if v.is_empty() {
            if let Err(e) = self.ports.update(&key_bytes(key.0, key.1), &1u32.to_ne_bytes()) {
                map.remove(&key);
                return Err(e);
            }
        }
        v.push(inbox.clone());
        Ok(())
    }

    /// Removes a socket's inbox from `key`; the last one takes the key out
    /// of the program's map (its frames go to the kernel again).
    fn remove_socket(&self, key: (Ipv4Addr, u16), inbox: &Arc<Inbox>) {
        let mut map = self.sockets.write().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get_mut(&key) {
            v.retain(|i| !Arc::ptr_eq(i, inbox));
            if v.is_empty() {
                map.remove(&key);
                let _ = self.ports.delete(&key_bytes(key.0, key.1));
            }
        }
    }

    /// The socket a datagram from `src` to `dst` belongs to, as the kernel
    /// picks it ([`pick_socket`]). `Err(true)` when only sockets connected
    /// to other peers hold the address, `Err(false)` when none does (it
    /// closed while the frame was on its way).
    fn find_socket(&self, dst: SocketAddrV4, src: SocketAddrV4) -> Result<Arc<Inbox>, bool> {
        let map = self.sockets.read().unwrap_or_else(|e| e.into_inner());
        let exact = map.get(&(*dst.ip(), dst.port())).map(Vec::as_slice).unwrap_or_default();
        let wild = map.get(&(Ipv4Addr::UNSPECIFIED, dst.port())).map(Vec::as_slice).unwrap_or_default();
        let all = || exact.iter().map(|i| (true, i)).chain(wild.iter().map(|i| (false, i)));
        match pick_socket(all().map(|(e, i)| (e, *lock(&i.peer))), src) {
            Some(k) => Ok(all().nth(k).expect("picked among them").1.clone()),
            None => Err(!exact.is_empty() || !wild.is_empty()),
        }
    }

    /// The MAC address of on-link neighbour `ip`, from the kernel's table
    /// (read again once an answer is older than `neigh_ttl`).
    fn neighbour(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        let mut n = lock(&self.neigh);
        let now = Instant::now();
        if let Some(&(mac, at)) = n.map.get(&ip) {
            if now.duration_since(at) < self.cfg.neigh_ttl {
                return Some(mac);
            }
        }
        // While unresolved (the kernel's send of the datagram that missed
        // resolves it), the table is read again after a growing wait.
        let wait = match n.missing.get(&ip) {
            Some(&(next, _)) if now < next => return None,
            Some(&(_, wait)) => (wait * 2).min(Duration::from_millis(100)),
            None => Duration::from_micros(50),
        };
        n.map.clear();
        // This thread's namespace: `/proc/net` is the process leader's.
        let text = std::fs::read_to_string("/proc/thread-self/net/arp").unwrap_or_default();
        for (a, mac) in parse_arp_table(&text, &self.cfg.ifname) {
            n.map.insert(a, (mac, now));
        }
        match n.map.get(&ip).map(|&(m, _)| m) {
            Some(mac) => {
                n.missing.remove(&ip);
                Some(mac)
            }
            None => {
                if n.missing.len() >= 4096 {
                    n.missing.clear();
                }
                n.missing.insert(ip, (now + wait, wait));
                None
            }
        }
    }
}

/// Which of the sockets holding a datagram's port gets it, scored as the
/// kernel's UDP lookup scores them: bound to the datagram's address (not
/// the wildcard) adds 1, connected to its source adds 2 (the kernel counts
/// the peer's address and port), and a socket connected to another peer is
/// out. Among equals the one registered last wins, as the kernel's hash
/// chain puts the newest socket first. `sockets`: (bound exactly, peer),
/// in registration order within each address, exact ones first.
fn pick_socket(sockets: impl IntoIterator<Item = (bool, Option<SocketAddrV4>)>, src: SocketAddrV4) -> Option<usize> {
    let mut best: Option<(u8, usize)> = None;
    for (k, (exact, peer)) in sockets.into_iter().enumerate() {
        let score = match peer {
            Some(p) if p != src => continue,
            Some(_) => 2,
            None => 0,
        } + u8::from(exact);
        // `>=`: a later equal (newer) socket replaces an earlier one.
        if best.is_none_or(|(b, _)| score >= b) {
            best = Some((score, k));
        }
    }
    best.map(|(_, k)| k)
}

/// The IPv4 address of `a`, also when it is v4-mapped IPv6; `None` for
/// other IPv6 addresses (those stay on the kernel path).
fn as_v4(a: &SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(*a),
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().map(|ip| SocketAddrV4::new(ip, a.port())),
    }
}

/// Copies `payload` into the front of `dst` (an engine buffer keeps its
/// length: the engine reads into the same buffers again), checking the UDP
/// checksum in the same pass when there is one; false when it is wrong.
fn copy_checked(dst: &mut [u8], payload: &[u8], pending: Option<frame::PendingChecksum>) -> bool {
    match pending {
        Some(p) => p.copy(dst, payload).is_ok(),
        None => {
            dst[..payload.len()].copy_from_slice(payload);
            true
        }
    }
}

/// Complete entries (flags 0x2) of `/proc/net/arp` on `dev`.
fn parse_arp_table(text: &str, dev: &str) -> Vec<(Ipv4Addr, [u8; 6])> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[5] != dev {
            continue;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0);
        if flags & 0x2 == 0 {
            continue;
        }
        let (Ok(ip), Ok(mac)) = (f[0].parse::<Ipv4Addr>(), f[3].parse::<MacAddr>()) else { continue };
        if mac.0 != [0; 6] {
            out.push((ip, mac.0));
        }
    }
    out
}

fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let mask = u32::MAX << (32 - u32::from(prefix.min(32)));
    u32::from(a) & mask == u32::from(b) & mask
}

fn broadcast_of(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    if prefix >= 32 {
        return a;
    }
    Ipv4Addr::from(u32::from(a) | (u32::MAX >> u32::from(prefix)))
}

impl Drop for XdpSocket {
    fn drop(&mut self) {
        self.unregister();
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
        let mut tx = TxBatch { side: lock(&self.t.tx), queued: 0 };
        let r = self.send_datagrams(&mut tx, &mut std::iter::once(buf), dst, dst);
        tx.flush(&self.t)?;
        r.map(|_| buf.len())
    }
    fn send_batch(&self, msgs: &[OutMsg<'_>]) -> io::Result<usize> {
        // One kick for the whole batch: the AF_XDP counterpart of a GSO send.
        let mut tx = TxBatch { side: lock(&self.t.tx), queued: 0 };
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
        let mut at = self.take_inbox(bufs, meta, 0);
        if at < bufs.len() {
            at = self.take_ring(bufs, meta, at);
        }
        // When the fast path had nothing: what came through the kernel
        // (another interface, loopback, fragments, arrivals before the
        // bind). Every such look reads it, as a kernel socket's receive
        // would find it: a spinning receiver's empty looks cost a system
        // call each (the kernel backend's looks all do).
        if at == 0 {
            match self.kernel.recv_batch(bufs, meta) {
                Ok(n) => {
                    self.t.c.rx_kernel.fetch_add(n as u64, Relaxed);
                    return Ok(n);
                }
                Err(e) => return Err(e),
            }
        }
        if at == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(at)
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
    }
    fn release_socket(&self) {
        self.unregister();
        self.kernel.release_socket();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arp_table_entries_on_the_device_only_and_complete_only() {
        let text = "IP address       HW type     Flags       HW address            Mask     Device\n\
                    198.18.0.2       0x1         0x2         02:aa:bb:cc:dd:01     *        veth0\n\
                    198.18.0.3       0x1         0x0         00:00:00:00:00:00     *        veth0\n\
                    198.18.0.4       0x1         0x2         02:aa:bb:cc:dd:02     *        eth9\n\
                    198.18.0.5       0x1         0x6         02:aa:bb:cc:dd:03     *        veth0\n";
        let got = parse_arp_table(text, "veth0");
        assert_eq!(
            got,
            vec![
                ("198.18.0.2".parse().unwrap(), [2, 0xaa, 0xbb, 0xcc, 0xdd, 1]),
                ("198.18.0.5".parse().unwrap(), [2, 0xaa, 0xbb, 0xcc, 0xdd, 3])
            ]
        );
    }

    #[test]
    fn subnets_and_broadcast() {
        let a: Ipv4Addr = "198.18.0.1".parse().unwrap();
        assert!(same_subnet(a, "198.18.0.200".parse().unwrap(), 24));
        assert!(!same_subnet(a, "198.18.1.2".parse().unwrap(), 24));
        assert!(same_subnet(a, "198.19.1.2".parse().unwrap(), 15));
        assert_eq!(broadcast_of(a, 24), "198.18.0.255".parse::<Ipv4Addr>().unwrap());
        assert_eq!(broadcast_of(a, 30), "198.18.0.3".parse::<Ipv4Addr>().unwrap());
    }

    #[test]
    fn the_socket_the_kernel_would_pick() {
        let a = |s: &str| s.parse::<SocketAddrV4>().unwrap();
        let (src, other) = (a("198.18.0.1:5000"), a("198.18.0.1:5001"));
        // Connected to the source beats bound exactly.
        assert_eq!(pick_socket([(true, None), (false, Some(src))], src), Some(1));
        // Bound exactly beats the wildcard.
        assert_eq!(pick_socket([(true, None), (false, None)], src), Some(0));
        // Connected elsewhere is out, even when nothing else is there.
        assert_eq!(pick_socket([(true, Some(other)), (false, None)], src), Some(1));
        assert_eq!(pick_socket([(true, Some(other))], src), None);
        assert_eq!(pick_socket(std::iter::empty(), src), None);
        // Exact and connected beats wildcard and connected.
        assert_eq!(pick_socket([(false, Some(src)), (true, Some(src))], src), Some(1));
        // Equals: the newest (last in its address's list).
        assert_eq!(pick_socket([(true, None), (true, None), (false, None)], src), Some(1));
    }

    #[test]
    fn keys_are_the_wire_bytes_the_program_reads() {
        // The program stores daddr (4 wire bytes) and the 16-bit port load,
        // zero-extended, little end first.
        assert_eq!(key_bytes("198.18.0.2".parse().unwrap(), 0x1389), [198, 18, 0, 2, 0x13, 0x89, 0, 0]);
    }
}
