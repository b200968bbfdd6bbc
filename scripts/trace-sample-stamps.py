#!/usr/bin/env python3
"""Stamped kernel messages and error-queue system calls per datagram under
`--sample N`, for two eudp builds side by side (interleaved rounds).

Runs `eudp trace worker recv|send` on loopback (no testbed needed), the
sender under `strace -f -c`, and counts from the sender's raw dump the
kernel messages it numbered (KMsg events: one per stamped message), the TX
stamps read back and the sampled send calls. Counts, not timings: they do
not depend on the host's load (recorded anyway).

usage: trace-sample-stamps.py BEFORE_BIN AFTER_BIN OUT.json [--rounds R] [--count C] [--size S]
"""
import argparse, json, os, random, subprocess, tempfile, time

KMSG, TX_SCHED, TX_SOFT, SEND_CALL = 9, 10, 11, 1
SAMPLES = [1, 16, 64, 256, 1024]


def syscalls(path):
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit():
            out[f[-1]] = int(f[3])
    return out


def run(binary, sample, count, size, tmp):
    port = 20000 + random.randrange(20000)
    env = dict(os.environ, EUDP_TRACE_SAMPLE=str(sample))
    common = ["--size", str(size), "--count", str(count), "--addr", f"127.0.0.1:{port}"]
    rx = subprocess.Popen([binary, "trace", "worker", "recv", *common, "--out", f"{tmp}/rx.json"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    subprocess.run(["strace", "-f", "-c", "-o", f"{tmp}/strace.txt", binary, "trace", "worker", "send", *common,
                    "--out", f"{tmp}/tx.json"], env=env, check=True, stdout=subprocess.DEVNULL, timeout=120)
    rx.wait(timeout=60)
    ev = json.load(open(f"{tmp}/tx.json"))["events"]
    kinds = [e[1] for e in ev]
    c = syscalls(f"{tmp}/strace.txt")
    msgs = kinds.count(KMSG)
    errq = c.get("io_uring_enter", 0) + c.get("recvmmsg", 0)
    return {
        "sample": sample,
        "datagrams": count,
        "stamped_messages": msgs,
        "datagrams_per_stamped_message": round(sum(e[5] >> 48 for e in ev if e[1] == KMSG) / max(msgs, 1), 1),
        "tx_stamps_read": kinds.count(TX_SCHED) + kinds.count(TX_SOFT),
        "sampled_send_calls": kinds.count(SEND_CALL),
        "send_syscalls": c.get("sendmmsg", 0) + c.get("sendto", 0),
        "errqueue_syscalls": errq,
        "stamped_messages_per_1000_datagrams": round(1000 * msgs / count, 3),
        "errqueue_syscalls_per_1000_datagrams": round(1000 * errq / count, 3),
        "errqueue_syscalls_per_stamped_message": round(errq / max(msgs, 1), 3),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("out")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--count", type=int, default=100000)
    ap.add_argument("--size", type=int, default=64)
    a = ap.parse_args()
    load = [open("/proc/loadavg").read().strip()]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(a.rounds):
            for sample in SAMPLES:
                builds = [("before", a.before), ("after", a.after)]
                if r % 2:
                    builds.reverse()
                for name, binary in builds:
                    row = run(binary, sample, a.count, a.size, tmp)
                    rows.append({"build": name, "round": r, **row})
            load.append(open("/proc/loadavg").read().strip())
    summary = []
    for sample in SAMPLES:
        per = {}
        for name in ("before", "after"):
            xs = sorted(x["stamped_messages_per_1000_datagrams"] for x in rows if x["build"] == name and x["sample"] == sample)
            per[name] = xs[len(xs) // 2]
        summary.append({"sample": sample, "stamped_per_1000_before": per["before"], "stamped_per_1000_after": per["after"],
                        "after_over_before": round(per["after"] / per["before"], 4) if per["before"] else None})
    doc = {
        "what": "stamped kernel messages and error-queue system calls per datagram under --sample N, sender worker on loopback; sample 1 (full tracing) is the ceiling row; medians over interleaved rounds",
        "command": f"scripts/trace-sample-stamps.py BEFORE AFTER OUT --rounds {a.rounds} --count {a.count} --size {a.size}",
        "size": a.size,
        "loadavg": load,
        "summary": summary,
        "rows": rows,
    }
    json.dump(doc, open(a.out, "w"), indent=1)
    for s in summary:
        print(s)


if __name__ == "__main__":
    main()
