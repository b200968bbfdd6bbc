//! `eudp worker`: one side of a measured transfer, run inside a testbed host.
//!
//! Every stack sends the same datagrams — an 8-byte sequence number followed
//! by a pattern derived from it — so the receiver can check every payload
//! byte, count loss and detect reordering whatever the stack. A worker prints
//! one JSON object ([`Report`]) on stdout; the receiver first prints
//! `ready` once bound.

use eudp_engine::backend::kernel::{InMeta, OutMsg, UdpSocket};
use eudp_engine::backend::xdp::XdpTransport;
use eudp_engine::sys::clock::process_cpu_time;
use eudp_engine::sys::poll::poll_readable;
use eudp_engine::{Config, Endpoint, Engine, StatsSnapshot};
use serde::Serialize;
use std::io::{IoSlice, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The stacks compared by `eudp bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// One `send()`/`recv()` syscall per datagram.
    Kernel,
    /// `sendmmsg`/`recvmmsg` with 32 datagrams per call.
    Mmsg,
    /// Hand-built 64 KB UDP GSO sends and UDP GRO receives: the ceiling.
    Gso,
    /// The eudp library path: one `Endpoint::send`/`recv` per datagram.
    Eudp,
    /// The eudp library path on the AF_XDP transport (the host's one
    /// interface; docs/xdp.md).
    Xdp,
}

impl Mode {
    pub fn name(&self) -> &'static str {
        match self {
            Mode::Kernel => "kernel",
            Mode::Mmsg => "mmsg",
            Mode::Gso => "gso",
            Mode::Eudp => "eudp",
            Mode::Xdp => "xdp",
        }
    }
}

/// What one worker measured.
#[derive(Debug, Default, Serialize, serde::Deserialize, Clone)]
pub struct Report {
    /// Datagrams sent (sender) or received (receiver).
    pub datagrams: u64,
    pub bytes: u64,
    /// Wall time of the transfer: sender from first to last send, receiver
    /// from first to last datagram.
    pub secs: f64,
    /// Process CPU time (all threads, including the eudp engine).
    pub cpu_secs: f64,
    /// Receiver: datagrams whose payload did not match.
    pub corrupt: u64,
    /// Receiver: datagrams that arrived with a lower sequence than one before.
    pub reordered: u64,
    /// Receiver: highest sequence number seen + 1.
    pub seq_span: u64,
    /// Peak resident set size of the worker, KiB.
    pub max_rss_kib: u64,
    /// eudp endpoint counters, for the eudp mode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eudp: Option<serde_json::Value>,
}

fn fill(buf: &mut [u8], seq: u64) {
    let b = seq.to_be_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&b[8 - n..]);
}

/// A fixed pattern; bytes 0..8 of each datagram carry the sequence number.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + 3) as u8).collect()
}

/// Peak resident set size (VmHWM) of this process, KiB.
pub fn max_rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Sender arguments.
pub struct SendArgs {
    pub mode: Mode,
    pub dst: SocketAddr,
    pub size: usize,
    pub secs: f64,
    /// Stop after this many datagrams (0: only the time bound).
    pub count: u64,
    /// Pause 1 ms after every this many datagrams (0: never), to send
    /// without loss in correctness tests.
    pub pace_every: u64,
    /// Offered load in datagrams per second (0: as fast as possible).
    pub rate_pps: f64,
}

/// Receiver arguments.
pub struct RecvArgs {
    pub mode: Mode,
    pub bind: SocketAddr,
    pub size: usize,
    /// Stop after this long without data once data has arrived.
    pub idle: Duration,
    /// Hard bound on the whole run.
    pub max: Duration,
    /// Stop after this many datagrams (0: no bound).
    pub count: u64,
}

/// Runs a sender and prints its report.
pub fn send(a: SendArgs) -> Result<Report, String> {
    let pat = pattern(a.size.max(8));
    let deadline = Duration::from_secs_f64(a.secs);
    let count = if a.count == 0 { u64::MAX } else { a.count };
    let cpu0 = process_cpu_time();
    let t0 = Instant::now();
    let mut seq = 0u64;
    let mut bytes = 0u64;
    let mut eudp_stats = None;
    let e = |e: std::io::Error| format!("send: {e}");
    let next_check = std::cell::Cell::new(0u64);
    let pace = |seq: u64| {
        if a.pace_every > 0 && seq.is_multiple_of(a.pace_every) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Rate pacing: every 16 datagrams, sleep until the schedule allows.
        if a.rate_pps > 0.0 && seq >= next_check.get() {
            next_check.set(seq + 16);
            let due = t0 + Duration::from_secs_f64(seq as f64 / a.rate_pps);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
    };
    match a.mode {
        Mode::Kernel => {
            let s = std::net::UdpSocket::bind(if a.dst.is_ipv6() { "[::]:0" } else { "0.0.0.0:0" }).map_err(e)?;
            s.connect(a.dst).map_err(e)?;
            let _ = set_sndbuf_std(&s);
            let mut buf = pat[..a.size].to_vec();
            while seq < count && (seq & 63 != 0 || t0.elapsed() < deadline) {
                fill(&mut buf, seq);
                match s.send(&buf) {
                    Ok(n) => bytes += n as u64,
                    Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => continue,
                    Err(x) => return Err(e(x)),
                }
                seq += 1;
                pace(seq);
            }
        }
        Mode::Mmsg | Mode::Gso => {
            let s = UdpSocket::new(a.dst.is_ipv6()).map_err(e)?;
            s.connect(&a.dst).map_err(e)?;
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, SNDBUF);
            let gso = a.mode == Mode::Gso;
            let per = if gso { (65_507 / a.size.max(1)).clamp(1, 64) } else { 32 };
            let mut bufs: Vec<Vec<u8>> = (0..per).map(|_| pat[..a.size].to_vec()).collect();
            while seq < count && t0.elapsed() < deadline {
                let n = per.min((count - seq) as usize);
                for (i, b) in bufs[..n].iter_mut().enumerate() {
                    fill(b, seq + i as u64);
                }
                let iov: Vec<IoSlice<'_>> = bufs[..n].iter().map(|b| IoSlice::new(b)).collect();
                let sent = if gso {
                    let msg =
                        [OutMsg { dst: None, iov: &iov, segment: (n > 1).then_some(a.size as u16), stamp: false }];
                    s.send_batch(&msg).map(|k| k * n)
                } else {
                    let msgs: Vec<OutMsg<'_>> = (0..n)
                        .map(|i| OutMsg { dst: None, iov: &iov[i..i + 1], segment: None, stamp: false })
                        .collect();
                    s.send_batch(&msgs)
                };
                match sent {
                    Ok(k) => {
                        seq += k as u64;
                        bytes += (k * a.size) as u64;
                    }
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                        let _ = eudp_engine::sys::poll::poll_writable(
                            std::os::fd::AsRawFd::as_raw_fd(&s),
                            Some(Duration::from_millis(10)),
                        );
                    }
                    Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => {}
                    Err(x) => return Err(e(x)),
                }
                pace(seq);
            }
        }
        Mode::Eudp | Mode::Xdp => {
            let cfg = Config::from_env().map_err(|x| x.to_string())?;
            let engine = Engine::start(cfg).map_err(e)?;
            let ep = endpoint(a.mode, &engine, a.dst.is_ipv6()).map_err(e)?;
            ep.connect(a.dst).map_err(e)?;
            let _ = ep.set_send_buffer_size(SNDBUF as usize);
            let mut buf = pat[..a.size].to_vec();
            while seq < count && (seq & 63 != 0 || t0.elapsed() < deadline) {
                fill(&mut buf, seq);
                match ep.send(&buf) {
                    Ok(n) => bytes += n as u64,
                    Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => continue,
                    Err(x) => return Err(e(x)),
                }
                seq += 1;
                pace(seq);
            }
            ep.flush(Duration::from_secs(5));
            eudp_stats = Some(stats_json(&ep.stats(), a.mode));
            drop(ep);
            drop(engine);
        }
    }
    Ok(Report {
        datagrams: seq,
        bytes,
        secs: t0.elapsed().as_secs_f64(),
        cpu_secs: (process_cpu_time() - cpu0).as_secs_f64(),
        max_rss_kib: max_rss_kib(),
        eudp: eudp_stats,
        ..Report::default()
    })
}

/// An endpoint of the library path: the kernel backend, or the AF_XDP
/// transport of the host's one interface.
fn endpoint(mode: Mode, engine: &Engine, v6: bool) -> std::io::Result<Endpoint> {
    if mode == Mode::Xdp {
        XdpTransport::global()?.endpoint(engine, v6)
    } else {
        Endpoint::with_engine(engine, v6)
    }
}

/// The endpoint's counters; on the xdp transport with the transport's own
/// (frames, kicks) under `xdp`.
fn stats_json(s: &StatsSnapshot, mode: Mode) -> serde_json::Value {
    let mut v = serde_json::to_value(s).unwrap_or(serde_json::Value::Null);
    if let (Mode::Xdp, Some(Ok(t)), Some(o)) = (mode, XdpTransport::global_started(), v.as_object_mut()) {
        o.insert("xdp".into(), serde_json::to_value(t.stats()).unwrap_or_default());
    }
    v
}

/// Receive-side bookkeeping shared by every mode.
struct Tally<'a> {
    pat: &'a [u8],
    size: usize,
    r: Report,
    next_seq: u64,
    first: Option<Instant>,
    last: Instant,
}

impl Tally<'_> {
    fn datagram(&mut self, d: &[u8]) {
        // Read the clock for the first datagram and every 32nd after: the
        // window's end is exact to within 32 datagrams, and no stack pays a
        // clock read per datagram.
        if self.first.is_none() || self.r.datagrams.is_multiple_of(32) {
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = now;
        }
        self.r.datagrams += 1;
        self.r.bytes += d.len() as u64;
        let mut seq_b = [0u8; 8];
        let n = d.len().min(8);
        seq_b[8 - n..].copy_from_slice(&d[..n]);
        let seq = u64::from_be_bytes(seq_b);
        if d.len() != self.size || d.len() > 8 && d[8..] != self.pat[8..self.size] {
            self.r.corrupt += 1;
        }
        if seq < self.next_seq {
            self.r.reordered += 1;
        } else {
            self.next_seq = seq + 1;
        }
        self.r.seq_span = self.r.seq_span.max(seq + 1);
    }
}

/// Runs a receiver: prints `ready`, receives until idle, returns its report.
pub fn recv(a: RecvArgs) -> Result<Report, String> {
    let pat = pattern(a.size.max(8));
    let mut t = Tally { pat: &pat, size: a.size, r: Report::default(), next_seq: 0, first: None, last: Instant::now() };
    let start = Instant::now();
    let count = if a.count == 0 { u64::MAX } else { a.count };
    let e = |e: std::io::Error| format!("recv: {e}");
    let ready = || {
        println!("ready");
        let _ = std::io::stdout().flush();
    };
    let cpu0 = process_cpu_time();
    let done = |t: &Tally| {
        t.r.datagrams >= count
            || start.elapsed() > a.max
            || (t.first.is_some() && t.last.elapsed() > a.idle)
            || (t.first.is_none() && start.elapsed() > a.max)
    };
    let mut eudp_stats = None;
    match a.mode {
        Mode::Kernel => {
            let s = std::net::UdpSocket::bind(a.bind).map_err(e)?;
            s.set_read_timeout(Some(Duration::from_millis(50))).map_err(e)?;
            let _ = set_rcvbuf_std(&s);
            ready();
            let mut buf = vec![0u8; 65_536];
            let mut i = 0u32;
            while t.r.datagrams < count {
                i = i.wrapping_add(1);
                match s.recv(&mut buf) {
                    Ok(n) => t.datagram(&buf[..n]),
                    Err(x) if matches!(x.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        i = 0
                    }
                    Err(x) => return Err(e(x)),
                }
                // Time checks every 32 datagrams, and on every idle timeout.
                if i.is_multiple_of(32) && done(&t) {
                    break;
                }
            }
        }
        Mode::Mmsg | Mode::Gso => {
            let s = UdpSocket::new(a.bind.is_ipv6()).map_err(e)?;
            s.bind(&a.bind).map_err(e)?;
            let gro = a.mode == Mode::Gso && s.enable_gro();
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
            ready();
            let (n, sz) = if gro { (8, 65_536) } else { (32, a.size.max(1) + 1) };
            let mut bufs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; sz]).collect();
            let mut meta = vec![InMeta::default(); n];
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            while !done(&t) {
                match s.recv_batch(&mut bufs, &mut meta) {
                    Ok(k) => {
                        for i in 0..k {
                            let m = meta[i];
                            let seg = m.segment.unwrap_or(m.len).max(1);
                            let mut off = 0;
                            while off < m.len || (m.len == 0 && off == 0) {
                                let end = (off + seg).min(m.len);
                                t.datagram(&bufs[i][off..end]);
                                if m.len == 0 {
                                    break;
                                }
                                off = end;
                            }
                        }
                    }
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                        poll_readable(&[fd], Some(Duration::from_millis(50))).map_err(e)?;
                    }
                    Err(x) => return Err(e(x)),
                }
            }
        }
        Mode::Eudp | Mode::Xdp => {
            let cfg = Config::from_env().map_err(|x| x.to_string())?;
            let engine = Engine::start(cfg).map_err(e)?;
            let ep = endpoint(a.mode, &engine, a.bind.is_ipv6()).map_err(e)?;
            let _ = ep.set_recv_buffer_size(4 << 20);
            ep.bind_to(a.bind).map_err(e)?;
            ep.set_read_timeout(Some(Duration::from_millis(50)));
            ready();
            let mut buf = vec![0u8; 65_536];
            let mut i = 0u32;
            while t.r.datagrams < count {
                i = i.wrapping_add(1);
                match ep.recv(&mut buf) {
                    Ok(n) => t.datagram(&buf[..n]),
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => i = 0,
                    Err(x) => return Err(e(x)),
                }
                if i.is_multiple_of(32) && done(&t) {
                    break;
                }
            }
            eudp_stats = Some(stats_json(&ep.stats(), a.mode));
        }
    }
    let mut r = t.r;
    r.secs = match t.first {
        Some(f) => (t.last - f).as_secs_f64(),
        None => 0.0,
    };
    r.cpu_secs = (process_cpu_time() - cpu0).as_secs_f64();
    r.max_rss_kib = max_rss_kib();
    r.eudp = eudp_stats;
    Ok(r)
}

/// Every sender asks for the same send buffer (the testbed raises wmem_max).
const SNDBUF: i32 = 4 << 20;

fn set_sndbuf_std(s: &std::net::UdpSocket) -> std::io::Result<()> {
    eudp_engine::sys::sockopt::set_int_option(std::os::fd::AsFd::as_fd(s), libc::SOL_SOCKET, libc::SO_SNDBUF, SNDBUF)
}

/// Every receiver asks for the same 4 MiB receive buffer (the testbed raises
/// rmem_max), so no stack is favoured by buffering.
fn set_rcvbuf_std(s: &std::net::UdpSocket) -> std::io::Result<()> {
    eudp_engine::sys::sockopt::set_int_option(std::os::fd::AsFd::as_fd(s), libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20)
}
