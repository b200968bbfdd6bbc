//! The knobs of an EMP endpoint and its flows.

use crate::emp::scheme::Scheme;
use std::time::Duration;

/// Bytes of IPv4 and UDP headers below every EMP frame.
const IP_UDP_HEADERS: usize = 20 + 8;
/// Bytes an IPv6 header adds to an IPv4 one.
const IPV6_EXTRA: usize = 40 - 20;

/// Configuration of an EMP endpoint (and of each of its flows).
#[derive(Clone, Debug)]
pub struct EmpConfig {
    /// Payload bytes per data frame; [`EmpConfig::for_mtu`] derives it
    /// from the path MTU so that a frame fills one IPv4 packet. An endpoint
    /// bound to IPv6 sends frames 20 bytes shorter
    /// ([`EmpConfig::for_ipv6`]), so that they fit the same MTU.
    pub frame_payload: usize,
    /// The receiver acknowledges every `ack_group` accepted frames (and
    /// each message's last frame). At most `window`.
    pub ack_group: u32,
    /// Frames a sender keeps in flight unacknowledged.
    pub window: u32,
    /// How long the acknowledgment owed for a message's last frame waits
    /// for a data frame of the reverse flow to carry it before it leaves
    /// as a frame of its own (zero: at once). A full group, a gap or a
    /// duplicate is acknowledged at once regardless.
    pub ack_delay: Duration,
    /// Retransmission timeout before a round trip is measured; after, the
    /// timeout follows the measured round trips (smoothed, plus four mean
    /// deviations), within `[rto_min, rto_max]`. It doubles per timeout
    /// up to `rto_max`.
    pub rto_initial: Duration,
    /// Smallest retransmission timeout from measured round trips.
    pub rto_min: Duration,
    /// Largest retransmission timeout.
    pub rto_max: Duration,
    /// A flow that makes no progress for this long gives up: its messages
    /// complete with a timeout error.
    pub deadline: Duration,
    /// Bytes of messages one flow queues (sent or not) before a send is
    /// refused as would-block; sized like a kernel send buffer.
    pub send_queue_bytes: usize,
    /// Operations (sends and receives) posted and not yet taken back as
    /// completions that the endpoint admits; a post beyond it is refused
    /// as would-block, so an application that never reads its completions
    /// holds at most this many (libfabric's completion queue size).
    pub completion_queue: usize,
    /// Messages the unexpected-message queue holds (0: off, EMP's rule).
    pub unexpected_messages: usize,
    /// Bytes the unexpected-message queue holds.
    pub unexpected_bytes: usize,
    /// Record each flow's events (for the transition table's checker).
    pub record_events: bool,
    /// Where the protocol's steps run: one engine thread or two.
    pub scheme: Scheme,
    /// A thread in [`crate::emp::EmpEndpoint::wait`] polls the socket and
    /// runs the protocol's rounds itself this long before it sleeps, so a
    /// reply that comes within it costs no wake-up (zero: sleep at once).
    /// Worth it only with a core to spare: on a loaded host the spinning
    /// thread takes the CPU the peer's threads need.
    pub poll_spin: Duration,
    /// Base scheme: a thread in `wait` leases the socket and sleeps in a
    /// blocking receive on it (`emp::lease`); off, it sleeps in epoll and
    /// the engine thread always watches the socket.
    pub blocking_wait: bool,
    /// Bytes asked of the kernel for the socket's send and receive
    /// buffers: a few windows of frames in flight.
    pub socket_buffer: usize,
}

impl Default for EmpConfig {
    fn default() -> Self {
        EmpConfig {
            frame_payload: Self::payload_for_mtu(1500),
            ack_group: 16,
            window: 512,
            ack_delay: Duration::from_micros(200),
            rto_initial: Duration::from_millis(20),
            rto_min: Duration::from_millis(2),
            rto_max: Duration::from_millis(500),
            deadline: Duration::from_secs(5),
            send_queue_bytes: 4 << 20,
            blocking_wait: true,
            completion_queue: 16 << 10,
            unexpected_messages: 0,
            unexpected_bytes: 0,
            record_events: false,
            scheme: Scheme::Base,
            poll_spin: Duration::ZERO,
            socket_buffer: 8 << 20,
        }
    }
}

impl EmpConfig {
    /// The default configuration with frames sized for a path MTU of `mtu`.
    pub fn for_mtu(mtu: usize) -> Self {
        EmpConfig { frame_payload: Self::payload_for_mtu(mtu), ..Self::default() }
    }

    /// Payload bytes of one frame on a path of `mtu` (IPv4).
    pub fn payload_for_mtu(mtu: usize) -> usize {
        mtu.saturating_sub(IP_UDP_HEADERS + eudp_wire::emp::DATA_HEADER_LEN).max(1)
    }

    /// The configuration of an endpoint bound to IPv6: frames 20 bytes
    /// shorter, for IPv6's 40-byte header. Over IPv4 (a mapped peer) they
    /// are 20 bytes short of full; at the IPv4 size they would be
    /// fragmented over IPv6, and their GSO runs refused.
    pub fn for_ipv6(&self) -> Self {
        let mut c = self.normalised();
        c.frame_payload = c.frame_payload.saturating_sub(IPV6_EXTRA).max(1);
        c
    }

    /// The configuration with its limits made consistent: a window of at
    /// least one frame, an ack group within it, a frame payload that fits a
    /// UDP datagram.
    pub fn normalised(&self) -> Self {
        let mut c = self.clone();
        c.window = c.window.clamp(1, 1 << 20);
        c.ack_group = c.ack_group.clamp(1, c.window);
        c.frame_payload =
            c.frame_payload.clamp(1, eudp_wire::limits::MAX_UDP_PAYLOAD_V4 - eudp_wire::emp::DATA_HEADER_LEN);
        c.rto_initial = c.rto_initial.max(Duration::from_micros(100));
        c.rto_min = c.rto_min.max(Duration::from_micros(100));
        c.rto_max = c.rto_max.max(c.rto_initial).max(c.rto_min);
        c.poll_spin = c.poll_spin.min(Duration::from_millis(10));
        c.ack_delay = c.ack_delay.min(c.rto_min / 2);
        c.socket_buffer = c.socket_buffer.clamp(4096, i32::MAX as usize);
        c.completion_queue = c.completion_queue.max(1);
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_frames_fit_the_mtu_ipv4_frames_fill() {
        let c = EmpConfig::for_mtu(1500);
        assert_eq!(c.frame_payload + eudp_wire::emp::DATA_HEADER_LEN + 8 + 20, 1500);
        assert_eq!(c.for_ipv6().frame_payload + eudp_wire::emp::DATA_HEADER_LEN + 8 + 40, 1500);
        assert_eq!(EmpConfig { frame_payload: 5, ..EmpConfig::default() }.for_ipv6().frame_payload, 1);
    }
}
