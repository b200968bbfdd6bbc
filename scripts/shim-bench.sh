#!/bin/sh
# The shim's per-call cost against plain libc (crates/preload/benches/hooks):
# criterion's ns per call and callgrind's instructions per call, side by side,
# into bench/results/shim-hooks.json (EUDP_HOOKS_OUT to write elsewhere,
# EUDP_HOOKS_LABEL to tag the run). Needs valgrind for the instruction counts
# and root for the xdp transport's namespace.
set -e
cd "$(dirname "$0")/.."
cargo build --release -p eudp-preload
exec cargo bench -p eudp-preload --bench hooks "$@"
