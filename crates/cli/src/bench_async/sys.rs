//! The benchmark's one raw call: moving a thread into a network namespace.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Moves the calling thread (only it) into the named network namespace
/// (`/run/netns/NAME`, as `ip netns` makes them); sockets it creates
/// afterwards belong to that namespace.
pub fn enter_netns(name: &str) -> io::Result<()> {
    let f = File::open(format!("/run/netns/{name}"))?;
    // SAFETY: setns(2) takes a descriptor that `f` keeps open for the call
    // and changes only the calling thread's network namespace.
    let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}
