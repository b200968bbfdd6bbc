//! `eudp`: the command that ties the project together.
//!
//! The command line is [`eudp_cli::command::Cli`]; this file dispatches.

use clap::{CommandFactory, Parser};
use eudp_cli::command::{Cli, Cmd, TestbedOp, WorkerRole};
use eudp_cli::worker::Mode;
use eudp_cli::{bench, testbed, worker};
use std::time::Duration;

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
        Cmd::Run(a) => eudp_cli::run::run_main(&a),
        Cmd::Stat(a) => eudp_cli::stat_view::stat_main(&a),
        Cmd::WorkerTcp { words } => eudp_cli::tcpbench::worker_main(&words),
        Cmd::Bench { soak: Some(minutes), out, .. } => match eudp_cli::soak::run(minutes, &out) {
            Ok((_, path)) => {
                eprintln!("bench: wrote {}", path.display());
                0
            }
            Err(e) => fail(e),
        },
        Cmd::Bench { apps: true, secs, out, repeats, .. } => {
            match eudp_cli::run::bench_apps(secs.ceil().max(1.0) as u32, repeats.clamp(1, 50) as u32, &out) {
                Ok(_) => 0,
                Err(e) => fail(e),
            }
        }
        Cmd::Bench { tcp: true, secs, out, repeats, .. } => bench_tcp(secs, repeats, &out),
        Cmd::Bench { emp: true, secs, schemes, out, no_json, .. } => bench_emp(secs, schemes, out, no_json),
        Cmd::Bench { mcast: true, sizes, out, no_json, .. } => {
            match eudp_cli::mcastbench::bench(&sizes, (!no_json).then_some(out.as_path())) {
                Ok((r, path)) => {
                    print!("{}", eudp_cli::mcastbench::table(&r));
                    if let Some(p) = path {
                        eprintln!("bench: wrote {}", p.display());
                    }
                    0
                }
                Err(e) => fail(e),
            }
        }
        Cmd::Bench { async_send: true, secs, sizes, parts, recv_rows, out, no_json, repeats, .. } => {
            bench_async(secs, sizes, parts, recv_rows, repeats, out, no_json)
        }
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
            WorkerRole::Impair(a) => eudp_cli::impair::relay::main(&a),
            WorkerRole::Kbase(a) => eudp_cli::kbase::main(&a),
            WorkerRole::Emp(a) => eudp_cli::worker_emp::main(&a),
        },
        Cmd::Model(a) => eudp_model::cli::run_model(&a),
        Cmd::Sim(a) => eudp_model::cli::run_sim(&a),
        Cmd::Verify(a) => eudp_verify::cli::run_verify(a),
        Cmd::Trace(a) => eudp_cli::trace::run_trace(a),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "eudp", &mut std::io::stdout());
            0
        }
        Cmd::Man { out } => man(out.as_deref()),
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

fn bench_emp(secs: f64, schemes: Vec<String>, out: std::path::PathBuf, no_json: bool) -> i32 {
    use eudp_cli::bench_emp;
    let program = match std::env::current_exe() {
        Ok(p) => p.display().to_string(),
        Err(e) => return fail(format!("the eudp executable: {e}")),
    };
    let args = bench_emp::EmpBenchArgs { secs, schemes, out_dir: (!no_json).then_some(out), program };
    match bench_emp::run(&args) {
        Ok((res, path)) => {
            print!("{}", eudp_cli::bench_emp_targets::table(&res));
            if let Some(p) = path {
                eprintln!("bench: wrote {}", p.display());
            }
            0
        }
        Err(e) => fail(e),
    }
}

fn bench_async(
    secs: f64,
    sizes: Vec<usize>,
    parts: Vec<eudp_cli::bench_async::AsyncPart>,
    recv_rows: Vec<String>,
    repeats: usize,
    out: std::path::PathBuf,
    no_json: bool,
) -> i32 {
    use eudp_cli::bench_async;
    // The general default (64,1472) gives way to the sizes paper 001 compares.
    let sizes = if sizes == [64, 1472] { bench_async::DEFAULT_SIZES.to_vec() } else { sizes };
    let args = bench_async::AsyncBenchArgs {
        secs,
        sizes,
        parts,
        recv_rows,
        rounds: repeats.clamp(1, 50),
        out_dir: (!no_json).then_some(out),
    };
    match bench_async::run(&args) {
        Ok(res) => {
            print!("{}", bench_async::table(&res));
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

/// `eudp man`: the page of eudp on stdout, or every page into `out`.
fn man(out: Option<&std::path::Path>) -> i32 {
    let r = match out {
        None => clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout()),
        Some(dir) => std::fs::create_dir_all(dir).and_then(|_| clap_mangen::generate_to(Cli::command(), dir)),
    };
    match r {
        Ok(()) => {
            if let Some(d) = out {
                eprintln!("eudp man: wrote the pages to {}", d.display());
            }
            0
        }
        Err(e) => fail(e),
    }
}
