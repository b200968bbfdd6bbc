//! [`AsyncReceiver`]: datagrams received into a ring of the receiver's
//! buffers and lent to the application, which gives each buffer back.

use crate::sys::sockopt::set_int_option;
use crate::sys::uring_recv::{Filled, Reaped, RecvRing};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// `UDP_GRO` (linux/udp.h).
const UDP_GRO: i32 = 104;

/// How an [`AsyncReceiver`] receives.
#[derive(Clone, Copy, Debug)]
pub struct RecvConfig {
    /// Buffers in the ring (rounded up to a power of two).
    pub buffers: u16,
    /// Bytes per buffer, headers included: 64 KiB and a little take any
    /// datagram or GRO super-packet whole.
    pub buffer_size: usize,
    /// Take coalesced runs whole (`UDP_GRO`) and split them in place.
    pub gro: bool,
}

impl Default for RecvConfig {
    fn default() -> Self {
        RecvConfig { buffers: 64, buffer_size: 65_536 + 512, gro: true }
    }
}

/// One received buffer, lent to the application: read it with
/// [`AsyncReceiver::datagrams`], give it back with
/// [`AsyncReceiver::release`]. A lease dropped without release keeps its
/// buffer out of the ring for good.
#[derive(Debug)]
pub struct RxLease {
    owner: u64,
    filled: Filled,
}

impl RxLease {
    pub fn src(&self) -> Option<SocketAddr> {
        self.filled.src
    }

    /// Payload bytes in the buffer (all segments of a GRO run).
    pub fn len(&self) -> usize {
        self.filled.len
    }

    pub fn is_empty(&self) -> bool {
        self.filled.len == 0
    }

    /// The segment size of a GRO run; `None` for a lone datagram.
    pub fn gro_segment(&self) -> Option<usize> {
        self.filled.gro_segment
    }

    /// The datagram did not fit the buffer.
    pub fn truncated(&self) -> bool {
        self.filled.truncated
    }
}

/// What an [`AsyncReceiver`] has done, for callers that count cost and loss.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvStats {
    /// Buffers handed to the application.
    pub received: u64,
    /// Times the ring ran dry and the kernel ended the receive (`ENOBUFS`);
    /// datagrams then wait in the socket's buffer (or are dropped there when
    /// it is full) until a release arms the receive again.
    pub ring_dry: u64,
    /// System calls made (`io_uring_enter`: arming, re-arming and waiting).
    pub syscalls: u64,
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// Receives on one UDP socket through a multishot io_uring receive; one
/// thread uses it.
pub struct AsyncReceiver {
    // Field order: the ring (registered on the socket) goes first.
    ring: RecvRing,
    sock: UdpSocket,
    owner: u64,
    ready: VecDeque<Filled>,
    /// An error the receive ended with, reported once.
    error: Option<i32>,
    received: u64,
    ring_dry: u64,
}

impl AsyncReceiver {
    /// Takes over `sock` (bound). An error where the kernel lacks io_uring
    /// or provided-buffer rings.
    pub fn new(sock: UdpSocket, cfg: RecvConfig) -> io::Result<Self> {
        if cfg.gro {
            set_int_option(sock.as_fd(), libc::SOL_UDP, UDP_GRO, 1)?;
        }
        let entries = cfg.buffers.max(2).checked_next_power_of_two().unwrap_or(1 << 15);
        let mut ring = RecvRing::new(sock.as_fd(), entries, cfg.buffer_size)?;
        ring.arm()?;
        let owner = NEXT_OWNER.fetch_add(1, Ordering::Relaxed);
        Ok(AsyncReceiver { ring, sock, owner, ready: VecDeque::new(), error: None, received: 0, ring_dry: 0 })
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// Arms the receive unless it is armed: it ends while the application
    /// holds every buffer, and [`AsyncReceiver::release`] and
    /// [`AsyncReceiver::recv`] arm it again.
    pub fn arm(&mut self) -> io::Result<()> {
        self.ring.arm()
    }

    pub fn stats(&self) -> RecvStats {
        RecvStats { received: self.received, ring_dry: self.ring_dry, syscalls: self.ring.enters() }
    }

    /// A descriptor readable while received buffers wait to be taken.
    pub fn ready_fd(&self) -> RawFd {
        self.ring.fd()
    }

    fn reap(&mut self) -> io::Result<()> {
        let mut got = Vec::new();
        self.ring.reap(|r| got.push(r));
        for r in got {
            match r {
                Reaped::Filled(f) => self.ready.push_back(f),
                // The ring ran dry: the receive ends and is armed again once
                // the application gives buffers back.
                Reaped::Error(libc::ENOBUFS) => self.ring_dry += 1,
                Reaped::Error(e) => self.error = Some(e),
            }
        }
        if let Some(e) = self.error.take() {
            return Err(io::Error::from_raw_os_error(e));
        }
        Ok(())
    }

    /// Moves up to `max` received buffers to `out`, waiting up to `timeout`
    /// (forever when `None`) for the first; returns how many.
    pub fn recv(&mut self, out: &mut Vec<RxLease>, max: usize, timeout: Option<Duration>) -> io::Result<usize> {
        self.reap()?;
        if self.ready.is_empty() {
            self.ring.arm()?;
            self.ring.wait(timeout)?;
            self.reap()?;
        }
        let n = self.ready.len().min(max);
        self.received += n as u64;
        out.extend(self.ready.drain(..n).map(|filled| RxLease { owner: self.owner, filled }));
        Ok(n)
    }

    /// The payload of a lease, whole (a GRO run's segments back to back).
    pub fn payload(&self, l: &RxLease) -> &[u8] {
        assert_eq!(l.owner, self.owner, "a lease of another receiver");
        self.ring.bytes(l.filled.bid, l.filled.offset, l.filled.len)
    }

    /// The datagrams of a lease, in place: a GRO run split at its segment size.
    pub fn datagrams<'a>(&'a self, l: &RxLease) -> impl Iterator<Item = &'a [u8]> + 'a {
        let p = self.payload(l);
        let seg = l.filled.gro_segment.unwrap_or(p.len()).max(1);
        p.chunks(seg)
    }

    /// Gives a lease's buffer back to the ring, and arms a receive that
    /// ended on a dry ring once every buffer is back: armed with fewer, a
    /// receive behind a backlog fills them and ends again at once, so each
    /// arming (a system call) takes only the buffers back so far.
    /// [`AsyncReceiver::recv`] (before it waits) and [`AsyncReceiver::arm`]
    /// arm with any number.
    pub fn release(&mut self, l: RxLease) -> io::Result<()> {
        assert_eq!(l.owner, self.owner, "a lease of another receiver");
        self.ring.recycle(l.filled.bid);
        if !self.ring.is_armed() && self.ring.free_buffers() == self.ring.buffers() {
            self.ring.arm()?;
        }
        Ok(())
    }
}
