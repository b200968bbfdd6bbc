//! Messages of the engine and the preload shim, by level.
//!
//! `EUDP_LOG=error|warn|info|debug` is the least severe level written
//! (default `warn`); `EUDP_LOG_FILE=PATH` appends them to that file (`%p`
//! becomes the pid) instead of stderr. Messages are rare, so each one opens
//! and closes the file: a fork child then writes to its own `%p` file.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::Mutex;

/// Severity; a message is written when its level is at most the one set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error = 0,
    Warn = 1,
    Info = 2,
    Debug = 3,
}

impl Level {
    /// The level a value of `EUDP_LOG` names (case aside).
    pub fn parse(v: &str) -> Option<Level> {
        match v.trim().to_ascii_lowercase().as_str() {
            "error" => Some(Level::Error),
            "warn" => Some(Level::Warn),
            "info" => Some(Level::Info),
            "debug" => Some(Level::Debug),
            _ => None,
        }
    }
}

const UNSET: u8 = 255;
static LEVEL: AtomicU8 = AtomicU8::new(UNSET);

/// The level set by `EUDP_LOG`, read once (an unknown value: `warn`).
pub fn level() -> Level {
    match LEVEL.load(Relaxed) {
        0 => Level::Error,
        1 => Level::Warn,
        2 => Level::Info,
        3 => Level::Debug,
        _ => {
            let l = std::env::var("EUDP_LOG").ok().and_then(|v| Level::parse(&v)).unwrap_or(Level::Warn);
            LEVEL.store(l as u8, Relaxed);
            l
        }
    }
}

/// True when messages of `l` are written.
#[inline]
pub fn enabled(l: Level) -> bool {
    l <= level()
}

/// The file messages go to, `%p` replaced, or None for stderr.
fn file_path() -> Option<String> {
    let p = std::env::var("EUDP_LOG_FILE").ok().filter(|p| !p.is_empty())?;
    Some(p.replace("%p", &std::process::id().to_string()))
}

/// Writes `msg` as one line when `l` is enabled: `eudp[PID]: msg`.
pub fn write(l: Level, msg: std::fmt::Arguments<'_>) {
    if !enabled(l) {
        return;
    }
    write_line(&format!("eudp[{}]: {msg}\n", std::process::id()));
}

/// Writes a line as it is (no prefix) to the log's destination.
pub fn write_line(line: &str) {
    if let Some(p) = file_path() {
        let f = std::fs::OpenOptions::new().create(true).append(true).open(p);
        if let Ok(mut f) = f {
            // One write per line: appends of concurrent writers do not mix.
            let _ = f.write_all(line.as_bytes());
            return;
        }
    }
    // Not through std's `Stderr`: its lock, held by another thread at a
    // fork, would stay held in the child for good.
    crate::sys::process::write_stderr(line.as_bytes());
}

/// Logs at warn level, once per process for each distinct `key`.
pub fn warn_once(key: &str, msg: std::fmt::Arguments<'_>) {
    static SAID: Mutex<Vec<String>> = Mutex::new(Vec::new());
    // A lock a fork left held (by a thread of the parent) is never
    // released in the child: after a while the message is given up.
    let mut tries = 0;
    let mut said = loop {
        match SAID.try_lock() {
            Ok(g) => break g,
            Err(std::sync::TryLockError::Poisoned(e)) => break e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if tries < 1000 => {
                tries += 1;
                std::thread::yield_now();
            }
            Err(std::sync::TryLockError::WouldBlock) => return,
        }
    };
    if said.iter().any(|k| k == key) {
        return;
    }
    said.push(key.to_string());
    drop(said);
    if enabled(Level::Warn) {
        write_line(&format!("eudp: {msg}\n"));
    }
}

/// Reports settings replaced by their defaults, each once per process.
pub fn report_ignored(errs: &[crate::settings::SettingError]) {
    for e in errs {
        warn_once(e.var, format_args!("{}", e.ignored()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_and_order() {
        assert_eq!(Level::parse("DEBUG"), Some(Level::Debug));
        assert_eq!(Level::parse("loud"), None);
        assert!(Level::Error < Level::Warn && Level::Info < Level::Debug);
    }
}
