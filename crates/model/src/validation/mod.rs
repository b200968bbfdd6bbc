//! Headline figures: simulated values next to the published ones.
//!
//! The published numbers live only here, as the yardstick; the presets and
//! the simulator never read them.

mod paper000;
pub mod papers;
mod row;

pub use paper000::rows_000;
pub use papers::{host_crossing_001, rows_001, rows_002, rows_003, rows_004, sides_001, SIZES_001};
pub use row::{holds, markdown, row, summary, text, Basis, Check, Row};

/// Every headline row of every preset that is available.
pub fn validate() -> Result<Vec<Row>, String> {
    let mut rows = rows_000()?;
    rows.extend(papers::rows_other()?);
    Ok(rows)
}
