#!/usr/bin/env bash
# System calls per round trip of the ping-pong client under `eudp run`
# (strace -f -c over the client process and its threads: the program's and
# the engine's), for one or more eudp builds in the same invocation. Counts
# do not depend on the host's load the way timings do.
#
# Usage: bench/xdp/syscalls.sh LABEL=EUDP_BINARY [LABEL=EUDP_BINARY ...]   (as root)
# Env:   N=20000 (timed round trips; the client adds 1000 warm-up ones)
#        RUN_ARGS="--transport xdp --profile latency" (the `eudp run` options)
# Output: bench/results/xdp-syscalls-<unix time>.json
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
N=${N:-20000}
RUN_ARGS=${RUN_ARGS:-"--transport xdp --profile latency"}
WARMUP=1000
[ "$(id -u)" = 0 ] || { echo "syscalls.sh: needs root (netns, AF_XDP)" >&2; exit 1; }
[ $# -ge 1 ] || { echo "usage: $0 LABEL=EUDP_BINARY ..." >&2; exit 2; }
command -v strace >/dev/null || { echo "syscalls.sh: strace is not installed" >&2; exit 1; }

EUDP=${1#*=}
LOAD_BEFORE=$(cat /proc/loadavg)
. bench/xdp/testbed.sh
xdp_testbed_up xs
BIN="$TMP/xdp_pingpong"
gcc -O2 -Wall -o "$BIN" bench/xdp/xdp_pingpong.c
read -r -a ARGS <<< "$RUN_ARGS"

for spec in "$@"; do
    label=${spec%%=*}
    eudp=$(realpath "${spec#*=}")
    : > "$TMP/server.err"
    ip netns exec "$NSB" timeout 180 "$eudp" run "${ARGS[@]}" -- "$BIN" server --mode kernel \
        --local-ip 198.18.0.2 --ifname "$IFB" --port 9099 --duration 150 >/dev/null 2>"$TMP/server.err" &
    SERVER_PID=$!
    for _ in $(seq 100); do grep -q READY "$TMP/server.err" && break; sleep 0.05; done
    ip netns exec "$NSA" timeout 170 strace -f -c -o "$TMP/$label.strace" "$eudp" run "${ARGS[@]}" -- "$BIN" client \
        --mode kernel --local-ip 198.18.0.1 --peer-ip 198.18.0.2 --ifname "$IFA" --peer-mac "$MACB" \
        --port 9099 -n "$N" > "$TMP/$label.client" 2>/dev/null || true
    kill "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
    sleep 0.3
done

mkdir -p bench/results
OUT="bench/results/xdp-syscalls-$(date +%s).json"
python3 - "$TMP" "$OUT" "$N" "$WARMUP" "$RUN_ARGS" "$LOAD_BEFORE" "$(cat /proc/loadavg)" "$@" <<'EOF'
import json, sys
tmp, out, n, warmup, run_args, load_before, load_after, *specs = sys.argv[1:]
trips = int(n) + int(warmup)
rows = []
for spec in specs:
    label = spec.split("=", 1)[0]
    calls = {}
    for line in open(f"{tmp}/{label}.strace"):
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            calls[f[-1]] = int(f[3])
    client = {}
    for line in open(f"{tmp}/{label}.client"):
        if '"role":"client"' in line:
            client = json.loads(line)
    done = client.get("completed", 0)
    per = {k: round(v / trips, 4) for k, v in sorted(calls.items(), key=lambda kv: -kv[1]) if v / trips >= 0.001}
    rows.append({"label": label, "completed": done, "round_trips_traced": trips,
                 "syscalls_per_round_trip": per,
                 "total_per_round_trip": round(sum(calls.values()) / trips, 3),
                 "client_under_strace": {k: client.get(k) for k in ("p50_us", "p99_us", "wall_s")}})
json.dump({"experiment": "xdp-syscalls", "payload_bytes": 64, "eudp_run": run_args,
           "note": "strace -f -c of the ping-pong client (program and engine threads), counts divided by "
                   "the round trips made (timed and warm-up); timings under strace are not the program's",
           "loadavg_before": load_before, "loadavg_after": load_after, "rows": rows},
          open(out, "w"), indent=2)
print(out)
for r in rows:
    print(r["label"], r["total_per_round_trip"], r["syscalls_per_round_trip"])
EOF
