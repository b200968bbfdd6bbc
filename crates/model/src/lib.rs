//! Analytical model and discrete-event simulator (issue 5).
pub mod cli;
