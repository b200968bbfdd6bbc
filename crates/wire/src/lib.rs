//! Wire formats for eudp: pure functions over byte slices, no I/O.
//!
//! * [`checksum`] — the Internet checksum (RFC 1071), including the fused
//!   copy-with-checksum that paper 000 moves into the data-movement step.
//! * [`udp`] — the UDP header and its pseudo-header checksum.
//! * [`limits`] — datagram size limits shared by every backend.
#![forbid(unsafe_code)]

pub mod checksum;
pub mod limits;
pub mod udp;
