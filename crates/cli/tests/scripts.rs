//! `scripts/deps.sh` under `dash` with fake programs first on a bare PATH:
//! a failed or empty rustup download stops it loudly, a cargo older than the
//! workspace's rust-version counts as absent, a good download is run, and
//! the root-only commands refuse other users. Nothing is downloaded or
//! installed: `curl` and `cargo` are shell scripts in a temporary directory.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn deps_sh() -> PathBuf {
    root().join("scripts/deps.sh")
}

/// The workspace's rust-version, as deps.sh reads it.
fn rust_min() -> String {
    let toml = fs::read_to_string(root().join("Cargo.toml")).expect("Cargo.toml");
    let line = toml.lines().find(|l| l.starts_with("rust-version")).expect("rust-version in Cargo.toml");
    line.split('"').nth(1).expect("quoted rust-version").to_string()
}

/// A scratch directory with `bin/` (first on PATH) and `home/` (HOME).
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("deps-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("bin")).unwrap();
        fs::create_dir_all(dir.join("home")).unwrap();
        Scratch { dir }
    }

    fn home(&self) -> PathBuf {
        self.dir.join("home")
    }

    fn script(&self, path: &Path, body: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn fake(&self, name: &str, body: &str) {
        self.script(&self.dir.join("bin").join(name), body);
    }

    /// `dash scripts/deps.sh ARGS` with only the fakes, /usr/bin and /bin on
    /// PATH (rustup's real cargo lives in the real HOME, not there).
    fn deps(&self, args: &[&str]) -> Output {
        let path = format!("{}:/usr/bin:/bin", self.dir.join("bin").display());
        Command::new("dash")
            .arg(deps_sh())
            .args(args)
            .env_clear()
            .env("PATH", path)
            .env("HOME", self.home())
            .output()
            .expect("dash scripts/deps.sh")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

fn ca_certs() -> bool {
    Path::new("/etc/ssl/certs/ca-certificates.crt").metadata().is_ok_and(|m| m.len() > 0)
}

#[test]
fn syntax_is_posix() {
    for name in ["deps.sh", "test.sh", "demo.sh", "env.sh", "install.sh", "package-deb.sh"] {
        let path = root().join("scripts").join(name);
        let out = Command::new("dash").arg("-n").arg(&path).output().expect("dash -n");
        assert!(out.status.success(), "{name}: {}", text(&out));
    }
}

#[test]
fn failed_download_fails_loudly() {
    if !have("dash") || std::path::Path::new("/usr/bin/cargo").exists() {
        eprintln!("skipped: needs dash and no cargo in /usr/bin");
        return;
    }
    let s = Scratch::new("fail");
    // curl -f on an HTTP error: exit 22, nothing written.
    s.fake("curl", "echo 'curl: (22) The requested URL returned error: 503' >&2; exit 22");
    let out = s.deps(&["rust"]);
    let t = text(&out);
    assert!(!out.status.success(), "a failed download must fail:\n{t}");
    assert!(t.contains("deps: error:"), "{t}");
    if ca_certs() {
        assert!(t.contains("downloading rustup-init") && t.contains("failed"), "{t}");
    }
    assert!(t.contains("no cargo on PATH"), "{t}");
}

#[test]
fn empty_download_fails_loudly() {
    if !have("dash") || !ca_certs() || Path::new("/usr/bin/cargo").exists() {
        eprintln!("skipped: needs dash, ca-certificates and no cargo in /usr/bin");
        return;
    }
    let s = Scratch::new("empty");
    // A "successful" download of nothing: the -o file is created empty.
    s.fake("curl", r#"while [ $# -gt 0 ]; do [ "$1" = -o ] && : > "$2"; shift; done; exit 0"#);
    let out = s.deps(&["rust"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains("empty file"), "{t}");
}

#[test]
fn old_cargo_counts_as_absent() {
    if !have("dash") || Path::new("/usr/bin/cargo").exists() {
        eprintln!("skipped: needs dash and no cargo in /usr/bin");
        return;
    }
    let s = Scratch::new("old");
    s.fake("cargo", r#"[ "$1" = --version ] && echo 'cargo 1.63.0' && exit 0; exit 1"#);
    s.fake("curl", "exit 22");
    let out = s.deps(&["rust"]);
    let t = text(&out);
    assert!(!out.status.success(), "cargo 1.63 must not be accepted:\n{t}");
    assert!(t.contains(&format!("cargo 1.63.0 is older than {}", rust_min())), "{t}");
    assert!(t.contains("treating it as absent"), "{t}");
}

#[test]
fn new_cargo_is_kept() {
    if !have("dash") {
        eprintln!("skipped: needs dash");
        return;
    }
    let s = Scratch::new("new");
    s.fake(
        "cargo",
        &format!(r#"[ "$1" = --version ] && echo 'cargo {}.0 (0 2099-01-01)' && exit 0; exit 1"#, rust_min()),
    );
    // Any download would fail the run.
    s.fake("curl", "exit 22");
    let out = s.deps(&["rust"]);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn good_download_is_run() {
    if !have("dash") || !ca_certs() || Path::new("/usr/bin/cargo").exists() {
        eprintln!("skipped: needs dash, ca-certificates and no cargo in /usr/bin");
        return;
    }
    let s = Scratch::new("good");
    // The "rustup-init" it fetches puts a new enough cargo where rustup does.
    let cargo = format!(r#"[ "$1" = --version ] && echo 'cargo {}.1' && exit 0; exit 1"#, rust_min());
    let init = format!(
        "mkdir -p \"$HOME/.cargo/bin\"\ncat > \"$HOME/.cargo/bin/cargo\" <<'EOF'\n#!/bin/sh\n{cargo}\nEOF\nchmod +x \"$HOME/.cargo/bin/cargo\"\necho \"init: $*\""
    );
    let init_path = s.dir.join("rustup-init");
    s.script(&init_path, &init);
    s.fake(
        "curl",
        &format!(r#"while [ $# -gt 0 ]; do [ "$1" = -o ] && cp '{}' "$2"; shift; done; exit 0"#, init_path.display()),
    );
    let out = s.deps(&["rust"]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("init: -y --profile minimal --default-toolchain stable"), "{t}");
    assert!(s.home().join(".cargo/bin/cargo").exists());
}

#[test]
fn dry_run_plans_rust_for_an_old_cargo() {
    if !have("dash") || !ca_certs() || Path::new("/usr/bin/cargo").exists() || !running_as_root() {
        eprintln!("skipped: needs dash, ca-certificates, root and no cargo in /usr/bin");
        return;
    }
    let s = Scratch::new("dry");
    s.fake("cargo", r#"[ "$1" = --version ] && echo 'cargo 1.63.0' && exit 0; exit 1"#);
    s.fake("curl", "exit 22");
    let out = Command::new("dash")
        .arg(deps_sh())
        .arg("demo")
        .env_clear()
        .env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", s.dir.join("bin").display()))
        .env("HOME", s.home())
        .env("EUDP_DEPS_DRY_RUN", "1")
        .output()
        .unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("would run: curl -fsSL --proto =https --tlsv1.2 -o"), "{t}");
}

fn running_as_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

#[test]
fn demo_and_test_refuse_other_users() {
    if !have("dash") || !have("setpriv") || !running_as_root() {
        eprintln!("skipped: needs dash, setpriv and root (to become another user)");
        return;
    }
    for what in ["demo", "test"] {
        let out = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "dash"])
            .arg(deps_sh())
            .arg(what)
            .env("EUDP_DEPS_DRY_RUN", "1")
            .output()
            .unwrap();
        let t = text(&out);
        assert_eq!(out.status.code(), Some(1), "{what}: {t}");
        assert!(t.contains("must run as root"), "{what}: {t}");
    }
}
