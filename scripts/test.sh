#!/bin/sh
# Every test: install what is missing, then unit, property and integration
# tests (including the netns testbed), then the Spin verification.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
. ./scripts/env.sh
# Build every artifact first: the shim's tests preload target/release/libeudp_preload.so
# and the C ABI tests link the built libraries.
cargo build --workspace --release
cargo test --workspace --release
./target/release/eudp verify
