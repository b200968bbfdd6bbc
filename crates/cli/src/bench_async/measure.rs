//! One measured transfer: an [`AsyncSender`] (copying, or zero-copy with
//! either engine) to a
//! receiving socket, both threads of this process, each in its own network
//! namespace on the testbed or both in this one over loopback.

use super::sys::enter_netns;
use eudp_engine::async_udp::{AsyncConfig, AsyncSender, Datagram, Full, SendEngine};
use eudp_engine::sys::clock::{process_cpu_time, thread_cpu_time};
use eudp_engine::sys::sockopt::set_int_option;
use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// `UDP_GRO` (linux/udp.h): take GSO runs whole, one receive per run.
const UDP_GRO: i32 = 104;
/// Buffers the sender holds at most.
const IN_FLIGHT: usize = 256;
/// Datagrams per submission.
const BATCH: usize = 32;

/// How the sender sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendMode {
    Copy,
    /// `MSG_ZEROCOPY`.
    MsgZerocopy,
    /// io_uring `SEND_ZC` from registered buffers.
    UringFixed,
}

/// Where the two ends are.
#[derive(Clone)]
pub struct Ends {
    pub sender_ns: Option<String>,
    pub receiver_ns: Option<String>,
    pub sender_ip: IpAddr,
    pub receiver_ip: IpAddr,
}

/// What one transfer measured.
#[derive(Clone, Debug, Default)]
pub struct Sample {
    pub secs: f64,
    pub sent_datagrams: u64,
    pub sent_bytes: u64,
    pub received_bytes: u64,
    /// Sent datagrams the kernel did not copy.
    pub zero_copied: u64,
    pub failed: u64,
    /// The failed datagrams by errno, so that a failing row says why.
    pub errors: BTreeMap<i32, u64>,
    /// CPU time of the sending thread.
    pub sender_cpu: Duration,
    /// CPU time of the whole process (both threads and the kernel's work
    /// on their behalf) during the transfer.
    pub process_cpu: Duration,
    /// Zero-copy was in use (asked for and accepted by the kernel).
    pub zerocopy: bool,
}

fn receiver(ends: &Ends, stop: Arc<AtomicBool>, addr_tx: mpsc::Sender<SocketAddr>) -> Result<u64, String> {
    if let Some(ns) = &ends.receiver_ns {
        enter_netns(ns).map_err(|e| format!("netns {ns}: {e}"))?;
    }
    let sock = UdpSocket::bind((ends.receiver_ip, 0)).map_err(|e| e.to_string())?;
    let fd = sock.as_fd();
    set_int_option(fd, libc::SOL_UDP, UDP_GRO, 1).map_err(|e| format!("UDP_GRO: {e}"))?;
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 16 << 20).is_err() {
        let _ = set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 16 << 20);
    }
    sock.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
    addr_tx.send(sock.local_addr().map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 1 << 16];
    let mut bytes = 0u64;
    let mut idle_since = None;
    loop {
        match sock.recv(&mut buf) {
            Ok(n) => {
                bytes += n as u64;
                idle_since = None;
            }
            Err(_) if stop.load(Ordering::Relaxed) => {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() > Duration::from_millis(200) {
                    return Ok(bytes);
                }
            }
            Err(_) => {}
        }
    }
}

fn sender(ends: &Ends, dst: SocketAddr, size: usize, mode: SendMode, secs: f64) -> Result<Sample, String> {
    if let Some(ns) = &ends.sender_ns {
        enter_netns(ns).map_err(|e| format!("netns {ns}: {e}"))?;
    }
    let sock = UdpSocket::bind((ends.sender_ip, 0)).map_err(|e| e.to_string())?;
    sock.connect(dst).map_err(|e| e.to_string())?;
    let mut pool: Vec<Vec<u8>> = (0..IN_FLIGHT).map(|i| vec![i as u8; size]).collect();
    let engine = if mode == SendMode::UringFixed { SendEngine::Uring } else { SendEngine::MsgZerocopy };
    let cfg =
        AsyncConfig { zerocopy: mode != SendMode::Copy, engine, max_in_flight: IN_FLIGHT, ..AsyncConfig::default() };
    let mut s: AsyncSender<Vec<u8>> = AsyncSender::new(sock, cfg).map_err(|e| e.to_string())?;
    if mode == SendMode::UringFixed {
        // Every buffer of the pool is a registered region: sends skip the
        // per-send page pinning.
        let regions: Vec<&[u8]> = pool.iter().map(|b| &b[..]).collect();
        s.register_buffers(&regions).map_err(|e| format!("registering buffers: {e}"))?;
    }
    let mut done = Vec::new();
    let mut errors = BTreeMap::new();
    let mut note = |done: &[eudp_engine::async_udp::Completion<Vec<u8>>]| {
        for e in done.iter().filter_map(|c| c.result.as_ref().err()) {
            *errors.entry(e.raw_os_error().unwrap_or(0)).or_insert(0u64) += 1;
        }
    };
    let mut token = 0u64;
    let (cpu0, proc0, t0) = (thread_cpu_time(), process_cpu_time(), Instant::now());
    let limit = Duration::from_secs_f64(secs);
    while t0.elapsed() < limit {
        let n = pool.len().min(BATCH);
        let batch: Vec<_> = pool
            .drain(pool.len() - n..)
            .map(|buf| {
                token += 1;
                Datagram { buf, token, dst: None }
            })
            .collect();
        if let Err(Full(rest)) = s.submit_batch(batch) {
            pool.extend(rest.into_iter().map(|d| d.buf));
            if s.in_flight() > 0 {
                s.wait(Some(Duration::from_millis(1))).map_err(|e| e.to_string())?;
            } else {
                s.wait_writable(Duration::from_millis(10)).map_err(|e| e.to_string())?;
            }
        }
        if pool.is_empty() {
            s.wait(Some(Duration::from_millis(1))).map_err(|e| e.to_string())?;
        }
        s.poll_completions(&mut done, usize::MAX).map_err(|e| e.to_string())?;
        note(&done);
        // ENOBUFS on a zero-copy send: the socket's option memory is held by
        // sends not yet notified. Sending on at once only fails again (a spin
        // of refused sends); their notifications free it.
        let starved = done.iter().any(|c| c.result.as_ref().is_err_and(|e| e.raw_os_error() == Some(libc::ENOBUFS)));
        pool.extend(done.drain(..).map(|c| c.buf));
        if starved && s.in_flight() > 0 {
            s.wait(Some(Duration::from_millis(1))).map_err(|e| e.to_string())?;
        }
    }
    s.drain(&mut done, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    note(&done);
    let (cpu1, proc1, elapsed) = (thread_cpu_time(), process_cpu_time(), t0.elapsed());
    let st = s.stats();
    Ok(Sample {
        secs: elapsed.as_secs_f64(),
        sent_datagrams: st.sent,
        sent_bytes: st.sent * size as u64,
        received_bytes: 0,
        zero_copied: st.zero_copied,
        failed: st.failed,
        errors,
        sender_cpu: cpu1 - cpu0,
        process_cpu: proc1 - proc0,
        zerocopy: s.zerocopy(),
    })
}

/// One transfer of `size`-byte datagrams for `secs`.
pub fn transfer(ends: &Ends, size: usize, mode: SendMode, secs: f64) -> Result<Sample, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (addr_tx, addr_rx) = mpsc::channel();
    let rx_ends = ends.clone();
    let rx_stop = stop.clone();
    let rx = std::thread::spawn(move || receiver(&rx_ends, rx_stop, addr_tx));
    let Ok(dst) = addr_rx.recv_timeout(Duration::from_secs(5)) else {
        stop.store(true, Ordering::Relaxed);
        return Err(rx.join().map_err(|_| "receiver panicked".to_string())?.err().unwrap_or_default());
    };
    let tx_ends = ends.clone();
    let sent = std::thread::spawn(move || sender(&tx_ends, dst, size, mode, secs))
        .join()
        .map_err(|_| "sender panicked".to_string());
    stop.store(true, Ordering::Relaxed);
    let received = rx.join().map_err(|_| "receiver panicked".to_string())??;
    let mut sample = sent??;
    sample.received_bytes = received;
    Ok(sample)
}
