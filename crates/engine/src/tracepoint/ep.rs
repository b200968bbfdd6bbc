//! An endpoint's trace (its counters and the events of its calls) and the
//! kernel's timestamps (TX stamps read off the error queue, RX stamps
//! noted by the receive path).

use super::clock::{now_ns, offset_cached, offset_cached_at, stamp};
use super::record::*;
use crate::sys::io_uring as stamp_ring;
use crate::sys::timestamp;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Once;

pub(super) const DIRECT: u64 = u64::MAX;
/// Messages of one batched receive whose RX stamps a thread keeps (the
/// engine reads at most 64 per call).
pub(super) const RX_STAMP_SLOTS: usize = 128;
#[allow(clippy::declare_interior_mutable_const)] // only an array initialiser
pub(super) const ZERO: Cell<u64> = Cell::new(0);

thread_local! {
    /// Send seq of the call in progress on this thread (u64::MAX: none
    /// yet) and its L1 index, or DIRECT.
    static CUR: Cell<(u64, u64)> = const { Cell::new((u64::MAX, DIRECT)) };
    /// First L1 index of what the engine took last on this thread.
    static TAKE_BASE: Cell<u64> = const { Cell::new(0) };
    /// This thread's send syscall in progress was entered while tracing was
    /// on: only such a call is numbered when it returns, so a call that
    /// began before tracing was turned on at run time (when the kernel did
    /// not stamp it) does not shift the numbering against the kernel's keys.
    static SYS_TRACED: Cell<bool> = const { Cell::new(false) };
    /// Arrival index of the datagram this thread popped last, u64::MAX when
    /// it was not sampled.
    static LAST_POP: Cell<u64> = const { Cell::new(u64::MAX) };
    /// RX_SOFTWARE stamps (`CLOCK_REALTIME`) of the last batched receive on
    /// this thread, by message (0: none).
    static RX_STAMPS: [Cell<u64>; RX_STAMP_SLOTS] = const { [ZERO; RX_STAMP_SLOTS] };
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
pub(super) const STAMP_BUFFER_PER_MESSAGE: usize = 4096;

/// Kernel messages' stamps from which [`EpTrace::drain_tx`] reads through
/// io_uring rather than `recvmmsg` alone (`one_shot_read_cost`: at one
/// message per read the ring costs more, at eight it saves).
pub(super) const RING_READ_MESSAGES: u64 = 4;

/// Whether TX stamps are read through io_uring where it pays: 0 not
/// decided yet (`EUDP_TRACE_STAMP_READER`), 1 yes, 2 `recvmmsg` only.
pub(super) static RING_READS: AtomicU8 = AtomicU8::new(0);

/// Reads TX stamps through io_uring where it pays (the default) or with
/// `recvmmsg` only (`EUDP_TRACE_STAMP_READER=recvmmsg`), from now on.
pub fn set_ring_reads(on: bool) {
    RING_READS.store(if on { 1 } else { 2 }, Relaxed);
}

/// The TX stamps a traced socket asks for: TX_SCHED and TX_SOFTWARE, each
/// keyed by the socket's OPT_ID counter, without a copy of the payload.
pub(super) const TX_STAMPS: i32 = (libc::SOF_TIMESTAMPING_TX_SCHED
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

/// The kernel's TX stamp records, which a socket asks for either in its
/// own flags (every message stamped) or per message in a control message
/// (sampled tracing).
const TX_RECORD: i32 = (libc::SOF_TIMESTAMPING_TX_SCHED | libc::SOF_TIMESTAMPING_TX_SOFTWARE) as i32;

/// After a socket asked for `flags`: when they include RX_SOFTWARE, makes
/// sure the kernel stamps arriving packets before any can arrive (once per
/// process, up to 200 ms; see [`timestamp::hold_rx_timestamps`]: without it
/// the first packets of a run may lack their RX_SOFTWARE point).
pub fn rx_stamps_ready(flags: i32) {
    static HOLD: Once = Once::new();
    if flags & libc::SOF_TIMESTAMPING_RX_SOFTWARE as i32 != 0 {
        HOLD.call_once(|| {
            if !timestamp::hold_rx_timestamps(std::time::Duration::from_millis(200)) {
                crate::log::write(
                    crate::log::Level::Warn,
                    format_args!("trace: kernel RX stamping not confirmed (no loopback?); the first packets may lack RX_SOFTWARE"),
                );
            }
        });
    }
}

/// As [`rx_stamps_ready`], then looks again for up to `wait` until an
/// arriving packet carries its stamp (for tracing turned on at run time,
/// where waiting at the start costs no traced packet; under load the
/// kernel's deferred switch can take longer than the first look). Returns
/// whether stamping is confirmed (true when `flags` asks for no RX stamps).
pub fn rx_stamps_confirmed(flags: i32, wait: std::time::Duration) -> bool {
    rx_stamps_ready(flags);
    flags & libc::SOF_TIMESTAMPING_RX_SOFTWARE as i32 == 0 || timestamp::hold_rx_timestamps(wait)
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
pub(super) fn take_rx_stamp_at(i: usize, now: u64) -> u64 {
    match RX_STAMPS.with(|v| v.get(i).map(|c| c.replace(0)).unwrap_or(0)) {
        0 => 0,
        real => (real as i64 + offset_cached_at(now)) as u64,
    }
}

/// Tags the datagram this thread received last with the application's own
/// sequence number (lets `eudp trace` match packets across lost datagrams).
/// Called after every receive, so inlined into the caller: an unsampled
/// datagram then costs a load or two rather than a call.
#[inline]
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
    /// The socket asks for TX stamps per message ([`EpTrace::socket_flags`]):
    /// only messages carrying a sampled datagram are stamped and counted.
    per_msg: AtomicBool,
    /// Reads of the error queue for TX stamps ([`EpTrace::drain_tx`]; one
    /// or more system calls each), and those of them a sending thread made
    /// after its own send ([`EpTrace::after_send`]).
    stamp_reads: AtomicU64,
    send_reads: AtomicU64,
}

/// How often an endpoint's error queue was read for TX stamps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StampReads {
    /// By a sending thread right after its send syscall, once enough
    /// stamped messages wait.
    pub after_send: u64,
    /// By anyone: after sends, on an engine wake-up, while waiting for
    /// room, at close.
    pub total: u64,
}

impl Default for EpTrace {
    fn default() -> Self {
        Self::new()
    }
}

pub(super) fn bump(c: &AtomicU64, n: u64) -> u64 {
    c.fetch_add(n, Relaxed)
}

/// As [`bump`] for a counter only ever written under a lock the caller
/// holds (no locked instruction).
pub(super) fn bump_locked(c: &AtomicU64, n: u64) -> u64 {
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
            per_msg: AtomicBool::new(false),
            stamp_reads: AtomicU64::new(0),
            send_reads: AtomicU64::new(0),
        }
    }

    /// The socket flags to set for kernel timestamping `flags`
    /// ([`timestamping_flags`]) on this endpoint's socket, and notes how
    /// its TX stamps are asked for. Sampling one datagram in more than one,
    /// the socket keeps the reporting flags and `OPT_ID` but no TX record:
    /// the messages carrying a sampled datagram ask for TX_SCHED and
    /// TX_SOFTWARE in an `SO_TIMESTAMPING` control message, so the kernel
    /// stamps (and gives an `OPT_ID` key to) only those, and an unsampled
    /// datagram costs no stamp and no error-queue read.
    pub fn socket_flags(&self, flags: i32) -> i32 {
        let per_msg = flags & TX_RECORD != 0 && sample() > 1;
        self.per_msg.store(per_msg, Relaxed);
        if per_msg {
            flags & !TX_RECORD
        } else {
            flags
        }
    }

    /// Turns kernel timestamping on for this endpoint's new socket when
    /// tracing is on; `set_option` sets an integer option on the socket.
    pub fn setup_socket(&self, set_option: impl FnOnce(i32, i32, i32) -> std::io::Result<()>) {
        init_from_env();
        let flags = timestamping_flags();
        if on() && flags != 0 {
            if let Err(e) = set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, self.socket_flags(flags)) {
                crate::log::write(crate::log::Level::Warn, format_args!("trace: SO_TIMESTAMPING: {e}"));
            }
            rx_stamps_ready(flags);
        }
    }

    /// Whether the messages a send syscall carries ask for their TX stamps
    /// one by one ([`EpTrace::socket_flags`]; `OutMsg::stamp`).
    #[inline]
    pub fn stamps_per_message(&self) -> bool {
        on() && self.per_msg.load(Relaxed)
    }

    /// Whether the direct post in progress on this thread is to ask for
    /// its TX stamps (sampled, on a socket that asks per message).
    #[inline]
    pub fn direct_stamp(&self) -> bool {
        self.stamps_per_message() && sampled(CUR.with(Cell::get).0)
    }

    /// Starts the counters again, for tracing turned on while the endpoint
    /// is open (call while tracing is off, under the send lock and the
    /// receive locks): `queued` datagrams wait in L1 and `ringed` in the
    /// ring, untraced; they keep their places in the numbering so the
    /// datagrams after them get the indices the engine's events will name.
    /// The kernel's `OPT_ID` keys restart with the option, as `kmsg` does.
    pub fn restart(&self, queued: u64, ringed: u64) {
        self.addrs_noted.store(0, Relaxed);
        for c in [&self.tx_seq, &self.q_out, &self.kmsg, &self.drained_at, &self.rx_out] {
            c.store(0, Relaxed);
        }
        self.q_in.store(queued, Relaxed);
        self.rx_in.store(ringed, Relaxed);
    }

    /// Application send entered (call only while tracing is on). The send
    /// gets its sequence number when it is posted or queued.
    #[inline]
    pub fn send_enter(&self, bytes: usize) -> SendToken {
        // The seq this call will most likely get (exact with one sending
        // thread); unsampled calls read no clock and touch no thread-local:
        // their return records nothing.
        let enter = if sampled(self.tx_seq.load(Relaxed)) {
            CUR.with(|c| c.set((u64::MAX, DIRECT)));
            stamp().0.max(1)
        } else {
            0
        };
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
        // The call decided when it was entered (enter 0: not traced).
        if t.enter == 0 {
            return;
        }
        let (seq, q) = CUR.with(Cell::get);
        if seq == u64::MAX {
            return;
        }
        let (now, tsc) = stamp();
        let r = if q == DIRECT { send_ref(0, t.bytes, true) } else { send_ref(q, t.bytes, false) };
        push_raw(word1(Kind::SendCall, self.id, tsc, seq), now, t.enter, r);
    }

    /// The send in progress on this thread posts directly (called under the
    /// endpoint's send lock, or by an only sender). Returns the send seq it
    /// gave the datagram (None: tracing off), for [`EpTrace::requeue_direct`].
    pub fn direct(&self) -> Option<u64> {
        if on() {
            let seq = bump_locked(&self.tx_seq, 1);
            CUR.with(|c| c.set((seq, DIRECT)));
            Some(seq)
        } else {
            None
        }
    }

    /// The direct post that [`EpTrace::direct`] numbered `seq` was queued in
    /// L1 instead (the kernel's send buffer was full; under the send lock):
    /// the datagram keeps its send seq and takes an L1 index. Returns, as
    /// [`EpTrace::enqueue`] does, whether its message is to ask for TX stamps.
    pub fn requeue_direct(&self, seq: Option<u64>) -> bool {
        match seq {
            Some(seq) if on() => {
                CUR.with(|c| c.set((seq, bump_locked(&self.q_in, 1))));
                self.per_msg.load(Relaxed) && sampled(seq)
            }
            // Tracing went on since the post: the datagram is numbered now.
            _ => self.enqueue(),
        }
    }

    /// The send in progress on this thread was copied into L1 (under the
    /// send lock). Returns whether its message is to ask for TX stamps
    /// (sampled, on a socket that asks per message): the caller marks
    /// its L1 slot.
    #[inline]
    pub fn enqueue(&self) -> bool {
        if !on() {
            return false;
        }
        let seq = bump_locked(&self.tx_seq, 1);
        CUR.with(|c| c.set((seq, bump_locked(&self.q_in, 1))));
        self.per_msg.load(Relaxed) && sampled(seq)
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

    /// A send syscall is about to be made; `stamped`: the kernel stamps a
    /// message of it (always, unless the socket asks per message). A call
    /// whose messages are not stamped records nothing (and a call that
    /// failed leaves no mark for the next one's return).
    pub fn sys_enter(&self, stamped: bool) {
        if on() {
            SYS_TRACED.with(|c| c.set(stamped));
            if stamped {
                push(Kind::SysEnter, self.id, self.kmsg.load(Relaxed), 0);
            }
        }
    }

    /// A direct send syscall (one datagram) was accepted (its
    /// [`EpTrace::sys_enter`] said whether it was stamped).
    pub fn sys_return_direct(&self) {
        if on() && SYS_TRACED.with(|c| c.replace(false)) {
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
    /// index of its first datagram, datagrams, whether it asked for its TX
    /// stamps). Where the socket asks per message, only the messages that
    /// asked get `OPT_ID` keys, so only they are numbered.
    pub fn sys_return_batch(&self, msgs: &mut dyn Iterator<Item = (usize, usize, bool)>) {
        if on() && SYS_TRACED.with(|c| c.replace(false)) {
            let base = TAKE_BASE.with(Cell::get);
            let k0 = self.kmsg.load(Relaxed);
            // One clock read for the return and the messages it accepted:
            // a KMsg only maps a kernel message to its datagrams, and
            // nothing happens between the return and these records.
            let (t, tsc) = stamp();
            let per_msg = self.per_msg.load(Relaxed);
            let mut n = 0;
            for (first, count, stamped) in msgs {
                if per_msg && !stamped {
                    continue;
                }
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
        self.stamp_reads.fetch_add(1, Relaxed);
        let mut n = 0;
        if ring && waiting >= RING_READ_MESSAGES {
            n += stamp_ring::read_queued_here(fd, &mut |st| record(st.key, st.sched, st.realtime_ns)).unwrap_or(0);
        }
        n + timestamp::read_tx_timestamps(fd, &mut record)
    }

    /// How many times the socket's error queue was read for TX stamps.
    pub fn stamp_reads(&self) -> StampReads {
        StampReads { after_send: self.send_reads.load(Relaxed), total: self.stamp_reads.load(Relaxed) }
    }

    /// After a send syscall on the sending thread (tracing on): reads the
    /// TX stamps when enough stamped messages wait ([`EpTrace::drain_due`]).
    pub fn after_send(&self, fd: std::os::fd::RawFd) {
        if self.drain_due() {
            self.send_reads.fetch_add(1, Relaxed);
            self.drain_tx(fd);
        }
    }

    /// Whether TX stamps may wait on the socket's error queue: always,
    /// unless the socket asks per message and every stamped message's
    /// stamps were read already (a stamp the kernel queues after the read
    /// that took its message's first one still makes the socket report
    /// `EPOLLERR`, so a wake-up that finds nothing else reads anyway).
    pub fn stamps_may_wait(&self) -> bool {
        !self.per_msg.load(Relaxed) || self.kmsg.load(Relaxed) != self.drained_at.load(Relaxed)
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
    /// receive call's return marks it). Only a sampled datagram's index is
    /// kept for the return (and for [`tag_received`]), so they need not
    /// decide again.
    #[inline]
    pub fn pop(&self) {
        if on() {
            let i = bump_locked(&self.rx_out, 1);
            LAST_POP.with(|c| c.set(if sampled(i) { i } else { u64::MAX }));
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
        if i != u64::MAX && enter != 0 {
            let (now, tsc) = stamp();
            push_raw(word1(Kind::RecvCall, self.id, tsc, 0), now, enter, i);
        }
    }
}
