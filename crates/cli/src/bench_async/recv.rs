//! The receiver rows of `eudp bench --async`: an
//! [`eudp_engine::async_udp::AsyncReceiver`] (multishot io_uring receive,
//! datagrams lent in place) against a plain `recvmmsg` loop into the
//! application's buffers, each fed by the same copying GSO sender, over
//! loopback and over the testbed's veth pair, back to back, with `UDP_GRO`
//! on and off. Both receivers hold the same number of 64 KiB buffers, so
//! that neither gains from a smaller cache footprint. Each: datagrams per
//! second, the receiving thread's CPU per datagram, its system calls per
//! datagram (counted by the loop, not traced), and the sender's rate, which
//! bounds the receiver's on a loaded host.

use super::measure::Ends;
use super::sys::enter_netns;
use eudp_engine::async_udp::{AsyncConfig, AsyncReceiver, AsyncSender, Datagram, Full, RecvConfig, RxLease};
use eudp_engine::backend::kernel::{InMeta, UdpSocket as KernelSocket};
use eudp_engine::sys::clock::thread_cpu_time;
use eudp_engine::sys::poll::poll_readable;
use eudp_engine::sys::sockopt::set_int_option;
use serde_json::{json, Value};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The payload of every datagram: one Ethernet frame's worth.
const SIZE: usize = 1472;
/// Messages per `recvmmsg`, and buffers the asynchronous receiver lends at once.
const BATCH: usize = 64;
/// Buffers of each receiver: the `recvmmsg` loop's vector and the
/// provided-buffer ring alike. The ring hands its buffers out in turn, so
/// all of them are touched; a larger ring than the loop's vector costs
/// cache misses the loop does not pay (256 ring buffers, 16 MiB, cost
/// about 15% more CPU per datagram than 64 in the measurements that set it).
const BUFFERS: u16 = 64;
/// `UDP_GRO` (linux/udp.h).
const UDP_GRO: i32 = 104;

/// What one receiver measured over its window.
#[derive(Default)]
struct RecvSample {
    secs: f64,
    datagrams: u64,
    /// Messages received (a GRO run is one).
    messages: u64,
    cpu: Duration,
    /// System calls the receiving loop made.
    syscalls: u64,
    /// Times the provided-buffer ring ran dry (asynchronous receiver only).
    ring_dry: Option<u64>,
    /// Datagrams the sender handed to the kernel over the same window.
    sent: u64,
}

impl RecvSample {
    fn json(&self) -> Value {
        let per_dg = |x: f64| (self.datagrams > 0).then(|| x / self.datagrams as f64);
        let rate = |n: u64| if self.secs > 0.0 { n as f64 / self.secs } else { 0.0 };
        json!({
            "secs": self.secs,
            "datagrams": self.datagrams,
            "datagrams_per_message": (self.messages > 0).then(|| self.datagrams as f64 / self.messages as f64),
            "datagrams_per_sec": rate(self.datagrams),
            "sender_datagrams_per_sec": rate(self.sent),
            "cpu_ns_per_datagram": per_dg(self.cpu.as_nanos() as f64),
            "syscalls_per_datagram": per_dg(self.syscalls as f64),
            "ring_dry": self.ring_dry,
        })
    }
}

/// Sends `SIZE`-byte datagrams to `dst` in GSO runs, copying, until `stop`,
/// counting them in `sent`.
fn blast(ends: &Ends, dst: SocketAddr, stop: Arc<AtomicBool>, sent: Arc<AtomicU64>) -> Result<(), String> {
    if let Some(ns) = &ends.sender_ns {
        enter_netns(ns).map_err(|e| format!("netns {ns}: {e}"))?;
    }
    let sock = UdpSocket::bind((ends.sender_ip, 0)).map_err(|e| e.to_string())?;
    sock.connect(dst).map_err(|e| e.to_string())?;
    let cfg = AsyncConfig { zerocopy: false, max_in_flight: 256, ..AsyncConfig::default() };
    let mut s: AsyncSender<Vec<u8>> = AsyncSender::new(sock, cfg).map_err(|e| e.to_string())?;
    let mut pool: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; SIZE]).collect();
    let mut done = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let n = pool.len().min(32);
        let batch: Vec<_> = pool.drain(pool.len() - n..).map(|buf| Datagram { buf, token: 0, dst: None }).collect();
        match s.submit_batch(batch) {
            Ok(()) => {
                sent.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(Full(rest)) => {
                sent.fetch_add((n - rest.len()) as u64, Ordering::Relaxed);
                pool.extend(rest.into_iter().map(|d| d.buf));
                s.wait_writable(Duration::from_millis(10)).map_err(|e| e.to_string())?;
            }
        }
        s.poll_completions(&mut done, usize::MAX).map_err(|e| e.to_string())?;
        pool.extend(done.drain(..).map(|c| c.buf));
    }
    Ok(())
}

fn big_rcvbuf(fd: std::os::fd::BorrowedFd<'_>) {
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20).is_err() {
        let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 16 << 20);
    }
}

/// Datagrams in a received message of `len` bytes with GRO segment `seg`.
fn count(len: usize, seg: Option<usize>) -> u64 {
    seg.filter(|&s| s > 0).map_or(1, |s| len.div_ceil(s)) as u64
}

/// Runs `recv_for` (the receiving loop for a window) against a sender.
fn with_sender(
    ends: &Ends,
    dst: SocketAddr,
    recv_for: impl FnOnce(Duration) -> Result<RecvSample, String>,
    secs: f64,
) -> Result<RecvSample, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let (tx_stop, tx_sent, tx_ends) = (stop.clone(), sent.clone(), ends.clone());
    let tx = std::thread::Builder::new()
        .name("async-blast".into())
        .spawn(move || blast(&tx_ends, dst, tx_stop, tx_sent))
        .map_err(|e| e.to_string())?;
    let r = recv_for(Duration::from_secs_f64(secs));
    let sent_in_window = sent.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    tx.join().map_err(|_| "sender panicked".to_string())??;
    r.map(|s| RecvSample { sent: sent_in_window, ..s })
}

/// Runs `f` in a thread of its own that has entered the receiver's namespace.
/// Runs `f` in a thread of its own, named `name` (so that a profile tells
/// the receivers apart), that has entered the receiver's namespace.
fn in_receiver_ns(
    name: &str,
    ends: &Ends,
    f: impl FnOnce(&Ends) -> Result<RecvSample, String> + Send + 'static,
) -> Result<RecvSample, String> {
    let ends = ends.clone();
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            if let Some(ns) = &ends.receiver_ns {
                enter_netns(ns).map_err(|e| format!("netns {ns}: {e}"))?;
            }
            f(&ends)
        })
        .map_err(|e| e.to_string())?
        .join()
        .map_err(|_| "receiver panicked".to_string())?
}

fn plain(ends: &Ends, gro: bool, secs: f64) -> Result<RecvSample, String> {
    let sock = KernelSocket::new(false).map_err(|e| e.to_string())?;
    sock.bind(&SocketAddr::new(ends.receiver_ip, 0)).map_err(|e| e.to_string())?;
    if gro {
        sock.set_option(libc::SOL_UDP, UDP_GRO, 1).map_err(|e| format!("UDP_GRO: {e}"))?;
    }
    sock.set_option(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20)
        .or_else(|_| sock.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 16 << 20))
        .map_err(|e| e.to_string())?;
    let dst = sock.local_addr().map_err(|e| e.to_string())?;
    with_sender(
        ends,
        dst,
        |window| {
            let mut bufs: Vec<Vec<u8>> = (0..usize::from(BUFFERS)).map(|_| vec![0u8; 1 << 16]).collect();
            let mut meta = vec![InMeta::default(); usize::from(BUFFERS)];
            let (cpu0, t0) = (thread_cpu_time(), Instant::now());
            let (mut datagrams, mut messages, mut syscalls) = (0, 0, 0);
            while t0.elapsed() < window {
                syscalls += 1;
                match sock.recv_batch(&mut bufs, &mut meta) {
                    Ok(n) => {
                        messages += n as u64;
                        datagrams += meta[..n].iter().map(|m| count(m.len, m.segment)).sum::<u64>();
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        syscalls += 1;
                        poll_readable(&[sock.as_raw_fd()], Some(Duration::from_millis(100)))
                            .map_err(|e| e.to_string())?;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            let cpu = thread_cpu_time() - cpu0;
            Ok(RecvSample {
                secs: t0.elapsed().as_secs_f64(),
                datagrams,
                messages,
                cpu,
                syscalls,
                ..Default::default()
            })
        },
        secs,
    )
}

fn lent(ends: &Ends, gro: bool, secs: f64) -> Result<RecvSample, String> {
    let sock = UdpSocket::bind((ends.receiver_ip, 0)).map_err(|e| e.to_string())?;
    big_rcvbuf(sock.as_fd());
    let cfg = RecvConfig { buffers: BUFFERS, gro, ..RecvConfig::default() };
    let mut r = AsyncReceiver::new(sock, cfg).map_err(|e| e.to_string())?;
    let dst = r.socket().local_addr().map_err(|e| e.to_string())?;
    with_sender(
        ends,
        dst,
        |window| {
            let mut got: Vec<RxLease> = Vec::with_capacity(BATCH);
            let (cpu0, t0, st0) = (thread_cpu_time(), Instant::now(), r.stats());
            let (mut datagrams, mut messages) = (0, 0);
            while t0.elapsed() < window {
                r.recv(&mut got, BATCH, Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
                for l in got.drain(..) {
                    messages += 1;
                    datagrams += count(l.len(), l.gro_segment());
                    r.release(l).map_err(|e| e.to_string())?;
                }
            }
            let (cpu, st) = (thread_cpu_time() - cpu0, r.stats());
            Ok(RecvSample {
                secs: t0.elapsed().as_secs_f64(),
                datagrams,
                messages,
                cpu,
                syscalls: st.syscalls - st0.syscalls,
                ring_dry: Some(st.ring_dry - st0.ring_dry),
                sent: 0,
            })
        },
        secs,
    )
}

/// Interleaved rounds per row: on a shared host one window can catch a
/// burst of other work, so each row reports its median round.
const ROUNDS: usize = 3;

/// `async` over `recvmmsg`, metric by metric.
fn ratios(a: &Value, p: &Value) -> Value {
    let r = |k: &str| match (a[k].as_f64(), p[k].as_f64()) {
        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
        _ => None,
    };
    json!({
        "datagrams_per_sec": r("datagrams_per_sec"),
        "cpu_ns_per_datagram": r("cpu_ns_per_datagram"),
        "syscalls_per_datagram": r("syscalls_per_datagram"),
    })
}

/// One row: `ROUNDS` interleaved rounds of the `recvmmsg` loop and the
/// asynchronous receiver; the round with the median CPU ratio stands for the
/// row, and every round's ratios are kept.
fn row(path: &str, ends: &Ends, gro: bool, secs: f64) -> Value {
    let mut rounds = Vec::new();
    for _ in 0..ROUNDS {
        let p = in_receiver_ns("rx-recvmmsg", ends, move |e| plain(e, gro, secs));
        let a = in_receiver_ns("rx-async", ends, move |e| lent(e, gro, secs));
        match (p, a) {
            (Ok(p), Ok(a)) => {
                let (pj, aj) = (p.json(), a.json());
                rounds.push((ratios(&aj, &pj), pj, aj));
            }
            (p, a) => {
                let error = [p.err(), a.err()].into_iter().flatten().collect::<Vec<_>>().join("; ");
                return json!({ "path": path, "size": SIZE, "gro": gro, "error": error });
            }
        }
    }
    let cpu_ratio = |r: &Value| r["cpu_ns_per_datagram"].as_f64().unwrap_or(f64::INFINITY);
    rounds.sort_by(|x, y| cpu_ratio(&x.0).total_cmp(&cpu_ratio(&y.0)));
    let all: Vec<Value> = rounds.iter().map(|r| r.0.clone()).collect();
    let (ratio, pj, aj) = rounds.swap_remove(rounds.len() / 2);
    json!({
        "path": path,
        "size": SIZE,
        "buffers": BUFFERS,
        "gro": gro,
        "recvmmsg": pj,
        "async": aj,
        "async_over_recvmmsg": ratio,
        "rounds_async_over_recvmmsg": all,
    })
}

/// A receiver row's name: its path, then `gro` or `nogro`.
pub fn row_name(path: &str, gro: bool) -> String {
    format!("{path}-{}", if gro { "gro" } else { "nogro" })
}

/// The receiver rows: per path and GRO setting (those named in `only`, or
/// all when it is empty), the `recvmmsg` loop and the asynchronous
/// receiver, interleaved.
pub fn measure(paths: &[(&str, Ends)], secs: f64, only: &[String]) -> Value {
    let rows = paths
        .iter()
        .flat_map(|(path, ends)| [true, false].map(|gro| (path, ends, gro)))
        .filter(|(path, _, gro)| only.is_empty() || only.contains(&row_name(path, *gro)))
        .map(|(path, ends, gro)| row(path, ends, gro, secs))
        .collect();
    Value::Array(rows)
}

/// The receiver rows as text.
pub fn table(rows: &Value) -> String {
    if rows.is_null() {
        return String::new();
    }
    let mut out = format!(
        "\nreceiver ({SIZE} B, {BUFFERS} buffers each)\n{:<13} {:<4} {:>11} {:>11} {:>7} {:>11} {:>11} {:>7} {:>9} {:>9}\n",
        "path", "gro", "mmsg dg/s", "async dg/s", "ratio", "mmsg ns/dg", "async ns/dg", "ratio", "mmsg sc/dg", "async sc/dg"
    );
    for r in rows.as_array().into_iter().flatten() {
        let path = r["path"].as_str().unwrap_or("?");
        let gro = if r["gro"].as_bool().unwrap_or(false) { "on" } else { "off" };
        if let Some(e) = r["error"].as_str() {
            out += &format!("{path:<13} {gro:<4} error: {e}\n");
            continue;
        }
        let g = |m: &str, k: &str| r[m][k].as_f64().unwrap_or(f64::NAN);
        out += &format!(
            "{path:<13} {gro:<4} {:>11.0} {:>11.0} {:>7.2} {:>11.1} {:>11.1} {:>7.2} {:>9.4} {:>9.4}\n",
            g("recvmmsg", "datagrams_per_sec"),
            g("async", "datagrams_per_sec"),
            g("async_over_recvmmsg", "datagrams_per_sec"),
            g("recvmmsg", "cpu_ns_per_datagram"),
            g("async", "cpu_ns_per_datagram"),
            g("async_over_recvmmsg", "cpu_ns_per_datagram"),
            g("recvmmsg", "syscalls_per_datagram"),
            g("async", "syscalls_per_datagram"),
        );
    }
    out
}
