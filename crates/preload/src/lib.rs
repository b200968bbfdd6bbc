//! `libeudp_preload.so`: runs unmodified UDP programs on the eudp engine.
//!
//! Loaded with `LD_PRELOAD` (`eudp run -- PROGRAM …` does it), the library
//! interposes the sockets API. An application UDP socket (AF_INET/AF_INET6,
//! SOCK_DGRAM, protocol 0 or UDP) stays a real kernel socket whose fd the
//! program keeps; on its first I/O the shim adopts a duplicate of it as an
//! engine [`eudp_engine::Endpoint`], and from then on sends go through the
//! two-level queue and receives come from the engine's ring. Every other
//! descriptor goes straight to libc. Anything the engine cannot honour
//! moves that socket to the plain kernel path (counted, logged with
//! `EUDP_LOG=debug`). See `docs/preload.md`.
//!
//! Modules, each using only those below it: [`hooks`] (the interposed C
//! functions, by call family) over [`shim`] (socket table and per-socket
//! state), which uses [`borrow`] (lock-free use of a socket's endpoint
//! within one call), [`stat`] (the per-process report), [`ringdup`] (epoll
//! duplicates of a ring's eventfd), [`signals`], [`ktrace`] (a program's
//! kernel path traced for `eudp trace`), [`sys`] (raw calls on kernel
//! sockets, and below it the raw side of the modules here, by job),
//! [`fdspace`] (the shim's and the engine's own descriptors, kept above
//! the program's; its rlimit hooks are in `hooks`), [`log`] and [`real`]
//! (libc's own functions, via `dlsym(RTLD_NEXT)`).
//!
//! `unsafe` lives only where raw calls and raw pointers are the job: the
//! hook entry points in `hooks` and the program's pointers they decode
//! (`hooks::args`), [`real`], and [`sys`], the raw layer by job: socket
//! options and waits in `sys` itself, descriptor numbers and rlimits
//! (`sys::fdspace`), the kernel path's stamped receives (`sys::timestamp`),
//! the hazard-slot dereference and `membarrier` (`sys::hazard`), the locks
//! held across fork (`sys::fork_lock`) and the engine leaked per process
//! generation (`sys::leaked`). Everything above them ([`fdspace`],
//! [`ktrace`], [`borrow`], [`shim`], ...) is safe Rust. Every `unsafe`
//! block says why it is sound.

#![deny(unsafe_op_in_unsafe_fn)]

pub mod borrow;
pub mod fdspace;
pub mod hooks;
pub mod ktrace;
pub mod log;
pub mod real;
pub mod ringdup;
pub mod shim;
pub mod signals;
pub mod startup;
pub mod stat;
pub mod sys;
