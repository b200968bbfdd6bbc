//! The xdp transport's redirect program, run by the kernel itself
//! (`BPF_PROG_TEST_RUN`) over a table of frames: which go to the AF_XDP
//! socket and which pass to the kernel stack. Runs in a namespace of its
//! own (the program is only loaded and run, never attached); needs root.

use eudp_engine::backend::xdp::sys::{self, Map};
use eudp_wire::ether::MacAddr;
use eudp_wire::frame::{build_udp4, Udp4Params};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::Command;

const XDP_PASS: u32 = 2;
const XDP_REDIRECT: u32 = 4;
/// What one UMEM frame holds in this test: longer frames must pass.
const MAX_FRAME: u32 = 1024;

const BOUND: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 7000);
/// A port bound to the wildcard address: any destination address matches.
const WILDCARD_PORT: u16 = 7100;
/// A group whose `{group, port}` key is in the map (the transport holds it alone).
const GROUP: Ipv4Addr = Ipv4Addr::new(239, 18, 3, 1);

fn key(addr: Ipv4Addr, port: u16) -> [u8; 8] {
    let mut k = [0u8; 8];
    k[..4].copy_from_slice(&addr.octets());
    k[4..6].copy_from_slice(&port.to_be_bytes());
    k
}

fn frame(dst: SocketAddrV4, payload: usize) -> Vec<u8> {
    let p = Udp4Params {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        src: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 40000),
        dst,
        tos: 0,
        ttl: 64,
        ident: 1,
    };
    let mut out = vec![0u8; 42 + payload];
    let n = build_udp4(&mut out, &p, &vec![0x5a; payload]).unwrap();
    out.truncate(n);
    out
}

/// A group's frame, with the group's MAC address.
fn group_frame(group: Ipv4Addr, port: u16) -> Vec<u8> {
    let o = group.octets();
    with(frame(SocketAddrV4::new(group, port), 64), |f| {
        f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, o[1] & 0x7f, o[2], o[3]]);
    })
}

fn with(mut f: Vec<u8>, edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    edit(&mut f);
    f
}

/// The table: (what, frame, verdict the program must give).
fn table() -> Vec<(&'static str, Vec<u8>, u32)> {
    let to = |port| SocketAddrV4::new(*BOUND.ip(), port);
    let ok = frame(BOUND, 64);
    vec![
        ("bound address and port", ok.clone(), XDP_REDIRECT),
        ("bound, empty payload (42 bytes)", frame(BOUND, 0), XDP_REDIRECT),
        ("bound, exactly the UMEM frame's size", frame(BOUND, MAX_FRAME as usize - 42), XDP_REDIRECT),
        ("wildcard-bound port", frame(to(WILDCARD_PORT), 64), XDP_REDIRECT),
        (
            "wildcard-bound port, another address",
            frame(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 9), WILDCARD_PORT), 64),
            XDP_REDIRECT,
        ),
        ("another port", frame(to(7001), 64), XDP_PASS),
        ("bound port, another address", frame(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 7000), 64), XDP_PASS),
        ("oversize: one byte past the UMEM frame", frame(BOUND, MAX_FRAME as usize - 41), XDP_PASS),
        (
            "ARP",
            with(ok.clone(), |f| {
                f[12..14].copy_from_slice(&[0x08, 0x06]);
            }),
            XDP_PASS,
        ),
        (
            "IPv6 ethertype",
            with(ok.clone(), |f| {
                f[12..14].copy_from_slice(&[0x86, 0xdd]);
            }),
            XDP_PASS,
        ),
        (
            // As below: an exact key, which the kernel would take as well.
            "broadcast MAC to a bound unicast address",
            with(ok.clone(), |f| {
                f[..6].copy_from_slice(&[0xff; 6]);
            }),
            XDP_REDIRECT,
        ),
        (
            // The kernel takes such a frame too (`drop_unicast_in_l2_multicast` is off by default).
            "multicast MAC to a bound unicast address",
            with(ok.clone(), |f| {
                f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
            }),
            XDP_REDIRECT,
        ),
        ("a group held alone, on the wildcard-bound port", group_frame(GROUP, WILDCARD_PORT), XDP_REDIRECT),
        (
            "a group not held, on the wildcard-bound port",
            group_frame(Ipv4Addr::new(239, 18, 3, 2), WILDCARD_PORT),
            XDP_PASS,
        ),
        ("a group held alone, another port", group_frame(GROUP, 7001), XDP_PASS),
        (
            "broadcast to the wildcard-bound port",
            with(frame(SocketAddrV4::new(Ipv4Addr::BROADCAST, WILDCARD_PORT), 64), |f| {
                f[..6].copy_from_slice(&[0xff; 6]);
            }),
            XDP_PASS,
        ),
        (
            "IPv4 options (IHL 6)",
            with(ok.clone(), |f| {
                f.splice(34..34, [1, 1, 1, 1]);
                f[14] = 0x46;
            }),
            XDP_PASS,
        ),
        ("first fragment (MF)", with(ok.clone(), |f| f[20] |= 0x20), XDP_PASS),
        ("later fragment (offset)", with(ok.clone(), |f| f[21] = 0x10), XDP_PASS),
        ("TCP, not UDP", with(ok.clone(), |f| f[23] = 6), XDP_PASS),
        ("truncated: Ethernet only", ok[..14].to_vec(), XDP_PASS),
        ("truncated: no UDP header", ok[..34].to_vec(), XDP_PASS),
        ("truncated: one byte short of the UDP header", ok[..41].to_vec(), XDP_PASS),
    ]
}

#[test]
fn the_redirect_program_sends_only_bound_udp_and_held_groups_to_the_socket() {
    let ns = format!("eudp-xp{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    assert!(Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success(), "ip netns add (root needed)");
    let ns2 = ns.clone();
    let result = std::thread::spawn(move || -> Vec<String> {
        sys::enter_netns(&ns2).expect("setns");
        let lo = sys::iface_info("lo").expect("lo");
        let xsks = Map::xsk(1).unwrap();
        let ports = Map::hash8(16, "eudp_test_ports").unwrap();
        ports.update(&key(*BOUND.ip(), BOUND.port()), &1u32.to_ne_bytes()).unwrap();
        ports.update(&key(Ipv4Addr::UNSPECIFIED, WILDCARD_PORT), &1u32.to_ne_bytes()).unwrap();
        ports.update(&key(GROUP, WILDCARD_PORT), &1u32.to_ne_bytes()).unwrap();
        let prog = sys::load_redirect_prog(&xsks, &ports, MAX_FRAME).expect("load (root and BPF needed)");
        // A socket on queue 0 of lo, where a test run's frame arrives: without
        // one the program's redirect falls back to passing.
        let (xsk, _rings) = sys::Xsk::open(lo.index, 0, 64, 2048, 64).expect("AF_XDP socket on lo");
        sys::xskmap_set(&xsks, 0, &xsk).unwrap();
        let mut wrong = Vec::new();
        for (what, f, want) in table() {
            let got = sys::test_run_xdp(&prog, &f).unwrap_or_else(|e| panic!("{what}: test run: {e}"));
            if got != want {
                wrong.push(format!("{what} ({} bytes): verdict {got}, expected {want}", f.len()));
            }
        }
        wrong
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    let wrong = result.expect("test thread");
    assert!(wrong.is_empty(), "verdicts:\n{}", wrong.join("\n"));
}

#[test]
fn without_a_socket_on_the_queue_a_bound_frame_passes() {
    let ns = format!("eudp-xq{}", std::process::id());
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    assert!(Command::new("ip").args(["netns", "add", &ns]).status().unwrap().success(), "ip netns add (root needed)");
    let ns2 = ns.clone();
    let got = std::thread::spawn(move || {
        sys::enter_netns(&ns2).expect("setns");
        let xsks = Map::xsk(1).unwrap();
        let ports = Map::hash8(16, "eudp_test_ports").unwrap();
        ports.update(&key(*BOUND.ip(), BOUND.port()), &1u32.to_ne_bytes()).unwrap();
        let prog = sys::load_redirect_prog(&xsks, &ports, MAX_FRAME).unwrap();
        sys::test_run_xdp(&prog, &frame(BOUND, 64)).unwrap()
    })
    .join();
    let _ = Command::new("ip").args(["netns", "del", &ns]).output();
    assert_eq!(got.expect("test thread"), XDP_PASS);
}
