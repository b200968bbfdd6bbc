//! Helpers shared by the preload tests: where the built library is, and
//! running a program with and without it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// `libeudp_preload.so` of this build (cargo builds the cdylib before the
/// integration tests; the test executable lives in `<target>/<profile>/deps`).
pub fn lib() -> PathBuf {
    if let Some(p) = std::env::var_os("EUDP_PRELOAD_LIB") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap();
    let prof = exe.parent().unwrap().parent().unwrap();
    let p = prof.join("libeudp_preload.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// Compiles a C test program from `tests/c/NAME.c` into a temporary directory.
pub fn cc(name: &str, extra: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c").join(format!("{name}.c"));
    // One output file per call: tests of one binary run in parallel in one
    // process, and two of them compiling the same program into one path
    // could exec a half-written file (EACCES/ETXTBSY).
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("eudp-preload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{n}"));
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&out)
        .arg(&src)
        .args(extra)
        .status()
        .expect("cc");
    assert!(st.success(), "cc {name}");
    out
}

/// A temporary directory for stats files.
pub fn stat_dir(tag: &str) -> PathBuf {
    // Unique per call: tests running at once may use the same tag.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let d = std::env::temp_dir().join(format!("eudp-stat-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `cmd` under the shim (stats into `stats`).
pub fn preloaded(mut cmd: Command, stats: &Path) -> Output {
    cmd.env("LD_PRELOAD", lib()).env("EUDP_STAT_DIR", stats).env("EUDP_STAT_MS", "200");
    cmd.output().expect("spawn")
}

/// The stats files written by processes under the shim.
pub fn reports(stats: &Path) -> Vec<serde_json::Value> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(stats).unwrap().flatten() {
        let p = e.path();
        if p.extension().is_some_and(|x| x == "json") {
            if let Ok(s) = std::fs::read_to_string(&p) {
                if let Ok(j) = serde_json::from_str(&s) {
                    v.push(j);
                }
            }
        }
    }
    v
}

/// Sum of one counter over every socket (open and closed) of every report.
pub fn total(reports: &[serde_json::Value], counter: &str) -> u64 {
    let mut t = 0;
    for r in reports {
        for key in ["sockets", "closed"] {
            for s in r[key].as_array().into_iter().flatten() {
                t += s["stats"][counter].as_u64().unwrap_or(0);
            }
        }
    }
    t
}

/// A TCP port for a run's UOE listener (`EUDP_TRANSPORT=tcp`,
/// `EUDP_TCP_PORT`), free now and below the kernel's ephemeral range: a
/// port from `bind(:0)` can become the automatic local port of any
/// connection on the host (another test's, a lane's) between this pick and
/// the program's own listen, and the program then waits for the port
/// while its datagrams to itself queue (a tcp_fork race run failed with
/// "port in use" about 1 in 400; a c_tcp_transport case hung to its alarm).
pub fn uoe_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768)
        .clamp(12_000, 65_535);
    let seed = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos()
        ^ (std::process::id() << 16);
    let mut x = seed | 1;
    for _ in 0..2000 {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        let port = (10_000 + (x >> 8) % (low - 10_000)) as u16;
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_ok()
            && std::net::UdpSocket::bind(("0.0.0.0", port)).is_ok()
        {
            return port;
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
