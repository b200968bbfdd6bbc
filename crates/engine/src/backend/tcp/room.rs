//! [`Room`]: a socket's "writable" descriptor, shut by a lane that refused
//! one of its sends and opened by the lane's drain. Shared by the socket
//! (which polls it) and the manager's lanes (which shut and open it).

use super::sys;
use crate::sys::fdevents::EventFd;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::AtomicUsize;

/// A socket's [`crate::backend::Backend::writable_fd`]: an eventfd that polls writable
/// except while a send of this socket was refused by a full connected lane
/// that has not drained since to the room the send wanted. A refusal
/// shuts it and enrolls it with the lane under the lane's lock; every
/// drain of the lane (the manager's `EPOLLOUT` flush, another sender's
/// flush, the connection's end) opens it under the same lock once the
/// room is there (`Mgr::open_rooms`), so a refusal can never miss the
/// room that follows it. It may open early (another lane this socket
/// waited on drained): the next send is then refused and shuts it again.
#[derive(Debug)]
pub(super) struct Room {
    fd: EventFd,
    /// Bytes of room the last send refused by a full lane wanted
    /// (`wait_writable` waits for that much).
    pub(super) need: AtomicUsize,
}

impl Room {
    pub(super) fn new() -> io::Result<Room> {
        Ok(Room { fd: EventFd::new()?, need: AtomicUsize::new(0) })
    }

    /// Stops polling writable: the counter at its largest value. Already
    /// shut, the write is refused and nothing changes.
    pub(super) fn shut(&self) {
        sys::eventfd_add(self.fd.as_raw_fd(), u64::MAX - 1);
    }

    /// Polls writable again (the counter back to 0).
    pub(super) fn open(&self) {
        self.fd.clear();
    }

    /// The descriptor that polls writable while the room is open.
    pub(super) fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
