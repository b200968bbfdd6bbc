//! Per-packet, per-layer tracepoints on one clock (`eudp trace`, issue 4).
//!
//! Off by default. Every hook on the hot path is one relaxed load of a
//! global flag ([`on`]); the recording itself is out of line. When on, each
//! thread appends fixed-size events to its own bounded buffer of atomics (no
//! locks, no allocation after the buffer exists; a full buffer counts the
//! events it drops). Timestamps are `CLOCK_MONOTONIC_RAW` nanoseconds; kernel
//! timestamps (`SO_TIMESTAMPING`, reported in `CLOCK_REALTIME`) are mapped
//! onto that clock when read, with an offset sampled at that moment.
//!
//! Packets are identified per endpoint: a send gets the endpoint's next send
//! sequence number, a queued datagram its L1 index, a kernel message the
//! index the kernel's `SOF_TIMESTAMPING_OPT_ID` counter gives it, and a
//! received datagram its arrival index. `eudp-trace` joins these into one
//! path per packet. Nothing sent on the wire changes.
//!
//! Enable with the environment variable `EUDP_TRACE=PATH` (the events are
//! written to PATH when an endpoint closes and by [`finish`]) or with
//! [`enable`]. A `%p` in PATH stands for the writing process's pid, so the
//! processes of one program (a client and its server, fork children) each
//! write their own file instead of overwriting one another's.

use crate::sys::io_uring as stamp_ring;
use crate::sys::{clock, timestamp};
use std::cell::Cell;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release,
};
use std::sync::{Mutex, Once};

static ON: AtomicBool = AtomicBool::new(false);
static ENV: Once = Once::new();
static PATH: Mutex<Option<String>> = Mutex::new(None);
static BUFS: Mutex<Vec<&'static ThreadBuf>> = Mutex::new(Vec::new());
static NEXT_EP: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Record one application call in this many (per thread); 1: every call.
static SAMPLE: AtomicU64 = AtomicU64::new(1);

/// Events each thread can hold by default (32 bytes each); `EUDP_TRACE_EVENTS`
/// overrides it.
pub const THREAD_CAPACITY: usize = 1 << 18;

/// Capacity of buffers created from now on; 0: not set yet.
static CAP: AtomicUsize = AtomicUsize::new(0);

fn capacity() -> usize {
    match CAP.load(Relaxed) {
        0 => {
            let n = std::env::var("EUDP_TRACE_EVENTS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n| n > 0)
                .unwrap_or(THREAD_CAPACITY);
            CAP.store(n, Relaxed);
            n
        }
        n => n,
    }
}

/// Sets how many events each thread buffer created from now on holds
/// (overrides `EUDP_TRACE_EVENTS`): a tool that knows how many packets it
/// will trace sizes the buffers so none is dropped.
pub fn set_capacity(events: usize) {
    CAP.store(events.max(1), Relaxed);
}

/// True while tracing is on. This is the only thing a hook costs when off.
#[inline(always)]
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// What an event marks. The numbers are part of the dump format
/// (docs/trace.md). Timestamps `ts` and, for the two call events, `a` are
/// on the trace clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Application send call, recorded at its return: extra = send seq,
    /// a = enter time, b = [`send_ref`] (L1 index or direct post, bytes).
    SendCall = 1,
    /// Engine took L1: a = first L1 index, b = count.
    Take = 5,
    /// Engine formed one backend call: a = first L1 index, b = datagrams.
    Batch = 6,
    /// Send syscall entered: a = kernel message index of its first message.
    SysEnter = 7,
    /// Send syscall returned: a = first kernel message index, b = accepted.
    SysReturn = 8,
    /// One accepted kernel message: a = its index, b = [`msg_ref`] packing.
    KMsg = 9,
    /// Kernel TX_SCHED (before the qdisc): a = OPT_ID key.
    TxSched = 10,
    /// Kernel TX_SOFTWARE (driver): a = OPT_ID key.
    TxSoft = 11,
    /// Receive syscall entered: a = arrival index of the next datagram.
    RxEnter = 12,
    /// Kernel RX_SOFTWARE of a message: a = first arrival index, b = datagrams.
    RxSoft = 13,
    /// Message read and pushed to the ring (or handed over): a, b as RxSoft.
    RxPush = 14,
    /// Application receive call, recorded at its return with a datagram:
    /// a = enter time, b = arrival index (the ring delivery is this return).
    RecvCall = 17,
    /// An application's own sequence number for the datagram it received
    /// last on this thread: a = arrival index, b = application seq.
    AppSeq = 18,
    /// The endpoint's addresses, once per side ([`EpTrace::note_addrs`]):
    /// extra = [`SIDE_SEND`] (b = the first send's destination) or
    /// [`SIDE_RECV`] (b = the first arrival's source); a = the local
    /// address. Packed by [`pack_addr`]. Lets a tool tell which of a
    /// program's endpoints, in which process, received what another sent.
    EpAddr = 19,
}

/// [`Kind::EpAddr`] of the sending side.
pub const SIDE_SEND: u64 = 1;
/// [`Kind::EpAddr`] of the receiving side.
pub const SIDE_RECV: u64 = 2;

/// An address in one word: IPv4 (also IPv4-mapped IPv6) as
/// `ip << 16 | port`, other IPv6 as `1 << 48 | port` (its port only); 0
/// when unknown.
pub fn pack_addr(a: Option<std::net::SocketAddr>) -> u64 {
    let v4 = |ip: std::net::Ipv4Addr, port: u16| u64::from(u32::from(ip)) << 16 | u64::from(port);
    match a {
        Some(std::net::SocketAddr::V4(v)) => v4(*v.ip(), v.port()),
        Some(std::net::SocketAddr::V6(v)) => match v.ip().to_ipv4_mapped() {
            Some(ip) => v4(ip, v.port()),
            None => 1 << 48 | u64::from(v.port()),
        },
        None => 0,
    }
}

/// Packs a kernel message: its first datagram (a send seq when `direct`,
/// else an L1 index) and how many datagrams it holds.
pub fn msg_ref(first: u64, count: u64, direct: bool) -> u64 {
    (first & ((1 << 47) - 1)) | (u64::from(direct) << 47) | (count << 48)
}

/// Inverse of [`msg_ref`]: (first, count, direct).
pub fn unpack_msg_ref(b: u64) -> (u64, u64, bool) {
    (b & ((1 << 47) - 1), b >> 48, (b >> 47) & 1 == 1)
}

/// Packs a send call: its L1 index (when queued), its bytes, direct or not.
pub fn send_ref(q: u64, bytes: u64, direct: bool) -> u64 {
    (q & ((1 << 40) - 1)) | ((bytes & 0x7f_ffff) << 40) | (u64::from(direct) << 63)
}

/// Inverse of [`send_ref`]: (L1 index, bytes, direct).
pub fn unpack_send_ref(b: u64) -> (u64, u64, bool) {
    (b & ((1 << 40) - 1), (b >> 40) & 0x7f_ffff, b >> 63 == 1)
}

/// One thread's bounded event buffer: 4 words per event. Buffers live for
/// the whole process (a thread's events outlive the thread), so a thread
/// keeps a plain `&'static` to its own: no reference count, no lazy
/// thread-local destructor, one TLS load on the hot path.
#[derive(Debug)]
struct ThreadBuf {
    thread: u64,
    words: Box<[AtomicU64]>,
    len: AtomicUsize,
}

thread_local! {
    static BUF: Cell<Option<&'static ThreadBuf>> = const { Cell::new(None) };
    /// Send seq of the call in progress on this thread (u64::MAX: none
    /// yet) and its L1 index, or DIRECT.
    static CUR: Cell<(u64, u64)> = const { Cell::new((u64::MAX, DIRECT)) };
    /// First L1 index of what the engine took last on this thread.
    static TAKE_BASE: Cell<u64> = const { Cell::new(0) };
    /// Arrival index of the datagram this thread popped last.
    static LAST_POP: Cell<u64> = const { Cell::new(u64::MAX) };
    /// RX_SOFTWARE stamps (`CLOCK_REALTIME`) of the last batched receive on
    /// this thread, by message (0: none).
    static RX_STAMPS: [Cell<u64>; RX_STAMP_SLOTS] = const { [ZERO; RX_STAMP_SLOTS] };
    /// Realtime-to-raw offset and when it was sampled (hot-path clock).
    static OFFSET: Cell<(i64, u64)> = const { Cell::new((0, 0)) };
}

/// Records the application calls of one packet in `n` (send seq or arrival
/// index divisible by `n`, so both ends sample the same packets; 1: all).
/// The engine's batch events and kernel stamps are always recorded. Also
/// `EUDP_TRACE_SAMPLE`.
pub fn set_sample(n: u64) {
    SAMPLE.store(n.max(1), Relaxed);
}

/// True when packet `i`'s application calls are recorded.
#[inline]
#[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
fn sampled(i: u64) -> bool {
    let k = SAMPLE.load(Relaxed);
    k <= 1 || i % k == 0
}

const DIRECT: u64 = u64::MAX;
/// Messages of one batched receive whose RX stamps a thread keeps (the
/// engine reads at most 64 per call).
const RX_STAMP_SLOTS: usize = 128;
#[allow(clippy::declare_interior_mutable_const)] // only an array initialiser
const ZERO: Cell<u64> = Cell::new(0);
/// Hot-path clock ticks within which a realtime-to-raw offset is reused:
/// about a millisecond (TSC at 1–4 GHz: 2.1–0.5 ms; the raw clock: 2.1 ms).
const OFFSET_TICKS: u64 = 1 << 21;
/// Event word 1: kind (bits 0-7), timestamps in TSC ticks (bit 8),
/// endpoint (bits 9-23), extra (bits 24-63).
const TSC_FLAG: u64 = 1 << 8;

/// `CLOCK_MONOTONIC_RAW` now, in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    clock::monotonic_raw_ns()
}

/// The hot-path clock, chosen when tracing is enabled: [`CLOCK_TSC`],
/// [`CLOCK_RAW`] or [`CLOCK_NONE`]; 0 before the first [`enable`].
static CLOCK: AtomicU8 = AtomicU8::new(0);
/// The invariant TSC (mapped onto `CLOCK_MONOTONIC_RAW` when events are read).
const CLOCK_TSC: u8 = 1;
/// `CLOCK_MONOTONIC_RAW` itself (no invariant TSC).
const CLOCK_RAW: u8 = 2;
/// Measurement only (`EUDP_TRACE_CLOCK=none`): no clock is read and every
/// hot-path time is 1, so `eudp trace --overhead` can tell the cost of the
/// clock reads from the rest of the tracing. Such a trace has no timing.
const CLOCK_NONE: u8 = 3;

/// Picks the hot-path clock (once per process: events of one buffer must
/// share it); enabling a trace does, and so does a measurement of
/// [`hot_clock`] before it.
pub fn choose_clock() {
    if CLOCK.load(Relaxed) != 0 {
        return;
    }
    let c = if std::env::var("EUDP_TRACE_CLOCK").as_deref() == Ok("none") {
        CLOCK_NONE
    } else if clock::tsc().is_some() {
        CLOCK_TSC
    } else {
        CLOCK_RAW
    };
    CLOCK.store(c, Relaxed);
}

/// The hot-path clock: one relaxed load selects it (no lazy check per read).
#[inline]
fn stamp() -> (u64, bool) {
    match CLOCK.load(Relaxed) {
        // Only chosen where clock::tsc found an invariant TSC.
        CLOCK_TSC => (clock::tsc_unchecked(), true),
        CLOCK_NONE => (1, false),
        _ => (now_ns(), false),
    }
}

/// One read of the hot-path clock as a traced call makes it, in the
/// clock's own units (TSC ticks or nanoseconds): for measuring what a read
/// costs, after [`choose_clock`].
#[inline]
pub fn hot_clock() -> u64 {
    stamp().0
}

/// A (TSC, raw ns) pair sampled at one instant, for the linear mapping.
fn tsc_pair() -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64, u64)> = None;
    for _ in 0..5 {
        let a = clock::tsc()?;
        let n = now_ns();
        let b = clock::tsc()?;
        if !matches!(best, Some(x) if x.0 <= b - a) {
            best = Some((b - a, a / 2 + b / 2, n));
        }
    }
    best.map(|x| (x.1, x.2))
}

static CAL: Mutex<Option<(u64, u64)>> = Mutex::new(None);

/// Maps TSC ticks to raw ns: the pair taken when tracing was enabled and
/// one taken now (at least 2 ms apart).
fn tsc_map() -> Option<(u64, u64, f64)> {
    let p0 = (*CAL.lock().unwrap_or_else(|e| e.into_inner()))?;
    let mut p1 = tsc_pair()?;
    if p1.1.saturating_sub(p0.1) < 2_000_000 {
        std::thread::sleep(std::time::Duration::from_millis(2));
        p1 = tsc_pair()?;
    }
    let slope = (p1.1 - p0.1) as f64 / (p1.0.wrapping_sub(p0.0)) as f64;
    Some((p0.0, p0.1, slope))
}

/// Offset to add to a `CLOCK_REALTIME` nanosecond stamp to put it on
/// `CLOCK_MONOTONIC_RAW`, from the tightest of three bracketed samples.
pub fn realtime_to_raw_offset() -> i64 {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..3 {
        let a = clock::monotonic_raw_ns();
        let r = clock::realtime_ns();
        let b = clock::monotonic_raw_ns();
        let width = b.saturating_sub(a);
        if width < best.0 {
            best = (width, (a / 2 + b / 2) as i64 - r as i64);
        }
    }
    best.1
}

/// The offset, re-sampled about every millisecond per thread (the age is
/// checked on the hot-path clock, so a cached offset costs no syscall).
fn offset_cached() -> i64 {
    offset_cached_at(stamp().0)
}

/// [`offset_cached`] with the hot-path clock already read (`now`).
fn offset_cached_at(now: u64) -> i64 {
    let (off, at) = OFFSET.with(Cell::get);
    if at != 0 && now.wrapping_sub(at) < OFFSET_TICKS {
        return off;
    }
    let off = realtime_to_raw_offset();
    OFFSET.with(|c| c.set((off, now)));
    off
}

/// Allocates this thread's buffer now, so the first traced packet does not
/// pay for it (the engine thread calls it at start when tracing is on).
pub fn prepare_thread() {
    if on() {
        thread_buf();
    }
}

/// This thread's buffer, created on first use.
#[inline]
fn thread_buf() -> &'static ThreadBuf {
    match BUF.with(Cell::get) {
        Some(b) => b,
        None => new_buf(),
    }
}

#[cold]
#[inline(never)]
fn new_buf() -> &'static ThreadBuf {
    let words: Box<[AtomicU64]> = (0..capacity() * 4).map(|_| AtomicU64::new(0)).collect();
    // The allocation may be fresh zero pages: touch each page now, so
    // recording never takes a page fault.
    for w in words.iter().step_by(512) {
        w.store(0, Relaxed);
    }
    let b: &'static ThreadBuf =
        Box::leak(Box::new(ThreadBuf { thread: NEXT_THREAD.fetch_add(1, Relaxed), words, len: AtomicUsize::new(0) }));
    BUFS.lock().unwrap_or_else(|e| e.into_inner()).push(b);
    BUF.with(|c| c.set(Some(b)));
    b
}

/// Events ahead of the write position whose cache line [`push_raw`]
/// prefetches for writing: 32 events, 1 KiB, 16 lines — several
/// microseconds of recording ahead at any rate this records.
const PREFETCH_AHEAD: usize = 32;

/// Asks for the cache line at `w` in a writable state (a hint only).
///
/// The event buffers stream through memory (tens of MB per thread per
/// run), so without it each new line is a store miss; the store then waits
/// in the store buffer and the next locked instruction of the hot path (the
/// endpoint's send lock) waits for it.
#[inline(always)]
fn prefetch_for_write(w: &AtomicU64) {
    crate::sys::cache::prefetch_for_write(w);
}

#[inline]
fn push_raw(w1: u64, ts: u64, a: u64, b: u64) {
    push_into(thread_buf(), w1, ts, a, b);
}

/// Appends one event to `buf` (its owning thread only), or counts it
/// dropped when `buf` is full.
#[inline(always)]
fn push_into(buf: &ThreadBuf, w1: u64, ts: u64, a: u64, b: u64) {
    let n = buf.len.load(Relaxed);
    match buf.words.get(n * 4..n * 4 + 4) {
        Some(w) => {
            w[0].store(ts, Relaxed);
            w[1].store(w1, Relaxed);
            w[2].store(a, Relaxed);
            w[3].store(b, Relaxed);
            buf.len.store(n + 1, Release);
            if let Some(ahead) = buf.words.get((n + PREFETCH_AHEAD) * 4) {
                prefetch_for_write(ahead);
            }
        }
        None => {
            DROPPED.fetch_add(1, Relaxed);
        }
    }
}

fn word1(kind: Kind, ep: u64, tsc: bool, extra: u64) -> u64 {
    kind as u64 | if tsc { TSC_FLAG } else { 0 } | ((ep & 0x7fff) << 9) | (extra << 24)
}

/// An event stamped now on the hot-path clock.
#[inline]
fn push(kind: Kind, ep: u64, a: u64, b: u64) {
    let (t, tsc) = stamp();
    push_raw(word1(kind, ep, tsc, 0), t, a, b);
}

/// An event with a `CLOCK_MONOTONIC_RAW` timestamp.
fn push_ns(kind: Kind, ep: u64, ts_ns: u64, a: u64, b: u64) {
    push_raw(word1(kind, ep, false, 0), ts_ns, a, b);
}

/// Records an event with a given `CLOCK_MONOTONIC_RAW` timestamp (for
/// tools that trace layers of their own).
pub fn record_at(kind: Kind, ep: u64, ts_ns: u64, a: u64, b: u64) {
    if on() {
        push_ns(kind, ep, ts_ns, a, b);
    }
}

/// Turns tracing on (sockets created from now on are timestamped).
pub fn enable() {
    let mut c = CAL.lock().unwrap_or_else(|e| e.into_inner());
    choose_clock();
    if c.is_none() && CLOCK.load(Relaxed) == CLOCK_TSC {
        *c = tsc_pair();
    }
    ON.store(true, Relaxed);
}

/// Turns tracing off; recorded events stay until [`reset`].
pub fn disable() {
    ON.store(false, Relaxed);
}

/// Reads `EUDP_TRACE` once: a non-empty value turns tracing on and names the
/// file the events go to.
pub fn init_from_env() {
    ENV.call_once(|| {
        if let Some(k) = std::env::var("EUDP_TRACE_SAMPLE").ok().and_then(|v| v.parse().ok()) {
            set_sample(k);
        }
        if let Ok(p) = std::env::var("EUDP_TRACE") {
            if !p.is_empty() {
                *PATH.lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
                enable();
            }
        }
    });
}

/// Forgets every recorded event (call while no thread records).
pub fn reset() {
    for b in BUFS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        b.len.store(0, Release);
    }
    DROPPED.store(0, Relaxed);
}

/// One recorded event, timestamps in `CLOCK_MONOTONIC_RAW` ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub ts_ns: u64,
    pub kind: u8,
    pub ep: u64,
    pub thread: u64,
    /// The send seq of a [`Kind::SendCall`], else 0.
    pub extra: u64,
    pub a: u64,
    pub b: u64,
}

/// Every event recorded so far, thread by thread in recording order.
pub fn events() -> Vec<Event> {
    let bufs = BUFS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let map = tsc_map();
    let conv = |t: u64| match map {
        Some((t0, n0, slope)) => (n0 as f64 + (t.wrapping_sub(t0) as i64) as f64 * slope).round() as u64,
        None => t,
    };
    let mut out = Vec::new();
    for b in bufs {
        let n = b.len.load(Acquire);
        for i in 0..n {
            let w = &b.words[i * 4..i * 4 + 4];
            let w1 = w[1].load(Relaxed);
            let kind = (w1 & 0xff) as u8;
            let tsc = w1 & TSC_FLAG != 0;
            let (mut ts, mut a) = (w[0].load(Relaxed), w[2].load(Relaxed));
            if tsc {
                ts = conv(ts);
                if kind == Kind::SendCall as u8 || kind == Kind::RecvCall as u8 {
                    a = conv(a);
                }
            }
            out.push(Event {
                ts_ns: ts,
                kind,
                ep: (w1 >> 9) & 0x7fff,
                thread: b.thread,
                extra: w1 >> 24,
                a,
                b: w[3].load(Relaxed),
            });
        }
    }
    out
}

/// How many threads have a trace buffer (a tool can wait for the engine
/// thread's before it starts timing: allocating and touching a buffer of
/// many events takes milliseconds).
pub fn thread_buffers() -> usize {
    BUFS.lock().unwrap_or_else(|e| e.into_inner()).len()
}

/// Events dropped because a thread's buffer was full.
pub fn dropped() -> u64 {
    DROPPED.load(Relaxed)
}

/// The events as JSON: `{"clock": ..., "dropped": n, "events": [[ts, kind,
/// ep, thread, a, b, extra], ...]}` (documented in docs/trace.md).
pub fn dump_json() -> String {
    use std::fmt::Write;
    let ev = events();
    let mut s = String::with_capacity(ev.len() * 48 + 128);
    let _ = write!(
        s,
        "{{\"clock\":\"CLOCK_MONOTONIC_RAW\",\"pid\":{},\"dropped\":{},\"events\":[",
        std::process::id(),
        dropped()
    );
    for (i, e) in ev.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "[{},{},{},{},{},{},{}]", e.ts_ns, e.kind, e.ep, e.thread, e.a, e.b, e.extra);
    }
    s.push_str("]}\n");
    s
}

/// Writes the events to `EUDP_TRACE`'s path, if set (tracing stays on).
/// `%p` in the path becomes this process's pid.
pub fn finish() -> std::io::Result<()> {
    let p = PATH.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match p {
        Some(p) => std::fs::write(dump_path(&p, std::process::id()), dump_json()),
        None => Ok(()),
    }
}

/// The file `EUDP_TRACE=pattern` names for process `pid`: every `%p`
/// replaced by the pid.
pub fn dump_path(pattern: &str, pid: u32) -> String {
    pattern.replace("%p", &pid.to_string())
}

/// In a fork child: forgets the events inherited from the parent (they are
/// the parent's, and its own dump has them), so the child's dump holds only
/// what the child recorded. Lock-free apart from a `try_lock`: a child
/// whose parent was registering a thread buffer at the fork keeps the
/// inherited events rather than risk waiting on a lock nobody will release.
pub fn forked_child() {
    stamp_ring::forked_child();
    if let Ok(bufs) = BUFS.try_lock() {
        for b in bufs.iter() {
            b.len.store(0, Release);
        }
    }
    DROPPED.store(0, Relaxed);
}

/// Kernel messages whose TX stamps a sending thread lets wait before it
/// reads them (after a send syscall), at most. Reading in batches spreads
/// the cost of each read's system calls.
pub const STAMP_READ_MESSAGES: u64 = 16;

/// Receive buffer one waiting kernel message may claim: its two stamps are
/// charged to the socket's receive buffer (832 bytes each here, with
/// OPT_TSONLY), and a stamp that does not fit is dropped by the kernel, a
/// hole in the trace. So the waiting stamps are kept to half the buffer
/// ([`EpTrace::fit_stamps_to`]).
const STAMP_BUFFER_PER_MESSAGE: usize = 4096;

/// Kernel messages' stamps from which [`EpTrace::drain_tx`] reads through
/// io_uring rather than `recvmmsg` alone (`one_shot_read_cost`: at one
/// message per read the ring costs more, at eight it saves).
const RING_READ_MESSAGES: u64 = 4;

/// Whether TX stamps are read through io_uring where it pays: 0 not
/// decided yet (`EUDP_TRACE_STAMP_READER`), 1 yes, 2 `recvmmsg` only.
static RING_READS: AtomicU8 = AtomicU8::new(0);

/// Reads TX stamps through io_uring where it pays (the default) or with
/// `recvmmsg` only (`EUDP_TRACE_STAMP_READER=recvmmsg`), from now on.
pub fn set_ring_reads(on: bool) {
    RING_READS.store(if on { 1 } else { 2 }, Relaxed);
}

/// The TX stamps a traced socket asks for: TX_SCHED and TX_SOFTWARE, each
/// keyed by the socket's OPT_ID counter, without a copy of the payload.
const TX_STAMPS: i32 = (libc::SOF_TIMESTAMPING_TX_SCHED
    | libc::SOF_TIMESTAMPING_TX_SOFTWARE
    | libc::SOF_TIMESTAMPING_OPT_ID
    | libc::SOF_TIMESTAMPING_OPT_TSONLY) as i32;

/// [`TX_STAMPS`] with software reporting on: a socket that makes TX stamps
/// and no RX stamps (the cost measurements).
pub const TX_STAMP_FLAGS: i32 = TX_STAMPS | libc::SOF_TIMESTAMPING_SOFTWARE as i32;

/// Kernel timestamping flags the engine asks for on a traced socket.
/// `EUDP_TRACE_KERNEL` narrows them: `0` none (user-space points only),
/// `rx` receive only, `tx` transmit only; anything else (default) both.
pub fn timestamping_flags() -> i32 {
    let tx = TX_STAMPS;
    let rx = libc::SOF_TIMESTAMPING_RX_SOFTWARE as i32;
    let sw = libc::SOF_TIMESTAMPING_SOFTWARE as i32;
    match std::env::var("EUDP_TRACE_KERNEL").as_deref() {
        Ok("0") => 0,
        Ok("rx") => rx | sw,
        Ok("tx") => tx | sw,
        _ => tx | rx | sw,
    }
}

/// Turns kernel timestamping on for a new socket when tracing is on;
/// `set_option` sets an integer option on the socket.
pub fn setup_socket(set_option: impl FnOnce(i32, i32, i32) -> std::io::Result<()>) {
    init_from_env();
    let flags = timestamping_flags();
    if on() && flags != 0 {
        if let Err(e) = set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, flags) {
            eprintln!("eudp trace: SO_TIMESTAMPING: {e}");
        }
        rx_stamps_ready(flags);
    }
}

/// After a socket asked for `flags`: when they include RX_SOFTWARE, makes
/// sure the kernel stamps arriving packets before any can arrive (once per
/// process, up to 200 ms; see [`timestamp::hold_rx_timestamps`]: without it
/// the first packets of a run may lack their RX_SOFTWARE point).
pub fn rx_stamps_ready(flags: i32) {
    static HOLD: Once = Once::new();
    if flags & libc::SOF_TIMESTAMPING_RX_SOFTWARE as i32 != 0 {
        HOLD.call_once(|| {
            if !timestamp::hold_rx_timestamps(std::time::Duration::from_millis(200)) {
                eprintln!("eudp trace: kernel RX stamping not confirmed (no loopback?); the first packets may lack RX_SOFTWARE");
            }
        });
    }
}

/// Called by the backend's batched receive for message `i` carrying a
/// `CLOCK_REALTIME` RX_SOFTWARE stamp.
/// It only keeps the stamp: mapping it onto the trace clock waits until
/// the message is pushed (messages that are not pushed cost nothing more).
#[inline]
pub fn note_rx_stamp(i: usize, realtime_ns: u64) {
    RX_STAMPS.with(|v| {
        if let Some(c) = v.get(i) {
            c.set(realtime_ns);
        }
    });
}

/// The RX_SOFTWARE stamp of message `i` of this thread's last batched
/// receive on `CLOCK_MONOTONIC_RAW` (taken: 0 afterwards), 0 when none was
/// reported.
pub fn take_rx_stamp(i: usize) -> u64 {
    take_rx_stamp_at(i, stamp().0)
}

/// [`take_rx_stamp`] with the hot-path clock already read (`now`, for the
/// offset's age).
fn take_rx_stamp_at(i: usize, now: u64) -> u64 {
    match RX_STAMPS.with(|v| v.get(i).map(|c| c.replace(0)).unwrap_or(0)) {
        0 => 0,
        real => (real as i64 + offset_cached_at(now)) as u64,
    }
}

/// Tags the datagram this thread received last with the application's own
/// sequence number (lets `eudp trace` match packets across lost datagrams).
pub fn tag_received(app_seq: u64) {
    if on() {
        let i = LAST_POP.with(Cell::get);
        if i != u64::MAX {
            push(Kind::AppSeq, 0, i, app_seq);
        }
    }
}

/// Per-endpoint trace counters. Each is written by one thread at a time
/// (under a lock the engine already holds, or by the only sender).
#[derive(Debug)]
pub struct EpTrace {
    pub id: u64,
    /// Sides whose [`Kind::EpAddr`] is recorded ([`SIDE_SEND`] | [`SIDE_RECV`] bits).
    addrs_noted: AtomicU8,
    tx_seq: AtomicU64,
    q_in: AtomicU64,
    q_out: AtomicU64,
    kmsg: AtomicU64,
    /// `kmsg` when the stamps were last read ([`EpTrace::drain_due`]).
    drained_at: AtomicU64,
    /// Kernel messages whose stamps may wait ([`EpTrace::fit_stamps_to`]).
    read_every: AtomicU64,
    rx_in: AtomicU64,
    rx_out: AtomicU64,
}

impl Default for EpTrace {
    fn default() -> Self {
        Self::new()
    }
}

fn bump(c: &AtomicU64, n: u64) -> u64 {
    c.fetch_add(n, Relaxed)
}

/// As [`bump`] for a counter only ever written under a lock the caller
/// holds (no locked instruction).
fn bump_locked(c: &AtomicU64, n: u64) -> u64 {
    let v = c.load(Relaxed);
    c.store(v + n, Relaxed);
    v
}

/// What an application send call carries from enter to return.
#[derive(Clone, Copy, Debug)]
pub struct SendToken {
    enter: u64,
    bytes: u64,
}

impl EpTrace {
    pub fn new() -> Self {
        EpTrace {
            id: NEXT_EP.fetch_add(1, Relaxed) & 0x7fff,
            addrs_noted: AtomicU8::new(0),
            tx_seq: AtomicU64::new(0),
            q_in: AtomicU64::new(0),
            q_out: AtomicU64::new(0),
            kmsg: AtomicU64::new(0),
            drained_at: AtomicU64::new(0),
            read_every: AtomicU64::new(STAMP_READ_MESSAGES),
            rx_in: AtomicU64::new(0),
            rx_out: AtomicU64::new(0),
        }
    }

    /// Application send entered (call only while tracing is on). The send
    /// gets its sequence number when it is posted or queued.
    #[inline]
    pub fn send_enter(&self, bytes: usize) -> SendToken {
        CUR.with(|c| c.set((u64::MAX, DIRECT)));
        // The seq this call will most likely get (exact with one sending
        // thread); unsampled calls read no clock at all.
        let enter = if sampled(self.tx_seq.load(Relaxed)) { stamp().0.max(1) } else { 0 };
        SendToken { enter, bytes: bytes as u64 }
    }

    /// Records the endpoint's addresses for `side` ([`SIDE_SEND`] or
    /// [`SIDE_RECV`]) the first time it is called for that side: `addrs`
    /// gives (local, the datagram's destination or source), asked only
    /// then (it may make system calls). Called on every traced send, so
    /// the check that it was done is inlined and the recording is not.
    #[inline(always)]
    pub fn note_addrs(
        &self,
        side: u64,
        addrs: impl FnOnce() -> (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
    ) {
        if on() && self.addrs_noted.load(Relaxed) & side as u8 == 0 {
            self.note_addrs_once(side, addrs);
        }
    }

    #[cold]
    #[inline(never)]
    fn note_addrs_once(
        &self,
        side: u64,
        addrs: impl FnOnce() -> (Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
    ) {
        let bit = side as u8;
        if self.addrs_noted.fetch_or(bit, Relaxed) & bit != 0 {
            return;
        }
        let (local, remote) = addrs();
        push_raw(word1(Kind::EpAddr, self.id, false, side), now_ns(), pack_addr(local), pack_addr(remote));
    }

    /// Application send returns: one event for the whole call (unless the
    /// call was not sampled or never posted).
    #[inline]
    pub fn send_return(&self, t: SendToken) {
        let (seq, q) = CUR.with(Cell::get);
        if t.enter == 0 || seq == u64::MAX || !sampled(seq) {
            return;
        }
        let (now, tsc) = stamp();
        let r = if q == DIRECT { send_ref(0, t.bytes, true) } else { send_ref(q, t.bytes, false) };
        push_raw(word1(Kind::SendCall, self.id, tsc, seq), now, t.enter, r);
    }

    /// The send in progress on this thread posts directly (called under the
    /// endpoint's send lock, or by an only sender).
    pub fn direct(&self) {
        if on() {
            CUR.with(|c| c.set((bump_locked(&self.tx_seq, 1), DIRECT)));
        }
    }

    /// The send in progress on this thread was copied into L1 (under the
    /// send lock).
    #[inline]
    pub fn enqueue(&self) {
        if on() {
            CUR.with(|c| c.set((bump_locked(&self.tx_seq, 1), bump_locked(&self.q_in, 1))));
        }
    }

    /// The engine took `n` datagrams from L1 (under the send lock).
    pub fn take(&self, n: usize) {
        if on() {
            let q0 = bump_locked(&self.q_out, n as u64);
            TAKE_BASE.with(|c| c.set(q0));
            push(Kind::Take, self.id, q0, n as u64);
        }
    }

    /// The engine formed a call of `datagrams` starting at staging index `at`.
    pub fn batch(&self, at: usize, datagrams: usize) {
        if on() {
            push(Kind::Batch, self.id, TAKE_BASE.with(Cell::get) + at as u64, datagrams as u64);
        }
    }

    /// A send syscall is about to be made.
    pub fn sys_enter(&self) {
        if on() {
            push(Kind::SysEnter, self.id, self.kmsg.load(Relaxed), 0);
        }
    }

    /// A direct send syscall (one datagram) was accepted.
    pub fn sys_return_direct(&self) {
        if on() {
            let k = bump(&self.kmsg, 1);
            push(Kind::SysReturn, self.id, k, 1);
            let seq = CUR.with(Cell::get).0;
            if seq != u64::MAX {
                push(Kind::KMsg, self.id, k, msg_ref(seq, 1, true));
            }
        }
    }

    /// After a send syscall: true once [`STAMP_READ_MESSAGES`] kernel
    /// messages (fewer with a small receive buffer) were accepted since the
    /// stamps were last read, when the sending thread reads them itself.
    pub fn drain_due(&self) -> bool {
        self.kmsg.load(Relaxed).wrapping_sub(self.drained_at.load(Relaxed)) >= self.read_every.load(Relaxed)
    }

    /// The socket's receive buffer is `rcvbuf` bytes (as the kernel reports
    /// it): the stamps of as many kernel messages wait as fit in half of it,
    /// up to [`STAMP_READ_MESSAGES`], at least one.
    pub fn fit_stamps_to(&self, rcvbuf: usize) {
        let n = (rcvbuf / STAMP_BUFFER_PER_MESSAGE).clamp(1, STAMP_READ_MESSAGES as usize);
        self.read_every.store(n as u64, Relaxed);
    }

    /// A batched send syscall accepted these messages; each is (staging
    /// index of its first datagram, datagrams).
    pub fn sys_return_batch(&self, msgs: &mut dyn Iterator<Item = (usize, usize)>) {
        if on() {
            let base = TAKE_BASE.with(Cell::get);
            let k0 = self.kmsg.load(Relaxed);
            // One clock read for the return and the messages it accepted:
            // a KMsg only maps a kernel message to its datagrams, and
            // nothing happens between the return and these records.
            let (t, tsc) = stamp();
            let mut n = 0;
            for (first, count) in msgs {
                push_raw(
                    word1(Kind::KMsg, self.id, tsc, 0),
                    t,
                    k0 + n,
                    msg_ref(base + first as u64, count as u64, false),
                );
                n += 1;
            }
            self.kmsg.store(k0 + n, Relaxed);
            push_raw(word1(Kind::SysReturn, self.id, tsc, 0), t, k0, n);
        }
    }

    /// Reads the kernel's TX timestamps from the socket's error queue;
    /// returns how many error-queue messages it read.
    ///
    /// With the stamps of [`RING_READ_MESSAGES`] or more kernel messages
    /// waiting, they are read through this thread's io_uring one shot at
    /// a time ([`stamp_ring::read_queued_here`]: about a third of what
    /// `recvmmsg` costs per stamp, but two or three system calls per read);
    /// a `recvmmsg` follows to take what the ring leaves (other queued
    /// errors, stamps queued meanwhile) or reads everything where no ring
    /// can be used. `EUDP_TRACE_STAMP_READER=recvmmsg` always reads with
    /// `recvmmsg` (for comparison).
    pub fn drain_tx(&self, fd: std::os::fd::RawFd) -> usize {
        // No TX stamps asked for (`EUDP_TRACE_KERNEL=0` or `rx`): nothing
        // to read, so no syscall after every send.
        static TX: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !on() || !*TX.get_or_init(|| timestamping_flags() & libc::SOF_TIMESTAMPING_TX_SOFTWARE as i32 != 0) {
            return 0;
        }
        let ring = match RING_READS.load(Relaxed) {
            0 => {
                let on = std::env::var("EUDP_TRACE_STAMP_READER").as_deref() != Ok("recvmmsg");
                set_ring_reads(on);
                on
            }
            r => r == 1,
        };
        let k = self.kmsg.load(Relaxed);
        let waiting = k.wrapping_sub(self.drained_at.swap(k, Relaxed));
        let off = offset_cached();
        let id = self.id;
        let mut record = |key: u32, sched: bool, real_ns: u64| {
            let kind = if sched { Kind::TxSched } else { Kind::TxSoft };
            push_ns(kind, id, (real_ns as i64 + off) as u64, u64::from(key), 0);
        };
        let mut n = 0;
        if ring && waiting >= RING_READ_MESSAGES {
            n += stamp_ring::read_queued_here(fd, &mut |st| record(st.key, st.sched, st.realtime_ns)).unwrap_or(0);
        }
        n + timestamp::read_tx_timestamps(fd, &mut record)
    }

    /// A receive syscall is about to be made.
    pub fn rx_enter(&self) {
        if on() {
            push(Kind::RxEnter, self.id, self.rx_in.load(Relaxed), 0);
        }
    }

    /// Message `i` of the last batched receive, `datagrams` long, entered
    /// the ring (or was handed to the application).
    pub fn rx_push(&self, i: usize, datagrams: usize) {
        if on() {
            // Pushes are serialised by the endpoint's socket-read lock.
            let first = bump_locked(&self.rx_in, datagrams as u64);
            // One clock read: the push's time, also the age check of the
            // realtime offset that maps the message's RX stamp.
            let (now, tsc) = stamp();
            let rx = take_rx_stamp_at(i, now);
            if rx != 0 {
                push_ns(Kind::RxSoft, self.id, rx, first, datagrams as u64);
            }
            push_raw(word1(Kind::RxPush, self.id, tsc, 0), now, first, datagrams as u64);
        }
    }

    /// A datagram left the ring, under the ring's lock (no event: the
    /// receive call's return marks it).
    #[inline]
    pub fn pop(&self) {
        if on() {
            let i = bump_locked(&self.rx_out, 1);
            LAST_POP.with(|c| c.set(i));
        }
    }

    /// Application receive entered (call only while tracing is on); returns
    /// the enter time for [`EpTrace::recv_return`].
    #[inline]
    pub fn recv_enter(&self) -> u64 {
        LAST_POP.with(|c| c.set(u64::MAX));
        if sampled(self.rx_out.load(Relaxed)) {
            stamp().0.max(1)
        } else {
            0
        }
    }

    /// The receive call returns the datagram this thread popped last.
    #[inline]
    pub fn recv_return(&self, enter: u64) {
        let i = LAST_POP.with(Cell::get);
        if i != u64::MAX && enter != 0 && sampled(i) {
            let (now, tsc) = stamp();
            push_raw(word1(Kind::RecvCall, self.id, tsc, 0), now, enter, i);
        }
    }
}

/// Tests that turn tracing on and off hold this: the switch is global, and
/// a test turning it off would cut another's recording short.
#[cfg(test)]
static TEST_SWITCH: Mutex<()> = Mutex::new(());

#[cfg(test)]
fn test_switch() -> std::sync::MutexGuard<'static, ()> {
    TEST_SWITCH.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_round_trip() {
        assert_eq!(unpack_msg_ref(msg_ref(12345, 64, true)), (12345, 64, true));
        assert_eq!(unpack_msg_ref(msg_ref(7, 1, false)), (7, 1, false));
        assert_eq!(unpack_send_ref(send_ref(123_456, 65_507, false)), (123_456, 65_507, false));
        assert_eq!(unpack_send_ref(send_ref(0, 64, true)), (0, 64, true));
    }

    #[test]
    fn tsc_maps_onto_the_raw_clock() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        let tok = t.send_enter(100);
        t.direct();
        let before = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(3));
        t.send_return(tok);
        let after = now_ns();
        disable();
        let ev: Vec<Event> = events().into_iter().filter(|e| e.ep == t.id && e.kind == Kind::SendCall as u8).collect();
        assert_eq!(ev.len(), 1);
        let e = ev[0];
        // The call began before `before` and ended between the two reads.
        assert!(
            e.a <= before + 20_000 && e.ts_ns + 20_000 >= before + 3_000_000 && e.ts_ns <= after + 20_000,
            "{e:?} {before} {after}"
        );
        assert_eq!(unpack_send_ref(e.b), (0, 100, true));
    }

    /// A sending thread reads the stamps once STAMP_READ_MESSAGES kernel
    /// messages are waiting, and a read (by any thread) starts the count
    /// again.
    #[test]
    fn stamps_are_read_every_sixteen_kernel_messages() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&sock);
        for round in 0..2 {
            for i in 1..=STAMP_READ_MESSAGES {
                t.sys_return_direct();
                assert_eq!(t.drain_due(), i == STAMP_READ_MESSAGES, "round {round}, message {i}");
            }
            t.drain_tx(fd);
            assert!(!t.drain_due());
        }
        // A batched send counts each message it accepted.
        t.take(40);
        t.sys_return_batch(&mut (0..STAMP_READ_MESSAGES as usize).map(|i| (i * 2, 2)));
        assert!(t.drain_due());
        t.drain_tx(fd);
        // A small receive buffer holds the stamps of fewer messages: they
        // are read sooner, down to after every message.
        for (rcvbuf, every) in [(212_992, STAMP_READ_MESSAGES), (16_384, 4), (4_608, 1), (0, 1)] {
            t.fit_stamps_to(rcvbuf);
            for i in 1..=every {
                t.sys_return_direct();
                assert_eq!(t.drain_due(), i == every, "rcvbuf {rcvbuf}, message {i}");
            }
            t.drain_tx(fd);
        }
        disable();
    }

    #[test]
    fn kernel_messages_share_the_return_stamp() {
        let _switch = test_switch();
        enable();
        let t = EpTrace::new();
        t.take(10);
        t.sys_enter();
        t.sys_return_batch(&mut [(0usize, 4usize), (4, 4), (8, 2)].into_iter());
        disable();
        let ev: Vec<Event> = events().into_iter().filter(|e| e.ep == t.id).collect();
        let ret: Vec<&Event> = ev.iter().filter(|e| e.kind == Kind::SysReturn as u8).collect();
        let msgs: Vec<&Event> = ev.iter().filter(|e| e.kind == Kind::KMsg as u8).collect();
        assert_eq!((ret.len(), ret[0].a, ret[0].b), (1, 0, 3));
        assert_eq!(
            msgs.iter().map(|e| (e.a, unpack_msg_ref(e.b))).collect::<Vec<_>>(),
            [(0, (0, 4, false)), (1, (4, 4, false)), (2, (8, 2, false))]
        );
        // One clock read serves the return and its messages.
        assert!(msgs.iter().all(|e| e.ts_ns == ret[0].ts_ns), "{ev:?}");
        let enter = ev.iter().find(|e| e.kind == Kind::SysEnter as u8).unwrap();
        assert!(enter.ts_ns <= ret[0].ts_ns);
    }

    #[test]
    fn a_full_buffer_keeps_its_events_and_counts_drops() {
        // Smaller than the prefetch distance: no prefetch may reach past
        // the end, and the events written must be intact.
        let cap = PREFETCH_AHEAD / 2 + 1;
        let buf =
            ThreadBuf { thread: 0, words: (0..cap * 4).map(|_| AtomicU64::new(0)).collect(), len: AtomicUsize::new(0) };
        let d0 = dropped();
        for i in 0..cap as u64 + 3 {
            push_into(&buf, word1(Kind::Take, 7, false, 0), 100 + i, i, 2 * i);
        }
        assert_eq!(buf.len.load(Acquire), cap);
        assert!(dropped() >= d0 + 3);
        for i in 0..cap {
            let w: Vec<u64> = buf.words[i * 4..i * 4 + 4].iter().map(|w| w.load(Relaxed)).collect();
            assert_eq!(w, [100 + i as u64, word1(Kind::Take, 7, false, 0), i as u64, 2 * i as u64]);
        }
    }

    #[test]
    fn clocks_agree() {
        let off = realtime_to_raw_offset();
        let raw = now_ns() as i64;
        let real = clock::realtime_ns() as i64;
        assert!((real + off - raw).abs() < 1_000_000, "offset {off}");
    }
}

#[cfg(test)]
mod cost {
    use super::*;

    /// Cost of one traced application call (enter + return event) and of
    /// one clock read, printed; run with `--release --nocapture` to
    /// measure. Each figure is the best of 20 rounds (the machine may be
    /// shared: a round that was preempted says nothing about the code).
    #[test]
    fn traced_call_cost() {
        let _switch = test_switch();
        enable();
        // Room for all 400 000 events (a full buffer's drop path is another cost).
        set_capacity(1 << 20);
        prepare_thread();
        let t = EpTrace::new();
        let best = |f: &mut dyn FnMut()| {
            let n = 10_000u64;
            (0..20)
                .map(|_| {
                    let t0 = now_ns();
                    for _ in 0..n {
                        f();
                    }
                    (now_ns() - t0) as f64 / n as f64
                })
                .fold(f64::MAX, f64::min)
        };
        let per = best(&mut || {
            let tok = t.send_enter(64);
            t.enqueue();
            t.send_return(tok);
        });
        let per_rx = best(&mut || {
            let e = t.recv_enter();
            t.pop();
            t.recv_return(e);
        });
        let mut x = 0u64;
        let per_clock = best(&mut || x = x.wrapping_add(stamp().0));
        eprintln!(
            "traced send call {per:.1} ns, traced recv call {per_rx:.1} ns, one clock read {per_clock:.1} ns ({x:x})"
        );
        assert!(per < 10_000.0);
    }

    /// What prefetching the event buffer buys on a send-like hot path:
    /// per iteration one 32-byte event, a 1472-byte copy into one of 64
    /// slots and a lock/unlock (a locked instruction waits for the
    /// event's store). The buffers (32 MB each) stream through memory as a
    /// long trace does. Best of 7 rounds each, alternated; printed with
    /// `--release --nocapture`.
    #[test]
    fn event_prefetch_cost() {
        let cap = 1 << 20;
        let words = || -> Box<[AtomicU64]> { (0..cap * 4).map(|_| AtomicU64::new(0)).collect() };
        let bufs = [
            ThreadBuf { thread: 0, words: words(), len: AtomicUsize::new(0) },
            ThreadBuf { thread: 0, words: words(), len: AtomicUsize::new(0) },
        ];
        let slots = Mutex::new(vec![[0u8; 1472]; 64]);
        let data = [7u8; 1472];
        let n = cap / 8;
        let round = |buf: &ThreadBuf, prefetch: bool| {
            let t0 = now_ns();
            for i in 0..n {
                if prefetch {
                    push_into(buf, 1, i as u64, 2, 3);
                } else {
                    // push_into's stores without its prefetch.
                    let k = buf.len.load(Relaxed);
                    let w = &buf.words[k * 4..k * 4 + 4];
                    for (x, v) in w.iter().zip([i as u64, 1, 2, 3]) {
                        x.store(v, Relaxed);
                    }
                    buf.len.store(k + 1, Release);
                }
                slots.lock().unwrap()[i % 64].copy_from_slice(&data);
            }
            (now_ns() - t0) as f64 / n as f64
        };
        let (mut with, mut without) = (f64::MAX, f64::MAX);
        for r in 0..7 {
            // Each round writes a fresh stretch of each buffer.
            with = with.min(round(&bufs[0], true));
            without = without.min(round(&bufs[1], false));
            assert_eq!(bufs[0].len.load(Relaxed), (r + 1) * n);
        }
        eprintln!("event + 1472 B copy + lock: {with:.1} ns with prefetch, {without:.1} ns without");
        assert!(bufs[0].words[4 * (7 * n - 1)].load(Relaxed) == (n - 1) as u64);
    }

    fn thread_cpu_ns() -> u64 {
        clock::thread_cpu_time().as_nanos() as u64
    }

    #[test]
    fn rx_stamping_is_on_once_held() {
        // The kernel turns RX stamping on asynchronously; once this returns
        // true, a fresh stamped socket gets a stamp on its first datagram.
        assert!(timestamp::hold_rx_timestamps(std::time::Duration::from_secs(5)));
        assert!(timestamp::hold_rx_timestamps(std::time::Duration::ZERO));
    }

    /// What reading the error queue less often saves the sending thread:
    /// one-datagram stamped loopback sends, the stamps read back after
    /// every `k` sends, for several `k`, alternated, best of 7 rounds;
    /// printed with `--release --nocapture`.
    #[test]
    fn stamp_read_batching_cost() {
        use crate::backend::kernel::UdpSocket;
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = UdpSocket::new(false).unwrap();
        s.set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, TX_STAMP_FLAGS).unwrap();
        s.connect(&sink.local_addr().unwrap()).unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        let n = 4096u64;
        let ks = [1u64, 2, 8, 32];
        let mut best = [f64::MAX; 4];
        let mut read = 0usize;
        for _ in 0..7 {
            for (j, &k) in ks.iter().enumerate() {
                let c0 = thread_cpu_ns();
                for i in 0..n {
                    s.send_to(&[1u8; 64], None).unwrap();
                    if i % k == k - 1 {
                        read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
                    }
                }
                best[j] = best[j].min((thread_cpu_ns() - c0) as f64 / n as f64);
            }
        }
        eprintln!(
            "stamped one-datagram send + reads after every k sends: {:?} ns for k = {ks:?}",
            best.map(|x| x.round())
        );
        assert_eq!(read as u64, 2 * 7 * n * ks.len() as u64);
    }

    /// What one kernel TX timestamp costs the sending thread: one-datagram
    /// sends on loopback with and without `SO_TIMESTAMPING` (TX_SCHED and
    /// TX_SOFTWARE, two stamps per send, read back 64 at a time as the
    /// engine does), alternated, best of 7 rounds each; printed with
    /// `--release --nocapture`.
    #[test]
    fn kernel_stamp_cost() {
        use crate::backend::kernel::UdpSocket;
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let dst = sink.local_addr().unwrap();
        let socket = |stamped: bool| {
            let s = UdpSocket::new(false).unwrap();
            if stamped {
                s.set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, TX_STAMP_FLAGS).unwrap();
            }
            s.connect(&dst).unwrap();
            s
        };
        let (plain, stamped) = (socket(false), socket(true));
        let fd = std::os::fd::AsRawFd::as_raw_fd(&stamped);
        let n = 4096u64;
        let mut read = 0;
        let mut sent = 0u64;
        let mut round = |s: &UdpSocket, drain: bool, read: &mut usize| {
            let c0 = thread_cpu_ns();
            for i in 0..n {
                sent += u64::from(s.send_to(&[1u8; 64], None).is_ok());
                if drain && i % 64 == 63 {
                    *read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
                }
            }
            if drain {
                *read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {});
            }
            (thread_cpu_ns() - c0) as f64 / n as f64
        };
        let (mut a, mut b) = (f64::MAX, f64::MAX);
        for _ in 0..7 {
            a = a.min(round(&plain, false, &mut read));
            b = b.min(round(&stamped, true, &mut read));
        }
        eprintln!(
            "one-datagram send: {a:.0} ns plain, {b:.0} ns with TX stamps read back: {:.0} ns per stamp",
            (b - a) / 2.0
        );
        // Every send went out and was stamped twice (else this measured nothing).
        assert_eq!(sent, 2 * 7 * n);
        assert_eq!(read as u64, 2 * 7 * n);
    }
}
