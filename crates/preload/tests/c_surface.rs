//! The rest of the UDP sockets surface (`tests/c/udp_surface.c`): socket
//! options, shutdown, signal-masked waits, epoll modes, partial sendmmsg,
//! ICMP errors, TOS/TTL control messages, zero-length and maximal
//! datagrams. Each case must print the same lines and exit 0 on the kernel
//! and under the shim, and under the shim some socket must have run on the
//! engine.

mod common;
use common::*;
use std::process::Command;

const CASES: &[&str] = &[
    "sockopts",
    "sndtimeo",
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
    "sizes",
    "zero",
    "waitall",
    "refused",
    "errqueue",
    "tos_ttl",
];

/// Runs one case on the kernel and under the shim; the two outputs, and
/// the shim's reports.
fn both(exe: &std::path::Path, case: &str) -> (String, String, Vec<serde_json::Value>) {
    let kernel = Command::new(exe).arg(case).output().unwrap();
    assert!(
        kernel.status.success(),
        "{case} on the kernel: {}{}",
        String::from_utf8_lossy(&kernel.stdout),
        String::from_utf8_lossy(&kernel.stderr)
    );
    let stats = stat_dir(&format!("surface-{case}"));
    let mut cmd = Command::new(exe);
    cmd.arg(case);
    let shim = preloaded(cmd, &stats);
    assert!(
        shim.status.success(),
        "{case} under the shim: {}{}",
        String::from_utf8_lossy(&shim.stdout),
        String::from_utf8_lossy(&shim.stderr)
    );
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    (String::from_utf8_lossy(&kernel.stdout).into_owned(), String::from_utf8_lossy(&shim.stdout).into_owned(), r)
}

fn sum(r: &[serde_json::Value], key: &str) -> u64 {
    r.iter().map(|x| x[key].as_u64().unwrap_or(0)).sum()
}

#[test]
fn surface_matches_the_kernel() {
    let exe = cc("udp_surface", &[]);
    let mut failed = Vec::new();
    for case in CASES {
        let (kernel, shim, r) = both(&exe, case);
        assert!(kernel.ends_with("ALL OK\n"), "{case}: {kernel}");
        if shim != kernel {
            failed.push(format!("{case}: output differs\n--- kernel\n{kernel}--- shim\n{shim}"));
            continue;
        }
        if sum(&r, "accelerated") == 0 {
            failed.push(format!("{case}: no socket ran on the engine: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn fallbacks_are_counted() {
    // Where the kernel path is the answer, the move is counted.
    let exe = cc("udp_surface", &[]);
    for (case, n) in [("shutdown", 7), ("epoll_oneshot", 1), ("errqueue", 2), ("tos_ttl", 1)] {
        let (_, _, r) = both(&exe, case);
        assert!(sum(&r, "fallbacks") >= n, "{case}: {r:?}");
    }
    // And where it is not, nothing moves.
    for case in ["refused", "epoll_dup", "zero", "sizes", "sendmmsg_partial", "pselect", "ppoll", "epoll_pwait"] {
        let (_, _, r) = both(&exe, case);
        assert_eq!(sum(&r, "fallbacks"), 0, "{case}: {r:?}");
    }
}

/// A datagram the engine took off the socket before the program asked for
/// IP_RECVTOS/IP_RECVTTL still comes with those control messages (the
/// engine keeps every message's TOS and TTL).
#[test]
fn tos_ttl_of_datagrams_queued_before_the_option() {
    let exe = cc("udp_surface", &[]);
    let (kernel, shim, _) = both(&exe, "tos_ttl_early");
    assert_eq!(shim, kernel);
}

/// IPv6 as IPv4: IPV6_RECVTCLASS/IPV6_RECVHOPLIMIT keep the receiver on
/// the engine (the only fallback is the sender's sendmsg with control
/// messages), and a datagram the engine took off the socket before the
/// program asked still comes with its traffic class and hop limit.
#[test]
fn tclass_hoplimit_stay_on_the_engine() {
    let exe = cc("udp_surface", &[]);
    for case in ["tclass_hlim", "tclass_hlim_early"] {
        let (kernel, shim, r) = both(&exe, case);
        assert!(kernel.contains(&format!("OK {case}\n")), "{case}: {kernel}");
        assert_eq!(shim, kernel, "{case}");
        assert_eq!(sum(&r, "fallbacks"), 1, "{case}: {r:?}");
    }
}

/// A fallback while another thread sleeps in a blocking recv on the socket
/// returns at once, as the kernel's option call does (the slowest of 20
/// within 50 ms; it waited 200 ms for the sleeper's read before), and the
/// sleeper then gets the next datagram, the program the ones after it.
/// The hand-over leaves the empty socket to the sleeping read, and until
/// that read has ended receives on the kernel path take the kept datagrams
/// only (what the read brought beyond its datagram joins them), so no
/// datagram is served out of order: `fallback_race` covers that.
#[test]
fn a_fallback_does_not_wait_for_a_sleeping_reader() {
    let exe = cc("udp_surface", &[]);
    let (kernel, shim, r) = both(&exe, "fallback_sleeper");
    assert!(kernel.contains("OK fallback_sleeper\n"), "{kernel}");
    assert_eq!(shim, kernel);
    assert_eq!(sum(&r, "fallbacks"), 20, "{r:?}");
}
