//! `tcp`: UDP over TCP — an emulated UDP offload engine (UOE, paper 002).
//!
//! UDP endpoints keep their datagram API; their datagrams travel over TCP
//! connections between hosts so that the kernel's TCP segmentation and
//! receive offloads (TSO/GSO/GRO with 64 KB segments) carry them.
//!
//! * **Connection Management Layer** ([`TcpTransport`], one per process by
//!   default, [`TcpTransport::global`]): a manager thread with its own
//!   epoll set. The first datagram to a peer host lazily opens a TCP
//!   connection to a pre-decided port on that host ([`TcpConfig::port`],
//!   default [`DEFAULT_PORT`], env `EUDP_TCP_PORT`); the manager listens on
//!   that port and demultiplexes incoming frames to the endpoint bound to the
//!   frame's destination UDP port. All sockets between two hosts share the
//!   connection(s); framing is in [`frame`].
//! * **Data Management Layer**: when the peer does not accept (refused,
//!   unreachable), datagrams wait in a bounded per-lane queue while the
//!   manager retries with backoff ([`Dml::Queue`], the default), dropping
//!   with a counter when the bound or [`TcpConfig::queue_deadline`] is hit;
//!   or the sender blocks up to [`TcpConfig::block_timeout`] and then falls
//!   back to queueing ([`Dml::Block`]). A connection that dies (peer
//!   restart) is reopened for the datagrams still queued.
//! * Per-connection options: TCP_NODELAY, TCP_CONGESTION, buffer sizes,
//!   TCP_USER_TIMEOUT — set on the UOE connections only.
//! * Each endpoint gets a [`TcpSocket`] (the [`crate::backend::Backend`]):
//!   its `raw_fd` is an eventfd readable while datagrams for it are queued.
//!   Its `writable_fd` polls writable except while a full lane it sent to
//!   has not made room yet, so the engine thread serves other endpoints
//!   meanwhile instead of waiting on that lane. Only while it has nothing
//!   else to do does it wait for the room first, briefly (a refusal handed
//!   back to the endpoint costs a copy of what the program queued since).
//!
//! * Fork: a child gives up the transport's descriptors at once (the
//!   listener's port, the connections' FIN stay the parent's business) and
//!   starts its own transport on first use (`fork.rs`).
//!
//! All `unsafe` code of this transport is in `sys.rs`.

mod fork;
mod manager;
mod room;
mod socket;
mod sys;

/// The UDP-over-TCP wire format (in `eudp-wire`).
pub use eudp_wire::uot as frame;
pub use fork::forked_child;
pub use manager::{TcpStats, TcpTransport};
pub use socket::TcpSocket;

use std::net::IpAddr;
use std::time::Duration;

/// The pre-decided port the UOE listens on and connects to.
pub const DEFAULT_PORT: u16 = 9717;

/// What the sender does while a peer does not accept connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dml {
    /// (a) Queue in a bounded buffer, retry in the background, drop with a
    /// counter when the bound or the deadline is hit. Never blocks.
    Queue,
    /// (b) The sending call blocks while the transport retries, up to
    /// `block_timeout`; then the lane falls back to (a) until it connects.
    Block,
    /// (c) A peer host that refuses the UOE port (`ECONNREFUSED`: nothing
    /// listens there, e.g. a program on plain kernel UDP) is sent plain UDP
    /// datagrams from the endpoint's own kernel socket, as if there were no
    /// UOE; the lane probes the port again when used and carries the
    /// datagrams again once the peer listens. Other failures queue as (a).
    /// Opt-in (`EUDP_TCP_DML=udp`): for programs that also talk to hosts
    /// running no UOE; (a) would keep such datagrams until the deadline.
    Udp,
}

/// Settings of one UOE transport (`EUDP_TCP_*` environment variables).
///
/// | variable | meaning | default |
/// |---|---|---|
/// | `EUDP_TCP_PORT` | pre-decided port: listen here, connect to peers here | 9717 |
/// | `EUDP_TCP_LISTEN` | `0`: do not listen (send-only process) | 1 |
/// | `EUDP_TCP_BIND` | local IP for the listener and outgoing connections | any |
/// | `EUDP_TCP_CONNS` | connections per peer host (flows hashed by ports) | 1 |
/// | `EUDP_TCP_CC` | TCP_CONGESTION of UOE connections | system default |
/// | `EUDP_TCP_NODELAY` | TCP_NODELAY | 1 |
/// | `EUDP_TCP_SNDBUF` / `EUDP_TCP_RCVBUF` | SO_SNDBUF/SO_RCVBUF of connections, 0 = autotune | 0 |
/// | `EUDP_TCP_DML` | `queue` (a), `block` (b) or `udp` (c) | queue |
/// | `EUDP_TCP_BLOCK_MS` | (b): longest block before falling back to (a) | 1000 |
/// | `EUDP_TCP_QUEUE_BYTES` | per-lane user-space queue bound | 4 MiB |
/// | `EUDP_TCP_DEADLINE_MS` | drop queued datagrams older than this while unconnected | 5000 |
/// | `EUDP_TCP_MAX_WAIT_MS` | drop queued datagrams older than this on a stalled connection | 1000 |
/// | `EUDP_TCP_MAX_CONNS` / `EUDP_TCP_MAX_PER_PEER` | connection caps | 1024 / 32 |
/// | `EUDP_TCP_SPIN_US` | manager polls this long after activity before sleeping | 0 |
/// | `EUDP_TCP_RX_DIRECT` | an endpoint reads its bulk connection itself | 1 |
/// | `EUDP_TCP_RX_STALL_MS` | the manager takes such a connection back when its endpoint has not read it this long while input waits | 10 |
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    pub port: u16,
    pub listen: bool,
    pub bind_ip: Option<IpAddr>,
    pub conns_per_peer: u8,
    pub congestion: Option<String>,
    pub nodelay: bool,
    pub sndbuf: usize,
    pub rcvbuf: usize,
    pub dml: Dml,
    pub block_timeout: Duration,
    pub queue_bytes: usize,
    /// Bound on bytes queued in user space over all lanes.
    pub total_queue_bytes: usize,
    pub queue_deadline: Duration,
    pub max_wait: Duration,
    pub retry_min: Duration,
    pub retry_max: Duration,
    pub max_conns: usize,
    pub max_conns_per_peer: usize,
    /// A connection must send its hello within this time.
    pub hello_timeout: Duration,
    /// TCP_USER_TIMEOUT: how long unacknowledged data may wait before the
    /// kernel gives the connection up (0: system default).
    pub user_timeout: Duration,
    /// Default per-endpoint receive queue, bytes (like `rmem_default`).
    pub rx_queue_bytes: usize,
    /// Default per-endpoint send size reported to the engine (sizes L1).
    pub tx_buffer_bytes: usize,
    /// The manager thread keeps polling this long after activity instead
    /// of sleeping (latency profile; 0: sleep at once).
    pub spin: Duration,
    /// Send coalescing (`EUDP_TCP_CORK_US`, 0 = off): while an application
    /// thread sends back to back without receiving, its datagrams are
    /// gathered in the lane queue and written in blocks of up to
    /// [`CORK_BYTES`] (one `send` and one TCP segment train per block, not
    /// one per datagram); what is left is written by the manager at most
    /// this long after it was queued.
    pub cork: Duration,
    /// `EUDP_TCP_RX_DIRECT`: a connection whose reads all go to one endpoint
    /// in place (a bulk flow) is read by that endpoint's receiving thread
    /// itself, not by the manager (no thread hop per batch).
    pub rx_direct: bool,
    /// `EUDP_TCP_RX_STALL_MS`: a connection read by its endpoint
    /// (`rx_direct`) whose endpoint has not read it for this long while
    /// input waits (its program stopped receiving) is read by the manager
    /// again, which drops what the full queue cannot take, so the other
    /// flows sharing the connection go on. At least 1 ms.
    pub rx_stall: Duration,
}

/// Block size of send coalescing (see [`TcpConfig::cork`]).
pub const CORK_BYTES: usize = 64 << 10;

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            port: DEFAULT_PORT,
            listen: true,
            bind_ip: None,
            conns_per_peer: 1,
            congestion: None,
            nodelay: true,
            sndbuf: 0,
            rcvbuf: 0,
            dml: Dml::Queue,
            block_timeout: Duration::from_millis(1000),
            queue_bytes: 4 << 20,
            total_queue_bytes: 64 << 20,
            queue_deadline: Duration::from_millis(5000),
            max_wait: Duration::from_millis(1000),
            retry_min: Duration::from_millis(10),
            retry_max: Duration::from_millis(500),
            max_conns: 1024,
            max_conns_per_peer: 32,
            hello_timeout: Duration::from_secs(5),
            user_timeout: Duration::from_secs(10),
            rx_queue_bytes: 212_992,
            tx_buffer_bytes: 212_992,
            spin: Duration::ZERO,
            cork: Duration::from_micros(100),
            rx_direct: true,
            rx_stall: Duration::from_millis(10),
        }
    }
}

/// An `EUDP_TCP_*` variable that could not be parsed.
pub use crate::settings::SettingError as TcpConfigError;

impl TcpConfig {
    /// Defaults overridden by any `EUDP_TCP_*` variables present. A bad
    /// value leaves only its own setting at the default; each is logged
    /// once per process. Never fails.
    pub fn from_env() -> Result<Self, TcpConfigError> {
        let (c, errs) = Self::from_lookup_lenient(|k| std::env::var(k).ok());
        crate::log::report_ignored(&errs);
        Ok(c)
    }

    /// As [`TcpConfig::from_env`] with an explicit lookup, strict: the
    /// first bad value is an error (testable; the profile checks use it).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, TcpConfigError> {
        let (c, mut errs) = Self::from_lookup_lenient(get);
        if errs.is_empty() {
            Ok(c)
        } else {
            Err(errs.swap_remove(0))
        }
    }

    /// Defaults overridden by the good values `get` finds, and the bad ones.
    pub fn from_lookup_lenient(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<TcpConfigError>) {
        use crate::settings::{lookup, Setting};
        let get: &dyn Fn(&str) -> Option<String> = &get;
        let mut e = Vec::new();
        let int = |s: &'static Setting, v: &str| s.int(v);
        let flag = |s: &'static Setting, v: &str| s.flag(v);
        let text = |s: &'static Setting, v: &str| s.check(v).map(|_| v.trim().to_string());
        let ms = |s: &'static Setting, v: &str| s.int(v).map(Duration::from_millis);
        let us = |s: &'static Setting, v: &str| s.int(v).map(Duration::from_micros);
        let mut c = TcpConfig::default();
        if let Some(n) = lookup(get, "EUDP_TCP_PORT", &mut e, int) {
            c.port = n as u16;
        }
        if let Some(b) = lookup(get, "EUDP_TCP_LISTEN", &mut e, flag) {
            c.listen = b;
        }
        if let Some(ip) = lookup(get, "EUDP_TCP_BIND", &mut e, text) {
            c.bind_ip = ip.parse().ok();
        }
        if let Some(n) = lookup(get, "EUDP_TCP_CONNS", &mut e, int) {
            c.conns_per_peer = n as u8;
        }
        if let Some(cc) = lookup(get, "EUDP_TCP_CC", &mut e, text) {
            c.congestion = Some(cc);
        }
        if let Some(b) = lookup(get, "EUDP_TCP_NODELAY", &mut e, flag) {
            c.nodelay = b;
        }
        if let Some(n) = lookup(get, "EUDP_TCP_SNDBUF", &mut e, int) {
            c.sndbuf = n as usize;
        }
        if let Some(n) = lookup(get, "EUDP_TCP_RCVBUF", &mut e, int) {
            c.rcvbuf = n as usize;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_DML", &mut e, text) {
            c.dml = match d.as_str() {
                "block" | "b" => Dml::Block,
                "udp" | "c" => Dml::Udp,
                _ => Dml::Queue,
            };
        }
        if let Some(d) = lookup(get, "EUDP_TCP_BLOCK_MS", &mut e, ms) {
            c.block_timeout = d;
        }
        if let Some(n) = lookup(get, "EUDP_TCP_QUEUE_BYTES", &mut e, int) {
            c.queue_bytes = n as usize;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_DEADLINE_MS", &mut e, ms) {
            c.queue_deadline = d;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_MAX_WAIT_MS", &mut e, ms) {
            c.max_wait = d;
        }
        if let Some(n) = lookup(get, "EUDP_TCP_MAX_CONNS", &mut e, int) {
            c.max_conns = n as usize;
        }
        if let Some(n) = lookup(get, "EUDP_TCP_MAX_PER_PEER", &mut e, int) {
            c.max_conns_per_peer = n as usize;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_SPIN_US", &mut e, us) {
            c.spin = d;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_CORK_US", &mut e, us) {
            c.cork = d;
        }
        if let Some(b) = lookup(get, "EUDP_TCP_RX_DIRECT", &mut e, flag) {
            c.rx_direct = b;
        }
        if let Some(d) = lookup(get, "EUDP_TCP_RX_STALL_MS", &mut e, ms) {
            c.rx_stall = d;
        }
        (c, e)
    }
}

/// The transport selected by `EUDP_TRANSPORT` (`kernel` when unset), read
/// once per process. Inlined: the preload shim asks on every call, and
/// then pays one load instead of a call.
#[inline]
pub fn transport_from_env() -> &'static str {
    static T: std::sync::OnceLock<&'static str> = std::sync::OnceLock::new();
    T.get_or_init(|| match std::env::var("EUDP_TRANSPORT").as_deref() {
        Ok("tcp") => "tcp",
        Ok("xdp") => "xdp",
        Ok(v) => {
            if let Some(Err(e)) = crate::settings::find("EUDP_TRANSPORT").map(|s| s.check(v)) {
                crate::log::report_ignored(&[e]);
            }
            "kernel"
        }
        Err(_) => "kernel",
    })
}

/// An endpoint on `engine` whose datagrams travel over the process-wide UOE
/// transport ([`TcpTransport::global`]).
pub fn endpoint(engine: &crate::Engine, v6: bool) -> std::io::Result<crate::Endpoint> {
    let t = TcpTransport::global()?;
    crate::Endpoint::with_backend(engine, Box::new(t.socket(v6)?))
}

/// As [`crate::Endpoint::from_kernel_fd`] on the process-wide UOE transport.
pub fn endpoint_from_kernel_fd(engine: &crate::Engine, fd: std::os::fd::OwnedFd) -> std::io::Result<crate::Endpoint> {
    TcpTransport::global()?.endpoint_from_kernel_fd(engine, fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_errors() {
        let c = TcpConfig::from_lookup(|k| match k {
            "EUDP_TCP_PORT" => Some("7000".into()),
            "EUDP_TCP_CONNS" => Some("4".into()),
            "EUDP_TCP_CC" => Some("reno".into()),
            "EUDP_TCP_DML" => Some("block".into()),
            "EUDP_TCP_BLOCK_MS" => Some("250".into()),
            _ => None,
        })
        .unwrap();
        assert_eq!((c.port, c.conns_per_peer, c.congestion.as_deref(), c.dml), (7000, 4, Some("reno"), Dml::Block));
        assert_eq!(c.block_timeout, Duration::from_millis(250));
        assert!(TcpConfig::from_lookup(|k| (k == "EUDP_TCP_PORT").then(|| "0".into())).is_err());
        assert!(TcpConfig::from_lookup(|k| (k == "EUDP_TCP_CONNS").then(|| "17".into())).is_err());
        assert!(TcpConfig::from_lookup(|k| (k == "EUDP_TCP_CC").then(|| "a;b".into())).is_err());
        assert_eq!(TcpConfig::from_lookup(|_| None).unwrap(), TcpConfig::default());
        let stall = TcpConfig::from_lookup(|k| (k == "EUDP_TCP_RX_STALL_MS").then(|| "25".into())).unwrap();
        assert_eq!(stall.rx_stall, Duration::from_millis(25));
        assert!(TcpConfig::from_lookup(|k| (k == "EUDP_TCP_RX_STALL_MS").then(|| "0".into())).is_err());
    }
}
