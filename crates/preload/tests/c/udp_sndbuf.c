/* Sends that find the socket's send buffer full: blocking with and without
 * SO_SNDTIMEO, nonblocking, and output readiness (poll, select, epoll
 * level- and edge-triggered) going off while full and on again with room.
 *
 * `./prog CASE DST` runs one case, sending 1000-byte datagrams to DST
 * port 9 (an IPv4 or IPv6 address). It is meant for a link whose qdisc
 * holds packets a long time (a slow token bucket): a datagram stays
 * charged to the socket until it leaves, so with a small SO_SNDBUF the
 * buffer fills after a few sends and frees one datagram at a time. Every
 * line printed must be the same on the kernel and under
 * libeudp_preload.so; a timing outside its expected range prints the
 * value, so the outputs then differ. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

enum { LEN = 1000, MAX_SENDS = 4000 };
static char payload[LEN];
static struct sockaddr_storage dst;
static socklen_t dst_len;
static int family;

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void show(const char *what, long r) {
    int e = errno;
    if (r < 0) printf("%s: -1 %s\n", what, strerrorname_np(e));
    else printf("%s: %ld\n", what, r);
    errno = e;
}

/* "yes" when `lo <= v < hi`, else the value (the outputs then differ). */
static void within(const char *what, double v, double lo, double hi) {
    if (v >= lo && v < hi) printf("%s: yes\n", what);
    else printf("%s: no (%.3f s)\n", what, v);
}

/* A socket with the smallest send buffer. */
static int sender(void) {
    int fd = socket(family, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    int small = 4096;
    CHECK(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    return fd;
}

static ssize_t send1(int fd, int flags) {
    return sendto(fd, payload, LEN, flags, (struct sockaddr *)&dst, dst_len);
}

/* Sends with `flags` until one fails (bounded); prints the failure and
 * whether any send waited. Returns the number sent. */
static int fill(int fd, int flags) {
    double worst = 0;
    int n = 0;
    ssize_t r = 0;
    for (; n < MAX_SENDS; n++) {
        double t0 = now();
        r = send1(fd, flags);
        double dt = now() - t0;
        if (dt > worst) worst = dt;
        if (r < 0) break;
        CHECK(r == LEN);
    }
    show("send when full", r);
    within("no send waited", worst, 0, 0.05);
    printf("sent before: %s\n", n > 0 ? "some" : "none");
    return n;
}

/* SO_SNDTIMEO: a blocking send that finds no room fails with EAGAIN once
 * the timeout passed (the next datagram leaves the link about 200 ms
 * after the first sends). */
static void t_sndtimeo(void) {
    int s = sender();
    struct timeval tv = { 0, 100000 };
    CHECK(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    ssize_t r = 0;
    double dt = 0;
    int n = 0;
    for (; n < MAX_SENDS; n++) {
        double t0 = now();
        r = send1(s, 0);
        dt = now() - t0;
        if (r < 0) break;
    }
    show("blocking send when full", r);
    within("failed after the timeout", dt, 0.09, 0.6);
    printf("sent before: %s\n", n > 0 ? "some" : "none");
    /* nothing left the link since the sends began */
    show("MSG_DONTWAIT", send1(s, MSG_DONTWAIT));
    close(s);
    puts("OK sndtimeo");
}

/* No timeout: a blocking send waits for room, then succeeds. */
static void t_block(void) {
    int s = sender();
    fill(s, MSG_DONTWAIT);
    double t0 = now();
    show("blocking send", send1(s, 0));
    within("it waited for room", now() - t0, 0.05, 20);
    close(s);
    puts("OK block");
}

/* O_NONBLOCK: EAGAIN at once; poll and select report no room until some
 * frees, then a send succeeds. */
static void t_nonblock(void) {
    int s = sender();
    CHECK(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) == 0);
    fill(s, 0);
    struct pollfd p = { .fd = s, .events = POLLOUT };
    show("poll now", poll(&p, 1, 0));
    double t0 = now();
    show("poll", poll(&p, 1, 20000));
    printf("revents %s\n", p.revents == POLLOUT ? "POLLOUT" : "other");
    within("poll waited for room", now() - t0, 0.05, 20);
    show("send", send1(s, 0));
    fill(s, 0);
    fd_set w;
    FD_ZERO(&w); FD_SET(s, &w);
    struct timeval zero = { 0, 0 }, tv = { 20, 0 };
    show("select now", select(s + 1, NULL, &w, NULL, &zero));
    FD_ZERO(&w); FD_SET(s, &w);
    t0 = now();
    show("select", select(s + 1, NULL, &w, NULL, &tv));
    printf("writable %d\n", FD_ISSET(s, &w) ? 1 : 0);
    within("select waited for room", now() - t0, 0.05, 20);
    show("send", send1(s, 0));
    close(s);
    puts("OK nonblock");
}

static void epoll_case(int et) {
    int s = sender();
    CHECK(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK) == 0);
    int ep = epoll_create1(0);
    CHECK(ep >= 0);
    struct epoll_event ev = { .events = EPOLLOUT | (et ? EPOLLET : 0), .data.fd = s }, out[4];
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    show("epoll_wait empty", epoll_wait(ep, out, 4, 0));
    for (int round = 0; round < 2; round++) {
        fill(s, 0);
        show("epoll_wait now", epoll_wait(ep, out, 4, 0));
        double t0 = now();
        int k = epoll_wait(ep, out, 4, 20000);
        show("epoll_wait", k);
        printf("events %s\n", k == 1 && out[0].events == EPOLLOUT ? "EPOLLOUT" : "other");
        within("epoll_wait waited for room", now() - t0, 0.05, 20);
        show("send", send1(s, 0));
    }
    close(ep);
    close(s);
}

static void t_epoll(void) { epoll_case(0); puts("OK epoll"); }
static void t_epoll_et(void) { epoll_case(1); puts("OK epoll_et"); }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    CHECK(argc == 3);
    memset(payload, 'x', sizeof payload);
    struct sockaddr_in *a4 = (struct sockaddr_in *)&dst;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)&dst;
    if (inet_pton(AF_INET, argv[2], &a4->sin_addr) == 1) {
        family = a4->sin_family = AF_INET;
        a4->sin_port = htons(9);
        dst_len = sizeof *a4;
    } else {
        CHECK(inet_pton(AF_INET6, argv[2], &a6->sin6_addr) == 1);
        family = a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(9);
        dst_len = sizeof *a6;
    }
    const char *only = argv[1];
    int ran = 0;
#define RUN(t) if (strcmp(only, #t) == 0) { alarm(60); t_##t(); alarm(0); ran = 1; }
    RUN(sndtimeo);
    RUN(block);
    RUN(nonblock);
    RUN(epoll);
    RUN(epoll_et);
    CHECK(ran);
    return 0;
}
