#!/bin/sh
# Runs every fuzz target for a bounded time over its committed seed corpus.
#   scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 7: eight targets stay within the test command's minute)
# A longer search: scripts/fuzz.sh 600, or cargo +nightly fuzz run TARGET in fuzz/.
# New inputs go to a scratch copy of the corpus, so a run leaves the tree as it was;
# a crash leaves its input in fuzz/artifacts/TARGET/ and fails the run.
set -eu
cd "$(dirname "$0")/../fuzz"
secs=${1:-7}

if ! command -v rustup >/dev/null 2>&1 && [ -f "$HOME/.cargo/env" ]; then
    . "$HOME/.cargo/env"
fi
command -v rustup >/dev/null 2>&1 || { echo "fuzz: rustup is required (scripts/deps.sh installs it)" >&2; exit 1; }
if ! rustup run nightly rustc --version >/dev/null 2>&1; then
    echo "fuzz: installing the nightly toolchain (cargo-fuzz needs it)" >&2
    rustup toolchain install nightly --profile minimal || { echo "fuzz: cannot install nightly Rust" >&2; exit 1; }
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked || { echo "fuzz: cannot install cargo-fuzz" >&2; exit 1; }
fi

cargo +nightly fuzz build -O
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for t in $(cargo +nightly fuzz list); do
    mkdir -p "$scratch/$t"
    cp corpus/"$t"/* "$scratch/$t"/
    echo "fuzz: $t for ${secs}s" >&2
    if ! cargo +nightly fuzz run -O "$t" "$scratch/$t" -- -max_total_time="$secs" -print_final_stats=0 \
        >"$scratch/$t.log" 2>&1; then
        tail -40 "$scratch/$t.log" >&2
        echo "fuzz: $t FAILED; the input is in fuzz/artifacts/$t/" >&2
        exit 1
    fi
    grep -E '^Done [0-9]+ runs' "$scratch/$t.log" | sed "s/^/fuzz: $t: /" >&2 || true
done
