//! The listener on the pre-decided port: listening from the first bound
//! endpoint on, taking the port later when another process holds it,
//! giving it back to a fork parent, accepting, and leaving the port and the
//! connections in order when the process ends.
//!
//! Owns `Mgr::listener` → `Mgr::listen_st` (in that order) and
//! `Mgr::accept_paused` (alone).

use super::counters::Counters;
use super::state::{lock, norm_ip, Conn, Lane, Leave, Mgr, Phase, LISTENER};
use crate::backend::tcp::fork::{self, Tracked};
use crate::backend::tcp::sys::{self, SockOpts};
use crate::backend::tcp::{frame, TcpConfig};
use crate::fdspace::{private, Private};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transport that wants the pre-decided port but runs without a
/// listener tries to take it again after this, doubling up to
/// [`LISTEN_RETRY_MAX`] (see [`Mgr::listen_tick`]).
pub(super) const LISTEN_RETRY_MIN: Duration = Duration::from_millis(20);
/// The longest wait between two attempts: the bound on how long the port
/// stays unlistened after its holder ends (plus a tick).
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(1);
/// How long a fork child whose parent runs (with no claim on the port)
/// leaves the port to the parent before it listens itself.
const PARENT_GRACE: Duration = Duration::from_millis(50);
/// How often a fork child listening under [`PARENT_GRACE`]'s rule checks
/// whether its parent now wants the port.
const YIELD_CHECK: Duration = Duration::from_millis(250);

/// Binds a listening socket on the pre-decided port (`cfg.bind_ip`, else
/// the IPv6 wildcard, else the IPv4 one); not listening yet.
pub(super) fn bind_port(cfg: &TcpConfig, opts: &SockOpts) -> io::Result<Private<TcpListener>> {
    match cfg.bind_ip {
        Some(ip) => sys::bind_listener(&SocketAddr::new(ip, cfg.port), opts),
        None => sys::bind_listener(&SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), cfg.port), opts)
            .or_else(|_| sys::bind_listener(&SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), cfg.port), opts)),
    }
}

impl Mgr {
    /// The first bound endpoint opens the pre-decided port for peers.
    ///
    /// Another process may have bound the port too while neither listened
    /// (both `SO_REUSEADDR`: a fork child whose parent's transport had not
    /// listened yet, say); the one that listens first keeps it, and the
    /// other runs without a listener, as when the bind itself fails, and
    /// takes the port once it is free ([`Mgr::listen_tick`]).
    /// `first`: no endpoint was bound before this one (a transport
    /// waiting for the port tries at once, not after its longest wait).
    pub(super) fn start_listening(&self, first: bool) -> io::Result<()> {
        if self.listening.load(SeqCst) {
            return Ok(());
        }
        let mut guard = lock(&self.listener);
        if self.listening.load(SeqCst) {
            return Ok(());
        }
        if guard.is_none() {
            let mut st = lock(&self.listen_st);
            if let (true, Some(_)) = (first, st.retry) {
                st.retry = Some((Instant::now(), LISTEN_RETRY_MIN));
                drop(st);
                self.ring();
            }
            return Ok(());
        }
        // A fork child whose parent runs: the parent may have been about to
        // start its transport at the fork (another thread's first send), so
        // that it had not claimed the port yet (`fork::Ancestor`). Listening
        // first would take the port from it (see docs/tcp.md, "Fork"), so
        // the manager listens `PARENT_GRACE` later unless someone (the
        // parent) does first; the endpoint's bind does not wait for it.
        if fork::parent_runs() && self.wants_port {
            self.retry_listen(PARENT_GRACE);
            return Ok(());
        }
        if !self.listen_now(&mut guard)? {
            self.retry_listen(LISTEN_RETRY_MIN);
        }
        Ok(())
    }

    /// Listens on the bound socket in `slot`, or binds one first. False:
    /// another socket listens on the port (nothing is kept).
    fn listen_now(&self, slot: &mut Option<Tracked<Private<TcpListener>>>) -> io::Result<bool> {
        let in_use = |e: &io::Error| e.raw_os_error() == Some(libc::EADDRINUSE);
        if slot.is_none() {
            match bind_port(&self.cfg, &self.opts) {
                Ok(l) => *slot = Some(Tracked::new(l)),
                Err(e) if in_use(&e) => return Ok(false),
                Err(e) => return Err(e),
            }
        }
        let Some(l) = slot.as_ref() else { return Ok(false) };
        if let Err(e) = sys::start_listening(l, 1024) {
            *slot = None;
            return if in_use(&e) { Ok(false) } else { Err(e) };
        }
        if let Err(e) = self.poller.add_level(l.as_raw_fd(), LISTENER) {
            *slot = None;
            return Err(e);
        }
        self.listening.store(true, SeqCst);
        Ok(true)
    }

    /// The port is wanted and not held: the manager tries to take it from
    /// `delay` on (an attempt already planned stays).
    fn retry_listen(&self, delay: Duration) {
        if !self.wants_port {
            return;
        }
        let mut st = lock(&self.listen_st);
        if st.retry.is_none() {
            st.retry = Some((Instant::now() + delay, LISTEN_RETRY_MIN));
            drop(st);
            self.ring();
        }
    }

    /// Listener upkeep on the manager's timer; returns when it is due next.
    ///
    /// * Without a listener, while the port is wanted: an attempt to bind
    ///   and listen every 20 ms doubling to 1 s ([`LISTEN_RETRY_MAX`]), so
    ///   the port is taken at most about 1 s after its holder (another
    ///   process, or this one's parent) ended. Skipped while the holder
    ///   this process defers to still runs (`fork::claimed_elsewhere`), or
    ///   its parent waits for the port itself, and before the first
    ///   endpoint is bound (a listener listens from then on). Two
    ///   processes racing both bind (`SO_REUSEADDR`); the kernel lets one
    ///   `listen`. An attempt that finds the port held costs a socket, a
    ///   failing bind and a close.
    /// * A fork child that listens while its parent runs, the parent
    ///   having had no claim at the fork (it started its transport after
    ///   [`PARENT_GRACE`]), gives the port back once the parent's
    ///   transport waits for it (its manager thread's name), and leaves it
    ///   to the parent from then on: "the port stays the parent's". It
    ///   half-closes the connections it accepted, so that their peers
    ///   (the parent's lanes to its own host among them) connect again,
    ///   to the parent.
    pub(super) fn listen_tick(&self, now: Instant) -> Option<Duration> {
        let leave = lock(&self.listen_st).leave;
        if leave != Leave::No {
            if leave == Leave::Asked {
                self.leave_now();
            }
            return None;
        }
        if !self.wants_port {
            return None;
        }
        let mut guard = lock(&self.listener);
        let mut st = lock(&self.listen_st);
        let port = self.cfg.port;
        if let Some(at) = st.provisional.filter(|_| self.listening.load(SeqCst)) {
            if at > now {
                return Some(at - now);
            }
            if !fork::parent_runs() {
                st.provisional = None;
            } else if fork::parent_waits_for_port() {
                drop((st, guard));
                self.give_back(now);
                return Some(LISTEN_RETRY_MIN);
            } else {
                st.provisional = Some(now + YIELD_CHECK);
                return Some(YIELD_CHECK);
            }
        }
        let (at, wait) = st.retry?;
        if self.listening.load(SeqCst) {
            st.retry = None;
            return None;
        }
        if at > now {
            return Some(at - now);
        }
        st.retry = Some((now + wait, (wait * 2).min(LISTEN_RETRY_MAX)));
        let parent = fork::parent_runs();
        let blocked = fork::claimed_elsewhere(port) || (parent && fork::parent_waits_for_port());
        let bound = self.bound_once.load(SeqCst);
        let took = !blocked && bound && self.listen_now(&mut guard).unwrap_or(false);
        if took {
            st.retry = None;
            if parent {
                st.provisional = Some(now + YIELD_CHECK);
            }
            if self.is_global() {
                fork::claim_own(port);
            }
            Counters::inc(&self.c.listen_takeovers);
        }
        // Named for other processes (a fork child holding the port looks).
        let waits = st.retry.is_some() && !blocked && bound;
        if waits != st.named_wait {
            st.named_wait = waits;
            sys::set_thread_name(if waits { fork::WAIT_NAME } else { fork::THREAD_NAME });
        }
        let next = match (st.retry, st.provisional) {
            (Some((at, _)), _) | (None, Some(at)) => Some(at.saturating_duration_since(now)),
            (None, None) => None,
        };
        drop((st, guard));
        if took {
            self.lanes_retry_now();
        }
        next
    }

    /// Gives the port back to the parent (see [`Mgr::listen_tick`]) and
    /// leaves it to the parent from then on.
    fn give_back(&self, now: Instant) {
        self.close_listener(Some((now + LISTEN_RETRY_MIN, LISTEN_RETRY_MIN)));
        if self.is_global() {
            fork::defer_to_parent(self.cfg.port);
        }
        Counters::inc(&self.c.listen_yields);
        // Its peers' connections too: each peer reads EOF, closes and
        // connects again (to the parent); what it wrote before is still
        // read here, and nothing is written here any more.
        let inbound: Vec<Arc<Conn>> = lock(&self.conns).values().filter(|c| c.inbound).cloned().collect();
        for c in inbound {
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
    }

    /// The process ends: waits (up to `bound`) until the manager has
    /// left the port and every connection has ended ([`Mgr::leave_now`]).
    /// A peer may use a connection to this process for datagrams to
    /// other processes' ports on this host (its lanes to this host reach
    /// the listener, this process's; a fork child's or a send-only
    /// program's connection carries its peer's replies): what sits in
    /// such a connection unread when the process ends is lost, and the
    /// peer sees nothing of it (a burst a parent sends itself through its
    /// child's listener as the child ends, say). Connections still open
    /// at the bound are counted (`exit_open_conns`). Runs once.
    pub(super) fn leave(&self, bound: Duration) {
        if self.stopped() {
            return;
        }
        {
            let mut st = lock(&self.listen_st);
            if st.leave != Leave::No {
                return;
            }
            st.leave = Leave::Asked;
        }
        self.ring();
        let end = Instant::now() + bound;
        loop {
            let open = lock(&self.conns).len();
            if open == 0 && lock(&self.listen_st).leave == Leave::Done {
                return;
            }
            if Instant::now() >= end {
                Counters::add(&self.c.exit_open_conns, open as u64);
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The manager's part of [`Mgr::leave`]: accepts the backlog (closing
    /// the listener would reset those connections), closes the listener
    /// (peers are refused and keep their datagrams queued until another
    /// process takes the port), and half-closes every connection. Each
    /// peer reads the end, stops writing on it and closes it; what it
    /// wrote before is still read here, delivered or handed over, until
    /// its end arrives and the connection closes as usual.
    fn leave_now(&self) {
        self.close_listener(None);
        let conns: Vec<Arc<Conn>> = lock(&self.conns).values().cloned().collect();
        for c in conns {
            if c.stream.peer_addr().is_err() {
                // Still connecting: nothing was written on it.
                self.close_conn(&c);
                continue;
            }
            // The manager reads it again (an endpoint's readers would not,
            // the program ending), and so sees the peer's end.
            self.revoke(&c);
            let _ = c.stream.shutdown(std::net::Shutdown::Write);
        }
        lock(&self.listen_st).leave = Leave::Done;
    }

    /// Stops listening; the next attempt to take the port is `retry`.
    /// Connections waiting in the backlog are accepted and read first:
    /// closing the listener would reset them, and lose what their peers
    /// wrote on them.
    fn close_listener(&self, retry: Option<(Instant, Duration)>) {
        for tok in self.accept_all() {
            let conn = lock(&self.conns).get(&tok).cloned();
            if let Some(c) = conn {
                while self.read_conn(&c) {}
            }
        }
        let mut guard = lock(&self.listener);
        if let Some(l) = guard.take() {
            self.poller.remove(l.as_raw_fd());
        }
        self.listening.store(false, SeqCst);
        let mut st = lock(&self.listen_st);
        st.provisional = None;
        st.retry = retry;
    }

    /// This transport has just taken the port: its lanes refused meanwhile
    /// (its lanes to its own host among them) connect now, in this tick,
    /// not after their backoff (up to `retry_max`).
    fn lanes_retry_now(&self) {
        let lanes: Vec<Arc<Lane>> = lock(&self.lanes).values().cloned().collect();
        for lane in lanes {
            let mut st = lock(&lane.st);
            if st.phase == Phase::Backoff && !st.plain {
                st.retry_at = None;
            }
        }
    }

    /// An accepted connection said hello: replies to that peer may use it
    /// (the paper's "connection previously established between the nodes")
    /// when the lane has no connection of its own.
    ///
    /// Not a connection from this host (its source address is the one it
    /// came to; a connection to a local address gets that as its
    /// source): it comes from another process here (a fork child, a
    /// send-only program), while the host's listener is this process,
    /// which a lane reaches by connecting. Taken as the lane, it made
    /// this process's datagrams to its own ports go through that
    /// process's hand-over, and what was on the way when it ended or
    /// stopped was lost (docs/tcp.md, "Fork").
    pub(super) fn attach_inbound(&self, conn: &Arc<Conn>, idx: u8) {
        if conn.peer.ip() == conn.local_ip {
            return;
        }
        let Ok(Some(lane)) = self.lane(conn.peer.ip(), idx) else { return };
        let mut st = lock(&lane.st);
        if st.conn.is_none() && matches!(st.phase, Phase::Idle | Phase::Backoff) && !st.closed {
            *lock(&conn.lane) = Some(Arc::downgrade(&lane));
            st.conn = Some(conn.clone());
            self.lane_up(&lane, &mut st);
        }
    }

    /// Accepts what waits; returns connections that may hold more input.
    pub(super) fn accept_all(&self) -> Vec<u64> {
        let mut more = Vec::new();
        loop {
            let r = match lock(&self.listener).as_ref() {
                Some(l) => l.accept(),
                None => return more,
            };
            let (stream, peer) = match r {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return more,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                Err(_) => {
                    // EMFILE, ENFILE, ENOBUFS, ...: the listener stays readable,
                    // so stop watching it for a while instead of spinning.
                    if let Some(l) = lock(&self.listener).as_ref() {
                        self.poller.remove(l.as_raw_fd());
                    }
                    *lock(&self.accept_paused) = Some(Instant::now() + Duration::from_millis(100));
                    self.ring(); // the timer resumes it
                    return more;
                }
            };
            let peer_ip = norm_ip(peer.ip());
            let (total, per_peer) = {
                let c = lock(&self.conns);
                (c.len(), c.values().filter(|x| x.peer.ip() == peer_ip).count())
            };
            if total >= self.cfg.max_conns
                || per_peer >= self.cfg.max_conns_per_peer
                || stream.set_nonblocking(true).is_err()
            {
                Counters::inc(&self.c.rejected_conns);
                continue; // dropping the stream closes it
            }
            // No private number left (the descriptor budget): the
            // placement closed the stream, as a refused connection.
            let Ok(stream) = private(stream) else {
                Counters::inc(&self.c.rejected_conns);
                continue;
            };
            let conn = Conn::new(self.next_token.fetch_add(1, SeqCst), stream, peer, true);
            self.apply_opts(&conn);
            // Our hello first, so the peer may read replies on this connection.
            if !matches!(sys::send_nosignal(conn.fd(), &frame::hello(0)), Ok(frame::HELLO_LEN)) {
                continue;
            }
            lock(&self.conns).insert(conn.token, conn.clone());
            if self.poller.add_conn(conn.fd(), conn.token).is_err() {
                lock(&self.conns).remove(&conn.token);
                continue;
            }
            Counters::inc(&self.c.conns_accepted);
            // Data may have arrived before registration (edge-triggered).
            if self.read_conn(&conn) {
                more.push(conn.token);
            }
        }
    }
}
