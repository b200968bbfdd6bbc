//! A program with many UDP sockets fits under the shim wherever it fits on
//! the kernel (`crates/preload/src/fdspace.rs`, the descriptor budget):
//! with its descriptor limit just above what it needs, sockets the shim
//! has no private descriptors for stay on the kernel path, and numbers
//! lent to the shim below the limit are given back when the program
//! needs them.

mod common;
use common::*;
use std::process::Command;

/// Runs `tests/c/many_sockets.c` with `args` on the kernel and under the
/// shim; both must receive every datagram. Returns the shim's output line
/// and its report (accelerated sockets and fallback reasons).
fn both(tag: &str, args: &[&str]) -> Option<(String, serde_json::Value)> {
    let exe = cc("many_sockets", &[]);
    let kernel = Command::new(&exe).args(args).output().unwrap();
    let kout = String::from_utf8_lossy(&kernel.stdout).into_owned();
    if kout.starts_with("skipped") {
        eprintln!("{kout}");
        return None;
    }
    assert!(kernel.status.success(), "{args:?} on the kernel: {kout}{}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir(&format!("many-{tag}"));
    let mut cmd = Command::new(&exe);
    cmd.args(args);
    let shim = preloaded(cmd, &stats);
    let sout = String::from_utf8_lossy(&shim.stdout).into_owned();
    eprintln!("{args:?}\n  kernel: {kout}  shim:   {sout}");
    assert!(
        shim.status.success(),
        "{args:?} under the shim ({:?}): {sout}{}",
        shim.status,
        String::from_utf8_lossy(&shim.stderr)
    );
    let n = args[0];
    assert!(sout.contains(&format!("opened {n} received {n} ")), "{sout}");
    let rep = reports(&stats).into_iter().next().expect("a stats report");
    let _ = std::fs::remove_dir_all(&stats);
    Some((sout, rep))
}

fn budget_fallbacks(rep: &serde_json::Value) -> u64 {
    rep["fallback_reasons"]["descriptor budget"].as_u64().unwrap_or(0)
}

#[test]
fn ten_thousand_sockets_in_one_epoll_set_at_a_tight_limit() {
    if let Some((_, rep)) = both("epoll", &["10000", "16", "epoll"]) {
        assert!(budget_fallbacks(&rep) > 0, "{rep}");
    }
}

#[test]
fn ten_thousand_plain_sockets_at_a_tight_limit() {
    if let Some((_, rep)) = both("plain", &["10000", "16", "plain"]) {
        assert!(budget_fallbacks(&rep) > 0, "{rep}");
    }
}

/// With room above the soft limit every socket stays on the engine.
#[test]
fn sockets_stay_on_the_engine_while_there_is_room() {
    if let Some((_, rep)) = both("room", &["1000", "16", "epoll", "8000"]) {
        assert!(rep["accelerated"].as_u64().unwrap_or(0) >= 1000, "{rep}");
        assert_eq!(budget_fallbacks(&rep), 0, "{rep}");
    }
}

/// With the hard limit at the soft limit the shim borrows numbers at the
/// top of the program's space while the program does not use them.
#[test]
fn sockets_use_the_top_of_a_tight_space_while_the_program_does_not() {
    if let Some((_, rep)) = both("top", &["300", "1700", "epoll"]) {
        assert!(rep["accelerated"].as_u64().unwrap_or(0) >= 50, "{rep}");
    }
}

/// Sockets already on the engine that cannot get their ring's eventfd and
/// error flag when the program registers them in an epoll set fall back
/// there, and the set still reports each one's datagram.
#[test]
fn sockets_without_room_for_epoll_fall_back_at_epoll_ctl() {
    if let Some((_, rep)) = both("late-epoll", &["300", "1700", "late-epoll"]) {
        assert!(rep["accelerated"].as_u64().unwrap_or(0) >= 50, "{rep}");
        assert!(budget_fallbacks(&rep) > 0, "{rep}");
    }
}

/// The same for a poll: one whose eventfd cannot be made falls back there
/// rather than sleep past a datagram the engine took into its ring.
#[test]
fn sockets_without_room_for_poll_fall_back_in_poll() {
    if let Some((out, rep)) = both("late-poll", &["300", "1700", "late-poll"]) {
        assert!(out.starts_with("stalls 0\n"), "{out}");
        assert!(rep["accelerated"].as_u64().unwrap_or(0) >= 50, "{rep}");
        assert!(budget_fallbacks(&rep) > 0, "{rep}");
    }
}

/// One thread's close and another's adoption at once, with soft = hard
/// (`tests/c/close_churn.c`: two threads, 2000 socket lifecycles each).
/// A placement checks that the numbers below its duplicate are all the
/// shim's; a number the other thread's close had just released (or
/// released and closed) looked like a program's descriptor there, and from
/// then on every socket fell back ("descriptor budget": 5937-5991 of 6000
/// in three runs of the library before the fix).
#[test]
fn sockets_closed_while_others_are_adopted_stay_on_the_engine() {
    let exe = cc("close_churn", &[]);
    let kernel = Command::new(&exe).args(["2", "2000"]).output().unwrap();
    let kout = String::from_utf8_lossy(&kernel.stdout).into_owned();
    assert_eq!(
        kout.trim(),
        "lifecycles 4000 received 4000",
        "on the kernel: {}",
        String::from_utf8_lossy(&kernel.stderr)
    );
    let stats = stat_dir("churn");
    let mut cmd = Command::new(&exe);
    cmd.args(["2", "2000"]);
    let shim = preloaded(cmd, &stats);
    let sout = String::from_utf8_lossy(&shim.stdout).into_owned();
    assert_eq!(sout, kout, "under the shim: {}", String::from_utf8_lossy(&shim.stderr));
    let rep = reports(&stats).into_iter().next().expect("a stats report");
    let _ = std::fs::remove_dir_all(&stats);
    assert_eq!(budget_fallbacks(&rep), 0, "{rep}");
    assert_eq!(rep["accelerated"].as_u64(), Some(4000), "{rep}");
}
