//! Multicast (`tests/c/udp_mcast.c`): which sockets receive which group's
//! datagrams (any-source and source-specific joins, `IP_MULTICAST_ALL`, a
//! socket bound to a group), leave, loopback off and on, many groups on one
//! socket with bursts (GSO to a group), membership across fork, and a group
//! port shared by `SO_REUSEADDR` and `SO_REUSEPORT` sockets of one process
//! and then of two (datagrams from the peer namespace), IPv4 and IPv6. Each case prints the same lines on the kernel and under the
//! shim. On the kernel transport the members run on the engine with no
//! fallback (the engine reads the member's own kernel socket); under the
//! tcp transport they stay on the kernel path, counted; under the xdp
//! transport they stay on the engine, IPv4 joins mirrored (the `share4`
//! case's groups redirected while one process holds the port), IPv6 ones
//! counted as left to the kernel.
//!
//! Each run is inside a namespace of its own whose veth leads to a second
//! namespace: what is received comes back by `IP_MULTICAST_LOOP`, except in
//! the `share` cases, whose sender runs in the second namespace.

mod common;
use common::*;
use std::process::{Command, Output};

const CASES: &[&str] = &["groups4", "groups6", "many4", "many6", "fork4", "fork6", "share4", "share6"];

fn ip(args: &[&str]) {
    let o = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(o.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&o.stderr));
}

/// A namespace with interface `mc0` (a veth whose peer is in a second
/// namespace), removed on drop.
struct Ns {
    name: String,
    peer: String,
}

impl Ns {
    fn new(tag: &str) -> Ns {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{tag}{}{n}", std::process::id() % 100_000);
        let ns = Ns { name: format!("mx{id}"), peer: format!("my{id}") };
        for x in [&ns.name, &ns.peer] {
            let _ = Command::new("ip").args(["netns", "del", x]).output();
            ip(&["netns", "add", x]);
        }
        ip(&["link", "add", "mc0", "netns", &ns.name, "type", "veth", "peer", "name", "mcp", "netns", &ns.peer]);
        ip(&["-n", &ns.name, "addr", "add", "198.18.200.1/24", "dev", "mc0"]);
        ip(&["-n", &ns.name, "-6", "addr", "add", "2001:2:0:c8::1/64", "dev", "mc0", "nodad"]);
        ip(&["-n", &ns.name, "link", "set", "mc0", "up"]);
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ip(&["-n", &ns.peer, "addr", "add", "198.18.200.2/24", "dev", "mcp"]);
        ip(&["-n", &ns.peer, "-6", "addr", "add", "2001:2:0:c8::2/64", "dev", "mcp", "nodad"]);
        ip(&["-n", &ns.peer, "link", "set", "mcp", "up"]);
        ns
    }

    fn run(&self, exe: &std::path::Path, case: &str, env: &[(&str, &str)], stats: Option<&std::path::Path>) -> Output {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, "timeout", "60"]).arg(exe).arg(case).env("MC_PEER_NS", &self.peer);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let o = match stats {
            Some(d) => preloaded(cmd, d),
            None => cmd.output().unwrap(),
        };
        assert!(
            o.status.success(),
            "{case} {env:?} (shim: {}): {}{}",
            stats.is_some(),
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        o
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        for x in [&self.name, &self.peer] {
            let _ = Command::new("ip").args(["netns", "del", x]).output();
        }
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn sum(r: &[serde_json::Value], key: &str) -> u64 {
    r.iter().map(|x| x[key].as_u64().unwrap_or(0)).sum()
}

/// Every case on the kernel and under the shim with `env`; the differences
/// found, and each case's reports.
fn compare(tag: &str, env: &[(&str, &str)]) -> (Vec<String>, Vec<(&'static str, Vec<serde_json::Value>)>) {
    compare_with(tag, &[], env)
}

/// As [`compare`], with `both` in the environment of the kernel's runs too.
fn compare_with(
    tag: &str,
    both: &[(&str, &str)],
    shim_only: &[(&str, &str)],
) -> (Vec<String>, Vec<(&'static str, Vec<serde_json::Value>)>) {
    let ns = Ns::new(tag);
    let exe = cc("udp_mcast", &[]);
    let mut failed = Vec::new();
    let mut all = Vec::new();
    let env: Vec<(&str, &str)> = both.iter().chain(shim_only).copied().collect();
    let env = env.as_slice();
    for case in CASES {
        let kernel = ns.run(&exe, case, both, None);
        let k = String::from_utf8_lossy(&kernel.stdout).into_owned();
        assert!(k.ends_with(&format!("OK {case}\n")), "{case}: {k}");
        let stats = stat_dir(&format!("mcast-{tag}-{case}"));
        let shim = ns.run(&exe, case, env, Some(&stats));
        let s = String::from_utf8_lossy(&shim.stdout).into_owned();
        if s != k {
            failed.push(format!("{case} {env:?}: output differs\n--- kernel\n{k}--- shim\n{s}"));
        }
        all.push((*case, reports(&stats)));
        let _ = std::fs::remove_dir_all(&stats);
    }
    (failed, all)
}

#[test]
fn multicast_on_the_kernel_transport_matches_the_kernel() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let (mut failed, all) = compare("k", &[]);
    for (case, r) in &all {
        if sum(r, "accelerated") == 0 {
            failed.push(format!("{case}: no socket ran on the engine: {r:?}"));
        }
        // Only a fork moves sockets to the kernel path (docs/preload.md).
        let fallbacks = sum(r, "fallbacks");
        let forks = r
            .iter()
            .filter_map(|x| x["fallback_reasons"].as_object())
            .flat_map(|m| m.iter().filter(|(k, _)| k.contains("fork")).map(|(_, v)| v.as_u64().unwrap_or(0)))
            .sum::<u64>();
        if fallbacks != forks || sum(r, "multicast_kernel") != 0 {
            failed.push(format!("{case}: a member fell back: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[test]
fn multicast_under_the_tcp_transport_stays_on_the_kernel_path() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let port = uoe_port().to_string();
    let (mut failed, all) = compare("t", &[("EUDP_TRANSPORT", "tcp"), ("EUDP_TCP_PORT", &port)]);
    for (case, r) in &all {
        // `share`'s members fall back at SO_REUSEPORT (docs/tcp.md), before
        // they join; the other cases' at their joins or sends to a group.
        if case.starts_with("share") {
            if sum(r, "accelerated") != 0 {
                failed.push(format!("{case}: a member ran on the engine: {r:?}"));
            }
        } else if sum(r, "multicast_kernel") == 0 {
            failed.push(format!("{case}: no socket counted in multicast_kernel: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Under the xdp transport (attached to the namespace's veth) the members
/// stay on the engine, `SO_REUSEPORT` ones too: what each socket receives
/// is the kernel's, IPv4 joins are mirrored by the transport, IPv6 joins are
/// counted as left to the kernel. Most cases' datagrams come back by
/// `IP_MULTICAST_LOOP` through the kernel (the shim's handling); `share4`'s
/// come from the peer namespace and are redirected frames.
#[test]
fn multicast_under_the_xdp_transport_matches_the_kernel() {
    if !is_root() {
        eprintln!("skipped: needs root (network namespaces)");
        return;
    }
    let (mut failed, all) = compare("x", &[("EUDP_TRANSPORT", "xdp"), ("EUDP_XDP_IFACE", "mc0")]);
    for (case, r) in &all {
        if sum(r, "accelerated") == 0 {
            failed.push(format!("{case}: no socket ran on the engine: {r:?}"));
        }
        let xdp_on = r.iter().any(|x| x["xdp"]["stats"].is_object());
        if !xdp_on {
            failed.push(format!("{case}: the xdp transport did not start: {r:?}"));
        }
        if *case == "share4" {
            // One process's three SO_REUSEPORT sockets: 3 datagrams to g1 for
            // two of them and 3 to g2 for two, redirected; then the second
            // process's socket on the port takes the groups to the kernel.
            let xdp = |k: &str| r.iter().map(|x| x["xdp"]["stats"][k].as_u64().unwrap_or(0)).sum::<u64>();
            if xdp("rx_group_copies") < 12 || xdp("group_kernel") < 1 {
                failed.push(format!("{case}: groups not redirected, or not left to the kernel when shared: {r:?}"));
            }
        }
        if case.ends_with('6') && !case.starts_with("fork") && sum(r, "multicast_kernel") == 0 {
            failed.push(format!("{case}: IPv6 joins not counted in multicast_kernel: {r:?}"));
        }
        let non_fork = sum(r, "fallbacks")
            - r.iter()
                .filter_map(|x| x["fallback_reasons"].as_object())
                .flat_map(|m| m.iter().filter(|(k, _)| k.contains("fork")).map(|(_, v)| v.as_u64().unwrap_or(0)))
                .sum::<u64>();
        if non_fork != 0 {
            failed.push(format!("{case}: a member fell back: {r:?}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
