//! What a socket loses once it moved to the kernel path: the datagrams the
//! hand-over kept for the program that its close discards unread
//! (`drop_fallback_close`), and what its kernel socket drops from the
//! hand-over on (`drop_kernel_rcvbuf`, the socket's `SO_MEMINFO` drops
//! since then). Both show in the socket's entry of the stats report: the
//! open socket's while it lives, then a closed entry of its kernel path.

use super::sock::{lock, KernelPath, Sock};
use eudp_engine::StatsSnapshot;

impl Sock {
    /// At the hand-over, `fd` naming this socket: the drops from now on
    /// are the kernel path's.
    pub(super) fn note_kernel_path(&self, fd: i32) {
        if let (Some(ino), Some(d)) = (crate::sys::inode(fd), crate::sys::socket_drops(fd)) {
            *lock(&self.kernel_path) = Some(KernelPath { ino, base: d, seen: d });
        }
    }

    /// Drops of the kernel socket since the hand-over, read through `fd`
    /// while it names this socket (else the last count read); None before
    /// a hand-over.
    fn kernel_drops(&self, fd: i32) -> Option<u64> {
        let mut g = lock(&self.kernel_path);
        let k = g.as_mut()?;
        if crate::sys::inode(fd) == Some(k.ino) {
            if let Some(d) = crate::sys::socket_drops(fd) {
                k.seen = d;
            }
        }
        // The kernel's count is 32 bits wide.
        Some((k.seen as u32).wrapping_sub(k.base as u32) as u64)
    }

    /// The counters of this socket's kernel path, read through `fd`, with
    /// `discarded` kept datagrams its close discards; None unless it was
    /// handed over.
    pub(super) fn kernel_path_stats(&self, fd: i32, discarded: u64) -> Option<StatsSnapshot> {
        let drops = self.kernel_drops(fd)?;
        Some(StatsSnapshot { drop_fallback_close: discarded, drop_kernel_rcvbuf: drops, ..Default::default() })
    }

    /// The entry of this open socket on the kernel path, as descriptor `fd`.
    pub(super) fn kernel_path_entry(&self, fd: i32) -> Option<crate::stat::SockReport> {
        let st = self.kernel_path_stats(fd, 0)?;
        let local = crate::sys::timestamp::local_addr(fd);
        let peer = crate::sys::timestamp::peer_addr(fd);
        Some(self.report_entry(fd, Some((st, local, peer)), true))
    }

    /// At close of the last descriptor `fd` of a socket on the kernel
    /// path: its closed entry, counting the `discarded` kept datagrams.
    pub(super) fn retire_kernel_path(&self, fd: i32, discarded: u64) {
        let Some(st) = self.kernel_path_stats(fd, discarded) else { return };
        let local = crate::sys::timestamp::local_addr(fd);
        let peer = crate::sys::timestamp::peer_addr(fd);
        crate::stat::retire(self.report_entry(fd, Some((st, local, peer)), false));
    }
}
