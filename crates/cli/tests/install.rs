//! `scripts/install.sh` end to end, on the release build already made (it
//! runs with `--no-build`): install into a temporary prefix; build a C
//! program against the installed header and library through pkg-config
//! (shared, and static with `Libs.private`) and run it; run an unmodified
//! UDP echo server under the installed `eudp run`, with no `EUDP_*`
//! variable, and check the bytes come back and the installed shim is mapped
//! in the server; uninstall and check the prefix is empty again.

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Uses the C interface on loopback: one datagram to itself, byte-exact.
const API_C: &str = r#"
#include <eudp.h>
#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

int main(void) {
    eudp_endpoint *ep = eudp_endpoint_new(AF_INET);
    if (!ep) { perror("eudp_endpoint_new"); return 1; }
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (eudp_bind(ep, (struct sockaddr *)&a, sizeof a) != 0) { perror("eudp_bind"); return 1; }
    struct sockaddr_storage me;
    socklen_t len = sizeof me;
    if (eudp_local_addr(ep, &me, &len) != 0) { perror("eudp_local_addr"); return 1; }
    const char msg[] = "installed eudp";
    if (eudp_sendto(ep, msg, sizeof msg, (struct sockaddr *)&me, len) != (ssize_t)sizeof msg) { perror("eudp_sendto"); return 1; }
    char buf[64];
    if (eudp_set_timeouts(ep, 5000, 5000) != 0) { perror("eudp_set_timeouts"); return 1; }
    ssize_t n = eudp_recv(ep, buf, sizeof buf, 0);
    if (n != (ssize_t)sizeof msg || memcmp(buf, msg, sizeof msg) != 0) { perror("eudp_recv"); return 1; }
    eudp_close(ep);
    puts("ok");
    return 0;
}
"#;

/// A plain UDP echo server on 127.0.0.1: prints its port, then echoes
/// `count` datagrams and exits. Knows nothing of eudp.
const ECHO_C: &str = r#"
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 1;
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { perror("socket"); return 1; }
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) { perror("bind"); return 1; }
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) { perror("getsockname"); return 1; }
    printf("%d\n", ntohs(a.sin_port));
    fflush(stdout);
    char buf[2048];
    for (int i = 0; i < count; i++) {
        struct sockaddr_in peer;
        socklen_t plen = sizeof peer;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&peer, &plen);
        if (n < 0) { perror("recvfrom"); return 1; }
        if (sendto(fd, buf, (size_t)n, 0, (struct sockaddr *)&peer, plen) != n) { perror("sendto"); return 1; }
    }
    return 0;
}
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The target directory of this build (the test runs from `<target>/release/deps/`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    exe.parent().and_then(Path::parent).and_then(Path::parent).expect("target dir").to_path_buf()
}

fn have(program: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {program}")]).output().is_ok_and(|o| o.status.success())
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn check(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let t = text(&out);
    assert!(out.status.success(), "{what} failed ({}):\n{t}", out.status);
    t
}

/// `pkg-config ARGS eudp` against the installed .pc file, split in words.
fn pkg_config(prefix: &Path, args: &[&str]) -> Vec<String> {
    let out = check(
        Command::new("pkg-config").args(args).arg("eudp").env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")),
        "pkg-config",
    );
    out.split_whitespace().map(str::to_string).collect()
}

fn install_sh(prefix: &Path, extra: &[&str]) -> String {
    check(
        Command::new("dash")
            .arg(root().join("scripts/install.sh"))
            .arg("--prefix")
            .arg(prefix)
            .args(extra)
            .env("CARGO_TARGET_DIR", target_dir()),
        "scripts/install.sh",
    )
}

fn compile(src: &str, exe: &Path, flags: &[String]) {
    let c = exe.with_extension("c");
    std::fs::write(&c, src).unwrap();
    check(
        Command::new("cc").args(["-std=gnu11", "-Wall", "-Werror", "-O1"]).arg(&c).arg("-o").arg(exe).args(flags),
        "cc",
    );
}

/// Every file and directory under `dir`.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(tree(&p));
        }
        out.push(p);
    }
    out
}

/// Echoes `n` datagrams through the installed `eudp run` and returns the
/// server's memory map, read while the shim is live.
fn echo_under_installed_run(prefix: &Path, echo: &Path, n: usize) -> String {
    let mut cmd = Command::new(prefix.join("bin/eudp"));
    cmd.arg("run").arg("--").arg(echo).arg(n.to_string());
    // Nothing may point at the build tree: the installed binary must find
    // its own shim.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("EUDP_") || k == "LD_PRELOAD" || k == "LD_LIBRARY_PATH" {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("installed eudp run");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let port: u16 = match lines.next() {
        Some(Ok(l)) => l.trim().parse().expect("port"),
        _ => {
            let out = child.wait_with_output().unwrap();
            panic!("echo server did not start:\n{}", text(&out));
        }
    };
    // `eudp run` execs the program: this pid is the server's.
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap_or_default();
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 2048];
    for i in 0..n {
        let msg: Vec<u8> = (0..(64 + i * 97) % 1400).map(|j| (j * 31 + i) as u8).collect();
        sock.send_to(&msg, ("127.0.0.1", port)).unwrap();
        let (len, _) = sock.recv_from(&mut buf).unwrap_or_else(|e| panic!("echo {i}: {e}"));
        assert_eq!(&buf[..len], &msg[..], "echo {i}");
    }
    let status = child.wait().unwrap();
    assert!(status.success(), "echo server: {status}");
    maps
}

#[test]
fn install_use_uninstall() {
    let build = target_dir().join("release");
    for f in ["eudp", "libeudp_preload.so", "libeudp_capi.so", "libeudp_capi.a"] {
        assert!(build.join(f).exists(), "{} missing: cargo build --workspace --release first", build.join(f).display());
    }
    if !have("dash") || !have("cc") || !have("pkg-config") {
        eprintln!("skipped: needs dash, cc and pkg-config (scripts/deps.sh test installs them)");
        return;
    }
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let prefix = work.join("prefix");
    std::fs::create_dir_all(&prefix).unwrap();
    install_sh(&prefix, &["--no-build"]);
    for f in [
        "bin/eudp",
        "lib/eudp/libeudp_preload.so",
        "lib/libeudp.so",
        "lib/libeudp.a",
        "include/eudp.h",
        "lib/pkgconfig/eudp.pc",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    let pc = std::fs::read_to_string(prefix.join("lib/pkgconfig/eudp.pc")).unwrap();
    assert!(pc.contains(&format!("prefix={}", prefix.display())), "{pc}");

    // The C interface through pkg-config: shared ...
    let api = work.join("api");
    let mut flags = pkg_config(&prefix, &["--cflags"]);
    flags.extend(pkg_config(&prefix, &["--libs"]));
    compile(API_C, &api, &flags);
    let out = check(Command::new(&api).env("LD_LIBRARY_PATH", prefix.join("lib")), "C program (shared)");
    assert!(out.contains("ok"), "{out}");
    // ... and static: the archive plus the .pc file's Libs.private.
    let api_static = work.join("api-static");
    let mut flags = pkg_config(&prefix, &["--cflags"]);
    flags.push(prefix.join("lib/libeudp.a").display().to_string());
    flags.extend(pkg_config(&prefix, &["--static", "--libs-only-l"]).into_iter().filter(|f| f != "-leudp"));
    compile(API_C, &api_static, &flags);
    let out = check(Command::new(&api_static).env_remove("LD_LIBRARY_PATH"), "C program (static)");
    assert!(out.contains("ok"), "{out}");

    // An unmodified program under the installed `eudp run`.
    let echo = work.join("echo");
    compile(ECHO_C, &echo, &[]);
    let maps = echo_under_installed_run(&prefix, &echo, 20);
    let shim = prefix.join("lib/eudp/libeudp_preload.so");
    let shim = shim.canonicalize().unwrap_or(shim);
    assert!(maps.contains(&shim.display().to_string()), "{} not mapped in the server:\n{maps}", shim.display());

    install_sh(&prefix, &["--uninstall"]);
    let left = tree(&prefix);
    assert!(left.is_empty(), "left after uninstall: {left:?}");
    let _ = std::fs::remove_dir_all(&work);
}
