//! The command's few raw calls.
#![allow(unsafe_code)]

use std::process::Child;

/// Sends SIGINT to a child this process spawned, so that it ends the way
/// a user's Ctrl-C ends it (a server writes its final report).
pub fn interrupt(child: &Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) has no memory effects; `child` is ours and not yet
    // reaped (the `Child` is alive), so its pid names that process.
    unsafe {
        libc::kill(pid, libc::SIGINT);
    }
}

/// Sends `sig` to process `pid`; false when there is no such process.
/// Callers pass the pid of a child they spawned and have not reaped, so the
/// pid still names that child.
pub fn signal(pid: u32, sig: i32) -> bool {
    // SAFETY: kill(2) has no memory effects; a wrong pid could only signal
    // another process, which the callers rule out (see above).
    unsafe { libc::kill(pid as libc::pid_t, sig) == 0 }
}
