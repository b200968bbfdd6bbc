/* Multicast fan-out for the testbed test and `eudp bench --mcast`.
 *
 *   mcastfan send 4|6 IFNAME PORT SIZE COUNT BURST GAP_US GROUP...
 *   mcastfan recv 4|6 IFNAME PORT IDLE_MS INDEX:GROUP...
 *
 * The sender sends COUNT datagrams of SIZE bytes to each group, in runs of
 * MCASTFAN_RUN (default 1) to one group before the next (so that a stack
 * can batch a run, GSO), pausing GAP_US after every BURST datagrams (BURST
 * 0: no pause), then an end marker (repeated) to each group, and prints one
 * JSON line.
 * Each datagram carries a magic, its group's index (the position in the
 * sender's list, from 1), its sequence number in that group, the send time
 * (CLOCK_MONOTONIC, which sender and receivers on one host share) and a
 * pattern derived from those.
 *
 * A receiver opens MCASTFAN_SOCKETS sockets (default 1) that share PORT
 * (SO_REUSEADDR, and SO_REUSEPORT unless MCASTFAN_NO_REUSEPORT is set), each
 * joining its groups with IP_MULTICAST_ALL off, prints "ready", receives
 * until every group's end marker came to every socket or nothing came for
 * IDLE_MS, and prints one JSON line per socket: per group what came, in
 * order or not, damaged or not, and the one-way latency's median and 99th
 * percentile. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "mcastfan: %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

#define MAGIC 0x4d43464eu /* data */
#define ENDMAGIC 0x4d43454eu /* end marker */
#define MAXG 16
#define HDR 24
#define BUCKET_NS 100
#define BUCKETS 200000 /* 20 ms in 100 ns steps; beyond: the last bucket */

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static unsigned char pattern(uint32_t g, uint64_t seq, size_t i) {
    return (unsigned char)(g * 31u + seq * 7u + i);
}

static void put32(unsigned char *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return v; }

struct dest {
    struct sockaddr_storage a;
    socklen_t len;
};

static struct dest group_addr(int v6, const char *g, int port) {
    struct dest d;
    memset(&d, 0, sizeof d);
    if (v6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&d.a;
        s->sin6_family = AF_INET6;
        s->sin6_port = htons(port);
        CHECK(inet_pton(AF_INET6, g, &s->sin6_addr) == 1);
        d.len = sizeof *s;
    } else {
        struct sockaddr_in *s = (struct sockaddr_in *)&d.a;
        s->sin_family = AF_INET;
        s->sin_port = htons(port);
        CHECK(inet_pton(AF_INET, g, &s->sin_addr) == 1);
        d.len = sizeof *s;
    }
    return d;
}

static int send_main(int v6, const char *ifname, int port, int argc, char **argv) {
    CHECK(argc >= 5);
    size_t size = strtoul(argv[0], NULL, 10);
    uint64_t count = strtoull(argv[1], NULL, 10);
    uint64_t burst = strtoull(argv[2], NULL, 10);
    long gap_us = strtol(argv[3], NULL, 10);
    int ng = argc - 4;
    CHECK(size >= HDR && size <= 65000 && ng <= MAXG);
    struct dest d[MAXG];
    for (int i = 0; i < ng; i++) d[i] = group_addr(v6, argv[4 + i], port);
    int ifindex = (int)if_nametoindex(ifname);
    CHECK(ifindex > 0);
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    int one = 1, zero = 0, sndbuf = 4 << 20;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (v6) {
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, &ifindex, sizeof ifindex) == 0);
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, &one, sizeof one) == 0);
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, &zero, sizeof zero) == 0);
    } else {
        struct ip_mreqn m = { .imr_ifindex = ifindex };
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &m, sizeof m) == 0);
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_TTL, &one, sizeof one) == 0);
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_LOOP, &zero, sizeof zero) == 0);
    }
    unsigned char *buf = malloc(size);
    CHECK(buf);
    const char *run_env = getenv("MCASTFAN_RUN");
    uint64_t run = run_env ? strtoull(run_env, NULL, 10) : 1;
    if (run < 1) run = 1;
    uint64_t sent = 0, failed = 0, t0 = now_ns();
    for (uint64_t base = 0; base < count; base += run) {
        for (int g = 0; g < ng; g++)
        for (uint64_t seq = base; seq < base + run && seq < count; seq++) {
            put32(buf, MAGIC);
            put32(buf + 4, (uint32_t)(g + 1));
            put64(buf + 8, seq);
            for (size_t i = HDR; i < size; i++) buf[i] = pattern(g + 1, seq, i);
            put64(buf + 16, now_ns());
            for (;;) {
                ssize_t r = sendto(fd, buf, size, 0, (struct sockaddr *)&d[g].a, d[g].len);
                if (r == (ssize_t)size) {
                    sent++;
                    break;
                }
                if (r < 0 && (errno == ENOBUFS || errno == EAGAIN || errno == EINTR)) continue;
                failed++;
                break;
            }
            if (burst && sent % burst == 0) usleep(gap_us);
        }
    }
    uint64_t t1 = now_ns();
    /* End markers: repeated, as any of them may be lost. */
    for (int k = 0; k < 5; k++) {
        for (int g = 0; g < ng; g++) {
            put32(buf, ENDMAGIC);
            put32(buf + 4, (uint32_t)(g + 1));
            put64(buf + 8, count);
            put64(buf + 16, now_ns());
            sendto(fd, buf, HDR, 0, (struct sockaddr *)&d[g].a, d[g].len);
        }
        usleep(20000);
    }
    printf("{\"sent\":%llu,\"send_errors\":%llu,\"secs\":%.6f}\n", (unsigned long long)sent,
           (unsigned long long)failed, (double)(t1 - t0) / 1e9);
    return 0;
}

struct gstat {
    uint32_t index;
    uint64_t received, out_of_order, corrupt, next, end_total;
    int joined, ended;
};

static uint64_t percentile(const uint32_t *h, uint64_t n, double p) {
    if (!n) return 0;
    uint64_t want = (uint64_t)((double)n * p), seen = 0;
    for (int i = 0; i < BUCKETS; i++) {
        seen += h[i];
        if (seen > want) return (uint64_t)i * BUCKET_NS + BUCKET_NS / 2;
    }
    return (uint64_t)BUCKETS * BUCKET_NS;
}

struct rsock {
    int fd, joined, ended;
    struct gstat gs[MAXG + 1];
    uint32_t *hist;
    uint64_t total, foreign, first, last;
};

static void open_member(struct rsock *m, int v6, int ifindex, int port, int argc, char **argv) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    int one = 1, zero = 0, rcvbuf = 16 << 20;
    CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    if (!getenv("MCASTFAN_NO_REUSEPORT")) CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0);
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof rcvbuf) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
    if (v6) {
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one) == 0);
        CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, &zero, sizeof zero) == 0);
        struct sockaddr_in6 b = { .sin6_family = AF_INET6, .sin6_port = htons(port), .sin6_addr = in6addr_any };
        CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    } else {
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_ALL, &zero, sizeof zero) == 0);
        struct sockaddr_in b = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY) };
        CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    }
    memset(m, 0, sizeof *m);
    m->fd = fd;
    for (int i = 1; i < argc; i++) {
        char *colon = strchr(argv[i], ':');
        CHECK(colon);
        int idx = atoi(argv[i]);
        CHECK(idx >= 1 && idx <= MAXG);
        const char *g = colon + 1;
        if (v6) {
            struct ipv6_mreq r = { .ipv6mr_interface = ifindex };
            CHECK(inet_pton(AF_INET6, g, &r.ipv6mr_multiaddr) == 1);
            CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &r, sizeof r) == 0);
        } else {
            struct ip_mreqn r = { .imr_ifindex = ifindex };
            CHECK(inet_pton(AF_INET, g, &r.imr_multiaddr) == 1);
            CHECK(setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &r, sizeof r) == 0);
        }
        m->gs[idx].joined = 1;
        m->gs[idx].index = (uint32_t)idx;
        m->joined++;
    }
    m->hist = calloc(BUCKETS, sizeof *m->hist);
    CHECK(m->hist);
}

/* One datagram received by `m` at time `t`. */
static void take(struct rsock *m, const unsigned char *buf, ssize_t r, uint64_t t) {
    if (r < HDR) {
        m->foreign++;
        return;
    }
    uint32_t magic = get32(buf), g = get32(buf + 4);
    uint64_t seq = get64(buf + 8), sent_at = get64(buf + 16);
    if (g < 1 || g > MAXG || !m->gs[g].joined || (magic != MAGIC && magic != ENDMAGIC)) {
        m->foreign++;
        return;
    }
    struct gstat *s = &m->gs[g];
    if (magic == ENDMAGIC) {
        if (!s->ended) {
            s->ended = 1;
            s->end_total = seq;
            m->ended++;
        }
        return;
    }
    if (!m->first) m->first = t;
    m->last = t;
    m->total++;
    s->received++;
    if (seq < s->next) s->out_of_order++;
    else s->next = seq + 1;
    for (ssize_t i = HDR; i < r; i++)
        if (buf[i] != pattern(g, seq, (size_t)i)) {
            s->corrupt++;
            break;
        }
    uint64_t lat = t > sent_at ? t - sent_at : 0;
    uint64_t b = lat / BUCKET_NS;
    m->hist[b < BUCKETS ? b : BUCKETS - 1]++;
}

static void report(const struct rsock *m) {
    double secs = m->last > m->first ? (double)(m->last - m->first) / 1e9 : 0;
    printf("{\"received\":%llu,\"foreign\":%llu,\"secs\":%.6f,\"pps\":%.1f,\"lat_p50_ns\":%llu,\"lat_p99_ns\":%llu,\"groups\":[",
           (unsigned long long)m->total, (unsigned long long)m->foreign, secs, secs > 0 ? (double)m->total / secs : 0,
           (unsigned long long)percentile(m->hist, m->total, 0.5), (unsigned long long)percentile(m->hist, m->total, 0.99));
    int k = 0;
    for (int g = 1; g <= MAXG; g++) {
        const struct gstat *s = &m->gs[g];
        if (!s->joined) continue;
        printf("%s{\"index\":%u,\"received\":%llu,\"out_of_order\":%llu,\"corrupt\":%llu,\"ended\":%s,\"end_total\":%llu}",
               k++ ? "," : "", s->index, (unsigned long long)s->received, (unsigned long long)s->out_of_order,
               (unsigned long long)s->corrupt, s->ended ? "true" : "false", (unsigned long long)s->end_total);
    }
    printf("]}\n");
}

#define MAXS 8

static int recv_main(int v6, const char *ifname, int port, int argc, char **argv) {
    CHECK(argc >= 2);
    long idle_ms = strtol(argv[0], NULL, 10);
    int ifindex = (int)if_nametoindex(ifname);
    CHECK(ifindex > 0);
    const char *ns_env = getenv("MCASTFAN_SOCKETS");
    int ns = ns_env ? atoi(ns_env) : 1;
    CHECK(ns >= 1 && ns <= MAXS);
    static struct rsock ms[MAXS];
    struct pollfd pf[MAXS];
    for (int i = 0; i < ns; i++) {
        open_member(&ms[i], v6, ifindex, port, argc, argv);
        pf[i].fd = ms[i].fd;
        pf[i].events = POLLIN;
    }
    /* A first receive puts each socket on the engine under the shim before
     * the sender starts. */
    unsigned char *buf = malloc(65536);
    CHECK(buf);
    for (int i = 0; i < ns; i++) (void)!recv(ms[i].fd, buf, 65536, MSG_DONTWAIT);
    printf("ready\n");
    fflush(stdout);
    uint64_t quiet_since = now_ns();
    for (;;) {
        int done = 1;
        for (int i = 0; i < ns; i++) done &= ms[i].ended >= ms[i].joined;
        if (done) break;
        int n = poll(pf, (nfds_t)ns, 50);
        CHECK(n >= 0 || errno == EINTR);
        uint64_t t = now_ns();
        if (n <= 0) {
            if (t - quiet_since > (uint64_t)idle_ms * 1000000u) break;
            continue;
        }
        for (int i = 0; i < ns; i++) {
            if (!(pf[i].revents & POLLIN)) continue;
            /* Up to a batch per wake-up and socket, so no socket starves. */
            for (int k = 0; k < 64; k++) {
                ssize_t r = recv(ms[i].fd, buf, 65536, MSG_DONTWAIT);
                if (r < 0) {
                    CHECK(errno == EAGAIN || errno == EINTR);
                    break;
                }
                t = now_ns();
                quiet_since = t;
                take(&ms[i], buf, r, t);
            }
        }
    }
    for (int i = 0; i < ns; i++) report(&ms[i]);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: mcastfan send|recv 4|6 IFNAME PORT ...\n");
        return 2;
    }
    int v6 = argv[2][0] == '6';
    int port = atoi(argv[4]);
    if (!strcmp(argv[1], "send")) return send_main(v6, argv[3], port, argc - 5, argv + 5);
    if (!strcmp(argv[1], "recv")) return recv_main(v6, argv[3], port, argc - 5, argv + 5);
    return 2;
}
