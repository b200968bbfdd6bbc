//! A lane's connection: connecting, coming up, detaching, closing, and the
//! options set on every UOE connection. Runs under `Lane::st`; takes
//! `Mgr::conns` inside it.

use super::counters::Counters;
use super::state::{lock, Conn, Lane, LaneSt, Mgr, Phase};
use crate::backend::tcp::{frame, sys, Dml};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;
use std::time::Instant;

impl Mgr {
    /// Opens the lane's connection (nonblocking).
    pub(super) fn start_connect(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        if st.closed {
            return;
        }
        if lock(&self.conns).len() >= self.cfg.max_conns {
            Counters::inc(&self.c.rejected_conns);
            self.connect_failed(st);
            return;
        }
        let dst = SocketAddr::new(lane.key.0, self.cfg.port);
        Counters::inc(&self.c.conns_opened);
        match sys::connect_start(&dst, self.cfg.bind_ip, &self.opts) {
            Ok((stream, done)) => {
                let conn = Conn::new(self.next_token.fetch_add(1, SeqCst), stream, dst, false);
                self.apply_opts(&conn);
                *lock(&conn.lane) = Some(Arc::downgrade(lane));
                lock(&self.conns).insert(conn.token, conn.clone());
                if self.poller.add_conn(conn.fd(), conn.token).is_err() {
                    lock(&self.conns).remove(&conn.token);
                    self.connect_failed(st);
                    return;
                }
                st.conn = Some(conn.clone());
                st.phase = Phase::Connecting;
                if done {
                    self.conn_up(lane, st, &conn);
                }
            }
            Err(e) => {
                if e.raw_os_error() == Some(libc::ECONNREFUSED) && self.cfg.dml == Dml::Udp {
                    self.go_plain(lane, st);
                }
                self.connect_failed(st)
            }
        }
    }

    pub(super) fn connect_failed(&self, st: &mut LaneSt) {
        Counters::inc(&self.c.connect_failures);
        st.conn = None;
        st.attempts = st.attempts.saturating_add(1);
        st.phase = Phase::Backoff;
        let exp = self.cfg.retry_min.saturating_mul(1u32 << st.attempts.min(16).saturating_sub(1));
        st.retry_at = Some(Instant::now() + exp.min(self.cfg.retry_max));
        // The manager recomputes its timer.
        self.ring();
    }

    /// An outgoing connection completed: say hello, send what waits.
    pub(super) fn conn_up(&self, lane: &Arc<Lane>, st: &mut LaneSt, conn: &Arc<Conn>) {
        match sys::send_nosignal(conn.fd(), &frame::hello(lane.key.1)) {
            Ok(frame::HELLO_LEN) => {}
            _ => {
                self.close_socket(conn);
                self.connect_failed(st);
                return;
            }
        }
        self.lane_up(lane, st);
    }

    pub(super) fn lane_up(&self, lane: &Arc<Lane>, st: &mut LaneSt) {
        st.phase = Phase::Up;
        st.plain = false;
        st.attempts = 0;
        st.retry_at = None;
        st.fallback = false;
        if st.was_up {
            Counters::inc(&self.c.reconnects);
        }
        st.was_up = true;
        let b = st.out.queued();
        self.flush_lane(lane, st);
        self.settle_partial(st, b);
        // Wake DML (b) blockers and room waiters.
        lane.cv.notify_all();
    }

    /// `conn` no longer carries the lane: forget it, cut a half-written
    /// frame, and reconnect if datagrams wait.
    pub(super) fn detach(&self, lane: &Arc<Lane>, st: &mut LaneSt, conn: &Arc<Conn>) {
        if !st.conn.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            return;
        }
        let b = st.out.queued();
        let (cut, src) = st.out.discard_partial();
        Counters::add(&self.c.lost_partial, cut);
        self.lost_by(src, cut, |d| &d.send);
        self.settle_partial(st, b);
        st.conn = None;
        match st.phase {
            Phase::Connecting => self.connect_failed(st),
            _ => {
                st.phase = Phase::Idle;
                if st.out.queued() > 0 {
                    self.start_connect(lane, st);
                }
            }
        }
        self.open_rooms(st);
        lane.cv.notify_all();
    }

    /// Removes a connection from the epoll set and the table and shuts it.
    pub(super) fn close_socket(&self, conn: &Arc<Conn>) {
        if conn.dead.swap(true, SeqCst) {
            return;
        }
        self.poller.remove(conn.fd());
        lock(&self.conns).remove(&conn.token);
        let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        Counters::inc(&self.c.conns_closed);
    }

    /// Closes a connection and detaches it from its lane.
    pub(super) fn close_conn(&self, conn: &Arc<Conn>) {
        self.revoke(conn);
        self.close_socket(conn);
        let lane = lock(&conn.lane).take().and_then(|w| w.upgrade());
        if let Some(lane) = lane {
            let mut st = lock(&lane.st);
            self.detach(&lane, &mut st, conn);
        }
    }

    pub(super) fn apply_opts(&self, conn: &Conn) {
        let _ = conn.stream.set_nodelay(self.cfg.nodelay);
        if let Some(cc) = &self.cfg.congestion {
            if let Err(e) = sys::set_congestion(conn.fd(), cc) {
                Counters::inc(&self.c.cc_errors);
                if !self.cc_warned.swap(true, SeqCst) {
                    crate::log::write(
                        crate::log::Level::Warn,
                        format_args!("TCP_CONGESTION {cc:?} not available ({e}); using the system default"),
                    );
                }
            }
        }
        if !self.cfg.user_timeout.is_zero() {
            let ms = self.cfg.user_timeout.as_millis().min(i32::MAX as u128) as i32;
            let _ = sys::set_int_opt(conn.fd(), libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, ms);
        }
    }
}
