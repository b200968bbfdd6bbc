//! The copy block inside a real transfer: `eudp bench`'s xdp mode (the
//! library path on the AF_XDP transport, host `a` to host `b` of the
//! testbed) with `EUDP_XDP_COPY=cached` and `=nontemporal`, beside kernel
//! UDP, in interleaved rounds. Per row: the sending process's CPU per byte
//! (the copy into UMEM runs there), throughput at the receiver, loss, and
//! the sender's transport counters, which say whether datagrams went as
//! frames (`tx_xdp`, through the copy block) or through the kernel
//! (`tx_kernel_too_big`: above the MTU, fragmented by the kernel, no copy
//! block).

use super::spread::{median, ratio};
use crate::bench::{transfer, Rates};
use crate::testbed::Testbed;
use crate::worker::{Mode, Report};
use serde_json::{json, Value};

/// Payload sizes: one small datagram, one MTU's worth, and two the
/// transport hands to the kernel at a 1500-byte MTU.
pub const SIZES: [usize; 4] = [64, 1472, 16_384, 65_507];
const ROUNDS: usize = 3;
/// The variants, by their `EUDP_XDP_COPY` value; `None`: kernel UDP.
const VARIANTS: [(&str, Option<&str>); 3] =
    [("kernel", None), ("xdp_cached", Some("cached")), ("xdp_nontemporal", Some("nontemporal"))];

fn counter(s: &Report, key: &str) -> Option<u64> {
    s.eudp.as_ref()?.get("xdp")?.get(key)?.as_u64()
}

/// One transfer's figures.
fn sample(s: &Report, r: &Report) -> Value {
    let m = Rates::of(s, r);
    json!({
        "sender_cpu_ns_per_byte": (s.bytes > 0).then(|| s.cpu_secs * 1e9 / s.bytes as f64),
        "received_gbps": m.gbps,
        "received_mpps": m.mpps,
        "loss": m.loss,
        "corrupt": r.corrupt,
        "tx_xdp": counter(s, "tx_xdp"),
        "tx_kernel_too_big": counter(s, "tx_kernel_too_big"),
        "tx_kicks": counter(s, "tx_kicks"),
    })
}

fn one(tb: &Testbed, variant: Option<&str>, size: usize, secs: f64) -> Result<Value, String> {
    let mode = match variant {
        // The workers inherit this process's environment; nothing else
        // runs in it while the bench's transfers run one at a time.
        Some(v) => {
            std::env::set_var("EUDP_XDP_COPY", v);
            Mode::Xdp
        }
        None => Mode::Kernel,
    };
    let r = transfer(tb, mode, size, secs, 0, 0, false);
    std::env::remove_var("EUDP_XDP_COPY");
    let (s, r) = r?;
    Ok(sample(&s, &r))
}

/// The median over the rounds that measured `variant` (a failed transfer
/// leaves its round out; `rounds_ok` in the row counts them).
fn median_of(rounds: &[Value], variant: &str, key: &str) -> Option<f64> {
    median(&mut rounds.iter().filter_map(|r| r[variant][key].as_f64()).collect::<Vec<_>>())
}

/// One row per size: every round's samples, and the medians' ratios
/// (non-temporal over cached, and each xdp variant over kernel UDP).
pub fn measure(tb: &Testbed, secs: f64) -> Vec<Value> {
    SIZES
        .iter()
        .map(|&size| {
            let mut rounds = Vec::new();
            for round in 0..ROUNDS {
                let mut r = serde_json::Map::new();
                // The xdp variants take turns going first.
                let order: Vec<_> =
                    if round % 2 == 0 { VARIANTS.to_vec() } else { VARIANTS.iter().rev().copied().collect() };
                for (name, v) in order {
                    r.insert(name.into(), one(tb, v, size, secs).unwrap_or_else(|e| json!({ "error": e })));
                }
                rounds.push(Value::Object(r));
            }
            let of_medians =
                |a: &str, b: &str, key: &str| ratio(median_of(&rounds, a, key), median_of(&rounds, b, key));
            let per_round = |key: &str| -> Vec<Option<f64>> {
                rounds
                    .iter()
                    .map(|r| ratio(r["xdp_nontemporal"][key].as_f64(), r["xdp_cached"][key].as_f64()))
                    .collect()
            };
            let medians: serde_json::Map<String, Value> = VARIANTS
                .iter()
                .map(|(name, _)| {
                    let m = |k: &str| median_of(&rounds, name, k);
                    let ok = rounds.iter().filter(|r| r[*name]["error"].is_null()).count();
                    (
                        name.to_string(),
                        json!({
                            "sender_cpu_ns_per_byte": m("sender_cpu_ns_per_byte"),
                            "received_gbps": m("received_gbps"),
                            "loss": m("loss"),
                            "rounds_ok": ok,
                        }),
                    )
                })
                .collect();
            json!({
                "size": size,
                "medians": medians,
                "nontemporal_over_cached": {
                    "sender_cpu_ns_per_byte": of_medians("xdp_nontemporal", "xdp_cached", "sender_cpu_ns_per_byte"),
                    "received_gbps": of_medians("xdp_nontemporal", "xdp_cached", "received_gbps"),
                },
                "rounds_nontemporal_over_cached_cpu": per_round("sender_cpu_ns_per_byte"),
                "cached_over_kernel": {
                    "sender_cpu_ns_per_byte": of_medians("xdp_cached", "kernel", "sender_cpu_ns_per_byte"),
                    "received_gbps": of_medians("xdp_cached", "kernel", "received_gbps"),
                },
                "rounds": rounds,
            })
        })
        .collect()
}

/// The rows as text.
pub fn table(rows: &Value) -> String {
    if rows.is_null() {
        return String::new();
    }
    let mut out = format!(
        "\ncopy block in an xdp transfer (testbed, medians)\n{:>6} {:>11} {:>11} {:>11} {:>7} {:>10} {:>10} {:>10} {:>12}\n",
        "size", "kern ns/B", "cach ns/B", "nt ns/B", "nt/cach", "kern Gb/s", "cach Gb/s", "nt Gb/s", "frames/total"
    );
    for r in rows.as_array().into_iter().flatten() {
        let g = |v: &str, k: &str| r["medians"][v][k].as_f64().unwrap_or(f64::NAN);
        let first = &r["rounds"][0]["xdp_cached"];
        let frames = first["tx_xdp"].as_u64().unwrap_or(0);
        let total = frames + first["tx_kernel_too_big"].as_u64().unwrap_or(0);
        out += &format!(
            "{:>6} {:>11.3} {:>11.3} {:>11.3} {:>7.2} {:>10.2} {:>10.2} {:>10.2} {:>12}\n",
            r["size"].as_u64().unwrap_or(0),
            g("kernel", "sender_cpu_ns_per_byte"),
            g("xdp_cached", "sender_cpu_ns_per_byte"),
            g("xdp_nontemporal", "sender_cpu_ns_per_byte"),
            r["nontemporal_over_cached"]["sender_cpu_ns_per_byte"].as_f64().unwrap_or(f64::NAN),
            g("kernel", "received_gbps"),
            g("xdp_cached", "received_gbps"),
            g("xdp_nontemporal", "received_gbps"),
            format!("{frames}/{total}"),
        );
    }
    out
}
