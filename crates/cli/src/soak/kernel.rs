//! The kernel's own drop counters, read beside the soak's balance: where a
//! datagram is dropped before or outside a socket, only the kernel counts it.
//!
//! * `/proc/net/softnet_stat`: per CPU, `dropped` (the backlog was full) and
//!   `time_squeeze` (softirq ran out of budget). Host-wide: every namespace
//!   and every other program on the host share it.
//! * `/proc/net/snmp` and `/proc/net/snmp6`: `Udp` and `Udp6` `InErrors`,
//!   `RcvbufErrors`, `SndbufErrors`, `NoPorts`, `MemErrors`, `InCsumErrors`.
//!   Per network namespace, so read inside each host of a testbed.
//! * `ip -s -j link`: `rx_dropped` and `tx_dropped` of the testbed's veth
//!   ends, in their namespaces.
//!
//! A snapshot is a flat map of `scope:counter` to its value; a delta is the
//! difference of two snapshots of the same testbed.

use crate::testbed::Testbed;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::process::{Command, Stdio};

/// The UDP counters read from snmp and snmp6 (the same names in both).
pub const UDP_COUNTERS: &[&str] = &[
    "InDatagrams",
    "InErrors",
    "RcvbufErrors",
    "SndbufErrors",
    "NoPorts",
    "MemErrors",
    "InCsumErrors",
    "IgnoredMulti",
];
/// Counters by `scope:name`.
pub type Snapshot = BTreeMap<String, u64>;

/// Per CPU `[dropped, time_squeeze]` from softnet_stat text: one row per
/// CPU of hex columns, the second and third.
pub fn parse_softnet(text: &str) -> Vec<[u64; 2]> {
    text.lines()
        .filter_map(|l| {
            let c: Vec<u64> = l.split_whitespace().map(|x| u64::from_str_radix(x, 16).unwrap_or(0)).collect();
            (c.len() >= 3).then(|| [c[1], c[2]])
        })
        .collect()
}

/// The `Udp:` counters of [`UDP_COUNTERS`] from `/proc/net/snmp` (a
/// header line of names, then a line of values) and the `Udp6` ones from
/// `/proc/net/snmp6` (a name and a value per line), keyed `Udp.X`, `Udp6.X`.
pub fn parse_snmp(snmp: &str, snmp6: &str) -> Snapshot {
    let mut out = Snapshot::new();
    let mut rows = snmp.lines().filter(|l| l.starts_with("Udp:"));
    if let (Some(names), Some(values)) = (rows.next(), rows.next()) {
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()).skip(1) {
            if UDP_COUNTERS.contains(&n) {
                out.insert(format!("Udp.{n}"), v.parse().unwrap_or(0));
            }
        }
    }
    for l in snmp6.lines() {
        let mut it = l.split_whitespace();
        let (Some(name), Some(v)) = (it.next(), it.next()) else { continue };
        if let Some(n) = name.strip_prefix("Udp6").filter(|n| UDP_COUNTERS.contains(n)) {
            out.insert(format!("Udp6.{n}"), v.parse().unwrap_or(0));
        }
    }
    out
}

/// `rx_dropped` and `tx_dropped` of interface `dev` from `ip -s -j link`
/// output, keyed `link.DEV.rx_dropped`.
pub fn parse_links(json_text: &str, dev: &str) -> Snapshot {
    let mut out = Snapshot::new();
    let v: Value = serde_json::from_str(json_text).unwrap_or(Value::Null);
    for l in v.as_array().into_iter().flatten().filter(|l| l["ifname"] == dev) {
        let st = if l["stats64"].is_object() { &l["stats64"] } else { &l["stats"] };
        for dir in ["rx", "tx"] {
            out.insert(format!("link.{dev}.{dir}_dropped"), st[dir]["dropped"].as_u64().unwrap_or(0));
        }
    }
    out
}

fn output(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null()).stderr(Stdio::null());
    cmd.output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
}

/// The host's softnet counters, keyed `host:softnet.cpuN.dropped`.
pub fn softnet() -> Snapshot {
    let text = std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default();
    let mut out = Snapshot::new();
    for (cpu, [dropped, squeeze]) in parse_softnet(&text).into_iter().enumerate() {
        out.insert(format!("host:softnet.cpu{cpu}.dropped"), dropped);
        out.insert(format!("host:softnet.cpu{cpu}.time_squeeze"), squeeze);
    }
    out
}

/// Every counter of testbed `tb` (both hosts) and the host's softnet.
pub fn snapshot(tb: &Testbed) -> Snapshot {
    let mut out = softnet();
    for h in ['a', 'b'] {
        let ns = tb.netns(h);
        let text = output(Command::new("ip").args(["netns", "exec", &ns, "cat", "/proc/net/snmp"]));
        let text6 = output(Command::new("ip").args(["netns", "exec", &ns, "cat", "/proc/net/snmp6"]));
        let links = output(Command::new("ip").args(["-n", &ns, "-s", "-j", "link"]));
        let dev = tb.veth(h);
        for (k, v) in parse_snmp(&text, &text6).into_iter().chain(parse_links(&links, &dev)) {
            // The veth's name carries the testbed's; the host letter says enough.
            let k = k.replace(&format!("link.{dev}."), "link.veth.");
            out.insert(format!("{h}:{k}"), v);
        }
    }
    out
}

/// `after - before` per counter of `after` (a counter that went back, as
/// a namespace's would if recreated, counts 0).
pub fn delta(before: &Snapshot, after: &Snapshot) -> Snapshot {
    after.iter().map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0)))).collect()
}

/// A delta as JSON; with `nonzero_only`, the counters that moved.
pub fn to_json(d: &Snapshot, nonzero_only: bool) -> Value {
    let m: Map<String, Value> =
        d.iter().filter(|(_, v)| !nonzero_only || **v > 0).map(|(k, v)| (k.clone(), (*v).into())).collect();
    Value::Object(m)
}

fn get(d: &Value, k: &str) -> u64 {
    d[k].as_u64().unwrap_or(0)
}

/// What the kernel counted in a workload's own namespaces (`delta`, from
/// [`to_json`]) that eudp's counters do not, and the host-wide counters
/// beside; then whether they can explain `off` (sent - received - counted
/// drops). `NoPorts` counts only in `hosts`, where the row's datagrams
/// arrive (a one-way row's replies meet closed ports on the other side).
///
/// `socket_level` is what eudp counted from the kernel sockets of the
/// workload (`socket_drops` + `drop_kernel_rcvbuf`): the kernel counts
/// those in `RcvbufErrors` and `InErrors` too, so only the rest is beyond eudp.
pub fn explain(off: i64, delta: &Value, hosts: &[char], socket_level: u64) -> Value {
    let mut own = Map::new();
    let (mut in_errors, mut rcvbuf) = (0, 0);
    for h in ['a', 'b'] {
        for p in ["Udp", "Udp6"] {
            let no_ports = get(delta, &format!("{h}:{p}.NoPorts"));
            if no_ports > 0 && hosts.contains(&h) {
                own.insert(format!("{h}:{p}.NoPorts"), no_ports.into());
            }
            in_errors += get(delta, &format!("{h}:{p}.InErrors"));
            rcvbuf += get(delta, &format!("{h}:{p}.RcvbufErrors"));
        }
    }
    // InErrors includes RcvbufErrors: what is beyond the buffer drops (memory, checksum) is listed apart.
    let beyond_rcvbuf = rcvbuf.saturating_sub(socket_level);
    if beyond_rcvbuf > 0 {
        own.insert("RcvbufErrors beyond eudp's socket-level counts".into(), beyond_rcvbuf.into());
    }
    let other_errors = in_errors.saturating_sub(rcvbuf);
    if other_errors > 0 {
        own.insert("InErrors other than RcvbufErrors".into(), other_errors.into());
    }
    for h in ['a', 'b'] {
        for dir in ["rx", "tx"] {
            let k = format!("{h}:link.veth.{dir}_dropped");
            if get(delta, &k) > 0 {
                own.insert(k.clone(), get(delta, &k).into());
            }
        }
    }
    let own_sum: u64 = own.values().filter_map(Value::as_u64).sum();
    let mut shared = Map::new();
    for (k, v) in delta.as_object().into_iter().flatten() {
        if k.starts_with("host:") && k.ends_with(".dropped") && v.as_u64() > Some(0) {
            shared.insert(k.clone(), v.clone());
        }
    }
    let shared_sum: u64 = shared.values().filter_map(Value::as_u64).sum();
    let verdict = if off == 0 {
        "exact"
    } else if off < 0 {
        "counted more than went missing: a drop counted twice, or a datagram received after it was counted dropped"
    } else if own_sum == off as u64 {
        "explained exactly by the kernel's counters in this workload's own namespaces"
    } else if own_sum > off as u64 {
        "the kernel's counters in this workload's own namespaces can cover it (they count more than the difference)"
    } else if own_sum + shared_sum >= off as u64 {
        "only with host-wide counters shared with every other workload and program (softnet_stat): not attributable"
    } else {
        "unexplained: no kernel counter can cover it"
    };
    json!({
        "off_by": off, "verdict": verdict,
        "own_namespaces": own, "own_sum": own_sum, "own_socket_level_counted_by_eudp": socket_level,
        "shared_host_wide": shared, "shared_sum": shared_sum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOFTNET: &str = "\
121272b4 00000000 00000038 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000
12fbd3bd 0000001a 00000047 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000001 00000000 00000000
";
    const SNMP: &str = "\
Ip: Forwarding DefaultTTL InReceives InDelivers
Ip: 1 64 1000 900
Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails EstabResets CurrEstab InSegs
Tcp: 1 200 120000 -1 0 0 0 0 0 42
Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
Udp: 32331245 58519068 187917168 208267465 187917160 3 0 0 0
UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors
UdpLite: 0 7 0 0 0 0 0 0 0
";
    const SNMP6: &str = "\
Ip6InReceives                   	60534
Ip6InDelivers                   	70000
Icmp6InMsgs                     	11
Udp6InDatagrams                 	60534
Udp6NoPorts                     	2
Udp6InErrors                    	5
Udp6OutDatagrams                	60534
Udp6RcvbufErrors                	4
Udp6SndbufErrors                	0
UdpLite6NoPorts                 	9
";
    const LINKS: &str = r#"[{"ifindex":1,"ifname":"lo","stats64":{"rx":{"dropped":0},"tx":{"dropped":0}}},
        {"ifindex":5,"ifname":"euskb","stats64":{"rx":{"bytes":10,"packets":1,"errors":0,"dropped":3},
         "tx":{"bytes":10,"packets":1,"errors":0,"dropped":1}}}]"#;

    #[test]
    fn softnet_rows_give_dropped_and_time_squeeze_per_cpu_in_hex() {
        assert_eq!(parse_softnet(SOFTNET), vec![[0, 0x38], [0x1a, 0x47]]);
    }

    #[test]
    fn snmp_gives_the_udp_lines_only_not_udplite() {
        let s = parse_snmp(SNMP, SNMP6);
        assert_eq!(s["Udp.NoPorts"], 58519068);
        assert_eq!(s["Udp.InErrors"], 187917168);
        assert_eq!(s["Udp.RcvbufErrors"], 187917160);
        assert_eq!(s["Udp.SndbufErrors"], 3);
        assert_eq!(s["Udp6.NoPorts"], 2);
        assert_eq!(s["Udp6.InErrors"], 5);
        assert_eq!(s["Udp6.RcvbufErrors"], 4);
        assert_eq!((s["Udp.InDatagrams"], s["Udp6.InDatagrams"]), (32331245, 60534));
        assert!(!s.contains_key("Ip.InReceives") && !s.keys().any(|k| k.contains("Lite")), "{s:?}");
    }

    #[test]
    fn links_give_the_named_interface_drops() {
        let l = parse_links(LINKS, "euskb");
        assert_eq!((l["link.euskb.rx_dropped"], l["link.euskb.tx_dropped"]), (3, 1));
        assert!(parse_links(LINKS, "none").is_empty());
        assert!(parse_links("not json", "euskb").is_empty());
    }

    #[test]
    fn a_delta_is_per_counter_and_never_negative() {
        let before: Snapshot = [("b:Udp.NoPorts".to_string(), 5), ("b:Udp.InErrors".to_string(), 9)].into();
        let after: Snapshot = [("b:Udp.NoPorts".to_string(), 7), ("b:Udp.InErrors".to_string(), 3)].into();
        let d = delta(&before, &after);
        assert_eq!((d["b:Udp.NoPorts"], d["b:Udp.InErrors"]), (2, 0));
        assert_eq!(to_json(&d, true), json!({ "b:Udp.NoPorts": 2 }));
    }

    #[test]
    fn the_explanation_separates_own_namespaces_from_host_wide_counters() {
        let d = json!({ "b:Udp.NoPorts": 2, "b:Udp.InErrors": 10, "b:Udp.RcvbufErrors": 10,
                        "a:Udp.NoPorts": 100, "host:softnet.cpu1.dropped": 5 });
        // Receiving host b only: a's NoPorts are another direction's.
        let e = explain(2, &d, &['b'], 10);
        assert_eq!(e["own_sum"], 2, "{e}");
        assert!(e["verdict"].as_str().unwrap().starts_with("explained exactly"), "{e}");
        // Two more RcvbufErrors than eudp counted at the sockets: beyond eudp.
        let e = explain(4, &d, &['b'], 8);
        assert_eq!(e["own_sum"], 4, "{e}");
        let e = explain(7, &d, &['b'], 10);
        assert!(e["verdict"].as_str().unwrap().contains("host-wide"), "{e}");
        assert_eq!(e["shared_sum"], 5);
        assert!(explain(1, &d, &['b'], 10)["verdict"].as_str().unwrap().contains("can cover it"));
        let e = explain(20, &d, &['b'], 10);
        assert!(e["verdict"].as_str().unwrap().starts_with("unexplained"), "{e}");
        assert_eq!(explain(0, &d, &['b'], 10)["verdict"], "exact");
    }
}
