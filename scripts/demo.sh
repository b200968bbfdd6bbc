#!/bin/sh
# The main job: install what is missing, build, and run `eudp demo`
# (a two-host veth testbed, a short side-by-side bench, teardown).
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
. ./scripts/env.sh
cargo build --release -q -p eudp-cli -p eudp-preload
exec ./target/release/eudp demo "$@"
