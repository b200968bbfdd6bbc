//! The soak's memory verdict: each program's RSS over time, judged flat or
//! not after warm-up, against its control where one ran, and the load the
//! machine was under.
//!
//! A program may grow by itself (sockperf keeps every latency sample for
//! its percentiles). The `control` workload runs the same sockperf pair
//! without the shim, so a program `NAME` with a series `control-NAME`
//! is judged by eudp's share of its growth: its growth minus the control's.

use serde_json::{json, Value};

/// A series is flat when its maximum after the first fifth of its samples
/// exceeds the maximum over that fifth by at most this fraction: later
/// growth that size is allocator noise, not a leak.
pub const FLAT_SLACK: f64 = 0.05;
/// Only a process that lives at least this fraction of the soak is judged:
/// one restarted more often (an iperf3 run, a restarted peer) says nothing
/// about growth over the soak, and iperf3 keeps every interval's results.
const JUDGED_LIFE: f64 = 0.5;
/// Nor is a series of fewer samples than this.
const MIN_SAMPLES: usize = 5;
/// The name prefix of the control's programs.
const CONTROL: &str = "control-";

/// The rule the verdict applies, as the JSON states it.
pub const RULE: &str = "a program is flat when its largest RSS after the first fifth of its samples is at most \
     1.05 x its largest in that fifth; a program with a control (the same program without the shim, run side by \
     side) is judged by eudp's share of its growth instead: its growth minus the control's, at most 0.05 x its \
     warm-up maximum; control programs are reported, not judged";

fn max(v: &[[f64; 3]], i: usize) -> f64 {
    v.iter().map(|x| x[i]).fold(0.0, f64::max)
}

/// One series' maxima, warm-up and growth (`None` when it is not judged).
fn judge(s: &mut Value, soak_secs: f64) -> Option<(f64, f64)> {
    let samples: Vec<[f64; 3]> = serde_json::from_value(s["samples"].clone()).unwrap_or_default();
    s["max_rss_kib"] = max(&samples, 1).into();
    s["max_hwm_kib"] = max(&samples, 2).into();
    let life = samples.last().map(|l| l[0]).unwrap_or(0.0) - samples.first().map(|f| f[0]).unwrap_or(0.0);
    if samples.len() < MIN_SAMPLES || life + 1.0 < soak_secs * JUDGED_LIFE {
        s["flat"] = Value::Null;
        return None;
    }
    let cut = samples.len().div_ceil(5);
    let (first, rest) = (max(&samples[..cut], 1), max(&samples[cut..], 1));
    s["warmup_max_rss_kib"] = first.into();
    s["after_warmup_max_rss_kib"] = rest.into();
    s["growth_kib"] = (rest - first).into();
    s["flat"] = (rest <= first * (1.0 + FLAT_SLACK)).into();
    Some((first, rest - first))
}

/// Per series the maxima and flatness, eudp's share where a control ran,
/// and the verdict: every judged program under the shim flat.
pub fn rss(series: Vec<Value>, soak_secs: f64) -> Value {
    let mut out: Vec<Value> = series;
    let judged: Vec<Option<(f64, f64)>> = out.iter_mut().map(|s| judge(s, soak_secs)).collect();
    let names: Vec<String> = out.iter().map(|s| s["name"].as_str().unwrap_or("").to_string()).collect();
    let (mut max_kib, mut flat_all, mut count) = (0.0f64, true, 0);
    for (i, s) in out.iter_mut().enumerate() {
        max_kib = max_kib.max(s["max_rss_kib"].as_f64().unwrap_or(0.0));
        let Some((warmup, growth)) = judged[i] else { continue };
        if names[i].starts_with(CONTROL) {
            s["judged"] = false.into();
            continue;
        }
        let control = names.iter().position(|n| *n == format!("{CONTROL}{}", names[i])).and_then(|j| judged[j]);
        let mut flat = s["flat"] == true;
        if let Some((c_warmup, c_growth)) = control {
            let share = growth - c_growth;
            s["control_growth_kib"] = c_growth.into();
            s["eudp_share_of_growth_kib"] = share.into();
            // The shim's own resident memory (library, engine thread, rings)
            // shows as the warm-up difference from the same program without it.
            s["shim_offset_at_warmup_kib"] = (warmup - c_warmup).into();
            let by_share = share <= warmup * FLAT_SLACK;
            if !flat {
                s["rss_growth_cause"] = if by_share {
                    format!(
                        "the program itself: without the shim it grows {c_growth:.0} KiB, under eudp {growth:.0} KiB"
                    )
                } else {
                    format!("eudp: {share:.0} KiB beyond the {c_growth:.0} KiB the program grows without the shim")
                }
                .into();
            }
            flat = by_share;
            s["flat_by_eudp_share"] = by_share.into();
        } else if !flat {
            s["rss_growth_cause"] = "unknown: no control ran for this program".into();
        }
        s["judged"] = true.into();
        flat_all &= flat;
        count += 1;
    }
    json!({
        "interval_s": 1, "flat_slack": FLAT_SLACK, "judged_life": JUDGED_LIFE, "min_samples": MIN_SAMPLES,
        "rule": RULE,
        "shim_memory_in_reports": "none: the stat reports carry no memory sizes (the receive rings are sized from \
            SO_RCVBUF); shim_offset_at_warmup_kib beside a control is the estimate",
        "max_rss_kib": max_kib, "flat": flat_all && count > 0, "series_judged": count, "series": out,
    })
}

/// The load averages sampled, and their range: every figure reads beside them.
pub fn loadavg(samples: Vec<[f64; 4]>) -> Value {
    let one: Vec<f64> = samples.iter().map(|s| s[1]).collect();
    let (lo, hi) = one.iter().fold((f64::MAX, 0.0f64), |(l, h), x| (l.min(*x), h.max(*x)));
    let mean = if one.is_empty() { 0.0 } else { one.iter().sum::<f64>() / one.len() as f64 };
    json!({
        "one_minute": { "min": if one.is_empty() { 0.0 } else { lo }, "max": hi, "mean": mean },
        "samples": samples, "columns": ["seconds", "1 min", "5 min", "15 min"],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A series of 10 samples, 1 s apart, from `a` KiB growing to `b` in its last half.
    fn series(name: &str, a: f64, b: f64) -> Value {
        let samples: Vec<[f64; 3]> = (0..10).map(|i| [i as f64, if i < 5 { a } else { b }, b]).collect();
        json!({ "name": name, "pid": 1, "samples": samples })
    }

    fn by_name<'a>(r: &'a Value, name: &str) -> &'a Value {
        r["series"].as_array().unwrap().iter().find(|s| s["name"] == name).unwrap()
    }

    #[test]
    fn growth_the_control_shows_too_is_the_programs_own() {
        let r = rss(
            vec![series("sockperf-client", 16000.0, 23000.0), series("control-sockperf-client", 9000.0, 16200.0)],
            10.0,
        );
        let s = by_name(&r, "sockperf-client");
        assert_eq!(s["flat"], false, "{s}");
        assert_eq!(s["flat_by_eudp_share"], true, "{s}");
        assert_eq!(s["eudp_share_of_growth_kib"], -200.0);
        assert_eq!(s["shim_offset_at_warmup_kib"], 7000.0);
        assert!(s["rss_growth_cause"].as_str().unwrap().starts_with("the program itself"), "{s}");
        assert_eq!(by_name(&r, "control-sockperf-client")["judged"], false);
        assert_eq!((r["flat"].as_bool(), r["series_judged"].as_u64()), (Some(true), Some(1)), "{r}");
    }

    #[test]
    fn growth_beyond_the_controls_is_eudps() {
        let r = rss(
            vec![series("sockperf-client", 16000.0, 23000.0), series("control-sockperf-client", 9000.0, 9000.0)],
            10.0,
        );
        let s = by_name(&r, "sockperf-client");
        assert!(s["rss_growth_cause"].as_str().unwrap().starts_with("eudp"), "{s}");
        assert_eq!(r["flat"], false);
    }

    #[test]
    fn without_a_control_growth_misses_and_its_cause_is_unknown() {
        let r = rss(vec![series("dns-client", 1000.0, 2000.0), series("fork-echo", 1000.0, 1010.0)], 10.0);
        assert!(by_name(&r, "dns-client")["rss_growth_cause"].as_str().unwrap().starts_with("unknown"));
        assert_eq!(by_name(&r, "fork-echo")["flat"], true);
        assert_eq!(r["flat"], false);
        // A program of a few samples is not judged.
        let short =
            json!({ "name": "iperf3-server#1", "pid": 2, "samples": [[0.0, 1000.0, 1000.0], [1.0, 5000.0, 5000.0]] });
        let r = rss(vec![series("fork-echo", 1000.0, 1000.0), short], 10.0);
        assert_eq!((r["flat"].as_bool(), r["series_judged"].as_u64()), (Some(true), Some(1)), "{r}");
    }
}
