//! `eudp run` checks the environment its program would get — this
//! process's `EUDP_*` variables with the profile's on top — before starting
//! anything: a bad value or a misspelt name is refused with exit status 2
//! and one line per mistake, instead of a program that silently runs on a
//! default.

use eudp_engine::settings::{self, Problem};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::process::Command;

/// `EUDP_*` variables the command line reads itself (none is passed on).
pub const CLI_VARIABLES: &[&str] = &["EUDP_PRELOAD_LIB", "EUDP_PROFILE_FILE", "EUDP_TRACE_EXE"];

/// The `EUDP_*` environment `cmd` starts its program with: this process's,
/// changed by what `cmd` sets or removes.
pub fn child_env(cmd: &Command) -> Vec<(String, String)> {
    let mut env: BTreeMap<OsString, OsString> = std::env::vars_os().collect();
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => env.insert(k.to_os_string(), v.to_os_string()),
            None => env.remove(k),
        };
    }
    env.into_iter()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| k.starts_with("EUDP_"))
        .collect()
}

/// The mistakes of `env`, one line each: the variable, its value and what
/// it accepts (or the known name it looks like).
pub fn problems(env: &[(String, String)]) -> Vec<String> {
    settings::validate(env.iter().map(|(k, v)| (k, v)), CLI_VARIABLES).iter().map(Problem::to_string).collect()
}

/// Checks the environment of `cmd`, the program `eudp run` is about to
/// start with profile `profile`; on a mistake prints each and returns the
/// exit status (2). Otherwise names the profile for the start-up line.
/// `eudp run --quiet` sets `EUDP_QUIET=1`, which the program inherits.
pub fn check(cmd: &mut Command, profile: &str) -> Result<(), i32> {
    let bad = problems(&child_env(cmd));
    if !bad.is_empty() {
        for b in &bad {
            eprintln!("eudp run: {b}");
        }
        eprintln!(
            "eudp run: {} bad setting(s); the program was not started (`eudp run --list-profiles` and docs/preload.md list the settings)",
            bad.len()
        );
        return Err(2);
    }
    cmd.env("EUDP_PROFILE", profile);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_environment_is_checked_with_the_profile_on_top() {
        let mut c = Command::new("true");
        c.env("EUDP_L2_DEPTH", "abc").env("EUDP_SPIN_US", "5").env("EUDP_TRANSPORT", "xpd");
        let env = child_env(&c);
        assert!(env.iter().any(|(k, v)| k == "EUDP_SPIN_US" && v == "5"));
        let p = problems(&env);
        assert!(p.iter().any(|l| l.starts_with("EUDP_L2_DEPTH=abc: expected an integer")), "{p:?}");
        assert!(p.iter().any(|l| l.contains("EUDP_TRANSPORT=xpd: expected one of kernel, tcp, xdp")), "{p:?}");
        c.env_remove("EUDP_L2_DEPTH").env_remove("EUDP_TRANSPORT");
        assert!(problems(&child_env(&c)).iter().all(|l| !l.contains("EUDP_L2_DEPTH")));
    }
}
