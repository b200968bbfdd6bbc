//! `eudp trace --perfetto` and `--sample` over the netns testbed: the
//! Chrome Trace Event file passes the format's rules (required fields,
//! every async begin ended, flows paired) and has one slice per packet and
//! layer, as many as trace.json's records; a sampled trace has every layer
//! of exactly the datagrams it sampled. Needs root; skipped otherwise.

use eudp_cli::testbed::{is_root, unique_name, Testbed};
use eudp_cli::trace as trace_cmd;
use eudp_trace::{perfetto, resolve};
use std::collections::BTreeMap;

fn setup(prefix: &str) -> Option<(Testbed, std::path::PathBuf)> {
    if !is_root() {
        eprintln!("SKIPPED: the testbed needs root (CI runs as root)");
        return None;
    }
    std::env::set_var("EUDP_TRACE_EXE", env!("CARGO_BIN_EXE_eudp"));
    let dir = std::env::temp_dir().join(format!("eudp-perfetto-test-{}-{prefix}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Some((Testbed::up(&unique_name(prefix)).expect("testbed up"), dir))
}

fn run(tb: &Testbed, dir: &std::path::Path, extra: &[&str]) -> (serde_json::Value, serde_json::Value) {
    let pf = dir.join("trace.perfetto.json");
    let mut args: Vec<String> = ["--testbed", &tb.name, "--out", &dir.display().to_string()]
        .iter()
        .chain(["--perfetto", pf.to_str().unwrap()].iter())
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    args.extend(["--".to_string(), "burst".to_string()]);
    assert_eq!(trace_cmd::trace_main(&args), 0);
    let read = |f: &std::path::Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap()
    };
    (read(&dir.join("trace.json")), read(&pf))
}

/// Slices per (process, layer) that trace.json's records call for.
fn counts_of(doc: &serde_json::Value) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for r in doc["records"].as_array().unwrap() {
        let s = |k: &str| r[k].as_str().unwrap().to_string();
        *m.entry((eudp_model::perfetto::process_name(&s("stack"), &s("host")), s("layer"))).or_default() += 1;
    }
    m
}

#[test]
fn perfetto_export_matches_the_records_kernel_and_eudp() {
    let Some((tb, dir)) = setup("pfx") else { return };
    let (doc, pf) =
        run(&tb, &dir, &["--packets", "8", "--run-packets", "64", "--sizes", "1472", "--compare", "kernel,eudp"]);
    assert_eq!(doc["problems"].as_array().unwrap().len(), 0, "{}", doc["problems"]);
    let c = perfetto::check(&pf).unwrap_or_else(|e| panic!("not a valid trace: {e}"));
    assert_eq!(c.slices, counts_of(&doc));
    // One track per layer and host for both stacks, 8 slices on each.
    for stack in ["kernel", "eudp"] {
        for l in resolve::layers_of(stack) {
            let key = (format!("{stack} {}", l.host), l.name.to_string());
            assert_eq!(c.slices.get(&key), Some(&8), "{key:?}");
        }
    }
    // The kernel-only run and eudp's on the same axis: each stack's slices
    // start at its own first application send, time 0.
    let ev = pf["traceEvents"].as_array().unwrap();
    let procs: BTreeMap<u64, String> = ev
        .iter()
        .filter(|m| m["ph"] == "M" && m["name"] == "process_name")
        .map(|m| (m["pid"].as_u64().unwrap(), m["args"]["name"].as_str().unwrap().to_string()))
        .collect();
    for stack in ["kernel", "eudp"] {
        let first = ev
            .iter()
            .filter(|e| e["ph"] == "b" && procs.get(&e["pid"].as_u64().unwrap()).is_some_and(|p| p.starts_with(stack)))
            .map(|e| e["ts"].as_f64().unwrap())
            .fold(f64::INFINITY, f64::min);
        assert_eq!(first, 0.0, "{stack}: first slice at {first} µs");
    }
    // A flow per packet per stack, from the application's send to its receive.
    assert_eq!(c.flows, 16);
    // Each flow starts at the sender's application call and ends at the receiving application.
    let track = |e: &serde_json::Value| {
        ev.iter()
            .find(|m| m["ph"] == "M" && m["name"] == "thread_name" && m["pid"] == e["pid"] && m["tid"] == e["tid"])
            .map(|m| m["args"]["name"].as_str().unwrap().to_string())
    };
    for e in ev.iter().filter(|e| e["ph"] == "s") {
        assert_eq!(track(e).as_deref(), Some("app.send"), "{e}");
    }
    for e in ev.iter().filter(|e| e["ph"] == "f") {
        assert_eq!(track(e).as_deref(), Some("app.recv"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sampled_trace_has_every_layer_of_its_datagrams() {
    let Some((tb, dir)) = setup("pfs") else { return };
    let (doc, pf) = run(
        &tb,
        &dir,
        &[
            "--sample",
            "4",
            "--packets",
            "6",
            "--run-packets",
            "256",
            "--sizes",
            "64",
            "--size",
            "64",
            "--compare",
            "eudp",
        ],
    );
    assert_eq!(doc["problems"].as_array().unwrap().len(), 0, "{}", doc["problems"]);
    let paths = doc["paths"][0]["paths"].as_array().unwrap();
    let packets: Vec<u64> = paths.iter().map(|p| p["packet"].as_u64().unwrap()).collect();
    assert_eq!(packets, [0, 1, 2, 3, 4, 5], "the first 6 sampled datagrams (the first run of 64) are charted");
    for p in paths {
        assert!(p["points"].as_array().unwrap().iter().all(|x| !x.is_null()), "a hole: {p}");
    }
    let recs = doc["records"].as_array().unwrap();
    assert_eq!(recs.len(), 6 * resolve::layers_of("eudp").len());
    assert!(recs.iter().all(|r| eudp_engine::tracepoint::is_sampled(r["packet"].as_u64().unwrap(), 4)));
    // The table covers the 64 sampled datagrams of the run.
    assert_eq!(doc["runs"][0]["layers"][0]["packets"], 64);
    assert!(doc["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("one datagram in 4")));
    let c = perfetto::check(&pf).unwrap();
    assert_eq!(c.slices, counts_of(&doc));
    assert_eq!(c.flows, 6);
    let _ = std::fs::remove_dir_all(&dir);
}
