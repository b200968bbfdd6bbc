//! The state all sockets of one transport share: the rings, the ports map
//! and the sockets bound through it (their inboxes), the neighbour answers.

use super::addr::{key_bytes, parse_arp_table, pick_socket};
use super::config::{Counters, XdpConfig};
use super::group::Groups;
use super::sys;
use crate::fdspace::Private;
use crate::sys::fdevents::EventFd;
use crate::sys::sync::lock;
use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// One queued datagram of a socket that was not the one reading the ring.
pub(super) struct Queued {
    pub(super) data: Vec<u8>,
    pub(super) src: SocketAddrV4,
    pub(super) dst: Ipv4Addr,
    pub(super) tos: u8,
    pub(super) ttl: u8,
}

/// The datagrams waiting for one socket, bounded by its receive buffer.
pub(super) struct Inbox {
    pub(super) q: Mutex<VecDeque<Queued>>,
    pub(super) bytes: AtomicU64,
    pub(super) capacity: AtomicU64,
    pub(super) ready: EventFd,
    /// Whether `ready` may be set: changed only under `q`'s lock, so an
    /// empty inbox's look clears the eventfd (a system call) only after a
    /// push, not on every look.
    pub(super) flagged: AtomicBool,
    pub(super) drops: AtomicU64,
    /// The socket's connected peer: frames from others are not its own.
    pub(super) peer: Mutex<Option<SocketAddrV4>>,
}

impl Inbox {
    pub(super) fn push(&self, c: &Counters, m: Queued) {
        let charge = m.data.len() as u64 + 256;
        if self.bytes.load(Relaxed) + charge > self.capacity.load(Relaxed) {
            self.drops.fetch_add(1, Relaxed);
            c.rx_inbox_drops.fetch_add(1, Relaxed);
            return;
        }
        self.bytes.fetch_add(charge, Relaxed);
        let mut q = lock(&self.q);
        q.push_back(m);
        if !self.flagged.swap(true, Relaxed) {
            self.ready.set();
        }
    }
}

/// The receive side: RX ring in, frames back to the fill ring.
pub(super) struct RxSide {
    pub(super) rx: sys::Ring<libc::xdp_desc>,
    pub(super) fill: sys::Ring<u64>,
}

/// The transmit side: TX ring out, completions back to the free list.
pub(super) struct TxSide {
    pub(super) tx: sys::Ring<libc::xdp_desc>,
    pub(super) completion: sys::Ring<u64>,
    pub(super) free: Vec<u64>,
}

impl TxSide {
    pub(super) fn reap(&mut self) {
        let n = self.completion.ready();
        for _ in 0..n {
            let a = self.completion.take();
            self.free.push(a);
        }
        if n > 0 {
            self.completion.release();
        }
    }
}

/// Where one datagram goes out.
#[derive(Clone, Copy)]
pub(super) enum Route {
    Xdp { src: SocketAddrV4, dst: SocketAddrV4, mac: [u8; 6] },
    Kernel,
}

/// The transmit side held for one send call, and the frames it put on the
/// TX ring since the last kick.
pub(super) struct TxBatch<'a> {
    pub(super) side: MutexGuard<'a, TxSide>,
    pub(super) queued: usize,
    /// The route of this send's last frame and its destination.
    pub(super) route: Option<(SocketAddrV4, Route)>,
}

impl<'a> TxBatch<'a> {
    pub(super) fn new(side: MutexGuard<'a, TxSide>) -> Self {
        TxBatch { side, queued: 0, route: None }
    }
}

impl TxBatch<'_> {
    /// Publishes the frames put on the ring and kicks the kernel to send
    /// them.
    pub(super) fn flush(&mut self, t: &Shared) -> io::Result<()> {
        let n = std::mem::take(&mut self.queued);
        t.flush(&mut self.side, n)
    }
}

/// Neighbour answers, from the kernel's table.
#[derive(Default)]
pub(super) struct Neighbours {
    pub(super) map: HashMap<Ipv4Addr, ([u8; 6], Instant)>,
    /// Addresses the table did not have: when to look again, and the
    /// wait after that (doubling from 50 µs up to 100 ms, so an answer the
    /// kernel gets within a round trip is seen at once, and an address that
    /// never answers costs a read of the table at most ten times a second).
    pub(super) missing: HashMap<Ipv4Addr, (Instant, Duration)>,
}

/// (local address or UNSPECIFIED, port) → the inboxes of the sockets there.
pub(super) type SocketTable = HashMap<(Ipv4Addr, u16), Vec<Arc<Inbox>>>;

pub(super) struct Shared {
    pub(super) cfg: XdpConfig,
    pub(super) iface: sys::IfaceInfo,
    pub(super) c: Counters,
    pub(super) rx: Mutex<RxSide>,
    pub(super) tx: Mutex<TxSide>,
    /// Demultiplexing: (local address or UNSPECIFIED, port) → the inboxes
    /// of the sockets bound there (several when they are connected to
    /// different peers). The same keys are in the XDP program's `ports` map.
    pub(super) sockets: RwLock<SocketTable>,
    pub(super) neigh: Mutex<Neighbours>,
    /// Multicast members and the group keys redirected for them (`group`).
    pub(super) groups: Mutex<Groups<Arc<Inbox>>>,
    pub(super) attach: &'static str,
    pub(super) ports: sys::Map,
    // Drop order: the link detaches the program before the socket goes.
    pub(super) _link: Private<OwnedFd>,
    pub(super) _prog: Private<OwnedFd>,
    pub(super) _xsks: sys::Map,
    /// The socket and its UMEM; dropped after the rings and the link.
    pub(super) xsk: sys::Xsk,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XdpTransport").field("ifname", &self.cfg.ifname).field("attach", &self.attach).finish()
    }
}

impl Shared {
    pub(super) fn umem(&self) -> &sys::Umem {
        self.xsk.umem()
    }

    /// Publishes `queued` TX descriptors and kicks until the kernel took
    /// them (copy mode transmits a bounded batch per kick).
    pub(super) fn flush(&self, tx: &mut TxSide, queued: usize) -> io::Result<()> {
        if queued == 0 {
            return Ok(());
        }
        tx.tx.publish();
        // Until the kernel has consumed every descriptor (bounded: a device
        // that stops taking frames leaves them for the next flush). A kick
        // only where the ring asks for one: copy mode always does (it
        // transmits inside the `sendto`), a driver that sends on its own
        // clears the flag and needs none.
        for _ in 0..64 {
            if !tx.tx.needs_wakeup() {
                tx.reap();
                break;
            }
            self.c.tx_kicks.fetch_add(1, Relaxed);
            self.xsk_kick()?;
            tx.reap();
            if tx.tx.free() == tx.tx.size() {
                break;
            }
        }
        Ok(())
    }

    pub(super) fn xsk_kick(&self) -> io::Result<bool> {
        self.xsk.kick_tx()
    }

    /// Adds a socket's inbox under `key`; the first one there puts the key
    /// into the program's map.
    pub(super) fn add_socket(&self, key: (Ipv4Addr, u16), inbox: &Arc<Inbox>) -> io::Result<()> {
        let mut map = self.sockets.write().unwrap_or_else(|e| e.into_inner());
        let v = map.entry(key).or_default();
        if v.is_empty() {
            if let Err(e) = self.ports.update(&key_bytes(key.0, key.1), &1u32.to_ne_bytes()) {
                map.remove(&key);
                return Err(e);
            }
        }
        v.push(inbox.clone());
        Ok(())
    }

    /// Removes a socket's inbox from `key`; the last one takes the key out
    /// of the program's map (its frames go to the kernel again).
    pub(super) fn remove_socket(&self, key: (Ipv4Addr, u16), inbox: &Arc<Inbox>) {
        let mut map = self.sockets.write().unwrap_or_else(|e| e.into_inner());
        if let Some(v) = map.get_mut(&key) {
            v.retain(|i| !Arc::ptr_eq(i, inbox));
            if v.is_empty() {
                map.remove(&key);
                let _ = self.ports.delete(&key_bytes(key.0, key.1));
            }
        }
    }

    /// The socket a datagram from `src` to `dst` belongs to, as the kernel
    /// picks it ([`pick_socket`]). `Err(true)` when only sockets connected
    /// to other peers hold the address, `Err(false)` when none does (it
    /// closed while the frame was on its way).
    pub(super) fn find_socket(&self, dst: SocketAddrV4, src: SocketAddrV4) -> Result<Arc<Inbox>, bool> {
        let map = self.sockets.read().unwrap_or_else(|e| e.into_inner());
        let exact = map.get(&(*dst.ip(), dst.port())).map(Vec::as_slice).unwrap_or_default();
        let wild = map.get(&(Ipv4Addr::UNSPECIFIED, dst.port())).map(Vec::as_slice).unwrap_or_default();
        let all = || exact.iter().map(|i| (true, i)).chain(wild.iter().map(|i| (false, i)));
        match pick_socket(all().map(|(e, i)| (e, *lock(&i.peer))), src) {
            Some(k) => Ok(all().nth(k).expect("picked among them").1.clone()),
            None => Err(!exact.is_empty() || !wild.is_empty()),
        }
    }

    /// The MAC address of on-link neighbour `ip`, from the kernel's table
    /// (read again once an answer is older than `neigh_ttl`).
    pub(super) fn neighbour(&self, ip: Ipv4Addr) -> Option<[u8; 6]> {
        let mut n = lock(&self.neigh);
        let now = Instant::now();
        if let Some(&(mac, at)) = n.map.get(&ip) {
            if now.duration_since(at) < self.cfg.neigh_ttl {
                return Some(mac);
            }
        }
        // While unresolved (the kernel's send of the datagram that missed
        // resolves it), the table is read again after a growing wait.
        let wait = match n.missing.get(&ip) {
            Some(&(next, _)) if now < next => return None,
            Some(&(_, wait)) => (wait * 2).min(Duration::from_millis(100)),
            None => Duration::from_micros(50),
        };
        n.map.clear();
        // This thread's namespace: `/proc/net` is the process leader's.
        let text = std::fs::read_to_string("/proc/thread-self/net/arp").unwrap_or_default();
        for (a, mac) in parse_arp_table(&text, &self.cfg.ifname) {
            n.map.insert(a, (mac, now));
        }
        match n.map.get(&ip).map(|&(m, _)| m) {
            Some(mac) => {
                n.missing.remove(&ip);
                Some(mac)
            }
            None => {
                if n.missing.len() >= 4096 {
                    n.missing.clear();
                }
                n.missing.insert(ip, (now + wait, wait));
                None
            }
        }
    }
}
