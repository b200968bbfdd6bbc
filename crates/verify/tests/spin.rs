//! Runs Spin for real: the correct models must give every expected verdict,
//! and every deliberately broken variant must be reported.

use eudp_verify::spin::{self, spin_available, Options};
use eudp_verify::{Verdict, BROKEN};

fn have_spin() -> bool {
    if spin_available() {
        return true;
    }
    eprintln!("SKIPPED: `spin` is not installed (Debian: apt-get install spin); CI installs it");
    false
}

#[test]
fn correct_models_give_every_expected_verdict() {
    if !have_spin() {
        return;
    }
    let report = spin::run(&Options::default(), &mut |_| {}).expect("spin runs");
    print!("{}", report.table());
    assert_eq!(report.outcomes.len(), 20);
    for o in &report.outcomes {
        assert!(o.ok, "{} {}: {}\n{}", o.model, o.property, o.verdict_text(), o.trail.as_deref().unwrap_or(""));
        assert_ne!(o.verdict, Verdict::Incomplete);
        assert!(o.states > 0.0);
    }
    // Formula 4 and the engine's safety properties explore a real state space.
    assert!(report.get("f4_host_dma_exclusive").unwrap().states > 10_000.0);
    assert!(report.get("l2_bound").unwrap().states > 10_000.0);
    // Reachability comes with a witness trail.
    let f1 = report.get("f1_sdma_send").unwrap();
    assert!(f1.trail.as_deref().unwrap().contains("SDMA"), "{:?}", f1.trail);
}

#[test]
fn every_broken_variant_is_reported() {
    if !have_spin() {
        return;
    }
    for b in BROKEN {
        let opts = Options {
            broken: Some(b.name.to_string()),
            only: b.breaks.iter().map(|s| s.to_string()).collect(),
            ..Options::default()
        };
        let report = spin::run(&opts, &mut |_| {}).expect("spin runs");
        assert_eq!(report.outcomes.len(), b.breaks.len(), "{}", b.name);
        for o in &report.outcomes {
            assert!(!o.ok, "broken variant {} was not caught by {}", b.name, o.property);
            assert_ne!(o.verdict, Verdict::Incomplete, "{} {}", b.name, o.property);
            // A violated invariant comes with a counterexample.
            if o.verdict == Verdict::Error {
                assert!(o.trail.is_some(), "{} {}: no trail", b.name, o.property);
            }
        }
    }
}

#[test]
fn broken_variant_leaves_unrelated_properties_alone() {
    if !have_spin() {
        return;
    }
    // An off-by-one L2 bound breaks the bound, not conservation.
    let opts = Options { broken: Some("l2-off-by-one".into()), ..Options::default() };
    let report = spin::run(&opts, &mut |_| {}).unwrap();
    assert!(!report.get("l2_bound").unwrap().ok);
    assert!(report.get("conservation").unwrap().ok);
    assert!(report.get("f4_host_dma_exclusive").is_none(), "only the engine model is checked");
    let trail = report.get("l2_bound").unwrap().trail.clone().unwrap();
    assert!(trail.contains("DirectPost") && trail.contains("l2=3"), "{trail}");
}

#[test]
fn cli_exit_codes() {
    let args = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let dir = std::env::temp_dir().join(format!("eudp-verify-test-emit-{}", std::process::id()));
    assert_eq!(eudp_verify::cli::verify_main(&args(&["--emit-promela", dir.to_str().unwrap()])), 0);
    let engine = std::fs::read_to_string(dir.join("engine.pml")).unwrap();
    assert!(engine.contains("GENERATED from crates/engine/src/machine.rs"));
    assert!(dir.join("firmware.pml").exists());
    let emp = std::fs::read_to_string(dir.join("emp.pml")).unwrap();
    assert!(emp.contains("GENERATED from\n * crates/engine/src/emp/table.rs"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(eudp_verify::cli::verify_main(&args(&["--broken", "no-such-thing"])), 2);
    assert_eq!(eudp_verify::cli::verify_main(&args(&["--list"])), 0);
    if !have_spin() {
        return;
    }
    assert_eq!(eudp_verify::cli::verify_main(&args(&["--only", "l2_bound"])), 0);
    assert_eq!(eudp_verify::cli::verify_main(&args(&["--broken", "l2-off-by-one", "--only", "l2_bound"])), 1);
}

#[test]
fn liveness_of_a_polling_engine_needs_weak_fairness() {
    if !have_spin() {
        return;
    }
    let mut opts =
        Options { models: vec!["engine".into()], only: vec!["eventually_handed".into()], ..Options::default() };
    opts.engine.busy_poll = true;
    let fair = spin::run(&opts, &mut |_| {}).unwrap();
    assert!(fair.all_ok(), "{}", fair.table());
    opts.no_fairness = true;
    let unfair = spin::run(&opts, &mut |_| {}).unwrap();
    let o = unfair.get("eventually_handed").unwrap();
    assert!(!o.ok, "without -f the polling engine may spin forever");
    assert!(o.trail.as_deref().unwrap().contains("start of cycle"), "{:?}", o.trail);
}

#[test]
fn committed_engine_model_is_up_to_date() {
    // crates/verify/promela/engine.pml is a snapshot for readers; the table in
    // crates/engine/src/machine.rs is the source.
    let committed = include_str!("../promela/engine.pml");
    let generated = eudp_verify::models::engine(None, &Default::default()).text;
    assert!(
        committed == generated,
        "crates/verify/promela/engine.pml is stale: run `eudp verify --emit-promela crates/verify/promela`"
    );
}

#[test]
fn committed_emp_model_is_up_to_date() {
    // crates/verify/promela/emp.pml is a snapshot for readers; the table in
    // crates/engine/src/emp/table.rs is the source.
    let committed = include_str!("../promela/emp.pml");
    let generated = eudp_verify::models::emp(None, &Default::default()).text;
    assert!(
        committed == generated,
        "crates/verify/promela/emp.pml is stale: run `eudp verify --emit-promela crates/verify/promela`"
    );
}

#[test]
fn emp_without_nak_still_delivers_by_its_timer() {
    if !have_spin() {
        return;
    }
    // The NAK makes repair fast; exactly-once delivery and progress rest on
    // the timer alone.
    let opts = Options {
        broken: Some("no-nak".into()),
        only: vec!["in_order_once".into(), "all_delivered".into(), "gap_repaired_by_nak".into()],
        ..Options::default()
    };
    let report = spin::run(&opts, &mut |_| {}).unwrap();
    assert!(report.get("in_order_once").unwrap().ok, "{}", report.table());
    assert!(report.get("all_delivered").unwrap().ok, "{}", report.table());
    let gap = report.get("gap_repaired_by_nak").unwrap();
    assert!(!gap.ok);
    let trail = gap.trail.as_deref().unwrap();
    assert!(trail.contains("receiver Hold") && trail.contains("Timeout (all quiet)"), "{trail}");
    assert!(!trail.contains("NakOut"), "{trail}");
}

#[test]
fn emp_window_off_by_one_accepts_a_stale_frame() {
    if !have_spin() {
        return;
    }
    let opts =
        Options { broken: Some("window-off-by-one".into()), only: vec!["in_order_once".into()], ..Options::default() };
    let report = spin::run(&opts, &mut |_| {}).unwrap();
    let o = report.get("in_order_once").unwrap();
    assert!(!o.ok);
    // The counterexample holds a repaired old frame as a new one and accepts it.
    let trail = o.trail.as_deref().unwrap();
    assert!(trail.contains("Repair") && trail.contains("misdelivered=1"), "{trail}");
}
