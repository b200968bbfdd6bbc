//! C programs using the sockets API directly: the same program must print
//! the same lines and exit 0 on the kernel and under the shim, and under
//! the shim its sockets must really have run on the engine.

mod common;
use common::*;
use std::process::Command;

const CASES: &[&str] = &[
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
    "close_busy",
    "exec",
    "execl",
    "execlp",
    "execle",
];

fn run_case(exe: &std::path::Path, case: &str) {
    let kernel = Command::new(exe).arg(case).output().unwrap();
    assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir(case);
    let mut cmd = Command::new(exe);
    cmd.arg(case);
    let shim = preloaded(cmd, &stats);
    assert!(
        shim.status.success(),
        "{case} under the shim: {}{}",
        String::from_utf8_lossy(&shim.stdout),
        String::from_utf8_lossy(&shim.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&shim.stdout),
        String::from_utf8_lossy(&kernel.stdout),
        "{case}: output differs"
    );
    let r = reports(&stats);
    let acc: u64 = r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
    // After exec the same pid's report is the new image's (plain kernel sockets).
    assert!(acc > 0 || case == "exec", "{case}: no socket ran on the engine: {r:?}");
    if case == "pktinfo" {
        let fb: u64 = r.iter().map(|x| x["fallbacks"].as_u64().unwrap_or(0)).sum();
        assert_eq!(fb, 0, "IP_PKTINFO and IPV6_RECVPKTINFO stay on the engine: {r:?}");
    }
    if !["fork", "timeout", "signals", "poll_signal", "exec", "execl", "execlp", "execle"].contains(&case) {
        assert!(total(&r, "datagrams_sent") + total(&r, "datagrams_received") > 0, "{case}: no datagram on the engine");
    }
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn semantics_match_the_kernel() {
    let exe = cc("udp_semantics", &[]);
    for case in CASES {
        run_case(&exe, case);
    }
}

#[test]
fn a_spinning_poll_still_ends_on_signals_and_data() {
    // EUDP_SPIN_US far longer than the test's waits: a spin that ignored
    // signals would return late (or 0) and fail the program's checks.
    let exe = cc("udp_semantics", &[]);
    let stats = stat_dir("poll_spin");
    let mut cmd = Command::new(&exe);
    cmd.arg("poll_signal").env("EUDP_SPIN_US", "2000000");
    let out = preloaded(cmd, &stats);
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK poll_signal\nALL OK\n");
    let r = reports(&stats);
    assert!(r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum::<u64>() > 0, "{r:?}");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn a_spinning_receive_still_ends_on_signals() {
    // A blocking recv interrupted by a handler without SA_RESTART fails
    // with EINTR, and one with SA_RESTART goes on to its datagram, with a
    // spin far longer than the case's waits: a spin that ran the handler
    // between its looks and then slept on would never return (bounded by
    // `timeout`).
    let exe = cc("udp_semantics", &[]);
    let stats = stat_dir("recv_spin");
    let mut cmd = Command::new("timeout");
    cmd.arg("20").arg(&exe).arg("signals").env("EUDP_SPIN_US", "2000000");
    let out = preloaded(cmd, &stats);
    assert!(
        out.status.success(),
        "{:?}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "OK signals\nALL OK\n");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn an_epoll_wait_spins_under_a_spinning_profile() {
    // An epoll_wait of 200 ms that nothing ends. A spin of 100 ms (then a
    // sleep) stays runnable for those 100 ms: on an idle machine it uses
    // tens of milliseconds of CPU; on a busy one, where its yields hand the
    // CPU to others, each yield that does counts as an involuntary switch.
    // (about 27 in 100 ms beside three busy loops on two CPUs, with 0-1 ms
    // of CPU). A plain wait sleeps at once: almost no CPU, and no
    // involuntary switch in the same conditions (a few at most).
    let exe = cc("epoll_spin", &[]);
    let run = |spin: Option<&str>| {
        let stats = stat_dir("epoll_spin");
        let mut cmd = Command::new(&exe);
        if let Some(us) = spin {
            cmd.env("EUDP_SPIN_US", us);
        }
        let out = preloaded(cmd, &stats);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
        let _ = std::fs::remove_dir_all(&stats);
        let field = |k: &str| {
            let w: Vec<&str> = text.split_whitespace().collect();
            w.iter()
                .position(|x| *x == k)
                .and_then(|i| w.get(i + 1))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or_else(|| panic!("no {k} in {text:?}"))
        };
        (field("cpu_ms"), field("ivcsw"), text)
    };
    let (spun, spun_yields, spun_text) = run(Some("100000"));
    let (slept, slept_yields, slept_text) = run(None);
    assert!(
        spun >= 20.0 || spun_yields >= 5.0,
        "a spinning epoll_wait neither used CPU nor stayed runnable: {spun_text}"
    );
    assert!(slept < 10.0 && slept_yields < 5.0, "a sleeping epoll_wait used CPU or stayed runnable: {slept_text}");
}

#[test]
fn whole_program_twice() {
    let exe = cc("udp_semantics", &[]);
    for _ in 0..2 {
        let stats = stat_dir("whole");
        let out = preloaded(Command::new(&exe), &stats);
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).ends_with("ALL OK\n"));
        let _ = std::fs::remove_dir_all(&stats);
    }
}

#[test]
fn non_udp_untouched() {
    // TCP, unix sockets, pipes and files through a shell pipeline.
    let stats = stat_dir("other");
    let mut c = Command::new("sh");
    c.args(["-c", "printf abc | cat | wc -c; python3 -c 'import socket; a,b=socket.socketpair(); a.send(b\"x\"); print(b.recv(1))'"]);
    let out = preloaded(c, &stats);
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "3\nb'x'\n");
}
