/*
 * C client of the eudp_async_recv part of eudp.h over loopback (127.0.0.1
 * only): datagrams lent in place with their source, buffers given back and
 * reused, a GRO run with its segment size, a dry ring that refills on
 * release, and the pollable fd. Exits 0 and prints "ok" on success.
 */
#include "eudp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/udp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

#ifdef EXPECTED_ASYNC_RX_DATAGRAM_SIZE
_Static_assert(sizeof(struct eudp_async_rx_datagram) == EXPECTED_ASYNC_RX_DATAGRAM_SIZE,
               "eudp_async_rx_datagram layout differs from the library");
#endif

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif

static void fill(unsigned char *p, unsigned seq, size_t len) {
    memset(p, (int)(seq % 251), len);
    memcpy(p, &seq, sizeof seq);
}

/* Checks one datagram against its number; returns the number. */
static unsigned check_datagram(const unsigned char *p, size_t len, size_t want_len) {
    unsigned char want[2048];
    unsigned seq;
    CHECK(len == want_len && len <= sizeof want);
    memcpy(&seq, p, sizeof seq);
    fill(want, seq, len);
    CHECK(memcmp(p, want, len) == 0);
    return seq;
}

/* Takes `want` datagrams of `len` bytes, releasing every buffer; fails
 * after a bounded number of empty waits. */
static void take(eudp_async_rx *r, unsigned want, size_t len, unsigned first, uint16_t src_port) {
    unsigned got = 0;
    for (int tries = 0; got < want && tries < 100; tries++) {
        struct pollfd p = {.fd = eudp_async_recv_fd(r), .events = POLLIN};
        poll(&p, 1, 50);
        struct eudp_async_rx_datagram d[8];
        ssize_t n = eudp_async_recv_next(r, d, 8, 0);
        CHECK(n >= 0);
        for (ssize_t k = 0; k < n; k++) {
            const struct sockaddr_in *src = (const struct sockaddr_in *)&d[k].src;
            CHECK(d[k].srclen == sizeof *src && src->sin_family == AF_INET && ntohs(src->sin_port) == src_port);
            CHECK(d[k].flags == 0);
            size_t seg = d[k].segment ? d[k].segment : d[k].len;
            for (size_t off = 0; off < d[k].len; off += seg) {
                size_t l = d[k].len - off < seg ? d[k].len - off : seg;
                CHECK(check_datagram((const unsigned char *)d[k].data + off, l, len) == first + got);
                got++;
            }
            CHECK(eudp_async_recv_release(r, d[k].lease) == 0);
        }
    }
    CHECK(got == want);
}

int main(void) {
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int tx = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(tx >= 0);
    CHECK(bind(tx, (struct sockaddr *)&lo, sizeof lo) == 0);
    struct sockaddr_in me;
    socklen_t mlen = sizeof me;
    CHECK(getsockname(tx, (struct sockaddr *)&me, &mlen) == 0);
    uint16_t tx_port = ntohs(me.sin_port);

    /* Four buffers carry forty datagrams, in rounds the ring can hold. */
    struct eudp_async_rx_config cfg = {.buffers = 4, .buffer_size = 4096, .flags = EUDP_ASYNC_RX_NO_GRO};
    eudp_async_rx *r = eudp_async_recv_open((struct sockaddr *)&lo, sizeof lo, &cfg);
    if (r == NULL && (errno == ENOSYS || errno == EINVAL || errno == EOPNOTSUPP)) {
        printf("SKIPPED: no io_uring provided-buffer receive here (errno %d)\nok\n", errno);
        return 0;
    }
    CHECK(r != NULL);
    struct sockaddr_storage at;
    socklen_t alen = sizeof at;
    CHECK(eudp_async_recv_local_addr(r, &at, &alen) == 0 && alen == sizeof(struct sockaddr_in));
    unsigned char buf[2048];
    for (unsigned round = 0; round < 10; round++) {
        for (unsigned i = 0; i < 4; i++) {
            fill(buf, round * 4 + i, 1000);
            CHECK(sendto(tx, buf, 1000, 0, (struct sockaddr *)&at, alen) == 1000);
        }
        take(r, 4, 1000, round * 4, tx_port);
    }
    errno = 0;
    CHECK(eudp_async_recv_release(r, 999999) == -1 && errno == ENOENT);

    /* A dry ring: every buffer held, later datagrams wait in the socket
     * and arrive once a buffer comes back. */
    struct eudp_async_rx_datagram held[4];
    unsigned nheld = 0;
    for (unsigned i = 0; i < 6; i++) {
        fill(buf, 100 + i, 1000);
        CHECK(sendto(tx, buf, 1000, 0, (struct sockaddr *)&at, alen) == 1000);
    }
    for (int tries = 0; nheld < 4 && tries < 100; tries++) {
        ssize_t n = eudp_async_recv_next(r, held + nheld, 4 - nheld, 50);
        CHECK(n >= 0);
        nheld += (unsigned)n;
    }
    CHECK(nheld == 4);
    for (unsigned i = 0; i < 4; i++)
        CHECK(check_datagram(held[i].data, held[i].len, 1000) == 100 + i);
    struct eudp_async_rx_datagram d[4];
    CHECK(eudp_async_recv_next(r, d, 4, 50) == 0);
    for (unsigned i = 0; i < 4; i++)
        CHECK(eudp_async_recv_release(r, held[i].lease) == 0);
    CHECK(eudp_async_recv_arm(r) == 0);
    take(r, 2, 1000, 104, tx_port);
    CHECK(eudp_async_recv_close(r) == 0);

    /* A GSO run arrives as one GRO buffer, split by its segment size. */
    r = eudp_async_recv_open((struct sockaddr *)&lo, sizeof lo, NULL);
    CHECK(r != NULL);
    alen = sizeof at;
    CHECK(eudp_async_recv_local_addr(r, &at, &alen) == 0);
    static unsigned char run[8 * 1200];
    for (unsigned i = 0; i < 8; i++)
        fill(run + i * 1200, 200 + i, 1200);
    int seg = 1200;
    CHECK(setsockopt(tx, SOL_UDP, UDP_SEGMENT, &seg, sizeof seg) == 0);
    CHECK(sendto(tx, run, sizeof run, 0, (struct sockaddr *)&at, alen) == (ssize_t)sizeof run);
    struct pollfd p = {.fd = eudp_async_recv_fd(r), .events = POLLIN};
    CHECK(poll(&p, 1, 5000) == 1);
    ssize_t n = eudp_async_recv_next(r, d, 4, 1000);
    CHECK(n >= 1);
    CHECK(d[0].segment == 1200 || d[0].len == 1200);
    for (ssize_t k = 0; k < n; k++)
        CHECK(eudp_async_recv_release(r, d[k].lease) == 0);
    unsigned rest = 0;
    for (ssize_t k = 0; k < n; k++)
        rest += (unsigned)(d[k].len / 1200);
    if (rest < 8)
        take(r, 8 - rest, 1200, 200 + rest, tx_port);
    CHECK(eudp_async_recv_close(r) == 0);
    close(tx);
    printf("ok\n");
    return 0;
}
