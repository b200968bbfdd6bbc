//! Signals and the spinning `poll`, `select` and `epoll_wait` of the
//! latency profile (`EUDP_SPIN_US`): they end as the kernel's calls end,
//! and the spin itself makes no signal-mask system call.

mod common;
use common::*;
use std::process::Command;

/// Runs `spin_signals kinds` on the kernel, and under the shim without a
/// spin and with one far longer than every wait of the program (each wait
/// then spins in user space while its signal comes): the same lines.
#[test]
fn spinning_waits_end_on_signals_as_the_kernels_do() {
    let exe = cc("spin_signals", &[]);
    let kernel = Command::new(&exe).arg("kinds").output().unwrap();
    let expected = String::from_utf8_lossy(&kernel.stdout).into_owned();
    assert!(kernel.status.success(), "on the kernel: {expected}{}", String::from_utf8_lossy(&kernel.stderr));
    // The kernel's own answers, so the program checks what it should.
    for line in [
        "no_restart poll EINTR handler 1 fast 1",
        "restart epoll_wait EINTR handler 1 fast 1",
        "signal_fn select EINTR handler 1 fast 1",
        "ignored poll ready",
        "masked ppoll ready handler 1",
        "unmasked ppoll EINTR handler 1",
        "blocked poll ready handler 0",
        "pending after unblock 1",
    ] {
        assert!(expected.lines().any(|l| l == line), "kernel run lacks {line:?}: {expected}");
    }
    for spin in [None, Some("2000000")] {
        let stats = stat_dir("spin_signals");
        let mut cmd = Command::new("timeout");
        cmd.arg("60").arg(&exe).arg("kinds");
        if let Some(us) = spin {
            cmd.env("EUDP_SPIN_US", us);
        }
        let out = preloaded(cmd, &stats);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "spin {spin:?}: {text}{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(text, expected, "spin {spin:?}: output differs from the kernel's");
        let r = reports(&stats);
        assert!(r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum::<u64>() > 0, "{r:?}");
        let _ = std::fs::remove_dir_all(&stats);
    }
}

/// `rt_sigprocmask` calls of the whole process (`strace -f`) over `n`
/// spinning polls that each end with a datagram during the spin, with a
/// handler without `SA_RESTART` installed (sockperf installs one for
/// SIGINT). Holding the signals blocked during the spin cost two per poll;
/// the handler count needs none, so what remains is the threads' start-up.
#[test]
fn a_spinning_poll_makes_no_signal_mask_calls() {
    if Command::new("strace").arg("-V").output().is_err() {
        eprintln!("skipped: strace is not installed (scripts/deps.sh test)");
        return;
    }
    let exe = cc("spin_signals", &[]);
    let n = 200;
    let stats = stat_dir("spin_sigmask");
    let trace = stats.join("strace.txt");
    let mut cmd = Command::new("strace");
    cmd.args(["-f", "-c", "-e", "trace=rt_sigprocmask", "-o"])
        .arg(&trace)
        .arg(&exe)
        .args(["rounds", &n.to_string()])
        .env("EUDP_SPIN_US", "200000");
    let out = preloaded(cmd, &stats);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(text, format!("rounds {n} ready {n}\n"));
    let counted = std::fs::read_to_string(&trace).unwrap();
    let calls: u64 = counted
        .lines()
        .find(|l| l.trim_end().ends_with("rt_sigprocmask"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let r = reports(&stats);
    assert!(r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum::<u64>() > 0, "{r:?}");
    let _ = std::fs::remove_dir_all(&stats);
    assert!(calls < n / 2, "{calls} rt_sigprocmask calls for {n} spinning polls:\n{counted}");
}
