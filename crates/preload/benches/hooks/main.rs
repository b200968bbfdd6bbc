//! Micro-benchmark of the shim's hot hooks against plain libc: `sendto`,
//! `recvfrom`, `recvmsg`, and `select`, `poll`, `epoll_wait` on a socket
//! with a datagram ready, on the kernel and xdp transports.
//!
//! `cargo bench -p eudp-preload --bench hooks` (or `scripts/shim-bench.sh`)
//! runs the harness ([`harness`]): it starts this binary again as the
//! program under test, once on libc and once with `libeudp_preload.so` in
//! `LD_PRELOAD`, so each hook is called as a real program calls it. Per
//! call it reports the time (criterion, median) and the user-space
//! instructions (callgrind `Ir` inside the measured loop of the calling
//! thread only), side by side, in `bench/results/shim-hooks.json`.
//!
//! Roles, by `EUDP_HOOKS_ROLE`: unset, the harness; `time`, criterion over
//! every hook; `count HOOK`, the calls callgrind counts.

mod fixture;
mod harness;
mod sys;

use criterion::Criterion;
use fixture::{Fixture, HOOKS};
use std::time::{Duration, Instant};

/// Calls counted under callgrind per hook (after as many unmeasured ones).
const COUNTED: u64 = 2048;

fn main() {
    match std::env::var("EUDP_HOOKS_ROLE").as_deref() {
        Ok("time") => time_all(),
        Ok("count") => count(&std::env::var("EUDP_HOOKS_HOOK").expect("EUDP_HOOKS_HOOK")),
        _ => harness::run(),
    }
}

fn time_all() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_millis(1500))
        .sample_size(20)
        .without_plots();
    let mut g = c.benchmark_group("hooks");
    for &hook in HOOKS {
        let mut f = Fixture::new(hook);
        g.bench_function(hook, |b| {
            b.iter_custom(|iters| {
                let (mut left, mut spent, mut failed) = (iters, Duration::ZERO, 0);
                while left > 0 {
                    let k = f.prepare(left);
                    let t = Instant::now();
                    failed += f.run(k);
                    spent += t.elapsed();
                    left -= k;
                }
                assert_eq!(failed, 0, "{hook}: calls failed");
                spent
            })
        });
    }
    g.finish();
}

/// The loop callgrind counts (`--toggle-collect` names this symbol).
#[no_mangle]
#[inline(never)]
pub extern "C" fn eudp_hooks_measured(f: &mut Fixture, n: u64) -> u64 {
    f.run(n)
}

fn count(hook: &str) {
    let hook = HOOKS.iter().copied().find(|h| *h == hook).expect("a known hook");
    let mut f = Fixture::new(hook);
    let mut failed = 0;
    for measured in [false, true] {
        let mut left = COUNTED;
        while left > 0 {
            let k = f.prepare(left);
            failed += if measured { eudp_hooks_measured(&mut f, k) } else { f.run(k) };
            left -= k;
        }
    }
    assert_eq!(failed, 0, "{hook}: calls failed");
    println!("counted {COUNTED}");
    println!("unsettled {}", f.unsettled);
}
