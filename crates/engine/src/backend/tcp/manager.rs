//! The UOE manager: Connection Management Layer (lazy connections, the
//! listener, demultiplexing) and Data Management Layer (bounded queues,
//! background retry, deadlines, reconnect) for one process.
//!
//! Threads: the manager thread owns the epoll set (listener, doorbell, every
//! connection, edge-triggered) and does all reads, accepts, connect
//! completions, retries and deadline drops. Senders (application threads
//! for direct posts, the engine thread for batches) append frames to a
//! lane's queue and write them to the connection themselves, under the
//! lane's lock, so an idle path costs one `send(2)` and a busy one batches
//! many frames per call. The manager finishes writes the socket refused
//! (EPOLLOUT).
//!
//! Locks, in the order they may nest: `Conn::rx` → `Mgr::rbuf` →
//! `Mgr::pool` → `Lane::st` → `Mgr::conns` / `Mgr::lanes` / `Mgr::ports`
//! → `RxQueue::inner`; and `Conn::rx` → `Conn::owner` → `RxQueue::owned`
//! → `RxQueue::inner`; and `Mgr::listener` → `Mgr::listen_st`. `rbuf`
//! and `pool` are the manager thread's own.

use super::fork::{self, Tracked};
use super::frame::{self, Decoder, Event, FrameError, HEADER_LEN, MAX_PAYLOAD, RUN_HEADER_LEN};
use super::socket::Room;
use super::sys::{self, Poller, SockOpts, EV_ERR, EV_IN, EV_OUT};
use super::{Dml, TcpConfig, CORK_BYTES};
use crate::backend::kernel::{to_family, unmap, EventFd};
use crate::fdspace::{private, Private};
use serde::Serialize;
use std::cell::Cell;
use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, IoSliceMut, Read};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const DOORBELL: u64 = 0;
const LISTENER: u64 = 1;
/// Bytes per read from a connection (one buffer shared by all).
const READ_CHUNK: usize = 512 << 10;
/// Bytes read from one connection per readiness event before others get a turn.
const READ_BUDGET: usize = 4 << 20;
/// Accounting overhead per queued received datagram (like skb truesize).
pub(super) const RX_OVERHEAD: usize = 64;
/// User-space queue bound of a connected lane (the DML bound,
/// `cfg.queue_bytes`, applies while it is not connected).
const UP_QUEUE_BYTES: usize = 2 * CORK_BYTES;
/// Longest the engine thread waits on a full lane, while it has nothing
/// else to do, before it leaves the refused batch to the room descriptor
/// ([`Mgr::engine_wait`]).
const ENGINE_WAIT: Duration = Duration::from_millis(10);
/// Between two looks of [`Mgr::engine_wait`] at the engine's other work.
const ENGINE_WAIT_SLICE: Duration = Duration::from_micros(250);
/// A lane with nothing queued and no connection is forgotten after this.
const LANE_IDLE: Duration = Duration::from_secs(30);
/// A transport that wants the pre-decided port but runs without a
/// listener tries to take it again after this, doubling up to
/// [`LISTEN_RETRY_MAX`] (see [`Mgr::listen_tick`]).
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(20);
/// The longest wait between two attempts: the bound on how long the port
/// stays unlistened after its holder ends (plus a tick).
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a fork child whose parent runs (with no claim on the port)
/// leaves the port to the parent before it listens itself.
const PARENT_GRACE: Duration = Duration::from_millis(50);
/// How often a fork child listening under [`PARENT_GRACE`]'s rule checks
/// whether its parent now wants the port.
const YIELD_CHECK: Duration = Duration::from_millis(250);
/// The longest a process's end waits for its peers to close the
/// connections it half-closed (see [`Mgr::leave`]).
const EXIT_DRAIN: Duration = Duration::from_millis(250);

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// Normalises IPv4-mapped IPv6 addresses to IPv4.
pub(super) fn norm_ip(ip: IpAddr) -> IpAddr {
    unmap(SocketAddr::new(ip, 0)).ip()
}

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        #[derive(Debug, Default)]
        pub(super) struct Counters { $(pub(super) $name: AtomicU64,)* }
        /// Counters of one UOE transport (all lanes, connections, endpoints).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct TcpStats { $(#[doc = $doc] pub $name: u64,)* }
        impl Counters {
            fn snapshot(&self) -> TcpStats { TcpStats { $($name: self.$name.load(Relaxed),)* } }
        }
        impl TcpStats {
            /// Every counter by name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> { vec![$((stringify!($name), self.$name),)*] }
        }
    };
}

counters! {
    conns_opened: "Outgoing connections attempted (sockets created).",
    conns_accepted: "Incoming connections accepted.",
    conns_closed: "Connections closed for any reason.",
    connect_failures: "Connection attempts that failed (refused, unreachable, cap).",
    reconnects: "Lanes that came up again after having been up before.",
    rejected_conns: "Connections refused by the caps (total or per peer).",
    bad_hello: "Connections closed because the preamble was not ours.",
    malformed: "Connections closed on a malformed frame header.",
    oversized: "Connections closed on a frame longer than 65507 bytes.",
    hello_timeouts: "Connections closed for not sending the preamble in time.",
    frames_sent: "Datagrams written to connections.",
    bytes_sent: "Bytes written to connections (headers included).",
    writes: "send/sendmsg calls that wrote to connections (joined runs share one).",
    frames_received: "Datagrams decoded from connections.",
    bytes_received: "Payload bytes decoded.",
    drop_queue_full: "Datagrams dropped: lane queue full while not connected (DML bound).",
    drop_deadline: "Datagrams dropped: waited past the DML deadline while not connected.",
    drop_max_wait: "Datagrams dropped: waited past the bound on a stalled connection.",
    drop_no_lane: "Datagrams dropped: lane cap reached.",
    drop_no_port: "Datagrams received for a port no endpoint is bound to (and no kernel UDP socket either, or no CAP_NET_RAW to reach one).",
    forwarded_kernel: "Datagrams for a port no endpoint is bound to, handed to the kernel UDP socket bound there (a socket on the kernel path, another process's) with the sender's address.",
    kernel_received: "Datagrams an endpoint read from its own kernel UDP socket (from senders not on this transport, or handed over by a listener).",
    drop_rx_full: "Datagrams dropped: the endpoint's receive queue was full.",
    drop_filtered: "Datagrams dropped by a connected endpoint (other source).",
    lost_partial: "Datagrams cut off by a connection failure mid-frame.",
    block_waits: "DML (b): sends that blocked waiting for a connection.",
    block_timeouts: "DML (b): blocks that timed out and fell back to queueing.",
    backpressure_waits: "Sends refused (EAGAIN) by a full connected lane; an application thread waits for room (wait_writable), the engine waits briefly on a lane that drains fast (engine_waits) or watches the socket's room descriptor.",
    engine_waits: "Refusals the engine thread, having nothing else to do, began to wait out on the lane (up to 10 ms) instead of watching the room descriptor.",
    engine_wait_timeouts: "Of engine_waits, those that ended without room after 10 ms (the batch then waits for the room descriptor).",
    engine_wait_yields: "Of engine_waits, those cut short because other work came for the engine (the batch then waits for the room descriptor).",
    cc_errors: "Connections on which TCP_CONGESTION could not be set.",
    coalesced_sends: "Datagrams of a streaming application thread gathered for a block write.",
    cork_timer_flushes: "Gathered blocks the manager wrote when the coalescing delay ran out.",
    frames_in_place: "Datagrams read straight into receive blocks (not copied by the manager).",
    rx_direct_reads: "Reads of a connection by the receiving thread of the endpoint its bulk flow goes to (not by the manager).",
    rx_delegations: "Times a connection was handed to an endpoint's readers (see rx_direct_reads).",
    rx_stall_revokes: "Connections the manager took back from an endpoint that had not read them for rx_stall while input waited (its program stopped receiving).",
    frames_shifted: "Datagrams of an in-place read that an unforeseen header had shifted, moved into their slots with one copy (not through the decoder).",
    plain_sent: "DML (c): datagrams sent as plain UDP from the endpoint's kernel socket to a peer host that refused the UOE port (no UOE there).",
    plain_lost: "DML (c): datagrams for such a peer that could not be sent as plain UDP (the sending socket was gone or its buffer stayed full).",
    listen_takeovers: "Times this transport, running without a listener, took the pre-decided port later (its holder had ended or given it back).",
    listen_yields: "Times this fork child gave the port back to its parent, whose transport started after the child had taken it.",
    exit_open_conns: "Connections still open when the process ended, after its exit drain's bound: what their peers wrote on them since is lost.",
}

/// What an endpoint's receive queue holds; filled by the manager thread,
/// drained by [`super::TcpSocket::recv_batch`].
#[derive(Debug)]
pub(super) struct RxQueue {
    pub(super) inner: Mutex<RxInner>,
    /// Readable exactly while `inner.items` is non-empty.
    pub(super) ready: EventFd,
    pub(super) v6: bool,
    /// Runs of equal-size datagrams are packed into blocks (`enable_gro`).
    pub(super) gro: AtomicBool,
    /// The socket's `raw_fd`: an epoll set holding `ready` and, while this
    /// queue's readers read a connection themselves, that connection.
    pub(super) poll: Poller,
    /// The connection this queue's readers read (see [`Mgr::delegate`]).
    owned: Mutex<Option<Arc<Conn>>>,
    /// Buffers for those reads.
    rd: Mutex<RdCtx>,
    /// The endpoint's kernel UDP socket may hold input (see
    /// [`Mgr::watch_kernel`]); its reader reads it next.
    pub(super) kernel_pending: AtomicBool,
    /// The manager took this queue's connection back because its readers
    /// had stopped reading ([`Mgr::watch_owned`]); it is not handed to them
    /// again until they receive again (`recv_batch` clears this).
    pub(super) stalled: AtomicBool,
    /// The endpoint's kernel UDP socket, to send plain UDP from its port
    /// (DML (c), [`Mgr::go_plain`]).
    pub(super) plain: OnceLock<Weak<crate::backend::kernel::UdpSocket>>,
}

/// A reader's buffers: the read buffer and receive blocks.
#[derive(Debug, Default)]
struct RdCtx {
    rbuf: Vec<u8>,
    pools: Pools,
}

/// One received datagram, or a run of `n` equal-size datagrams from one
/// source packed back to back, the last possibly shorter, as UDP GRO packs
/// them. A `big` item is a [`BIG_BUF`] block, handed to the engine whole
/// (the buffers are swapped, nothing is copied); others are exact-size
/// buffers that are copied. The engine's ring cuts a run at `seg`.
#[derive(Debug)]
pub(super) struct RxItem {
    pub(super) buf: Vec<u8>,
    pub(super) len: usize,
    pub(super) seg: usize,
    pub(super) n: usize,
    pub(super) src: SocketAddr,
    pub(super) big: bool,
}

impl RxItem {
    /// Charged against the queue bound: payload plus per-datagram overhead,
    /// and at least the block's memory (like skb truesize).
    pub(super) fn cost(&self) -> usize {
        let c = self.len + self.n * RX_OVERHEAD;
        if self.big {
            c.max(self.buf.len())
        } else {
            c
        }
    }

    /// Whether a `len`-byte datagram from `src` continues this block.
    fn extends(&self, src: SocketAddr, len: usize) -> bool {
        self.big
            && self.src == src
            && len > 0
            && len <= self.seg
            && self.len == self.n * self.seg
            && self.len + len <= self.buf.len()
    }
}

#[derive(Debug)]
pub(super) struct RxInner {
    pub(super) items: VecDeque<RxItem>,
    /// Datagrams in `items`.
    pub(super) dgrams: usize,
    pub(super) bytes: usize,
    pub(super) cap: usize,
    /// Connected endpoint: only datagrams from this peer are accepted.
    pub(super) peer: Option<SocketAddr>,
    /// Buffers the reader is done with, for the manager to reuse (no
    /// malloc/free per datagram across threads). Bounded by [`FREE_MAX`].
    pub(super) free: Vec<Vec<u8>>,
    /// Blocks the reader got in exchange, for the manager (≤ [`BIG_FREE_MAX`]).
    pub(super) free_big: Vec<Vec<u8>>,
    /// Whether `ready` is set: the eventfd is written and read only on a
    /// change (a syscall saved per hand-over and per emptying read).
    pub(super) signalled: bool,
    /// The endpoint let go of its port ([`Mgr::unregister_port`]): what a
    /// reader still delivers here goes to the kernel socket instead.
    pub(super) left: bool,
}

/// Buffers kept for reuse per receive queue (the manager's pool keeps
/// twice as many).
pub(super) const FREE_MAX: usize = 4096;
/// Larger buffers are not kept for reuse (bounded memory).
pub(super) const FREE_MAX_CAP: usize = 16 << 10;
/// Size of a packed block: the engine's receive buffer size, so its ring
/// keeps the block for reuse.
pub(super) const BIG_BUF: usize = 1 << 16;
/// Blocks kept for reuse per receive queue (the manager keeps twice as many).
pub(super) const BIG_FREE_MAX: usize = 64;
/// Smaller datagrams are not packed into blocks (a block charges its memory).
const PACK_MIN: usize = 1024;

/// The manager thread's buffers for received payloads.
#[derive(Debug, Default)]
struct Pools {
    small: Vec<Vec<u8>>,
    big: Vec<Vec<u8>>,
}

impl Pools {
    fn give(&mut self, buf: Vec<u8>, big: bool) {
        if big {
            self.big.push(buf);
        } else {
            self.small.push(buf);
        }
    }

    fn small_copy(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = self.small.pop().unwrap_or_default();
        b.clear();
        b.extend_from_slice(data);
        b
    }

    fn block(&mut self) -> Vec<u8> {
        match self.big.pop() {
            Some(b) if b.len() == BIG_BUF => b,
            _ => vec![0u8; BIG_BUF],
        }
    }

    /// Appends a datagram to `batch`, continuing the last block if it can.
    fn add(&mut self, batch: &mut Vec<RxItem>, pack: bool, src: SocketAddr, payload: &[u8]) {
        let len = payload.len();
        if let Some(last) = batch.last_mut().filter(|l| l.extends(src, len)) {
            last.buf[last.len..last.len + len].copy_from_slice(payload);
            last.len += len;
            last.n += 1;
            return;
        }
        if pack && len >= PACK_MIN {
            let mut buf = self.block();
            buf[..len].copy_from_slice(payload);
            batch.push(RxItem { buf, len, seg: len, n: 1, src, big: true });
        } else {
            batch.push(RxItem { buf: self.small_copy(payload), len, seg: len, n: 1, src, big: false });
        }
    }

    fn trim(&mut self) {
        self.small.retain(|b| b.capacity() <= FREE_MAX_CAP);
        self.small.truncate(2 * FREE_MAX);
        self.big.truncate(2 * BIG_FREE_MAX);
    }
}

impl RxQueue {
    pub(super) fn new(v6: bool, cap: usize) -> io::Result<Self> {
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
        })
    }

    /// Input arrived on the endpoint's kernel socket: its reader is woken
    /// (the flag first, so a reader clearing readiness sees it).
    fn kernel_ready(&self) {
        self.kernel_pending.store(true, SeqCst);
        let mut q = lock(&self.inner);
        if !q.signalled {
            q.signalled = true;
            self.ready.set();
        }
    }

    /// Bytes this queue can still take before its bound.
    fn room(&self) -> usize {
        let q = lock(&self.inner);
        q.cap.saturating_sub(q.bytes)
    }

    /// Whether a connection is read by this queue's readers.
    pub(super) fn owns(&self) -> bool {
        lock(&self.owned).is_some()
    }

    /// Queues a batch under one lock and one readiness signal (none when
    /// `!signal`: the reader that pushes pops next); counts what was dropped
    /// into `c`. False, with the batch untouched, when the endpoint has let
    /// go of its port since the reader looked it up: the caller hands the
    /// batch to the kernel socket.
    fn push_many(&self, batch: &mut Vec<RxItem>, c: &Counters, pools: &mut Pools, signal: bool) -> bool {
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
        if signal && !q.items.is_empty() && !q.signalled {
            q.signalled = true;
            self.ready.set();
        }
        true
    }
}

/// Datagrams queued for one lane, as the bytes that go on the wire, with
/// the enqueue time of every frame (for the deadlines).
#[derive(Debug, Default)]
struct OutBuf {
    buf: Vec<u8>,
    head: usize,
    /// Stream position of `buf[head]`.
    pos: u64,
    /// (start, end, enqueued, datagrams) of every frame not completely
    /// written; the rest of a run counts its unwritten datagrams.
    frames: VecDeque<(u64, u64, Instant, u32)>,
}

impl OutBuf {
    fn queued(&self) -> usize {
        self.buf.len() - self.head
    }

    fn push(&mut self, src: u16, dst: u16, parts: &[IoSlice<'_>], len: usize, now: Instant) {
        let start = self.pos + self.queued() as u64;
        self.buf.extend_from_slice(&frame::header(src, dst, len));
        for p in parts {
            self.buf.extend_from_slice(p);
        }
        self.frames.push_back((start, start + (HEADER_LEN + len) as u64, now, 1));
    }

    /// `n` bytes went to the socket without passing through the (empty)
    /// queue: the stream position moves on.
    fn wrote_direct(&mut self, n: usize) {
        debug_assert_eq!(self.queued(), 0);
        self.pos += n as u64;
    }

    /// Queues the rest of a frame or run (`pieces`, `datagrams` of them
    /// not completely written) whose first `written` bytes went to the
    /// socket directly (just before, with the queue empty).
    fn push_rest<'a>(&mut self, pieces: impl Iterator<Item = &'a [u8]>, written: usize, datagrams: u32, now: Instant) {
        debug_assert_eq!(self.queued(), 0);
        let start = self.pos - written as u64;
        let mut skip = written;
        for piece in pieces {
            if skip >= piece.len() {
                skip -= piece.len();
                continue;
            }
            self.buf.extend_from_slice(&piece[skip..]);
            skip = 0;
        }
        self.frames.push_back((start, self.pos + self.queued() as u64, now, datagrams));
    }

    fn unwritten(&self) -> &[u8] {
        &self.buf[self.head..]
    }

    /// `n` bytes were written; returns frames completed.
    fn advance(&mut self, n: usize) -> u64 {
        self.skip(n);
        let mut done = 0;
        while self.frames.front().is_some_and(|f| f.1 <= self.pos) {
            done += self.frames.pop_front().map_or(0, |f| f.3 as u64);
        }
        done
    }

    fn skip(&mut self, n: usize) {
        self.head += n;
        self.pos += n as u64;
        if self.head == self.buf.len() {
            self.buf.clear();
            self.head = 0;
        } else if self.head >= (1 << 20) && self.head * 2 >= self.buf.len() {
            self.buf.drain(..self.head);
            self.head = 0;
        }
    }

    /// The connection died mid-frame: the rest of that frame (or run) is
    /// useless; returns its datagrams.
    fn discard_partial(&mut self) -> u64 {
        match self.frames.front().copied() {
            Some((s, e, _, n)) if s < self.pos => {
                self.skip((e - self.pos) as usize);
                self.frames.pop_front();
                n as u64
            }
            _ => 0,
        }
    }

    /// Drops whole, unwritten frames at the head enqueued before `cutoff`.
    fn drop_older(&mut self, cutoff: Instant) -> u64 {
        let mut n = 0;
        while let Some(&(s, e, t, k)) = self.frames.front() {
            if s != self.pos || t >= cutoff {
                break;
            }
            self.skip((e - s) as usize);
            self.frames.pop_front();
            n += k as u64;
        }
        n
    }

    fn clear(&mut self) -> u64 {
        let n = self.frames.iter().map(|f| f.3 as u64).sum();
        let q = self.queued();
        self.skip(q);
        self.frames.clear();
        n
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Idle,
    Connecting,
    Up,
    Backoff,
}

/// One lane: the datagrams to one peer host that hash to one connection.
#[derive(Debug)]
pub(super) struct Lane {
    key: (IpAddr, u8),
    st: Mutex<LaneSt>,
    cv: Condvar,
}

#[derive(Debug)]
struct LaneSt {
    phase: Phase,
    conn: Option<Arc<Conn>>,
    out: OutBuf,
    attempts: u32,
    retry_at: Option<Instant>,
    /// DML (b) timed out: queue without blocking until the lane is up.
    fallback: bool,
    was_up: bool,
    waiters: u32,
    last_used: Instant,
    /// Removed from the lane map (idle) or the transport shut down.
    retired: bool,
    closed: bool,
    /// Coalesced datagrams wait unwritten since then (the manager writes
    /// them when `cfg.cork` has passed).
    corked_at: Option<Instant>,
    /// DML (c): the peer refused the UOE port; datagrams go as plain UDP
    /// until a probe connects (`Mgr::go_plain`).
    plain: bool,
    /// Sockets whose send this lane refused, with the bytes of room that
    /// send wanted: their [`Room`] is shut until then ([`Mgr::open_rooms`]).
    rooms: Vec<(Weak<Room>, usize)>,
}

impl Lane {
    /// DML (c): the peer refused the UOE port, sends go as plain UDP.
    pub(super) fn is_plain(&self) -> bool {
        lock(&self.st).plain
    }
}

/// One TCP connection, outgoing or accepted.
#[derive(Debug)]
struct Conn {
    token: u64,
    stream: Private<TcpStream>,
    peer: SocketAddr,
    local_ip: IpAddr,
    inbound: bool,
    created: Instant,
    dead: AtomicBool,
    hello_seen: AtomicBool,
    rx: Mutex<Decoder>,
    /// The lane this connection transmits for, if any.
    lane: Mutex<Option<Weak<Lane>>>,
    /// Read by an endpoint's readers, not the manager (see [`Mgr::delegate`]).
    delegated: AtomicBool,
    /// That endpoint, and the manager's watch on it. Delegation, its end
    /// and the manager's epoll events for the connection change under this
    /// lock only, so they cannot cross.
    owner: Mutex<Owner>,
    /// Reads by that endpoint's readers (the manager's watch compares).
    direct_reads: AtomicU64,
    /// Consecutive manager reads that went in place to one queue, and
    /// that queue's address (an identity only, never dereferenced).
    bulk: AtomicU32,
    bulk_q: AtomicUsize,
}

/// Who reads a delegated connection, and whether it still does
/// ([`Mgr::watch_owned`]).
#[derive(Debug)]
struct Owner {
    q: Option<Weak<RxQueue>>,
    /// `Conn::direct_reads` when last looked at, and since when it is so.
    reads: u64,
    since: Instant,
    /// The connection was idle: the manager's epoll set reports its next
    /// input (edge-triggered) instead of the manager looking every tick.
    armed: bool,
}

impl Conn {
    fn new(token: u64, stream: Private<TcpStream>, peer: SocketAddr, inbound: bool) -> Arc<Conn> {
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

    fn fd(&self) -> RawFd {
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

/// How long a sender may wait, by caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Caller {
    /// An application thread (direct post): DML (b) may block it.
    App,
    /// An application thread sending back to back: as `App`, and its
    /// datagrams may be coalesced (see [`TcpConfig::cork`]).
    Stream,
    /// The engine thread (queued batches): never blocked by DML.
    Engine,
}

/// Bound UDP ports: port → (bound address, receive queue).
type Ports = HashMap<u16, Vec<(IpAddr, Weak<RxQueue>)>>;

/// Everything one transport shares between its threads.
#[derive(Debug)]
pub(super) struct Mgr {
    pub(super) cfg: TcpConfig,
    opts: SockOpts,
    poller: Tracked<Poller>,
    doorbell: Tracked<EventFd>,
    stop: AtomicBool,
    /// The fork generation the transport was started in (see `fork.rs`):
    /// in a later one (a fork child) it is abandoned, as if stopped.
    gen: u32,
    listener: Mutex<Option<Tracked<Private<TcpListener>>>>,
    listening: AtomicBool,
    /// The transport wants the pre-decided port: without a listener it
    /// keeps trying to take it (`listen_st`).
    wants_port: bool,
    /// Retry and give-back state of the listener (nests inside `listener`).
    listen_st: Mutex<ListenSt>,
    /// An endpoint was bound: from then on the transport listens (or
    /// tries to), as from its first endpoint on, whether or not
    /// endpoints are bound later.
    bound_once: AtomicBool,
    /// Accepting is paused until then (out of descriptors).
    accept_paused: Mutex<Option<Instant>>,
    conns: Mutex<HashMap<u64, Arc<Conn>>>,
    lanes: Mutex<HashMap<(IpAddr, u8), Arc<Lane>>>,
    ports: Mutex<Ports>,
    queued_total: AtomicUsize,
    /// Receive buffers for reuse (manager thread only).
    pool: Mutex<Pools>,
    /// The read buffer (manager thread only).
    rbuf: Mutex<Vec<u8>>,
    next_token: AtomicU64,
    cc_warned: AtomicBool,
    /// Some lane may hold coalesced datagrams: the manager runs its timer.
    cork_armed: AtomicBool,
    /// When the process-wide transport last wrote its counters file.
    stats_written: Mutex<Option<Instant>>,
    /// Endpoints' kernel UDP sockets in `poller`, by token.
    kernel_socks: Mutex<HashMap<u64, Weak<RxQueue>>>,
    /// Raw sockets for [`Mgr::forward`], opened on first use.
    raw: OnceLock<sys::RawUdp>,
    /// Recent answers of [`sys::udp_port_bound`]: (bound, when asked).
    bound: Mutex<HashMap<(IpAddr, u16), (bool, Instant)>>,
    pub(super) c: Counters,
}

/// Retry and give-back state of a transport's listener (see
/// [`Mgr::listen_tick`]).
#[derive(Debug, Default)]
struct ListenSt {
    /// No listener, and the port is wanted: the next attempt to take it,
    /// and the wait after that one.
    retry: Option<(Instant, Duration)>,
    /// Listening as a fork child whose parent runs and had no claim on
    /// the port: when to check next whether the parent wants it back.
    provisional: Option<Instant>,
    /// The manager thread is named [`fork::WAIT_NAME`].
    named_wait: bool,
    /// The process ends ([`Mgr::leave`]): asked, then done by the manager.
    leave: Leave,
}

#[derive(Debug, Default, PartialEq, Eq, Clone, Copy)]
enum Leave {
    #[default]
    No,
    Asked,
    Done,
}

/// A UOE transport: the manager thread and its state. Dropping it closes
/// the listener and every connection (in tests: a peer "restart").
#[derive(Debug)]
pub struct TcpTransport {
    pub(super) mgr: Arc<Mgr>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// The process-wide transport and the fork generation it was started in.
struct Global {
    gen: u32,
    t: Result<TcpTransport, i32>,
}

/// Leaked, never freed: a fork child abandons its parent's transport
/// (whose manager thread it does not have, and whose descriptors it gave
/// up, see `fork.rs`) and starts its own. No lock: a fork child must not
/// inherit one held by a thread it does not have.
static GLOBAL: sys::Leaked<Global> = sys::Leaked::new();
/// Held (true) while a thread starts the process-wide transport.
static GLOBAL_INIT: AtomicBool = AtomicBool::new(false);
/// Some transport was started in this process or an ancestor.
static GLOBAL_STARTED: AtomicBool = AtomicBool::new(false);

/// This process's transport, if started here (not inherited across fork).
fn current() -> Option<&'static Result<TcpTransport, i32>> {
    GLOBAL.get().filter(|g| g.gen == fork::generation()).map(|g| &g.t)
}

/// Fork child handler (`fork.rs`): a start under way in the parent has no
/// thread here to finish it.
pub(super) fn forked() {
    GLOBAL_INIT.store(false, SeqCst);
}

/// Holds [`GLOBAL_INIT`] while it lives.
struct InitGuard;

impl InitGuard {
    /// Waits for a start under way in another thread; None once a
    /// transport of this process exists.
    fn take() -> Option<InitGuard> {
        loop {
            if current().is_some() {
                return None;
            }
            if GLOBAL_INIT.compare_exchange(false, true, SeqCst, SeqCst).is_ok() {
                return Some(InitGuard);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for InitGuard {
    fn drop(&mut self) {
        GLOBAL_INIT.store(false, SeqCst);
    }
}

/// Where the process-wide transport writes its counters:
/// `<dir>/<pid>.tcp.json`, next to the shim's `<pid>.json` that `eudp stat`
/// reads (None: no directory shared by the shim nor `EUDP_STAT_DIR`, or
/// `EUDP_STAT_MS=0`).
fn stats_path() -> Option<std::path::PathBuf> {
    let dir = crate::stat_dir::shared()?;
    if std::env::var("EUDP_STAT_MS").ok().and_then(|v| v.trim().parse::<u64>().ok()) == Some(0) {
        return None;
    }
    Some(std::path::Path::new(&dir).join(format!("{}.tcp.json", std::process::id())))
}

/// Writes `stats` of the transport to [`stats_path`] (temporary file, then rename).
fn write_stats(stats: &TcpStats, queued: usize) {
    let Some(path) = stats_path() else { return };
    let fields: Vec<String> = stats.fields().iter().map(|(k, v)| format!("    \"{k}\": {v}")).collect();
    let body = format!(
        "{{\n  \"pid\": {},\n  \"queued_bytes\": {queued},\n  \"tcp\": {{\n{}\n  }}\n}}\n",
        std::process::id(),
        fields.join(",\n")
    );
    let tmp = path.with_extension("json.tmp");
    if let Some(d) = path.parent() {
        let _ = std::fs::create_dir_all(d);
    }
    if std::fs::write(&tmp, body).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// atexit hook of the process-wide transport: the final counters.
extern "C" fn dump_global_stats() {
    if let Some(Ok(t)) = current() {
        write_stats(&t.stats(), t.queued_bytes());
    }
}

impl TcpTransport {
    /// Starts a transport: binds the listener (unless `cfg.listen` is off)
    /// and the manager thread.
    pub fn start(cfg: TcpConfig) -> io::Result<TcpTransport> {
        let wants = cfg.listen;
        TcpTransport::start_with(cfg, wants)
    }

    /// As [`TcpTransport::start`]; `wants_port`: a transport started
    /// without a listener (`cfg.listen` off because the port was taken)
    /// takes the port once it is free (see [`Mgr::listen_tick`]).
    fn start_with(cfg: TcpConfig, wants_port: bool) -> io::Result<TcpTransport> {
        let opts = SockOpts { sndbuf: cfg.sndbuf, rcvbuf: cfg.rcvbuf };
        let wants_port = wants_port && cfg.port != 0;
        fork::install();
        let poller = Tracked::new(Poller::new()?);
        let doorbell = Tracked::new(EventFd::new()?);
        poller.add_level(doorbell.as_raw_fd(), DOORBELL)?;
        let mut listener = None;
        if cfg.listen {
            // Bound now (the port is ours), listening from the first bound
            // endpoint on: until then peers are refused, as a UDP port
            // nobody has opened, and their DML keeps the datagrams.
            listener = Some(Tracked::new(bind_port(&cfg, &opts)?));
        }
        let mut listen_st = ListenSt::default();
        if wants_port && listener.is_none() {
            listen_st.retry = Some((Instant::now() + LISTEN_RETRY_MIN, LISTEN_RETRY_MIN));
        }
        let mgr = Arc::new(Mgr {
            cfg,
            opts,
            poller,
            doorbell,
            stop: AtomicBool::new(false),
            gen: fork::generation(),
            listener: Mutex::new(listener),
            listening: AtomicBool::new(false),
            wants_port,
            listen_st: Mutex::new(listen_st),
            bound_once: AtomicBool::new(false),
            accept_paused: Mutex::new(None),
            conns: Mutex::new(HashMap::new()),
            lanes: Mutex::new(HashMap::new()),
            ports: Mutex::new(HashMap::new()),
            queued_total: AtomicUsize::new(0),
            pool: Mutex::new(Pools::default()),
            rbuf: Mutex::new(Vec::new()),
            next_token: AtomicU64::new(2),
            cc_warned: AtomicBool::new(false),
            cork_armed: AtomicBool::new(false),
            stats_written: Mutex::new(None),
            kernel_socks: Mutex::new(HashMap::new()),
            raw: OnceLock::new(),
            bound: Mutex::new(HashMap::new()),
            c: Counters::default(),
        });
        let m2 = mgr.clone();
        let thread = std::thread::Builder::new().name(fork::THREAD_NAME.into()).spawn(move || {
            crate::backend::kernel::block_async_signals();
            m2.run()
        })?;
        Ok(TcpTransport { mgr, thread: Mutex::new(Some(thread)) })
    }

    /// Waits (bounded by `timeout`) until this process's transport, if it
    /// has one, holds no queued datagram: what waits for a connection
    /// (one a fork child opens to its parent's listener, say) is written
    /// before the process ends (`_exit`). False: still queued. After a
    /// wait the final counters are written again: the transport's atexit
    /// hook, registered after the preload shim's, ran before this.
    ///
    /// Then the transport leaves its connections and the port in order
    /// ([`Mgr::leave`], bounded by [`EXIT_DRAIN`]), so that what peers
    /// wrote to it for other processes' ports is handed over, not lost.
    pub fn wait_global_sent(timeout: Duration) -> bool {
        let Some(Ok(t)) = current() else { return true };
        let end = Instant::now() + timeout;
        let mut sent = true;
        while t.queued_bytes() > 0 {
            if Instant::now() >= end {
                sent = false;
                break;
            }
            t.mgr.ring();
            std::thread::sleep(Duration::from_millis(1));
        }
        t.mgr.leave(end.saturating_duration_since(Instant::now()).min(EXIT_DRAIN));
        dump_global_stats();
        sent
    }

    /// The process-wide transport, from `EUDP_TCP_*` (see [`TcpConfig`]).
    /// When the pre-decided port is taken on this host (another UOE process
    /// listens), it runs without a listener, says so on stderr, and takes
    /// the port once it is free (`Mgr::listen_tick`).
    ///
    /// A fork child starts its own on first use: the one it inherited has
    /// no manager thread there, and its descriptors were given up at the
    /// fork (`fork.rs`). While the parent listens, the port is the
    /// parent's, so the child runs without a listener (replies reach it
    /// over the connections it opens, and datagrams for its ports through
    /// the listening process's hand-over to their kernel sockets, see
    /// `Mgr::forward`); once the parent is gone, the child's transport
    /// takes the port.
    pub fn global() -> io::Result<&'static TcpTransport> {
        // Before the start lock: a fork while it is held then resets it.
        fork::install();
        let Some(_init) = InitGuard::take() else {
            return current().expect("set before the start is released").as_ref().map_err(|&c| err(c));
        };
        if let Some(r) = current() {
            return r.as_ref().map_err(|&c| err(c));
        }
        // Before anything is bound: a fork from here on leaves the port to
        // this process (see `fork::Ancestor::listens`).
        let ancestor = fork::begin_start();
        let mut cfg = TcpConfig::from_env().unwrap_or_else(|e| {
            eprintln!("eudp: {e}; using tcp defaults");
            TcpConfig::default()
        });
        let defer = cfg.listen && ancestor.listens(cfg.port);
        if defer {
            // The ancestor's claim stays, for this process's children too.
            cfg.listen = false;
            ancestor.restore();
        } else {
            fork::claim_listener(cfg.port, cfg.listen);
        }
        let first = !GLOBAL_STARTED.swap(true, SeqCst);
        // A transport that defers or finds the port taken still wants it:
        // it takes the port once its holder has ended (`Mgr::listen_tick`).
        let r = match TcpTransport::start_with(cfg.clone(), cfg.listen || defer) {
            Ok(t) => Ok(t),
            Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) && cfg.listen => {
                if first {
                    eprintln!(
                        "eudp: tcp port {} is in use; this process will accept UOE connections once it is free",
                        cfg.port
                    );
                }
                TcpTransport::start_with(TcpConfig { listen: false, ..cfg }, true)
                    .map_err(|e| e.raw_os_error().unwrap_or(libc::EIO))
            }
            Err(e) => Err(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        if !defer && !r.as_ref().is_ok_and(|t| t.mgr.cfg.listen) {
            fork::claim_listener(cfg.port, false);
        }
        // atexit handlers are inherited across fork: one registration serves all.
        if first && r.is_ok() && stats_path().is_some() {
            sys::at_exit(dump_global_stats);
        }
        let g = GLOBAL.set(Global { gen: fork::generation(), t: r });
        g.t.as_ref().map_err(|&c| err(c))
    }

    /// The transport's settings.
    pub fn config(&self) -> &TcpConfig {
        &self.mgr.cfg
    }

    /// Where the listener is bound (None when not listening).
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        lock(&self.mgr.listener).as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Counters.
    pub fn stats(&self) -> TcpStats {
        self.mgr.c.snapshot()
    }

    /// Live connections.
    pub fn connections(&self) -> Vec<ConnInfo> {
        let conns: Vec<Arc<Conn>> = lock(&self.mgr.conns).values().cloned().collect();
        conns
            .iter()
            .map(|c| ConnInfo {
                peer: c.peer,
                inbound: c.inbound,
                lane: lock(&c.lane).as_ref().and_then(Weak::upgrade).map(|l| l.key.1),
                congestion: sys::congestion(c.fd()).unwrap_or_default(),
                nodelay: c.stream.nodelay().unwrap_or(false),
            })
            .collect()
    }

    /// Bytes waiting in user-space lane queues.
    pub fn queued_bytes(&self) -> usize {
        self.mgr.queued_total.load(SeqCst)
    }

    /// A backend socket for [`crate::Endpoint::with_backend`].
    pub fn socket(&self, v6: bool) -> io::Result<super::TcpSocket> {
        super::TcpSocket::new(self.mgr.clone(), v6)
    }

    /// An endpoint on `engine` over this transport.
    pub fn endpoint(&self, engine: &crate::Engine, v6: bool) -> io::Result<crate::Endpoint> {
        crate::Endpoint::with_backend(engine, Box::new(self.socket(v6)?))
    }

    /// A backend socket adopting an existing kernel UDP socket (which keeps
    /// reserving its port; its bound address and peer carry over).
    pub fn socket_from_kernel_fd(&self, fd: std::os::fd::OwnedFd) -> io::Result<super::TcpSocket> {
        super::TcpSocket::adopt(self.mgr.clone(), fd)
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

    /// Stops the manager, closes the listener and every connection, and
    /// drops what is queued. Sockets of this transport then fail with
    /// ENETDOWN.
    pub fn shutdown(&self) {
        let m = &self.mgr;
        if m.abandoned() {
            // Inherited across fork: its thread is not ours to join, and
            // its locks may be held by threads that do not exist here.
            if let Ok(mut t) = self.thread.try_lock() {
                std::mem::forget(t.take());
            }
            return;
        }
        m.stop.store(true, SeqCst);
        m.doorbell.set();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        if let Some(l) = lock(&m.listener).take() {
            m.poller.remove(l.as_raw_fd());
        }
        lock(&m.listen_st).retry = None;
        let lanes: Vec<Arc<Lane>> = lock(&m.lanes).drain().map(|(_, l)| l).collect();
        for lane in lanes {
            let mut st = lock(&lane.st);
            st.closed = true;
            st.retired = true;
            st.conn = None;
            let before = st.out.queued();
            st.out.clear();
            m.queued_total.fetch_sub(before, SeqCst);
            m.open_rooms(&mut st);
            lane.cv.notify_all();
        }
        let conns: Vec<Arc<Conn>> = lock(&m.conns).drain().map(|(_, c)| c).collect();
        for c in conns {
            m.poller.remove(c.fd());
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
            c.dead.store(true, SeqCst);
        }
    }
}

impl Drop for TcpTransport {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Mgr {
    pub(super) fn stopped(&self) -> bool {
        self.stop.load(Relaxed) || self.abandoned()
    }

    /// Inherited across fork: no manager thread here, its descriptors given
    /// up (`fork.rs`), its locks possibly held by threads that do not exist
    /// here. Nothing of it is touched again.
    pub(super) fn abandoned(&self) -> bool {
        self.gen != fork::generation()
    }

    fn ring(&self) {
        self.doorbell.set();
    }

    // ---- port registry (demultiplexing) ----

    pub(super) fn register_port(&self, addr: SocketAddr, q: &Arc<RxQueue>) -> io::Result<()> {
        {
            let mut p = lock(&self.ports);
            let v = p.entry(addr.port()).or_default();
            v.retain(|(_, w)| w.strong_count() > 0);
            v.push((norm_ip(addr.ip()), Arc::downgrade(q)));
        }
        self.start_listening(!self.bound_once.swap(true, SeqCst))
    }

    /// The first bound endpoint opens the pre-decided port for peers.
    ///
    /// Another process may have bound the port too while neither listened
    /// (both `SO_REUSEADDR`: a fork child whose parent's transport had not
    /// listened yet, say); the one that listens first keeps it, and the
    /// other runs without a listener, as when the bind itself fails, and
    /// takes the port once it is free ([`Mgr::listen_tick`]).
    /// `first`: no endpoint was bound before this one (a transport
    /// waiting for the port tries at once, not after its longest wait).
    fn start_listening(&self, first: bool) -> io::Result<()> {
        if self.listening.load(SeqCst) {
            return Ok(());
        }
        let mut guard = lock(&self.listener);
        if self.listening.load(SeqCst) {
            return Ok(());
        }
        if guard.is_none() {
            let mut st = lock(&self.listen_st);
            if let (true, Some(_)) = (first, st.retry) {
                st.retry = Some((Instant::now(), LISTEN_RETRY_MIN));
                drop(st);
                self.ring();
            }
            return Ok(());
        }
        // A fork child whose parent runs: the parent may have been about to
        // start its transport at the fork (another thread's first send), so
        // that it had not claimed the port yet (`fork::Ancestor`). Listening
        // first would take the port from it (see docs/tcp.md, "Fork"), so
        // the manager listens `PARENT_GRACE` later unless someone (the
        // parent) does first; the endpoint's bind does not wait for it.
        if fork::parent_runs() && self.wants_port {
            self.retry_listen(PARENT_GRACE);
            return Ok(());
        }
        if !self.listen_now(&mut guard)? {
            self.retry_listen(LISTEN_RETRY_MIN);
        }
        Ok(())
    }

    /// Listens on the bound socket in `slot`, or binds one first. False:
    /// another socket listens on the port (nothing is kept).
    fn listen_now(&self, slot: &mut Option<Tracked<Private<TcpListener>>>) -> io::Result<bool> {
        let in_use = |e: &io::Error| e.raw_os_error() == Some(libc::EADDRINUSE);
        if slot.is_none() {
            match bind_port(&self.cfg, &self.opts) {
                Ok(l) => *slot = Some(Tracked::new(l)),
                Err(e) if in_use(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        let Some(l) = slot.as_ref() else { return Ok(false) };
        if let Err(e) = sys::start_listening(l, 1024) {
            *slot = None;
            return if in_use(&e) { Ok(false) } else { Err(e) };
        }
        if let Err(e) = self.poller.add_level(l.as_raw_fd(), LISTENER) {
            *slot = None;
            return Err(e);
        }
        self.listening.store(true, SeqCst);
        Ok(true)
    }

    /// The port is wanted and not held: the manager tries to take it from
    /// `delay` on (an attempt already planned stays).
    fn retry_listen(&self, delay: Duration) {
        if !self.wants_port {
            return;
        }
        let mut st = lock(&self.listen_st);
        if st.retry.is_none() {
            st.retry = Some((Instant::now() + delay, LISTEN_RETRY_MIN));
            drop(st);
            self.ring();
        }
    }

    /// This transport is the process-wide one (whose claim on the port
    /// fork children inherit, see `fork.rs`).
    fn is_global(&self) -> bool {
        current().is_some_and(|r| r.as_ref().is_ok_and(|t| std::ptr::eq(&*t.mgr, self)))
    }

    /// Listener upkeep on the manager's timer; returns when it is due next.
    ///
    /// * Without a listener, while the port is wanted: an attempt to bind
    ///   and listen every 20 ms doubling to 1 s ([`LISTEN_RETRY_MAX`]), so
    ///   the port is taken at most about 1 s after its holder (another
    ///   process, or this one's parent) ended. Skipped while the holder
    ///   this process defers to still runs (`fork::claimed_elsewhere`), or
    ///   its parent waits for the port itself, and before the first
    ///   endpoint is bound (a listener listens from then on). Two
    ///   processes racing both bind (`SO_REUSEADDR`); the kernel lets one
    ///   `listen`. An attempt that finds the port held costs a socket, a
    ///   failing bind and a close.
    /// * A fork child that listens while its parent runs, the parent
    ///   having had no claim at the fork (it started its transport after
    ///   [`PARENT_GRACE`]), gives the port back once the parent's
    ///   transport waits for it (its manager thread's name), and leaves it
    ///   to the parent from then on: "the port stays the parent's". It
    ///   half-closes the connections it accepted, so that their peers
    ///   (the parent's lanes to its own host among them) connect again,
    ///   to the parent.
    fn listen_tick(&self, now: Instant) -> Option<Duration> {
        let leave = lock(&self.listen_st).leave;
        if leave != Leave::No {
            if leave == Leave::Asked {
                self.leave_now();
            }
            return None;
        }
        if !self.wants_port {
            return None;
        }
        let mut guard = lock(&self.listener);
        let mut st = lock(&self.listen_st);
        let port = self.cfg.port;
        if let Some(at) = st.provisional.filter(|_| self.listening.load(SeqCst)) {
            if at > now {
                return Some(at - now);
            }
            if !fork::parent_runs() {
                st.provisional = None;
            } else if fork::parent_waits_for_port() {
                drop((st, guard));
                self.give_back(now);
                return Some(LISTEN_RETRY_MIN);
            } else {
                st.provisional = Some(now + YIELD_CHECK);
                return Some(YIELD_CHECK);
            }
        }
        let (at, wait) = st.retry?;
        if self.listening.load(SeqCst) {
            st.retry = None;
            return None;
        }
        if at > now {
            return Some(at - now);
        }
        st.retry = Some((now + wait, (wait * 2).min(LISTEN_RETRY_MAX)));
        let parent = fork::parent_runs();
        let blocked = fork::claimed_elsewhere(port) || (parent && fork::parent_waits_for_port());
        let bound = self.bound_once.load(SeqCst);
        let took = !blocked && bound && self.listen_now(&mut guard).unwrap_or(false);
        if took {
            st.retry = None;
            if parent {
                st.provisional = Some(now + YIELD_CHECK);
            }
            if self.is_global() {
                fork::claim_own(port);
            }
            Counters::inc(&self.c.listen_takeovers);
        }
        // Named for other processes (a fork child holding the port looks).
        let waits = st.retry.is_some() && !blocked && bound;
        if waits != st.named_wait {
            st.named_wait = waits;
            sys::set_thread_name(if waits { fork::WAIT_NAME } else { fork::THREAD_NAME });
        }
        let next = match (st.retry, st.provisional) {
            (Some((at, _)), _) | (None, Some(at)) => Some(at.saturating_duration_since(now)),
            (None, None) => None,
        };
        drop((st, guard));
        if took {
            self.lanes_retry_now();
        }
        next
    }

    /// Gives the port back to the parent (see [`Mgr::listen_tick`]) and
    /// leaves it to the parent from then on.
    fn give_back(&self, now: Instant) {
        self.close_listener(Some((now + LISTEN_RETRY_MIN, LISTEN_RETRY_MIN)));
        if self.is_global() {
            fork::defer_to_parent(self.cfg.port);
        }
        Counters::inc(&self.c.listen_yields);
        // Its peers' connections too: each peer reads EOF, closes and
        // connects again (to the parent); what it wrote before is still
        // read here, and nothing is written here any more.
        let inbound: Vec<Arc<Conn>> = lock(&self.conns).values().filter(|c| c.inbound).cloned().collect();
        for c in inbound {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    /// The process ends: waits (up to `bound`) until the manager has
    /// left the port and every connection has ended ([`Mgr::leave_now`]).
    /// A peer may use a connection to this process for datagrams to
    /// other processes' ports on this host (its lanes to this host reach
    /// the listener, this process's; a fork child's or a send-only
    /// program's connection carries its peer's replies): what sits in
    /// such a connection unread when the process ends is lost, and the
    /// peer sees nothing of it (before: all 200 datagrams of a burst a
    /// parent sent itself through its child's listener as the child
    /// ended). Connections still open at the bound are counted
    /// (`exit_open_conns`). Runs once.
    fn leave(&self, bound: Duration) {
        if self.stopped() {
            return;
        }
        {
            let mut st = lock(&self.listen_st);
            if st.leave != Leave::No {
                return;
            }
            st.leave = Leave::Asked;
        }
        self.ring();
        let end = Instant::now() + bound;
        loop {
            let open = lock(&self.conns).len();
            if open == 0 && lock(&self.listen_st).leave == Leave::Done {
                return;
            }
            if Instant::now() >= end {
                Counters::add(&self.c.exit_open_conns, open as u64);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The manager's part of [`Mgr::leave`]: accepts the backlog (closing
    /// the listener would reset those connections), closes the listener
    /// (peers are refused and keep their datagrams queued until another
    /// process takes the port), and half-closes every connection. Each
    /// peer reads the end, stops writing on it and closes it; what it
    /// wrote before is still read here, delivered or handed over, until
    /// its end arrives and the connection closes as usual.
    fn leave_now(&self) {
        self.close_listener(None);
        let conns: Vec<Arc<Conn>> = lock(&self.conns).values().cloned().collect();
        for c in conns {
            if c.stream.peer_addr().is_err() {
                // Still connecting: nothing was written on it.
                self.close_conn(&c);
                continue;
            }
            // The manager reads it again (an endpoint's readers would not,
            // the program ending), and so sees the peer's end.
            self.revoke(&c);
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        lock(&self.listen_st).leave = Leave::Done;
    }

    /// Stops listening; the next attempt to take the port is `retry`.
    /// Connections waiting in the backlog are accepted and read first:
    /// closing the listener would reset them, and lose what their peers
    /// wrote on them.
    fn close_listener(&self, retry: Option<(Instant, Duration)>) {
        for tok in self.accept_all() {
            let conn = lock(&self.conns).get(&tok).cloned();
            if let Some(c) = conn {
                while self.read_conn(&c) {}
            }
        }
        let mut guard = lock(&self.listener);
        if let Some(l) = guard.take() {
            self.poller.remove(l.as_raw_fd());
        }
        self.listening.store(false, SeqCst);
        let mut st = lock(&self.listen_st);
        st.provisional = None;
        st.retry = retry;
    }

    /// This transport has just taken the port: its lanes refused meanwhile
    /// (its lanes to its own host among them) connect now, in this tick,
    /// not after their backoff (up to `retry_max`).
    fn lanes_retry_now(&self) {
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        for lane in lanes {
            let mut st = lock(&lane.st);
            if st.phase == Phase::Backoff && !st.plain {
                st.retry_at = None;
            }
        }
    }

    /// The endpoint on `addr` lets go of its port. With `hand_over` (the
    /// socket stays the program's, on the kernel path: a fallback), what
    /// readers delivered to its queue after the endpoint's last read, and
    /// what they deliver from now on, goes to the kernel socket
    /// ([`Mgr::forward`]) rather than into a queue nobody reads.
    pub(super) fn unregister_port(&self, addr: SocketAddr, q: &Arc<RxQueue>, hand_over: bool) {
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
    fn lookup(
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

    /// A kernel UDP socket that holds local port `port` (to send plain
    /// UDP from it).
    fn sender_of(&self, port: u16) -> Option<Arc<crate::backend::kernel::UdpSocket>> {
        let ports = lock(&self.ports);
        ports.get(&port)?.iter().filter_map(|(_, w)| w.upgrade()).find_map(|q| q.plain.get().and_then(Weak::upgrade))
    }

    /// Sends `items` to `ip` as plain UDP datagrams from `udp` (DML (c)),
    /// as the kernel path would: a full send buffer is waited on briefly,
    /// then the rest is dropped and counted. Returns the items taken (all,
    /// unless the first found the buffer full: `EAGAIN`).
    pub(super) fn send_plain(
        &self,
        udp: &crate::backend::kernel::UdpSocket,
        ip: IpAddr,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
    ) -> io::Result<usize> {
        use crate::backend::kernel::{poll_writable, OutMsg};
        let msgs: Vec<OutMsg<'_>> = items
            .iter()
            .map(|it| OutMsg { dst: Some(to_family(SocketAddr::new(ip, it.1), udp.is_v6())), iov: it.2, segment: None })
            .collect();
        let mut i = 0;
        let mut waited = false;
        while i < msgs.len() {
            match udp.send_batch(&msgs[i..]) {
                Ok(n) => {
                    i += n.max(1);
                    waited = false;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && i == 0 => return Err(e),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && !waited => {
                    waited = true;
                    let _ = poll_writable(udp.as_raw_fd(), Some(Duration::from_millis(20)));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if i == 0 && items.len() == 1 => return Err(e),
                Err(_) => {
                    // As a UDP send that fails: this datagram is lost.
                    Counters::inc(&self.c.plain_lost);
                    i += 1;
                    waited = false;
                }
            }
        }
        Counters::add(&self.c.plain_sent, i as u64);
        Ok(i)
    }

    /// DML (c): the lane's peer refused the UOE port. The datagrams waiting
    /// in the lane go out as plain UDP, each from its own source port's
    /// kernel socket, and so do later sends until a probe connects.
    fn go_plain(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        st.plain = true;
        let before = st.out.queued();
        if before == 0 {
            return;
        }
        let mut lost = 0u64;
        frame::each_queued(st.out.unwritten(), |src, dst, payload| {
            let iov = [IoSlice::new(payload)];
            let item = [(src, dst, &iov[..], payload.len())];
            let sent = self.sender_of(src).is_some_and(|u| {
                let r = self.send_plain(&u, lane.key.0, &item);
                if r.as_ref().is_err_and(|e| e.kind() == io::ErrorKind::WouldBlock) {
                    let _ = crate::backend::kernel::poll_writable(u.as_raw_fd(), Some(Duration::from_millis(20)));
                    return self.send_plain(&u, lane.key.0, &item).is_ok();
                }
                r.is_ok()
            });
            if !sent {
                lost += 1;
            }
        });
        Counters::add(&self.c.plain_lost, lost);
        st.out.clear();
        self.settle(lane, st, before);
    }

    // ---- kernel UDP sockets (input not carried by this transport) ----

    /// Watches an endpoint's kernel UDP socket `fd`: each arrival there
    /// (from a sender not on this transport, or handed over by
    /// [`Mgr::forward`] of the process that listens) wakes the endpoint's
    /// reader, which reads the socket too. Costs nothing while nothing
    /// arrives. Returns the token for [`Mgr::unwatch_kernel`].
    pub(super) fn watch_kernel(&self, fd: RawFd, q: &Arc<RxQueue>) -> io::Result<u64> {
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
    pub(super) fn unwatch_kernel(&self, fd: RawFd, tok: u64) {
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
    fn forward(&self, src: SocketAddr, local: IpAddr, dst: u16, payload: &[u8]) -> bool {
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

    // ---- lanes (send side) ----

    /// The lane for `(peer, idx)`, created on first use; None at the cap.
    pub(super) fn lane(&self, peer: IpAddr, idx: u8) -> io::Result<Option<Arc<Lane>>> {
        if self.stopped() {
            return Err(err(libc::ENETDOWN));
        }
        let key = (norm_ip(peer), idx);
        let mut lanes = lock(&self.lanes);
        if let Some(l) = lanes.get(&key) {
            return Ok(Some(l.clone()));
        }
        if lanes.len() >= self.cfg.max_conns {
            return Ok(None);
        }
        let l = Arc::new(Lane {
            key,
            st: Mutex::new(LaneSt {
                phase: Phase::Idle,
                conn: None,
                out: OutBuf::default(),
                attempts: 0,
                retry_at: None,
                fallback: false,
                was_up: false,
                waiters: 0,
                last_used: Instant::now(),
                retired: false,
                closed: false,
                corked_at: None,
                plain: false,
                rooms: Vec::new(),
            }),
            cv: Condvar::new(),
        });
        lanes.insert(key, l.clone());
        Ok(Some(l))
    }

    /// Lane index of a flow.
    pub(super) fn lane_index(&self, src: u16, dst: u16) -> u8 {
        let n = u32::from(self.cfg.conns_per_peer.max(1));
        if n == 1 {
            return 0;
        }
        let h = ((u32::from(src) << 16) | u32::from(dst)).wrapping_mul(0x9E37_79B1);
        ((h >> 16) % n) as u8
    }

    /// Queues datagrams `(src port, dst port, payload pieces, length)` on a
    /// lane and pushes them out. Returns how many were taken (sent, queued
    /// or dropped with a counter, as UDP would), or `WouldBlock` when a
    /// connected lane is full: `room` is then shut until the lane has the
    /// `room.need` bytes the send wanted ([`Mgr::shut_room`]), where the
    /// engine thread watches for it, and an application thread waits with
    /// [`Mgr::wait_room`] (through `Backend::wait_writable`), as a full
    /// kernel socket returns `EAGAIN` and its owner polls for `POLLOUT`.
    ///
    /// `whole`: the exclusive ends of messages (GSO-style runs from the
    /// engine) whose items are taken completely or not at all, as
    /// `sendmmsg` takes messages; the count returned then ends on a
    /// message boundary.
    pub(super) fn submit(
        &self,
        lane: &Arc<Lane>,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
        caller: Caller,
        whole: Option<&[usize]>,
        udp: &crate::backend::kernel::UdpSocket,
        room: &Arc<Room>,
    ) -> io::Result<usize> {
        let now = Instant::now();
        let mut st = lock(&lane.st);
        if st.closed || self.stopped() {
            return Err(err(libc::ENETDOWN));
        }
        if st.retired {
            return Err(err(libc::ESTALE)); // the caller fetches the lane again
        }
        st.last_used = now;
        if st.plain {
            // DML (c): the peer has no UOE. A lane that stopped probing
            // probes again now; until a probe connects, plain UDP.
            if st.phase == Phase::Idle {
                self.start_connect(lane, &mut st);
            }
            if st.plain {
                drop(st);
                return self.send_plain(udp, lane.key.0, items);
            }
        }
        let mut taken = 0;
        let mut i = 0;
        // Bytes queued by this call not yet added to `queued_total` (one
        // shared atomic update per call, not per datagram).
        let mut added = 0usize;
        if items.iter().any(|it| it.3 > MAX_PAYLOAD) && (whole.is_some() || items[0].3 > MAX_PAYLOAD) {
            return Err(err(libc::EMSGSIZE));
        }
        // The end of the message that item `i` starts (a datagram alone
        // unless `whole` groups it).
        let group_end =
            |i: usize| whole.and_then(|e| e.iter().copied().find(|&e| e > i)).unwrap_or(i + 1).min(items.len());
        // Items before this index belong to a message already admitted.
        let mut admitted = 0;
        // A streaming sender's datagrams are gathered in the queue instead
        // (one write per block, below).
        let cork = caller == Caller::Stream && !self.cfg.cork.is_zero();
        if st.phase == Phase::Up && st.out.queued() == 0 && !cork && items.iter().all(|it| it.3 <= MAX_PAYLOAD) {
            // Connected and nothing waits: write the frames straight from the
            // caller's buffers (no copy into the queue). What the socket does
            // not take is queued below as usual; so is the rest of a message
            // it took in part.
            i = self.write_direct(lane, &mut st, items, now, &mut added);
            taken = i;
            if i > 0 && whole.is_some() {
                admitted = group_end(i - 1);
            }
        }
        while i < items.len() {
            let (src, dst, parts, len) = items[i];
            if len > MAX_PAYLOAD {
                break;
            }
            // On a connected lane a whole message is admitted at once (the
            // engine retries what is not taken, so no part may be taken
            // twice); while unconnected, datagrams are queued or dropped one
            // by one and all count as taken.
            if i >= admitted {
                let atomic = whole.is_some() && st.phase == Phase::Up;
                let end = if atomic { group_end(i) } else { i + 1 };
                let size: usize = items[i..end].iter().map(|it| HEADER_LEN + it.3).sum();
                // The bound admits one datagram (or message) of any size into
                // an empty queue. On a connected lane the kernel's socket
                // buffer is the queue: a sender that finds it full gets
                // `WouldBlock` rather than copying megabytes into user space
                // for the manager to write later.
                let bound =
                    if st.phase == Phase::Up { self.cfg.queue_bytes.min(UP_QUEUE_BYTES) } else { self.cfg.queue_bytes };
                // So does the process-wide bound: a lane with nothing queued
                // may always queue one, or the other lanes' queues (a peer
                // that does not listen) would stop it for good.
                let total = self.cfg.total_queue_bytes;
                let fits = |q: usize, all: usize| q == 0 || (q + size <= bound && all + size <= total);
                if !fits(st.out.queued(), self.queued_total.load(Relaxed) + added) {
                    self.queued_total.fetch_add(std::mem::take(&mut added), Relaxed);
                    if st.phase == Phase::Up {
                        // Connected but the socket is full: push what we have;
                        // if that made no room, the caller waits for it.
                        let b = st.out.queued();
                        self.flush_lane(lane, &mut st);
                        self.settle_partial(&mut st, b);
                        if fits(st.out.queued(), self.queued_total.load(Relaxed)) {
                            continue;
                        }
                        Counters::inc(&self.c.backpressure_waits);
                        Self::shut_room(&mut st, room, size);
                        break;
                    }
                    // DML: the bounded queue is full while not connected.
                    Counters::inc(&self.c.drop_queue_full);
                    taken += 1;
                    i += 1;
                    continue;
                }
                admitted = end;
            }
            st.out.push(src, dst, parts, len, now);
            added += HEADER_LEN + len;
            taken += 1;
            i += 1;
        }
        self.queued_total.fetch_add(added, Relaxed);
        match st.phase {
            Phase::Up if cork && st.out.queued() < CORK_BYTES => {
                Counters::add(&self.c.coalesced_sends, taken as u64);
                if st.corked_at.is_none() && st.out.queued() > 0 {
                    st.corked_at = Some(now);
                    // Lane lock held: the manager's scan sees this lane or
                    // we see its disarm and ring.
                    if !self.cork_armed.swap(true, SeqCst) {
                        self.ring();
                    }
                }
            }
            Phase::Up => {
                if cork {
                    Counters::add(&self.c.coalesced_sends, taken as u64);
                }
                let b = st.out.queued();
                self.flush_lane(lane, &mut st);
                self.settle_partial(&mut st, b);
            }
            Phase::Idle => self.start_connect(lane, &mut st),
            Phase::Connecting | Phase::Backoff => {}
        }
        if matches!(caller, Caller::App | Caller::Stream)
            && self.cfg.dml == Dml::Block
            && st.phase != Phase::Up
            && !st.fallback
            && st.out.queued() > 0
        {
            // DML (b): block while the transport retries, then fall back to (a).
            Counters::inc(&self.c.block_waits);
            let dl = Instant::now() + self.cfg.block_timeout;
            while st.phase != Phase::Up && !st.closed {
                let left = dl.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    st.fallback = true;
                    Counters::inc(&self.c.block_timeouts);
                    break;
                }
                st.waiters += 1;
                st = lane.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
                st.waiters -= 1;
            }
        }
        if taken == 0 && !items.is_empty() {
            return Err(err(libc::EAGAIN));
        }
        Ok(taken)
    }

    /// A send of `room`'s socket found the lane full, wanting `need` bytes:
    /// shuts `room` and enrolls it (once; the smallest need counts), under
    /// the lane's lock, so the drain that makes the room opens it.
    fn shut_room(st: &mut LaneSt, room: &Arc<Room>, need: usize) {
        room.need.store(need, Relaxed);
        room.shut();
        st.rooms.retain(|(r, _)| r.strong_count() > 0);
        match st.rooms.iter_mut().find(|(r, _)| std::ptr::eq(r.as_ptr(), Arc::as_ptr(room))) {
            Some(e) => e.1 = e.1.min(need),
            None => st.rooms.push((Arc::downgrade(room), need)),
        }
    }

    /// Opens the enrolled rooms whose send would no longer find the lane
    /// full, by the test [`Mgr::wait_room`] makes (a lane not connected, or
    /// closed, takes or fails every send). Called wherever the lane's
    /// queue shrinks or its connection changes.
    fn open_rooms(&self, st: &mut LaneSt) {
        if st.rooms.is_empty() {
            return;
        }
        let q = st.out.queued();
        let all = st.closed || st.retired || st.phase != Phase::Up || q == 0;
        st.rooms.retain(|(r, need)| {
            if !all && !self.up_room(q, *need) {
                return r.strong_count() > 0;
            }
            if let Some(r) = r.upgrade() {
                r.open();
            }
            false
        });
    }

    /// The engine thread's send of `need` bytes was refused by `lane`:
    /// whether to wait for the room on the thread (true once it is there)
    /// rather than return `EAGAIN` for the endpoint to watch the room
    /// descriptor.
    ///
    /// The watch keeps a full lane from holding up the engine's other work,
    /// but on a lane to a peer that keeps up each refusal then costs the
    /// endpoint a watch and a wake-up through the engine's room set (a few
    /// syscalls) and splits its next send in two (the refused rest, then
    /// what its program queued meanwhile). Such a
    /// lane refuses every few megabytes and its room comes back within
    /// milliseconds, so while nothing else waits for the engine (no kicked
    /// endpoint, nothing ready in its epoll set: `engine::others_waiting`,
    /// looked at every [`ENGINE_WAIT_SLICE`]) it waits here, for at most
    /// [`ENGINE_WAIT`]. Work that comes meanwhile waits at most one slice;
    /// a stopped peer costs one such wait, after which its room is watched.
    pub(super) fn engine_wait(&self, lane: &Arc<Lane>, need: usize) -> bool {
        let start = Instant::now();
        let mut begun = false;
        loop {
            if crate::engine::others_waiting() != Some(false) {
                if begun {
                    Counters::inc(&self.c.engine_wait_yields);
                }
                return false;
            }
            if !std::mem::replace(&mut begun, true) {
                Counters::inc(&self.c.engine_waits);
            }
            let left = ENGINE_WAIT.saturating_sub(start.elapsed());
            if left.is_zero() {
                Counters::inc(&self.c.engine_wait_timeouts);
                return false;
            }
            if self.wait_room(lane, left.min(ENGINE_WAIT_SLICE), need) {
                return true;
            }
        }
    }

    /// Whether `need` more bytes fit a connected lane holding `q` (the test
    /// [`Mgr::submit`] makes): its own bound and the process-wide one. A
    /// lane that drains to empty always has room, so a wait on it ends even
    /// while other lanes hold the process-wide queue.
    fn up_room(&self, q: usize, need: usize) -> bool {
        q + need <= self.cfg.queue_bytes.min(UP_QUEUE_BYTES)
            && self.queued_total.load(Relaxed) + need <= self.cfg.total_queue_bytes
    }

    /// Waits at most `timeout` until a send on `lane` would not find it
    /// full: true when any datagram fits (or the lane is not connected, where
    /// the DML takes every datagram, or closed, where a send fails at once).
    ///
    /// `need`: the bytes the refused send wanted (a whole message may be
    /// larger than a datagram); 0 means room for a datagram of any size,
    /// as POLLOUT means room for one.
    pub(super) fn wait_room(&self, lane: &Arc<Lane>, timeout: Duration, need: usize) -> bool {
        let deadline = Instant::now() + timeout;
        let need = if need == 0 { HEADER_LEN + MAX_PAYLOAD } else { need };
        let mut st = lock(&lane.st);
        loop {
            let q = st.out.queued();
            let room = q == 0 || self.up_room(q, need);
            if st.closed || st.retired || st.phase != Phase::Up || room {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            // The manager's EPOLLOUT flush wakes waiters (`settle`).
            st.waiters += 1;
            st = lane.cv.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
            st.waiters -= 1;
        }
    }

    /// The direct path of [`Mgr::submit`]: one `sendmsg` of headers and
    /// payloads; returns the items taken (written, or partly written with
    /// the rest queued, adding the queued bytes to `added`). Consecutive
    /// datagrams of one size between the same ports (an engine run) go as
    /// one run (`frame::run_header`): one header, and payloads that a
    /// receiver reads contiguously.
    fn write_direct(
        &self,
        lane: &Arc<Lane>,
        st: &mut LaneSt,
        items: &[(u16, u16, &[IoSlice<'_>], usize)],
        now: Instant,
        added: &mut usize,
    ) -> usize {
        let Some(conn) = st.conn.clone() else { return 0 };
        // Units: (first item, end, header, header bytes); at most 1024
        // iovecs (IOV_MAX) per call.
        let mut units: Vec<(usize, usize, [u8; RUN_HEADER_LEN], usize)> = Vec::new();
        let mut n_iov = 0;
        let mut i = 0;
        while i < items.len() {
            let (src, dst, parts, len) = items[i];
            if n_iov + 1 + parts.len() > 1024 {
                break;
            }
            n_iov += 1 + parts.len();
            let mut j = i + 1;
            if len > 0 {
                while j < items.len()
                    && j - i < u16::MAX as usize
                    && (items[j].0, items[j].1, items[j].3) == (src, dst, len)
                    && n_iov + items[j].2.len() <= 1024
                {
                    n_iov += items[j].2.len();
                    j += 1;
                }
            }
            let mut h = [0u8; RUN_HEADER_LEN];
            let hl = if j - i > 1 {
                h = frame::run_header(src, dst, (j - i) as u16, len);
                RUN_HEADER_LEN
            } else {
                h[..HEADER_LEN].copy_from_slice(&frame::header(src, dst, len));
                HEADER_LEN
            };
            units.push((i, j, h, hl));
            i = j;
        }
        let mut iov: Vec<IoSlice<'_>> = Vec::with_capacity(n_iov);
        for (a, b, h, hl) in &units {
            iov.push(IoSlice::new(&h[..*hl]));
            for it in &items[*a..*b] {
                iov.extend_from_slice(it.2);
            }
        }
        loop {
            match sys::sendv_nosignal(conn.fd(), &iov) {
                Ok(w) => {
                    Counters::inc(&self.c.writes);
                    Counters::add(&self.c.bytes_sent, w as u64);
                    st.out.wrote_direct(w);
                    let mut left = w;
                    let mut taken = 0;
                    for (a, b, h, hl) in &units {
                        if left == 0 {
                            break;
                        }
                        let size: usize = hl + items[*a..*b].iter().map(|it| it.3).sum::<usize>();
                        taken = *b;
                        if left >= size {
                            left -= size;
                            Counters::add(&self.c.frames_sent, (b - a) as u64);
                            continue;
                        }
                        // Cut inside this unit: the rest of it is queued
                        // (a run cannot be cut into frames).
                        let len = items[*a].3.max(1);
                        let full = if b - a > 1 { left.saturating_sub(*hl) / len } else { 0 };
                        Counters::add(&self.c.frames_sent, full as u64);
                        let pieces = std::iter::once(&h[..*hl])
                            .chain(items[*a..*b].iter().flat_map(|it| it.2.iter().map(|p| &p[..])));
                        st.out.push_rest(pieces, left, (b - a - full) as u32, now);
                        *added += size - left;
                        break;
                    }
                    return taken;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return 0,
                Err(_) => {
                    self.detach(lane, st, &conn);
                    self.close_socket(&conn);
                    return 0;
                }
            }
        }
    }

    /// Accounts bytes that left the queue since it held `before` and wakes
    /// senders waiting for room.
    fn settle(&self, lane: &Lane, st: &mut LaneSt, before: usize) {
        self.settle_partial(st, before);
        if st.waiters > 0 {
            lane.cv.notify_all();
        }
    }

    fn settle_partial(&self, st: &mut LaneSt, before: usize) {
        let now = st.out.queued();
        if now < before {
            self.queued_total.fetch_sub(before - now, Relaxed);
        }
        self.open_rooms(st);
    }

    /// Writes what the lane holds to its connection until the socket is full.
    /// The caller accounts the bytes (`settle`).
    fn flush_lane(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        let Some(conn) = st.conn.clone() else { return };
        if st.phase != Phase::Up {
            return;
        }
        // What the socket does not take now is finished on EPOLLOUT.
        st.corked_at = None;
        loop {
            let data = st.out.unwritten();
            if data.is_empty() {
                break;
            }
            match sys::send_nosignal(conn.fd(), data) {
                Ok(n) => {
                    Counters::inc(&self.c.writes);
                    let f = st.out.advance(n);
                    Counters::add(&self.c.frames_sent, f);
                    Counters::add(&self.c.bytes_sent, n as u64);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.detach(lane, st, &conn);
                    self.close_socket(&conn);
                    break;
                }
            }
        }
    }

    /// Opens the lane's connection (nonblocking).
    fn start_connect(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        if st.closed {
            return;
        }
        if lock(&self.conns).len() >= self.cfg.max_conns {
            Counters::inc(&self.c.rejected_conns);
            self.connect_failed(st);
            return;
        }
        let dst = SocketAddr::new(lane.key.0, self.cfg.port);
        Counters::inc(&self.c.conns_opened);
        match sys::connect_start(&dst, self.cfg.bind_ip, &self.opts) {
            Ok((stream, done)) => {
                let conn = Conn::new(self.next_token.fetch_add(1, SeqCst), stream, dst, false);
                self.apply_opts(&conn);
                *lock(&conn.lane) = Some(Arc::downgrade(lane));
                lock(&self.conns).insert(conn.token, conn.clone());
                if self.poller.add_conn(conn.fd(), conn.token).is_err() {
                    lock(&self.conns).remove(&conn.token);
                    self.connect_failed(st);
                    return;
                }
                st.conn = Some(conn.clone());
                st.phase = Phase::Connecting;
                if done {
                    self.conn_up(lane, st, &conn);
                }
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::ECONNREFUSED) && self.cfg.dml == Dml::Udp {
                    self.go_plain(lane, st);
                }
                self.connect_failed(st)
            }
        }
    }

    fn connect_failed(&self, st: &mut LaneSt) {
        Counters::inc(&self.c.connect_failures);
        st.conn = None;
        st.attempts = st.attempts.saturating_add(1);
        st.phase = Phase::Backoff;
        let exp = self.cfg.retry_min.saturating_mul(1u32 << st.attempts.min(16).saturating_sub(1));
        st.retry_at = Some(Instant::now() + exp.min(self.cfg.retry_max));
        // The manager recomputes its timer.
        self.ring();
    }

    /// An outgoing connection completed: say hello, send what waits.
    fn conn_up(&self, lane: &Arc<Lane>, st: &mut LaneSt, conn: &Arc<Conn>) {
        match sys::send_nosignal(conn.fd(), &frame::hello(lane.key.1)) {
            Ok(frame::HELLO_LEN) => {}
            _ => {
                self.close_socket(conn);
                self.connect_failed(st);
                return;
            }
        }
        self.lane_up(lane, st);
    }

    fn lane_up(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        st.phase = Phase::Up;
        st.plain = false;
        st.attempts = 0;
        st.retry_at = None;
        st.fallback = false;
        if st.was_up {
            Counters::inc(&self.c.reconnects);
        }
        st.was_up = true;
        let b = st.out.queued();
        self.flush_lane(lane, st);
        self.settle_partial(st, b);
        // Wake DML (b) blockers and room waiters.
        lane.cv.notify_all();
    }

    /// `conn` no longer carries the lane: forget it, cut a half-written
    /// frame, and reconnect if datagrams wait.
    fn detach(&self, lane: &Arc<Lane>, st: &mut LaneSt, conn: &Arc<Conn>) {
        if !st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            return;
        }
        let b = st.out.queued();
        Counters::add(&self.c.lost_partial, st.out.discard_partial());
        self.settle_partial(st, b);
        st.conn = None;
        match st.phase {
            Phase::Connecting => self.connect_failed(st),
            _ => {
                st.phase = Phase::Idle;
                if st.out.queued() > 0 {
                    self.start_connect(lane, st);
                }
            }
        }
        self.open_rooms(st);
        lane.cv.notify_all();
    }

    /// Removes a connection from the epoll set and the table and shuts it.
    fn close_socket(&self, conn: &Arc<Conn>) {
        if conn.dead.swap(true, SeqCst) {
            return;
        }
        self.poller.remove(conn.fd());
        lock(&self.conns).remove(&conn.token);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        Counters::inc(&self.c.conns_closed);
    }

    /// Closes a connection and detaches it from its lane.
    fn close_conn(&self, conn: &Arc<Conn>) {
        self.revoke(conn);
        self.close_socket(conn);
        let lane = lock(&conn.lane).take().and_then(|w| w.upgrade());
        if let Some(lane) = lane {
            let mut st = lock(&lane.st);
            self.detach(&lane, &mut st, conn);
        }
    }

    fn apply_opts(&self, conn: &Conn) {
        let _ = conn.stream.set_nodelay(self.cfg.nodelay);
        if let Some(cc) = &self.cfg.congestion {
            if let Err(e) = sys::set_congestion(conn.fd(), cc) {
                Counters::inc(&self.c.cc_errors);
                if !self.cc_warned.swap(true, SeqCst) {
                    eprintln!("eudp: TCP_CONGESTION {cc:?} not available ({e}); using the system default");
                }
            }
        }
        if !self.cfg.user_timeout.is_zero() {
            let ms = self.cfg.user_timeout.as_millis().min(i32::MAX as u128) as i32;
            let _ = sys::set_int_opt(conn.fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms);
        }
    }

    // ---- the manager thread ----

    fn run(self: Arc<Self>) {
        let mut events: Vec<(u64, u32)> = Vec::with_capacity(128);
        let mut again: Vec<u64> = Vec::new();
        let mut next_tick = Instant::now();
        // Latency profile: after activity, poll without sleeping this long
        // (EUDP_TCP_SPIN_US), so an arrival costs no manager wake-up.
        let spin = self.cfg.spin;
        let mut busy_until = Instant::now();
        while !self.stopped() {
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + self.tick(now);
            }
            let mut timeout = if !again.is_empty() || (!spin.is_zero() && now < busy_until) {
                Duration::ZERO
            } else {
                next_tick.saturating_duration_since(now)
            };
            if self.cork_armed.load(SeqCst) {
                if let Some(d) = self.flush_corked(now) {
                    timeout = timeout.min(d);
                }
            }
            let r = self.poller.wait(&mut events, Some(timeout));
            if !spin.is_zero() && (!events.is_empty() || !again.is_empty()) {
                busy_until = Instant::now() + spin;
            }
            if let Err(e) = r {
                eprintln!("eudp: uoe epoll_wait failed: {e}");
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut work: Vec<(u64, u32)> = again.drain(..).map(|t| (t, EV_IN)).collect();
            work.extend(events.iter().copied());
            for (tok, flags) in work {
                match tok {
                    DOORBELL => {
                        self.doorbell.clear();
                        next_tick = Instant::now();
                    }
                    LISTENER => again.extend(self.accept_all()),
                    _ => {
                        let conn = lock(&self.conns).get(&tok).cloned();
                        if let Some(conn) = conn {
                            if self.conn_event(&conn, flags) {
                                again.push(tok);
                            }
                        } else if let Some(q) = lock(&self.kernel_socks).get(&tok).and_then(Weak::upgrade) {
                            q.kernel_ready();
                        }
                    }
                }
            }
        }
    }

    /// Writes coalesced datagrams that waited `cfg.cork`; returns the time
    /// until the next lane is due (None: nothing is coalesced, timer off).
    fn flush_corked(&self, now: Instant) -> Option<Duration> {
        // Disarm before the scan: a lane corked after its scan re-arms and rings.
        self.cork_armed.store(false, SeqCst);
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        let mut next: Option<Duration> = None;
        for lane in lanes {
            let mut st = lock(&lane.st);
            let Some(t) = st.corked_at else { continue };
            let due = t + self.cfg.cork;
            if due <= now {
                Counters::inc(&self.c.cork_timer_flushes);
                let b = st.out.queued();
                self.flush_lane(&lane, &mut st);
                self.settle(&lane, &mut st, b);
            } else {
                next = Some(next.map_or(due - now, |n: Duration| n.min(due - now)));
            }
        }
        if next.is_some() {
            self.cork_armed.store(true, SeqCst);
        }
        next
    }

    /// Handles readiness of one connection; true when it may hold more input.
    fn conn_event(&self, conn: &Arc<Conn>, flags: u32) -> bool {
        let lane = lock(&conn.lane).as_ref().and_then(Weak::upgrade);
        if let Some(lane) = &lane {
            let mut st = lock(&lane.st);
            let mine = st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn));
            if mine && st.phase == Phase::Connecting {
                if flags & (EV_OUT | EV_ERR) == 0 {
                    return false;
                }
                let error = conn.stream.take_error();
                let failed = !matches!(error, Ok(None)) || conn.stream.peer_addr().is_err();
                if failed {
                    self.close_socket(conn);
                    *lock(&conn.lane) = None;
                    if self.cfg.dml == Dml::Udp
                        && matches!(&error, Ok(Some(e)) if e.raw_os_error() == Some(libc::ECONNREFUSED))
                    {
                        self.go_plain(lane, &mut st);
                    }
                    self.connect_failed(&mut st);
                    return false;
                }
                self.conn_up(lane, &mut st, conn);
            } else if mine && flags & EV_OUT != 0 {
                let b = st.out.queued();
                self.flush_lane(lane, &mut st);
                self.settle(lane, &mut st, b);
            }
        }
        if flags & (EV_IN | EV_ERR) != 0 && !conn.dead.load(SeqCst) {
            let more = self.read_conn(conn);
            // The peer's FIN came with this edge's data: the short read
            // took the data, and no later edge reports the end, so one
            // more read sees it (before, such a connection stayed open and
            // took frames until the peer's reset).
            if !more && flags & sys::EV_RDHUP != 0 && !conn.dead.load(SeqCst) {
                return self.read_conn(conn);
            }
            return more;
        }
        false
    }

    /// Reads and delivers; closes the connection on EOF, error or bad input.
    fn read_conn(&self, conn: &Arc<Conn>) -> bool {
        if conn.delegated.load(SeqCst) {
            // Its endpoint's readers read it; input after an idle spell
            // restarts the manager's watch.
            self.input_arrived(conn);
            return false;
        }
        let mut dec = lock(&conn.rx);
        // One read buffer for all connections (only this thread reads).
        let mut rbuf = lock(&self.rbuf);
        if rbuf.len() < READ_CHUNK {
            rbuf.resize(READ_CHUNK, 0);
        }
        let mut pools = lock(&self.pool);
        let mut budget = READ_BUDGET;
        loop {
            let (step, only) = self.read_step(conn, &mut dec, &mut rbuf, &mut pools, None, SCATTER_BLOCKS);
            let n = match step {
                Step::Closed => {
                    drop((dec, rbuf, pools));
                    self.close_conn(conn);
                    return false;
                }
                Step::Again => continue,
                Step::Drained(n) | Step::Full(n) => n,
            };
            if let Some(q) = only.filter(|_| self.cfg.rx_direct) {
                // Reads to one and the same endpoint: a stalled endpoint's
                // reads must not count for another's first one.
                let id = Arc::as_ptr(&q) as usize;
                let run = if conn.bulk_q.swap(id, Relaxed) == id {
                    conn.bulk.fetch_add(1, Relaxed) + 1
                } else {
                    conn.bulk.store(1, Relaxed);
                    1
                };
                if run >= DELEGATE_AFTER && self.delegate(conn, &q) {
                    return false;
                }
            } else {
                conn.bulk.store(0, Relaxed);
            }
            budget = budget.saturating_sub(n);
            match step {
                // Short read: the socket is drained; any later arrival (or
                // FIN) raises a new edge-triggered event.
                Step::Drained(_) => return false,
                _ if budget == 0 => return true,
                _ => {}
            }
        }
    }

    /// One read of `conn`, delivered (`quiet`: the queue whose reader reads,
    /// not signalled). Also returns the queue every frame went to in place,
    /// if there was one (a bulk flow to one endpoint).
    fn read_step(
        &self,
        conn: &Arc<Conn>,
        dec: &mut Decoder,
        rbuf: &mut [u8],
        pools: &mut Pools,
        quiet: Option<&RxQueue>,
        blocks: usize,
    ) -> (Step, Option<Arc<RxQueue>>) {
        let mut out = Deliver {
            mgr: self,
            conn,
            pools,
            cache: None,
            batch: Vec::new(),
            frames: 0,
            bytes: 0,
            frames_seen: 0,
            quiet,
            first: None,
            mixed: false,
        };
        let r = match self.scatter_plan(dec, conn) {
            Some(plan) => self.read_in_place(conn, dec, rbuf, plan, &mut out, blocks),
            None => {
                // An endpoint's reader reads no more than its queue holds
                // (a frame costs at most RX_MAX_RATIO times its wire bytes);
                // the manager reads for every endpoint at once.
                let lim = quiet.map_or(rbuf.len(), |q| (q.room() / RX_MAX_RATIO).clamp(PLAIN_MIN, rbuf.len()));
                match (&*conn.stream).read(&mut rbuf[..lim]) {
                    Ok(0) => Ok((0, lim)),
                    Ok(n) => out.feed(dec, &rbuf[..n]).map(|_| (n, lim)).map_err(ReadErr::Frame),
                    Err(e) => Err(ReadErr::Io(e)),
                }
            }
        };
        out.flush();
        // Every frame of this read went to one endpoint: a bulk flow read in
        // place, or a request/response flow of small datagrams (whose
        // endpoint, once it reads the connection itself, is woken by the
        // connection directly: no manager wake-up and hand-over per message).
        let only = if !out.mixed && out.frames_seen > 0 { out.first.take() } else { None };
        drop(out);
        pools.trim();
        let step = match r {
            Ok((0, _)) => {
                if dec.pending() > 0 {
                    Counters::inc(&self.c.lost_partial);
                }
                Step::Closed
            }
            Ok((n, room)) if n < room => Step::Drained(n),
            Ok((n, _)) => Step::Full(n),
            Err(ReadErr::Frame(e)) => {
                Counters::inc(match e {
                    FrameError::BadHello => &self.c.bad_hello,
                    FrameError::Oversized => &self.c.oversized,
                    FrameError::Malformed => &self.c.malformed,
                });
                Step::Closed
            }
            Err(ReadErr::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => Step::Drained(0),
            Err(ReadErr::Io(e)) if e.kind() == io::ErrorKind::Interrupted => Step::Again,
            Err(ReadErr::Io(_)) => Step::Closed,
        };
        (step, only)
    }

    /// Hands `conn` to the readers of `q`, the endpoint all of its recent
    /// reads went to: its receiving thread (or its engine, while no thread
    /// receives) reads the connection itself in `recv_batch`, woken through
    /// `q.poll`, and the manager keeps only the connection's writes. This
    /// takes the manager's wake-up and the hand-over off the path of a
    /// bulk flow. Frames for other endpoints are still delivered to them,
    /// and the first such read gives the connection back ([`Mgr::revoke`]).
    /// The manager keeps watching that the endpoint reads
    /// ([`Mgr::watch_owned`]); one that stopped gets none until it receives
    /// again.
    fn delegate(&self, conn: &Arc<Conn>, q: &Arc<RxQueue>) -> bool {
        if q.stalled.load(SeqCst) {
            return false;
        }
        let mut owner = lock(&conn.owner);
        let mut owned = lock(&q.owned);
        if owned.is_some() || conn.dead.load(SeqCst) || q.poll.add_level(conn.fd(), 1).is_err() {
            return false;
        }
        if self.poller.conn_out_only(conn.fd(), conn.token).is_err() {
            q.poll.remove(conn.fd());
            return false;
        }
        *owned = Some(conn.clone());
        *owner = Owner {
            q: Some(Arc::downgrade(q)),
            reads: conn.direct_reads.load(SeqCst),
            since: Instant::now(),
            armed: false,
        };
        conn.delegated.store(true, SeqCst);
        Counters::inc(&self.c.rx_delegations);
        // The next tick comes soon and starts the watch.
        self.ring();
        // Input already waiting on the connection needs no wake-up of its
        // own: the connection just joined `q.poll` level-triggered, and an
        // epoll set that gains a ready descriptor wakes its waiters. Frames
        // already queued have signalled when they were pushed; a wake-up
        // with nothing queued would leave the readiness flag up with
        // nothing to read until the next receive (seen as a spurious event
        // in `udp_surface`'s `epoll_dup` under load).
        let mut i = lock(&q.inner);
        if !i.signalled && !i.items.is_empty() {
            i.signalled = true;
            q.ready.set();
        }
        true
    }

    /// The manager reads `conn` again (its owner went away, other endpoints
    /// have frames on it, or it closes).
    fn revoke(&self, conn: &Arc<Conn>) {
        self.revoke_locked(conn, &mut lock(&conn.owner));
    }

    /// [`Mgr::revoke`] with `conn.owner` held.
    fn revoke_locked(&self, conn: &Arc<Conn>, owner: &mut Owner) {
        owner.armed = false;
        if let Some(q) = owner.q.take().and_then(|w| w.upgrade()) {
            let mut owned = lock(&q.owned);
            if owned.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
                *owned = None;
                q.poll.remove(conn.fd());
            }
        }
        conn.bulk.store(0, Relaxed);
        if conn.delegated.swap(false, SeqCst) && !conn.dead.load(SeqCst) {
            // Reports input that already waits, so nothing is stranded.
            let _ = self.poller.conn_all(conn.fd(), conn.token);
        }
    }

    /// The manager's watch on a delegated connection (each tick, every
    /// `cfg.rx_stall / 2` while one is delegated): its endpoint's program
    /// may stop receiving (its engine stops reading once its ring is
    /// full), and then nobody would read the connection, and every flow
    /// sharing it would wait. When the endpoint has made no read for
    /// `cfg.rx_stall` while input waits, the manager takes the connection
    /// back: it reads it for every endpoint again and drops what the full
    /// queue cannot take (`drop_rx_full`), as a full UDP socket does.
    /// Reads are counted per connection, so a busy endpoint costs this
    /// watch no syscall; a connection found idle is watched by the epoll
    /// set instead (no tick while nothing arrives). Returns whether this
    /// connection needs the next tick.
    fn watch_owned(&self, conn: &Arc<Conn>, now: Instant) -> bool {
        let mut owner = lock(&conn.owner);
        if !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) || owner.armed {
            return false;
        }
        let reads = conn.direct_reads.load(SeqCst);
        if reads != owner.reads {
            (owner.reads, owner.since) = (reads, now);
            return true;
        }
        if now.saturating_duration_since(owner.since) < self.cfg.rx_stall {
            return true;
        }
        if sys::input_waits(conn.fd()) {
            if let Some(q) = owner.q.as_ref().and_then(Weak::upgrade) {
                q.stalled.store(true, SeqCst);
            }
            Counters::inc(&self.c.rx_stall_revokes);
            // The manager reads what waits (the revoke reports it) after
            // any read of the endpoint still under way: both take the
            // connection's decoder lock, so no frame is split or reordered.
            self.revoke_locked(conn, &mut owner);
            return false;
        }
        // Idle: the next arrival is reported (at once if one came since the
        // look above), and restarts the watch (`Mgr::input_arrived`).
        if self.poller.conn_all(conn.fd(), conn.token).is_ok() {
            owner.armed = true;
            return false;
        }
        true
    }

    /// Input on a delegated connection whose watch was idle: its endpoint
    /// has `cfg.rx_stall` from now to read it. The manager's epoll set
    /// goes back to write readiness only (no wake-up per arrival).
    fn input_arrived(&self, conn: &Arc<Conn>) {
        let mut owner = lock(&conn.owner);
        if !owner.armed || !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) {
            return;
        }
        if self.poller.conn_out_only(conn.fd(), conn.token).is_ok() {
            (owner.armed, owner.reads, owner.since) = (false, conn.direct_reads.load(SeqCst), Instant::now());
            drop(owner);
            // Its next tick comes within the watch's period.
            self.ring();
        }
    }

    /// A reader of `q` reads the connection handed to it (one read of at
    /// most `blocks` receive blocks, about what the caller takes at once),
    /// unless another reader is at it.
    pub(super) fn read_owned(&self, q: &Arc<RxQueue>, blocks: usize) {
        if self.abandoned() {
            return;
        }
        let Some(conn) = lock(&q.owned).clone() else { return };
        let Ok(mut dec) = conn.rx.try_lock() else { return };
        if !conn.delegated.load(SeqCst) || conn.dead.load(SeqCst) {
            return;
        }
        conn.direct_reads.fetch_add(1, Relaxed);
        let mut ctx = lock(&q.rd);
        let RdCtx { rbuf, pools } = &mut *ctx;
        if rbuf.len() < READ_CHUNK {
            rbuf.resize(READ_CHUNK, 0);
        }
        Counters::inc(&self.c.rx_direct_reads);
        let (step, only) = self.read_step(&conn, &mut dec, rbuf, pools, Some(q), blocks.clamp(1, SCATTER_BLOCKS));
        drop((dec, ctx));
        match step {
            Step::Closed => self.close_conn(&conn),
            // Frames for another endpoint (or a break in the pattern): the
            // manager reads this connection again.
            Step::Drained(n) | Step::Full(n) if n > 0 && !only.as_ref().is_some_and(|o| Arc::ptr_eq(o, q)) => {
                self.revoke(&conn)
            }
            _ => {}
        }
    }

    /// The frames that follow are guessed to repeat the last ones (a bulk
    /// flow: the rest of the current run, then runs like the last one, or
    /// frames like the last one): when those are large enough to be
    /// packed for an endpoint that packs, they may be read straight into
    /// blocks.
    fn scatter_plan(&self, dec: &Decoder, conn: &Conn) -> Option<Plan> {
        let need = dec.need()?;
        let ((src, dst, len), left) = match dec.in_run() {
            // The cut unit (if any) is one of the run's datagrams.
            Some((s, d, seg, l)) => ((s, d, seg), l as usize - usize::from(need > 0)),
            None => (dec.last_frame()?, 0),
        };
        if !(PACK_MIN..=BIG_BUF).contains(&len) {
            return None;
        }
        let q = Self::lookup(&lock(&self.ports), dst, conn.local_ip, SocketAddr::new(conn.peer.ip(), src)).0?;
        if !q.gro.load(Relaxed) {
            return None;
        }
        let room = q.room();
        Some(Plan { src, dst, len, left, runs: dec.last_run(), need, room })
    }

    /// One `readv` laid out for the guessed stream: the rest of a cut unit
    /// into `rbuf`, then each header into a small array and the payloads
    /// into their places in blocks (a run's payloads contiguously, one
    /// iovec per block). Payloads that arrive where the guess put them are
    /// handed over in their blocks without a copy; anything else (the first
    /// unexpected header on, a datagram cut by the end of the read) goes
    /// through the decoder as usual. Returns (bytes read, bytes the read
    /// could take).
    fn read_in_place(
        &self,
        conn: &Conn,
        dec: &mut Decoder,
        rbuf: &mut [u8],
        plan: Plan,
        out: &mut Deliver<'_>,
        blocks: usize,
    ) -> Result<(usize, usize), ReadErr> {
        let len = plan.len;
        let per_block = BIG_BUF / len;
        let nblocks = blocks_for(len, blocks, plan.room);
        let slots = nblocks * per_block;
        let mut blocks: Vec<Vec<u8>> = (0..nblocks).map(|_| out.pools.block()).collect();
        // The layout: a header (its bytes) or `k` payload slots from slot `s`,
        // never across a block's end.
        enum Ent {
            Hdr([u8; RUN_HEADER_LEN], usize),
            Pay(usize, usize),
        }
        let mut ents: Vec<Ent> = Vec::new();
        let mut s = 0;
        let pays = |ents: &mut Vec<Ent>, s: &mut usize, mut k: usize| {
            while k > 0 && *s < slots {
                let n = k.min(per_block - *s % per_block);
                ents.push(Ent::Pay(*s, n));
                *s += n;
                k -= n;
            }
        };
        pays(&mut ents, &mut s, plan.left);
        while s < slots {
            match plan.runs {
                Some(c) => {
                    ents.push(Ent::Hdr(frame::run_header(plan.src, plan.dst, c, len), RUN_HEADER_LEN));
                    pays(&mut ents, &mut s, c as usize);
                }
                None => {
                    let mut h = [0u8; RUN_HEADER_LEN];
                    h[..HEADER_LEN].copy_from_slice(&frame::header(plan.src, plan.dst, len));
                    ents.push(Ent::Hdr(h, HEADER_LEN));
                    pays(&mut ents, &mut s, 1);
                }
            }
        }
        let mut hdrs: Vec<[u8; RUN_HEADER_LEN]> =
            vec![[0u8; RUN_HEADER_LEN]; ents.iter().filter(|e| matches!(e, Ent::Hdr(..))).count()];
        // No spare room after the slots: a fuller socket is read again in
        // place rather than into `rbuf` (which would cost a copy).
        let head = &mut rbuf[..plan.need];
        let room =
            plan.need + slots * len + ents.iter().map(|e| if let Ent::Hdr(_, l) = e { *l } else { 0 }).sum::<usize>();
        let n = {
            let mut iov: Vec<IoSliceMut<'_>> = Vec::with_capacity(1 + ents.len());
            iov.push(IoSliceMut::new(head));
            let mut hs = hdrs.iter_mut();
            let mut bs = blocks.iter_mut();
            let mut cur: &mut [u8] = &mut [];
            for e in &ents {
                match *e {
                    Ent::Hdr(_, l) => iov.push(IoSliceMut::new(&mut hs.next().expect("one array per header")[..l])),
                    Ent::Pay(at, k) => {
                        if at % per_block == 0 {
                            cur = &mut bs.next().expect("one block per per_block slots")[..per_block * len];
                        }
                        let (a, rest) = std::mem::take(&mut cur).split_at_mut(k * len);
                        cur = rest;
                        iov.push(IoSliceMut::new(a));
                    }
                }
            }
            match (&*conn.stream).read_vectored(&mut iov) {
                Ok(n) => n,
                Err(e) => {
                    blocks.into_iter().for_each(|b| out.pools.big.push(b));
                    return Err(ReadErr::Io(e));
                }
            }
        };
        let mut rest = n;
        let first = rest.min(plan.need);
        out.feed(dec, &rbuf[..first]).map_err(ReadErr::Frame)?;
        rest -= first;
        // Payloads in place, while the stream goes as guessed: an expected
        // header (read whole) goes through the decoder, and the decoder
        // must then expect a datagram of `len` bytes between these ports.
        let mut good: usize = 0;
        // Where the rest of the read starts: (entry, slots of it in place).
        let mut stop = (ents.len(), 0);
        let mut hi = 0;
        'walk: for (i, e) in ents.iter().enumerate() {
            match e {
                Ent::Hdr(want, l) => {
                    if rest < *l || hdrs[hi][..*l] != want[..*l] {
                        stop = (i, 0);
                        break;
                    }
                    out.feed(dec, &hdrs[hi][..*l]).map_err(ReadErr::Frame)?;
                    rest -= l;
                    hi += 1;
                }
                Ent::Pay(_, k) => {
                    for j in 0..*k {
                        if rest < len || dec.take_in_place(len) != Some((plan.src, plan.dst)) {
                            stop = (i, j);
                            break 'walk;
                        }
                        rest -= len;
                        good += 1;
                    }
                }
            }
        }
        // What follows them, in stream order (an unexpected header, or a
        // datagram cut by the end of the read): where its bytes are.
        let mut segs: Vec<(At, usize, usize)> = Vec::new();
        let mut left = rest;
        let mut hi = ents[..stop.0].iter().filter(|e| matches!(e, Ent::Hdr(..))).count();
        for (i, e) in ents.iter().enumerate().skip(stop.0) {
            if left == 0 {
                break;
            }
            match e {
                Ent::Hdr(_, l) => {
                    let k = (*l).min(left);
                    segs.push((At::Arr(hi), 0, k));
                    left -= k;
                    hi += 1;
                }
                Ent::Pay(at, k) => {
                    let skip = if i == stop.0 { stop.1 } else { 0 };
                    let (b, o) = ((at + skip) / per_block, (at + skip) % per_block * len);
                    let m = ((k - skip) * len).min(left);
                    segs.push((At::Blk(b), o, m));
                    left -= m;
                }
            }
        }
        debug_assert_eq!(left, 0);
        let rd = Scattered::new(&segs);
        // Repair: as long as the rest is made of runs (or frames) of the
        // guessed kind, only cut differently (a run count other than the
        // guess), each header goes through the decoder and each datagram is
        // moved to the next free slot (one copy; its bytes only shifted by
        // the headers the guess did not foresee). The first unit of another
        // kind, a datagram cut by the end of the read, or the end of the
        // slots stops it; the bytes from there go through the decoder.
        let mut moves: Vec<(usize, usize, bool)> = Vec::new();
        let mut p = 0;
        let mut slot = good;
        while p < rest {
            let avail = rest - p;
            if let Some((s, d, seg, _)) = dec.in_run() {
                if (s, d, seg) != (plan.src, plan.dst, len) || avail < len || slot >= slots {
                    break;
                }
                let Some(fwd) = rd.direction(p, len, slot, per_block) else { break };
                if dec.take_in_place(len).is_none() {
                    break;
                }
                moves.push((p, slot, fwd));
                p += len;
                slot += 1;
                continue;
            }
            let mut h = [0u8; RUN_HEADER_LEN];
            if avail < HEADER_LEN {
                break;
            }
            rd.copy_to(&hdrs, &blocks, p, &mut h[..HEADER_LEN]);
            let (s, d, l) =
                (u16::from_be_bytes([h[0], h[1]]), u16::from_be_bytes([h[2], h[3]]), u16::from_be_bytes([h[4], h[5]]));
            if (s, d) != (plan.src, plan.dst) {
                break;
            }
            let hl = if l == frame::RUN_MARK {
                if avail < RUN_HEADER_LEN {
                    break;
                }
                rd.copy_to(&hdrs, &blocks, p, &mut h);
                if usize::from(u16::from_be_bytes([h[8], h[9]])) != len {
                    break;
                }
                RUN_HEADER_LEN
            } else {
                if usize::from(l) != len
                    || avail < HEADER_LEN + len
                    || slot >= slots
                    || rd.direction(p + HEADER_LEN, len, slot, per_block).is_none()
                {
                    break;
                }
                HEADER_LEN
            };
            out.feed(dec, &h[..hl]).map_err(ReadErr::Frame)?;
            p += hl;
            if hl == HEADER_LEN {
                if dec.take_in_place(len) != Some((plan.src, plan.dst)) {
                    // Unreachable for a well-formed header; the decoder
                    // keeps it and takes the payload below.
                    break;
                }
                let fwd = rd.direction(p, len, slot, per_block).expect("checked before the header was fed");
                moves.push((p, slot, fwd));
                p += len;
                slot += 1;
            }
        }
        // The rest is gathered before the moves overwrite its bytes.
        let mut spill: Vec<u8> = Vec::new();
        if p < rest {
            spill.resize(rest - p, 0);
            rd.copy_to(&hdrs, &blocks, p, &mut spill);
        }
        rd.move_all(&hdrs, &mut blocks, &moves, len, per_block);
        let filled = slot;
        let from = SocketAddr::new(conn.peer.ip(), plan.src);
        for (b, buf) in blocks.into_iter().enumerate() {
            let k = filled.saturating_sub(b * per_block).min(per_block);
            if k == 0 {
                out.pools.big.push(buf);
            } else {
                out.block(plan.dst, RxItem { buf, len: k * len, seg: len, n: k, src: from, big: true });
            }
        }
        if good > 0 {
            Counters::add(&self.c.frames_in_place, good as u64);
        }
        if !moves.is_empty() {
            Counters::add(&self.c.frames_shifted, moves.len() as u64);
        }
        out.feed(dec, &spill).map_err(ReadErr::Frame)?;
        Ok((n, room))
    }

    /// An accepted connection said hello: replies to that peer may use it
    /// (the paper's "connection previously established between the nodes")
    /// when the lane has no connection of its own.
    ///
    /// Not a connection from this host (its source address is the one it
    /// came to; a connection to a local address gets that as its
    /// source): it comes from another process here (a fork child, a
    /// send-only program), while the host's listener is this process,
    /// which a lane reaches by connecting. Taken as the lane, it made
    /// this process's datagrams to its own ports go through that
    /// process's hand-over, and what was on the way when it ended or
    /// stopped was lost (docs/tcp.md, "Fork").
    fn attach_inbound(&self, conn: &Arc<Conn>, idx: u8) {
        if conn.peer.ip() == conn.local_ip {
            return;
        }
        let Ok(Some(lane)) = self.lane(conn.peer.ip(), idx) else { return };
        let mut st = lock(&lane.st);
        if st.conn.is_none() && matches!(st.phase, Phase::Idle | Phase::Backoff) && !st.closed {
            *lock(&conn.lane) = Some(Arc::downgrade(&lane));
            st.conn = Some(conn.clone());
            self.lane_up(&lane, &mut st);
        }
    }

    /// Accepts what waits; returns connections that may hold more input.
    fn accept_all(&self) -> Vec<u64> {
        let mut more = Vec::new();
        loop {
            let r = match lock(&self.listener).as_ref() {
                Some(l) => l.accept(),
                None => return more,
            };
            let (stream, peer) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return more,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(_) => {
                    // EMFILE, ENFILE, ENOBUFS, ...: the listener stays readable,
                    // so stop watching it for a while instead of spinning.
                    if let Some(l) = lock(&self.listener).as_ref() {
                        self.poller.remove(l.as_raw_fd());
                    }
                    *lock(&self.accept_paused) = Some(Instant::now() + Duration::from_millis(100));
                    self.ring(); // the timer resumes it
                    return more;
                }
            };
            let peer_ip = norm_ip(peer.ip());
            let (total, per_peer) = {
                let c = lock(&self.conns);
                (c.len(), c.values().filter(|x| x.peer.ip() == peer_ip).count())
            };
            if total >= self.cfg.max_conns
                || per_peer >= self.cfg.max_conns_per_peer
                || stream.set_nonblocking(true).is_err()
            {
                Counters::inc(&self.c.rejected_conns);
                continue; // dropping the stream closes it
            }
            // No private number left (the descriptor budget): the
            // placement closed the stream, as a refused connection.
            let Ok(stream) = private(stream) else {
                Counters::inc(&self.c.rejected_conns);
                continue;
            };
            let conn = Conn::new(self.next_token.fetch_add(1, SeqCst), stream, peer, true);
            self.apply_opts(&conn);
            // Our hello first, so the peer may read replies on this connection.
            if !matches!(sys::send_nosignal(conn.fd(), &frame::hello(0)), Ok(frame::HELLO_LEN)) {
                continue;
            }
            lock(&self.conns).insert(conn.token, conn.clone());
            if self.poller.add_conn(conn.fd(), conn.token).is_err() {
                lock(&self.conns).remove(&conn.token);
                continue;
            }
            Counters::inc(&self.c.conns_accepted);
            // Data may have arrived before registration (edge-triggered).
            if self.read_conn(&conn) {
                more.push(conn.token);
            }
        }
    }

    /// Timers: retries, deadlines, hello timeouts, idle lanes. Returns the
    /// time until the next tick.
    fn tick(&self, now: Instant) -> Duration {
        let mut next = Duration::from_secs(1);
        if let Some(Ok(t)) = current() {
            // The process-wide transport keeps `<pid>.tcp.json` current for
            // `eudp stat` (the atexit hook writes the final counters).
            if std::ptr::eq(&*t.mgr, self) && stats_path().is_some() {
                let mut last = lock(&self.stats_written);
                if last.is_none_or(|t| now.duration_since(t) >= Duration::from_secs(1)) {
                    *last = Some(now);
                    write_stats(&self.c.snapshot(), self.queued_total.load(Relaxed));
                }
            }
        }
        if let Some(d) = self.listen_tick(now) {
            next = next.min(d);
        }
        let paused = *lock(&self.accept_paused);
        if let Some(t) = paused {
            if t <= now {
                *lock(&self.accept_paused) = None;
                if let Some(l) = lock(&self.listener).as_ref() {
                    let _ = self.poller.add_level(l.as_raw_fd(), LISTENER);
                }
            } else {
                next = next.min(t - now);
            }
        }
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        let mut idle = Vec::new();
        for lane in lanes {
            let mut st = lock(&lane.st);
            if st.phase == Phase::Backoff && st.plain && now.duration_since(st.last_used) > self.cfg.retry_max {
                // A plain UDP lane not used lately stops probing (the next
                // send probes again, see `submit`).
                st.phase = Phase::Idle;
            }
            if st.phase == Phase::Backoff {
                match st.retry_at {
                    Some(t) if t > now => next = next.min(t - now),
                    _ => self.start_connect(&lane, &mut st),
                }
            }
            if st.out.queued() > 0 {
                let (bound, ctr) = if st.phase == Phase::Up {
                    (self.cfg.max_wait, &self.c.drop_max_wait)
                } else {
                    (self.cfg.queue_deadline, &self.c.drop_deadline)
                };
                if let Some(cutoff) = now.checked_sub(bound) {
                    let b = st.out.queued();
                    let n = st.out.drop_older(cutoff);
                    if n > 0 {
                        Counters::add(ctr, n);
                        self.settle(&lane, &mut st, b);
                    }
                }
                next = next.min(Duration::from_millis(20));
            }
            if st.out.queued() == 0 && st.out.buf.capacity() > (1 << 20) {
                // A burst grew the queue; give the memory back once drained.
                st.out.buf = Vec::new();
                st.out.head = 0;
            }
            if st.phase == Phase::Idle
                && st.conn.is_none()
                && st.out.queued() == 0
                && now.duration_since(st.last_used) > LANE_IDLE
            {
                st.retired = true;
                idle.push(lane.key);
            }
        }
        if !idle.is_empty() {
            let mut lanes = lock(&self.lanes);
            for k in idle {
                lanes.remove(&k);
            }
        }
        let owned: Vec<Arc<Conn>> = lock(&self.conns).values().filter(|c| c.delegated.load(Relaxed)).cloned().collect();
        for c in owned {
            if self.watch_owned(&c, now) {
                next = next.min(self.cfg.rx_stall / 2);
            }
        }
        let conns: Vec<Arc<Conn>> =
            lock(&self.conns).values().filter(|c| !c.hello_seen.load(SeqCst)).cloned().collect();
        for c in conns {
            let age = now.saturating_duration_since(c.created);
            if age >= self.cfg.hello_timeout {
                Counters::inc(&self.c.hello_timeouts);
                self.close_conn(&c);
            } else {
                next = next.min(self.cfg.hello_timeout - age);
            }
        }
        next.max(Duration::from_millis(1))
    }
}

/// Binds a listening socket on the pre-decided port (`cfg.bind_ip`, else
/// the IPv6 wildcard, else the IPv4 one); not listening yet.
fn bind_port(cfg: &TcpConfig, opts: &SockOpts) -> io::Result<Private<TcpListener>> {
    match cfg.bind_ip {
        Some(ip) => sys::bind_listener(&SocketAddr::new(ip, cfg.port), opts),
        None => sys::bind_listener(&SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), cfg.port), opts)
            .or_else(|_| sys::bind_listener(&SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg.port), opts)),
    }
}

/// Why a read ended the connection's turn.
enum ReadErr {
    Frame(FrameError),
    Io(io::Error),
}

/// A guess at the frames that follow (see [`Mgr::scatter_plan`]).
/// Where bytes of an in-place read went: a header array, or a receive block.
#[derive(Clone, Copy, Debug)]
enum At {
    Arr(usize),
    Blk(usize),
}

/// The rest of an in-place read after the first miss, as one stream over
/// its pieces in stream order: (where, byte offset there, bytes). Block
/// bytes are addressed linearly (block `b`'s slot area starts at
/// `b * per_block * len`), which is also where slot `s` starts (`s * len`).
struct Scattered<'a> {
    segs: &'a [(At, usize, usize)],
    starts: Vec<usize>,
    /// The piece the last lookup found: lookups go a datagram at a time,
    /// so the next one is found a step or two away (a binary search per
    /// lookup was the largest cost of this walk).
    hint: Cell<usize>,
}

impl<'a> Scattered<'a> {
    fn new(segs: &'a [(At, usize, usize)]) -> Self {
        let mut at = 0;
        let starts = segs
            .iter()
            .map(|s| {
                let a = at;
                at += s.2;
                a
            })
            .collect();
        Scattered { segs, starts, hint: Cell::new(0) }
    }

    /// The piece that holds stream byte `p` (the last one when `p` is past
    /// the end; 0 when there are none).
    fn seg_at(&self, p: usize) -> usize {
        let st = &self.starts;
        let mut i = self.hint.get().min(st.len().saturating_sub(1));
        for _ in 0..8 {
            if i > 0 && st[i] > p {
                i -= 1;
            } else if i + 1 < st.len() && st[i + 1] <= p {
                i += 1;
            } else {
                self.hint.set(i);
                return i;
            }
        }
        i = st.partition_point(|&s| s <= p).saturating_sub(1);
        self.hint.set(i);
        i
    }

    /// Calls `f` with each piece of stream bytes `[p, p + n)`, in stream order.
    fn each_piece(&self, p: usize, mut n: usize, mut f: impl FnMut(At, usize, usize)) {
        let mut i = self.seg_at(p);
        let mut off = p - self.starts.get(i).copied().unwrap_or(0);
        while n > 0 && i < self.segs.len() {
            let (w, o, l) = self.segs[i];
            let k = (l - off).min(n);
            if k > 0 {
                f(w, o + off, k);
            }
            n -= k;
            off = 0;
            i += 1;
        }
    }

    /// The pieces of stream bytes `[p, p + n)`, in stream order.
    fn pieces(&self, p: usize, n: usize, out: &mut Vec<(At, usize, usize)>) {
        out.clear();
        self.each_piece(p, n, |w, o, k| out.push((w, o, k)));
    }

    fn copy_to(&self, hdrs: &[[u8; RUN_HEADER_LEN]], blocks: &[Vec<u8>], p: usize, dst: &mut [u8]) {
        let mut at = 0;
        self.each_piece(p, dst.len(), |w, o, k| {
            let src = match w {
                At::Arr(i) => &hdrs[i][o..o + k],
                At::Blk(b) => &blocks[b][o..o + k],
            };
            dst[at..at + k].copy_from_slice(src);
            at += k;
        });
    }

    /// How the datagram at stream offset `p` can be moved to `slot` in
    /// place, given that the datagrams before it are moved first:
    /// `Some(false)` when its slot ends before its bytes do (it moves
    /// back, and the moves of such a sequence go in stream order),
    /// `Some(true)` when its slot starts at or after its first block byte
    /// (it moves forward, such a sequence in reverse order), None when
    /// neither (its slot would cover bytes of a neighbour still to move).
    fn direction(&self, p: usize, len: usize, slot: usize, per_block: usize) -> Option<bool> {
        let lin = |b: usize, o: usize| b * per_block * len + o;
        // Linear block space: where its first block byte is, and where its
        // last one ends.
        let mut span: Option<(usize, usize)> = None;
        self.each_piece(p, len, |w, o, k| {
            if let At::Blk(b) = w {
                let a = lin(b, o);
                span = Some((span.map_or(a, |s| s.0), a + k));
            }
        });
        let (first, end) = span?;
        let d = slot * len;
        if d + len <= end {
            Some(false)
        } else if d >= first {
            Some(true)
        } else {
            None
        }
    }

    /// Moves each datagram (stream offset, slot, forward) to its slot. The
    /// sources of a datagram lie in linear block space between the end of
    /// the previous one's and the start of the next one's, so a backward
    /// move never covers bytes still to move after it, and a forward one
    /// never those before it: backward runs go in stream order, forward
    /// runs in reverse (the pieces of one datagram likewise).
    fn move_all(
        &self,
        hdrs: &[[u8; RUN_HEADER_LEN]],
        blocks: &mut [Vec<u8>],
        moves: &[(usize, usize, bool)],
        len: usize,
        per_block: usize,
    ) {
        let mut ps = Vec::new();
        let mut exec = |m: &(usize, usize, bool), blocks: &mut [Vec<u8>]| {
            let (p, slot, fwd) = *m;
            self.pieces(p, len, &mut ps);
            let (db, base) = (slot / per_block, slot % per_block * len);
            let mut one = |&(w, o, k): &(At, usize, usize), off: usize| {
                let d = base + off;
                match w {
                    At::Arr(i) => blocks[db][d..d + k].copy_from_slice(&hdrs[i][o..o + k]),
                    At::Blk(b) if b == db => {
                        if o != d {
                            blocks[db].copy_within(o..o + k, d);
                        }
                    }
                    At::Blk(b) if b < db => {
                        let (x, y) = blocks.split_at_mut(db);
                        y[0][d..d + k].copy_from_slice(&x[b][o..o + k]);
                    }
                    At::Blk(b) => {
                        let (x, y) = blocks.split_at_mut(b);
                        x[db][d..d + k].copy_from_slice(&y[0][o..o + k]);
                    }
                }
            };
            // Each piece goes to its offset within the datagram.
            if fwd {
                let mut off: usize = ps.iter().map(|pc| pc.2).sum();
                for pc in ps.iter().rev() {
                    off -= pc.2;
                    one(pc, off);
                }
            } else {
                let mut off = 0;
                for pc in ps.iter() {
                    one(pc, off);
                    off += pc.2;
                }
            }
        };
        let mut i = 0;
        while i < moves.len() {
            let fwd = moves[i].2;
            let j = moves[i..].iter().position(|m| m.2 != fwd).map_or(moves.len(), |k| i + k);
            if fwd {
                moves[i..j].iter().rev().for_each(|m| exec(m, blocks));
            } else {
                moves[i..j].iter().for_each(|m| exec(m, blocks));
            }
            i = j;
        }
    }
}

struct Plan {
    src: u16,
    dst: u16,
    len: usize,
    /// Datagrams of the current run that follow the cut unit (known).
    left: usize,
    /// Count of the runs guessed to follow (None: single frames).
    runs: Option<u16>,
    /// Bytes that complete the frame cut by the previous read.
    need: usize,
    /// Room left in the receive queue of the guessed endpoint (bytes).
    room: usize,
}

/// Receive blocks an in-place read of `len`-byte frames fills: at most
/// `blocks`, and no more than `room` bytes of the endpoint's queue hold
/// (each block charged as [`RxItem::cost`] charges it), but at least one,
/// so a full queue still drains the connection and drops, as UDP would.
/// Reading more than the queue holds in one call dropped the excess at
/// once even when the reader kept up (the loss with a default-size
/// receive buffer: four blocks of 44 datagrams against 212 992 bytes).
fn blocks_for(len: usize, blocks: usize, room: usize) -> usize {
    let per_block = (BIG_BUF / len.max(1)).max(1);
    let cost = (per_block * (len + RX_OVERHEAD)).max(BIG_BUF);
    blocks.min(1000 / (2 * per_block)).min(room / cost).max(1)
}

/// Blocks one in-place read fills at most.
const SCATTER_BLOCKS: usize = 8;
/// Bound on a frame's charge ([`RxItem::cost`]) over its wire bytes: an
/// empty datagram costs [`RX_OVERHEAD`] for a 6-byte header.
const RX_MAX_RATIO: usize = RX_OVERHEAD.div_ceil(HEADER_LEN);
/// Smallest plain read by an endpoint's reader.
const PLAIN_MIN: usize = 4096;
/// Consecutive in-place manager reads to one endpoint before its readers
/// read the connection themselves ([`Mgr::delegate`]).
const DELEGATE_AFTER: u32 = 4;

/// How one read of a connection ended.
enum Step {
    /// EOF, error or bad input: the connection is to be closed.
    Closed,
    /// Interrupted: read again.
    Again,
    /// A short read (the socket is drained) of this many bytes.
    Drained(usize),
    /// The read filled its room: more may wait.
    Full(usize),
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
struct Deliver<'a> {
    mgr: &'a Mgr,
    conn: &'a Arc<Conn>,
    pools: &'a mut Pools,
    cache: Option<Route>,
    batch: Vec<RxItem>,
    frames: u64,
    bytes: u64,
    /// Frames of this read (not reset by `flush`).
    frames_seen: u64,
    /// The queue whose reader reads (not signalled, it pops next).
    quiet: Option<&'a RxQueue>,
    /// The first queue frames went to, and whether any went elsewhere.
    first: Option<Arc<RxQueue>>,
    mixed: bool,
}

impl Deliver<'_> {
    /// Switches to the queue for `src` → `dst`, handing over what was gathered for the previous one.
    fn to(&mut self, src: SocketAddr, dst: u16) {
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
    fn feed(&mut self, dec: &mut Decoder, bytes: &[u8]) -> Result<usize, FrameError> {
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
    fn block(&mut self, dst: u16, it: RxItem) {
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

    fn flush(&mut self) {
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

impl Counters {
    fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
    pub(super) fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lays a stream of runs (`counts`, headers of `hl` bytes) out as an
    /// in-place read guessing runs of `guess` would, then moves every
    /// datagram the reader may move (as `read_in_place` does) and checks
    /// each slot. Returns (moved forward, moved back, stopped early).
    fn scatter_case(
        len: usize,
        per_block: usize,
        nblocks: usize,
        counts: &[usize],
        guess: usize,
        hl: usize,
    ) -> (usize, usize, bool) {
        let slots = per_block * nblocks;
        // The guessed layout: a header array, then `guess` slots, and so on.
        let mut segs: Vec<(At, usize, usize)> = Vec::new();
        let (mut s, mut a) = (0, 0);
        while s < slots {
            segs.push((At::Arr(a), 0, hl));
            a += 1;
            let mut k = guess;
            while k > 0 && s < slots {
                let n = k.min(per_block - s % per_block);
                segs.push((At::Blk(s / per_block), s % per_block * len, n * len));
                s += n;
                k -= n;
            }
        }
        // The real stream: headers (0xEE) and numbered payloads.
        let mut stream = Vec::new();
        let mut at = Vec::new();
        let mut d = 0u8;
        for &c in counts {
            stream.extend(std::iter::repeat_n(0xEE, hl));
            for _ in 0..c {
                at.push(stream.len());
                d = d.wrapping_add(1);
                stream.extend((0..len).map(|j| d ^ j as u8));
            }
        }
        // The read: as readv fills the layout.
        let mut hdrs = vec![[0u8; RUN_HEADER_LEN]; a];
        let mut blocks = vec![vec![0u8; per_block * len]; nblocks];
        let mut p = 0;
        for &(w, o, n) in &segs {
            let k = n.min(stream.len() - p);
            match w {
                At::Arr(i) => hdrs[i][o..o + k].copy_from_slice(&stream[p..p + k]),
                At::Blk(b) => blocks[b][o..o + k].copy_from_slice(&stream[p..p + k]),
            }
            p += k;
        }
        let rd = Scattered::new(&segs);
        let mut moves = Vec::new();
        let mut stopped = false;
        for (slot, &q) in at.iter().enumerate() {
            if slot >= slots || q + len > p {
                break;
            }
            match rd.direction(q, len, slot, per_block) {
                Some(f) => moves.push((q, slot, f)),
                None => {
                    stopped = true;
                    break;
                }
            }
        }
        rd.move_all(&hdrs, &mut blocks, &moves, len, per_block);
        for &(q, slot, _) in &moves {
            let got = &blocks[slot / per_block][slot % per_block * len..][..len];
            assert_eq!(got, &stream[q..q + len], "slot {slot}, counts {counts:?}, guess {guess}");
        }
        let fwd = moves.iter().filter(|m| m.2).count();
        (fwd, moves.len() - fwd, stopped)
    }

    #[test]
    fn shifted_datagrams_are_moved_into_their_slots_in_a_safe_order() {
        let (mut fwd, mut back, mut stops, mut cases) = (0, 0, 0, 0);
        let mut x = 7u32;
        for len in [16usize, 40] {
            for guess in [1usize, 3, 5, 8] {
                for _ in 0..200 {
                    let counts: Vec<usize> = (0..12)
                        .map(|_| {
                            x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                            (x >> 16) as usize % 9 + 1
                        })
                        .collect();
                    for hl in [HEADER_LEN, RUN_HEADER_LEN] {
                        let (f, b, s) = scatter_case(len, 4, 3, &counts, guess, hl);
                        fwd += f;
                        back += b;
                        stops += usize::from(s);
                        cases += 1;
                    }
                }
            }
        }
        // Both directions occur, and the reader rarely has to give up.
        assert!(fwd > 1000 && back > 1000, "forward {fwd}, back {back}");
        assert!(stops * 5 < cases, "{stops} of {cases} stopped");
    }

    #[test]
    fn outbuf_partial_frames_and_deadlines() {
        let t0 = Instant::now();
        let mut o = OutBuf::default();
        let a = [1u8; 10];
        let b = [2u8; 20];
        // A frame half written directly, then one queued whole.
        o.wrote_direct(7);
        o.push_rest([&frame::header(1, 2, 10)[..], &a[..]].into_iter(), 7, 1, t0);
        assert_eq!(o.queued(), HEADER_LEN + 10 - 7);
        o.push(1, 2, &[IoSlice::new(&b)], 20, t0 + Duration::from_millis(5));
        // The half-written frame is never dropped by a deadline...
        assert_eq!(o.drop_older(t0 + Duration::from_secs(1)), 0);
        // ...but cut when its connection dies; the next one is intact.
        assert_eq!(o.discard_partial(), 1);
        assert_eq!(o.unwritten(), &[&frame::header(1, 2, 20)[..], &b[..]].concat()[..]);
        assert_eq!(o.drop_older(t0 + Duration::from_millis(1)), 0);
        assert_eq!(o.drop_older(t0 + Duration::from_millis(6)), 1);
        assert_eq!(o.queued(), 0);
        // Writes complete frames as they pass their end.
        o.push(1, 2, &[IoSlice::new(&a)], 10, t0);
        o.push(1, 2, &[IoSlice::new(&b)], 20, t0);
        assert_eq!(o.advance(HEADER_LEN + 10 + 3), 1);
        assert_eq!(o.discard_partial(), 1);
        assert_eq!((o.queued(), o.clear()), (0, 0));
        // The rest of a run of 3 cut in its second datagram: 2 datagrams.
        let run = frame::run_header(1, 2, 3, 10);
        o.wrote_direct(RUN_HEADER_LEN + 15);
        o.push_rest([&run[..], &a[..], &a[..], &a[..]].into_iter(), RUN_HEADER_LEN + 15, 2, t0);
        assert_eq!(o.queued(), 15);
        assert_eq!(o.drop_older(t0 + Duration::from_secs(1)), 0);
        assert_eq!(o.advance(15), 2);
        o.wrote_direct(RUN_HEADER_LEN + 5);
        o.push_rest([&run[..], &a[..], &a[..], &a[..]].into_iter(), RUN_HEADER_LEN + 5, 3, t0);
        assert_eq!((o.discard_partial(), o.queued()), (3, 0));
    }
}
