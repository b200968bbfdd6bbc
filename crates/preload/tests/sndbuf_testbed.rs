//! Sends that find the send buffer full (`tests/c/udp_sndbuf.c`), on the
//! netns testbed: loopback frees a datagram's buffer as it is delivered,
//! so only a link that holds packets makes a UDP send wait. Host `a`'s
//! veth gets a slow token bucket (each 1000-byte datagram takes about
//! 200 ms to leave, and stays charged to its socket until then); each case
//! runs on the kernel and under the shim, with the qdisc made afresh
//! before each run, and must print the same lines. Needs root (network
//! namespaces) and the `eudp` binary (`cargo build --release -p eudp-cli`);
//! skipped without them.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

struct Testbed {
    eudp: PathBuf,
    name: String,
}

impl Testbed {
    fn up() -> Option<Testbed> {
        let root = std::fs::read_to_string("/proc/self/status")
            .map(|s| s.lines().any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false);
        let eudp = lib().parent().unwrap().join("eudp");
        if !root || !eudp.exists() {
            eprintln!("SKIPPED: needs root and {}", eudp.display());
            return None;
        }
        // One testbed per test: the tests of this file run at once.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("sb{:x}{n}", std::process::id() & 0xfffff);
        let st = Command::new(&eudp).args(["testbed", "up", &name]).status().unwrap();
        assert!(st.success(), "testbed up");
        Some(Testbed { eudp, name })
    }

    fn ns(&self) -> String {
        format!("eudp-{}-a", self.name)
    }

    /// A fresh slow qdisc on host `a`'s veth: nothing queued from an
    /// earlier run holds the next one's sends.
    fn slow_link(&self) {
        let dev = format!("eu{}a", self.name);
        let tc = |args: &[&str]| {
            Command::new("ip").args(["netns", "exec", &self.ns(), "tc", "qdisc"]).args(args).output().unwrap()
        };
        let _ = tc(&["del", "dev", &dev, "root"]);
        let o = tc(&["add", "dev", &dev, "root", "tbf", "rate", "40kbit", "burst", "1600", "limit", "1000000"]);
        assert!(o.status.success(), "tc: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// Runs `exe case dst` on host `a`, under the shim when `stats` is given.
    fn run(&self, exe: &std::path::Path, case: &str, dst: &str, stats: Option<&std::path::Path>) -> String {
        self.slow_link();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.ns(), "env"]);
        if let Some(d) = stats {
            c.arg(format!("LD_PRELOAD={}", lib().display()));
            c.arg(format!("EUDP_STAT_DIR={}", d.display()));
            c.arg("EUDP_STAT_MS=200");
        }
        let o = c.arg(exe).args([case, dst]).output().unwrap();
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let who = if stats.is_some() { "under the shim" } else { "on the kernel" };
        assert!(o.status.success(), "{case} {dst} {who}: {out}{}", String::from_utf8_lossy(&o.stderr));
        out
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = Command::new(&self.eudp).args(["testbed", "down", &self.name]).status();
    }
}

#[test]
fn full_send_buffer_matches_the_kernel() {
    let Some(tb) = Testbed::up() else { return };
    let exe = cc("udp_sndbuf", &[]);
    let mut failed = Vec::new();
    for dst in ["198.18.0.2", "2001:2::2"] {
        for case in ["sndtimeo", "block", "nonblock", "epoll", "epoll_et"] {
            let kernel = tb.run(&exe, case, dst, None);
            assert!(kernel.contains(&format!("OK {case}")), "{case}: {kernel}");
            let stats = stat_dir(&format!("sndbuf-{case}"));
            let shim = tb.run(&exe, case, dst, Some(&stats));
            let r = reports(&stats);
            let _ = std::fs::remove_dir_all(&stats);
            if shim != kernel {
                failed.push(format!("{case} {dst}: output differs\n--- kernel\n{kernel}--- shim\n{shim}"));
            } else if r.iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum::<u64>() == 0 {
                failed.push(format!("{case} {dst}: no socket ran on the engine: {r:?}"));
            }
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// A fallback whose flush runs out of time (`EUDP_TEST_FLUSH_MS=0`: it
/// gives up at once while the slow link has taken only part of a burst):
/// the endpoint's drop then sends what it can within its own bound and
/// counts the rest (`drop_shutdown`), and the socket's final entry has
/// those counts: sent + drop_shutdown = every datagram the program sent.
/// With the entry taken at the flush's timeout, what the drop sent was
/// missing (17 of 32 in the entry).
#[test]
fn a_fallback_whose_flush_times_out_reports_what_its_drop_sent_or_dropped() {
    let Some(tb) = Testbed::up() else { return };
    let exe = cc("fallback_flush", &[]);
    let dir = stat_dir("fbflush");
    tb.slow_link();
    let o = Command::new("ip")
        .args(["netns", "exec", &tb.ns(), "env", "EUDP_TEST_FLUSH_MS=0", "EUDP_STAT_MS=200"])
        .arg(format!("LD_PRELOAD={}", lib().display()))
        .arg(format!("EUDP_STAT_DIR={}", dir.display()))
        .arg(&exe)
        .args(["198.18.0.2", "9", "200"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(o.status.success(), "{text}{}", String::from_utf8_lossy(&o.stderr));
    let sent: u64 = text.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("sent");
    let reps = reports(&dir);
    let entries: Vec<&serde_json::Value> =
        reps.iter().flat_map(|r| r["closed"].as_array().into_iter().flatten()).collect();
    let count = |k: &str| entries.iter().map(|e| e["stats"][k].as_u64().unwrap_or(0)).sum::<u64>();
    println!("sent {sent}: entries count {} sent, {} drop_shutdown", count("datagrams_sent"), count("drop_shutdown"));
    assert_eq!(count("datagrams_sent") + count("drop_shutdown"), sent, "{}", serde_json::to_string(&entries).unwrap());
    let _ = std::fs::remove_dir_all(&dir);
}
