//! `eudp trace --emp`: EMP's seven steps (paper 003, Table 1) per message
//! on one clock, for each scheme of Table 2.
//!
//! For each scheme, two EMP endpoints on loopback in this process exchange
//! `--messages` messages of `--size` bytes (ping-pong or stream) with the
//! tracepoints on; the stages stamp each step ([`eudp_engine::emp::steptrace`])
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

/// Runs `eudp trace --emp` with message size `size`, writing to `out`.
pub fn run(o: &EmpTraceOptions, size: u64, out: &Path) -> Result<(), String> {
    let schemes = o.schemes()?;
    if o.messages == 0 || o.messages > 20_000 {
        return Err("--messages must be 1 to 20000".into());
    }
    if size > u64::from(eudp_wire::emp::MAX_MESSAGE) {
        return Err(format!("--size {size} is over EMP's largest message"));
    }
    let mut traced = Vec::new();
    for &s in &schemes {
        eprintln!("eudp trace --emp: scheme {s}: {} {} B messages, traced", o.messages, size);
        traced.push(drive::traced(s, o.pattern, size as usize, o.messages)?);
    }
    let mut measured = Vec::new();
    if o.measure_secs > 0.0 {
        for &s in &schemes {
            eprintln!("eudp trace --emp: scheme {s}: measuring bandwidth and latency ({} s each)", o.measure_secs);
            match measure::scheme(s, o.measure_secs) {
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
