//! The relay's raw calls: AF_PACKET sockets bound to one interface, their
//! frames in and out, and a flag raised by SIGTERM/SIGINT.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// Makes SIGTERM and SIGINT raise the flag [`stopped`] reads, so the relay
/// ends its loop and prints its summary instead of dying mid-frame.
pub fn catch_stop_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is
        // async-signal-safe; the sigaction struct is zeroed, then filled.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Whether a stop signal arrived.
pub fn stopped() -> bool {
    STOP.load(Ordering::Relaxed)
}

/// An AF_PACKET socket receiving and sending whole Ethernet frames on one
/// interface, non-blocking.
pub struct PacketSocket {
    fd: OwnedFd,
}

/// The interface index of `name` in this network namespace.
pub fn ifindex(name: &str) -> io::Result<i32> {
    let c = std::ffi::CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i as i32)
}

impl PacketSocket {
    /// Opens a socket for every protocol on interface `ifindex`, ignoring
    /// the frames this host sends out of it (the relay's own).
    pub fn open(ifindex: i32) -> io::Result<PacketSocket> {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: socket(2) takes no pointers; the result is checked.
        let raw = unsafe {
            libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, proto as i32)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sockaddr_ll is plain data; zeroed then filled, and its
        // size is passed with it.
        let rc = unsafe {
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = proto;
            sll.sll_ifindex = ifindex;
            libc::bind(
                fd.as_raw_fd(),
                &sll as *const libc::sockaddr_ll as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let one: libc::c_int = 1;
        // SAFETY: the option value is a c_int that lives across the call.
        // An older kernel without the option still works: outgoing frames
        // are also skipped by their packet type in `recv`.
        unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_IGNORE_OUTGOING,
                &one as *const libc::c_int as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
        let buf: libc::c_int = 4 << 20;
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            // SAFETY: as above, a c_int option value.
            unsafe {
                libc::setsockopt(
                    fd.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    &buf as *const libc::c_int as *const libc::c_void,
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
        Ok(PacketSocket { fd })
    }

    /// One incoming frame into `buf`: its length, or `None` when there is
    /// none now. Frames this host sent are skipped.
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        loop {
            // SAFETY: sockaddr_ll is plain data; `buf` is valid for writes of
            // its length, and `len` holds the address buffer's size.
            let (n, sll) = unsafe {
                let mut sll: libc::sockaddr_ll = std::mem::zeroed();
                let mut len = std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t;
                let n = libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr() as *mut libc::c_void,
                    buf.len(),
                    0,
                    &mut sll as *mut libc::sockaddr_ll as *mut libc::sockaddr,
                    &mut len,
                );
                (n, sll)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                return match e.kind() {
                    io::ErrorKind::WouldBlock => Ok(None),
                    io::ErrorKind::Interrupted => continue,
                    _ => Err(e),
                };
            }
            if sll.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            return Ok(Some(n as usize));
        }
    }

    /// Sends one whole frame out of the interface. A full queue or a
    /// frame the interface refuses is reported to the caller, which counts it.
    pub fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: `frame` is valid for reads of its length during the
        // call; the socket is bound, so no address is needed.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr() as *const libc::c_void, frame.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
