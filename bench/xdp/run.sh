#!/usr/bin/env bash
# AF_XDP vs kernel UDP ping-pong on an eudp veth testbed.
#
# Usage: bench/xdp/run.sh            (as root)
# Env:   R=3 (repetitions)  N=100000 (timed round trips per run)  PORT=9099
#        MODES="kernel eudp eudp-latency kernel-spin xdp xdp-skb"
#          xdp     = AF_XDP at both ends, XDP program attached native (driver) mode
#                    first, generic mode only if native fails
#          xdp-skb = AF_XDP at both ends, XDP program forced to generic (SKB) mode
#          eudp, eudp-latency = the `kernel` mode's program under `eudp run`
#                    (default and latency profiles): eudp's own data path
#          eudp-xdp, eudp-xdp-latency = the same under `eudp run --transport xdp`
#                    (eudp's AF_XDP transport; the C `xdp` mode is its floor)
# Output: bench/results/xdp-pingpong-<unix time>.json
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
R=${R:-3}
N=${N:-100000}
PORT=${PORT:-9099}
MODES=${MODES:-"kernel eudp eudp-latency kernel-spin xdp xdp-skb"}
BIN=bench/xdp/xdp_pingpong
EUDP=${EUDP:-./target/release/eudp}

[ "$(id -u)" = 0 ] || { echo "run.sh: needs root (CAP_BPF, CAP_NET_ADMIN, netns)" >&2; exit 1; }
gcc -O2 -Wall -o "$BIN" bench/xdp/xdp_pingpong.c
if [ ! -x "$EUDP" ]; then
    . scripts/env.sh
    cargo build --release
fi

EUDP_ABS=$(realpath "$EUDP")
LOAD_BEFORE=$(cat /proc/loadavg)
. bench/xdp/testbed.sh
xdp_testbed_up xp

SERVER_DURATION=$(( 60 + N / 1000 ))
CLIENT_TIMEOUT=$(( SERVER_DURATION + 30 ))
RUNS="$TMP/runs.jsonl"
: > "$RUNS"

run_one() {   # $1 = label, $2 = rep
    local label=$1 rep=$2 mode=$1 extra=() pre=()
    case "$label" in
        xdp) extra=(--xdp-mode auto) ;;
        xdp-skb) mode=xdp; extra=(--xdp-mode skb) ;;
        eudp) mode=kernel; pre=("$EUDP_ABS" run --) ;;
        eudp-latency) mode=kernel; pre=("$EUDP_ABS" run --profile latency --) ;;
        eudp-xdp) mode=kernel; pre=("$EUDP_ABS" run --transport xdp --) ;;
        eudp-xdp-latency) mode=kernel; pre=("$EUDP_ABS" run --transport xdp --profile latency --) ;;
    esac
    local serr="$TMP/server.err" sout="$TMP/server.out" cout="$TMP/client.out"
    : > "$serr"; : > "$sout"; : > "$cout"
    ip netns exec "$NSB" taskset -c 1 timeout "$((SERVER_DURATION + 10))" "${pre[@]}" "$BIN" server \
        --mode "$mode" --local-ip 198.18.0.2 --ifname "$IFB" --port "$PORT" \
        --duration "$SERVER_DURATION" "${extra[@]}" >"$sout" 2>"$serr" &
    SERVER_PID=$!
    for _ in $(seq 100); do
        grep -q READY "$serr" && break
        kill -0 "$SERVER_PID" 2>/dev/null || break
        sleep 0.05
    done
    if ! grep -q READY "$serr"; then
        echo "server failed to start ($label):" >&2; cat "$serr" >&2
        kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true
        SERVER_PID=""
        return 1
    fi
    ip netns exec "$NSA" taskset -c 0 timeout "$CLIENT_TIMEOUT" "${pre[@]}" "$BIN" client \
        --mode "$mode" --local-ip 198.18.0.1 --peer-ip 198.18.0.2 --ifname "$IFA" \
        --peer-mac "$MACB" --port "$PORT" -n "$N" "${extra[@]}" >"$cout" 2>"$TMP/client.err" || true
    wait "$SERVER_PID" 2>/dev/null || true
    SERVER_PID=""
    local c s
    c=$(grep '"role":"client"' "$cout" | tail -1)
    s=$(grep '"role":"server"' "$sout" | tail -1)
    [ -n "$c" ] || c='{"error":"client produced no result"}'
    [ -n "$s" ] || s='{"error":"server produced no result"}'
    printf '{"label":"%s","rep":%d,"client":%s,"server":%s}\n' "$label" "$rep" "$c" "$s" >> "$RUNS"
    echo "rep $rep $label: $c" >&2
    sleep 0.3   # let the kernel release the previous AF_XDP socket / XDP program
}

read -r -a MODE_ARR <<< "$MODES"
M=${#MODE_ARR[@]}
for rep in $(seq 1 "$R"); do
    for i in $(seq 0 $((M - 1))); do           # rotate the order every repetition
        run_one "${MODE_ARR[$(( (i + rep - 1) % M ))]}" "$rep" || true
    done
done

# nothing of ours may remain attached: check before tearing down
for ns in "$NSA" "$NSB"; do
    if ip -n "$ns" -d link | grep -q 'prog/xdp'; then
        echo "run.sh: WARNING: an XDP program is still attached in $ns" >&2
    fi
done

mkdir -p bench/results
OUT="bench/results/xdp-pingpong-$(date +%s).json"
python3 - "$RUNS" "$OUT" "$N" "$R" "$PORT" "$(uname -r)" "$MODES" "$LOAD_BEFORE" "$(cat /proc/loadavg)" <<'EOF'
import json, statistics, sys
runs_path, out, n, reps, port, kernel, modes, load_before, load_after = sys.argv[1:]
runs = [json.loads(l) for l in open(runs_path) if l.strip()]
labels = modes.split()
med = {}
for lab in labels:
    ok = [r["client"] for r in runs if r["label"] == lab and r["client"].get("completed", 0) > 0]
    if not ok:
        med[lab] = None
        continue
    m = {k: round(statistics.median(c[k] for c in ok), 3)
         for k in ("p50_us", "p90_us", "p99_us", "mean_us", "min_us")}
    m["runs"] = len(ok)
    m["lost_total"] = sum(c["lost"] for c in ok)
    m["mismatched_total"] = sum(c["mismatched"] for c in ok)
    m["xdp_attach"] = sorted({c["xdp_attach"] for c in ok})
    med[lab] = m
def ratio(a, b):
    if med.get(a) and med.get(b):
        return round(med[a]["p50_us"] / med[b]["p50_us"], 3)
    return None
ratios = {f"{lab}/kernel_p50": ratio(lab, "kernel") for lab in labels if lab != "kernel"}
# eudp's xdp transport against its floor, the C AF_XDP mode of the same run
ratios.update({f"{lab}/xdp_p50": ratio(lab, "xdp") for lab in labels if lab.startswith("eudp-xdp")})
def ratio99(a, b):
    if med.get(a) and med.get(b):
        return round(med[a]["p99_us"] / med[b]["p99_us"], 3)
    return None
ratios.update({f"{lab}/kernel_p99": ratio99(lab, "kernel") for lab in labels if lab.startswith("eudp")})
summary = {"experiment": "xdp-pingpong", "payload_bytes": 64, "n": int(n), "reps": int(reps),
           "port": int(port), "kernel": kernel, "cpus": {"client": 0, "server": 1},
           "loadavg_before": load_before, "loadavg_after": load_after,
           "medians": med, "ratios": ratios, "runs": runs}
json.dump(summary, open(out, "w"), indent=2)
print(json.dumps({"file": out, "medians": {k: (v and {x: v[x] for x in ("p50_us", "p90_us", "p99_us", "mean_us", "xdp_attach")}) for k, v in med.items()}, "ratios": ratios}, indent=2))
EOF
