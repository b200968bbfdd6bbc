//! `eudp run` with profiles from a TOML file: the settings reach the
//! program's environment, mistakes stop the run with a message naming the
//! file, and the list of settings a profile may hold covers every `EUDP_*`
//! variable the engine and the shim read.

use std::path::{Path, PathBuf};
use std::process::Command;

fn eudp() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eudp"));
    // The program below only prints its environment: the library need not
    // exist (the dynamic loader skips a missing preload with a warning).
    c.env("EUDP_PRELOAD_LIB", "/nonexistent/libeudp_preload.so");
    for (k, _) in std::env::vars() {
        if k.starts_with("EUDP_") && k != "EUDP_PRELOAD_LIB" {
            c.env_remove(k);
        }
    }
    c
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eudp-profiles-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The `EUDP_*` variables `sh` sees under `eudp run ARGS -- sh -c env`.
fn env_under(args: &[&str], extra: &[(&str, &str)]) -> Vec<String> {
    let mut c = eudp();
    c.arg("run").args(args).args(["--", "sh", "-c", "env"]);
    for (k, v) in extra {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let mut v: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            // EUDP_PROFILE names the profile for the program's start-up line.
            l.starts_with("EUDP_")
                && !l.starts_with("EUDP_PRELOAD_LIB=")
                && !l.starts_with("EUDP_PROFILE_FILE=")
                && !l.starts_with("EUDP_PROFILE=")
        })
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn a_file_profile_reaches_the_program() {
    let d = tmpdir("ok");
    let f = write(&d, "p.toml", "# a DNS server's settings\n[profiles.dns]\ninherit = \"latency\"\nEUDP_SPIN_US = 20\nEUDP_RX_HANDOFF_US = 500\nEUDP_GSO = false\n");
    let fs = f.to_str().unwrap();
    let want = ["EUDP_GSO=0", "EUDP_RX_HANDOFF_US=500", "EUDP_SPIN_US=20", "EUDP_TX_COALESCE_US=0"];
    assert_eq!(env_under(&["--profile-file", fs, "--profile", "dns"], &[]), want);
    // The same file through the environment.
    assert_eq!(env_under(&["--profile", "dns"], &[("EUDP_PROFILE_FILE", fs)]), want);
    // A variable already set wins over the profile.
    let got = env_under(&["--profile-file", fs, "--profile", "dns"], &[("EUDP_SPIN_US", "7")]);
    assert!(got.contains(&"EUDP_SPIN_US=7".to_string()), "{got:?}");
    // Built-ins still work with a file given.
    assert_eq!(
        env_under(&["--profile-file", fs, "--profile", "latency"], &[]),
        ["EUDP_SPIN_US=50", "EUDP_TX_COALESCE_US=0"]
    );
    // And the list shows both kinds.
    let out = eudp().args(["run", "--list-profiles", "--profile-file", fs]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("latency      built in: EUDP_SPIN_US=50 EUDP_TX_COALESCE_US=0"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("dns") && l.contains("EUDP_RX_HANDOFF_US=500")), "{text}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_bad_profile_file_stops_the_run_before_the_program() {
    let d = tmpdir("bad");
    let marker = d.join("ran");
    let cases = [
        ("typo.toml", "[profiles.a]\nEUDP_SPIN_UZ = 1\n", "unknown setting \"EUDP_SPIN_UZ\""),
        ("value.toml", "[profiles.a]\nEUDP_MAX_MSGS = \"many\"\n", "invalid value \"many\" for EUDP_MAX_MSGS"),
        ("syntax.toml", "[profiles.a\n", "TOML parse error"),
        ("loop.toml", "[profiles.a]\ninherit = \"a\"\n", "inherit loop: a -> a"),
        ("transport.toml", "[profiles.a]\nEUDP_TRANSPORT = \"tpc\"\n", "invalid value \"tpc\" for EUDP_TRANSPORT"),
    ];
    for (name, text, want) in cases {
        let f = write(&d, name, text);
        let out = eudp()
            .args([
                "run",
                "--profile-file",
                f.to_str().unwrap(),
                "--profile",
                "a",
                "--",
                "touch",
                marker.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        assert!(err.contains(want) && err.contains(name), "{name}: {err:?} lacks {want:?} or the file's name");
        assert!(!marker.exists(), "{name}: the program ran");
    }
    let out = eudp()
        .args(["run", "--profile-file", d.join("missing.toml").to_str().unwrap(), "--", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.toml"));
    let out = eudp().args(["run", "--profile", "nope", "--", "true"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("unknown profile \"nope\" (profiles: default, throughput, latency)"));
    std::fs::remove_dir_all(&d).unwrap();
}

/// Every `"EUDP_…"` string literal in the engine's and the shim's sources.
fn variables_read() -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut found = Vec::new();
    let mut stack = vec![root.join("engine/src"), root.join("preload/src")];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let text = std::fs::read_to_string(&p).unwrap();
                for (i, _) in text.match_indices("\"EUDP_") {
                    let name: String = text[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                        .collect();
                    if text[i + 1 + name.len()..].starts_with('"') && !found.contains(&name) {
                        found.push(name);
                    }
                }
            }
        }
    }
    found.sort();
    found
}

#[test]
fn every_variable_the_engine_and_shim_read_is_a_known_setting() {
    // Not settings: test hooks.
    let not_settings = ["EUDP_TEST_RACE_PAUSE_US", "EUDP_TEST_PANIC", "EUDP_TEST_STAT_RENAME_MS", "EUDP_TEST_FLUSH_MS"];
    let read = variables_read();
    assert!(read.len() >= 30, "the scan found too little: {read:?}");
    let missing: Vec<&String> = read
        .iter()
        .filter(|v| !eudp_cli::profiles::SETTINGS.contains(&v.as_str()) && !not_settings.contains(&v.as_str()))
        .collect();
    assert!(missing.is_empty(), "read by the engine or the shim but not in profiles::SETTINGS: {missing:?}");
    let stale: Vec<&&str> = eudp_cli::profiles::SETTINGS.iter().filter(|s| !read.iter().any(|r| r == *s)).collect();
    assert!(stale.is_empty(), "in profiles::SETTINGS but read nowhere: {stale:?}");
}
