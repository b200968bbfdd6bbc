//! Calls that make, close, copy or configure descriptors: socket, close,
//! close_range, closefrom, dup*, shutdown, bind, connect, fcntl, ioctl, and
//! the pass-through calls whose new descriptors the budget watches.

use super::args::read_addr;
use super::fail;
use super::guard::{guard, Retry};
use crate::fdspace::{is_private, program_fds};
use crate::ktrace;
use crate::real;
use crate::shim::{self, lookup, ACTIVE};
use crate::sys::{errno, set_errno};
use libc::{c_char, c_int, c_uint, c_ulong, c_void, sockaddr, socklen_t};

#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    guard(-1, "socket", Retry::Yes, || {
        // SAFETY: the caller passes `socket`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let fd = program_fds(|| real::socket(domain, ty, proto));
            shim::forget_stale(fd);
            if fd >= 0
                && (domain == libc::AF_INET || domain == libc::AF_INET6)
                && ty & 0xf == libc::SOCK_DGRAM
                && (proto == 0 || proto == libc::IPPROTO_UDP)
            {
                shim::register_new(fd, domain == libc::AF_INET6, ty & libc::SOCK_NONBLOCK != 0);
                ktrace::register(fd);
            }
            fd
        }
    })
}

/// The program's other calls that make descriptors: numbers lent to the
/// shim below the program's limit are given back when the program needs
/// them (see [`crate::fdspace::program_fds`]); otherwise plain
/// pass-throughs. `open`'s optional mode is read as a plain third argument
/// (how the x86-64 and AArch64 ABIs pass it) and handed on.
macro_rules! fd_makers {
    ($($name:ident ( $($a:ident : $t:ty),* );)*) => {
        $(
            #[no_mangle]
            pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
                // SAFETY: the arguments go to libc's function of the same
                // name unchanged, under the caller's C contract for it.
                guard(-1, stringify!($name), Retry::Yes, || program_fds(|| unsafe { real::$name($($a),*) }))
            }
        )*
    };
}

fd_makers! {
    socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int);
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t);
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int);
    epoll_create(size: c_int);
    epoll_create1(flags: c_int);
    eventfd(initval: c_uint, flags: c_int);
    pipe(fds: *mut c_int);
    pipe2(fds: *mut c_int, flags: c_int);
    open(path: *const c_char, flags: c_int, mode: libc::mode_t);
    open64(path: *const c_char, flags: c_int, mode: libc::mode_t);
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t);
    openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t);
}

#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    guard(fd, "close", Retry::No, || {
        // SAFETY: the caller passes `close`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if ktrace::traced(fd).is_some() {
                ktrace::forget(fd);
            }
            // The shim's and the engine's own descriptors are beyond the program's
            // reach, as a number beyond its limit is on the kernel.
            if is_private(fd) {
                return fail(libc::EBADF);
            }
            shim::remove(fd);
            real::close(fd)
        }
    })
}

pub(super) fn forget_range(first: u32, last: u32) {
    if !shim::any() {
        return;
    }
    for (fd, _) in shim::all() {
        if (fd as u32) >= first && (fd as u32) <= last {
            shim::remove(fd);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    guard(-1, "close_range", Retry::No, || {
        // SAFETY: the caller passes `close_range`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if flags & libc::CLOSE_RANGE_CLOEXEC as c_int == 0 {
                forget_range(first, last);
            }
            crate::fdspace::close_range_sparing(first, last, flags, |a, b, fl| real::close_range(a, b, fl))
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn closefrom(first: c_int) {
    guard(-1, "closefrom", Retry::No, || {
        forget_range(first.max(0) as u32, u32::MAX);
        crate::fdspace::closefrom_sparing(first)
    })
}

#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    guard(fd, "shutdown", Retry::Yes, || {
        // SAFETY: the caller passes `shutdown`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if let Some(s) = lookup(fd) {
                s.fallback(fd, "shutdown()");
            }
            real::shutdown(fd, how)
        }
    })
}

pub(super) fn after_dup(old: c_int, new: c_int) {
    if new < 0 || new == old {
        return;
    }
    match lookup(old) {
        Some(s) => shim::insert(new, s),
        None => shim::remove(new),
    }
}

#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    guard(fd, "dup", Retry::Yes, || {
        // SAFETY: the caller passes `dup`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let r = program_fds(|| real::dup(fd));
            after_dup(fd, r);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    guard(fd, "dup2", Retry::Yes, || {
        // SAFETY: the caller passes `dup2`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if is_private(to) {
                return fail(libc::EBADF);
            }
            let r = real::dup2(fd, to);
            after_dup(fd, r);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    guard(fd, "dup3", Retry::Yes, || {
        // SAFETY: the caller passes `dup3`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if is_private(to) {
                return fail(libc::EBADF);
            }
            let r = real::dup3(fd, to, flags);
            after_dup(fd, r);
            r
        }
    })
}

/// Under the `tcp` transport a bound socket is attached to the engine at
/// once, so its port is the transport's from the first frame: attached on
/// first use instead, the frames that came before that use went through the
/// listener's hand-over to the kernel socket while later ones reached the
/// endpoint, and a burst could be read out of order. The kernel backend
/// needs nothing here (the kernel socket itself queues what arrives).
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(fd, "bind", Retry::Yes, || {
        // SAFETY: the caller passes `bind`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let r = real::bind(fd, addr, len);
            if r == 0 && !shim::inside() && shim::bypass_transport() {
                if let Some(s) = lookup(fd) {
                    let e = errno();
                    let _ = s.endpoint(fd);
                    set_errno(e);
                }
            }
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    guard(fd, "connect", Retry::Yes, || {
        // SAFETY: the caller passes `connect`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let Some(s) = lookup(fd) else { return real::connect(fd, addr, len) };
            if !addr.is_null()
                && (*addr).sa_family as c_int != libc::AF_UNSPEC
                && read_addr(addr, len).is_ok_and(|a| shim::multicast_off_transport(a.ip()))
            {
                s.fallback_multicast(fd, "destination");
                return real::connect(fd, addr, len);
            }
            let Some(ep) = s.existing() else { return real::connect(fd, addr, len) };
            if addr.is_null() {
                return fail(libc::EFAULT);
            }
            let r = if (*addr).sa_family as c_int == libc::AF_UNSPEC {
                ep.disconnect()
            } else {
                match read_addr(addr, len) {
                    Ok(a) => ep.connect(a),
                    Err(e) => return fail(e),
                }
            };
            match r {
                Ok(()) => 0,
                Err(e) => fail(shim::errno_of(&e)),
            }
        }
    })
}

unsafe fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong, f: unsafe fn(c_int, c_int, c_ulong) -> c_int) -> c_int {
    // SAFETY: the pointers are a hook's arguments, valid as that hook's
    // caller vouches (this function's contract).
    unsafe {
        let Some(s) = lookup(fd) else {
            return match cmd {
                libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => program_fds(|| f(fd, cmd, arg)),
                _ => f(fd, cmd, arg),
            };
        };
        match cmd {
            libc::F_GETFL => {
                let r = f(fd, cmd, arg);
                if r >= 0 && s.mode() == ACTIVE {
                    (r & !libc::O_NONBLOCK) | if s.nonblock() { libc::O_NONBLOCK } else { 0 }
                } else {
                    r
                }
            }
            libc::F_SETFL => {
                s.set_nonblock(arg as c_int & libc::O_NONBLOCK != 0);
                f(fd, cmd, arg)
            }
            libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => {
                let r = program_fds(|| f(fd, cmd, arg));
                after_dup(fd, r);
                r
            }
            _ => f(fd, cmd, arg),
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    guard(fd, "fcntl", Retry::Yes, || {
        // SAFETY: the caller passes `fcntl`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe { fcntl_common(fd, cmd, arg, real::fcntl) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    guard(fd, "fcntl64", Retry::Yes, || {
        // SAFETY: the caller passes `fcntl64`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe { fcntl_common(fd, cmd, arg, real::fcntl64) }
    })
}

#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int {
    guard(fd, "ioctl", Retry::Yes, || {
        // SAFETY: the caller passes `ioctl`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let Some(s) = lookup(fd) else { return real::ioctl(fd, req, arg) };
            match req {
                libc::FIONBIO if !arg.is_null() => {
                    s.set_nonblock(*(arg as *const c_int) != 0);
                    real::ioctl(fd, req, arg)
                }
                libc::FIONREAD if !arg.is_null() => {
                    if s.has_leftover() {
                        if let Some(r) = s.pop_leftover(&mut [], true, None) {
                            *(arg as *mut c_int) = r.len as c_int;
                            return 0;
                        }
                    }
                    match s.existing() {
                        Some(ep) => {
                            let n = match ep.recv_with(
                                &mut [],
                                eudp_engine::RecvFlags { peek: true, dont_wait: true, interruptible: false },
                            ) {
                                Ok(r) => r.len,
                                Err(_) => 0,
                            };
                            *(arg as *mut c_int) = n as c_int;
                            0
                        }
                        None => real::ioctl(fd, req, arg),
                    }
                }
                _ => real::ioctl(fd, req, arg),
            }
        }
    })
}
