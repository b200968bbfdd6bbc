//! The shim's debug log, through the engine's logger (`EUDP_LOG`,
//! `EUDP_LOG_FILE`).

/// True when `EUDP_LOG=debug`.
pub fn debug() -> bool {
    eudp_engine::log::enabled(eudp_engine::log::Level::Debug)
}

macro_rules! dlog {
    ($($t:tt)*) => {
        if $crate::log::debug() {
            eudp_engine::log::write(eudp_engine::log::Level::Debug, format_args!($($t)*));
        }
    };
}
pub(crate) use dlog;
