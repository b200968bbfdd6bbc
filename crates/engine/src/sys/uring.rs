//! The raw io_uring under the engine's rings: [`super::io_uring`] (TX
//! timestamps), [`super::uring_recv`] (multishot receive) and
//! [`super::uring_send`] (zero-copy sends). Here are
//! the kernel's structures, `io_uring_setup`, the mappings of the
//! submission and completion rings, queueing an entry and
//! `io_uring_enter`; what each ring submits and how it reads its
//! completions stays with it. Hand-rolled: no io_uring crate is among the
//! workspace's dependencies.

use std::io;
use std::mem::size_of;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

pub(super) const IORING_SETUP_CQSIZE: u32 = 1 << 3;
pub(super) const IORING_SETUP_COOP_TASKRUN: u32 = 1 << 8;
pub(super) const IORING_CQE_F_MORE: u32 = 1 << 1;
const IORING_FEAT_SINGLE_MMAP: u32 = 1 << 0;
const IORING_OFF_SQ_RING: i64 = 0;
const IORING_OFF_CQ_RING: i64 = 0x800_0000;
const IORING_OFF_SQES: i64 = 0x1000_0000;
const IORING_ENTER_GETEVENTS: u32 = 1 << 0;
const IORING_ENTER_EXT_ARG: u32 = 1 << 3;

#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct SqOffsets {
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
#[derive(Default, Clone, Copy)]
pub(super) struct CqOffsets {
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

/// `struct io_uring_params` (120 bytes).
#[repr(C)]
#[derive(Default)]
pub(super) struct Params {
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

impl Params {
    /// The parameters of a ring with `cq_entries` completions (with
    /// `IORING_SETUP_CQSIZE` among `flags`) and these setup flags.
    pub(super) fn new(cq_entries: u32, flags: u32) -> Params {
        Params { cq_entries, flags, ..Default::default() }
    }
}

/// A completion entry (16 bytes: rings set up without `IORING_SETUP_CQE32`).
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct Cqe {
    pub(super) user_data: u64,
    pub(super) res: i32,
    pub(super) flags: u32,
}

/// A submission entry (64 bytes).
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(super) struct Sqe {
    pub(super) opcode: u8,
    pub(super) flags: u8,
    pub(super) ioprio: u16,
    pub(super) fd: i32,
    /// `cmd_op` in its low half for `URING_CMD`.
    pub(super) off: u64,
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) op_flags: u32,
    pub(super) user_data: u64,
    pub(super) buf_index: u16,
    pub(super) personality: u16,
    pub(super) file_index: u32,
    pub(super) addr3: u64,
    pub(super) pad: u64,
}

/// `struct __kernel_timespec`.
#[repr(C)]
struct KernelTimespec {
    sec: i64,
    nsec: i64,
}

/// `struct io_uring_getevents_arg`.
#[repr(C)]
struct GetEventsArg {
    sigmask: u64,
    sigmask_sz: u32,
    min_wait_usec: u32,
    ts: u64,
}

/// A shared mapping: of the ring fd at a kernel-defined offset, or
/// anonymous memory (`fd` negative: a buffer ring, buffers).
pub(super) struct Map {
    pub(super) ptr: *mut u8,
    pub(super) len: usize,
}

impl Map {
    pub(super) fn new(fd: RawFd, len: usize, off: i64) -> io::Result<Map> {
        let (flags, fd) = if fd < 0 {
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE, -1)
        } else {
            (libc::MAP_SHARED | libc::MAP_POPULATE, fd)
        };
        // SAFETY: a new mapping chosen by the kernel (of the ring fd at an
        // offset the kernel defines, or anonymous); the result is checked
        // before use.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, flags, fd, off) };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Map { ptr: p as *mut u8, len })
    }

    /// The u32 at byte `off` as an atomic (ring heads and tails are shared
    /// with the kernel).
    pub(super) fn atomic(&self, off: u32) -> &AtomicU32 {
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

/// `io_uring_setup` with `sq_entries` submission entries; the kernel fills
/// in the rest of `p`, which [`Rings::map`] then takes.
pub(super) fn setup(sq_entries: u32, p: &mut Params) -> io::Result<OwnedFd> {
    // SAFETY: io_uring_setup reads and writes the params struct, which has
    // the kernel's layout (120 bytes).
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, sq_entries, p as *mut Params) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor the kernel just returned, owned here.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// The mapped submission and completion rings of one io_uring and the
/// submission entries. The owner keeps the ring's descriptor and drops it
/// after this (the mappings go first).
pub(super) struct Rings {
    sq: Map,
    /// `None` under `IORING_FEAT_SINGLE_MMAP`: the CQ lives in `sq`'s map.
    cq: Option<Map>,
    sqes: Map,
    sq_off: SqOffsets,
    cq_off: CqOffsets,
}

impl Rings {
    /// Maps the rings of `fd`, just set up with `p`, for completions of
    /// `cqe_size` bytes (16, or 32 with `IORING_SETUP_CQE32`).
    pub(super) fn map(fd: RawFd, p: &Params, cqe_size: usize) -> io::Result<Rings> {
        let sq_len = p.sq_off.array as usize + p.sq_entries as usize * 4;
        let cq_len = p.cq_off.cqes as usize + p.cq_entries as usize * cqe_size;
        let single = p.features & IORING_FEAT_SINGLE_MMAP != 0;
        let sq = Map::new(fd, if single { sq_len.max(cq_len) } else { sq_len }, IORING_OFF_SQ_RING)?;
        let cq = if single { None } else { Some(Map::new(fd, cq_len, IORING_OFF_CQ_RING)?) };
        let sqes = Map::new(fd, p.sq_entries as usize * size_of::<Sqe>(), IORING_OFF_SQES)?;
        Ok(Rings { sq, cq, sqes, sq_off: p.sq_off, cq_off: p.cq_off })
    }

    fn cq(&self) -> &Map {
        self.cq.as_ref().unwrap_or(&self.sq)
    }

    /// Queues one entry for the next `io_uring_enter` to submit.
    pub(super) fn push(&self, e: Sqe) {
        let tail_a = self.sq.atomic(self.sq_off.tail);
        let tail = tail_a.load(Ordering::Relaxed);
        let mask = self.sq.atomic(self.sq_off.ring_mask).load(Ordering::Relaxed);
        let idx = tail & mask;
        // SAFETY: idx is masked to the SQE array's length; only the owning
        // thread writes entries, and the kernel reads one only after the
        // tail moves.
        unsafe { std::ptr::write((self.sqes.ptr as *mut Sqe).add(idx as usize), e) };
        self.sq.atomic(self.sq_off.array + idx * 4).store(idx, Ordering::Relaxed);
        tail_a.store(tail.wrapping_add(1), Ordering::Release);
    }

    /// The completion ring's head, its tail as the kernel published it
    /// (acquired: the entries before it are written) and its mask.
    pub(super) fn cq_state(&self) -> (&AtomicU32, u32, u32) {
        let cq = self.cq();
        let tail = cq.atomic(self.cq_off.tail).load(Ordering::Acquire);
        (cq.atomic(self.cq_off.head), tail, cq.atomic(self.cq_off.ring_mask).load(Ordering::Relaxed))
    }

    /// The completion at `head` (masked with `mask`) as a `T`, whose size
    /// is the ring's entry size.
    pub(super) fn cqe<T: Copy>(&self, head: u32, mask: u32) -> T {
        let cq = self.cq();
        let off = self.cq_off.cqes as usize + (head & mask) as usize * size_of::<T>();
        assert!(off + size_of::<T>() <= cq.len);
        // SAFETY: in bounds (checked); callers read only entries before the
        // tail that `cq_state` acquired, which the kernel wrote before it
        // published that tail; T is plain data (an entry's words).
        unsafe { std::ptr::read_unaligned(cq.ptr.add(off) as *const T) }
    }

    /// Takes the oldest posted completion as a `T` (the ring's entry size)
    /// and frees its slot for the kernel; `None` when none is posted.
    pub(super) fn pop_cqe<T: Copy>(&self) -> Option<T> {
        let (head_a, tail, mask) = self.cq_state();
        let head = head_a.load(Ordering::Relaxed);
        if head == tail {
            return None;
        }
        let c = self.cqe(head, mask);
        head_a.store(head.wrapping_add(1), Ordering::Release);
        Some(c)
    }
}

/// `io_uring_enter` on `fd`: submits `n` queued entries, runs the kernel's
/// deferred work (which posts the completions of everything ready) and
/// waits for `min` completions. With `ext` (`IORING_ENTER_EXT_ARG`) the
/// wait ends after the timeout it holds, if any; without, no signal mask
/// is passed. An error is the call's errno as it failed, `EINTR` included.
pub(super) fn enter(fd: RawFd, n: u32, min: u32, ext: Option<Option<Duration>>) -> io::Result<()> {
    enter_counted(fd, n, min, ext).map(|_| ())
}

/// As [`enter`]; returns how many entries the kernel took.
pub(super) fn enter_counted(fd: RawFd, n: u32, min: u32, ext: Option<Option<Duration>>) -> io::Result<u32> {
    let r = match ext {
        None => {
            // SAFETY: no signal mask is passed (null, size 0).
            unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    fd,
                    n,
                    min,
                    IORING_ENTER_GETEVENTS,
                    std::ptr::null::<libc::c_void>(),
                    0usize,
                )
            }
        }
        Some(timeout) => {
            let ts = timeout.map(|t| KernelTimespec { sec: t.as_secs() as i64, nsec: i64::from(t.subsec_nanos()) });
            let arg = GetEventsArg {
                sigmask: 0,
                sigmask_sz: 0,
                min_wait_usec: 0,
                ts: ts.as_ref().map_or(0, |t| t as *const KernelTimespec as u64),
            };
            // SAFETY: `arg` and `ts` are live locals for the call; with
            // EXT_ARG the kernel reads `arg` (its size given) and the timespec.
            unsafe {
                libc::syscall(
                    libc::SYS_io_uring_enter,
                    fd,
                    n,
                    min,
                    IORING_ENTER_GETEVENTS | IORING_ENTER_EXT_ARG,
                    &arg as *const GetEventsArg,
                    size_of::<GetEventsArg>(),
                )
            }
        }
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as u32)
}
