#!/bin/sh
# Every test: install what is missing, the style gates (rustfmt, clippy),
# then unit, property and integration tests (including the netns testbed,
# the scripts' and the install's tests), the Spin verification, and a
# bounded run of every fuzz target over its seed corpus.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh test
. ./scripts/env.sh
cargo fmt --all --check
cargo clippy --workspace --all-targets --release -- -D warnings
# Build every artifact first: the shim's tests preload target/release/libeudp_preload.so,
# the C ABI tests link the built libraries and the install test installs them.
cargo build --workspace --release
cargo test --workspace --release
./target/release/eudp verify
./scripts/fuzz.sh 7
