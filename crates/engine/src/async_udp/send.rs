//! [`AsyncSender`]: datagrams sent from the caller's buffers, each returned
//! by a completion once the kernel is done with it.

pub use super::buf::SendBuf;
use super::inflight::{Held, InFlight};
use super::uring_engine::{Finished, UringEngine};
use crate::batch::{gso_batch, GsoLimits, Run};
use crate::sys::epoll::{Epoll, EV_ERR};
use crate::sys::fdevents::EventFd;
use crate::sys::zerocopy;
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::time::{Duration, Instant};

/// One datagram to send: its buffer, the caller's token and its
/// destination (the connected peer when `None`).
#[derive(Debug)]
pub struct Datagram<B> {
    pub buf: B,
    pub token: u64,
    pub dst: Option<SocketAddr>,
}

/// The end of one datagram's send: its buffer is the caller's again.
#[derive(Debug)]
pub struct Completion<B> {
    pub token: u64,
    pub buf: B,
    /// The bytes sent, or why the kernel refused this datagram.
    pub result: io::Result<usize>,
    /// The kernel copied the payload (always so for copying sends and
    /// refused ones; on zero-copy sends, what the kernel's notification says).
    pub copied: bool,
}

/// How an [`AsyncSender`] hands zero-copy sends to the kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SendEngine {
    /// `sendmsg(MSG_ZEROCOPY)`; notifications on the socket's error queue.
    #[default]
    MsgZerocopy,
    /// io_uring `SEND_ZC` / `SENDMSG_ZC`; notifications as completions of
    /// the ring, and sends from buffers registered with
    /// [`AsyncSender::register_buffers`] skip the per-send page pinning.
    Uring,
}

/// How an [`AsyncSender`] sends.
#[derive(Clone, Copy, Debug)]
pub struct AsyncConfig {
    /// Ask for zero-copy sends; off, every send copies and completes at
    /// once, which is the copying send the benchmark compares.
    pub zerocopy: bool,
    /// The zero-copy engine (with `zerocopy` on).
    pub engine: SendEngine,
    /// Merge consecutive same-size datagrams to one destination into GSO runs.
    pub gso: bool,
    /// Most datagrams whose buffers the sender holds (sent and not yet
    /// notified, or completed and not yet collected).
    pub max_in_flight: usize,
}

impl Default for AsyncConfig {
    fn default() -> Self {
        AsyncConfig { zerocopy: true, engine: SendEngine::MsgZerocopy, gso: true, max_in_flight: 1024 }
    }
}

/// The datagrams of a submission that were not sent, in order (see
/// [`AsyncSender::submit_batch`]).
#[derive(Debug)]
pub struct Full<B>(pub Vec<Datagram<B>>);

/// Counts of an [`AsyncSender`]'s completed datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AsyncStats {
    pub sent: u64,
    /// Sent datagrams whose payload the kernel did not copy.
    pub zero_copied: u64,
    pub failed: u64,
}

/// The sends the kernel holds, by engine.
enum Kernel<B> {
    /// `MSG_ZEROCOPY` sends, keyed by notification id (copying sends too,
    /// which never enter it).
    Msg(InFlight<B>),
    Uring(UringEngine<B>),
}

impl<B: SendBuf> Kernel<B> {
    fn datagrams(&self) -> usize {
        match self {
            Kernel::Msg(f) => f.datagrams(),
            Kernel::Uring(u) => u.datagrams(),
        }
    }
}

/// Sends datagrams from caller-owned buffers on one UDP socket. It belongs
/// to one thread at a time (`&mut self`); its completion fd may be watched
/// from any poller.
pub struct AsyncSender<B: SendBuf> {
    sock: UdpSocket,
    cfg: AsyncConfig,
    zerocopy: bool,
    limits: GsoLimits,
    kernel: Kernel<B>,
    ready: VecDeque<Completion<B>>,
    /// Readable while `ready` holds completions.
    ready_fd: EventFd,
    /// The completion fd: the socket's error queue and `ready_fd`.
    poller: Epoll,
    /// An error the socket reported between sends; the next datagram gets it.
    pending_error: Option<i32>,
    stats: AsyncStats,
}

impl<B: SendBuf> AsyncSender<B> {
    /// Takes over `sock` (bound, and connected if sends may omit `dst`).
    /// Where the kernel refuses `SO_ZEROCOPY`, every send of the
    /// `MsgZerocopy` engine copies; the `Uring` engine is an `Unsupported`
    /// error where the kernel lacks io_uring zero-copy sends.
    pub fn new(sock: UdpSocket, cfg: AsyncConfig) -> io::Result<Self> {
        sock.set_nonblocking(true)?;
        let max_in_flight = cfg.max_in_flight.max(1);
        let uring = cfg.zerocopy && cfg.engine == SendEngine::Uring;
        let kernel =
            if uring { Kernel::Uring(UringEngine::new(&sock, max_in_flight)?) } else { Kernel::Msg(InFlight::new()) };
        let zerocopy = uring || cfg.zerocopy && zerocopy::enable(sock.as_fd()).is_ok();
        let v6 = sock.local_addr()?.is_ipv6();
        let limits = GsoLimits { enabled: cfg.gso, ..GsoLimits::ethernet(v6) };
        let ready_fd = EventFd::new()?;
        let poller = Epoll::new()?;
        match &kernel {
            Kernel::Uring(u) => poller.add_readable(u.fd(), 0)?,
            // Level-triggered on errors only: a socket with a non-empty
            // error queue polls as an error, which epoll reports whatever
            // was asked.
            Kernel::Msg(_) => poller.add(sock.as_raw_fd(), 0, EV_ERR)?,
        }
        poller.add_readable(ready_fd.as_raw_fd(), 1)?;
        Ok(AsyncSender {
            sock,
            cfg: AsyncConfig { max_in_flight, ..cfg },
            zerocopy,
            limits,
            kernel,
            ready: VecDeque::new(),
            ready_fd,
            poller,
            pending_error: None,
            stats: AsyncStats::default(),
        })
    }

    /// Zero-copy sends are in use (asked for and accepted by the kernel).
    pub fn zerocopy(&self) -> bool {
        self.zerocopy
    }

    /// The engine that sends: the configured one with zero-copy in use.
    pub fn engine(&self) -> Option<SendEngine> {
        match self.kernel {
            Kernel::Uring(_) => Some(SendEngine::Uring),
            Kernel::Msg(_) => self.zerocopy.then_some(SendEngine::MsgZerocopy),
        }
    }

    /// Registers `regions` with the `Uring` engine, once: a datagram whose
    /// bytes lie in one of them is sent from its pages, pinned now, instead
    /// of pinning its own pages per send. Each region must stay mapped at
    /// its address as long as the sender lives (the kernel sends the pages
    /// it pinned). `Unsupported` with the `MsgZerocopy` engine.
    pub fn register_buffers(&mut self, regions: &[&[u8]]) -> io::Result<()> {
        match &mut self.kernel {
            Kernel::Uring(u) => u.register(regions),
            Kernel::Msg(_) => {
                Err(io::Error::new(io::ErrorKind::Unsupported, "registered buffers need the Uring engine"))
            }
        }
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.sock
    }

    /// A descriptor that polls readable while completions wait to be
    /// collected by [`AsyncSender::poll_completions`].
    pub fn completion_fd(&self) -> RawFd {
        self.poller.as_raw_fd()
    }

    /// Datagrams whose buffers the sender holds.
    pub fn in_flight(&self) -> usize {
        self.kernel.datagrams() + self.ready.len()
    }

    pub fn stats(&self) -> AsyncStats {
        self.stats
    }

    /// Sends one datagram; see [`AsyncSender::submit_batch`].
    pub fn submit(&mut self, dg: Datagram<B>) -> Result<(), Full<B>> {
        self.submit_batch(vec![dg])
    }

    /// Sends `dgs` in order, as GSO runs where they allow it. Each datagram
    /// sent gets one completion; a datagram the kernel refuses gets its
    /// error there, and the others are still sent. Comes back as [`Full`]
    /// with the datagrams not sent: all of them when the batch would take
    /// the held buffers past `max_in_flight` (collect completions, then
    /// submit again), or the tail from the first that found the socket's
    /// send buffer full (wait until it drains, see [`AsyncSender::wait_writable`]).
    pub fn submit_batch(&mut self, dgs: Vec<Datagram<B>>) -> Result<(), Full<B>> {
        if self.in_flight() + dgs.len() > self.cfg.max_in_flight {
            return Err(Full(dgs));
        }
        let items: Vec<_> = dgs.iter().map(|d| (d.dst, d.buf.bytes().len())).collect();
        let mut runs = gso_batch(&items, &self.limits);
        if self.zerocopy {
            runs = fit_frags(runs, &dgs);
        }
        if matches!(self.kernel, Kernel::Uring(_)) {
            self.submit_uring(dgs, runs);
            return Ok(());
        }
        let mut dgs = dgs.into_iter();
        let mut result = Ok(());
        for run in runs {
            let mut group: Vec<Datagram<B>> = dgs.by_ref().take(run.count).collect();
            let mut segment = run.segment;
            if let Some(e) = self.pending_error.take() {
                let first = group.remove(0);
                self.fail(first, e);
                segment = None;
            }
            let unsent = if segment.is_none() && group.len() > 1 {
                self.send_singly(group)
            } else if group.is_empty() {
                Vec::new()
            } else {
                self.send_group(group, segment)
            };
            if !unsent.is_empty() {
                result = Err(Full(unsent.into_iter().chain(dgs.by_ref()).collect()));
                break;
            }
        }
        if !self.ready.is_empty() {
            self.ready_fd.set();
        }
        result
    }

    /// Hands the runs to the io_uring engine, which takes them all (a full
    /// socket makes the kernel wait for room), and collects the results
    /// the kernel posted at once, errors among them.
    fn submit_uring(&mut self, dgs: Vec<Datagram<B>>, runs: Vec<Run>) {
        let Kernel::Uring(engine) = &mut self.kernel else { return };
        let mut dgs = dgs.into_iter();
        let mut groups = Vec::with_capacity(runs.len());
        for run in &runs {
            let group: Vec<Datagram<B>> = dgs.by_ref().take(run.count).collect();
            let dst = group[0].dst;
            groups.push((held(group), dst, run.segment));
        }
        let mut done = Vec::new();
        // A ring that fails to submit for good leaves its requests held:
        // the kernel may have taken some, so their buffers never come back.
        let _ = engine.send(groups).and_then(|()| engine.reap(&mut done));
        self.finish_all(done);
    }

    fn finish_all(&mut self, done: Vec<Finished<B>>) {
        for (token, buf, result, copied) in done {
            self.finish(token, buf, result.map_err(io::Error::from_raw_os_error), copied);
        }
        if !self.ready.is_empty() {
            self.ready_fd.set();
        }
    }

    /// Waits up to `timeout` until the socket's send buffer has room.
    pub fn wait_writable(&self, timeout: Duration) -> io::Result<bool> {
        crate::sys::poll::poll_writable(self.sock.as_raw_fd(), Some(timeout))
    }

    fn send_singly(&mut self, group: Vec<Datagram<B>>) -> Vec<Datagram<B>> {
        let mut group = group.into_iter();
        while let Some(d) = group.next() {
            let unsent = self.send_group(vec![d], None);
            if !unsent.is_empty() {
                return unsent.into_iter().chain(group).collect();
            }
        }
        Vec::new()
    }

    /// One `sendmsg` of `group` (a GSO run when `segment` is set); returns
    /// the datagrams not sent because the send buffer is full. A refused
    /// run is sent again one datagram at a time, so that each error lands
    /// on the datagram the kernel refused.
    fn send_group(&mut self, group: Vec<Datagram<B>>, segment: Option<u16>) -> Vec<Datagram<B>> {
        let total: usize = group.iter().map(|d| d.buf.bytes().len()).sum();
        // An empty datagram has no pages to hold and gets no notification.
        let zc = self.zerocopy && total > 0;
        let dst = group[0].dst;
        let r = {
            let iov: Vec<io::IoSlice<'_>> = group.iter().map(|d| io::IoSlice::new(d.buf.bytes())).collect();
            zerocopy::send(self.sock.as_fd(), dst.as_ref(), &iov, segment, zc)
        };
        match r {
            Ok(_) if zc => {
                if let Kernel::Msg(f) = &mut self.kernel {
                    f.push(held(group));
                }
            }
            Ok(_) => {
                for d in group {
                    let len = d.buf.bytes().len();
                    self.finish(d.token, d.buf, Ok(len), true);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return group,
            Err(_) if group.len() > 1 => return self.send_singly(group),
            Err(e) => {
                let d = group.into_iter().next().expect("a group holds a datagram");
                self.fail(d, e.raw_os_error().unwrap_or(libc::EIO));
            }
        }
        Vec::new()
    }

    fn fail(&mut self, d: Datagram<B>, errno: i32) {
        self.finish(d.token, d.buf, Err(io::Error::from_raw_os_error(errno)), true);
    }

    fn finish(&mut self, token: u64, buf: B, result: io::Result<usize>, copied: bool) {
        match &result {
            Ok(_) => {
                self.stats.sent += 1;
                self.stats.zero_copied += u64::from(!copied);
            }
            Err(_) => self.stats.failed += 1,
        }
        self.ready.push_back(Completion { token, buf, result, copied });
    }

    /// Reads the kernel's notifications and moves finished datagrams (at
    /// most `max`, oldest first) to `out`; returns how many it moved.
    /// Never waits.
    pub fn poll_completions(&mut self, out: &mut Vec<Completion<B>>, max: usize) -> io::Result<usize> {
        self.read_kernel()?;
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
        if self.ready.is_empty() {
            self.ready_fd.clear();
        }
        Ok(n)
    }

    fn read_kernel(&mut self) -> io::Result<()> {
        let flight = match &mut self.kernel {
            Kernel::Msg(f) => f,
            Kernel::Uring(u) => {
                let mut done = Vec::new();
                u.reap(&mut done)?;
                self.finish_all(done);
                return Ok(());
            }
        };
        let mut notes = Vec::new();
        let mut errors = Vec::new();
        zerocopy::read_notifications(self.sock.as_fd(), 256, |n| match n {
            Ok(n) => notes.push(n),
            Err(e) => errors.push(e),
        })?;
        let mut done = Vec::new();
        for n in notes {
            flight.complete(n.lo, n.hi, |held| done.push((held, n.copied)));
        }
        for (held, copied) in done {
            for (token, buf, len) in held {
                self.finish(token, buf, Ok(len), copied);
            }
        }
        // Without IP_RECVERR the queue holds only notifications; anything
        // else is kept for the next datagram like a pending socket error.
        if let Some(e) = errors.into_iter().find(|&e| e != 0) {
            self.pending_error = Some(e);
        }
        Ok(())
    }

    /// Waits up to `timeout` (forever when `None`) until completions can be
    /// collected; true when some can.
    pub fn wait(&mut self, timeout: Option<Duration>) -> io::Result<bool> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut events = Vec::new();
        loop {
            if !self.ready.is_empty() {
                return Ok(true);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match &self.kernel {
                // Entering the ring also runs the deferred work that posts
                // notifications.
                Kernel::Uring(u) => u.wait(left)?,
                Kernel::Msg(_) => self.poller.wait(&mut events, left)?,
            }
            self.read_kernel()?;
            if self.ready.is_empty() && matches!(self.kernel, Kernel::Msg(_)) && events.contains(&0) {
                // The socket polls as an error with an empty queue: an ICMP
                // error is pending. The kernel would refuse the next send
                // with it; that datagram gets it instead.
                let e = zerocopy::take_pending_error(self.sock.as_fd())?;
                if e != 0 {
                    self.pending_error = Some(e);
                }
            }
            if !self.ready.is_empty() {
                return Ok(true);
            }
            // A wait cut short (a signal, the kernel's deferred work) goes on
            // until the deadline.
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(false);
            }
        }
    }

    /// Waits up to `timeout` until no buffer is in the kernel's hands,
    /// collecting completions into `out`; true when none is.
    pub fn drain(&mut self, out: &mut Vec<Completion<B>>, timeout: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            self.poll_completions(out, usize::MAX)?;
            let left = deadline.saturating_duration_since(Instant::now());
            if self.kernel.datagrams() == 0 {
                return Ok(true);
            }
            if left.is_zero() {
                return Ok(false);
            }
            self.wait(Some(left.min(Duration::from_millis(50))))?;
        }
    }
}

/// Pages one zero-copy message may pin: the kernel's `MAX_SKB_FRAGS` as
/// built by default. A run past it makes the kernel take a slow path
/// (several times the cost of copying), so zero-copy runs are cut to fit.
const MAX_FRAGS: usize = 17;

/// What the kernel holds of a sent group until its completion: each
/// datagram's token, buffer and length.
fn held<B: SendBuf>(group: Vec<Datagram<B>>) -> Held<B> {
    group
        .into_iter()
        .map(|d| {
            let len = d.buf.bytes().len();
            (d.token, d.buf, len)
        })
        .collect()
}

/// Pages `b` spans.
fn pages(b: &[u8]) -> usize {
    if b.is_empty() {
        return 0;
    }
    let start = b.as_ptr() as usize;
    (start + b.len() - 1) / 4096 - start / 4096 + 1
}

/// Cuts GSO runs so that each pins at most [`MAX_FRAGS`] pages.
fn fit_frags<B: SendBuf>(runs: Vec<Run>, dgs: &[Datagram<B>]) -> Vec<Run> {
    let mut out = Vec::with_capacity(runs.len());
    for r in runs {
        let mut start = r.start;
        let mut used = 0;
        for (i, d) in dgs.iter().enumerate().skip(r.start).take(r.count) {
            let p = pages(d.buf.bytes());
            if i > start && used + p > MAX_FRAGS {
                out.push(Run { start, count: i - start, segment: r.segment.filter(|_| i - start > 1) });
                start = i;
                used = 0;
            }
            used += p;
        }
        let count = r.start + r.count - start;
        out.push(Run { start, count, segment: r.segment.filter(|_| count > 1) });
    }
    out
}

impl<B: SendBuf> Drop for AsyncSender<B> {
    fn drop(&mut self) {
        let mut out = Vec::new();
        let _ = self.drain(&mut out, Duration::from_secs(1));
        // Buffers the kernel still holds after that are leaked, never freed:
        // freed memory could be reused while the kernel still reads it.
        let held = match &mut self.kernel {
            Kernel::Msg(f) => f.abandon(),
            Kernel::Uring(u) => u.abandon(),
        };
        for h in held {
            std::mem::forget(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_copy_runs_pin_at_most_max_frags_pages() {
        // Buffers of 4097 B span two pages or more each: a run of 20 must be cut.
        let block = vec![0u8; 4096 * 41];
        let base = block.as_ptr().align_offset(4096);
        let dgs: Vec<Datagram<Vec<u8>>> =
            (0..20).map(|i| Datagram { buf: block[base + i * 8192..][..4097].to_vec(), token: 0, dst: None }).collect();
        let runs = fit_frags(vec![Run { start: 0, count: 20, segment: Some(4097) }], &dgs);
        assert_eq!(runs.iter().map(|r| r.count).sum::<usize>(), 20);
        for r in &runs {
            let used: usize = dgs[r.start..r.start + r.count].iter().map(|d| pages(d.buf.bytes())).sum();
            assert!(used <= MAX_FRAGS || r.count == 1, "{r:?} pins {used} pages");
            assert_eq!(r.segment.is_some(), r.count > 1);
        }
        assert_eq!(pages(&[]), 0);
        assert_eq!(pages(&block[base..base + 4096]), 1);
        assert_eq!(pages(&block[base + 4095..base + 4097]), 2);
    }
}
