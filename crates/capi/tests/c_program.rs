//! Compiles the C programs (`tests/c/basic.c`, `tests/c/emp.c`, `tests/c/async.c`,
//! `tests/c/async_recv.c` and
//! `examples/emp_pingpong.c`) with `cc` against `include/eudp.h` and the
//! built library (shared and static), and runs them. Skipped, with a
//! message, only when no C compiler is installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

const CC_ENV: &str = "CC";

fn compiler() -> Option<String> {
    let cc = std::env::var(CC_ENV).unwrap_or_else(|_| "cc".into());
    let ok = Command::new(&cc)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    ok.then_some(cc)
}

/// The newest `name` among the directories cargo puts library outputs in:
/// the profile directory (uplifted) and its `deps/` (next to this test).
fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let profile = deps.parent().expect("profile dir").to_path_buf();
    let mut found: Vec<(SystemTime, PathBuf)> = [profile, deps]
        .iter()
        .map(|d| d.join(name))
        .filter_map(|p| Some((p.metadata().ok()?.modified().ok()?, p)))
        .collect();
    found.sort();
    match found.pop() {
        Some((_, p)) => p,
        None => panic!("{name} not found next to {} (is crate-type cdylib/staticlib set?)", exe.display()),
    }
}

fn run(cmd: &mut Command, what: &str, limit: Duration) -> String {
    let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap_or_else(|e| panic!("{what}: {e}"));
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{text}", out.status);
    text
}

/// Compiles `source` (relative to the crate) and runs it with `args`;
/// returns its output, which must contain `expect`.
fn compile_and_run(
    cc: &str,
    lib: &Path,
    extra: &[&str],
    tag: &str,
    source: &str,
    args: &[&str],
    expect: &str,
) -> String {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let stem = Path::new(source).file_stem().unwrap().to_string_lossy().into_owned();
    let exe = out_dir.join(format!("eudp-c-{stem}-{tag}-{}", std::process::id()));
    let sizes = [
        format!("-DEXPECTED_STATS_SIZE={}", std::mem::size_of::<eudp_capi::eudp_stats>()),
        format!("-DEXPECTED_RXMSG_SIZE={}", std::mem::size_of::<eudp_capi::eudp_rxmsg>()),
        format!("-DEXPECTED_TXMSG_SIZE={}", std::mem::size_of::<eudp_capi::eudp_txmsg>()),
        format!("-DEXPECTED_EMP_COMPLETION_SIZE={}", std::mem::size_of::<eudp_capi::eudp_emp_completion>()),
        format!("-DEXPECTED_EMP_COUNTERS_SIZE={}", std::mem::size_of::<eudp_capi::eudp_emp_counters>()),
        format!("-DEXPECTED_EMP_CONFIG_SIZE={}", std::mem::size_of::<eudp_capi::eudp_emp_config>()),
        format!("-DEXPECTED_ASYNC_COMPLETION_SIZE={}", std::mem::size_of::<eudp_capi::eudp_async_completion>()),
        format!("-DEXPECTED_ASYNC_MSG_SIZE={}", std::mem::size_of::<eudp_capi::eudp_async_msg>()),
        format!("-DEXPECTED_ASYNC_RX_DATAGRAM_SIZE={}", std::mem::size_of::<eudp_capi::eudp_async_rx_datagram>()),
    ];
    let mut cmd = Command::new(cc);
    cmd.args(["-std=gnu11", "-Wall", "-Wextra", "-Werror", "-O1"])
        .arg("-I")
        .arg(manifest.join("include"))
        .args(&sizes)
        .arg(manifest.join(source))
        .arg("-o")
        .arg(&exe)
        .arg(lib)
        .args(extra);
    run(&mut cmd, &format!("compiling {source} ({tag})"), Duration::from_secs(120));
    let out = run(Command::new(&exe).args(args), &format!("running {source} ({tag})"), Duration::from_secs(120));
    assert!(out.contains(expect), "{out}");
    let _ = std::fs::remove_file(&exe);
    out
}

/// The shared library and the flags that find it at run time.
fn shared() -> (PathBuf, String) {
    let so = built("libeudp_capi.so");
    let dir = so.parent().unwrap().display().to_string();
    (so, format!("-Wl,-rpath,{dir}"))
}

const STATIC_LIBS: [&str; 6] = ["-lpthread", "-ldl", "-lm", "-lrt", "-lutil", "-lgcc_s"];

/// The C compiler, or `None` after saying why `test` is skipped.
fn compiler_for(test: &str) -> Option<String> {
    let cc = compiler();
    if cc.is_none() {
        eprintln!("SKIPPED {test}: no C compiler (`cc` or ${CC_ENV}) found");
    }
    cc
}

#[test]
fn c_program_shared() {
    let Some(cc) = compiler_for("c_program_shared") else { return };
    let (so, rpath) = shared();
    compile_and_run(&cc, &so, &[&rpath], "shared", "tests/c/basic.c", &[], "ok");
}

#[test]
fn c_program_static() {
    let Some(cc) = compiler_for("c_program_static") else { return };
    let a = built("libeudp_capi.a");
    compile_and_run(&cc, &a, &STATIC_LIBS, "static", "tests/c/basic.c", &[], "ok");
}

#[test]
fn c_emp_program_shared() {
    let Some(cc) = compiler_for("c_emp_program_shared") else { return };
    let (so, rpath) = shared();
    compile_and_run(&cc, &so, &[&rpath], "shared", "tests/c/emp.c", &[], "ok");
}

#[test]
fn c_emp_program_static() {
    let Some(cc) = compiler_for("c_emp_program_static") else { return };
    let a = built("libeudp_capi.a");
    compile_and_run(&cc, &a, &STATIC_LIBS, "static", "tests/c/emp.c", &[], "ok");
}

#[test]
fn c_async_program_shared() {
    let Some(cc) = compiler_for("c_async_program_shared") else { return };
    let (so, rpath) = shared();
    compile_and_run(&cc, &so, &[&rpath], "shared", "tests/c/async.c", &[], "ok");
}

#[test]
fn c_async_program_static() {
    let Some(cc) = compiler_for("c_async_program_static") else { return };
    let a = built("libeudp_capi.a");
    compile_and_run(&cc, &a, &STATIC_LIBS, "static", "tests/c/async.c", &[], "ok");
}

#[test]
fn c_async_recv_program_shared() {
    let Some(cc) = compiler_for("c_async_recv_program_shared") else { return };
    let (so, rpath) = shared();
    compile_and_run(&cc, &so, &[&rpath], "shared", "tests/c/async_recv.c", &[], "ok");
}

#[test]
fn c_async_recv_program_static() {
    let Some(cc) = compiler_for("c_async_recv_program_static") else { return };
    let a = built("libeudp_capi.a");
    compile_and_run(&cc, &a, &STATIC_LIBS, "static", "tests/c/async_recv.c", &[], "ok");
}

#[test]
fn c_emp_example_runs() {
    let Some(cc) = compiler_for("c_emp_example_runs") else { return };
    let (so, rpath) = shared();
    let out = compile_and_run(&cc, &so, &[&rpath], "shared", "examples/emp_pingpong.c", &["200", "64"], "round trip");
    assert!(out.contains("200 messages of 64 bytes"), "{out}");
}

#[test]
fn header_declares_every_export() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(manifest.join("include/eudp.h")).unwrap();
    let src = ["src/lib.rs", "src/emp.rs", "src/async_udp.rs", "src/async_recv.rs"]
        .map(|f| std::fs::read_to_string(manifest.join(f)).unwrap())
        .concat();
    let exported: Vec<&str> =
        src.split("extern \"C\" fn ").skip(1).map(|s| s.split('(').next().unwrap().trim()).collect();
    assert!(exported.len() >= 20, "{exported:?}");
    for f in &exported {
        assert!(header.contains(&format!(" {f}(")) || header.contains(&format!("*{f}(")), "{f} missing from eudp.h");
    }
    let declared = header.matches(" eudp_").count() + header.matches("*eudp_").count();
    assert!(declared >= exported.len());
    for f in header.split('\n').filter_map(|l| l.split_once(" eudp_").or_else(|| l.split_once("*eudp_")).map(|x| x.1)) {
        if let Some(name) = f.split('(').next().filter(|_| f.contains('(')) {
            let name = format!("eudp_{name}");
            if !name.contains(' ') {
                assert!(exported.contains(&name.as_str()), "{name} declared in eudp.h but not exported");
            }
        }
    }
}
