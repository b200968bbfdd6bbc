#!/bin/sh
# Builds the Debian package target/debian/eudp_<version>_<arch>.deb with
# cargo-deb (installed with `cargo install cargo-deb --locked` when
# missing). Its files are what scripts/install.sh puts under /usr (staged in
# target/release/deb-root); the assets are listed in crates/cli/Cargo.toml.
set -eu
cd "$(dirname "$0")/.."
. ./scripts/env.sh
if ! cargo deb --version >/dev/null 2>&1; then
    echo "package-deb: installing cargo-deb" >&2
    cargo install cargo-deb --locked
fi
cargo build --workspace --release
STAGE=target/release/deb-root
rm -rf "$STAGE"
mkdir -p "$STAGE"
./scripts/install.sh --prefix /usr --destdir "$STAGE" --no-build
# The release profile keeps line tables for backtraces; the package does not.
strip --strip-debug "$STAGE/usr/bin/eudp" "$STAGE/usr/lib/eudp/libeudp_preload.so" \
    "$STAGE/usr/lib/libeudp.so" "$STAGE/usr/lib/libeudp.a"
# dpkg keeps its own list of the package's files.
rm -f "$STAGE/usr/lib/eudp/install-manifest"
# The usr/share asset (completions and man pages when this eudp writes them)
# always holds the README, so the package's asset list is the same either way.
mkdir -p "$STAGE/usr/share/doc/eudp"
cp README.md "$STAGE/usr/share/doc/eudp/README.md"
cargo deb -p eudp-cli --no-build
ls -l target/debian/eudp_*.deb
