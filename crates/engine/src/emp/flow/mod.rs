//! The two halves of one flow as sans-I/O state machines: [`send`] (the
//! sender's transmission records, window, timer; [`scoreboard`] its view
//! of frames in flight for selective repeat, [`rtt`] its timeout from
//! measured round trips) and [`recv`] (the receiver's
//! expected sequence number, held frames and acknowledgments). Time comes
//! in as an argument; neither touches a socket or a thread.

pub mod recv;
pub mod rtt;
pub mod scoreboard;
pub mod send;
pub mod seq;
