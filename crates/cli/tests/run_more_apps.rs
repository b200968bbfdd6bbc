//! `eudp run` with more real programs over the netns testbed (root, as CI),
//! each on the default transport and on `tcp`: iperf (v2), unbound
//! resolving through dnsmasq, memcached's UDP protocol and rsyslog's
//! imudp fed by logger. Their I/O differs from the programs of
//! `run_apps.rs`: iperf's server connects its socket and then moves it to
//! the kernel path (`SO_TIMESTAMP`), unbound opens a socket per upstream
//! query, memcached answers from worker threads in several datagrams.
//! Outputs are checked byte for byte, counts against the shim's counters.
//! The programs come from Debian packages that `scripts/deps.sh` installs.

use eudp_cli::run;
use eudp_cli::testbed;

use run::{app_command, Stack};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testbed::{is_root, unique_name, Testbed, ADDR_A, ADDR_B};

struct Env {
    tb: Testbed,
    lib: PathBuf,
    stats: PathBuf,
    tcp: bool,
}

impl Env {
    /// A testbed, the shim and a stats directory; None (skipped) unless root.
    fn new(tag: &str, tcp: bool) -> Option<Env> {
        if !is_root() {
            eprintln!("SKIPPED: the testbed needs root (CI runs as root)");
            return None;
        }
        let lib = run::preload_lib().expect("libeudp_preload.so: cargo build --release -p eudp-preload first");
        let stats = std::env::temp_dir().join(format!("eudp-moreapps-{tag}-{}-{}", tcp as u8, std::process::id()));
        let _ = std::fs::remove_dir_all(&stats);
        std::fs::create_dir_all(&stats).unwrap();
        let tb = Testbed::up(&unique_name(tag)).expect("testbed up");
        Some(Env { tb, lib, stats, tcp })
    }

    fn eudp(&self) -> Stack {
        if self.tcp {
            Stack::EudpTcp("default")
        } else {
            Stack::Eudp("default")
        }
    }

    /// `argv` on `host` under the shim. A server under `tcp` also answers
    /// peers on plain kernel UDP (DML (c)); the others have a UOE.
    fn cmd(&self, host: char, argv: &[&str]) -> Command {
        let mut c = app_command(&self.tb, host, self.eudp(), &self.lib, &self.stats, argv);
        if self.tcp {
            c.env("EUDP_TCP_DML", "udp");
        }
        c
    }

    /// Sum of a per-socket counter over the reports of `exe`'s processes.
    fn total(&self, exe: &str, counter: &str) -> u64 {
        self.reports(exe)
            .iter()
            .flat_map(|r| ["sockets", "closed"].map(|k| r[k].as_array().cloned().unwrap_or_default()))
            .flatten()
            .map(|s| s["stats"][counter].as_u64().unwrap_or(0))
            .sum()
    }

    fn reports(&self, exe: &str) -> Vec<serde_json::Value> {
        eudp_cli::stat_report::read_reports(&self.stats, true, &[])
            .into_iter()
            .filter(|r| r["exe"].as_str().is_some_and(|e| e.rsplit('/').next().is_some_and(|b| b.starts_with(exe))))
            .collect()
    }

    fn sum(&self, exe: &str, f: impl Fn(&serde_json::Value) -> u64) -> u64 {
        self.reports(exe).iter().map(f).sum()
    }

    /// Each process's report in brief, for a failure's message: its
    /// sockets' counters, fallback reasons and UOE counters.
    fn diagnosis(&self) -> String {
        let mut out = String::new();
        for r in eudp_cli::stat_report::read_reports(&self.stats, true, &[]) {
            out += &format!("report of {} (pid {}): fallback_reasons {}\n", r["exe"], r["pid"], r["fallback_reasons"]);
            for k in ["sockets", "closed"] {
                for s in r[k].as_array().into_iter().flatten() {
                    out += &format!("  {k} {} {} peer {}: {}\n", s["mode"], s["local"], s["peer"], s["stats"]);
                }
            }
            if !r["uoe"].is_null() {
                out += &format!("  uoe: {}\n", r["uoe"]["tcp"]);
            }
        }
        out
    }

    /// Waits until server `ch` holds UDP `port` (and, under `tcp`, its
    /// UOE listens): see [`testbed::wait_udp_server`].
    fn wait_server(&self, ch: &Child, port: u16) {
        testbed::wait_udp_server(ch.id(), port, self.tcp, Duration::from_secs(10)).unwrap();
    }

    /// Sum of a UOE (`tcp` transport) counter over all reports.
    fn uoe(&self, counter: &str) -> u64 {
        eudp_cli::stat_report::read_reports(&self.stats, true, &[])
            .iter()
            .map(|r| r["uoe"]["tcp"][counter].as_u64().unwrap_or(0))
            .sum()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.stats);
    }
}

/// Signals `ch` (our own child: `ip netns exec` execs the program) and
/// waits at most 5 s for it, then kills it.
fn stop(ch: &mut Child, sig: i32) {
    // SAFETY: signals our own child.
    unsafe { libc::kill(ch.id() as i32, sig) };
    let t0 = Instant::now();
    while ch.try_wait().unwrap().is_none() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = ch.kill();
    let _ = ch.wait();
}

/// Output of `c`, killed after `limit` (a hang fails the test, not CI).
fn output(c: Command, limit: Duration) -> (bool, String) {
    let (ok, out, _) = output_both(c, limit);
    (ok, out)
}

/// Status, standard output and standard error of `c`, killed after `limit`.
fn output_both(mut c: Command, limit: Duration) -> (bool, String, String) {
    c.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut ch = c.spawn().expect("spawn");
    let t0 = Instant::now();
    while ch.try_wait().unwrap().is_none() {
        if t0.elapsed() > limit {
            let _ = ch.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = ch.wait_with_output().unwrap();
    (
        o.status.success(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn tmp_file(env: &Env, name: &str, text: &str) -> PathBuf {
    let p = env.stats.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn python() -> &'static str {
    // `python3` on PATH may be a wrapper script; the system one is plain.
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

// ---- iperf (v2) ----

#[test]
fn iperf2_udp() {
    iperf2(false);
}

/// The server connects its socket to the client, then `SO_TIMESTAMP`
/// moves that socket to the kernel path, and it opens its next socket on
/// the same port. Before the fix the client's frames went to that new
/// socket: no server report, 3 of 3 runs.
#[test]
fn iperf2_udp_over_tcp() {
    iperf2(true);
}

/// "Lost/Total" of an iperf 2 final report line (`0/18727`).
fn lost_total(line: &str) -> Option<(u64, u64)> {
    let w = line.split_whitespace().find(|w| w.contains('/') && w.split('/').all(|n| n.parse::<u64>().is_ok()))?;
    let (l, t) = w.split_once('/')?;
    Some((l.parse().ok()?, t.parse().ok()?))
}

fn iperf2(tcp: bool) {
    let Some(env) = Env::new("ip2", tcp) else { return };
    let mut srv = env.cmd('b', &["iperf", "-s", "-u", "-B", ADDR_B, "-p", "7100"]);
    let srv_out = env.stats.join("iperf-server.txt");
    srv.stdout(std::fs::File::create(&srv_out).unwrap()).stderr(Stdio::null());
    let mut srv = srv.spawn().unwrap();
    env.wait_server(&srv, 7100);
    let (ok, cli, cli_err) = output_both(
        env.cmd('a', &["iperf", "-c", ADDR_B, "-u", "-p", "7100", "-t", "2", "-b", "50M", "-l", "1400"]),
        Duration::from_secs(20),
    );
    std::thread::sleep(Duration::from_millis(300));
    stop(&mut srv, libc::SIGINT);
    eprintln!("{cli}");
    let srv_text = std::fs::read_to_string(&srv_out).unwrap();
    assert!(ok, "iperf client failed");
    let sent: u64 = cli
        .lines()
        .find_map(|l| l.split("Sent ").nth(1)?.split_whitespace().next()?.parse().ok())
        .expect("datagrams sent");
    assert!(sent > 5000, "{cli}");
    let report = cli.lines().skip_while(|l| !l.contains("Server Report")).find_map(lost_total);
    let Some((lost, total)) = report else {
        panic!("no server report (the server did not see the end of the test):\n{cli}\nclient stderr:\n{cli_err}\nserver:\n{srv_text}\n{}", env.diagnosis())
    };
    // The final datagram (negative sequence number) ends the test and is
    // not counted; paced well below capacity, loss only from a busy host.
    assert_eq!(total, sent - 1, "{cli}");
    assert!(lost * 20 < total, "lost {lost} of {total}");
    assert_eq!(srv_text.lines().filter_map(lost_total).next_back(), Some((lost, total)), "server:\n{srv_text}");
    // The server's socket left the engine for SO_TIMESTAMP, counted with its reason.
    let reasons: Vec<String> = env
        .reports("iperf")
        .iter()
        .filter_map(|r| r["fallback_reasons"].as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()))
        .flatten()
        .collect();
    assert!(reasons.iter().any(|r| r.contains("SOL_SOCKET/29")), "{reasons:?}");
    // iperf's "Sent N" is one more than the datagrams it writes (N - 1 on
    // the kernel, counted with strace); a lost end-of-test ack adds resends.
    let tx = env.total("iperf", "datagrams_sent");
    assert!(tx >= sent - 1, "the client's sends went through the engine: {tx} of {sent}");
    if tcp {
        // Carried by the UOE and handed over to the server's kernel socket.
        assert!(env.uoe("frames_received") >= sent - lost - 1);
        assert!(env.uoe("forwarded_kernel") > 0);
    }
}

// ---- unbound forwarding to dnsmasq ----

#[test]
fn unbound_forwarding_to_dnsmasq() {
    unbound(false);
}

#[test]
fn unbound_forwarding_to_dnsmasq_over_tcp() {
    unbound(true);
}

fn unbound(tcp: bool) {
    let Some(env) = Env::new("unb", tcp) else { return };
    let conf = format!(
        "server:\n interface: {ADDR_B}\n port: 5300\n access-control: 198.18.0.0/15 allow\n do-daemonize: no\n username: \"\"\n chroot: \"\"\n pidfile: \"\"\n use-syslog: no\n logfile: \"\"\n num-threads: 1\n do-ip6: no\n do-not-query-localhost: no\n module-config: \"iterator\"\n qname-minimisation: no\n domain-insecure: \"eudp.test\"\n local-zone: \"test.\" nodefault\nforward-zone:\n name: \"eudp.test.\"\n forward-addr: {ADDR_A}@5301\n"
    );
    let conf = tmp_file(&env, "unbound.conf", &conf);
    // Each name is new to unbound: every query goes upstream from a socket of its own.
    let mut queries = String::new();
    let mut want = String::new();
    for i in 1..=300 {
        queries += &format!("n{i}.eudp.test A\n");
        want += "198.18.0.99\n";
        if i % 50 == 0 {
            queries += "t.eudp.test TXT\n";
            want += "\"byte-exact\"\n";
        }
    }
    let qfile = tmp_file(&env, "queries.txt", &queries);
    let mut dns = env.cmd(
        'a',
        &[
            "dnsmasq",
            "-k",
            "--conf-file=/dev/null",
            "--no-resolv",
            "--no-hosts",
            "--bind-interfaces",
            "--listen-address",
            ADDR_A,
            "-p",
            "5301",
            "--user=root",
            "--pid-file=",
            "--address=/eudp.test/198.18.0.99",
            "--txt-record=t.eudp.test,byte-exact",
        ],
    );
    let mut dns = dns.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut unb = env.cmd('b', &["/usr/sbin/unbound", "-d", "-c", conf.to_str().unwrap()]);
    let mut unb = unb.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    env.wait_server(&dns, 5301);
    env.wait_server(&unb, 5300);
    let dig = ["dig", "@198.18.0.2", "-p", "5300", "+short", "+tries=2", "+time=3", "-f", qfile.to_str().unwrap()];
    let (ok, got) = output(env.cmd('a', &dig), Duration::from_secs(30));
    stop(&mut unb, libc::SIGTERM);
    stop(&mut dns, libc::SIGTERM);
    assert!(ok);
    assert!(got == want, "answers differ: {} of {} lines", got.lines().count(), want.lines().count());
    // unbound's upstream sockets were on the engine; dnsmasq answered them all.
    assert!(env.sum("unbound", |r| r["accelerated"].as_u64().unwrap_or(0)) >= 300);
    assert!(env.total("dnsmasq", "datagrams_received") >= 306, "{}", env.total("dnsmasq", "datagrams_received"));
    if tcp {
        // unbound's port has SO_REUSEPORT (kernel path under this
        // transport); its queries to dnsmasq crossed the UOE.
        assert!(env.uoe("frames_received") >= 2 * 306, "{}", env.uoe("frames_received"));
    } else {
        assert_eq!(env.sum("unbound", |r| r["fallbacks"].as_u64().unwrap_or(0)), 0);
        // dig opens a socket per query (under `tcp` they go to the kernel
        // path: SO_REUSEPORT).
        assert!(env.sum("dig", |r| r["accelerated"].as_u64().unwrap_or(0)) >= 306);
    }
}

// ---- memcached over UDP ----

/// set then get of three keys over memcached's UDP framing (an 8-byte
/// header with the request id); values up to 3 KiB: a get is answered in
/// several datagrams. Every answer is checked whole.
const MC_CLIENT: &str = r#"
import socket, struct, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(3)
dst = (sys.argv[1], int(sys.argv[2])); n = int(sys.argv[3])
def req(rid, body, end):
    # An answer comes in datagrams of this request id, in order (a get's
    # items and its END in datagrams of their own).
    s.sendto(struct.pack('!HHHH', rid, 0, 1, 0) + body, dst)
    out = b''
    while not out.endswith(end):
        d = s.recv(65536)
        assert struct.unpack('!H', d[:2])[0] == rid
        out += d[8:]
    return out
vals = {}
for i in range(n):
    k = b'k%d' % (i % 40); v = (b'v%d-' % i) * (1 + i % 500); vals[k] = v
    assert req(i & 0xffff, b'set %s 0 0 %d\r\n%s\r\n' % (k, len(v), v), b'\r\n') == b'STORED\r\n'
    ks = [b'k%d' % ((i + j) % 40) for j in range(3)]
    want = b''.join(b'VALUE %s 0 %d\r\n%s\r\n' % (x, len(vals[x]), vals[x]) for x in ks if x in vals) + b'END\r\n'
    got = req((i + 1) & 0xffff, b'get ' + b' '.join(ks) + b'\r\n', b'END\r\n')
    assert got == want, (i, len(got), len(want))
print('ok', n)
"#;

#[test]
fn memcached_udp() {
    memcached(false);
}

#[test]
fn memcached_udp_over_tcp() {
    memcached(true);
}

fn memcached(tcp: bool) {
    let Some(env) = Env::new("mcd", tcp) else { return };
    let mut mc = env.cmd('b', &["memcached", "-u", "root", "-l", ADDR_B, "-p", "0", "-U", "11311", "-t", "2"]);
    let mut mc = mc.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    env.wait_server(&mc, 11311);
    let n = 1500;
    let (ok, got) =
        output(env.cmd('a', &[python(), "-c", MC_CLIENT, ADDR_B, "11311", &n.to_string()]), Duration::from_secs(30));
    stop(&mut mc, libc::SIGTERM);
    assert!(ok && got == format!("ok {n}\n"), "client: {got:?}");
    // Two requests per round; the server's answers to gets span datagrams.
    let rx = env.total("memcached", "datagrams_received");
    let tx = env.total("memcached", "datagrams_sent");
    assert_eq!(rx, 2 * n, "memcached received");
    assert!(tx > 2 * n, "memcached sent {tx}: multi-datagram answers");
    assert_eq!(env.total("python3", "datagrams_received"), tx);
    if tcp {
        assert!(env.uoe("frames_received") >= rx + tx);
    }
}

// ---- rsyslog imudp fed by logger ----

#[test]
fn rsyslog_imudp_from_logger() {
    rsyslog(false);
}

#[test]
fn rsyslog_imudp_from_logger_over_tcp() {
    rsyslog(true);
}

fn rsyslog(tcp: bool) {
    let Some(env) = Env::new("rsl", tcp) else { return };
    let out = env.stats.join("messages.txt");
    let conf = format!(
        "module(load=\"imudp\")\ninput(type=\"imudp\" address=\"{ADDR_B}\" port=\"5514\")\ntemplate(name=\"m\" type=\"string\" string=\"%msg%\\n\")\n*.* action(type=\"omfile\" file=\"{}\" template=\"m\")\n",
        out.display()
    );
    let conf = tmp_file(&env, "rsyslog.conf", &conf);
    let pid = env.stats.join("rsyslog.pid");
    let mut rs = env.cmd('b', &["rsyslogd", "-n", "-f", conf.to_str().unwrap(), "-i", pid.to_str().unwrap()]);
    let mut rs = rs.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    env.wait_server(&rs, 5514);
    // Five runs of 100 messages, apart: rsyslog's reader keeps up (a burst
    // of 1000 overflows its kernel socket buffer here).
    let mut want = String::new();
    for k in 0..5 {
        let lines: String = (0..100).map(|i| format!("run {k} message {i} of eudp\n")).collect();
        want += &lines;
        let f = tmp_file(&env, &format!("chunk{k}.txt"), &lines);
        let (ok, _) = output(
            env.cmd('a', &["logger", "-d", "-n", ADDR_B, "-P", "5514", "-f", f.to_str().unwrap()]),
            Duration::from_secs(10),
        );
        assert!(ok, "logger failed");
        std::thread::sleep(Duration::from_millis(100));
    }
    let t0 = Instant::now();
    let read = || {
        std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .map(|l| format!("{}\n", l.trim_start()))
            .collect::<String>()
    };
    while read().len() < want.len() && t0.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop(&mut rs, libc::SIGTERM);
    let got = read();
    let runs: Vec<usize> =
        (0..5).map(|k| got.lines().filter(|l| l.starts_with(&format!("run {k} "))).count()).collect();
    assert!(
        got == want,
        "rsyslog wrote {} of {} lines, per run {runs:?}; UOE frames {}, kernel {}",
        got.lines().count(),
        want.lines().count(),
        env.uoe("frames_received"),
        env.uoe("kernel_received")
    );
    assert_eq!(env.total("rsyslogd", "datagrams_received"), 500);
    assert_eq!(env.total("logger", "datagrams_sent"), 500);
    if tcp {
        assert!(env.uoe("frames_received") >= 500);
    }
}

/// Binds, sleeps (its first receive, which starts its UOE, comes later),
/// then counts datagrams until 1 s of silence. The bind is a raw
/// `syscall(SYS_bind)`: under the tcp transport the shim attaches a socket
/// at `bind()` (and its UOE listens from then on), which would take away
/// the late start this test needs; the shim does not look at raw binds.
const PY_LATE_READER: &str = r#"
import ctypes, socket, struct, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sa = struct.pack("=HH4s8x", socket.AF_INET, socket.htons(int(sys.argv[2])), socket.inet_aton(sys.argv[1]))
libc = ctypes.CDLL(None, use_errno=True)
if libc.syscall(49, s.fileno(), ctypes.c_char_p(sa), len(sa)) != 0:
    raise OSError(ctypes.get_errno(), "bind")
time.sleep(0.5)
s.settimeout(1); n = 0
try:
    while True: s.recv(9999); n += 1
except socket.timeout: pass
print(n, flush=True)
"#;

/// logger sends 100 datagrams, closes its socket and exits before its
/// lane to host b can connect (b's UOE starts 0.5 s later). The kernel
/// delivers them from the receiver's socket buffer; under `tcp` (DML
/// `queue`) the exit must wait for the lane as it does for open sockets.
/// Before the fix the wait was skipped once no socket was open: 0 of 100.
#[test]
#[cfg(target_arch = "x86_64")] // the reader's raw bind is syscall 49 there
fn logger_exits_before_its_lane_connects_over_tcp() {
    let Some(env) = Env::new("lgx", true) else { return };
    let lines: String = (0..100).map(|i| format!("early message {i}\n")).collect();
    let f = tmp_file(&env, "lines.txt", &lines);
    for stack in [Stack::Kernel, Stack::EudpTcp("default")] {
        let mut rx =
            app_command(&env.tb, 'b', stack, &env.lib, &env.stats, &[python(), "-c", PY_LATE_READER, ADDR_B, "5514"]);
        let rx = rx.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
        // Its port is bound (its UOE, which starts at its first receive, is not).
        testbed::wait_udp_server(rx.id(), 5514, false, Duration::from_secs(10)).unwrap();
        let logger = ["logger", "-d", "-n", ADDR_B, "-P", "5514", "-f", f.to_str().unwrap()];
        let (ok, _) = output(app_command(&env.tb, 'a', stack, &env.lib, &env.stats, &logger), Duration::from_secs(10));
        assert!(ok, "logger failed");
        let got = String::from_utf8_lossy(&rx.wait_with_output().unwrap().stdout).into_owned();
        assert_eq!(got, "100\n", "{}", stack.name());
    }
    // Only logger sends here.
    assert_eq!(env.uoe("frames_sent"), 100, "logger's frames over the UOE");
}
