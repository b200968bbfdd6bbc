//! `eudp model` and `eudp sim`: their command lines ([`ModelArgs`],
//! [`SimArgs`], embedded by the `eudp` command) and what they run.

mod args;
mod io;
mod model_cmd;
mod sim_cmd;

pub use args::{parse_size, parse_size_list, ModelArgs, PresetArgs, SimArgs, SimCmd, SizeList};

use clap::{CommandFactory, Parser};

// `eudp model` on its own (the standalone example and the tests).
/// Analytical model of 000 §4.4 (eqs. 1-4), Ratemax (000 §4.2) and 001 §5.1.
#[derive(Parser, Debug)]
#[command(name = "eudp model", disable_version_flag = true, args_override_self = true)]
struct ModelCli {
    #[command(flatten)]
    args: ModelArgs,
}

// `eudp sim` on its own (the standalone example and the tests).
/// Discrete-event simulator of host, I/O bus, NIC and link.
#[derive(Parser, Debug)]
#[command(name = "eudp sim", disable_version_flag = true, args_override_self = true)]
struct SimCli {
    #[command(flatten)]
    args: SimArgs,
}

/// Parses `args` (the words after the command's name) with clap; a parse
/// error or help request becomes its exit code.
fn parse<P: Parser>(name: &str, args: &[String]) -> Result<P, i32> {
    P::try_parse_from(std::iter::once(name.to_string()).chain(args.iter().cloned())).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            2
        } else {
            0
        }
    })
}

fn exit_code(r: Result<(), String>, what: &str) -> i32 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("eudp {what}: error: {e}");
            2
        }
    }
}

/// `eudp model ARGS` from words: returns the process exit code.
pub fn model_main(args: &[String]) -> i32 {
    parse::<ModelCli>("eudp model", args).map_or_else(|c| c, |c| run_model(&c.args))
}

/// `eudp sim ARGS` from words: returns the process exit code.
pub fn sim_main(args: &[String]) -> i32 {
    parse::<SimCli>("eudp sim", args).map_or_else(|c| c, |c| run_sim(&c.args))
}

/// Runs `eudp model`: returns the process exit code. With no source and
/// no `--ratemax` it prints its help.
pub fn run_model(a: &ModelArgs) -> i32 {
    if a.is_empty() {
        let _ = ModelCli::command().print_help();
        return 0;
    }
    exit_code(model_cmd::model(a), "model")
}

/// Runs `eudp sim`: returns the process exit code. With no subcommand it
/// prints its help.
pub fn run_sim(a: &SimArgs) -> i32 {
    match &a.cmd {
        None => {
            let _ = SimCli::command().print_help();
            0
        }
        Some(c) => exit_code(sim_cmd::sim(c), "sim"),
    }
}
