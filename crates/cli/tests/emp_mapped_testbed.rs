//! EMP between the testbed's hosts across the address families: the server
//! in b binds `[::]` and names the client by its IPv4 address, the client
//! in a binds IPv4 and names the server `::ffff:198.18.0.2`; and both on
//! IPv6, whose frames must fit the veth's 1500-byte MTU unfragmented. A
//! 16 KiB stream and the end handshake cross both ways, every byte checked,
//! and neither side counts a frame from an unknown peer.

use eudp_cli::testbed::{is_root, unique_name, wait_udp_server, Testbed, ADDR6_A, ADDR6_B, ADDR_A, ADDR_B};
use serde_json::Value;
use std::process::Command;
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

/// Runs the stream: server in b on `server_local` naming `client_at`, client
/// in a on `client_local` naming `server_at`; checks both lines.
fn stream(bed: &Testbed, server_local: &str, client_at: &str, client_local: &str, server_at: &str) {
    let server = bed
        .command('b', EUDP)
        .args(args("server", server_local, client_at))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("server");
    wait_udp_server(server.id(), SERVER_PORT, false, Duration::from_secs(10)).expect("server bound");
    let client = bed.command('a', EUDP).args(args("client", client_local, server_at)).output().expect("client");
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

fn bed(prefix: &str) -> Option<Testbed> {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return None;
    }
    Some(Testbed::up(&unique_name(prefix)).expect("testbed up"))
}

#[test]
fn a_dual_stack_server_and_an_ipv4_client_exchange_a_stream() {
    let Some(bed) = bed("empmap") else { return };
    stream(
        &bed,
        &format!("[::]:{SERVER_PORT}"),
        &format!("{ADDR_A}:{CLIENT_PORT}"),
        &format!("{ADDR_A}:{CLIENT_PORT}"),
        &format!("[::ffff:{ADDR_B}]:{SERVER_PORT}"),
    );
}

/// A counter of `/proc/net/snmp6` in host `host`.
fn snmp6(bed: &Testbed, host: char, name: &str) -> u64 {
    let out = Command::new("ip").args(["netns", "exec", &bed.netns(host), "cat", "/proc/net/snmp6"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.split_whitespace().next() == Some(name));
    line.and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or_else(|| panic!("no {name}"))
}

#[test]
fn ipv6_endpoints_stream_without_fragments() {
    let Some(bed) = bed("emp6") else { return };
    let before = snmp6(&bed, 'a', "Ip6FragCreates");
    stream(
        &bed,
        &format!("[{ADDR6_B}]:{SERVER_PORT}"),
        &format!("[{ADDR6_A}]:{CLIENT_PORT}"),
        &format!("[{ADDR6_A}]:{CLIENT_PORT}"),
        &format!("[{ADDR6_B}]:{SERVER_PORT}"),
    );
    assert!(snmp6(&bed, 'a', "Ip6OutRequests") > 0);
    assert_eq!(snmp6(&bed, 'a', "Ip6FragCreates"), before, "the client's frames were fragmented");
}
