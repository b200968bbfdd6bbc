//! Asynchronous UDP: sends from the application's own buffers, which come
//! back by completion (paper 001's Asynchronous UDP).
//!
//! [`AsyncSender`] sends with `MSG_ZEROCOPY`: the kernel pins the pages of
//! the caller's buffer instead of copying them, and a notification on the
//! socket's error queue says when it is done with them. Until then the
//! sender holds the buffer; a [`Completion`] hands it back with the
//! caller's token, the result of that one datagram and whether the kernel
//! copied after all. On loopback and veth it always does (the receiving
//! socket must own its bytes), and the completion says so.
//!
//! * [`send`] — the sender, its configuration, completions and back-pressure.
//! * [`recv`] — the receiver: a multishot io_uring receive into a ring of
//!   its buffers, lent to the application and given back, GRO runs split
//!   in place.
//! * `inflight` — the sends the kernel holds, keyed by notification id.
//!
//! The raw calls are in [`crate::sys::zerocopy`] and [`crate::sys::uring_recv`].

mod buf;
mod inflight;
pub mod recv;
pub mod send;
mod uring_engine;

pub use buf::SendBuf;
pub use recv::{AsyncReceiver, RecvConfig, RecvStats, RxLease};
pub use send::{AsyncConfig, AsyncSender, AsyncStats, Completion, Datagram, Full, SendEngine};
