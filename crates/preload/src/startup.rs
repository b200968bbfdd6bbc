//! The start-up line: once per program image, when the shim starts its
//! engine (the first socket it takes over), one line on stderr (or
//! `EUDP_LOG_FILE`) saying which version, transport and profile the program
//! runs on, and what fell back and why:
//!
//! ```text
//! eudp 0.1.0: transport xdp unavailable (AF_XDP on veth0: ...): kernel transport; profile latency
//! ```
//!
//! A fork child shares its parent's program image and says nothing; a
//! program started by exec (which inherits `LD_PRELOAD`) says its own line.
//! `EUDP_QUIET=1` (`eudp run --quiet`) silences it.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// True when `EUDP_QUIET` asks for no start-up line.
pub fn quiet() -> bool {
    std::env::var("EUDP_QUIET").ok().and_then(|v| eudp_engine::settings::parse_flag(&v)).unwrap_or(false)
}

/// The transport this process runs on, and why not the one asked for.
pub fn transport() -> String {
    let asked = eudp_engine::backend::tcp::transport_from_env();
    if asked != "xdp" {
        return asked.to_string();
    }
    match eudp_engine::backend::xdp::XdpTransport::global() {
        Ok(t) => format!("xdp on {}", t.ifname()),
        Err(e) => format!("xdp unavailable ({e}): kernel transport"),
    }
}

/// The profile `eudp run` applied, if any.
pub fn profile() -> Option<String> {
    std::env::var("EUDP_PROFILE").ok().filter(|p| !p.is_empty())
}

/// The start-up line of this process.
pub fn line() -> String {
    let mut s = format!("eudp {}: transport {}", env!("CARGO_PKG_VERSION"), transport());
    if let Some(p) = profile() {
        s += &format!("; profile {p}");
    }
    s
}

/// Warns once about each `EUDP_*` variable of the environment that is
/// misspelt or has a bad value (also those no configuration parses, such
/// as the shim's own).
pub fn warn_settings() {
    use eudp_engine::settings::{validate, Problem};
    for p in validate(eudp_engine::settings::env_vars(), &[]) {
        match &p {
            Problem::Bad(e) => eudp_engine::log::report_ignored(std::slice::from_ref(e)),
            Problem::Unknown { var, .. } => eudp_engine::log::warn_once(var, format_args!("{p}; ignored")),
        }
    }
}

/// Writes the start-up line once per program image unless quiet, after
/// the warnings about the settings.
pub fn announce() {
    // Claimed before the work, not a `Once`: a fork child of a parent in
    // the middle of it must not wait for a completion that never comes.
    static SAID: AtomicBool = AtomicBool::new(false);
    if SAID.swap(true, Relaxed) {
        return;
    }
    warn_settings();
    if !quiet() {
        eudp_engine::log::write_line(&format!("{}\n", line()));
    }
}
