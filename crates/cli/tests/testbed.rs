//! Integration over the netns testbed: every stack delivers byte-exact,
//! in-order datagrams between two hosts, and eudp's counters match what
//! the programs saw. Needs root (network namespaces), as CI has.

use eudp_cli::bench::{set_worker_exe, transfer};
use eudp_cli::testbed::{unique_name, Testbed};
use eudp_cli::worker::Mode;
use std::process::Command;

use eudp_cli::testbed::is_root;

fn testbed(prefix: &str) -> Option<Testbed> {
    if !is_root() {
        eprintln!("SKIPPED: the testbed needs root (CI runs as root)");
        return None;
    }
    set_worker_exe(env!("CARGO_BIN_EXE_eudp"));
    Some(Testbed::up(&unique_name(prefix)).expect("testbed up"))
}

fn exact(tb: &Testbed, mode: Mode, size: usize, count: u64, v6: bool) {
    let (s, r) = transfer(tb, mode, size, 30.0, count, 16, v6).expect("transfer");
    assert_eq!(s.datagrams, count, "{mode:?} sender");
    assert_eq!(r.corrupt, 0, "{mode:?} {size} B: corrupted payloads");
    assert_eq!(r.reordered, 0, "{mode:?} {size} B: reordered");
    assert_eq!(r.datagrams, count, "{mode:?} {size} B: lost datagrams (paced, should be none): {r:?}");
    if mode == Mode::Eudp {
        let tx = s.eudp.expect("sender stats");
        let rx = r.eudp.expect("receiver stats");
        assert_eq!(tx["datagrams_sent"], count);
        assert_eq!(tx["direct_posts"].as_u64().unwrap() + tx["queued_posts"].as_u64().unwrap(), count);
        assert_eq!(tx["bytes_sent"], count * size as u64);
        assert_eq!(rx["datagrams_received"], count);
        assert_eq!(rx["drop_ring_full"], 0);
    }
}

#[test]
fn every_stack_is_byte_exact_and_ordered_over_veth() {
    let Some(tb) = testbed("ex") else { return };
    for mode in [Mode::Eudp, Mode::Kernel, Mode::Gso, Mode::Mmsg] {
        exact(&tb, mode, 1472, 3000, false);
    }
    // Odd sizes: GSO runs with a size that is not a multiple of anything.
    exact(&tb, Mode::Eudp, 333, 3000, false);
    exact(&tb, Mode::Eudp, 64, 5000, false);
}

#[test]
fn ipv6_over_veth() {
    let Some(tb) = testbed("v6") else { return };
    exact(&tb, Mode::Eudp, 1232, 2000, true);
    exact(&tb, Mode::Gso, 1232, 2000, true);
}

#[test]
fn unpaced_eudp_batches_and_accounts_for_every_datagram() {
    let Some(tb) = testbed("ac") else { return };
    let (s, r) = transfer(&tb, Mode::Eudp, 1472, 1.0, 0, 0, false).expect("transfer");
    let tx = s.eudp.expect("sender stats");
    let rx = r.eudp.expect("receiver stats");
    assert_eq!(r.corrupt + r.reordered, 0);
    // Under load most sends are queued and go out in GSO batches.
    assert!(tx["queued_posts"].as_u64().unwrap() > tx["direct_posts"].as_u64().unwrap(), "{tx}");
    assert!(tx["send_calls_per_datagram"].as_f64().unwrap() < 0.2, "{tx}");
    assert!(tx["gso_messages"].as_u64().unwrap() > 0, "{tx}");
    // Everything the application received was delivered by the ring, and
    // everything the ring dropped was counted: received + dropped <= sent.
    assert_eq!(rx["datagrams_received"].as_u64().unwrap(), r.datagrams);
    assert!(r.datagrams + rx["drop_ring_full"].as_u64().unwrap() <= s.datagrams);
}

#[test]
fn testbed_cli_up_exec_down() {
    if !is_root() {
        eprintln!("SKIPPED: needs root");
        return;
    }
    let exe = env!("CARGO_BIN_EXE_eudp");
    let name = unique_name("cl");
    let ok = |args: &[&str]| Command::new(exe).args(args).status().expect("run eudp").success();
    assert!(ok(&["testbed", "up", &name]));
    let ping = ok(&["testbed", "exec", &name, "--", "ping", "-c", "1", "-W", "2", "198.18.0.2"]);
    let ping_b = ok(&["testbed", "exec", &name, "--host", "b", "--", "ping", "-c", "1", "-W", "2", "198.18.0.1"]);
    assert!(ok(&["testbed", "down", &name]));
    assert!(ping && ping_b, "hosts cannot reach each other");
    // Gone after down.
    let ns = String::from_utf8(Command::new("ip").args(["netns", "list"]).output().unwrap().stdout).unwrap();
    assert!(!ns.contains(&format!("eudp-{name}-")), "{ns}");
    // Bad names are refused clearly.
    assert!(!ok(&["testbed", "up", "bad/name"]));
}

#[test]
fn gso_rejected_by_a_small_mtu_falls_back_without_loss() {
    let Some(tb) = testbed("mt") else { return };
    // 1472-byte segments no longer fit a 1280-byte MTU: the kernel refuses
    // the GSO send (EINVAL); eudp must turn GSO off for the socket and resend
    // the same datagrams as plain (fragmented) ones.
    for h in ['a', 'b'] {
        let ok = Command::new("ip")
            .args(["-n", &tb.netns(h), "link", "set", &tb.veth(h), "mtu", "1280"])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }
    let (s, r) = transfer(&tb, Mode::Eudp, 1472, 30.0, 2000, 64, false).expect("transfer");
    let tx = s.eudp.expect("sender stats");
    assert!(tx["gso_fallbacks"].as_u64().unwrap() >= 1, "{tx}");
    assert_eq!(tx["drop_send_error"], 0, "{tx}");
    assert_eq!(r.corrupt + r.reordered, 0);
    assert_eq!(r.datagrams, 2000, "{r:?}");
}
