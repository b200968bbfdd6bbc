//! System calls per message of a 10-byte EMP ping-pong in the base scheme,
//! counted with strace: this test runs itself again as a child under
//! `strace -f`, the child's client thread marks the measured stretch with
//! two `getppid` calls, and the calls between the marks are counted per
//! thread. Each application thread should pay a send and a blocking
//! receive per message; the engine threads wake by time (the socket's
//! lease), not per message.

use eudp_engine::emp::{EmpConfig, EmpEndpoint, Op, Status};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const CHILD: &str = "EUDP_EMP_SYSCALLS_CHILD";
const WARMUP: u64 = 200;
const MEASURED: u64 = 1_000;
const WAIT: Duration = Duration::from_secs(20);

#[test]
fn pingpong_costs_a_send_and_a_receive_per_message() {
    if let Some(out) = std::env::var_os(CHILD) {
        child(Path::new(&out));
        return;
    }
    let have_strace = Command::new("strace").arg("-V").output().is_ok_and(|o| o.status.success());
    assert!(have_strace, "strace is missing (scripts/deps.sh test installs it)");
    let dir = std::env::temp_dir().join(format!("eudp-emp-syscalls-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace = dir.join("trace");
    let exe = std::env::current_exe().unwrap();
    let status = Command::new("strace")
        .args(["-ff", "-ttt", "-qq", "-o"])
        .arg(&trace)
        .arg(&exe)
        .args(["--exact", "pingpong_costs_a_send_and_a_receive_per_message", "--test-threads=1", "--nocapture"])
        .env(CHILD, &dir)
        .status()
        .unwrap();
    assert!(status.success(), "the child ping-pong failed: {status}");
    let names: HashMap<String, String> = std::fs::read_to_string(dir.join("threads"))
        .unwrap()
        .lines()
        .filter_map(|l| l.split_once(' ').map(|(t, n)| (t.to_string(), n.to_string())))
        // A thread seen before it named itself is listed twice: its name wins.
        .fold(HashMap::new(), |mut m: HashMap<String, String>, (t, n)| {
            if n.starts_with("emp-") || n.starts_with("eudp-") || !m.contains_key(&t) {
                m.insert(t, n);
            }
            m
        });
    let alone: Vec<f64> = std::fs::read_to_string(dir.join("acks_alone"))
        .unwrap()
        .split(' ')
        .map(|v| v.trim().parse().unwrap())
        .collect();
    // One trace file per thread: "trace.TID".
    let mut traces = HashMap::new();
    for e in std::fs::read_dir(&dir).unwrap().flatten() {
        let f = e.file_name().to_string_lossy().into_owned();
        if let Some(tid) = f.strip_prefix("trace.") {
            let name = names.get(tid).cloned().unwrap_or_else(|| format!("tid {tid}"));
            traces.insert(name, std::fs::read_to_string(e.path()).unwrap());
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    let (from, to) = marks(traces.get("emp-client").expect("the client thread's trace"));
    let elapsed_ms = (to - from) * 1e3;
    let mut calls: Vec<(String, Calls)> = traces.iter().map(|(n, t)| (n.clone(), count(t, from, to))).collect();
    calls.sort_by(|a, b| a.0.cmp(&b.0));
    let engine: usize = calls.iter().filter(|(n, _)| n.starts_with("eudp-emp")).map(|(_, c)| c.total).sum();
    eprintln!("system calls over {MEASURED} messages in {elapsed_ms:.1} ms, per thread: {calls:#?}");
    let m = MEASURED as f64;
    for (name, c) in calls.iter().filter(|(n, _)| n == "emp-client" || n == "emp-server") {
        // A send and a blocking receive per message. A blocking receive
        // that ends without a frame (a late reply on a loaded host) costs
        // two more (it, and the round that looks again); it ends so at
        // most once per `BLOCK` (400 µs).
        // An acknowledgment sent alone (the reply came after the ack delay,
        // as on a loaded host) costs its sender a send and its receiver a
        // receive.
        let acks = alone[0] + alone[1];
        let per_msg = (c.total - c.empty_receives) as f64 / m - acks / m;
        eprintln!(
            "{name}: {per_msg:.2} system calls per message besides {} empty receives and {acks} acknowledgments sent alone",
            c.empty_receives
        );
        assert!(per_msg <= 2.2, "{name}: {per_msg:.2} system calls per message: {c:?}");
        let empty_bound = 2.0 * (elapsed_ms / 0.4 + 1.0) + 0.05 * m;
        assert!((c.empty_receives as f64) <= empty_bound, "{name}: {c:?}, bound {empty_bound:.0}");
    }
    // The engine threads of both endpoints wake at the lease's end (1 ms)
    // and not per message: a few calls per millisecond.
    let engine_bound = 6.0 * elapsed_ms + 0.1 * m;
    eprintln!("engine threads: {engine} system calls, {:.2} per message", engine as f64 / m);
    assert!(engine as f64 <= engine_bound, "engine threads: {engine} calls (bound {engine_bound:.0})");
}

/// One thread's system calls in the measured stretch.
#[derive(Debug, Default)]
#[allow(dead_code)] // `calls` is read through Debug.
struct Calls {
    total: usize,
    /// `recvmmsg` calls that returned no frame.
    empty_receives: usize,
    calls: std::collections::BTreeMap<String, usize>,
}

/// The times of the client's two `getppid` marks.
fn marks(client: &str) -> (f64, f64) {
    let t: Vec<f64> =
        client.lines().filter(|l| l.contains(" getppid(")).filter_map(|l| l.split(' ').next()?.parse().ok()).collect();
    assert_eq!(t.len(), 2, "the client's trace holds both marks");
    (t[0], t[1])
}

/// The calls of one thread's trace strictly between `from` and `to`.
fn count(trace: &str, from: f64, to: f64) -> Calls {
    let mut c = Calls::default();
    for line in trace.lines() {
        let Some((ts, rest)) = line.split_once(' ') else { continue };
        let Ok(ts) = ts.parse::<f64>() else { continue };
        if ts <= from || ts >= to || !rest.starts_with(|ch: char| ch.is_ascii_lowercase()) {
            continue;
        }
        let call = rest.split('(').next().unwrap_or("").to_string();
        if call == "recvmmsg" && rest.contains("= -1 E") {
            c.empty_receives += 1;
        }
        c.total += 1;
        *c.calls.entry(call).or_insert(0) += 1;
    }
    c
}

fn child(out: &Path) {
    let cfg = EmpConfig { blocking_wait: true, ..EmpConfig::default() };
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let a = EmpEndpoint::bind(any, cfg.clone()).unwrap();
    let b = EmpEndpoint::bind(any, cfg).unwrap();
    let ab = a.insert(b.local_addr());
    let ba = b.insert(a.local_addr());
    let total = WARMUP + MEASURED;
    std::thread::scope(|s| {
        let server = std::thread::Builder::new()
            .name("emp-server".into())
            .spawn_scoped(s, || {
                b.recv(Some(ba), 0, u64::MAX, 64, 0).unwrap();
                let mut echoed = 0;
                while echoed < total {
                    let c = b.wait(Some(WAIT)).expect("a request");
                    assert_eq!(c.status, Status::Ok, "{c:?}");
                    if c.op == Op::Recv {
                        b.recv(Some(ba), 0, u64::MAX, 64, 0).unwrap();
                        b.send(ba, c.tag, c.data, c.tag).unwrap();
                        echoed += 1;
                    }
                }
                // The last replies' acknowledgments.
                let until = Instant::now() + WAIT;
                while b.counters().messages_sent < total && Instant::now() < until {
                    let _ = b.wait(Some(Duration::from_millis(10)));
                }
            })
            .unwrap();
        let client = std::thread::Builder::new()
            .name("emp-client".into())
            .spawn_scoped(s, || {
                let mut alone = (0, 0);
                for i in 0..total {
                    if i == WARMUP {
                        alone = acks_alone(&a, &b);
                        let _ = std::os::unix::process::parent_id();
                    }
                    a.recv(Some(ab), i, 0, 64, i).unwrap();
                    let body = i.to_le_bytes()[..8].iter().chain(b"ab").copied().collect::<Vec<u8>>();
                    a.send(ab, i, body.clone(), i).unwrap();
                    let (mut reply, mut acked) = (false, false);
                    while !(reply && acked) {
                        let c = a.wait(Some(WAIT)).expect("a reply");
                        assert_eq!(c.status, Status::Ok, "{c:?}");
                        match c.op {
                            Op::Recv => {
                                assert_eq!((c.tag, &c.data), (i, &body));
                                reply = true;
                            }
                            Op::Send => acked = true,
                        }
                    }
                }
                let _ = std::os::unix::process::parent_id();
                let after = acks_alone(&a, &b);
                std::fs::write(out.join("acks_alone"), format!("{} {}", after.0 - alone.0, after.1 - alone.1)).unwrap();
            })
            .unwrap();
        // Thread names by id, gathered while the threads live (a thread
        // names itself as it starts).
        let mut names = std::collections::BTreeSet::new();
        let deadline = Instant::now() + WAIT;
        while !client.is_finished() && Instant::now() < deadline {
            names.extend(thread_names());
            std::thread::sleep(Duration::from_millis(5));
        }
        client.join().unwrap();
        server.join().unwrap();
        std::fs::write(out.join("threads"), names.into_iter().collect::<Vec<_>>().join("\n")).unwrap();
    });
}

/// Acknowledgments the client and the server sent alone (not on a reply).
fn acks_alone(client: &EmpEndpoint, server: &EmpEndpoint) -> (u64, u64) {
    (client.counters().acks_sent, server.counters().acks_sent)
}

/// "tid name" of each of this process's threads.
fn thread_names() -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let tid = e.file_name().to_string_lossy().into_owned();
        if let Ok(comm) = std::fs::read_to_string(e.path().join("comm")) {
            v.push(format!("{tid} {}", comm.trim()));
        }
    }
    v
}
