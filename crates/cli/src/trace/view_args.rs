//! Options of `eudp trace` that choose which datagrams are traced and
//! where else the result goes: `--sample`, `--perfetto`, `--attach`.

use clap::Args;

/// Sampling, Perfetto export and attaching to a running program.
#[derive(Args, Clone, Debug, Default)]
pub struct ViewOptions {
    /// Trace one datagram in N (whole paths: every layer of one run of 64 consecutive datagrams in N). With --overhead it adds the setting sampleN.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub sample: u64,
    /// Also write the charted records as Chrome Trace Event JSON (opens in ui.perfetto.dev).
    #[arg(long, value_name = "FILE")]
    pub perfetto: Option<std::path::PathBuf>,
    /// Trace a program already running under `eudp run` (its pid) for --for seconds, instead of starting one.
    #[arg(long, value_name = "PID", conflicts_with = "overhead")]
    pub attach: Option<u32>,
    /// How long --attach traces, in seconds.
    #[arg(long = "for", value_name = "SECONDS", default_value_t = 2.0, requires = "attach")]
    pub attach_secs: f64,
}

impl ViewOptions {
    /// The `--overhead` setting `--sample` stands for, if any.
    pub fn overhead_mode(&self) -> Option<String> {
        (self.sample > 1).then(|| format!("sample{}", self.sample))
    }
}
