//! Socket options: blocking mode, timeouts, buffer sizes, error reporting.

use super::{deadline_after, lock, Endpoint, EpInner};
use std::io;
use std::sync::atomic::{Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, Instant};

impl Endpoint {
    /// Nonblocking mode: calls that would wait fail with `WouldBlock` (EAGAIN).
    pub fn set_nonblocking(&self, on: bool) {
        self.inner.nonblocking.store(on, SeqCst);
    }

    /// Receive timeout (SO_RCVTIMEO); `None` waits forever.
    pub fn set_read_timeout(&self, t: Option<Duration>) {
        let mut g = lock(&self.inner.timeouts);
        g.0 = t;
        self.inner.rx_timeout_in_socket.store(false, Relaxed);
    }

    /// As [`Endpoint::set_read_timeout`], for a timeout that the backend's
    /// socket already holds as its own `SO_RCVTIMEO` (the shim mirrors the
    /// program's option this way). A blocking receive with a timeout may
    /// then sleep inside the socket's read, as one without does: one system
    /// call per datagram instead of a failed read, a `poll` and a read.
    pub fn set_read_timeout_in_socket(&self, t: Option<Duration>) {
        let mut g = lock(&self.inner.timeouts);
        g.0 = t;
        self.inner.rx_timeout_in_socket.store(true, Relaxed);
    }

    /// Send timeout for a full L1 (SO_SNDTIMEO); `None` waits forever.
    pub fn set_write_timeout(&self, t: Option<Duration>) {
        lock(&self.inner.timeouts).1 = t;
    }

    /// Sets SO_SNDBUF on the socket and sizes L1 from what the kernel grants.
    pub fn set_send_buffer_size(&self, bytes: usize) -> io::Result<()> {
        let b = &self.inner.backend;
        b.set_option(libc::SOL_SOCKET, libc::SO_SNDBUF, bytes.min(i32::MAX as usize) as i32)?;
        lock(&self.inner.send).capacity = b.send_buffer_size();
        Ok(())
    }

    /// Sets SO_RCVBUF on the socket and sizes the receive ring from what the
    /// kernel grants.
    pub fn set_recv_buffer_size(&self, bytes: usize) -> io::Result<()> {
        let b = &self.inner.backend;
        b.set_option(libc::SOL_SOCKET, libc::SO_RCVBUF, bytes.min(i32::MAX as usize) as i32)?;
        let granted = b.recv_buffer_size();
        lock(&self.inner.recv).ring.set_capacity(granted);
        // Traced: the TX stamps waiting to be read share this buffer.
        self.inner.trace.fit_stamps_to(granted);
        Ok(())
    }

    /// Enables ICMP error reporting on an unconnected endpoint (IP_RECVERR).
    pub fn set_recv_err(&self, on: bool) -> io::Result<()> {
        let lvl_v4 = libc::IPPROTO_IP;
        if self.inner.backend.is_v6() {
            self.inner.backend.set_option(libc::IPPROTO_IPV6, libc::IPV6_RECVERR, on as i32)?;
            let _ = self.inner.backend.set_option(lvl_v4, libc::IP_RECVERR, on as i32);
            Ok(())
        } else {
            self.inner.backend.set_option(lvl_v4, libc::IP_RECVERR, on as i32)
        }
    }
}

impl EpInner {
    pub(super) fn deadline(&self, send: bool) -> Option<Instant> {
        let t = lock(&self.timeouts);
        let d = if send { t.1 } else { t.0 };
        d.and_then(deadline_after)
    }
}
