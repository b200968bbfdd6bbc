//! The median and range of a figure over interleaved rounds, shared by the
//! parts that repeat their measurements.

use serde_json::{json, Value};

/// The median of `v` (the mean of the two middle values when their number is
/// even); `None` when `v` is empty. Sorts `v`.
pub fn median(v: &mut [f64]) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// `{median, min, max, n}` of the values present (a failed round leaves its
/// value out, and `n` counts the rest); null when none is.
pub fn spread(values: impl IntoIterator<Item = Option<f64>>) -> Value {
    let mut v: Vec<f64> = values.into_iter().flatten().collect();
    match median(&mut v) {
        Some(m) => json!({ "median": m, "min": v[0], "max": v[v.len() - 1], "n": v.len() }),
        None => Value::Null,
    }
}

/// `a / b` when both are there and `b` is positive.
pub fn ratio(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn spread_skips_missing_rounds() {
        let s = spread([Some(5.0), None, Some(1.0), Some(2.0)]);
        assert_eq!(s, json!({ "median": 2.0, "min": 1.0, "max": 5.0, "n": 3 }));
        assert_eq!(spread([None, None]), Value::Null);
    }

    #[test]
    fn ratio_needs_a_positive_divisor() {
        assert_eq!(ratio(Some(3.0), Some(2.0)), Some(1.5));
        assert_eq!(ratio(Some(3.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
    }
}
