//! The sockets one hook is measured on, and the calls themselves: the
//! same code runs under the shim and on plain libc.

use super::sys::{self, Fd};
use std::time::{Duration, Instant};

/// The hooks measured, by the name they have in the report.
///
/// `select` and `poll` find datagrams in the ring, as a streaming
/// receiver's waits do (`epoll_wait`, in the kernel socket: the engine
/// leaves a socket in an epoll set to the program); `poll_sparse` finds one datagram in the
/// kernel socket alone (a receiver of a datagram now and then, whose socket
/// the engine leaves to it); `select_iperf` is `select` on iperf3's server
/// set: its idle TCP listener and control connection beside the UDP socket.
pub const HOOKS: &[&str] =
    &["sendto", "recvfrom", "recvmsg", "select", "select_iperf", "poll", "epoll_wait", "poll_sparse"];

/// Datagrams loaded per round of a receive benchmark: well inside the
/// kernel socket's default receive buffer, so none is dropped.
pub const BATCH: u64 = 64;

const LEN: usize = 64;

pub struct Fixture {
    hook: &'static str,
    /// The socket under test (the program's, tracked by the shim).
    rx: Fd,
    /// Where `sendto` sends: a socket nobody reads (the kernel drops what
    /// overflows it).
    sink: libc::sockaddr_in,
    /// An untracked socket that loads `rx` outside the measured calls.
    feeder: Fd,
    rx_addr: libc::sockaddr_in,
    ep: Fd,
    /// `select_iperf`'s TCP listener, accepted and connecting ends.
    tcp: [Fd; 3],
    buf: [u8; 2048],
    /// Whether the shim is in this process (the harness sets this).
    preloaded: bool,
    /// Loads the engine had not taken off the socket in time (see `settle`).
    pub unsettled: u64,
}

impl Fixture {
    pub fn new(hook: &'static str) -> Fixture {
        let (rx, rx_addr) = sys::udp_socket(true);
        let (_sink_fd, sink) = sys::udp_socket(false);
        let (feeder, _) = sys::udp_socket(false);
        sys::recv_timeout(rx, 2);
        let preloaded = std::env::var_os("EUDP_HOOKS_SHIM").is_some();
        let mut f =
            Fixture { hook, rx, sink, feeder, rx_addr, ep: -1, tcp: [-1; 3], buf: [0; 2048], preloaded, unsettled: 0 };
        // The first receive adopts the socket (the shim's engine takes it
        // on its first I/O); nothing is there yet.
        sys::recvfrom(rx, &mut f.buf, libc::MSG_DONTWAIT);
        if hook == "epoll_wait" {
            f.ep = sys::epoll_for(rx);
        }
        if hook == "select_iperf" {
            f.tcp = sys::tcp_pair();
        }
        if hook == "poll_sparse" {
            // One datagram that stays: every wait finds the socket ready.
            f.feed(1);
            assert_eq!(sys::poll(rx), 1, "{hook}: the loaded datagram is not reported");
        } else if matches!(hook, "select" | "select_iperf" | "poll" | "epoll_wait") {
            // A burst of which one is read: under the shim that read takes
            // the burst into the ring, where the rest stays for every wait.
            f.feed(8);
            // (A socket in an epoll set is the program's to read: the engine
            // leaves its datagrams in the kernel socket.)
            if hook != "epoll_wait" {
                f.settle();
            }
            assert_eq!(sys::recvfrom(rx, &mut f.buf, 0), LEN as isize, "{hook}: the burst did not come");
            assert_eq!(sys::poll(rx), 1, "{hook}: the loaded datagrams are not reported");
        }
        f
    }

    fn feed(&mut self, n: u64) {
        let payload = [7u8; LEN];
        for _ in 0..n {
            assert_eq!(sys::sendto(self.feeder, &payload, &self.rx_addr), LEN as isize, "feeder sendto");
        }
    }

    /// Under the shim, waits (at most 2 s) until the engine has taken
    /// what was fed off the kernel socket: the measured calls then find
    /// their datagrams in the ring, as a streaming receiver's calls do,
    /// whatever the scheduling (under callgrind, threads take turns, and a
    /// receive that came first would read the socket itself instead).
    /// A wait that runs out is counted in `unsettled` (the calls after it
    /// may have read the socket themselves).
    fn settle(&mut self) {
        if !self.preloaded {
            return;
        }
        let t = Instant::now();
        let mut looks = 0u32;
        while sys::kernel_queued(self.rx) > 0 {
            if t.elapsed() > Duration::from_secs(2) {
                self.unsettled += 1;
                return;
            }
            looks += 1;
            if looks < 100 {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
    }

    /// Calls needed before the next `n` measured ones (receives need a
    /// datagram each); returns how many of them may be made (≤ `n`).
    pub fn prepare(&mut self, n: u64) -> u64 {
        if matches!(self.hook, "recvfrom" | "recvmsg") {
            let k = n.min(BATCH);
            self.feed(k);
            self.settle();
            return k;
        }
        n
    }

    /// Makes `n` calls of the hook; the number that failed.
    #[inline(always)]
    pub fn run(&mut self, n: u64) -> u64 {
        let payload = [7u8; LEN];
        let (rx, ep, sink, buf) = (self.rx, self.ep, self.sink, &mut self.buf);
        let iperf = [self.tcp[0], self.tcp[1], rx];
        match self.hook {
            "sendto" => count(n, || sys::sendto(rx, &payload, &sink) == LEN as isize),
            "recvfrom" => count(n, || sys::recvfrom(rx, buf, 0) == LEN as isize),
            "recvmsg" => count(n, || sys::recvmsg(rx, buf) == LEN as isize),
            "select" => count(n, || sys::select(rx) == 1),
            "select_iperf" => count(n, || sys::select_all(&iperf) == 1),
            "poll" | "poll_sparse" => count(n, || sys::poll(rx) == 1),
            // (An accelerated socket may be reported twice: its own descriptor
            // and its ring's eventfd carry the program's event data.)
            _ => count(n, || sys::epoll_wait(ep) >= 1),
        }
    }
}

#[inline(always)]
fn count(n: u64, mut ok: impl FnMut() -> bool) -> u64 {
    (0..n).filter(|_| !ok()).count() as u64
}
