#!/usr/bin/env python3
"""Writes the fuzz targets' seed corpora: well-formed frames and headers
and the near misses around them, so that fuzzing starts past the easy
rejections. Run from the fuzz directory; the outputs are committed."""
import os
import struct


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return (~s) & 0xFFFF


def udp4_frame(payload, tos=0, ttl=64, ihl=5, frag=0x4000, proto=17, ucsum=True):
    src, dst = bytes([198, 18, 0, 1]), bytes([198, 18, 0, 2])
    ulen = 8 + len(payload)
    pseudo = src + dst + struct.pack("!BBH", 0, 17, ulen)
    udp = struct.pack("!HHHH", 40000, 5001, ulen, 0) + payload
    c = csum(pseudo + udp) if ucsum else 0
    if ucsum and c == 0:
        c = 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    opts = b"\x01" * ((ihl - 5) * 4)
    total = ihl * 4 + len(udp)
    ip = struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, tos, total, 7, frag, ttl, proto, 0, src, dst) + opts
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    eth = bytes.fromhex("0200000000020200000000010800")
    return eth + ip + udp


def write(target, name, data):
    d = os.path.join("corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


frames = {
    "empty-payload": udp4_frame(b""),
    "64B": udp4_frame(bytes(range(64))),
    "1472B": udp4_frame(bytes(i & 0xFF for i in range(1472))),
    "no-udp-checksum": udp4_frame(b"hello", ucsum=False),
    "ip-options": udp4_frame(b"opts", ihl=6),
    "fragment": udp4_frame(b"frag", frag=0x2000),
    "not-udp": udp4_frame(b"tcp?", proto=6),
    "padded": udp4_frame(b"x") + bytes(20),
    "truncated": udp4_frame(b"abcdef")[:30],
    "arp": bytes.fromhex("ffffffffffff0200000000010806") + bytes(28),
}
for name, f in frames.items():
    write("wire_frame", name, f)
    write("wire_headers", name, f[14:])
write("wire_headers", "udp-header", struct.pack("!HHHH", 1, 2, 8, 0))
write("checksum_fused", "odd", bytes([3]) + bytes(range(255)))
write("checksum_fused", "zeros", bytes([0]) + bytes(64))
write("checksum_fused", "ones", bytes([200]) + b"\xff" * 1500)

# UDP-over-TCP streams; the first byte is the read size the target cuts at.
def hello(lane, version=2):
    return b"EUT1" + bytes([version, lane, 0, 0])


def frame(src, dst, payload):
    return struct.pack("!HHH", src, dst, len(payload)) + payload


def run(src, dst, seg, payloads):
    return struct.pack("!HHHHH", src, dst, 0xFFFF, len(payloads), seg) + b"".join(payloads)


write("uot_stream", "frames", bytes([7]) + hello(0) + frame(1000, 2000, b"a" * 100) + frame(1000, 2000, b""))
write("uot_stream", "run", bytes([13]) + hello(1) + run(1, 2, 64, [b"r" * 64, b"s" * 64, b"t" * 10]))
write("uot_stream", "v1-frames", bytes([3]) + hello(0, 1) + frame(5, 6, b"old"))
write("uot_stream", "oversized", bytes([1]) + hello(0) + struct.pack("!HHH", 1, 2, 0xFFF0))
write("uot_stream", "port-zero", bytes([2]) + hello(0) + frame(1, 0, b"zero"))
write("uot_stream", "not-ours", bytes([5]) + b"GET / HTTP/1.1\r\n\r\n")
# Ring capacity (2 bytes, x4), read buffer (x8), then [segment-1, length, bytes] messages.
write("gro_split", "two-messages", bytes([0, 4, 8]) + bytes([63, 200]) + bytes(200) + bytes([0, 5]) + b"hello")
write("gro_split", "tight-ring", bytes([40, 0, 2]) + bytes([9, 100]) + bytes(100) + bytes([9, 100]) + bytes(100))
for name, text in [("good", "EUDP_L2_DEPTH=4"), ("bad-int", "EUDP_L2_DEPTH=abc"), ("typo", "EUDP_SPIN_UZ=3"),
                   ("transport", "EUDP_TRANSPORT=xpd"), ("flag", "EUDP_GSO=0"), ("empty", "EUDP_CPU=")]:
    write("settings", name, text.encode())
# Profile files for `eudp run --profile-file`: good ones and the mistakes the parser names.
for name, text in [
    ("inherit", '[profiles.dns]\ninherit = "latency"\nEUDP_SPIN_US = 20\nEUDP_GSO = false\n'),
    ("chain", '[profiles.a]\nEUDP_CPU = "1"\n[profiles.b]\ninherit = "a"\nEUDP_RX_HANDOFF_US = "500"\n'),
    ("quoted", '[profiles."a \\"q\\" \\u0007"]\nEUDP_TRANSPORT = "tcp"\n'),
    ("inline", 'profiles = { x = { EUDP_GRO = true, EUDP_MAX_MSGS = 64 } }\n'),
    ("dotted", '[profiles]\nx.EUDP_L2_DEPTH = 4\ny.inherit = "x"\n'),
    ("loop", '[profiles.a]\ninherit = "b"\n[profiles.b]\ninherit = "a"\n'),
    ("typo", '[profiles.a]\nspin_us = 3\n'),
    ("float", '[profiles.a]\nEUDP_SPIN_US = 1.5\n'),
    ("bad-value", '[profiles.a]\nEUDP_XDP_MODE = "native"\n'),
    ("built-in", '[profiles.latency]\nEUDP_SPIN_US = 1\n'),
    ("unclosed", '[profiles.a\nEUDP_SPIN_US = 1\n'),
]:
    write("profile_file", name, text.encode())


# EMP frames: a middle DATA frame, a whole small message, ACK, NAK, and near misses.
def emp_common(kind, flags, epoch, seq):
    return b"EM" + bytes([1, kind, flags, 0, 0, 0]) + struct.pack("!II", epoch, seq)


def emp_data(epoch, seq, tag, msg_len, offset, payload):
    flags = (1 if offset == 0 else 0) | (2 if offset + len(payload) == msg_len else 0)
    return emp_common(1, flags, epoch, seq) + struct.pack("!QII", tag, msg_len, offset) + payload


write("wire_emp", "data-middle", emp_data(7, 3, 42, 4000, 1440, b"m" * 1440))
write("wire_emp", "data-whole", emp_data(7, 0, 1, 10, 0, b"0123456789"))
write("wire_emp", "data-empty", emp_data(7, 0, 1, 0, 0, b""))
write("wire_emp", "ack", emp_common(2, 0, 7, 0) + struct.pack("!II", 5, 256))
write("wire_emp", "nak", emp_common(3, 0, 7, 0) + struct.pack("!II", 4, 256))
write("wire_emp", "beyond", emp_data(7, 0, 1, 10, 0, b"0123456789")[:-1] + b"9x")
write("wire_emp", "too-long", emp_common(1, 1, 7, 0) + struct.pack("!QII", 1, (16 << 20) + 1, 0) + b"x")
