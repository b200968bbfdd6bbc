//! Multicast groups on the fast path: what the process's member sockets
//! joined, which `{group, port}` keys the program may redirect, and which
//! members get a redirected frame. No I/O here (see `group_path`).
//!
//! Membership stays with the kernel: every join is set on the member's
//! kernel socket, so the kernel keeps the group on the interface and sends
//! the IGMP reports. This table mirrors each member's joins (group and
//! source filter) so that a redirected frame reaches the sockets the
//! kernel would have given it to.
//!
//! A redirect takes the frame from every socket of the host (the network
//! namespace). So a key is redirected only while every UDP socket that the
//! kernel would give the group's datagrams (bound to the port, at the
//! wildcard address or at the group) is a member socket of this transport.
//! The sockets of the namespace are read from `/proc/net/udp` and
//! `/proc/net/udp6`; ours are known by their inodes.

use std::collections::{BTreeSet, HashMap};
use std::net::{Ipv4Addr, SocketAddrV4};

/// A member's source filter for one group, as the kernel keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Filter {
    /// Any source but these (an any-source join, then `IP_BLOCK_SOURCE`).
    Exclude(Vec<Ipv4Addr>),
    /// Only these sources (source-specific joins).
    Include(Vec<Ipv4Addr>),
}

impl Filter {
    pub(super) fn allows(&self, src: Ipv4Addr) -> bool {
        match self {
            Filter::Exclude(v) => !v.contains(&src),
            Filter::Include(v) => v.contains(&src),
        }
    }
}

/// One membership option, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Op {
    Join(Ipv4Addr),
    Leave(Ipv4Addr),
    JoinSource(Ipv4Addr, Ipv4Addr),
    LeaveSource(Ipv4Addr, Ipv4Addr),
    Block(Ipv4Addr, Ipv4Addr),
    Unblock(Ipv4Addr, Ipv4Addr),
}

impl Op {
    pub(super) fn is_join(self) -> bool {
        matches!(self, Op::Join(_) | Op::JoinSource(..))
    }
}

/// Which interface a membership request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Iface {
    /// None: the kernel picks one by route.
    Any,
    Index(u32),
    Addr(Ipv4Addr),
}

fn v4(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    b.get(at..at + 4).map(|x| Ipv4Addr::new(x[0], x[1], x[2], x[3]))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    b.get(at..at + 4).map(|x| u32::from_ne_bytes([x[0], x[1], x[2], x[3]]))
}

/// An IPv4 `sockaddr_in` at `at` (its address), `None` for another family.
fn sockaddr_v4(b: &[u8], at: usize) -> Option<Ipv4Addr> {
    let fam = b.get(at..at + 2).map(|x| u16::from_ne_bytes([x[0], x[1]]))?;
    if i32::from(fam) != libc::AF_INET {
        return None;
    }
    v4(b, at + 4)
}

/// Decodes an IPv4 membership option (`IP_ADD_MEMBERSHIP` with `ip_mreq`
/// or `ip_mreqn`, the `ip_mreq_source` forms, and the `MCAST_*` forms with
/// an `AF_INET` group). `None` for IPv6 and anything else.
pub(super) fn decode(level: i32, name: i32, val: &[u8]) -> Option<(Op, Iface)> {
    use libc::*;
    let iface_of = |addr: Ipv4Addr| if addr.is_unspecified() { Iface::Any } else { Iface::Addr(addr) };
    let index = |i: u32| if i == 0 { Iface::Any } else { Iface::Index(i) };
    match (level, name) {
        (IPPROTO_IP, IP_ADD_MEMBERSHIP | IP_DROP_MEMBERSHIP) => {
            let g = v4(val, 0)?;
            // `ip_mreqn` names the interface by index first, then by address.
            let i = match u32_at(val, 8) {
                Some(ix) if val.len() >= 12 && ix != 0 => Iface::Index(ix),
                _ => iface_of(v4(val, 4)?),
            };
            Some((if name == IP_ADD_MEMBERSHIP { Op::Join(g) } else { Op::Leave(g) }, i))
        }
        (IPPROTO_IP, IP_ADD_SOURCE_MEMBERSHIP | IP_DROP_SOURCE_MEMBERSHIP | IP_BLOCK_SOURCE | IP_UNBLOCK_SOURCE) => {
            let (g, i, s) = (v4(val, 0)?, iface_of(v4(val, 4)?), v4(val, 8)?);
            let op = match name {
                IP_ADD_SOURCE_MEMBERSHIP => Op::JoinSource(g, s),
                IP_DROP_SOURCE_MEMBERSHIP => Op::LeaveSource(g, s),
                IP_BLOCK_SOURCE => Op::Block(g, s),
                _ => Op::Unblock(g, s),
            };
            Some((op, i))
        }
        (IPPROTO_IP | IPPROTO_IPV6, MCAST_JOIN_GROUP | MCAST_LEAVE_GROUP) => {
            // struct group_req: the index, then a sockaddr_storage at 8.
            let g = sockaddr_v4(val, 8)?;
            Some((if name == MCAST_JOIN_GROUP { Op::Join(g) } else { Op::Leave(g) }, index(u32_at(val, 0)?)))
        }
        (
            IPPROTO_IP | IPPROTO_IPV6,
            MCAST_JOIN_SOURCE_GROUP | MCAST_LEAVE_SOURCE_GROUP | MCAST_BLOCK_SOURCE | MCAST_UNBLOCK_SOURCE,
        ) => {
            // struct group_source_req: the index, the group at 8, the source at 136.
            let (g, s) = (sockaddr_v4(val, 8)?, sockaddr_v4(val, 136)?);
            let op = match name {
                MCAST_JOIN_SOURCE_GROUP => Op::JoinSource(g, s),
                MCAST_LEAVE_SOURCE_GROUP => Op::LeaveSource(g, s),
                MCAST_BLOCK_SOURCE => Op::Block(g, s),
                _ => Op::Unblock(g, s),
            };
            Some((op, index(u32_at(val, 0)?)))
        }
        _ => None,
    }
}

/// Applies `op` to a member's groups as the kernel applies it to the
/// socket's (the kernel accepted it already): the last included source
/// left leaves the group.
pub(super) fn apply(groups: &mut HashMap<Ipv4Addr, Filter>, op: Op) {
    match op {
        Op::Join(g) => {
            groups.insert(g, Filter::Exclude(Vec::new()));
        }
        Op::Leave(g) => {
            groups.remove(&g);
        }
        Op::JoinSource(g, s) => {
            let f = groups.entry(g).or_insert(Filter::Include(Vec::new()));
            if let Filter::Include(v) = f {
                if !v.contains(&s) {
                    v.push(s);
                }
            }
        }
        Op::LeaveSource(g, s) => {
            if let Some(Filter::Include(v)) = groups.get_mut(&g) {
                v.retain(|x| *x != s);
                if v.is_empty() {
                    groups.remove(&g);
                }
            }
        }
        Op::Block(g, s) => {
            if let Some(Filter::Exclude(v)) = groups.get_mut(&g) {
                if !v.contains(&s) {
                    v.push(s);
                }
            }
        }
        Op::Unblock(g, s) => {
            if let Some(Filter::Exclude(v)) = groups.get_mut(&g) {
                v.retain(|x| *x != s);
            }
        }
    }
}

/// One member socket of the transport; `I` is its inbox.
pub(super) struct Member<I> {
    pub(super) inbox: I,
    /// The kernel socket's inode, which `/proc/net/udp` shows.
    pub(super) inode: u64,
    /// Where the kernel socket is bound, as last read (port 0: not yet).
    pub(super) local: SocketAddrV4,
    /// `IP_MULTICAST_ALL`: a group it did not join reaches it too when
    /// another socket of the host joined it.
    pub(super) mc_all: bool,
    pub(super) groups: HashMap<Ipv4Addr, Filter>,
}

impl<I> Member<I> {
    /// Whether the kernel would give this member a datagram from `src` to
    /// `{group, port}` (its connected peer, if any, is checked by the caller).
    pub(super) fn wants(&self, group: Ipv4Addr, port: u16, src: Ipv4Addr) -> bool {
        if self.local.port() != port || !(self.local.ip().is_unspecified() || *self.local.ip() == group) {
            return false;
        }
        match self.groups.get(&group) {
            Some(f) => f.allows(src),
            None => self.mc_all,
        }
    }
}

/// A set of `{group, port}` keys.
pub(super) type Keys = BTreeSet<(Ipv4Addr, u16)>;

/// The transport's members and the keys the program redirects for them.
pub(super) struct Groups<I> {
    pub(super) members: Vec<Member<I>>,
    pub(super) redirected: Keys,
    /// The keys found shared at the last look (each change to shared is counted once).
    pub(super) shared: Keys,
    /// A watcher thread runs (see `group_path`).
    pub(super) watching: bool,
    /// Buffers of delivered copies, kept for later frames' copies (each
    /// member socket's copy would be an allocation otherwise); at most
    /// [`SPARE_MAX`] of at most [`SPARE_BYTES`] each.
    pub(super) spare: Vec<Vec<u8>>,
}

/// How many copy buffers `Groups::spare` keeps.
pub(super) const SPARE_MAX: usize = 512;
/// The largest buffer kept (a redirected frame fits a UMEM frame of 4 KiB).
pub(super) const SPARE_BYTES: usize = 4096;

impl<I> Default for Groups<I> {
    fn default() -> Self {
        Groups {
            members: Vec::new(),
            redirected: BTreeSet::new(),
            shared: BTreeSet::new(),
            watching: false,
            spare: Vec::new(),
        }
    }
}

/// One UDP socket of the namespace, from `/proc/net/udp` or `udp6`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcSocket {
    /// The IPv4 address it is bound to; for an IPv6 socket, its v4-mapped
    /// address, `0.0.0.0` for `::`, `None` for any other IPv6 address.
    pub(super) addr: Option<Ipv4Addr>,
    pub(super) port: u16,
    pub(super) inode: u64,
}

/// The sockets listed in the text of `/proc/net/udp` (`v6` false) or
/// `/proc/net/udp6`.
pub(super) fn parse_proc_udp(text: &str, v6: bool) -> Vec<ProcSocket> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 {
            continue;
        }
        let Some((a, p)) = f[1].split_once(':') else { continue };
        let (Ok(port), Ok(inode)) = (u16::from_str_radix(p, 16), f[9].parse::<u64>()) else { continue };
        // Each 32-bit word is printed as the host reads the wire bytes.
        let words: Vec<[u8; 4]> = (0..a.len() / 8)
            .filter_map(|i| u32::from_str_radix(&a[i * 8..i * 8 + 8], 16).ok().map(u32::to_ne_bytes))
            .collect();
        let addr = match (v6, words.as_slice()) {
            (false, [w]) => Some(Ipv4Addr::from(*w)),
            (true, [w0, w1, w2, w3]) => {
                let mut b = [0u8; 16];
                for (k, w) in [w0, w1, w2, w3].into_iter().enumerate() {
                    b[k * 4..k * 4 + 4].copy_from_slice(w);
                }
                let ip = std::net::Ipv6Addr::from(b);
                if ip.is_unspecified() {
                    Some(Ipv4Addr::UNSPECIFIED)
                } else {
                    ip.to_ipv4_mapped()
                }
            }
            _ => continue,
        };
        out.push(ProcSocket { addr, port, inode });
    }
    out
}

/// The keys to redirect: every `{group, port}` a member joined where it is
/// bound (at the wildcard or the group), when every socket of the
/// namespace that the kernel would give that group's datagrams on that
/// port is a member (`ours`). The second set: keys left to the kernel
/// because another socket shares them.
pub(super) fn exclusive_keys<I>(members: &[Member<I>], sockets: &[ProcSocket]) -> (Keys, Keys) {
    let ours = |inode: u64| members.iter().any(|m| m.inode == inode);
    let (mut redirect, mut shared) = (BTreeSet::new(), BTreeSet::new());
    for m in members {
        let port = m.local.port();
        if port == 0 {
            continue;
        }
        for &g in m.groups.keys() {
            if !(m.local.ip().is_unspecified() || *m.local.ip() == g) {
                continue;
            }
            let alone = sockets.iter().filter(|s| s.port == port).all(|s| {
                // An IPv6 socket at another address than `::` or a mapped
                // one gets no IPv4 datagrams.
                let takes = s.addr.is_some_and(|a| a.is_unspecified() || a == g);
                !takes || ours(s.inode)
            });
            if alone {
                redirect.insert((g, port));
            } else {
                shared.insert((g, port));
            }
        }
    }
    (redirect, shared)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    #[test]
    fn membership_requests_decode() {
        let (g, i, s) = (a("239.1.2.3"), a("198.18.0.2"), a("198.18.0.1"));
        let mut mreq = g.octets().to_vec();
        mreq.extend(i.octets());
        assert_eq!(decode(libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &mreq), Some((Op::Join(g), Iface::Addr(i))));
        let mut mreqn = mreq.clone();
        mreqn.extend(7u32.to_ne_bytes());
        assert_eq!(decode(libc::IPPROTO_IP, libc::IP_DROP_MEMBERSHIP, &mreqn), Some((Op::Leave(g), Iface::Index(7))));
        let mut src = mreq.clone();
        src.extend(s.octets());
        assert_eq!(
            decode(libc::IPPROTO_IP, libc::IP_ADD_SOURCE_MEMBERSHIP, &src),
            Some((Op::JoinSource(g, s), Iface::Addr(i)))
        );
        let mut gsr = vec![0u8; 264];
        gsr[..4].copy_from_slice(&3u32.to_ne_bytes());
        for at in [8, 136] {
            gsr[at..at + 2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        }
        gsr[12..16].copy_from_slice(&g.octets());
        gsr[140..144].copy_from_slice(&s.octets());
        assert_eq!(
            decode(libc::IPPROTO_IP, libc::MCAST_JOIN_SOURCE_GROUP, &gsr),
            Some((Op::JoinSource(g, s), Iface::Index(3)))
        );
        assert_eq!(decode(libc::IPPROTO_IP, libc::MCAST_JOIN_GROUP, &gsr[..136]), Some((Op::Join(g), Iface::Index(3))));
        gsr[8..10].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        assert_eq!(decode(libc::IPPROTO_IPV6, libc::MCAST_JOIN_GROUP, &gsr[..136]), None);
        assert_eq!(decode(libc::IPPROTO_IPV6, libc::IPV6_ADD_MEMBERSHIP, &[0; 20]), None);
        assert_eq!(decode(libc::IPPROTO_IP, libc::IP_ADD_MEMBERSHIP, &[0; 3]), None);
    }

    #[test]
    fn filters_follow_the_kernels_rules() {
        let (g, s1, s2) = (a("239.1.2.3"), a("10.0.0.1"), a("10.0.0.2"));
        let mut m = HashMap::new();
        apply(&mut m, Op::JoinSource(g, s1));
        apply(&mut m, Op::JoinSource(g, s2));
        assert!(m[&g].allows(s1) && m[&g].allows(s2) && !m[&g].allows(a("10.0.0.3")));
        apply(&mut m, Op::LeaveSource(g, s1));
        assert!(!m[&g].allows(s1) && m[&g].allows(s2));
        apply(&mut m, Op::LeaveSource(g, s2));
        assert!(m.is_empty(), "the last source left leaves the group");
        apply(&mut m, Op::Join(g));
        apply(&mut m, Op::Block(g, s1));
        assert!(!m[&g].allows(s1) && m[&g].allows(s2));
        apply(&mut m, Op::Unblock(g, s1));
        assert!(m[&g].allows(s1));
        apply(&mut m, Op::Leave(g));
        assert!(m.is_empty());
    }

    #[test]
    fn proc_net_udp_lines_parse() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  12: 00000000:14B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4242 2 0000000000000000 0\n\
                  13: 010312EF:14B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 4243 2 0000000000000000 0\n";
        let got = parse_proc_udp(v4, false);
        let le = cfg!(target_endian = "little");
        assert_eq!(got[0], ProcSocket { addr: Some(Ipv4Addr::UNSPECIFIED), port: 5301, inode: 4242 });
        if le {
            assert_eq!(got[1].addr, Some(a("239.18.3.1")));
        }
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops\n\
                  1: 00000000000000000000000000000000:14B5 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 77 2 0000000000000000 0\n\
                  2: 0000000000000000FFFF0000010312EF:14B5 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 78 2 0000000000000000 0\n\
                  3: 000080FE00000000FF005A0201000002:14B5 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 79 2 0000000000000000 0\n";
        let got = parse_proc_udp(v6, true);
        assert_eq!(got[0].addr, Some(Ipv4Addr::UNSPECIFIED));
        if le {
            assert_eq!(got[1].addr, Some(a("239.18.3.1")));
        }
        assert_eq!(got[2].addr, None);
        assert_eq!(got.iter().map(|s| s.inode).collect::<Vec<_>>(), vec![77, 78, 79]);
    }

    fn member(inode: u64, local: &str, groups: &[&str]) -> Member<()> {
        Member {
            inbox: (),
            inode,
            local: local.parse().unwrap(),
            mc_all: true,
            groups: groups.iter().map(|g| (a(g), Filter::Exclude(Vec::new()))).collect(),
        }
    }

    #[test]
    fn a_key_is_redirected_only_while_every_socket_on_it_is_a_member() {
        let (g1, g2) = (a("239.0.0.1"), a("239.0.0.2"));
        let ms =
            vec![member(1, "0.0.0.0:5000", &["239.0.0.1", "239.0.0.2"]), member(2, "239.0.0.1:5000", &["239.0.0.1"])];
        let sock = |addr: Option<Ipv4Addr>, port, inode| ProcSocket { addr, port, inode };
        let ours = vec![sock(Some(Ipv4Addr::UNSPECIFIED), 5000, 1), sock(Some(g1), 5000, 2)];
        let (r, s) = exclusive_keys(&ms, &ours);
        assert_eq!(r.into_iter().collect::<Vec<_>>(), vec![(g1, 5000), (g2, 5000)]);
        assert!(s.is_empty());
        // Another socket bound to one group's address takes only that group.
        let mut with_other = ours.clone();
        with_other.push(sock(Some(g2), 5000, 9));
        let (r, s) = exclusive_keys(&ms, &with_other);
        assert_eq!(
            (r.into_iter().collect::<Vec<_>>(), s.into_iter().collect::<Vec<_>>()),
            (vec![(g1, 5000)], vec![(g2, 5000)])
        );
        // A wildcard one (or a dual-stack `::` one) takes both; other ports and
        // other IPv6 addresses take neither.
        let mut v = ours.clone();
        v.push(sock(Some(Ipv4Addr::UNSPECIFIED), 5000, 9));
        assert!(exclusive_keys(&ms, &v).0.is_empty());
        for other in
            [sock(Some(Ipv4Addr::UNSPECIFIED), 5001, 9), sock(None, 5000, 9), sock(Some(a("198.18.0.2")), 5000, 9)]
        {
            let mut v = ours.clone();
            v.push(other);
            assert_eq!(exclusive_keys(&ms, &v).0.len(), 2);
        }
    }

    #[test]
    fn members_want_what_the_kernel_gives_them() {
        let g = a("239.0.0.1");
        let mut m = member(1, "0.0.0.0:5000", &["239.0.0.1"]);
        assert!(m.wants(g, 5000, a("10.0.0.1")));
        assert!(!m.wants(g, 5001, a("10.0.0.1")));
        assert!(m.wants(a("239.0.0.9"), 5000, a("10.0.0.1")), "IP_MULTICAST_ALL on: a group another socket joined");
        m.mc_all = false;
        assert!(!m.wants(a("239.0.0.9"), 5000, a("10.0.0.1")));
        m.groups.insert(g, Filter::Include(vec![a("10.0.0.2")]));
        assert!(!m.wants(g, 5000, a("10.0.0.1")) && m.wants(g, 5000, a("10.0.0.2")));
        let bound = member(2, "239.0.0.2:5000", &["239.0.0.1"]);
        assert!(!bound.wants(g, 5000, a("10.0.0.1")), "bound to another group's address");
    }
}
