//! Child processes and the datagrams queued when they are made: Python's
//! subprocess (vfork, or fork with a `preexec_fn`) and a C program that
//! vforks or moves a socket to the kernel path with a burst queued. Each
//! must print exactly what it prints on the kernel: every datagram whole
//! and in order.

mod common;
use common::*;
use std::process::{Command, Output};

const SCRIPT: &str = r#"
import socket, subprocess, sys, zlib
how, burst = sys.argv[1], int(sys.argv[2])
print("pid", __import__("os").getpid(), file=sys.stderr)
a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); a.bind(("127.0.0.1", 0))
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); b.bind(("127.0.0.1", 0))
b.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
a.sendto(b"one", b.getsockname()); print(b.recv(10))
# Runs of equal sizes (the engine sends a run as one GSO message), each
# datagram distinct.
data = [bytes((i * 7 + j) % 256 for j in range(1 + ((i // 8) * 97) % 1400)) for i in range(burst)]
to = b.getsockname()
for i in range(3): a.sendto(b"queued%d" % i, to)
for d in data: a.sendto(d, to)
if how == "fork":
    subprocess.run(["true"], close_fds=True, preexec_fn=lambda: None, check=True)
else:
    subprocess.run(["true"], close_fds=True, check=True)
b.settimeout(2)
for i in range(3): print(b.recv(10))
for i in range(burst):
    d = b.recv(65536)
    print(len(d), zlib.crc32(d))
a.sendto(b"two", b.getsockname()); print(b.recv(10))
"#;

/// The report of the process that wrote `pid N` on stderr.
fn own_report(out: &Output, stats: &std::path::Path) -> serde_json::Value {
    let err = String::from_utf8_lossy(&out.stderr);
    let pid: u64 =
        err.lines().find_map(|l| l.strip_prefix("pid ")).and_then(|p| p.trim().parse().ok()).expect("pid line");
    reports(stats)
        .into_iter()
        .find(|r| r["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("no report of pid {pid}"))
}

/// `handoff_us`: the engine's receive handoff (`EUDP_RX_HANDOFF_US`); a
/// long one keeps the engine off the receiver after its first receive, so
/// what is queued at the spawn is still in the kernel's queue.
fn python(how: &str, burst: usize, handoff_us: Option<&str>) {
    let args = ["-c", SCRIPT, how, &burst.to_string()];
    let kernel = Command::new("python3").args(args).output().unwrap();
    assert!(kernel.status.success(), "{}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir(&format!("subprocess-{how}-{burst}-{}", handoff_us.unwrap_or("0")));
    let mut c = Command::new("python3");
    c.args(args);
    if let Some(us) = handoff_us {
        c.env("EUDP_RX_HANDOFF_US", us);
    }
    let out = preloaded(c, &stats);
    assert!(
        out.status.success(),
        "{how} {burst}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&kernel.stdout),
        "{how} {burst}: output differs"
    );
    let r = own_report(&out, &stats);
    assert!(r["accelerated"].as_u64().unwrap_or(0) >= 2, "{how}: {r}");
    if how == "vfork" {
        // Python's sockets are close-on-exec: the parent keeps them.
        assert_eq!(r["fallbacks"].as_u64(), Some(0), "vfork of a CLOEXEC socket's owner: {r}");
    }
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn python_subprocess_vfork() {
    python("vfork", 0, None);
    python("vfork", 200, None);
    python("vfork", 200, Some("300000"));
}

#[test]
fn python_subprocess_fork() {
    python("fork", 0, None);
    python("fork", 200, None);
    python("fork", 0, Some("300000"));
    python("fork", 200, Some("300000"));
}

fn c_case(exe: &std::path::Path, case: &str, env: &[(&str, &str)], fallbacks: std::ops::RangeInclusive<u64>) {
    let kernel = Command::new(exe).arg(case).output().unwrap();
    assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stdout));
    assert_eq!(String::from_utf8_lossy(&kernel.stdout), format!("OK {case}\n"));
    let stats = stat_dir(&format!("fallback-{case}-{}", env.len()));
    let mut c = Command::new(exe);
    c.arg(case).envs(env.iter().copied());
    let out = preloaded(c, &stats);
    assert!(
        out.status.success(),
        "{case} under the shim: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("OK {case}\n"));
    let r = own_report(&out, &stats);
    assert!(r["accelerated"].as_u64().unwrap_or(0) >= 2, "{case}: {r}");
    let fb = r["fallbacks"].as_u64().unwrap_or(0);
    assert!(fallbacks.contains(&fb), "{case}: {fb} fallbacks, want {fallbacks:?}: {r}");
    let _ = std::fs::remove_dir_all(&stats);
}

#[test]
fn c_fallback_keeps_queued_datagrams() {
    let exe = cc("fallback_paths", &[]);
    // The GSO sender's UDP_SEGMENT is one fallback; the receiver's the other.
    c_case(&exe, "shutdown", &[], 2..=2);
    c_case(&exe, "epoll", &[], 2..=2);
    // fork: every socket of the parent (a, b; g was already).
    c_case(&exe, "fork", &[], 3..=3);
    // vfork + exec: close-on-exec sockets stay on the engine.
    c_case(&exe, "vfork_cloexec", &[], 1..=1);
    c_case(&exe, "vfork_inherit", &[], 3..=3);
    // From an exit handler: the hand-over must not need thread-locals.
    c_case(&exe, "atexit", &[], 2..=2);
    // The engine left off the socket for longer than the program runs:
    // the whole burst is in the kernel's queue, coalesced, at the fallback.
    c_case(&exe, "shutdown", &[("EUDP_RX_HANDOFF_US", "300000")], 2..=2);
    c_case(&exe, "fork", &[("EUDP_RX_HANDOFF_US", "300000")], 3..=3);
}

#[test]
fn c_fork_keep_leaves_the_parents_gro_alone() {
    // The parent keeps its sockets on the engine; the child must not turn
    // GRO off on the kernel socket they share, or the parent's engine reads
    // the coalesced messages queued meanwhile as single datagrams.
    // The engine stays off the socket meanwhile (a long handoff), so the
    // burst is still queued, coalesced, when the child runs.
    let exe = cc("fallback_paths", &[]);
    c_case(&exe, "fork", &[("EUDP_FORK_KEEP", "1"), ("EUDP_RX_HANDOFF_US", "300000")], 1..=1);
}
