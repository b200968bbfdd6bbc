//! A waiting application thread's blocking receive (base scheme): while
//! it holds the socket's lease ([`crate::emp::lease`]) it sleeps in one
//! `recvmmsg` on the socket, outside the runtime's lock, and runs the
//! round for what it received; a ping-pong then costs each side a send and
//! this receive per message.

use crate::backend::kernel::{InMeta, UdpSocket};
use crate::emp::lease::BLOCK;
use crate::emp::runtime::Runtime;
use crate::emp::shared::Shared;
use crate::sys::sync::{lock, try_lock};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Receive buffers of the blocking waiter; each holds a GRO super-packet.
const BATCH: usize = 8;
const BUF: usize = 65_536;

/// The blocking waiter's buffers (one waiter at a time holds them),
/// allocated at its first blocking receive.
#[derive(Debug, Default)]
pub struct RxBuffers {
    bufs: Vec<Vec<u8>>,
    meta: Vec<InMeta>,
}

/// What a blocking receive came to.
#[derive(Debug)]
pub enum Blocking {
    /// Frames came and their round ran: look at the completion queue.
    Received,
    /// The receive timed out (or was interrupted): a round runs the timers.
    Empty,
    /// This thread may not block on the socket now (another waiter holds
    /// the buffers, the engine thread still watches the socket, or a timer
    /// or the caller's timeout is due before a blocking receive would
    /// end): it sleeps in epoll instead, until the flow timer given, if any.
    Declined(Option<Instant>),
}

/// One blocking receive by a waiting thread, with `left` of its timeout.
pub fn receive_blocking(
    shared: &Shared,
    rt: &Mutex<Runtime>,
    rx: &Mutex<RxBuffers>,
    sock: &UdpSocket,
    now: Instant,
    left: Option<Duration>,
) -> Blocking {
    shared.lease.renew(now);
    let Some(mut rx) = try_lock(rx) else { return Blocking::Declined(None) };
    let timer = {
        let Some(g) = try_lock(rt) else { return Blocking::Declined(None) };
        if !shared.lease.engine_off() {
            drop(g);
            // The engine thread takes the socket out of its epoll set when
            // it sees the lease.
            shared.doorbell.set();
            return Blocking::Declined(None);
        }
        g.next_timer()
    };
    if left.is_some_and(|l| l < BLOCK) || timer.is_some_and(|t| t < now + BLOCK) {
        return Blocking::Declined(timer);
    }
    let rx = &mut *rx;
    if rx.bufs.is_empty() {
        rx.bufs = vec![vec![0; BUF]; BATCH];
        rx.meta = vec![InMeta::default(); BATCH];
    }
    match sock.recv_batch_wait(&mut rx.bufs, &mut rx.meta) {
        Ok(n) if n > 0 => {
            lock(rt).round_received(Instant::now(), &rx.bufs, &rx.meta, n);
            // An engine thread still watching (the lease just began) woke
            // for later frames and left them to this thread.
            if shared.take_missed() {
                lock(rt).round(Instant::now(), false, true);
            }
            Blocking::Received
        }
        // A timeout, a signal, or a socket error (an ICMP report, consumed
        // by this call): the round that follows reads the socket again.
        _ => Blocking::Empty,
    }
}
