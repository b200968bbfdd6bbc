//! `eudp bench --soak` for a fraction of a minute: it runs every workload
//! and fault, writes a JSON with every section, and each workload makes
//! progress. Structure and progress only: no timing or target is checked.

use std::process::Command;

#[test]
fn a_short_soak_writes_every_section() {
    let tools = ["iperf3", "sockperf", "dnsmasq", "taskset", "cc"];
    let have = |t: &str| {
        Command::new("sh").args(["-c", &format!("command -v {t}")]).output().is_ok_and(|o| o.status.success())
    };
    if !eudp_cli::testbed::is_root() || !tools.iter().all(|t| have(t)) || eudp_cli::run::preload_lib().is_err() {
        eprintln!("skipped: needs root, {} and the built shim", tools.join(", "));
        return;
    }
    let dir = std::env::temp_dir().join(format!("eudp-soak-test-{}", std::process::id()));
    let out = Command::new(env!("CARGO_BIN_EXE_eudp"))
        .args(["bench", "--soak", "0.2", "--out"])
        .arg(&dir)
        .output()
        .expect("eudp bench --soak");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let file = std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).find(|p| {
        p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("soak-") && n.ends_with(".json"))
    });
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(file.expect("soak-*.json written")).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);

    assert_eq!(v["schema"], "eudp-bench-soak/2");
    for k in ["faults", "workloads", "balance", "stalls", "rss", "counters", "targets", "kernel_counters", "loadavg"] {
        assert!(!v[k].is_null(), "no {k}: {v}");
    }
    let w = &v["workloads"];
    // Progress: iperf3 ran more than once and carried datagrams, every other workload too.
    let runs = w["iperf3"]["runs"].as_array().unwrap();
    assert!(runs.len() >= 2, "iperf3 is restarted: {runs:?}");
    assert!(runs.iter().all(|r| r["error"].is_null() && r["received"].as_u64() > Some(0)), "{runs:?}");
    assert!(w["sockperf"]["received"].as_f64() > Some(0.0), "{}", w["sockperf"]);
    assert!(w["sockperf"]["max_us"].as_f64().is_some());
    assert!(w["dns"]["answered"].as_u64() > Some(0), "{}", w["dns"]);
    assert_eq!(w["dns"]["server_pids"].as_array().map(Vec::len), Some(2), "dnsmasq restarted: {}", w["dns"]);
    assert!(w["fork"]["succeeded"].as_u64() > Some(0), "{}", w["fork"]);
    // The same dns and fork programs without the shim, each stall row judged beside its control.
    assert!(w["control_dns"]["answered"].as_u64() > Some(0), "{}", w["control_dns"]);
    assert!(w["control_fork"]["succeeded"].as_u64() > Some(0), "{}", w["control_fork"]);
    for st in v["stalls"].as_array().unwrap().iter().filter(|s| s["workload"] != "iperf3") {
        assert!(st["control_longest_ms"].is_number() && st["bound_ms"].is_number(), "{st}");
    }
    // The faults: the restart, the CPU hog and the pause, each done.
    let faults = v["faults"].as_array().unwrap();
    let kinds: Vec<&str> = faults.iter().filter_map(|f| f["fault"].as_str()).collect();
    assert_eq!(kinds, ["peer restart", "peer restart", "cpu hog", "receiver paused (SIGSTOP, SIGCONT)"], "{faults:?}");
    let restarted: Vec<&str> = faults[..2].iter().filter_map(|f| f["workload"].as_str()).collect();
    assert_eq!(restarted, ["dns", "control-dns"], "the control's dnsmasq restarts too: {faults:?}");
    assert!(faults.iter().all(|f| f["error"].is_null()), "{faults:?}");
    // RSS sampled for every long-lived program; counters for every workload.
    let series = v["rss"]["series"].as_array().unwrap();
    for name in [
        "sockperf-server",
        "sockperf-client",
        "dns-client",
        "fork-client",
        "fork-echo",
        "control-sockperf-server",
        "control-sockperf-client",
    ] {
        let s = series.iter().find(|s| s["name"] == name).unwrap_or_else(|| panic!("no RSS of {name}"));
        assert!(s["max_rss_kib"].as_f64() > Some(0.0), "{s}");
    }
    assert!(v["rss"]["max_rss_kib"].as_f64() > Some(0.0));
    for wl in ["iperf3", "sockperf", "dns", "fork"] {
        assert!(v["counters"]["by_workload"][wl]["reports"].as_u64() > Some(0), "no reports of {wl}");
    }
    assert!(v["counters"]["fork_children"]["reports"].as_u64() > Some(0), "the children report");
    // The control ran without the shim: no reports, and it is no program's missing report.
    assert!(w["control"]["received"].as_f64() > Some(0.0), "{}", w["control"]);
    assert!(v["counters"]["by_workload"]["control"].is_null(), "{}", v["counters"]["by_workload"]);
    let without = v["counters"]["named_without_report"].as_array().unwrap();
    assert!(!without.iter().any(|n| n.as_str().is_some_and(|n| n.starts_with("control-"))), "{without:?}");
    let client = series.iter().find(|s| s["name"] == "sockperf-client").unwrap();
    if client["judged"] == true {
        assert!(client["eudp_share_of_growth_kib"].is_number(), "judged against its control: {client}");
    }
    // The kernel's counters of each workload's own namespaces, and the host's.
    for wl in ["iperf3", "sockperf", "dns", "fork", "control"] {
        let d = &v["kernel_counters"][wl]["delta"];
        for k in ["a:Udp.NoPorts", "b:Udp.RcvbufErrors", "b:Udp6.InErrors", "b:link.veth.rx_dropped"] {
            assert!(d[k].is_u64(), "no {k} for {wl}: {d}");
        }
        assert!(d.as_object().unwrap().keys().any(|k| k.starts_with("host:softnet.cpu")), "{d}");
    }
    // What the iperf3 servers' sockets dropped, the kernel counted in InErrors of their namespace.
    let level = v["counters"]["by_workload"]["iperf3"]["socket_level_drops"].as_u64().unwrap();
    let d = &v["kernel_counters"]["iperf3"]["delta"];
    let in_errors = d["b:Udp.InErrors"].as_u64().unwrap() + d["b:Udp6.InErrors"].as_u64().unwrap();
    assert!(in_errors >= level, "{in_errors} < {level}: {d}");
    for b in v["balance"].as_array().unwrap() {
        assert!(b["kernel"]["verdict"].is_string() && b["kernel"]["off_by"].is_i64(), "{b}");
        assert_eq!(b["balanced"], b["kernel"]["off_by"] == 0, "{b}");
    }
    let per_run = v["balance"][0]["per_run"].as_array().unwrap();
    assert_eq!(per_run.len(), runs.len());
    for st in v["stalls"].as_array().unwrap().iter().filter(|s| s["workload"] == "dns" || s["workload"] == "fork") {
        assert!(st["longest_touches_faults"].is_array() && st["gaps_listed"].is_u64(), "{st}");
    }
    assert!(v["loadavg"]["samples"].as_array().is_some_and(|s| !s.is_empty()));
    assert_eq!(v["balance"].as_array().map(Vec::len), Some(4));
    assert_eq!(v["stalls"].as_array().map(Vec::len), Some(4));
    let targets = v["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 3);
    assert!(targets.iter().all(|t| t["met"].is_boolean()));
    assert_eq!(text.lines().filter(|l| l.starts_with("target ")).count(), 3, "{text}");
    // Nothing left behind: the run's testbeds are gone.
    let tb = format!("eudp-{}-", v["testbed"].as_str().unwrap());
    let ns = String::from_utf8_lossy(&Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).into_owned();
    assert!(!ns.lines().any(|l| l.starts_with(&tb)), "{ns}");
}
