//! Entry points for `eudp model` and `eudp sim`.

/// `eudp model ARGS`: returns the process exit code.
pub fn model_main(_args: &[String]) -> i32 {
    eprintln!("eudp model: not implemented yet");
    2
}

/// `eudp sim ARGS`: returns the process exit code.
pub fn sim_main(_args: &[String]) -> i32 {
    eprintln!("eudp sim: not implemented yet");
    2
}
