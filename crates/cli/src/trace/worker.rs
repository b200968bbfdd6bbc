//! The trace workers: one side of a transfer each (`eudp trace worker
//! send|recv`), on the engine or on a plain kernel socket.

use super::args::WorkerArgs;
use eudp_engine::backend::kernel::{InMeta, UdpSocket};
use eudp_engine::sys::poll::{poll_readable, poll_writable};
use eudp_engine::tracepoint::{self, EpTrace};
use eudp_engine::{Config, Endpoint, Engine};
use std::io::Write;
use std::time::{Duration, Instant};

fn fill(buf: &mut [u8], seq: u64) {
    let b = seq.to_be_bytes();
    let n = buf.len().min(8);
    buf[..n].copy_from_slice(&b[8 - n..]);
}

fn seq_of(d: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = d.len().min(8);
    b[8 - n..].copy_from_slice(&d[..n]);
    u64::from_be_bytes(b)
}

/// Runs one side of a traced transfer.
pub fn worker(w: &WorkerArgs) -> Result<(), String> {
    if w.trace() {
        // Room for every event of the transfer on each thread, so nothing
        // is dropped: an eudp application thread records one or two per
        // datagram, a plain-socket worker up to six (its syscalls and
        // kernel stamps are per datagram).
        let per = if w.stack == "kernel" { 7 } else { 2 };
        tracepoint::set_capacity(w.count as usize * per + (1 << 16));
        tracepoint::enable();
        tracepoint::prepare_thread();
    }
    let e = |x: std::io::Error| format!("{} {}: {x}", w.role, w.stack);
    match (w.role.as_str(), w.stack.as_str()) {
        ("send", "eudp") => {
            let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
            let ep = Endpoint::with_engine(&engine, w.addr.is_ipv6()).map_err(e)?;
            ep.connect(w.addr).map_err(e)?;
            settle(w.trace());
            let _ = ep.set_send_buffer_size(4 << 20);
            let mut buf = vec![0xa5u8; w.size];
            let cpu0 = usage();
            for seq in 0..w.count {
                fill(&mut buf, seq);
                loop {
                    match ep.send(&buf) {
                        Ok(_) => break,
                        Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                        Err(x) => return Err(e(x)),
                    }
                }
            }
            ep.flush(Duration::from_secs(5));
            println!("{}", used(cpu0));
            std::thread::sleep(Duration::from_millis(20));
            drop(ep);
            drop(engine);
        }
        ("send", "kernel") => {
            let s = UdpSocket::new(w.addr.is_ipv6()).map_err(e)?;
            if w.trace() {
                s.set_option(
                    libc::SOL_SOCKET,
                    eudp_engine::sys::timestamp::SO_TIMESTAMPING,
                    tracepoint::timestamping_flags(),
                )
                .map_err(e)?;
            }
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, 4 << 20);
            let _ = s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
            s.connect(&w.addr).map_err(e)?;
            let tr = EpTrace::new();
            let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
            let mut buf = vec![0xa5u8; w.size];
            let cpu0 = usage();
            for seq in 0..w.count {
                fill(&mut buf, seq);
                let tok = tracepoint::on().then(|| tr.send_enter(w.size));
                tr.direct();
                loop {
                    tr.sys_enter(true);
                    match s.send_to(&buf, None) {
                        Ok(_) => {
                            tr.sys_return_direct();
                            break;
                        }
                        Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                            let _ = poll_writable(fd, Some(Duration::from_millis(10)));
                        }
                        Err(x) if x.raw_os_error() == Some(libc::ENOBUFS) => std::thread::yield_now(),
                        Err(x) => return Err(e(x)),
                    }
                }
                if let Some(t) = tok {
                    tr.send_return(t);
                }
                // Keep the error queue short: it is charged to the receive buffer.
                if seq % 64 == 63 {
                    tr.drain_tx(fd);
                }
            }
            let sent = Instant::now();
            std::thread::sleep(Duration::from_millis(20));
            tr.drain_tx(fd);
            // CPU includes the last stamp read; the wall time (for the busy
            // share) ends with the last send, not the wait before that read.
            let mut u = used(cpu0);
            u["wall_ns"] = ((sent - cpu0.at).as_nanos() as u64).into();
            println!("{u}");
        }
        ("recv", stack) => return receive(w, stack == "eudp"),
        (r, s) => return Err(format!("worker: unknown role/stack {r}/{s}")),
    }
    // Format the dump only once the receiver is done, so it does not take
    // the CPU from the receiver's tail.
    std::thread::sleep(Duration::from_millis(300 + w.count / 1000));
    if w.trace() {
        std::fs::write(&w.out, tracepoint::dump_json()).map_err(|x| format!("{}: {x}", w.out))?;
    }
    Ok(())
}

/// Lets a new engine settle before a transfer is timed: when tracing, its
/// thread has allocated and touched its trace buffer (this thread's was
/// prepared already), which would otherwise be charged to the transfer.
fn settle(trace: bool) {
    let t0 = Instant::now();
    while trace && tracepoint::thread_buffers() < 2 && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
}

/// A worker's resource reading: CPU time all of this process's threads
/// have run (ns) and how many times they were switched in (the first and
/// third fields of each thread's `schedstat`: wakeups and preemptions
/// alike; 0 where the kernel does not report them), the calling thread's
/// own CPU time (the application thread's: the one that bounds a
/// streaming sender's rate), and when it was taken.
#[derive(Clone, Copy, Debug)]
struct Usage {
    cpu_ns: u64,
    switches: u64,
    app_ns: u64,
    at: Instant,
}

/// The calling thread's CPU time is its CPU clock's, which is exact: a
/// running thread's `schedstat` lags by up to a scheduler tick (4 ms at
/// 250 Hz), a share of a short transfer worth correcting.
fn usage() -> Usage {
    let app_ns = eudp_engine::sys::clock::thread_cpu_time().as_nanos() as u64;
    // This thread's directory under /proc/self/task ("PID/task/TID").
    let me = std::fs::read_link("/proc/thread-self").ok().and_then(|p| p.file_name().map(|n| n.to_owned()));
    let (mut cpu_ns, mut switches) = (0, 0);
    if let Ok(dir) = std::fs::read_dir("/proc/self/task") {
        for t in dir.flatten() {
            if let Ok(st) = std::fs::read_to_string(t.path().join("schedstat")) {
                let (run, sw) = parse_schedstat(&st);
                cpu_ns += if Some(t.file_name()) == me { app_ns } else { run };
                switches += sw;
            }
        }
    }
    Usage { cpu_ns, switches, app_ns, at: Instant::now() }
}

/// (run time ns, times switched in) from one `schedstat` line.
fn parse_schedstat(s: &str) -> (u64, u64) {
    let f: Vec<u64> = s.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
    (f.first().copied().unwrap_or(0), f.get(2).copied().unwrap_or(0))
}

/// What a worker used between two [`usage`] readings, as its report's
/// fields: all threads' CPU, switches, the application thread's CPU and
/// the wall time between the readings (ns).
fn used(u0: Usage) -> serde_json::Value {
    let u = usage();
    serde_json::json!({"cpu_ns": u.cpu_ns - u0.cpu_ns, "switches": u.switches - u0.switches, "app_cpu_ns": u.app_ns - u0.app_ns, "wall_ns": (u.at - u0.at).as_nanos() as u64})
}

/// The receive loop's clock: read once per [`Arrivals::EVERY`] datagrams,
/// not per datagram (three clock reads per datagram would be a large share
/// of a small datagram's cost and hide the tracing overhead being measured).
struct Arrivals {
    start: Instant,
    max: Duration,
    first: Option<Instant>,
    /// The latest clock read on an arrival and how many had arrived then.
    last: (Instant, u64),
}

impl Arrivals {
    const EVERY: u64 = 64;

    fn new(max: Duration) -> Self {
        let now = Instant::now();
        Arrivals { start: now, max, first: None, last: (now, 0) }
    }

    /// The `got`-th datagram arrived; true when the loop should look at the
    /// clock now (see [`Arrivals::over`]).
    #[allow(clippy::manual_is_multiple_of)] // is_multiple_of is newer than the MSRV
    fn arrived(&mut self, got: u64) -> bool {
        if got == 1 || got % Self::EVERY == 0 {
            let now = Instant::now();
            self.first.get_or_insert(now);
            self.last = (now, got);
            return true;
        }
        false
    }

    /// Time is up, or data arrived and then nothing for a while (the rest
    /// was lost).
    fn over(&self) -> bool {
        self.start.elapsed() > self.max || (self.first.is_some() && self.last.0.elapsed() > Duration::from_millis(500))
    }

    /// The loop ended with `got` datagrams: the last one's arrival is now
    /// if all came, else the last clock read on an arrival.
    fn end(&mut self, got: u64, all: bool) {
        if all && got > 0 {
            self.last = (Instant::now(), got);
        }
    }

    /// Receive span (s) and rate (Gbit/s) from the first arrival to the
    /// last timed one.
    fn rate(&self, size: usize) -> (f64, f64) {
        let secs = self.first.map(|f| (self.last.0 - f).as_secs_f64()).unwrap_or(0.0);
        let gbps =
            if secs > 0.0 { (self.last.1.saturating_sub(1) * size as u64) as f64 * 8.0 / secs / 1e9 } else { 0.0 };
        (secs, gbps)
    }
}

fn receive(w: &WorkerArgs, eudp: bool) -> Result<(), String> {
    let e = |x: std::io::Error| format!("recv: {x}");
    let ready = || {
        println!("ready");
        let _ = std::io::stdout().flush();
    };
    let mut buf = vec![0u8; 65_536];
    let (mut got, mut bad) = (0u64, 0u64);
    let mut t = Arrivals::new(Duration::from_secs(20 + w.count / 10_000));
    // CPU is counted from the first arrival: before it the receiver only
    // waits for the sender to start, which takes longer when the sender is
    // traced (its buffers), and an idle receiver still uses 1-2 ms of CPU
    // per second (its engine's timed checks, the read timeouts).
    let (mut cpu0, cpu);
    let mut next = 0u64;
    // Counts one datagram; true when the loop should check the clock.
    let mut tally = |d: &[u8], got: &mut u64, t: &mut Arrivals| {
        let seq = seq_of(d);
        if w.tag() {
            tracepoint::tag_received(seq);
        }
        if seq < next || d.len() != w.size {
            bad += 1;
        }
        next = next.max(seq + 1);
        *got += 1;
        t.arrived(*got)
    };
    if eudp {
        let engine = Engine::start(Config::from_env().map_err(|x| x.to_string())?).map_err(e)?;
        let ep = Endpoint::with_engine(&engine, w.addr.is_ipv6()).map_err(e)?;
        let _ = ep.set_recv_buffer_size(4 << 20);
        ep.bind_to(w.addr).map_err(e)?;
        ep.set_read_timeout(Some(Duration::from_millis(50)));
        settle(w.trace());
        ready();
        cpu0 = usage();
        while got < w.count {
            let look = match ep.recv(&mut buf) {
                Ok(n) => {
                    let look = tally(&buf[..n], &mut got, &mut t);
                    if got == 1 {
                        cpu0 = usage();
                    }
                    look
                }
                Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => true,
                Err(x) => return Err(e(x)),
            };
            if look && t.over() {
                break;
            }
        }
        t.end(got, got == w.count);
        cpu = used(cpu0);
        drop(ep);
        drop(engine);
    } else {
        let s = UdpSocket::new(w.addr.is_ipv6()).map_err(e)?;
        if w.trace() {
            s.set_option(
                libc::SOL_SOCKET,
                eudp_engine::sys::timestamp::SO_TIMESTAMPING,
                tracepoint::timestamping_flags(),
            )
            .map_err(e)?;
            tracepoint::rx_stamps_ready(tracepoint::timestamping_flags());
        }
        let _ = s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 4 << 20);
        s.bind(&w.addr).map_err(e)?;
        ready();
        cpu0 = usage();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&s);
        let tr = EpTrace::new();
        let mut bufs = vec![vec![0u8; 65_536]];
        let mut meta = vec![InMeta::default()];
        let on = tracepoint::on();
        'outer: while got < w.count {
            let enter = on.then(|| tr.recv_enter());
            loop {
                tr.rx_enter();
                match s.recv_batch(&mut bufs, &mut meta) {
                    Ok(1) => {
                        tr.rx_push(0, 1);
                        tr.pop();
                        break;
                    }
                    Ok(_) => {}
                    Err(x) if x.kind() == std::io::ErrorKind::WouldBlock => {
                        poll_readable(&[fd], Some(Duration::from_millis(50))).map_err(e)?;
                        if t.over() {
                            break 'outer;
                        }
                    }
                    Err(x) => return Err(e(x)),
                }
            }
            if let Some(x) = enter {
                tr.recv_return(x);
            }
            let n = meta[0].len;
            let look = tally(&bufs[0][..n], &mut got, &mut t);
            if got == 1 {
                cpu0 = usage();
            }
            if look && t.over() {
                break;
            }
        }
        t.end(got, got == w.count);
        cpu = used(cpu0);
    }
    if w.trace() {
        std::fs::write(&w.out, tracepoint::dump_json()).map_err(|x| format!("{}: {x}", w.out))?;
    }
    let (secs, gbps) = t.rate(w.size);
    println!(
        "{}",
        serde_json::json!({"received": got, "out_of_order": bad, "secs": secs, "gbps": gbps, "cpu_ns": cpu["cpu_ns"], "switches": cpu["switches"], "app_cpu_ns": cpu["app_cpu_ns"], "wall_ns": cpu["wall_ns"]})
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_workers_usage_counts_its_own_thread_and_the_wall_time() {
        let u0 = usage();
        // Busy until this thread has run 20 ms (however long a loaded host
        // takes to give it that), bounded in wall time.
        let (t0, c0) = (Instant::now(), eudp_engine::sys::clock::thread_cpu_time());
        let mut x = 0u64;
        while eudp_engine::sys::clock::thread_cpu_time() - c0 < Duration::from_millis(20)
            && t0.elapsed() < Duration::from_secs(10)
        {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let u = used(u0);
        let (app, all, wall) =
            (u["app_cpu_ns"].as_u64().unwrap(), u["cpu_ns"].as_u64().unwrap(), u["wall_ns"].as_u64().unwrap());
        assert!(wall >= 20_000_000, "{u}");
        // At least the 20 ms it ran, never more than the wall time.
        assert!(app >= 20_000_000 && app <= wall + 1_000_000, "{u}");
        // All threads' CPU (0 where the kernel has no schedstat) counts
        // this thread's at its CPU clock: never less than it.
        assert!(all == 0 || all >= app, "{u}");
    }
}
