//! Process-wide calls: syscall(), exec*, fork hand-over, signal handlers,
//! exit, and the library's constructor.

use super::fail;
use super::fd::{after_dup, forget_range};
use super::guard::{guard, Retry};
use super::recv::{recvfrom, recvmmsg, recvmsg};
use super::send::{sendmmsg, sendmsg, sendto};
use crate::fdspace::is_private;
use crate::real;
use crate::shim::{self, lookup};
use crate::sys::{errno, restore_kernel_socket, set_errno, sockopt_int, UDP_GRO};
use libc::{c_char, c_int, c_uint, c_void, size_t, sockaddr, socklen_t};
use std::time::Duration;

#[cfg(target_arch = "x86_64")]
const SYS_DUP2: libc::c_long = libc::SYS_dup2;
#[cfg(not(target_arch = "x86_64"))]
const SYS_DUP2: libc::c_long = -1;

/// `syscall(2)`: libuv, for one, closes descriptors with
/// `syscall(SYS_close, fd)`; the shim must see those closes. The six
/// argument registers are taken as plain arguments (how the x86-64 and
/// AArch64 ABIs pass variadic integers) and handed on unchanged.
#[no_mangle]
pub unsafe extern "C" fn syscall(
    n: libc::c_long,
    a: libc::c_long,
    b: libc::c_long,
    c: libc::c_long,
    d: libc::c_long,
    e: libc::c_long,
    f: libc::c_long,
) -> libc::c_long {
    guard(-1, "syscall", Retry::Yes, || {
        // SAFETY: the caller passes `syscall`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            match n {
                libc::SYS_close if is_private(a as c_int) => return fail(libc::EBADF),
                libc::SYS_close => shim::remove(a as c_int),
                libc::SYS_close_range if c & libc::CLOSE_RANGE_CLOEXEC as libc::c_long == 0 => {
                    forget_range(a as u32, b as u32);
                    let close = |x: c_uint, y: c_uint, fl: c_int| {
                        real::syscall(n, x as libc::c_long, y as libc::c_long, fl as libc::c_long, 0, 0, 0) as c_int
                    };
                    return crate::fdspace::close_range_sparing(a as c_uint, b as c_uint, c as c_int, close)
                        as libc::c_long;
                }
                SYS_DUP2 | libc::SYS_dup3 if is_private(b as c_int) => return fail(libc::EBADF),
                SYS_DUP2 | libc::SYS_dup3 => shim::remove(b as c_int),
                _ => {}
            }
            // Socket calls made through syscall() (libuv's uv__sendmmsg and
            // uv__recvmmsg, for one) on an application UDP socket.
            if matches!(
                n,
                libc::SYS_sendmmsg
                    | libc::SYS_recvmmsg
                    | libc::SYS_sendto
                    | libc::SYS_recvfrom
                    | libc::SYS_sendmsg
                    | libc::SYS_recvmsg
            ) && lookup(a as c_int).is_some()
            {
                let fd = a as c_int;
                return match n {
                    libc::SYS_sendmmsg => {
                        sendmmsg(fd, b as *mut libc::mmsghdr, c as c_uint, d as c_int) as libc::c_long
                    }
                    libc::SYS_recvmmsg => {
                        recvmmsg(fd, b as *mut libc::mmsghdr, c as c_uint, d as c_int, e as *mut libc::timespec)
                            as libc::c_long
                    }
                    libc::SYS_sendto => {
                        sendto(fd, b as *const c_void, c as size_t, d as c_int, e as *const sockaddr, f as socklen_t)
                            as libc::c_long
                    }
                    libc::SYS_recvfrom => {
                        recvfrom(fd, b as *mut c_void, c as size_t, d as c_int, e as *mut sockaddr, f as *mut socklen_t)
                            as libc::c_long
                    }
                    libc::SYS_sendmsg => sendmsg(fd, b as *const libc::msghdr, c as c_int) as libc::c_long,
                    _ => recvmsg(fd, b as *mut libc::msghdr, c as c_int) as libc::c_long,
                };
            }
            let r = real::syscall(n, a, b, c, d, e, f);
            if (n == SYS_DUP2 || n == libc::SYS_dup3) && r >= 0 {
                after_dup(a as c_int, r as c_int);
            }
            r
        }
    })
}

/// Before exec: what is queued goes out, and sockets the new program
/// inherits become plain kernel sockets with the flags it asked for.
fn before_exec() -> Vec<(c_int, bool)> {
    let mut touched = Vec::new();
    if !shim::any() {
        return touched;
    }
    crate::stat::write_now(true);
    for (fd, s) in shim::all() {
        if let Some(ep) = s.existing() {
            ep.flush(Duration::from_secs(1));
            if crate::sys::fd_flags(fd).is_some_and(|f| f & libc::FD_CLOEXEC == 0) {
                restore_kernel_socket(fd, s.nonblock());
                s.restore_rx_opts(fd, true);
                touched.push((fd, s.nonblock()));
            }
        }
    }
    touched
}

/// exec failed: the sockets stay on the engine.
fn after_failed_exec(touched: Vec<(c_int, bool)>) {
    for (fd, _) in touched {
        sockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1);
        if let Some(s) = lookup(fd) {
            s.reforce_rx_opts(fd);
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    guard(-1, "execve", Retry::Yes, || {
        // SAFETY: the caller passes `execve`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let t = before_exec();
            let r = real::execve(path, argv, envp);
            let e = errno();
            after_failed_exec(t);
            set_errno(e);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn execv(path: *const c_char, argv: *const *const c_char) -> c_int {
    guard(-1, "execv", Retry::Yes, || {
        // SAFETY: the caller passes `execv`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let t = before_exec();
            let r = real::execv(path, argv);
            let e = errno();
            after_failed_exec(t);
            set_errno(e);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn execvp(file: *const c_char, argv: *const *const c_char) -> c_int {
    guard(-1, "execvp", Retry::Yes, || {
        // SAFETY: the caller passes `execvp`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let t = before_exec();
            let r = real::execvp(file, argv);
            let e = errno();
            after_failed_exec(t);
            set_errno(e);
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int {
    guard(-1, "execvpe", Retry::Yes, || {
        // SAFETY: the caller passes `execvpe`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            let t = before_exec();
            let r = real::execvpe(file, argv, envp);
            let e = errno();
            after_failed_exec(t);
            set_errno(e);
            r
        }
    })
}

// execl, execlp and execle are variadic, and glibc's versions call its
// internal execve, bypassing the hook above. Stable Rust cannot define a
// C-variadic function, so these take 32 pointer arguments: on x86-64 and
// AArch64 Linux a variadic call passes its pointer arguments exactly where
// these parameters are read from (registers, then the caller's stack), and
// only the slots up to the terminating NULL (and execle's envp after it)
// are used. A list longer than 30 arguments fails with E2BIG.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod exec_list {
    use super::*;

    /// The argument vector up to and including its NULL, and the slot after.
    fn argv(slots: &[*const c_char]) -> Option<(Vec<*const c_char>, *const c_char)> {
        let end = slots.iter().position(|p| p.is_null())?;
        Some((slots[..=end].to_vec(), slots.get(end + 1).copied().unwrap_or(std::ptr::null())))
    }

    #[no_mangle]
    pub unsafe extern "C" fn execl(
        path: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        guard(-1, "execl", Retry::Yes, || {
            // SAFETY: the caller passes `execl`'s arguments under its C contract
            // (pointers valid for the stated lengths, for this call); they go to
            // libc unchanged or are read and written within those bounds.
            unsafe {
                match argv(&[
                    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
                    a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
                ]) {
                    Some((v, _)) => execv(path, v.as_ptr()),
                    None => fail::<c_int>(libc::E2BIG),
                }
            }
        })
    }

    #[no_mangle]
    pub unsafe extern "C" fn execlp(
        file: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        guard(-1, "execlp", Retry::Yes, || {
            // SAFETY: the caller passes `execlp`'s arguments under its C contract
            // (pointers valid for the stated lengths, for this call); they go to
            // libc unchanged or are read and written within those bounds.
            unsafe {
                match argv(&[
                    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
                    a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
                ]) {
                    Some((v, _)) => execvp(file, v.as_ptr()),
                    None => fail::<c_int>(libc::E2BIG),
                }
            }
        })
    }

    #[no_mangle]
    pub unsafe extern "C" fn execle(
        path: *const c_char,
        a0: *const c_char,
        a1: *const c_char,
        a2: *const c_char,
        a3: *const c_char,
        a4: *const c_char,
        a5: *const c_char,
        a6: *const c_char,
        a7: *const c_char,
        a8: *const c_char,
        a9: *const c_char,
        a10: *const c_char,
        a11: *const c_char,
        a12: *const c_char,
        a13: *const c_char,
        a14: *const c_char,
        a15: *const c_char,
        a16: *const c_char,
        a17: *const c_char,
        a18: *const c_char,
        a19: *const c_char,
        a20: *const c_char,
        a21: *const c_char,
        a22: *const c_char,
        a23: *const c_char,
        a24: *const c_char,
        a25: *const c_char,
        a26: *const c_char,
        a27: *const c_char,
        a28: *const c_char,
        a29: *const c_char,
        a30: *const c_char,
        a31: *const c_char,
    ) -> c_int {
        guard(-1, "execle", Retry::Yes, || {
            // SAFETY: the caller passes `execle`'s arguments under its C contract
            // (pointers valid for the stated lengths, for this call); they go to
            // libc unchanged or are read and written within those bounds.
            unsafe {
                match argv(&[
                    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20, a21,
                    a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
                ]) {
                    Some((v, envp)) if v.len() < 32 => execve(path, v.as_ptr(), envp as *const *const c_char),
                    _ => fail::<c_int>(libc::E2BIG),
                }
            }
        })
    }
}

#[no_mangle]
pub unsafe extern "C" fn sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int {
    guard(-1, "sigaction", Retry::Yes, || {
        // SAFETY: the caller passes `sigaction`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            if crate::signals::owned(sig) {
                // The shim's flush-first handler stands for the default
                // action: the program sees, and may set, the default.
                let replaced = !act.is_null() && (*act).sa_sigaction != libc::SIG_DFL;
                let r = crate::sys::sigrelay::sigaction(sig, if replaced { act } else { std::ptr::null() }, old);
                if r == 0 && !old.is_null() && (*old).sa_sigaction == crate::sys::sigflush::handler() {
                    (*old).sa_sigaction = libc::SIG_DFL;
                    (*old).sa_flags = 0;
                    libc::sigemptyset(&mut (*old).sa_mask);
                }
                if r == 0 && replaced {
                    crate::signals::released(sig);
                    crate::signals::record(sig, (*act).sa_sigaction, (*act).sa_flags);
                }
                return r;
            }
            let r = crate::sys::sigrelay::sigaction(sig, act, old);
            if r == 0 && !act.is_null() {
                crate::signals::record(sig, (*act).sa_sigaction, (*act).sa_flags);
            }
            r
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    guard(-1, "signal", Retry::Yes, || {
        if crate::signals::owned(sig) {
            // As in `sigaction`: the shim's handler reads as the default.
            if handler == libc::SIG_DFL {
                return libc::SIG_DFL;
            }
            crate::signals::released(sig);
            let r = crate::sys::sigrelay::signal(sig, handler);
            if r == libc::SIG_ERR {
                return r;
            }
            crate::signals::record(sig, handler, libc::SA_RESTART);
            return if r == crate::sys::sigflush::handler() { libc::SIG_DFL } else { r };
        }
        // Through the shim's sigaction, so the relay stands for the handler
        // (glibc's signal() would go around it).
        let r = crate::sys::sigrelay::signal(sig, handler);
        if r != libc::SIG_ERR {
            // glibc's signal() has BSD semantics: handlers restart calls.
            crate::signals::record(sig, handler, libc::SA_RESTART);
        }
        r
    })
}

fn flush_all(t: Duration) {
    if shim::any() {
        for (_, s) in shim::all() {
            if let Some(ep) = s.existing() {
                ep.flush(t);
            }
        }
    }
    if shim::tcp_transport() {
        // Flushed endpoints, and endpoints already closed (a program that
        // sends, closes its socket and exits: logger), may leave datagrams
        // in the transport's lanes, waiting for a connection.
        eudp_engine::backend::tcp::TcpTransport::wait_global_sent(t);
    }
}

/// Under `eudp trace` (`EUDP_TRACE`): at exit, the trace is written with
/// every socket's pending TX stamps, also for a program that never closes
/// its sockets (an endpoint's close writes it otherwise).
fn trace_at_exit() {
    if !eudp_engine::tracepoint::on() {
        return;
    }
    if shim::any() {
        for (_, s) in shim::all() {
            if let Some(ep) = s.existing() {
                ep.drain_trace();
            }
        }
    }
    if let Err(e) = eudp_engine::tracepoint::finish() {
        eudp_engine::log::write(
            eudp_engine::log::Level::Error,
            format_args!("trace: cannot write the trace at exit: {e}"),
        );
    }
}

/// `_exit` skips atexit handlers, but a kernel socket would already hold
/// what the program sent: flush the queues first.
#[no_mangle]
pub unsafe extern "C" fn _exit(code: c_int) -> ! {
    // SAFETY: the caller passes `_exit`'s arguments under its C contract
    // (pointers valid for the stated lengths, for this call); they go to
    // libc unchanged or are read and written within those bounds.
    unsafe {
        guard(-1, "_exit", Retry::No, || {
            flush_all(Duration::from_secs(2));
            trace_at_exit();
        });
        libc::syscall(libc::SYS_exit_group, code);
        loop {
            std::hint::spin_loop();
        }
    }
}

#[no_mangle]
pub unsafe extern "C" fn _Exit(code: c_int) -> ! {
    // SAFETY: the caller passes `_Exit`'s arguments under its C contract
    // (pointers valid for the stated lengths, for this call); they go to
    // libc unchanged or are read and written within those bounds.
    unsafe { _exit(code) }
}

/// `vfork` runs as `fork`, which POSIX allows: a vfork child shares the
/// parent's memory and runs no fork handlers, so the shim's hooks it calls
/// before exec (`close_range`, `close`, `dup2` in Python's subprocess)
/// would tear down the parent's sockets. As a fork child it has its own
/// copy of the shim's state, and the fork handlers apply `vfork`'s policy
/// (`shim::fork_prepare`: sockets closed at exec stay on the engine in the
/// parent). `vfork` cannot be wrapped (the child would return through the
/// wrapper's frame the parent then reuses); glibc's `fork` is called
/// instead. `posix_spawn` and `system` are not affected: glibc's child
/// there calls its internal functions, which no preloaded library
/// interposes, and never reaches the shim.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    guard(-1, "vfork", Retry::Yes, || {
        // SAFETY: the caller passes `vfork`'s arguments under its C contract
        // (pointers valid for the stated lengths, for this call); they go to
        // libc unchanged or are read and written within those bounds.
        unsafe {
            shim::vforking(true);
            // SAFETY: glibc's fork; the child returns through its own copy of
            // this frame.
            let pid = libc::fork();
            shim::vforking(false);
            pid
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn __vfork() -> libc::pid_t {
    // SAFETY: the caller passes `__vfork`'s arguments under its C contract
    // (pointers valid for the stated lengths, for this call); they go to
    // libc unchanged or are read and written within those bounds.
    unsafe { vfork() }
}

extern "C" fn on_prepare() {
    shim::fork_prepare();
}
extern "C" fn on_parent() {
    shim::fork_parent();
}
extern "C" fn on_child() {
    shim::fork_child();
}

/// At exit: what is queued goes out (the kernel would have sent it), and
/// the final counters are written.
extern "C" fn on_exit() {
    flush_all(Duration::from_secs(2));
    trace_at_exit();
    crate::stat::write_now(true);
}

/// Before a deadly signal the program left at its default action ends the
/// process (`crate::signals`): as at exit, bounded within the handler's wait.
fn on_deadly_signal() {
    flush_all(Duration::from_secs(2));
    trace_at_exit();
    crate::stat::write_now(true);
}

extern "C" fn init() {
    // SAFETY: registering plain extern "C" functions with libc.
    unsafe {
        libc::pthread_atfork(Some(on_prepare), Some(on_parent), Some(on_child));
        libc::atexit(on_exit);
    }
    // Both cost an RCU grace period once the process has a second thread
    // and almost nothing before: done here, the first socket's adoption
    // (inside its bind, first send or receive) does not pay that wait.
    // Under either transport (docs/preload.md, "The fast start under the
    // tcp transport too").
    crate::borrow::init();
    crate::fdspace::pregrow();
    // A panic of the shim or of its threads is contained and logged by
    // eudp (`guard`, `eudp_engine::failure`): std's printing is not for
    // the program's stderr.
    eudp_engine::failure::install_quiet_hook();
    eudp_engine::failure::set_handler(shim::engine_failed);
    crate::signals::set_flush(on_deadly_signal);
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;
