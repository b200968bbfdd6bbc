//! The `xdp` transport between two test hosts: network namespaces joined by
//! a veth pair in 198.18.0.0/24, one thread per host (each thread enters
//! its namespace before it makes its engine and transport). Needs root and
//! AF_XDP, as every testbed test does.

use eudp_engine::backend::xdp::{sys, AttachMode, CopyBlock, XdpConfig, XdpTransport};
use eudp_engine::{Config, Engine};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

const A_IP: &str = "198.18.0.1";
const B_IP: &str = "198.18.0.2";

/// Two namespaces and a veth pair, torn down on drop.
struct Pair {
    a: String,
    b: String,
    a_if: String,
    b_if: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("ip(8)");
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

impl Pair {
    fn new(tag: &str) -> Pair {
        let id = format!("{}{}", tag, std::process::id() % 100_000);
        let p = Pair { a: format!("xa{id}"), b: format!("xb{id}"), a_if: format!("va{id}"), b_if: format!("vb{id}") };
        let _ = Command::new("ip").args(["netns", "del", &p.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &p.b]).output();
        ip(&["netns", "add", &p.a]);
        ip(&["netns", "add", &p.b]);
        ip(&["link", "add", &p.a_if, "netns", &p.a, "type", "veth", "peer", "name", &p.b_if, "netns", &p.b]);
        for (ns, dev, addr) in [(&p.a, &p.a_if, A_IP), (&p.b, &p.b_if, B_IP)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev]);
            ip(&["-n", ns, "link", "set", dev, "up"]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
        }
        p
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.a]).output();
        let _ = Command::new("ip").args(["netns", "del", &self.b]).output();
    }
}

fn payload(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|k| (i * 131 + k * 7) as u8).collect()
}

/// One host: its own engine and transport, in its namespace.
fn host(ns: &str, ifname: &str) -> (Engine, XdpTransport) {
    sys::enter_netns(ns).expect("setns");
    let engine = Engine::start(Config::default()).expect("engine");
    let mut cfg = XdpConfig::new(ifname);
    cfg.attach = AttachMode::Auto;
    let t = XdpTransport::start(cfg).expect("xdp transport (root and AF_XDP needed)");
    (engine, t)
}

#[test]
fn datagrams_cross_the_testbed_on_the_xdp_path_byte_exact_and_in_order() {
    let pair = Pair::new("d");
    let sizes: Vec<usize> = vec![0, 1, 64, 333, 1000, 1472, 4000, 1472, 8, 65_507];
    let n = 400;
    let (ready_tx, ready_rx) = mpsc::channel();
    let (b_ns, b_if) = (pair.b.clone(), pair.b_if.clone());
    let sizes_b = sizes.clone();
    // Host B echoes every datagram back to its source.
    let server = std::thread::spawn(move || {
        let (engine, t) = host(&b_ns, &b_if);
        let ep = t.endpoint(&engine, false).unwrap();
        ep.bind_to("0.0.0.0:7000".parse().unwrap()).unwrap();
        ep.set_read_timeout(Some(Duration::from_secs(5)));
        // A plain kernel socket on another port still receives (its frames
        // pass the program).
        let plain = UdpSocket::bind("0.0.0.0:7001").unwrap();
        plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = vec![0u8; 65_536];
        for i in 0..n + sizes_b.len() {
            let (k, src) = ep.recv_from(&mut buf).unwrap_or_else(|e| panic!("server datagram {i}: {e}"));
            ep.send_to(&buf[..k], src).unwrap();
        }
        let (k, _) = plain.recv_from(&mut buf).expect("the plain socket's datagram");
        assert_eq!(&buf[..k], b"plain");
        ep.flush(Duration::from_secs(2));
        t.stats()
    });
    ready_rx.recv().unwrap();
    sys::enter_netns(&pair.a).unwrap();
    let engine = Engine::start(Config::default()).unwrap();
    let t = XdpTransport::start(XdpConfig::new(&pair.a_if)).unwrap();
    let ep = t.endpoint(&engine, false).unwrap();
    let dst: SocketAddr = format!("{B_IP}:7000").parse().unwrap();
    ep.connect(dst).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = vec![0u8; 65_536];
    // Ping-pong first (each size, then n small ones), one at a time.
    for (i, &len) in sizes.iter().enumerate() {
        ep.send(&payload(i, len)).unwrap();
        let k = ep.recv(&mut buf).unwrap_or_else(|e| panic!("echo of size {len}: {e}"));
        assert_eq!(k, len, "echo length");
        assert!(buf[..k] == payload(i, len)[..], "echo of size {len} differs");
    }
    // Then a burst of n, echoes checked in order.
    for i in 0..n {
        ep.send(&payload(1000 + i, 64 + i % 1400)).unwrap();
    }
    for i in 0..n {
        let k = ep.recv(&mut buf).unwrap_or_else(|e| panic!("burst echo {i}: {e}"));
        assert!(buf[..k] == payload(1000 + i, 64 + i % 1400)[..], "burst echo {i} differs or out of order");
    }
    UdpSocket::bind("0.0.0.0:0").unwrap().send_to(b"plain", format!("{B_IP}:7001")).unwrap();
    let b = server.join().expect("server");
    let a = t.stats();
    eprintln!("client {a:?}\nserver {b:?}");
    // The fast path carried the traffic both ways; what it cannot carry
    // (larger than the MTU) went through the kernel and arrived all the same.
    for s in [&a, &b] {
        assert!(s.tx_xdp >= n as u64, "frames sent on the xdp path: {s:?}");
        assert!(s.rx_xdp >= n as u64, "frames received on the xdp path: {s:?}");
        assert!(s.tx_kernel_too_big >= 2, "4000 and 65507 B went through the kernel: {s:?}");
        assert!(s.rx_kernel >= 2, "and came back through it: {s:?}");
        assert_eq!(s.rx_bad_frames + s.rx_no_socket + s.rx_inbox_drops, 0, "{s:?}");
    }
}

#[test]
fn a_closed_sockets_port_goes_back_to_the_kernel() {
    let pair = Pair::new("c");
    let (b_ns, b_if) = (pair.b.clone(), pair.b_if.clone());
    let (tx, rx) = mpsc::channel::<&'static str>();
    let (back_tx, back_rx) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (engine, t) = host(&b_ns, &b_if);
        let ep = t.endpoint(&engine, false).unwrap();
        ep.bind_to("198.18.0.2:7100".parse().unwrap()).unwrap();
        ep.set_read_timeout(Some(Duration::from_secs(5)));
        back_tx.send(()).unwrap();
        let mut buf = [0u8; 100];
        let k = ep.recv(&mut buf).expect("first datagram");
        assert_eq!(&buf[..k], b"one");
        drop(ep);
        // The same port, now a plain kernel socket, while the program is
        // still attached: the frame must reach it.
        let plain = UdpSocket::bind("198.18.0.2:7100").unwrap();
        plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        back_tx.send(()).unwrap();
        let k = plain.recv(&mut buf).expect("datagram after the close");
        assert_eq!(&buf[..k], b"two");
        assert_eq!(rx.recv().unwrap(), "done");
        t.stats()
    });
    sys::enter_netns(&pair.a).unwrap();
    let engine = Engine::start(Config::default()).unwrap();
    let t = XdpTransport::start(XdpConfig::new(&pair.a_if)).unwrap();
    let ep = t.endpoint(&engine, false).unwrap();
    let dst: SocketAddr = "198.18.0.2:7100".parse().unwrap();
    back_rx.recv().unwrap();
    ep.send_to(b"one", dst).unwrap();
    back_rx.recv().unwrap();
    ep.send_to(b"two", dst).unwrap();
    tx.send("done").unwrap();
    let b = server.join().expect("server");
    assert!(b.rx_xdp >= 1, "the first datagram came on the xdp path: {b:?}");
}

#[test]
fn frames_go_to_the_socket_the_kernel_would_pick() {
    let pair = Pair::new("m");
    let (b_ns, b_if) = (pair.b.clone(), pair.b_if.clone());
    let (tx, rx) = mpsc::channel::<Vec<SocketAddr>>();
    let (back_tx, back_rx) = mpsc::channel::<SocketAddr>();
    let server = std::thread::spawn(move || {
        let (engine, t) = host(&b_ns, &b_if);
        let peers = rx.recv().unwrap();
        // Three sockets on one address: two connected to different peers,
        // one open to anybody, plus one on the wildcard address.
        let mk = |addr: &str| {
            let ep = t.endpoint(&engine, false).unwrap();
            ep.backend().set_option(libc::SOL_SOCKET, libc::SO_REUSEADDR, 1).unwrap();
            ep.bind_to(addr.parse().unwrap()).unwrap();
            ep.set_read_timeout(Some(Duration::from_secs(5)));
            ep
        };
        let c0 = mk("198.18.0.2:7200");
        c0.connect(peers[0]).unwrap();
        let c1 = mk("198.18.0.2:7200");
        c1.connect(peers[1]).unwrap();
        let open = mk("198.18.0.2:7200");
        let wild = mk("0.0.0.0:7201");
        back_tx.send(open.local_addr().unwrap()).unwrap();
        let mut buf = [0u8; 64];
        let mut got = |ep: &eudp_engine::Endpoint| {
            let (k, src) = ep.recv_from(&mut buf).expect("datagram");
            (String::from_utf8_lossy(&buf[..k]).into_owned(), src)
        };
        let r = [got(&c0), got(&c1), got(&open), got(&wild)];
        let before = t.stats().rx_kernel;
        back_tx.send(open.local_addr().unwrap()).unwrap();
        // A broadcast reaches the wildcard socket through the kernel, which
        // decides who gets it (the program passes L2 broadcast frames).
        let b = got(&wild);
        assert_eq!(b.0, "to-all");
        assert!(t.stats().rx_kernel > before, "the broadcast came through the kernel: {:?}", t.stats());
        (r, t.stats())
    });
    sys::enter_netns(&pair.a).unwrap();
    let engine = Engine::start(Config::default()).unwrap();
    let t = XdpTransport::start(XdpConfig::new(&pair.a_if)).unwrap();
    let socks: Vec<_> = (0..3)
        .map(|_| {
            let ep = t.endpoint(&engine, false).unwrap();
            ep.bind_to("198.18.0.1:0".parse().unwrap()).unwrap();
            ep
        })
        .collect();
    tx.send(socks.iter().map(|s| s.local_addr().unwrap()).collect()).unwrap();
    let dst = back_rx.recv().unwrap();
    // The unconnected peer first: a frame must not go to a socket
    // connected to someone else.
    socks[2].send_to(b"to-open", dst).unwrap();
    socks[1].send_to(b"to-c1", dst).unwrap();
    socks[0].send_to(b"to-c0", dst).unwrap();
    socks[0].send_to(b"to-wild", "198.18.0.2:7201".parse().unwrap()).unwrap();
    back_rx.recv().unwrap();
    let bc = UdpSocket::bind("198.18.0.1:0").unwrap();
    bc.set_broadcast(true).unwrap();
    bc.send_to(b"to-all", "198.18.0.255:7201").unwrap();
    let (r, st) = server.join().expect("server");
    let want = [("to-c0", 0), ("to-c1", 1), ("to-open", 2), ("to-wild", 0)];
    for ((msg, src), (w, from)) in r.iter().zip(want) {
        assert_eq!((msg.as_str(), *src), (w, socks[from].local_addr().unwrap()));
    }
    assert_eq!(st.rx_not_peer + st.rx_no_socket, 0, "{st:?}");
}

/// On a jumbo-frame link, a frame longer than a UMEM frame can hold after
/// the kernel's headroom goes to the kernel (the program passes it; the
/// AF_XDP socket would drop it), and a send that long takes the kernel path.
#[test]
fn frames_beyond_a_umem_frame_take_the_kernel_path() {
    let pair = Pair::new("j");
    for (ns, dev) in [(&pair.a, &pair.a_if), (&pair.b, &pair.b_if)] {
        ip(&["-n", ns, "link", "set", dev, "mtu", "9000"]);
    }
    let (b_ns, b_if) = (pair.b.clone(), pair.b_if.clone());
    let (tx, rx) = mpsc::channel::<()>();
    let server = std::thread::spawn(move || {
        let (engine, t) = host(&b_ns, &b_if);
        let ep = t.endpoint(&engine, false).unwrap();
        ep.bind_to("0.0.0.0:7300".parse().unwrap()).unwrap();
        ep.set_read_timeout(Some(Duration::from_secs(5)));
        tx.send(()).unwrap();
        let mut buf = vec![0u8; 65_536];
        let mut lens = Vec::new();
        for _ in 0..3 {
            let (k, src) = ep.recv_from(&mut buf).expect("datagram");
            assert!(buf[..k] == payload(k, k)[..], "{k} bytes differ");
            lens.push(k);
            ep.send_to(&buf[..k], src).unwrap();
        }
        ep.flush(Duration::from_secs(2));
        (lens, t.stats())
    });
    rx.recv().unwrap();
    sys::enter_netns(&pair.a).unwrap();
    let engine = Engine::start(Config::default()).unwrap();
    let t = XdpTransport::start(XdpConfig::new(&pair.a_if)).unwrap();
    let ep = t.endpoint(&engine, false).unwrap();
    ep.connect(format!("{B_IP}:7300").parse().unwrap()).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = vec![0u8; 65_536];
    // Fits a frame; then longer than a UMEM frame; then longer than the MTU.
    for len in [3000usize, 5000, 12_000] {
        ep.send(&payload(len, len)).unwrap();
        let k = ep.recv(&mut buf).unwrap_or_else(|e| panic!("echo of {len}: {e}"));
        assert!(k == len && buf[..k] == payload(len, len)[..], "echo of {len}");
    }
    let (lens, b) = server.join().expect("server");
    assert_eq!(lens, [3000, 5000, 12_000]);
    let a = t.stats();
    for s in [&a, &b] {
        assert!(s.tx_kernel_too_big >= 2 && s.rx_kernel >= 2, "5000 and 12 000 B through the kernel: {s:?}");
        assert_eq!(s.xsk_rx_dropped, 0, "no frame dropped by the AF_XDP socket: {s:?}");
    }
}

#[test]
fn the_nontemporal_copy_block_sends_the_same_frames() {
    let pair = Pair::new("n");
    let sizes: Vec<usize> = vec![0, 1, 15, 17, 64, 333, 1000, 1471, 1472];
    let rounds = 20;
    let (ready_tx, ready_rx) = mpsc::channel();
    let b_ns = pair.b.clone();
    let total = sizes.len() * rounds;
    // Host B is the plain kernel: it checks each frame's UDP checksum
    // before it delivers the datagram, then echoes it.
    let server = std::thread::spawn(move || {
        sys::enter_netns(&b_ns).expect("setns");
        let plain = UdpSocket::bind("0.0.0.0:7200").unwrap();
        plain.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        ready_tx.send(()).unwrap();
        let mut buf = vec![0u8; 2048];
        for i in 0..total {
            let (k, src) = plain.recv_from(&mut buf).unwrap_or_else(|e| panic!("server datagram {i}: {e}"));
            plain.send_to(&buf[..k], src).unwrap();
        }
    });
    ready_rx.recv().unwrap();
    sys::enter_netns(&pair.a).unwrap();
    let engine = Engine::start(Config::default()).unwrap();
    let mut cfg = XdpConfig::new(&pair.a_if);
    cfg.copy = CopyBlock::NonTemporal;
    let t = XdpTransport::start(cfg).unwrap();
    let ep = t.endpoint(&engine, false).unwrap();
    ep.connect(format!("{B_IP}:7200").parse::<SocketAddr>().unwrap()).unwrap();
    ep.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = vec![0u8; 2048];
    for r in 0..rounds {
        for (i, &len) in sizes.iter().enumerate() {
            let p = payload(r * 100 + i, len);
            ep.send(&p).unwrap();
            let k = ep.recv(&mut buf).unwrap_or_else(|e| panic!("echo of size {len}: {e}"));
            assert!(buf[..k] == p[..], "echo of size {len} differs");
        }
    }
    server.join().expect("server");
    let s = t.stats();
    assert!(s.tx_xdp > 0, "frames sent on the xdp path: {s:?}");
}
