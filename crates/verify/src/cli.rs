//! `eudp verify`: its command line ([`VerifyArgs`], embedded by the `eudp`
//! command) and what it runs.

use crate::models::{self, BROKEN};
use crate::spin::{self, Options};
use clap::{Args, Parser};
use eudp_engine::machine::PromelaConfig;
use std::io::Write as _;
use std::path::PathBuf;

/// `println!` that ignores a closed stdout (e.g. `eudp verify | head`).
macro_rules! out {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout(), $($t)*);
    }};
}

const EXAMPLES: &str = "Examples:
  eudp verify
  eudp verify --model engine --apps 2 --per-app 2
  eudp verify --broken no-dma-lock
  eudp verify --model emp --broken window-off-by-one
  eudp verify --list";

/// Check the firmware pipeline (paper 000 §4.3), eudp's two-level queue and an EMP flow with Spin.
///
/// Exit status: 0 when every verdict is as expected, 1 when some is not,
/// 2 on a usage or tool error.
#[derive(Args, Debug, Clone)]
#[command(after_help = EXAMPLES)]
pub struct VerifyArgs {
    /// Only these models: firmware, engine, emp (repeatable).
    #[arg(long = "model", value_name = "NAME")]
    models: Vec<String>,
    /// Only these properties (repeatable; see --list).
    #[arg(long = "only", value_name = "PROPERTY")]
    only: Vec<String>,
    /// Check a deliberately broken variant instead (it must fail; see --list).
    #[arg(long, value_name = "NAME")]
    broken: Option<String>,
    /// List models, properties and broken variants.
    #[arg(long)]
    list: bool,
    /// Write the Promela models into DIR and exit.
    #[arg(long, value_name = "DIR")]
    emit_promela: Option<PathBuf>,
    /// Run in DIR and keep models, pan sources, outputs and trails there.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
    /// Also print the witness trails of reachable properties.
    #[arg(long)]
    witness: bool,
    /// Engine model: application threads.
    #[arg(long, default_value_t = 3)]
    apps: u32,
    /// Engine model: datagrams per application thread.
    #[arg(long, default_value_t = 2)]
    per_app: u32,
    /// Engine model: L2 bound (descriptors).
    #[arg(long, default_value_t = 2)]
    l2: u32,
    /// Engine model: L1 capacity (datagrams).
    #[arg(long, default_value_t = 2)]
    l1: u32,
    /// Engine model: the engine polls when idle instead of blocking.
    #[arg(long)]
    busy_poll: bool,
    /// Check liveness without weak fairness (a polling engine then starves the others).
    #[arg(long)]
    no_fairness: bool,
    /// Depth bound of the depth-first (liveness) searches.
    #[arg(long, default_value_t = 1_000_000)]
    depth: u32,
}

fn list() {
    out!("models and properties:");
    for m in [
        models::firmware(None),
        models::engine(None, &PromelaConfig::default()),
        models::emp(None, &Default::default()),
    ] {
        for p in &m.properties {
            let how = match p.mode {
                models::Mode::Safety => "safety",
                models::Mode::EndState => "end states",
                models::Mode::Liveness => "liveness, weak fairness",
            };
            let expect = match p.expect {
                models::Expect::Holds => "must hold",
                models::Expect::Reachable => "must be reachable",
            };
            out!("  {:<9} {:<22} {} ({how}; {expect})", m.name, p.name, p.meaning);
        }
    }
    out!("\nbroken variants (--broken NAME; each must be reported):");
    for b in BROKEN {
        out!("  {:<19} {:<9} {}\n  {:<19} {:<9} breaks: {}", b.name, b.model, b.what, "", "", b.breaks.join(", "));
    }
}

// `eudp verify` on its own (tests and scripts that hold the words).
/// Check the firmware pipeline (paper 000 §4.3), eudp's two-level queue and an EMP flow with Spin.
#[derive(Parser, Debug)]
#[command(name = "eudp verify", disable_version_flag = true)]
struct VerifyCli {
    #[command(flatten)]
    args: VerifyArgs,
}

/// `eudp verify ARGS` from words: returns the process exit code (0: every
/// verdict as expected; 1: some verdict unexpected; 2: usage or tool error).
pub fn verify_main(args: &[String]) -> i32 {
    let argv = std::iter::once("eudp verify".to_string()).chain(args.iter().cloned());
    match VerifyCli::try_parse_from(argv) {
        Ok(c) => run_verify(c.args),
        Err(e) => {
            let _ = e.print();
            if e.use_stderr() {
                2
            } else {
                0
            }
        }
    }
}

/// Runs `eudp verify`: returns the process exit code (see [`verify_main`]).
pub fn run_verify(a: VerifyArgs) -> i32 {
    if a.list {
        list();
        return 0;
    }
    if a.apps == 0 || a.per_app == 0 || a.l2 == 0 || a.l1 == 0 || a.apps * a.per_app > 8 {
        eprintln!("eudp verify: --apps, --per-app, --l2, --l1 must be >= 1 and apps * per-app <= 8");
        return 2;
    }
    let opts = Options {
        models: a.models,
        only: a.only,
        broken: a.broken,
        engine: PromelaConfig {
            apps: a.apps,
            per_app: a.per_app,
            l2_bound: a.l2,
            l1_cap: a.l1,
            unlocked: vec![],
            busy_poll: a.busy_poll,
        },
        emp: Default::default(),
        keep: a.keep,
        depth: a.depth,
        no_fairness: a.no_fairness,
    };
    if let Some(dir) = &a.emit_promela {
        return match spin::emit(&opts, dir) {
            Ok(paths) => {
                for p in paths {
                    out!("wrote {}", p.display());
                }
                0
            }
            Err(e) => {
                eprintln!("eudp verify: {e}");
                2
            }
        };
    }
    if let Some(b) = opts.broken.as_deref().and_then(models::broken) {
        out!("checking deliberately broken variant `{}`: {}", b.name, b.what);
        out!("expected to break: {}\n", b.breaks.join(", "));
    }
    let mut header = false;
    let report = spin::run(&opts, &mut |o| {
        if !header {
            out!(
                "{:<9} {:<22} {:<11} {:>4} {:>10} {:>6} {:>8}",
                "model",
                "property",
                "verdict",
                "",
                "states",
                "depth",
                "time"
            );
            header = true;
        }
        out!(
            "{:<9} {:<22} {:<11} {:>4} {:>10} {:>6} {:>7.2}s",
            o.model,
            o.property,
            o.verdict_text(),
            if o.ok { "ok" } else { "FAIL" },
            o.states as u64,
            o.depth,
            o.seconds
        );
        if let (Some(t), true) = (&o.trail, !o.ok || a.witness) {
            let what = if o.ok { "witness" } else { "counterexample" };
            out!("  {what} ({}):", o.error.as_deref().unwrap_or("trail"));
            let _ = write!(std::io::stdout(), "{t}");
        }
    });
    match report {
        Ok(r) => {
            let bad: Vec<_> = r.outcomes.iter().filter(|o| !o.ok).map(|o| o.property).collect();
            if bad.is_empty() {
                out!("\nall {} properties as expected", r.outcomes.len());
                0
            } else {
                out!("\nunexpected verdicts: {}", bad.join(", "));
                1
            }
        }
        Err(e) => {
            eprintln!("eudp verify: {e}");
            2
        }
    }
}
