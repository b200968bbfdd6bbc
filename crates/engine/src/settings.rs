//! Every `EUDP_*` variable the engine, its transports and the preload shim
//! read, in one table ([`SETTINGS`]): what each accepts, its default and
//! what it means. The parsers of [`crate::Config`] and the transports check
//! values through [`Setting::check`], so `eudp run`'s validation
//! ([`validate`]) and what a program does at run time agree.

use std::fmt;

/// What a variable accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `1`/`0` (also `true`/`false`, `yes`/`no`, `on`/`off`).
    Flag,
    /// A decimal integer within `min..=max`.
    Int { min: u64, max: u64 },
    /// One of these words.
    Choice(&'static [&'static str]),
    /// An IPv4 or IPv6 address.
    Ip,
    /// A TCP congestion control name (letters, digits, `_`; 1 to 15 long).
    CcName,
    /// Any text (a path, a pattern, an interface name).
    Text,
}

/// Who reads a variable (for the tables `eudp run` and the docs print).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    Engine,
    Tcp,
    Xdp,
    Trace,
    Shim,
    /// Test hooks: known, but no setting.
    Test,
}

/// One variable of [`SETTINGS`].
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    pub name: &'static str,
    pub kind: Kind,
    /// The default, as text (a description where there is no value).
    pub default: &'static str,
    pub scope: Scope,
    pub meaning: &'static str,
}

const fn s(name: &'static str, kind: Kind, default: &'static str, scope: Scope, meaning: &'static str) -> Setting {
    Setting { name, kind, default, scope, meaning }
}

const U32: u64 = u32::MAX as u64;
const U64: u64 = u64::MAX;
const I32: u64 = i32::MAX as u64;

use Kind::*;
use Scope::*;

/// The table: every `EUDP_*` variable read below the command line.
pub const SETTINGS: &[Setting] = &[
    s("EUDP_L2_DEPTH", Int { min: 1, max: U32 }, "1", Engine, "backend operations in flight per endpoint (L2 bound)"),
    s("EUDP_BUSY_POLL", Flag, "0", Engine, "the engine thread spins instead of sleeping"),
    s("EUDP_CPU", Int { min: 0, max: 4095 }, "unpinned", Engine, "pin the engine thread to this CPU"),
    s("EUDP_GSO", Flag, "1", Engine, "use UDP GSO on send"),
    s("EUDP_GRO", Flag, "1", Engine, "use UDP GRO on receive"),
    s("EUDP_GRO_HOLD", Flag, "1", Engine, "keep one GRO socket open so the kernel's static key stays on"),
    s("EUDP_GSO_SEGMENTS", Int { min: 1, max: 1024 }, "64", Engine, "datagrams per GSO message"),
    s("EUDP_MAX_MSGS", Int { min: 1, max: 1024 }, "16", Engine, "messages per sendmmsg/recvmmsg call"),
    s("EUDP_SPIN_US", Int { min: 0, max: U64 }, "0", Engine, "a blocked receiver spins this long before sleeping"),
    s(
        "EUDP_RX_HANDOFF_US",
        Int { min: 1, max: U64 },
        "1000",
        Engine,
        "an idle receiver hands its socket back after this long",
    ),
    s(
        "EUDP_TX_COALESCE_US",
        Int { min: 0, max: U64 },
        "100",
        Engine,
        "queued datagrams may wait this long for a full GSO batch",
    ),
    s(
        "EUDP_TX_FLUSH_BATCHES",
        Int { min: 1, max: 64 },
        "2",
        Engine,
        "GSO batches a sender's thread gathers before it sends them",
    ),
    s("EUDP_TX_CALLER_DRAIN", Flag, "1", Engine, "a streaming sender's own thread may send its queued batches"),
    s(
        "EUDP_TRANSPORT",
        Choice(&["kernel", "tcp", "xdp"]),
        "kernel",
        Engine,
        "transport: kernel UDP, UDP over TCP lanes, or AF_XDP",
    ),
    s("EUDP_TCP_PORT", Int { min: 1, max: 65535 }, "9717", Tcp, "port the UOE listens on and connects to"),
    s("EUDP_TCP_LISTEN", Flag, "1", Tcp, "listen on the UOE port (0: send-only process)"),
    s("EUDP_TCP_BIND", Ip, "any", Tcp, "local address of the listener and outgoing connections"),
    s("EUDP_TCP_CONNS", Int { min: 1, max: 16 }, "1", Tcp, "connections per peer host"),
    s("EUDP_TCP_CC", CcName, "system default", Tcp, "TCP_CONGESTION of UOE connections"),
    s("EUDP_TCP_NODELAY", Flag, "1", Tcp, "TCP_NODELAY on UOE connections"),
    s("EUDP_TCP_SNDBUF", Int { min: 0, max: U64 }, "0", Tcp, "SO_SNDBUF of connections (0: autotune)"),
    s("EUDP_TCP_RCVBUF", Int { min: 0, max: U64 }, "0", Tcp, "SO_RCVBUF of connections (0: autotune)"),
    s(
        "EUDP_TCP_DML",
        Choice(&["queue", "block", "udp", "a", "b", "c"]),
        "queue",
        Tcp,
        "what a sender does while its peer does not accept",
    ),
    s("EUDP_TCP_BLOCK_MS", Int { min: 0, max: U64 }, "1000", Tcp, "longest block of a sender (dml block)"),
    s("EUDP_TCP_QUEUE_BYTES", Int { min: 0, max: U64 }, "4194304", Tcp, "per-lane queue bound in bytes"),
    s(
        "EUDP_TCP_DEADLINE_MS",
        Int { min: 0, max: U64 },
        "5000",
        Tcp,
        "drop queued datagrams older than this while unconnected",
    ),
    s(
        "EUDP_TCP_MAX_WAIT_MS",
        Int { min: 0, max: U64 },
        "1000",
        Tcp,
        "drop queued datagrams older than this on a stalled connection",
    ),
    s("EUDP_TCP_MAX_CONNS", Int { min: 0, max: U64 }, "1024", Tcp, "connection cap"),
    s("EUDP_TCP_MAX_PER_PEER", Int { min: 0, max: U64 }, "32", Tcp, "connection cap per peer host"),
    s(
        "EUDP_TCP_SPIN_US",
        Int { min: 0, max: U64 },
        "0",
        Tcp,
        "the manager polls this long after activity before sleeping",
    ),
    s(
        "EUDP_TCP_CORK_US",
        Int { min: 0, max: U64 },
        "100",
        Tcp,
        "a back-to-back sender's datagrams gather this long (0: off)",
    ),
    s("EUDP_TCP_RX_DIRECT", Flag, "1", Tcp, "an endpoint reads its bulk connection itself"),
    s(
        "EUDP_TCP_RX_STALL_MS",
        Int { min: 1, max: U64 },
        "10",
        Tcp,
        "the manager takes back a connection its reader left this long",
    ),
    s("EUDP_XDP_IFACE", Text, "the one interface up with IPv4", Xdp, "interface of the AF_XDP transport"),
    s("EUDP_XDP_MODE", Choice(&["auto", "driver", "generic"]), "auto", Xdp, "how the XDP program attaches"),
    s("EUDP_XDP_COPY", Choice(&["cached", "nontemporal"]), "cached", Xdp, "the stores of the payload copy into UMEM"),
    s("EUDP_XDP_QUEUE", Int { min: 0, max: U32 }, "0", Xdp, "the interface queue the AF_XDP socket binds"),
    s(
        "EUDP_XDP_RING",
        Choice(&["512", "1024", "2048", "4096", "8192", "16384"]),
        "2048",
        Xdp,
        "entries of each AF_XDP ring; twice as many UMEM frames, half of them receiving",
    ),
    s("EUDP_TRACE", Text, "off", Trace, "trace file (%p: pid); set turns tracing on"),
    s("EUDP_TRACE_CLOCK", Text, "monotonic", Trace, "`none`: record events without reading a clock"),
    s(
        "EUDP_TRACE_EVENTS",
        Int { min: 1, max: U64 },
        "per-thread default",
        Trace,
        "trace buffer size in events per thread",
    ),
    s("EUDP_TRACE_KERNEL", Text, "both", Trace, "kernel stamps: `0` none, `tx`, `rx`, else both"),
    s("EUDP_TRACE_SAMPLE", Int { min: 1, max: U64 }, "1", Trace, "trace one datagram in N, every layer of it"),
    s("EUDP_TRACE_STACK", Text, "eudp", Trace, "`kernel`: trace the program's kernel path (no adoption)"),
    s("EUDP_TRACE_STAMP_READER", Text, "io_uring", Trace, "`recvmmsg`: read TX stamps with recvmmsg only"),
    s("EUDP_EINTR", Choice(&["0", "1"]), "1", Shim, "0: blocked calls restart instead of failing with EINTR"),
    s(
        "EUDP_FORK_KEEP",
        Choice(&["0", "1"]),
        "0",
        Shim,
        "1: a socket shared with a fork child stays accelerated in the parent",
    ),
    s("EUDP_LOG", Choice(&["error", "warn", "info", "debug"]), "warn", Shim, "least severe message level written"),
    s("EUDP_LOG_FILE", Text, "stderr", Shim, "append messages to this file instead (%p: pid)"),
    s("EUDP_QUIET", Flag, "0", Shim, "1: no start-up line"),
    s("EUDP_PROFILE", Text, "default", Shim, "the profile `eudp run` applied (shown in the start-up line)"),
    s("EUDP_PRELOAD", Choice(&["0", "1", "off", "on"]), "1", Shim, "0/off: the shim adopts nothing"),
    s("EUDP_SOCK_RCVBUF", Int { min: 0, max: I32 }, "kernel's", Shim, "SO_RCVBUF of adopted sockets (0: unchanged)"),
    s("EUDP_STAT_DIR", Text, "/run/eudp", Shim, "directory of the per-process stats files"),
    s("EUDP_STAT_MS", Int { min: 0, max: U64 }, "1000", Shim, "stats file period (0: none)"),
    s("EUDP_TEST_PANIC", Text, "unset", Test, "test hook: panic at hook:NAME:N, engine:N or tcp:N"),
    s("EUDP_TEST_RACE_PAUSE_US", Int { min: 0, max: U64 }, "0", Test, "test hook: pause in a receive's race window"),
    s(
        "EUDP_TEST_STAT_RENAME_MS",
        Int { min: 0, max: U64 },
        "0",
        Test,
        "test hook: the stats writer's rename takes this long",
    ),
];

/// The table entry of `name`.
pub fn find(name: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.name == name)
}

/// Parses a flag as the engine does.
pub fn parse_flag(v: &str) -> Option<bool> {
    match v.trim() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl Setting {
    /// What the variable accepts, in words.
    pub fn expected(&self) -> String {
        match self.kind {
            Flag => "1 or 0 (true/false, yes/no, on/off)".into(),
            Int { min, max } if max == U64 || max == U32 && min > 0 => format!("an integer >= {min}"),
            Int { min, max } => format!("an integer {min}..={max}"),
            Choice(words) => format!("one of {}", words.join(", ")),
            Ip => "an IPv4 or IPv6 address".into(),
            CcName => "a congestion control name (letters, digits, _; up to 15)".into(),
            Text => "any text".into(),
        }
    }

    /// Checks `value`; the error names what is accepted.
    pub fn check(&'static self, value: &str) -> Result<(), SettingError> {
        let v = value.trim();
        let ok = match self.kind {
            Flag => parse_flag(v).is_some(),
            Int { min, max } => v.parse::<u64>().is_ok_and(|n| (min..=max).contains(&n)),
            Choice(words) => words.contains(&v),
            Ip => v.parse::<std::net::IpAddr>().is_ok(),
            CcName => !v.is_empty() && v.len() <= 15 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            Text => true,
        };
        if ok {
            Ok(())
        } else {
            Err(SettingError { var: self.name, value: value.to_string(), setting: self })
        }
    }

    /// The integer `value`, checked.
    pub fn int(&'static self, value: &str) -> Result<u64, SettingError> {
        self.check(value)?;
        value.trim().parse().map_err(|_| SettingError { var: self.name, value: value.to_string(), setting: self })
    }

    /// The flag `value`, checked.
    pub fn flag(&'static self, value: &str) -> Result<bool, SettingError> {
        self.check(value)?;
        parse_flag(value).ok_or(SettingError { var: self.name, value: value.to_string(), setting: self })
    }
}

/// A value a variable does not accept.
#[derive(Debug, Clone)]
pub struct SettingError {
    pub var: &'static str,
    pub value: String,
    pub setting: &'static Setting,
}

impl PartialEq for SettingError {
    fn eq(&self, o: &Self) -> bool {
        self.var == o.var && self.value == o.value
    }
}

impl Eq for SettingError {}

impl SettingError {
    /// What is accepted, in words.
    pub fn expected(&self) -> String {
        self.setting.expected()
    }

    /// The line a program logs when it goes on with the default.
    pub fn ignored(&self) -> String {
        format!("{}={} ignored: expected {}; using {}", self.var, self.value, self.expected(), self.setting.default)
    }
}

impl fmt::Display for SettingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid value {:?} for {}: expected {}", self.value, self.var, self.expected())
    }
}

impl std::error::Error for SettingError {}

/// The value of `name` from `get`, or the default when absent; a bad value
/// is pushed to `errs` and leaves `or` in place.
pub(crate) fn lookup<T>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &'static str,
    errs: &mut Vec<SettingError>,
    parse: impl FnOnce(&'static Setting, &str) -> Result<T, SettingError>,
) -> Option<T> {
    let v = get(name)?;
    let set = find(name).unwrap_or_else(|| panic!("{name} is not in settings::SETTINGS"));
    match parse(set, &v) {
        Ok(x) => Some(x),
        Err(e) => {
            errs.push(e);
            None
        }
    }
}

/// One problem of an environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A known variable with a value it does not accept.
    Bad(SettingError),
    /// An `EUDP_*` name no one reads, with the nearest known name if close.
    Unknown { var: String, value: String, suggestion: Option<&'static str> },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Bad(e) => write!(f, "{}={}: expected {}", e.var, e.value, e.expected()),
            Problem::Unknown { var, value, suggestion } => {
                write!(f, "{var}={value}: unknown variable")?;
                match suggestion {
                    Some(s) => write!(f, " (did you mean {s}?)"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// The problems of an environment: every `EUDP_*` pair whose value its
/// variable does not accept, and every `EUDP_*` name that is neither in
/// [`SETTINGS`] nor in `also_known` (names the caller reads itself).
pub fn validate<K: AsRef<str>, V: AsRef<str>>(
    env: impl IntoIterator<Item = (K, V)>,
    also_known: &[&str],
) -> Vec<Problem> {
    let mut out = Vec::new();
    for (k, v) in env {
        let (k, v) = (k.as_ref(), v.as_ref());
        if !k.starts_with(PREFIX) || also_known.contains(&k) {
            continue;
        }
        match find(k) {
            Some(s) => {
                if let Err(e) = s.check(v) {
                    out.push(Problem::Bad(e));
                }
            }
            None => out.push(Problem::Unknown { var: k.to_string(), value: v.to_string(), suggestion: nearest(k) }),
        }
    }
    out
}

/// The known name within two edits of `name` (case aside), if any.
pub fn nearest(name: &str) -> Option<&'static str> {
    let up = name.to_ascii_uppercase();
    SETTINGS
        .iter()
        .filter(|s| s.scope != Test)
        .map(|s| (distance(&up, s.name), s.name))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, n)| n)
}

/// Levenshtein distance between two ASCII names.
fn distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, &ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, &cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The prefix of every variable: written so that no scan for `"EUDP_…"`
/// literals of the sources takes it for a variable's name.
pub const PREFIX: &str = concat!("EUDP", "_");

/// The `EUDP_*` variables of this process's environment.
pub fn env_vars() -> Vec<(String, String)> {
    std::env::vars().filter(|(k, _)| k.starts_with(PREFIX)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_validator_names_the_variable_the_value_and_what_is_accepted() {
        let p = validate([("EUDP_L2_DEPTH", "abc")], &[]);
        assert_eq!(p.len(), 1);
        let Problem::Bad(e) = &p[0] else { panic!("{p:?}") };
        assert_eq!((e.var, e.value.as_str()), ("EUDP_L2_DEPTH", "abc"));
        assert_eq!(e.ignored(), "EUDP_L2_DEPTH=abc ignored: expected an integer >= 1; using 1");
        assert!(p[0].to_string().contains("EUDP_L2_DEPTH=abc"), "{}", p[0]);

        let p = validate([("EUDP_TRANSPORT", "xpd")], &[]);
        assert_eq!(p[0].to_string(), "EUDP_TRANSPORT=xpd: expected one of kernel, tcp, xdp");

        // Names no one reads are built, so that no source scan finds them.
        let typo = "eudp_spin_uz".to_ascii_uppercase();
        let p = validate([(typo.as_str(), "3")], &[]);
        assert_eq!(p[0].to_string(), "EUDP_SPIN_UZ=3: unknown variable (did you mean EUDP_SPIN_US?)");
        let p = validate([(format!("{PREFIX}NOTHING_LIKE_IT"), "3")], &[]);
        assert!(matches!(&p[0], Problem::Unknown { suggestion: None, .. }), "{p:?}");

        let good = [
            ("EUDP_L2_DEPTH", "4"),
            ("EUDP_TRANSPORT", "xdp"),
            ("EUDP_GSO", "off"),
            ("EUDP_TCP_BIND", "::1"),
            ("EUDP_TCP_CC", "bbr"),
            ("EUDP_LOG", "debug"),
            ("EUDP_LOG_FILE", "/tmp/x.%p"),
            ("HOME", "/root"),
        ];
        assert_eq!(validate(good, &[]), vec![]);
        let lib = format!("{PREFIX}PRELOAD_LIB");
        assert_eq!(validate([(lib.as_str(), "/x.so")], &[lib.as_str()]), vec![]);
        for (k, v) in [("EUDP_TCP_PORT", "0"), ("EUDP_MAX_MSGS", "1025"), ("EUDP_TCP_CC", "a;b"), ("EUDP_LOG", "loud")]
        {
            assert_eq!(validate([(k, v)], &[]).len(), 1, "{k}={v}");
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, a) in SETTINGS.iter().enumerate() {
            assert!(SETTINGS[i + 1..].iter().all(|b| b.name != a.name), "{} twice", a.name);
        }
    }
}
