//! Size limits that every path must enforce identically to the kernel.

/// Largest UDP payload over IPv4: 65535 − 20 (IPv4) − 8 (UDP).
pub const MAX_UDP_PAYLOAD_V4: usize = 65_507;
/// Largest UDP payload over IPv6 without jumbograms: 65535 − 8 (UDP).
/// (The IPv6 header is not counted in the payload length field.)
pub const MAX_UDP_PAYLOAD_V6: usize = 65_527;
/// Largest total payload one UDP GSO send may carry (the kernel limits the
/// whole super-packet to an IP datagram).
pub const GSO_MAX_BYTES_V4: usize = MAX_UDP_PAYLOAD_V4;
/// As [`GSO_MAX_BYTES_V4`] for IPv6.
pub const GSO_MAX_BYTES_V6: usize = MAX_UDP_PAYLOAD_V6;
/// Segment count limit of UDP GSO that every kernel with UDP GSO accepts
/// (`UDP_MAX_SEGMENTS` was 64 until upstream raised it to 128). The engine
/// uses [`GSO_MAX_SEGMENTS_RAISED`] where a probe shows the kernel accepts it.
pub const GSO_MAX_SEGMENTS: usize = 64;
/// `UDP_MAX_SEGMENTS` of recent kernels (6.18 here: 128 segments accepted,
/// 129 fail with `EINVAL`).
pub const GSO_MAX_SEGMENTS_RAISED: usize = 128;

/// Maximum payload for the address family (`v6` true for IPv6).
pub fn max_payload(v6: bool) -> usize {
    if v6 {
        MAX_UDP_PAYLOAD_V6
    } else {
        MAX_UDP_PAYLOAD_V4
    }
}
