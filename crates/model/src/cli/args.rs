//! The command lines of `eudp model` and `eudp sim` (clap).

use clap::{Args, Subcommand};

/// A comma-separated list of sizes (`1,1k,4k,32k`; k = 1024, M = 1024²).
#[derive(Clone, Debug, PartialEq)]
pub struct SizeList(pub Vec<f64>);

/// Parses `1024`, `4k`, `32K`, `1M` (k = 1024).
pub fn parse_size(s: &str) -> Result<f64, String> {
    let s = s.trim();
    let (num, mul) = match s.chars().last() {
        Some('k') | Some('K') => (&s[..s.len() - 1], 1024.0),
        Some('m') | Some('M') => (&s[..s.len() - 1], 1024.0 * 1024.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>().map(|v| v * mul).map_err(|_| format!("bad size {s:?}"))
}

/// Parses a [`SizeList`]; empty items are skipped.
pub fn parse_size_list(s: &str) -> Result<SizeList, String> {
    s.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| parse_size(x).map_err(|_| format!("bad list item {x:?}")))
        .collect::<Result<Vec<_>, _>>()
        .map(SizeList)
}

const MODEL_EXAMPLES: &str = "Examples:
  eudp model --preset 000 --stack eudp --sizes 1k,4k,32k --svg lat.svg
  eudp model --preset 001 --stack udp --dominant
  eudp model --trace trace-out/trace.json
  eudp model --ratemax 4,8,100";

/// Analytical model of 000 §4.4 (eqs. 1-4), Ratemax (000 §4.2) and 001 §5.1.
///
/// The layers come from one source: a preset's stack, a layers JSON or a
/// trace whose per-layer `g + B·G` is fitted first.
#[derive(Args, Clone, Debug, Default)]
#[command(after_help = MODEL_EXAMPLES)]
pub struct ModelArgs {
    /// Source: a preset (shipped id such as 000, or a JSON file); needs --stack.
    #[arg(long, value_name = "NAME|FILE", help_heading = "Source")]
    pub preset: Option<String>,
    /// The preset's stack (g = per-packet + S, G = per-byte).
    #[arg(long, value_name = "STACK", help_heading = "Source")]
    pub stack: Option<String>,
    /// Source: JSON [{"name":..,"g_ns":..,"big_g_ns":..,"s_ns":..}].
    #[arg(long, value_name = "FILE", help_heading = "Source")]
    pub layers: Option<String>,
    /// Source: fit g + B*G per layer from a trace JSON (layer, packet, bytes, t_start_ns, t_end_ns[, host]).
    #[arg(long, value_name = "FILE", help_heading = "Source")]
    pub trace: Option<String>,
    /// Packet sizes, e.g. 1,1k,4k,32k (default: powers of two up to the MTU or 64k).
    #[arg(long, value_name = "LIST", value_parser = parse_size_list)]
    pub sizes: Option<SizeList>,
    /// Fine-grained threshold t in bytes (default: the stack's, else 2048).
    #[arg(long, value_name = "BYTES")]
    pub threshold: Option<f64>,
    /// Packets for the finite-m bandwidth.
    #[arg(long, value_name = "M", default_value_t = 1000)]
    pub packets: usize,
    /// Override every bus resource (pci32/33, pci64/66, pci64/133, pcie3x8, ...).
    #[arg(long, value_name = "NAME")]
    pub bus: Option<String>,
    /// Override every link rate (Mbit/s).
    #[arg(long, value_name = "X")]
    pub link_mbps: Option<f64>,
    /// 001 §5.1 view: per-layer latency, dominant layer, size / dominant latency.
    #[arg(long)]
    pub dominant: bool,
    /// Print Ratemax = (N + L2) / T.
    #[arg(long, value_name = "N,L2,T_US")]
    pub ratemax: Option<String>,
    /// Write the table as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<String>,
    /// Write latency and bandwidth plots (FILE, and FILE with -bw before .svg).
    #[arg(long, value_name = "FILE")]
    pub svg: Option<String>,
}

impl ModelArgs {
    /// Nothing asked: the command prints its help.
    pub fn is_empty(&self) -> bool {
        self.preset.is_none() && self.layers.is_none() && self.trace.is_none() && self.ratemax.is_none()
    }
}

const SIM_EXAMPLES: &str = "Examples:
  eudp sim run --preset 000 --stack eudp --sizes 1k,32k --pingpong
  eudp sim timeline --preset 000 --stack eudp --messages 10 --svg flow.svg
  eudp sim validate --markdown";

/// Discrete-event simulator of host, I/O bus, NIC and link.
#[derive(Args, Clone, Debug)]
#[command(after_help = SIM_EXAMPLES)]
pub struct SimArgs {
    #[command(subcommand)]
    pub cmd: Option<SimCmd>,
}

/// A preset with optional bus and link overrides.
#[derive(Args, Clone, Debug)]
pub struct PresetArgs {
    /// Preset: a shipped id (000 ... 004) or a JSON file.
    #[arg(long, value_name = "NAME|FILE")]
    pub preset: String,
    /// The preset's stack to simulate.
    #[arg(long, value_name = "STACK")]
    pub stack: String,
    /// Override every bus resource (pci32/33, pci64/66, pci64/133, pcie3x8, ...).
    #[arg(long, value_name = "NAME")]
    pub bus: Option<String>,
    /// Override every link rate (Mbit/s).
    #[arg(long, value_name = "X")]
    pub link_mbps: Option<f64>,
    /// Measured EMP step costs (`eudp trace --emp` JSON) in place of the 003 preset's.
    #[arg(long, value_name = "FILE")]
    pub step_costs: Option<String>,
}

#[derive(Subcommand, Clone, Debug)]
pub enum SimCmd {
    /// One-way latency and steady bandwidth per size.
    ///
    /// Latency is that of one message, or with --pingpong half the mean round
    /// trip of 8 exchanges (as 000 §5.2 and 003 §6.2 measure it); bandwidth
    /// that of N back-to-back messages.
    #[command(after_help = "Example:\n  eudp sim run --preset 000 --stack eudp --sizes 1k,32k --csv run.csv")]
    Run {
        #[command(flatten)]
        preset: PresetArgs,
        /// Message sizes (default: powers of two up to 64k).
        #[arg(long, value_name = "LIST", value_parser = parse_size_list)]
        sizes: Option<SizeList>,
        /// Messages of the bandwidth run.
        #[arg(long, value_name = "N", default_value_t = 64)]
        messages: usize,
        /// Send in both directions at once.
        #[arg(long)]
        bidir: bool,
        /// Latency as half the mean round trip of a ping-pong.
        #[arg(long)]
        pingpong: bool,
        /// Write the table as CSV.
        #[arg(long, value_name = "FILE")]
        csv: Option<String>,
        /// Write latency and bandwidth plots (FILE, and FILE with -bw before .svg).
        #[arg(long, value_name = "FILE")]
        svg: Option<String>,
    },
    /// Time-flow chart of a burst (default ten 32 KB packets).
    #[command(
        after_help = "Example:\n  eudp sim timeline --preset 000 --stack eudp --layers sender --json t.json --svg t.svg"
    )]
    Timeline {
        #[command(flatten)]
        preset: PresetArgs,
        /// Message size (e.g. 32k).
        #[arg(long, value_name = "BYTES", value_parser = parse_size, default_value = "32768")]
        size: f64,
        /// Messages in the burst.
        #[arg(long, value_name = "N", default_value_t = 10)]
        messages: usize,
        /// Keep these layers: by name, host (sender/receiver) or host:layer, comma-separated.
        #[arg(long, value_name = "L1,L2")]
        layers: Option<String>,
        /// Write the records as trace JSON.
        #[arg(long, value_name = "FILE")]
        json: Option<String>,
        /// Write the time-flow chart.
        #[arg(long, value_name = "FILE")]
        svg: Option<String>,
        /// Write the records as Chrome Trace Event JSON (opens in ui.perfetto.dev).
        #[arg(long, value_name = "FILE")]
        perfetto: Option<String>,
    },
    /// A parameter grid (stacks x buses x links x sizes), run in parallel.
    #[command(
        after_help = "Example:\n  eudp sim sweep --preset 000 --stacks eudp,coarse --buses pci32/33,pci64/66 --csv sweep.csv"
    )]
    Sweep {
        /// Preset: a shipped id (000 ... 004) or a JSON file.
        #[arg(long, value_name = "NAME|FILE")]
        preset: String,
        /// Stacks to sweep.
        #[arg(long, visible_alias = "stack", value_name = "S1,S2", value_delimiter = ',', required = true)]
        stacks: Vec<String>,
        /// Message sizes (default: powers of two up to 64k).
        #[arg(long, value_name = "LIST", value_parser = parse_size_list)]
        sizes: Option<SizeList>,
        /// Buses to sweep (default: the preset's).
        #[arg(long, value_name = "B1,B2", value_delimiter = ',')]
        buses: Vec<String>,
        /// Link rates to sweep in Mbit/s (default: the preset's).
        #[arg(long, value_name = "X1,X2", value_parser = parse_size_list)]
        links: Option<SizeList>,
        /// Messages per bandwidth run.
        #[arg(long, value_name = "N", default_value_t = 32)]
        messages: usize,
        /// Worker threads (default: the number of CPUs).
        #[arg(long, value_name = "J")]
        jobs: Option<usize>,
        /// Write the grid as CSV.
        #[arg(long, value_name = "FILE")]
        csv: String,
        /// Write latency and bandwidth plots (FILE, and FILE with -bw before .svg).
        #[arg(long, value_name = "FILE")]
        svg: Option<String>,
    },
    /// Draw any trace JSON (simulated or from `eudp trace`) as a time-flow chart.
    #[command(after_help = "Example:\n  eudp sim chart --trace trace-out/trace.json --svg chart.svg --layers sender")]
    Chart {
        /// The trace JSON.
        #[arg(long, value_name = "FILE")]
        trace: String,
        /// The chart to write.
        #[arg(long, value_name = "OUT")]
        svg: String,
        /// Keep these layers: by name, host or host:layer, comma-separated.
        #[arg(long, value_name = "L1,L2")]
        layers: Option<String>,
    },
    /// The order of EMP's schemes (003) for bandwidth both ways and latency.
    ///
    /// Runs every scheme's stack of the preset, with measured step costs
    /// when given, over a fast bus and link unless overridden.
    #[command(after_help = "Example:\n  eudp sim schemes --step-costs trace-out/emp-steps.json")]
    Schemes {
        /// Preset: a shipped id or a JSON file with the 003 stacks.
        #[arg(long, value_name = "NAME|FILE", default_value = "003")]
        preset: String,
        /// Measured step costs (`eudp trace --emp` JSON).
        #[arg(long, value_name = "FILE")]
        step_costs: Option<String>,
        /// Message size of the bandwidth runs.
        #[arg(long, value_name = "BYTES", default_value_t = 16_384)]
        size: u64,
        /// Message size of the ping-pong.
        #[arg(long, value_name = "BYTES", default_value_t = 10)]
        latency_size: u64,
        /// Bus of the simulation.
        #[arg(long, value_name = "NAME", default_value = "pcie4x16")]
        bus: String,
        /// Link rate of the simulation (Mbit/s).
        #[arg(long, value_name = "X", default_value_t = 100_000.0)]
        link_mbps: f64,
    },
    /// Published vs simulated headline figures of all presets.
    #[command(after_help = "Example:\n  eudp sim validate --markdown")]
    Validate {
        /// A Markdown table instead of plain text.
        #[arg(long)]
        markdown: bool,
    },
    /// List presets, their stacks and (optionally) every assumed input.
    #[command(after_help = "Example:\n  eudp sim presets --assumptions")]
    Presets {
        /// Also list every input that is an assumption rather than a citation.
        #[arg(long)]
        assumptions: bool,
    },
    /// Measure the simulator's speed (events/s).
    #[command(after_help = "Example:\n  eudp sim bench --packets 100000")]
    Bench {
        /// 4 kB messages to simulate.
        #[arg(long, value_name = "N", default_value_t = 200_000)]
        packets: usize,
    },
}
