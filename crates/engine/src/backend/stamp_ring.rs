//! Kernel TX timestamps read through io_uring instead of `recvmsg`.
//!
//! `SOCKET_URING_OP_TX_TIMESTAMP` (Linux ≥ 6.16) is a multishot command
//! armed on a socket: each time stamps are queued on its error queue the
//! kernel moves them into 32-byte completions (key, SCHED or SND, the time)
//! under one lock, with no message header, control messages or per-stamp
//! system call. That is the costly part of `recvmmsg(MSG_ERRQUEUE)` on a
//! traced sender (docs/trace.md, "Cost").
//!
//! A [`StampRing`] belongs to one thread: it is made with `SINGLE_ISSUER`
//! and `DEFER_TASKRUN`, so the kernel's work for every stamp queued since
//! the last look runs in one batch when that thread calls
//! [`StampRing::reap`], and never interrupts the thread's other system
//! calls. An armed command holds its socket open until it is cancelled
//! ([`StampRing::disarm`]) or the ring is dropped; only the owning thread
//! may do either. Everything here is raw syscalls and shared-memory rings,
//! kept in this one module.
//!
//! Not wired into the tracer: measured here (`ring_read_cost`), reading
//! through the ring saves 150–230 ns per stamp against `recvmmsg`, about
//! 9 ns per datagram of a traced 1472 B sender (1.3 % of its pipeline's
//! CPU). Wiring it in would also mean cancelling, on the ring's own thread,
//! commands for endpoints closed on other threads. docs/trace.md, "Cost",
//! has the figures.

#![allow(unsafe_code)] // Raw io_uring syscalls and its shared rings: this module's whole job.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

const IORING_SETUP_CQSIZE: u32 = 1 << 3;
const IORING_SETUP_SUBMIT_ALL: u32 = 1 << 7;
const IORING_SETUP_COOP_TASKRUN: u32 = 1 << 8;
const IORING_SETUP_CQE32: u32 = 1 << 11;
const IORING_SETUP_SINGLE_ISSUER: u32 = 1 << 12;
const IORING_SETUP_DEFER_TASKRUN: u32 = 1 << 13;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x800_0000;
const IORING_OFF_SQES: i64 = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_OP_ASYNC_CANCEL: u8 = 14;
const IORING_OP_URING_CMD: u8 = 46;
const IORING_CQE_F_MORE: u32 = 1 << 1;
const SOCKET_URING_OP_TX_TIMESTAMP: u32 = 4;
const IORING_TIMESTAMP_TYPE_SHIFT: u32 = 17;
/// `SCM_TSTAMP_SCHED`: the stamp taken before the qdisc.
const SCM_TSTAMP_SCHED: u32 = 1;

/// Completions the ring holds: stamps are reaped after every traced send
/// call (a few per call); a fuller ring only defers the rest to the next
/// reap, the kernel leaves them queued on the socket.
const CQ_ENTRIES: u32 = 512;
const SQ_ENTRIES: u32 = 8;

#[repr(C)]
#[derive(Default)]
struct SqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    flags: u32,
    dropped: u32,
    array: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct CqOffsets {
    head: u32,
    tail: u32,
    ring_mask: u32,
    ring_entries: u32,
    overflow: u32,
    cqes: u32,
    flags: u32,
    resv1: u32,
    user_addr: u64,
}

#[repr(C)]
#[derive(Default)]
struct Params {
    sq_entries: u32,
    cq_entries: u32,
    flags: u32,
    sq_thread_cpu: u32,
    sq_thread_idle: u32,
    features: u32,
    wq_fd: u32,
    resv: [u32; 3],
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}

/// A submission entry (64 bytes).
#[repr(C)]
#[derive(Default, Clone, Copy)]
struct Sqe {
    opcode: u8,
    flags: u8,
    ioprio: u16,
    fd: i32,
    /// `cmd_op` in its low half for `URING_CMD`.
    off: u64,
    addr: u64,
    len: u32,
    op_flags: u32,
    user_data: u64,
    buf_index: u16,
    personality: u16,
    file_index: u32,
    addr3: u64,
    pad: u64,
}

/// One mapped region of the ring.
struct Map {
    ptr: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: RawFd, len: usize, off: i64) -> io::Result<Map> {
        // SAFETY: a shared mapping of the ring fd at an offset the kernel
        // defines; the result is checked before use.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map { ptr: p as *mut u8, len })
    }

    /// The u32 at byte `off` as an atomic (ring heads and tails are shared
    /// with the kernel).
    fn atomic(&self, off: u32) -> &AtomicU32 {
        assert!(off as usize + 4 <= self.len);
        // SAFETY: in bounds (checked), 4-aligned by the kernel's layout, and
        // valid for the life of the mapping, which outlives the borrow.
        unsafe { &*(self.ptr.add(off as usize) as *const AtomicU32) }
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

/// One TX stamp: the socket's OPT_ID key, SCHED (else SND), realtime ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxStamp {
    pub key: u32,
    pub sched: bool,
    pub realtime_ns: u64,
}

/// What [`StampRing::reap`] found for one armed socket.
#[derive(Debug, PartialEq, Eq)]
pub enum Reaped {
    Stamp(u64, TxStamp),
    /// The command for this tag ended (cancelled, or the kernel refused
    /// it: `res` is its error); it is no longer armed.
    Ended(u64, i32),
}

/// A per-thread io_uring for reading TX stamps (see the module docs).
pub struct StampRing {
    // Field order: the maps go before the fd closes.
    sq: Map,
    cq: Option<Map>,
    sqes: Map,
    fd: OwnedFd,
    sq_off: SqOffsets,
    cq_off: CqOffsets,
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
        let mut p = Params { cq_entries: CQ_ENTRIES, flags: IORING_SETUP_CQSIZE | IORING_SETUP_SUBMIT_ALL | IORING_SETUP_COOP_TASKRUN | IORING_SETUP_CQE32 | IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN, ..Default::default() };
        // SAFETY: io_uring_setup reads and writes the params struct, which
        // has the kernel's layout (120 bytes).
        let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, SQ_ENTRIES, &mut p as *mut Params) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a new descriptor the kernel just returned, owned here.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * 32;
        let single = p.features & IORING_FEAT_SINGLE_MMAP != 0;
        let sq = Map::new(fd.as_raw_fd(), if single { sq_len.max(cq_len) } else { sq_len }, IORING_OFF_SQ_RING)?;
        let cq = if single { None } else { Some(Map::new(fd.as_raw_fd(), cq_len, IORING_OFF_CQ_RING)?) };
        let sqes = Map::new(fd.as_raw_fd(), p.sq_entries as usize * std::mem::size_of::<Sqe>(), IORING_OFF_SQES)?;
        Ok(StampRing { sq, cq, sqes, fd, sq_off: p.sq_off, cq_off: p.cq_off })
    }

    fn cq(&self) -> &Map {
        self.cq.as_ref().unwrap_or(&self.sq)
    }

    /// Queues one entry and submits it.
    fn submit(&self, e: Sqe) -> io::Result<()> {
        let tail_a = self.sq.atomic(self.sq_off.tail);
        let tail = tail_a.load(Ordering::Relaxed);
        let mask = self.sq.atomic(self.sq_off.ring_mask).load(Ordering::Relaxed);
        let idx = tail & mask;
        // SAFETY: idx is masked to the SQE array's length; only this thread
        // writes entries, and the kernel reads one only after the tail moves.
        unsafe { std::ptr::write((self.sqes.ptr as *mut Sqe).add(idx as usize), e) };
        self.sq.atomic(self.sq_off.array + idx * 4).store(idx, Ordering::Relaxed);
        tail_a.store(tail.wrapping_add(1), Ordering::Release);
        self.enter(1)
    }

    /// `io_uring_enter`: submits `n` entries and runs the kernel's deferred
    /// work, which posts the completions of everything ready.
    fn enter(&self, n: u32) -> io::Result<()> {
        loop {
            // SAFETY: no signal mask is passed (null, size 0).
            let r = unsafe { libc::syscall(libc::SYS_io_uring_enter, self.fd.as_raw_fd(), n, 0u32, IORING_ENTER_GETEVENTS, std::ptr::null::<libc::c_void>(), 0usize) };
            if r >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Arms the stamp command on `fd`; its completions carry `tag`.
    pub fn arm(&self, fd: RawFd, tag: u64) -> io::Result<()> {
        self.submit(Sqe { opcode: IORING_OP_URING_CMD, fd, off: u64::from(SOCKET_URING_OP_TX_TIMESTAMP), user_data: tag, ..Default::default() })
    }

    /// Cancels the command tagged `tag` and waits (bounded) until the kernel
    /// reports it ended, so its socket is no longer held. Stamps it posted
    /// on the way go to `f`.
    pub fn disarm(&self, tag: u64, f: &mut dyn FnMut(Reaped)) -> io::Result<()> {
        // The cancel's own completion carries tag | CANCEL_BIT.
        const CANCEL_BIT: u64 = 1 << 63;
        self.submit(Sqe { opcode: IORING_OP_ASYNC_CANCEL, fd: -1, addr: tag, user_data: tag | CANCEL_BIT, ..Default::default() })?;
        let mut ended = false;
        let mut cancel: Option<i32> = None;
        for _ in 0..1000 {
            self.reap_into(&mut |r| match r {
                Reaped::Ended(t, _) if t == tag => ended = true,
                Reaped::Ended(t, res) if t == tag | CANCEL_BIT => cancel = Some(res),
                other => f(other),
            });
            // Ended, or the cancel found nothing to cancel (it had ended).
            if ended || matches!(cancel, Some(r) if r < 0) {
                return Ok(());
            }
            self.enter(0)?;
        }
        Err(io::Error::new(io::ErrorKind::TimedOut, "stamp command did not end"))
    }

    /// Runs the kernel's deferred work and hands every completion to `f`.
    pub fn reap(&self, f: &mut dyn FnMut(Reaped)) -> io::Result<()> {
        self.enter(0)?;
        self.reap_into(f);
        Ok(())
    }

    fn reap_into(&self, f: &mut dyn FnMut(Reaped)) {
        let cq = self.cq();
        let head_a = cq.atomic(self.cq_off.head);
        let mut head = head_a.load(Ordering::Relaxed);
        let tail = cq.atomic(self.cq_off.tail).load(Ordering::Acquire);
        let mask = cq.atomic(self.cq_off.ring_mask).load(Ordering::Relaxed);
        while head != tail {
            let off = self.cq_off.cqes as usize + (head & mask) as usize * 32;
            assert!(off + 32 <= cq.len);
            // SAFETY: in bounds (checked); the kernel wrote this 32-byte
            // entry before publishing the tail (acquired above).
            let w: [u64; 4] = unsafe { std::ptr::read_unaligned(cq.ptr.add(off) as *const [u64; 4]) };
            let (tag, res, flags) = (w[0], (w[1] & 0xffff_ffff) as u32 as i32, (w[1] >> 32) as u32);
            if flags & IORING_CQE_F_MORE != 0 {
                // A stamp: res is the OPT_ID key, the second half the time.
                let sched = (flags >> IORING_TIMESTAMP_TYPE_SHIFT) == SCM_TSTAMP_SCHED;
                f(Reaped::Stamp(tag, TxStamp { key: res as u32, sched, realtime_ns: w[2].wrapping_mul(1_000_000_000).wrapping_add(w[3]) }));
            } else {
                f(Reaped::Ended(tag, res));
            }
            head = head.wrapping_add(1);
        }
        head_a.store(head, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::kernel::{self, UdpSocket};

    fn stamped_socket(dst: &std::net::SocketAddr) -> UdpSocket {
        let s = UdpSocket::new(false).unwrap();
        s.set_option(libc::SOL_SOCKET, kernel::SO_TIMESTAMPING, crate::tracepoint::TX_STAMP_FLAGS).unwrap();
        s.connect(dst).unwrap();
        s
    }

    /// Every stamp of every send comes back through the ring, keyed as
    /// `recvmmsg` would key it, and a disarmed socket is really released:
    /// its port can be bound again once it is closed.
    #[test]
    fn the_ring_reads_every_stamp_and_lets_the_socket_go() {
        let Ok(ring) = StampRing::new() else { return eprintln!("no io_uring here: nothing to test") };
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = stamped_socket(&sink.local_addr().unwrap());
        let fd = s.as_raw_fd();
        ring.arm(fd, 7).unwrap();
        let mut got = Vec::new();
        let mut ended = None;
        for _ in 0..10 {
            s.send_to(&[1u8; 64], None).unwrap();
        }
        for _ in 0..100 {
            ring.reap(&mut |r| match r {
                Reaped::Stamp(7, st) => got.push(st),
                Reaped::Ended(t, res) => ended = Some((t, res)),
                other => panic!("{other:?}"),
            })
            .unwrap();
            if got.len() >= 20 || ended.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        if let Some((_, res)) = ended {
            // A kernel without the command (before 6.16) refuses it.
            assert!(res == -libc::EINVAL || res == -libc::EOPNOTSUPP, "{res}");
            return eprintln!("SOCKET_URING_OP_TX_TIMESTAMP unsupported here");
        }
        // Two stamps (SCHED and SND) for each of keys 0..10, times now-ish.
        got.sort_by_key(|t| (t.key, t.sched));
        let keys: Vec<(u32, bool)> = got.iter().map(|t| (t.key, t.sched)).collect();
        let want: Vec<(u32, bool)> = (0..10).flat_map(|k| [(k, false), (k, true)]).collect();
        assert_eq!(keys, want);
        let now = kernel::realtime_ns();
        assert!(got.iter().all(|t| t.realtime_ns <= now && now - t.realtime_ns < 10_000_000_000), "{got:?}");
        // Nothing left for recvmmsg.
        assert_eq!(kernel::read_tx_timestamps(fd, &mut |_, _, _| {}), 0);
        let port = s.local_addr().unwrap();
        ring.disarm(7, &mut |r| panic!("{r:?}")).unwrap();
        drop(s);
        std::net::UdpSocket::bind(port).expect("the port is free once the command ended and the socket closed");
    }

    /// What reading stamps through the ring saves against `recvmmsg`:
    /// one-datagram stamped loopback sends, the stamps read after every
    /// `k` sends one way or the other, alternated, best of 7 rounds of the
    /// sending thread's CPU per send; printed with `--release --nocapture`.
    #[test]
    fn ring_read_cost() {
        let Ok(ring) = StampRing::new() else { return };
        let sink = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let s = stamped_socket(&sink.local_addr().unwrap());
        let fd = s.as_raw_fd();
        let cpu = || kernel::thread_cpu_time().as_nanos() as u64;
        let n = 2048u64;
        for k in [1u64, 2, 8] {
            let (mut via_recv, mut via_ring) = (f64::MAX, f64::MAX);
            let mut read = 0u64;
            for _ in 0..7 {
                let c0 = cpu();
                for i in 0..n {
                    s.send_to(&[1u8; 64], None).unwrap();
                    if i % k == k - 1 {
                        read += kernel::read_tx_timestamps(fd, &mut |_, _, _| {}) as u64;
                    }
                }
                via_recv = via_recv.min((cpu() - c0) as f64 / n as f64);
                ring.arm(fd, 1).unwrap();
                let c0 = cpu();
                for i in 0..n {
                    s.send_to(&[1u8; 64], None).unwrap();
                    if i % k == k - 1 {
                        ring.reap(&mut |r| read += u64::from(matches!(r, Reaped::Stamp(1, _)))).unwrap();
                    }
                }
                via_ring = via_ring.min((cpu() - c0) as f64 / n as f64);
                ring.disarm(1, &mut |r| read += u64::from(matches!(r, Reaped::Stamp(1, _)))).unwrap();
                read += kernel::read_tx_timestamps(fd, &mut |_, _, _| {}) as u64;
            }
            eprintln!("stamped send, stamps read every {k} sends: {via_recv:.0} ns per send with recvmmsg, {via_ring:.0} with the ring");
            assert_eq!(read, 2 * 2 * 7 * n);
        }
    }
}
