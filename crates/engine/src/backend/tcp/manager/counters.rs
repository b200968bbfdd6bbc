//! Counters of one transport: atomics the parts bump ([`Counters`]) and
//! their public snapshot ([`TcpStats`]). No locks.

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

macro_rules! counters {
    ($($name:ident: $doc:literal,)*) => {
        #[derive(Debug, Default)]
        pub(in crate::backend::tcp) struct Counters { $(pub(in crate::backend::tcp) $name: AtomicU64,)* }
        /// Counters of one UOE transport (all lanes, connections, endpoints).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
        pub struct TcpStats { $(#[doc = $doc] pub $name: u64,)* }
        impl Counters {
            pub(super) fn snapshot(&self) -> TcpStats { TcpStats { $($name: self.$name.load(Relaxed),)* } }
        }
        impl TcpStats {
            /// Every counter by name, in declaration order.
            pub fn fields(&self) -> Vec<(&'static str, u64)> { vec![$((stringify!($name), self.$name),)*] }
        }
    };
}

counters! {
    conns_opened: "Outgoing connections attempted (sockets created).",
    conns_accepted: "Incoming connections accepted.",
    conns_closed: "Connections closed for any reason.",
    connect_failures: "Connection attempts that failed (refused, unreachable, cap).",
    reconnects: "Lanes that came up again after having been up before.",
    rejected_conns: "Connections refused by the caps (total or per peer).",
    bad_hello: "Connections closed because the preamble was not ours.",
    malformed: "Connections closed on a malformed frame header.",
    oversized: "Connections closed on a frame longer than 65507 bytes.",
    hello_timeouts: "Connections closed for not sending the preamble in time.",
    frames_sent: "Datagrams written to connections.",
    bytes_sent: "Bytes written to connections (headers included).",
    writes: "send/sendmsg calls that wrote to connections (joined runs share one).",
    frames_received: "Datagrams decoded from connections.",
    bytes_received: "Payload bytes decoded.",
    drop_queue_full: "Datagrams dropped: lane queue full while not connected (DML bound).",
    drop_deadline: "Datagrams dropped: waited past the DML deadline while not connected.",
    drop_max_wait: "Datagrams dropped: waited past the bound on a stalled connection.",
    drop_no_lane: "Datagrams dropped: lane cap reached.",
    drop_no_port: "Datagrams received for a port no endpoint is bound to (and no kernel UDP socket either, or no CAP_NET_RAW to reach one).",
    forwarded_kernel: "Datagrams for a port no endpoint is bound to, handed to the kernel UDP socket bound there (a socket on the kernel path, another process's) with the sender's address.",
    kernel_received: "Datagrams an endpoint read from its own kernel UDP socket (from senders not on this transport, or handed over by a listener).",
    drop_rx_full: "Datagrams dropped: the endpoint's receive queue was full.",
    drop_filtered: "Datagrams dropped by a connected endpoint (other source).",
    lost_partial: "Datagrams cut off by a connection failure mid-frame.",
    block_waits: "DML (b): sends that blocked waiting for a connection.",
    block_timeouts: "DML (b): blocks that timed out and fell back to queueing.",
    backpressure_waits: "Sends refused (EAGAIN) by a full connected lane; an application thread waits for room (wait_writable), the engine waits briefly on a lane that drains fast (engine_waits) or watches the socket's room descriptor.",
    engine_waits: "Refusals the engine thread, having nothing else to do, began to wait out on the lane (up to 10 ms) instead of watching the room descriptor.",
    engine_wait_timeouts: "Of engine_waits, those that ended without room after 10 ms (the batch then waits for the room descriptor).",
    engine_wait_yields: "Of engine_waits, those cut short because other work came for the engine (the batch then waits for the room descriptor).",
    cc_errors: "Connections on which TCP_CONGESTION could not be set.",
    coalesced_sends: "Datagrams of a streaming application thread gathered for a block write.",
    cork_timer_flushes: "Gathered blocks the manager wrote when the coalescing delay ran out.",
    frames_in_place: "Datagrams read straight into receive blocks (not copied by the manager).",
    rx_direct_reads: "Reads of a connection by the receiving thread of the endpoint its bulk flow goes to (not by the manager).",
    rx_delegations: "Times a connection was handed to an endpoint's readers (see rx_direct_reads).",
    rx_stall_revokes: "Connections the manager took back from an endpoint that had not read them for rx_stall while input waited (its program stopped receiving).",
    frames_shifted: "Datagrams of an in-place read that an unforeseen header had shifted, moved into their slots with one copy (not through the decoder).",
    plain_sent: "DML (c): datagrams sent as plain UDP from the endpoint's kernel socket to a peer host that refused the UOE port (no UOE there).",
    plain_lost: "DML (c): datagrams for such a peer that could not be sent as plain UDP (the sending socket was gone or its buffer stayed full).",
    listen_takeovers: "Times this transport, running without a listener, took the pre-decided port later (its holder had ended or given it back).",
    listen_yields: "Times this fork child gave the port back to its parent, whose transport started after the child had taken it.",
    exit_open_conns: "Connections still open when the process ended, after its exit drain's bound: what their peers wrote on them since is lost.",
    drop_exit: "Datagrams still queued on a lane when the process ended (after its exit drain's bound) or the transport shut down.",
}

/// The drops of one endpoint's datagrams, beside the transport's counters
/// by reason: what it sent and the transport dropped (queue full,
/// deadlines, lane cap, a frame cut by a failed connection, plain UDP
/// that could not be sent), what was sent to it and dropped (its queue
/// full, filtered by its peer), and what it sent that was still queued
/// when the process ended.
#[derive(Debug, Default)]
pub(in crate::backend::tcp) struct SockDrops {
    pub(in crate::backend::tcp) send: AtomicU64,
    pub(in crate::backend::tcp) receive: AtomicU64,
    pub(in crate::backend::tcp) exit: AtomicU64,
}

impl SockDrops {
    pub(in crate::backend::tcp) fn snapshot(&self) -> crate::backend::TransportDrops {
        crate::backend::TransportDrops {
            send: self.send.load(Relaxed),
            receive: self.receive.load(Relaxed),
            exit: self.exit.load(Relaxed),
        }
    }
}

impl Counters {
    pub(super) fn inc(c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }
    pub(in crate::backend::tcp) fn add(c: &AtomicU64, n: u64) {
        if n > 0 {
            c.fetch_add(n, Relaxed);
        }
    }
}
