//! The transport's settings ([`XdpConfig`], [`AttachMode`]) and its counters ([`XdpStats`]).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

/// How the XDP program is attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachMode {
    /// The driver's hook, else the generic one.
    Auto,
    /// The driver's hook only (`XDP_FLAGS_DRV_MODE`).
    Driver,
    /// The generic hook only (`XDP_FLAGS_SKB_MODE`), which every device has.
    Generic,
}

/// The stores of the copy into UMEM (paper 001 §5.3's copy block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyBlock {
    /// Ordinary stores: the frame's lines pass through the cache.
    Cached,
    /// Non-temporal stores: the frame is written around the cache.
    NonTemporal,
}

/// Settings of one transport.
#[derive(Debug, Clone)]
pub struct XdpConfig {
    /// The interface whose traffic the transport takes over.
    pub ifname: String,
    /// The receive queue the AF_XDP socket binds to.
    pub queue: u32,
    /// UMEM frames: half receive (fill ring), half transmit.
    pub frames: usize,
    /// Entries of each of the four rings (a power of two).
    pub ring: u32,
    pub attach: AttachMode,
    /// How long a neighbour-table answer is trusted.
    pub neigh_ttl: Duration,
    /// The stores of the payload copy (and fused checksum) into UMEM.
    pub copy: CopyBlock,
}

impl XdpConfig {
    pub fn new(ifname: &str) -> XdpConfig {
        XdpConfig {
            ifname: ifname.to_string(),
            queue: 0,
            frames: 4096,
            ring: 2048,
            attach: AttachMode::Auto,
            neigh_ttl: Duration::from_secs(1),
            copy: CopyBlock::Cached,
        }
    }
}

/// Counters of one transport (all sockets).
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) tx_xdp: AtomicU64,
    pub(super) tx_kernel: AtomicU64,
    pub(super) tx_kernel_no_neigh: AtomicU64,
    pub(super) tx_kernel_off_link: AtomicU64,
    pub(super) tx_kernel_too_big: AtomicU64,
    pub(super) tx_kicks: AtomicU64,
    pub(super) rx_xdp: AtomicU64,
    pub(super) rx_kernel: AtomicU64,
    pub(super) rx_bad_frames: AtomicU64,
    pub(super) rx_no_socket: AtomicU64,
    pub(super) rx_not_peer: AtomicU64,
    pub(super) rx_inbox_drops: AtomicU64,
    pub(super) rx_group_copies: AtomicU64,
    pub(super) group_kernel: AtomicU64,
}

/// A snapshot of the transport's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdpStats {
    /// Datagrams sent as AF_XDP frames.
    pub tx_xdp: u64,
    /// Datagrams sent through the kernel socket instead, in all…
    pub tx_kernel: u64,
    /// …because the neighbour table had no MAC address for the next hop,
    pub tx_kernel_no_neigh: u64,
    /// …because the destination is not on the interface's subnets (or is
    /// broadcast, multicast, or the socket's source is not the interface's),
    pub tx_kernel_off_link: u64,
    /// …because the datagram is larger than the MTU allows unfragmented.
    pub tx_kernel_too_big: u64,
    /// TX kicks (`sendto` on the AF_XDP socket).
    pub tx_kicks: u64,
    /// Datagrams taken from the RX ring for a socket.
    pub rx_xdp: u64,
    /// Datagrams read from the sockets' kernel sockets.
    pub rx_kernel: u64,
    /// Frames the redirect let through that were not valid IPv4 UDP
    /// (bad checksum, bad lengths): dropped, as the kernel drops them.
    pub rx_bad_frames: u64,
    /// Frames for an address no socket holds any more (it closed while
    /// they were in flight).
    pub rx_no_socket: u64,
    /// Frames to a connected socket from another source (the kernel would
    /// not deliver them to it either).
    pub rx_not_peer: u64,
    /// Datagrams dropped because the receiving socket's inbox was full.
    pub rx_inbox_drops: u64,
    /// Copies of redirected group datagrams delivered, one per member
    /// socket that wanted each (`rx_xdp` counts each datagram once).
    pub rx_group_copies: u64,
    /// Times a joined `{group, port}` was found left on (or taken back to)
    /// the kernel path because another socket of the host shares it.
    pub group_kernel: u64,
    /// `{group, port}` keys the program redirects now.
    pub group_keys: u64,
    /// The kernel's own AF_XDP drop counters (`XDP_STATISTICS`).
    pub xsk_rx_dropped: u64,
    pub xsk_rx_ring_full: u64,
    pub xsk_fill_ring_empty: u64,
    /// `"driver"` or `"generic"`.
    pub attach: String,
}

impl XdpConfig {
    /// The settings of a transport on `ifname` from `EUDP_XDP_QUEUE`,
    /// `EUDP_XDP_RING` (ring entries; twice as many frames),
    /// `EUDP_XDP_MODE` and `EUDP_XDP_COPY` (`cached` or `nontemporal`); a
    /// bad value leaves its default, logged once.
    pub fn from_env(ifname: &str) -> XdpConfig {
        let (cfg, errs) = XdpConfig::from_lookup(ifname, &|k| std::env::var(k).ok());
        crate::log::report_ignored(&errs);
        cfg
    }

    /// As [`XdpConfig::from_env`] with an explicit lookup: the settings, and
    /// the bad values left at their defaults.
    pub fn from_lookup(
        ifname: &str,
        get: &dyn Fn(&str) -> Option<String>,
    ) -> (XdpConfig, Vec<crate::settings::SettingError>) {
        use crate::settings::lookup;
        let mut errs = Vec::new();
        let mut cfg = XdpConfig::new(ifname);
        if let Some(q) = lookup(get, "EUDP_XDP_QUEUE", &mut errs, |s, v| s.int(v)) {
            cfg.queue = q as u32;
        }
        if let Some(m) = lookup(get, "EUDP_XDP_MODE", &mut errs, |s, v| s.check(v).map(|_| v.trim().to_string())) {
            cfg.attach = match m.as_str() {
                "driver" => AttachMode::Driver,
                "generic" => AttachMode::Generic,
                _ => AttachMode::Auto,
            };
        }
        if let Some(r) = lookup(get, "EUDP_XDP_RING", &mut errs, |s, v| s.int(v)) {
            // A power of two (the setting's choices); the fill ring can
            // hold every receive frame.
            cfg.ring = r as u32;
            cfg.frames = 2 * r as usize;
        }
        if let Some(c) = lookup(get, "EUDP_XDP_COPY", &mut errs, |s, v| s.check(v).map(|_| v.trim().to_string())) {
            cfg.copy = if c == "nontemporal" { CopyBlock::NonTemporal } else { CopyBlock::Cached };
        }
        (cfg, errs)
    }
}

#[cfg(test)]
mod tests {
    use super::XdpConfig;

    fn with(k: &'static str, v: &'static str) -> impl Fn(&str) -> Option<String> {
        move |q: &str| (q == k).then(|| v.to_string())
    }

    #[test]
    fn the_ring_setting_sizes_the_rings_and_twice_as_many_frames() {
        let (c, errs) = XdpConfig::from_lookup("veth0", &with("EUDP_XDP_RING", "16384"));
        assert!(errs.is_empty());
        assert_eq!((c.ring, c.frames), (16384, 32768));
        let (d, _) = XdpConfig::from_lookup("veth0", &|_| None);
        assert_eq!((d.ring, d.frames), (2048, 4096), "the default");
        // Not a power of two the rings accept: an error, the default kept.
        let (b, errs) = XdpConfig::from_lookup("veth0", &with("EUDP_XDP_RING", "3000"));
        assert_eq!(errs.len(), 1);
        assert_eq!((b.ring, b.frames), (2048, 4096));
    }
}
