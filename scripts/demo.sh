#!/bin/sh
# The main job: install what the demo needs (build tools, iproute2, Rust),
# build, and run `eudp demo` (a two-host veth testbed, a short side-by-side
# bench, teardown). Needs root for the network namespaces.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh demo
. ./scripts/env.sh
cargo build --release -q -p eudp-cli -p eudp-preload
exec ./target/release/eudp demo "$@"
