//! A socket's entry in `eudp stat`'s report.

use super::sock::{Sock, ACTIVE, KERNEL};
use crate::stat::SockReport;
use eudp_engine::{Endpoint, StatsSnapshot};
use std::net::SocketAddr;

impl Sock {
    /// This socket's entry as descriptor `fd`, with its endpoint's counters
    /// and addresses when it has one.
    pub(super) fn report_entry(
        &self,
        fd: i32,
        stats: Option<(StatsSnapshot, Option<SocketAddr>, Option<SocketAddr>)>,
        open: bool,
    ) -> SockReport {
        let mode = match self.mode() {
            ACTIVE => "eudp",
            KERNEL => "kernel",
            _ => "idle",
        };
        let (stats, local, peer) = match stats {
            Some((st, l, p)) => (Some(st), l, p),
            None => (None, None, None),
        };
        SockReport {
            id: self.id,
            fd,
            open,
            mode,
            v6: self.v6,
            local: local.map(|a| a.to_string()),
            peer: peer.map(|a| a.to_string()),
            fallback_reason: self.reason(),
            stats,
        }
    }

    /// The entry of this socket's endpoint `ep` as it closes or is
    /// abandoned, with its counters now.
    pub(super) fn closing_entry(&self, ep: &Endpoint) -> SockReport {
        self.report_entry(self.fd, Some((ep.report(), ep.local_addr().ok(), ep.peer_addr().ok())), false)
    }
}
