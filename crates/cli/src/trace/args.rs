//! The command line of `eudp trace` ([`TraceOptions`], clap) and the
//! settings it resolves to ([`TraceArgs`]).

use super::transfer::Variant;
use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;

const EXAMPLES: &str = "Examples:
  eudp trace --compare kernel,eudp --sizes 64,1472
  eudp trace --packets 20 -- eudp run -- python3 client.py
  eudp trace --overhead 8 --overhead-modes full,control --sizes 64,256
  eudp trace --emp --scheme base,ro --size 16384 --pattern stream";

/// Per-packet, per-layer time flow on one clock: chart, table, fits.
///
/// With no PROGRAM (or `burst`), a fresh testbed carries a burst per stack
/// and size; a PROGRAM runs with `EUDP_TRACE` set (its sockets must go
/// through eudp: `eudp trace -- eudp run -- PROGRAM`). Writes trace.json,
/// trace.svg and table.txt to --out.
#[derive(Args, Clone, Debug)]
#[command(after_help = EXAMPLES)]
pub struct TraceOptions {
    #[command(subcommand)]
    pub sub: Option<TraceSub>,
    /// Packets charted (the first N of each run).
    #[arg(long, value_name = "N", default_value_t = 32)]
    pub packets: u64,
    /// Packets per run (at least --packets); the table uses all of them.
    #[arg(long, value_name = "M", default_value_t = 512)]
    pub run_packets: u64,
    /// Datagram size charted (bytes); it joins the sweep.
    #[arg(long, value_name = "BYTES", default_value_t = 1472)]
    pub size: u64,
    /// Datagram sizes of the sweep [default: 64,256,512,1024,1472].
    #[arg(long, value_name = "A,B,..", value_delimiter = ',')]
    pub sizes: Vec<u64>,
    /// Stacks to compare [default: kernel,eudp; a PROGRAM runs on eudp only].
    #[arg(long, visible_alias = "stacks", value_name = "S1,S2", value_delimiter = ',', value_parser = ["kernel", "eudp"])]
    pub compare: Vec<String>,
    /// Output directory.
    #[arg(long, value_name = "DIR", default_value = "trace-out")]
    pub out: std::path::PathBuf,
    /// Use this existing testbed instead of a fresh one.
    #[arg(long, value_name = "NAME")]
    pub testbed: Option<String>,
    /// Instead of tracing: REPS alternating untraced/traced transfers per stack and size, comparing rates.
    #[arg(long, value_name = "REPS", default_value_t = 0)]
    pub overhead: u32,
    /// Traced settings --overhead compares with untraced runs: full, user, txstamps, rxstamps, noclock, recvmmsg, sampleN, control.
    #[arg(long, value_name = "M1,M2", value_delimiter = ',', default_value = "full")]
    pub overhead_modes: Vec<String>,
    #[command(flatten)]
    pub emp: super::emp::EmpTraceOptions,
    #[command(flatten)]
    pub view: super::view_args::ViewOptions,
    /// `burst` (the built-in scenario, the default) or the program to trace and its arguments.
    #[arg(trailing_var_arg = true, value_name = "burst | PROGRAM [ARGS]")]
    pub target: Vec<String>,
}

#[derive(Subcommand, Clone, Debug)]
pub enum TraceSub {
    /// One side of a traced transfer (run by `eudp trace` on a testbed host).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// One side of a traced transfer.
#[derive(Args, Clone, Debug)]
pub struct WorkerArgs {
    /// The side: send or recv.
    #[arg(value_parser = ["send", "recv"])]
    pub role: String,
    /// The stack: eudp or kernel.
    #[arg(long, default_value = "eudp", value_parser = ["eudp", "kernel"])]
    pub stack: String,
    /// Datagram size (bytes).
    #[arg(long, default_value_t = 64)]
    pub size: usize,
    /// Datagrams to send or receive.
    #[arg(long, default_value_t = 1)]
    pub count: u64,
    /// The receiver's address (send: to, recv: bind).
    #[arg(long, default_value = "0.0.0.0:9400")]
    pub addr: SocketAddr,
    /// Where the trace dump goes.
    #[arg(long, default_value = "")]
    pub out: String,
    /// Untraced.
    #[arg(long)]
    pub off: bool,
    /// The receiver does not tag datagrams with their sequence numbers.
    #[arg(long)]
    pub no_tag: bool,
}

impl WorkerArgs {
    pub fn trace(&self) -> bool {
        !self.off
    }
    pub fn tag(&self) -> bool {
        !self.no_tag
    }
}

/// Settings of `eudp trace`.
#[derive(Clone, Debug)]
pub struct TraceArgs {
    /// Packets charted (the first N of each run).
    pub packets: u64,
    /// Packets per run (at least `packets`); the table uses all of them.
    pub run_packets: u64,
    pub size: u64,
    pub sizes: Vec<u64>,
    pub stacks: Vec<String>,
    pub out: std::path::PathBuf,
    pub testbed: Option<String>,
    /// Empty or `burst`: the built-in scenario; otherwise a program.
    pub target: Vec<String>,
    /// Instead of tracing: this many alternating untraced/traced transfers
    /// per stack and size, comparing their receive rates.
    pub overhead_reps: u32,
    /// The traced settings `--overhead` compares with untraced runs
    /// ([`Variant::named`]); default `full`.
    pub overhead_modes: Vec<String>,
    /// `--compare` was given (a PROGRAM runs once per stack only then).
    pub stacks_given: bool,
    /// `--sample`, `--perfetto`, `--attach`.
    pub view: super::view_args::ViewOptions,
}

impl TraceOptions {
    /// Checks the options and fills in the defaults that depend on others.
    pub fn resolve(self) -> Result<TraceArgs, String> {
        let sizes_given = !self.sizes.is_empty();
        let stacks_given = !self.compare.is_empty();
        let mut a = TraceArgs {
            packets: self.packets,
            run_packets: self.run_packets,
            size: self.size,
            sizes: if sizes_given { self.sizes } else { vec![64, 256, 512, 1024, 1472] },
            stacks: if stacks_given { self.compare } else { vec!["kernel".into(), "eudp".into()] },
            out: self.out,
            testbed: self.testbed,
            target: self.target,
            overhead_reps: self.overhead,
            overhead_modes: self.overhead_modes,
            stacks_given,
            view: self.view,
        };
        a.overhead_modes.extend(a.view.overhead_mode().filter(|m| !a.overhead_modes.contains(m)));
        if a.packets == 0 || a.size == 0 {
            return Err("--packets and --size must be positive".into());
        }
        for m in &a.overhead_modes {
            Variant::named(m)?;
        }
        // The charted size joins the sweep, except where nothing is charted:
        // `--overhead` measures the sizes it is given and no others.
        let charted = !(sizes_given && a.overhead_reps > 0);
        if charted && !a.sizes.contains(&a.size) {
            a.sizes.push(a.size);
        }
        a.sizes.sort_unstable();
        a.sizes.dedup();
        a.run_packets = a.run_packets.max(a.packets);
        Ok(a)
    }
}

// `eudp trace` on its own, for callers that hold the words.
/// Per-packet, per-layer time flow on one clock: chart, table, fits.
#[derive(Parser, Debug)]
#[command(name = "eudp trace", disable_version_flag = true)]
pub struct TraceCli {
    #[command(flatten)]
    pub opts: TraceOptions,
}

/// Parses and resolves the words after `trace` (no worker subcommand).
pub fn parse_args(args: &[String]) -> Result<TraceArgs, String> {
    let words = std::iter::once("eudp trace".to_string()).chain(args.iter().cloned());
    TraceCli::try_parse_from(words).map_err(|e| e.to_string())?.opts.resolve()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overhead_modes_parse() {
        let a = parse_args(&[
            "--overhead".into(),
            "3".into(),
            "--overhead-modes".into(),
            "full,user,noclock,sample16".into(),
        ])
        .unwrap();
        assert_eq!(a.overhead_reps, 3);
        assert_eq!(a.overhead_modes, ["full", "user", "noclock", "sample16"]);
        assert_eq!(parse_args(&[]).unwrap().overhead_modes, ["full"]);
        // `--overhead` runs the sizes it is given, not the charted size too.
        let args = |v: &[&str]| parse_args(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        assert_eq!(args(&["--overhead", "2", "--sizes", "64"]).sizes, [64]);
        assert_eq!(args(&["--sizes", "64"]).sizes, [64, 1472]);
        assert_eq!(args(&["--sizes", "64", "--size", "256"]).sizes, [64, 256]);
        assert!(parse_args(&["--overhead-modes".into(), "fast".into()]).is_err());
        assert!(parse_args(&["--overhead-modes".into(), "samplex".into()]).is_err());
        let full = Variant::named("full").unwrap();
        assert!(full.trace && full.complete && full.env.is_empty());
        let off = Variant::named("off").unwrap();
        assert!(!off.trace && !off.complete);
        // The control runs exactly what `off` runs.
        let control = Variant::named("control").unwrap();
        assert!(!control.trace && !control.complete && control.env == off.env);
        // One datagram in N, every layer of it.
        let s = Variant::named("sample16").unwrap();
        assert!(s.trace && s.complete && s.sample == 16);
        assert_eq!(s.env, [("EUDP_TRACE_SAMPLE", "16")]);
        assert_eq!(args(&["--overhead", "2", "--sample", "8"]).overhead_modes, ["full", "sample8"]);
        assert!(parse_args(&["--sample".into(), "0".into()]).is_err());
        // These leave layers out (user) or have no timing
        // (noclock): their traces are not held to be complete.
        for (m, var, val) in [
            ("user", "EUDP_TRACE_KERNEL", "0"),
            ("txstamps", "EUDP_TRACE_KERNEL", "tx"),
            ("rxstamps", "EUDP_TRACE_KERNEL", "rx"),
            ("noclock", "EUDP_TRACE_CLOCK", "none"),
        ] {
            let v = Variant::named(m).unwrap();
            assert!(v.trace && !v.complete, "{m}");
            assert_eq!(v.env, [(var, val)], "{m}");
        }
        // Another stamp reader records the same points: held to complete traces.
        let r = Variant::named("recvmmsg").unwrap();
        assert!(r.trace && r.complete);
        assert_eq!(r.env, [("EUDP_TRACE_STAMP_READER", "recvmmsg")]);
    }
}
