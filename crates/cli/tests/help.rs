//! Every command of `eudp`, taken from clap's own command tree, answers
//! `--help` and rejects an unknown option; `run` and `trace` never start a
//! program for a mistyped option; completions and man pages come out.

use clap::CommandFactory;
use eudp_cli::command::Cli;
use std::process::{Command, Output};

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");

fn eudp(args: &[&str]) -> Output {
    Command::new(EUDP).args(args).output().expect("eudp runs")
}

/// A command's words after `eudp`, and whether it has options of its own.
struct Path {
    words: Vec<String>,
    has_options: bool,
    /// It hands its words to another parser (hidden helpers only).
    verbatim: bool,
}

fn walk(cmd: &clap::Command, prefix: &[String], out: &mut Vec<Path>) {
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut words = prefix.to_vec();
        words.push(sub.get_name().to_string());
        let own = |a: &&clap::Arg| !["help", "version"].contains(&a.get_id().as_str());
        out.push(Path {
            words: words.clone(),
            has_options: sub.get_arguments().filter(own).any(|a| !a.is_positional()),
            verbatim: sub.get_arguments().any(|a| a.is_positional() && a.is_allow_hyphen_values_set()),
        });
        walk(sub, &words, out);
    }
}

fn commands() -> Vec<Path> {
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    walk(&cmd, &[], &mut out);
    out
}

#[test]
fn the_tree_has_the_nested_commands() {
    let names: Vec<String> = commands().iter().map(|p| p.words.join(" ")).collect();
    for want in ["run", "stat", "trace", "trace worker", "model", "sim", "sim validate", "testbed up", "verify", "man"]
    {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
}

#[test]
fn every_command_answers_help() {
    for p in commands() {
        let mut args: Vec<&str> = p.words.iter().map(String::as_str).collect();
        args.push("--help");
        let o = eudp(&args);
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "eudp {args:?}: {text}");
        assert!(text.contains("Usage:"), "eudp {args:?}: {text}");
        if p.has_options {
            assert!(
                text.lines().any(|l| l.trim_start().starts_with("--") || l.trim_start().starts_with('-')),
                "eudp {args:?} lists no option: {text}"
            );
        }
    }
}

#[test]
fn every_command_rejects_an_unknown_option() {
    for p in commands().into_iter().filter(|p| !p.verbatim) {
        let mut args: Vec<&str> = p.words.iter().map(String::as_str).collect();
        args.push("--no-such-option");
        let o = eudp(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "eudp {args:?}: {err}");
        assert!(err.contains("--no-such-option"), "eudp {args:?}: {err}");
    }
}

#[test]
fn run_and_trace_never_start_a_program_for_a_mistyped_option() {
    let o = eudp(&["run", "--bogus", "true"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--bogus"));
    let dir = std::env::temp_dir().join(format!("eudp-help-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mark = dir.join("ran");
    let mark_s = mark.to_str().unwrap();
    assert_eq!(eudp(&["run", "--bogus", "touch", mark_s]).status.code(), Some(2));
    let out = dir.join("out");
    let o = eudp(&["trace", "--out", out.to_str().unwrap(), "--bogus", "touch", mark_s]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--bogus"));
    assert!(!mark.exists(), "a program ran");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn words_after_the_program_are_the_programs() {
    // A shim that cannot be loaded is skipped by the dynamic loader (with
    // a warning), so this needs no build of it.
    let o = Command::new(EUDP)
        .args(["run", "--profile", "latency", "sh", "-c", "echo \"$@\"", "sh", "--profile", "nope", "--", "-x"])
        .env("EUDP_PRELOAD_LIB", "/nonexistent/libeudp_preload.so")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "--profile nope -- -x");
}

#[test]
fn completions_and_man_pages_come_out() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = eudp(&["completions", shell]);
        assert_eq!(o.status.code(), Some(0), "{shell}");
        assert!(String::from_utf8_lossy(&o.stdout).contains("eudp"), "{shell}");
    }
    let o = eudp(&["man"]);
    assert_eq!(o.status.code(), Some(0));
    let page = String::from_utf8_lossy(&o.stdout);
    assert!(page.contains(".TH") && page.contains("eudp"), "{page}");
    let dir = std::env::temp_dir().join(format!("eudp-man-{}", std::process::id()));
    assert_eq!(eudp(&["man", "--out", dir.to_str().unwrap()]).status.code(), Some(0));
    for page in ["eudp.1", "eudp-run.1", "eudp-stat.1", "eudp-trace.1", "eudp-sim.1", "eudp-sim-validate.1"] {
        let len = std::fs::metadata(dir.join(page)).map(|m| m.len()).unwrap_or(0);
        assert!(len > 0, "{page} not written");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
