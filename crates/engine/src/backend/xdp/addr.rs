//! Address arithmetic of the fast path: demultiplexing keys, the socket a
//! datagram is for, subnets, the kernel's neighbour table text, checked copies.

use eudp_wire::ether::MacAddr;
use eudp_wire::frame;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

pub(super) fn key_bytes(addr: Ipv4Addr, port: u16) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&addr.octets());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k
}

/// Which of the sockets holding a datagram's port gets it, scored as the
/// kernel's UDP lookup scores them: bound to the datagram's address (not
/// the wildcard) adds 1, connected to its source adds 2 (the kernel counts
/// the peer's address and port), and a socket connected to another peer is
/// out. Among equals the one registered last wins, as the kernel's hash
/// chain puts the newest socket first. `sockets`: (bound exactly, peer),
/// in registration order within each address, exact ones first.
pub(super) fn pick_socket(
    sockets: impl IntoIterator<Item = (bool, Option<SocketAddrV4>)>,
    src: SocketAddrV4,
) -> Option<usize> {
    let mut best: Option<(u8, usize)> = None;
    for (k, (exact, peer)) in sockets.into_iter().enumerate() {
        let score = match peer {
            Some(p) if p != src => continue,
            Some(_) => 2,
            None => 0,
        } + u8::from(exact);
        // `>=`: a later equal (newer) socket replaces an earlier one.
        if best.is_none_or(|(b, _)| score >= b) {
            best = Some((score, k));
        }
    }
    best.map(|(_, k)| k)
}

/// The IPv4 address of `a`, also when it is v4-mapped IPv6; `None` for
/// other IPv6 addresses (those stay on the kernel path).
pub(super) fn as_v4(a: &SocketAddr) -> Option<SocketAddrV4> {
    match a {
        SocketAddr::V4(a) => Some(*a),
        SocketAddr::V6(a) => a.ip().to_ipv4_mapped().map(|ip| SocketAddrV4::new(ip, a.port())),
    }
}

/// Copies `payload` into the front of `dst` (an engine buffer keeps its
/// length: the engine reads into the same buffers again), checking the UDP
/// checksum in the same pass when there is one; false when it is wrong.
pub(super) fn copy_checked(dst: &mut [u8], payload: &[u8], pending: Option<frame::PendingChecksum>) -> bool {
    match pending {
        Some(p) => p.copy(dst, payload).is_ok(),
        None => {
            dst[..payload.len()].copy_from_slice(payload);
            true
        }
    }
}

/// Complete entries (flags 0x2) of `/proc/net/arp` on `dev`.
pub(super) fn parse_arp_table(text: &str, dev: &str) -> Vec<(Ipv4Addr, [u8; 6])> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || f[5] != dev {
            continue;
        }
        let flags = u32::from_str_radix(f[2].trim_start_matches("0x"), 16).unwrap_or(0);
        if flags & 0x2 == 0 {
            continue;
        }
        let (Ok(ip), Ok(mac)) = (f[0].parse::<Ipv4Addr>(), f[3].parse::<MacAddr>()) else { continue };
        if mac.0 != [0; 6] {
            out.push((ip, mac.0));
        }
    }
    out
}

pub(super) fn same_subnet(a: Ipv4Addr, b: Ipv4Addr, prefix: u8) -> bool {
    if prefix == 0 {
        return true;
    }
    let mask = u32::MAX << (32 - u32::from(prefix.min(32)));
    u32::from(a) & mask == u32::from(b) & mask
}

pub(super) fn broadcast_of(a: Ipv4Addr, prefix: u8) -> Ipv4Addr {
    if prefix >= 32 {
        return a;
    }
    Ipv4Addr::from(u32::from(a) | (u32::MAX >> u32::from(prefix)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arp_table_entries_on_the_device_only_and_complete_only() {
        let text = "IP address       HW type     Flags       HW address            Mask     Device\n\
                    198.18.0.2       0x1         0x2         02:aa:bb:cc:dd:01     *        veth0\n\
                    198.18.0.3       0x1         0x0         00:00:00:00:00:00     *        veth0\n\
                    198.18.0.4       0x1         0x2         02:aa:bb:cc:dd:02     *        eth9\n\
                    198.18.0.5       0x1         0x6         02:aa:bb:cc:dd:03     *        veth0\n";
        let got = parse_arp_table(text, "veth0");
        assert_eq!(
            got,
            vec![
                ("198.18.0.2".parse().unwrap(), [2, 0xaa, 0xbb, 0xcc, 0xdd, 1]),
                ("198.18.0.5".parse().unwrap(), [2, 0xaa, 0xbb, 0xcc, 0xdd, 3])
            ]
        );
    }

    #[test]
    fn subnets_and_broadcast() {
        let a: Ipv4Addr = "198.18.0.1".parse().unwrap();
        assert!(same_subnet(a, "198.18.0.200".parse().unwrap(), 24));
        assert!(!same_subnet(a, "198.18.1.2".parse().unwrap(), 24));
        assert!(same_subnet(a, "198.19.1.2".parse().unwrap(), 15));
        assert_eq!(broadcast_of(a, 24), "198.18.0.255".parse::<Ipv4Addr>().unwrap());
        assert_eq!(broadcast_of(a, 30), "198.18.0.3".parse::<Ipv4Addr>().unwrap());
    }

    #[test]
    fn the_socket_the_kernel_would_pick() {
        let a = |s: &str| s.parse::<SocketAddrV4>().unwrap();
        let (src, other) = (a("198.18.0.1:5000"), a("198.18.0.1:5001"));
        // Connected to the source beats bound exactly.
        assert_eq!(pick_socket([(true, None), (false, Some(src))], src), Some(1));
        // Bound exactly beats the wildcard.
        assert_eq!(pick_socket([(true, None), (false, None)], src), Some(0));
        // Connected elsewhere is out, even when nothing else is there.
        assert_eq!(pick_socket([(true, Some(other)), (false, None)], src), Some(1));
        assert_eq!(pick_socket([(true, Some(other))], src), None);
        assert_eq!(pick_socket(std::iter::empty(), src), None);
        // Exact and connected beats wildcard and connected.
        assert_eq!(pick_socket([(false, Some(src)), (true, Some(src))], src), Some(1));
        // Equals: the newest (last in its address's list).
        assert_eq!(pick_socket([(true, None), (true, None), (false, None)], src), Some(1));
    }

    #[test]
    fn keys_are_the_wire_bytes_the_program_reads() {
        // The program stores daddr (4 wire bytes) and the 16-bit port load,
        // zero-extended, little end first.
        assert_eq!(key_bytes("198.18.0.2".parse().unwrap(), 0x1389), [198, 18, 0, 2, 0x13, 0x89, 0, 0]);
    }
}
