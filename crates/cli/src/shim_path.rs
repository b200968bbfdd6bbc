//! Where `eudp run` finds `libeudp_preload.so`, so that a development build,
//! an install under a prefix (`scripts/install.sh`) and the Debian package
//! all work without any environment variable.
//!
//! Order: `$EUDP_PRELOAD_LIB`; beside the running executable
//! (`target/{debug,release}/`) or one directory up (test executables live in
//! `deps/`); `<exe_dir>/../lib/eudp/` (an install under a prefix); the
//! Debian package's `/usr/lib/eudp/`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The shim's file name.
pub const SHIM_NAME: &str = "libeudp_preload.so";

/// The variable that names the shim outright.
pub const SHIM_ENV: &str = "EUDP_PRELOAD_LIB";

/// Where the Debian package installs the shim.
pub const SYSTEM_DIR: &str = "/usr/lib/eudp";

/// The places searched for an executable at `exe`, in order.
pub fn candidates(exe: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = exe.parent() {
        out.push(dir.join(SHIM_NAME));
        if let Some(up) = dir.parent() {
            out.push(up.join(SHIM_NAME));
            out.push(up.join("lib/eudp").join(SHIM_NAME));
        }
    }
    out.push(Path::new(SYSTEM_DIR).join(SHIM_NAME));
    out
}

/// The shim for an executable at `exe`: `env` (the variable's value) when
/// set, else the first candidate `exists` accepts.
pub fn find(env: Option<OsString>, exe: &Path, exists: impl Fn(&Path) -> bool) -> Result<PathBuf, String> {
    if let Some(p) = env {
        return Ok(PathBuf::from(p));
    }
    let places = candidates(exe);
    if let Some(p) = places.iter().find(|p| exists(p)) {
        return Ok(p.clone());
    }
    let tried: Vec<String> = places.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "{SHIM_NAME} not found (tried {}); build it with cargo build --release -p eudp-preload, install it with scripts/install.sh, or set {SHIM_ENV}",
        tried.join(", ")
    ))
}

/// The shim for the running executable.
pub fn preload_lib() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("the running executable's path: {e}"))?;
    find(std::env::var_os(SHIM_ENV), &exe, |p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(path: &'static str) -> impl Fn(&Path) -> bool {
        move |p| p == Path::new(path)
    }

    #[test]
    fn the_variable_wins() {
        let got = find(Some("/x/y.so".into()), Path::new("/usr/bin/eudp"), |_| true).unwrap();
        assert_eq!(got, Path::new("/x/y.so"));
    }

    #[test]
    fn beside_the_binary_first() {
        let exe = Path::new("/w/target/release/eudp");
        let got = find(None, exe, |_| true).unwrap();
        assert_eq!(got, Path::new("/w/target/release/libeudp_preload.so"));
    }

    #[test]
    fn test_executables_look_one_up() {
        let exe = Path::new("/w/target/release/deps/run_apps-0123");
        let got = find(None, exe, only("/w/target/release/libeudp_preload.so")).unwrap();
        assert_eq!(got, Path::new("/w/target/release/libeudp_preload.so"));
    }

    #[test]
    fn installed_under_a_prefix() {
        let exe = Path::new("/opt/eudp/bin/eudp");
        let got = find(None, exe, only("/opt/eudp/lib/eudp/libeudp_preload.so")).unwrap();
        assert_eq!(got, Path::new("/opt/eudp/lib/eudp/libeudp_preload.so"));
    }

    #[test]
    fn the_debian_path_last() {
        let exe = Path::new("/home/u/.cargo/bin/eudp");
        let got = find(None, exe, only("/usr/lib/eudp/libeudp_preload.so")).unwrap();
        assert_eq!(got, Path::new("/usr/lib/eudp/libeudp_preload.so"));
        let order = candidates(exe);
        assert_eq!(order.last().unwrap(), Path::new("/usr/lib/eudp/libeudp_preload.so"));
    }

    #[test]
    fn nowhere_says_where_it_looked() {
        let err = find(None, Path::new("/opt/eudp/bin/eudp"), |_| false).unwrap_err();
        assert!(err.contains("/opt/eudp/lib/eudp/libeudp_preload.so"), "{err}");
        assert!(err.contains(SHIM_ENV), "{err}");
    }
}
