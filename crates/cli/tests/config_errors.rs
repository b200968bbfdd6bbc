//! Settings with mistakes, the start-up line and `eudp stat` as an operator
//! meets them: `eudp run` refuses a bad environment before the program
//! starts; under a plain `LD_PRELOAD` a bad value is logged once and the
//! other settings still apply; the start-up line comes once per program
//! and `EUDP_QUIET=1` silences it; an unprivileged user's program has its
//! stats and `eudp stat` shows them (table, OpenMetrics, rates).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");

/// The shim next to the `eudp` binary (the release build).
fn lib() -> PathBuf {
    Path::new(EUDP).with_file_name("libeudp_preload.so")
}

/// A command without any `EUDP_*` of the test's own environment.
fn clean(prog: &str) -> Command {
    let mut c = Command::new(prog);
    for (k, _) in std::env::vars() {
        if k.starts_with("EUDP_") || k == "LD_PRELOAD" || k == "XDG_RUNTIME_DIR" {
            c.env_remove(k);
        }
    }
    c
}

fn tmpdir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eudp-config-errors-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A Python program that sends itself a datagram on each of `n` sockets,
/// with `fork` forks a child that does the same once (the parent's sockets
/// then fall back to the kernel), and then sleeps `secs`.
fn udp_program(n: u32, fork: bool, secs: f64) -> String {
    let fork = if fork { "True" } else { "False" };
    format!(
        r#"
import os, socket, time
def echo():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    s.sendto(b"x", s.getsockname())
    assert s.recv(10) == b"x"
    return s
keep = [echo() for _ in range({n})]
if {fork}:
    pid = os.fork()
    if pid == 0:
        echo()
        os._exit(0)
    os.waitpid(pid, 0)
print("pid", os.getpid(), flush=True)
time.sleep({secs})
"#
    )
}

#[test]
fn run_refuses_a_bad_value_without_starting_the_program() {
    let d = tmpdir("refuse");
    let witness = d.join("ran");
    let out = clean(EUDP)
        .args(["run", "--", "touch"])
        .arg(&witness)
        .env("EUDP_L2_DEPTH", "abc")
        .env("EUDP_PRELOAD_LIB", lib())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("EUDP_L2_DEPTH=abc: expected an integer >= 1"), "{err}");
    assert!(!witness.exists(), "the program ran");

    let out = clean(EUDP)
        .args(["run", "--", "touch"])
        .arg(&witness)
        .env("EUDP_TRANSPORT", "xpd")
        .env("EUDP_SPIN_UZ", "3")
        .env("EUDP_PRELOAD_LIB", lib())
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("EUDP_TRANSPORT=xpd: expected one of kernel, tcp, xdp"), "{err}");
    assert!(err.contains("EUDP_SPIN_UZ=3: unknown variable (did you mean EUDP_SPIN_US?)"), "{err}");
    assert!(!witness.exists(), "the program ran");

    // A good environment runs the program.
    let out = clean(EUDP).args(["run", "--", "touch"]).arg(&witness).env("EUDP_PRELOAD_LIB", lib()).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(witness.exists());
    std::fs::remove_dir_all(&d).unwrap();
}

/// The program's report in `dir`.
fn report(dir: &Path, pid: &str) -> Value {
    let path = report_file(dir, pid).expect("report");
    let s = std::fs::read_to_string(path).expect("report");
    serde_json::from_str(&s).unwrap()
}

fn pid_of(out: &Output) -> String {
    let so = text(&out.stdout);
    so.lines().find_map(|l| l.strip_prefix("pid ")).unwrap_or_else(|| panic!("no pid in {so:?}")).trim().to_string()
}

#[test]
fn under_ld_preload_a_bad_value_is_logged_once_and_the_others_apply() {
    let d = tmpdir("preload");
    let out = clean("python3")
        .args(["-c", &udp_program(2, true, 0.0)])
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_DIR", &d)
        .env("EUDP_L2_DEPTH", "abc")
        .env("EUDP_MAX_MSGS", "7")
        .env("EUDP_SPIN_US", "30")
        .env("EUDP_SPIN_UZ", "3")
        .env("EUDP_STAT_MS", "soon")
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("EUDP_L2_DEPTH=abc ignored")).collect();
    assert_eq!(said, ["eudp: EUDP_L2_DEPTH=abc ignored: expected an integer >= 1; using 1"], "{err}");
    let said: Vec<&str> = err.lines().filter(|l| l.contains("EUDP_SPIN_UZ")).collect();
    assert_eq!(said, ["eudp: EUDP_SPIN_UZ=3: unknown variable (did you mean EUDP_SPIN_US?); ignored"], "{err}");
    assert_eq!(err.matches("EUDP_STAT_MS=soon ignored").count(), 1, "{err}");
    let r = report(&d, &pid_of(&out));
    assert_eq!(r["engine"]["l2_depth"], 1, "{r}");
    assert_eq!(r["engine"]["max_msgs"], 7, "{r}");
    assert_eq!(r["engine"]["spin_us"], 30, "{r}");
    assert_eq!(r["settings"]["values"]["EUDP_L2_DEPTH"], "1", "{r}");
    assert_eq!(r["schema_version"], 1, "{r}");

    // One start-up line for the program (its fork child says none).
    let banner = |e: &str| e.lines().filter(|l| l.starts_with("eudp ") && l.contains(": transport ")).count();
    assert_eq!(banner(&err), 1, "{err}");
    let out = clean("python3")
        .args(["-c", &udp_program(2, true, 0.0)])
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_DIR", &d)
        .env("EUDP_QUIET", "1")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(banner(&text(&out.stderr)), 0, "{}", text(&out.stderr));

    // Under `eudp run` the line names the profile.
    let out = clean(EUDP)
        .args(["run", "--profile", "latency", "--", "python3", "-c", &udp_program(1, true, 0.0)])
        .env("EUDP_PRELOAD_LIB", lib())
        .env("EUDP_STAT_DIR", &d)
        .output()
        .unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    let line: Vec<&str> = err.lines().filter(|l| l.starts_with("eudp ")).collect();
    assert_eq!(line.len(), 1, "{err}");
    assert!(line[0].ends_with(": transport kernel; profile latency"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

/// Waits until `path` exists.
/// The report of process `pid` in `dir` (named by pid and start time).
fn report_file(dir: &Path, pid: &str) -> Option<std::path::PathBuf> {
    eudp_engine::stat_dir::files_of(dir, pid.parse().ok()?, false).pop()
}

fn wait_for(dir: &Path, pid: &str) {
    let t = Instant::now();
    while report_file(dir, pid).is_none() {
        assert!(t.elapsed() < Duration::from_secs(20), "no report of {pid} in {}", dir.display());
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts the UDP program (sleeping `secs`) and waits for its report.
fn start(mut c: Command, dir: &Path, secs: f64) -> (std::process::Child, String) {
    let mut child = c
        .args(["-c", &udp_program(1, false, secs)])
        .env("LD_PRELOAD", lib())
        .env("EUDP_STAT_MS", "100")
        .env("EUDP_QUIET", "1")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    let pid = line.trim().strip_prefix("pid ").expect("pid line").to_string();
    wait_for(dir, &pid);
    (child, pid)
}

/// `setpriv` as nobody, with no supplementary groups.
fn as_nobody(prog: &str) -> Command {
    let mut c = clean("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", prog]);
    c
}

#[test]
fn an_unprivileged_program_has_its_stats_and_eudp_stat_shows_them() {
    if Command::new("setpriv").arg("--help").output().is_err() {
        eprintln!("skipped: no setpriv");
        return;
    }
    let priv_dir = PathBuf::from("/tmp/eudp-65534");
    let (mut child, pid) = start(as_nobody("/usr/bin/python3"), &priv_dir, 3.0);
    let meta = std::fs::symlink_metadata(&priv_dir).unwrap();
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!((meta.uid(), meta.permissions().mode() & 0o777), (65534, 0o700));
    let out = as_nobody(EUDP).args(["stat", &pid]).output().unwrap();
    let table = text(&out.stdout);
    child.kill().ok();
    child.wait().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(table.contains(&format!("pid {pid} ")), "{table}");
    assert!(table.contains("127.0.0.1:"), "the socket is not listed: {table}");
    assert!(table.contains("drops: ring_full 0"), "{table}");
    assert!(table.contains("transport kernel"), "{table}");
    assert!(table.contains("  eudp "), "the socket is not on the engine: {table}");
}

#[test]
fn prometheus_output_types_every_sample_and_watch_prints_rates() {
    let d = tmpdir("prom");
    let mut c = clean("python3");
    c.env("EUDP_STAT_DIR", &d);
    let (mut child, pid) = start(c, &d, 3.0);
    let out = clean(EUDP).args(["stat", "--prometheus", "--dir"]).arg(&d).output().unwrap();
    let prom = text(&out.stdout);
    let mut typed = Vec::new();
    let mut samples = 0;
    for l in prom.lines() {
        if let Some(t) = l.strip_prefix("# TYPE ") {
            let mut w = t.split(' ');
            typed.push(w.next().unwrap().to_string());
            assert!(matches!(w.next(), Some("counter" | "gauge")), "{l}");
        } else if l != "# EOF" {
            let name = l.split('{').next().unwrap();
            let fam = name.strip_suffix("_total").unwrap_or(name);
            assert_eq!(typed.last().map(String::as_str), Some(fam), "{l}: not under its TYPE");
            assert!(l.contains(&format!("pid=\"{pid}\"")) && l.contains("program=\"python3"), "{l}");
            assert!(l.rsplit(' ').next().unwrap().parse::<u64>().is_ok(), "{l}");
            samples += 1;
        }
    }
    assert_eq!(prom.lines().last(), Some("# EOF"), "{prom}");
    assert!(prom.contains("eudp_socket_datagrams_sent_total{"), "{prom}");
    assert!(prom.contains("fd=\""), "{prom}");
    assert!(samples > 10, "{prom}");

    let out = clean(EUDP).args(["stat", "--watch", "0.3", "--count", "2", "--dir"]).arg(&d).output().unwrap();
    let w = text(&out.stdout);
    child.kill().ok();
    child.wait().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(w.matches("rates:").count(), 2, "{w}");
    assert!(w.contains(&format!("pid {pid} fd ")) && w.contains("/s"), "{w}");
    std::fs::remove_dir_all(&d).unwrap();
}
