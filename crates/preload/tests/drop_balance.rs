//! Every datagram a program under the shim sends or is sent is received or
//! counted: sent = received + the counted drops of its path (see
//! docs/promises.md, "Datagrams").

mod common;
use common::*;
use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Datagrams arriving at `sock` until `want` came or nothing came for a
/// second.
fn receive(sock: &UdpSocket, want: usize) -> usize {
    sock.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut buf = [0u8; 2048];
    let mut n = 0;
    while n < want {
        match sock.recv(&mut buf) {
            Ok(_) => n += 1,
            Err(_) => break,
        }
    }
    n
}

/// Runs `sig_flush` in `mode` with a coalescing interval that keeps its
/// sends in L1, waits for "sent", sends it `sig`; returns what the
/// receiver counted, the exit status and the program's output.
fn signalled(
    tag: &str,
    mode: &str,
    sig: i32,
    count: usize,
) -> (usize, std::process::ExitStatus, String, Vec<serde_json::Value>) {
    let exe = cc("sig_flush", &[]);
    let stats = stat_dir(tag);
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = rx.local_addr().unwrap().port();
    let mut child = Command::new(&exe)
        .args([port.to_string(), count.to_string(), mode.to_string()])
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_DIR", &stats)
        .env("EUDP_STAT_MS", "200")
        .env("EUDP_TX_COALESCE_US", "30000000")
        .env("EUDP_QUIET", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = String::new();
    let mut lines = BufReader::new(child.stdout.take().unwrap());
    let t0 = Instant::now();
    while !out.contains("sent\n") && t0.elapsed() < Duration::from_secs(30) {
        if lines.read_line(&mut out).unwrap_or(0) == 0 {
            break;
        }
    }
    let _ = Command::new("kill").arg(format!("-{sig}")).arg(child.id().to_string()).status();
    let got = receive(&rx, count);
    let status = child.wait().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut lines, &mut rest);
    out += &rest;
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    (got, status, out, r)
}

fn flushed_on(tag: &str, sig: i32) {
    let (got, status, out, r) = signalled(tag, "default", sig, 50);
    assert!(out.contains("dfl 1"), "{tag}: the program sees the default action: {out}");
    assert_eq!(status.signal(), Some(sig), "{tag}: ends by the signal: {status:?}");
    assert!(total(&r, "queued_posts") > 0, "{tag}: datagrams waited in L1: {r:?}");
    assert_eq!(got, 50, "{tag}: every queued datagram arrives");
    assert_eq!(total(&r, "datagrams_sent"), 50, "{tag}: the final report counts them: {r:?}");
}

#[test]
fn sigterm_with_the_default_action_flushes_l1_first() {
    flushed_on("sigterm", libc::SIGTERM);
}

#[test]
fn sigint_with_the_default_action_flushes_l1_first() {
    flushed_on("sigint", libc::SIGINT);
}

#[test]
fn a_programs_own_sigterm_handler_keeps_its_behaviour() {
    let (got, status, out, _) = signalled("sighandler", "handler", libc::SIGTERM, 50);
    assert!(out.contains("handled"), "the program's handler ran: {out}");
    assert_eq!(status.code(), Some(7), "the program exits as its handler decides: {status:?}");
    assert_eq!(got, 50, "exit flushes as always");
}

/// Runs `drop_paths ARGS` under the shim in a network namespace of its
/// own; returns (sent, received, RcvbufErrors delta) and the reports.
fn in_netns(tag: &str, args: &[&str]) -> ((u64, u64, u64), Vec<serde_json::Value>) {
    in_netns_with(tag, args, &[])
}

fn in_netns_with(tag: &str, args: &[&str], env: &[(&str, String)]) -> ((u64, u64, u64), Vec<serde_json::Value>) {
    let exe = cc("drop_paths", &[]);
    let stats = stat_dir(tag);
    let mut cmd = Command::new("unshare");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.args(["-n", "sh", "-c", "ip link set lo up && exec \"$0\" \"$@\""]).arg(&exe).args(args).env("EUDP_QUIET", "1");
    let out = preloaded(cmd, &stats);
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{tag}: {:?}\n{stdout}{}", out.status, String::from_utf8_lossy(&out.stderr));
    let w: Vec<u64> = stdout.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(w.len(), 3, "{tag}: {stdout}");
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    ((w[0], w[1], w[2]), r)
}

/// Receive drops of every socket in the reports, by counter.
fn receive_drops(r: &[serde_json::Value]) -> u64 {
    ["drop_ring_full", "drop_truncated", "socket_drops", "drop_fallback_close", "drop_kernel_rcvbuf"]
        .iter()
        .map(|k| total(r, k))
        .sum()
}

#[test]
fn kept_datagrams_a_close_discards_are_counted() {
    let ((sent, got, kernel), r) = in_netns("fallback-close", &["fallback_close", "100", "30"]);
    assert_eq!((sent, got, kernel), (101, 31, 0));
    assert_eq!(total(&r, "drop_fallback_close"), 70, "{r:?}");
    assert_eq!(sent, got + receive_drops(&r), "sent = received + counted drops: {r:?}");
}

/// Every receive drop of every socket in the reports.
fn all_receive_drops(r: &[serde_json::Value]) -> u64 {
    receive_drops(r) + total(r, "drop_close")
}

/// `drop_paths MODE 40 10`: 10 of 40 datagrams read, the other 30 counted
/// in `drop_close` (plus the first exchange, received).
fn unread_counted(tag: &str, mode: &str) {
    let ((sent, got, kernel), r) = in_netns(tag, &[mode, "40", "10"]);
    assert_eq!((sent, got, kernel), (41, 11, 0));
    assert_eq!(total(&r, "drop_close"), 30, "{r:?}");
    assert_eq!(sent, got + all_receive_drops(&r), "sent = received + counted drops: {r:?}");
}

#[test]
fn datagrams_a_close_leaves_unread_are_counted() {
    unread_counted("close-unread", "close_unread");
}

#[test]
fn datagrams_unread_at_exit_are_counted() {
    unread_counted("exit-unread", "exit_unread");
}

#[test]
fn a_burst_into_a_handed_over_kernel_socket_is_counted() {
    let ((sent, got, kernel), r) = in_netns("kernel-rcvbuf", &["kernel_rcvbuf", "200"]);
    assert!(kernel > 0, "the burst overflows the small receive buffer: {sent} {got} {kernel}");
    assert_eq!(total(&r, "drop_kernel_rcvbuf"), kernel, "the kernel's own count: {r:?}");
    assert_eq!(sent, got + receive_drops(&r), "sent = received + counted drops: {r:?}");
}

#[test]
fn datagrams_on_a_tcp_lane_at_exit_are_counted_on_their_socket() {
    let env = [("EUDP_TRANSPORT", "tcp".to_string()), ("EUDP_TCP_PORT", uoe_port().to_string())];
    let ((sent, got, _), r) = in_netns_with("tcp-exit", &["tcp_exit", "40"], &env);
    assert_eq!((sent, got), (40, 0));
    let exit = total(&r, "drop_tcp_exit");
    assert!(exit > 0, "datagrams waited on the lane at exit: {r:?}");
    assert_eq!(sent, exit + total(&r, "drop_tcp_send"), "sent = counted drops: {r:?}");
}
