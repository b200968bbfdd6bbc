"""The DNS workload's client in `eudp bench --soak`: queries SERVER:PORT for
NAME every EVERY_MS for SECS seconds (or until SIGTERM), one query at a
time, each waiting at most WAIT_MS for its answer, then prints one JSON
line: queries sent, answered (an answer with the query's id and at least
one record), unanswered, late (answers read after their query was given
up: a datagram received all the same), the longest time between two answers, and
every gap between answers over 100 ms as [start, end] seconds after its
start (the 500 longest, so the longest is always listed).

    python3 dnsloop.py SERVER PORT NAME SECS EVERY_MS WAIT_MS
"""
import json
import signal
import socket
import struct
import sys
import time

server, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
secs, every, wait = float(sys.argv[4]), float(sys.argv[5]) / 1000, float(sys.argv[6]) / 1000
stop = False
MAX_GAPS = 500


def on_stop(*_):
    global stop
    stop = True


signal.signal(signal.SIGTERM, on_stop)
signal.signal(signal.SIGINT, on_stop)

qname = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
sent = answered = unanswered = late = 0
t0 = time.monotonic()
last = t0
longest = 0.0
gaps = []
qid = 0


def note_gap(a, b):
    # Keeps the MAX_GAPS longest: once full, a longer gap replaces the shortest.
    if b - a <= 0.1:
        return
    if len(gaps) == MAX_GAPS:
        shortest = min(range(len(gaps)), key=lambda i: gaps[i][1] - gaps[i][0])
        if gaps[shortest][1] - gaps[shortest][0] >= b - a:
            return
        del gaps[shortest]
    gaps.append([round(a - t0, 3), round(b - t0, 3)])


while not stop and time.monotonic() - t0 < secs:
    qid = (qid + 1) & 0xFFFF
    query = struct.pack("!HHHHHH", qid, 0x0100, 1, 0, 0, 0) + qname + struct.pack("!HH", 1, 1)
    qstart = time.monotonic()
    try:
        sock.sendto(query, (server, port))
        sent += 1
    except OSError:
        time.sleep(every)
        continue
    deadline = time.monotonic() + wait
    ok = False
    while not ok and not stop:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        sock.settimeout(left)
        try:
            data = sock.recv(2048)
        except (socket.timeout, InterruptedError):
            continue
        except OSError:
            break
        # An answer to this query (a late one to an earlier query is skipped).
        if len(data) >= 12:
            rid, _flags, _qd, an = struct.unpack("!HHHH", data[:8])
            ok = rid == qid and an > 0
            late += rid != qid
    if ok:
        answered += 1
        now = time.monotonic()
        longest = max(longest, now - last)
        note_gap(last, now)
        last = now
    else:
        unanswered += 1
    pause = every - (time.monotonic() - qstart)
    if pause > 0 and not stop:
        time.sleep(pause)
end = time.monotonic()
longest = max(longest, end - last)
note_gap(last, end)
print(json.dumps({"sent": sent, "answered": answered, "unanswered": unanswered, "late": late,
                  "longest_gap_ms": round(longest * 1000, 1), "gaps": gaps, "secs": round(end - t0, 3)}), flush=True)
