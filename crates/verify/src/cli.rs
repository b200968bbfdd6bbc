//! Entry point for `eudp verify`.

/// `eudp verify ARGS`: returns the process exit code.
pub fn verify_main(_args: &[String]) -> i32 {
    eprintln!("eudp verify: not implemented yet");
    2
}
