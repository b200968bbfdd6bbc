//! Sampled tracing (this test binary is its own process: tracing state is
//! global): the kernel stamps only the messages that carry a sampled
//! datagram, every such message has both its stamps under the key the
//! engine gave it, sending unsampled datagrams reads no error queue, and a
//! sampled run of datagrams stamps only the few messages that carry it.

mod common;

use eudp_engine::tracepoint::{self as tp, Kind};
use eudp_engine::{Config, Engine};
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

const SAMPLE: u64 = 8;
/// Cycles of SAMPLE runs of single datagrams, each sent alone (a direct
/// post): the first run of each cycle is sampled.
const CYCLES: u64 = 2;
/// Then bursts, which the engine or the sending thread batches into GSO
/// messages.
const BURSTS: u64 = 10;
const PER_BURST: u64 = 200;

#[test]
fn only_sampled_datagrams_are_stamped_and_unsampled_ones_read_no_error_queue() {
    tp::reset();
    tp::set_sample(SAMPLE);
    tp::set_capacity(1 << 18);
    tp::enable();
    let e = Engine::start(Config::default()).expect("engine");
    let (a, b, dst) = common::loopback_pair(&e);
    let mut buf = [0u8; 2048];
    let data = [5u8; 256];

    // Singles: each waits for its receipt, so each is its own kernel
    // message. Send seqs 0 .. SAMPLE_RUN, then every SAMPLE-th run of
    // SAMPLE_RUN, are sampled; the reads made while the SAMPLE - 1
    // unsampled runs after each go out are counted.
    let run = tp::SAMPLE_RUN;
    let mut unsampled_reads = 0;
    let mut all_reads = 0;
    for _ in 0..CYCLES {
        for _ in 0..run {
            a.send_to(&data, dst).unwrap();
            b.recv(&mut buf).expect("sampled single arrives");
        }
        // Take the sampled messages' stamps now (the kernel queues them
        // during the send call on loopback), after the engine's wake-ups
        // for them had time to pass (each stamp can wake it).
        std::thread::sleep(Duration::from_millis(20));
        a.drain_trace();
        let before = a.tx_stamp_reads();
        for _ in run..run * SAMPLE {
            a.send_to(&data, dst).unwrap();
            b.recv(&mut buf).expect("unsampled single arrives");
        }
        let after = a.tx_stamp_reads();
        unsampled_reads += after.after_send - before.after_send;
        all_reads += after.total - before.total;
    }
    // The sending thread never reads after an unsampled send. The engine
    // may read on a late wake-up that the sampled message's two stamps
    // caused (each can wake it) and that found them gone (taken by
    // `drain_trace`): at most two per cycle.
    assert_eq!(unsampled_reads, 0, "error-queue reads after unsampled sends");
    assert!(all_reads <= 2 * CYCLES, "{all_reads} error-queue reads while only unsampled datagrams were sent");
    let singles_sent = a.stats().send_calls;

    for _ in 0..BURSTS {
        for _ in 0..PER_BURST {
            a.send_to(&data, dst).unwrap();
        }
        assert!(a.flush(Duration::from_secs(5)));
        for _ in 0..PER_BURST {
            b.recv(&mut buf).expect("burst datagram arrives");
        }
    }
    let gso = a.stats().gso_messages;
    drop(a);
    tp::disable();
    let ev = tp::events();
    e.shutdown(Duration::from_secs(1));

    let singles = CYCLES * run * SAMPLE;
    let total = singles + BURSTS * PER_BURST;
    let sender = ev.iter().find(|x| x.kind == Kind::SendCall as u8).expect("a traced send").ep;
    let of = |k: Kind| ev.iter().filter(move |x| x.kind == k as u8 && x.ep == sender);
    // Traced send calls: exactly the sampled send seqs. L1 index -> seq of
    // the queued ones.
    let seqs: BTreeSet<u64> = of(Kind::SendCall).map(|x| x.extra).collect();
    assert_eq!(seqs, (0..total).filter(|&s| tp::is_sampled(s, SAMPLE)).collect::<BTreeSet<u64>>());
    let queued: HashMap<u64, u64> = of(Kind::SendCall)
        .filter_map(|x| {
            let (q, _, direct) = tp::unpack_send_ref(x.b);
            (!direct).then_some((q, x.extra))
        })
        .collect();
    // Every kernel message the engine numbered carries a sampled datagram,
    // and every sampled datagram is in one of them.
    let mut covered = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let mut burst_msgs = 0;
    for m in of(Kind::KMsg) {
        let (first, count, direct) = tp::unpack_msg_ref(m.b);
        let sampled: Vec<u64> = if direct {
            vec![first].into_iter().filter(|&s| tp::is_sampled(s, SAMPLE)).collect()
        } else {
            (first..first + count).filter_map(|q| queued.get(&q).copied()).collect()
        };
        assert!(!sampled.is_empty(), "kernel message {} ({m:?}) carries no sampled datagram", m.a);
        burst_msgs += usize::from(sampled[0] >= singles);
        covered.extend(sampled);
        keys.insert(m.a);
    }
    assert_eq!(covered, seqs, "sampled datagrams without a stamped kernel message");
    // The engine's numbering is the kernel's OPT_ID keys: consecutive from
    // 0, and both stamps came back for each key and for no other.
    let n = keys.len() as u64;
    assert_eq!(keys, (0..n).collect::<BTreeSet<u64>>());
    let stamps = |k: Kind| of(k).map(|x| x.a).collect::<BTreeSet<u64>>();
    assert_eq!(stamps(Kind::TxSched), keys, "TX_SCHED keys");
    assert_eq!(stamps(Kind::TxSoft), keys, "TX_SOFTWARE keys");
    // Fewer stamped messages than the singles alone were messages: the
    // unsampled singles were not stamped.
    assert!(n <= seqs.len() as u64, "{n} stamped messages for {} sampled datagrams", seqs.len());
    assert!(singles_sent >= singles, "{singles_sent} send calls for the singles");
    // In the bursts a sampled run lies in a few GSO messages (a direct
    // post, then at most two of L1's), not one message in every SAMPLE
    // datagrams' worth.
    let burst_runs = (seqs.iter().filter(|&&s| s >= singles).count() as u64).div_ceil(run) as usize;
    assert!(burst_msgs <= 3 * burst_runs, "{burst_msgs} stamped messages for {burst_runs} sampled runs in the bursts");
    eprintln!("{total} datagrams, {} sampled, {n} stamped kernel messages, {gso} GSO messages", seqs.len());
}
