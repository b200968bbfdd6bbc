//! Per-endpoint counters: lock-free to update, copied out as a [`StatsSnapshot`].

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Buckets of the batch-size histogram: datagrams per backend send call,
/// in powers of two (1, 2–3, 4–7, …, 512+).
pub const HIST_BUCKETS: usize = 10;

/// Live counters of one endpoint.
#[derive(Debug, Default)]
pub struct Stats {
    pub engine_batches: AtomicU64,
    pub caller_flushes: AtomicU64,
    pub sleep_flushes: AtomicU64,
    pub datagrams_sent: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub send_calls: AtomicU64,
    pub gso_messages: AtomicU64,
    pub batch_hist: [AtomicU64; HIST_BUCKETS],
    pub drop_send_error: AtomicU64,
    pub drop_shutdown: AtomicU64,
    pub gso_fallbacks: AtomicU64,
    pub datagrams_received: AtomicU64,
    pub bytes_received: AtomicU64,
    pub recv_calls: AtomicU64,
    pub gro_superpackets: AtomicU64,
    pub direct_recv_calls: AtomicU64,
    pub drop_ring_full: AtomicU64,
    pub drop_truncated: AtomicU64,
    pub drop_close: AtomicU64,
    pub errors_surfaced: AtomicU64,
}

/// Index of the histogram bucket for a batch of `n` datagrams.
pub fn hist_bucket(n: u64) -> usize {
    (63 - n.max(1).leading_zeros() as usize).min(HIST_BUCKETS - 1)
}

impl Stats {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Relaxed);
    }

    /// Records one engine send call carrying `datagrams`.
    pub(crate) fn record_batch(&self, datagrams: u64) {
        Self::add(&self.batch_hist[hist_bucket(datagrams)], 1);
    }

    /// Copies the counters out.
    pub fn snapshot(&self) -> StatsSnapshot {
        let g = |c: &AtomicU64| c.load(Relaxed);
        let sent = g(&self.datagrams_sent);
        let calls = g(&self.send_calls);
        StatsSnapshot {
            // Filled from the send queue's own counters by the endpoint.
            direct_posts: 0,
            queued_posts: 0,
            send_full: 0,
            engine_batches: g(&self.engine_batches),
            caller_flushes: g(&self.caller_flushes),
            sleep_flushes: g(&self.sleep_flushes),
            datagrams_sent: sent,
            bytes_sent: g(&self.bytes_sent),
            send_calls: calls,
            gso_messages: g(&self.gso_messages),
            send_calls_per_datagram: if sent == 0 { 0.0 } else { calls as f64 / sent as f64 },
            batch_hist: std::array::from_fn(|i| g(&self.batch_hist[i])),
            drop_send_error: g(&self.drop_send_error),
            drop_shutdown: g(&self.drop_shutdown),
            gso_fallbacks: g(&self.gso_fallbacks),
            datagrams_received: g(&self.datagrams_received),
            bytes_received: g(&self.bytes_received),
            recv_calls: g(&self.recv_calls),
            gro_superpackets: g(&self.gro_superpackets),
            direct_recv_calls: g(&self.direct_recv_calls),
            drop_ring_full: g(&self.drop_ring_full),
            drop_truncated: g(&self.drop_truncated),
            drop_close: g(&self.drop_close),
            errors_surfaced: g(&self.errors_surfaced),
            // Read from the kernel socket by `Endpoint::report`.
            socket_drops: None,
            // Counted by the owner of the socket after a hand-over.
            drop_fallback_close: 0,
            drop_kernel_rcvbuf: 0,
            // Read from the transport by `Endpoint::report`.
            drop_tcp_send: 0,
            drop_tcp_receive: 0,
            drop_tcp_exit: 0,
        }
    }
}

/// A point-in-time copy of an endpoint's counters.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct StatsSnapshot {
    /// Sends posted on the caller's thread (L1 empty, L2 room).
    pub direct_posts: u64,
    /// Sends queued in L1 for the engine.
    pub queued_posts: u64,
    /// Sends that found L1 full (blocked or EAGAIN).
    pub send_full: u64,
    /// Backend send calls carrying queued datagrams (made by the engine,
    /// or by a sender's own thread when it drained a full L1).
    pub engine_batches: u64,
    /// Times a sender's own thread drained L1 because a full batch was
    /// queued, instead of waking the engine.
    pub caller_flushes: u64,
    /// Times a remainder waiting out its coalescing interval in L1 was sent
    /// at once because the program's thread went to sleep (a blocking
    /// receive, `poll`, `select`, `epoll_wait`).
    pub sleep_flushes: u64,
    /// Datagrams accepted by the kernel.
    pub datagrams_sent: u64,
    pub bytes_sent: u64,
    /// Send syscalls, direct and engine.
    pub send_calls: u64,
    /// GSO super-packets among the engine's messages.
    pub gso_messages: u64,
    /// `send_calls / datagrams_sent`.
    pub send_calls_per_datagram: f64,
    /// Engine batch sizes: bucket i counts calls of 2^i .. 2^(i+1)-1 datagrams.
    pub batch_hist: [u64; HIST_BUCKETS],
    /// Queued datagrams the kernel refused (error recorded for the caller).
    pub drop_send_error: u64,
    /// Queued datagrams discarded because the endpoint was dropped without flush.
    pub drop_shutdown: u64,
    /// Times GSO was turned off for this socket after the kernel rejected it.
    pub gso_fallbacks: u64,
    pub datagrams_received: u64,
    pub bytes_received: u64,
    /// Receive syscalls (engine and caller).
    pub recv_calls: u64,
    /// Received messages that carried more than one datagram (GRO).
    pub gro_superpackets: u64,
    /// Receive syscalls made on the caller's thread because the ring was empty.
    pub direct_recv_calls: u64,
    /// Datagrams dropped because the receive ring was full.
    pub drop_ring_full: u64,
    /// Datagrams dropped because they exceeded the receive buffer.
    pub drop_truncated: u64,
    /// Datagrams the ring still held when the endpoint was dropped (the
    /// program closed the socket, or ended, without reading them).
    pub drop_close: u64,
    /// Asynchronous errors reported to the caller.
    pub errors_surfaced: u64,
    /// Messages the kernel socket under the endpoint dropped (`SO_MEMINFO`
    /// drops: its own receive buffer was full, or a checksum failed). A
    /// GRO message counts once however many datagrams it carried. With the
    /// ring full the engine leaves arrivals in the socket, so a receiver
    /// that falls behind loses here rather than in `drop_ring_full`.
    /// `None` unless read (`Endpoint::report`; it costs a syscall).
    pub socket_drops: Option<u64>,
    /// Datagrams taken off the engine when the socket moved to the kernel
    /// path (kept for the program: the ring, and the kernel socket as the
    /// hand-over drained it) that the program closed the socket without
    /// receiving. Counted by the preload shim.
    pub drop_fallback_close: u64,
    /// Messages the kernel socket dropped after the socket moved to the
    /// kernel path (`SO_MEMINFO` drops since the hand-over: its receive
    /// buffer was full). Counted by the preload shim.
    pub drop_kernel_rcvbuf: u64,
    /// Under the `tcp` transport: datagrams of this socket the transport
    /// dropped on send (queue full, deadlines, lane cap, a frame cut by a
    /// failed connection, plain UDP that could not go out); per reason in
    /// the transport's counters.
    pub drop_tcp_send: u64,
    /// Under the `tcp` transport: datagrams for this socket dropped on
    /// receive (its queue full, or from another source than its peer).
    pub drop_tcp_receive: u64,
    /// Under the `tcp` transport: datagrams this socket sent that were
    /// still queued on a lane when the process ended (after its exit
    /// drain's bound).
    pub drop_tcp_exit: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1), 0);
        assert_eq!(hist_bucket(2), 1);
        assert_eq!(hist_bucket(3), 1);
        assert_eq!(hist_bucket(64), 6);
        assert_eq!(hist_bucket(1 << 20), HIST_BUCKETS - 1);
    }
}
