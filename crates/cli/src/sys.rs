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
