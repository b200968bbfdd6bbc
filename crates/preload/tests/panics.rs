//! No panic reaches the program: a UDP echo program under the shim keeps
//! answering when a hook, the engine thread or the tcp transport's manager
//! thread panics (injected with the test-only `EUDP_TEST_PANIC`); the
//! panic is logged once and counted in the stats report, and the program
//! exits normally.

mod common;
use common::*;
use std::process::Command;

/// Runs the echo program with `EUDP_TEST_PANIC=spec` (and `env`); checks
/// its exit, the one log line naming `what` and the report's count.
fn survives(tag: &str, spec: &str, env: &[(&str, String)], what: &str) {
    let exe = cc("panic_echo", &["-Wno-unused-function"]);
    let stats = stat_dir(tag);
    let mut cmd = Command::new("timeout");
    cmd.arg("60").arg(&exe).env("EUDP_TEST_PANIC", spec).env("EUDP_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = preloaded(cmd, &stats);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{tag}: {:?}\n{stdout}{stderr}", out.status);
    assert!(stdout.contains("answered 300 of 300"), "{tag}: {stdout}");
    let lines = stderr.lines().filter(|l| l.contains("panic") && l.contains(what)).count();
    assert_eq!(lines, 1, "{tag}: the panic is logged once:\n{stderr}");
    assert!(stderr.contains("EUDP_TEST_PANIC"), "{tag}: the log names the panic's message:\n{stderr}");
    assert!(!stderr.contains("RUST_BACKTRACE"), "{tag}: std's panic output reached the program:\n{stderr}");
    let r = reports(&stats);
    let panics: u64 = r.iter().map(|x| x["panics"].as_u64().unwrap_or(0)).sum();
    assert_eq!(panics, 1, "{tag}: one panic counted: {r:?}");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn a_panicking_hook_moves_its_socket_to_the_kernel() {
    survives("hook", "hook:sendto:40", &[], "in sendto");
}

#[test]
fn a_panicking_engine_thread_leaves_the_program_on_the_kernel() {
    survives("engine", "engine:3", &[], "eudp engine thread");
}

#[test]
fn a_panicking_tcp_manager_leaves_the_program_on_the_kernel() {
    let env = [("EUDP_TRANSPORT", "tcp".to_string()), ("EUDP_TCP_PORT", uoe_port().to_string())];
    survives("tcp", "tcp:20", &env, "eudp tcp manager thread");
}
