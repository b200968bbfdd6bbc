//! `eudp`: the command that ties the project together.
//!
//! Subcommands owned by other crates (`model`, `sim`, `verify`) take their
//! arguments verbatim and parse them in their own crate, so each concern keeps
//! one home.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "eudp", version, about = "User-space UDP offload engine, measurement, model and verification")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
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
    /// Check the pipeline and engine state machines with Spin.
    Verify {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

fn main() {
    let cli = Cli::parse();
    let code = match cli.cmd {
        Cmd::Model { args } => eudp_model::cli::model_main(&args),
        Cmd::Sim { args } => eudp_model::cli::sim_main(&args),
        Cmd::Verify { args } => eudp_verify::cli::verify_main(&args),
    };
    std::process::exit(code);
}
