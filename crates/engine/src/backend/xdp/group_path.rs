//! Multicast on the fast path, the moving parts: a member's joins mirrored
//! ([`XdpSocket::membership_changed`]), the program's group keys kept to
//! those the transport holds alone (read again by a watcher thread while
//! it has members), and a redirected frame copied to every member that
//! the kernel would have given it to. The rules are in `group`.

use super::addr::{copy_checked, key_bytes};
use super::group::{apply, decode, exclusive_keys, parse_proc_udp, Iface, Member, ProcSocket, SPARE_BYTES, SPARE_MAX};
use super::shared::{Queued, Shared};
use super::socket::XdpSocket;
use crate::backend::kernel::InMeta;
use crate::sys::sync::lock;
use eudp_wire::frame::{PendingChecksum, Udp4Frame};
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// How often the watcher reads the namespace's sockets again: the longest
/// a socket that another process binds to a redirected group's port goes
/// without the group's datagrams.
const WATCH: Duration = Duration::from_millis(20);

/// A join: `IP_ADD_MEMBERSHIP`, `IP_ADD_SOURCE_MEMBERSHIP`, the `MCAST_JOIN_*`
/// forms and `IPV6_ADD_MEMBERSHIP`.
fn is_join(level: i32, name: i32) -> bool {
    use libc::*;
    matches!(name, MCAST_JOIN_GROUP | MCAST_JOIN_SOURCE_GROUP)
        || (level == IPPROTO_IP && matches!(name, IP_ADD_MEMBERSHIP | IP_ADD_SOURCE_MEMBERSHIP))
        || (level == IPPROTO_IPV6 && name == IPV6_ADD_MEMBERSHIP)
}

/// The UDP sockets of the calling thread's network namespace.
fn namespace_sockets() -> Vec<ProcSocket> {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/thread-self/net/{f}")).unwrap_or_default();
    let mut v = parse_proc_udp(&read("udp"), false);
    v.extend(parse_proc_udp(&read("udp6"), true));
    v
}

/// The inode of a socket descriptor (`socket:[N]`).
fn socket_inode(fd: i32) -> Option<u64> {
    let l = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let s = l.to_str()?;
    s.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
}

impl Shared {
    /// Reads the namespace's sockets and brings the program's group keys in
    /// line with [`exclusive_keys`]; `gone` is a member socket closing now
    /// (still listed, but no longer anyone's). `count`: keys newly found
    /// shared are counted (the watcher's looks only, so that a process
    /// whose sockets join one after another is not counted while it does).
    pub(super) fn refresh_groups(&self, gone: Option<u64>, count: bool) {
        let socks: Vec<ProcSocket> = namespace_sockets().into_iter().filter(|s| Some(s.inode) != gone).collect();
        let mut g = lock(&self.groups);
        for m in g.members.iter_mut() {
            if let Some(s) = socks.iter().find(|s| s.inode == m.inode) {
                m.local = SocketAddrV4::new(s.addr.unwrap_or(Ipv4Addr::UNSPECIFIED), s.port);
            }
        }
        let (want, shared) = exclusive_keys(&g.members, &socks);
        let stale: Vec<_> = g.redirected.difference(&want).copied().collect();
        for k in stale {
            let _ = self.ports.delete(&key_bytes(k.0, k.1));
            g.redirected.remove(&k);
        }
        let new: Vec<_> = want.difference(&g.redirected).copied().collect();
        for k in new {
            if self.ports.update(&key_bytes(k.0, k.1), &1u32.to_ne_bytes()).is_ok() {
                g.redirected.insert(k);
            }
        }
        if count {
            let newly_shared = shared.difference(&g.shared).count() as u64;
            self.c.group_kernel.fetch_add(newly_shared, Relaxed);
            g.shared = shared;
        }
    }

    /// Keeps a delivered datagram's buffer for a later group copy, while the
    /// transport has members (bounded by `SPARE_MAX` and `SPARE_BYTES`).
    pub(super) fn recycle(&self, buf: Vec<u8>) {
        let mut g = lock(&self.groups);
        if !g.members.is_empty() && g.spare.len() < SPARE_MAX && buf.capacity() <= SPARE_BYTES {
            g.spare.push(buf);
        }
    }

    /// Starts the watcher unless it runs: while the transport has members it
    /// reads the namespace's sockets every [`WATCH`], so a socket bound later
    /// by another process takes a redirected key back to the kernel. It runs
    /// in the namespace of the thread that starts it (a new thread's).
    fn watch(self: &Arc<Self>) {
        {
            let mut g = lock(&self.groups);
            if g.watching || g.members.is_empty() {
                return;
            }
            g.watching = true;
        }
        let w = Arc::downgrade(self);
        let spawned = std::thread::Builder::new().name("eudp-xdp-groups".into()).spawn(move || loop {
            std::thread::sleep(WATCH);
            let Some(t) = w.upgrade() else { return };
            {
                let mut g = lock(&t.groups);
                if g.members.is_empty() {
                    g.watching = false;
                    return;
                }
            }
            t.refresh_groups(None, true);
        });
        if spawned.is_err() {
            // Without a watcher no key may stay redirected.
            let mut g = lock(&self.groups);
            g.watching = false;
            for k in std::mem::take(&mut g.redirected) {
                let _ = self.ports.delete(&key_bytes(k.0, k.1));
            }
        }
    }
}

impl XdpSocket {
    /// Sets a membership option (`IP_ADD_MEMBERSHIP`, `MCAST_JOIN_SOURCE_GROUP`,
    /// …, given as the option's bytes) on the kernel socket, then mirrors it
    /// ([`XdpSocket::membership_changed`]).
    pub fn set_membership(&self, level: i32, name: i32, val: &[u8]) -> io::Result<Option<bool>> {
        crate::sys::sockopt::set_bytes_option(&self.kernel, level, name, val)?;
        Ok(self.membership_changed(level, name, val))
    }

    /// Mirrors a membership option that the kernel socket has just accepted
    /// (the preload shim sets it on the program's own descriptor). For a
    /// join: `Some(true)` when the transport takes the group over (its
    /// frames to this socket's port are redirected whenever the process
    /// holds every socket on that port; the transport counts the times it
    /// does not in `group_kernel`), `Some(false)` when they stay on the
    /// kernel path for good (an IPv6 group or socket, another interface).
    /// `None` for other options.
    pub fn membership_changed(&self, level: i32, name: i32, val: &[u8]) -> Option<bool> {
        let join = is_join(level, name);
        let decoded = decode(level, name, val).filter(|_| !self.v6);
        let ours = |i: Iface| match i {
            Iface::Any => true,
            Iface::Index(ix) => ix == self.t.iface.index,
            Iface::Addr(a) => self.t.iface.v4.iter().any(|(x, _)| *x == a),
        };
        let Some((op, _)) = decoded.filter(|&(_, i)| ours(i)) else { return join.then_some(false) };
        let local = match self.kernel.local_addr() {
            Ok(SocketAddr::V4(l)) => l,
            _ => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0),
        };
        {
            let mut g = lock(&self.t.groups);
            let at = g.members.iter().position(|m| Arc::ptr_eq(&m.inbox, &self.inbox));
            let at = match at {
                Some(k) => k,
                None => {
                    let Some(inode) = socket_inode(self.kernel.as_raw_fd()) else { return join.then_some(false) };
                    g.members.push(Member {
                        inbox: self.inbox.clone(),
                        inode,
                        local,
                        mc_all: self.kernel.option(libc::IPPROTO_IP, libc::IP_MULTICAST_ALL).unwrap_or(1) != 0,
                        groups: HashMap::new(),
                    });
                    g.members.len() - 1
                }
            };
            apply(&mut g.members[at].groups, op);
            if g.members[at].groups.is_empty() {
                g.members.remove(at);
            }
        }
        self.t.refresh_groups(None, false);
        self.t.watch();
        op.is_join().then_some(true)
    }

    /// Reads `IP_MULTICAST_ALL` again after the program changed an option.
    pub(super) fn group_options_changed(&self) {
        let mut g = lock(&self.t.groups);
        if let Some(m) = g.members.iter_mut().find(|m| Arc::ptr_eq(&m.inbox, &self.inbox)) {
            m.mc_all = self.kernel.option(libc::IPPROTO_IP, libc::IP_MULTICAST_ALL).unwrap_or(1) != 0;
        }
    }

    /// The socket closes: its memberships go with it.
    pub(super) fn leave_groups(&self) {
        let inode = {
            let mut g = lock(&self.t.groups);
            let Some(k) = g.members.iter().position(|m| Arc::ptr_eq(&m.inbox, &self.inbox)) else { return };
            g.members.remove(k).inode
        };
        self.t.refresh_groups(Some(inode), false);
    }

    /// A redirected group frame: one copy to each member that wants it
    /// (this socket's straight into `bufs` at `at`, the others' into their
    /// inboxes, in buffers kept from earlier copies). Returns the next free
    /// index of `bufs`.
    pub(super) fn take_group_frame(
        &self,
        f: &Udp4Frame<'_>,
        pending: Option<PendingChecksum>,
        bufs: &mut [Vec<u8>],
        meta: &mut [InMeta],
        mut at: usize,
    ) -> usize {
        let c = &self.t.c;
        let (group, port, src) = (*f.dst.ip(), f.dst.port(), *f.src.ip());
        let len = f.payload.len();
        let room = at < bufs.len();
        let (mine, others, mut spare) = {
            let mut g = lock(&self.t.groups);
            let (mut mine, mut others) = (false, Vec::new());
            for m in g.members.iter() {
                if !m.wants(group, port, src) || lock(&m.inbox.peer).is_some_and(|p| p != f.src) {
                    continue;
                }
                if room && Arc::ptr_eq(&m.inbox, &self.inbox) {
                    mine = true;
                } else {
                    others.push(m.inbox.clone());
                }
            }
            let keep = g.spare.len().saturating_sub(others.len());
            let spare = g.spare.split_off(keep);
            (mine, others, spare)
        };
        if !mine && others.is_empty() {
            c.rx_no_socket.fetch_add(1, Relaxed);
            return at;
        }
        // One checked copy out of the UMEM: into this socket's buffer, or
        // (not a member) into the first other member's copy.
        let mut first = None;
        let checked = if mine {
            let b = &mut bufs[at];
            if b.len() < len {
                b.resize(len, 0);
            }
            copy_checked(b, f.payload, pending)
        } else {
            let mut v = spare.pop().unwrap_or_default();
            v.clear();
            v.resize(len, 0);
            let ok = copy_checked(&mut v, f.payload, pending);
            first = Some(v);
            ok
        };
        if !checked {
            c.rx_bad_frames.fetch_add(1, Relaxed);
            for b in spare.into_iter().chain(first) {
                self.t.recycle(b);
            }
            return at;
        }
        c.rx_xdp.fetch_add(1, Relaxed);
        c.rx_group_copies.fetch_add((others.len() + usize::from(mine)) as u64, Relaxed);
        let queued = |data| Queued { data, src: f.src, dst: group, tos: f.tos, ttl: f.ttl };
        for inbox in &others[usize::from(first.is_some())..] {
            let from: &[u8] = first.as_deref().unwrap_or(&bufs[at][..len]);
            let mut d = spare.pop().unwrap_or_default();
            d.clear();
            d.extend_from_slice(from);
            inbox.push(c, queued(d));
        }
        if let Some(v) = first {
            others[0].push(c, queued(v));
        }
        if mine {
            self.meta_for(&mut meta[at], len, f.src, group, f.tos, f.ttl);
            at += 1;
        }
        at
    }
}
