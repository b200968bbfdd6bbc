//! The send family: send, sendto, sendmsg, sendmmsg, write and writev.

use super::args::{iov_total, iovs, read_addr, with_buf};
use super::guard::{guard, Retry};
use super::{fail, ret_isize, with_sock_t};
use crate::ktrace;
use crate::real;
use crate::shim::{self, ep_send, Sock, Tls};
use libc::{c_int, c_uint, c_void, size_t, sockaddr, socklen_t, ssize_t};
use std::net::SocketAddr;
use std::sync::Arc;

/// Checks send flags; `Err(reason)` moves the socket to the kernel path.
fn send_flags_ok(flags: c_int) -> Result<(), &'static str> {
    if flags & libc::MSG_MORE != 0 {
        return Err("send flag MSG_MORE (corking)");
    }
    if flags & libc::MSG_DONTROUTE != 0 {
        return Err("send flag MSG_DONTROUTE");
    }
    Ok(())
}

/// Send on the engine path. `None`: kernel path.
fn shim_send(
    t: &Tls,
    s: &Arc<Sock>,
    fd: c_int,
    data: &[u8],
    flags: c_int,
    dst: Option<SocketAddr>,
) -> Option<Result<usize, c_int>> {
    if flags & libc::MSG_OOB != 0 {
        return Some(Err(libc::EOPNOTSUPP));
    }
    if s.mode() == shim::KERNEL {
        // A fallback under way on another thread sends what the engine
        // queued first; this send goes after it, as this thread's earlier
        // sends would on a kernel socket.
        s.await_hand_over();
        return None;
    }
    if let Err(why) = send_flags_ok(flags) {
        s.fallback(fd, why);
        return None;
    }
    if dst.is_some_and(|d| shim::multicast_off_transport(d.ip())) {
        s.fallback_multicast(fd, "destination");
        return None;
    }
    if let Some(r) = s.with_existing_in(t, |ep| ep_send(ep, data, dst, flags)) {
        return Some(r);
    }
    let Some(ep) = s.endpoint(fd) else {
        s.await_hand_over(); // handed over since the check above
        return None;
    };
    Some(ep_send(&ep, data, dst, flags))
}

#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    len: size_t,
    flags: c_int,
    addr: *const sockaddr,
    alen: socklen_t,
) -> ssize_t {
    guard(fd, "sendto", Retry::Yes, || {
        // SAFETY: the caller passes `sendto`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::send(&k, fd, len, ktrace::addr_of(addr, alen), || {
                    real::sendto(fd, buf, len, flags, addr, alen)
                });
            }
            with_sock_t(fd, |t, s| {
                let dst = if addr.is_null() {
                    None
                } else {
                    match read_addr(addr, alen) {
                        Ok(a) => Some(a),
                        Err(_) => return real::sendto(fd, buf, len, flags, addr, alen),
                    }
                };
                let data: &[u8] =
                    if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
                match shim_send(t, s, fd, data, flags, dst) {
                    Some(r) => ret_isize(r),
                    None => real::sendto(fd, buf, len, flags, addr, alen),
                }
            })
            .unwrap_or_else(|| real::sendto(fd, buf, len, flags, addr, alen))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t {
    guard(fd, "send", Retry::Yes, || {
        // SAFETY: the caller passes `send`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::send(&k, fd, len, None, || real::send(fd, buf, len, flags));
            }
            with_sock_t(fd, |t, s| {
                let data: &[u8] =
                    if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
                match shim_send(t, s, fd, data, flags, None) {
                    Some(r) => ret_isize(r),
                    None => real::send(fd, buf, len, flags),
                }
            })
            .unwrap_or_else(|| real::send(fd, buf, len, flags))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t {
    guard(fd, "write", Retry::Yes, || {
        // SAFETY: the caller passes `write`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                return ktrace::send(&k, fd, len, None, || real::write(fd, buf, len));
            }
            with_sock_t(fd, |t, s| {
                let data: &[u8] =
                    if len == 0 || buf.is_null() { &[] } else { std::slice::from_raw_parts(buf as *const u8, len) };
                match shim_send(t, s, fd, data, 0, None) {
                    Some(r) => ret_isize(r),
                    None => real::write(fd, buf, len),
                }
            })
            .unwrap_or_else(|| real::write(fd, buf, len))
        }
    })
}

/// sendmsg on the shim's path; `None`: kernel path.
unsafe fn sendmsg_shim(t: &Tls, fd: c_int, s: &Arc<Sock>, msg: *const libc::msghdr, flags: c_int) -> Option<ssize_t> {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        if msg.is_null() {
            return Some(fail(libc::EFAULT));
        }
        let m = &*msg;
        if s.mode() == shim::KERNEL {
            return None;
        }
        if m.msg_controllen > 0 && !m.msg_control.is_null() {
            let c = libc::CMSG_FIRSTHDR(m);
            if !c.is_null() {
                let why = format!("sendmsg control message (level {}, type {})", (*c).cmsg_level, (*c).cmsg_type);
                s.fallback(fd, &why);
                return None;
            }
        }
        let dst = if m.msg_name.is_null() || m.msg_namelen == 0 {
            None
        } else {
            match read_addr(m.msg_name as *const sockaddr, m.msg_namelen) {
                Ok(a) => Some(a),
                Err(_) => return None,
            }
        };
        let v = iovs(m.msg_iov, m.msg_iovlen);
        let r = with_buf(v, true, |b| (shim_send(t, s, fd, b, flags, dst), 0))?;
        Some(ret_isize(r))
    }
}

#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t {
    guard(fd, "sendmsg", Retry::Yes, || {
        // SAFETY: the caller passes `sendmsg`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(k) = ktrace::traced(fd) {
                let (len, dst) = if msg.is_null() {
                    (0, None)
                } else {
                    (
                        iov_total((*msg).msg_iov, (*msg).msg_iovlen as c_int).unwrap_or(0),
                        ktrace::addr_of((*msg).msg_name as *const sockaddr, (*msg).msg_namelen),
                    )
                };
                return ktrace::send(&k, fd, len, dst, || real::sendmsg(fd, msg, flags));
            }
            with_sock_t(fd, |t, s| {
                if let Some(r) = sendmsg_shim(t, fd, s, msg, flags) {
                    return r;
                }
                real::sendmsg(fd, msg, flags)
            })
            .unwrap_or_else(|| real::sendmsg(fd, msg, flags))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    guard(fd, "writev", Retry::Yes, || {
        // SAFETY: the caller passes `writev`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            if iov_total(iov, n) == Some(0) {
                // writev of nothing sends nothing on the kernel (write, send and
                // sendmsg of nothing do send an empty datagram).
                return real::writev(fd, iov, n);
            }
            with_sock_t(fd, |t, s| {
                let mut m: libc::msghdr = std::mem::zeroed();
                m.msg_iov = iov as *mut libc::iovec;
                m.msg_iovlen = n.max(0) as usize;
                if let Some(r) = sendmsg_shim(t, fd, s, &m, 0) {
                    return r;
                }
                real::writev(fd, iov, n)
            })
            .unwrap_or_else(|| real::writev(fd, iov, n))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int) -> c_int {
    guard(fd, "sendmmsg", Retry::No, || {
        // SAFETY: the caller passes `sendmmsg`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            with_sock_t(fd, |t, s| {
                if s.mode() != shim::KERNEL && !msgs.is_null() {
                    let mut sent = 0u32;
                    while sent < vlen {
                        let h = &mut *msgs.add(sent as usize);
                        match sendmsg_shim(t, fd, s, &h.msg_hdr, flags) {
                            None => break,
                            Some(r) if r >= 0 => {
                                h.msg_len = r as c_uint;
                                sent += 1;
                            }
                            Some(_) => {
                                if sent == 0 {
                                    return -1;
                                }
                                return sent as c_int;
                            }
                        }
                    }
                    if sent == vlen {
                        return sent as c_int;
                    }
                    if sent > 0 {
                        // The rest goes on the kernel path (the socket fell back).
                        let r = real::sendmmsg(fd, msgs.add(sent as usize), vlen - sent, flags);
                        return sent as c_int + r.max(0);
                    }
                }
                real::sendmmsg(fd, msgs, vlen, flags) as ssize_t as c_int
            })
            .unwrap_or_else(|| real::sendmmsg(fd, msgs, vlen, flags))
        }
    })
}
