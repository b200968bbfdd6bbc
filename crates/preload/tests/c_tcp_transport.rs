//! The program-level UDP suites (`tests/c/udp_semantics.c`,
//! `tests/c/udp_surface.c`) under the TCP transport (`EUDP_TRANSPORT=tcp`):
//! each case must print the same lines and exit 0 as on the kernel.
//!
//! Several cases depend on the listener handing datagrams for ports that no
//! endpoint owns to the kernel socket bound there (fork children, sockets
//! that fell back): that takes `CAP_NET_RAW`, so without it the test says
//! so and does nothing.

mod common;
use common::*;
use std::process::Command;

const SEMANTICS: &[&str] = &[
    "sendto_recvfrom",
    "connected",
    "flags",
    "timeout",
    "iov_mmsg",
    "readiness",
    "blocking_wakeup",
    "fork",
    "dup",
    "pktinfo",
    "v6",
    "signals",
    "poll_signal",
    "threads_nb_burst",
    "threads",
    "pollout",
    "select_busy",
    "select_send",
    "select_high",
    "exec",
    "execl",
    "execlp",
    "execle",
];

const SURFACE: &[&str] = &[
    "sockopts",
    "reuse",
    "shutdown",
    "shutdown_wakes",
    "pselect",
    "ppoll",
    "epoll_pwait",
    "epoll_oneshot",
    "epoll_exclusive",
    "epoll_dup",
    "sendmmsg_partial",
    "zero",
    "waitall",
];

/// Cases of `udp_surface.c` left out, inherent to carrying UDP over TCP
/// (docs/tcp.md, "Program-level UDP semantics"):
const SURFACE_INHERENT: &[(&str, &str)] = &[
    // 20 000 nonblocking 1400 B sends: loopback UDP hands each datagram to the
    // receiver at once and never fills the send buffer; the transport holds
    // them until TCP has sent them, and a full lane refuses with EAGAIN, as
    // a UDP socket with a full send buffer does.
    ("sndtimeo", "a nonblocking sender faster than the connection gets EAGAIN"),
    // IPv6 allows 65 527 B of payload; a frame carries at most 65 507 B (the
    // IPv4 limit), and larger sends fail with EMSGSIZE.
    ("sizes", "IPv6 datagrams of 65 508-65 527 bytes exceed the frame limit"),
    // A datagram for a port nobody holds is dropped by the receiving
    // listener (drop_no_port); no ICMP port unreachable travels back, so no
    // ECONNREFUSED, POLLERR or error-queue entry.
    ("refused", "no ICMP errors over TCP"),
    ("errqueue", "no ICMP errors over TCP"),
    // Frames carry no TOS or TTL of the sender's packet.
    ("tos_ttl", "frames carry no TOS/TTL"),
];

/// Root (CAP_NET_RAW, which the hand-over's raw socket needs).
fn can_raw() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn counter(stats: &std::path::Path, name: &str) -> u64 {
    let mut t = 0;
    for e in std::fs::read_dir(stats).unwrap().flatten() {
        if e.file_name().to_string_lossy().ends_with(".tcp.json") {
            if let Ok(j) =
                serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(e.path()).unwrap_or_default())
            {
                t += j["tcp"][name].as_u64().unwrap_or(0);
            }
        }
    }
    t
}

/// Runs every case on the kernel and under the shim with the TCP transport;
/// the differences found.
fn run(prog: &str, cases: &[&str]) -> Vec<String> {
    let exe = cc(prog, &[]);
    let mut failed = Vec::new();
    for case in cases {
        let kernel = Command::new(&exe).arg(case).output().unwrap();
        assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stderr));
        let stats = stat_dir(&format!("tcp-{prog}-{case}"));
        let mut cmd = Command::new("timeout");
        cmd.arg("30").arg(&exe).arg(case).env("EUDP_TRANSPORT", "tcp").env("EUDP_TCP_PORT", uoe_port().to_string());
        let shim = preloaded(cmd, &stats);
        let (k, s) = (String::from_utf8_lossy(&kernel.stdout), String::from_utf8_lossy(&shim.stdout));
        let r = reports(&stats);
        let acc: u64 = r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
        if !shim.status.success() || s != k {
            failed.push(format!(
                "{case}: {}\n--- kernel\n{k}--- tcp\n{s}{}",
                shim.status,
                String::from_utf8_lossy(&shim.stderr)
            ));
        } else if acc == 0 && !case.starts_with("exec") {
            failed.push(format!("{case}: no socket ran on the engine: {r:?}"));
        } else if ["fork", "shutdown"].contains(case) && counter(&stats, "forwarded_kernel") == 0 {
            // These get datagrams of senders on the transport on sockets
            // that are on the kernel path: only the hand-over delivers them.
            // (`signals` and `poll_signal` did too while a socket bound before
            // a fork joined the engine only on first use, in the child; bound
            // sockets now join at bind, fall back at the fork in both
            // processes, and the child's datagram travels as plain UDP.)
            failed.push(format!("{case}: nothing handed to a kernel socket"));
        }
        let _ = std::fs::remove_dir_all(&stats);
    }
    failed
}

#[test]
fn semantics_match_the_kernel_over_tcp() {
    if !can_raw() {
        eprintln!("skipped: needs CAP_NET_RAW (root) for the listener's hand-over to kernel sockets");
        return;
    }
    let failed = run("udp_semantics", SEMANTICS);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `close_busy` streams into a socket nobody reads (its `sink`) while
/// other sockets of the process talk over the same connection. Once the
/// sink's flow is read by the sink's own readers (`Mgr::delegate`) and its
/// program never receives, the manager takes the connection back within
/// `EUDP_TCP_RX_STALL_MS` and drops what the sink's full queue cannot
/// take, as UDP would; before, every flow sharing the connection stalled
/// (runs hung past a minute).
#[test]
fn close_busy_over_tcp() {
    let failed = run("udp_semantics", &["close_busy"]);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn surface_matches_the_kernel_over_tcp() {
    if !can_raw() {
        eprintln!("skipped: needs CAP_NET_RAW (root) for the listener's hand-over to kernel sockets");
        return;
    }
    for (c, _) in SURFACE_INHERENT {
        assert!(!SURFACE.contains(c));
    }
    let failed = run("udp_surface", SURFACE);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
