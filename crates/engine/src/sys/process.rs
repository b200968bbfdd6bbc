//! Process and thread settings: signal masks, CPU pinning, the open-file
//! limit.

use super::cvt;
use std::io;
use std::mem::{size_of, zeroed};

/// The asynchronous signals ([`async_signals`]) blocked in this thread
/// until dropped, when the mask they replaced is back (and a signal that
/// came meanwhile is taken). A wait that spun in user space holds them
/// from its last look to its sleep: a handler that ran between that look
/// and the sleep would leave nothing for the sleep to fail with `EINTR`
/// for; blocked, the signal stays pending until that sleep
/// ([`super::poll::poll_readable_or_shut_masked`] with
/// [`AsyncSignalsBlocked::mask_before`]) or the drop.
pub struct AsyncSignalsBlocked {
    old: libc::sigset_t,
}

impl AsyncSignalsBlocked {
    pub fn new() -> Self {
        let set = async_signals();
        // SAFETY: sigset_t is plain data, filled in by the call below.
        let mut old: libc::sigset_t = unsafe { zeroed() };
        // SAFETY: valid set and out pointer.
        unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old) };
        AsyncSignalsBlocked { old }
    }

    /// The thread's mask before [`AsyncSignalsBlocked::new`].
    pub fn mask_before(&self) -> &libc::sigset_t {
        &self.old
    }
}

impl Default for AsyncSignalsBlocked {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: the mask saved by `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.old, std::ptr::null_mut()) };
    }
}

thread_local! {
    /// Handlers without `SA_RESTART` that ran on this thread
    /// ([`note_interrupt`]).
    static INTERRUPTS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Counts, for the calling thread, one run of a signal handler that would
/// have failed a blocked system call with `EINTR` (one installed without
/// `SA_RESTART`). Called from a signal handler: it only bumps a
/// thread-local counter (no allocation, no lock, no destructor).
pub fn note_interrupt() {
    INTERRUPTS.with(|n| n.set(n.get().wrapping_add(1)));
}

/// The calling thread's count of [`note_interrupt`]s. A receive that waits
/// by spinning in user space, with signals unblocked, compares it between
/// its looks: a change means a handler without `SA_RESTART` ran on this
/// thread during the wait, which must then fail with `EINTR` as a kernel
/// wait would — one thread-local read per look instead of holding the
/// signals blocked (two `rt_sigprocmask` per call).
pub fn interrupts() -> u32 {
    INTERRUPTS.with(|n| n.get())
}

/// Writes `buf` to standard error, with `write(2)` calls of its own and no
/// lock: std's `Stderr` lock may be held in a fork child, by a thread of
/// the parent that does not exist there, for good. Bytes the descriptor
/// refuses (closed, full pipe of a non-blocking stderr) are given up.
pub fn write_stderr(mut buf: &[u8]) {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for reads of its length during the call.
        let n = unsafe { libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), buf.len()) };
        match n {
            n if n > 0 => buf = &buf[(n as usize).min(buf.len())..],
            n if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

/// Raises the soft limit on open files towards `want` (bounded by the hard
/// limit); returns the new soft limit. Servers with many sockets need this.
pub fn raise_fd_limit(want: u64) -> io::Result<u64> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: pointer to a live rlimit.
    cvt(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) })?;
    if r.rlim_cur < want {
        r.rlim_cur = want.min(r.rlim_max);
        // SAFETY: pointer to a live rlimit.
        cvt(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) })?;
    }
    Ok(r.rlim_cur)
}

/// Every signal but the synchronous ones a fault raises on the faulting
/// thread (SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS) and SIGABRT.
pub fn async_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset/sigdelset only write it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sig in [libc::SIGSEGV, libc::SIGBUS, libc::SIGFPE, libc::SIGILL, libc::SIGTRAP, libc::SIGSYS, libc::SIGABRT]
        {
            libc::sigdelset(&mut set, sig);
        }
        set
    }
}

/// Blocks [`async_signals`] in the calling thread, for eudp's own threads:
/// a signal sent to the process is then taken by one of the program's
/// threads, as it would be without eudp, and a program's handler never
/// runs on an engine thread in the middle of its work.
pub fn block_async_signals() {
    let set = async_signals();
    // SAFETY: valid set; the old mask is not asked for.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// Pins the calling thread to one CPU.
pub fn pin_current_thread(cpu: usize) -> io::Result<()> {
    // SAFETY: cpu_set_t is plain data; CPU_SET writes within it; the syscall
    // reads it for the duration of the call.
    unsafe {
        let mut set: libc::cpu_set_t = zeroed();
        libc::CPU_SET(cpu, &mut set);
        cvt(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set)).map(drop)
    }
}
