//! Kernel packet timestamps (`SO_TIMESTAMPING`): the option, the TX stamps
//! read off a socket's error queue, and the hold that keeps RX stamping on.

use super::cvt;
use super::poll::poll_readable;
use crate::fdspace::new_private;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// `SO_TIMESTAMPING` (asm-generic/socket.h, the 32-bit-time variant that is
/// also `SCM_TIMESTAMPING`), and `SCM_TSTAMP_SCHED` (linux/errqueue.h).
pub const SO_TIMESTAMPING: libc::c_int = 37;
const SCM_TSTAMP_SCHED: u32 = 1;

/// Reads every kernel TX timestamp queued on `fd`'s error queue
/// (`SO_TIMESTAMPING` with `OPT_ID | OPT_TSONLY`), up to 64 per `recvmmsg`, calling `f(key, sched,
/// realtime_ns)` for each: `sched` for TX_SCHED, otherwise TX_SOFTWARE.
/// Other queued errors read on the way are consumed, so only traced sockets
/// are drained. Returns how many messages were read.
pub fn read_tx_timestamps(fd: RawFd, f: &mut dyn FnMut(u32, bool, u64)) -> usize {
    // A drain after a send syscall finds 2-4 stamps (two per kernel
    // message); a fuller queue takes more calls.
    const BATCH: usize = 32;
    let mut n = 0;
    loop {
        // Control space only, left uninitialised: the kernel writes it and
        // reports its length in msg_controllen, and only that much is read.
        // No data buffer: with OPT_TSONLY a stamp carries no payload (other
        // queued errors are truncated, and dropped anyway). On the stack
        // and small: this runs after every traced send syscall.
        let mut ctrl = [MaybeUninit::<[u64; 16]>::uninit(); BATCH];
        // SAFETY: mmsghdr is plain data; zero is a valid initial value.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        for (h, c) in hdrs.iter_mut().zip(ctrl.iter_mut()) {
            h.msg_hdr.msg_control = c.as_mut_ptr() as *mut libc::c_void;
            h.msg_hdr.msg_controllen = size_of::<[u64; 16]>();
        }
        // SAFETY: every pointer refers to the live arrays above.
        let r = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                BATCH as u32,
                libc::MSG_ERRQUEUE | libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if r <= 0 {
            return n;
        }
        for h in &hdrs[..r as usize] {
            n += 1;
            let mut stamp = None;
            let mut key = None;
            // SAFETY: walking the control data the kernel wrote for this message.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h.msg_hdr);
                while !c.is_null() {
                    let lvl = (*c).cmsg_level;
                    let ty = (*c).cmsg_type;
                    if lvl == libc::SOL_SOCKET && ty == SO_TIMESTAMPING {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        stamp = Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64);
                    } else if (lvl == libc::IPPROTO_IP && ty == libc::IP_RECVERR)
                        || (lvl == libc::IPPROTO_IPV6 && ty == libc::IPV6_RECVERR)
                    {
                        let ee = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::sock_extended_err);
                        if ee.ee_origin == libc::SO_EE_ORIGIN_TIMESTAMPING {
                            key = Some((ee.ee_data, ee.ee_info == SCM_TSTAMP_SCHED));
                        }
                    }
                    c = libc::CMSG_NXTHDR(&h.msg_hdr, c);
                }
            }
            if let (Some(ts), Some((k, sched))) = (stamp, key) {
                f(k, sched, ts);
            }
        }
        if (r as usize) < BATCH {
            return n;
        }
    }
}

/// Makes sure the kernel stamps arriving packets (RX_SOFTWARE) from now on.
///
/// The first socket of the machine that asks for receive timestamps turns
/// the kernel's stamping on through a deferred work item
/// (`net_enable_timestamp` schedules `netstamp_work` and returns), so
/// packets that arrive before a kworker runs it carry no stamp: under load,
/// for milliseconds — traced packets without an RX_SOFTWARE point. The
/// same happens again whenever the last such socket closed (the disable is
/// deferred too). This opens a socket that asks for receive timestamps and
/// keeps it open for the life of the process (holding the kernel's count,
/// so later sockets turn stamping on at once and closing them never turns
/// it off), then sends itself one-byte datagrams over loopback until one
/// arrives stamped, for up to `wait`. Returns whether one did (false where
/// loopback is down: then only the hold is in place). Later calls reuse the
/// held socket: they only look again, for up to their own `wait`.
pub fn hold_rx_timestamps(wait: Duration) -> bool {
    // The held socket, bound to loopback and connected to itself (-1: none
    // yet); the lock also keeps two probes from reading each other's bytes.
    static HELD: std::sync::Mutex<RawFd> = std::sync::Mutex::new(-1);
    let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
    if *held < 0 {
        match hold_socket() {
            Some(fd) => *held = fd,
            None => return false,
        }
    }
    probe_rx_timestamp(*held, wait)
}

/// Opens the socket [`hold_rx_timestamps`] keeps, asks it for receive
/// timestamps and connects it to itself on loopback; `None` where that
/// fails (a socket that asked for timestamps stays open even then).
fn hold_socket() -> Option<RawFd> {
    let Ok(sock) = new_private(|| {
        // SAFETY: plain syscall; the fd is owned below.
        let fd = cvt(unsafe {
            libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK, 0)
        })?;
        // SAFETY: fresh fd owned by nobody else.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }) else {
        return None;
    };
    let fd = sock.as_raw_fd();
    let flags = (libc::SOF_TIMESTAMPING_RX_SOFTWARE | libc::SOF_TIMESTAMPING_SOFTWARE) as libc::c_int;
    // SAFETY: pointer to a live c_int of the given size.
    if unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_TIMESTAMPING,
            &flags as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    } != 0
    {
        return None;
    }
    // From here on the kernel's count is held: keep the socket for good.
    std::mem::forget(sock);
    let mut a = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(Ipv4Addr::LOCALHOST).to_be() },
        sin_zero: [0; 8],
    };
    let mut len = size_of::<libc::sockaddr_in>() as libc::socklen_t;
    let ap = &mut a as *mut libc::sockaddr_in as *mut libc::sockaddr;
    // SAFETY: pointers to the live sockaddr_in and its length.
    if unsafe {
        libc::bind(fd, ap, len) != 0 || libc::getsockname(fd, ap, &mut len) != 0 || libc::connect(fd, ap, len) != 0
    } {
        return None;
    }
    Some(fd)
}

/// Sends the held socket `fd` one-byte datagrams until one arrives with a
/// receive timestamp, for up to `wait`; true when one did.
fn probe_rx_timestamp(fd: RawFd, wait: Duration) -> bool {
    let t0 = std::time::Instant::now();
    loop {
        // SAFETY: one byte from a live buffer on a connected socket.
        unsafe { libc::send(fd, b"t".as_ptr() as *const libc::c_void, 1, 0) };
        let _ = poll_readable(&[fd], Some(Duration::from_millis(2)));
        loop {
            let mut ctrl = [0u64; 16];
            let mut byte = [0u8; 1];
            let mut iov = libc::iovec { iov_base: byte.as_mut_ptr() as *mut libc::c_void, iov_len: 1 };
            // SAFETY: msghdr is plain data; zero is a valid initial value.
            let mut h: libc::msghdr = unsafe { zeroed() };
            h.msg_iov = &mut iov;
            h.msg_iovlen = 1;
            h.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
            h.msg_controllen = size_of::<[u64; 16]>() as _;
            // SAFETY: every pointer refers to the live locals above.
            if unsafe { libc::recvmsg(fd, &mut h, libc::MSG_DONTWAIT) } < 0 {
                break;
            }
            // SAFETY: walking the control data the kernel wrote for this message.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == SO_TIMESTAMPING {
                        let ts = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        if ts.tv_sec != 0 || ts.tv_nsec != 0 {
                            return true;
                        }
                    }
                    c = libc::CMSG_NXTHDR(&h, c);
                }
            }
        }
        if t0.elapsed() >= wait {
            return false;
        }
    }
}
