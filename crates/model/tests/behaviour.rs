//! Behaviour of the simulator, the model and the command line.

use eudp_model::cli::{model_main, sim_main};
use eudp_model::measure::shipped;
use eudp_model::preset;
use eudp_model::sim::{self, Workload};
use eudp_model::{fit, perfetto, timeline};

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

fn tmp(name: &str) -> String {
    let d = std::env::temp_dir().join(format!("eudp-model-test-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name).to_string_lossy().into_owned()
}

#[test]
fn every_shipped_preset_loads_and_cites_every_input() {
    let dir = preset::presets_dir();
    let mut n = 0;
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().and_then(|x| x.to_str()) != Some("json") {
            continue;
        }
        let pr = preset::load(&p.to_string_lossy()).unwrap();
        for (field, c) in preset::cited_values(&pr) {
            assert!(!c.cite.trim().is_empty(), "{}: {field} has no citation", p.display());
        }
        for stack in pr.stacks.keys() {
            let r =
                sim::run(&pr, stack, &Workload { msg_bytes: 4096, messages: 3, bidirectional: false, timeline: false })
                    .unwrap();
            assert!(r.latency_ns() > 0.0, "{stack}");
        }
        n += 1;
    }
    assert!(n >= 3);
}

#[test]
fn events_per_second() {
    // Best of three short runs, so a busy shared machine does not decide.
    let mut best = 0.0f64;
    let mut events = 0;
    for _ in 0..3 {
        let (ev, secs) = eudp_model::measure::bench(20_000).unwrap();
        events = ev;
        best = best.max(ev as f64 / secs);
    }
    eprintln!("simulator: {events} events per run, best {:.2} M events/s", best / 1e6);
    assert!(events > 100_000);
    // Issue 5 asks for at least 1M events/s on one core; an unoptimised
    // test build is not what that figure is about, so only release asserts it.
    if !cfg!(debug_assertions) {
        assert!(best >= 1e6, "simulator below 1M events/s: {best:.0}");
    }
}

#[test]
fn fine_grained_beats_coarse_latency_and_keeps_bandwidth() {
    let p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    let w1 = Workload { msg_bytes: 32768, messages: 1, bidirectional: false, timeline: false };
    let fine = sim::run(&p, "eudp", &w1).unwrap().latency_ns();
    let coarse = sim::run(&p, "coarse", &w1).unwrap().latency_ns();
    assert!(fine < coarse * 0.6, "fine {fine} coarse {coarse}");
    let wn = Workload { messages: 30, ..w1 };
    let bf = sim::run(&p, "eudp", &wn).unwrap().total_bits_per_ns(32768);
    let bc = sim::run(&p, "coarse", &wn).unwrap().total_bits_per_ns(32768);
    assert!((bf - bc).abs() / bc < 0.05, "eq. (4) = eq. (2): {bf} vs {bc}");
}

#[test]
fn bottom_half_priority_delays_the_copy() {
    // Fig. 2b: the copy to the application (process context) waits while
    // bottom halves of later packets hold the CPU.
    let p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    let r = sim::run(&p, "udp", &Workload { msg_bytes: 32768, messages: 10, bidirectional: false, timeline: true })
        .unwrap();
    // The host sees whole IP packets; GM's firmware moves them as 4 kB
    // segments (preset 000), so each packet has 8 records per stage.
    let span = |stage: &str, m: usize| {
        let v: Vec<_> = r.records.iter().filter(|x| x.stage == stage && x.message == m).collect();
        assert_eq!(v.len(), 8, "{stage} message {m}");
        (v.iter().map(|x| x.t_start_ns).fold(f64::INFINITY, f64::min), v.iter().map(|x| x.t_end_ns).fold(0.0, f64::max))
    };
    for m in 0..10 {
        let (_, bh_end) = span("bottom_half", m);
        let (cp_start, _) = span("udp_rx", m);
        assert!(cp_start >= bh_end - 1e-6, "copy of packet {m} starts before its bottom half ends");
    }
}

#[test]
fn timeline_roundtrip_and_fit_recovers_pci_rate() {
    let p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    let mut recs = Vec::new();
    for b in [4096u64, 8192, 16384, 32768] {
        let r = sim::run(&p, "coarse", &Workload { msg_bytes: b, messages: 1, bidirectional: false, timeline: true })
            .unwrap();
        recs.extend(timeline::from_sim(&r.records));
    }
    let text = timeline::to_json(&recs);
    let back = timeline::parse(&text).unwrap();
    assert_eq!(back, recs);
    let fitted = fit::fit(&back).unwrap();
    let nic = fitted.iter().find(|f| f.layer.name == "sender:NIC").expect("sender NIC layer");
    let pci_ns_per_byte = 1.0 / 0.132;
    assert!((nic.layer.big_g_ns - pci_ns_per_byte).abs() / pci_ns_per_byte < 0.02, "{}", nic.layer.big_g_ns);
}

#[test]
fn cli_model_and_sim_write_outputs() {
    let csv = tmp("m.csv");
    let svg = tmp("m.svg");
    assert_eq!(model_main(&args(&format!("--preset 000 --stack eudp --sizes 1k,32k --csv {csv} --svg {svg}"))), 0);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.starts_with("bytes,latency_coarse_us"));
    assert_eq!(text.lines().count(), 3);
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));
    assert_eq!(model_main(&args("--preset 001 --stack udp --dominant --sizes 64,8k")), 0);
    assert_eq!(model_main(&args("--ratemax 4,8,100")), 0);
    let js = tmp("t.json");
    let tsvg = tmp("t.svg");
    assert_eq!(
        sim_main(&args(&format!("timeline --preset 000 --stack eudp --messages 3 --json {js} --svg {tsvg}"))),
        0
    );
    let recs = timeline::parse(&std::fs::read_to_string(&js).unwrap()).unwrap();
    assert!(recs.iter().any(|r| r.host.as_deref() == Some("receiver")));
    assert_eq!(model_main(&args(&format!("--trace {js}"))), 0);
    let sw = tmp("s.csv");
    assert_eq!(sim_main(&args(&format!("sweep --preset 000 --stacks eudp,coarse --sizes 1k,32k --buses pci32/33,pci64/66 --messages 8 --jobs 2 --csv {sw}"))), 0);
    assert_eq!(std::fs::read_to_string(&sw).unwrap().lines().count(), 1 + 2 * 2 * 2);
}

/// `sim timeline --perfetto` writes a valid Trace Event file with one
/// slice per record, per host and layer as in the timeline JSON.
#[test]
fn sim_timeline_writes_perfetto() {
    let js = tmp("pt.json");
    let pf = tmp("pt.perfetto.json");
    assert_eq!(
        sim_main(&args(&format!("timeline --preset 000 --stack eudp --messages 3 --json {js} --perfetto {pf}"))),
        0
    );
    let recs = timeline::parse(&std::fs::read_to_string(&js).unwrap()).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&pf).unwrap()).unwrap();
    let c = perfetto::check(&doc).unwrap();
    assert_eq!(c.slices, perfetto::expected_counts(&perfetto::from_timeline("sim 000 eudp", &recs)));
    assert_eq!(c.slices.values().sum::<usize>(), recs.len());
    assert_eq!(c.flows, 3);
}

#[test]
fn cli_errors_are_reported_not_panics() {
    assert_eq!(model_main(&args("--preset nosuch --stack x")), 2);
    assert_eq!(model_main(&args("--preset 000 --stack nosuch")), 2);
    assert_eq!(model_main(&args("--bogus")), 2);
    assert_eq!(model_main(&args("--preset 000 --stack eudp --sizes 1,abc")), 2);
    assert_eq!(sim_main(&args("frobnicate")), 2);
    assert_eq!(sim_main(&args("run --preset 000 --stack eudp --bus isa8")), 2);
    assert_eq!(sim_main(&args("run --preset 000 --stack eudp --messages")), 2);
    let bad = tmp("bad.json");
    std::fs::write(&bad, "{\"name\": 1}").unwrap();
    assert_eq!(sim_main(&args(&format!("run --preset {bad} --stack x"))), 2);
    let trace = tmp("bad-trace.json");
    std::fs::write(
        &trace,
        "{\"records\": [{\"layer\":\"a\",\"packet\":0,\"bytes\":1,\"t_start_ns\":5,\"t_end_ns\":1}]}",
    )
    .unwrap();
    assert_eq!(model_main(&args(&format!("--trace {trace}"))), 2);
}

#[test]
fn chart_renders_a_trace_and_deadlocks_are_errors() {
    let js = tmp("c.json");
    std::fs::write(&js, "[{\"layer\":\"app\",\"packet\":0,\"size\":10,\"t_start_ns\":0,\"t_end_ns\":900,\"extra\":1}]")
        .unwrap();
    let out = tmp("c.svg");
    assert_eq!(sim_main(&args(&format!("chart --trace {js} --svg {out}"))), 0);
    assert!(std::fs::read_to_string(&out).unwrap().contains("app"));
    assert_eq!(sim_main(&args(&format!("chart --trace {js} --svg {out} --layers nosuch"))), 2);
    // a stage that holds the CPU it also needs for its overhead can never run
    let text = std::fs::read_to_string(preset::resolve("001").unwrap()).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["stacks"]["udp"]["stages"][0]["hold"] = serde_json::json!(["tx.cpu"]);
    v["stacks"]["udp"]["stages"][0]["per_packet_us"] = serde_json::json!({"v": 1.0, "cite": "test"});
    let p = preset::parse(&v.to_string()).unwrap();
    let e = sim::run(&p, "udp", &Workload { msg_bytes: 100, messages: 1, bidirectional: false, timeline: false })
        .unwrap_err();
    assert!(e.contains("deadlock"), "{e}");
}

#[test]
fn uncited_input_is_rejected() {
    let text = std::fs::read_to_string(preset::resolve("001").unwrap()).unwrap();
    let broken = text.replacen("\"cite\": \"001 §4: one Intel Pentium Pro 180 MHz\"", "\"cite\": \"\"", 1);
    assert_ne!(broken, text);
    let e = preset::parse(&broken).unwrap_err();
    assert!(e.contains("citation"), "{e}");
}

#[test]
fn bidirectional_runs_share_resources() {
    let p = preset::load(&preset::resolve("003").unwrap()).unwrap();
    let w = Workload { msg_bytes: 16384, messages: 16, bidirectional: true, timeline: false };
    let r = sim::run(&p, "base", &w).unwrap();
    assert_eq!(r.messages.len(), 2);
    let one = sim::run(&p, "base", &Workload { bidirectional: false, ..w }).unwrap();
    // one CPU per NIC serves both directions: each direction is slower
    assert!(r.flow_bits_per_ns(0, 16384) < one.flow_bits_per_ns(0, 16384));
}

#[test]
fn simulator_agrees_with_the_closed_form_model() {
    // 000 §5.3 validates eqs. (1)-(4) against measurements within 5%; here
    // the simulator (with contention and fragments) must agree with the
    // closed form computed from the same preset within 5% where no
    // contention exists: bandwidth (eq. 2/4) and coarse latency (eq. 1).
    use eudp_model::analytic;
    let p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    for stack in ["coarse", "eudp"] {
        for b in [4096u64, 32768] {
            let layers = analytic::layers_from_stack(&p, stack, b as f64).unwrap();
            let model_bw = analytic::bandwidth_limit(&layers, b as f64) * 8.0;
            let r =
                sim::run(&p, stack, &Workload { msg_bytes: b, messages: 40, bidirectional: false, timeline: false })
                    .unwrap();
            let sim_bw = r.flow_bits_per_ns(0, b);
            assert!((sim_bw - model_bw).abs() / model_bw < 0.05, "{stack} {b}: sim {sim_bw} model {model_bw}");
        }
    }
    let b = 32768.0;
    let layers = analytic::layers_from_stack(&p, "coarse", b).unwrap();
    let eq1 = analytic::latency_coarse(&layers, b);
    let sim1 =
        sim::run(&p, "coarse", &Workload { msg_bytes: 32768, messages: 1, bidirectional: false, timeline: false })
            .unwrap()
            .latency_ns();
    assert!((sim1 - eq1).abs() / eq1 < 0.05, "coarse latency: sim {sim1} eq1 {eq1}");
    let t = analytic::stack_threshold(&p, "eudp").unwrap();
    let layers = analytic::layers_from_stack(&p, "eudp", b).unwrap();
    let eq3 = analytic::latency_fine(&layers, b, t);
    let simf = sim::run(&p, "eudp", &Workload { msg_bytes: 32768, messages: 1, bidirectional: false, timeline: false })
        .unwrap()
        .latency_ns();
    eprintln!("eudp 32 kB latency: sim {:.1} us, eq. (3) {:.1} us", simf / 1000.0, eq3 / 1000.0);
    assert!((simf - eq3).abs() / eq3 < 0.05, "fine latency: sim {simf} eq3 {eq3}");
}

#[test]
fn pci_express_directions_do_not_contend() {
    // Minimal stack: host DMA to the NIC, a fast wire, DMA to the receiving
    // host. In a bidirectional run each host's bus carries both directions.
    let mk = |bus: serde_json::Value| {
        let c = |v: f64| serde_json::json!({"v": v, "cite": "test"});
        let dma = |name: &str, side: &str, res: &str, dir: &str| {
            serde_json::json!({
            "name": name, "layer": "DMA", "side": side, "per_byte": {"rate_of": res},
            "use": [{"res": res, "dir": dir}], "chunk_bytes": c(4096.0)})
        };
        let v = serde_json::json!({
            "name": "t", "title": "t", "mbit_bits": c(1e6),
            "resources": {"tx.bus": bus.clone(), "rx.bus": bus,
                          "tx.link": {"kind": "link", "mbps": c(1e6)}, "rx.link": {"kind": "link", "mbps": c(1e6)}},
            "stacks": {"s": {"description": "t", "mtu_bytes": c(65536.0), "stages": [
                dma("sdma", "tx", "tx.bus", "to_nic"),
                {"name": "wire", "layer": "wire", "side": "tx", "per_byte": {"rate_of": "tx.link"}, "use": ["tx.link"]},
                dma("rdma", "rx", "rx.bus", "to_host")]}}});
        preset::parse(&v.to_string()).unwrap()
    };
    let w = Workload { msg_bytes: 65536, messages: 20, bidirectional: true, timeline: false };
    let duplex = sim::run(&mk(serde_json::json!({"kind": "bus", "bus": "pcie1x8", "cite": "test"})), "s", &w).unwrap();
    let shared = sim::run(&mk(serde_json::json!({"kind": "bus", "width_bits": {"v": 64.0, "cite": "t"}, "clock_mhz": {"v": 250.0, "cite": "t"}})), "s", &w).unwrap();
    assert!(duplex.resource("tx.bus@to_host").is_some());
    assert!(shared.resource("tx.bus@to_host").is_none());
    let (d, h) = (duplex.total_bits_per_ns(65536), shared.total_bits_per_ns(65536));
    // same 2 GB/s peak per direction: the duplex bus carries about twice as much
    assert!(d > 1.8 * h, "duplex {d} vs shared {h}");
}

#[test]
fn validation_fails_when_a_preset_drifts() {
    // The ±10% checks are not vacuous: the same E-UDP figure from a preset
    // with a different bus lands far from the published 951 Mbit/s.
    let mut p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    let ok = eudp_model::measure::bandwidth(&p, "eudp", 32768, 40, false).unwrap();
    assert!((ok - 951.0).abs() / 951.0 <= 0.10);
    eudp_model::preset::apply_overrides(&mut p, Some("pci64/33"), None).unwrap();
    let drifted = eudp_model::measure::bandwidth(&p, "eudp", 32768, 40, false).unwrap();
    let row = eudp_model::validation::row("drift", "test", "E-UDP peak on the wrong bus", 951.0, drifted, "Mbit/s");
    assert!(!row.pass(), "drifted preset still passes: {drifted}");
}

#[test]
fn coalesced_interrupts_fire_every_third_segment_and_on_the_last() {
    // 002 §4: an interrupt every 3 segments; a message's final segment must
    // interrupt as well, so a lone datagram pays a whole one.
    let p = preset::load(&preset::resolve("002").unwrap()).unwrap();
    let paid = |bytes: u64| {
        let r = sim::run(&p, "udp", &Workload { msg_bytes: bytes, messages: 1, bidirectional: false, timeline: true })
            .unwrap();
        r.records.iter().filter(|x| x.layer == "interrupt" && x.t_end_ns - x.t_start_ns > 1000.0).count()
    };
    assert_eq!(paid(1), 1);
    assert_eq!(paid(3 * 1472), 1);
    assert_eq!(paid(4 * 1472), 2);
    assert_eq!(paid(45 * 1472), 15);
}

#[test]
fn pingpong_latency_counts_work_left_behind_on_the_path() {
    // 003 base: the receiving NIC's single CPU still owes the send ack when
    // the reply is posted, so half a round trip exceeds the one-way time;
    // with RO's ack beside the receive path (003 §5) the two agree.
    let p = shipped("003").unwrap();
    let one = |s: &str| {
        sim::run(&p, s, &Workload { msg_bytes: 10, messages: 1, bidirectional: false, timeline: false })
            .unwrap()
            .latency_ns()
    };
    let pp = |s: &str| sim::pingpong(&p, s, 10, 4).unwrap().1;
    assert!(pp("base") > one("base") + 1000.0, "base ping-pong {} vs one-way {}", pp("base"), one("base"));
    assert!((pp("ro") - one("ro")).abs() < 1.0, "ro ping-pong {} vs one-way {}", pp("ro"), one("ro"));
    assert!(pp("ro") < pp("base"));
    // every round trip is simulated: 4 messages each way, replies after requests
    let (r, _) = sim::pingpong(&p, "base", 10, 4).unwrap();
    assert_eq!(r.messages[0].len(), 4);
    for k in 0..4 {
        assert!(r.messages[1][k].0 >= r.messages[0][k].1, "reply {k} posted before the request arrived");
        if k + 1 < 4 {
            assert!(r.messages[0][k + 1].0 >= r.messages[1][k].1, "request {} posted before reply {k} arrived", k + 1);
        }
    }
}

#[test]
fn after_gates_a_stage_on_an_earlier_one() {
    let mut p = shipped("003").unwrap();
    let w = Workload { msg_bytes: 10, messages: 1, bidirectional: false, timeline: true };
    let start = |p: &eudp_model::preset::Preset| {
        let r = sim::run(p, "ro", &w).unwrap();
        let t = |n: &str| r.records.iter().find(|x| x.stage == n).map(|x| (x.t_start_ns, x.t_end_ns)).unwrap();
        (t("send_ack"), t("recv_bookkeep"), t("receiving"))
    };
    let (ack, bk, rcv) = start(&p);
    assert!((ack.0 - bk.1).abs() < 1e-6, "send ack starts when receive bookkeeping ends");
    assert!(ack.1 < rcv.1, "and overlaps receiving");
    for st in p.stacks.get_mut("ro").unwrap().stages.iter_mut() {
        st.after = None;
    }
    let (ack, _, rcv) = start(&p);
    assert!(ack.0 >= rcv.1, "without it the ack waits for receiving");
    let mut bad = shipped("003").unwrap();
    bad.stacks.get_mut("ro").unwrap().stages[0].after =
        Some(eudp_model::preset::After { stage: "wire".into(), cite: "x".into() });
    let text = serde_json::to_string(&bad).unwrap();
    assert!(eudp_model::preset::parse(&text).is_err(), "after must name an earlier stage");
}

#[test]
fn a_cpu_waiting_for_a_spin_lock_does_no_other_work() {
    // 003 §2: a Tigon CPU loops on the semaphore register until it owns the
    // lock. In SO bidirectional traffic cpu A's receive DMA and cpu B's
    // transmissions contend for the one semaphore; a spinning cpu A cannot
    // run receive bookkeeping meanwhile, so it is busier and the NIC slower.
    let spin = shipped("003").unwrap();
    let mut free = spin.clone();
    for r in free.resources.values_mut() {
        if let eudp_model::preset::ResourceSpec::Lock { spin } = r {
            *spin = None;
        }
    }
    let w = Workload { msg_bytes: 16384, messages: 40, bidirectional: true, timeline: false };
    let go = |p: &eudp_model::preset::Preset, s: &str| {
        let r = sim::run(p, s, &w).unwrap();
        (r.total_bits_per_ns(w.msg_bytes), r.resource("rx.cpuA").unwrap().busy_ns)
    };
    let (bw_spin, busy_spin) = go(&spin, "so");
    let (bw_free, busy_free) = go(&free, "so");
    assert!(bw_spin < 0.98 * bw_free, "spinning costs bandwidth: {bw_spin} vs {bw_free}");
    assert!(busy_spin > busy_free * 1.02, "spinning keeps cpu A busy: {busy_spin} vs {busy_free} ns");
    // base runs on one CPU and never takes the semaphore: unchanged
    assert_eq!(go(&spin, "base").0, go(&free, "base").0);
    // the spin is cited like every other input
    assert!(eudp_model::preset::cited_values(&spin)
        .iter()
        .any(|(f, c)| f.ends_with(".spin") && c.cite.contains("003 §2")));
}

#[test]
fn host_crossing_resolves_sizes_between_table_points() {
    // 001 §4.1-4.2 place the UDP and Asynchronous UDP boundaries of Table 3
    // between the sizes of Tables 1-2 ("near 5 KB", "adjacent to 3 KB"), so
    // the crossing is searched between table sizes, not only at them. A
    // hypothetical 50 us host cost (a test value, not a preset input) puts
    // UDP's crossing between 2 and 4 kB, where the linear interpolation of
    // Table 1 (host 14.6 + 50 vs DMA 52.5 at 2 kB, 27.8 + 50 vs 100.4 at
    // 4 kB) places it at about 2762 B.
    let mut p = preset::load(&preset::resolve("001").unwrap()).unwrap();
    assert_eq!(
        eudp_model::validation::host_crossing_001(&p, "udp").unwrap(),
        0.0,
        "shipped preset: host never dominates"
    );
    let host = p.stacks.get_mut("udp").unwrap().stages.iter_mut().find(|s| s.name == "host").unwrap();
    host.per_packet_us.as_mut().unwrap().v = 50.0;
    let x = eudp_model::validation::host_crossing_001(&p, "udp").unwrap();
    assert!((x - 2762.0).abs() < 40.0, "crossing at {x} B");
}

#[test]
fn message_start_waits_for_every_segment() {
    // Preset 000's traditional stack: the host posts whole 32 kB IP packets,
    // GM's firmware moves them as 4 kB segments. The NIC may not start a
    // packet's first segment before the host has posted all of it, and the
    // receiving bottom half not before the last segment is in host memory.
    let p = preset::load(&preset::resolve("000").unwrap()).unwrap();
    let r =
        sim::run(&p, "udp", &Workload { msg_bytes: 32768, messages: 2, bidirectional: false, timeline: true }).unwrap();
    let recs = |stage: &str, m: usize| {
        r.records.iter().filter(|x| x.stage == stage && x.message == m).cloned().collect::<Vec<_>>()
    };
    for m in 0..2 {
        let post_end = recs("post", m).iter().map(|x| x.t_end_ns).fold(0.0, f64::max);
        let sdma = recs("sdma", m);
        assert_eq!(sdma.len(), 8);
        assert!(sdma.iter().all(|x| x.t_start_ns >= post_end - 1e-6), "NIC starts message {m} before its post ends");
        let rdma_end = recs("rdma", m).iter().map(|x| x.t_end_ns).fold(0.0, f64::max);
        assert!(
            recs("bottom_half", m).iter().all(|x| x.t_start_ns >= rdma_end - 1e-6),
            "bottom half of {m} before its last segment"
        );
        // and the pipelining across segments remains: the link sends segment
        // 0 while the host DMA moves segment 1
        let send0 = recs("send", m)[0].clone();
        assert!(sdma[1].t_start_ns < send0.t_end_ns, "no overlap of DMA and send across segments");
    }
}
