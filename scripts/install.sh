#!/bin/sh
# Installs eudp under a prefix, or removes such an install.
#
#   scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--uninstall]
#
# Installs PREFIX/bin/eudp, the shim PREFIX/lib/eudp/libeudp_preload.so
# (where `eudp run` finds it), the C library PREFIX/lib/libeudp.so and
# libeudp.a, PREFIX/include/eudp.h, PREFIX/lib/pkgconfig/eudp.pc, and shell
# completions and man pages when the built `eudp` can write them. The
# default prefix is /usr/local. --destdir stages the files under DIR (for
# packaging) while paths inside them still name PREFIX. --no-build uses the
# release build already in the target directory.
#
# Every file and every directory the install creates is listed in
# PREFIX/lib/eudp/install-manifest; --uninstall (same --prefix and
# --destdir) removes exactly those.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=/usr/local
DESTDIR=""
BUILD=1
UNINSTALL=0

die() {
    echo "install: error: $*" >&2
    exit 1
}
usage() { die "usage: scripts/install.sh [--prefix DIR] [--destdir DIR] [--no-build] [--uninstall]"; }

while [ $# -gt 0 ]; do
    case "$1" in
        --prefix) [ $# -ge 2 ] || usage; PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#*=}; shift ;;
        --destdir) [ $# -ge 2 ] || usage; DESTDIR=$2; shift 2 ;;
        --destdir=*) DESTDIR=${1#*=}; shift ;;
        --no-build) BUILD=0; shift ;;
        --uninstall) UNINSTALL=1; shift ;;
        -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) usage ;;
    esac
done
case "$PREFIX" in /*) ;; *) die "--prefix must be an absolute path: $PREFIX" ;; esac
PREFIX=${PREFIX%/}
[ -n "$PREFIX" ] || die "--prefix / is not supported"
DEST="$DESTDIR$PREFIX"
MANIFEST_REL=lib/eudp/install-manifest
MANIFEST="$DEST/$MANIFEST_REL"

# Removes what the manifest lists: files first, then the directories the
# install created, deepest first, each only if it is empty.
uninstall() {
    [ -f "$MANIFEST" ] || die "no install at $DEST (missing $MANIFEST)"
    dirs=$(sed -n 's/^d //p' "$MANIFEST" | sort -r)
    files=$(sed -n 's/^f //p' "$MANIFEST")
    for f in $files; do
        rm -f "$DEST/$f"
    done
    for d in $dirs; do
        rmdir "$DEST/$d" 2>/dev/null || true
    done
    echo "install: removed eudp from $DEST" >&2
}

if [ "$UNINSTALL" = 1 ]; then
    uninstall
    exit 0
fi

if [ "$BUILD" = 1 ]; then
    # shellcheck disable=SC1091
    . "$ROOT/scripts/env.sh"
    (cd "$ROOT" && cargo build --release -p eudp-cli -p eudp-preload -p eudp-capi)
fi
OUT=${CARGO_TARGET_DIR:-$ROOT/target}/release
for f in eudp libeudp_preload.so libeudp_capi.so libeudp_capi.a; do
    [ -f "$OUT/$f" ] || die "$OUT/$f is missing (build with: cargo build --workspace --release)"
done
VERSION=$(sed -n 's/^version *= *"\([^"]*\)".*/\1/p' "$ROOT/Cargo.toml" | head -n 1)

# Directories and files this run creates, relative to DEST; directories
# created by an earlier install stay listed.
LIST=$(mktemp)
STAGE=$(mktemp -d)
[ -f "$MANIFEST" ] && grep '^d ' "$MANIFEST" >>"$LIST" || true

# mkdirs REL: creates DEST/REL and its missing parents, listing each.
mkdirs() {
    [ -d "$DEST/$1" ] && return 0
    parent=$(dirname "$1")
    [ "$parent" = . ] || mkdirs "$parent"
    mkdir "$DEST/$1"
    echo "d $1" >>"$LIST"
}

# put MODE SRC REL: installs SRC as DEST/REL.
put() {
    mkdirs "$(dirname "$3")"
    install -m "$1" "$2" "$DEST/$3"
    echo "f $3" >>"$LIST"
}

# Writes the manifest on every exit, so that a failed install can be
# removed as well.
finish() {
    if [ -d "$DEST/lib/eudp" ]; then
        sort -u "$LIST" >"$MANIFEST"
        echo "f $MANIFEST_REL" >>"$MANIFEST"
    fi
    rm -rf "$LIST" "$STAGE"
}
trap finish EXIT
[ -d "$DEST" ] || mkdir -p "$DEST"
mkdirs lib/eudp

put 755 "$OUT/eudp" bin/eudp
put 644 "$OUT/libeudp_preload.so" lib/eudp/libeudp_preload.so
put 644 "$OUT/libeudp_capi.so" lib/libeudp.so
put 644 "$OUT/libeudp_capi.a" lib/libeudp.a
put 644 "$ROOT/crates/capi/include/eudp.h" include/eudp.h

# The static library also needs what Rust's std links against.
cat >"$STAGE/eudp.pc" <<EOF
prefix=$PREFIX
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: eudp
Description: User-space UDP offload engine, C interface
Version: $VERSION
Cflags: -I\${includedir}
Libs: -L\${libdir} -leudp
Libs.private: -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
EOF
put 644 "$STAGE/eudp.pc" lib/pkgconfig/eudp.pc

# Completions and man pages, when this eudp can write them.
for sh in bash zsh fish; do
    case "$sh" in
        bash) rel=share/bash-completion/completions/eudp ;;
        zsh) rel=share/zsh/site-functions/_eudp ;;
        fish) rel=share/fish/vendor_completions.d/eudp.fish ;;
    esac
    if "$OUT/eudp" completions "$sh" >"$STAGE/completion" 2>/dev/null && [ -s "$STAGE/completion" ]; then
        put 644 "$STAGE/completion" "$rel"
    fi
done
if "$OUT/eudp" man --out "$STAGE/man" >/dev/null 2>&1; then
    for page in "$STAGE"/man/*.[1-9]; do
        [ -f "$page" ] || continue
        name=$(basename "$page")
        put 644 "$page" "share/man/man${name##*.}/$name"
    done
fi

echo "install: eudp $VERSION installed under $DEST ($(grep -c '^f ' "$LIST") files)" >&2
