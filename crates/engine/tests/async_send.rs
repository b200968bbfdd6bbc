//! The asynchronous sender over loopback: buffer reuse, completions,
//! per-datagram errors, back-pressure and GSO runs.

use eudp_engine::async_udp::{AsyncConfig, AsyncSender, Completion, Datagram};
use eudp_engine::sys::sockopt::set_int_option;
use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::time::Duration;

/// A receiving socket with room for every datagram a test sends: a
/// loopback GSO run arrives as segments that each charge a large share of
/// the receive buffer.
fn receiver() -> UdpSocket {
    let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
    rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let fd = rx.as_fd();
    if set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20).is_err() {
        set_int_option(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, 8 << 20).unwrap();
    }
    rx
}

fn pair() -> (UdpSocket, UdpSocket) {
    let rx = receiver();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.connect(rx.local_addr().unwrap()).unwrap();
    (tx, rx)
}

fn sender(tx: UdpSocket, max_in_flight: usize) -> AsyncSender<Vec<u8>> {
    AsyncSender::new(tx, AsyncConfig { zerocopy: true, gso: true, max_in_flight }).unwrap()
}

/// The payload of datagram `seq`: its number, then a byte pattern of it.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![(seq % 251) as u8; len];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v
}

fn collect(s: &mut AsyncSender<Vec<u8>>, want: usize) -> Vec<Completion<Vec<u8>>> {
    let mut out = Vec::new();
    for _ in 0..200 {
        s.poll_completions(&mut out, usize::MAX).unwrap();
        if out.len() >= want {
            break;
        }
        s.wait(Some(Duration::from_millis(20))).unwrap();
    }
    out
}

#[test]
fn buffers_come_back_once_and_are_overwritten_only_after_their_completion() {
    let (tx, rx) = pair();
    let mut s = sender(tx, 4);
    const N: u64 = 300;
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 2048];
        let mut seen = Vec::new();
        while seen.len() < N as usize {
            let Ok(n) = rx.recv(&mut buf) else { break };
            let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert_eq!(&buf[..n], &payload(seq, n)[..], "datagram {seq} arrived changed");
            seen.push(seq);
        }
        seen
    });
    let mut pool: Vec<Vec<u8>> = (0..4).map(|_| vec![0u8; 1200]).collect();
    let mut done = HashSet::new();
    let mut seq = 0;
    while seq < N || s.in_flight() > 0 {
        while seq < N {
            let Some(mut buf) = pool.pop() else { break };
            buf.copy_from_slice(&payload(seq, 1200));
            s.submit(Datagram { buf, token: seq, dst: None }).unwrap();
            assert!(s.in_flight() <= 4);
            seq += 1;
        }
        s.wait(Some(Duration::from_secs(2))).unwrap();
        let mut out = Vec::new();
        s.poll_completions(&mut out, usize::MAX).unwrap();
        for mut c in out {
            assert_eq!(c.result.as_ref().unwrap(), &1200);
            assert!(done.insert(c.token), "token {} completed twice", c.token);
            // The earliest moment the buffer is the caller's again: scribble
            // on it at once; the datagram on the wire must not change.
            c.buf.fill(0xEE);
            pool.push(c.buf);
        }
    }
    assert_eq!(done.len(), N as usize);
    let seen = reader.join().unwrap();
    assert_eq!(seen.len(), N as usize);
    if s.zerocopy() {
        // Loopback receivers copy the pages: the kernel says so.
        assert_eq!(s.stats().zero_copied, 0);
    }
    assert_eq!(s.stats().sent, N);
}

#[test]
fn back_pressure_returns_the_batch_untouched() {
    let (tx, _rx) = pair();
    let mut s = sender(tx, 2);
    for t in 0..2 {
        s.submit(Datagram { buf: payload(t, 100), token: t, dst: None }).unwrap();
    }
    let full = s.submit(Datagram { buf: payload(2, 100), token: 2, dst: None }).unwrap_err();
    assert_eq!(full.0.len(), 1);
    assert_eq!(full.0[0].buf, payload(2, 100));
    let got = collect(&mut s, 2);
    assert_eq!(got.len(), 2);
    s.submit(full.0.into_iter().next().unwrap()).unwrap();
    assert_eq!(collect(&mut s, 1)[0].token, 2);
}

#[test]
fn errors_arrive_with_the_datagram_they_belong_to() {
    let (tx, rx) = pair();
    let mut s = sender(tx, 16);
    let batch = vec![
        Datagram { buf: payload(0, 100), token: 0, dst: None },
        Datagram { buf: vec![0u8; 70_000], token: 1, dst: None },
        Datagram { buf: payload(2, 100), token: 2, dst: None },
    ];
    s.submit_batch(batch).unwrap();
    let mut got = collect(&mut s, 3);
    got.sort_by_key(|c| c.token);
    assert_eq!(got.len(), 3);
    assert_eq!(got[0].result.as_ref().unwrap(), &100);
    assert_eq!(got[1].result.as_ref().unwrap_err().raw_os_error(), Some(libc::EMSGSIZE));
    assert!(got[1].copied, "a refused datagram reports no zero-copy");
    assert_eq!(got[2].result.as_ref().unwrap(), &100);

    // A closed port: the first datagram draws an ICMP error, which the
    // kernel reports by refusing the next send on the connected socket.
    drop(rx);
    s.submit(Datagram { buf: payload(3, 100), token: 3, dst: None }).unwrap();
    assert!(collect(&mut s, 1)[0].result.is_ok());
    std::thread::sleep(Duration::from_millis(20));
    s.wait(Some(Duration::from_millis(50))).unwrap();
    s.submit(Datagram { buf: payload(4, 100), token: 4, dst: None }).unwrap();
    let c = collect(&mut s, 1);
    assert_eq!(c[0].token, 4);
    assert_eq!(c[0].result.as_ref().unwrap_err().raw_os_error(), Some(libc::ECONNREFUSED));
}

#[test]
fn completion_fd_polls_readable_while_completions_wait() {
    let (tx, _rx) = pair();
    let mut s = sender(tx, 8);
    let fd = s.completion_fd();
    let readable = |fd| {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one live pollfd for the call.
        unsafe { libc::poll(&mut p, 1, 1000) == 1 }
    };
    s.submit(Datagram { buf: payload(0, 64), token: 7, dst: None }).unwrap();
    assert!(readable(fd));
    let got = collect(&mut s, 1);
    assert_eq!(got[0].token, 7);
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one live pollfd for the call.
    assert_eq!(unsafe { libc::poll(&mut p, 1, 0) }, 0, "nothing waits after collection");
}

#[test]
fn a_gso_batch_arrives_as_its_datagrams() {
    let rx = receiver();
    let dst: SocketAddr = rx.local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut s = sender(tx, 64);
    let batch: Vec<_> = (0..40).map(|t| Datagram { buf: payload(t, 1000), token: t, dst: Some(dst) }).collect();
    s.submit_batch(batch).unwrap();
    let mut buf = vec![0u8; 2048];
    for t in 0..40 {
        let n = rx.recv(&mut buf).unwrap_or_else(|e| panic!("datagram {t}: {e} {:?}", s.stats()));
        assert_eq!(&buf[..n], &payload(t, 1000)[..]);
    }
    let got = collect(&mut s, 40);
    let tokens: HashSet<u64> = got.iter().map(|c| c.token).collect();
    assert_eq!(tokens.len(), 40);
    assert!(got.iter().all(|c| c.result.as_ref().ok() == Some(&1000)));
}

#[test]
fn copying_mode_completes_at_once() {
    let (tx, rx) = pair();
    let mut s = AsyncSender::new(tx, AsyncConfig { zerocopy: false, gso: true, max_in_flight: 4 }).unwrap();
    s.submit(Datagram { buf: payload(1, 500), token: 1, dst: None }).unwrap();
    let mut out = Vec::new();
    assert_eq!(s.poll_completions(&mut out, usize::MAX).unwrap(), 1);
    assert!(out[0].copied);
    let mut buf = [0u8; 600];
    assert_eq!(rx.recv(&mut buf).unwrap(), 500);
}
