//! Readiness shared by poll, select and epoll: what an accelerated socket
//! reports, when the kernel may be skipped, and the flush before a sleep.

use crate::shim::{self, with_sock_in, Sock, Tls, ACTIVE};
use crate::sys::coarse_ns;
use eudp_engine::Endpoint;
use libc::c_int;
use std::time::Instant;

/// [`Extra::fd`] of a socket whose ring's eventfd could not be made.
pub(super) const NO_RING: c_int = -2;

/// What stands for one accelerated socket of a poll besides its own
/// descriptor.
#[derive(Clone, Copy)]
pub(super) struct Extra {
    /// Index in the application's array.
    pub(super) at: usize,
    /// A descriptor to poll for input on its behalf (its ring's eventfd),
    /// or -1.
    pub(super) fd: c_int,
    /// Events known to be ready now, without asking the kernel: POLLIN
    /// (datagrams in the ring), POLLERR (an error waiting for the
    /// application) and POLLOUT (room in L1).
    pub(super) ready: libc::c_short,
    /// The kernel socket's own events must be asked for even with `ready`
    /// set (a socket back on the kernel path with datagrams kept from its
    /// ring: its other events are the kernel's).
    pub(super) ask: bool,
}

/// Accelerated sockets a poll names before `poll_input` allocates.
pub(super) const EXTRA_MAX: usize = 16;

/// Reports, for each accelerated socket polled for input or output, the
/// descriptors that stand for its input besides itself and what is ready
/// now. `room`: those asked for output are known to have room in L1.
pub(super) fn scan_ready(t: &Tls, app: &[libc::pollfd], room: bool, mut add: impl FnMut(Extra)) {
    let bypass = shim::bypass_transport();
    for (at, p) in app.iter().enumerate() {
        let input = p.events & libc::POLLIN != 0;
        let output = p.events & libc::POLLOUT != 0;
        if !(input || output) || !shim::maybe(p.fd) {
            continue;
        }
        with_sock_in(t, p.fd, |s| {
            // A ring with data is input whatever else stands for the
            // socket (under the TCP transport, the backend's descriptor).
            if !output {
                if let Some(fd) = s.ready_ring_fd() {
                    add(Extra { at, fd, ready: libc::POLLIN, ask: false });
                    return;
                }
            }
            let mut seen = |ep: &Endpoint| {
                // Room in L1 is what POLLOUT means for an accelerated
                // socket (a full L1 is `poll_impl`'s business).
                let out = if output && (room || ep.writable()) { libc::POLLOUT } else { 0 };
                if !input {
                    if out != 0 {
                        add(Extra { at, fd: -1, ready: out, ask: false });
                    }
                    return;
                }
                let ready = if ep.ready_or_fill() { input_events(s, ep) } else { 0 } | out;
                if let Some(fd) = s.ring_fd(ep) {
                    add(Extra { at, fd, ready, ask: false });
                } else {
                    // No eventfd (the descriptor budget): without it a wait
                    // would miss the ring; the caller moves the socket to
                    // the kernel path.
                    add(Extra { at, fd: NO_RING, ready, ask: false });
                }
                if let Some(fd) = s.err_fd_made() {
                    add(Extra { at, fd, ready: 0, ask: false });
                }
                // (A kernel-backend endpoint under a bypass transport that
                // could not start has none: its socket is the program's.)
                if let Some(fd) = ep.bypass_fd().filter(|_| bypass) {
                    add(Extra { at, fd, ready: 0, ask: false });
                }
            };
            // Under the TCP transport a socket waited on for input is adopted
            // now; one already on the engine is borrowed without its mutex.
            let found = if bypass && input && s.mode() != ACTIVE {
                s.endpoint(p.fd).map(|ep| seen(&ep))
            } else {
                s.with_existing_in(t, seen)
            };
            if found.is_none() && input && s.has_leftover() {
                add(Extra { at, fd: -1, ready: libc::POLLIN, ask: true });
            }
        });
    }
}

/// What input readiness of an accelerated socket stands for: POLLIN for
/// datagrams in the ring, POLLERR for an asynchronous error waiting for the
/// next send or receive (the engine took it off the kernel socket, whose
/// own poll would have said POLLERR, not POLLIN).
fn input_events(s: &Sock, ep: &Endpoint) -> libc::c_short {
    let mut ev = 0;
    if ep.has_pending_error() {
        ev |= libc::POLLERR;
    }
    if s.ring_has_data() || ev == 0 {
        ev |= libc::POLLIN;
    }
    ev
}

/// The kernel socket of the accelerated socket `fd` reported an error
/// (POLLERR): it becomes the endpoint's pending error at once, so the send
/// or receive the program makes next fails with it, as on the kernel —
/// rather than a send being queued and the engine's own send meeting the
/// error later. Only on POLLERR, which is rare.
///
/// Returns false when the POLLERR stood for no error: the socket is traced
/// (`eudp trace`) and its error queue held the kernel's TX stamps, which
/// are read into the trace here (a kernel socket the program traced
/// itself would not report them).
pub(super) fn claim_error(t: &Tls, fd: c_int) -> bool {
    let Some(ep) = with_sock_in(t, fd, |s| s.existing()).flatten() else { return true };
    let v = crate::sys::int_opt(fd, libc::SOL_SOCKET, libc::SO_ERROR);
    if let Some(v) = v {
        ep.note_error(v);
    }
    let v = v.unwrap_or(0);
    if v == 0 && eudp_engine::tracepoint::on() {
        ep.drain_trace();
        return ep.has_pending_error();
    }
    true
}

/// [`input_events`] of the accelerated socket `fd` one of whose input
/// descriptors (ring eventfd, error flag, the backend's descriptor) was
/// found readable; 0 when the ring is still empty after a read on the spot
/// (`Endpoint::ready_after_read`): the backend's descriptor does not
/// promise a datagram, and "readable" must mean the next nonblocking
/// receive returns one.
pub(super) fn ring_events_of(t: &Tls, fd: c_int) -> libc::c_short {
    with_sock_in(t, fd, |s| {
        if s.ring_has_data() {
            None
        } else {
            s.existing().map(|ep| if ep.ready_after_read() { input_events(s, &ep) } else { 0 })
        }
    })
    .flatten()
    .unwrap_or(libc::POLLIN)
}

/// A poll/select whose accelerated sockets already have datagrams in their
/// rings is answered without a syscall, except that the kernel is asked
/// (timeout 0) about the other descriptors at least every
/// `SKIP_LIMIT`-th call and at least once per tick of the coarse clock
/// (4 ms at HZ=250), so none of them waits long behind a busy socket.
/// Past about 256 000 calls a second the count binds before the tick. The
/// count is high because a receiver that selects once per datagram (iperf3,
/// millions a second) would otherwise ask the kernel every few tens of
/// microseconds, and those syscalls cost it datagrams of an unpaced stream.
const SKIP_LIMIT: u32 = 1024;

/// True (and counted) when this call may be answered from the rings alone.
pub(super) fn may_skip_kernel(t: &Tls) -> bool {
    let (n, at) = t.skipped.get();
    if n < SKIP_LIMIT && coarse_ns() == at {
        t.skipped.set((n + 1, at));
        true
    } else {
        false
    }
}

/// The kernel is being asked about every descriptor now.
pub(super) fn kernel_checked(t: &Tls) {
    t.skipped.set((0, coarse_ns()));
}

/// Records, for a running `select`, the moment before a call that may sleep
/// (`ts` not zero).
pub(super) unsafe fn mark_sleep(t: &Tls, ts: *const libc::timespec) {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        if no_wait(ts) {
            return;
        }
        before_sleep();
        if let (true, None) = t.sleep_mark.get() {
            t.sleep_mark.set((true, Some(Instant::now())));
        }
    }
}

/// This thread may sleep in the kernel now (a wait whose timeout is not
/// zero): whatever it queued that waits out its coalescing interval is sent
/// first (`Engine::send_coalesced_now`; one atomic load when nothing
/// waits). A program that sent a burst and now waits for the answers
/// would otherwise wait up to `EUDP_TX_COALESCE_US` for its last datagrams
/// to leave. (A wait that finds something ready at once has then sent its
/// remainder early: a smaller batch, nothing worse.)
pub(super) fn before_sleep() {
    if let Some(e) = shim::running_engine() {
        e.send_coalesced_now();
    }
}

/// True for a timeout that makes a wait return at once.
pub(super) unsafe fn no_wait(ts: *const libc::timespec) -> bool {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe { !ts.is_null() && (*ts).tv_sec == 0 && (*ts).tv_nsec == 0 }
}
