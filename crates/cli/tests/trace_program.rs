//! `eudp trace -- PROGRAM` on unmodified programs under `eudp run`
//! (loopback, no testbed): each process writes its own dump
//! (`EUDP_TRACE=…-%p.json`), a fork child's dump holds only the child's
//! events, and a client and its server, two processes, are charted as one
//! flow with every layer of every packet.

use eudp_cli::trace as trace_cmd;
use eudp_trace::resolve::{self, kind};
use std::path::{Path, PathBuf};

const EUDP: &str = env!("CARGO_BIN_EXE_eudp");

fn out_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eudp-trace-program-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `eudp trace --packets N --out DIR -- PROGRAM…`; the parsed trace.json.
fn trace(dir: &Path, packets: u64, program: &[&str]) -> serde_json::Value {
    trace_with(dir, packets, &[], program)
}

/// As [`trace`] with `--compare STACKS`.
fn trace_stacks(dir: &Path, packets: u64, stacks: &str, program: &[&str]) -> serde_json::Value {
    trace_with(dir, packets, &["--compare", stacks], program)
}

fn trace_with(dir: &Path, packets: u64, opts: &[&str], program: &[&str]) -> serde_json::Value {
    let mut args: Vec<String> = opts.iter().map(|s| s.to_string()).collect();
    args.extend(
        ["--packets", &packets.to_string(), "--out", &dir.display().to_string(), "--"].iter().map(|s| s.to_string()),
    );
    args.extend(program.iter().map(|s| s.to_string()));
    assert_eq!(trace_cmd::trace_main(&args), 0, "eudp trace {args:?} failed");
    serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap()
}

/// The per-process dumps the run of `stack` left, by pid.
fn dumps_of(dir: &Path, stack: &str) -> Vec<resolve::Dump> {
    let prefix = format!("raw-program-{stack}-");
    let mut v: Vec<resolve::Dump> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with(&prefix))
        .map(|p| resolve::parse_dump(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    v.sort_by_key(|d| d.pid);
    v
}

/// The dumps of the (default, eudp only) run.
fn dumps(dir: &Path) -> Vec<resolve::Dump> {
    dumps_of(dir, "eudp")
}

fn count(d: &resolve::Dump, k: u8) -> usize {
    d.events.iter().filter(|e| e.1 == k).count()
}

/// Every layer of `stack` for each of the `packets` charted packets, no
/// problems, and each packet's points in path order.
fn complete(json: &serde_json::Value, stack: &str, packets: u64) {
    assert_eq!(json["problems"].as_array().unwrap().len(), 0, "{}", json["problems"]);
    assert_eq!(json["notes"].as_array().unwrap().len(), 0, "{}", json["notes"]);
    let recs: Vec<&serde_json::Value> =
        json["records"].as_array().unwrap().iter().filter(|r| r["stack"] == stack).collect();
    for l in resolve::layers_of(stack) {
        let n = recs.iter().filter(|r| r["layer"] == l.name).count() as u64;
        assert_eq!(n, packets, "{stack}: layer {} has {n} of {packets} packets", l.name);
    }
    let sp = json["paths"].as_array().unwrap().iter().find(|p| p["stack"] == stack).expect("the stack's paths");
    let paths = sp["paths"].as_array().unwrap();
    assert_eq!(paths.len() as u64, packets);
    // The points this stack has (the kernel's path has no L1 or engine).
    let want: &[usize] = if stack == "kernel" { &[0, 4, 5, 6, 7, 8, 10] } else { &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10] };
    for p in paths {
        let pts: Vec<u64> = want
            .iter()
            .map(|&i| {
                p["points"][i]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{stack}: packet {} lacks {}", p["packet"], resolve::POINTS[i]))
            })
            .collect();
        for w in pts.windows(2) {
            assert!(
                w[1] + trace_cmd::ORDER_TOLERANCE_NS >= w[0],
                "{stack}: packet {} out of path order: {pts:?}",
                p["packet"]
            );
        }
    }
}

/// A Python program whose one socket sends itself `count` datagrams of
/// `size` bytes, receiving each.
fn to_itself(count: u32, size: u32) -> String {
    format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('127.0.0.1', 0))\n\
         for i in range({count}):\n\
         \x20   s.sendto(bytes([i % 256]) * {size}, s.getsockname())\n\
         \x20   assert len(s.recv(2048)) == {size}\n\
         s.close()\n"
    )
}

#[test]
fn one_process_sending_to_itself() {
    let dir = out_dir("self");
    let py = to_itself(30, 300);
    let json = trace(&dir, 30, &[EUDP, "run", "--", "python3", "-c", &py]);
    complete(&json, "eudp", 30);
    assert_eq!(json["size"], 300);
    let d = dumps(&dir);
    assert_eq!(d.len(), 1);
    assert_eq!((count(&d[0], kind::SEND_CALL), count(&d[0], kind::RECV_CALL)), (30, 30));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reading a traced program's TX stamps through io_uring takes a ring
/// descriptor of the shim's own: it is kept out of the program's numbers,
/// so the program's next descriptor is the one it would get untraced, and
/// every packet is still traced.
#[test]
fn the_stamp_reader_keeps_out_of_the_programs_descriptors() {
    let dir = out_dir("fds");
    let report = dir.join("fds.txt");
    let py = format!(
        "import os, resource, socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('127.0.0.1', 0))\n\
         before = os.open('/dev/null', os.O_RDONLY)\n\
         os.close(before)\n\
         for i in range(200):\n\
         \x20   s.sendto(bytes([i % 256]) * 100, s.getsockname())\n\
         \x20   assert len(s.recv(2048)) == 100\n\
         after = os.open('/dev/null', os.O_RDONLY)\n\
         def link(f):\n\
         \x20   try:\n\
         \x20       return os.readlink('/proc/self/fd/' + f)\n\
         \x20   except OSError:\n\
         \x20       return ''\n\
         rings = [int(f) for f in os.listdir('/proc/self/fd') if link(f) == 'anon_inode:[io_uring]']\n\
         open({report:?}, 'w').write('%d %d %d %s' % (before, after, resource.getrlimit(resource.RLIMIT_NOFILE)[0], ','.join(map(str, rings))))\n\
         s.close()\n",
        report = report.display().to_string()
    );
    let json = trace(&dir, 200, &[EUDP, "run", "--", "python3", "-c", &py]);
    complete(&json, "eudp", 200);
    let r = std::fs::read_to_string(&report).unwrap();
    let f: Vec<&str> = r.split(' ').collect();
    let (before, after, soft): (i64, i64, i64) = (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap());
    assert_eq!(before, after, "the program's next descriptor moved: {r}");
    // Where the kernel has the stamp command, the reads went through a ring
    // (200 direct posts: read every 16 messages), on a private number: above
    // the soft limit, or in the shim's region at the top of the program's
    // space (never under FD_SETSIZE when the space reaches beyond it).
    for ring in f.get(3).unwrap_or(&"").split(',').filter(|x| !x.is_empty()) {
        let ring: i64 = ring.parse().unwrap();
        assert!(ring > after && (soft <= 1024 || ring >= 1024), "a ring descriptor among the program's numbers: {r}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program that outlasts its trace buffers (`EUDP_TRACE_EVENTS` kept
/// small): the analysis covers the datagrams whose every layer was kept,
/// says so in a note, and reports no hole for the later ones. Before, every
/// later datagram's missing layers were reported as problems.
#[test]
fn a_full_buffer_cuts_the_analysis_with_a_note_not_holes() {
    let dir = out_dir("full");
    let py = to_itself(400, 200);
    let json = trace(&dir, 10, &["env", "EUDP_TRACE_EVENTS=1500", EUDP, "run", "--", "python3", "-c", &py]);
    let d = dumps(&dir);
    assert_eq!(d.len(), 1);
    assert!(d[0].dropped > 0, "the buffers were meant to fill");
    let notes: Vec<&str> = json["notes"].as_array().unwrap().iter().map(|n| n.as_str().unwrap()).collect();
    assert_eq!(notes.len(), 1, "{notes:?}");
    let kept: u64 = notes[0]
        .split("covers the first ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", notes[0]));
    assert!((10..400).contains(&kept), "{kept} datagrams kept: {}", notes[0]);
    assert_eq!(json["runs"][0]["packets"].as_u64(), Some(kept), "the table covers exactly the kept datagrams");
    assert_eq!(json["problems"].as_array().unwrap().len(), 0, "{}", json["problems"]);
    // The charted packets are complete, in path order.
    let mut cut = json.clone();
    cut["notes"] = serde_json::json!([]);
    complete(&cut, "eudp", 10);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_client_and_its_server_are_one_flow() {
    let dir = out_dir("pair");
    // The server binds port 0 and publishes it; the client waits for it
    // (bounded), sends 40 datagrams and leaves by `_exit` without closing
    // its socket: its dump is written at exit.
    let port = dir.join("port");
    let server = format!(
        "import socket, os\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('127.0.0.1', 0))\n\
         s.settimeout(10)\n\
         open('{p}.tmp', 'w').write(str(s.getsockname()[1]))\n\
         os.rename('{p}.tmp', '{p}')\n\
         for i in range(40):\n\
         \x20   assert len(s.recv(4096)) == 700\n\
         s.close()\n",
        p = port.display()
    );
    let client = format!(
        "import socket, time, os\n\
         for _ in range(1000):\n\
         \x20   if os.path.exists('{p}'): break\n\
         \x20   time.sleep(0.01)\n\
         port = int(open('{p}').read())\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         for i in range(40):\n\
         \x20   s.sendto(b'x' * 700, ('127.0.0.1', port))\n\
         \x20   time.sleep(0.0005)\n\
         os._exit(0)\n",
        p = port.display()
    );
    // Run once per stack: each run starts without the last run's port.
    let sh = format!(
        "rm -f {p}; {EUDP} run -- python3 -c \"$SERVER\" & {EUDP} run -- python3 -c \"$CLIENT\"; wait $!",
        p = port.display()
    );
    std::env::set_var("SERVER", &server);
    std::env::set_var("CLIENT", &client);
    // Both stacks: the kernel run keeps the sockets on the kernel, traced.
    let json = trace_stacks(&dir, 40, "kernel,eudp", &["sh", "-c", &sh]);
    for stack in ["kernel", "eudp"] {
        let d = dumps_of(&dir, stack);
        assert_eq!(d.len(), 2, "{stack}: one dump per process");
        assert_ne!(d[0].pid, d[1].pid);
        let sender = d.iter().find(|x| count(x, kind::SEND_CALL) == 40).expect("the client's dump");
        let receiver = d.iter().find(|x| count(x, kind::RECV_CALL) == 40).expect("the server's dump");
        assert_ne!(sender.pid, receiver.pid);
        assert_eq!(count(sender, kind::RECV_CALL) + count(receiver, kind::SEND_CALL), 0);
        complete(&json, stack, 40);
    }
    // Causal across the processes: the server's kernel stamped each arrival
    // after the client's kernel sent it.
    for sp in json["paths"].as_array().unwrap() {
        for p in sp["paths"].as_array().unwrap() {
            let pt = |i: usize| p["points"][i].as_u64().unwrap();
            assert!(
                pt(7) + trace_cmd::ORDER_TOLERANCE_NS >= pt(6),
                "{}: packet {} received before it was sent",
                sp["stack"],
                p["packet"]
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_fork_childs_dump_holds_only_its_own_events() {
    let dir = out_dir("fork");
    // The parent sends 5 datagrams to itself, then forks; the child sends 3
    // to itself on a socket of its own and exits. (A socket both processes
    // hold moves to the kernel path, so the parent's stays idle.)
    let py = "import socket, os\n\
              def loop(n):\n\
              \x20   s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
              \x20   s.bind(('127.0.0.1', 0))\n\
              \x20   for i in range(n):\n\
              \x20       s.sendto(b'y' * 100, s.getsockname())\n\
              \x20       assert len(s.recv(2048)) == 100\n\
              \x20   return s\n\
              a = loop(5)\n\
              pid = os.fork()\n\
              if pid == 0:\n\
              \x20   loop(3).close()\n\
              \x20   raise SystemExit(0)\n\
              assert os.waitpid(pid, 0)[1] == 0\n\
              a.close()\n";
    let json = trace_stacks(&dir, 5, "kernel,eudp", &[EUDP, "run", "--", "python3", "-c", py]);
    for stack in ["kernel", "eudp"] {
        let d = dumps_of(&dir, stack);
        assert_eq!(d.len(), 2, "{stack}: parent and child each write a dump");
        let mut sends: Vec<usize> = d.iter().map(|x| count(x, kind::SEND_CALL)).collect();
        sends.sort();
        // Without the reset at fork the child's dump would hold 8.
        assert_eq!(sends, [3, 5], "{stack}: the child's dump has its 3 sends and none of the parent's 5");
        // The parent's flow (5 datagrams to itself) is the one charted.
        complete(&json, stack, 5);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_programs_kernel_path_is_traced_alike_and_unchanged() {
    let dir = out_dir("kernel");
    // The program checks what tracing must not change: its recvmsg gets
    // exactly the control message it asked for (IP_PKTINFO, not the RX
    // stamp, no MSG_CTRUNC), and poll reports no POLLERR for the TX stamps
    // on the error queue, on either stack.
    let py = "import socket, select\n\
              s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
              s.bind(('127.0.0.1', 0))\n\
              s.setsockopt(socket.IPPROTO_IP, 8, 1)\n\
              p = select.poll()\n\
              p.register(s, select.POLLIN)\n\
              for i in range(20):\n\
              \x20   s.sendto(bytes([i]) * 200, s.getsockname())\n\
              \x20   if i % 2:\n\
              \x20       data, anc, flags, addr = s.recvmsg(2048, socket.CMSG_SPACE(12))\n\
              \x20       assert [(l, t) for l, t, _ in anc] == [(socket.IPPROTO_IP, 8)], anc\n\
              \x20       assert flags & socket.MSG_CTRUNC == 0 and addr == s.getsockname(), (flags, addr)\n\
              \x20   else:\n\
              \x20       data = s.recv(2048)\n\
              \x20   assert data == bytes([i]) * 200\n\
              \x20   assert p.poll(0) == [], p.poll(0)\n\
              s.close()\n";
    let json = trace_stacks(&dir, 20, "kernel,eudp", &[EUDP, "run", "--", "python3", "-c", py]);
    complete(&json, "kernel", 20);
    complete(&json, "eudp", 20);
    for stack in ["kernel", "eudp"] {
        let d = dumps_of(&dir, stack);
        assert_eq!(d.len(), 1);
        assert_eq!((count(&d[0], kind::SEND_CALL), count(&d[0], kind::RECV_CALL)), (20, 20), "{stack}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
