//! The asynchronous sender over loopback, with each zero-copy engine:
//! buffer reuse, completions, per-datagram errors, back-pressure and GSO
//! runs; registered buffers with the io_uring engine.

mod async_common;
use async_common::engines;
use eudp_engine::async_udp::{AsyncConfig, AsyncSender, Completion, Datagram, SendBuf, SendEngine};
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

fn sender<B: SendBuf>(tx: UdpSocket, max_in_flight: usize, engine: SendEngine) -> AsyncSender<B> {
    let s = AsyncSender::new(tx, AsyncConfig { engine, max_in_flight, ..AsyncConfig::default() }).unwrap();
    assert!(s.engine().is_none() || s.engine() == Some(engine));
    s
}

/// The payload of datagram `seq`: its number, then a byte pattern of it.
fn payload(seq: u64, len: usize) -> Vec<u8> {
    let mut v = vec![(seq % 251) as u8; len];
    v[..8].copy_from_slice(&seq.to_le_bytes());
    v
}

fn collect<B: SendBuf>(s: &mut AsyncSender<B>, want: usize) -> Vec<Completion<B>> {
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
    for e in engines() {
        buffers_come_back_once_and_are_overwritten_only_after_their_completion_with(e);
    }
}

fn buffers_come_back_once_and_are_overwritten_only_after_their_completion_with(engine: SendEngine) {
    let (tx, rx) = pair();
    let mut s = sender(tx, 4, engine);
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
    for e in engines() {
        back_pressure_returns_the_batch_untouched_with(e);
    }
}

fn back_pressure_returns_the_batch_untouched_with(engine: SendEngine) {
    let (tx, _rx) = pair();
    let mut s = sender(tx, 2, engine);
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
    for e in engines() {
        errors_arrive_with_the_datagram_they_belong_to_with(e);
    }
}

fn errors_arrive_with_the_datagram_they_belong_to_with(engine: SendEngine) {
    let (tx, rx) = pair();
    let mut s = sender(tx, 16, engine);
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
    for e in engines() {
        completion_fd_polls_readable_while_completions_wait_with(e);
    }
}

fn completion_fd_polls_readable_while_completions_wait_with(engine: SendEngine) {
    let (tx, _rx) = pair();
    let mut s = sender(tx, 8, engine);
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
    for e in engines() {
        a_gso_batch_arrives_as_its_datagrams_with(e);
    }
}

fn a_gso_batch_arrives_as_its_datagrams_with(engine: SendEngine) {
    let rx = receiver();
    let dst: SocketAddr = rx.local_addr().unwrap();
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut s = sender(tx, 64, engine);
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
    let mut s =
        AsyncSender::new(tx, AsyncConfig { zerocopy: false, max_in_flight: 4, ..AsyncConfig::default() }).unwrap();
    s.submit(Datagram { buf: payload(1, 500), token: 1, dst: None }).unwrap();
    let mut out = Vec::new();
    assert_eq!(s.poll_completions(&mut out, usize::MAX).unwrap(), 1);
    assert!(out[0].copied);
    let mut buf = [0u8; 600];
    assert_eq!(rx.recv(&mut buf).unwrap(), 500);
}

/// A slot of a region registered with the io_uring engine.
struct Slot(&'static mut [u8]);

impl SendBuf for Slot {
    fn bytes(&self) -> &[u8] {
        self.0
    }
}

#[test]
fn registered_buffers_are_reused_only_after_their_completion() {
    if !engines().contains(&SendEngine::Uring) {
        return;
    }
    const SLOTS: usize = 8;
    const LEN: usize = 1200;
    const N: u64 = 300;
    let (tx, rx) = pair();
    let mut s: AsyncSender<Slot> = sender(tx, SLOTS, SendEngine::Uring);
    let region: &'static mut [u8] = Box::leak(vec![0u8; SLOTS * LEN].into_boxed_slice());
    s.register_buffers(&[&*region]).unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 2048];
        let mut seen = HashSet::new();
        while seen.len() < N as usize {
            let Ok(n) = rx.recv(&mut buf) else { break };
            let seq = u64::from_le_bytes(buf[..8].try_into().unwrap());
            assert_eq!(&buf[..n], &payload(seq, LEN)[..], "datagram {seq} arrived changed");
            assert!(seen.insert(seq), "datagram {seq} twice");
        }
        seen.len()
    });
    let mut pool: Vec<Slot> = region.chunks_mut(LEN).map(Slot).collect();
    let mut seq = 0;
    let mut done = HashSet::new();
    while seq < N || s.in_flight() > 0 {
        // Whole batches of free slots: same-size datagrams to one peer go
        // out as GSO runs from the registered region.
        let mut batch = Vec::new();
        while seq < N {
            let Some(slot) = pool.pop() else { break };
            slot.0.copy_from_slice(&payload(seq, LEN));
            batch.push(Datagram { buf: slot, token: seq, dst: None });
            seq += 1;
        }
        if !batch.is_empty() {
            s.submit_batch(batch).map_err(|f| f.0.len()).unwrap();
        }
        s.wait(Some(Duration::from_secs(2))).unwrap();
        let mut out = Vec::new();
        s.poll_completions(&mut out, usize::MAX).unwrap();
        for c in out {
            assert_eq!(c.result.as_ref().unwrap(), &LEN);
            assert!(done.insert(c.token), "token {} completed twice", c.token);
            c.buf.0.fill(0xEE);
            pool.push(c.buf);
        }
    }
    assert_eq!(done.len(), N as usize);
    assert_eq!(reader.join().unwrap(), N as usize);
}

/// Runs `f` on a thread inside a new network namespace with its loopback
/// up and `net.core.optmem_max` set to `optmem`; `None` where that cannot
/// be had (not root, no `ip`).
fn in_netns_with_optmem<T: Send + 'static>(optmem: u32, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    use std::process::Command;
    // Unique per call: the tests of this binary run at once.
    static CALLS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let ns = format!("eudp-enobufs-{}-{call}", std::process::id());
    let ip = |args: &[&str]| Command::new("ip").args(args).output().is_ok_and(|o| o.status.success());
    let _ = ip(&["netns", "del", &ns]);
    if !ip(&["netns", "add", &ns]) {
        eprintln!("SKIPPED: cannot create a network namespace (root needed)");
        return None;
    }
    let set = ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])
        && ip(&["netns", "exec", &ns, "sysctl", "-qw", &format!("net.core.optmem_max={optmem}")]);
    let ns2 = ns.clone();
    let r = set.then(|| {
        std::thread::spawn(move || {
            eudp_engine::backend::xdp::sys::enter_netns(&ns2).expect("setns");
            f()
        })
        .join()
    });
    let _ = ip(&["netns", "del", &ns]);
    if !set {
        eprintln!("SKIPPED: optmem_max is not settable in a network namespace here");
    }
    Some(r?.expect("test thread"))
}

#[test]
fn enobufs_lands_on_the_datagram_the_kernel_refused() {
    // Each zero-copy send takes a notification buffer charged to the
    // socket's option memory until its notification is read; with room for
    // about one, the sends after the first are refused with ENOBUFS.
    let r = in_netns_with_optmem(1000, || {
        let (tx, rx) = pair();
        let mut s: AsyncSender<Vec<u8>> = sender(tx, 16, SendEngine::MsgZerocopy);
        if !s.zerocopy() {
            return None;
        }
        const N: u64 = 6;
        for t in 0..N {
            s.submit(Datagram { buf: payload(t, 300), token: t, dst: None }).unwrap();
        }
        let got = collect(&mut s, N as usize);
        let mut sent = HashSet::new();
        let mut refused = HashSet::new();
        for c in &got {
            match &c.result {
                Ok(n) => assert!(*n == 300 && sent.insert(c.token)),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::ENOBUFS), "token {}", c.token);
                    assert!(refused.insert(c.token));
                }
            }
        }
        assert_eq!(sent.len() + refused.len(), N as usize, "every datagram completes once");
        // Exactly the datagrams whose completions said sent arrive.
        rx.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 512];
        let mut arrived = HashSet::new();
        while let Ok(n) = rx.recv(&mut buf) {
            assert_eq!(n, 300);
            arrived.insert(u64::from_le_bytes(buf[..8].try_into().unwrap()));
        }
        assert_eq!(arrived, sent);
        // With the notifications read, the option memory is free again.
        s.submit(Datagram { buf: payload(N, 300), token: N, dst: None }).unwrap();
        let last = collect(&mut s, 1);
        Some((sent.len(), refused.len(), last[0].result.is_ok()))
    });
    let Some(Some((sent, refused, last_ok))) = r else { return };
    assert!(sent >= 1 && refused >= 1, "sent {sent}, refused {refused}");
    assert!(last_ok);
}

#[test]
fn the_uring_engine_sends_where_option_memory_refuses_msg_zerocopy() {
    // io_uring takes its notifications from its own ring, not the socket's
    // option memory: with room for about one MSG_ZEROCOPY notification,
    // every SEND_ZC of the same sends completes sent and arrives.
    if !engines().contains(&SendEngine::Uring) {
        return;
    }
    let r = in_netns_with_optmem(1000, || {
        let (tx, rx) = pair();
        let mut s: AsyncSender<Vec<u8>> = sender(tx, 16, SendEngine::Uring);
        assert!(s.zerocopy(), "the io_uring engine sends zero-copy");
        const N: u64 = 6;
        for t in 0..N {
            s.submit(Datagram { buf: payload(t, 300), token: t, dst: None }).unwrap();
        }
        let got = collect(&mut s, N as usize);
        let sent: HashSet<u64> = got
            .iter()
            .map(|c| {
                assert_eq!(c.result.as_ref().ok(), Some(&300), "token {}: {:?}", c.token, c.result);
                c.token
            })
            .collect();
        rx.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        let mut buf = [0u8; 512];
        let mut arrived = HashSet::new();
        while arrived.len() < N as usize {
            let Ok(n) = rx.recv(&mut buf) else { break };
            assert_eq!(n, 300);
            arrived.insert(u64::from_le_bytes(buf[..8].try_into().unwrap()));
        }
        (sent, arrived)
    });
    let Some((sent, arrived)) = r else { return };
    assert_eq!(sent, (0..6).collect::<HashSet<_>>());
    assert_eq!(arrived, sent);
}
