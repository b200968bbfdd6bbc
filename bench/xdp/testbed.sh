# Sourced by bench/xdp's scripts: a testbed of their own (two namespaces and
# a veth, docs/testbed.md), torn down with the server and TMP on exit.
# `xdp_testbed_up TAG` needs EUDP (an eudp binary) and sets NAME, NSA, NSB,
# IFA, IFB, MACB (the server side's MAC), TMP and SERVER_PID.

xdp_testbed_cleanup() {
    set +e
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill "$SERVER_PID" 2>/dev/null
        wait "$SERVER_PID" 2>/dev/null
    fi
    "$EUDP" testbed down "$NAME" >/dev/null 2>&1
    rm -rf "$TMP"
}

xdp_testbed_up() {
    NAME="$1$$"                 # testbed names are limited to 10 characters
    NAME=${NAME:0:10}
    NSA="eudp-$NAME-a"
    NSB="eudp-$NAME-b"
    TMP=$(mktemp -d "/tmp/xdp-$1.XXXXXX")
    SERVER_PID=""
    trap xdp_testbed_cleanup EXIT
    trap 'exit 130' INT TERM
    "$EUDP" testbed up "$NAME" >/dev/null
    IFA=$(xdp_ifname "$NSA")
    IFB=$(xdp_ifname "$NSB")
    MACB=$(ip -n "$NSB" -o link show "$IFB" | grep -o 'link/ether [0-9a-f:]*' | cut -d' ' -f2)
    echo "testbed $NAME: $NSA/$IFA (198.18.0.1) <-> $NSB/$IFB (198.18.0.2, $MACB)" >&2
}

xdp_ifname() { ip -n "$1" -o link | awk -F': ' '$2 != "lo" {print $2}' | cut -d@ -f1 | head -1; }
