//! Wire formats for eudp: pure functions over byte slices, no I/O.
//!
//! * [`checksum`] — the Internet checksum (RFC 1071), including the fused
//!   copy-with-checksum that paper 000 moves into the data-movement step.
//! * [`udp`] — the UDP header and its pseudo-header checksum.
//! * [`limits`] — datagram size limits shared by every backend.
//! * [`ether`] — the Ethernet II header and MAC addresses.
//! * [`ipv4`] — the IPv4 header and its header checksum.
//! * [`frame`] — whole Ethernet + IPv4 + UDP frames, built and checked in
//!   user space for the AF_XDP backend.
//! * [`emp`] — EMP frames: DATA with tag and message offset, ACK and NAK.
//! * [`uot`] — UDP over TCP: the hello, frame and run headers of the UOE
//!   transport's byte stream, and its streaming decoder.
#![forbid(unsafe_code)]

pub mod checksum;
pub mod emp;
pub mod ether;
pub mod frame;
pub mod ipv4;
pub mod limits;
pub mod udp;
pub mod uot;
