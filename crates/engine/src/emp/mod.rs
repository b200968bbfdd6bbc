//! EMP: reliable tagged messaging over UDP (paper 003).
//!
//! A sender fragments each message into frames of the path MTU and keeps a
//! transmission record until the receiver acknowledges them; the receiver
//! acknowledges groups of frames, answers a gap with a negative
//! acknowledgment, drops duplicates, and drops the first frame of a message
//! that matches no pre-posted receive. [`event`] names the steps of one flow
//! (one sender, one receiver); the protocol code records them and the
//! transition table checks them.
//!
//! * [`endpoint`] — [`endpoint::EmpEndpoint`], the application's API.
//! * [`completion`] — completions and the pollable completion queue.
//! * [`counters`] — per-peer and per-endpoint counters.
//! * [`config`] — [`config::EmpConfig`], the endpoint's and flows' knobs.
//! * [`runtime`] — the engine thread of the base scheme; its child
//!   `staged` runs the two engine threads of the other schemes.
//! * [`scheme`] — [`scheme::Scheme`] and its table of stages per thread.
//! * [`handoff`] — the bounded queues between the stages of two threads.
//! * [`stages`] — the seven steps of the protocol over separate send-side
//!   and receive-side state.
//! * [`steptrace`] — per-step start and end stamps of the stages (tracing).
//! * [`transmit`] — the transmit batch (`sendmmsg`, GSO runs).
//! * [`shared`] — commands and state the application and engine share.
//! * [`flow`] — the sans-I/O send and receive halves of a flow.
//! * [`matching`] — posted receives and the unexpected-message queue.
//! * [`recv_buffer`] — where a posted receive's bytes land (an allocated
//!   buffer, the caller's vector, caller memory) and its completion.
//! * [`peer`] — [`peer::PeerId`]; [`peermap`] — per-peer state by id.
//! * [`table`] — the flow as one transition table: the trace checker and
//!   the Promela model `eudp verify` checks.

pub mod completion;
pub mod config;
pub mod counters;
pub mod endpoint;
pub mod event;
pub mod flow;
pub mod handoff;
pub mod lease;
pub mod matching;
pub mod peer;
pub mod peermap;
pub mod recv_buffer;
pub mod runtime;
pub mod scheme;
pub mod shared;
pub mod stages;
pub mod steptrace;
pub mod table;
pub mod transmit;
pub mod waiter;

pub use completion::{Completion, Op, Status};
pub use config::EmpConfig;
pub use counters::EmpCounters;
pub use endpoint::EmpEndpoint;
pub use peer::PeerId;
pub use recv_buffer::RecvBuffer;
pub use scheme::{Scheme, Stage};
