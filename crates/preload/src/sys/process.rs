//! The process and the calling thread, as the kernel names them.

/// This process's id.
pub fn getpid() -> libc::pid_t {
    // SAFETY: getpid has no preconditions.
    unsafe { libc::getpid() }
}

/// The calling thread's name (at most 15 bytes, NUL-padded), if it can be read.
pub fn thread_name() -> Option<[u8; 16]> {
    let mut name = [0u8; 16];
    // SAFETY: the calling thread's handle and a live buffer of its length.
    let r =
        unsafe { libc::pthread_getname_np(libc::pthread_self(), name.as_mut_ptr() as *mut libc::c_char, name.len()) };
    (r == 0).then_some(name)
}
