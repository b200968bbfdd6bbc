//! The receiver rows of `eudp bench --async`: an
//! [`eudp_engine::async_udp::AsyncReceiver`] (multishot io_uring receive,
//! datagrams lent in place) against a plain `recvmmsg` loop into the
//! application's buffers, each fed by the same copying GSO sender over
//! loopback, back to back, with `UDP_GRO` on and off. Each: datagrams per
//! second and the receiving thread's CPU per datagram.

use eudp_engine::async_udp::{AsyncConfig, AsyncReceiver, AsyncSender, Datagram, Full, RecvConfig, RxLease};
use eudp_engine::backend::kernel::{InMeta, UdpSocket as KernelSocket};
use eudp_engine::sys::clock::thread_cpu_time;
use eudp_engine::sys::poll::poll_readable;
use eudp_engine::sys::sockopt::set_int_option;
use serde_json::{json, Value};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The payload of every datagram: one Ethernet frame's worth.
const SIZE: usize = 1472;
/// Messages per `recvmmsg`, and buffers the asynchronous receiver lends at once.
const BATCH: usize = 64;
/// `UDP_GRO` (linux/udp.h).
const UDP_GRO: i32 = 104;

/// What one receiver measured over its window.
struct RecvSample {
    secs: f64,
    datagrams: u64,
    cpu: Duration,
}

impl RecvSample {
    fn json(&self) -> Value {
        json!({
            "secs": self.secs,
            "datagrams": self.datagrams,
            "datagrams_per_sec": if self.secs > 0.0 { self.datagrams as f64 / self.secs } else { 0.0 },
            "cpu_ns_per_datagram": (self.datagrams > 0).then(|| self.cpu.as_nanos() as f64 / self.datagrams as f64),
        })
    }
}

/// Sends `SIZE`-byte datagrams to `dst` in GSO runs, copying, until `stop`.
fn blast(dst: SocketAddr, stop: Arc<AtomicBool>) -> Result<(), String> {
    let sock = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    sock.connect(dst).map_err(|e| e.to_string())?;
    let cfg = AsyncConfig { zerocopy: false, max_in_flight: 256, ..AsyncConfig::default() };
    let mut s: AsyncSender<Vec<u8>> = AsyncSender::new(sock, cfg).map_err(|e| e.to_string())?;
    let mut pool: Vec<Vec<u8>> = (0..256).map(|i| vec![i as u8; SIZE]).collect();
    let mut done = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let n = pool.len().min(32);
        let batch: Vec<_> = pool.drain(pool.len() - n..).map(|buf| Datagram { buf, token: 0, dst: None }).collect();
        if let Err(Full(rest)) = s.submit_batch(batch) {
            pool.extend(rest.into_iter().map(|d| d.buf));
            s.wait_writable(Duration::from_millis(10)).map_err(|e| e.to_string())?;
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
    dst: SocketAddr,
    recv_for: impl FnOnce(Duration) -> Result<RecvSample, String>,
    secs: f64,
) -> Result<RecvSample, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let tx_stop = stop.clone();
    let tx = std::thread::spawn(move || blast(dst, tx_stop));
    let r = recv_for(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    tx.join().map_err(|_| "sender panicked".to_string())??;
    r
}

fn plain(gro: bool, secs: f64) -> Result<RecvSample, String> {
    let sock = KernelSocket::new(false).map_err(|e| e.to_string())?;
    sock.bind(&"127.0.0.1:0".parse().expect("address")).map_err(|e| e.to_string())?;
    if gro {
        sock.set_option(libc::SOL_UDP, UDP_GRO, 1).map_err(|e| format!("UDP_GRO: {e}"))?;
    }
    sock.set_option(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20)
        .or_else(|_| sock.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 16 << 20))
        .map_err(|e| e.to_string())?;
    let dst = sock.local_addr().map_err(|e| e.to_string())?;
    with_sender(
        dst,
        |window| {
            let mut bufs: Vec<Vec<u8>> = (0..BATCH).map(|_| vec![0u8; 1 << 16]).collect();
            let mut meta = vec![InMeta::default(); BATCH];
            let (cpu0, t0) = (thread_cpu_time(), Instant::now());
            let mut datagrams = 0;
            while t0.elapsed() < window {
                match sock.recv_batch(&mut bufs, &mut meta) {
                    Ok(n) => datagrams += meta[..n].iter().map(|m| count(m.len, m.segment)).sum::<u64>(),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        poll_readable(&[sock.as_raw_fd()], Some(Duration::from_millis(100)))
                            .map_err(|e| e.to_string())?;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            Ok(RecvSample { secs: t0.elapsed().as_secs_f64(), datagrams, cpu: thread_cpu_time() - cpu0 })
        },
        secs,
    )
}

fn lent(gro: bool, secs: f64) -> Result<RecvSample, String> {
    let sock = UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    big_rcvbuf(sock.as_fd());
    let cfg = RecvConfig { buffers: 256, gro, ..RecvConfig::default() };
    let mut r = AsyncReceiver::new(sock, cfg).map_err(|e| e.to_string())?;
    let dst = r.socket().local_addr().map_err(|e| e.to_string())?;
    with_sender(
        dst,
        |window| {
            let mut got: Vec<RxLease> = Vec::with_capacity(BATCH);
            let (cpu0, t0) = (thread_cpu_time(), Instant::now());
            let mut datagrams = 0;
            while t0.elapsed() < window {
                r.recv(&mut got, BATCH, Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
                for l in got.drain(..) {
                    datagrams += count(l.len(), l.gro_segment());
                    r.release(l).map_err(|e| e.to_string())?;
                }
            }
            Ok(RecvSample { secs: t0.elapsed().as_secs_f64(), datagrams, cpu: thread_cpu_time() - cpu0 })
        },
        secs,
    )
}

/// The receiver rows: per GRO setting, the `recvmmsg` loop and the
/// asynchronous receiver back to back.
pub fn measure(secs: f64) -> Value {
    let rows: Vec<Value> = [true, false]
        .into_iter()
        .map(|gro| {
            let p = plain(gro, secs);
            let a = lent(gro, secs);
            match (p, a) {
                (Ok(p), Ok(a)) => {
                    let (pj, aj) = (p.json(), a.json());
                    let r = |k: &str| match (aj[k].as_f64(), pj[k].as_f64()) {
                        (Some(x), Some(y)) if y > 0.0 => Some(x / y),
                        _ => None,
                    };
                    json!({
                        "path": "loopback",
                        "size": SIZE,
                        "gro": gro,
                        "recvmmsg": pj,
                        "async": aj,
                        "async_over_recvmmsg": {
                            "datagrams_per_sec": r("datagrams_per_sec"),
                            "cpu_ns_per_datagram": r("cpu_ns_per_datagram"),
                        },
                    })
                }
                (p, a) => {
                    let error = [p.err(), a.err()].into_iter().flatten().collect::<Vec<_>>().join("; ");
                    json!({ "path": "loopback", "size": SIZE, "gro": gro, "error": error })
                }
            }
        })
        .collect();
    Value::Array(rows)
}

/// The receiver rows as text.
pub fn table(rows: &Value) -> String {
    let mut out = format!(
        "\nreceiver ({SIZE} B, loopback)\n{:<5} {:>14} {:>14} {:>14} {:>14}\n",
        "gro", "mmsg dg/s", "async dg/s", "mmsg ns/dg", "async ns/dg"
    );
    for r in rows.as_array().into_iter().flatten() {
        let gro = if r["gro"].as_bool().unwrap_or(false) { "on" } else { "off" };
        if let Some(e) = r["error"].as_str() {
            out += &format!("{gro:<5} error: {e}\n");
            continue;
        }
        let g = |m: &str, k: &str| r[m][k].as_f64().unwrap_or(f64::NAN);
        out += &format!(
            "{gro:<5} {:>14.0} {:>14.0} {:>14.1} {:>14.1}\n",
            g("recvmmsg", "datagrams_per_sec"),
            g("async", "datagrams_per_sec"),
            g("recvmmsg", "cpu_ns_per_datagram"),
            g("async", "cpu_ns_per_datagram"),
        );
    }
    out
}
