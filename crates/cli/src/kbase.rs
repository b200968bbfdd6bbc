//! `eudp worker kbase`: the kernel baselines of `eudp bench --emp`, run
//! inside a testbed host. Kernel UDP ping-pong, and kernel TCP ping-pong and
//! a stream of fixed-size messages; the client prints one JSON line shaped
//! like the EMP worker's (`messages`, `bytes`, `errors`, `lat_ns` or
//! `mbit_s`), the stream server one with what it received and checked.

use serde_json::json;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug, Clone)]
pub struct KbaseArgs {
    /// `udp` or `tcp`.
    #[arg(long, value_parser = ["udp", "tcp"])]
    pub proto: String,
    /// `server` or `client`.
    #[arg(long, value_parser = ["server", "client"])]
    pub role: String,
    /// The address to bind (server) or bind from (client).
    #[arg(long)]
    pub local: SocketAddr,
    /// The server's address (client).
    #[arg(long)]
    pub peer: Option<SocketAddr>,
    /// `pingpong`, or `stream` (tcp only).
    #[arg(long, value_parser = ["pingpong", "stream"])]
    pub pattern: String,
    /// Message size in bytes.
    #[arg(long)]
    pub size: usize,
    /// Seconds the client runs.
    #[arg(long, default_value_t = 1.0)]
    pub secs: f64,
}

/// The bytes of message 0 of a stream; message `i` adds [`shift`]`(i)` to
/// each, so the receiver can check every byte at memory speed.
pub fn base_pattern(size: usize) -> Vec<u8> {
    (0..size).map(|j| (j.wrapping_mul(7) + 1) as u8).collect()
}

/// What message `i` adds to every byte of [`base_pattern`].
pub fn shift(i: u64) -> u8 {
    i.wrapping_mul(131) as u8
}

/// p50, p99 and max of round-trip samples, ns.
pub fn percentiles(mut ns: Vec<u64>) -> serde_json::Value {
    ns.sort_unstable();
    let at = |q: f64| ns.get(((ns.len() as f64 * q) as usize).min(ns.len().saturating_sub(1))).copied();
    json!({ "p50": at(0.50), "p99": at(0.99), "max": ns.last().copied() })
}

/// Runs one side and prints its JSON line; exit status 0 or 1.
pub fn main(a: &KbaseArgs) -> i32 {
    let r = match (a.proto.as_str(), a.role.as_str(), a.pattern.as_str()) {
        _ if a.size == 0 || a.size > 16 << 20 => Err(format!("--size {}: 1..=16 MiB", a.size)),
        ("udp", _, "stream") => Err("udp has only the pingpong pattern".into()),
        ("udp", "server", _) => udp_server(a),
        ("udp", _, _) => udp_client(a),
        ("tcp", "server", _) => tcp_server(a),
        _ => tcp_client(a),
    };
    match r {
        Ok(v) => {
            println!("{v}");
            let _ = std::io::stdout().flush();
            0
        }
        Err(e) => {
            eprintln!("eudp worker kbase: {e}");
            1
        }
    }
}

fn peer(a: &KbaseArgs) -> Result<SocketAddr, String> {
    a.peer.ok_or_else(|| "the client needs --peer".to_string())
}

/// The server's overall bound: the client's run plus room to finish.
fn server_limit(a: &KbaseArgs) -> Duration {
    Duration::from_secs_f64(a.secs.max(0.0) + 5.0)
}

/// Echoes datagrams until an empty one (the client's end) or the bound.
fn udp_server(a: &KbaseArgs) -> Result<serde_json::Value, String> {
    let s = UdpSocket::bind(a.local).map_err(|e| format!("bind {}: {e}", a.local))?;
    s.set_read_timeout(Some(Duration::from_millis(100))).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 65_536];
    let (t0, limit) = (Instant::now(), server_limit(a));
    let mut echoed = 0u64;
    while t0.elapsed() < limit {
        match s.recv_from(&mut buf) {
            Ok((0, _)) => break,
            Ok((n, from)) => {
                let _ = s.send_to(&buf[..n], from);
                echoed += 1;
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(e) => return Err(format!("recv: {e}")),
        }
    }
    Ok(json!({ "role": "server", "proto": "udp", "messages_received": echoed }))
}

fn udp_client(a: &KbaseArgs) -> Result<serde_json::Value, String> {
    let s = UdpSocket::bind(a.local).map_err(|e| format!("bind {}: {e}", a.local))?;
    s.connect(peer(a)?).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
    let size = a.size.max(8);
    let (mut msg, mut back) = (vec![0u8; size], vec![0u8; 65_536]);
    let (mut lat, mut errors) = (Vec::new(), 0u64);
    let (t0, secs) = (Instant::now(), Duration::from_secs_f64(a.secs));
    let mut seq = 0u64;
    while t0.elapsed() < secs {
        seq += 1;
        msg[..8].copy_from_slice(&seq.to_be_bytes());
        let sent = Instant::now();
        s.send(&msg).map_err(|e| format!("send: {e}"))?;
        // Bounded: a reply with another sequence number is a late one.
        let mut got = false;
        for _ in 0..4 {
            match s.recv(&mut back) {
                Ok(n) if n == size && back[..8] == msg[..8] => {
                    got = true;
                    break;
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        if got {
            lat.push(sent.elapsed().as_nanos() as u64);
        } else {
            errors += 1;
        }
    }
    let secs_run = t0.elapsed().as_secs_f64();
    for _ in 0..3 {
        let _ = s.send(&[]);
    }
    Ok(json!({
        "proto": "udp", "pattern": "pingpong", "size": size, "secs": secs_run,
        "messages": lat.len(), "bytes": lat.len() * size, "errors": errors, "lat_ns": percentiles(lat),
    }))
}

fn tcp_server(a: &KbaseArgs) -> Result<serde_json::Value, String> {
    let l = TcpListener::bind(a.local).map_err(|e| format!("bind {}: {e}", a.local))?;
    l.set_nonblocking(true).map_err(|e| e.to_string())?;
    let (t0, limit) = (Instant::now(), server_limit(a));
    let mut c = loop {
        match l.accept() {
            Ok((c, _)) => break c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if t0.elapsed() > limit {
                    return Err("no client connected".into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("accept: {e}")),
        }
    };
    c.set_nonblocking(false).map_err(|e| e.to_string())?;
    c.set_nodelay(true).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(limit)).map_err(|e| e.to_string())?;
    c.set_write_timeout(Some(limit)).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; a.size];
    let base = base_pattern(a.size);
    let (mut n, mut corrupt) = (0u64, 0u64);
    loop {
        match c.read_exact(&mut buf) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("read: {e}")),
        }
        if a.pattern == "pingpong" {
            c.write_all(&buf).map_err(|e| format!("write: {e}"))?;
        } else if buf.iter().zip(&base).any(|(&b, &p)| b != p.wrapping_add(shift(n))) {
            corrupt += 1;
        }
        n += 1;
    }
    if a.pattern == "stream" {
        // The client's proof that every message arrived.
        let _ = c.write_all(&n.to_be_bytes());
    }
    Ok(json!({
        "role": "server", "proto": "tcp", "pattern": a.pattern, "messages_received": n,
        "bytes_received": n * a.size as u64, "corrupt": corrupt,
    }))
}

fn tcp_client(a: &KbaseArgs) -> Result<serde_json::Value, String> {
    let to = peer(a)?;
    let mut c = TcpStream::connect_timeout(&to, Duration::from_secs(5)).map_err(|e| format!("connect {to}: {e}"))?;
    c.set_nodelay(true).map_err(|e| e.to_string())?;
    c.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    c.set_write_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    let (t0, secs) = (Instant::now(), Duration::from_secs_f64(a.secs));
    let mut msg = vec![0u8; a.size];
    let mut n = 0u64;
    if a.pattern == "pingpong" {
        let mut back = vec![0u8; a.size];
        let mut lat = Vec::new();
        while t0.elapsed() < secs {
            let sent = Instant::now();
            c.write_all(&msg).map_err(|e| format!("write: {e}"))?;
            c.read_exact(&mut back).map_err(|e| format!("read: {e}"))?;
            lat.push(sent.elapsed().as_nanos() as u64);
        }
        n = lat.len() as u64;
        return Ok(json!({
            "proto": "tcp", "pattern": "pingpong", "size": a.size, "secs": t0.elapsed().as_secs_f64(),
            "messages": n, "bytes": n * a.size as u64, "errors": 0, "lat_ns": percentiles(lat),
        }));
    }
    let base = base_pattern(a.size);
    while t0.elapsed() < secs {
        let k = shift(n);
        for (b, &p) in msg.iter_mut().zip(&base) {
            *b = p.wrapping_add(k);
        }
        c.write_all(&msg).map_err(|e| format!("write: {e}"))?;
        n += 1;
    }
    c.shutdown(std::net::Shutdown::Write).map_err(|e| e.to_string())?;
    let mut got = [0u8; 8];
    c.read_exact(&mut got).map_err(|e| format!("reading the server's count: {e}"))?;
    let secs_run = t0.elapsed().as_secs_f64();
    let received = u64::from_be_bytes(got);
    let bytes = received * a.size as u64;
    Ok(json!({
        "proto": "tcp", "pattern": "stream", "size": a.size, "secs": secs_run, "messages": n, "bytes": bytes,
        "errors": n - received.min(n), "mbit_s": bytes as f64 * 8.0 / secs_run / 1e6,
    }))
}
