/*
 * C client of the eudp_async part of eudp.h over loopback (127.0.0.1
 * only): buffers reused only after their completion (and scribbled on at
 * once), the copied flag, back-pressure, a per-datagram EMSGSIZE and the
 * completion fd, with each zero-copy engine (the io_uring one from a
 * registered region). Exits 0 and prints "ok" on success.
 */
#include "eudp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#ifdef EXPECTED_ASYNC_COMPLETION_SIZE
_Static_assert(sizeof(struct eudp_async_completion) == EXPECTED_ASYNC_COMPLETION_SIZE,
               "eudp_async_completion layout differs from the library");
#endif
#ifdef EXPECTED_ASYNC_MSG_SIZE
_Static_assert(sizeof(struct eudp_async_msg) == EXPECTED_ASYNC_MSG_SIZE,
               "eudp_async_msg layout differs from the library");
#endif

#define N 300
#define SLOTS 4
#define LEN 1200

static void fill(unsigned char *p, unsigned seq) {
    memset(p, (int)(seq % 251), LEN);
    memcpy(p, &seq, sizeof seq);
}

/* Reads every datagram waiting on rx, checking each against its number. */
static unsigned drain_rx(int rx, int wait_ms, unsigned *seen) {
    unsigned char buf[2048], want[LEN];
    unsigned got = 0;
    struct pollfd p = {.fd = rx, .events = POLLIN};
    while (poll(&p, 1, wait_ms) == 1) {
        ssize_t n = recv(rx, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0)
            break;
        CHECK(n == LEN);
        unsigned seq;
        memcpy(&seq, buf, sizeof seq);
        CHECK(seq < N);
        fill(want, seq);
        CHECK(memcmp(buf, want, LEN) == 0); /* the bytes of the send, not the scribble */
        seen[seq]++;
        got++;
    }
    return got;
}

/* The whole sequence with one engine (flags for eudp_async_config). */
static void run(uint32_t flags) {
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int rx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(rx >= 0);
    CHECK(bind(rx, (struct sockaddr *)&lo, sizeof lo) == 0);
    struct sockaddr_in peer;
    socklen_t plen = sizeof peer;
    CHECK(getsockname(rx, (struct sockaddr *)&peer, &plen) == 0);

    struct eudp_async_config cfg = {.max_in_flight = SLOTS, .flags = flags};
    eudp_async *s = eudp_async_open((struct sockaddr *)&lo, sizeof lo, (struct sockaddr *)&peer, plen, &cfg);
    if (s == NULL && errno == EOPNOTSUPP && (flags & EUDP_ASYNC_URING)) {
        printf("SKIPPED the io_uring engine: not in this kernel\n");
        close(rx);
        return;
    }
    CHECK(s != NULL);
    int zc = eudp_async_zerocopy(s);
    CHECK(zc == 0 || zc == 1);
    int engine = eudp_async_engine(s);

    /* Buffer reuse: SLOTS buffers carry N datagrams; a slot is refilled
     * only after its completion, and scribbled on the moment it returns.
     * With the io_uring engine the slots are one registered region. */
    static unsigned char slot[SLOTS][LEN];
    struct iovec region = {.iov_base = slot, .iov_len = sizeof slot};
    if (flags & EUDP_ASYNC_URING) {
        CHECK(engine == EUDP_ASYNC_ENGINE_URING);
        CHECK(eudp_async_register(s, &region, 1) == 0);
        errno = 0;
        CHECK(eudp_async_register(s, &region, 1) == -1 && errno == EBUSY);
    } else {
        CHECK(engine == (zc ? EUDP_ASYNC_ENGINE_MSG_ZEROCOPY : EUDP_ASYNC_ENGINE_COPY));
        errno = 0;
        CHECK(eudp_async_register(s, &region, 1) == -1 && errno == EOPNOTSUPP);
    }
    int busy[SLOTS] = {0};
    unsigned seen[N] = {0}, received = 0, completed = 0, copied = 0;
    unsigned seq = 0;
    while (completed < N) {
        for (int i = 0; i < SLOTS && seq < N; i++) {
            if (busy[i])
                continue;
            fill(slot[i], seq);
            struct eudp_async_msg m = {.buf = slot[i], .len = LEN, .token = seq};
            CHECK(eudp_async_send(s, &m, 1) == 1);
            busy[i] = 1;
            seq++;
        }
        if (seq < N || eudp_async_in_flight(s) > 0) {
            CHECK(eudp_async_wait(s, 5000) == 1);
        }
        struct eudp_async_completion c[SLOTS];
        ssize_t n = eudp_async_completions(s, c, SLOTS);
        CHECK(n >= 0);
        for (ssize_t k = 0; k < n; k++) {
            int i = (int)(((const unsigned char *)c[k].buf - &slot[0][0]) / LEN);
            CHECK(i >= 0 && i < SLOTS && busy[i]);
            CHECK(c[k].result == LEN);
            CHECK(c[k].token < N);
            if (c[k].flags & EUDP_ASYNC_COPIED)
                copied++;
            memset(slot[i], 0xEE, LEN);
            busy[i] = 0;
            completed++;
        }
        CHECK(eudp_async_in_flight(s) <= SLOTS);
        received += drain_rx(rx, 0, seen);
    }
    received += drain_rx(rx, 200, seen);
    CHECK(received == N);
    for (unsigned i = 0; i < N; i++)
        CHECK(seen[i] == 1);
    /* Loopback receivers copy the pages; the completions must say so. */
    CHECK(copied == N);

    /* Back-pressure: SLOTS datagrams held, the next is refused whole. */
    struct eudp_async_msg m[SLOTS + 1];
    for (int i = 0; i <= SLOTS; i++) {
        fill(slot[i % SLOTS], (unsigned)i);
        m[i] = (struct eudp_async_msg){.buf = slot[i % SLOTS], .len = LEN, .token = 1000 + (uint64_t)i};
    }
    CHECK(eudp_async_send(s, m, SLOTS) == SLOTS);
    errno = 0;
    CHECK(eudp_async_send(s, &m[SLOTS], 1) == -1 && errno == EAGAIN);

    /* The completion fd polls readable while completions wait. */
    struct pollfd p = {.fd = eudp_async_fd(s), .events = POLLIN};
    CHECK(p.fd >= 0);
    CHECK(poll(&p, 1, 5000) == 1);
    struct eudp_async_completion c[SLOTS];
    unsigned got = 0;
    while (got < SLOTS) {
        ssize_t n = eudp_async_completions(s, c, SLOTS);
        CHECK(n >= 0);
        got += (unsigned)n;
        if (got < SLOTS)
            CHECK(eudp_async_wait(s, 5000) == 1);
    }
    CHECK(poll(&p, 1, 0) == 0);
    drain_rx(rx, 100, seen);

    /* A datagram too long for UDP fails alone, in its own completion. */
    static unsigned char big[70000];
    struct eudp_async_msg three[3] = {
        {.buf = slot[0], .len = LEN, .token = 1},
        {.buf = big, .len = sizeof big, .token = 2},
        {.buf = slot[1], .len = LEN, .token = 3},
    };
    CHECK(eudp_async_send(s, three, 3) == 3);
    got = 0;
    while (got < 3) {
        CHECK(eudp_async_wait(s, 5000) == 1);
        ssize_t n = eudp_async_completions(s, c, SLOTS);
        CHECK(n >= 0);
        for (ssize_t k = 0; k < n; k++) {
            CHECK(c[k].result == (c[k].token == 2 ? -EMSGSIZE : LEN));
        }
        got += (unsigned)n;
    }

    CHECK(eudp_async_close(s) == 0);
    close(rx);
    printf("engine %d: zerocopy %d\n", engine, zc);
}

int main(void) {
    run(0);
    run(EUDP_ASYNC_URING);
    printf("ok\n");
    return 0;
}
