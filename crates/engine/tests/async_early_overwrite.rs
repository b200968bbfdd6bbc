//! Early overwrite: what reaches the wire when a zero-copy send's buffer is
//! written before its completion.
//!
//! On loopback the kernel copies a zero-copy send's pages while the send
//! call runs, so no overwrite after it can show. Here the sending end of a
//! veth pair holds the datagram in a token-bucket queue (`tbf` at 100 bit/s,
//! its bucket emptied by one plug datagram): the send returns with the
//! kernel still reading the caller's pages, and the datagram leaves (and is
//! copied, by the receiving side of the veth) only when the test raises the
//! rate and kicks the queue. The queue's backlog, read after the overwrite,
//! proves the datagram had not left yet, so every assertion is exact:
//!
//! * a buffer overwritten while held goes out with the new bytes — the
//!   hazard the completion guards against;
//! * the sender gives no buffer back, and its completion fd stays quiet,
//!   while the kernel holds the datagram; back-pressure refuses more; the
//!   buffers it hands back after the release went out with their old bytes;
//! * the completion's `copied` is the kernel's word: copied when the veth
//!   delivered the datagram, not copied when the queue dropped it unsent.
//!
//! Needs root (network namespaces) and the `tbf` qdisc; says SKIPPED
//! otherwise.

mod async_common;
use async_common::engines;
use eudp_engine::async_udp::{AsyncConfig, AsyncSender, Completion, Datagram, SendBuf, SendEngine};
use std::net::{SocketAddr, UdpSocket};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

const A_ADDR: &str = "198.18.39.1";
const B_ADDR: &str = "198.18.39.2";
/// Fills the bucket's 1600 bytes but for 58 (1542 bytes with headers).
const PLUG: usize = 1500;
/// Held for about 80 s at 100 bit/s: far longer than any test step.
const HELD: usize = 1000;

/// Two namespaces joined by a veth pair with static neighbours and no IPv6
/// (nothing but the test's datagrams passes the queue); removed on drop.
struct HeldBed {
    a: String,
    b: String,
}

fn run(args: &[&str]) -> bool {
    Command::new(args[0]).args(&args[1..]).output().is_ok_and(|o| o.status.success())
}

impl HeldBed {
    fn new() -> Option<HeldBed> {
        static CALLS: AtomicU32 = AtomicU32::new(0);
        let call = CALLS.fetch_add(1, Ordering::Relaxed);
        let base = format!("eudp-eo-{}-{call}", std::process::id());
        let bed = HeldBed { a: format!("{base}-a"), b: format!("{base}-b") };
        if !run(&["ip", "netns", "add", &bed.a]) || !run(&["ip", "netns", "add", &bed.b]) {
            eprintln!("SKIPPED: cannot create network namespaces (root needed)");
            return None;
        }
        let (a, b) = (bed.a.as_str(), bed.b.as_str());
        let ok = [a, b].iter().all(|n| {
            run(&["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv6.conf.all.disable_ipv6=1"])
                && run(&["ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1"])
        }) && run(&[
            "ip",
            "-n",
            a,
            "link",
            "add",
            "va",
            "address",
            "02:00:00:00:00:01",
            "type",
            "veth",
            "peer",
            "name",
            "vb",
            "address",
            "02:00:00:00:00:02",
            "netns",
            b,
        ]) && run(&["ip", "-n", a, "addr", "add", &format!("{A_ADDR}/24"), "dev", "va"])
            && run(&["ip", "-n", b, "addr", "add", &format!("{B_ADDR}/24"), "dev", "vb"])
            && run(&["ip", "-n", a, "link", "set", "va", "up"])
            && run(&["ip", "-n", b, "link", "set", "vb", "up"])
            && run(&[
                "ip",
                "-n",
                a,
                "neigh",
                "add",
                B_ADDR,
                "lladdr",
                "02:00:00:00:00:02",
                "dev",
                "va",
                "nud",
                "permanent",
            ])
            && run(&[
                "ip",
                "-n",
                b,
                "neigh",
                "add",
                A_ADDR,
                "lladdr",
                "02:00:00:00:00:01",
                "dev",
                "vb",
                "nud",
                "permanent",
            ]);
        assert!(ok, "testbed setup failed");
        if !bed.hold_queue() {
            eprintln!("SKIPPED: this kernel has no tbf qdisc");
            return None;
        }
        Some(bed)
    }

    fn tc(&self, args: &[&str]) -> bool {
        let mut v = vec!["ip", "netns", "exec", &self.a, "tc"];
        v.extend_from_slice(args);
        run(&v)
    }

    /// Datagrams in the sending veth's queue now.
    fn backlog(&self) -> u64 {
        let out =
            Command::new("ip").args(["netns", "exec", &self.a, "tc", "-s", "qdisc", "show", "dev", "va"]).output();
        let text = String::from_utf8_lossy(&out.expect("tc").stdout).into_owned();
        // "... backlog 1042b 1p requeues 0"
        let words: Vec<&str> = text.split_whitespace().collect();
        let at = words.iter().position(|w| *w == "backlog").expect("tc prints a backlog");
        words[at + 2].trim_end_matches('p').parse().expect("backlog packets")
    }

    /// A fresh 100 bit/s queue with a full 1600-byte bucket (the plug empties it).
    fn hold_queue(&self) -> bool {
        self.tc(&["qdisc", "replace", "dev", "va", "root", "tbf", "rate", "100bit", "burst", "1600", "limit", "100000"])
    }

    /// Raises the rate: the queue empties at its next dequeue (the caller
    /// kicks it with a send).
    fn open_queue(&self) {
        assert!(self.tc(&[
            "qdisc", "change", "dev", "va", "root", "tbf", "rate", "1gbit", "burst", "100000", "limit", "100000"
        ]));
    }

    /// Removes the queue, dropping what it holds unsent.
    fn drop_queue(&self) {
        assert!(self.tc(&["qdisc", "del", "dev", "va", "root"]));
    }

    /// Runs `f` on a thread inside namespace `ns`: sockets it opens belong
    /// to that namespace wherever they are used afterwards.
    fn inside<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = ns.to_string();
        std::thread::spawn(move || {
            eudp_engine::backend::xdp::sys::enter_netns(&ns).expect("setns");
            f()
        })
        .join()
        .expect("namespace thread")
    }

    /// The receiver in `b`, a plain socket in `a` for the plug and the
    /// kick, and the socket for the sender under test in `a`.
    fn sockets(&self) -> (UdpSocket, UdpSocket, UdpSocket) {
        let rx = Self::inside(&self.b, || UdpSocket::bind(format!("{B_ADDR}:0")).unwrap());
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let (plain, tx) = Self::inside(&self.a, || {
            (UdpSocket::bind(format!("{A_ADDR}:0")).unwrap(), UdpSocket::bind(format!("{A_ADDR}:0")).unwrap())
        });
        (rx, plain, tx)
    }
}

impl Drop for HeldBed {
    fn drop(&mut self) {
        run(&["ip", "netns", "del", &self.a]);
        run(&["ip", "netns", "del", &self.b]);
    }
}

fn sender<B: SendBuf>(tx: UdpSocket, engine: SendEngine, max_in_flight: usize) -> AsyncSender<B> {
    let cfg = AsyncConfig { engine, max_in_flight, gso: false, ..AsyncConfig::default() };
    let s = AsyncSender::new(tx, cfg).unwrap();
    assert!(s.zerocopy(), "zero-copy sends on this kernel");
    s
}

/// Empties the bucket: the plug leaves at once, and what follows waits.
fn plug(plain: &UdpSocket, dst: SocketAddr) {
    plain.send_to(&[b'P'; PLUG], dst).unwrap();
}

fn kick(plain: &UdpSocket, dst: SocketAddr) {
    plain.send_to(b"kick", dst).unwrap();
}

/// Everything `rx` receives until the kick arrives (the kick excluded).
fn received_until_kick(rx: &UdpSocket) -> Vec<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 4096];
    loop {
        let n = rx.recv(&mut buf).expect("a datagram before the 5 s timeout");
        if &buf[..n] == b"kick" {
            return got;
        }
        got.push(buf[..n].to_vec());
        assert!(got.len() < 100, "runaway receive");
    }
}

fn collect<B: SendBuf>(s: &mut AsyncSender<B>, want: usize) -> Vec<Completion<B>> {
    let mut out = Vec::new();
    for _ in 0..250 {
        s.poll_completions(&mut out, usize::MAX).unwrap();
        if out.len() >= want {
            break;
        }
        s.wait(Some(Duration::from_millis(20))).unwrap();
    }
    assert_eq!(out.len(), want, "completions within 5 s");
    out
}

/// A buffer the test keeps writing to while the sender holds it: what a C
/// caller that breaks the reuse rule does.
#[derive(Debug)]
struct Alias {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointee is a leaked heap block that outlives every use.
unsafe impl Send for Alias {}

impl SendBuf for Alias {
    fn bytes(&self) -> &[u8] {
        // SAFETY: the block lives (see `Send`); the test writes to it only
        // between the sender's calls, never while this slice is in use.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[test]
fn a_buffer_overwritten_before_its_completion_goes_out_with_the_new_bytes() {
    let Some(bed) = HeldBed::new() else { return };
    for e in engines() {
        overwrite_before_completion_with(&bed, e);
    }
}

fn overwrite_before_completion_with(bed: &HeldBed, engine: SendEngine) {
    let (rx, plain, tx) = bed.sockets();
    let dst = rx.local_addr().unwrap();
    let mut s: AsyncSender<Alias> = sender(tx, engine, 4);
    let block: &'static mut [u8] = Box::leak(vec![b'O'; HELD].into_boxed_slice());
    let alias = Alias { ptr: block.as_mut_ptr(), len: HELD };
    plug(&plain, dst);
    s.submit(Datagram { buf: alias, token: 7, dst: Some(dst) }).unwrap();
    let mut out = Vec::new();
    assert_eq!(s.poll_completions(&mut out, usize::MAX).unwrap(), 0, "{engine:?}: no completion while held");
    // SAFETY: the block is live and no slice of it is in use (see `Alias`).
    unsafe { std::ptr::write_bytes(block.as_mut_ptr(), b'N', HELD) };
    // Read after the overwrite: the datagram had not left, so the kernel
    // has not copied its pages yet.
    assert_eq!(bed.backlog(), 1, "{engine:?}: the datagram waits in the queue");
    assert_eq!(s.poll_completions(&mut out, usize::MAX).unwrap(), 0, "{engine:?}: still no completion");
    bed.open_queue();
    kick(&plain, dst);
    let c = collect(&mut s, 1).pop().unwrap();
    assert_eq!((c.token, c.result.as_ref().ok()), (7, Some(&HELD)));
    assert!(c.copied, "{engine:?}: the veth's receiving side copied the pages");
    let got = received_until_kick(&rx);
    assert_eq!(got.len(), 2, "{engine:?}: the plug and the held datagram");
    assert_eq!(got[0], vec![b'P'; PLUG]);
    assert_eq!(got[1], vec![b'N'; HELD], "{engine:?}: the early overwrite reached the wire");
    assert!(bed.hold_queue());
}

/// Datagram `seq`'s bytes.
fn pattern(seq: u8) -> Vec<u8> {
    vec![b'a' + seq; HELD]
}

#[test]
fn the_sender_gives_a_buffer_back_only_after_the_kernel_is_done_with_it() {
    let Some(bed) = HeldBed::new() else { return };
    for e in engines() {
        reuse_after_completion_with(&bed, e);
    }
}

fn reuse_after_completion_with(bed: &HeldBed, engine: SendEngine) {
    const IN_FLIGHT: usize = 3;
    let (rx, plain, tx) = bed.sockets();
    let dst = rx.local_addr().unwrap();
    let mut s: AsyncSender<Vec<u8>> = sender(tx, engine, IN_FLIGHT);
    plug(&plain, dst);
    for seq in 0..IN_FLIGHT as u8 {
        s.submit(Datagram { buf: pattern(seq), token: seq.into(), dst: Some(dst) }).unwrap();
    }
    // Held: nothing comes back, the completion fd stays quiet, and the
    // bound refuses a fourth datagram, handing it back untouched.
    assert!(!s.wait(Some(Duration::from_millis(200))).unwrap(), "{engine:?}: no completion while held");
    let mut out = Vec::new();
    assert_eq!(s.poll_completions(&mut out, usize::MAX).unwrap(), 0);
    assert_eq!(s.in_flight(), IN_FLIGHT);
    let refused = s.submit(Datagram { buf: pattern(9), token: 9, dst: Some(dst) }).unwrap_err();
    assert_eq!(refused.0.len(), 1);
    assert_eq!((refused.0[0].token, &refused.0[0].buf), (9, &pattern(9)));
    assert_eq!(bed.backlog(), IN_FLIGHT as u64, "{engine:?}: every datagram waits in the queue");
    bed.open_queue();
    kick(&plain, dst);
    let done = collect(&mut s, IN_FLIGHT);
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    assert_eq!(tokens, vec![0, 1, 2]);
    for mut c in done {
        assert_eq!(c.result.as_ref().ok(), Some(&HELD));
        assert!(c.copied, "{engine:?}: the veth's receiving side copied the pages");
        // The buffer is the caller's again: overwrite it at once.
        c.buf.fill(0xEE);
    }
    let got = received_until_kick(&rx);
    assert_eq!(got.len(), 1 + IN_FLIGHT, "{engine:?}: the plug and the held datagrams");
    for (seq, d) in got[1..].iter().enumerate() {
        assert_eq!(d, &pattern(seq as u8), "{engine:?}: datagram {seq} went out with its old bytes");
    }
    assert_eq!(s.stats().zero_copied, 0);
    assert!(bed.hold_queue());
}

#[test]
fn a_datagram_the_queue_drops_unsent_completes_not_copied() {
    let Some(bed) = HeldBed::new() else { return };
    for e in engines() {
        dropped_unsent_with(&bed, e);
        assert!(bed.hold_queue());
    }
}

fn dropped_unsent_with(bed: &HeldBed, engine: SendEngine) {
    let (rx, plain, tx) = bed.sockets();
    let dst = rx.local_addr().unwrap();
    let mut s: AsyncSender<Vec<u8>> = sender(tx, engine, 4);
    plug(&plain, dst);
    s.submit(Datagram { buf: pattern(0), token: 1, dst: Some(dst) }).unwrap();
    assert_eq!(bed.backlog(), 1);
    // The kernel frees the datagram without ever copying its pages: the
    // notification says zero-copy, and the completion repeats it.
    bed.drop_queue();
    let c = collect(&mut s, 1).pop().unwrap();
    assert_eq!((c.token, c.result.as_ref().ok()), (1, Some(&HELD)));
    assert!(!c.copied, "{engine:?}: the kernel never copied the dropped datagram");
    assert_eq!(s.stats().zero_copied, 1);
    kick(&plain, dst);
    assert_eq!(received_until_kick(&rx), vec![vec![b'P'; PLUG]], "{engine:?}: only the plug arrived");
}
