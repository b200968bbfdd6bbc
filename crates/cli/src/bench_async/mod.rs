//! `eudp bench --async`: copying sends against asynchronous zero-copy sends
//! (paper 001's kernel UDP against Asynchronous UDP), and the asynchronous
//! receiver against a `recvmmsg` loop.
//!
//! The send columns are the same [`eudp_engine::async_udp::AsyncSender`]
//! with GSO on: copying, with `MSG_ZEROCOPY`, and with io_uring `SEND_ZC`
//! from registered buffers, so that they differ in how the payload reaches
//! the kernel alone. Per payload size (1472 B, 16 KiB, 64 KiB by default)
//! and path (loopback; the testbed's veth pair when run as root) they run
//! back to back: throughput at the receiver, CPU per byte of the sending
//! thread and of the whole process, and the fraction of sends the kernel
//! really did without copying (its notifications' copied flag). The
//! receiver rows are in [`recv`]. The JSON schema is in docs/bench.md.

mod copy_block;
mod measure;
mod recv;
mod sys;
mod xdp_copy;

use crate::testbed::{is_root, unique_name, Testbed, ADDR_A, ADDR_B};
use measure::{transfer, Ends, Sample, SendMode};
use serde_json::{json, Value};
use std::path::PathBuf;

/// The parts of `eudp bench --async`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AsyncPart {
    /// Copying against zero-copy sends.
    Send,
    /// The asynchronous receiver against a `recvmmsg` loop.
    Recv,
    /// The copy block alone: cached against non-temporal stores into rotating frames.
    Copy,
    /// The copy block inside xdp transfers on the testbed (root).
    Xdp,
}

/// What `eudp bench --async` runs.
pub struct AsyncBenchArgs {
    /// Seconds per transfer.
    pub secs: f64,
    /// Payload sizes in bytes.
    pub sizes: Vec<usize>,
    pub parts: Vec<AsyncPart>,
    /// The receiver rows to run (`loopback-gro`, `loopback-nogro`,
    /// `testbed-veth-gro`, `testbed-veth-nogro`); empty: all.
    pub recv_rows: Vec<String>,
    pub out_dir: Option<PathBuf>,
}

/// The sizes paper 001 §5.3 contrasts: one Ethernet frame, 16 KiB, and the
/// largest UDP payload.
pub const DEFAULT_SIZES: [usize; 3] = [1472, 16 * 1024, 65_507];

fn per_byte_ns(cpu: std::time::Duration, bytes: u64) -> Option<f64> {
    (bytes > 0).then(|| cpu.as_nanos() as f64 / bytes as f64)
}

fn sample_json(s: &Sample) -> Value {
    let gbps = |b: u64| if s.secs > 0.0 { b as f64 * 8.0 / s.secs / 1e9 } else { 0.0 };
    json!({
        "zerocopy_in_use": s.zerocopy,
        "secs": s.secs,
        "sent_datagrams": s.sent_datagrams,
        "sent_bytes": s.sent_bytes,
        "received_bytes": s.received_bytes,
        "sent_gbps": gbps(s.sent_bytes),
        "received_gbps": gbps(s.received_bytes),
        "failed": s.failed,
        "failed_by_error": s.errors.iter().map(|(e, n)| (std::io::Error::from_raw_os_error(*e).to_string(), json!(n))).collect::<serde_json::Map<_, _>>(),
        "zero_copy_fraction": if s.sent_datagrams > 0 { s.zero_copied as f64 / s.sent_datagrams as f64 } else { 0.0 },
        "sender_cpu_ns_per_byte": per_byte_ns(s.sender_cpu, s.sent_bytes),
        "process_cpu_ns_per_byte": per_byte_ns(s.process_cpu, s.received_bytes),
    })
}

fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

/// `a` against `c`, key by key.
fn over(a: &Value, c: &Value) -> Value {
    let f = |v: &Value, k: &str| v[k].as_f64();
    let r = |k: &str| ratio(f(a, k), f(c, k));
    json!({
        "received_gbps": r("received_gbps"),
        "sender_cpu_ns_per_byte": r("sender_cpu_ns_per_byte"),
        "process_cpu_ns_per_byte": r("process_cpu_ns_per_byte"),
    })
}

fn row(path: &str, size: usize, copy: &Sample, zc: &Sample, uring: Result<Sample, String>) -> Value {
    let c = sample_json(copy);
    let z = sample_json(zc);
    let mut row = json!({
        "path": path,
        "size": size,
        "copy": c,
        "zerocopy": z,
        "zerocopy_over_copy": over(&z, &c),
    });
    match uring {
        Ok(u) => {
            let u = sample_json(&u);
            row["uring_fixed_over_copy"] = over(&u, &c);
            row["uring_fixed"] = u;
        }
        Err(e) => row["uring_fixed"] = json!({ "error": e }),
    }
    row
}

fn measure_path(path: &str, ends: &Ends, args: &AsyncBenchArgs, rows: &mut Vec<Value>) {
    for &size in &args.sizes {
        let copy = transfer(ends, size, SendMode::Copy, args.secs);
        let zc = transfer(ends, size, SendMode::MsgZerocopy, args.secs);
        let uring = transfer(ends, size, SendMode::UringFixed, args.secs);
        match (copy, zc) {
            (Ok(c), Ok(z)) => rows.push(row(path, size, &c, &z, uring)),
            (c, z) => {
                let error = [c.err(), z.err()].into_iter().flatten().collect::<Vec<_>>().join("; ");
                rows.push(json!({ "path": path, "size": size, "error": error }));
            }
        }
    }
}

/// Runs the chosen parts; writes `async-<unix time>.json` under `out_dir`.
pub fn run(args: &AsyncBenchArgs) -> Result<Value, String> {
    let started_unix = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let part = |p: AsyncPart| args.parts.contains(&p);
    let known: Vec<String> =
        ["loopback", "testbed-veth"].iter().flat_map(|p| [true, false].map(|g| recv::row_name(p, g))).collect();
    if let Some(bad) = args.recv_rows.iter().find(|r| !known.contains(r)) {
        return Err(format!("unknown receiver row {bad:?} (known: {})", known.join(", ")));
    }
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let mut rows = Vec::new();
    let lo = "127.0.0.1".parse().expect("loopback address");
    let loopback = Ends { sender_ns: None, receiver_ns: None, sender_ip: lo, receiver_ip: lo };
    if part(AsyncPart::Send) {
        measure_path("loopback", &loopback, args, &mut rows);
    }
    let mut notes = vec![
        "copy, zerocopy and uring_fixed are the same AsyncSender (GSO on): copying, MSG_ZEROCOPY, and io_uring SEND_ZC/SENDMSG_ZC from registered buffers, run back to back"
            .to_string(),
        "receiver: AsyncReceiver (multishot io_uring receive, datagrams lent in place) against a recvmmsg loop, the same number of buffers each, both with and without UDP_GRO, fed by one copying GSO sender over loopback and the testbed; CPU and system calls are the receiving thread's; the sender's rate bounds the receiver's".to_string(),
        "process CPU covers sender and receiver threads and the kernel's work in their context".to_string(),
        "copy_block: the fused copy-and-checksum into rotating frames (8 MiB of 2 KiB frames, the xdp UMEM at MTU 1500, and 64 MiB of 4 KiB frames), cached vs non-temporal stores, thread CPU time, median of 5 interleaved rounds".to_string(),
        "xdp_copy: eudp bench's xdp mode on the testbed with EUDP_XDP_COPY=cached and =nontemporal beside kernel UDP, 3 interleaved rounds, medians; sender CPU is the sending process's".to_string(),
    ];
    let mut paths = vec![("loopback", loopback)];
    // Torn down when it drops, after the receiver rows.
    let tb = if is_root() { Some(Testbed::up(&unique_name("as"))?) } else { None };
    let mut xdp = Value::Null;
    if let Some(tb) = &tb {
        let ends = Ends {
            sender_ns: Some(tb.netns('a')),
            receiver_ns: Some(tb.netns('b')),
            sender_ip: ADDR_A.parse().expect("testbed address"),
            receiver_ip: ADDR_B.parse().expect("testbed address"),
        };
        if part(AsyncPart::Send) {
            measure_path("testbed-veth", &ends, args, &mut rows);
        }
        paths.push(("testbed-veth", ends));
        if part(AsyncPart::Xdp) {
            xdp = Value::Array(xdp_copy::measure(tb, args.secs));
        }
    } else {
        notes.push("testbed rows skipped: not root".to_string());
    }
    let receiver = if part(AsyncPart::Recv) { recv::measure(&paths, args.secs, &args.recv_rows) } else { Value::Null };
    drop(tb);
    let copy_block = if part(AsyncPart::Copy) { Value::Array(copy_block::measure()) } else { Value::Null };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let res = json!({
        "schema": "eudp-bench-async/2",
        "bench": "async",
        "started_unix": started_unix,
        "secs_per_transfer": args.secs,
        "parts": args.parts.iter().map(|p| format!("{p:?}").to_lowercase()).collect::<Vec<_>>(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "loadavg_before": load_before.trim(),
        "loadavg_at_end": load.trim(),
        "notes": notes,
        "rows": rows,
        "receiver": receiver,
        "copy_block": copy_block,
        "xdp_copy": xdp,
    });
    if let Some(dir) = &args.out_dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join(format!("async-{started_unix}.json"));
        let text = serde_json::to_string_pretty(&res).map_err(|e| e.to_string())?;
        std::fs::write(&path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    Ok(res)
}

/// The result as a text table, one line per path and size.
pub fn table(res: &Value) -> String {
    let sends = res["rows"].as_array().is_some_and(|r| !r.is_empty());
    let mut out = if !sends {
        String::new()
    } else {
        format!(
            "{:<13} {:>6} {:>9} {:>9} {:>9} {:>10} {:>10} {:>10} {:>10} {:>10} {:>6}\n",
            "path",
            "size",
            "copy Gb/s",
            "zc Gb/s",
            "uzc Gb/s",
            "copy ns/B",
            "zc ns/B",
            "uzc ns/B",
            "copy p/B",
            "zc p/B",
            "zc %"
        )
    };
    for r in res["rows"].as_array().into_iter().flatten() {
        let path = r["path"].as_str().unwrap_or("?");
        let size = r["size"].as_u64().unwrap_or(0);
        if let Some(e) = r["error"].as_str() {
            out += &format!("{path:<13} {size:>6} error: {e}\n");
            continue;
        }
        let g = |m: &str, k: &str| r[m][k].as_f64().unwrap_or(f64::NAN);
        out += &format!(
            "{path:<13} {size:>6} {:>9.2} {:>9.2} {:>9.2} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>5.0}%\n",
            g("copy", "received_gbps"),
            g("zerocopy", "received_gbps"),
            g("uring_fixed", "received_gbps"),
            g("copy", "sender_cpu_ns_per_byte"),
            g("zerocopy", "sender_cpu_ns_per_byte"),
            g("uring_fixed", "sender_cpu_ns_per_byte"),
            g("copy", "process_cpu_ns_per_byte"),
            g("zerocopy", "process_cpu_ns_per_byte"),
            g("zerocopy", "zero_copy_fraction") * 100.0,
        );
    }
    out + &recv::table(&res["receiver"]) + &copy_block::table(&res["copy_block"]) + &xdp_copy::table(&res["xdp_copy"])
}
