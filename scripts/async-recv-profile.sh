#!/bin/sh
# Where the asynchronous receiver's CPU goes, beside the recvmmsg loop's:
# one `eudp bench --async --parts recv` row under `perf record -e cpu-clock`
# (a software clock: this works in VMs without hardware counters), its
# kernel and user symbols grouped by job per receiving thread, written with
# the bench's own figures to bench/results/async-recv-profile-<time>.json.
#
#   scripts/async-recv-profile.sh [ROW] [SECS]    ROW: loopback-nogro (default),
#                                                 loopback-gro, testbed-veth-gro, testbed-veth-nogro
set -eu
row=${1:-loopback-nogro}
secs=${2:-3}
eudp=${EUDP:-target/release/eudp}
here=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
load_before=$(cat /proc/loadavg)
perf record -q -e cpu-clock -F 2000 -o "$tmp/perf.data" -- \
    "$eudp" bench --async --parts recv --recv-rows "$row" --secs "$secs" --out "$tmp" >/dev/null
perf report -i "$tmp/perf.data" --sort comm,dso,sym --stdio 2>/dev/null >"$tmp/report.txt"
out="bench/results/async-recv-profile-$(date +%s).json"
python3 "$here/async_recv_profile.py" "$tmp/report.txt" "$tmp"/async-*.json "$row" "$load_before" >"$out"
echo "wrote $out"
