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
//! Modules: [`real`] (libc's own functions, via `dlsym(RTLD_NEXT)`),
//! [`borrow`] (lock-free use of a socket's endpoint within one call),
//! [`hooks`] (the interposed C functions: all pointer handling), [`shim`]
//! (socket table and per-socket state), [`fdspace`] (the shim's and the
//! engine's own descriptors, kept above the program's), [`signals`],
//! [`stat`], [`ktrace`] (a program's kernel path traced for `eudp trace`).

#![deny(unsafe_op_in_unsafe_fn)]

pub mod borrow;
pub mod fdspace;
pub mod hooks;
pub mod ktrace;
pub mod real;
pub mod shim;
pub mod signals;
pub mod startup;
pub mod stat;
