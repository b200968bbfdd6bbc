//! `EUDP_LOG=debug` logging.

use std::sync::atomic::{AtomicU8, Ordering::*};

static LOG: AtomicU8 = AtomicU8::new(255);

/// True when `EUDP_LOG=debug`.
pub fn debug() -> bool {
    let v = LOG.load(Relaxed);
    if v != 255 {
        return v == 1;
    }
    let on = std::env::var("EUDP_LOG").map(|v| v.eq_ignore_ascii_case("debug")).unwrap_or(false);
    LOG.store(on as u8, Relaxed);
    on
}

macro_rules! dlog {
    ($($t:tt)*) => {
        if $crate::log::debug() {
            eprintln!("eudp[{}]: {}", std::process::id(), format!($($t)*));
        }
    };
}
pub(crate) use dlog;
