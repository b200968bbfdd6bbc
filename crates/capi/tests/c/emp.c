/*
 * C client of the EMP part of eudp.h over loopback (127.0.0.1 only): a
 * tagged ping-pong with an ignore mask, a 1 MiB message byte-exact, a
 * truncated and a cancelled receive, readiness of the completion fd with
 * poll(), a send to a dead peer that times out, counters and errors.
 * Exits 0 and prints "ok" on success.
 */
#include "eudp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#ifdef EXPECTED_EMP_COMPLETION_SIZE
_Static_assert(sizeof(struct eudp_emp_completion) == EXPECTED_EMP_COMPLETION_SIZE,
               "eudp_emp_completion layout differs from the library");
#endif
#ifdef EXPECTED_EMP_COUNTERS_SIZE
_Static_assert(sizeof(struct eudp_emp_counters) == EXPECTED_EMP_COUNTERS_SIZE,
               "eudp_emp_counters layout differs from the library");
#endif
#ifdef EXPECTED_EMP_CONFIG_SIZE
_Static_assert(sizeof(struct eudp_emp_config) == EXPECTED_EMP_CONFIG_SIZE,
               "eudp_emp_config layout differs from the library");
#endif

#define WAIT_MS 10000
#define PINGS 1000
#define BIG (1u << 20)
#define TAG_BASE 0xab000000ull
#define TAG_LOW 0xffffull

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static struct sockaddr_in loopback(unsigned short port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static eudp_emp *open_on_loopback(const struct eudp_emp_config *cfg) {
    struct sockaddr_in a = loopback(0);
    eudp_emp *ep = eudp_emp_open((struct sockaddr *)&a, sizeof a, cfg);
    CHECK(ep != NULL);
    return ep;
}

/* The peer id of `other` in `ep`'s address vector. */
static uint32_t insert(eudp_emp *ep, eudp_emp *other) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    CHECK(eudp_emp_local_addr(other, &ss, &len) == 0);
    CHECK(len == sizeof(struct sockaddr_in) && ss.ss_family == AF_INET);
    int64_t id = eudp_emp_av_insert(ep, (struct sockaddr *)&ss, len);
    CHECK(id >= 0 && id != EUDP_EMP_ANY_PEER);
    return (uint32_t)id;
}

static unsigned long sends_done;
/* Sends completed on the echoing endpoint. */
static eudp_emp *echoer;
static unsigned long echoes_done;

/* The next completion of `op`; send completions met on the way must be
 * successes and are counted. */
static struct eudp_emp_completion next_of(eudp_emp *ep, int op) {
    for (;;) {
        struct eudp_emp_completion c;
        CHECK(eudp_emp_cq_wait(ep, &c, WAIT_MS) == 1);
        if (c.op == op)
            return c;
        CHECK(c.op == EUDP_EMP_OP_SEND && c.status == 0 && c.buf == NULL);
        sends_done++;
        if (ep == echoer)
            echoes_done++;
    }
}

static void ping_pong(eudp_emp *a, eudp_emp *b, uint32_t b_at_a, uint32_t a_at_b) {
    unsigned char out[256], back[256], mid[256];
    /* Posted first but never matching: message tags differ in bit 32. */
    CHECK(eudp_emp_trecv(b, EUDP_EMP_ANY_PEER, TAG_BASE | (1ull << 32), TAG_LOW, mid, sizeof mid, 999) == 0);
    CHECK(eudp_emp_trecv(b, a_at_b, TAG_BASE, TAG_LOW, mid, sizeof mid, 1000) == 0);
    for (unsigned i = 0; i < PINGS; i++) {
        uint64_t tag = TAG_BASE | i;
        size_t n = 1 + i % sizeof out;
        fill(out, n, i);
        CHECK(eudp_emp_trecv(a, b_at_a, tag, 0, back, sizeof back, 5000 + i) == 0);
        CHECK(eudp_emp_tsend(a, b_at_a, tag, out, n, 7000 + i) == 0);

        struct eudp_emp_completion r = next_of(b, EUDP_EMP_OP_RECV);
        CHECK(r.status == 0 && r.context == 1000 + i && r.tag == tag && r.peer == a_at_b);
        CHECK(r.buf == mid && r.len == n && r.full_len == n && memcmp(mid, out, n) == 0);
        unsigned char echo[256];
        memcpy(echo, mid, n);
        if (i + 1 < PINGS)
            CHECK(eudp_emp_trecv(b, a_at_b, TAG_BASE, TAG_LOW, mid, sizeof mid, 1001 + i) == 0);
        CHECK(eudp_emp_tsend(b, a_at_b, r.tag, echo, n, 9000 + i) == 0);

        struct eudp_emp_completion e = next_of(a, EUDP_EMP_OP_RECV);
        CHECK(e.status == 0 && e.context == 5000 + i && e.tag == tag && e.peer == b_at_a);
        CHECK(e.buf == back && e.len == n && memcmp(back, out, n) == 0);
    }
    /* The receive that never matched: cancelled. */
    CHECK(eudp_emp_cancel(b, 999) == 0);
    struct eudp_emp_completion c = next_of(b, EUDP_EMP_OP_RECV);
    CHECK(c.status == ECANCELED && c.context == 999 && c.len == 0 && c.peer == EUDP_EMP_ANY_PEER);
    CHECK(c.buf == mid && c.flags == 0); /* the buffer comes back */
    errno = 0;
    CHECK(eudp_emp_cancel(b, 999) == -1 && errno == ENOENT);
}

static void big_and_truncated(eudp_emp *a, eudp_emp *b, uint32_t b_at_a, uint32_t a_at_b) {
    unsigned char *src = malloc(BIG), *dst = malloc(BIG);
    CHECK(src && dst);
    fill(src, BIG, 77);
    memset(dst, 0, BIG);
    CHECK(eudp_emp_trecv(b, a_at_b, 42, 0, dst, BIG, 1) == 0);
    CHECK(eudp_emp_tsend(a, b_at_a, 42, src, BIG, 2) == 0);
    memset(src + BIG / 2, 0, 16); /* the library copied it: reusing src is fine */
    struct eudp_emp_completion r = next_of(b, EUDP_EMP_OP_RECV);
    fill(src, BIG, 77);
    CHECK(r.status == 0 && r.len == BIG && r.full_len == BIG && r.flags == 0 && memcmp(src, dst, BIG) == 0);
    struct eudp_emp_completion s = next_of(a, EUDP_EMP_OP_SEND);
    CHECK(s.status == 0 && s.context == 2 && s.len == BIG && s.tag == 42 && s.peer == b_at_a);

    /* A message longer than the receive's capacity: the bytes past it are
     * not written, and the completion says truncated with the true length. */
    memset(dst, 0xAB, 2000);
    CHECK(eudp_emp_trecv(b, EUDP_EMP_ANY_PEER, 43, 0, dst, 1000, 3) == 0);
    CHECK(eudp_emp_tsend(a, b_at_a, 43, src, 3000, 4) == 0);
    r = next_of(b, EUDP_EMP_OP_RECV);
    CHECK(r.status == EMSGSIZE && r.flags == EUDP_EMP_TRUNCATED && r.buf == dst);
    CHECK(r.len == 1000 && r.full_len == 3000 && memcmp(src, dst, 1000) == 0);
    for (size_t i = 1000; i < 2000; i++)
        CHECK(dst[i] == 0xAB);

    /* The bytes land in the buffer as the frames arrive, before the
     * completion is read (the counters are published after the round that
     * placed them). */
    memset(dst, 0, 5000);
    CHECK(eudp_emp_trecv(b, a_at_b, 44, 0, dst, 5000, 5) == 0);
    struct eudp_emp_counters k0, k1;
    CHECK(eudp_emp_counters(b, a_at_b, &k0) == 0);
    CHECK(eudp_emp_tsend(a, b_at_a, 44, src, 5000, 6) == 0);
    next_of(a, EUDP_EMP_OP_SEND);
    for (int i = 0; i < 2000; i++) {
        CHECK(eudp_emp_counters(b, a_at_b, &k1) == 0);
        if (k1.messages_received > k0.messages_received)
            break;
        usleep(5000);
    }
    CHECK(k1.messages_received == k0.messages_received + 1 && memcmp(src, dst, 5000) == 0);
    r = next_of(b, EUDP_EMP_OP_RECV);
    CHECK(r.status == 0 && r.context == 5 && r.len == 5000 && r.buf == dst);
    free(src);
    free(dst);
}

/* The completion fd is readable exactly while completions are pending. */
static void cq_fd_with_poll(eudp_emp *a, eudp_emp *b, uint32_t b_at_a, uint32_t a_at_b) {
    struct eudp_emp_completion c[4];
    /* Every echo acknowledged: nothing more completes on b by itself. */
    while (echoes_done < PINGS) {
        CHECK(eudp_emp_cq_wait(b, c, WAIT_MS) == 1);
        CHECK(c[0].op == EUDP_EMP_OP_SEND && c[0].status == 0);
        echoes_done++;
    }
    CHECK(eudp_emp_cq_read(b, c, 4) == 0);
    struct pollfd p = {.fd = eudp_emp_cq_fd(b), .events = POLLIN};
    CHECK(p.fd >= 0);
    CHECK(poll(&p, 1, 0) == 0);
    unsigned char buf[64], msg[5] = "hello";
    CHECK(eudp_emp_trecv(b, a_at_b, 5, 0, buf, sizeof buf, 11) == 0);
    CHECK(eudp_emp_tsend(a, b_at_a, 5, msg, sizeof msg, 12) == 0);
    CHECK(poll(&p, 1, WAIT_MS) == 1 && (p.revents & POLLIN));
    CHECK(eudp_emp_cq_read(b, c, 4) == 1);
    CHECK(c[0].op == EUDP_EMP_OP_RECV && c[0].status == 0 && c[0].len == 5 && memcmp(buf, "hello", 5) == 0);
    p.revents = 0;
    CHECK(poll(&p, 1, 0) == 0);
    errno = 0;
    CHECK(eudp_emp_cq_wait(b, c, 0) == -1 && errno == EAGAIN);
}

/* A peer that never answers: the send completes with ETIMEDOUT after the
 * configured deadline. */
static void dead_peer(void) {
    struct eudp_emp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.deadline_ms = 300;
    cfg.rto_initial_us = 5000;
    cfg.rto_max_us = 50000;
    cfg.socket_buffer = 1u << 20;
    cfg.poll_spin_us = 20;
    eudp_emp *ep = open_on_loopback(&cfg);
    /* A port with nobody behind it: another endpoint's, closed. */
    eudp_emp *gone = open_on_loopback(NULL);
    uint32_t peer = insert(ep, gone);
    CHECK(eudp_emp_close(gone) == 0);

    unsigned char msg[100];
    fill(msg, sizeof msg, 3);
    double t0 = now_s();
    CHECK(eudp_emp_tsend(ep, peer, 1, msg, sizeof msg, 77) == 0);
    struct eudp_emp_completion c;
    CHECK(eudp_emp_cq_wait(ep, &c, WAIT_MS) == 1);
    double took = now_s() - t0;
    CHECK(c.op == EUDP_EMP_OP_SEND && c.status == ETIMEDOUT && c.context == 77 && c.peer == peer);
    CHECK(took < 5.0);
    struct eudp_emp_counters k;
    CHECK(eudp_emp_counters(ep, peer, &k) == 0);
    CHECK(k.messages_failed >= 1);
    CHECK(k.go_backs <= k.frames_sent);
    CHECK(k.held <= k.frames_received);
    CHECK(eudp_emp_close(ep) == 0);
}

static void errors(eudp_emp *a, uint32_t b_at_a) {
    unsigned char buf[8] = {0};
    errno = 0;
    CHECK(eudp_emp_open(NULL, 0, NULL) == NULL && errno == EINVAL);
    errno = 0;
    CHECK(eudp_emp_tsend(a, 12345, 1, buf, sizeof buf, 0) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(eudp_emp_tsend(a, b_at_a, 1, buf, (size_t)EUDP_EMP_MAX_MESSAGE + 1, 0) == -1 && errno == EMSGSIZE);
    errno = 0;
    CHECK(eudp_emp_trecv(a, EUDP_EMP_ANY_PEER, 1, 0, NULL, 8, 0) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(eudp_emp_trecv(a, 12345, 1, 0, buf, sizeof buf, 0) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(eudp_emp_av_remove(a, 12345) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(eudp_emp_cq_read(a, NULL, 1) == -1 && errno == EINVAL);
    errno = 0;
    CHECK(eudp_emp_counters(a, 12345, &(struct eudp_emp_counters){0}) == -1 && errno == ENOENT);
    errno = 0;
    CHECK(eudp_emp_close(NULL) == -1 && errno == EINVAL);
}

/* A dual-stack endpoint (bound to [::]) and an IPv4 one: a.b.c.d and
 * ::ffff:a.b.c.d name one peer on either, counted per insert, and a
 * message crosses each way. */
static void mapped_peers(void) {
    struct sockaddr_in6 any6;
    memset(&any6, 0, sizeof any6);
    any6.sin6_family = AF_INET6;
    any6.sin6_addr = in6addr_any;
    eudp_emp *six = eudp_emp_open((struct sockaddr *)&any6, sizeof any6, NULL);
    CHECK(six != NULL);
    eudp_emp *four = open_on_loopback(NULL);
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    CHECK(eudp_emp_local_addr(six, &ss, &len) == 0 && ss.ss_family == AF_INET6);
    unsigned short port6 = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    len = sizeof ss;
    CHECK(eudp_emp_local_addr(four, &ss, &len) == 0 && ss.ss_family == AF_INET);
    unsigned short port4 = ntohs(((struct sockaddr_in *)&ss)->sin_port);

    struct sockaddr_in four_v4 = loopback(port4);
    struct sockaddr_in6 six_mapped;
    memset(&six_mapped, 0, sizeof six_mapped);
    six_mapped.sin6_family = AF_INET6;
    six_mapped.sin6_port = htons(port6);
    CHECK(inet_pton(AF_INET6, "::ffff:127.0.0.1", &six_mapped.sin6_addr) == 1);
    int64_t at_six = eudp_emp_av_insert(six, (struct sockaddr *)&four_v4, sizeof four_v4);
    int64_t at_four = eudp_emp_av_insert(four, (struct sockaddr *)&six_mapped, sizeof six_mapped);
    CHECK(at_six >= 0 && at_four >= 0);

    unsigned char buf[32];
    struct eudp_emp_completion c;
    CHECK(eudp_emp_trecv(four, (uint32_t)at_four, 1, 0, buf, sizeof buf, 1) == 0);
    CHECK(eudp_emp_tsend(six, (uint32_t)at_six, 1, "six", 3, 2) == 0);
    CHECK(eudp_emp_cq_wait(four, &c, WAIT_MS) == 1);
    CHECK(c.op == EUDP_EMP_OP_RECV && c.status == 0 && c.peer == (uint32_t)at_four && c.len == 3);
    CHECK(memcmp(buf, "six", 3) == 0);
    CHECK(eudp_emp_trecv(six, (uint32_t)at_six, 2, 0, buf, sizeof buf, 3) == 0);
    CHECK(eudp_emp_tsend(four, (uint32_t)at_four, 2, "four", 4, 4) == 0);
    do
        CHECK(eudp_emp_cq_wait(six, &c, WAIT_MS) == 1);
    while (c.op != EUDP_EMP_OP_RECV);
    CHECK(c.status == 0 && c.peer == (uint32_t)at_six && c.len == 4 && memcmp(buf, "four", 4) == 0);

    /* The other forms are the same peers; each insert takes one remove. */
    struct sockaddr_in6 four_mapped = six_mapped;
    four_mapped.sin6_port = htons(port4);
    struct sockaddr_in six_v4 = loopback(port6);
    CHECK(eudp_emp_av_insert(six, (struct sockaddr *)&four_mapped, sizeof four_mapped) == at_six);
    CHECK(eudp_emp_av_insert(four, (struct sockaddr *)&six_v4, sizeof six_v4) == at_four);
    CHECK(eudp_emp_av_remove(six, (uint32_t)at_six) == 0);
    CHECK(eudp_emp_av_remove(six, (uint32_t)at_six) == 0);
    errno = 0;
    CHECK(eudp_emp_av_remove(six, (uint32_t)at_six) == -1 && errno == ENOENT);
    /* Plain IPv6 needs an IPv6 endpoint. */
    struct sockaddr_in6 v6only = six_mapped;
    v6only.sin6_addr = in6addr_loopback;
    errno = 0;
    CHECK(eudp_emp_av_insert(four, (struct sockaddr *)&v6only, sizeof v6only) == -1 && errno == EAFNOSUPPORT);
    CHECK(eudp_emp_close(six) == 0);
    CHECK(eudp_emp_close(four) == 0);
}

int main(void) {
    eudp_emp *a = open_on_loopback(NULL);
    struct eudp_emp_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.window = 64;
    cfg.ack_group = 8;
    eudp_emp *b = open_on_loopback(&cfg);
    uint32_t b_at_a = insert(a, b), a_at_b = insert(b, a);
    echoer = b;

    ping_pong(a, b, b_at_a, a_at_b);
    big_and_truncated(a, b, b_at_a, a_at_b);
    cq_fd_with_poll(a, b, b_at_a, a_at_b);

    struct eudp_emp_counters ka, kp, kb;
    /* The peer's first: counters grow while the engine runs, so the
     * endpoint's total read after it cannot be behind it. */
    CHECK(eudp_emp_counters(a, b_at_a, &kp) == 0);
    CHECK(eudp_emp_counters(a, EUDP_EMP_ANY_PEER, &ka) == 0);
    CHECK(eudp_emp_counters(b, EUDP_EMP_ANY_PEER, &kb) == 0);
    CHECK(ka.messages_sent >= PINGS && kp.messages_sent <= ka.messages_sent);
    CHECK(kb.messages_received >= PINGS && kb.truncated >= 1);
    CHECK(ka.frames_sent > 0 && ka.frames_received > 0 && kb.malformed == 0);
    CHECK(sends_done > 0);

    errors(a, b_at_a);
    dead_peer();
    mapped_peers();

    CHECK(eudp_emp_av_remove(a, b_at_a) == 0);
    unsigned char x = 1;
    errno = 0;
    CHECK(eudp_emp_tsend(a, b_at_a, 1, &x, 1, 0) == -1 && errno == ENOENT);
    CHECK(eudp_emp_close(a) == 0);
    CHECK(eudp_emp_close(b) == 0);
    printf("ok\n");
    return 0;
}
