//! Multicast on the `xdp` transport between two test hosts (network
//! namespaces joined by a veth pair): a plain kernel sender on host `a`,
//! three member sockets of one process on host `b`, three groups.
//!
//! * While the process holds every socket on the group port, the groups'
//!   frames are redirected: each member gets exactly what the kernel would
//!   give it (any-source, source-specific and filtered joins, and
//!   `IP_MULTICAST_ALL`), byte-exact and in order, one copy each.
//! * Once another socket of the host binds the port, the keys go back to
//!   the kernel (counted), every socket gets its datagrams through the
//!   kernel, and when that socket closes the keys are redirected again.
//!
//! Needs root and AF_XDP, as every testbed test does.

use eudp_engine::backend::kernel::InMeta;
use eudp_engine::backend::xdp::{sys, AttachMode, XdpConfig, XdpSocket, XdpTransport};
use eudp_engine::backend::Backend;
use socket2::{Domain, Socket, Type};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
const OTHER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 9);
const PORT: u16 = 5301;
const GROUPS: [Ipv4Addr; 3] =
    [Ipv4Addr::new(239, 18, 3, 1), Ipv4Addr::new(239, 18, 3, 2), Ipv4Addr::new(239, 18, 3, 3)];
const N: u32 = 300;
const SIZE: usize = 700;

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

struct Pair {
    a: String,
    b: String,
    b_if: String,
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let id = format!("{}{}", tag, std::process::id() % 100_000);
        let (a_if, b_if) = (format!("ma{id}"), format!("mb{id}"));
        let p = Pair { a: format!("xma{id}"), b: format!("xmb{id}"), b_if: b_if.clone() };
        for ns in [&p.a, &p.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
            ip(&["netns", "add", ns]);
        }
        ip(&["link", "add", &a_if, "netns", &p.a, "type", "veth", "peer", "name", &b_if, "netns", &p.b]);
        for (ns, dev, addr) in [(&p.a, &a_if, A_IP), (&p.b, &b_if, B_IP)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "route", "add", "224.0.0.0/4", "dev", dev]);
        }
        p
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

fn payload(phase: u32, g: usize, seq: u32) -> Vec<u8> {
    let mut v: Vec<u8> = (0..SIZE).map(|k| (g * 31 + seq as usize * 7 + k) as u8 ^ phase as u8).collect();
    v[..4].copy_from_slice(&phase.to_be_bytes());
    v[4] = g as u8;
    v[5..9].copy_from_slice(&seq.to_be_bytes());
    v
}

/// What one socket got: per (phase, group), the sequence numbers in order;
/// and how many were damaged.
#[derive(Default, Debug)]
struct Got {
    seqs: HashMap<(u32, usize), Vec<u32>>,
    bad: u32,
}

impl Got {
    fn take(&mut self, data: &[u8]) {
        if data.len() != SIZE {
            self.bad += 1;
            return;
        }
        let phase = u32::from_be_bytes(data[..4].try_into().unwrap());
        let (g, seq) = (data[4] as usize, u32::from_be_bytes(data[5..9].try_into().unwrap()));
        if g >= 3 || data != payload(phase, g, seq).as_slice() {
            self.bad += 1;
            return;
        }
        self.seqs.entry((phase, g)).or_default().push(seq);
    }

    /// The groups of `phase` that came whole and in order (others: listed as wrong).
    fn complete(&self, phase: u32) -> Vec<usize> {
        let all: Vec<u32> = (0..N).collect();
        let mut v: Vec<usize> = (0..3).filter(|g| self.seqs.get(&(phase, *g)) == Some(&all)).collect();
        for g in 0..3 {
            if let Some(s) = self.seqs.get(&(phase, g)) {
                if *s != all {
                    v.push(100 + g);
                }
            }
        }
        v
    }
}

/// Reads every socket (and `plain`, a kernel socket) until nothing came for 300 ms.
fn drain(socks: &[&dyn Backend], got: &mut [Got], mut plain: Option<(&std::net::UdpSocket, &mut Got)>) {
    let mut bufs = vec![vec![0u8; 2048]; 16];
    let mut meta = vec![InMeta::default(); 16];
    let mut quiet = Instant::now();
    while quiet.elapsed() < Duration::from_millis(300) {
        let mut any = false;
        for (s, g) in socks.iter().zip(got.iter_mut()) {
            if let Ok(n) = s.recv_batch(&mut bufs, &mut meta) {
                for k in 0..n {
                    g.take(&bufs[k][..meta[k].len]);
                    assert_eq!(meta[k].src, Some(SocketAddr::V4(SocketAddrV4::new(A_IP, 40000))));
                }
                any |= n > 0;
            }
        }
        if let Some((p, g)) = plain.as_mut() {
            let mut buf = [0u8; 2048];
            while let Ok(n) = p.recv(&mut buf) {
                g.take(&buf[..n]);
                any = true;
            }
        }
        if any {
            quiet = Instant::now();
        } else {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

fn mreq(g: Ipv4Addr) -> Vec<u8> {
    [g.octets(), B_IP.octets()].concat()
}

fn group_req(name_source: Option<Ipv4Addr>, g: Ipv4Addr, ifindex: u32) -> Vec<u8> {
    let mut v = vec![0u8; if name_source.is_some() { 264 } else { 136 }];
    v[..4].copy_from_slice(&ifindex.to_ne_bytes());
    let mut put = |at: usize, a: Ipv4Addr| {
        v[at..at + 2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v[at + 4..at + 8].copy_from_slice(&a.octets());
    };
    put(8, g);
    if let Some(s) = name_source {
        put(136, s);
    }
    v
}

fn member(t: &XdpTransport, mc_all: bool) -> XdpSocket {
    let s = t.socket(false).unwrap();
    s.set_option(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).unwrap();
    s.set_option(libc::IPPROTO_IP, libc::IP_MULTICAST_ALL, i32::from(mc_all)).unwrap();
    s.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, 1 << 20).unwrap();
    s.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT))).unwrap();
    s
}

#[test]
fn groups_are_redirected_to_a_lone_process_and_go_back_to_the_kernel_when_shared() {
    let pair = Pair::new("g");
    let (go_tx, go_rx) = mpsc::channel::<u32>();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let a_ns = pair.a.clone();
    let sender = std::thread::spawn(move || {
        sys::enter_netns(&a_ns).unwrap();
        let s = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
        s.bind(&SocketAddr::from((A_IP, 40000)).into()).unwrap();
        s.set_multicast_if_v4(&A_IP).unwrap();
        s.set_multicast_ttl_v4(1).unwrap();
        while let Ok(phase) = go_rx.recv() {
            for seq in 0..N {
                for (g, group) in GROUPS.iter().enumerate() {
                    let to = SocketAddr::from((*group, PORT));
                    s.send_to(&payload(phase, g, seq), &to.into()).unwrap();
                }
                if seq % 4 == 3 {
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
            done_tx.send(()).unwrap();
        }
    });

    sys::enter_netns(&pair.b).unwrap();
    let mut cfg = XdpConfig::new(&pair.b_if);
    cfg.attach = AttachMode::Auto;
    let t = XdpTransport::start(cfg).expect("xdp transport (root and AF_XDP needed)");
    let ifindex = sys::iface_info(&pair.b_if).unwrap().index;
    let (s1, s2, s3) = (member(&t, false), member(&t, false), member(&t, true));
    let ip = libc::IPPROTO_IP;
    // s1: groups 1 and 2, any source. s2: group 2 (MCAST_JOIN_GROUP). s3:
    // group 3 from the sender only, group 1 from another source only, and
    // IP_MULTICAST_ALL on (s1 and s2 have it off): group 2, which it did not
    // join but others did, reaches it too.
    let joins = [
        s1.set_membership(ip, libc::IP_ADD_MEMBERSHIP, &mreq(GROUPS[0])).unwrap(),
        s1.set_membership(ip, libc::IP_ADD_MEMBERSHIP, &mreq(GROUPS[1])).unwrap(),
        s2.set_membership(ip, libc::MCAST_JOIN_GROUP, &group_req(None, GROUPS[1], ifindex)).unwrap(),
        s3.set_membership(ip, libc::MCAST_JOIN_SOURCE_GROUP, &group_req(Some(A_IP), GROUPS[2], ifindex)).unwrap(),
        s3.set_membership(ip, libc::MCAST_JOIN_SOURCE_GROUP, &group_req(Some(OTHER), GROUPS[0], ifindex)).unwrap(),
    ];
    assert_eq!(joins, [Some(true); 5], "every join mirrored");
    // Redirected once the last member joined: the process holds every socket on the port.
    assert_eq!(t.stats().group_keys, 3);
    let kernel_before = t.stats().group_kernel;
    let socks: [&dyn Backend; 3] = [&s1, &s2, &s3];
    let want = [vec![0, 1], vec![1], vec![1, 2]];

    // Phase 0: redirected.
    let mut got: Vec<Got> = (0..3).map(|_| Got::default()).collect();
    go_tx.send(0).unwrap();
    drain(&socks, &mut got, None);
    done_rx.recv().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!((g.complete(0), g.bad), (want[i].clone(), 0), "phase 0, member {}: {:?}", i + 1, t.stats());
    }
    let st = t.stats();
    assert_eq!(st.rx_xdp, 3 * N as u64, "{st:?}");
    assert_eq!(st.rx_group_copies, 5 * N as u64, "{st:?}");
    assert_eq!((st.rx_kernel, st.rx_no_socket), (0, 0), "{st:?}");

    // Phase 1: a plain kernel socket binds the port and joins group 1; its
    // IP_MULTICAST_ALL takes the other groups too. Every key goes back.
    let other = Socket::new(Domain::IPV4, Type::DGRAM, None).unwrap();
    other.set_reuse_address(true).unwrap();
    other.bind(&SocketAddr::from((Ipv4Addr::UNSPECIFIED, PORT)).into()).unwrap();
    other.join_multicast_v4(&GROUPS[0], &B_IP).unwrap();
    other.set_nonblocking(true).unwrap();
    let other: std::net::UdpSocket = other.into();
    let until = Instant::now() + Duration::from_secs(2);
    while t.stats().group_keys != 0 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    let st = t.stats();
    assert_eq!((st.group_keys, st.group_kernel - kernel_before), (0, 3), "{st:?}");
    let mut got: Vec<Got> = (0..3).map(|_| Got::default()).collect();
    let mut o = Got::default();
    go_tx.send(1).unwrap();
    drain(&socks, &mut got, Some((&other, &mut o)));
    done_rx.recv().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!((g.complete(1), g.bad), (want[i].clone(), 0), "phase 1, member {}: {:?}", i + 1, t.stats());
    }
    assert_eq!((o.complete(1), o.bad), (vec![0, 1, 2], 0), "the other socket");
    let st2 = t.stats();
    assert_eq!(st2.rx_xdp, st.rx_xdp, "nothing redirected while shared: {st2:?}");
    assert_eq!(st2.rx_kernel, 5 * N as u64, "{st2:?}");

    // Phase 2: the other socket closes; the keys are redirected again.
    drop(other);
    let until = Instant::now() + Duration::from_secs(2);
    while t.stats().group_keys != 3 && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(t.stats().group_keys, 3);
    let mut got: Vec<Got> = (0..3).map(|_| Got::default()).collect();
    go_tx.send(2).unwrap();
    drain(&socks, &mut got, None);
    done_rx.recv().unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!((g.complete(2), g.bad), (want[i].clone(), 0), "phase 2, member {}", i + 1);
    }
    let st3 = t.stats();
    assert_eq!(st3.rx_xdp - st2.rx_xdp, 3 * N as u64, "{st3:?}");

    // Leaves take a key away at once when its group has no member left.
    s1.set_membership(ip, libc::IP_DROP_MEMBERSHIP, &mreq(GROUPS[0])).unwrap();
    assert_eq!(t.stats().group_keys, 3, "s3 is still in group 1 (for another source)");
    s3.set_membership(ip, libc::MCAST_LEAVE_SOURCE_GROUP, &group_req(Some(OTHER), GROUPS[0], ifindex)).unwrap();
    assert_eq!(t.stats().group_keys, 2, "group 1 has no member left");
    drop(go_tx);
    sender.join().unwrap();
}
