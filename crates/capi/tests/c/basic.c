/*
 * C client of eudp.h: byte-exact datagrams over loopback, batches, errors
 * via errno, and readiness through eudp_poll_fd() with poll() and epoll.
 * Exits 0 and prints "ok" on success. Loopback (127.0.0.1 / ::1) only.
 */
#include "eudp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>
#include <unistd.h>

#include "check.h"

#ifdef EXPECTED_STATS_SIZE
_Static_assert(sizeof(struct eudp_stats) == EXPECTED_STATS_SIZE, "eudp_stats layout differs from the library");
#endif
#ifdef EXPECTED_RXMSG_SIZE
_Static_assert(sizeof(struct eudp_rxmsg) == EXPECTED_RXMSG_SIZE, "eudp_rxmsg layout differs from the library");
#endif
#ifdef EXPECTED_TXMSG_SIZE
_Static_assert(sizeof(struct eudp_txmsg) == EXPECTED_TXMSG_SIZE, "eudp_txmsg layout differs from the library");
#endif

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)((i * 2654435761u + seed) >> 13);
}

/* An endpoint bound to addr:0 with 5 s timeouts; its address in *out. */
static eudp_endpoint *bound(int family, const char *addr, struct sockaddr_storage *out, socklen_t *outlen) {
    eudp_endpoint *ep = eudp_endpoint_new(family);
    CHECK(ep != NULL);
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    socklen_t len;
    if (family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        sin->sin_family = AF_INET;
        CHECK(inet_pton(AF_INET, addr, &sin->sin_addr) == 1);
        len = sizeof *sin;
    } else {
        struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
        sin6->sin6_family = AF_INET6;
        CHECK(inet_pton(AF_INET6, addr, &sin6->sin6_addr) == 1);
        len = sizeof *sin6;
    }
    CHECK(eudp_bind(ep, (struct sockaddr *)&ss, len) == 0);
    CHECK(eudp_set_timeouts(ep, 5000, 5000) == 0);
    *outlen = sizeof *out;
    CHECK(eudp_local_addr(ep, out, outlen) == 0);
    CHECK(*outlen == len);
    return ep;
}

static int readable(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, ms);
    CHECK(r >= 0);
    return r == 1 && (p.revents & POLLIN);
}

static void exchange(int family, const char *addr) {
    struct sockaddr_storage rxa, txa, src;
    socklen_t rxl, txl, srcl;
    eudp_endpoint *rx = bound(family, addr, &rxa, &rxl);
    eudp_endpoint *tx = bound(family, addr, &txa, &txl);
    int fd = eudp_poll_fd(rx);
    CHECK(fd >= 0);
    CHECK(!readable(fd, 20));
    /* Room for the whole burst, so the kernel drops nothing. */
    CHECK(eudp_set_recv_buffer_size(rx, 4 << 20) == 0);

    /* Single sends of many sizes, then a batch. */
    enum { SINGLE = 40, BATCH = 24, TOTAL = SINGLE + BATCH };
    static unsigned char data[TOTAL][2000];
    size_t lens[TOTAL];
    for (int i = 0; i < TOTAL; i++) {
        lens[i] = (size_t)(i * 53) % 2000;
        fill(data[i], lens[i], (unsigned)i);
    }
    for (int i = 0; i < SINGLE; i++)
        CHECK(eudp_sendto(tx, data[i], lens[i], (struct sockaddr *)&rxa, rxl) == (ssize_t)lens[i]);
    struct eudp_txmsg tm[BATCH];
    for (int i = 0; i < BATCH; i++) {
        tm[i].buf = data[SINGLE + i];
        tm[i].len = lens[SINGLE + i];
        tm[i].addr = (struct sockaddr *)&rxa;
        tm[i].addrlen = rxl;
    }
    for (size_t done = 0; done < BATCH;) {
        ssize_t k = eudp_send_batch(tx, tm + done, BATCH - done);
        CHECK(k > 0);
        done += (size_t)k;
    }
    CHECK(eudp_flush(tx, 5000) == 0);

    /* Readiness, then byte-exact receipt in order from the right sender. */
    CHECK(readable(fd, 5000));
    unsigned char buf[4096];
    for (int i = 0; i < SINGLE; i++) {
        srcl = sizeof src;
        ssize_t n = eudp_recvfrom(rx, buf, sizeof buf, 0, (struct sockaddr *)&src, &srcl);
        CHECK(n == (ssize_t)lens[i]);
        CHECK(memcmp(buf, data[i], lens[i]) == 0);
        CHECK(srcl == txl && memcmp(&src, &txa, txl) == 0);
    }
    struct eudp_rxmsg rm[BATCH];
    static unsigned char rbuf[BATCH][2000];
    int got = 0;
    while (got < BATCH) {
        for (int i = 0; i < BATCH; i++) {
            rm[i].buf = rbuf[i];
            rm[i].cap = sizeof rbuf[i];
        }
        ssize_t k = eudp_recv_batch(rx, rm, (size_t)(BATCH - got), 0);
        CHECK(k > 0);
        for (ssize_t j = 0; j < k; j++, got++) {
            CHECK(rm[j].len == lens[SINGLE + got] && rm[j].full_len == rm[j].len && rm[j].flags == 0);
            CHECK(memcmp(rbuf[j], data[SINGLE + got], rm[j].len) == 0);
            CHECK(rm[j].addrlen == txl && memcmp(&rm[j].addr, &txa, txl) == 0);
        }
    }
    CHECK(!readable(fd, 20));

    /* Truncation: MSG_TRUNC-style full length, and the out flag. */
    CHECK(eudp_sendto(tx, data[10], lens[10], (struct sockaddr *)&rxa, rxl) == (ssize_t)lens[10]);
    CHECK(eudp_sendto(tx, data[10], lens[10], (struct sockaddr *)&rxa, rxl) == (ssize_t)lens[10]);
    CHECK(eudp_recv(rx, buf, 7, EUDP_MSG_PEEK | EUDP_MSG_TRUNC) == (ssize_t)lens[10]);
    CHECK(eudp_recv(rx, buf, 7, 0) == 7 && memcmp(buf, data[10], 7) == 0);
    struct eudp_rxmsg one = {.buf = buf, .cap = 7};
    CHECK(eudp_recvmsg(rx, &one, 0) == 7);
    CHECK(one.flags == EUDP_MSG_TRUNC && one.full_len == lens[10]);

    /* Oversize datagrams fail like the kernel's. */
    size_t max = family == AF_INET ? 65507 : 65527;
    unsigned char *big = calloc(1, max + 1);
    CHECK(big != NULL);
    errno = 0;
    CHECK(eudp_sendto(tx, big, max + 1, (struct sockaddr *)&rxa, rxl) == -1);
    CHECK(errno == EMSGSIZE);
    CHECK(eudp_sendto(tx, big, max, (struct sockaddr *)&rxa, rxl) == (ssize_t)max);
    CHECK(eudp_recv(rx, big, max + 1, 0) == (ssize_t)max);
    free(big);

    /* Nothing left; nonblocking receive says so. */
    CHECK(eudp_recv(rx, buf, sizeof buf, EUDP_MSG_DONTWAIT) == -1 && errno == EAGAIN);

    /* Counters are final once everything accepted reached the kernel. */
    CHECK(eudp_flush(tx, 5000) == 0);
    struct eudp_stats st;
    CHECK(eudp_stats(tx, &st) == 0);
    CHECK(st.datagrams_sent == TOTAL + 3);
    CHECK(st.drop_send_error == 0);
    CHECK(eudp_stats(rx, &st) == 0);
    CHECK(st.datagrams_received == TOTAL + 3);
    CHECK(st.drop_ring_full == 0);
    CHECK(eudp_close(tx) == 0);
    CHECK(eudp_close(rx) == 0);
}

/* epoll, edge-triggered, on the poll fd. */
static void with_epoll(void) {
    struct sockaddr_storage rxa, txa;
    socklen_t rxl, txl;
    eudp_endpoint *rx = bound(AF_INET, "127.0.0.1", &rxa, &rxl);
    eudp_endpoint *tx = bound(AF_INET, "127.0.0.1", &txa, &txl);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = {.events = EPOLLIN | EPOLLET, .data.u64 = 7};
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, eudp_poll_fd(rx), &ev) == 0);
    struct epoll_event out;
    CHECK(epoll_wait(ep, &out, 1, 20) == 0);
    CHECK(eudp_set_nonblocking(rx, 1) == 0);
    for (int round = 0; round < 3; round++) {
        CHECK(eudp_sendto(tx, "epoll", 5, (struct sockaddr *)&rxa, rxl) == 5);
        CHECK(epoll_wait(ep, &out, 1, 5000) == 1 && out.data.u64 == 7);
        char b[16];
        int n = 0;
        while (eudp_recv(rx, b, sizeof b, 0) == 5)
            n++;
        CHECK(errno == EAGAIN);
        CHECK(n >= 1);
        if (n == 1)
            continue;
        round = 3; /* several arrived together: fine, stop */
    }
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, eudp_poll_fd(rx), NULL) == 0);
    close(ep);
    CHECK(eudp_close(tx) == 0);
    CHECK(eudp_close(rx) == 0);
}

/* A connected endpoint sending to a closed port sees ECONNREFUSED. */
static void refused(void) {
    struct sockaddr_storage gone, mine;
    socklen_t gonel, minel;
    eudp_endpoint *tmp = bound(AF_INET, "127.0.0.1", &gone, &gonel);
    CHECK(eudp_close(tmp) == 0);
    eudp_endpoint *ep = bound(AF_INET, "127.0.0.1", &mine, &minel);
    CHECK(eudp_connect(ep, (struct sockaddr *)&gone, gonel) == 0);
    CHECK(eudp_send(ep, "x", 1) == 1);
    char b[4];
    for (int i = 0; i < 1000; i++) {
        if (eudp_recv(ep, b, sizeof b, EUDP_MSG_DONTWAIT) == -1 && errno == ECONNREFUSED)
            break;
        CHECK(errno == EAGAIN);
        CHECK(i < 999);
        usleep(5000);
    }
    CHECK(eudp_close(ep) == 0);
}

int main(void) {
    /* Argument errors. */
    errno = 0;
    CHECK(eudp_endpoint_new(AF_UNIX) == NULL && errno == EAFNOSUPPORT);
    CHECK(eudp_send(NULL, "x", 1) == -1 && errno == EINVAL);
    CHECK(eudp_close(NULL) == -1 && errno == EINVAL);
    eudp_endpoint *ep = eudp_endpoint_new(AF_INET);
    CHECK(ep != NULL);
    CHECK(eudp_send(ep, "x", 1) == -1 && errno == EDESTADDRREQ);
    CHECK(eudp_close(ep) == 0);

    exchange(AF_INET, "127.0.0.1");
    exchange(AF_INET6, "::1");
    with_epoll();
    refused();
    puts("ok");
    return 0;
}
