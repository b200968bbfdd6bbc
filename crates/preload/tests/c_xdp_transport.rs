//! The program-level UDP suites (`tests/c/udp_semantics.c`,
//! `tests/c/udp_surface.c`) under the AF_XDP transport (`EUDP_TRANSPORT=xdp`):
//! each case must print the same lines and exit 0 as on the kernel.
//!
//! The suites talk over loopback, which is the kernel path under this
//! transport (docs/xdp.md): what this checks is the shim's own handling of
//! the transport — adoption at bind, readiness that includes the backend's
//! descriptor, fallbacks, fork and exec — with the transport running. Each
//! run is inside a namespace of its own whose veth the transport attaches
//! to (never the host's interfaces); the fast path itself is tested across
//! the testbed (engine `xdp_testbed`, cli `run_apps` `…_over_xdp`).

mod common;
use common::*;
use std::process::Command;

const SEMANTICS: &[&str] = &[
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

const SURFACE: &[&str] = &[
    "sockopts",
    "sndtimeo",
    "reuse",
    "shutdown",
    "shutdown_wakes",
    "pselect",
    "ppoll",
    "epoll_pwait",
    "epoll_oneshot",
    "epoll_exclusive",
    "epoll_dup",
    "sendmmsg_partial",
    "sizes",
    "zero",
    "waitall",
    "refused",
    "errqueue",
    "tos_ttl",
];

/// A namespace with a veth (its peer in a second namespace), removed on drop.
struct Ns {
    name: String,
    peer: String,
    dev: String,
}

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

impl Ns {
    fn new(tag: &str) -> Ns {
        let id = format!("{tag}{}", std::process::id() % 100_000);
        let n = Ns { name: format!("cx{id}"), peer: format!("cy{id}"), dev: format!("vx{id}") };
        for ns in [&n.name, &n.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ip(&["netns", "add", ns]);
        }
        ip(&[
            "link",
            "add",
            &n.dev,
            "netns",
            &n.name,
            "type",
            "veth",
            "peer",
            "name",
            &format!("vy{id}"),
            "netns",
            &n.peer,
        ]);
        ip(&["-n", &n.name, "addr", "add", "198.18.0.1/24", "dev", &n.dev]);
        ip(&["-n", &n.name, "link", "set", &n.dev, "up"]);
        ip(&["-n", &n.peer, "link", "set", &format!("vy{id}"), "up"]);
        ip(&["-n", &n.name, "link", "set", "lo", "up"]);
        n
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        for ns in [&self.name, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs every case on the kernel and under the shim on the xdp transport,
/// both inside `ns`; the differences found.
fn run(ns: &Ns, prog: &str, cases: &[&str]) -> Vec<String> {
    let exe = cc(prog, &[]);
    let mut failed = Vec::new();
    for case in cases {
        let kernel = Command::new("ip").args(["netns", "exec", &ns.name]).arg(&exe).arg(case).output().unwrap();
        assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stderr));
        let stats = stat_dir(&format!("xdp-{prog}-{case}"));
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name, "timeout", "30"])
            .arg(&exe)
            .arg(case)
            .env("EUDP_TRANSPORT", "xdp")
            .env("EUDP_XDP_IFACE", &ns.dev);
        let shim = preloaded(cmd, &stats);
        let (k, s) = (String::from_utf8_lossy(&kernel.stdout), String::from_utf8_lossy(&shim.stdout));
        let r = reports(&stats);
        let acc: u64 = r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
        let unavailable: Vec<&str> = r.iter().filter_map(|x| x["xdp"]["unavailable"].as_str()).collect();
        let started = r.iter().any(|x| x["xdp"]["stats"].is_object());
        if !shim.status.success() || s != k {
            failed.push(format!(
                "{case}: {}\n--- kernel\n{k}--- xdp\n{s}{}",
                shim.status,
                String::from_utf8_lossy(&shim.stderr)
            ));
        } else if acc == 0 && !case.starts_with("exec") {
            failed.push(format!("{case}: no socket ran on the engine: {r:?}"));
        } else if !unavailable.is_empty() && !["fork", "signals", "poll_signal"].contains(case) {
            // (A fork child cannot use its parent's AF_XDP socket: its
            // reports say so, as they should.)
            failed.push(format!("{case}: the xdp transport did not start: {unavailable:?}"));
        } else if !started && acc > 0 {
            failed.push(format!("{case}: no report shows the xdp transport: {r:?}"));
        }
        let _ = std::fs::remove_dir_all(&stats);
    }
    failed
}

#[test]
fn semantics_match_the_kernel_over_xdp() {
    if !is_root() {
        eprintln!("skipped: network namespaces and AF_XDP need root");
        return;
    }
    let ns = Ns::new("s");
    let failed = run(&ns, "udp_semantics", SEMANTICS);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn surface_matches_the_kernel_over_xdp() {
    if !is_root() {
        eprintln!("skipped: network namespaces and AF_XDP need root");
        return;
    }
    let ns = Ns::new("u");
    let failed = run(&ns, "udp_surface", SURFACE);
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A blocking receive on the xdp transport that spins (`EUDP_SPIN_US`)
/// before it sleeps: a signal whose handler lacks `SA_RESTART` ends it with
/// `EINTR`, and one whose handler has it lets it go on to its datagram, as
/// on the kernel. The signal comes 100 ms into the receive: inside a 2 s
/// spin, and inside the sleep after a 20 ms one. A spin that ran the
/// handler between its looks and went on would never return (bounded by
/// `timeout`).
#[test]
fn a_spinning_receive_over_xdp_still_ends_on_signals() {
    if !is_root() {
        eprintln!("skipped: network namespaces and AF_XDP need root");
        return;
    }
    let ns = Ns::new("g");
    let exe = cc("udp_semantics", &[]);
    for spin in ["2000000", "20000"] {
        let stats = stat_dir("xdp-signals-spin");
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns.name, "timeout", "20"])
            .arg(&exe)
            .arg("signals")
            .env("EUDP_TRANSPORT", "xdp")
            .env("EUDP_XDP_IFACE", &ns.dev)
            .env("EUDP_SPIN_US", spin);
        let out = preloaded(cmd, &stats);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text == "OK signals\nALL OK\n",
            "spin {spin} µs: {:?}: {text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let r = reports(&stats);
        assert!(r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum::<u64>() > 0, "{r:?}");
        let _ = std::fs::remove_dir_all(&stats);
    }
}

/// A second process on an interface whose XDP hook and queue a first one
/// holds cannot start the transport: its sockets run on the kernel backend
/// (said in its report), and it behaves as on the kernel.
#[test]
fn a_second_process_on_the_interface_gets_the_kernel_backend() {
    if !is_root() {
        eprintln!("skipped: network namespaces and AF_XDP need root");
        return;
    }
    let ns = Ns::new("p");
    let first_stats = stat_dir("xdp-first");
    // The first holds a bound UDP socket (so the transport starts) for a while.
    let hold = "import socket,time; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('0.0.0.0', 0)); print('bound', flush=True); time.sleep(20)";
    let mut first = Command::new("ip")
        .args(["netns", "exec", &ns.name, "python3", "-c", hold])
        .env("EUDP_TRANSPORT", "xdp")
        .env("EUDP_XDP_IFACE", &ns.dev)
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_DIR", &first_stats)
        .env("EUDP_STAT_MS", "200")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(first.stdout.as_mut().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "bound");
    // The transport starts on the engine thread after the bind; a loaded host can take seconds.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let started = loop {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let up = reports(&first_stats).iter().any(|r| r["xdp"]["stats"].is_object());
        if up || std::time::Instant::now() > deadline {
            break up;
        }
    };
    let mut failed = run_second(&ns, "udp_semantics", "sendto_recvfrom");
    // epoll on a kernel-backend socket under this transport: each event once.
    failed.extend(run_second(&ns, "udp_surface", "epoll_dup"));
    failed.extend(run_second(&ns, "udp_semantics", "readiness"));
    let _ = first.kill();
    let _ = first.wait();
    let _ = std::fs::remove_dir_all(&first_stats);
    assert!(started, "the first process's transport did not start");
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// `case` of `prog` as the second process: same output as on the kernel,
/// on the kernel backend, with the reason in its report.
fn run_second(ns: &Ns, prog: &str, case: &str) -> Vec<String> {
    let exe = cc(prog, &[]);
    let kernel = Command::new("ip").args(["netns", "exec", &ns.name]).arg(&exe).arg(case).output().unwrap();
    let stats = stat_dir(&format!("xdp-second-{case}"));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.name, "timeout", "30"])
        .arg(&exe)
        .arg(case)
        .env("EUDP_TRANSPORT", "xdp")
        .env("EUDP_XDP_IFACE", &ns.dev);
    let shim = preloaded(cmd, &stats);
    let r = reports(&stats);
    let _ = std::fs::remove_dir_all(&stats);
    let mut failed = Vec::new();
    if !shim.status.success() || shim.stdout != kernel.stdout {
        failed.push(format!(
            "second process, {case}: {}\n--- kernel\n{}--- shim\n{}{}",
            shim.status,
            String::from_utf8_lossy(&kernel.stdout),
            String::from_utf8_lossy(&shim.stdout),
            String::from_utf8_lossy(&shim.stderr)
        ));
    }
    let why: Vec<&str> = r.iter().filter_map(|x| x["xdp"]["unavailable"].as_str()).collect();
    let on_kernel: u64 = r.iter().map(|x| x["xdp"]["kernel_backend_sockets"].as_u64().unwrap_or(0)).sum();
    let acc: u64 = r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
    if why.is_empty() || on_kernel == 0 || acc == 0 {
        failed.push(format!("second process, {case}: expected its sockets on the kernel backend with a reason: {r:?}"));
    }
    failed
}
