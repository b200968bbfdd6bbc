//! Inputs and outputs shared by `eudp model` and `eudp sim`: presets with
//! overrides, the default size sweep and the files written.

use super::args::PresetArgs;
use crate::preset::{self, apply_overrides, Preset};

/// Loads the preset and applies the bus and link overrides.
pub fn load_preset(name: &str, bus: Option<&str>, link_mbps: Option<f64>) -> Result<Preset, String> {
    let mut p = preset::load(&preset::resolve(name)?)?;
    apply_overrides(&mut p, bus, link_mbps)?;
    Ok(p)
}

/// [`load_preset`] from a subcommand's preset options.
pub fn load(a: &PresetArgs) -> Result<Preset, String> {
    let mut p = load_preset(&a.preset, a.bus.as_deref(), a.link_mbps)?;
    if let Some(f) = &a.step_costs {
        crate::step_costs::apply(&mut p, &crate::step_costs::load(f)?, f);
    }
    Ok(p)
}

/// Powers of two from 1 up to `max`.
pub fn default_sizes(max: f64) -> Vec<f64> {
    let mut v = vec![1.0];
    let mut x = 2.0;
    while x <= max {
        v.push(x);
        x *= 2.0;
    }
    v
}

pub fn write_file(path: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {path}: {e}"))
}

/// The bandwidth plot's file beside the latency plot's.
pub fn bw_path(f: &str) -> String {
    match f.strip_suffix(".svg") {
        Some(s) => format!("{s}-bw.svg"),
        None => format!("{f}-bw.svg"),
    }
}
