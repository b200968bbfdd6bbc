//! Least-squares fit of per-layer `duration = g + bytes·G` from a trace.

use crate::analytic::Layer;
use crate::timeline::TraceRecord;

/// A fitted layer and the quality of its fit.
#[derive(Debug, Clone)]
pub struct Fitted {
    pub layer: Layer,
    pub samples: usize,
    /// Root-mean-square residual (ns).
    pub rms_ns: f64,
    /// Warning when G could not be determined (one packet size only).
    pub note: Option<String>,
}

/// Fits every layer, in order of first appearance in the trace.
pub fn fit(recs: &[TraceRecord]) -> Result<Vec<Fitted>, String> {
    if recs.is_empty() {
        return Err("trace has no records".into());
    }
    let mut order: Vec<String> = Vec::new();
    for r in recs {
        let name = match &r.host {
            Some(h) => format!("{h}:{}", r.layer),
            None => r.layer.clone(),
        };
        if !order.contains(&name) {
            order.push(name);
        }
    }
    let mut out = Vec::new();
    for name in order {
        let pts: Vec<(f64, f64)> = recs
            .iter()
            .filter(|r| match &r.host {
                Some(h) => format!("{h}:{}", r.layer) == name,
                None => r.layer == name,
            })
            .map(|r| (r.bytes as f64, r.t_end_ns - r.t_start_ns))
            .collect();
        let n = pts.len() as f64;
        let mx = pts.iter().map(|p| p.0).sum::<f64>() / n;
        let my = pts.iter().map(|p| p.1).sum::<f64>() / n;
        let sxx: f64 = pts.iter().map(|p| (p.0 - mx).powi(2)).sum();
        let sxy: f64 = pts.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
        let (g, big_g, note) = if sxx <= 1e-9 {
            (my, 0.0, Some("single packet size: G not identifiable, g = mean duration".to_string()))
        } else {
            let big_g = sxy / sxx;
            (my - big_g * mx, big_g, None)
        };
        let rms = (pts.iter().map(|p| (p.1 - g - big_g * p.0).powi(2)).sum::<f64>() / n).sqrt();
        out.push(Fitted { layer: Layer::new(&name, g, big_g, 0.0), samples: pts.len(), rms_ns: rms, note });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_line() {
        let recs: Vec<TraceRecord> = [1000u64, 2000, 4000, 8000]
            .iter()
            .enumerate()
            .map(|(i, &b)| TraceRecord {
                layer: "dma".into(),
                packet: i,
                bytes: b,
                t_start_ns: 100.0,
                t_end_ns: 100.0 + 500.0 + 7.5 * b as f64,
                host: None,
            })
            .collect();
        let f = fit(&recs).unwrap();
        assert_eq!(f.len(), 1);
        assert!((f[0].layer.g_ns - 500.0).abs() < 1e-6);
        assert!((f[0].layer.big_g_ns - 7.5).abs() < 1e-9);
        assert!(f[0].rms_ns < 1e-6);
    }

    #[test]
    fn empty_is_an_error() {
        assert!(fit(&[]).is_err());
    }
}
