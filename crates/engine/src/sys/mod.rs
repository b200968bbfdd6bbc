//! The engine's floor: its system calls that belong to no one transport.
//!
//! Contract: this module and the transports' own raw layers — the kernel
//! UDP socket's calls in `backend/kernel/sys.rs`, `backend/xdp/sys.rs` and
//! `backend/tcp/sys.rs` — are the only places of the crate allowed
//! `unsafe` (`#[allow(unsafe_code)]` per module; the crate denies it).
//! Everything above them is safe Rust over the types and functions here.
//!
//! Safety policy: each `unsafe` block calls one libc function (or one CPU
//! instruction) with pointers derived from live Rust borrows for the
//! duration of the call, adopts a descriptor the kernel just returned into
//! an `OwnedFd` nobody else owns, or reads a kernel-initialised structure
//! after the call reported success. No pointer outlives its call, except
//! the caller's buffer [`user_buffer::UserBuffer`] holds under the contract
//! of its `unsafe` constructor. Each block carries a `// SAFETY:` note
//! saying which of these holds.
//!
//! One file per job:
//! * [`addr`] — [`addr::RawAddr`] (a socket address as the kernel takes it)
//!   and the dual-stack forms [`addr::to_family`] / [`addr::unmap`].
//! * [`cache`] — the cache hint of the tracer's event buffers.
//! * [`clock`] — the time-stamp counter, the trace and timestamp clocks,
//!   thread and process CPU time.
//! * [`epoll`] — [`epoll::Epoll`], the one epoll wrapper (engine thread,
//!   `xdp` backend, `tcp` manager), with sub-millisecond waits.
//! * [`error_flag`] — [`error_flag::ErrorFlag`], a descriptor that polls as
//!   an error.
//! * [`fdevents`] — [`fdevents::EventFd`] and [`fdevents::TimerFd`].
//! * [`io_uring`] — the io_uring ring that reads kernel TX timestamps.
//! * [`nt_copy`] — the copy block's non-temporal stores.
//! * [`poll`] — one-shot readiness waits ([`poll::poll_readable`],
//!   [`poll::poll_writable`], [`poll::has_data`], ...).
//! * [`process`] — signal masks, CPU pinning, the open-file limit.
//! * [`sockopt`] — integer socket options on any descriptor.
//! * [`sync`] — the poison-tolerant mutex lock.
//! * [`timestamp`] — `SO_TIMESTAMPING` and its error-queue reads.
//! * [`uring`] — the raw io_uring under [`io_uring`] and [`uring_recv`]:
//!   setup, the ring mappings, queueing, `io_uring_enter`.
//! * [`uring_recv`] — multishot `recvmsg` into a provided-buffer ring.
//! * [`uring_send`] — io_uring `SEND_ZC` / `SENDMSG_ZC` from registered buffers.
//! * [`user_buffer`] — [`user_buffer::UserBuffer`], caller memory an EMP
//!   receive writes into by address (the C ABI).
//! * [`zerocopy`] — `MSG_ZEROCOPY` sends and their notifications.
//!
//! [`cvt`] turns a C-style return value (negative: failed, `errno` set)
//! into an `io::Result`; every raw layer of the crate uses it.

#![allow(unsafe_code)] // The documented home of the engine's raw syscalls (see above).

pub mod addr;
pub mod cache;
pub mod clock;
pub mod epoll;
pub mod error_flag;
pub mod fdevents;
pub mod io_uring;
pub mod nt_copy;
pub mod poll;
pub mod process;
pub mod sockopt;
pub mod sync;
pub mod timestamp;
pub mod uring;
pub mod uring_recv;
pub mod uring_send;
pub mod user_buffer;
pub mod zerocopy;

use std::io;

/// `Err(last_os_error)` for a negative return value, else the value.
pub(crate) fn cvt<T: Copy + PartialOrd + Default>(r: T) -> io::Result<T> {
    if r < T::default() {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}
