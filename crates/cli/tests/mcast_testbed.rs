//! Multicast over the netns testbed: one sender on host `a`, four
//! receiving processes on host `b` sharing the group port, three groups
//! joined in different subsets, IPv4 and IPv6. Each receiver gets exactly
//! its groups' datagrams, intact and in order per group, and eudp's
//! counters match what the programs saw. Needs root (network namespaces).

use eudp_cli::mcastbench::{fanout, FanRun, Plan};
use eudp_cli::run::Stack;
use eudp_cli::testbed::{is_root, unique_name, Testbed};

fn testbed(prefix: &str) -> Option<Testbed> {
    if !is_root() {
        eprintln!("SKIPPED: the testbed needs root (CI runs as root)");
        return None;
    }
    Some(Testbed::up(&unique_name(prefix)).expect("testbed up"))
}

const COUNT: u64 = 3000;
const SIZE: usize = 1000;
/// End markers: five to each of three groups, 24 bytes each.
const ENDS: u64 = 15;

fn plan(v6: bool) -> Plan {
    Plan { size: SIZE, count: COUNT, burst: 32, gap_us: 300, v6, subsets: true }
}

fn check(run: &FanRun, eudp: bool) {
    let tag = format!("{} v6={}", run.stack, run.v6);
    assert_eq!(run.sender["sent"], 3 * COUNT, "{tag}: {:?}", run.sender);
    for (i, r) in run.receivers.iter().enumerate() {
        let rep = &r.report;
        assert_eq!(rep["foreign"], 0, "{tag} receiver {i}: a group it did not join: {rep}");
        let groups = rep["groups"].as_array().expect("groups");
        assert_eq!(groups.len(), r.groups.len(), "{tag} receiver {i}: {rep}");
        for g in groups {
            assert_eq!(g["received"], COUNT, "{tag} receiver {i}: lost datagrams (paced, should be none): {rep}");
            assert_eq!(g["out_of_order"], 0, "{tag} receiver {i}: {rep}");
            assert_eq!(g["corrupt"], 0, "{tag} receiver {i}: {rep}");
            assert_eq!(g["ended"], true, "{tag} receiver {i}: {rep}");
            assert_eq!(g["end_total"], COUNT, "{tag} receiver {i}: {rep}");
        }
        assert_eq!(rep["received"], COUNT * r.groups.len() as u64, "{tag} receiver {i}: {rep}");
        if eudp {
            let p = r.process.as_ref().expect("receiver's shim report");
            assert!(p["accelerated"].as_u64().unwrap_or(0) >= 1, "{tag} receiver {i}: {p}");
            assert_eq!(p["fallbacks"], 0, "{tag} receiver {i}: {p}");
            assert_eq!(p["multicast_kernel"], 0, "{tag} receiver {i}: {p}");
            let s = r.eudp.as_ref().expect("receiver's socket counters");
            // Data and end markers, every one through the ring.
            let seen = rep["received"].as_u64().unwrap();
            let got = s["datagrams_received"].as_u64().unwrap();
            assert!(got >= seen && got <= seen + 5 * r.groups.len() as u64, "{tag} receiver {i}: {s} vs {rep}");
            assert_eq!(s["drop_ring_full"], 0, "{tag} receiver {i}: {s}");
        }
    }
    if eudp {
        let s = run.sender_eudp.as_ref().expect("sender's socket counters");
        assert_eq!(s["datagrams_sent"], 3 * COUNT + ENDS, "{tag}: {s}");
        assert_eq!(s["bytes_sent"], 3 * COUNT * SIZE as u64 + ENDS * 24, "{tag}: {s}");
    }
}

fn lib() -> std::path::PathBuf {
    eudp_cli::shim_path::preload_lib().expect("libeudp_preload.so (cargo build --release -p eudp-preload)")
}

#[test]
fn fan_out_to_four_processes_over_the_kernel_transport() {
    let Some(tb) = testbed("mc") else { return };
    let lib = lib();
    for v6 in [false, true] {
        let k = fanout(&tb, Stack::Kernel, &lib, plan(v6)).expect("kernel fan-out");
        check(&k, false);
        let e = fanout(&tb, Stack::Eudp("default"), &lib, plan(v6)).expect("eudp fan-out");
        check(&e, true);
    }
}

/// Under the tcp transport the members stay on the kernel path, counted,
/// and receive the same.
#[test]
fn fan_out_under_the_tcp_transport_stays_on_the_kernel_path() {
    let Some(tb) = testbed("mt") else { return };
    let run = fanout(&tb, Stack::EudpTcp("default"), &lib(), plan(false)).expect("tcp fan-out");
    check(&run, false);
    // The receivers' SO_REUSEPORT already keeps them there; the sender's
    // first send to a group moves it.
    for r in &run.receivers {
        let p = r.process.as_ref().expect("receiver's shim report");
        assert_eq!(p["fallbacks"], 1, "{p}");
    }
    let p = run.sender_process.as_ref().expect("sender's shim report");
    assert_eq!(p["multicast_kernel"], 1, "{p}");
    assert_eq!(p["fallbacks"], 1, "{p}");
}
