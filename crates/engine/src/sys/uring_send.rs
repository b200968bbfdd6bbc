//! io_uring zero-copy sends: `IORING_OP_SEND_ZC` for one datagram,
//! `IORING_OP_SENDMSG_ZC` for a GSO run, from registered buffers
//! (`IORING_REGISTER_BUFFERS`) where the payload lies in one.
//!
//! Each send posts two completions with the send's tag: first the send's
//! own result (bytes or `-errno`) with `IORING_CQE_F_MORE` when a
//! notification follows, then the notification (`IORING_CQE_F_NOTIF`),
//! once the kernel no longer reads the pages. With
//! `IORING_SEND_ZC_REPORT_USAGE` the notification's result has
//! `IORING_NOTIF_USAGE_ZC_COPIED` set when the kernel copied after all.
//! The kernel copies a submission's headers (message header, address,
//! iovecs, control data) while it submits, so they need to live only
//! across [`SendRing::submit`]; the payload is read until the notification.

use super::addr::RawAddr;
use super::uring::{self, Cqe, Params, Rings, Sqe, IORING_CQE_F_MORE, IORING_SETUP_CQSIZE};
use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

const IORING_OP_SEND_ZC: u8 = 47;
const IORING_OP_SENDMSG_ZC: u8 = 48;
const IORING_RECVSEND_FIXED_BUF: u16 = 1 << 2;
const IORING_SEND_ZC_REPORT_USAGE: u16 = 1 << 3;
const IORING_CQE_F_NOTIF: u32 = 1 << 3;
const IORING_NOTIF_USAGE_ZC_COPIED: u32 = 1 << 31;
const IORING_REGISTER_BUFFERS: u32 = 0;
const IORING_REGISTER_PROBE: u32 = 8;
const IO_URING_OP_SUPPORTED: u16 = 1 << 0;
/// `UDP_SEGMENT` (linux/udp.h): per-send GSO segment size.
const UDP_SEGMENT: libc::c_int = 103;
/// Submission entries: sends queued per `io_uring_enter`.
const SQ_ENTRIES: u32 = 256;

/// `struct io_uring_probe_op`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct ProbeOp {
    op: u8,
    resv: u8,
    flags: u16,
    resv2: u32,
}

/// `struct io_uring_probe` with room for 256 operations.
#[repr(C)]
struct Probe {
    last_op: u8,
    ops_len: u8,
    resv: u16,
    resv2: [u32; 3],
    ops: [ProbeOp; 256],
}

/// What one completion of a send ring says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendEvent {
    /// The send's own result: bytes sent or errno; `notif` when a
    /// notification follows.
    Sent { tag: u64, result: Result<usize, i32>, notif: bool },
    /// The kernel is done with the send's pages; `copied` when it copied.
    Done { tag: u64, copied: bool },
}

/// One send for [`SendRing::submit`].
pub struct ZcSend<'a> {
    pub tag: u64,
    pub dst: Option<SocketAddr>,
    /// The datagram, or a GSO run's datagrams back to back.
    pub iov: Vec<io::IoSlice<'a>>,
    pub segment: Option<u16>,
}

/// The headers of one `SENDMSG_ZC`, alive across its submission.
struct MsgParts {
    hdr: libc::msghdr,
    addr: Option<RawAddr>,
    cmsg: [u64; 4],
}

/// An io_uring for zero-copy sends on one socket; one thread uses it.
pub struct SendRing {
    // Field order: the maps go before the fd closes.
    rings: Rings,
    fd: OwnedFd,
    sock: RawFd,
    /// Registered buffers, `(start, len, index)`, sorted by start.
    fixed: Vec<(usize, usize, u16)>,
    queued: u32,
}

// SAFETY: the mappings belong to this value alone; the raw pointers in
// `Rings` are not shared with another value, so the ring may move between
// threads (it is used by one at a time, through `&mut`).
unsafe impl Send for SendRing {}

impl SendRing {
    /// A ring for `sock` with room for `cq_entries` completions (two per
    /// send). An `Unsupported` error where the kernel has no io_uring
    /// zero-copy sends (before 6.1).
    pub fn new(sock: BorrowedFd<'_>, cq_entries: u32) -> io::Result<SendRing> {
        let cq = cq_entries.clamp(2 * SQ_ENTRIES, 1 << 16).next_power_of_two();
        let mut p = Params::new(cq, IORING_SETUP_CQSIZE);
        let fd = uring::setup(SQ_ENTRIES, &mut p).map_err(|e| {
            io::Error::new(io::ErrorKind::Unsupported, format!("io_uring zero-copy send engine: no io_uring: {e}"))
        })?;
        let rings = Rings::map(fd.as_raw_fd(), &p, size_of::<Cqe>())?;
        let ring = SendRing { rings, fd, sock: sock.as_raw_fd(), fixed: Vec::new(), queued: 0 };
        for (op, name) in [(IORING_OP_SEND_ZC, "SEND_ZC"), (IORING_OP_SENDMSG_ZC, "SENDMSG_ZC")] {
            if !ring.supports(op)? {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("io_uring zero-copy send engine: this kernel lacks IORING_OP_{name} (Linux 6.1 or later)"),
                ));
            }
        }
        Ok(ring)
    }

    /// The operation `op` is among those `IORING_REGISTER_PROBE` lists as supported.
    fn supports(&self, op: u8) -> io::Result<bool> {
        // SAFETY: Probe is plain data; all-zero is what the kernel expects.
        let mut probe: Box<Probe> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: the kernel writes at most 256 ops into the live probe,
        // whose size it is told.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd.as_raw_fd(),
                IORING_REGISTER_PROBE,
                &mut *probe as *mut Probe,
                256u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        let i = usize::from(op);
        Ok(i < usize::from(probe.ops_len) && probe.ops[i].flags & IO_URING_OP_SUPPORTED != 0)
    }

    /// The ring's descriptor: readable while completions wait.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Registers `regions` as fixed buffers (once per ring). The kernel
    /// pins their pages now and sends a payload that lies in one from
    /// those pages: a region must stay mapped, at its address, while the
    /// ring lives, or sends from it carry the pages it had when registered.
    pub fn register(&mut self, regions: &[&[u8]]) -> io::Result<()> {
        if !self.fixed.is_empty() {
            return Err(io::Error::from_raw_os_error(libc::EBUSY));
        }
        if regions.is_empty() || regions.len() > usize::from(u16::MAX) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let iov: Vec<libc::iovec> = regions
            .iter()
            .map(|r| libc::iovec { iov_base: r.as_ptr() as *mut libc::c_void, iov_len: r.len() })
            .collect();
        // SAFETY: the kernel reads `iov.len()` live iovecs and pins the
        // pages they name (the regions are borrowed for the call).
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd.as_raw_fd(),
                IORING_REGISTER_BUFFERS,
                iov.as_ptr(),
                iov.len() as u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        self.fixed = regions.iter().enumerate().map(|(i, r)| (r.as_ptr() as usize, r.len(), i as u16)).collect();
        self.fixed.sort_unstable();
        Ok(())
    }

    /// The registered buffer that holds all of `iov`, if one does.
    fn fixed_index(&self, iov: &[io::IoSlice<'_>]) -> Option<u16> {
        let first = iov.first()?.as_ptr() as usize;
        // The last region that starts at or before the first byte.
        let at = self.fixed.partition_point(|r| r.0 <= first).checked_sub(1)?;
        let (start, len, index) = self.fixed[at];
        let inside = |b: &io::IoSlice<'_>| {
            let a = b.as_ptr() as usize;
            a >= start && a + b.len() <= start + len
        };
        iov.iter().all(inside).then_some(index)
    }

    /// Queues and submits `sends` (one `io_uring_enter` per
    /// [`SQ_ENTRIES`]). The payloads must stay readable and unchanged
    /// until each send's notification.
    pub fn submit(&mut self, sends: &[ZcSend<'_>]) -> io::Result<()> {
        for chunk in sends.chunks(SQ_ENTRIES as usize) {
            // Headers, stable in memory (boxed) until the enter below.
            let mut parts: Vec<Box<MsgParts>> = Vec::with_capacity(chunk.len());
            let mut addrs: Vec<Box<RawAddr>> = Vec::new();
            for s in chunk {
                let fixed = self.fixed_index(&s.iov);
                let mut ioprio = IORING_SEND_ZC_REPORT_USAGE;
                if fixed.is_some() {
                    ioprio |= IORING_RECVSEND_FIXED_BUF;
                }
                let mut e = Sqe {
                    fd: self.sock,
                    ioprio,
                    op_flags: libc::MSG_NOSIGNAL as u32,
                    user_data: s.tag,
                    buf_index: fixed.unwrap_or(0),
                    ..Default::default()
                };
                if s.iov.len() == 1 && s.segment.is_none() {
                    e.opcode = IORING_OP_SEND_ZC;
                    e.addr = s.iov[0].as_ptr() as u64;
                    e.len = s.iov[0].len() as u32;
                    if let Some(d) = &s.dst {
                        let a = Box::new(RawAddr::from_std(d));
                        // addr2 and addr_len (the low half of the word at byte 44).
                        e.off = a.as_ptr() as u64;
                        e.file_index = u32::from(a.len as u16);
                        addrs.push(a);
                    }
                } else {
                    let mut m = Box::new(MsgParts {
                        // SAFETY: msghdr is plain data; all-zero is a valid value.
                        hdr: unsafe { std::mem::zeroed() },
                        addr: s.dst.as_ref().map(RawAddr::from_std),
                        cmsg: [0; 4],
                    });
                    msg_header(&mut m, &s.iov, s.segment);
                    e.opcode = IORING_OP_SENDMSG_ZC;
                    e.addr = &m.hdr as *const libc::msghdr as u64;
                    e.len = 1;
                    parts.push(m);
                }
                self.rings.push(e);
                self.queued += 1;
            }
            self.submit_queued()?;
            drop((parts, addrs));
        }
        Ok(())
    }

    /// Submits every queued entry, again where the kernel took only some
    /// or was briefly busy.
    fn submit_queued(&mut self) -> io::Result<()> {
        for _ in 0..1000 {
            if self.queued == 0 {
                return Ok(());
            }
            match uring::enter_counted(self.fd.as_raw_fd(), self.queued, 0, None) {
                Ok(n) => self.queued -= n.min(self.queued),
                Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {
                    std::thread::yield_now()
                }
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }

    /// `io_uring_enter`: submits `n`, waits for `min` completions up to
    /// `timeout`. An interrupted or expired wait is not an error.
    fn enter(&self, n: u32, min: u32, timeout: Option<Duration>) -> io::Result<()> {
        match uring::enter(self.fd.as_raw_fd(), n, min, Some(timeout)) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR)) => Ok(()),
            r => r,
        }
    }

    /// Waits up to `timeout` (forever when `None`) for a completion.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        let (head, tail, _) = self.rings.cq_state();
        if tail != head.load(Ordering::Relaxed) {
            return Ok(());
        }
        self.enter(0, 1, timeout)
    }

    /// Runs the kernel's deferred work (which posts finished sends'
    /// notifications) without waiting.
    pub fn flush(&self) -> io::Result<()> {
        self.enter(0, 0, None)
    }

    /// Takes every posted completion, passing each to `each`.
    pub fn reap(&mut self, mut each: impl FnMut(SendEvent)) -> usize {
        let mut n = 0;
        while let Some(c) = self.rings.pop_cqe::<Cqe>() {
            n += 1;
            if c.flags & IORING_CQE_F_NOTIF != 0 {
                each(SendEvent::Done { tag: c.user_data, copied: c.res as u32 & IORING_NOTIF_USAGE_ZC_COPIED != 0 });
            } else {
                let result = if c.res < 0 { Err(-c.res) } else { Ok(c.res as usize) };
                each(SendEvent::Sent { tag: c.user_data, result, notif: c.flags & IORING_CQE_F_MORE != 0 });
            }
        }
        n
    }
}

/// Fills `m.hdr` for a `sendmsg` of `iov` to `m.addr`, with a
/// `UDP_SEGMENT` control message when `segment` is set.
fn msg_header(m: &mut MsgParts, iov: &[io::IoSlice<'_>], segment: Option<u16>) {
    if let Some(a) = &m.addr {
        m.hdr.msg_name = a.as_ptr() as *mut libc::c_void;
        m.hdr.msg_namelen = a.len;
    }
    // IoSlice is ABI-compatible with iovec on Unix.
    m.hdr.msg_iov = iov.as_ptr() as *mut libc::iovec;
    m.hdr.msg_iovlen = iov.len();
    if let Some(seg) = segment {
        m.hdr.msg_control = m.cmsg.as_mut_ptr() as *mut libc::c_void;
        // SAFETY: CMSG_SPACE is a pure size computation.
        m.hdr.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as usize;
        // SAFETY: msg_control points at 32 zeroed, aligned bytes, enough for
        // one u16 control message; CMSG_FIRSTHDR/DATA stay inside them.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&m.hdr);
            (*c).cmsg_level = libc::SOL_UDP;
            (*c).cmsg_type = UDP_SEGMENT;
            (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut u16, seg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_payload_uses_the_registered_buffer_that_holds_all_of_it() {
        let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let Ok(mut ring) = SendRing::new(std::os::fd::AsFd::as_fd(&sock), 64) else { return };
        let a = vec![0u8; 8192];
        let b = vec![0u8; 4096];
        ring.register(&[&a, &b]).unwrap();
        assert_eq!(ring.fixed_index(&[io::IoSlice::new(&a[100..200])]), Some(0));
        assert_eq!(ring.fixed_index(&[io::IoSlice::new(&b[..]), io::IoSlice::new(&b[10..20])]), Some(1));
        assert_eq!(ring.fixed_index(&[io::IoSlice::new(&a[..10]), io::IoSlice::new(&b[..10])]), None);
        let other = vec![0u8; 16];
        assert_eq!(ring.fixed_index(&[io::IoSlice::new(&other)]), None);
        assert_eq!(ring.register(&[&a]).unwrap_err().raw_os_error(), Some(libc::EBUSY));
    }
}
