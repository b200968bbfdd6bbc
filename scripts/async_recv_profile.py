"""Groups a perf report (--sort comm,dso,sym) of `eudp bench --async --parts recv`
by job per receiving thread (rx-async, rx-recvmmsg) and prints JSON.

Both receivers copy each payload once, with the same kernel functions, so
each thread's samples divided by its payload-copy samples are its CPU per
datagram in units of one payload copy: a yardstick that a loaded host's
preemptions and frequency changes scale alike for both threads.
Usage: async_recv_profile.py REPORT BENCH_JSON ROW LOADAVG_BEFORE
"""
import json
import re
import sys
from collections import Counter

# Checked in order; the first match names the job.
JOBS = [
    ("payload_copy", r"copy_to_iter|skb_datagram_iter|check_object_size|virt_addr_valid|check_stack|simple_copy"),
    ("io_uring", r"^(__)?io_|^xa_|^xas_|^tctx_|ctx_flush"),
    ("syscall_msghdr", r"recvmsg|recvmmsg|msghdr|iovec|move_addr|copy_from_user|put_user|copy_to_user|fdget|fget"),
    ("locks", r"spin|lock"),
    ("udp_skb_free", r"udp|skb|sk_|sock|free|slab|page|napi|kmem|pfn|rmem"),
    ("sched_timer_entry", r"schedule|task_switch|msr|hrtimer|timer|wake|idle|enqueue|dequeue|pick|update_|exit_to_user|syscall|entry"),
]
THREADS = ("rx-async", "rx-recvmmsg")


def job(kind, sym):
    if kind == ".":
        return "user"
    for name, pat in JOBS:
        if re.search(pat, sym):
            return name
    return "other"


def main():
    report, bench_json, row, load_before = sys.argv[1:5]
    shares = {t: Counter() for t in THREADS}
    for line in open(report):
        m = re.match(r"\s+([\d.]+)%\s+(\S+)\s+(\S+)\s+\[(.)\]\s+(.*)", line)
        if m and m[2] in THREADS:
            shares[m[2]][job(m[4], m[5].strip())] += float(m[1])
    units = {}
    for t, c in shares.items():
        total, copy = sum(c.values()), c["payload_copy"]
        units[t] = {k: v / copy for k, v in sorted(c.items(), key=lambda x: -x[1])} if copy else {}
        units[t]["total"] = total / copy if copy else None
    a, p = units["rx-async"].get("total"), units["rx-recvmmsg"].get("total")
    bench = json.load(open(bench_json))
    print(json.dumps({
        "bench": "async-recv-profile",
        "row": row,
        "loadavg_before": load_before.strip(),
        "loadavg_at_end": open("/proc/loadavg").read().strip(),
        "method": "perf record -e cpu-clock -F 2000 over eudp bench --async --parts recv --recv-rows ROW; "
                  "per thread, samples by job in units of that thread's payload-copy samples (= per datagram, one copy each)",
        "per_datagram_in_copy_units": units,
        "async_over_recvmmsg_copy_normalized": a / p if a and p else None,
        "sample_percent_of_run": {t: sum(c.values()) for t, c in shares.items()},
        "bench_receiver_rows": bench["receiver"],
    }, indent=2))


main()
