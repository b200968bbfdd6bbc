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
