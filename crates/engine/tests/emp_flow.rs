//! The EMP flow state machines over a simulated channel: exactly-once,
//! in-order delivery under loss, duplication and reordering; a dead peer
//! times out within the deadline; the send queue stays bounded.

mod emp_sim;

use emp_sim::{run, Impairment, Outcome};
use eudp_engine::emp::config::EmpConfig;
use eudp_engine::emp::flow::send::{SendError, SendFlow};
use proptest::prelude::*;
use std::time::{Duration, Instant};

fn small() -> EmpConfig {
    EmpConfig {
        frame_payload: 64,
        window: 16,
        ack_group: 4,
        rto_initial: Duration::from_millis(1),
        rto_max: Duration::from_millis(8),
        deadline: Duration::from_secs(1000),
        send_queue_bytes: 4096,
        ..EmpConfig::default()
    }
}

/// Every message delivered once, in order, intact, acknowledged; every data
/// frame sent is accounted for.
fn check(o: &Outcome, messages: usize) {
    assert_eq!(o.sent.len(), messages, "all queued");
    assert_eq!(o.delivered.len(), messages, "all delivered once");
    assert!(o.delivered == o.sent, "delivered in order with intact bytes");
    assert_eq!(o.done.len(), messages);
    assert!(o.done.iter().all(|d| d.result.is_ok()));
    assert!(o.done.iter().enumerate().all(|(i, d)| d.token == i as u64), "completions in order");
    let r = o.receiver;
    let arrived = r.accepted + r.duplicates + r.gaps + r.unmatched + r.stale;
    assert_eq!(o.sender.frames_sent + o.data_duplicated, arrived + o.data_lost, "{o:?}");
}

#[test]
fn clean_channel_delivers_in_order() {
    let o = run(&small(), 1, Impairment::NONE, 200, 500, false, Duration::from_secs(60));
    check(&o, 200);
    assert_eq!(o.sender.retransmits, 0);
    assert_eq!(o.receiver.gaps + o.receiver.duplicates, 0);
}

#[test]
fn heavy_impairment_still_delivers_exactly_once() {
    let imp = Impairment { loss: 30, duplicate: 30, reorder: 40, unmatched: 20 };
    let o = run(&small(), 7, imp, 150, 400, false, Duration::from_secs(600));
    check(&o, 150);
    assert!(o.sender.retransmits > 0 && o.receiver.naks_sent > 0 && o.receiver.duplicates > 0);
}

#[test]
fn empty_and_single_frame_messages() {
    let o = run(
        &small(),
        3,
        Impairment { loss: 10, duplicate: 10, reorder: 10, unmatched: 0 },
        100,
        64,
        false,
        Duration::from_secs(60),
    );
    check(&o, 100);
    assert!(o.sent.iter().any(|(_, m)| m.is_empty()));
}

#[test]
fn a_dead_peer_times_out_within_the_deadline() {
    let cfg = EmpConfig { deadline: Duration::from_millis(200), ..small() };
    let o = run(&cfg, 5, Impairment::NONE, 3, 300, true, Duration::from_secs(10));
    assert_eq!(o.done.len(), 3);
    assert!(o.done.iter().all(|d| d.result == Err(SendError::TimedOut)));
    assert!(o.elapsed <= cfg.deadline + cfg.rto_max, "gave up after {:?}", o.elapsed);
    assert_eq!(o.sender.give_ups, 1);
}

#[test]
fn the_queue_refuses_past_its_bound() {
    let now = Instant::now();
    let mut s = SendFlow::new(&small(), 1, now);
    let mut n = 0;
    while s.queue(0, vec![0; 1000], n).is_ok() {
        n += 1;
        assert!(n < 100, "the queue never refuses");
    }
    assert_eq!(n, 4);
    assert!(s.queued_bytes() <= 4096);
    // One message above the bound goes alone into an empty flow.
    let mut lone = SendFlow::new(&small(), 1, now);
    assert!(lone.queue(0, vec![0; 10_000], 0).is_ok());
    assert!(lone.queue(0, vec![0; 1], 1).is_err());
}

#[test]
fn traces_record_both_sides() {
    let (s, r) = emp_sim::traces(11);
    assert!(!s.is_empty() && !r.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn any_seed_and_rates_deliver_exactly_once(seed in any::<u64>(), loss in 0u32..35, dup in 0u32..35, reorder in 0u32..50, unmatched in 0u32..30) {
        let o = run(&small(), seed, Impairment { loss, duplicate: dup, reorder, unmatched }, 60, 300, false, Duration::from_secs(600));
        check(&o, 60);
    }
}

/// The flows' recorded traces under loss, duplication, reordering and
/// unmatched first frames are what the transition table allows: the code
/// and the model `eudp verify` checks are the same protocol.
#[test]
fn traces_conform_to_the_transition_table() {
    use eudp_engine::emp::event::FlowEvent;
    use eudp_engine::emp::table::{check_receiver_trace, check_sender_trace, Params};
    for seed in [1u64, 11, 42, 7_777, 123_456] {
        let (s, r) = emp_sim::traces(seed);
        let first_seq = match s.first() {
            Some(FlowEvent::SendNew { seq }) => *seq,
            other => panic!("a sender's trace starts with its first frame, not {other:?}"),
        };
        let params = Params { window: 8, ack_group: 3, first_seq };
        if let Err(v) = check_sender_trace(&s, &params) {
            panic!("seed {seed}: sender trace leaves the table: {v:?}");
        }
        if let Err(v) = check_receiver_trace(&r, &params) {
            panic!("seed {seed}: receiver trace leaves the table: {v:?}");
        }
    }
}
