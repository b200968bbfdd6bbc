//! `tests/c/fallback_race.c`: a socket moved to the kernel path while
//! threads are blocked receiving on it (every datagram received once,
//! whole, in order per thread), and epoll's report of an ICMP error the
//! engine took off the kernel socket (EPOLLERR, level and edge triggered,
//! then the error on the next send or receive). Each case must print the
//! same lines on the kernel and under the shim.

mod common;
use common::*;
use std::process::Command;

fn run(case: &str) -> (String, Vec<serde_json::Value>) {
    let exe = cc("fallback_race", &[]);
    let kernel = Command::new(&exe).arg(case).output().unwrap();
    let k = String::from_utf8_lossy(&kernel.stdout).into_owned();
    assert!(kernel.status.success() && k.ends_with("ALL OK\n"), "{case} on the kernel: {k}{}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir(&format!("fallback-race-{case}"));
    let mut cmd = Command::new(&exe);
    cmd.arg(case);
    let shim = preloaded(cmd, &stats);
    let s = String::from_utf8_lossy(&shim.stdout).into_owned();
    assert!(shim.status.success(), "{case} under the shim: {s}{}", String::from_utf8_lossy(&shim.stderr));
    assert_eq!(s, k, "{case}: output differs from the kernel's");
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    (k, r)
}

fn sum(r: &[serde_json::Value], key: &str) -> u64 {
    r.iter().map(|x| x[key].as_u64().unwrap_or(0)).sum()
}

#[test]
fn blocked_receivers_lose_nothing_at_a_fallback() {
    let (_, r) = run("race");
    // Every round put the socket on the engine and moved it off.
    assert!(sum(&r, "accelerated") >= 20 && sum(&r, "fallbacks") >= 20, "{r:?}");
}

#[test]
fn epoll_reports_an_icmp_error_as_the_kernel_does() {
    let (_, r) = run("epoll_err");
    assert!(sum(&r, "accelerated") > 0, "{r:?}");
    assert_eq!(sum(&r, "fallbacks"), 0, "{r:?}");
}
