#!/bin/sh
# Every test: install what is missing, then unit, property and integration
# tests (including the netns testbed), then the Spin verification.
set -eu
cd "$(dirname "$0")/.."
./scripts/deps.sh
. ./scripts/env.sh
cargo test --workspace --release
./target/release/eudp verify
