//! Closed-form performance model.
//!
//! * Eq. (1)/(2) of 000 §4.4.1: coarse-grained pipelining, where a layer
//!   starts a packet only when the layer above has finished it.
//! * Eq. (3)/(4) of 000 §4.4.2: fine-grained pipelining, where a layer starts
//!   once `t` bytes have arrived, with start-up overhead `S_i` per fragment and
//!   the switch-over packet `u` after which fragments merge and the pipeline
//!   behaves coarse-grained.
//! * Ratemax of 000 §4.2: bound on the descriptor-post (PIO) rate of the
//!   two-level queue.
//! * 001 §5.1: throughput = size / dominant (largest) layer latency.
//!
//! All times are in ns, sizes in bytes.

use crate::preset::Preset;
use serde::{Deserialize, Serialize};

/// One pipelined layer: per-packet overhead `g` (includes `s`), per-byte
/// overhead `big_g`, start-up overhead `s` of one per-byte operation.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Layer {
    pub name: String,
    pub g_ns: f64,
    pub big_g_ns: f64,
    pub s_ns: f64,
}

impl Layer {
    pub fn new(name: &str, g_ns: f64, big_g_ns: f64, s_ns: f64) -> Self {
        Layer { name: name.to_string(), g_ns, big_g_ns, s_ns }
    }
    /// Time for one packet of `b` bytes: g + b·G.
    pub fn cost(&self, b: f64) -> f64 {
        self.g_ns + b * self.big_g_ns
    }
}

/// Index of the bottleneck layer (largest g + B·G).
pub fn bottleneck(layers: &[Layer], b: f64) -> usize {
    let mut best = 0;
    for (i, l) in layers.iter().enumerate() {
        if l.cost(b) > layers[best].cost(b) {
            best = i;
        }
    }
    best
}

/// Eq. (1): one-way latency with coarse-grained pipelining.
pub fn latency_coarse(layers: &[Layer], b: f64) -> f64 {
    layers.iter().map(|l| l.cost(b)).sum()
}

/// Eq. (2) before the limit: bandwidth (bytes/ns) for `m` packets of `b` bytes.
pub fn bandwidth_coarse_m(layers: &[Layer], b: f64, m: usize) -> f64 {
    let m = m.max(1) as f64;
    let lb = &layers[bottleneck(layers, b)];
    b * m / ((m - 1.0) * lb.cost(b) + latency_coarse(layers, b))
}

/// Eq. (2)/(4) limit m → ∞: B / (g_b + B·G_b) in bytes/ns.
pub fn bandwidth_limit(layers: &[Layer], b: f64) -> f64 {
    b / layers[bottleneck(layers, b)].cost(b)
}

/// Γ_{1,i} for the first packet: a layer cannot process bytes faster than
/// any layer above it delivers them, so its effective per-byte time is the
/// largest G among itself and the layers above.
pub fn gamma_first(layers: &[Layer]) -> Vec<f64> {
    let mut out = Vec::with_capacity(layers.len());
    let mut worst: f64 = 0.0;
    for l in layers {
        worst = worst.max(l.big_g_ns);
        out.push(if l.big_g_ns == 0.0 { 0.0 } else { worst });
    }
    out
}

/// Eq. (3): one-way latency with fine-grained pipelining and threshold `t`.
pub fn latency_fine(layers: &[Layer], b: f64, t: f64) -> f64 {
    let gam = gamma_first(layers);
    let e = match gam.iter().rposition(|&g| g != 0.0) {
        Some(e) => e,
        None => return latency_coarse(layers, b),
    };
    let tt = t.min(b);
    let mut sum = 0.0;
    for (i, l) in layers.iter().enumerate() {
        if i != e {
            sum += l.g_ns + tt * l.big_g_ns;
        }
    }
    sum + layers[e].g_ns + b * gam[e]
}

/// Ratemax of 000 §4.2: the two-level queue bounds the PIO post rate to
/// (n + sizeof(L2)) / t, with n requests processed by the NIC in time t.
pub fn ratemax(n: f64, l2: f64, t_ns: f64) -> f64 {
    (n + l2) / t_ns
}

/// Per-packet schedule of the fine-grained pipeline (the recurrence behind
/// eq. (4)): fragment counts per packet at every layer.
#[derive(Debug, Clone, Serialize)]
pub struct FineSchedule {
    /// Finish time (ns) of each packet at the last layer.
    pub finish: Vec<f64>,
    /// k_{p,i}: fragments of packet p at layer i.
    pub fragments: Vec<Vec<usize>>,
    /// First packet (1-based) at the bottleneck layer moved in one fragment
    /// (0 when it never happens within `m` packets).
    pub u: usize,
    /// Bottleneck layer index.
    pub bottleneck: usize,
}

impl FineSchedule {
    /// Bandwidth (bytes/ns) of the m packets of size `b`.
    pub fn bandwidth(&self, b: f64) -> f64 {
        b * self.finish.len() as f64 / self.finish.last().copied().unwrap_or(f64::INFINITY)
    }
}

/// Runs the fine-grained pipeline for `m` back-to-back packets of `b` bytes.
/// A layer takes a packet when it finished the previous one and `t` bytes
/// (or the whole packet) have arrived; each fragment moves everything
/// available, costing S + x·G; the per-packet part g − S is paid first.
pub fn fine_schedule(layers: &[Layer], b: f64, t: f64, m: usize) -> FineSchedule {
    let n = layers.len();
    let t = t.max(1.0).min(b.max(1.0));
    // Fragments of the layer above as (data start, end, bytes before, bytes after);
    // bytes become visible linearly while a fragment is being moved.
    type Frag = (f64, f64, f64, f64);
    let avail_at = |up: &[Frag], time: f64| -> f64 {
        let mut a: f64 = 0.0;
        for &(s, e, x0, x1) in up {
            if time >= e - 1e-9 {
                a = a.max(x1);
            } else if time > s {
                a = a.max(x0 + (x1 - x0) * (time - s) / (e - s));
            }
        }
        a
    };
    let time_when = |up: &[Frag], bytes: f64| -> f64 {
        for &(s, e, x0, x1) in up {
            if x1 >= bytes - 1e-9 {
                if x1 - x0 <= 1e-12 || e <= s {
                    return e;
                }
                return s + (e - s) * ((bytes - x0) / (x1 - x0)).clamp(0.0, 1.0);
            }
        }
        f64::INFINITY
    };
    let mut prev: Vec<Vec<Frag>> = (0..m).map(|_| vec![(0.0, 0.0, 0.0, b)]).collect();
    let mut frags = vec![vec![0usize; n]; m];
    for (i, l) in layers.iter().enumerate() {
        let mut cur_free = 0.0f64;
        let mut this: Vec<Vec<Frag>> = Vec::with_capacity(m);
        let gp = (l.g_ns - l.s_ns).max(0.0);
        for p in 0..m {
            let up = &prev[p];
            let need = if l.big_g_ns == 0.0 { b } else { t };
            let mut cur = cur_free.max(time_when(up, need)) + gp;
            let mut done = 0.0;
            let mut out: Vec<Frag> = Vec::new();
            if l.big_g_ns == 0.0 || b == 0.0 {
                let s0 = cur;
                cur += l.s_ns;
                out.push((s0, cur, 0.0, b));
                frags[p][i] = 1;
            } else {
                while done < b - 1e-9 {
                    let av = avail_at(up, cur);
                    let x = av - done;
                    let complete = av >= b - 1e-9;
                    if x >= t - 1e-9 || (complete && x > 1e-9) {
                        let s0 = cur + l.s_ns;
                        cur = s0 + x * l.big_g_ns;
                        out.push((s0, cur, done, done + x));
                        done += x;
                        frags[p][i] += 1;
                    } else {
                        let want = (done + t).min(b);
                        let next = time_when(up, want);
                        if !next.is_finite() {
                            break;
                        }
                        cur = next.max(cur + 1e-6);
                    }
                }
            }
            cur_free = cur;
            this.push(out);
        }
        prev = this;
    }
    let finish: Vec<f64> = prev.iter().map(|v| v.last().map(|x| x.1).unwrap_or(0.0)).collect();
    let bn = bottleneck(layers, b);
    let u = (0..m).find(|&p| frags[p][bn] == 1).map(|p| p + 1).unwrap_or(0);
    FineSchedule { finish, fragments: frags, u, bottleneck: bn }
}

/// Eq. (4) evaluated for finite m with the fragment counts of [`fine_schedule`]:
/// B·m / (Σ_{i<n} g_i + m·(g_b − S_b + B·G_b) + Σ_p k_{p,b}·S_b).
pub fn bandwidth_fine_m(layers: &[Layer], b: f64, t: f64, m: usize) -> f64 {
    let sch = fine_schedule(layers, b, t, m);
    let lb = &layers[sch.bottleneck];
    let n = layers.len();
    let head: f64 = layers[..n - 1].iter().map(|l| l.g_ns).sum();
    let ks: f64 = sch.fragments.iter().map(|k| k[sch.bottleneck] as f64).sum();
    b * m as f64 / (head + m as f64 * (lb.g_ns - lb.s_ns + b * lb.big_g_ns) + ks * lb.s_ns)
}

/// 001 §5.1: with ideal overlap the steady throughput is size / largest layer
/// latency. Returns (bytes/ns, index of the dominant layer).
pub fn dominant_throughput(latencies_ns: &[f64], b: f64) -> (f64, usize) {
    let mut d = 0;
    for (i, &l) in latencies_ns.iter().enumerate() {
        if l > latencies_ns[d] {
            d = i;
        }
    }
    (b / latencies_ns[d], d)
}

/// Layers of a preset stack for packets of `b` bytes: g = per-packet
/// overhead + start-up (+ header time), G = uncontended per-byte time.
/// A cut-through stage (fine start with a threshold of one byte, e.g. the
/// receive DMA following the wire) is not a pipelining layer of its own and
/// is left out.
pub fn layers_from_stack(p: &Preset, stack: &str, b: f64) -> Result<Vec<Layer>, String> {
    let st = p.stacks.get(stack).ok_or_else(|| format!("preset {} has no stack {stack:?}", p.name))?;
    Ok(st
        .stages
        .iter()
        .filter(|s| !is_pass_through(s))
        .map(|s| {
            let gb = s.per_byte_ns(p, b);
            let hdr = s.header_bytes.as_ref().map(|c| c.v).unwrap_or(0.0) * gb;
            Layer::new(&s.name, s.g_ns() + s.s_ns() + hdr, gb, s.s_ns())
        })
        .collect())
}

/// A stage that only follows the wire byte by byte (a cut-through receive
/// with a 1-byte threshold and no per-packet cost): it is part of the link,
/// not a layer of eqs. (1)-(4).
fn is_pass_through(s: &crate::preset::StageSpec) -> bool {
    s.start == crate::preset::StartRule::Fine && s.threshold() <= 1.0 && s.g_ns() == 0.0
}

/// Smallest fine-grained threshold *t* among the stages that are layers of
/// eq. (3) (bytes), if any. A cut-through receive stage's 1-byte threshold
/// is not the *t* of 000 §4.4: that stage is left out of the layers, so its
/// threshold is left out here too.
pub fn stack_threshold(p: &Preset, stack: &str) -> Option<f64> {
    p.stacks
        .get(stack)?
        .stages
        .iter()
        .filter(|s| !is_pass_through(s))
        .filter_map(|s| s.threshold_bytes.as_ref().map(|c| c.v))
        .reduce(f64::min)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Vec<Layer> {
        vec![Layer::new("dma", 10_000.0, 8.0, 1_000.0), Layer::new("link", 5_000.0, 6.0, 1_000.0)]
    }

    #[test]
    fn coarse_sums_layers() {
        let l = two();
        assert_eq!(latency_coarse(&l, 1000.0), 10_000.0 + 8000.0 + 5000.0 + 6000.0);
        assert_eq!(bottleneck(&l, 1000.0), 0);
        let bw = bandwidth_limit(&l, 1000.0);
        assert!((bw - 1000.0 / 18_000.0).abs() < 1e-12);
        assert!(bandwidth_coarse_m(&l, 1000.0, 1) < bandwidth_coarse_m(&l, 1000.0, 100));
    }

    #[test]
    fn fine_is_faster_than_coarse_for_large_packets() {
        let l = two();
        let b = 32768.0;
        assert!(latency_fine(&l, b, 1024.0) < latency_coarse(&l, b));
        // fine latency ≈ g_dma + t·G_dma + g_link + B·max(G)
        let want = 10_000.0 + 1024.0 * 8.0 + 5_000.0 + b * 8.0;
        assert!((latency_fine(&l, b, 1024.0) - want).abs() < 1e-6);
    }

    #[test]
    fn recurrence_matches_eq3_for_one_packet_and_eq4_limit() {
        let l = two();
        let b = 32768.0;
        let s = fine_schedule(&l, b, 1024.0, 1);
        // eq. (3) is the paper's closed form of this schedule: within a few %
        let eq3 = latency_fine(&l, b, 1024.0);
        assert!((s.finish[0] - eq3).abs() / eq3 < 0.05, "{} vs {eq3}", s.finish[0]);
        let many = fine_schedule(&l, b, 1024.0, 200);
        let lim = bandwidth_limit(&l, b);
        assert!((many.bandwidth(b) - lim).abs() / lim < 0.02);
        assert!(bandwidth_fine_m(&l, b, 1024.0, 200) > 0.0);
    }

    #[test]
    fn switch_over_packet_when_bottleneck_is_downstream() {
        // slow link below a fast DMA: data piles up, so fragments merge
        let l = vec![Layer::new("dma", 2_000.0, 2.0, 500.0), Layer::new("link", 2_000.0, 8.0, 500.0)];
        let s = fine_schedule(&l, 32768.0, 1024.0, 10);
        assert_eq!(s.bottleneck, 1);
        assert!(s.u >= 1 && s.u <= 3, "u = {}", s.u);
        assert!(s.fragments[0][1] > 1);
    }

    #[test]
    fn ratemax_and_dominant() {
        assert_eq!(ratemax(4.0, 8.0, 1000.0), 0.012);
        let (bw, d) = dominant_throughput(&[10.0, 30.0, 20.0], 300.0);
        assert_eq!(d, 1);
        assert_eq!(bw, 10.0);
    }
}
