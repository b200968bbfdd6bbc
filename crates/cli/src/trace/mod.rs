//! `eudp trace`: per-packet, per-layer time flow on one clock (issue 4).
//!
//! ```text
//! eudp trace [OPTIONS] [-- burst | PROGRAM ARGS...]
//! ```
//!
//! Scenario `burst` (the default): on a fresh testbed, for every stack and
//! every size of the sweep, a receiver on host b and a sender on host a that
//! sends N datagrams back to back (payloads carry their sequence number; the
//! receiver checks order and loss). Each worker records tracepoints
//! (`eudp_engine::tracepoint`) and dumps them; the parent joins the dumps into
//! one path per packet, writes `trace.json`, `trace.svg` and `table.txt` to
//! DIR and prints the table. A PROGRAM is run with `EUDP_TRACE` set; each of
//! its processes that uses eudp endpoints writes its own dump, and the
//! busiest flow among them (one process sending to itself, or a client and
//! its server) is analysed the same way. With `--compare kernel,...` it runs
//! once more with `EUDP_TRACE_STACK=kernel`: the shim then leaves the
//! sockets on the kernel and traces them (`eudp_preload::ktrace`).
//!
//! Hidden: `eudp trace worker send|recv ...` is one side of a transfer.
//!
//! * [`args`]: the command line and the settings it resolves to;
//! * [`run`]: the burst scenario and traced programs;
//! * [`overhead`], [`floor`], [`verdict`]: the `--overhead` harness, its
//!   floor, and its verdict on the budget from per-round ratios;
//! * [`transfer`], [`worker`]: one transfer and its two sides;
//! * [`analysis`], [`output`]: joined paths, the document and its files;
//! * [`emp`]: `--emp`, EMP's seven steps per message and scheme.
//! * [`view_args`]: `--sample`, `--perfetto`, `--attach`; [`attach`]: tracing a running program.

pub mod analysis;
pub mod args;
pub mod attach;
pub mod emp;
pub mod floor;
pub mod output;
pub mod overhead;
pub mod run;
pub mod transfer;
pub mod verdict;
pub mod view_args;
pub mod worker;

pub use analysis::{analyse, analyse_lossy, Analysed, ORDER_TOLERANCE_NS};
pub use args::{parse_args, TraceArgs, TraceOptions, TraceSub, WorkerArgs};
pub use output::{document, write_outputs};
pub use transfer::{transfer, transfer_variant, RxReport, Variant};

use clap::Parser;

/// `eudp trace` from the words after `trace`: returns the exit code (2 for
/// a usage error, 1 when the trace fails).
pub fn trace_main(args: &[String]) -> i32 {
    let words = std::iter::once("eudp trace".to_string()).chain(args.iter().cloned());
    match args::TraceCli::try_parse_from(words) {
        Ok(c) => run_trace(c.opts),
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

/// Runs `eudp trace` with parsed options: returns the exit code.
pub fn run_trace(o: TraceOptions) -> i32 {
    let r = match &o.sub {
        Some(TraceSub::Worker(w)) => worker::worker(w),
        None if o.emp.emp => emp::run(&o.emp, o.size, &o.out, o.testbed.as_deref()),
        None => match o.resolve() {
            Ok(a) => match a.view.attach {
                Some(pid) => attach::attach(&a, pid),
                None => run::run(&a),
            },
            Err(e) => {
                eprintln!("eudp trace: {e}");
                return 2;
            }
        },
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("eudp trace: {e}");
            1
        }
    }
}
