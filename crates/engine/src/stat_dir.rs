//! Where per-process stats files go, for the preload shim and the
//! transports that write next to it, and where `eudp stat` looks.
//!
//! `EUDP_STAT_DIR` when set; otherwise the first of `/run/eudp`,
//! `$XDG_RUNTIME_DIR/eudp` and `/tmp/eudp-$UID` this process may write.
//! The last is created 0700 and used only when it is a directory (not a
//! link) owned by this user and closed to others: in a shared `/tmp`
//! another user could have made it first.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The system-wide directory, for root and a group allowed to write it.
pub const SYSTEM_DIR: &str = "/run/eudp";

/// This process's real user id (from `/proc/self/status`; no syscall).
pub fn uid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The per-user directory under `/tmp`.
pub fn tmp_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/eudp-{uid}"))
}

/// The directories to try, in order (`EUDP_STAT_DIR` alone when set).
pub fn candidates() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os("EUDP_STAT_DIR").filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    let mut v = vec![PathBuf::from(SYSTEM_DIR)];
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        v.push(Path::new(&x).join("eudp"));
    }
    if let Some(u) = uid() {
        v.push(tmp_dir(u));
    }
    v
}

/// True when `d` exists or was made, and a file can be created in it.
fn usable(d: &Path, uid: Option<u32>) -> bool {
    let private = uid.is_some_and(|u| d == tmp_dir(u));
    if private {
        let _ = std::fs::DirBuilder::new().mode(0o700).create(d);
        let Ok(m) = std::fs::symlink_metadata(d) else { return false };
        if !m.is_dir() || Some(m.uid()) != uid || m.permissions().mode() & 0o077 != 0 {
            return false;
        }
    } else if std::fs::create_dir_all(d).is_err() {
        return false;
    }
    let probe = d.join(format!(".probe.{}", std::process::id()));
    let ok = std::fs::File::create(&probe).is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

/// The directory this process writes its stats files to, found once
/// (None: none of the candidates may be written).
pub fn writable() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    // Found outside the lock (two threads may both look): a fork child of a
    // parent in the middle of it must not wait on an initialization that
    // never ends in the child.
    if DIR.get().is_none() {
        let u = uid();
        let _ = DIR.set(candidates().into_iter().find(|d| usable(d, u)));
    }
    DIR.get().and_then(|d| d.as_deref())
}

/// The directories `eudp stat` reads: the candidates, and for a user who
/// may read them (root) the other users' runtime and `/tmp` directories.
pub fn readable() -> Vec<PathBuf> {
    let mut v = candidates();
    if std::env::var_os("EUDP_STAT_DIR").is_some_and(|d| !d.is_empty()) {
        return v;
    }
    let mut more = Vec::new();
    if let Ok(rd) = std::fs::read_dir("/tmp") {
        more.extend(rd.flatten().filter(|e| e.file_name().to_string_lossy().starts_with("eudp-")).map(|e| e.path()));
    }
    if let Ok(rd) = std::fs::read_dir("/run/user") {
        more.extend(rd.flatten().map(|e| e.path().join("eudp")));
    }
    more.sort();
    for d in more {
        if !v.contains(&d) && std::fs::read_dir(&d).is_ok() {
            v.push(d);
        }
    }
    v
}

static SHARED: OnceLock<PathBuf> = OnceLock::new();

/// Makes `d` the directory the transports of this process write their
/// own stats files to (the shim calls it with [`writable`]'s answer).
pub fn share(d: &Path) {
    let _ = SHARED.set(d.to_path_buf());
}

/// The directory set by [`share`], else `EUDP_STAT_DIR` (None: neither:
/// a program without the shim writes no stats files unless asked).
pub fn shared() -> Option<PathBuf> {
    SHARED.get().cloned().or_else(|| std::env::var_os("EUDP_STAT_DIR").filter(|d| !d.is_empty()).map(PathBuf::from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_private_directory_must_be_ours_and_closed() {
        let u = uid().expect("uid");
        assert!(candidates().contains(&tmp_dir(u)) || std::env::var_os("EUDP_STAT_DIR").is_some());
        let d = std::env::temp_dir().join(format!("eudp-statdir-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        assert!(usable(&d, Some(u)));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
