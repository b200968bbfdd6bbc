//! The unit costs behind `eudp trace --overhead`'s floor: what each point
//! a full trace records costs on this host, measured on loopback.

use eudp_engine::backend::kernel::UdpSocket;
use eudp_engine::sys::clock::thread_cpu_time;
use eudp_engine::sys::timestamp::{read_tx_timestamps, SO_TIMESTAMPING};
use eudp_engine::tracepoint;

/// What the points a full trace must record cost on this host, one by one:
/// the inputs of the overhead floor (`eudp trace --overhead`, docs/trace.md
/// "Cost"). Each is a cost of the CPU or the kernel, not of eudp: any
/// implementation that records the same points pays it too.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnitCosts {
    /// One read of the hot-path clock (ns; best round of reads back to back).
    pub clock_read_ns: f64,
    /// What one read adds among other work ([`clock_cost_in_context`]):
    /// the CPU may overlap part of a read with the work around it.
    pub clock_in_context_ns: f64,
    /// What asking for one kernel TX stamp adds to the send call that makes
    /// it (ns of the sender's CPU; `__skb_tstamp_tx`: an skb per stamp,
    /// queued on the error queue). Reading it back is not included.
    pub stamp_make_ns: f64,
    /// Reading one stamp back with `recvmmsg(MSG_ERRQUEUE)` (ns, the way
    /// the engine reads them).
    pub stamp_read_ns: f64,
    /// Stamped sends made, and stamps read back (twice as many when every
    /// send was stamped: TX_SCHED and TX_SOFTWARE).
    pub stamped_sends: u64,
    pub stamps_read: u64,
}

/// Measures [`UnitCosts`] on loopback in the calling thread's network
/// namespace: clock reads in a loop (best of 20 rounds), then one-datagram
/// 64 B sends from a plain and a stamped socket, alternated, the stamped
/// socket's stamps read back between timed stretches (best of 7 rounds of
/// 32 × 32 sends each). Times are the thread's CPU time, so a round in which
/// the thread was preempted does not inflate them.
pub fn unit_costs() -> std::io::Result<UnitCosts> {
    tracepoint::choose_clock();
    let mut x = 0u64;
    let clock_read_ns = (0..20)
        .map(|_| {
            let n = 10_000u64;
            let t0 = tracepoint::now_ns();
            for _ in 0..n {
                x = x.wrapping_add(tracepoint::hot_clock());
            }
            (tracepoint::now_ns() - t0) as f64 / n as f64
        })
        .fold(f64::MAX, f64::min);
    std::hint::black_box(x);
    let clock_in_context_ns = clock_cost_in_context();
    let sink = std::net::UdpSocket::bind("127.0.0.1:0")?;
    let dst = sink.local_addr()?;
    let socket = |stamped: bool| -> std::io::Result<UdpSocket> {
        let s = UdpSocket::new(false)?;
        if stamped {
            s.set_option(libc::SOL_SOCKET, SO_TIMESTAMPING, tracepoint::TX_STAMP_FLAGS)?;
        }
        s.connect(&dst)?;
        Ok(s)
    };
    let (plain, stamped) = (socket(false)?, socket(true)?);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stamped);
    let cpu = || thread_cpu_time().as_nanos() as u64;
    // 32 sends (64 stamps) between reads: well within the error queue's
    // room (SO_RCVBUF), so no stamp is dropped for want of it.
    const STRETCH: u64 = 32;
    const STRETCHES: u64 = 32;
    let mut c = UnitCosts {
        clock_read_ns,
        clock_in_context_ns,
        stamp_make_ns: 0.0,
        stamp_read_ns: f64::MAX,
        stamped_sends: 0,
        stamps_read: 0,
    };
    let (mut plain_best, mut stamped_best) = (f64::MAX, f64::MAX);
    for _ in 0..7 {
        for s in [&plain, &stamped] {
            let is_stamped = std::ptr::eq(s, &stamped);
            let (mut send_ns, mut read_ns, mut read) = (0u64, 0u64, 0u64);
            for _ in 0..STRETCHES {
                let t0 = cpu();
                for _ in 0..STRETCH {
                    s.send_to(&[1u8; 64], None)?;
                }
                let t1 = cpu();
                send_ns += t1 - t0;
                if is_stamped {
                    read += read_tx_timestamps(fd, &mut |_, _, _| {}) as u64;
                    read_ns += cpu() - t1;
                }
            }
            let per_send = send_ns as f64 / (STRETCH * STRETCHES) as f64;
            if is_stamped {
                c.stamped_sends += STRETCH * STRETCHES;
                c.stamps_read += read;
                stamped_best = stamped_best.min(per_send);
                if read > 0 {
                    c.stamp_read_ns = c.stamp_read_ns.min(read_ns as f64 / read as f64);
                }
            } else {
                plain_best = plain_best.min(per_send);
            }
        }
    }
    // Two stamps per stamped send.
    c.stamp_make_ns = (stamped_best - plain_best) / 2.0;
    if c.stamp_read_ns == f64::MAX {
        c.stamp_read_ns = f64::NAN;
    }
    Ok(c)
}

/// What two clock reads add to a loop shaped like a traced send call's own
/// work: take a lock, copy 64 bytes into one of 64 slots, release it, with
/// a read before and after; against the same loop without the reads,
/// alternated, best of 20 rounds each; half the difference (ns per read).
fn clock_cost_in_context() -> f64 {
    let slots = std::sync::Mutex::new(vec![[0u8; 64]; 64]);
    let data = [7u8; 64];
    let n = 10_000usize;
    let round = |reads: bool| {
        let mut acc = 0u64;
        let t0 = tracepoint::now_ns();
        for i in 0..n {
            let a = if reads { tracepoint::hot_clock() } else { i as u64 };
            slots.lock().unwrap_or_else(|e| e.into_inner())[i % 64].copy_from_slice(std::hint::black_box(&data));
            let b = if reads { tracepoint::hot_clock() } else { i as u64 };
            acc = acc.wrapping_add(b.wrapping_sub(a));
        }
        std::hint::black_box(acc);
        (tracepoint::now_ns() - t0) as f64 / n as f64
    };
    let (mut with, mut without) = (f64::MAX, f64::MAX);
    for _ in 0..20 {
        with = with.min(round(true));
        without = without.min(round(false));
    }
    (with - without) / 2.0
}

impl UnitCosts {
    /// The clock read the floor counts: the lower of the two measurements
    /// (never below zero), so the floor stays a lower bound.
    pub fn clock_floor_ns(&self) -> f64 {
        self.clock_read_ns.min(self.clock_in_context_ns).max(0.0)
    }
}

/// The least CPU per datagram that recording a full trace adds, from unit
/// costs: four clock reads (enter and return of the send call and of the
/// receive call) and the making of `stamps_per_datagram` kernel TX stamps.
/// Everything else a trace does (storing events, reading the stamps back,
/// the RX stamp) comes on top, so this is a lower bound.
pub fn floor_ns_per_datagram(c: &UnitCosts, stamps_per_datagram: f64) -> f64 {
    4.0 * c.clock_floor_ns() + stamps_per_datagram * c.stamp_make_ns.max(0.0)
}

/// [`floor_ns_per_datagram`] by side: (sender: its send call's two clock
/// reads and the stamps, receiver: its receive call's two clock reads).
pub fn floor_by_side(c: &UnitCosts, stamps_per_datagram: f64) -> (f64, f64) {
    let clocks = 2.0 * c.clock_floor_ns();
    (clocks + stamps_per_datagram * c.stamp_make_ns.max(0.0), clocks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The unit costs behind the overhead floor: every stamped send made
    /// its two stamps and every one was read back (else the stamp costs
    /// measured nothing), and the figures are finite.
    #[test]
    fn unit_costs_stamp_every_send() {
        let c = unit_costs().unwrap();
        assert!(c.stamped_sends > 0);
        assert_eq!(c.stamps_read, 2 * c.stamped_sends, "{c:?}");
        assert!(c.clock_read_ns > 0.0 && c.clock_read_ns.is_finite(), "{c:?}");
        assert!(c.stamp_make_ns.is_finite() && c.stamp_read_ns.is_finite() && c.stamp_read_ns > 0.0, "{c:?}");
        let f = floor_ns_per_datagram(&c, 0.05);
        assert!(c.clock_in_context_ns.is_finite(), "{c:?}");
        assert!(c.clock_floor_ns() <= c.clock_read_ns && c.clock_floor_ns() >= 0.0);
        assert_eq!(f, 4.0 * c.clock_floor_ns() + 0.05 * c.stamp_make_ns.max(0.0));
    }
}
