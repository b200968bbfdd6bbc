//! Multicast over the netns testbed: one sender on host `a`, four
//! receiving processes on host `b` sharing the group port, three groups
//! joined in different subsets, IPv4 and IPv6. Each receiver gets exactly
//! its groups' datagrams, intact and in order per group, and eudp's
//! counters match what the programs saw. Under the xdp transport also four
//! sockets of one receiving process, whose groups are redirected. Needs
//! root (network namespaces).

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
    Plan::new(SIZE, COUNT, 32, 300, v6, true)
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

fn sum(run: &FanRun, f: impl Fn(&serde_json::Value) -> u64) -> u64 {
    run.receivers.iter().filter_map(|r| r.process.as_ref()).map(f).sum()
}

/// Four receiving processes under the xdp transport (sharing the port by
/// SO_REUSEADDR and SO_REUSEPORT; they stay on the engine): one holds the interface's
/// transport, the others get the kernel backend, and since four processes
/// share every group the transport leaves the groups to the kernel,
/// counted. Every receiver gets exactly its groups, in order, intact.
#[test]
fn fan_out_to_four_processes_under_xdp_leaves_shared_groups_to_the_kernel() {
    let Some(tb) = testbed("mx") else { return };
    for v6 in [false, true] {
        let run = fanout(&tb, Stack::EudpXdp("default"), &lib(), plan(v6)).expect("xdp fan-out");
        check(&run, false);
        let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        for r in &run.receivers {
            let p = r.process.as_ref().expect("receiver's shim report");
            assert_eq!(p["fallbacks"], 0, "v6={v6}: {p}");
            assert!(u(&p["accelerated"]) >= 1, "v6={v6}: {p}");
        }
        let holders = run.receivers.iter().filter(|r| r.process.as_ref().unwrap()["xdp"]["stats"].is_object()).count();
        assert_eq!(holders, 1, "v6={v6}: one process holds the interface's transport");
        let copies = sum(&run, |p| u(&p["xdp"]["stats"]["rx_group_copies"]));
        assert_eq!(copies, 0, "v6={v6}: nothing redirected while four processes share the groups");
        // IPv4: the holder's transport found its groups shared; IPv6: its joins stay on the kernel path.
        let holder = run.receivers.iter().find_map(|r| r.process.as_ref().filter(|p| p["xdp"]["stats"].is_object()));
        assert!(u(&holder.unwrap()["multicast_kernel"]) >= 1, "v6={v6}: {holder:?}");
    }
}

/// Four sockets of one receiving process under the xdp transport, sharing
/// the port by `SO_REUSEADDR` and then by `SO_REUSEADDR` and `SO_REUSEPORT`
/// (the kernel gives every socket of a reuseport group a copy of a group
/// datagram, `udp_mcast`'s `share` cases): the process holds every socket
/// on the group port, so the groups' frames are redirected and copied to
/// each socket; bytes, order and counts as on the kernel.
#[test]
fn fan_out_to_four_sockets_of_one_process_is_redirected_under_xdp() {
    let Some(tb) = testbed("my") else { return };
    for reuseport in [false, true] {
        let plan = Plan { reuseport, one_process: true, subsets: false, ..plan(false) };
        let run = fanout(&tb, Stack::EudpXdp("default"), &lib(), plan).expect("xdp fan-out");
        check_one_process(&run, reuseport);
    }
}

fn check_one_process(run: &FanRun, reuseport: bool) {
    let tag = format!("reuseport={reuseport}");
    assert_eq!(run.receivers.len(), 4);
    assert_eq!(run.sender["sent"], 3 * COUNT, "{tag}: {:?}", run.sender);
    let p = run.receivers[0].process.as_ref().expect("receiver's shim report");
    let u = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
    assert_eq!(p["fallbacks"], 0, "{tag}: {p}");
    assert!(u(&p["accelerated"]) >= 4, "{tag}: {p}");
    let st = &p["xdp"]["stats"];
    // Each frame is copied to all four sockets: they get the same datagrams,
    // intact and in order. A frame the process was too slow to take off the
    // AF_XDP ring (a loaded host starves it; the ring holds 2048 frames where
    // a kernel socket here holds 16 MB) is lost to all four, and the
    // kernel's AF_XDP counters account for every one.
    let first = &run.receivers[0].report;
    for (i, r) in run.receivers.iter().enumerate() {
        let rep = &r.report;
        assert_eq!(rep["foreign"], 0, "{tag} receiver {i}: {rep}");
        for g in rep["groups"].as_array().expect("groups") {
            assert_eq!(
                (&g["out_of_order"], &g["corrupt"], &g["ended"]),
                (&0.into(), &0.into(), &true.into()),
                "{tag}: {rep}"
            );
            assert_eq!(g["end_total"], COUNT, "{tag} receiver {i}: {rep}");
        }
        assert_eq!(rep["groups"], first["groups"], "{tag}: receiver {i} got other datagrams than receiver 0");
    }
    let lost = 3 * COUNT - u(&first["received"]);
    assert!(lost <= u(&st["xsk_rx_dropped"]) + u(&st["xsk_rx_ring_full"]), "{tag}: {lost} lost, unaccounted: {st}");
    assert!(u(&st["rx_xdp"]) >= 3 * COUNT - lost, "{tag}: {st}");
    assert!(u(&st["rx_group_copies"]) >= 4 * (3 * COUNT - lost), "{tag}: {st}");
    assert_eq!(u(&st["rx_inbox_drops"]), 0, "{tag}: {st}");
}
