//! `eudp worker emp` on loopback: a short ping-pong and a short stream,
//! each client printing its one JSON line and the stream's server finding
//! every byte intact.

use std::net::UdpSocket;
use std::process::{Command, Stdio};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn pair(pattern: &str, size: usize) -> (serde_json::Value, Option<serde_json::Value>) {
    let exe = env!("CARGO_BIN_EXE_eudp");
    let (ps, pc) = (free_port(), free_port());
    let (srv, cli) = (format!("127.0.0.1:{ps}"), format!("127.0.0.1:{pc}"));
    let args = |role: &str, local: &str, peer: &str| {
        let size = size.to_string();
        let v: Vec<String> = ["worker", "emp", "--role", role, "--local", local, "--peer", peer, "--pattern", pattern]
            .iter()
            .map(|s| s.to_string())
            .chain(["--size".into(), size, "--secs".into(), "1".into()])
            .collect();
        v
    };
    let server = Command::new(exe).args(args("server", &srv, &cli)).stdout(Stdio::piped()).spawn().unwrap();
    let client = Command::new(exe).args(args("client", &cli, &srv)).output().unwrap();
    let server = server.wait_with_output().unwrap();
    assert!(client.status.success(), "client: {}", String::from_utf8_lossy(&client.stderr));
    assert!(server.status.success(), "server: {}", String::from_utf8_lossy(&server.stderr));
    let lines = |b: &[u8]| String::from_utf8_lossy(b).lines().map(str::to_owned).collect::<Vec<_>>();
    let c = lines(&client.stdout);
    assert_eq!(c.len(), 1, "one JSON line: {c:?}");
    let s = lines(&server.stdout);
    (serde_json::from_str(&c[0]).unwrap(), s.first().map(|l| serde_json::from_str(l).unwrap()))
}

#[test]
fn ping_pong_reports_latency() {
    let (c, s) = pair("pingpong", 10);
    assert!(c["messages"].as_u64().unwrap() > 0);
    assert_eq!(c["errors"], 0);
    assert!(c["lat_ns"]["p50"].as_u64().unwrap() > 0);
    assert!(s.is_none(), "the ping-pong server prints nothing");
}

#[test]
fn stream_is_acknowledged_and_intact() {
    let (c, s) = pair("stream", 16384);
    let s = s.expect("the stream server's line");
    assert_eq!(c["errors"], 0);
    assert_eq!(s["corrupt"], 0);
    assert_eq!(c["messages"], s["messages_received"]);
    assert_eq!(c["bytes"], s["bytes_received"]);
    assert!(c["mbit_s"].as_f64().unwrap() > 0.0);
}
