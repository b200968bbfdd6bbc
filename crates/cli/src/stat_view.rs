//! `eudp stat`: the per-process reports of programs under the shim, as a
//! table (with every drop counter and the settings in effect), as JSON
//! (docs/stat-json.md), as OpenMetrics text for Prometheus, or refreshed
//! with per-second rates (`--watch`).
//!
//! Reports are read from every directory a program may have written
//! (`eudp_engine::stat_dir::readable`): `/run/eudp`, the user's runtime
//! directory and `/tmp/eudp-$UID`, or `--dir` / `EUDP_STAT_DIR` alone.

pub use crate::stat_report::SOCKET_DROPS;
use crate::stat_report::{format_reports, read_reports};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The version of `--json`'s layout (docs/stat-json.md).
pub const SCHEMA_VERSION: u64 = 1;

/// What `eudp stat` shows.
#[derive(Clone, Debug, Default)]
pub struct StatArgs {
    /// Directories to read (empty: every one a program may write).
    pub dirs: Vec<PathBuf>,
    /// Include the reports of exited programs.
    pub all: bool,
    pub json: bool,
    pub prometheus: bool,
    /// Remove the reports of exited programs instead.
    pub clean: bool,
    /// Refresh every this many seconds, with per-second rates.
    pub watch: Option<f64>,
    /// With `watch`: stop after this many refreshes (else at Ctrl-C).
    pub count: Option<u64>,
    /// Only these processes.
    pub pids: Vec<u64>,
}

const STAT_EXAMPLES: &str = "Examples:
  eudp stat
  eudp stat --json 4242
  eudp stat --all --clean
  eudp stat --watch 2
  eudp stat --prometheus";

/// Per-socket counters of programs running under `eudp run`.
///
/// Reads the reports the shim writes to DIR/<pid>.json.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(after_help = STAT_EXAMPLES)]
pub struct StatCmd {
    /// Directory of the reports (default: $EUDP_STAT_DIR, else every one a
    /// program may write: /run/eudp, $XDG_RUNTIME_DIR/eudp, /tmp/eudp-$UID).
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// Include programs that have exited.
    #[arg(long)]
    pub all: bool,
    /// Print the reports as JSON.
    #[arg(long)]
    pub json: bool,
    /// Remove the reports of programs that have exited.
    #[arg(long)]
    pub clean: bool,
    /// Print again every SECS seconds (1 if no value is given) until interrupted.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    pub watch: Option<f64>,
    /// With --watch: stop after N refreshes.
    #[arg(long, value_name = "N", requires = "watch")]
    pub count: Option<u64>,
    /// Print the counters in the OpenMetrics (Prometheus) text format.
    #[arg(long, conflicts_with = "json")]
    pub prometheus: bool,
    /// Only these processes.
    #[arg(value_name = "PID")]
    pub pids: Vec<u64>,
}

/// `eudp stat`.
pub fn stat_main(a: &StatCmd) -> i32 {
    stat(&StatArgs {
        dirs: a.dir.iter().cloned().collect(),
        all: a.all,
        json: a.json,
        prometheus: a.prometheus,
        clean: a.clean,
        watch: a.watch,
        count: a.count,
        pids: a.pids.clone(),
    })
}

/// `eudp stat` with parsed arguments; the exit status.
pub fn stat(a: &StatArgs) -> i32 {
    let dirs = if a.dirs.is_empty() { eudp_engine::stat_dir::readable() } else { a.dirs.clone() };
    if a.clean {
        return clean(&dirs);
    }
    if let Some(every) = a.watch {
        return watch(a, &dirs, Duration::from_secs_f64(every.clamp(0.05, 3600.0)));
    }
    let reps = reports(&dirs, a.all, &a.pids);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&reps).unwrap_or_default());
    } else if a.prometheus {
        print!("{}", openmetrics(&reps));
    } else if reps.is_empty() {
        println!("{}", nothing_found(&dirs));
    } else {
        print!("{}", table(&reps));
    }
    0
}

fn nothing_found(dirs: &[PathBuf]) -> String {
    let names: Vec<String> = dirs.iter().map(|d| d.display().to_string()).collect();
    format!("no eudp programs found in {} (run one with `eudp run`; --all includes exited ones)", names.join(", "))
}

/// The reports of every directory, by pid, each with a `schema_version`.
pub fn reports(dirs: &[PathBuf], all: bool, pids: &[u64]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for d in dirs {
        for mut r in read_reports(d, all, pids) {
            if let Some(m) = r.as_object_mut() {
                m.entry("schema_version").or_insert(SCHEMA_VERSION.into());
                m.insert("dir".into(), d.display().to_string().into());
            }
            // One report per process (pid and start time). Another directory
            // may hold what an earlier process with the same pid left: a live
            // process's full report goes before a transport's counters alone,
            // and both before a final report.
            let rank = |v: &Value| match (v["exited"] == true, v.get("sockets").is_some()) {
                (true, _) => 0,
                (false, false) => 1,
                (false, true) => 2,
            };
            match out.iter_mut().find(|o| o["pid"] == r["pid"] && o["start_ticks"] == r["start_ticks"]) {
                Some(o) if rank(&r) > rank(o) => *o = r,
                Some(_) => {}
                None => out.push(r),
            }
        }
    }
    out.sort_by_key(|v| (v["pid"].as_u64().unwrap_or(0), v["start_ticks"].as_u64().unwrap_or(0)));
    out
}

fn clean(dirs: &[PathBuf]) -> i32 {
    for d in dirs {
        let mut n = 0;
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let name = e.file_name();
            let Some((pid, start, tcp)) = name.to_str().and_then(eudp_engine::stat_dir::parse_name) else { continue };
            if !eudp_engine::stat_dir::runs(pid, start) && std::fs::remove_file(e.path()).is_ok() && !tcp {
                n += 1;
            }
        }
        if n > 0 || dirs.len() == 1 {
            println!("removed {n} report(s) of exited programs from {}", d.display());
        }
    }
    0
}

fn sockets(r: &Value) -> impl Iterator<Item = &Value> {
    ["sockets", "closed"].into_iter().flat_map(move |k| r[k].as_array().into_iter().flatten())
}

fn stat_u(x: &Value, k: &str) -> u64 {
    x["stats"][k].as_u64().unwrap_or(0)
}

/// The table of the reports: the socket table, every drop counter summed
/// over the process's sockets, and the settings in effect.
pub fn table(reps: &[Value]) -> String {
    let mut s = String::new();
    for r in reps {
        s += &format_reports(std::slice::from_ref(r));
        let drops: Vec<String> = SOCKET_DROPS
            .iter()
            .map(|k| format!("{} {}", k.trim_start_matches("drop_"), sockets(r).map(|x| stat_u(x, k)).sum::<u64>()))
            .collect();
        let _ = writeln!(s, "  drops: {}", drops.join(", "));
        s += &settings_lines(r);
    }
    s
}

fn settings_lines(r: &Value) -> String {
    let mut s = String::new();
    if let Some(t) = r["transport"].as_str() {
        let _ = write!(s, "  transport {t}");
        if let Some(p) = r["profile"].as_str() {
            let _ = write!(s, "; profile {p}");
        }
        let set: Vec<String> = r["settings"]["values"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or("?")))
            .collect();
        let _ = writeln!(s, "; settings: {}", if set.is_empty() { "defaults".to_string() } else { set.join(" ") });
    }
    for i in r["settings"]["ignored"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {}", i.as_str().unwrap_or("?"));
    }
    for u in r["settings"]["unknown"].as_array().into_iter().flatten() {
        let _ = writeln!(s, "  {} ignored: unknown variable", u.as_str().unwrap_or("?"));
    }
    s
}

/// Counters of one socket at one refresh: sent, received, dropped.
type Sample = (u64, u64, u64);

/// The samples of a refresh by (pid, socket id), with each socket's fd.
type Samples = BTreeMap<(u64, u64), (i64, Sample)>;

fn samples(reps: &[Value]) -> Samples {
    let mut m = BTreeMap::new();
    for r in reps {
        let pid = r["pid"].as_u64().unwrap_or(0);
        for x in r["sockets"].as_array().into_iter().flatten() {
            let drops = SOCKET_DROPS.iter().map(|k| stat_u(x, k)).sum();
            let v = (stat_u(x, "datagrams_sent"), stat_u(x, "datagrams_received"), drops);
            m.insert((pid, x["id"].as_u64().unwrap_or(0)), (x["fd"].as_i64().unwrap_or(-1), v));
        }
    }
    m
}

/// The per-second rates of each socket between two refreshes.
fn rates(before: &Samples, now: &Samples, secs: f64) -> String {
    let mut s = String::new();
    for (&(pid, id), &(fd, (tx, rx, dr))) in now {
        let Some(&(_, (tx0, rx0, dr0))) = before.get(&(pid, id)) else { continue };
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs.max(1e-6);
        let _ = writeln!(
            s,
            "  pid {pid} fd {fd}: sent {:.0}/s, received {:.0}/s, dropped {:.0}/s",
            per(tx, tx0),
            per(rx, rx0),
            per(dr, dr0)
        );
    }
    if s.is_empty() {
        s = "  (no socket in both refreshes)\n".into();
    }
    s
}

fn watch(a: &StatArgs, dirs: &[PathBuf], every: Duration) -> i32 {
    use std::io::IsTerminal;
    let tty = std::io::stdout().is_terminal();
    let mut before: Option<(Instant, Samples)> = None;
    let mut n = 0u64;
    loop {
        let reps = reports(dirs, a.all, &a.pids);
        let t = Instant::now();
        let now = samples(&reps);
        let mut out = String::new();
        if tty {
            out += "\x1b[H\x1b[2J";
        } else if n > 0 {
            out += "---\n";
        }
        if a.prometheus {
            out += &openmetrics(&reps);
        } else if reps.is_empty() {
            out += &nothing_found(dirs);
            out += "\n";
        } else {
            out += &table(&reps);
        }
        if !a.prometheus {
            out += "rates:\n";
            match &before {
                Some((t0, b)) => out += &rates(b, &now, t.duration_since(*t0).as_secs_f64()),
                None => out += "  (from the next refresh on)\n",
            }
        }
        print!("{out}");
        let _ = std::io::Write::flush(&mut std::io::stdout());
        before = Some((t, now));
        n += 1;
        if a.count.is_some_and(|c| n >= c) {
            return 0;
        }
        std::thread::sleep(every);
    }
}

/// A label value as OpenMetrics quotes it.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The reports in the OpenMetrics text format: one counter family per
/// counter (`eudp_socket_*`, `eudp_process_*`, `eudp_uoe_*`, `eudp_xdp_*`),
/// labelled with pid, program, transport (and fd for sockets); `# EOF` last.
pub fn openmetrics(reps: &[Value]) -> String {
    // family -> (type, samples), so that each family's samples stay together.
    let mut fams: BTreeMap<String, (&str, Vec<String>)> = BTreeMap::new();
    let mut add = |fam: String, kind: &'static str, labels: &str, v: u64| {
        let name = if kind == "counter" { format!("{fam}_total") } else { fam.clone() };
        fams.entry(fam).or_insert((kind, Vec::new())).1.push(format!("{name}{{{labels}}} {v}"));
    };
    for r in reps {
        let pid = r["pid"].as_u64().unwrap_or(0);
        let exe = r["exe"].as_str().unwrap_or("");
        let program = label(exe.rsplit('/').next().unwrap_or(exe));
        let transport = label(r["transport"].as_str().unwrap_or("unknown"));
        let proc_labels = format!("pid=\"{pid}\",program=\"{program}\",transport=\"{transport}\"");
        for k in ["accelerated", "fallbacks", "multicast_kernel", "panics"] {
            if let Some(v) = r[k].as_u64() {
                add(format!("eudp_process_{k}"), "counter", &proc_labels, v);
            }
        }
        for x in r["sockets"].as_array().into_iter().flatten() {
            let fd = x["fd"].as_i64().unwrap_or(-1);
            let l = format!("{proc_labels},fd=\"{fd}\"");
            for (k, v) in x["stats"].as_object().into_iter().flatten() {
                if let Some(v) = v.as_u64() {
                    add(format!("eudp_socket_{k}"), "counter", &l, v);
                }
            }
        }
        for (k, v) in r["uoe"]["tcp"].as_object().into_iter().flatten() {
            if let Some(v) = v.as_u64() {
                add(format!("eudp_uoe_{k}"), "counter", &proc_labels, v);
            }
        }
        if let Some(q) = r["uoe"]["queued_bytes"].as_u64() {
            add("eudp_uoe_queued_bytes".into(), "gauge", &proc_labels, q);
        }
        for (k, v) in r["xdp"]["stats"].as_object().into_iter().flatten() {
            if let Some(v) = v.as_u64() {
                add(format!("eudp_xdp_{k}"), "counter", &proc_labels, v);
            }
        }
    }
    let mut s = String::new();
    for (fam, (kind, lines)) in fams {
        let _ = writeln!(s, "# TYPE {fam} {kind}");
        for l in lines {
            s += &l;
            s += "\n";
        }
    }
    s += "# EOF\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> Value {
        serde_json::json!({
            "pid": 42, "exe": "/usr/bin/dns\"d", "transport": "kernel", "accelerated": 1, "fallbacks": 0,
            "sockets": [{"id": 1, "fd": 5, "stats": {"datagrams_sent": 10, "drop_ring_full": 2, "socket_drops": null,
                "send_calls_per_datagram": 0.5, "batch_hist": [1, 2]}}],
            "uoe": {"queued_bytes": 7, "tcp": {"frames_sent": 3}},
            "settings": {"values": {"EUDP_SPIN_US": "50"}, "ignored": ["EUDP_L2_DEPTH=abc ignored: expected an integer >= 1; using 1"], "unknown": []}
        })
    }

    #[test]
    fn openmetrics_has_a_type_for_every_sample_and_ends_with_eof() {
        let text = openmetrics(&[report()]);
        assert!(text.ends_with("# EOF\n"), "{text}");
        let mut typed = std::collections::HashSet::new();
        for l in text.lines() {
            if let Some(t) = l.strip_prefix("# TYPE ") {
                typed.insert(t.split(' ').next().unwrap().to_string());
            } else if l != "# EOF" {
                let name = l.split('{').next().unwrap();
                let fam = name.strip_suffix("_total").unwrap_or(name);
                assert!(typed.contains(fam), "{l}: no TYPE before it");
            }
        }
        assert!(
            text.contains(
                "eudp_socket_drop_ring_full_total{pid=\"42\",program=\"dns\\\"d\",transport=\"kernel\",fd=\"5\"} 2"
            ),
            "{text}"
        );
        assert!(text.contains("eudp_uoe_queued_bytes{"), "{text}");
        assert!(!text.contains("send_calls_per_datagram"), "{text}");
    }

    #[test]
    fn the_table_shows_every_drop_counter_and_the_settings() {
        let t = table(&[report()]);
        assert!(
            t.contains("drops: ring_full 2, truncated 0, send_error 0, shutdown 0, close 0, socket_drops 0"),
            "{t}"
        );
        assert!(t.contains("fallback_close 0, kernel_rcvbuf 0, tcp_send 0, tcp_receive 0, tcp_exit 0"), "{t}");
        assert!(t.contains("transport kernel; settings: EUDP_SPIN_US=50"), "{t}");
        assert!(t.contains("EUDP_L2_DEPTH=abc ignored"), "{t}");
    }

    #[test]
    fn each_socket_row_names_its_drops() {
        let mut r = report();
        r["sockets"][0]["stats"]["drop_fallback_close"] = 3.into();
        r["sockets"][0]["stats"]["drop_tcp_exit"] = 4.into();
        r["sockets"][0]["stats"]["drop_close"] = 5.into();
        let t = table(&[r.clone()]);
        let row = t.lines().find(|l| l.trim_start().starts_with("5 ")).unwrap_or_default();
        assert!(row.contains("drops: ring_full 2, close 5, fallback_close 3, tcp_exit 4"), "{t}");
        let m = openmetrics(&[r]);
        assert!(m.contains("eudp_socket_drop_tcp_exit_total{") && m.contains("eudp_socket_drop_close_total{"), "{m}");
    }

    #[test]
    fn rates_are_per_second() {
        let a = samples(&[report()]);
        let mut r = report();
        r["sockets"][0]["stats"]["datagrams_sent"] = 30.into();
        let b = samples(&[r]);
        assert!(rates(&a, &b, 2.0).contains("pid 42 fd 5: sent 10/s, received 0/s, dropped 0/s"));
    }

    #[test]
    fn watch_takes_an_optional_period() {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: StatCmd,
        }
        let w = |v: &[&str]| <P as clap::Parser>::parse_from(std::iter::once(&"stat").chain(v)).a;
        assert_eq!(w(&["--watch"]).watch, Some(1.0));
        assert_eq!(w(&["--watch", "0.5", "--count", "2"]).watch, Some(0.5));
        assert_eq!(w(&["--watch", "0.5", "--count", "2"]).count, Some(2));
    }
}
