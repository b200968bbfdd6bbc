//! The eudp offload engine.
//!
//! An application hands datagrams to an [`Endpoint`]; an engine thread (the
//! "NIC processor" of paper 000) does the per-packet work through a
//! [`backend`]. Layers, from the application down:
//!
//! * [`endpoint`] — the sockets-like API (send/recv, blocking, timeouts,
//!   pollable readiness, stats).
//! * [`queue`] — the two-level send queue (L1 in host memory, bounded L2)
//!   whose transitions are the state machine in [`machine`].
//! * [`batch`] — `gso_batch`: forming GSO super-packets and `sendmmsg` calls.
//! * [`ring`] — the byte-bounded receive ring with zero-copy GRO split.
//! * [`engine`] — the engine thread and its scheduling.
//! * `serve` — what the engine thread needs of an endpoint (a trait the
//!   endpoint implements), so that the engine does not depend on it.
//! * [`backend`] — the transports.
//! * [`sys`] — the engine's system calls; with the transports' own raw
//!   layers, the only `unsafe` code of the crate.
//! * [`emp`] — EMP, reliable tagged messaging over UDP.
//! * [`async_udp`] — sends from the application's buffers with completions.
//! * [`fdspace`] — where the engine's own descriptors go (a hook the
//!   preload shim sets).
#![deny(unsafe_code, unsafe_op_in_unsafe_fn)]

pub mod async_udp;
pub mod backend;
pub mod batch;
pub mod config;
pub mod emp;
pub mod endpoint;
pub mod engine;
pub mod failure;
pub mod fdspace;
pub mod log;
pub mod machine;
pub mod queue;
pub mod ring;
mod serve;
pub mod settings;
pub mod stat_dir;
pub mod stats;
pub mod sys;
pub mod testpanic;
pub mod tracepoint;

pub use config::Config;
pub use endpoint::{
    is_handed_over, Endpoint, FinalCounters, KeptDatagram, Received, RecvFlags, RingLen, SendFlags, Taken,
};
pub use engine::Engine;
pub use stats::StatsSnapshot;
