//! A fork must not wait for what another thread of the shim is doing,
//! and a child must not wait for what a thread of its parent held:
//!
//! * `fork_log`: a thread logs while the main thread forks; each child
//!   logs too.
//! * `fork_stat`: a fork while the stats writer renames its report.

mod common;
use common::*;
use std::process::Command;

/// 200 forks while a thread logs (`EUDP_LOG=debug`), each child logging
/// too: every child ends. With the log written through std's `Stderr`,
/// whose lock the logging thread held at some of the forks, about 2 children
/// in 100 waited for that lock forever (killed by their 5 s alarm).
#[test]
fn a_child_forked_while_a_thread_logs_can_log() {
    let exe = cc("fork_log", &[]);
    let out = Command::new("timeout")
        .args(["120", &exe.display().to_string(), "200"])
        .env("LD_PRELOAD", lib())
        .env("EUDP_LOG", "debug")
        .env("EUDP_STAT_MS", "0")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} {stdout}", out.status);
    assert!(stdout.contains("hung 0 of 200"), "{stdout}");
}

/// 10 forks while the stats writer holds its report's rename for 10 s each
/// time (`EUDP_TEST_STAT_RENAME_MS`, as a rename over the previous report
/// does while the disk is busy; the writer runs every 50 ms): the longest
/// fork takes under 3 s. With the rename under a lock held across fork,
/// the first fork waited for the writer (about 10 s).
#[test]
fn a_fork_does_not_wait_for_the_stats_writers_rename() {
    let exe = cc("fork_stat", &[]);
    let dir = stat_dir("forkstat");
    let out = Command::new("timeout")
        .args(["60", &exe.display().to_string(), "10"])
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_DIR", &dir)
        .env("EUDP_STAT_MS", "50")
        .env("EUDP_TEST_STAT_RENAME_MS", "10000")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{} {stdout}", out.status);
    let ms: f64 = stdout.trim().strip_prefix("longest ").and_then(|v| v.parse().ok()).expect("longest fork");
    assert!(ms < 3000.0, "a fork took {ms} ms");
    let _ = std::fs::remove_dir_all(&dir);
}
