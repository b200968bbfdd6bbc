//! Engine settings, from code or from `EUDP_*` environment variables.
//! What each variable accepts is in [`crate::settings`]; a bad value
//! leaves its own setting at the default and is reported, the others apply.
//!
//! | variable | meaning | default |
//! |---|---|---|
//! | `EUDP_L2_DEPTH` | L2 bound: backend operations in flight per endpoint | 1 |
//! | `EUDP_BUSY_POLL` | `1`: the engine thread spins instead of sleeping (and yields its CPU after every poll that found nothing, so a woken application thread on the same CPU runs at once); for hosts with a core to spare | 0 |
//! | `EUDP_CPU` | pin the engine thread to this CPU | unpinned |
//! | `EUDP_GSO` / `EUDP_GRO` | `0` disables UDP GSO / GRO | 1 |
//! | `EUDP_GRO_HOLD` | `1`: from its first UDP socket on, the engine keeps one unbound UDP socket of its own with `UDP_GRO` on, so the kernel's UDP encapsulation static keys stay on and a GRO socket that comes and goes does not flip them each time (on the test VM ~85 µs each way for an IPv4 socket, ~155 for an IPv6 one, which flips both keys). System-wide side effect while held: every UDP receive in the host takes the encapsulation branch (a socket lookup in UDP GRO, an `encap_type` test per datagram), as whenever any GRO or tunnel socket is open. `0`: no such socket | 1 |
//! | `EUDP_MAX_MSGS` | messages per `sendmmsg`/`recvmmsg` call | 16 |
//! | `EUDP_SPIN_US` | a blocked receiver spins this long before sleeping | 0 |
//! | `EUDP_TX_COALESCE_US` | a streaming sender's queued datagrams may wait this long for a full GSO batch before the engine sends them; `0` wakes the engine at once | 100 |
//! | `EUDP_TX_FLUSH_BATCHES` | a streaming sender's own thread sends L1 once it holds this many GSO batches (or half of L1), in one `sendmmsg`; more per call means fewer syscalls and fewer receiver wake-ups, at the cost of that much more queueing delay | 2 |
//! | `EUDP_TX_CALLER_DRAIN` | `0`: a streaming sender's own thread never sends L1; the engine thread sends every batch (woken once L1 holds `EUDP_TX_FLUSH_BATCHES` batches; a remainder still waits up to `EUDP_TX_COALESCE_US`), so the application thread only copies datagrams in while the engine's send runs on another CPU. Slower for 1472 B, faster for 64 B on the 2-CPU testbed (docs/preload.md). `1`: the sender's thread sends L1 itself (backends that allow it) | 1 |
//! | `EUDP_RX_HANDOFF_US` | an application thread that stopped receiving hands its socket back to the engine after this long (up to 32 times this long after a sleep in a receive with nothing arriving, during which the engine looks ever less often) | 1000 |

use std::time::Duration;

/// Settings of one engine and the endpoints it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// L2 bound in backend operations (descriptors) per endpoint.
    pub l2_depth: u32,
    /// The engine thread polls instead of sleeping when idle.
    pub busy_poll: bool,
    /// Pin the engine thread to this CPU.
    pub cpu: Option<usize>,
    /// Use UDP GSO on send when the kernel supports it.
    pub gso: bool,
    /// Use UDP GRO on receive when the kernel supports it.
    pub gro: bool,
    /// With `gro`: keep one GRO socket of the engine's own open from the
    /// first UDP endpoint on (see `EUDP_GRO_HOLD` above), so that sockets
    /// turning GRO on and closing do not each flip the kernel's static key.
    pub gro_hold: bool,
    /// Messages per batched send/receive syscall.
    pub max_msgs: usize,
    /// A blocked receiver spins this long before sleeping (latency profile).
    pub recv_spin: Duration,
    /// While an application thread keeps calling receive it reads the
    /// socket itself (batched, GRO) and the engine stays off it; once the
    /// thread has been away this long the engine watches the socket again.
    pub rx_handoff: Duration,
    /// How long a streaming sender's queued datagrams may wait before the
    /// engine sends them, counted from the oldest one L1 holds. Within it
    /// the sender's own thread sends L1 once it holds `tx_flush_batches`
    /// GSO batches, and the engine is not woken at all (its wake-up cost per
    /// batch was the largest part of a sender's overhead).
    /// Zero: every queued send wakes the engine at once.
    pub tx_coalesce: Duration,
    /// GSO batches L1 holds before the sender's own thread sends them (one
    /// backend call of that many messages, `max_msgs` permitting); L1 half
    /// full also triggers the send. A receiver is woken once per call's
    /// burst, so several batches per call also spare it wake-ups.
    pub tx_flush_batches: usize,
    /// A streaming sender's own thread may send L1 when it holds
    /// `tx_flush_batches` batches (where the backend allows it, see
    /// `Capabilities::drain_on_caller`). False: the engine thread sends every
    /// batch, woken by the send that completes one; a remainder still waits
    /// up to `tx_coalesce`.
    pub tx_caller_drain: bool,
    /// Record every queue transition (tests and conformance checks only).
    pub record_transitions: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            l2_depth: 1,
            busy_poll: false,
            cpu: None,
            gso: true,
            gro: true,
            gro_hold: true,
            max_msgs: 16,
            recv_spin: Duration::ZERO,
            rx_handoff: Duration::from_millis(1),
            tx_coalesce: Duration::from_micros(100),
            tx_flush_batches: 2,
            tx_caller_drain: true,
            record_transitions: false,
        }
    }
}

/// An `EUDP_*` variable that could not be parsed.
pub use crate::settings::SettingError as ConfigError;

impl Config {
    /// Defaults overridden by any `EUDP_*` variables present. A bad value
    /// leaves only its own setting at the default; each is logged once
    /// per process ([`crate::log::report_ignored`]). Never fails.
    pub fn from_env() -> Result<Self, ConfigError> {
        let (c, errs) = Self::from_lookup_lenient(|k| std::env::var(k).ok());
        crate::log::report_ignored(&errs);
        Ok(c)
    }

    /// As [`Config::from_env`] with an explicit lookup, strict: the first
    /// bad value is an error (testable; the profile checks use it).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let (c, mut errs) = Self::from_lookup_lenient(get);
        if errs.is_empty() {
            Ok(c)
        } else {
            Err(errs.swap_remove(0))
        }
    }

    /// Defaults overridden by the good values `get` finds, and the bad ones.
    pub fn from_lookup_lenient(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<ConfigError>) {
        use crate::settings::{lookup, Setting};
        let get: &dyn Fn(&str) -> Option<String> = &get;
        let mut e = Vec::new();
        let int = |s: &'static Setting, v: &str| s.int(v);
        let flag = |s: &'static Setting, v: &str| s.flag(v);
        let mut c = Config::default();
        if let Some(n) = lookup(get, "EUDP_L2_DEPTH", &mut e, int) {
            c.l2_depth = n as u32;
        }
        if let Some(b) = lookup(get, "EUDP_BUSY_POLL", &mut e, flag) {
            c.busy_poll = b;
        }
        if let Some(n) = lookup(get, "EUDP_CPU", &mut e, int) {
            c.cpu = Some(n as usize);
        }
        if let Some(b) = lookup(get, "EUDP_GSO", &mut e, flag) {
            c.gso = b;
        }
        if let Some(b) = lookup(get, "EUDP_GRO", &mut e, flag) {
            c.gro = b;
        }
        if let Some(b) = lookup(get, "EUDP_GRO_HOLD", &mut e, flag) {
            c.gro_hold = b;
        }
        if let Some(n) = lookup(get, "EUDP_MAX_MSGS", &mut e, int) {
            c.max_msgs = n as usize;
        }
        if let Some(n) = lookup(get, "EUDP_RX_HANDOFF_US", &mut e, int) {
            c.rx_handoff = Duration::from_micros(n);
        }
        if let Some(n) = lookup(get, "EUDP_TX_COALESCE_US", &mut e, int) {
            c.tx_coalesce = Duration::from_micros(n);
        }
        if let Some(n) = lookup(get, "EUDP_TX_FLUSH_BATCHES", &mut e, int) {
            c.tx_flush_batches = n as usize;
        }
        if let Some(b) = lookup(get, "EUDP_TX_CALLER_DRAIN", &mut e, flag) {
            c.tx_caller_drain = b;
        }
        if let Some(n) = lookup(get, "EUDP_SPIN_US", &mut e, int) {
            c.recv_spin = Duration::from_micros(n);
        }
        (c, e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_errors() {
        let c = Config::from_lookup(|k| match k {
            "EUDP_L2_DEPTH" => Some("4".into()),
            "EUDP_BUSY_POLL" => Some("yes".into()),
            "EUDP_CPU" => Some("1".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.l2_depth, c.busy_poll, c.cpu), (4, true, Some(1)));
        let e = Config::from_lookup(|k| (k == "EUDP_L2_DEPTH").then(|| "0".into())).unwrap_err();
        assert_eq!(e.var, "EUDP_L2_DEPTH");
        assert!(Config::from_lookup(|k| (k == "EUDP_GSO").then(|| "maybe".into())).is_err());
        let c = Config::from_lookup(|k| (k == "EUDP_TX_FLUSH_BATCHES").then(|| "3".into())).unwrap();
        assert_eq!(c.tx_flush_batches, 3);
        for bad in ["0", "65", "x"] {
            let e = Config::from_lookup(|k| (k == "EUDP_TX_FLUSH_BATCHES").then(|| bad.into())).unwrap_err();
            assert_eq!(e.var, "EUDP_TX_FLUSH_BATCHES");
        }
        assert!(Config::default().gro_hold);
        let c = Config::from_lookup(|k| (k == "EUDP_GRO_HOLD").then(|| "0".into())).unwrap();
        assert!(!c.gro_hold && c.gro);
        assert!(Config::from_lookup(|k| (k == "EUDP_GRO_HOLD").then(|| "2".into())).is_err());
        assert!(Config::default().tx_caller_drain);
        let c = Config::from_lookup(|k| (k == "EUDP_TX_CALLER_DRAIN").then(|| "0".into())).unwrap();
        assert!(!c.tx_caller_drain);
        let e = Config::from_lookup(|k| (k == "EUDP_TX_CALLER_DRAIN").then(|| "2".into())).unwrap_err();
        assert_eq!(e.var, "EUDP_TX_CALLER_DRAIN");
    }

    #[test]
    fn a_bad_value_leaves_the_good_ones() {
        let (c, errs) = Config::from_lookup_lenient(|k| match k {
            "EUDP_L2_DEPTH" => Some("abc".into()),
            "EUDP_MAX_MSGS" => Some("32".into()),
            "EUDP_GSO" => Some("maybe".into()),
            _ => None,
        });
        assert_eq!((c.l2_depth, c.max_msgs, c.gso), (1, 32, true));
        let vars: Vec<&str> = errs.iter().map(|e| e.var).collect();
        assert_eq!(vars, ["EUDP_L2_DEPTH", "EUDP_GSO"]);
        assert_eq!(errs[0].ignored(), "EUDP_L2_DEPTH=abc ignored: expected an integer >= 1; using 1");
    }
}
