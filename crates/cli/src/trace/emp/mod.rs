//! `eudp trace --emp`: EMP's seven steps (paper 003, Table 1) per message
//! on one clock, for each scheme of Table 2.
//!
//! For each scheme, two EMP endpoints in this process exchange
//! `--messages` messages of `--size` bytes (ping-pong or stream) with the
//! tracepoints on, on loopback or across the netns testbed's veth pair
//! (`--emp-hosts testbed`: each endpoint's socket opened in its host's
//! namespace, both hosts on one clock); the stages stamp each step ([`eudp_engine::emp::steptrace`])
//! and [`steps`] joins the records per message and checks them. Then each
//! scheme's bandwidth (both directions) and latency are measured briefly by
//! `eudp worker emp` pairs, the measured step costs go into the simulator's
//! 003 preset ([`eudp_model::step_costs`]), and the predicted order of the
//! schemes is printed beside the measured one.
//!
//! * [`steps`]: records joined per message, and the checks;
//! * [`drive`]: the traced exchange between two endpoints;
//! * [`measure`]: the brief measurement of each scheme by worker pairs;
//! * [`report`]: the table, the JSON document and the chart.

pub mod drive;
pub mod measure;
pub mod report;
pub mod steps;

use clap::{Args, ValueEnum};
use eudp_engine::emp::Scheme;
use std::path::Path;

/// The exchange a trace runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Each message answered before the next goes.
    Pingpong,
    /// Messages back to back in one direction.
    Stream,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Pingpong => "pingpong",
            Pattern::Stream => "stream",
        }
    }
}

/// Where the two endpoints of a traced run are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum HostsKind {
    /// Both on this host's loopback.
    Loopback,
    /// One on each host of a netns testbed (`--testbed NAME`, or a fresh one), across veth.
    Testbed,
}

/// The two hosts of a run: their namespaces (none: this one) and addresses.
#[derive(Clone, Debug)]
pub struct Hosts {
    pub netns: Option<[String; 2]>,
    pub ip: [std::net::IpAddr; 2],
}

impl HostsKind {
    pub fn name(self) -> &'static str {
        match self {
            HostsKind::Loopback => "loopback",
            HostsKind::Testbed => "testbed",
        }
    }
}

impl Hosts {
    pub fn loopback() -> Self {
        let lo = std::net::IpAddr::from([127, 0, 0, 1]);
        Hosts { netns: None, ip: [lo, lo] }
    }

    fn of(tb: &crate::testbed::Testbed) -> Result<Self, String> {
        let ip = |s: &str| s.parse::<std::net::IpAddr>().map_err(|e| e.to_string());
        Ok(Hosts {
            netns: Some([tb.netns('a'), tb.netns('b')]),
            ip: [ip(crate::testbed::ADDR_A)?, ip(crate::testbed::ADDR_B)?],
        })
    }

    /// Runs `f` on a thread inside host `h`'s namespace (0: a, 1: b), so the
    /// sockets it opens are that host's.
    pub fn on<T: Send>(&self, h: usize, f: impl FnOnce() -> Result<T, String> + Send) -> Result<T, String> {
        match &self.netns {
            None => f(),
            Some(ns) => std::thread::scope(|sc| {
                sc.spawn(|| {
                    crate::sys::enter_netns(&ns[h]).map_err(|e| format!("netns {}: {e}", ns[h]))?;
                    f()
                })
                .join()
                .map_err(|_| "a host thread panicked".to_string())?
            }),
        }
    }
}

/// The options of `eudp trace --emp`.
#[derive(Args, Clone, Debug)]
pub struct EmpTraceOptions {
    /// Trace EMP's seven steps per message (paper 003 Table 1) instead of packets.
    #[arg(long)]
    pub emp: bool,
    /// EMP schemes to trace: base, so, ro, dsr, sr or all.
    #[arg(long, value_name = "S1,S2", value_delimiter = ',', default_value = "all", requires = "emp")]
    pub scheme: Vec<String>,
    /// EMP messages traced per scheme.
    #[arg(long, value_name = "N", default_value_t = 200, requires = "emp")]
    pub messages: u64,
    /// EMP exchange traced.
    #[arg(long, value_enum, default_value = "pingpong", requires = "emp")]
    pub pattern: Pattern,
    /// Seconds each scheme's bandwidth and latency are measured for the
    /// measured order (0: no measurement).
    #[arg(long, value_name = "SECS", default_value_t = 1.0, requires = "emp")]
    pub measure_secs: f64,
    /// Where the two endpoints run: loopback, or testbed (one per host of a
    /// netns testbed, across veth; --testbed NAME or a fresh one; needs root).
    #[arg(long, value_enum, default_value = "loopback", requires = "emp")]
    pub emp_hosts: HostsKind,
}

impl EmpTraceOptions {
    /// The schemes named by `--scheme`.
    pub fn schemes(&self) -> Result<Vec<Scheme>, String> {
        let mut v = Vec::new();
        for s in &self.scheme {
            if s.eq_ignore_ascii_case("all") {
                v.extend(Scheme::ALL);
            } else {
                v.push(s.parse::<Scheme>()?);
            }
        }
        v.dedup();
        if v.is_empty() {
            return Err("--scheme names no scheme".into());
        }
        Ok(v)
    }
}

/// Runs `eudp trace --emp` with message size `size`, writing to `out`;
/// `testbed`: the existing testbed `--emp-hosts testbed` uses.
pub fn run(o: &EmpTraceOptions, size: u64, out: &Path, testbed: Option<&str>) -> Result<(), String> {
    let schemes = o.schemes()?;
    if o.messages == 0 || o.messages > 20_000 {
        return Err("--messages must be 1 to 20000".into());
    }
    if size > u64::from(eudp_wire::emp::MAX_MESSAGE) {
        return Err(format!("--size {size} is over EMP's largest message"));
    }
    // Torn down when dropped (a fresh one), kept (an existing one).
    let tb = match (o.emp_hosts, testbed) {
        (HostsKind::Loopback, _) => None,
        (HostsKind::Testbed, Some(n)) => Some(crate::testbed::Testbed::existing(n)?),
        (HostsKind::Testbed, None) => Some(crate::testbed::Testbed::up(&crate::testbed::unique_name("emp"))?),
    };
    let hosts = match &tb {
        Some(tb) => Hosts::of(tb)?,
        None => Hosts::loopback(),
    };
    let mut traced = Vec::new();
    for &s in &schemes {
        eprintln!("eudp trace --emp: scheme {s}: {} {} B messages, traced", o.messages, size);
        traced.push(drive::traced(s, o.pattern, size as usize, o.messages, &hosts)?);
    }
    let mut measured = Vec::new();
    if o.measure_secs > 0.0 {
        for &s in &schemes {
            eprintln!("eudp trace --emp: scheme {s}: measuring bandwidth and latency ({} s each)", o.measure_secs);
            match measure::scheme(s, o.measure_secs, &hosts) {
                Ok(m) => measured.push(m),
                // The order is then of the schemes measured.
                Err(e) => eprintln!("eudp trace --emp: scheme {s} not measured: {e}"),
            }
        }
    }
    let doc = report::document(o, size, &traced, &measured)?;
    report::write(out, &doc, &traced)?;
    print!("{}", report::text(&doc));
    let bad: Vec<&str> = traced.iter().filter(|t| !t.checks.ok()).map(|t| t.scheme.name()).collect();
    if !bad.is_empty() {
        return Err(format!("the step records of {} fail their checks (see the table)", bad.join(", ")));
    }
    Ok(())
}
