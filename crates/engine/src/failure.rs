//! Panics on eudp's own threads and in the preload shim's calls, contained.
//!
//! eudp runs inside other people's programs: a bug of ours must not unwind
//! into them, abort them or leave them hanging. The engine thread and the
//! transports' threads run their loops through [`contain_thread`]: a panic
//! there is logged once, counted and marks eudp failed ([`failed`]); waits
//! on the engine give up with [`failed_error`], and the handler a host
//! layer set ([`set_handler`], the preload shim's) moves its sockets to
//! the kernel path.
//!
//! [`install_quiet_hook`] replaces std's panic hook by one that keeps the
//! message (with its location) for the panicking thread instead of
//! printing a backtrace; [`take_message`] hands it to whoever caught the
//! unwind. The preload shim links its own std, so its hook is not the
//! host program's.

use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::{Mutex, OnceLock};

static FAILED: AtomicBool = AtomicBool::new(false);
static WHY: Mutex<Option<String>> = Mutex::new(None);
static HANDLER: OnceLock<fn(&str)> = OnceLock::new();
/// Panics contained in this process (threads and calls).
pub static PANICS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static LAST: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Sets std's panic hook to one that stores the message for
/// [`take_message`] instead of printing. Once per process; later calls do
/// nothing.
pub fn install_quiet_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let msg = payload_text(info.payload());
            let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
            // A thread being torn down has no thread-locals left: the
            // message is then only the payload's, taken by the catcher.
            let _ = LAST.try_with(|c| {
                if let Ok(mut c) = c.try_borrow_mut() {
                    *c = Some(format!("{msg}{at}"));
                }
            });
        }));
    });
}

fn payload_text(p: &(dyn Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-text payload".to_string()
    }
}

/// The message of the panic this thread caught last: the quiet hook's
/// when it ran, else the payload's text.
pub fn take_message(payload: &(dyn Any + Send)) -> String {
    LAST.try_with(|c| c.try_borrow_mut().ok().and_then(|mut c| c.take()))
        .ok()
        .flatten()
        .unwrap_or_else(|| payload_text(payload))
}

/// Sets what runs once when an eudp thread fails (on a thread of its own,
/// so it may wait for what the failed thread no longer does). First call
/// wins.
pub fn set_handler(f: fn(&str)) {
    let _ = HANDLER.set(f);
}

/// Whether an engine or transport thread of this process panicked.
#[inline]
pub fn failed() -> bool {
    FAILED.load(Relaxed)
}

/// The error blocking calls return once eudp failed (`EIO` through the
/// preload shim, which maps errors without an errno so).
pub fn failed_error() -> std::io::Error {
    let why = WHY.lock().unwrap_or_else(|e| e.into_inner()).clone().unwrap_or_default();
    std::io::Error::other(format!("eudp engine thread failed: {why}"))
}

/// Runs a thread's loop; a panic in it is logged, counted and marks eudp
/// failed (then the handler runs). Returns whether it panicked.
pub fn contain_thread(thread: &'static str, body: impl FnOnce()) -> bool {
    let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) else {
        return false;
    };
    let msg = take_message(&*p);
    PANICS.fetch_add(1, Relaxed);
    crate::log::write(crate::log::Level::Error, format_args!("{thread} thread panicked: {msg}"));
    let first = {
        let mut w = WHY.lock().unwrap_or_else(|e| e.into_inner());
        let first = w.is_none();
        if first {
            *w = Some(format!("{thread}: {msg}"));
        }
        first
    };
    FAILED.store(true, SeqCst);
    if first {
        if let Some(&h) = HANDLER.get() {
            let why = format!("{thread} thread panicked: {msg}");
            let _ = std::thread::Builder::new().name("eudp-failover".into()).spawn(move || h(&why));
        }
    }
    true
}
