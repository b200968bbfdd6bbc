//! Spin verification of the pipeline and engine state machines (issue 6).
pub mod cli;
