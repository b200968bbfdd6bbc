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

/// Moves the calling thread into the network namespace `name` (as `ip
/// netns` names it, `/run/netns/NAME`): sockets it opens from then on live
/// there. Other threads stay where they are.
pub fn enter_netns(name: &str) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(format!("/run/netns/{name}"))?;
    // SAFETY: setns(2) takes a descriptor we hold open for the call and a
    // namespace type; it changes only this thread's namespace and touches
    // no memory of ours.
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}
