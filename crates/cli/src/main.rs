//! `eudp`: the command that ties the project together.
//!
//! Subcommands owned by other crates (`model`, `sim`, `verify`) take their
//! arguments verbatim and parse them in their own crate, so each concern keeps
//! one home.

use clap::{Parser, Subcommand};
use eudp_cli::worker::Mode;
use eudp_cli::{bench, testbed, worker};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "eudp", version, about = "User-space UDP offload engine, measurement, model and verification")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The main job: build a testbed, run a short bench, print it, tear down.
    Demo {
        /// Seconds per transfer.
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
    },
    /// Two network-namespace hosts joined by veth (198.18.0.1 and .2).
    Testbed {
        #[command(subcommand)]
        op: TestbedOp,
    },
    /// Kernel, sendmmsg, GSO/GRO ceiling and eudp side by side on a testbed.
    Bench {
        /// Datagram sizes in bytes.
        #[arg(long, value_delimiter = ',', default_values_t = vec![64usize, 1472])]
        sizes: Vec<usize>,
        /// Modes to run.
        #[arg(long, value_delimiter = ',', value_enum, default_values_t = vec![Mode::Kernel, Mode::Mmsg, Mode::Gso, Mode::Eudp])]
        modes: Vec<Mode>,
        /// Seconds per transfer.
        #[arg(long, default_value_t = 3.0)]
        secs: f64,
        /// Directory for the JSON result.
        #[arg(long, default_value = "bench/results")]
        out: std::path::PathBuf,
        /// Do not write JSON.
        #[arg(long)]
        no_json: bool,
        /// Unmodified programs instead: iperf3 and sockperf, kernel vs `eudp run`.
        #[arg(long, conflicts_with = "tcp")]
        apps: bool,
        /// One program with --count UDP sockets in one epoll set (a DNS server's shape), kernel vs `eudp run`.
        #[arg(long, conflicts_with_all = ["tcp", "apps"])]
        sockets: bool,
        /// With --sockets: the number of sockets.
        #[arg(long, default_value_t = 10_000)]
        count: u64,
        /// With --sockets: the server's RLIMIT_NOFILE (default: what the kernel run needs plus headroom).
        #[arg(long)]
        nofile: Option<u64>,
        /// The UDP-over-TCP transport: kernel UDP vs eudp (kernel backend) vs eudp (tcp backend).
        #[arg(long)]
        tcp: bool,
        /// With --tcp or --apps: interleaved repetitions per mode (medians are reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    /// Run an unmodified program with its UDP sockets on the engine (LD_PRELOAD):
    /// eudp run [--profile NAME] [--profile-file FILE] [--transport kernel|tcp|xdp] [--] PROGRAM ARGS…;
    /// eudp run --list-profiles [--profile-file FILE].
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Per-socket counters of programs running under `eudp run`.
    Stat {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// One side of a UDP-over-TCP transfer (used by `bench --tcp`).
    #[command(hide = true, name = "worker-tcp")]
    WorkerTcp {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        words: Vec<String>,
    },
    /// One side of a measured transfer (used by bench and tests).
    #[command(hide = true)]
    Worker {
        #[command(subcommand)]
        role: WorkerRole,
    },
    /// Analytical performance model (paper 000 §4.4, paper 001 §5.1).
    Model {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Discrete-event simulator of host, I/O bus, NIC and link.
    Sim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Per-packet, per-layer time flow on one clock: chart, table, fits.
    Trace {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Check the pipeline and engine state machines with Spin.
    Verify {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

#[derive(Subcommand)]
enum TestbedOp {
    /// Create testbed NAME (replacing leftovers of the same name).
    Up { name: String },
    /// Remove testbed NAME.
    Down { name: String },
    /// Run CMD inside host a (default) or b of testbed NAME.
    Exec {
        name: String,
        #[arg(long, default_value = "a", value_parser = ["a", "b"])]
        host: String,
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(Subcommand)]
enum WorkerRole {
    Send {
        #[arg(long, value_enum)]
        mode: Mode,
        #[arg(long)]
        dst: SocketAddr,
        #[arg(long)]
        size: usize,
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
        #[arg(long, default_value_t = 0)]
        count: u64,
        #[arg(long, default_value_t = 0)]
        pace_every: u64,
        #[arg(long, default_value_t = 0.0)]
        rate_pps: f64,
    },
    Recv {
        #[arg(long, value_enum)]
        mode: Mode,
        #[arg(long)]
        bind: SocketAddr,
        #[arg(long)]
        size: usize,
        #[arg(long, default_value_t = 0)]
        count: u64,
        #[arg(long, default_value_t = 500)]
        idle_ms: u64,
        #[arg(long, default_value_t = 20.0)]
        max_secs: f64,
    },
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("eudp: {msg}");
    1
}

fn print_report(r: Result<worker::Report, String>) -> i32 {
    match r {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).unwrap_or_default());
            0
        }
        Err(e) => fail(e),
    }
}

fn check_size(size: usize) -> Result<(), String> {
    if size == 0 || size > 65_507 {
        return Err(format!("datagram size {size} out of range 1..=65507"));
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Demo { secs } => demo(secs),
        Cmd::Testbed { op } => match op {
            TestbedOp::Up { name } => match testbed::Testbed::up(&name) {
                Ok(tb) => {
                    println!(
                        "testbed {name}: host a = {} ({}), host b = {} ({})",
                        tb.netns('a'),
                        testbed::ADDR_A,
                        tb.netns('b'),
                        testbed::ADDR_B
                    );
                    tb.keep();
                    0
                }
                Err(e) => fail(e),
            },
            TestbedOp::Down { name } => match testbed::Testbed::existing(&name) {
                Ok(tb) => {
                    tb.teardown();
                    0
                }
                Err(e) => fail(e),
            },
            TestbedOp::Exec { name, host, cmd } => match testbed::Testbed::existing(&name) {
                Ok(tb) => {
                    let h = host.chars().next().unwrap_or('a');
                    match tb.command(h, &cmd[0]).args(&cmd[1..]).status() {
                        Ok(s) => s.code().unwrap_or(1),
                        Err(e) => fail(e),
                    }
                }
                Err(e) => fail(e),
            },
        },
        Cmd::Run { args } => eudp_cli::run::run_main(&args),
        Cmd::Stat { args } => eudp_cli::run::stat_main(&args),
        Cmd::WorkerTcp { words } => eudp_cli::tcpbench::worker_main(&words),
        Cmd::Bench { apps: true, secs, out, repeats, .. } => {
            match eudp_cli::run::bench_apps(secs.ceil().max(1.0) as u32, repeats.clamp(1, 50) as u32, &out) {
                Ok(_) => 0,
                Err(e) => fail(e),
            }
        }
        Cmd::Bench { tcp: true, secs, out, repeats, .. } => bench_tcp(secs, repeats, &out),
        Cmd::Bench { sockets: true, count, nofile, out, no_json, .. } => {
            match eudp_cli::sockbench::run(&eudp_cli::sockbench::SocketsArgs {
                count,
                out_dir: (!no_json).then_some(out),
                lib: None,
                nofile,
            }) {
                Ok((r, path)) => {
                    print!("{}", eudp_cli::sockbench::table(&r));
                    if let Some(p) = path {
                        eprintln!("bench: wrote {}", p.display());
                    }
                    0
                }
                Err(e) => fail(e),
            }
        }
        Cmd::Bench { sizes, modes, secs, out, no_json, .. } => {
            if let Some(e) = sizes.iter().find_map(|&s| check_size(s).err()) {
                std::process::exit(fail(e));
            }
            let args = bench::BenchArgs { sizes, modes, secs, out_dir: (!no_json).then_some(out) };
            match bench::run(&args) {
                Ok(res) => {
                    bench::print_table(&res);
                    0
                }
                Err(e) => fail(e),
            }
        }
        Cmd::Worker { role } => match role {
            WorkerRole::Send { mode, dst, size, secs, count, pace_every, rate_pps } => {
                print_report(check_size(size).and_then(|_| {
                    worker::send(worker::SendArgs { mode, dst, size, secs, count, pace_every, rate_pps })
                }))
            }
            WorkerRole::Recv { mode, bind, size, count, idle_ms, max_secs } => {
                print_report(check_size(size).and_then(|_| {
                    worker::recv(worker::RecvArgs {
                        mode,
                        bind,
                        size,
                        idle: Duration::from_millis(idle_ms),
                        max: Duration::from_secs_f64(max_secs),
                        count,
                    })
                }))
            }
        },
        Cmd::Model { args } => eudp_model::cli::model_main(&args),
        Cmd::Sim { args } => eudp_model::cli::sim_main(&args),
        Cmd::Verify { args } => eudp_verify::cli::verify_main(&args),
        Cmd::Trace { args } => eudp_cli::trace_cmd::trace_main(&args),
    };
    std::process::exit(code);
}

fn bench_tcp(secs: f64, repeats: usize, out: &std::path::Path) -> i32 {
    use eudp_cli::tcpbench;
    let tb = match testbed::Testbed::up(&testbed::unique_name("tcb")) {
        Ok(tb) => tb,
        Err(e) => return fail(e),
    };
    let program = std::env::current_exe().map(|p| p.display().to_string()).unwrap_or_else(|_| "eudp".into());
    let env = std::env::vars().filter(|(k, _)| k.starts_with("EUDP_")).collect();
    let w = tcpbench::WorkerCmd { program, args: vec!["worker-tcp".into()], env };
    match tcpbench::bench(&tb, &w, 1472, secs, repeats, &out.display().to_string()) {
        Ok((r, path)) => {
            print!("{}", tcpbench::table(&r));
            eprintln!("bench: wrote {path}");
            0
        }
        Err(e) => fail(e),
    }
}

fn demo(secs: f64) -> i32 {
    println!("eudp demo: a two-host testbed (198.18.0.1 -> 198.18.0.2 over veth), {secs} s per transfer\n");
    let args = bench::BenchArgs {
        sizes: vec![64, 1472],
        modes: vec![Mode::Kernel, Mode::Mmsg, Mode::Gso, Mode::Eudp],
        secs,
        out_dir: Some("bench/results".into()),
    };
    match bench::run(&args) {
        Ok(res) => {
            println!();
            bench::print_table(&res);
            0
        }
        Err(e) => fail(e),
    }
}
