//! Runs `eudp model ...` / `eudp sim ...` without the full `eudp` binary:
//! `cargo run --release -p eudp-model --example standalone -- sim validate`.
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("model") => eudp_model::cli::model_main(&args[1..]),
        Some("sim") => eudp_model::cli::sim_main(&args[1..]),
        _ => {
            eprintln!("usage: standalone (model|sim) ARGS...");
            2
        }
    };
    std::process::exit(code);
}
