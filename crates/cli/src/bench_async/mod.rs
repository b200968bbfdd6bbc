//! `eudp bench --async`: copying sends against asynchronous zero-copy sends
//! (paper 001's kernel UDP against Asynchronous UDP), and the asynchronous
//! receiver against a `recvmmsg` loop.
//!
//! The send columns are the same [`eudp_engine::async_udp::AsyncSender`]
//! with GSO on: copying, with `MSG_ZEROCOPY`, and with io_uring `SEND_ZC`
//! from registered buffers, so that they differ in how the payload reaches
//! the kernel alone. Per payload size (1472 B, 16 KiB, 64 KiB by default)
//! and path (loopback; the testbed's veth pair when run as root) they run
//! in interleaved rounds ([`send`]): throughput at the receiver, CPU per byte of the sending
//! thread and of the whole process, and the fraction of sends the kernel
//! really did without copying (its notifications' copied flag). The
//! receiver rows are in [`recv`]. The JSON schema is in docs/bench.md.

mod copy_block;
mod measure;
mod recv;
mod send;
mod spread;
mod sys;
mod xdp_copy;

use crate::testbed::{is_root, unique_name, Testbed, ADDR_A, ADDR_B};
use measure::Ends;
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
    /// Interleaved rounds of the send part.
    pub rounds: usize,
    pub out_dir: Option<PathBuf>,
}

/// The sizes paper 001 §5.3 contrasts: one Ethernet frame, 16 KiB, and the
/// largest UDP payload.
pub const DEFAULT_SIZES: [usize; 3] = [1472, 16 * 1024, 65_507];

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
        send::measure_path("loopback", &loopback, &args.sizes, args.secs, args.rounds, &mut rows);
    }
    let mut notes = vec![
        format!("copy, zerocopy and uring_fixed are the same AsyncSender (GSO on): copying, MSG_ZEROCOPY, and io_uring SEND_ZC/SENDMSG_ZC from registered buffers, in {} interleaved rounds whose order rotates; per mode the median and min-max over the rounds, ratios as the median and min-max of per-round ratios", args.rounds),
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
            send::measure_path("testbed-veth", &ends, &args.sizes, args.secs, args.rounds, &mut rows);
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
        "schema": "eudp-bench-async/3",
        "bench": "async",
        "started_unix": started_unix,
        "secs_per_transfer": args.secs,
        "send_rounds": args.rounds,
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

/// The result as text: the send rows, then the other parts'.
pub fn table(res: &Value) -> String {
    send::table(&res["rows"])
        + &recv::table(&res["receiver"])
        + &copy_block::table(&res["copy_block"])
        + &xdp_copy::table(&res["xdp_copy"])
}
