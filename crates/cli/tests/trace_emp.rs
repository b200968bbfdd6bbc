//! `eudp trace --emp` on loopback, briefly, for two schemes and both
//! patterns: every traced message has all seven steps, each starting
//! before it ends, in causal order, and each engine thread ran only the
//! steps its scheme places on it.

use serde_json::Value;
use std::process::Command;

/// The steps in the order one message passes them (by first start);
/// indices into a message's `steps` (Table 1's numbering minus one).
const CAUSAL: [usize; 7] = [0, 1, 4, 3, 5, 6, 2];

fn trace(args: &[&str]) -> Value {
    let out = std::env::temp_dir().join(format!("eudp-trace-emp-{}-{}", std::process::id(), args.join("-")));
    let o = Command::new(env!("CARGO_BIN_EXE_eudp"))
        .args(["trace", "--emp", "--measure-secs", "0", "--out", out.to_str().unwrap()])
        .args(args)
        .output()
        .unwrap();
    assert!(o.status.success(), "eudp trace --emp: {}", String::from_utf8_lossy(&o.stderr));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("receive acknowledgment") && text.contains("predicted"), "{text}");
    let doc: Value = serde_json::from_str(&std::fs::read_to_string(out.join("emp-steps.json")).unwrap()).unwrap();
    for s in doc["schemes"].as_array().unwrap() {
        assert!(out.join(format!("emp-{}.svg", s["scheme"].as_str().unwrap())).exists());
    }
    let _ = std::fs::remove_dir_all(&out);
    doc
}

fn check(doc: &Value, schemes: &[&str], messages: u64) {
    let traced = doc["schemes"].as_array().unwrap();
    assert_eq!(traced.len(), schemes.len());
    for (s, name) in traced.iter().zip(schemes) {
        assert_eq!(s["scheme"], *name);
        // Each message goes one way in a stream, both ways in a ping-pong.
        let per_run = if doc["pattern"] == "pingpong" { 2 * messages } else { messages };
        assert_eq!(s["messages_traced"].as_u64().unwrap(), per_run, "{name}");
        let msgs = s["messages"].as_array().unwrap();
        assert_eq!(msgs.len() as u64, per_run.min(200), "{name}");
        for m in msgs {
            let steps = m["steps"].as_array().unwrap();
            let span = |i: usize| -> (u64, u64) {
                let st = steps[i].as_array().unwrap_or_else(|| panic!("{name}: message {m} lacks step {}", i + 1));
                (st[0].as_u64().unwrap(), st[1].as_u64().unwrap())
            };
            for i in 0..7 {
                let (start, end) = span(i);
                assert!(start <= end, "{name}: step {} of {m}", i + 1);
            }
            for w in CAUSAL.windows(2) {
                assert!(span(w[0]).0 <= span(w[1]).0, "{name}: step {} after step {} in {m}", w[0] + 1, w[1] + 1);
            }
        }
        // Engine threads (A, B; `engine` in base) ran only their own steps.
        let placement: Vec<Vec<&str>> = s["placement"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_array().unwrap().iter().map(|x| x.as_str().unwrap()).collect())
            .collect();
        for row in s["steps"].as_array().unwrap() {
            let step = row["name"].as_str().unwrap().trim_end_matches(" (acks)");
            for thread in row["threads"].as_object().unwrap().keys() {
                let on = match thread.as_str() {
                    "app" => continue,
                    "engine" => 0,
                    t => (t.as_bytes()[0] - b'A') as usize,
                };
                assert!(placement[on].contains(&step), "{name}: {step} ran on engine thread {thread}");
            }
        }
        assert_eq!(s["checks"]["ok"], true, "{name}: {}", s["checks"]);
    }
    let costs = doc["model_costs"].as_object().unwrap();
    assert_eq!(costs.len(), 7);
    for order in ["unidir", "bidir", "latency"] {
        assert_eq!(doc["predicted"][order]["order"].as_array().unwrap().len(), schemes.len());
    }
}

#[test]
fn ping_pong_steps_per_message_in_order_and_in_place() {
    let doc = trace(&["--scheme", "base,ro", "--messages", "30", "--size", "64"]);
    check(&doc, &["base", "ro"], 30);
}

#[test]
fn stream_of_many_frame_messages_in_order_and_in_place() {
    let doc = trace(&["--scheme", "dsr,sr", "--messages", "20", "--size", "9000", "--pattern", "stream"]);
    check(&doc, &["dsr", "sr"], 20);
    assert!(doc["schemes"][0]["messages"][0]["frames"].as_u64().unwrap() > 1);
}

/// Across the netns testbed (a fresh one, torn down after): each endpoint
/// on its own host, across veth, on one clock, every step of every message
/// in order and in place, and the simulator's order from the steps
/// measured there. Needs root; skipped otherwise.
#[test]
fn across_the_testbed_steps_in_order_and_in_place() {
    if !eudp_cli::testbed::is_root() {
        eprintln!("SKIPPED: needs root (network namespaces)");
        return;
    }
    let doc = trace(&[
        "--scheme",
        "base,dsr",
        "--messages",
        "20",
        "--size",
        "9000",
        "--pattern",
        "stream",
        "--emp-hosts",
        "testbed",
    ]);
    assert_eq!(doc["hosts"], "testbed");
    check(&doc, &["base", "dsr"], 20);
}

#[test]
fn emp_options_need_emp_and_name_known_schemes() {
    let eudp = |args: &[&str]| Command::new(env!("CARGO_BIN_EXE_eudp")).args(args).output().unwrap();
    let o = eudp(&["trace", "--scheme", "ro", "--out", "/nonexistent/eudp-trace-emp"]);
    assert_eq!(o.status.code(), Some(2), "{}", String::from_utf8_lossy(&o.stderr));
    let o = eudp(&["trace", "--emp", "--scheme", "xx", "--measure-secs", "0", "--out", "/nonexistent/eudp-trace-emp"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unknown EMP scheme"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}
