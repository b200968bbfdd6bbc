//! `tests/c/rr_paths.c`: request/response paths of the shim, on the kernel
//! and under the shim (same output), with the shim's counters checked:
//! an `EAGAIN` costs one read of the socket, a send that follows a receive
//! takes back a slot its own thread's earlier post still held instead of
//! queueing behind the engine, a fallback sends what was queued before its
//! final counters are taken, an epoll echo thread answers each request,
//! reading its socket itself (the engine thread stays off a socket in the
//! program's epoll set), and the end of a burst leaves when the sending
//! thread goes to sleep waiting for the answer (or sleeps in a timed sleep).

mod common;
use common::*;
use std::process::Command;

/// Runs one case on the kernel and under the shim (with `env`); returns the
/// shim's reports.
fn run(case: &str, n: u32, env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let exe = cc("rr_paths", &[]);
    let kernel = Command::new(&exe).args([case, &n.to_string()]).output().unwrap();
    assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stdout));
    let stats = stat_dir(&format!("rr-paths-{case}"));
    let mut cmd = Command::new("timeout");
    cmd.args(["60"]).arg(&exe).args([case, &n.to_string()]);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let shim = preloaded(cmd, &stats);
    let (k, s) = (String::from_utf8_lossy(&kernel.stdout), String::from_utf8_lossy(&shim.stdout));
    assert!(
        shim.status.success() && s == k,
        "{case}: {}\n--- kernel\n{k}--- shim\n{s}{}",
        shim.status,
        String::from_utf8_lossy(&shim.stderr)
    );
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    let acc: u64 = r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
    assert!(acc >= 1, "{case}: no socket ran on the engine");
    r
}

/// A nonblocking receive on an empty socket reads it once, as the kernel
/// does (it used to read it twice, and snapshot every counter twice).
#[test]
fn eagain_reads_the_socket_once() {
    let n = 1000;
    let r = run("eagain", n, &[]);
    let reads = total(&r, "recv_calls");
    assert!(reads <= n as u64 + 16, "{reads} reads of the socket for {n} EAGAIN receives and one datagram");
}

/// A send whose own thread's previous post is done but not yet reaped
/// (no receive came between that post and the one before) reaps it and
/// goes out directly: queued, it waited for the engine's coalescing
/// interval (set long here, so the old path shows in the counters and in
/// the time).
#[test]
fn a_send_after_a_receive_is_never_queued() {
    let n = 100;
    let r = run("turns", n, &[("EUDP_TX_COALESCE_US", "20000")]);
    assert_eq!(total(&r, "datagrams_sent"), 3 * n as u64);
    assert_eq!(total(&r, "queued_posts"), 0, "sends queued behind the engine");
}

/// A fallback flushes what the socket queued before taking its final
/// counters: all of the burst is counted (it went out either way).
#[test]
fn a_fallback_counts_the_sends_it_flushes() {
    let n = 100;
    let r = run("fallback_burst", n, &[("EUDP_TX_COALESCE_US", "100000")]);
    let fell: u64 = r.iter().map(|x| x["fallbacks"].as_u64().unwrap_or(0)).sum();
    assert_eq!(fell, 1, "the SO_TIMESTAMP socket moves to the kernel path");
    assert!(total(&r, "queued_posts") > 0, "nothing was queued at the fallback: the case tests nothing");
    assert_eq!(total(&r, "datagrams_sent"), n as u64, "sends counted for the burst");
}

/// An echo thread in epoll (level-triggered, reading until EAGAIN) answers
/// every request of a client on another socket.
#[test]
fn epoll_echo_answers_each_request() {
    let n = 2000;
    let r = run("epoll_turns", n, &[]);
    assert!(total(&r, "datagrams_received") > 2 * n as u64, "requests and answers went through the engine");
}

/// Requests 3 ms apart (the engine would take a socket whose program was
/// away for its 1 ms handoff interval): the echo thread, woken by its epoll
/// set, reads every request itself; the engine thread never reads a socket
/// in the program's epoll set (it used to read each request first, a
/// thread hop and an eventfd write per request).
#[test]
fn a_socket_in_an_epoll_set_is_read_by_the_program() {
    let n = 40;
    let r = run("epoll_sparse", n, &[]);
    let (reads, own) = (total(&r, "recv_calls"), total(&r, "direct_recv_calls"));
    assert!(total(&r, "datagrams_received") > 2 * n as u64, "requests and answers went through the engine");
    assert_eq!(reads, own, "reads of the sockets by the engine thread: {}", reads - own);
}

/// A burst whose last datagrams wait out the coalescing interval (3 s
/// here), then the sender's thread waits for the answer that needs all of
/// them — in a blocking receive, `poll`, `select` and `epoll_wait`, or
/// sleeps in `usleep`, `nanosleep` or `clock_nanosleep` between looks. The
/// remainder must leave when that thread goes to sleep: the C program
/// fails when the answer takes 1 s or more (before, it took the interval).
#[test]
fn the_end_of_a_burst_leaves_when_the_sender_waits() {
    let n = 100;
    for how in ["recv", "poll", "select", "epoll", "sleep_usleep", "sleep_nanosleep", "sleep_clock_nanosleep"] {
        let r = run(&format!("burst_{how}"), n, &[("EUDP_TX_COALESCE_US", "3000000")]);
        assert!(total(&r, "queued_posts") > 0, "{how}: nothing was queued: the case tests nothing");
        assert_eq!(total(&r, "sleep_flushes"), 1, "{how}: the remainder was not sent at the sleep");
        assert_eq!(total(&r, "datagrams_sent"), n as u64 + 1, "{how}: the burst and the answer");
    }
}
