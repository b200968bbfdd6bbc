//! The C ABI called from Rust over loopback (127.0.0.1 and ::1 only).

use eudp_capi::*;
use libc::{c_int, c_void, sockaddr, sockaddr_in, sockaddr_in6, sockaddr_storage, socklen_t};
use libc::{AF_INET, AF_INET6, AF_UNIX, AF_UNSPEC};
use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::ptr::{null, null_mut};
use std::time::{Duration, Instant};

fn errno() -> c_int {
    io::Error::last_os_error().raw_os_error().unwrap()
}

/// A socket address in C form.
struct Raw(sockaddr_storage, socklen_t);

impl Raw {
    fn new(a: SocketAddr) -> Raw {
        // SAFETY: plain data.
        let mut ss: sockaddr_storage = unsafe { zeroed() };
        let len = match a {
            SocketAddr::V4(a) => {
                // SAFETY: storage is larger than and aligned for sockaddr_in.
                let sin = unsafe { &mut *(&mut ss as *mut sockaddr_storage).cast::<sockaddr_in>() };
                sin.sin_family = AF_INET as _;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
                size_of::<sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                // SAFETY: as above.
                let s = unsafe { &mut *(&mut ss as *mut sockaddr_storage).cast::<sockaddr_in6>() };
                s.sin6_family = AF_INET6 as _;
                s.sin6_port = a.port().to_be();
                s.sin6_addr.s6_addr = a.ip().octets();
                size_of::<sockaddr_in6>()
            }
        };
        Raw(ss, len as socklen_t)
    }

    fn ptr(&self) -> *const sockaddr {
        (&self.0 as *const sockaddr_storage).cast()
    }

    fn to_std(ss: &sockaddr_storage) -> SocketAddr {
        match ss.ss_family as c_int {
            AF_INET => {
                // SAFETY: family says sockaddr_in.
                let s = unsafe { &*(ss as *const sockaddr_storage).cast::<sockaddr_in>() };
                SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(s.sin_addr.s_addr.to_ne_bytes()),
                    u16::from_be(s.sin_port),
                ))
            }
            AF_INET6 => {
                // SAFETY: family says sockaddr_in6.
                let s = unsafe { &*(ss as *const sockaddr_storage).cast::<sockaddr_in6>() };
                SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::from(s.sin6_addr.s6_addr), u16::from_be(s.sin6_port), 0, 0))
            }
            f => panic!("family {f}"),
        }
    }
}

/// An endpoint closed on drop.
struct Ep(*mut eudp_endpoint);

impl Drop for Ep {
    fn drop(&mut self) {
        // SAFETY: a live handle, closed once.
        assert_eq!(unsafe { eudp_close(self.0) }, 0);
    }
}

impl Ep {
    fn new(family: c_int) -> Ep {
        let p = eudp_endpoint_new(family);
        assert!(!p.is_null(), "eudp_endpoint_new: {}", io::Error::last_os_error());
        Ep(p)
    }

    fn bound(a: &str) -> Ep {
        let a: SocketAddr = a.parse().unwrap();
        let ep = Ep::new(if a.is_ipv6() { AF_INET6 } else { AF_INET });
        let r = Raw::new(a);
        // SAFETY: live handle and address.
        assert_eq!(unsafe { eudp_bind(ep.0, r.ptr(), r.1) }, 0, "bind: {}", io::Error::last_os_error());
        // SAFETY: live handle.
        assert_eq!(unsafe { eudp_set_timeouts(ep.0, 5000, 5000) }, 0);
        ep
    }

    fn local(&self) -> SocketAddr {
        // SAFETY: plain data.
        let mut ss: sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<sockaddr_storage>() as socklen_t;
        // SAFETY: live handle, valid out pointers.
        assert_eq!(unsafe { eudp_local_addr(self.0, &mut ss, &mut len) }, 0);
        Raw::to_std(&ss)
    }

    fn sendto(&self, data: &[u8], to: SocketAddr) -> isize {
        let r = Raw::new(to);
        // SAFETY: live handle, buffer and address.
        unsafe { eudp_sendto(self.0, data.as_ptr().cast(), data.len(), r.ptr(), r.1) }
    }

    fn connect(&self, to: SocketAddr) -> c_int {
        let r = Raw::new(to);
        // SAFETY: live handle and address.
        unsafe { eudp_connect(self.0, r.ptr(), r.1) }
    }

    fn recvfrom(&self, buf: &mut [u8], flags: c_int) -> (isize, SocketAddr) {
        // SAFETY: plain data.
        let mut ss: sockaddr_storage = unsafe { zeroed() };
        let mut len = size_of::<sockaddr_storage>() as socklen_t;
        // SAFETY: live handle, buffers.
        let n = unsafe {
            eudp_recvfrom(
                self.0,
                buf.as_mut_ptr().cast(),
                buf.len(),
                flags,
                (&mut ss as *mut sockaddr_storage).cast(),
                &mut len,
            )
        };
        assert!(n >= 0, "recvfrom: {}", io::Error::last_os_error());
        (n, Raw::to_std(&ss))
    }

    fn recv_err(&self, flags: c_int) -> c_int {
        let mut buf = [0u8; 16];
        // SAFETY: live handle, buffer.
        let n = unsafe { eudp_recv(self.0, buf.as_mut_ptr().cast(), buf.len(), flags) };
        assert_eq!(n, -1, "expected an error");
        errno()
    }

    fn stats(&self) -> eudp_stats {
        let mut s = eudp_stats::default();
        // SAFETY: live handle, valid out pointer.
        assert_eq!(unsafe { eudp_stats(self.0, &mut s) }, 0);
        s
    }
}

fn payload(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8).collect()
}

fn round_trip(rx_addr: &str, tx_addr: &str) {
    let rx = Ep::bound(rx_addr);
    let tx = Ep::bound(tx_addr);
    let to = rx.local();
    let from = tx.local();
    let max = if to.is_ipv6() { 65_527 } else { 65_507 };
    let sizes = [0usize, 1, 64, 1472, 1473, 9000, max];
    for (i, &n) in sizes.iter().enumerate() {
        let d = payload(n, i as u32);
        assert_eq!(tx.sendto(&d, to), n as isize, "send {n}: {}", io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 1 << 16];
    for (i, &n) in sizes.iter().enumerate() {
        let (got, src) = rx.recvfrom(&mut buf, 0);
        assert_eq!(got as usize, n);
        assert_eq!(&buf[..n], &payload(n, i as u32)[..], "datagram {i} differs");
        assert_eq!(src, from);
    }
    // SAFETY: live handle.
    assert_eq!(unsafe { eudp_flush(tx.0, 5000) }, 0);
    let s = tx.stats();
    assert_eq!(s.datagrams_sent, sizes.len() as u64);
    assert_eq!(s.bytes_sent, sizes.iter().sum::<usize>() as u64);
    assert_eq!(rx.stats().datagrams_received, sizes.len() as u64);
}

#[test]
fn ipv4_byte_exact() {
    round_trip("127.0.0.1:0", "127.0.0.1:0");
}

#[test]
fn ipv6_byte_exact() {
    round_trip("[::1]:0", "[::1]:0");
}

#[test]
fn dual_stack_reports_mapped_sender() {
    let rx = Ep::bound("[::]:0");
    let tx = Ep::bound("127.0.0.1:0");
    let port = rx.local().port();
    assert_eq!(tx.sendto(b"mapped", SocketAddr::from(([127, 0, 0, 1], port))), 6);
    let mut buf = [0u8; 64];
    let (n, src) = rx.recvfrom(&mut buf, 0);
    assert_eq!(&buf[..n as usize], b"mapped");
    let want: SocketAddr =
        SocketAddr::V6(SocketAddrV6::new(Ipv4Addr::LOCALHOST.to_ipv6_mapped(), tx.local().port(), 0, 0));
    assert_eq!(src, want);
    // An IPv6 endpoint sending over IPv4 is held to the IPv4 limit.
    let big = vec![0u8; 65_508];
    let v4dst = SocketAddr::from(([127, 0, 0, 1], tx.local().port()));
    assert_eq!(rx.sendto(&big, v4dst), -1);
    assert_eq!(errno(), libc::EMSGSIZE);
    assert_eq!(rx.connect(v4dst), 0);
    // SAFETY: live handle and buffer.
    assert_eq!(unsafe { eudp_send(rx.0, big.as_ptr().cast(), big.len()) }, -1);
    assert_eq!(errno(), libc::EMSGSIZE);
}

#[test]
fn errors_like_the_kernel() {
    assert!(eudp_endpoint_new(AF_UNIX).is_null());
    assert_eq!(errno(), libc::EAFNOSUPPORT);
    let ep = Ep::bound("127.0.0.1:0");
    let me = ep.local();
    // Oversize.
    let big = vec![7u8; 65_508];
    assert_eq!(ep.sendto(&big, me), -1);
    assert_eq!(errno(), libc::EMSGSIZE);
    let ep6 = Ep::bound("[::1]:0");
    assert_eq!(ep6.sendto(&vec![0u8; 65_528], ep6.local()), -1);
    assert_eq!(errno(), libc::EMSGSIZE);
    // Family and address errors.
    assert_eq!(ep.sendto(b"x", "[::1]:9".parse().unwrap()), -1);
    assert_eq!(errno(), libc::EAFNOSUPPORT);
    assert_eq!(ep.sendto(b"x", "127.0.0.1:0".parse().unwrap()), -1);
    assert_eq!(errno(), libc::EINVAL);
    let r = Raw::new(me);
    // SAFETY: live handle; lengths shorter than the address are the point.
    unsafe {
        assert_eq!(eudp_sendto(ep.0, b"x".as_ptr().cast(), 1, r.ptr(), 8), -1);
        assert_eq!(errno(), libc::EINVAL);
        // inet6_bind checks the length, then the family.
        assert_eq!(eudp_bind(ep6.0, r.ptr(), r.1), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_bind(ep6.0, r.ptr(), size_of::<sockaddr_in6>() as socklen_t), -1);
        assert_eq!(errno(), libc::EAFNOSUPPORT);
        assert_eq!(eudp_connect(ep.0, r.ptr(), 1), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
    // Not connected.
    // SAFETY: live handle and buffers.
    unsafe {
        assert_eq!(eudp_send(ep.0, b"x".as_ptr().cast(), 1), -1);
        assert_eq!(errno(), libc::EDESTADDRREQ);
        let mut ss: sockaddr_storage = zeroed();
        let mut len = size_of::<sockaddr_storage>() as socklen_t;
        assert_eq!(eudp_peer_addr(ep.0, &mut ss, &mut len), -1);
        assert_eq!(errno(), libc::ENOTCONN);
    }
    // NULL and bad arguments.
    // SAFETY: the calls must reject these without touching them.
    unsafe {
        assert_eq!(eudp_send(null_mut(), null(), 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_sendto(ep.0, null(), 10, r.ptr(), r.1), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_recv(ep.0, null_mut(), 10, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_close(null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_stats(ep.0, null_mut()), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_set_timeouts(ep.0, -2, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
        assert_eq!(eudp_recv_batch(ep.0, null_mut(), 3, 0), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
    assert_eq!(ep.recv_err(libc::MSG_OOB), libc::EOPNOTSUPP);
    // An empty datagram from a NULL buffer is fine.
    // SAFETY: live handle; len 0.
    assert_eq!(unsafe { eudp_sendto(ep.0, null(), 0, r.ptr(), r.1) }, 0);
    let mut buf = [1u8; 4];
    assert_eq!(ep.recvfrom(&mut buf, 0).0, 0);
}

#[test]
fn connect_to_closed_port_is_refused() {
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let dst = closed.local_addr().unwrap();
    drop(closed);
    let ep = Ep::bound("127.0.0.1:0");
    assert_eq!(ep.connect(dst), 0);
    let mut peer: sockaddr_storage = unsafe { zeroed() };
    let mut len = size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: live handle, out pointers.
    assert_eq!(unsafe { eudp_peer_addr(ep.0, &mut peer, &mut len) }, 0);
    assert_eq!(Raw::to_std(&peer), dst);
    // SAFETY: live handle and buffer.
    assert_eq!(unsafe { eudp_send(ep.0, b"ping".as_ptr().cast(), 4) }, 4);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match ep.recv_err(EUDP_MSG_DONTWAIT) {
            libc::EAGAIN if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            e => {
                assert_eq!(e, libc::ECONNREFUSED);
                break;
            }
        }
    }
    assert!(ep.stats().errors_surfaced >= 1);
    // Reported once, like sk_err.
    assert_eq!(ep.recv_err(EUDP_MSG_DONTWAIT), libc::EAGAIN);
    // AF_UNSPEC dissolves the association.
    // SAFETY: plain data; live handle.
    unsafe {
        let mut sa: sockaddr = zeroed();
        sa.sa_family = AF_UNSPEC as _;
        assert_eq!(eudp_connect(ep.0, &sa, size_of::<sockaddr>() as socklen_t), 0);
        assert_eq!(eudp_send(ep.0, b"x".as_ptr().cast(), 1), -1);
        assert_eq!(errno(), libc::EDESTADDRREQ);
    }
}

#[test]
fn nonblocking_and_timeouts() {
    let ep = Ep::bound("127.0.0.1:0");
    // SAFETY: live handle.
    unsafe {
        assert_eq!(eudp_set_nonblocking(ep.0, 1), 0);
        assert_eq!(ep.recv_err(0), libc::EAGAIN);
        assert_eq!(eudp_set_nonblocking(ep.0, 0), 0);
        assert_eq!(eudp_set_timeouts(ep.0, 100, -1), 0);
    }
    let t = Instant::now();
    assert_eq!(ep.recv_err(0), libc::EAGAIN);
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(90) && took < Duration::from_secs(3), "{took:?}");
    // SAFETY: live handle.
    unsafe { assert_eq!(eudp_set_timeouts(ep.0, 0, -1), 0) };
    let t = Instant::now();
    assert_eq!(ep.recv_err(0), libc::EAGAIN);
    assert!(t.elapsed() < Duration::from_secs(1));
}

#[test]
fn peek_truncation_and_recvmsg() {
    let rx = Ep::bound("127.0.0.1:0");
    let tx = Ep::bound("127.0.0.1:0");
    let to = rx.local();
    let d = payload(100, 9);
    for _ in 0..3 {
        assert_eq!(tx.sendto(&d, to), 100);
    }
    let mut small = [0u8; 10];
    // Peek leaves it; MSG_TRUNC returns the full length.
    assert_eq!(rx.recvfrom(&mut small, EUDP_MSG_PEEK | EUDP_MSG_TRUNC).0, 100);
    let mut n = 0usize;
    let mut next = 0usize;
    // SAFETY: live handle, out pointers.
    assert_eq!(unsafe { eudp_pending(rx.0, &mut n, &mut next) }, 0);
    assert!(n >= 1 && next == 100, "{n} {next}");
    // Truncated receive: 10 copied, the rest discarded.
    assert_eq!(rx.recvfrom(&mut small, 0).0, 10);
    assert_eq!(&small[..], &d[..10]);
    // SAFETY: plain data; live handle and buffers.
    unsafe {
        let mut m: eudp_rxmsg = zeroed();
        m.buf = small.as_mut_ptr().cast::<c_void>();
        m.cap = small.len();
        assert_eq!(eudp_recvmsg(rx.0, &mut m, 0), 10);
        assert_eq!((m.len, m.full_len, m.flags), (10, 100, EUDP_MSG_TRUNC));
        assert_eq!(Raw::to_std(&m.addr), tx.local());
        assert_eq!(m.addrlen as usize, size_of::<sockaddr_in>());
        let mut big = [0u8; 200];
        m.buf = big.as_mut_ptr().cast();
        m.cap = big.len();
        assert_eq!(eudp_recvmsg(rx.0, &mut m, 0), 100);
        assert_eq!((m.len, m.full_len, m.flags), (100, 100, 0));
        assert_eq!(&big[..100], &d[..]);
    }
    assert_eq!(rx.recv_err(EUDP_MSG_DONTWAIT), libc::EAGAIN);
}

#[test]
fn batches_keep_order_and_count() {
    let rx = Ep::bound("127.0.0.1:0");
    let tx = Ep::bound("127.0.0.1:0");
    let to = Raw::new(rx.local());
    // 200 datagrams sent in a few GSO/sendmmsg calls outrun the default
    // receive buffer (the kernel would drop them, as for any socket).
    // SAFETY: live handle.
    assert_eq!(unsafe { eudp_set_recv_buffer_size(rx.0, 4 << 20) }, 0);
    const N: usize = 200;
    let data: Vec<Vec<u8>> = (0..N).map(|i| payload(1 + (i * 37) % 1500, i as u32)).collect();
    let msgs: Vec<eudp_txmsg> = data
        .iter()
        .map(|d| eudp_txmsg { buf: d.as_ptr().cast(), len: d.len(), addr: to.ptr(), addrlen: to.1 })
        .collect();
    let mut sent = 0;
    while sent < N {
        // SAFETY: live handle, entries valid for the call.
        let k = unsafe { eudp_send_batch(tx.0, msgs[sent..].as_ptr(), N - sent) };
        assert!(k > 0, "send_batch: {}", io::Error::last_os_error());
        sent += k as usize;
    }
    // A bad entry after progress: the count, then the error on retry.
    let bad = [msgs[0], eudp_txmsg { addrlen: 3, ..msgs[1] }];
    // SAFETY: as above.
    unsafe {
        assert_eq!(eudp_send_batch(tx.0, bad.as_ptr(), 2), 1);
        assert_eq!(eudp_send_batch(tx.0, bad[1..].as_ptr(), 1), -1);
        assert_eq!(errno(), libc::EINVAL);
    }
    let mut bufs = vec![[0u8; 2048]; 32];
    let mut got: Vec<Vec<u8>> = Vec::new();
    while got.len() < N + 1 {
        // SAFETY: plain data.
        let mut ms: Vec<eudp_rxmsg> = (0..bufs.len()).map(|_| unsafe { zeroed() }).collect();
        for (m, b) in ms.iter_mut().zip(bufs.iter_mut()) {
            m.buf = b.as_mut_ptr().cast();
            m.cap = b.len();
        }
        // SAFETY: live handle, entries valid.
        let k = unsafe { eudp_recv_batch(rx.0, ms.as_mut_ptr(), ms.len(), 0) };
        assert!(
            k > 0,
            "recv_batch: {} after {} datagrams; rx {:?}; tx {:?}",
            io::Error::last_os_error(),
            got.len(),
            rx.stats(),
            tx.stats()
        );
        for (m, b) in ms.iter().zip(bufs.iter()).take(k as usize) {
            assert_eq!(m.flags, 0);
            got.push(b[..m.len].to_vec());
        }
    }
    assert_eq!(&got[..N], &data[..], "order or bytes differ");
    assert_eq!(got[N], data[0]);
    // SAFETY: live handle.
    assert_eq!(unsafe { eudp_flush(tx.0, -1) }, 0);
    let s = tx.stats();
    assert_eq!(s.datagrams_sent, N as u64 + 1);
    assert_eq!(s.direct_posts + s.queued_posts, N as u64 + 1);
    assert_eq!(s.drop_send_error + s.drop_shutdown, 0);
    let hist_calls: u64 = s.batch_hist.iter().sum();
    assert_eq!(hist_calls, s.engine_batches);
    let r = rx.stats();
    assert_eq!(r.datagrams_received, N as u64 + 1);
    assert_eq!(r.drop_ring_full, 0);
    // SAFETY: live handle, no entries.
    assert_eq!(unsafe { eudp_recv_batch(rx.0, null_mut(), 0, 0) }, 0);
    // SAFETY: as above; peek is refused for batches.
    assert_eq!(unsafe { eudp_recv_batch(rx.0, null_mut(), 0, EUDP_MSG_PEEK) }, -1);
    assert_eq!(errno(), libc::EINVAL);
}

fn readable(fd: c_int, ms: c_int) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    assert!(r >= 0);
    r == 1 && p.revents & libc::POLLIN != 0
}

#[test]
fn poll_fd_readable_exactly_when_data_waits() {
    let rx = Ep::bound("[::1]:0");
    let tx = Ep::bound("[::1]:0");
    // SAFETY: live handle.
    let fd = unsafe { eudp_poll_fd(rx.0) };
    assert!(fd >= 0);
    // SAFETY: as above; the same fd every time.
    assert_eq!(unsafe { eudp_poll_fd(rx.0) }, fd);
    assert!(!readable(fd, 50));
    for i in 0..2u8 {
        assert_eq!(tx.sendto(&[i; 33], rx.local()), 33);
    }
    assert!(readable(fd, 5000));
    let mut buf = [0u8; 64];
    assert_eq!(rx.recvfrom(&mut buf, 0).0, 33);
    // The second datagram may still be on its way into the ring.
    assert!(readable(fd, 5000));
    assert_eq!(rx.recvfrom(&mut buf, 0).0, 33);
    assert_eq!(buf[0], 1);
    assert!(!readable(fd, 50));
}

#[test]
fn one_handle_shared_by_threads() {
    let rx = Ep::bound("127.0.0.1:0");
    let tx = Ep::bound("127.0.0.1:0");
    // SAFETY: live handle.
    assert_eq!(unsafe { eudp_set_recv_buffer_size(rx.0, 4 << 20) }, 0);
    let to = rx.local();
    const PER: u32 = 500;
    // Handles cross threads as integers, as a C program would share a pointer.
    let (txp, rxp) = (tx.0 as usize, rx.0 as usize);
    let receiver = std::thread::spawn(move || {
        let mut next = [0u32; 2];
        let mut buf = [0u8; 64];
        for _ in 0..2 * PER {
            // SAFETY: the handle outlives this thread (joined below).
            let n = unsafe { eudp_recv(rxp as *mut eudp_endpoint, buf.as_mut_ptr().cast(), buf.len(), 0) };
            assert_eq!(n, 8, "recv: {}", io::Error::last_os_error());
            let t = u32::from_le_bytes(buf[..4].try_into().unwrap()) as usize;
            let seq = u32::from_le_bytes(buf[4..8].try_into().unwrap());
            assert_eq!(seq, next[t], "thread {t} out of order");
            next[t] += 1;
        }
        next
    });
    let senders: Vec<_> = (0..2u32)
        .map(|t| {
            std::thread::spawn(move || {
                let r = Raw::new(to);
                for seq in 0..PER {
                    let mut d = [0u8; 8];
                    d[..4].copy_from_slice(&t.to_le_bytes());
                    d[4..].copy_from_slice(&seq.to_le_bytes());
                    // SAFETY: the handle outlives this thread (joined below).
                    let n = unsafe { eudp_sendto(txp as *mut eudp_endpoint, d.as_ptr().cast(), 8, r.ptr(), r.1) };
                    assert_eq!(n, 8, "send: {}", io::Error::last_os_error());
                }
            })
        })
        .collect();
    for s in senders {
        s.join().unwrap();
    }
    assert_eq!(receiver.join().unwrap(), [PER, PER]);
    // SAFETY: live handle.
    assert_eq!(unsafe { eudp_flush(tx.0, 5000) }, 0);
    assert_eq!(tx.stats().datagrams_sent, 2 * PER as u64);
}
