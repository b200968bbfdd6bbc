//! User-space instructions per message of a 10-byte ping-pong, EMP (any
//! scheme) beside kernel UDP, counted with callgrind.
//!
//! `cargo run --release -p eudp-engine --example emp_instr -- [OUT.json]
//! [--schemes base,so] [--messages N]` runs each mode's server and client
//! as two processes under `valgrind --tool=callgrind --separate-threads=yes`,
//! once with N and once with 2N messages, and charges the difference to
//! the N extra messages, so start-up and shutdown cancel out. It reports
//! per side: instructions per message in all, per thread (the application
//! thread and the engine threads), and per function (callgrind_annotate's
//! self cost, the largest first). Instruction counts do not depend on the
//! host's load; time-driven work (an engine thread's periodic wake-ups)
//! does, since callgrind runs the program ~50× slower, so the engine
//! threads' share is reported apart.
//!
//! `emp_instr side ROLE MODE PORT PEER_PORT MESSAGES` is one side; the
//! client prints its mean round trip (`ns_per_round_trip`), for a timing
//! without callgrind.

use eudp_engine::emp::{EmpConfig, EmpEndpoint, Op, Scheme, Status};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: usize = 10;
const WAIT: Duration = Duration::from_secs(30);
/// Functions listed per side.
const TOP: usize = 25;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("side") {
        if let Err(e) = side(&args[1..]) {
            eprintln!("emp_instr side: {e}");
            std::process::exit(1);
        }
        return;
    }
    match drive(&args) {
        Ok(path) => println!("{}", path.display()),
        Err(e) => {
            eprintln!("emp_instr: {e}");
            std::process::exit(1);
        }
    }
}

fn drive(args: &[String]) -> Result<PathBuf, String> {
    let mut out = None;
    let mut schemes = vec!["base".to_string()];
    let mut messages = 2_000u64;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--schemes" => schemes = it.next().ok_or("--schemes needs a list")?.split(',').map(String::from).collect(),
            "--messages" => messages = it.next().and_then(|n| n.parse().ok()).ok_or("--messages needs a number")?,
            p => out = Some(PathBuf::from(p)),
        }
    }
    let out = out.unwrap_or_else(|| PathBuf::from(format!("bench/results/emp-instr-{}.json", unix_time())));
    let loadavg_before = loadavg();
    let scratch = std::env::temp_dir().join(format!("eudp-emp-instr-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for mode in std::iter::once("udp".to_string()).chain(schemes.iter().map(|s| format!("emp-{s}"))) {
        eprintln!("emp_instr: {mode}");
        let short = run_pair(&mode, messages, &scratch)?;
        let long = run_pair(&mode, 2 * messages, &scratch)?;
        let mut sides = serde_json::Map::new();
        for (i, role) in ["server", "client"].iter().enumerate() {
            sides.insert(role.to_string(), per_message(&short[i], &long[i], messages));
        }
        rows.push(json!({"mode": mode, "sides": sides}));
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let udp_total = |r: &Value| r["sides"]["client"]["total"].as_f64().unwrap_or(0.0);
    let udp = udp_total(&rows[0]);
    let ratios: Vec<Value> = rows[1..]
        .iter()
        .map(|r| {
            json!({"mode": r["mode"], "client_total_vs_udp": ratio(udp_total(r), udp),
            "server_total_vs_udp": ratio(r["sides"]["server"]["total"].as_f64().unwrap_or(0.0),
                rows[0]["sides"]["server"]["total"].as_f64().unwrap_or(0.0))})
        })
        .collect();
    let doc = json!({
        "kind": "emp-instr",
        "unix_time": unix_time(),
        "size": SIZE,
        "messages_charged": messages,
        "method": "callgrind Ir of a run of 2N messages minus a run of N, per message; both sides separate \
                   processes on loopback; per_thread: callgrind --separate-threads (thread 1 is the \
                   application's); functions: callgrind_annotate self cost",
        "loadavg_before": loadavg_before,
        "loadavg_after": loadavg(),
        "rows": rows,
        "ratios": ratios,
    });
    if let Some(d) = out.parent() {
        std::fs::create_dir_all(d).map_err(|e| e.to_string())?;
    }
    std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap() + "\n").map_err(|e| e.to_string())?;
    Ok(out)
}

fn ratio(a: f64, b: f64) -> Value {
    if b > 0.0 {
        json!((a / b * 1000.0).round() / 1000.0)
    } else {
        Value::Null
    }
}

/// One side's callgrind results: total, per thread, per function.
#[derive(Default)]
struct Counted {
    total: f64,
    threads: BTreeMap<usize, f64>,
    functions: BTreeMap<String, f64>,
}

fn per_message(short: &Counted, long: &Counted, extra: u64) -> Value {
    let m = extra as f64;
    let per = |a: f64, b: f64| ((b - a) / m * 10.0).round() / 10.0;
    let threads: serde_json::Map<String, Value> = long
        .threads
        .iter()
        .map(|(t, &v)| (t.to_string(), json!(per(short.threads.get(t).copied().unwrap_or(0.0), v))))
        .collect();
    let mut funcs: Vec<(String, f64)> = long
        .functions
        .iter()
        .map(|(f, &v)| (f.clone(), per(short.functions.get(f).copied().unwrap_or(0.0), v)))
        .collect();
    funcs.sort_by(|a, b| b.1.total_cmp(&a.1));
    funcs.truncate(TOP);
    json!({
        "total": per(short.total, long.total),
        "per_thread": threads,
        "functions": funcs.into_iter().map(|(f, v)| json!([f, v])).collect::<Vec<_>>(),
    })
}

/// Server and client of `mode` under callgrind for `messages`.
fn run_pair(mode: &str, messages: u64, scratch: &Path) -> Result<[Counted; 2], String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let ports = free_ports();
    let mut children = Vec::new();
    for (role, (me, peer)) in [("server", (ports.1, ports.0)), ("client", (ports.0, ports.1))] {
        let base = scratch.join(format!("{mode}-{role}-{messages}"));
        let child = Command::new("valgrind")
            .args(["--tool=callgrind", "--separate-threads=yes", "--dump-instr=no"])
            .arg(format!("--callgrind-out-file={}", base.display()))
            .arg(&exe)
            .args(["side", role, mode, &me.to_string(), &peer.to_string(), &messages.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("spawn valgrind: {e}"))?;
        children.push((role, base, child));
        // The server binds before the client's first send.
        std::thread::sleep(Duration::from_millis(1500));
    }
    let mut out: [Counted; 2] = Default::default();
    for (i, (role, base, child)) in children.into_iter().enumerate().rev() {
        let o = child.wait_with_output().map_err(|e| e.to_string())?;
        if !o.status.success() {
            let err = String::from_utf8_lossy(&o.stderr);
            return Err(format!(
                "{mode} {role}: {}: {}",
                o.status,
                err.lines().filter(|l| !l.starts_with("==")).collect::<Vec<_>>().join(" | ")
            ));
        }
        out[i] = read_counts(&base)?;
    }
    Ok(out)
}

/// Two free loopback ports (bound and released).
fn free_ports() -> (u16, u16) {
    let a = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b = UdpSocket::bind("127.0.0.1:0").unwrap();
    (a.local_addr().unwrap().port(), b.local_addr().unwrap().port())
}

/// The per-thread files `BASE-NN` callgrind wrote: totals per thread and
/// self cost per function over all of them.
fn read_counts(base: &Path) -> Result<Counted, String> {
    let dir = base.parent().unwrap();
    let stem = base.file_name().unwrap().to_string_lossy().into_owned();
    let mut c = Counted::default();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(t) = name.strip_prefix(&format!("{stem}-")).and_then(|t| t.parse::<usize>().ok()) else { continue };
        let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
        let total = text
            .lines()
            .find_map(|l| l.strip_prefix("totals:").or_else(|| l.strip_prefix("summary:")))
            .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
            .unwrap_or(0.0);
        c.total += total;
        c.threads.insert(t, total);
        let o = Command::new("callgrind_annotate")
            .args(["--inclusive=no", "--auto=no", "--threshold=100"])
            .arg(e.path())
            .output()
            .map_err(|e| format!("callgrind_annotate: {e}"))?;
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            // "1,234 (12.3%)  file:function [object]" or "1,234  file:function"
            let l = line.trim_start();
            let Some((num, rest)) = l.split_once(' ') else { continue };
            let Ok(ir) = num.replace(',', "").parse::<f64>() else { continue };
            let rest = rest.trim_start();
            let rest =
                if rest.starts_with('(') { rest.split_once(')').map_or(rest, |r| r.1).trim_start() } else { rest };
            if rest.starts_with("PROGRAM TOTALS") || rest.is_empty() {
                continue;
            }
            let func = rest.split_once(':').map_or(rest, |r| r.1);
            let func = func.split(" [").next().unwrap_or(func).to_string();
            *c.functions.entry(func).or_insert(0.0) += ir;
        }
    }
    if c.threads.is_empty() {
        return Err(format!("no callgrind output at {}-*", base.display()));
    }
    Ok(c)
}

/// One side: `ROLE MODE PORT PEER_PORT MESSAGES`.
fn side(a: &[String]) -> Result<(), String> {
    let [role, mode, port, peer, messages] = a else { return Err("ROLE MODE PORT PEER_PORT MESSAGES".into()) };
    let addr =
        |p: &String| -> Result<SocketAddr, String> { format!("127.0.0.1:{p}").parse().map_err(|e| format!("{e}")) };
    let (me, peer) = (addr(port)?, addr(peer)?);
    let n: u64 = messages.parse().map_err(|e| format!("{e}"))?;
    let server = role == "server";
    if mode == "udp" {
        return udp_side(server, me, peer, n);
    }
    let scheme: Scheme =
        mode.strip_prefix("emp-").ok_or("MODE is udp or emp-SCHEME")?.parse().map_err(|e| format!("{e:?}"))?;
    let ep = EmpEndpoint::bind(me, EmpConfig { scheme, ..EmpConfig::default() }).map_err(|e| e.to_string())?;
    let p = ep.insert(peer);
    let wait = || ep.wait(Some(WAIT)).ok_or("no completion within 30 s");
    if server {
        ep.recv(Some(p), 0, u64::MAX, 64, 0).map_err(|e| e.to_string())?;
        let (mut echoed, mut acked) = (0, 0);
        while acked < n {
            let c = wait()?;
            if c.status != Status::Ok {
                return Err(format!("{c:?}"));
            }
            match c.op {
                Op::Recv => {
                    echoed += 1;
                    if echoed < n {
                        ep.recv(Some(p), 0, u64::MAX, 64, 0).map_err(|e| e.to_string())?;
                    }
                    ep.send(p, c.tag, c.data, c.tag).map_err(|e| e.to_string())?;
                }
                Op::Send => acked += 1,
            }
        }
        return Ok(());
    }
    let start = Instant::now();
    for i in 0..n {
        ep.recv(Some(p), i, 0, 64, i).map_err(|e| e.to_string())?;
        let body = body(i);
        ep.send(p, i, body.to_vec(), i).map_err(|e| e.to_string())?;
        let (mut reply, mut acked) = (false, false);
        while !(reply && acked) {
            let c = wait()?;
            if c.status != Status::Ok {
                return Err(format!("{c:?}"));
            }
            match c.op {
                Op::Recv if c.tag == i && c.data == body[..] => reply = true,
                Op::Recv => return Err(format!("reply {} to message {i}", c.tag)),
                Op::Send => acked = true,
            }
        }
    }
    report(start, n);
    // The last reply's acknowledgment is parked for a request that never
    // comes: it leaves alone once its delay ends, before the endpoint goes.
    let _ = ep.wait(Some(Duration::from_millis(20)));
    Ok(())
}

/// The client's mean round trip, for a timing without callgrind.
fn report(start: Instant, n: u64) {
    println!("{{\"ns_per_round_trip\": {}}}", start.elapsed().as_nanos() / u128::from(n.max(1)));
}

/// Message `i`'s bytes (on the stack: the harness allocates nothing per
/// message of its own; an EMP send takes a `Vec`, the API's cost).
fn body(i: u64) -> [u8; SIZE] {
    let mut b = [b'x'; SIZE];
    b[..8].copy_from_slice(&i.to_le_bytes());
    b
}

/// Kernel UDP: blocking `send_to` and `recv_from`, the client waits for
/// each reply.
fn udp_side(server: bool, me: SocketAddr, peer: SocketAddr, n: u64) -> Result<(), String> {
    let s = UdpSocket::bind(me).map_err(|e| e.to_string())?;
    if !server {
        s.set_read_timeout(Some(Duration::from_millis(200))).map_err(|e| e.to_string())?;
    }
    let mut buf = [0u8; 64];
    let start = Instant::now();
    let give_up = start + WAIT;
    for i in 0..n {
        if server {
            let (len, from) = s.recv_from(&mut buf).map_err(|e| e.to_string())?;
            s.send_to(&buf[..len], from).map_err(|e| e.to_string())?;
            continue;
        }
        let body = body(i);
        // A request lost before the server bound is sent again; a late
        // reply to an earlier copy is skipped.
        'resend: loop {
            s.send_to(&body, peer).map_err(|e| e.to_string())?;
            loop {
                match s.recv_from(&mut buf) {
                    Ok((len, _)) if buf[..len] == body[..] => break 'resend,
                    Ok(_) => continue,
                    Err(_) if Instant::now() < give_up => continue 'resend,
                    Err(e) => return Err(format!("message {i}: {e}")),
                }
            }
        }
    }
    if !server {
        report(start, n);
    }
    Ok(())
}

fn loadavg() -> Value {
    let s = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let v: Vec<f64> = s.split_whitespace().take(3).filter_map(|x| x.parse().ok()).collect();
    json!(v)
}

fn unix_time() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
