#!/bin/sh
# Installs what eudp needs on Debian 12 when it is missing: build tools,
# the testbed's networking tools, real UDP peers and Spin. Rust comes from
# rustup if cargo is absent. Idempotent; does nothing when all is present.
set -eu

need=""
have() { command -v "$1" >/dev/null 2>&1; }
for pair in ip:iproute2 ethtool:ethtool ping:iputils-ping cc:gcc spin:spin \
            iperf3:iperf3 sockperf:sockperf socat:socat dig:bind9-dnsutils \
            python3:python3 curl:curl nstat:iproute2 iperf:iperf memcached:memcached \
            logger:bsdutils; do
    cmd=${pair%%:*}; pkg=${pair#*:}
    have "$cmd" || need="$need $pkg"
done
[ -x /usr/sbin/dnsmasq ] || need="$need dnsmasq-base"
[ -x /usr/sbin/unbound ] || need="$need unbound"
[ -x /usr/sbin/rsyslogd ] || need="$need rsyslog"

if [ -n "$need" ]; then
    echo "deps: installing$need" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null 2>&1 || true
    # shellcheck disable=SC2086
    apt-get install -y -q --no-install-recommends $need >/dev/null
fi

if ! have cargo; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
        :
    else
        echo "deps: installing Rust with rustup" >&2
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal >/dev/null
    fi
fi
