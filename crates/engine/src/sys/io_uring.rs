//! Kernel TX timestamps read through io_uring instead of `recvmsg`.
//!
//! `SOCKET_URING_OP_TX_TIMESTAMP` (Linux ≥ 6.16) is a multishot command
//! armed on a socket: each time stamps are queued on its error queue the
//! kernel moves them into 32-byte completions (key, SCHED or SND, the time)
//! under one lock, with no message header, control messages or per-stamp
//! system call. That is the costly part of `recvmmsg(MSG_ERRQUEUE)` on a
//! traced sender.
//!
//! A [`StampRing`] belongs to one thread: it is made with `SINGLE_ISSUER`
//! and `DEFER_TASKRUN`, so the kernel's work for the stamps runs when that
//! thread enters the ring and never interrupts its other system calls.
//! It is used one shot at a time: [`StampRing::read_queued`] arms the
//! command, takes what is queued and cancels it before it returns. An
//! armed command holds its socket open, so none is left armed between
//! reads: a socket closed on any thread is released at once, and queueing
//! a stamp wakes nothing. The tracer reads through [`read_queued_here`]
//! (a ring per thread that reads, made on first use, `recvmmsg` where the
//! kernel has no ring or no such command). The raw ring (setup, mappings,
//! submission, `io_uring_enter`) is [`super::uring`]'s.
//!
//! One shot costs two or three `io_uring_enter` calls, more than one
//! `recvmmsg`, so it pays only when many stamps wait: the tracer reads
//! after every 16 kernel messages. `one_shot_read_cost` measures the
//! difference against `recvmmsg`.

use super::uring::{self, Params, Rings, Sqe, IORING_CQE_F_MORE, IORING_SETUP_COOP_TASKRUN, IORING_SETUP_CQSIZE};
use std::cell::RefCell;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const IORING_SETUP_SUBMIT_ALL: u32 = 1 << 7;
const IORING_SETUP_CQE32: u32 = 1 << 11;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_OP_ASYNC_CANCEL: u8 = 14;
const IORING_OP_URING_CMD: u8 = 46;
const SOCKET_URING_OP_TX_TIMESTAMP: u32 = 4;
const IORING_TIMESTAMP_TYPE_SHIFT: u32 = 17;
/// `SCM_TSTAMP_SCHED`: the stamp taken before the qdisc.
const SCM_TSTAMP_SCHED: u32 = 1;

/// Completions the ring holds: a read finds the stamps of 16 or so kernel
/// messages (two each); what does not fit stays queued on the socket for
/// the `recvmmsg` that follows every read.
const CQ_ENTRIES: u32 = 512;
const SQ_ENTRIES: u32 = 8;

/// One TX stamp: the socket's OPT_ID key, SCHED (else SND), realtime ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxStamp {
    pub key: u32,
    pub sched: bool,
    pub realtime_ns: u64,
}

/// One completion: a stamp, or the end of a command.
#[derive(Debug, PartialEq, Eq)]
enum Reaped {
    Stamp(u64, TxStamp),
    /// The entry with this tag ended (a command cancelled or refused, a
    /// cancel done): `res` is its result.
    Ended(u64, i32),
}

/// A per-thread io_uring for reading TX stamps (see the module docs).
pub struct StampRing {
    // Field order: the maps go before the fd closes.
    rings: Rings,
    fd: crate::fdspace::Private<OwnedFd>,
    /// One-shot reads made (their completions' tags).
    reads: std::cell::Cell<u64>,
}

// A ring is used by the thread that made it only; it is never shared.
impl std::fmt::Debug for StampRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StampRing").field("fd", &self.fd.as_raw_fd()).finish()
    }
}

impl StampRing {
    /// A ring owned by the calling thread; an error where the kernel lacks
    /// io_uring or one of the setup flags (older than 6.1).
    pub fn new() -> io::Result<StampRing> {
        let mut p = Params::new(
            CQ_ENTRIES,
            IORING_SETUP_CQSIZE
                | IORING_SETUP_SUBMIT_ALL
                | IORING_SETUP_COOP_TASKRUN
                | IORING_SETUP_CQE32
                | IORING_SETUP_SINGLE_ISSUER
                | IORING_SETUP_DEFER_TASKRUN,
        );
        // One of the engine's own descriptors: under the preload shim it is
        // kept out of the program's numbers (the maps below are made
        // through the number it ends up on).
        let fd = crate::fdspace::new_private(|| uring::setup(SQ_ENTRIES, &mut p))?;
        // 32-byte completions (`CQE32`).
        let rings = Rings::map(fd.as_raw_fd(), &p, 32)?;
        Ok(StampRing { rings, fd, reads: std::cell::Cell::new(0) })
    }

    /// Queues one entry and submits it.
    fn submit(&self, e: Sqe) -> io::Result<()> {
        self.rings.push(e);
        self.enter(1)
    }

    /// `io_uring_enter`: submits `n` entries and runs the kernel's deferred
    /// work, which posts the completions of everything ready.
    fn enter(&self, n: u32) -> io::Result<()> {
        loop {
            match uring::enter(self.fd.as_raw_fd(), n, 0, None) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    /// Reads every TX stamp queued on `fd` now, without leaving anything
    /// armed. Arming the stamp command on a socket whose error queue holds
    /// stamps makes it ready at once: the `io_uring_enter` that submits it
    /// also runs the deferred work that moves them into completions. A
    /// second one cancels it, and the call returns once the kernel reports
    /// the command ended, so the socket is never held past the call and no
    /// thread has to cancel anything later. Nothing is armed while the
    /// sender sends, so queueing a stamp wakes nothing. Returns the stamps
    /// read; an error where the kernel refuses the command (before 6.16: the
    /// caller reads with `recvmmsg`).
    pub fn read_queued(&self, fd: RawFd, f: &mut dyn FnMut(TxStamp)) -> io::Result<usize> {
        use std::cell::Cell;
        // Tags of this read only: a completion left over from an earlier
        // read can never be taken for one of this read's.
        let seq = self.reads.get().wrapping_add(1);
        self.reads.set(seq);
        let (tag, cancel) = (seq << 1, seq << 1 | 1);
        let n = Cell::new(0);
        let ended: Cell<Option<i32>> = Cell::new(None);
        let cancelled = Cell::new(false);
        let mut on = |r: Reaped| match r {
            Reaped::Stamp(t, st) if t == tag => {
                n.set(n.get() + 1);
                f(st);
            }
            Reaped::Ended(t, res) if t == tag => ended.set(Some(res)),
            Reaped::Ended(t, _) if t == cancel => cancelled.set(true),
            _ => {}
        };
        let refused = |res: Option<i32>| {
            res.filter(|&r| r != 0 && r != -libc::ECANCELED).map(|r| io::Error::from_raw_os_error(-r))
        };
        self.submit(Sqe {
            opcode: IORING_OP_URING_CMD,
            fd,
            off: u64::from(SOCKET_URING_OP_TX_TIMESTAMP),
            user_data: tag,
            ..Default::default()
        })?;
        self.reap_into(&mut on);
        if let Some(e) = refused(ended.get()) {
            return Err(e); // not armed: nothing to cancel
        }
        self.submit(Sqe {
            opcode: IORING_OP_ASYNC_CANCEL,
            fd: -1,
            addr: tag,
            user_data: cancel,
            ..Default::default()
        })?;
        // Both end within the cancelling call or the next run of deferred
        // work; the bound only guards against a kernel that never ends it.
        for _ in 0..1000 {
            self.reap_into(&mut on);
            if let Some(e) = refused(ended.get()) {
                return Err(e);
            }
            if ended.get().is_some() && cancelled.get() {
                return Ok(n.get());
            }
            self.enter(0)?;
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "stamp command did not end"))
    }

    /// Hands every completion posted so far to `f`.
    fn reap_into(&self, f: &mut dyn FnMut(Reaped)) {
        let (head_a, tail, mask) = self.rings.cq_state();
        let mut head = head_a.load(Ordering::Relaxed);
        while head != tail {
            // A 32-byte entry (`CQE32`) as four words.
            let w: [u64; 4] = self.rings.cqe(head, mask);
            let (tag, res, flags) = (w[0], (w[1] & 0xffff_ffff) as u32 as i32, (w[1] >> 32) as u32);
            if flags & IORING_CQE_F_MORE != 0 {
                // A stamp: res is the OPT_ID key, the second half the time.
                let sched = (flags >> IORING_TIMESTAMP_TYPE_SHIFT) == SCM_TSTAMP_SCHED;
                f(Reaped::Stamp(
                    tag,
                    TxStamp {
                        key: res as u32,
                        sched,
                        realtime_ns: w[2].wrapping_mul(1_000_000_000).wrapping_add(w[3]),
                    },
                ));
            } else {
                f(Reaped::Ended(tag, res));
            }
            head = head.wrapping_add(1);
        }
        head_a.store(head, Ordering::Release);
    }
}

/// Set once the kernel refused a ring or the stamp command: every read
/// goes through `recvmmsg` from then on.
static UNSUPPORTED: AtomicBool = AtomicBool::new(false);
/// Stamps read through rings in this process (tests, reports).
static READ: AtomicU64 = AtomicU64::new(0);
/// Bumped in a fork child: a ring inherited from the parent belongs to a
/// thread that does not exist here (`SINGLE_ISSUER`) and is replaced.
static GENERATION: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// This thread's ring and the generation it was made in.
    static RING: RefCell<Option<(u64, StampRing)>> = const { RefCell::new(None) };
}

/// Reads the TX stamps queued on `fd` through the calling thread's ring
/// (made on first use), handing each to `f`; `None` where no ring can be
/// used (kernel without io_uring or the command, io_uring disabled, the
/// thread exiting): the caller reads them with `recvmmsg`. Stamps of
/// other kinds of queued errors are left for that `recvmmsg` too.
pub fn read_queued_here(fd: RawFd, f: &mut dyn FnMut(TxStamp)) -> Option<usize> {
    if UNSUPPORTED.load(Ordering::Relaxed) {
        return None;
    }
    let generation = GENERATION.load(Ordering::Relaxed);
    RING.try_with(|cell| {
        let mut slot = cell.try_borrow_mut().ok()?;
        if !matches!(&*slot, Some((g, _)) if *g == generation) {
            // Dropping an inherited ring closes this process's copy only.
            *slot = None;
            match StampRing::new() {
                Ok(r) => *slot = Some((generation, r)),
                Err(_) => {
                    UNSUPPORTED.store(true, Ordering::Relaxed);
                    return None;
                }
            }
        }
        let (_, ring) = slot.as_ref()?;
        match ring.read_queued(fd, f) {
            Ok(n) => {
                READ.fetch_add(n as u64, Ordering::Relaxed);
                Some(n)
            }
            Err(e) => {
                if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) {
                    UNSUPPORTED.store(true, Ordering::Relaxed);
                }
                // Closing the ring ends whatever it still holds.
                *slot = None;
                None
            }
        }
    })
    .ok()
    .flatten()
}

/// How many stamps this process read through its rings so far.
pub fn stamps_read() -> u64 {
    READ.load(Ordering::Relaxed)
}

/// False once a ring or the stamp command was refused here (every read
/// then goes through `recvmmsg`).
pub fn usable() -> bool {
    !UNSUPPORTED.load(Ordering::Relaxed)
}

/// In a fork child: rings inherited from the parent are not used again.
pub fn forked_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::kernel::UdpSocket;
    use crate::sys::{clock, timestamp};

    fn stamped_socket(dst: &std::net::SocketAddr) -> UdpSocket {
        let s = UdpSocket::new(false).unwrap();
        s.set_option(libc::SOL_SOCKET, timestamp::SO_TIMESTAMPING, crate::tracepoint::TX_STAMP_FLAGS).unwrap();
        s.connect(dst).unwrap();
        s
    }

    /// A one-shot read takes every queued stamp, leaves nothing for
    /// `recvmmsg`, and holds nothing afterwards: the socket's port is free
    /// as soon as it closes, with the ring still open.
    #[test]
    fn a_one_shot_read_takes_every_stamp_and_holds_nothing() {
        let Ok(ring) = StampRing::new() else { return eprintln!("no io_uring here: nothing to test") };
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = stamped_socket(&sink.local_addr().unwrap());
        let fd = s.as_raw_fd();
        let mut got = Vec::new();
        for round in 0..3u32 {
            for _ in 0..10 {
                s.send_to(&[1u8; 64], None).unwrap();
            }
            match ring.read_queued(fd, &mut |st| got.push(st)) {
                Ok(n) => assert_eq!(n, 20, "round {round}"),
                Err(e) => {
                    assert!(matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)), "{e}");
                    return eprintln!("SOCKET_URING_OP_TX_TIMESTAMP unsupported here");
                }
            }
            assert_eq!(timestamp::read_tx_timestamps(fd, &mut |_, _, _| {}), 0);
        }
        // Nothing queued: a read finds nothing and still ends.
        assert_eq!(ring.read_queued(fd, &mut |st| got.push(st)).unwrap(), 0);
        got.sort_by_key(|t| (t.key, t.sched));
        let keys: Vec<(u32, bool)> = got.iter().map(|t| (t.key, t.sched)).collect();
        let want: Vec<(u32, bool)> = (0..30).flat_map(|k| [(k, false), (k, true)]).collect();
        assert_eq!(keys, want);
        // Times on CLOCK_REALTIME, of these sends: within seconds of now.
        let now = clock::realtime_ns();
        assert!(got.iter().all(|t| t.realtime_ns <= now && now - t.realtime_ns < 10_000_000_000), "{got:?}");
        let port = s.local_addr().unwrap();
        drop(s);
        std::net::UdpSocket::bind(port).expect("nothing holds the socket after a one-shot read");
        drop(ring);
    }

    /// The sending thread's CPU per send of `n` stamped one-datagram
    /// sends on `s`, calling `read` after every `k`th.
    fn per_send(s: &UdpSocket, n: u64, k: u64, read: &mut dyn FnMut()) -> f64 {
        let cpu = || clock::thread_cpu_time().as_nanos() as u64;
        let c0 = cpu();
        for i in 0..n {
            s.send_to(&[1u8; 64], None).unwrap();
            if i % k == k - 1 {
                read();
            }
        }
        (cpu() - c0) as f64 / n as f64
    }

    /// What a one-shot ring read costs against `recvmmsg`: stamped
    /// one-datagram loopback sends, the stamps read after every `k` sends
    /// with `recvmmsg`, with the ring, or with the ring and then `recvmmsg`
    /// (as the tracer does), alternated, best of 7 rounds; printed with
    /// `--release --nocapture`.
    #[test]
    fn one_shot_read_cost() {
        let Ok(ring) = StampRing::new() else { return };
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = stamped_socket(&sink.local_addr().unwrap());
        let fd = s.as_raw_fd();
        if ring.read_queued(fd, &mut |_| {}).is_err() {
            return;
        }
        let n = 2048u64;
        for k in [1u64, 2, 8, 16] {
            let mut best = [f64::MAX; 3];
            let mut read = 0u64;
            for _ in 0..7 {
                best[0] = best[0].min(per_send(&s, n, k, &mut || {
                    read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {}) as u64
                }));
                best[1] =
                    best[1].min(per_send(&s, n, k, &mut || read += ring.read_queued(fd, &mut |_| {}).unwrap() as u64));
                best[2] = best[2].min(per_send(&s, n, k, &mut || {
                    read += ring.read_queued(fd, &mut |_| {}).unwrap() as u64;
                    read += timestamp::read_tx_timestamps(fd, &mut |_, _, _| {}) as u64;
                }));
            }
            let [recv, ring_only, both] = best;
            eprintln!("stamped send, stamps read every {k} sends: {recv:.0} ns per send with recvmmsg, {ring_only:.0} with one-shot ring reads, {both:.0} with a recvmmsg after each");
            // Every stamp was read, whichever way.
            assert_eq!(read, 3 * 2 * 7 * n);
        }
    }
}
