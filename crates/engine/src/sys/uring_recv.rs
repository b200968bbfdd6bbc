//! Multishot `recvmsg` through io_uring into a provided-buffer ring.
//!
//! One armed `IORING_OP_RECVMSG` with `IORING_RECV_MULTISHOT` keeps
//! receiving: for each datagram the kernel takes a buffer from a ring the
//! application registered (`IORING_REGISTER_PBUF_RING`), writes a header,
//! the source address, the control messages and the payload into it, and
//! posts a completion naming the buffer. The buffer is the application's
//! until it is put back on the ring. This file holds the raw side: the
//! io_uring and buffer-ring memory, arming, reaping and the layout of a
//! filled buffer; the ring itself is [`super::uring`]'s, shared with
//! [`super::io_uring`].

use super::addr::RawAddr;
use super::uring::{
    self, Cqe, Map, Params, Rings, Sqe, IORING_CQE_F_MORE, IORING_SETUP_COOP_TASKRUN, IORING_SETUP_CQSIZE,
};
use std::io;
use std::mem::size_of;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

const IORING_OP_RECVMSG: u8 = 10;
const IOSQE_BUFFER_SELECT: u8 = 1 << 5;
const IORING_RECV_MULTISHOT: u16 = 1 << 1;
const IORING_CQE_F_BUFFER: u32 = 1 << 0;
const IORING_CQE_BUFFER_SHIFT: u32 = 16;
const IORING_REGISTER_PBUF_RING: u32 = 22;
const IORING_UNREGISTER_PBUF_RING: u32 = 23;
/// `UDP_GRO` (linux/udp.h): the control message with a coalesced run's segment size.
const UDP_GRO: i32 = 104;
/// The buffer group of the ring (one ring per io_uring here).
const BGID: u16 = 0;
/// The armed receive's tag.
const RECV_TAG: u64 = 1;
/// Room reserved in each buffer for the source address and control messages.
const NAME_LEN: u32 = size_of::<libc::sockaddr_storage>() as u32;
const CONTROL_LEN: u32 = 64;
/// `struct io_uring_recvmsg_out`: name, control and payload lengths, flags.
const OUT_LEN: usize = 16;

/// `struct io_uring_buf_reg`.
#[repr(C)]
struct BufReg {
    ring_addr: u64,
    ring_entries: u32,
    bgid: u16,
    flags: u16,
    resv: [u64; 3],
}

/// `struct io_uring_buf`: one entry of the provided-buffer ring.
#[repr(C)]
struct BufEntry {
    addr: u64,
    len: u32,
    bid: u16,
    resv: u16,
}

/// One filled buffer as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filled {
    pub bid: u16,
    pub src: Option<SocketAddr>,
    /// The payload: `len` bytes from `offset` in the buffer.
    pub offset: usize,
    pub len: usize,
    /// The segment size of a GRO super-packet (`UDP_GRO`).
    pub gro_segment: Option<usize>,
    /// The payload did not fit the buffer.
    pub truncated: bool,
}

/// What one completion said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reaped {
    Filled(Filled),
    /// The receive failed with this errno (`ENOBUFS`: the ring ran dry).
    Error(i32),
}

/// A multishot receive on one socket with its buffer ring; one thread uses it.
pub struct RecvRing {
    // Field order: the maps go before the fd closes.
    rings: Rings,
    ring: Map,
    bufs: Map,
    fd: OwnedFd,
    sock: RawFd,
    entries: u16,
    buf_size: usize,
    /// The buffer ring's tail as this side last published it.
    tail: u16,
    /// The header the armed receive was prepared from (lengths only).
    hdr: Box<libc::msghdr>,
    armed: bool,
    /// `io_uring_enter` calls made (arming and waiting).
    enters: u64,
    /// Buffers the kernel has filled and that are not back on the ring.
    out: u16,
}

impl RecvRing {
    /// A ring of `entries` (a power of two) buffers of `buf_size` bytes each
    /// for `sock`, registered and full, not yet armed. The socket must stay
    /// open as long as the ring; an error where the kernel lacks provided
    /// buffer rings (before 5.19).
    pub fn new(sock: BorrowedFd<'_>, entries: u16, buf_size: usize) -> io::Result<RecvRing> {
        if !entries.is_power_of_two() || buf_size <= OUT_LEN + (NAME_LEN + CONTROL_LEN) as usize {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        let mut p = Params::new(u32::from(entries) * 2, IORING_SETUP_CQSIZE | IORING_SETUP_COOP_TASKRUN);
        let fd = uring::setup(4, &mut p)?;
        let rings = Rings::map(fd.as_raw_fd(), &p, size_of::<Cqe>())?;
        let ring = Map::new(-1, usize::from(entries) * size_of::<BufEntry>(), 0)?;
        let bufs = Map::new(-1, usize::from(entries) * buf_size, 0)?;
        let reg =
            BufReg { ring_addr: ring.ptr as u64, ring_entries: u32::from(entries), bgid: BGID, flags: 0, resv: [0; 3] };
        // SAFETY: io_uring_register reads the live `reg`; the ring memory it
        // names stays mapped (and registered) until this value drops.
        let r = unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                fd.as_raw_fd(),
                IORING_REGISTER_PBUF_RING,
                &reg as *const BufReg,
                1u32,
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: msghdr is plain data; only the two lengths matter to a
        // buffer-select receive, which lays the buffer out by them.
        let mut hdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        hdr.msg_namelen = NAME_LEN;
        hdr.msg_controllen = CONTROL_LEN as usize;
        let mut me = RecvRing {
            rings,
            ring,
            bufs,
            fd,
            sock: sock.as_raw_fd(),
            entries,
            buf_size,
            tail: 0,
            hdr,
            armed: false,
            enters: 0,
            out: 0,
        };
        for bid in 0..entries {
            me.put(bid);
        }
        me.publish();
        Ok(me)
    }

    /// The ring's descriptor: readable while completions wait.
    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Writes buffer `bid` at the next free ring slot (published later).
    fn put(&mut self, bid: u16) {
        assert!(bid < self.entries);
        let idx = usize::from(self.tail & (self.entries - 1));
        let e = BufEntry {
            // SAFETY: bid < entries, so the offset stays inside `bufs`.
            addr: unsafe { self.bufs.ptr.add(usize::from(bid) * self.buf_size) } as u64,
            len: self.buf_size as u32,
            bid,
            resv: 0,
        };
        // SAFETY: idx < entries, inside the ring mapping; the kernel reads
        // a slot only once the published tail covers it, which it does not
        // yet. The entry's last two bytes double as the ring's tail in
        // slot 0, so slot 0 is written field by field below the tail.
        unsafe {
            let slot = (self.ring.ptr as *mut BufEntry).add(idx);
            std::ptr::addr_of_mut!((*slot).addr).write(e.addr);
            std::ptr::addr_of_mut!((*slot).len).write(e.len);
            std::ptr::addr_of_mut!((*slot).bid).write(e.bid);
        }
        self.tail = self.tail.wrapping_add(1);
    }

    /// Makes the buffers put so far visible to the kernel.
    fn publish(&self) {
        // SAFETY: the tail is the u16 at byte 14 of the ring mapping, 2-aligned.
        let tail = unsafe { &*(self.ring.ptr.add(14) as *const AtomicU16) };
        tail.store(self.tail, Ordering::Release);
    }

    /// Gives buffer `bid` back to the kernel.
    pub fn recycle(&mut self, bid: u16) {
        self.put(bid);
        self.publish();
        self.out = self.out.saturating_sub(1);
    }

    /// Buffers on the ring, free for the kernel to fill.
    pub fn free_buffers(&self) -> u16 {
        self.entries - self.out
    }

    /// Buffers in the ring.
    pub fn buffers(&self) -> u16 {
        self.entries
    }

    pub fn is_armed(&self) -> bool {
        self.armed
    }

    /// The bytes of buffer `bid` at `offset..offset + len`.
    ///
    /// Callers pass a buffer a completion handed out and that they have not
    /// recycled: the kernel does not write it until it is put back.
    pub fn bytes(&self, bid: u16, offset: usize, len: usize) -> &[u8] {
        assert!(bid < self.entries && offset + len <= self.buf_size);
        // SAFETY: in bounds of `bufs` (checked); the buffer is out of the
        // ring (caller contract above), so nothing writes it while the
        // returned borrow of `self` lives.
        unsafe { std::slice::from_raw_parts(self.bufs.ptr.add(usize::from(bid) * self.buf_size + offset), len) }
    }

    /// Arms the multishot receive unless it is armed.
    pub fn arm(&mut self) -> io::Result<()> {
        if self.armed {
            return Ok(());
        }
        let e = Sqe {
            opcode: IORING_OP_RECVMSG,
            flags: IOSQE_BUFFER_SELECT,
            ioprio: IORING_RECV_MULTISHOT,
            fd: self.sock,
            addr: &*self.hdr as *const libc::msghdr as u64,
            len: 1,
            user_data: RECV_TAG,
            buf_index: BGID,
            ..Default::default()
        };
        self.rings.push(e);
        self.enter(1, 0, None)?;
        self.armed = true;
        Ok(())
    }

    /// `io_uring_enter`: submits `n`, waits for `min` completions up to `timeout`.
    fn enter(&mut self, n: u32, min: u32, timeout: Option<Duration>) -> io::Result<()> {
        self.enters += 1;
        match uring::enter(self.fd.as_raw_fd(), n, min, Some(timeout)) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)) => {
                Ok(())
            }
            r => r,
        }
    }

    /// Waits up to `timeout` (forever when `None`) for a completion.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        if self.pending() > 0 {
            return Ok(());
        }
        self.enter(0, 1, timeout)
    }

    /// The `io_uring_enter` calls this ring has made.
    pub fn enters(&self) -> u64 {
        self.enters
    }

    fn pending(&self) -> u32 {
        let (head, tail, _) = self.rings.cq_state();
        tail.wrapping_sub(head.load(Ordering::Relaxed))
    }

    /// Takes every posted completion, passing each to `each`; a receive the
    /// kernel ended (no `F_MORE`) is marked unarmed for [`RecvRing::arm`].
    pub fn reap(&mut self, mut each: impl FnMut(Reaped)) -> usize {
        let mut n = 0;
        while let Some(c) = self.rings.pop_cqe::<Cqe>() {
            if c.user_data != RECV_TAG {
                continue;
            }
            if c.flags & IORING_CQE_F_MORE == 0 {
                self.armed = false;
            }
            n += 1;
            if c.res < 0 {
                each(Reaped::Error(-c.res));
            } else if c.flags & IORING_CQE_F_BUFFER != 0 {
                let bid = (c.flags >> IORING_CQE_BUFFER_SHIFT) as u16;
                self.out += 1;
                each(Reaped::Filled(self.parse(bid, c.res as usize)));
            }
        }
        n
    }

    /// Reads the layout the kernel wrote into buffer `bid` (`filled` bytes).
    fn parse(&self, bid: u16, filled: usize) -> Filled {
        let whole = self.bytes(bid, 0, filled.min(self.buf_size));
        let word = |i: usize| u32::from_ne_bytes(whole[i * 4..i * 4 + 4].try_into().expect("4 bytes"));
        let (namelen, controllen, payloadlen, flags) = (word(0), word(1), word(2), word(3));
        let name_at = OUT_LEN;
        let control_at = name_at + NAME_LEN as usize;
        let offset = control_at + CONTROL_LEN as usize;
        let len = (payloadlen as usize).min(self.buf_size - offset).min(filled.saturating_sub(offset));
        let mut raw = RawAddr::empty();
        let n = (namelen as usize).min(NAME_LEN as usize);
        // SAFETY: copies at most NAME_LEN bytes from the buffer's name area
        // into the sockaddr_storage, which is NAME_LEN bytes long.
        unsafe {
            std::ptr::copy_nonoverlapping(
                whole.as_ptr().add(name_at),
                &mut raw.storage as *mut libc::sockaddr_storage as *mut u8,
                n,
            )
        };
        raw.len = n as libc::socklen_t;
        let control = &whole[control_at..control_at + (controllen as usize).min(CONTROL_LEN as usize)];
        Filled {
            bid,
            src: if n > 0 { raw.to_std() } else { None },
            offset,
            len,
            gro_segment: gro_segment(control),
            truncated: flags & libc::MSG_TRUNC as u32 != 0 || (payloadlen as usize) > len,
        }
    }
}

/// The `UDP_GRO` segment size among control messages laid out as the
/// kernel writes them (`cmsghdr`s, each padded to 8 bytes).
fn gro_segment(control: &[u8]) -> Option<usize> {
    let hdr = size_of::<libc::cmsghdr>();
    let mut at = 0;
    while at + hdr <= control.len() {
        let len = usize::from_ne_bytes(control[at..at + 8].try_into().ok()?);
        let level = i32::from_ne_bytes(control[at + 8..at + 12].try_into().ok()?);
        let ty = i32::from_ne_bytes(control[at + 12..at + 16].try_into().ok()?);
        if len < hdr || at + len > control.len() {
            return None;
        }
        if level == libc::SOL_UDP && ty == UDP_GRO && len >= hdr + 4 {
            let v = i32::from_ne_bytes(control[at + hdr..at + hdr + 4].try_into().ok()?);
            return (v > 0).then_some(v as usize);
        }
        at += (len + 7) & !7;
    }
    None
}

impl Drop for RecvRing {
    fn drop(&mut self) {
        let reg = BufReg { ring_addr: 0, ring_entries: 0, bgid: BGID, flags: 0, resv: [0; 3] };
        // SAFETY: unregisters the group this value registered, reading the
        // live `reg`; the ring memory is unmapped only afterwards (field drops).
        unsafe {
            libc::syscall(
                libc::SYS_io_uring_register,
                self.fd.as_raw_fd(),
                IORING_UNREGISTER_PBUF_RING,
                &reg as *const BufReg,
                1u32,
            )
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gro_segment_is_found_among_control_messages() {
        let mut c = vec![0u8; 48];
        // A TOS message first (16-byte header + 1 byte, padded to 24), then UDP_GRO.
        c[0..8].copy_from_slice(&17usize.to_ne_bytes());
        c[8..12].copy_from_slice(&libc::SOL_IP.to_ne_bytes());
        c[12..16].copy_from_slice(&libc::IP_TOS.to_ne_bytes());
        c[24..32].copy_from_slice(&20usize.to_ne_bytes());
        c[32..36].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
        c[36..40].copy_from_slice(&UDP_GRO.to_ne_bytes());
        c[40..44].copy_from_slice(&1400i32.to_ne_bytes());
        assert_eq!(gro_segment(&c), Some(1400));
        assert_eq!(gro_segment(&c[..24]), None);
        assert_eq!(gro_segment(&[]), None);
    }
}
