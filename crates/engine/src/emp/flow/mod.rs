//! The two halves of one flow as sans-I/O state machines: [`send`] (the
//! sender's transmission records, window, timer) and [`recv`] (the
//! receiver's expected sequence number and its acknowledgments). Time comes
//! in as an argument; neither touches a socket or a thread.

pub mod recv;
pub mod send;
pub mod seq;
