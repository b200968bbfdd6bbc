//! The C library's own implementations of the functions the shim
//! interposes, reached with `dlsym(RTLD_NEXT, …)` and cached.
//!
//! Safety: every function here is the libc function of the same name with
//! the same C signature; callers must uphold that function's contract
//! (valid pointers and lengths). Resolution happens once per function; a
//! missing symbol aborts with a message, since no fallback can be correct.

#![allow(clippy::missing_safety_doc)]

use libc::{c_char, c_int, c_uint, c_ulong, c_void, size_t, ssize_t};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

fn resolve(name: &'static [u8]) -> usize {
    // SAFETY: name is a NUL-terminated byte string; dlsym is thread-safe.
    let p = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr() as *const c_char) };
    if p.is_null() {
        let msg = b"eudp-preload: cannot resolve a libc function\n";
        // SAFETY: writes a static buffer to stderr, then aborts.
        unsafe {
            libc::syscall(libc::SYS_write, 2, msg.as_ptr(), msg.len());
            libc::abort();
        }
    }
    p as usize
}

macro_rules! real {
    ($($name:ident ( $($a:ident : $t:ty),* ) -> $r:ty;)*) => {
        $(
            #[allow(non_snake_case)]
            pub unsafe fn $name($($a: $t),*) -> $r {
                static P: AtomicUsize = AtomicUsize::new(0);
                let mut p = P.load(Relaxed);
                if p == 0 {
                    p = resolve(concat!(stringify!($name), "\0").as_bytes());
                    P.store(p, Relaxed);
                }
                // SAFETY: p is the address of the libc function of this name,
                // whose C signature is the one declared here.
                let f: unsafe extern "C" fn($($t),*) -> $r = unsafe { std::mem::transmute(p) };
                // SAFETY: the caller upholds the C function's contract.
                unsafe { f($($a),*) }
            }
        )*
    };
}

real! {
    socket(domain: c_int, ty: c_int, proto: c_int) -> c_int;
    close(fd: c_int) -> c_int;
    connect(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    bind(fd: c_int, addr: *const libc::sockaddr, len: libc::socklen_t) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    send(fd: c_int, buf: *const c_void, len: size_t, flags: c_int) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, len: size_t, flags: c_int, addr: *const libc::sockaddr, alen: libc::socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const libc::msghdr, flags: c_int) -> ssize_t;
    sendmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int) -> c_int;
    recv(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, len: size_t, flags: c_int, addr: *mut libc::sockaddr, alen: *mut libc::socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut libc::msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut libc::mmsghdr, vlen: c_uint, flags: c_int, timeout: *mut libc::timespec) -> c_int;
    read(fd: c_int, buf: *mut c_void, len: size_t) -> ssize_t;
    write(fd: c_int, buf: *const c_void, len: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t;
    __read_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t) -> ssize_t;
    __recv_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, len: size_t, buflen: size_t, flags: c_int, addr: *mut libc::sockaddr, alen: *mut libc::socklen_t) -> ssize_t;
    fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int;
    ioctl(fd: c_int, req: c_ulong, arg: *mut c_void) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: libc::socklen_t) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut libc::socklen_t) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(fd: c_int, to: c_int) -> c_int;
    dup3(fd: c_int, to: c_int, flags: c_int) -> c_int;
    close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    closefrom(first: c_int) -> ();
    poll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int;
    nanosleep(req: *const libc::timespec, rem: *mut libc::timespec) -> c_int;
    clock_nanosleep(clock: libc::clockid_t, flags: c_int, req: *const libc::timespec, rem: *mut libc::timespec) -> c_int;
    usleep(usec: libc::useconds_t) -> c_int;
    ppoll(fds: *mut libc::pollfd, n: libc::nfds_t, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    select(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *mut libc::timeval) -> c_int;
    pselect(n: c_int, r: *mut libc::fd_set, w: *mut libc::fd_set, e: *mut libc::fd_set, t: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, ev: *mut libc::epoll_event) -> c_int;
    epoll_wait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, timeout: c_int, mask: *const libc::sigset_t) -> c_int;
    epoll_pwait2(epfd: c_int, evs: *mut libc::epoll_event, max: c_int, ts: *const libc::timespec, mask: *const libc::sigset_t) -> c_int;
    execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    execv(path: *const c_char, argv: *const *const c_char) -> c_int;
    execvp(file: *const c_char, argv: *const *const c_char) -> c_int;
    execvpe(file: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    syscall(n: libc::c_long, a: libc::c_long, b: libc::c_long, c: libc::c_long, d: libc::c_long, e: libc::c_long, f: libc::c_long) -> libc::c_long;
    sigaction(sig: c_int, act: *const libc::sigaction, old: *mut libc::sigaction) -> c_int;
    signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t;
    getrlimit(res: c_int, rl: *mut libc::rlimit) -> c_int;
    setrlimit(res: c_int, rl: *const libc::rlimit) -> c_int;
    prlimit64(pid: libc::pid_t, res: c_int, new: *const libc::rlimit64, old: *mut libc::rlimit64) -> c_int;
    getdtablesize() -> c_int;
    socketpair(domain: c_int, ty: c_int, proto: c_int, sv: *mut c_int) -> c_int;
    accept(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut libc::sockaddr, len: *mut libc::socklen_t, flags: c_int) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    eventfd(initval: c_uint, flags: c_int) -> c_int;
    pipe(fds: *mut c_int) -> c_int;
    pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    open(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    open64(path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    openat(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    openat64(dirfd: c_int, path: *const c_char, flags: c_int, mode: libc::mode_t) -> c_int;
    sysconf(name: c_int) -> libc::c_long;
}
