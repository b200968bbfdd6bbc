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
//! [`enable`].

use crate::backend::kernel;
use crate::backend::Backend;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Acquire, Ordering::Relaxed, Ordering::Release};
use std::sync::{Arc, Mutex, Once};

static ON: AtomicBool = AtomicBool::new(false);
static ENV: Once = Once::new();
static PATH: Mutex<Option<String>> = Mutex::new(None);
static BUFS: Mutex<Vec<Arc<ThreadBuf>>> = Mutex::new(Vec::new());
static NEXT_EP: AtomicU64 = AtomicU64::new(1);
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Events each thread can hold by default (32 bytes each); `EUDP_TRACE_EVENTS`
/// overrides it.
pub const THREAD_CAPACITY: usize = 1 << 18;

fn capacity() -> usize {
    static CAP: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CAP.get_or_init(|| std::env::var("EUDP_TRACE_EVENTS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(THREAD_CAPACITY))
}

/// True while tracing is on. This is the only thing a hook costs when off.
#[inline(always)]
pub fn on() -> bool {
    ON.load(Relaxed)
}

/// What an event marks. The numbers are part of the dump format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Application send call entered: a = send seq, b = bytes.
    SendEnter = 1,
    /// Application send call returns: a = send seq.
    SendReturn = 2,
    /// Posted directly on the caller's thread: a = send seq.
    Direct = 3,
    /// Copied into L1: a = send seq, b = L1 index.
    Enqueue = 4,
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
    /// Datagram delivered from the ring: a = arrival index.
    Pop = 15,
    /// Application receive call entered.
    RecvEnter = 16,
    /// Application receive call returns a datagram: a = arrival index.
    RecvReturn = 17,
}

/// Packs what a kernel message carries: its first datagram (a send seq when
/// `direct`, else an L1 index) and how many datagrams it holds.
pub fn msg_ref(first: u64, count: u64, direct: bool) -> u64 {
    (first & ((1 << 47) - 1)) | (u64::from(direct) << 47) | (count << 48)
}

/// Inverse of [`msg_ref`]: (first, count, direct).
pub fn unpack_msg_ref(b: u64) -> (u64, u64, bool) {
    (b & ((1 << 47) - 1), b >> 48, (b >> 47) & 1 == 1)
}

/// One thread's bounded event buffer: 4 words per event.
#[derive(Debug)]
struct ThreadBuf {
    thread: u64,
    words: Box<[AtomicU64]>,
    len: AtomicUsize,
}

thread_local! {
    static BUF: std::cell::RefCell<Option<Arc<ThreadBuf>>> = const { std::cell::RefCell::new(None) };
    /// Send seq of the call in progress on this thread.
    static CUR_SEQ: Cell<u64> = const { Cell::new(0) };
    /// First L1 index of what the engine took last on this thread.
    static TAKE_BASE: Cell<u64> = const { Cell::new(0) };
    /// Arrival index of the datagram this thread popped last.
    static LAST_POP: Cell<u64> = const { Cell::new(u64::MAX) };
    /// RX_SOFTWARE stamps of the last batched receive on this thread, by message.
    static RX_STAMPS: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// `CLOCK_MONOTONIC_RAW` now, in nanoseconds.
#[inline]
pub fn now_ns() -> u64 {
    kernel::monotonic_raw_ns()
}

/// Offset to add to a `CLOCK_REALTIME` nanosecond stamp to put it on
/// `CLOCK_MONOTONIC_RAW`, from the tightest of three bracketed samples.
pub fn realtime_to_raw_offset() -> i64 {
    let mut best = (u64::MAX, 0i64);
    for _ in 0..3 {
        let a = kernel::monotonic_raw_ns();
        let r = kernel::realtime_ns();
        let b = kernel::monotonic_raw_ns();
        let width = b.saturating_sub(a);
        if width < best.0 {
            best = (width, (a / 2 + b / 2) as i64 - r as i64);
        }
    }
    best.1
}

/// Allocates this thread's buffer now, so the first traced packet does not
/// pay for it (the engine thread calls it at start when tracing is on).
pub fn prepare_thread() {
    if on() {
        BUF.with(|cell| {
            cell.borrow_mut().get_or_insert_with(new_buf);
        });
    }
}

fn new_buf() -> Arc<ThreadBuf> {
    let words: Vec<AtomicU64> = (0..capacity() * 4).map(|_| AtomicU64::new(0)).collect();
    let b = Arc::new(ThreadBuf { thread: NEXT_THREAD.fetch_add(1, Relaxed), words: words.into_boxed_slice(), len: AtomicUsize::new(0) });
    BUFS.lock().unwrap_or_else(|e| e.into_inner()).push(b.clone());
    b
}

#[cold]
#[inline(never)]
fn push(kind: Kind, ep: u64, ts: u64, a: u64, b: u64) {
    BUF.with(|cell| {
        let mut slot = cell.borrow_mut();
        let buf = slot.get_or_insert_with(new_buf);
        let n = buf.len.load(Relaxed);
        if n * 4 >= buf.words.len() {
            DROPPED.fetch_add(1, Relaxed);
            return;
        }
        let w = &buf.words[n * 4..n * 4 + 4];
        w[0].store(ts, Relaxed);
        w[1].store(kind as u64 | (ep << 8), Relaxed);
        w[2].store(a, Relaxed);
        w[3].store(b, Relaxed);
        buf.len.store(n + 1, Release);
    });
}

/// Records an event now (for tools that trace their own layers).
pub fn record(kind: Kind, ep: u64, a: u64, b: u64) {
    if on() {
        push(kind, ep, now_ns(), a, b);
    }
}

/// Records an event with a given `CLOCK_MONOTONIC_RAW` timestamp.
pub fn record_at(kind: Kind, ep: u64, ts: u64, a: u64, b: u64) {
    if on() {
        push(kind, ep, ts, a, b);
    }
}

/// Turns tracing on (sockets created from now on are timestamped).
pub fn enable() {
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

/// One recorded event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    pub ts_ns: u64,
    pub kind: u8,
    pub ep: u64,
    pub thread: u64,
    pub a: u64,
    pub b: u64,
}

/// Every event recorded so far, thread by thread in recording order.
pub fn events() -> Vec<Event> {
    let bufs = BUFS.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut out = Vec::new();
    for b in bufs {
        let n = b.len.load(Acquire);
        for i in 0..n {
            let w = &b.words[i * 4..i * 4 + 4];
            let kw = w[1].load(Relaxed);
            out.push(Event { ts_ns: w[0].load(Relaxed), kind: (kw & 0xff) as u8, ep: kw >> 8, thread: b.thread, a: w[2].load(Relaxed), b: w[3].load(Relaxed) });
        }
    }
    out
}

/// Events dropped because a thread's buffer was full.
pub fn dropped() -> u64 {
    DROPPED.load(Relaxed)
}

/// The events as JSON: `{"clock": ..., "dropped": n, "events": [[ts, kind,
/// ep, thread, a, b], ...]}` (documented in docs/trace.md).
pub fn dump_json() -> String {
    use std::fmt::Write;
    let ev = events();
    let mut s = String::with_capacity(ev.len() * 40 + 128);
    let _ = write!(s, "{{\"clock\":\"CLOCK_MONOTONIC_RAW\",\"pid\":{},\"dropped\":{},\"events\":[", std::process::id(), dropped());
    for (i, e) in ev.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "[{},{},{},{},{},{}]", e.ts_ns, e.kind, e.ep, e.thread, e.a, e.b);
    }
    s.push_str("]}\n");
    s
}

/// Writes the events to `EUDP_TRACE`'s path, if set (tracing stays on).
pub fn finish() -> std::io::Result<()> {
    let p = PATH.lock().unwrap_or_else(|e| e.into_inner()).clone();
    match p {
        Some(p) => std::fs::write(p, dump_json()),
        None => Ok(()),
    }
}

/// Kernel timestamping flags the engine asks for on a traced socket.
pub fn timestamping_flags() -> i32 {
    (libc::SOF_TIMESTAMPING_TX_SCHED
        | libc::SOF_TIMESTAMPING_TX_SOFTWARE
        | libc::SOF_TIMESTAMPING_RX_SOFTWARE
        | libc::SOF_TIMESTAMPING_SOFTWARE
        | libc::SOF_TIMESTAMPING_OPT_ID
        | libc::SOF_TIMESTAMPING_OPT_TSONLY) as i32
}

/// Turns kernel timestamping on for a new socket when tracing is on.
pub fn setup_socket(b: &dyn Backend) {
    init_from_env();
    if on() {
        if let Err(e) = b.set_option(libc::SOL_SOCKET, kernel::SO_TIMESTAMPING, timestamping_flags()) {
            eprintln!("eudp trace: SO_TIMESTAMPING: {e}");
        }
    }
}

/// Called by the backend's batched receive for message `i` carrying a
/// `CLOCK_REALTIME` RX_SOFTWARE stamp.
pub fn note_rx_stamp(i: usize, realtime_ns: u64) {
    RX_STAMPS.with(|v| {
        let mut v = v.borrow_mut();
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        v[i] = (realtime_ns as i64 + realtime_to_raw_offset()) as u64;
    });
}

/// The RX_SOFTWARE stamp of message `i` of this thread's last batched
/// receive (taken: 0 afterwards), 0 when none was reported.
pub fn take_rx_stamp(i: usize) -> u64 {
    RX_STAMPS.with(|v| v.borrow_mut().get_mut(i).map(std::mem::take).unwrap_or(0))
}

/// Per-endpoint trace counters. Each is written by one thread at a time
/// (under a lock the engine already holds, or by the only sender).
#[derive(Debug)]
pub struct EpTrace {
    pub id: u64,
    tx_seq: AtomicU64,
    q_in: AtomicU64,
    q_out: AtomicU64,
    kmsg: AtomicU64,
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

impl EpTrace {
    pub fn new() -> Self {
        EpTrace {
            id: NEXT_EP.fetch_add(1, Relaxed),
            tx_seq: AtomicU64::new(0),
            q_in: AtomicU64::new(0),
            q_out: AtomicU64::new(0),
            kmsg: AtomicU64::new(0),
            rx_in: AtomicU64::new(0),
            rx_out: AtomicU64::new(0),
        }
    }

    /// Application send entered; returns its seq (also kept per thread).
    pub fn send_enter(&self, bytes: usize) -> u64 {
        let seq = bump(&self.tx_seq, 1);
        CUR_SEQ.with(|c| c.set(seq));
        push(Kind::SendEnter, self.id, now_ns(), seq, bytes as u64);
        seq
    }

    pub fn send_return(&self, seq: u64) {
        push(Kind::SendReturn, self.id, now_ns(), seq, 0);
    }

    /// The send in progress on this thread posts directly.
    pub fn direct(&self) {
        if on() {
            push(Kind::Direct, self.id, now_ns(), CUR_SEQ.with(Cell::get), 0);
        }
    }

    /// The send in progress on this thread was copied into L1.
    pub fn enqueue(&self) {
        if on() {
            let q = bump(&self.q_in, 1);
            push(Kind::Enqueue, self.id, now_ns(), CUR_SEQ.with(Cell::get), q);
        }
    }

    /// The engine took `n` datagrams from L1.
    pub fn take(&self, n: usize) {
        if on() {
            let q0 = bump(&self.q_out, n as u64);
            TAKE_BASE.with(|c| c.set(q0));
            push(Kind::Take, self.id, now_ns(), q0, n as u64);
        }
    }

    /// The engine formed a call of `datagrams` starting at staging index `at`.
    pub fn batch(&self, at: usize, datagrams: usize) {
        if on() {
            push(Kind::Batch, self.id, now_ns(), TAKE_BASE.with(Cell::get) + at as u64, datagrams as u64);
        }
    }

    /// A send syscall is about to be made.
    pub fn sys_enter(&self) {
        if on() {
            push(Kind::SysEnter, self.id, now_ns(), self.kmsg.load(Relaxed), 0);
        }
    }

    /// A direct send syscall (one datagram) was accepted.
    pub fn sys_return_direct(&self) {
        if on() {
            let t = now_ns();
            let k = bump(&self.kmsg, 1);
            push(Kind::SysReturn, self.id, t, k, 1);
            push(Kind::KMsg, self.id, t, k, msg_ref(CUR_SEQ.with(Cell::get), 1, true));
        }
    }

    /// A batched send syscall accepted these messages; each is (staging
    /// index of its first datagram, datagrams).
    pub fn sys_return_batch(&self, msgs: &mut dyn Iterator<Item = (usize, usize)>) {
        if on() {
            let t = now_ns();
            let base = TAKE_BASE.with(Cell::get);
            let k0 = self.kmsg.load(Relaxed);
            let mut n = 0;
            for (first, count) in msgs {
                push(Kind::KMsg, self.id, t, k0 + n, msg_ref(base + first as u64, count as u64, false));
                n += 1;
            }
            self.kmsg.store(k0 + n, Relaxed);
            push(Kind::SysReturn, self.id, t, k0, n);
        }
    }

    /// Reads the kernel's TX timestamps from the socket's error queue.
    pub fn drain_tx(&self, fd: std::os::fd::RawFd) {
        if !on() {
            return;
        }
        let off = realtime_to_raw_offset();
        let id = self.id;
        kernel::read_tx_timestamps(fd, &mut |key, sched, real_ns| {
            let kind = if sched { Kind::TxSched } else { Kind::TxSoft };
            push(kind, id, (real_ns as i64 + off) as u64, u64::from(key), 0);
        });
    }

    /// A receive syscall is about to be made.
    pub fn rx_enter(&self) {
        if on() {
            push(Kind::RxEnter, self.id, now_ns(), self.rx_in.load(Relaxed), 0);
        }
    }

    /// Message `i` of the last batched receive, `datagrams` long, entered
    /// the ring (or was handed to the application).
    pub fn rx_push(&self, i: usize, datagrams: usize) {
        if on() {
            let t = now_ns();
            let first = bump(&self.rx_in, datagrams as u64);
            let stamp = take_rx_stamp(i);
            if stamp != 0 {
                push(Kind::RxSoft, self.id, stamp, first, datagrams as u64);
            }
            push(Kind::RxPush, self.id, t, first, datagrams as u64);
        }
    }

    /// A datagram left the ring.
    pub fn pop(&self) {
        if on() {
            let i = bump(&self.rx_out, 1);
            LAST_POP.with(|c| c.set(i));
            push(Kind::Pop, self.id, now_ns(), i, 0);
        }
    }

    pub fn recv_enter(&self) {
        LAST_POP.with(|c| c.set(u64::MAX));
        push(Kind::RecvEnter, self.id, now_ns(), 0, 0);
    }

    /// The receive call returns the datagram this thread popped last.
    pub fn recv_return(&self) {
        let i = LAST_POP.with(Cell::get);
        if i != u64::MAX {
            push(Kind::RecvReturn, self.id, now_ns(), i, 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refs_round_trip() {
        assert_eq!(unpack_msg_ref(msg_ref(12345, 64, true)), (12345, 64, true));
        assert_eq!(unpack_msg_ref(msg_ref(7, 1, false)), (7, 1, false));
    }

    #[test]
    fn clocks_agree() {
        let off = realtime_to_raw_offset();
        let raw = now_ns() as i64;
        let real = kernel::realtime_ns() as i64;
        assert!((real + off - raw).abs() < 1_000_000, "offset {off}");
    }
}
