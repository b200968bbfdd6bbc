//! The impairment testbed: the relay between hosts a and b forwards
//! everything at loss 0, and its counts of duplicated and held-back UDP
//! frames match what a receiver in b observes exactly; the nftables loss
//! rule's counter matches the datagrams that never arrived. Counts only,
//! no timings.

use eudp_cli::impair::{nft_dropped, nft_loss, ImpairBed, Summary, IMP_B};
use eudp_cli::testbed::{is_root, unique_name};
use eudp_cli::worker::Report;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");
const SENT: u64 = 2_000;

fn bed() -> Option<ImpairBed> {
    if !is_root() {
        eprintln!("skipped: network namespaces need root");
        return None;
    }
    match ImpairBed::up(&unique_name("imp")) {
        Ok(b) => Some(b),
        Err(e) if e.contains("netns add") => {
            eprintln!("skipped: network namespaces are unavailable: {e}");
            None
        }
        Err(e) => panic!("impairment topology: {e}"),
    }
}

/// Sends SENT numbered 64-byte datagrams from a to b, paced so neither
/// socket buffer overflows; returns the receiver's report.
fn transfer(bed: &ImpairBed, port: u16) -> Report {
    let dst = format!("{IMP_B}:{port}");
    let mut rx = bed
        .command('b', EUDP)
        .args(["worker", "recv", "--mode", "kernel", "--bind", &dst, "--size", "64"])
        .args(["--idle-ms", "400", "--max-secs", "15"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("receiver");
    let mut out = BufReader::new(rx.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready");
    let st = bed
        .command('a', EUDP)
        .args(["worker", "send", "--mode", "kernel", "--dst", &dst, "--size", "64"])
        .args(["--count", &SENT.to_string(), "--pace-every", "20", "--secs", "15"])
        .stdout(Stdio::null())
        .status()
        .expect("sender");
    assert!(st.success());
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(rx.wait().unwrap().success());
    serde_json::from_str(line.trim()).expect("receiver report")
}

fn relayed(impair: &[&str], port: u16) -> Option<(Report, Summary)> {
    let mut bed = bed()?;
    bed.start_relay(EUDP, impair).expect("relay");
    let r = transfer(&bed, port);
    let s = bed.stop_relay().expect("relay summary");
    assert_eq!(s.ended_by, "signal");
    Some((r, s))
}

#[test]
fn relay_at_loss_zero_delivers_everything_in_order() {
    let Some((r, s)) = relayed(&["--seed", "1"], 40_001) else { return };
    let d = &s.left_to_right;
    assert_eq!((r.datagrams, r.reordered, r.corrupt, r.seq_span), (SENT, 0, 0, SENT), "{r:?}");
    assert_eq!((d.udp, d.dropped, d.duplicated, d.reordered, d.send_errors), (SENT, 0, 0, 0, 0), "{s:?}");
    assert_eq!(d.forwarded, d.frames, "{s:?}");
}

#[test]
fn relay_drops_and_duplicates_as_it_counts() {
    let Some((r, s)) = relayed(&["--dup", "10", "--loss", "5", "--seed", "2"], 40_002) else { return };
    let d = &s.left_to_right;
    assert_eq!(d.udp, SENT, "{s:?}");
    assert_eq!(r.datagrams, SENT - d.dropped + d.duplicated, "receiver {r:?}, relay {s:?}");
    assert!((SENT / 20..SENT * 3 / 20).contains(&d.duplicated), "{s:?}");
    assert!((SENT / 50..SENT / 10).contains(&d.dropped), "{s:?}");
    assert_eq!((r.corrupt, d.reordered, d.send_errors), (0, 0, 0));
}

#[test]
fn relay_reorders_as_it_counts() {
    let Some((r, s)) = relayed(&["--reorder", "10", "--reorder-depth", "3", "--seed", "3"], 40_003) else {
        return;
    };
    let d = &s.left_to_right;
    assert_eq!((r.datagrams, r.seq_span, r.corrupt), (SENT, SENT, 0), "{r:?}");
    assert!(d.reordered > SENT / 20, "{s:?}");
    assert_eq!(r.reordered, d.reordered, "receiver {r:?}, relay {s:?}");
}

#[test]
fn nftables_loss_rule_counts_what_it_drops() {
    let Some(mut bed) = bed() else { return };
    bed.start_relay(EUDP, &[]).expect("relay");
    nft_loss(&bed.netns('b'), 10).expect("nft loss rule (scripts/deps.sh test installs nftables)");
    let r = transfer(&bed, 40_004);
    let dropped = nft_dropped(&bed.netns('b')).expect("nft counter");
    assert!((SENT / 25..SENT / 5).contains(&dropped), "nft dropped {dropped}");
    assert_eq!(r.datagrams, SENT - dropped, "{r:?}");
    let s = bed.stop_relay().expect("relay summary");
    assert_eq!(s.left_to_right.udp, SENT);
}
