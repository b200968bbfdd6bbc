//! Numbers with a source.
//!
//! Every numeric input of a preset is written as `{"v": 1280, "cite": "000 §5"}`.
//! A citation starting with `ASSUMPTION` marks a value the papers do not give;
//! `eudp sim presets --assumptions` lists them so they are never hidden.

use serde::{Deserialize, Serialize};

/// A numeric input and where it comes from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Cited {
    /// The value, in the unit implied by the field name.
    pub v: f64,
    /// Paper and section/table, e.g. `"001 Table 1"`, or `"ASSUMPTION: ..."`.
    pub cite: String,
}

impl Cited {
    /// A value with a citation.
    pub fn new(v: f64, cite: &str) -> Self {
        Cited { v, cite: cite.to_string() }
    }

    /// True when the value is not taken from a paper.
    pub fn is_assumption(&self) -> bool {
        self.cite.trim_start().to_ascii_uppercase().starts_with("ASSUMPTION")
    }
}

/// Checks that a citation is present (non-empty).
pub fn check(c: &Cited, field: &str) -> Result<(), String> {
    if c.cite.trim().is_empty() {
        return Err(format!("{field}: empty citation (every input must cite a paper section/table or say ASSUMPTION)"));
    }
    if !c.v.is_finite() {
        return Err(format!("{field}: value is not a finite number"));
    }
    Ok(())
}
