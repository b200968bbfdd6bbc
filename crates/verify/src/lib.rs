//! Spin verification of the pipeline and engine state machines (issue 6).
//!
//! Three models are checked:
//!
//! * `firmware`: the fine-grained pipelining NIC firmware of paper 000 §4.3
//!   (threads SDMA, SEND, RECV, RDMA sharing one host DMA engine), hand
//!   written in `promela/firmware.pml`, with Table 1's formulas;
//! * `engine`: eudp's two-level send queue, generated from the transition
//!   table in `eudp_engine::machine` so model and code cannot drift;
//! * `emp`: one EMP flow (selective repeat, cumulative acks, NAKs) over lossy,
//!   duplicating, reordering channels, generated from the transition table
//!   in `eudp_engine::emp::table`.
//!
//! [`run`] writes the models, drives `spin -a`, `cc` and `pan`, and reports a
//! verdict per property; [`BROKEN`] lists deliberately broken variants that
//! must be reported violated.
pub mod cli;
pub mod emp_model;
pub mod models;
pub mod spin;

pub use models::{Broken, Expect, Mode, Model, Property, BROKEN};
pub use spin::{run, Options, Outcome, Report, Verdict};
