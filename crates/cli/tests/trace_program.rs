//! `eudp trace -- PROGRAM` on unmodified programs under `eudp run`
//! (loopback, no testbed): each process writes its own dump
//! (`EUDP_TRACE=…-%p.json`), a fork child's dump holds only the child's
//! events, and a client and its server, two processes, are charted as one
//! flow with every layer of every packet.

use eudp_cli::trace_cmd;
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
    let mut args: Vec<String> = ["--packets", &packets.to_string(), "--out", &dir.display().to_string(), "--"].iter().map(|s| s.to_string()).collect();
    args.extend(program.iter().map(|s| s.to_string()));
    assert_eq!(trace_cmd::trace_main(&args), 0, "eudp trace {args:?} failed");
    serde_json::from_str(&std::fs::read_to_string(dir.join("trace.json")).unwrap()).unwrap()
}

/// The per-process dumps the run left, by pid.
fn dumps(dir: &Path) -> Vec<resolve::Dump> {
    let mut v: Vec<resolve::Dump> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("raw-program-"))
        .map(|p| resolve::parse_dump(&std::fs::read_to_string(p).unwrap()).unwrap())
        .collect();
    v.sort_by_key(|d| d.pid);
    v
}

fn count(d: &resolve::Dump, k: u8) -> usize {
    d.events.iter().filter(|e| e.1 == k).count()
}

/// Every eudp layer for each of the `packets` charted packets, no problems,
/// and each packet's points in path order.
fn complete(json: &serde_json::Value, packets: u64) {
    assert_eq!(json["problems"].as_array().unwrap().len(), 0, "{}", json["problems"]);
    let recs = json["records"].as_array().unwrap();
    for l in resolve::layers_of("eudp") {
        let n = recs.iter().filter(|r| r["layer"] == l.name).count() as u64;
        assert_eq!(n, packets, "layer {} has {n} of {packets} packets", l.name);
    }
    let paths = json["paths"][0]["paths"].as_array().unwrap();
    assert_eq!(paths.len() as u64, packets);
    for p in paths {
        let pts: Vec<u64> = p["points"].as_array().unwrap().iter().map(|x| x.as_u64().expect("a point is missing")).collect();
        for w in pts.windows(2) {
            assert!(w[1] + trace_cmd::ORDER_TOLERANCE_NS >= w[0], "packet {} out of path order: {pts:?}", p["packet"]);
        }
    }
}

#[test]
fn one_process_sending_to_itself() {
    let dir = out_dir("self");
    let py = "import socket\n\
              s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
              s.bind(('127.0.0.1', 0))\n\
              for i in range(30):\n\
              \x20   s.sendto(bytes([i]) * 300, s.getsockname())\n\
              \x20   assert len(s.recv(2048)) == 300\n\
              s.close()\n";
    let json = trace(&dir, 30, &[EUDP, "run", "--", "python3", "-c", py]);
    complete(&json, 30);
    assert_eq!(json["size"], 300);
    let d = dumps(&dir);
    assert_eq!(d.len(), 1);
    assert_eq!((count(&d[0], kind::SEND_CALL), count(&d[0], kind::RECV_CALL)), (30, 30));
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
    let sh = format!("{EUDP} run -- python3 -c \"$SERVER\" & {EUDP} run -- python3 -c \"$CLIENT\"; wait $!");
    std::env::set_var("SERVER", &server);
    std::env::set_var("CLIENT", &client);
    let json = trace(&dir, 40, &["sh", "-c", &sh]);
    let d = dumps(&dir);
    assert_eq!(d.len(), 2, "one dump per process");
    assert_ne!(d[0].pid, d[1].pid);
    let sender = d.iter().find(|x| count(x, kind::SEND_CALL) == 40).expect("the client's dump");
    let receiver = d.iter().find(|x| count(x, kind::RECV_CALL) == 40).expect("the server's dump");
    assert_ne!(sender.pid, receiver.pid);
    assert_eq!(count(sender, kind::RECV_CALL) + count(receiver, kind::SEND_CALL), 0);
    complete(&json, 40);
    // Causal across the processes: the server's kernel stamped each arrival
    // after the client's kernel sent it.
    for p in json["paths"][0]["paths"].as_array().unwrap() {
        let pt = |i: usize| p["points"][i].as_u64().unwrap();
        assert!(pt(7) + trace_cmd::ORDER_TOLERANCE_NS >= pt(6), "packet {} received before it was sent", p["packet"]);
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
    let json = trace(&dir, 5, &[EUDP, "run", "--", "python3", "-c", py]);
    let d = dumps(&dir);
    assert_eq!(d.len(), 2, "parent and child each write a dump");
    let mut sends: Vec<usize> = d.iter().map(|x| count(x, kind::SEND_CALL)).collect();
    sends.sort();
    // Without the reset at fork the child's dump would hold 8.
    assert_eq!(sends, [3, 5], "the child's dump has its 3 sends and none of the parent's 5");
    // The parent's flow (5 datagrams to itself) is the one charted.
    complete(&json, 5);
    let _ = std::fs::remove_dir_all(&dir);
}
