//! A fork while another thread of the program is inside the shim's log
//! (`tests/c/fork_log.c`): the child inherits whatever that thread held,
//! and its own log lines must not wait for it.

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
