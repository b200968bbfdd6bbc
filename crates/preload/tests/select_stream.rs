//! `tests/c/select_stream.c`: select loops over a socket receiving a stream
//! (iperf3's shape), on the kernel and under the shim with each transport.
//! The shim answers most of these selects without a syscall (from the ring,
//! a read of the arriving stream, and L1's room); the program checks that
//! every answer is exact for the socket and that a pipe beside it is still
//! reported within the shim's bound, for sets of one word and of several.

mod common;
use common::*;
use std::process::Command;

fn check(transport: &str) {
    let exe = cc("select_stream", &[]);
    for case in ["rw_stream", "read_stream", "high_stream"] {
        let kernel = Command::new(&exe).arg(case).output().unwrap();
        assert!(kernel.status.success(), "{case} on the kernel: {}", String::from_utf8_lossy(&kernel.stderr));
        let stats = stat_dir(&format!("select-stream-{transport}-{case}"));
        let mut cmd = Command::new("timeout");
        cmd.arg("60").arg(&exe).arg(case).env("EUDP_TRANSPORT", transport).env("EUDP_TCP_PORT", uoe_port().to_string());
        let shim = preloaded(cmd, &stats);
        let (k, s) = (String::from_utf8_lossy(&kernel.stdout), String::from_utf8_lossy(&shim.stdout));
        assert!(
            shim.status.success() && s == k,
            "{case} over {transport}: {}\n--- kernel\n{k}--- shim\n{s}{}",
            shim.status,
            String::from_utf8_lossy(&shim.stderr)
        );
        let acc: u64 = reports(&stats).iter().map(|x| x["accelerated"].as_u64().unwrap_or(0)).sum();
        assert!(acc >= 1, "{case} over {transport}: no socket ran on the engine");
        let _ = std::fs::remove_dir_all(&stats);
    }
}

#[test]
fn select_stream_over_tcp() {
    check("tcp");
}

#[test]
fn select_stream_over_kernel_udp() {
    check("kernel");
}
