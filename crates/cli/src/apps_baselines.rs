//! The rows `eudp bench --apps` sets the unmodified programs against: the
//! library path (`eudp bench`'s eudp mode, the engine linked into the
//! program) and the C AF_XDP ping-pong of `bench/xdp/` (no shim, no
//! engine: the floor a user-space path on this testbed can reach). Both run
//! on the invocation's own testbed, interleaved with the program rows.

use crate::testbed::{Testbed, ADDR_A, ADDR_B};
use crate::worker::Mode;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One `eudp bench` transfer of the eudp mode at `size` (unpaced): what the
/// engine moves for a program that links it.
pub fn library_row(tb: &Testbed, size: usize, secs: u32) -> Value {
    match crate::bench::transfer(tb, Mode::Eudp, size, secs as f64, 0, 0, false) {
        Ok((s, r)) => {
            let m = crate::bench::Rates::of(&s, &r);
            json!({
                "tool": "eudp-bench", "stack": "library", "size": size,
                "received_gbps": m.gbps, "received_pps": m.mpps * 1e6, "lost_percent": m.loss * 100.0,
                "sender_cpu_ns_per_datagram": m.tx_cpu_per_m * 1e3,
                "receiver_cpu_ns_per_datagram": m.rx_cpu_per_m * 1e3,
            })
        }
        Err(e) => json!({"tool": "eudp-bench", "stack": "library", "size": size, "error": e}),
    }
}

/// The source of the C ping-pong: `EUDP_XDP_PINGPONG_SRC`, else the
/// repository's copy.
fn pingpong_source() -> PathBuf {
    std::env::var_os("EUDP_XDP_PINGPONG_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/xdp/xdp_pingpong.c"))
}

/// Compiles the C ping-pong once per invocation into `dir`.
pub fn build_pingpong(dir: &Path) -> Result<PathBuf, String> {
    let src = pingpong_source();
    let bin = dir.join("xdp_pingpong");
    if bin.exists() {
        return Ok(bin);
    }
    let o = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .map_err(|e| format!("gcc: {e}"))?;
    if !o.status.success() {
        return Err(format!("gcc {}: {}", src.display(), String::from_utf8_lossy(&o.stderr).trim()));
    }
    Ok(bin)
}

fn mac_of(tb: &Testbed, host: char) -> Result<String, String> {
    let o = Command::new("ip")
        .args(["-n", &tb.netns(host), "-o", "link", "show", &tb.veth(host)])
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let mut words = text.split_whitespace();
    words.find(|w| *w == "link/ether");
    words.next().map(str::to_string).ok_or_else(|| format!("no MAC for {}", tb.veth(host)))
}

/// One run of the C AF_XDP ping-pong (`--mode xdp` at both ends, `n` timed
/// round trips of 64 B) on the testbed: its client's p50/p99.
pub fn c_floor_row(tb: &Testbed, bin: &Path, n: u32) -> Value {
    c_floor(tb, bin, n).unwrap_or_else(|e| json!({"tool": "xdp_pingpong", "stack": "c-af_xdp", "error": e}))
}

fn c_floor(tb: &Testbed, bin: &Path, n: u32) -> Result<Value, String> {
    let port = "9099";
    let bin = bin.display().to_string();
    let duration = (30 + n / 1000).to_string();
    let err_path = bin.clone() + ".server.err";
    let err = std::fs::File::create(&err_path).map_err(|e| format!("{err_path}: {e}"))?;
    let mut srv = tb
        .command('b', &bin)
        .args(["server", "--mode", "xdp", "--local-ip", ADDR_B, "--ifname", &tb.veth('b'), "--port", port])
        .args(["--duration", &duration])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .map_err(|e| format!("xdp_pingpong server: {e}"))?;
    let t0 = Instant::now();
    let mut said = String::new();
    while t0.elapsed() < Duration::from_secs(5) && srv.try_wait().ok().flatten().is_none() {
        said = std::fs::read_to_string(&err_path).unwrap_or_default();
        if said.contains("READY") {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let result = (|| {
        if !said.contains("READY") {
            return Err(format!("xdp_pingpong server did not start: {}", said.trim()));
        }
        let mac = mac_of(tb, 'b')?;
        let mut cli = tb.command('a', "timeout");
        cli.args([&duration, &bin, "client", "--mode", "xdp", "--local-ip", ADDR_A, "--peer-ip", ADDR_B]).args([
            "--ifname",
            &tb.veth('a'),
            "--peer-mac",
            &mac,
            "--port",
            port,
            "-n",
            &n.to_string(),
        ]);
        let o = cli.output().map_err(|e| format!("xdp_pingpong client: {e}"))?;
        let out = String::from_utf8_lossy(&o.stdout);
        let line = out.lines().rev().find(|l| l.contains("\"role\":\"client\"")).ok_or_else(|| {
            format!("xdp_pingpong client gave no result: {}", String::from_utf8_lossy(&o.stderr).trim())
        })?;
        let c: Value = serde_json::from_str(line).map_err(|e| format!("xdp_pingpong client: {e}"))?;
        Ok(json!({
            "tool": "xdp_pingpong", "stack": "c-af_xdp", "mode": "ping-pong", "size": 64,
            "p50_us": c["p50_us"], "p99_us": c["p99_us"], "completed": c["completed"], "lost": c["lost"],
            "xdp_attach": c["xdp_attach"], "xsk_bind": c["xsk_bind"],
        }))
    })();
    // The client's STOP ends the server; bounded either way.
    let t0 = Instant::now();
    while srv.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = srv.kill();
    let _ = srv.wait();
    // The kernel releases the AF_XDP socket and program a moment after exit.
    std::thread::sleep(Duration::from_millis(300));
    result
}

/// `/proc/loadavg` as it reads (every figure of a run on a shared host is
/// read beside it).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg").unwrap_or_default().trim().to_string()
}

pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// Median of the values `key` takes in the rows `f` selects.
pub fn median_of(rows: &[Value], f: &dyn Fn(&Value) -> bool, key: &str) -> Option<f64> {
    let mut v: Vec<f64> = rows.iter().filter(|r| f(r)).filter_map(|r| r[key].as_f64()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 { v[m] } else { (v[m - 1] + v[m]) / 2.0 })
}

/// The targets that set the programs against the library path and the C
/// floor (medians over the repeats of one invocation).
pub fn side_by_side_targets(rows: &[Value]) -> Vec<Value> {
    let library = |size: u64| move |r: &Value| r["tool"] == "eudp-bench" && r["size"] == size;
    let iperf = |s: &'static str| move |r: &Value| r["tool"] == "iperf3" && r["reverse"] == false && r["stack"] == s;
    let sp = |mode: &'static str, s: &'static str| {
        move |r: &Value| r["tool"] == "sockperf" && r["mode"] == mode && r["client"] == s
    };
    let floor = |r: &Value| r["tool"] == "xdp_pingpong";

    let lib_gbps = median_of(rows, &library(1472), "received_gbps");
    let e_gbps = median_of(rows, &iperf("eudp-throughput"), "received_gbps");
    let k_gbps = median_of(rows, &iperf("kernel"), "received_gbps");
    let (kl, el) =
        (median_of(rows, &iperf("kernel"), "lost_percent"), median_of(rows, &iperf("eudp-throughput"), "lost_percent"));
    let x = ratio(e_gbps, lib_gbps);
    let iperf3 = json!({
        "target": "iperf3 -u -l 1472 -b 0 under eudp run --profile throughput: received >= 0.8x the library path (eudp bench, eudp mode, 1472 B), loss <= kernel's",
        "ratio": x,
        "measured": {"eudp_gbps": e_gbps, "library_gbps": lib_gbps, "kernel_gbps": k_gbps,
                     "eudp_over_kernel": ratio(e_gbps, k_gbps), "loss_eudp_percent": el, "loss_kernel_percent": kl},
        "met": x.is_some_and(|x| x >= 0.8) && matches!((el, kl), (Some(e), Some(k)) if e <= k),
    });

    let lib_pps = median_of(rows, &library(64), "received_pps");
    let e_rate = median_of(rows, &sp("throughput", "eudp-throughput"), "received_rate");
    let x = ratio(e_rate, lib_pps);
    let sockperf = json!({
        "target": "sockperf throughput 64 B under eudp run: received >= 0.8x the library path's Mpps (eudp bench, eudp mode, 64 B)",
        "ratio": x,
        "measured": {"eudp_mpps": e_rate.map(|r| r / 1e6), "library_mpps": lib_pps.map(|r| r / 1e6),
                     "kernel_mpps": median_of(rows, &sp("throughput", "kernel"), "received_rate").map(|r| r / 1e6)},
        "met": x.is_some_and(|x| x >= 0.8),
    });

    let (c50, c99) = (median_of(rows, &floor, "p50_us"), median_of(rows, &floor, "p99_us"));
    let (l50, l99) = (
        median_of(rows, &sp("ping-pong", "eudp-xdp-latency"), "p50_us"),
        median_of(rows, &sp("ping-pong", "eudp-xdp-latency"), "p99_us"),
    );
    let (k50, k99) =
        (median_of(rows, &sp("ping-pong", "kernel"), "p50_us"), median_of(rows, &sp("ping-pong", "kernel"), "p99_us"));
    // sockperf reports half the round trip; the C ping-pong the whole one.
    let l50_round_trip = l50.map(|v| 2.0 * v);
    let x50 = ratio(l50_round_trip, c50);
    let x99 = ratio(l99, k99);
    vec![
        iperf3,
        sockperf,
        json!({
            "target": "sockperf ping-pong 64 B, xdp transport + latency profile: round-trip p50 <= 1.3x the C AF_XDP ping-pong's round-trip p50",
            "ratio": x50,
            "measured": {"eudp_p50_us": l50, "eudp_round_trip_p50_us": l50_round_trip, "c_floor_round_trip_p50_us": c50,
                         "c_floor_round_trip_p99_us": c99, "kernel_p50_us": k50,
                         "c_floor_over_kernel_round_trip_p50": ratio(c50, k50.map(|v| 2.0 * v))},
            "met": x50.is_some_and(|x| x <= 1.3),
        }),
        json!({
            "target": "sockperf ping-pong 64 B, xdp transport + latency profile: p99 <= kernel p99",
            "ratio": x99,
            "measured": {"eudp_p99_us": l99, "kernel_p99_us": k99},
            "met": x99.is_some_and(|x| x <= 1.0),
        }),
    ]
}
