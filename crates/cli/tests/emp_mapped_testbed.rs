//! EMP between the testbed's hosts across the address families: the server
//! in b binds `[::]` and names the client by its IPv4 address, the client
//! in a binds IPv4 and names the server `::ffff:198.18.0.2`. A 16 KiB
//! stream and the end handshake cross both ways, every byte checked, and
//! neither side counts a frame from an unknown peer.

use eudp_cli::testbed::{is_root, unique_name, wait_udp_server, Testbed, ADDR_A, ADDR_B};
use serde_json::Value;
use std::process::Stdio;
use std::time::Duration;

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");
const SERVER_PORT: u16 = 41_010;
const CLIENT_PORT: u16 = 41_011;

fn args(role: &str, local: &str, peer: &str) -> Vec<String> {
    ["worker", "emp", "--role", role, "--local", local, "--peer", peer, "--pattern", "stream", "--size", "16384"]
        .iter()
        .chain(&["--secs", "1"])
        .map(|s| s.to_string())
        .collect()
}

fn line(what: &str, out: &std::process::Output) -> Value {
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{what} failed: {}; stdout {text}", String::from_utf8_lossy(&out.stderr));
    let first = text.lines().next().unwrap_or_else(|| panic!("{what}: no JSON line"));
    serde_json::from_str(first).unwrap_or_else(|e| panic!("{what} line {first:?}: {e}"))
}

#[test]
fn a_dual_stack_server_and_an_ipv4_client_exchange_a_stream() {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return;
    }
    let bed = Testbed::up(&unique_name("empmap")).expect("testbed up");
    let server = bed
        .command('b', EUDP)
        .args(args("server", &format!("[::]:{SERVER_PORT}"), &format!("{ADDR_A}:{CLIENT_PORT}")))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    wait_udp_server(server.id(), SERVER_PORT, false, Duration::from_secs(10)).expect("server bound");
    let client = bed
        .command('a', EUDP)
        .args(args("client", &format!("{ADDR_A}:{CLIENT_PORT}"), &format!("[::ffff:{ADDR_B}]:{SERVER_PORT}")))
        .output()
        .expect("client");
    let server = server.wait_with_output().expect("server output");
    let (c, s) = (line("client", &client), line("server", &server));
    assert_eq!((c["errors"].as_u64(), s["errors"].as_u64(), s["corrupt"].as_u64()), (Some(0), Some(0), Some(0)));
    assert!(c["messages"].as_u64().unwrap() > 0, "{c}");
    assert_eq!(c["messages"], s["messages_received"], "client {c}\nserver {s}");
    assert_eq!(c["bytes"], s["bytes_received"]);
    for v in [&c, &s] {
        assert_eq!(v["counters"]["unknown_peer"].as_u64(), Some(0), "{v}");
        assert_eq!(v["counters"]["give_ups"].as_u64(), Some(0), "{v}");
    }
}
