//! [`XdpTransport`]: the program attached, the AF_XDP socket opened, the
//! sockets made; and the process-wide transport.

use super::addr::as_v4;
use super::config::{AttachMode, Counters, XdpConfig, XdpStats};
use super::shared::{Inbox, Neighbours, RxSide, Shared, TxSide};
use super::socket::{SockState, XdpSocket};
use super::sys;
use crate::backend::kernel::UdpSocket;
use crate::backend::Backend;
use crate::sys::epoll::Epoll;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

/// The transport of one interface: the attached program, the AF_XDP socket
/// and the sockets it demultiplexes to. Cheap to clone.
#[derive(Debug, Clone)]
pub struct XdpTransport {
    pub(super) shared: Arc<Shared>,
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
                groups: Mutex::new(Default::default()),
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
            flagged: AtomicBool::new(false),
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
            spin_looks: AtomicU32::new(0),
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
            rx_group_copies: g(&c.rx_group_copies),
            group_kernel: g(&c.group_kernel),
            group_keys: lock(&self.shared.groups).redirected.len() as u64,
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
