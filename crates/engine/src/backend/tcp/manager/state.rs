//! The state the manager's parts share, and the locks in it:
//!
//! * [`Conn`]: one TCP connection. `Conn::rx` (its decoder) is held by
//!   whoever reads it, outermost of all; `Conn::owner` (the endpoint whose
//!   readers read it, see `rx.rs`) nests inside `Conn::rx`; `Conn::lane`
//!   is taken alone.
//! * [`Lane`]: the datagrams to one peer host that hash to one connection;
//!   `Lane::st` is held while queueing, writing and connecting.
//! * [`RxQueue`]: an endpoint's receive queue. `RxQueue::inner` is the
//!   innermost lock; `RxQueue::owned` nests inside `Conn::owner`;
//!   `RxQueue::rd` is its readers' own.
//!
//! * [`Mgr`]: everything one transport shares, its fields grouped by the
//!   part that owns them; [`ListenSt`] is the listener's.
//!
//! They refer to each other (a lane to its connection, a connection to its
//! lane and to the queue that reads it), so they live together, below the
//! parts that act on them: those parts use this module, never the reverse.

use super::counters::Counters;
use super::outbuf::OutBuf;
use super::pools::{Pools, RxItem, BIG_BUF, BIG_FREE_MAX, FREE_MAX};
use crate::backend::tcp::fork::{self, Tracked};
use crate::backend::tcp::frame::Decoder;
use crate::backend::tcp::room::Room;
use crate::backend::tcp::sys::{self, Poller, SockOpts};
use crate::backend::tcp::TcpConfig;
use crate::fdspace::Private;
use crate::sys::addr::{to_family, unmap};
use crate::sys::fdevents::EventFd;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The manager's epoll token of its doorbell.
pub(super) const DOORBELL: u64 = 0;
/// The manager's epoll token of the listener.
pub(super) const LISTENER: u64 = 1;

pub(in crate::backend::tcp) use crate::sys::sync::lock;

pub(super) fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Normalises IPv4-mapped IPv6 addresses to IPv4.
pub(in crate::backend::tcp) fn norm_ip(ip: IpAddr) -> IpAddr {
    unmap(SocketAddr::new(ip, 0)).ip()
}

/// Everything one transport shares between its threads, by the part that
/// owns it (its locks in the order of the manager's header).
#[derive(Debug)]
pub(in crate::backend::tcp) struct Mgr {
    // The manager thread and its start (`mod.rs`, `transport.rs`).
    pub(in crate::backend::tcp) cfg: TcpConfig,
    pub(super) opts: SockOpts,
    pub(super) poller: Tracked<Poller>,
    pub(super) doorbell: Tracked<EventFd>,
    pub(super) stop: AtomicBool,
    /// The fork generation the transport was started in (see `fork.rs`):
    /// in a later one (a fork child) it is abandoned, as if stopped.
    pub(super) gen: u32,
    pub(super) next_token: AtomicU64,
    /// When the process-wide transport last wrote its counters file.
    pub(super) stats_written: Mutex<Option<Instant>>,
    pub(in crate::backend::tcp) c: Counters,

    // The listener (`listener.rs`).
    pub(super) listener: Mutex<Option<Tracked<Private<TcpListener>>>>,
    pub(super) listening: AtomicBool,
    /// The transport wants the pre-decided port: without a listener it
    /// keeps trying to take it (`listen_st`).
    pub(super) wants_port: bool,
    /// Retry and give-back state of the listener (nests inside `listener`).
    pub(super) listen_st: Mutex<ListenSt>,
    /// An endpoint was bound: from then on the transport listens (or
    /// tries to), as from its first endpoint on, whether or not
    /// endpoints are bound later.
    pub(super) bound_once: AtomicBool,
    /// Accepting is paused until then (out of descriptors).
    pub(super) accept_paused: Mutex<Option<Instant>>,

    // Connections (`connect.rs` opens and closes them, `listener.rs`
    // accepts them) and lanes (`lanes.rs`).
    pub(super) conns: Mutex<HashMap<u64, Arc<Conn>>>,
    pub(super) lanes: Mutex<HashMap<(IpAddr, u8), Arc<Lane>>>,
    pub(super) queued_total: AtomicUsize,
    pub(super) cc_warned: AtomicBool,
    /// Some lane may hold coalesced datagrams: the manager runs its timer.
    pub(super) cork_armed: AtomicBool,

    // The manager thread's reads (`rx.rs`, `in_place.rs`).
    /// Receive buffers for reuse (manager thread only).
    pub(super) pool: Mutex<Pools>,
    /// The read buffer (manager thread only).
    pub(super) rbuf: Mutex<Vec<u8>>,

    // Demultiplexing (`demux.rs`).
    pub(super) ports: Mutex<Ports>,
    /// Endpoints' kernel UDP sockets in `poller`, by token.
    pub(super) kernel_socks: Mutex<HashMap<u64, Weak<RxQueue>>>,
    /// Raw sockets for [`Mgr::forward`], opened on first use.
    pub(super) raw: OnceLock<sys::RawUdp>,
    /// Recent answers of [`sys::udp_port_bound`]: (bound, when asked).
    pub(super) bound: Mutex<HashMap<(IpAddr, u16), (bool, Instant)>>,
}

/// Bound UDP ports: port → (bound address, receive queue).
pub(super) type Ports = HashMap<u16, Vec<(IpAddr, Weak<RxQueue>)>>;

/// Retry and give-back state of a transport's listener (see
/// [`Mgr::listen_tick`]).
#[derive(Debug, Default)]
pub(super) struct ListenSt {
    /// No listener, and the port is wanted: the next attempt to take it,
    /// and the wait after that one.
    pub(super) retry: Option<(Instant, Duration)>,
    /// Listening as a fork child whose parent runs and had no claim on
    /// the port: when to check next whether the parent wants it back.
    pub(super) provisional: Option<Instant>,
    /// The manager thread is named [`fork::WAIT_NAME`].
    pub(super) named_wait: bool,
    /// The process ends ([`Mgr::leave`]): asked, then done by the manager.
    pub(super) leave: Leave,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
pub(super) enum Leave {
    #[default]
    No,
    Asked,
    Done,
}

/// What an endpoint's receive queue holds; filled by the manager thread,
/// drained by [`crate::backend::tcp::TcpSocket::recv_batch`].
#[derive(Debug)]
pub(in crate::backend::tcp) struct RxQueue {
    pub(in crate::backend::tcp) inner: Mutex<RxInner>,
    /// Readable exactly while `inner.items` is non-empty.
    pub(in crate::backend::tcp) ready: EventFd,
    pub(in crate::backend::tcp) v6: bool,
    /// Runs of equal-size datagrams are packed into blocks (`enable_gro`).
    pub(in crate::backend::tcp) gro: AtomicBool,
    /// The socket's `raw_fd`: an epoll set holding `ready` and, while this
    /// queue's readers read a connection themselves, that connection.
    pub(in crate::backend::tcp) poll: Poller,
    /// The connection this queue's readers read (see [`Mgr::delegate`]).
    pub(super) owned: Mutex<Option<Arc<Conn>>>,
    /// Buffers for those reads.
    pub(super) rd: Mutex<RdCtx>,
    /// The endpoint's kernel UDP socket may hold input (see
    /// [`Mgr::watch_kernel`]); its reader reads it next.
    pub(in crate::backend::tcp) kernel_pending: AtomicBool,
    /// The manager took this queue's connection back because its readers
    /// had stopped reading ([`Mgr::watch_owned`]); it is not handed to them
    /// again until they receive again (`recv_batch` clears this).
    pub(in crate::backend::tcp) stalled: AtomicBool,
    /// The endpoint's kernel UDP socket, to send plain UDP from its port
    /// (DML (c), [`Mgr::go_plain`]).
    pub(in crate::backend::tcp) plain: OnceLock<Weak<crate::backend::kernel::UdpSocket>>,
    /// The endpoint's datagrams the transport dropped.
    pub(in crate::backend::tcp) lost: super::counters::SockDrops,
}

/// A reader's buffers: the read buffer and receive blocks.
#[derive(Debug, Default)]
pub(super) struct RdCtx {
    pub(super) rbuf: Vec<u8>,
    pub(super) pools: Pools,
}

/// One received datagram, or a run of `n` equal-size datagrams from one
/// source packed back to back, the last possibly shorter, as UDP GRO packs

#[derive(Debug)]
pub(in crate::backend::tcp) struct RxInner {
    pub(in crate::backend::tcp) items: VecDeque<RxItem>,
    /// Datagrams in `items`.
    pub(in crate::backend::tcp) dgrams: usize,
    pub(in crate::backend::tcp) bytes: usize,
    pub(in crate::backend::tcp) cap: usize,
    /// Connected endpoint: only datagrams from this peer are accepted.
    pub(in crate::backend::tcp) peer: Option<SocketAddr>,
    /// Buffers the reader is done with, for the manager to reuse (no
    /// malloc/free per datagram across threads). Bounded by [`FREE_MAX`].
    pub(in crate::backend::tcp) free: Vec<Vec<u8>>,
    /// Blocks the reader got in exchange, for the manager (≤ [`BIG_FREE_MAX`]).
    pub(in crate::backend::tcp) free_big: Vec<Vec<u8>>,
    /// Whether `ready` is set: the eventfd is written and read only on a
    /// change (a syscall saved per hand-over and per emptying read).
    pub(in crate::backend::tcp) signalled: bool,
    /// The endpoint let go of its port ([`Mgr::unregister_port`]): what a
    /// reader still delivers here goes to the kernel socket instead.
    pub(in crate::backend::tcp) left: bool,
}

impl RxQueue {
    pub(in crate::backend::tcp) fn new(v6: bool, cap: usize) -> io::Result<Self> {
        let inner = RxInner {
            items: VecDeque::new(),
            dgrams: 0,
            bytes: 0,
            cap,
            peer: None,
            free: Vec::new(),
            free_big: Vec::new(),
            signalled: false,
            left: false,
        };
        let ready = EventFd::new()?;
        let poll = Poller::new()?;
        poll.add_level(ready.as_raw_fd(), 0)?;
        Ok(RxQueue {
            inner: Mutex::new(inner),
            ready,
            v6,
            gro: AtomicBool::new(false),
            poll,
            owned: Mutex::new(None),
            rd: Mutex::new(RdCtx::default()),
            kernel_pending: AtomicBool::new(true),
            stalled: AtomicBool::new(false),
            plain: OnceLock::new(),
            lost: Default::default(),
        })
    }

    /// Input arrived on the endpoint's kernel socket: its reader is woken
    /// (the flag first, so a reader clearing readiness sees it).
    pub(super) fn kernel_ready(&self) {
        self.kernel_pending.store(true, SeqCst);
        let mut q = lock(&self.inner);
        if !q.signalled {
            q.signalled = true;
            self.ready.set();
        }
    }

    /// Bytes this queue can still take before its bound.
    pub(super) fn room(&self) -> usize {
        let q = lock(&self.inner);
        q.cap.saturating_sub(q.bytes)
    }

    /// Whether a connection is read by this queue's readers.
    pub(in crate::backend::tcp) fn owns(&self) -> bool {
        lock(&self.owned).is_some()
    }

    /// Queues a batch under one lock and one readiness signal (none when
    /// `!signal`: the reader that pushes pops next); counts what was dropped
    /// into `c`. False, with the batch untouched, when the endpoint has let
    /// go of its port since the reader looked it up: the caller hands the
    /// batch to the kernel socket.
    pub(super) fn push_many(&self, batch: &mut Vec<RxItem>, c: &Counters, pools: &mut Pools, signal: bool) -> bool {
        if batch.is_empty() {
            return true;
        }
        let mut q = lock(&self.inner);
        if q.left {
            return false;
        }
        // Take back what the reader has finished with.
        if pools.small.len() < 2 * FREE_MAX {
            pools.small.append(&mut q.free);
        }
        if pools.big.len() < 2 * BIG_FREE_MAX {
            pools.big.append(&mut q.free_big);
        }
        let (mut full, mut filtered) = (0u64, 0u64);
        for mut it in batch.drain(..) {
            if it.big && (it.n == 1 || it.len < BIG_BUF / 2) {
                // A run of one, or a block less than half full (the end of a
                // read): into an exact-size buffer, so memory stays near what
                // is charged and a short burst is not charged whole blocks.
                let b = pools.small_copy(&it.buf[..it.len]);
                pools.big.push(std::mem::replace(&mut it.buf, b));
                it.big = false;
            }
            if (!self.v6 && it.src.is_ipv6()) || q.peer.is_some_and(|p| unmap(p) != it.src) {
                filtered += it.n as u64;
                pools.give(it.buf, it.big);
                continue;
            }
            let cost = it.cost();
            // A block larger than a tiny bound is still admitted into an empty queue.
            if q.bytes + cost > q.cap && !(it.big && q.items.is_empty()) {
                full += it.n as u64;
                pools.give(it.buf, it.big);
                continue;
            }
            it.src = to_family(it.src, self.v6);
            q.bytes += cost;
            q.dgrams += it.n;
            q.items.push_back(it);
        }
        // Counters before the wake-up, so a reader woken by it sees them.
        Counters::add(&c.drop_rx_full, full);
        Counters::add(&c.drop_filtered, filtered);
        Counters::add(&self.lost.receive, full + filtered);
        if signal && !q.items.is_empty() && !q.signalled {
            q.signalled = true;
            self.ready.set();
        }
        true
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Idle,
    Connecting,
    Up,
    Backoff,
}

/// One lane: the datagrams to one peer host that hash to one connection.
#[derive(Debug)]
pub(in crate::backend::tcp) struct Lane {
    pub(super) key: (IpAddr, u8),
    pub(super) st: Mutex<LaneSt>,
    pub(super) cv: Condvar,
}

#[derive(Debug)]
pub(super) struct LaneSt {
    pub(super) phase: Phase,
    pub(super) conn: Option<Arc<Conn>>,
    pub(super) out: OutBuf,
    pub(super) attempts: u32,
    pub(super) retry_at: Option<Instant>,
    /// DML (b) timed out: queue without blocking until the lane is up.
    pub(super) fallback: bool,
    pub(super) was_up: bool,
    pub(super) waiters: u32,
    pub(super) last_used: Instant,
    /// Removed from the lane map (idle) or the transport shut down.
    pub(super) retired: bool,
    pub(super) closed: bool,
    /// Coalesced datagrams wait unwritten since then (the manager writes
    /// them when `cfg.cork` has passed).
    pub(super) corked_at: Option<Instant>,
    /// DML (c): the peer refused the UOE port; datagrams go as plain UDP
    /// until a probe connects (`Mgr::go_plain`).
    pub(super) plain: bool,
    /// Sockets whose send this lane refused, with the bytes of room that
    /// send wanted: their [`Room`] is shut until then ([`Mgr::open_rooms`]).
    pub(super) rooms: Vec<(Weak<Room>, usize)>,
}

impl Lane {
    /// DML (c): the peer refused the UOE port, sends go as plain UDP.
    pub(in crate::backend::tcp) fn is_plain(&self) -> bool {
        lock(&self.st).plain
    }
}

/// One TCP connection, outgoing or accepted.
#[derive(Debug)]
pub(super) struct Conn {
    pub(super) token: u64,
    pub(super) stream: Private<TcpStream>,
    pub(super) peer: SocketAddr,
    pub(super) local_ip: IpAddr,
    pub(super) inbound: bool,
    pub(super) created: Instant,
    pub(super) dead: AtomicBool,
    pub(super) hello_seen: AtomicBool,
    pub(super) rx: Mutex<Decoder>,
    /// The lane this connection transmits for, if any.
    pub(super) lane: Mutex<Option<Weak<Lane>>>,
    /// Read by an endpoint's readers, not the manager (see [`Mgr::delegate`]).
    pub(super) delegated: AtomicBool,
    /// That endpoint, and the manager's watch on it. Delegation, its end
    /// and the manager's epoll events for the connection change under this
    /// lock only, so they cannot cross.
    pub(super) owner: Mutex<Owner>,
    /// Reads by that endpoint's readers (the manager's watch compares).
    pub(super) direct_reads: AtomicU64,
    /// Consecutive manager reads that went in place to one queue, and
    /// that queue's address (an identity only, never dereferenced).
    pub(super) bulk: AtomicU32,
    pub(super) bulk_q: AtomicUsize,
}

/// Who reads a delegated connection, and whether it still does
/// ([`Mgr::watch_owned`]).
#[derive(Debug)]
pub(super) struct Owner {
    pub(super) q: Option<Weak<RxQueue>>,
    /// `Conn::direct_reads` when last looked at, and since when it is so.
    pub(super) reads: u64,
    pub(super) since: Instant,
    /// The connection was idle: the manager's epoll set reports its next
    /// input (edge-triggered) instead of the manager looking every tick.
    pub(super) armed: bool,
}

impl Conn {
    pub(super) fn new(token: u64, stream: Private<TcpStream>, peer: SocketAddr, inbound: bool) -> Arc<Conn> {
        let local_ip = stream.local_addr().map(|a| norm_ip(a.ip())).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        fork::record(stream.as_raw_fd());
        Arc::new(Conn {
            token,
            stream,
            peer: unmap(peer),
            local_ip,
            inbound,
            created: Instant::now(),
            dead: AtomicBool::new(false),
            hello_seen: AtomicBool::new(false),
            rx: Mutex::new(Decoder::new()),
            lane: Mutex::new(None),
            delegated: AtomicBool::new(false),
            owner: Mutex::new(Owner { q: None, reads: 0, since: Instant::now(), armed: false }),
            direct_reads: AtomicU64::new(0),
            bulk: AtomicU32::new(0),
            bulk_q: AtomicUsize::new(0),
        })
    }

    pub(super) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}

impl Drop for Conn {
    /// Before `stream` closes: a fork child no longer gives it up.
    fn drop(&mut self) {
        fork::forget(self.stream.as_raw_fd());
    }
}

/// Information about one live connection (diagnostics and tests).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnInfo {
    pub peer: SocketAddr,
    pub inbound: bool,
    pub lane: Option<u8>,
    pub congestion: String,
    pub nodelay: bool,
}
