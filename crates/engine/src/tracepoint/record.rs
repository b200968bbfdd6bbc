//! The switch, the per-thread event buffers and the dump.

use super::clock::*;
use crate::sys::io_uring as stamp_ring;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Mutex, Once};

pub(super) static ON: AtomicBool = AtomicBool::new(false);
pub(super) static ENV: Once = Once::new();
pub(super) static PATH: Mutex<Option<String>> = Mutex::new(None);
pub(super) static BUFS: Mutex<Vec<&'static ThreadBuf>> = Mutex::new(Vec::new());
pub(super) static NEXT_EP: AtomicU64 = AtomicU64::new(1);
pub(super) static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
pub(super) static DROPPED: AtomicU64 = AtomicU64::new(0);
/// Record one datagram in this many; 1: every datagram.
pub(super) static SAMPLE: AtomicU64 = AtomicU64::new(1);
/// `SAMPLE - 1` when it is a power of two (a mask decides without a
/// division on the hot path), else `u64::MAX`.
pub(super) static SAMPLE_MASK: AtomicU64 = AtomicU64::new(0);

/// Events each thread can hold by default (32 bytes each); `EUDP_TRACE_EVENTS`
/// overrides it.
pub const THREAD_CAPACITY: usize = 1 << 18;

/// Capacity of buffers created from now on; 0: not set yet.
pub(super) static CAP: AtomicUsize = AtomicUsize::new(0);

pub(super) fn capacity() -> usize {
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
    /// One EMP step ([`crate::tracepoint::span_end`]), recorded at its end:
    /// a = its start on the trace clock, b = the peer's [`pack_addr`],
    /// extra = the step's own words (`emp::steptrace` packs them).
    EmpStep = 20,
    /// The EMP role of the recording thread, once per thread before its
    /// first [`Kind::EmpStep`]: a = 0 for an application thread, 1 + the
    /// engine thread's index in its scheme's placement.
    EmpThread = 21,
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
pub(super) struct ThreadBuf {
    pub(super) thread: u64,
    pub(super) words: Box<[AtomicU64]>,
    pub(super) len: AtomicUsize,
}

thread_local! {
    static BUF: Cell<Option<&'static ThreadBuf>> = const { Cell::new(None) };
}

/// Sampled datagrams come in runs of this many consecutive numbers: one
/// run in `n` is traced. The kernel stamps per message, and a GSO message
/// carries up to 128 datagrams, so one datagram in `n` picked alone would
/// stamp every message whenever `n` is below the message's size; a run of
/// 64 lies in one or two messages, so the stamped messages fall with `n`
/// as the traced datagrams do. Still one datagram in `n`, every layer.
pub const SAMPLE_RUN: u64 = 64;

/// Traces one datagram in `n`: the runs of [`SAMPLE_RUN`] send seqs (at
/// the sender) or arrival indices (at the receiver) whose run number `n`
/// divides ([`is_sampled`]), so both ends pick the same datagrams where
/// none is lost or reordered; 1: all. The sending call
/// decides once, when it is entered, and the decision holds for the
/// call's return; the engine's batch events and the kernel's stamps are
/// per batch and message, so they are recorded for every batch, and a
/// sampled datagram has every layer. Also `EUDP_TRACE_SAMPLE`.
pub fn set_sample(n: u64) {
    let n = n.max(1);
    SAMPLE.store(n, Relaxed);
    SAMPLE_MASK.store(if n.is_power_of_two() { n - 1 } else { u64::MAX }, Relaxed);
}

/// The datagrams traced: one in this many.
pub fn sample() -> u64 {
    SAMPLE.load(Relaxed)
}

/// True when datagram number `i` is traced under one in `n` (the rule of
/// [`set_sample`], for readers of a trace).
#[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
pub fn is_sampled(i: u64, n: u64) -> bool {
    n <= 1 || (i / SAMPLE_RUN) % n == 0
}

/// The number of the `k`-th datagram (from 0) traced under one in `n`.
pub fn nth_sampled(k: u64, n: u64) -> u64 {
    let n = n.max(1);
    (k / SAMPLE_RUN) * SAMPLE_RUN * n + k % SAMPLE_RUN
}

/// True when datagram `i` is traced.
#[inline]
#[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
pub(super) fn sampled(i: u64) -> bool {
    match SAMPLE_MASK.load(Relaxed) {
        u64::MAX => (i / SAMPLE_RUN) % SAMPLE.load(Relaxed) == 0,
        mask => (i / SAMPLE_RUN) & mask == 0,
    }
}

/// Event word 1: kind (bits 0-7), timestamps in TSC ticks (bit 8),
/// endpoint (bits 9-23), extra (bits 24-63).
pub(super) const TSC_FLAG: u64 = 1 << 8;

/// Allocates this thread's buffer now, so the first traced packet does not
/// pay for it (the engine thread calls it at start when tracing is on).
pub fn prepare_thread() {
    if on() {
        thread_buf();
    }
}

/// This thread's buffer, created on first use.
#[inline]
pub(super) fn thread_buf() -> &'static ThreadBuf {
    match BUF.with(Cell::get) {
        Some(b) => b,
        None => new_buf(),
    }
}

#[cold]
#[inline(never)]
pub(super) fn new_buf() -> &'static ThreadBuf {
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
pub(super) const PREFETCH_AHEAD: usize = 32;

/// Asks for the cache line at `w` in a writable state (a hint only).
///
/// The event buffers stream through memory (tens of MB per thread per
/// run), so without it each new line is a store miss; the store then waits
/// in the store buffer and the next locked instruction of the hot path (the
/// endpoint's send lock) waits for it.
#[inline(always)]
pub(super) fn prefetch_for_write(w: &AtomicU64) {
    crate::sys::cache::prefetch_for_write(w);
}

#[inline]
pub(super) fn push_raw(w1: u64, ts: u64, a: u64, b: u64) {
    push_into(thread_buf(), w1, ts, a, b);
}

/// Appends one event to `buf` (its owning thread only), or counts it
/// dropped when `buf` is full.
#[inline(always)]
pub(super) fn push_into(buf: &ThreadBuf, w1: u64, ts: u64, a: u64, b: u64) {
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

pub(super) fn word1(kind: Kind, ep: u64, tsc: bool, extra: u64) -> u64 {
    kind as u64 | if tsc { TSC_FLAG } else { 0 } | ((ep & 0x7fff) << 9) | (extra << 24)
}

/// An event stamped now on the hot-path clock.
#[inline]
pub(super) fn push(kind: Kind, ep: u64, a: u64, b: u64) {
    let (t, tsc) = stamp();
    push_raw(word1(kind, ep, tsc, 0), t, a, b);
}

/// An event with a `CLOCK_MONOTONIC_RAW` timestamp.
pub(super) fn push_ns(kind: Kind, ep: u64, ts_ns: u64, a: u64, b: u64) {
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

/// Names the file the events go to from now on (`%p`: the pid), as
/// `EUDP_TRACE` does: for tracing turned on at run time.
pub fn set_path(pattern: &str) {
    *PATH.lock().unwrap_or_else(|e| e.into_inner()) = Some(pattern.to_string());
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
                if kind == Kind::SendCall as u8 || kind == Kind::RecvCall as u8 || kind == Kind::EmpStep as u8 {
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
