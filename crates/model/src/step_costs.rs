//! Measured EMP step costs in place of paper 003's Table 1, and the order
//! of the schemes (base, SO, RO, DSR, SR) the simulator predicts from them.
//!
//! `eudp trace --emp` measures the seven steps on this host and writes
//! them as [`StepCosts`] (its JSON's `model_costs`); [`apply`] puts them
//! into every stack of the 003 preset, where each stack already places the
//! steps on the NIC's two CPUs as Table 2 does, and [`predict`] runs the
//! simulator on each stack for unidirectional bandwidth, bidirectional
//! bandwidth and ping-pong latency.

use crate::cited::Cited;
use crate::measure;
use crate::preset::{apply_overrides, Preset};
use serde::{Deserialize, Serialize};

/// The stacks of the 003 preset, in Table 2's order.
pub const SCHEMES: [&str; 5] = ["base", "so", "ro", "dsr", "sr"];

/// Costs of the seven steps in µs: per message for send bookkeeping,
/// receive acknowledgment and send acknowledgment (as the preset charges
/// them), per frame for the others.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCosts {
    pub send_bookkeeping_us: f64,
    pub transmission_us: f64,
    pub receive_acknowledgment_us: f64,
    pub receive_bookkeeping_us: f64,
    pub receive_frame_us: f64,
    pub receiving_us: f64,
    pub send_acknowledgment_us: f64,
}

/// Reads step costs from a file: an `eudp trace --emp` document (its
/// `model_costs`) or a bare [`StepCosts`] object.
pub fn load(path: &str) -> Result<StepCosts, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    parse(&text).map_err(|e| format!("{path}: {e}"))
}

/// [`load`] from the text.
pub fn parse(text: &str) -> Result<StepCosts, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let costs = v.get("model_costs").cloned().unwrap_or(v);
    let c: StepCosts = serde_json::from_value(costs).map_err(|e| format!("no step costs: {e}"))?;
    let all = [
        c.send_bookkeeping_us,
        c.transmission_us,
        c.receive_acknowledgment_us,
        c.receive_bookkeeping_us,
        c.receive_frame_us,
        c.receiving_us,
        c.send_acknowledgment_us,
    ];
    if all.iter().any(|x| !x.is_finite() || *x < 0.0) {
        return Err("step costs must be finite and not negative".into());
    }
    Ok(c)
}

/// Puts the measured costs into every stack of a 003-shaped preset. A
/// stack that splits receive acknowledgment over two CPUs (DSR) keeps the
/// preset's proportion between the halves. Every value replaced cites
/// `source`.
pub fn apply(p: &mut Preset, c: &StepCosts, source: &str) {
    let cite = |v: f64| Cited { v, cite: format!("measured: {source}") };
    for stack in p.stacks.values_mut() {
        let halves: f64 = stack
            .stages
            .iter()
            .filter(|s| s.name.starts_with("recv_ack"))
            .filter_map(|s| s.per_message_us.as_ref().map(|x| x.v))
            .sum();
        for s in stack.stages.iter_mut() {
            match s.name.as_str() {
                "send_bookkeep" => s.per_message_us = Some(cite(c.send_bookkeeping_us)),
                "transmission" => s.per_packet_us = Some(cite(c.transmission_us)),
                "recv_bookkeep" => s.per_packet_us = Some(cite(c.receive_bookkeeping_us)),
                "recv_frame" => s.per_packet_us = Some(cite(c.receive_frame_us)),
                "receiving" => s.per_packet_us = Some(cite(c.receiving_us)),
                "send_ack" => s.per_message_us = Some(cite(c.send_acknowledgment_us)),
                n if n.starts_with("recv_ack") => {
                    let share = match (&s.per_message_us, halves > 0.0) {
                        (Some(x), true) => x.v / halves,
                        _ => 1.0,
                    };
                    s.per_message_us = Some(cite(c.receive_acknowledgment_us * share));
                }
                _ => {}
            }
        }
    }
}

/// What the prediction runs: message sizes, messages per bandwidth run,
/// and the bus and link the host's steps are simulated beside.
#[derive(Clone, Debug)]
pub struct Workload {
    pub bandwidth_bytes: u64,
    pub latency_bytes: u64,
    pub messages: usize,
    pub bus: Option<String>,
    pub link_mbps: Option<f64>,
}

impl Default for Workload {
    /// 16 KiB bandwidth and 10 B latency (the sizes `eudp bench --emp`
    /// measures), over a bus and link fast enough that the steps, not the
    /// wire, set the pace, as on loopback.
    fn default() -> Self {
        Workload {
            bandwidth_bytes: 16_384,
            latency_bytes: 10,
            messages: 64,
            bus: Some("pcie4x16".into()),
            link_mbps: Some(100_000.0),
        }
    }
}

/// One scheme's simulated figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchemeFigures {
    pub scheme: String,
    pub unidir_mbit_s: f64,
    pub bidir_mbit_s: f64,
    pub latency_us: f64,
}

/// The simulated figures of every scheme and the three orders (best first).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prediction {
    pub schemes: Vec<SchemeFigures>,
    pub unidir_order: Vec<String>,
    pub bidir_order: Vec<String>,
    pub latency_order: Vec<String>,
}

/// Simulates every scheme of `p` (after [`apply`]) under `w`.
pub fn predict(p: &Preset, w: &Workload) -> Result<Prediction, String> {
    let mut p = p.clone();
    apply_overrides(&mut p, w.bus.as_deref(), w.link_mbps)?;
    let mut schemes = Vec::new();
    for s in SCHEMES.iter().filter(|s| p.stacks.contains_key(**s)) {
        schemes.push(SchemeFigures {
            scheme: s.to_string(),
            unidir_mbit_s: measure::bandwidth(&p, s, w.bandwidth_bytes, w.messages.max(1), false)?,
            bidir_mbit_s: measure::bandwidth(&p, s, w.bandwidth_bytes, w.messages.max(1), true)?,
            latency_us: measure::pingpong_us(&p, s, w.latency_bytes)?,
        });
    }
    if schemes.is_empty() {
        return Err(format!("preset {} has none of the stacks {}", p.name, SCHEMES.join(", ")));
    }
    Ok(Prediction {
        unidir_order: order(&schemes, |f| -f.unidir_mbit_s),
        bidir_order: order(&schemes, |f| -f.bidir_mbit_s),
        latency_order: order(&schemes, |f| f.latency_us),
        schemes,
    })
}

/// The schemes by `key`, smallest first; equal keys keep Table 2's order.
pub fn order(schemes: &[SchemeFigures], key: impl Fn(&SchemeFigures) -> f64) -> Vec<String> {
    let pairs: Vec<(String, f64)> = schemes.iter().map(|f| (f.scheme.clone(), key(f))).collect();
    rank(&pairs).into_iter().map(|(n, _)| n).collect()
}

/// Named values, smallest first; equal values keep their order.
pub fn rank(pairs: &[(String, f64)]) -> Vec<(String, f64)> {
    let mut v = pairs.to_vec();
    v.sort_by(|a, b| a.1.total_cmp(&b.1));
    v
}

/// Values within this fraction of each other rank as equal in [`show`].
pub const TIE: f64 = 0.01;

/// Ranked values ([`rank`]) as text, best first: `ro = sr > dsr > base`;
/// neighbours within [`TIE`] of each other are joined by `=`.
pub fn show(ranked: &[(String, f64)]) -> String {
    let mut out = String::new();
    for (i, (name, v)) in ranked.iter().enumerate() {
        if i > 0 {
            let prev = ranked[i - 1].1;
            let tie = (v - prev).abs() <= TIE * v.abs().max(prev.abs());
            out.push_str(if tie { " = " } else { " > " });
        }
        out.push_str(name);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;

    fn preset003() -> Preset {
        preset::load(&preset::resolve("003").unwrap()).unwrap()
    }

    fn costs(send: f64, recv: f64) -> StepCosts {
        StepCosts {
            send_bookkeeping_us: send,
            transmission_us: send,
            receive_acknowledgment_us: send,
            receive_bookkeeping_us: recv,
            receive_frame_us: recv,
            receiving_us: recv,
            send_acknowledgment_us: recv,
        }
    }

    fn predicted(c: &StepCosts) -> Prediction {
        let mut p = preset003();
        apply(&mut p, c, "test");
        predict(&p, &Workload { messages: 16, ..Workload::default() }).unwrap()
    }

    #[test]
    fn the_prediction_follows_the_step_costs() {
        // A costly send path and a costly receive path favour different
        // splits: the order is computed, not fixed.
        let send_heavy = predicted(&costs(8.0, 0.5));
        let recv_heavy = predicted(&costs(0.5, 8.0));
        assert_eq!(send_heavy.schemes.len(), 5);
        assert_ne!(send_heavy.unidir_order, recv_heavy.unidir_order, "{send_heavy:?}\n{recv_heavy:?}");
        // Slower steps make every scheme slower.
        let slow = predicted(&costs(8.0, 8.0));
        for (a, b) in slow.schemes.iter().zip(&send_heavy.schemes) {
            assert!(a.unidir_mbit_s <= b.unidir_mbit_s + 1e-9, "{a:?} {b:?}");
            assert!(a.latency_us >= b.latency_us - 1e-9, "{a:?} {b:?}");
        }
    }

    #[test]
    fn costs_parse_from_a_trace_document_or_bare() {
        let c = costs(1.0, 2.0);
        let bare = serde_json::to_string(&c).unwrap();
        assert_eq!(parse(&bare).unwrap(), c);
        let doc = format!("{{\"schemes\":[],\"model_costs\":{bare}}}");
        assert_eq!(parse(&doc).unwrap(), c);
        assert!(parse("{\"model_costs\":{}}").is_err());
        let mut p = preset003();
        apply(&mut p, &c, "test");
        let dsr = &p.stacks["dsr"];
        let acks: f64 = dsr
            .stages
            .iter()
            .filter(|s| s.name.starts_with("recv_ack"))
            .map(|s| s.per_message_us.as_ref().unwrap().v)
            .sum();
        assert!((acks - 1.0).abs() < 1e-9);
    }
}
