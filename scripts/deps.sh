#!/bin/sh
# Installs what eudp needs on Debian 12 when it is missing, and fails loudly
# when it cannot.
#
#   scripts/deps.sh demo   what `scripts/demo.sh` needs: build tools, iproute2
#                          and Rust (root)
#   scripts/deps.sh test   that plus the real peers the tests run, pkg-config
#                          for the install test, and rustfmt/clippy for the
#                          style gates (root)
#   scripts/deps.sh bench  what `eudp bench --emp` runs besides the demo's:
#                          nftables for the loss rule, libfabric's fi_pingpong
#                          (root)
#   scripts/deps.sh rust   only a cargo at least as new as the workspace's
#                          rust-version, through rustup in $HOME (any user)
#
# EUDP_DEPS_DRY_RUN=1 prints the apt-get and rustup commands instead of
# running them; every check still runs. Idempotent: nothing is installed
# when everything is present.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DRY=${EUDP_DEPS_DRY_RUN:-0}

die() {
    echo "deps: error: $*" >&2
    exit 1
}
say() { echo "deps: $*" >&2; }
have() { command -v "$1" >/dev/null 2>&1; }

# Runs a command, or only shows it in a dry run.
act() {
    if [ "$DRY" = 1 ]; then
        echo "deps: would run: $*" >&2
    else
        "$@"
    fi
}

# The workspace's minimum Rust version, read from Cargo.toml so that it has
# one home.
rust_min() {
    v=$(sed -n 's/^rust-version *= *"\([0-9][0-9.]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -n 1)
    [ -n "$v" ] || die "no rust-version in $ROOT/Cargo.toml"
    echo "$v"
}

# version_ge A B: whether dotted version A is at least B (missing parts
# count as 0). Anything but digits and dots is not a version.
version_ge() {
    a=$1
    b=$2
    case "$a$b" in *[!0-9.]* | "") return 1 ;; esac
    while [ -n "$a" ] || [ -n "$b" ]; do
        x=${a%%.*}
        y=${b%%.*}
        case "$a" in *.*) a=${a#*.} ;; *) a= ;; esac
        case "$b" in *.*) b=${b#*.} ;; *) b= ;; esac
        x=${x:-0}
        y=${y:-0}
        [ "$x" -gt "$y" ] && return 0
        [ "$x" -lt "$y" ] && return 1
    done
    return 0
}

# Puts rustup's cargo first on PATH when it is there, ahead of a distro
# cargo that may be too old.
use_rustup_path() {
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        case ":$PATH:" in
            *":$HOME/.cargo/bin:"*) ;;
            *) PATH="$HOME/.cargo/bin:$PATH" ;;
        esac
        export PATH
    fi
}

# The version of the cargo on PATH ("1.88.0"), empty when there is none or
# it does not answer.
cargo_version() {
    have cargo || return 0
    cargo --version 2>/dev/null | sed -n 's/^cargo \([0-9][0-9.]*\).*/\1/p' | head -n 1
}

# Whether the cargo on PATH can build the locked workspace; says why not.
cargo_ok() {
    min=$(rust_min)
    v=$(cargo_version)
    if [ -z "$v" ]; then
        say "no cargo on PATH"
        return 1
    fi
    if ! version_ge "$v" "$min"; then
        say "cargo $v is older than $min (rust-version in Cargo.toml); treating it as absent"
        return 1
    fi
    return 0
}

have_ca_certs() { [ -s /etc/ssl/certs/ca-certificates.crt ]; }

# Downloads rustup-init to a temporary file and runs it: a failed or empty
# download stops here instead of reaching a shell as an empty script.
install_rustup() {
    components=$1
    if [ -x "$HOME/.cargo/bin/rustup" ]; then
        say "installing Rust stable with the existing rustup"
        act "$HOME/.cargo/bin/rustup" toolchain install stable --profile minimal
        act "$HOME/.cargo/bin/rustup" default stable
        return 0
    fi
    have curl || die "curl is missing: run scripts/deps.sh demo as root, or install curl and ca-certificates"
    have_ca_certs || die "ca-certificates is missing: curl cannot check https://sh.rustup.rs"
    say "installing Rust stable with rustup"
    if [ "$DRY" = 1 ]; then
        act curl -fsSL --proto '=https' --tlsv1.2 -o RUSTUP_INIT https://sh.rustup.rs
        act sh RUSTUP_INIT -y --profile minimal --default-toolchain stable $components
        return 0
    fi
    tmp=$(mktemp -d) || die "mktemp failed"
    init="$tmp/rustup-init.sh"
    if ! curl -fsSL --proto '=https' --tlsv1.2 -o "$init" https://sh.rustup.rs; then
        rm -rf "$tmp"
        die "downloading rustup-init from https://sh.rustup.rs failed (see curl's message above)"
    fi
    if [ ! -s "$init" ]; then
        rm -rf "$tmp"
        die "downloading rustup-init from https://sh.rustup.rs gave an empty file"
    fi
    # A distro rustc/cargo on PATH is expected here: rustup's comes first on
    # PATH afterwards (scripts/env.sh).
    # shellcheck disable=SC2086
    if ! RUSTUP_INIT_SKIP_PATH_CHECK=yes sh "$init" -y --profile minimal --default-toolchain stable $components; then
        rm -rf "$tmp"
        die "rustup-init failed"
    fi
    rm -rf "$tmp"
}

# Makes sure a new enough cargo is on PATH (after scripts/env.sh).
ensure_rust() {
    components=$1
    use_rustup_path
    cargo_ok && return 0
    install_rustup "$components"
    [ "$DRY" = 1 ] && return 0
    use_rustup_path
    cargo_ok || die "Rust was installed but no cargo at least $(rust_min) is on PATH ($HOME/.cargo/bin)"
    say "$(cargo --version)"
}

# rustfmt and clippy for the style gates of scripts/test.sh.
ensure_style_tools() {
    [ "$DRY" = 1 ] && ! cargo_ok 2>/dev/null && return 0
    missing=""
    cargo fmt --version >/dev/null 2>&1 || missing="$missing rustfmt"
    cargo clippy --version >/dev/null 2>&1 || missing="$missing clippy"
    [ -n "$missing" ] || return 0
    have rustup || die "cargo has no$missing and there is no rustup to add them"
    say "adding rustup components$missing"
    # shellcheck disable=SC2086
    act rustup component add $missing || die "rustup component add$missing failed"
}

require_root() {
    [ "$(id -u)" = 0 ] || die "scripts/deps.sh $1 installs Debian packages and must run as root (try: sudo $0 $1)"
}

# Packages whose program is missing. Arguments: command:package pairs; a
# command starting with / is a file that must exist.
missing_packages() {
    for pair in "$@"; do
        cmd=${pair%%:*}
        pkg=${pair#*:}
        case "$cmd" in
            /*) [ -e "$cmd" ] && continue ;;
            *) have "$cmd" && continue ;;
        esac
        case " $out " in *" $pkg "*) ;; *) out="$out $pkg" ;; esac
    done
}

# One apt-get update for the whole run, its errors shown, then the install.
apt_install() {
    [ -n "$1" ] || return 0
    have apt-get || die "missing:$1, and there is no apt-get to install them (Debian 12 expected)"
    say "installing$1"
    export DEBIAN_FRONTEND=noninteractive
    act apt-get update -q || die "apt-get update failed (see its errors above); needed:$1"
    # shellcheck disable=SC2086
    act apt-get install -y -q --no-install-recommends $1 || die "apt-get install failed for:$1"
}

# What `eudp demo` uses: a compiler and libc headers to build, ip for the
# testbed's namespaces and veth pair, ethtool and sysctl to tune it.
DEMO_PKGS="cc:gcc /usr/include/stdio.h:libc6-dev ip:iproute2 ethtool:ethtool sysctl:procps"
# What `eudp bench --emp` and its tests run: nft for the loss rule of the
# impairment testbed, libfabric's fi_pingpong (udp;ofi_rxd) as a baseline.
EMP_PKGS="/usr/sbin/nft:nftables fi_pingpong:libfabric-bin"
# What the tests run besides: ping, tc, python3 helpers, the real UDP peers
# under `eudp run`, Spin for `eudp verify`, pkg-config for the install test,
# strace for the EMP system-call count.
TEST_PKGS="ping:iputils-ping tc:iproute2 python3:python3 timeout:coreutils kill:procps \
iperf3:iperf3 iperf:iperf sockperf:sockperf socat:socat /usr/sbin/dnsmasq:dnsmasq-base \
dig:bind9-dnsutils /usr/sbin/unbound:unbound memcached:memcached logger:bsdutils \
/usr/sbin/rsyslogd:rsyslog spin:spin pkg-config:pkg-config /usr/bin/time:time strace:strace $EMP_PKGS"

main() {
    what=${1:-}
    case "$what" in
        demo) pairs=$DEMO_PKGS ;;
        test) pairs="$DEMO_PKGS $TEST_PKGS" ;;
        bench) pairs="$DEMO_PKGS $EMP_PKGS" ;;
        rust)
            ensure_rust ""
            return 0
            ;;
        *) die "usage: scripts/deps.sh demo|test|bench|rust" ;;
    esac
    require_root "$what"
    out=""
    # shellcheck disable=SC2086
    missing_packages $pairs
    use_rustup_path
    rust_needed=0
    cargo_ok 2>/dev/null || rust_needed=1
    if [ "$rust_needed" = 1 ] && [ ! -x "$HOME/.cargo/bin/rustup" ]; then
        have curl || out="$out curl"
        have_ca_certs || out="$out ca-certificates"
    fi
    apt_install "$out"
    components=""
    [ "$what" = test ] && components="-c rustfmt -c clippy"
    if [ "$rust_needed" = 1 ]; then
        ensure_rust "$components"
    fi
    [ "$what" = test ] && ensure_style_tools
    return 0
}

main "$@"
