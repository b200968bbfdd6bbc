//! Where per-process stats files go, for the preload shim and the
//! transports that write next to it, and where `eudp stat` looks.
//!
//! `EUDP_STAT_DIR` when set; otherwise the first of `/run/eudp`,
//! `$XDG_RUNTIME_DIR/eudp` and `/tmp/eudp-$UID` this process may write.
//! The last is created 0700 and used only when it is a directory (not a
//! link) owned by this user and closed to others: in a shared `/tmp`
//! another user could have made it first.
//!
//! A process's files there are named `<pid>-<start>.json` (the shim's
//! report) and `<pid>-<start>.tcp.json` (the `tcp` transport's counters),
//! `<start>` being the process's start time in clock ticks since boot
//! (`/proc/<pid>/stat`, field 22): a later process that gets the same pid
//! writes files of its own instead of replacing the earlier one's.

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

/// The start time of process `pid` in clock ticks since boot
/// (`/proc/<pid>/stat`, field 22), and whether it has ended (a zombie);
/// None: no such process (or no `/proc`).
pub fn proc_start(pid: u32) -> Option<(u64, bool)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) may hold spaces and parentheses: fields 3.. follow its last ')'.
    let mut f = s.rsplit_once(')')?.1.split_whitespace();
    let state = f.next()?;
    let start = f.nth(18)?.parse().ok()?;
    Some((start, state == "Z" || state == "X"))
}

/// The stem of this process's stats file names: `<pid>-<start>` (see the
/// module notes), `<pid>` alone when `/proc` does not say its start.
pub fn own_stem() -> String {
    let pid = std::process::id();
    match proc_start(pid) {
        Some((start, _)) => format!("{pid}-{start}"),
        None => pid.to_string(),
    }
}

/// A stats file's name read back: the process's pid, its start time when
/// the name has one, and whether it holds the `tcp` transport's counters.
/// None: not a stats file (temporary files and others).
pub fn parse_name(name: &str) -> Option<(u64, Option<u64>, bool)> {
    let stem = name.strip_suffix(".json")?;
    let (stem, tcp) = match stem.strip_suffix(".tcp") {
        Some(s) => (s, true),
        None => (stem, false),
    };
    let (pid, start) = match stem.split_once('-') {
        Some((p, t)) => (p.parse().ok()?, Some(t.parse().ok()?)),
        None => (stem.parse().ok()?, None),
    };
    Some((pid, start, tcp))
}

/// Whether the process a stats file names still runs: its pid exists and,
/// when the name has a start time, with that start time (a reused pid is
/// another process).
pub fn runs(pid: u64, start: Option<u64>) -> bool {
    let Ok(pid) = u32::try_from(pid) else { return false };
    match (proc_start(pid), start) {
        (None, _) => false,
        (Some(_), None) => true,
        (Some((t, _)), Some(s)) => t == s,
    }
}

/// The stats files in `dir` of the processes with pid `pid` (the shim's
/// report, or with `tcp` the transport's counters), oldest process first.
pub fn files_of(dir: &Path, pid: u64, tcp: bool) -> Vec<PathBuf> {
    let mut v: Vec<(Option<u64>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name();
            let (p, start, t) = parse_name(name.to_str()?)?;
            (p == pid && t == tcp).then(|| (start, e.path()))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
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

    #[test]
    fn names_carry_the_start_time_and_read_back() {
        let stem = own_stem();
        let (pid, start, tcp) = parse_name(&format!("{stem}.json")).expect("own name");
        assert_eq!((pid, tcp), (u64::from(std::process::id()), false));
        assert!(start.is_some(), "{stem}");
        assert!(runs(pid, start));
        assert!(!runs(pid, start.map(|s| s + 1)), "a reused pid is another process");
        assert_eq!(parse_name("12-34.tcp.json"), Some((12, Some(34), true)));
        assert_eq!(parse_name("12.json"), Some((12, None, false)));
        assert_eq!(parse_name(".12-34.0.json.tmp"), None);
        assert_eq!(parse_name("12-x.json"), None);
    }
}
