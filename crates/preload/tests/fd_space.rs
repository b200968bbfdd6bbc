//! The shim's and the engine's own descriptors stay out of the program's
//! descriptor space (`crates/preload/src/fdspace.rs`): a program gets the
//! same numbers, the same count of descriptors under its soft limit, the
//! same `getrlimit` answers and the same results of closing by number as on
//! the kernel, while its sockets run on the engine.

mod common;
use common::*;
use std::process::Command;

/// Runs `case` of `tests/c/fd_space.c` on the kernel and under the shim
/// (with `env`); the output must match. Returns the output and the number
/// of sockets the shim put on the engine.
fn same_as_kernel(case: &str, env: &[(&str, &str)]) -> (String, u64) {
    let exe = cc("fd_space", &["-D_FORTIFY_SOURCE=2"]);
    let kernel = Command::new(&exe).arg(case).output().unwrap();
    let kout = String::from_utf8_lossy(&kernel.stdout).into_owned();
    assert!(kernel.status.success(), "{case} on the kernel: {kout}{}", String::from_utf8_lossy(&kernel.stderr));
    let stats = stat_dir(&format!("fd-{case}-{}", env.len()));
    let mut cmd = Command::new(&exe);
    cmd.arg(case).envs(env.iter().copied());
    let shim = preloaded(cmd, &stats);
    let sout = String::from_utf8_lossy(&shim.stdout).into_owned();
    assert!(
        shim.status.success(),
        "{case} under the shim ({:?}): {sout}{}",
        shim.status,
        String::from_utf8_lossy(&shim.stderr)
    );
    assert_eq!(sout, kout, "{case} {env:?}: output differs from the kernel's");
    let acc = reports(&stats).iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
    let _ = std::fs::remove_dir_all(&stats);
    (kout, acc)
}

#[test]
fn descriptor_numbers_after_udp_traffic_are_the_kernels() {
    let (out, acc) = same_as_kernel("numbers", &[]);
    assert!(out.starts_with("udp 3 4 5 6 7 pipe 8 9 "), "{out}");
    assert!(acc >= 6, "sockets not on the engine: {acc}");
}

#[test]
fn descriptor_numbers_are_the_kernels_under_the_tcp_transport() {
    let (_, acc) = same_as_kernel("numbers", &[("EUDP_TRANSPORT", "tcp")]);
    assert!(acc >= 6, "sockets not on the engine: {acc}");
}

#[test]
fn a_program_opens_as_many_sockets_as_its_soft_limit_allows() {
    let (out, acc) = same_as_kernel("limit", &[]);
    assert!(out.contains("limits getrlimit 256 prlimit 256 getdtablesize 256 sysconf 256\n"), "{out}");
    assert!(out.contains("then EMFILE"), "{out}");
    let n: u64 = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(n >= 250, "{out}");
    assert!(acc >= n, "{n} sockets, {acc} on the engine");
}

#[test]
fn select_over_400_sockets_at_a_limit_of_1024() {
    let (out, acc) = same_as_kernel("select", &[]);
    if !out.contains("skipped") {
        assert!(out.contains("received 400"), "{out}");
        assert!(acc >= 400, "{acc} sockets on the engine");
    }
}

#[test]
fn closing_by_number_spares_the_shims_descriptors() {
    let (out, acc) = same_as_kernel("closing", &[]);
    assert!(out.contains("traffic 1\n") && !out.contains("traffic 0"), "{out}");
    assert!(acc >= 5, "{acc} sockets on the engine");
}

#[test]
fn closing_by_number_spares_the_tcp_transports_descriptors() {
    same_as_kernel("closing", &[("EUDP_TRANSPORT", "tcp")]);
}

#[test]
fn getrlimit_shows_the_programs_limit_while_the_shim_places_descriptors() {
    let (out, acc) = same_as_kernel("rlimit_race", &[]);
    assert!(out.starts_with("limit seen other than 512: 0 times\n"), "{out}");
    assert!(acc >= 100, "{acc} sockets on the engine");
}
