//! Forming backend messages from queued datagrams (`gso_batch`).
//!
//! Consecutive datagrams to the same destination with the same size become
//! one UDP GSO super-packet; the last of a run may be shorter (the kernel
//! sends a short final segment). A run ends at a destination change, a size
//! change, a short datagram, the segment-count limit or the byte limit.
//! Everything else goes out as a plain datagram. Messages are then grouped
//! into `sendmmsg` calls.
//!
//! The segment-count limit is the kernel's `UDP_MAX_SEGMENTS`: 128 where a
//! once-per-process probe finds the kernel accepts that many, else 64
//! ([`crate::backend::kernel::gso_max_segments`]; `EUDP_GSO_SEGMENTS=64`
//! forces the old limit). At 64 B that halves the `sendmsg` calls and the
//! per-message TX timestamps; at 1472 B the byte limit binds first (44 per
//! message) and nothing changes. Should the kernel later refuse a message
//! over 64 segments (`EINVAL`), the backend resends it in pieces of 64 and
//! lowers the process's cap ([`crate::backend::kernel::gso_segment_cap`]),
//! which [`gso_batch`] obeys whatever `max_segments` it is given.

use std::net::SocketAddr;

/// Limits that bound one GSO super-packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GsoLimits {
    /// Maximum segments per super-packet (`UDP_MAX_SEGMENTS`: 64, or 128
    /// on kernels that accept it).
    pub max_segments: usize,
    /// Maximum total payload bytes per super-packet.
    pub max_bytes: usize,
    /// Largest segment size that may be segmented: a segment plus headers
    /// must fit the path MTU, or the kernel rejects the send. Applies to
    /// IPv6 destinations and to connected sends (`dst` `None`).
    pub max_segment_size: usize,
    /// The same for IPv4 destinations, including IPv4-mapped ones of a
    /// dual-stack IPv6 socket, whose packets carry the smaller IPv4 header.
    pub max_segment_size_v4: usize,
    /// GSO is usable at all on this socket.
    pub enabled: bool,
}

impl GsoLimits {
    /// Limits for a socket of the given family with GSO enabled, the
    /// typical 1500-byte Ethernet MTU and the segment count this kernel
    /// accepts ([`crate::backend::kernel::gso_max_segments`], probed once
    /// per process on first use).
    pub fn ethernet(v6: bool) -> Self {
        GsoLimits {
            max_segments: crate::backend::kernel::gso_max_segments(),
            max_bytes: if v6 { eudp_wire::limits::GSO_MAX_BYTES_V6 } else { eudp_wire::limits::GSO_MAX_BYTES_V4 },
            max_segment_size: if v6 { 1500 - 48 } else { 1500 - 28 },
            max_segment_size_v4: 1500 - 28,
            enabled: true,
        }
    }
}

/// One backend message: `count` consecutive datagrams starting at `start`.
/// `segment` is the GSO segment size when `count > 1` (or when a lone
/// datagram is sent as a one-segment batch, never done here).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    pub start: usize,
    pub count: usize,
    pub segment: Option<u16>,
}

/// Splits the datagrams described by `(dst, len)` into messages of at most
/// `lim.max_segments` datagrams (and at most the process's segment cap, which
/// only a kernel refusal lowers).
pub fn gso_batch(items: &[(Option<SocketAddr>, usize)], lim: &GsoLimits) -> Vec<Run> {
    let max_segments = lim.max_segments.min(crate::backend::kernel::gso_segment_cap());
    let mut runs = Vec::new();
    let mut i = 0;
    while i < items.len() {
        let (dst, seg) = items[i];
        let cap = match dst {
            Some(SocketAddr::V4(_)) => lim.max_segment_size_v4,
            Some(SocketAddr::V6(a)) if a.ip().to_ipv4_mapped().is_some() => lim.max_segment_size_v4,
            _ => lim.max_segment_size,
        };
        let segmentable = lim.enabled && seg > 0 && seg <= cap && seg <= u16::MAX as usize;
        if !segmentable {
            runs.push(Run { start: i, count: 1, segment: None });
            i += 1;
            continue;
        }
        let mut count = 1;
        let mut bytes = seg;
        while i + count < items.len() && count < max_segments {
            let (d, len) = items[i + count];
            if d != dst || len > seg || len == 0 || bytes + len > lim.max_bytes {
                break;
            }
            count += 1;
            bytes += len;
            if len < seg {
                // A short datagram can only be the last segment.
                break;
            }
        }
        let segment = if count > 1 { Some(seg as u16) } else { None };
        runs.push(Run { start: i, count, segment });
        i += count;
    }
    runs
}

/// Groups runs into backend calls of at most `max_msgs` messages and
/// `max_iov` datagrams (iovecs) each. Returns `(first_run, n_runs)` pairs.
pub fn group_calls(runs: &[Run], max_msgs: usize, max_iov: usize) -> Vec<(usize, usize)> {
    let mut calls = Vec::new();
    let mut first = 0;
    let mut iov = 0;
    for (k, r) in runs.iter().enumerate() {
        let n = k - first;
        if n > 0 && (n >= max_msgs || iov + r.count > max_iov) {
            calls.push((first, n));
            first = k;
            iov = 0;
        }
        iov += r.count;
    }
    if first < runs.len() {
        calls.push((first, runs.len() - first));
    }
    calls
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn a(p: u16) -> Option<SocketAddr> {
        Some(SocketAddr::from(([198, 18, 0, 2], p)))
    }

    fn lim() -> GsoLimits {
        GsoLimits {
            max_segments: 64,
            max_bytes: 65_507,
            max_segment_size: 1472,
            max_segment_size_v4: 1472,
            enabled: true,
        }
    }

    #[test]
    fn dual_stack_socket_segments_ipv4_mapped_peers_at_the_ipv4_limit() {
        let v6 = GsoLimits::ethernet(true);
        let mapped = Some("[::ffff:198.18.0.2]:9".parse().unwrap());
        let native = Some("[2001:2::2]:9".parse().unwrap());
        assert_eq!(gso_batch(&[(mapped, 1472); 4], &v6), vec![Run { start: 0, count: 4, segment: Some(1472) }]);
        // 1472 B does not fit a 1500 B MTU under an IPv6 header.
        assert_eq!(gso_batch(&[(native, 1472); 2], &v6).len(), 2);
        assert_eq!(gso_batch(&[(native, 1452); 2], &v6).len(), 1);
    }

    #[test]
    fn equal_sizes_one_run() {
        let items = vec![(a(1), 1000); 10];
        assert_eq!(gso_batch(&items, &lim()), vec![Run { start: 0, count: 10, segment: Some(1000) }]);
    }

    #[test]
    fn short_last_segment_ends_run() {
        let items = vec![(a(1), 1000), (a(1), 1000), (a(1), 300), (a(1), 1000)];
        assert_eq!(
            gso_batch(&items, &lim()),
            vec![Run { start: 0, count: 3, segment: Some(1000) }, Run { start: 3, count: 1, segment: None }]
        );
    }

    #[test]
    fn larger_size_and_destination_change_split() {
        let items = vec![(a(1), 500), (a(1), 600), (a(2), 600), (a(2), 600)];
        assert_eq!(
            gso_batch(&items, &lim()),
            vec![
                Run { start: 0, count: 1, segment: None },
                Run { start: 1, count: 1, segment: None },
                Run { start: 2, count: 2, segment: Some(600) }
            ]
        );
    }

    #[test]
    fn byte_limit_respected() {
        // 1472 * 44 = 64768 fits; the 45th would exceed 65507.
        let items = vec![(a(1), 1472); 50];
        let runs = gso_batch(&items, &lim());
        assert_eq!(runs[0].count, 44);
        assert_eq!(runs[1], Run { start: 44, count: 6, segment: Some(1472) });
    }

    #[test]
    fn segment_limit_respected() {
        let items = vec![(a(1), 64); 200];
        let runs = gso_batch(&items, &lim());
        assert_eq!(runs.iter().map(|r| r.count).collect::<Vec<_>>(), vec![64, 64, 64, 8]);
    }

    #[test]
    fn raised_segment_limit_packs_128_small_but_still_44_full_size() {
        let l = GsoLimits { max_segments: 128, ..lim() };
        let runs = gso_batch(&[(a(1), 64); 300], &l);
        assert_eq!(runs.iter().map(|r| r.count).collect::<Vec<_>>(), vec![128, 128, 44]);
        // 1472 B: the byte limit binds first, as with 64.
        let runs = gso_batch(&[(a(1), 1472); 100], &l);
        assert_eq!(runs.iter().map(|r| r.count).collect::<Vec<_>>(), vec![44, 44, 12]);
        // 500 B: 131 fit the bytes; 128 is the cap.
        assert_eq!(gso_batch(&[(a(1), 500); 130], &l)[0].count, 128);
    }

    #[test]
    fn ethernet_limits_use_the_probed_segment_count() {
        let n = GsoLimits::ethernet(false).max_segments;
        assert!(n == 64 || n == 128 || std::env::var_os("EUDP_GSO_SEGMENTS").is_some(), "{n}");
        assert_eq!(n, crate::backend::kernel::gso_max_segments());
    }

    #[test]
    fn oversize_or_empty_or_disabled_go_plain() {
        let items = vec![(a(1), 2000), (a(1), 2000), (a(1), 0), (a(1), 0)];
        assert!(gso_batch(&items, &lim()).iter().all(|r| r.count == 1 && r.segment.is_none()));
        let mut l = lim();
        l.enabled = false;
        assert!(gso_batch(&[(a(1), 100); 5], &l).iter().all(|r| r.count == 1));
    }

    #[test]
    fn calls_grouping() {
        let runs: Vec<Run> = (0..5).map(|i| Run { start: i * 10, count: 10, segment: Some(1) }).collect();
        assert_eq!(group_calls(&runs, 2, 1000), vec![(0, 2), (2, 2), (4, 1)]);
        assert_eq!(group_calls(&runs, 100, 25), vec![(0, 2), (2, 2), (4, 1)]);
        assert!(group_calls(&[], 4, 4).is_empty());
    }

    proptest! {
        /// Runs cover every datagram once, in order, and obey every limit.
        #[test]
        fn runs_partition_and_obey_limits(
            spec in proptest::collection::vec((0u16..3, prop_oneof![Just(0usize), Just(64), Just(1000), Just(1472), Just(1473), 1usize..1600]), 0..300),
            max_segments in 1usize..200,
        ) {
            let items: Vec<_> = spec.iter().map(|&(p, l)| (a(p), l)).collect();
            let l = GsoLimits { max_segments, ..lim() };
            let runs = gso_batch(&items, &l);
            let mut next = 0;
            for r in &runs {
                prop_assert_eq!(r.start, next);
                prop_assert!(r.count >= 1 && r.count <= max_segments);
                next += r.count;
                let run = &items[r.start..r.start + r.count];
                if let Some(seg) = r.segment {
                    let seg = seg as usize;
                    prop_assert!(seg <= l.max_segment_size);
                    prop_assert!(run.iter().all(|x| x.0 == run[0].0));
                    prop_assert!(run[..run.len() - 1].iter().all(|x| x.1 == seg));
                    prop_assert!(run[run.len() - 1].1 <= seg && run[run.len() - 1].1 > 0);
                    prop_assert!(run.iter().map(|x| x.1).sum::<usize>() <= l.max_bytes);
                } else {
                    prop_assert_eq!(r.count, 1);
                }
            }
            prop_assert_eq!(next, items.len());
        }

        /// A uniform stream (one destination, one size, up to 128
        /// segments allowed): every run but the last is as long as the
        /// segment and byte limits allow, none longer.
        #[test]
        fn uniform_runs_are_full_and_within_the_limit(
            len in 1usize..1473,
            n in 0usize..1000,
            max_segments in 1usize..=128,
        ) {
            let l = GsoLimits { max_segments, ..lim() };
            let runs = gso_batch(&vec![(a(1), len); n], &l);
            let full = max_segments.min(l.max_bytes / len);
            prop_assert_eq!(runs.iter().map(|r| r.count).sum::<usize>(), n);
            for (k, r) in runs.iter().enumerate() {
                prop_assert!(r.count <= full);
                if k + 1 < runs.len() {
                    prop_assert_eq!(r.count, full);
                }
            }
        }
    }
}
