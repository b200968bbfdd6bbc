//! For tests only: injected panics, to check that they are contained.
//!
//! `EUDP_TEST_PANIC` names one site and the call of it that panics:
//! `hook:NAME:N` (the N-th call of the preload shim's hook NAME on one of
//! the program's sockets, e.g. `hook:sendto:3`), `engine:N` (the engine
//! thread's N-th turn), `tcp:N` (the tcp transport's manager thread's N-th
//! turn). The xdp transport has no thread of its own: its work runs on the
//! engine thread and the program's. Read once; unset, a site costs one relaxed load.
//! Never set it in production.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};
use std::sync::OnceLock;

const UNREAD: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static STATE: AtomicU8 = AtomicU8::new(UNREAD);
static SPEC: OnceLock<Option<(String, String, u64)>> = OnceLock::new();
static SEEN: AtomicU64 = AtomicU64::new(0);

fn parse(v: &str) -> Option<(String, String, u64)> {
    let parts: Vec<&str> = v.trim().split(':').collect();
    match parts.as_slice() {
        ["hook", name, n] => Some(("hook".into(), (*name).into(), n.parse().ok()?)),
        [kind @ ("engine" | "tcp"), n] => Some(((*kind).into(), String::new(), n.parse().ok()?)),
        _ => None,
    }
}

#[cold]
fn read_once() -> bool {
    let spec = SPEC.get_or_init(|| std::env::var("EUDP_TEST_PANIC").ok().and_then(|v| parse(&v)));
    STATE.store(if spec.is_some() { ON } else { OFF }, Relaxed);
    spec.is_some()
}

/// Whether `EUDP_TEST_PANIC` is set (one relaxed load once read).
#[inline]
pub fn armed() -> bool {
    match STATE.load(Relaxed) {
        OFF => false,
        ON => true,
        _ => read_once(),
    }
}

/// Panics when this is the call `EUDP_TEST_PANIC` names (site `kind`, and
/// `name` for a hook).
#[inline]
pub fn point(kind: &str, name: &str) {
    if armed() {
        count(kind, name);
    }
}

#[cold]
fn count(kind: &str, name: &str) {
    let Some(Some((k, nm, n))) = SPEC.get() else { return };
    if k != kind || (kind == "hook" && nm != name) {
        return;
    }
    if SEEN.fetch_add(1, Relaxed) + 1 == *n {
        if name.is_empty() {
            panic!("EUDP_TEST_PANIC: injected panic in {kind}");
        }
        panic!("EUDP_TEST_PANIC: injected panic in {kind} {name}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses() {
        assert_eq!(super::parse("hook:sendto:3"), Some(("hook".into(), "sendto".into(), 3)));
        assert_eq!(super::parse("engine:10"), Some(("engine".into(), String::new(), 10)));
        assert_eq!(super::parse("tcp:x"), None);
        assert_eq!(super::parse("nope"), None);
    }
}
