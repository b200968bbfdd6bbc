//! Library side of the `eudp` command: the testbed, the bench and its
//! workers, usable from integration tests.

// `eudp_cli::…` paths resolve both here and in tests that include a module
// with `#[path]` (run.rs reaches `shim_path` that way).
extern crate self as eudp_cli;

pub mod apps_baselines;
pub mod bench;
pub mod bench_async;
pub mod bench_chart;
pub mod bench_emp;
pub mod bench_emp_targets;
pub mod command;
pub mod impair;
pub mod kbase;
pub mod mcastbench;
pub mod profiles;
pub mod rss;
pub mod run;
pub mod run_check;
pub mod shim_path;
pub mod soak;
pub mod sockbench;
pub mod stat_report;
pub mod stat_view;
pub mod sys;
pub mod tcpbench;
pub mod testbed;
pub mod trace;
pub mod trace_costs;
pub mod worker;
pub mod worker_emp;
