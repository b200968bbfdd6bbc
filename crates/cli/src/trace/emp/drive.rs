//! The traced exchange: two EMP endpoints in this process, on loopback or
//! one on each testbed host (its socket opened in that host's namespace),
//! a client on the calling thread and a server on another, with the
//! tracepoints on while the messages go.

use super::steps::{self, Checks, Joined};
use super::{Hosts, Pattern};
use eudp_engine::emp::{EmpConfig, EmpEndpoint, Op, PeerId, Scheme, Status};
use eudp_engine::tracepoint;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

/// How long one completion may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(10);

/// One scheme's traced run.
#[derive(Debug)]
pub struct Traced {
    pub scheme: Scheme,
    pub messages: u64,
    pub joined: Joined,
    pub checks: Checks,
    /// Trace events dropped for want of buffer room.
    pub dropped: u64,
    /// The run's first record's start (ns, trace clock): charts count from it.
    pub t0: u64,
}

/// The bytes of message `i`.
fn fill(i: u64, size: usize) -> Vec<u8> {
    (0..size).map(|k| (i as u8).wrapping_mul(7).wrapping_add(k as u8)).collect()
}

fn wait(ep: &EmpEndpoint) -> Result<eudp_engine::emp::Completion, String> {
    ep.wait(Some(PATIENCE)).ok_or_else(|| "no completion within 10 s".to_string())
}

fn send(ep: &EmpEndpoint, peer: PeerId, tag: u64, data: Vec<u8>) -> Result<(), String> {
    let until = Instant::now() + PATIENCE;
    loop {
        match ep.send(peer, tag, data.clone(), tag) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < until => {
                std::thread::sleep(Duration::from_micros(20))
            }
            Err(e) => return Err(format!("send: {e}")),
        }
    }
}

/// Runs `n` messages of `size` bytes under `scheme`, traced, and joins
/// the step records.
pub fn traced(scheme: Scheme, pattern: Pattern, size: usize, n: u64, hosts: &Hosts) -> Result<Traced, String> {
    let cfg = EmpConfig { scheme, ..EmpConfig::default() };
    let bind = |h: usize| {
        let cfg = cfg.clone();
        hosts.on(h, move || {
            EmpEndpoint::bind(std::net::SocketAddr::new(hosts.ip[h], 0), cfg).map_err(|e| format!("bind: {e}"))
        })
    };
    let a = bind(0)?;
    let b = bind(1)?;
    let to_b = a.insert(b.local_addr());
    let to_a = b.insert(a.local_addr());
    tracepoint::disable();
    tracepoint::reset();
    tracepoint::enable();
    // A warm-up ping-pong first: each thread's first step creates its
    // trace buffer, and first messages meet cold caches; the analysis
    // keeps only what starts after it.
    exchange(&a, &b, (to_b, to_a), Pattern::Pingpong, size, WARM_UP)?;
    let cutoff = tracepoint::now_ns();
    let result = exchange(&a, &b, (to_b, to_a), pattern, size, n);
    tracepoint::disable();
    let events = tracepoint::events();
    let dropped = tracepoint::dropped();
    drop((a, b));
    result?;
    let recs = steps::records(&events).into_iter().filter(|r| r.start >= cutoff).collect();
    let joined = steps::join(recs)?;
    let checks = steps::check(&joined, scheme);
    let t0 = joined.recs.iter().map(|r| r.start).min().unwrap_or(0);
    Ok(Traced { scheme, messages: n, joined, checks, dropped, t0 })
}

/// Messages of the warm-up ping-pong.
const WARM_UP: u64 = 16;

/// `n` messages from `a` to `b` (`peers`: `b` in `a`, `a` in `b`), the
/// server on another thread. Its receives are posted before anything is
/// sent: EMP drops a message no receive matches.
fn exchange(
    a: &EmpEndpoint,
    b: &EmpEndpoint,
    peers: (PeerId, PeerId),
    pattern: Pattern,
    size: usize,
    n: u64,
) -> Result<(), String> {
    let (to_b, to_a) = peers;
    let posted = if pattern == Pattern::Stream { n } else { 1 };
    for i in 0..posted {
        b.recv(Some(to_a), 0, u64::MAX, size, i).map_err(|e| format!("recv: {e}"))?;
    }
    std::thread::scope(|sc| {
        let server = sc.spawn(|| serve(b, to_a, pattern, size, n));
        let client = client(a, to_b, pattern, size, n);
        let server = server.join().map_err(|_| "the server thread panicked".to_string())?;
        client.and(server)
    })
}

fn client(a: &EmpEndpoint, peer: PeerId, pattern: Pattern, size: usize, n: u64) -> Result<(), String> {
    match pattern {
        Pattern::Pingpong => {
            for i in 0..n {
                a.recv(Some(peer), i, 0, size, i).map_err(|e| format!("recv: {e}"))?;
                send(a, peer, i, fill(i, size))?;
                let (mut replied, mut acked) = (false, false);
                while !(replied && acked) {
                    let c = wait(a)?;
                    if c.status != Status::Ok {
                        return Err(format!("message {i}: {:?}", c.status));
                    }
                    match c.op {
                        Op::Recv if c.data == fill(i, size) => replied = true,
                        Op::Recv => return Err(format!("reply {i}: wrong bytes")),
                        Op::Send => acked = true,
                    }
                }
            }
        }
        Pattern::Stream => {
            for i in 0..n {
                send(a, peer, i, fill(i, size))?;
            }
            for _ in 0..n {
                let c = wait(a)?;
                if c.status != Status::Ok {
                    return Err(format!("send {}: {:?}", c.context, c.status));
                }
            }
        }
    }
    Ok(())
}

fn serve(b: &EmpEndpoint, peer: PeerId, pattern: Pattern, size: usize, n: u64) -> Result<(), String> {
    let (mut got, mut sent) = (0u64, 0u64);
    let echoes = if pattern == Pattern::Pingpong { n } else { 0 };
    while got < n || sent < echoes {
        let c = wait(b)?;
        if c.status != Status::Ok {
            return Err(format!("server: {:?} {:?}", c.op, c.status));
        }
        match c.op {
            Op::Recv => {
                if c.data != fill(c.tag, size) {
                    return Err(format!("message {}: wrong bytes", c.tag));
                }
                got += 1;
                if pattern == Pattern::Pingpong {
                    if got < n {
                        b.recv(Some(peer), 0, u64::MAX, size, got).map_err(|e| format!("recv: {e}"))?;
                    }
                    send(b, peer, c.tag, c.data)?;
                }
            }
            Op::Send => sent += 1,
        }
    }
    Ok(())
}
