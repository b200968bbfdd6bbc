//! The `--overhead` verdict: whether a traced setting keeps its share of
//! the untraced rate, judged from the per-round (paired) ratios so that a
//! noisy host yields "not determinable" instead of a pass or a miss.
//!
//! Each round runs the untraced transfer and every setting once, so one
//! round's ratio compares transfers made close in time. The median of the
//! ratios is bracketed by a distribution-free confidence interval (order
//! statistics of the binomial sign test); the setting meets the budget
//! when the whole interval lies at or above it, misses it when the whole
//! interval lies below, and is not determinable otherwise — the rounds'
//! spread then exceeds the distance between the effect and the budget.

/// Rate share a traced transfer must keep (at most 10% loss).
pub const BUDGET: f64 = 0.90;
/// Two-sided confidence of the median's interval.
pub const CONFIDENCE: f64 = 0.95;

/// What the per-round ratios of one setting say.
#[derive(Clone, Debug, PartialEq)]
pub struct Verdict {
    pub rounds: usize,
    pub median: f64,
    /// Interquartile range of the ratios (their spread).
    pub q1: f64,
    pub q3: f64,
    /// The median's confidence interval; `None` with too few rounds for
    /// one at [`CONFIDENCE`] (fewer than 6).
    pub ci: Option<(f64, f64)>,
    pub outcome: Outcome,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Met,
    Missed,
    NotDeterminable,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Met => "met",
            Outcome::Missed => "missed",
            Outcome::NotDeterminable => "not determinable",
        }
    }
}

/// Judges the per-round ratios `ratios` (traced rate over the same
/// round's untraced rate) against `budget`. `None` when there are none.
pub fn judge(ratios: &[f64], budget: f64) -> Option<Verdict> {
    let mut v: Vec<f64> = ratios.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    let ci = median_ci_ranks(n, 1.0 - CONFIDENCE).map(|(lo, hi)| (v[lo], v[hi]));
    let outcome = match ci {
        Some((lo, _)) if lo >= budget => Outcome::Met,
        Some((_, hi)) if hi < budget => Outcome::Missed,
        _ => Outcome::NotDeterminable,
    };
    Some(Verdict { rounds: n, median: quantile(&v, 0.5), q1: quantile(&v, 0.25), q3: quantile(&v, 0.75), ci, outcome })
}

/// Writes to `out` the verdicts of one setting (`label`) against the
/// untraced transfers of the same rounds: on the rate (traced over
/// untraced) and on the CPU per datagram (untraced over traced: the rate a
/// transfer bound by its CPU keeps, steadier where other jobs take the
/// CPUs). Returns them as JSON rows.
pub fn report_verdicts(
    out: &mut String,
    label: &str,
    rate: (&[f64], &[f64]),
    cpu: (&[f64], &[f64]),
) -> Vec<serde_json::Value> {
    use std::fmt::Write as _;
    let mut rows = Vec::new();
    for (measure, ratios) in [
        ("rate", rate.0.iter().zip(rate.1).map(|(x, b)| x / b).collect::<Vec<f64>>()),
        ("cpu", cpu.0.iter().zip(cpu.1).map(|(x, b)| b / x).collect()),
    ] {
        let Some(v) = judge(&ratios, BUDGET) else { continue };
        let ci = v.ci.map(|(l, h)| format!("{l:.3}-{h:.3}")).unwrap_or_else(|| "none (under 6 rounds)".into());
        let _ = writeln!(
            out,
            "        {label}: per-round {measure} ratio median {:.3}, IQR {:.3}-{:.3}, {:.0}% interval of the median {ci}, {} rounds: budget {BUDGET} {}",
            v.median,
            v.q1,
            v.q3,
            100.0 * CONFIDENCE,
            v.rounds,
            v.outcome.as_str()
        );
        rows.push(serde_json::json!({"measure": measure, "rounds": v.rounds, "ratios": ratios, "median": v.median,
            "q1": v.q1, "q3": v.q3, "ci_low": v.ci.map(|c| c.0), "ci_high": v.ci.map(|c| c.1),
            "confidence": CONFIDENCE, "budget": BUDGET, "verdict": v.outcome.as_str()}));
    }
    rows
}

/// Linear-interpolated quantile of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let (i, f) = (pos.floor() as usize, pos.fract());
    if i + 1 < v.len() {
        v[i] + f * (v[i + 1] - v[i])
    } else {
        v[i]
    }
}

/// 0-based ranks (lo, hi) of the sorted sample that bracket the median
/// of `n` values with coverage at least 1 - `alpha`: the largest j with
/// P(Binomial(n, 1/2) < j) <= alpha / 2 gives ranks j-1 and n-j. `None`
/// when even the extremes do not reach that coverage.
fn median_ci_ranks(n: usize, alpha: f64) -> Option<(usize, usize)> {
    // Cumulative binomial probabilities, in f64 (n is a few dozen rounds).
    let mut pmf = 0.5f64.powi(n as i32);
    let mut below = 0.0; // P(X < j)
    let mut j = 0;
    for i in 0..n {
        if below + pmf > alpha / 2.0 {
            break;
        }
        below += pmf;
        j = i + 1;
        pmf *= (n - i) as f64 / (i + 1) as f64;
    }
    (j >= 1 && j <= n - j + 1).then(|| (j - 1, n - j))
}

/// The order of the `n` settings in round `r`: a Williams design, so that
/// over a full cycle of rounds (`n` when `n` is even, `2n` when odd) each
/// setting runs in each position equally often and follows each other
/// setting equally often. A plain rotation keeps every setting behind the
/// same neighbour in every round, so whatever one transfer leaves to the
/// next (the host's state after a traced run, say) would be charged to
/// that one setting; here it spreads over all of them.
pub fn round_order(n: usize, r: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    // 0, 1, n-1, 2, n-2, …: every difference between neighbours mod n once.
    let base: Vec<usize> = (0..n).map(|j| if j % 2 == 1 { j.div_ceil(2) } else { (n - j / 2) % n }).collect();
    let cycle = if n.is_multiple_of(2) { n } else { 2 * n };
    let row = r % cycle;
    let (shift, reversed) = if row < n { (row, false) } else { (row - n, true) };
    let mut order: Vec<usize> = base.iter().map(|&b| (b + shift) % n).collect();
    if reversed {
        order.reverse();
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_interval_ranks_match_the_sign_test_tables() {
        // Fewer than 6 values: no 95% interval (1/32 > 0.025 at n = 5).
        assert_eq!(median_ci_ranks(5, 0.05), None);
        // n = 6: the extremes (2/64 = 0.031 two-sided coverage 96.9%).
        assert_eq!(median_ci_ranks(6, 0.05), Some((0, 5)));
        // n = 9: 2nd and 8th values (coverage 96.1%).
        assert_eq!(median_ci_ranks(9, 0.05), Some((1, 7)));
        // n = 20: 6th and 15th values (coverage 95.9%).
        assert_eq!(median_ci_ranks(20, 0.05), Some((5, 14)));
    }

    #[test]
    fn verdict_follows_the_interval_not_the_median() {
        let met = judge(&[0.95, 0.97, 0.93, 0.99, 0.92, 0.96, 0.94, 0.98, 0.91], BUDGET).unwrap();
        assert_eq!(met.outcome, Outcome::Met);
        let missed = judge(&[0.80, 0.82, 0.78, 0.85, 0.79, 0.81, 0.83, 0.84, 0.86], BUDGET).unwrap();
        assert_eq!(missed.outcome, Outcome::Missed);
        // Median above the budget, but the rounds scatter across it.
        let noisy = judge(&[0.95, 0.80, 1.05, 0.93, 0.85, 1.10, 0.92, 0.97, 0.88], BUDGET).unwrap();
        assert!(noisy.median > BUDGET);
        assert_eq!(noisy.outcome, Outcome::NotDeterminable);
        // Too few rounds to say anything.
        assert_eq!(judge(&[0.99, 0.98, 0.97], BUDGET).unwrap().outcome, Outcome::NotDeterminable);
        assert!(judge(&[], BUDGET).is_none());
    }

    #[test]
    fn quartiles_interpolate() {
        let v = judge(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.0).unwrap();
        assert_eq!((v.q1, v.median, v.q3), (2.0, 3.0, 4.0));
    }

    #[test]
    fn round_order_balances_position_and_predecessor() {
        for n in 1..=7usize {
            let cycle = if n.is_multiple_of(2) { n } else { 2 * n };
            let mut at = vec![vec![0usize; n]; n];
            let mut after = vec![vec![0usize; n]; n];
            for r in 0..cycle {
                let o = round_order(n, r);
                let mut seen = o.clone();
                seen.sort_unstable();
                assert_eq!(seen, (0..n).collect::<Vec<_>>(), "n {n} round {r}: each setting once");
                for (pos, &k) in o.iter().enumerate() {
                    at[k][pos] += 1;
                }
                for w in o.windows(2) {
                    after[w[0]][w[1]] += 1;
                }
            }
            let per_position = cycle / n;
            assert!(at.iter().flatten().all(|&c| c == per_position), "n {n}: positions {at:?}");
            let per_pair = if n > 1 { cycle / n } else { 0 };
            for (a, row) in after.iter().enumerate() {
                for (b, &c) in row.iter().enumerate() {
                    let want = if a == b { 0 } else { per_pair };
                    assert_eq!(c, want, "n {n}: {b} after {a}");
                }
            }
        }
    }
}
