//! The `eudp` command line: every subcommand and its options (clap). The
//! commands other crates own (`model`, `sim`, `verify`) bring their own
//! argument structs; this tree only gathers them.

use crate::bench_async::AsyncPart;
use crate::run::RunArgs;
use crate::stat_view::StatCmd;
use crate::trace::TraceOptions;
use crate::worker::Mode;
use clap::{Parser, Subcommand};
use eudp_model::cli::{ModelArgs, SimArgs};
use eudp_verify::cli::VerifyArgs;
use std::net::SocketAddr;

const EXAMPLES: &str = "Examples:
  eudp demo
  eudp run --profile latency -- sockperf server
  eudp stat
  eudp trace --compare kernel,eudp
  eudp sim validate";

#[derive(Parser, Debug)]
#[command(
    name = "eudp",
    version,
    about = "User-space UDP offload engine, measurement, model and verification",
    after_help = EXAMPLES
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// The main job: build a testbed, run a short bench, print it, tear down.
    #[command(after_help = "Examples:\n  eudp demo\n  eudp demo --secs 3")]
    Demo {
        /// Seconds per transfer.
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
    },
    /// Two network-namespace hosts joined by veth (198.18.0.1 and .2).
    #[command(
        after_help = "Examples:\n  eudp testbed up tb1\n  eudp testbed exec tb1 --host b -- ip addr\n  eudp testbed down tb1"
    )]
    Testbed {
        #[command(subcommand)]
        op: TestbedOp,
    },
    /// Kernel, sendmmsg, GSO/GRO ceiling and eudp side by side on a testbed.
    #[command(
        after_help = "Examples:\n  eudp bench --sizes 64,1472 --secs 3\n  eudp bench --apps --repeats 5\n  eudp bench --sockets --count 10000\n  eudp bench --tcp\n  eudp bench --mcast\n  eudp bench --soak 10"
    )]
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
        /// Every workload at once under `eudp run` for MINUTES (fractions too), with faults on a
        /// schedule: RSS over time, counters, balance and stalls (docs/bench.md).
        #[arg(long, value_name = "MINUTES", conflicts_with_all = ["tcp", "apps", "sockets", "emp"])]
        soak: Option<f64>,
        /// Multicast fan-out (1 sender, 4 receiving processes, 3 groups): kernel vs eudp's kernel and xdp transports.
        #[arg(long, conflicts_with_all = ["tcp", "apps", "sockets", "emp"])]
        mcast: bool,
        /// EMP beside kernel UDP, kernel TCP and libfabric rxd, and under 1% loss (docs/bench.md).
        #[arg(long, conflicts_with_all = ["tcp", "apps", "sockets"])]
        emp: bool,
        /// Copying sends against asynchronous zero-copy sends, over loopback and the testbed
        /// (sizes default to 1472,16384,65507; docs/async.md).
        #[arg(long = "async", conflicts_with_all = ["tcp", "apps", "sockets", "emp"])]
        async_send: bool,
        /// With --async: the parts to run (send, recv, copy, xdp).
        #[arg(long, value_delimiter = ',', value_enum, requires = "async_send",
              default_values_t = vec![AsyncPart::Send, AsyncPart::Recv, AsyncPart::Copy, AsyncPart::Xdp])]
        parts: Vec<AsyncPart>,
        /// With --async: only these receiver rows (loopback-gro, loopback-nogro,
        /// testbed-veth-gro, testbed-veth-nogro); default all.
        #[arg(long, value_delimiter = ',', requires = "async_send")]
        recv_rows: Vec<String>,
        /// With --emp: the EMP schemes to run (base, so, ro, dsr, sr).
        #[arg(long, value_delimiter = ',', default_value = "base")]
        schemes: Vec<String>,
        /// With --tcp, --apps or --async (its send part): interleaved repetitions per mode
        /// (medians are reported).
        #[arg(long, default_value_t = 3)]
        repeats: usize,
    },
    Run(RunArgs),
    Stat(StatCmd),
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
    Model(ModelArgs),
    Sim(SimArgs),
    Trace(TraceOptions),
    Verify(VerifyArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(
        after_help = "Examples:\n  eudp completions bash > /etc/bash_completion.d/eudp\n  eudp completions zsh > ~/.zfunc/_eudp"
    )]
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page of eudp, or write one per command to a directory.
    #[command(after_help = "Examples:\n  eudp man | man -l -\n  eudp man --out /usr/local/share/man/man1")]
    Man {
        /// Write eudp.1 and eudp-SUB.1 for every subcommand into DIR instead.
        #[arg(long, value_name = "DIR")]
        out: Option<std::path::PathBuf>,
    },
}

#[derive(Subcommand, Debug)]
pub enum TestbedOp {
    /// Create testbed NAME (replacing leftovers of the same name).
    #[command(after_help = "Example:\n  eudp testbed up tb1")]
    Up {
        /// The testbed's name (its namespaces are eudp-NAME-a and eudp-NAME-b).
        name: String,
    },
    /// Remove testbed NAME.
    #[command(after_help = "Example:\n  eudp testbed down tb1")]
    Down {
        /// The testbed's name.
        name: String,
    },
    /// Run CMD inside host a (default) or b of testbed NAME.
    #[command(after_help = "Example:\n  eudp testbed exec tb1 --host b -- iperf3 -s")]
    Exec {
        /// The testbed's name.
        name: String,
        /// The host to run in.
        #[arg(long, default_value = "a", value_parser = ["a", "b"])]
        host: String,
        /// The command and its arguments (after --).
        #[arg(last = true, required = true)]
        cmd: Vec<String>,
    },
}

#[derive(Subcommand, Debug)]
pub enum WorkerRole {
    /// Send datagrams to DST.
    Send {
        /// How to send.
        #[arg(long, value_enum)]
        mode: Mode,
        /// The receiver's address.
        #[arg(long)]
        dst: SocketAddr,
        /// Datagram size (bytes).
        #[arg(long)]
        size: usize,
        /// Send for this long (seconds).
        #[arg(long, default_value_t = 1.0)]
        secs: f64,
        /// Stop after this many datagrams (0: only the time bound).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Pause 1 ms after every this many datagrams (0: never).
        #[arg(long, default_value_t = 0)]
        pace_every: u64,
        /// Offered load in datagrams per second (0: as fast as possible).
        #[arg(long, default_value_t = 0.0)]
        rate_pps: f64,
    },
    /// Receive datagrams on BIND until idle.
    Recv {
        /// How to receive.
        #[arg(long, value_enum)]
        mode: Mode,
        /// The address to bind.
        #[arg(long)]
        bind: SocketAddr,
        /// Datagram size (bytes).
        #[arg(long)]
        size: usize,
        /// Stop after this many datagrams (0: no bound).
        #[arg(long, default_value_t = 0)]
        count: u64,
        /// Stop after this long without data once data has arrived (ms).
        #[arg(long, default_value_t = 500)]
        idle_ms: u64,
        /// Bound on the whole run (seconds).
        #[arg(long, default_value_t = 20.0)]
        max_secs: f64,
    },
    /// The impairment relay between two interfaces (impairment testbed).
    Impair(crate::impair::RelayArgs),
    /// A kernel UDP or TCP baseline side (used by `bench --emp`).
    Kbase(crate::kbase::KbaseArgs),
    /// One EMP endpoint of a measured exchange (used by `bench --emp`).
    Emp(crate::worker_emp::EmpArgs),
}
