//! The brief measurement behind the measured order: for each scheme, an
//! `eudp worker emp` pair on loopback (or one worker on each testbed host)
//! runs a 10 B ping-pong and 16 KiB
//! streams one way and both ways (the sizes `eudp bench --emp` uses),
//! untraced.

use super::Hosts;
use eudp_engine::emp::Scheme;
use serde_json::Value;
use std::net::UdpSocket;
use std::process::{Command, Stdio};

/// Bytes of the ping-pong messages.
pub const LATENCY_BYTES: u64 = 10;
/// Bytes of the stream messages.
pub const BANDWIDTH_BYTES: u64 = 16_384;

/// One scheme's measured figures.
#[derive(Clone, Debug)]
pub struct Measured {
    pub scheme: Scheme,
    pub unidir_mbit_s: f64,
    pub bidir_mbit_s: f64,
    /// Half the median round trip, as the simulator's latency is half a round trip.
    pub latency_us: f64,
    pub latency_p50_rtt_us: f64,
}

/// A free port (the kernel's pick on loopback, released for the worker; a
/// testbed host's fresh namespace has every port free).
fn free_port() -> Result<u16, String> {
    let s = UdpSocket::bind("127.0.0.1:0").map_err(|e| format!("bind: {e}"))?;
    Ok(s.local_addr().map_err(|e| e.to_string())?.port())
}

/// Runs one worker pair; the client's JSON line.
fn pair(scheme: Scheme, pattern: &str, size: u64, secs: f64, hosts: &Hosts) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let (ps, pc) = (free_port()?, free_port()?);
    // The server on host b, the client on host a.
    let worker = |role: &str, local: u16, peer: u16| {
        let (me, other) = if role == "server" { (1, 0) } else { (0, 1) };
        let mut c = match &hosts.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &ns[me]]).arg(&exe);
                c
            }
            None => Command::new(&exe),
        };
        let at = |h: usize, port: u16| std::net::SocketAddr::new(hosts.ip[h], port).to_string();
        c.args(["worker", "emp", "--role", role, "--pattern", pattern, "--scheme", scheme.name()])
            .args(["--local", &at(me, local), "--peer", &at(other, peer)])
            .args(["--size", &size.to_string(), "--secs", &secs.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    };
    let server = worker("server", ps, pc).spawn().map_err(|e| format!("server: {e}"))?;
    std::thread::sleep(std::time::Duration::from_millis(100));
    let client = worker("client", pc, ps).output().map_err(|e| format!("client: {e}"));
    let server = server.wait_with_output().map_err(|e| format!("server: {e}"))?;
    let client = client?;
    if !client.status.success() || !server.status.success() {
        return Err(format!(
            "scheme {scheme} {pattern}: worker failed: {}{}",
            String::from_utf8_lossy(&client.stderr).trim(),
            String::from_utf8_lossy(&server.stderr).trim()
        ));
    }
    let line = String::from_utf8_lossy(&client.stdout);
    serde_json::from_str(line.trim()).map_err(|e| format!("scheme {scheme} {pattern}: client said {line:?}: {e}"))
}

/// [`pair`], once more when it fails: the workers' end handshake can miss
/// its last message, which says nothing about the figures.
fn pair_again(scheme: Scheme, pattern: &str, size: u64, secs: f64, hosts: &Hosts) -> Result<Value, String> {
    pair(scheme, pattern, size, secs, hosts).or_else(|e| {
        eprintln!("eudp trace --emp: {e}; once more");
        pair(scheme, pattern, size, secs, hosts)
    })
}

/// Measures `scheme` for `secs` per pattern.
pub fn scheme(scheme: Scheme, secs: f64, hosts: &Hosts) -> Result<Measured, String> {
    let pp = pair_again(scheme, "pingpong", LATENCY_BYTES, secs, hosts)?;
    let uni = pair_again(scheme, "stream", BANDWIDTH_BYTES, secs, hosts)?;
    let bi = pair_again(scheme, "bidir", BANDWIDTH_BYTES, secs, hosts)?;
    let p50 = pp["lat_ns"]["p50"].as_f64().ok_or("ping-pong: no p50")? / 1000.0;
    Ok(Measured {
        scheme,
        unidir_mbit_s: uni["mbit_s"].as_f64().ok_or("stream: no mbit_s")?,
        bidir_mbit_s: bi["mbit_s_both"].as_f64().ok_or("bidir: no mbit_s_both")?,
        latency_us: p50 / 2.0,
        latency_p50_rtt_us: p50,
    })
}
