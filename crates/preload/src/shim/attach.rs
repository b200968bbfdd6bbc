//! A socket's adoption by the engine (its endpoint, made on first I/O), its
//! ring's readiness descriptors and the receive options forced on it.

use super::generation::{engine, sock_rcvbuf, tcp_transport, xdp_transport};
use super::sock::{lock, rx_opt_names, Sock, ACTIVE, KERNEL, RX_FORCED, RX_WANT_TOS, RX_WANT_TTL};
use super::table::{budget_reason, forget_stale, PRIVATE_PER_SOCKET};
use super::tls::{with_tls, Inside, Tls};
use crate::log::dlog;
use crate::stat::{ACCELERATED, XDP_UNAVAILABLE};
use eudp_engine::Endpoint;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicI32, Ordering::*};
use std::sync::Arc;

/// The descriptor cached in `slot` (-1: none yet), made by `make` and
/// cached on first use; `None` when it cannot be made.
fn cached_fd(slot: &AtomicI32, make: impl FnOnce() -> io::Result<i32>) -> Option<i32> {
    let cached = slot.load(Relaxed);
    if cached >= 0 {
        return Some(cached);
    }
    let fd = make().ok()?;
    slot.store(fd, Relaxed);
    Some(fd)
}

impl Sock {
    /// The endpoint's error flag for an epoll registration (made now if
    /// needed; see [`Endpoint::error_fd`]).
    pub fn err_fd(&self, ep: &Endpoint) -> Option<i32> {
        cached_fd(&self.err_fd, || ep.error_fd())
    }

    /// The error flag if one was made (for poll/select).
    #[inline]
    pub fn err_fd_made(&self) -> Option<i32> {
        Some(self.err_fd.load(Relaxed)).filter(|&f| f >= 0)
    }

    /// Sockets on the engine: the kernel socket gets `IP_RECVTOS` and
    /// `IP_RECVTTL` on (IPv6: `IPV6_RECVTCLASS` and `IPV6_RECVHOPLIMIT`), so
    /// every message the engine reads carries its TOS and TTL (traffic
    /// class and hop limit): the kernel reports them only while the option
    /// is on when a message is read, not when it arrived. The program's
    /// own settings are kept here: `getsockopt` reports them, the shim
    /// writes these control messages only when the program asked, and a
    /// fallback or an exec gives them back to the kernel socket.
    fn force_rx_opts(&self, fd: i32) {
        if tcp_transport() {
            return;
        }
        let (level, tos_name, ttl_name) = rx_opt_names(self.v6);
        let tos = crate::sys::int_opt(fd, level, tos_name);
        let ttl = crate::sys::int_opt(fd, level, ttl_name);
        let (Some(tos), Some(ttl)) = (tos, ttl) else { return };
        let bits = RX_FORCED | if tos != 0 { RX_WANT_TOS } else { 0 } | if ttl != 0 { RX_WANT_TTL } else { 0 };
        self.set_rx_opts(fd, true, true);
        self.rx_opts.store(bits, Release);
    }

    /// Sets the kernel socket's TOS and TTL options (traffic class and hop
    /// limit) to `tos` and `ttl`.
    fn set_rx_opts(&self, fd: i32, tos: bool, ttl: bool) {
        let (level, tos_name, ttl_name) = rx_opt_names(self.v6);
        crate::sys::set_int_opt(fd, level, tos_name, i32::from(tos));
        crate::sys::set_int_opt(fd, level, ttl_name, i32::from(ttl));
    }

    /// True while the kernel socket has those options on for the engine
    /// rather than as the program set them.
    pub fn rx_opts_forced(&self) -> bool {
        self.rx_opts.load(Acquire) & RX_FORCED != 0
    }

    /// Whether the program asked for the TOS/traffic class (`tos`) or the
    /// TTL/hop limit.
    pub fn wants_rx_opt(&self, tos: bool) -> bool {
        self.rx_opts.load(Acquire) & if tos { RX_WANT_TOS } else { RX_WANT_TTL } != 0
    }

    /// The program set one of those options (`name`) to `on` while the
    /// kernel socket has both on for the engine: recorded, and the kernel
    /// socket keeps both on.
    pub fn note_rx_opt(&self, fd: i32, name: i32, on: bool) {
        let (level, tos_name, _) = rx_opt_names(self.v6);
        let bit = if name == tos_name { RX_WANT_TOS } else { RX_WANT_TTL };
        if on {
            self.rx_opts.fetch_or(bit, AcqRel);
        } else {
            self.rx_opts.fetch_and(!bit, AcqRel);
        }
        crate::sys::set_int_opt(fd, level, name, 1);
    }

    /// Gives the kernel socket back the program's settings (`keep`: they
    /// stay recorded as forced, for an exec that fails).
    pub fn restore_rx_opts(&self, fd: i32, keep: bool) {
        let bits = self.rx_opts.load(Acquire);
        if bits & RX_FORCED == 0 {
            return;
        }
        self.set_rx_opts(fd, bits & RX_WANT_TOS != 0, bits & RX_WANT_TTL != 0);
        if !keep {
            self.rx_opts.fetch_and(!RX_FORCED, AcqRel);
        }
    }

    /// After an exec that failed: the socket is still on the engine.
    pub fn reforce_rx_opts(&self, fd: i32) {
        if self.rx_opts_forced() {
            self.set_rx_opts(fd, true, true);
        }
    }

    /// The endpoint serving this socket, created on first use; `None` on the
    /// kernel path.
    #[inline]
    pub fn endpoint(&self, fd: i32) -> Option<Arc<Endpoint>> {
        match self.mode() {
            ACTIVE => lock(&self.ep).clone(),
            KERNEL => None,
            _ => self.activate(fd),
        }
    }

    /// The endpoint only if it already exists.
    pub fn existing(&self) -> Option<Arc<Endpoint>> {
        if self.mode() == ACTIVE {
            lock(&self.ep).clone()
        } else {
            None
        }
    }

    /// Runs `f`, which must not sleep for long, on the endpoint if the socket is on
    /// the engine: lock-free when it can (`crate::borrow`), else through
    /// the mutex.
    #[inline]
    pub fn with_existing<R>(&self, f: impl FnOnce(&Endpoint) -> R) -> Option<R> {
        if self.mode() != ACTIVE {
            return None;
        }
        with_tls(|t| self.with_existing_in(t, f))
    }

    /// [`Sock::with_existing`] with this thread's [`Tls`] in hand.
    #[inline]
    pub fn with_existing_in<R>(&self, t: &Tls, f: impl FnOnce(&Endpoint) -> R) -> Option<R> {
        if self.mode() != ACTIVE {
            return None;
        }
        match crate::borrow::borrow(&t.slot, self as *const Sock as *const (), &self.fast, f) {
            Ok(r) => Some(r),
            Err(f) => self.existing().map(|ep| f(&ep)),
        }
    }

    fn activate(&self, fd: i32) -> Option<Arc<Endpoint>> {
        let mut g = lock(&self.ep);
        match self.mode() {
            ACTIVE => return g.clone(),
            KERNEL => return None,
            _ => {}
        }
        let r = (|| -> io::Result<Endpoint> {
            let _inside = Inside::enter();
            if !crate::fdspace::has_room(fd, PRIVATE_PER_SOCKET) {
                return Err(io::Error::from_raw_os_error(libc::EMFILE));
            }
            if eudp_engine::failure::failed() {
                return Err(eudp_engine::failure::failed_error());
            }
            let engine = engine()?;
            let owned = crate::sys::dup_owned(fd)?;
            let d = owned.as_raw_fd();
            // A number the kernel just handed out cannot name an application
            // socket: an entry for it is stale (closed behind the shim's back).
            forget_stale(d);
            let ep = if tcp_transport() {
                // Paper 002's emulated UOE: datagrams travel over TCP lanes.
                eudp_engine::backend::tcp::endpoint_from_kernel_fd(engine, owned)?
            } else if xdp_transport() {
                // AF_XDP; without it (privileges, a queue another process
                // holds) the kernel backend, said once in the debug log.
                match eudp_engine::backend::xdp::XdpTransport::global() {
                    Ok(t) => t.endpoint_from_kernel_fd(engine, owned)?,
                    Err(e) => {
                        static SAID: std::sync::Once = std::sync::Once::new();
                        SAID.call_once(|| dlog!("xdp transport unavailable, kernel backend instead: {e}"));
                        XDP_UNAVAILABLE.fetch_add(1, Relaxed);
                        Endpoint::from_kernel_fd(engine, owned)?
                    }
                }
            } else {
                Endpoint::from_kernel_fd(engine, owned)?
            };
            ep.set_nonblocking(self.nonblock());
            if let Some(bytes) = sock_rcvbuf() {
                // Kernel-side room for bursts while the engine thread is not
                // running (the ring keeps the program's SO_RCVBUF size).
                crate::sys::grow_kernel_rcvbuf(d, bytes);
            }
            let (rt, st) = crate::sys::kernel_timeouts(fd);
            // The backend's socket is a duplicate of the program's: the
            // same socket, holding the same SO_RCVTIMEO.
            ep.set_read_timeout_in_socket(rt);
            ep.set_write_timeout(st);
            self.force_rx_opts(fd);
            ep.backend().option_changed();
            self.dup_fd.store(d, SeqCst);
            Ok(ep)
        })();
        match r {
            Ok(ep) => {
                let ep = Arc::new(ep);
                *g = Some(ep.clone());
                crate::borrow::init();
                self.fast.store(Arc::as_ptr(&ep) as *mut Endpoint, SeqCst);
                let _ = self.ring_len.set(ep.ring_len());
                self.mode.store(ACTIVE, Release);
                ACCELERATED.fetch_add(1, Relaxed);
                dlog!("fd {fd}: UDP socket on the engine (endpoint over fd {})", ep.raw_fd());
                Some(ep)
            }
            Err(e) => {
                drop(g);
                let reason = if e.raw_os_error() == Some(libc::EMFILE) {
                    budget_reason("attaching to the engine")
                } else {
                    format!("cannot attach to the engine: {e}")
                };
                self.fallback(fd, &reason);
                None
            }
        }
    }

    /// The ring's eventfd when the socket is on the engine and its ring
    /// holds a datagram now, found without touching the endpoint.
    pub fn ready_ring_fd(&self) -> Option<i32> {
        let fd = self.poll_fd.load(Relaxed);
        (fd >= 0 && self.mode() == ACTIVE && self.ring_len.get()?.get() > 0).then_some(fd)
    }

    /// True when the socket is on the engine and its ring holds a datagram.
    #[inline]
    pub fn ring_has_data(&self) -> bool {
        self.ring_len.get().is_some_and(|r| r.get() > 0)
    }

    /// The eventfd readable while the ring holds a datagram.
    pub fn ring_fd(&self, ep: &Endpoint) -> Option<i32> {
        // The endpoint creates its ready fd once and keeps it for life; the
        // cache is cleared when the endpoint goes (fallback, fork).
        cached_fd(&self.poll_fd, || ep.poll_fd())
    }
}
