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
//! * [`config`] — [`config::EmpConfig`], the endpoint's and flows' knobs.
//! * [`flow`] — the sans-I/O send and receive halves of a flow.
//! * [`matching`] — posted receives and the unexpected-message queue.
//! * [`peer`] — [`peer::PeerId`].

pub mod config;
pub mod event;
pub mod flow;
pub mod matching;
pub mod peer;
