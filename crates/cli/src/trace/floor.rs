//! The overhead floor: the least CPU a full trace adds per datagram on
//! each side at this host's unit costs.

use eudp_trace::resolve::{self, Dump};

/// What `--overhead` keeps of a traced (stack, size) for its floor.
#[derive(Clone, Debug)]
pub struct Floor {
    pub stack: String,
    pub size: u64,
    /// Kernel TX stamps per datagram sent in the full traces (median).
    pub stamps: f64,
    /// Untraced CPU ns per datagram: both sides, the sender, the receiver (medians).
    pub cpu: f64,
    pub tx_cpu: f64,
    pub rx_cpu: f64,
    /// The sender's application thread, untraced (medians).
    pub app: AppThread,
}

/// The sender's application thread: it makes the send calls, and with the
/// default policy (`EUDP_TX_CALLER_DRAIN`) also the send syscalls of a
/// stream. Busy nearly all the time, it bounds the rate, so what tracing
/// adds to it sets the traced rate.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct AppThread {
    /// CPU ns per datagram.
    pub cpu: f64,
    /// Its CPU over the wall time of the sending (0-1).
    pub busy: f64,
    /// Share of the kernel messages it sent itself (from the full traces;
    /// the engine thread sent the rest), hence of the TX stamps it made.
    pub msg_share: f64,
}

/// A thread this busy (CPU over wall time) or more is taken to bound its
/// side's rate (a streaming sender's application thread runs 88-92% of the
/// time on the test VM; the rest it waits for room).
const BOUND_BUSY: f64 = 0.85;

/// The share of a full trace's kernel messages sent by its application
/// thread (the thread that recorded the send calls); `None` without any.
pub fn app_thread_msg_share(tx: &Dump) -> Option<f64> {
    let mut calls: std::collections::HashMap<u64, u64> = std::collections::HashMap::new();
    for e in tx.events.iter().filter(|e| e.1 == resolve::kind::SEND_CALL) {
        *calls.entry(e.3).or_default() += 1;
    }
    let app = calls.into_iter().max_by_key(|&(_, n)| n)?.0;
    let (mut total, mut mine) = (0u64, 0u64);
    for e in tx.events.iter().filter(|e| e.1 == resolve::kind::KMSG) {
        total += 1;
        mine += u64::from(e.3 == app);
    }
    (total > 0).then(|| mine as f64 / total as f64)
}

/// A [`Floor`] at given unit costs: the least CPU a full trace adds per
/// datagram on each side, and its share of that side's untraced CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FloorShares {
    /// Sender: its application thread's two clock reads and the stamps its
    /// sends make; receiver: its two clock reads (ns per datagram).
    pub tx_floor: f64,
    pub rx_floor: f64,
    /// Shares of the untraced CPU per datagram: sender, receiver, both.
    pub tx: f64,
    pub rx: f64,
    pub total: f64,
    /// The sender's application thread: its send call's two clock reads
    /// and the stamps of the messages it sent (ns per datagram), and their
    /// share of its untraced CPU.
    pub app_floor: f64,
    pub app: f64,
}

impl FloorShares {
    /// The smallest of the three shares: above 10%, no side can be traced
    /// in full for 10% more CPU.
    fn least(&self) -> f64 {
        self.total.min(self.tx).min(self.rx)
    }
}

impl Floor {
    fn shares(&self, uc: &crate::trace_costs::UnitCosts) -> FloorShares {
        let (tx_floor, rx_floor) = crate::trace_costs::floor_by_side(uc, self.stamps);
        // The sender's floor, with only the stamps of its own messages.
        let app_floor = crate::trace_costs::floor_by_side(uc, self.stamps * self.app.msg_share).0;
        FloorShares {
            tx_floor,
            rx_floor,
            tx: tx_floor / self.tx_cpu,
            rx: rx_floor / self.rx_cpu,
            total: (tx_floor + rx_floor) / self.cpu,
            app_floor,
            app: app_floor / self.app.cpu,
        }
    }

    /// About the traced/untraced rate the floor alone would allow when the
    /// sender's application thread bounds the rate (busy [`BOUND_BUSY`] or
    /// more): its time per datagram grows by the floor. An estimate, not a
    /// bound: the thread may overlap part of a clock read with its other
    /// work, or with the time it waits. `None` when it does not bound it.
    fn rate_at_floor(&self, s: &FloorShares) -> Option<f64> {
        (self.app.busy >= BOUND_BUSY).then(|| 1.0 / (1.0 + s.app))
    }
}

/// Appends the overhead floor to `out`: for each traced (stack, size), the
/// least CPU per datagram a full trace adds on each side at this host's
/// unit costs (`crate::trace_costs::floor_ns_per_datagram`), as a share of that
/// side's untraced CPU per datagram. Where CPU bounds a transfer's rate (a
/// side's, or the CPUs the testbed's two hosts share), the rate falls by at
/// least about that share. Returns the same as JSON.
pub fn floor_report(
    out: &mut String,
    before: &crate::trace_costs::UnitCosts,
    after: &crate::trace_costs::UnitCosts,
    floors: &[Floor],
) -> serde_json::Value {
    use std::fmt::Write as _;
    let uc = crate::trace_costs::UnitCosts {
        clock_read_ns: before.clock_read_ns.min(after.clock_read_ns),
        clock_in_context_ns: before.clock_in_context_ns.min(after.clock_in_context_ns),
        stamp_make_ns: before.stamp_make_ns.min(after.stamp_make_ns),
        stamp_read_ns: before.stamp_read_ns.min(after.stamp_read_ns),
        stamped_sends: before.stamped_sends + after.stamped_sends,
        stamps_read: before.stamps_read + after.stamps_read,
    };
    let _ = writeln!(
        out,
        "floor: unit costs on this host (lower of two measurements): clock read {:.1} ns back to back, {:.1} ns among a send's work (the floor counts {:.1}), making a kernel TX stamp {:.0} ns, reading one back {:.0} ns ({} of {} stamps read)",
        uc.clock_read_ns,
        uc.clock_in_context_ns,
        uc.clock_floor_ns(),
        uc.stamp_make_ns,
        uc.stamp_read_ns,
        uc.stamps_read,
        2 * uc.stamped_sends
    );
    let mut rows = Vec::new();
    for f in floors {
        let b = f.shares(&uc);
        let _ = writeln!(
            out,
            "{:<7} {:>6} floor: sender 2 x {:.1} + {:.4} stamps/dgram x {:.0} = {:.0} ns/dgram ({:.1}% of its untraced {:.0}), receiver 2 x {:.1} = {:.0} ({:.1}% of {:.0}), both {:.1}% of {:.0}{}",
            f.stack,
            f.size,
            uc.clock_floor_ns(),
            f.stamps,
            uc.stamp_make_ns.max(0.0),
            b.tx_floor,
            100.0 * b.tx,
            f.tx_cpu,
            uc.clock_floor_ns(),
            b.rx_floor,
            100.0 * b.rx,
            f.rx_cpu,
            100.0 * b.total,
            f.cpu,
            if b.least() > 0.1 { ": the floor alone is over 10% of each side's CPU" } else { "" }
        );
        let _ = writeln!(out, "{}", app_floor_line(f, &b, &uc));
        rows.push(serde_json::json!({"stack": f.stack, "size": f.size, "stamps_per_datagram": f.stamps, "sender_floor_ns": b.tx_floor, "receiver_floor_ns": b.rx_floor,
            "untraced_cpu_ns_per_datagram": f.cpu, "untraced_sender_cpu_ns": f.tx_cpu, "untraced_receiver_cpu_ns": f.rx_cpu,
            "floor_share": {"sender": b.tx, "receiver": b.rx, "both": b.total},
            "app_thread": {"untraced_cpu_ns": f.app.cpu, "untraced_busy": f.app.busy, "kernel_message_share": f.app.msg_share, "floor_ns": b.app_floor, "floor_share": b.app, "rate_on_off_bound": f.rate_at_floor(&b)}}));
    }
    serde_json::json!({"clock_read_ns": uc.clock_read_ns, "clock_in_context_ns": uc.clock_in_context_ns, "clock_floor_ns": uc.clock_floor_ns(), "stamp_make_ns": uc.stamp_make_ns, "stamp_read_ns": uc.stamp_read_ns,
        "before": format!("{before:?}"), "after": format!("{after:?}"), "rows": rows})
}

/// The floor report's line for the sender's application thread.
fn app_floor_line(f: &Floor, b: &FloorShares, uc: &crate::trace_costs::UnitCosts) -> String {
    let bound = match f.rate_at_floor(b) {
        Some(r) => format!(": busy most of the time, it bounds the rate: at these unit costs the floor alone would hold rate on/off to about {r:.3}{}", if r < 0.9 { ", under the 10% budget's 0.9" } else { "" }),
        None => String::new(),
    };
    let head = format!("{:<7} {:>6} floor on the sender's application thread ({:.0}% busy untraced, sent {:.0}% of the kernel messages)", f.stack, f.size, 100.0 * f.app.busy, 100.0 * f.app.msg_share);
    let sum = format!(
        "2 x {:.1} + {:.4} x {:.2} x {:.0} = {:.0} ns/dgram",
        uc.clock_floor_ns(),
        f.stamps,
        f.app.msg_share,
        uc.stamp_make_ns.max(0.0),
        b.app_floor
    );
    format!("{head}: {sum} ({:.1}% of its untraced {:.0}){bound}", 100.0 * b.app, f.app.cpu)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floor_shares_count_clock_reads_and_stamps_on_the_right_side() {
        let uc = crate::trace_costs::UnitCosts {
            clock_read_ns: 10.0,
            clock_in_context_ns: 12.0,
            stamp_make_ns: 300.0,
            stamp_read_ns: 600.0,
            stamped_sends: 1,
            stamps_read: 2,
        };
        // 2 stamps per 40 datagrams: 15 ns per datagram on the sender.
        let f = Floor {
            stack: "eudp".into(),
            size: 1472,
            stamps: 0.05,
            cpu: 700.0,
            tx_cpu: 500.0,
            rx_cpu: 200.0,
            app: AppThread { cpu: 400.0, busy: 0.5, msg_share: 0.5 },
        };
        let s = f.shares(&uc);
        assert_eq!((s.tx_floor, s.rx_floor), (35.0, 20.0));
        assert_eq!((s.tx, s.rx), (0.07, 0.1));
        assert!((s.total - 55.0 / 700.0).abs() < 1e-12);
        assert_eq!(s.least(), s.tx);
        // A cheap pipeline: every side's floor is over 10 %.
        let small = Floor {
            stack: "eudp".into(),
            size: 64,
            stamps: 0.016,
            cpu: 250.0,
            tx_cpu: 170.0,
            rx_cpu: 80.0,
            app: AppThread::default(),
        };
        assert!(small.shares(&uc).least() > 0.1);
        // The stamp cost is never counted negative (a noisy measurement).
        let neg = crate::trace_costs::UnitCosts { stamp_make_ns: -5.0, ..uc };
        assert_eq!(f.shares(&neg).tx_floor, 20.0);
        // Reads that cost less among other work count at that cost.
        let hidden = crate::trace_costs::UnitCosts { clock_in_context_ns: 4.0, ..uc };
        assert_eq!((f.shares(&hidden).tx_floor, f.shares(&hidden).rx_floor), (23.0, 8.0));
    }

    #[test]
    fn the_application_threads_floor_counts_the_stamps_of_its_own_messages() {
        let uc = crate::trace_costs::UnitCosts {
            clock_read_ns: 10.0,
            clock_in_context_ns: 12.0,
            stamp_make_ns: 300.0,
            stamp_read_ns: 600.0,
            stamped_sends: 1,
            stamps_read: 2,
        };
        // Half the kernel messages sent by the application thread: half of
        // the 0.05 stamps per datagram made on it.
        let mut f = Floor {
            stack: "eudp".into(),
            size: 1472,
            stamps: 0.05,
            cpu: 700.0,
            tx_cpu: 500.0,
            rx_cpu: 200.0,
            app: AppThread { cpu: 400.0, busy: 0.5, msg_share: 0.5 },
        };
        let s = f.shares(&uc);
        assert_eq!(s.app_floor, 27.5);
        assert_eq!(s.app, 27.5 / 400.0);
        // Half busy, it does not bound the rate: no estimate is made.
        assert_eq!(f.rate_at_floor(&s), None);
        f.app.busy = 0.95;
        assert_eq!(f.rate_at_floor(&s), Some(400.0 / 427.5));
        // The engine thread sent every message: only the clock reads.
        f.app.msg_share = 0.0;
        assert_eq!(f.shares(&uc).app_floor, 20.0);
    }

    #[test]
    fn the_application_thread_is_the_one_that_made_the_send_calls() {
        use resolve::{kind, RawEvent};
        let ev = |k: u8, thread: u64| RawEvent(1, k, 0, thread, 0, 0, 0);
        let mut d = Dump {
            events: vec![
                ev(kind::SEND_CALL, 7),
                ev(kind::SEND_CALL, 7),
                ev(kind::SEND_CALL, 9),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 7),
                ev(kind::KMSG, 9),
            ],
            ..Dump::default()
        };
        assert_eq!(app_thread_msg_share(&d), Some(0.75));
        d.events.retain(|e| e.1 != kind::KMSG);
        assert_eq!(app_thread_msg_share(&d), None);
        d.events.clear();
        assert_eq!(app_thread_msg_share(&d), None);
    }
}
