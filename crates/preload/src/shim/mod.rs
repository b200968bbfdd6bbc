//! The shim's state: the table of the application's UDP sockets, each
//! socket's mode (not yet accelerated, on the engine, or on the plain
//! kernel path), the engine of this process generation, fallbacks, the
//! signal policy.
//!
//! Safe Rust except the fork hand-over of the table lock (see
//! `fork`) and the engine pointer; raw pointers stay in `hooks`, libc's own functions in
//! `real`.
//!
//! Submodules, lowest first: [`sock`] (the per-socket state), [`tls`] (the
//! per-thread state), [`generation`] (the engine and transport of this
//! process generation), [`table`] (sockets by descriptor), [`io`]
//! (receives and sends on an endpoint), [`attach`] (adoption by the
//! engine), [`fallback`] (the move to the kernel path), [`lost`] (what a
//! socket loses on the kernel path), [`fork`], [`report`] (a socket's entry
//! in the stats report), [`multicast`] (group members under the tcp and xdp
//! transports), [`live_trace`] (`eudp trace --attach`).

mod attach;
mod fallback;
mod fork;
mod generation;
mod io;
pub mod live_trace;
mod lost;
mod multicast;
mod report;
mod sock;
mod table;
mod tls;

pub use fallback::engine_failed;
pub use fork::*;
pub use generation::*;
pub use io::*;
pub use multicast::*;
pub use sock::*;
pub use table::*;
pub use tls::*;
