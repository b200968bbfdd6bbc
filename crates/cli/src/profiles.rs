//! Profiles for `eudp run`: named sets of `EUDP_*` settings.
//!
//! Three are built in ([`PROFILES`]). More can be defined in a TOML file,
//! given with `eudp run --profile-file FILE` or `EUDP_PROFILE_FILE`; each
//! starts empty or from another profile and sets any documented variable:
//!
//! ```toml
//! [profiles.dns]
//! inherit = "latency"      # optional: a built-in or another profile of the file
//! EUDP_SPIN_US = 20        # integers, strings and booleans (true = "1")
//! EUDP_RX_HANDOFF_US = 500
//! ```
//!
//! A file is checked whole when it is read, so a mistake is an error naming
//! the file, the profile and the key before the program starts — not a
//! setting silently ignored (a misspelt variable) or replaced by its default
//! at run time (a bad value): only `profiles` at the top level, only the
//! variables in [`SETTINGS`], no floats, arrays or tables as values, no
//! unknown or circular `inherit`, no built-in redefined, and every value
//! checked against what its variable accepts (`eudp_engine::settings`).

use std::collections::BTreeMap;
use std::path::Path;

/// The built-in profiles.
pub const PROFILES: &[(&str, &[(&str, &str)])] = &[
    ("default", &[]),
    // Bigger batches per syscall once sends queue up, kernel-side room for
    // bursts while the engine thread is off CPU, two GSO messages per
    // sender-side send (half the receiver's wake-ups) and a longer bound
    // for a remainder: a streaming sender rarely meets it, a sender that
    // goes to sleep sends its remainder then (`Engine::send_coalesced_now`),
    // and each engine wake-up for the timer costs a streaming sender's CPU
    // (2 ms against 200 µs: +11 % received iperf3 rate, docs/preload.md).
    (
        "throughput",
        &[
            ("EUDP_MAX_MSGS", "64"),
            ("EUDP_SOCK_RCVBUF", "8388608"),
            ("EUDP_TX_FLUSH_BATCHES", "2"),
            ("EUDP_TX_COALESCE_US", "2000"),
        ],
    ),
    // A blocked receiver spins before it sleeps; a queued send wakes the
    // engine at once instead of waiting to fill a batch.
    ("latency", &[("EUDP_SPIN_US", "50"), ("EUDP_TX_COALESCE_US", "0")]),
];

/// Every variable a profile may set: the engine's (`Config`), the TCP
/// transport's (`TcpConfig`), the AF_XDP transport's, tracing's and the
/// shim's (docs/preload.md).
/// A test checks that every `EUDP_*` name the engine and the shim read is
/// here, or deliberately left out (test hooks, the library's location).
pub const SETTINGS: &[&str] = &[
    // engine
    "EUDP_BUSY_POLL",
    "EUDP_CPU",
    "EUDP_GRO",
    "EUDP_GRO_HOLD",
    "EUDP_GSO",
    "EUDP_GSO_SEGMENTS",
    "EUDP_L2_DEPTH",
    "EUDP_MAX_MSGS",
    "EUDP_RX_HANDOFF_US",
    "EUDP_SPIN_US",
    "EUDP_TX_CALLER_DRAIN",
    "EUDP_TX_COALESCE_US",
    "EUDP_TX_FLUSH_BATCHES",
    // TCP transport
    "EUDP_TRANSPORT",
    "EUDP_TCP_BIND",
    "EUDP_TCP_BLOCK_MS",
    "EUDP_TCP_CC",
    "EUDP_TCP_CONNS",
    "EUDP_TCP_CORK_US",
    "EUDP_TCP_DEADLINE_MS",
    "EUDP_TCP_DML",
    "EUDP_TCP_LISTEN",
    "EUDP_TCP_MAX_CONNS",
    "EUDP_TCP_MAX_PER_PEER",
    "EUDP_TCP_MAX_WAIT_MS",
    "EUDP_TCP_NODELAY",
    "EUDP_TCP_PORT",
    "EUDP_TCP_QUEUE_BYTES",
    "EUDP_TCP_RCVBUF",
    "EUDP_TCP_RX_DIRECT",
    "EUDP_TCP_RX_STALL_MS",
    "EUDP_TCP_SNDBUF",
    "EUDP_TCP_SPIN_US",
    // AF_XDP transport (docs/xdp.md)
    "EUDP_XDP_COPY",
    "EUDP_XDP_IFACE",
    "EUDP_XDP_MODE",
    "EUDP_XDP_QUEUE",
    "EUDP_XDP_RING",
    // tracing
    "EUDP_TRACE",
    "EUDP_TRACE_CLOCK",
    "EUDP_TRACE_EVENTS",
    "EUDP_TRACE_KERNEL",
    "EUDP_TRACE_SAMPLE",
    "EUDP_TRACE_STACK",
    "EUDP_TRACE_STAMP_READER",
    // shim
    "EUDP_EINTR",
    "EUDP_FORK_KEEP",
    "EUDP_LOG",
    "EUDP_LOG_FILE",
    "EUDP_PRELOAD",
    "EUDP_PROFILE",
    "EUDP_QUIET",
    "EUDP_SOCK_RCVBUF",
    "EUDP_STAT_DIR",
    "EUDP_STAT_MS",
];

/// The settings of a built-in profile.
pub fn profile(name: &str) -> Result<&'static [(&'static str, &'static str)], String> {
    PROFILES.iter().find(|p| p.0 == name).map(|p| p.1).ok_or_else(|| {
        let names: Vec<&str> = PROFILES.iter().map(|p| p.0).collect();
        format!("unknown profile {name:?} (profiles: {})", names.join(", "))
    })
}

/// One profile of a file.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Def {
    inherit: Option<String>,
    settings: Vec<(String, String)>,
}

/// The profiles of one TOML file, checked (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProfileFile {
    origin: String,
    defs: BTreeMap<String, Def>,
}

impl ProfileFile {
    /// Reads and checks `path`.
    pub fn read(path: &Path) -> Result<ProfileFile, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("profile file {}: {e}", path.display()))?;
        ProfileFile::parse(&text, &path.display().to_string())
    }

    /// Checks `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<ProfileFile, String> {
        let err = |msg: String| format!("profile file {origin}: {msg}");
        let doc: toml_edit::DocumentMut =
            text.parse().map_err(|e: toml_edit::TomlError| err(e.to_string().trim_end().to_string()))?;
        let mut file = ProfileFile { origin: origin.to_string(), defs: BTreeMap::new() };
        for (key, item) in doc.as_table().iter() {
            if key != "profiles" {
                return Err(err(format!("unknown top-level key {key:?} (profiles go in [profiles.NAME] tables)")));
            }
            let Some(profiles) = item.as_table_like() else {
                return Err(err("`profiles` must be a table of [profiles.NAME] tables".into()));
            };
            for (name, body) in profiles.iter() {
                if PROFILES.iter().any(|p| p.0 == name) {
                    return Err(err(format!(
                        "profile {name:?} is built in; give yours another name and `inherit = {name:?}`"
                    )));
                }
                let Some(body) = body.as_table_like() else {
                    return Err(err(format!("profile {name:?} must be a table ([profiles.{name}])")));
                };
                let mut def = Def::default();
                for (key, value) in body.iter() {
                    let value = value
                        .as_value()
                        .ok_or_else(|| err(format!("profile {name:?}: {key} must be a plain value, not a table")))?;
                    if key == "inherit" {
                        let Some(parent) = value.as_str() else {
                            return Err(err(format!("profile {name:?}: inherit must be a profile name in quotes")));
                        };
                        def.inherit = Some(parent.to_string());
                        continue;
                    }
                    if !SETTINGS.contains(&key) {
                        return Err(err(format!("profile {name:?}: unknown setting {key:?}{}", suggestion(key))));
                    }
                    let text = match value {
                        toml_edit::Value::Integer(i) => i.value().to_string(),
                        toml_edit::Value::String(s) => s.value().clone(),
                        toml_edit::Value::Boolean(b) => if *b.value() { "1" } else { "0" }.to_string(),
                        _ => {
                            return Err(err(format!(
                                "profile {name:?}: {key} must be an integer, a string or a boolean"
                            )))
                        }
                    };
                    def.settings.push((key.to_string(), text));
                }
                file.defs.insert(name.to_string(), def);
            }
        }
        // Every profile resolves: inherits exist, no cycle, values parse.
        for name in file.defs.keys() {
            resolve(name, Some(&file)).map_err(err)?;
        }
        Ok(file)
    }

    /// The names of the file's profiles.
    pub fn names(&self) -> Vec<&str> {
        self.defs.keys().map(String::as_str).collect()
    }

    /// Where the profiles came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// The profiles as a TOML file that parses back to the same profiles:
    /// every name and value quoted, so any text the parser accepted survives.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        for (name, def) in &self.defs {
            out.push_str(&format!("[profiles.{}]\n", toml_string(name)));
            if let Some(parent) = &def.inherit {
                out.push_str(&format!("inherit = {}\n", toml_string(parent)));
            }
            for (k, v) in &def.settings {
                out.push_str(&format!("{} = {}\n", toml_string(k), toml_string(v)));
            }
        }
        out
    }
}

/// `s` as a TOML basic string: quotes, backslashes and control characters escaped.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// " (did you mean X?)" for a key one edit-ish away from a setting:
/// the same letters once `EUDP_` and case are set aside.
fn suggestion(key: &str) -> String {
    let norm = |s: &str| s.to_ascii_uppercase().trim_start_matches("EUDP_").replace(['-', '_'], "");
    let k = norm(key);
    SETTINGS
        .iter()
        .find(|s| norm(s) == k)
        .map(|s| format!(" (did you mean {s}?)"))
        .unwrap_or_else(|| " (settings are the EUDP_* variables of docs/preload.md)".to_string())
}

/// The settings of profile `name` — a built-in, or one of `file` on top of
/// what it inherits (its own settings win) — after checking the values the
/// engine and the TCP transport parse.
pub fn resolve(name: &str, file: Option<&ProfileFile>) -> Result<Vec<(String, String)>, String> {
    let mut chain: Vec<String> = Vec::new();
    let mut layers: Vec<Vec<(String, String)>> = Vec::new();
    let mut at = name.to_string();
    loop {
        if let Some(def) = file.and_then(|f| f.defs.get(&at)) {
            let looped = chain.contains(&at);
            chain.push(at.clone());
            if looped {
                return Err(format!("inherit loop: {}", chain.join(" -> ")));
            }
            layers.push(def.settings.clone());
            match &def.inherit {
                Some(p) => at = p.clone(),
                None => break,
            }
        } else if let Ok(b) = profile(&at) {
            layers.push(b.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
            break;
        } else {
            let mut names: Vec<&str> = PROFILES.iter().map(|p| p.0).collect();
            names.extend(file.map(ProfileFile::names).unwrap_or_default());
            let via = chain.last().map(|c| format!(" (inherited by {c})")).unwrap_or_default();
            return Err(format!("unknown profile {at:?}{via} (profiles: {})", names.join(", ")));
        }
    }
    let mut merged: Vec<(String, String)> = Vec::new();
    for layer in layers.into_iter().rev() {
        for (k, v) in layer {
            match merged.iter_mut().find(|(mk, _)| *mk == k) {
                Some(e) => e.1 = v,
                None => merged.push((k, v)),
            }
        }
    }
    check_values(name, &merged)?;
    Ok(merged)
}

/// The values the engine, its transports and the shim would replace by a
/// default at run time (`eudp_engine::settings`), reported now.
fn check_values(name: &str, settings: &[(String, String)]) -> Result<(), String> {
    for (k, v) in settings {
        if let Some(Err(e)) = eudp_engine::settings::find(k).map(|s| s.check(v)) {
            return Err(format!("profile {name:?}: {e}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_profile_inherits_and_overrides() {
        let f = ProfileFile::parse("[profiles.dns]\ninherit = \"latency\"\nEUDP_SPIN_US = 20\nEUDP_GSO = false\n\n[profiles.dns2]\ninherit = \"dns\"\nEUDP_RX_HANDOFF_US = \"500\"\n", "t.toml").unwrap();
        assert_eq!(f.names(), vec!["dns", "dns2"]);
        let s = resolve("dns2", Some(&f)).unwrap();
        let get = |k: &str| s.iter().find(|(x, _)| x == k).map(|(_, v)| v.as_str());
        assert_eq!(get("EUDP_SPIN_US"), Some("20"), "own value wins over the inherited 50");
        assert_eq!(get("EUDP_TX_COALESCE_US"), Some("0"), "from latency");
        assert_eq!(get("EUDP_GSO"), Some("0"));
        assert_eq!(get("EUDP_RX_HANDOFF_US"), Some("500"));
        // Built-ins resolve without a file, and with one.
        assert_eq!(resolve("latency", None).unwrap().len(), 2);
        assert_eq!(resolve("throughput", Some(&f)).unwrap().len(), 4);
    }

    #[test]
    fn mistakes_are_errors_that_say_where() {
        let cases = [
            ("[profiles.a]\nEUDP_SPIN_UZ = 3\n", "unknown setting \"EUDP_SPIN_UZ\""),
            ("[profiles.a]\nspin_us = 3\n", "did you mean EUDP_SPIN_US?"),
            ("[profiles.a]\nEUDP_SPIN_US = 1.5\n", "must be an integer, a string or a boolean"),
            ("[profiles.a]\nEUDP_SPIN_US = [1]\n", "must be an integer, a string or a boolean"),
            ("[profiles.a]\nEUDP_SPIN_US = \"soon\"\n", "invalid value \"soon\" for EUDP_SPIN_US"),
            ("[profiles.a]\nEUDP_TCP_PORT = \"x\"\n", "EUDP_TCP_PORT"),
            ("[profiles.a]\nEUDP_STAT_MS = -1\n", "invalid value \"-1\" for EUDP_STAT_MS"),
            ("[profiles.a]\nEUDP_XDP_MODE = \"native\"\n", "invalid value \"native\" for EUDP_XDP_MODE"),
            ("[profiles.a]\nEUDP_XDP_QUEUE = \"first\"\n", "invalid value \"first\" for EUDP_XDP_QUEUE"),
            ("[profiles.a]\ninherit = \"nope\"\n", "unknown profile \"nope\" (inherited by a)"),
            ("[profiles.a]\ninherit = \"b\"\n[profiles.b]\ninherit = \"a\"\n", "inherit loop: a -> b -> a"),
            ("[profiles.latency]\nEUDP_SPIN_US = 1\n", "is built in"),
            ("[profile.a]\nEUDP_SPIN_US = 1\n", "unknown top-level key \"profile\""),
            ("profiles = 3\n", "must be a table"),
            ("[profiles.a\nEUDP_SPIN_US = 1\n", "t.toml"),
            ("[profiles]\na = 3\n", "profile \"a\" must be a table"),
        ];
        for (text, want) in cases {
            let e = ProfileFile::parse(text, "t.toml").expect_err(text);
            assert!(e.contains(want), "{text:?}: {e:?} lacks {want:?}");
            assert!(e.starts_with("profile file t.toml: "), "{e:?} does not name the file");
        }
    }

    #[test]
    fn every_profile_setting_is_in_the_engine_table() {
        for name in SETTINGS {
            assert!(eudp_engine::settings::find(name).is_some(), "{name} is not in eudp_engine::settings");
        }
        for s in eudp_engine::settings::SETTINGS {
            let test_hook = s.scope == eudp_engine::settings::Scope::Test;
            assert!(test_hook || SETTINGS.contains(&s.name), "{} is not a profile setting", s.name);
        }
    }

    #[test]
    fn a_file_written_back_parses_to_the_same_profiles() {
        let text = "[profiles.\"a \\\"q\\\" \\u0007\"]\nEUDP_GSO = true\nEUDP_SPIN_US = 5\n[profiles.b]\ninherit = \"a \\\"q\\\" \\u0007\"\nEUDP_CPU = \"1\"\n";
        let f = ProfileFile::parse(text, "t.toml").unwrap();
        let again = ProfileFile::parse(&f.to_toml(), "t.toml").unwrap();
        assert_eq!(f, again, "{}", f.to_toml());
    }

    #[test]
    fn an_unknown_profile_lists_the_known_ones() {
        let f = ProfileFile::parse("[profiles.mine]\nEUDP_GRO = true\n", "t.toml").unwrap();
        let e = resolve("nope", Some(&f)).unwrap_err();
        assert!(e.contains("default, throughput, latency, mine"), "{e}");
    }
}
