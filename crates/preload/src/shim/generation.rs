//! The engine of this process generation, the transport it runs, and what
//! a forked child keeps.

use super::sock::lock;
use crate::sys::leaked::Leaked;
use eudp_engine::{Config, Engine};
use std::io;
use std::sync::atomic::{AtomicU32, Ordering::*};
use std::sync::Mutex;

/// Incremented in every fork child: endpoints of an older generation
/// belong to an engine thread that does not exist in this process.
pub(super) static GEN: AtomicU32 = AtomicU32::new(0);
static ENGINE: Leaked<Engine> = Leaked::new();
static ENGINE_GEN: AtomicU32 = AtomicU32::new(u32::MAX);
pub(super) static ENGINE_INIT: Mutex<()> = Mutex::new(());

pub fn generation() -> u32 {
    GEN.load(SeqCst)
}

/// The engine of this process if it runs already (never starts one).
pub fn running_engine() -> Option<&'static Engine> {
    if ENGINE_GEN.load(SeqCst) != generation() {
        return None;
    }
    ENGINE.get()
}

/// The engine of this process (started on first use, again in a fork child).
pub fn engine() -> io::Result<&'static Engine> {
    let g = generation();
    if ENGINE_GEN.load(SeqCst) == g {
        if let Some(e) = ENGINE.get() {
            return Ok(e);
        }
    }
    let _l = lock(&ENGINE_INIT);
    if ENGINE_GEN.load(SeqCst) == g {
        if let Some(e) = ENGINE.get() {
            return Ok(e);
        }
    }
    // Bad values are logged once and leave their defaults.
    let cfg = Config::from_env().unwrap_or_default();
    let e = ENGINE.put(Engine::start(cfg)?);
    ENGINE_GEN.store(g, SeqCst);
    drop(_l);
    crate::startup::announce();
    crate::signals::arm();
    Ok(e)
}

/// `EUDP_SOCK_RCVBUF`: kernel receive buffer of adopted sockets, in bytes.
pub(super) fn sock_rcvbuf() -> Option<i32> {
    std::env::var("EUDP_SOCK_RCVBUF").ok().and_then(|v| v.trim().parse().ok()).filter(|&b: &i32| b > 0)
}

/// `EUDP_TRANSPORT=tcp`: endpoints use the engine's TCP (UOE) backend.
/// The application's kernel socket then never becomes readable: sockets
/// are adopted as soon as they are waited on, and readiness includes the
/// backend's descriptor.
pub fn tcp_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() == "tcp"
}

/// `EUDP_TRANSPORT=xdp`: IPv4 endpoints use the engine's AF_XDP backend.
/// The program's kernel socket then gets only what the fast path does not
/// carry (see the engine's `backend::xdp`), so readiness includes the
/// backend's descriptor, as under the TCP transport.
pub fn xdp_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() == "xdp"
}

/// A transport whose datagrams do not reach the program's kernel socket
/// (`tcp` or `xdp`): sockets are adopted at bind and readiness includes the
/// backend's descriptor.
pub fn bypass_transport() -> bool {
    eudp_engine::backend::tcp::transport_from_env() != "kernel"
}

/// Fallback reasons of a socket shared with a fork child: `fallback`
/// recognises them (GRO must go off at once, the child may read).
pub(super) const FORK_REASON: &str =
    "fork(): socket shared with the child (EUDP_FORK_KEEP=1 keeps the parent accelerated)";
pub(super) const VFORK_REASON: &str =
    "vfork(): socket inherited by the program the child executes (EUDP_FORK_KEEP=1 keeps the parent accelerated)";

pub(super) fn fork_keep() -> bool {
    std::env::var("EUDP_FORK_KEEP").map(|v| v == "1").unwrap_or(false)
}
