/* The rest of the UDP sockets surface: options, shutdown, signal-masked
 * waits, epoll modes, partial sendmmsg, ICMP errors, control messages and
 * size limits. `./prog CASE` runs one case; every line printed must be the
 * same on the kernel and under libeudp_preload.so (no timings, ports or
 * pids are printed). Each case runs under an alarm() watchdog. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

/* Prints a call's result: the value, or -1 and the errno's name. */
static void show(const char *what, long r) {
    int e = errno;
    if (r < 0) printf("%s: -1 %s\n", what, strerrorname_np(e));
    else printf("%s: %ld\n", what, r);
    errno = e;
}

static struct sockaddr_in loop4(unsigned short port) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = port, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    return a;
}

static int udp4(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in b = loop4(0);
    CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    socklen_t l = sizeof *a;
    CHECK(getsockname(fd, (struct sockaddr *)a, &l) == 0);
    return fd;
}

static int udp6(struct sockaddr_in6 *a) {
    int fd = socket(AF_INET6, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in6 b = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    socklen_t l = sizeof *a;
    CHECK(getsockname(fd, (struct sockaddr *)a, &l) == 0);
    return fd;
}

/* "yes" when `lo <= v < hi` seconds, else the value in ms (the outputs
 * then differ). */
static void within_ms(const char *what, double v, double lo, double hi) {
    if (v >= lo && v < hi) printf("%s: yes\n", what);
    else printf("%s: no (%.1f ms)\n", what, v * 1e3);
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

/* Waits (bounded) until `fd` is readable. */
static int readable(int fd, int ms) { struct pollfd p = { .fd = fd, .events = POLLIN }; return poll(&p, 1, ms); }

static volatile sig_atomic_t got_usr1;
static void on_usr1(int sig) { (void)sig; got_usr1++; }

static void usr1_handler(void) {
    struct sigaction act = { .sa_handler = on_usr1 };
    sigemptyset(&act.sa_mask);
    CHECK(sigaction(SIGUSR1, &act, NULL) == 0);
}

static int usr1_pending(void) { sigset_t p; sigpending(&p); return sigismember(&p, SIGUSR1); }

/* ------------------------------------------------------------ options */

static void t_sockopts(void) {
    struct sockaddr_in sa; struct sockaddr_in6 s6;
    int s = udp4(&sa), v6 = udp6(&s6);
    int fds[2] = { s, v6 };
    for (int i = 0; i < 2; i++) {
        int v = -1; socklen_t l = sizeof v;
        CHECK(getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &v, &l) == 0); printf("SO_TYPE %d\n", v);
        l = sizeof v; CHECK(getsockopt(fds[i], SOL_SOCKET, SO_PROTOCOL, &v, &l) == 0); printf("SO_PROTOCOL %d\n", v);
        l = sizeof v; CHECK(getsockopt(fds[i], SOL_SOCKET, SO_DOMAIN, &v, &l) == 0); printf("SO_DOMAIN %d\n", v);
        l = sizeof v; CHECK(getsockopt(fds[i], SOL_SOCKET, SO_ERROR, &v, &l) == 0); printf("SO_ERROR %d\n", v);
    }
    /* the socket in use, then again */
    CHECK(sendto(s, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    char b[8];
    CHECK(recv(s, b, sizeof b, 0) == 1);
    int v = -1; socklen_t l = sizeof v;
    CHECK(getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &l) == 0 && v == SOCK_DGRAM);
    l = sizeof v; CHECK(getsockopt(s, SOL_SOCKET, SO_ERROR, &v, &l) == 0); printf("SO_ERROR in use %d\n", v);
    close(s); close(v6);
    puts("OK sockopts");
}

/* Loopback frees a datagram's buffer as it is delivered, so a UDP send on
 * the kernel never waits for send-buffer room, even with the smallest
 * SO_SNDBUF and a receiver that never reads: blocking sends with
 * SO_SNDTIMEO all succeed, well within the timeout, and so do
 * nonblocking ones. */
static void t_sndtimeo(void) {
    struct sockaddr_in sa, ra;
    int s = udp4(&sa), r = udp4(&ra);
    int one = 1;
    CHECK(setsockopt(s, SOL_SOCKET, SO_SNDBUF, &one, sizeof one) == 0);
    CHECK(setsockopt(r, SOL_SOCKET, SO_RCVBUF, &one, sizeof one) == 0);
    struct timeval tv = { 0, 200000 }, got = { 9, 9 };
    CHECK(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == 0);
    socklen_t l = sizeof got;
    CHECK(getsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &got, &l) == 0);
    printf("SO_SNDTIMEO %ld.%06ld\n", (long)got.tv_sec, (long)got.tv_usec);
    static char buf[1400];
    int ok = 0, again = 0, other = 0;
    double worst = 0;
    for (int i = 0; i < 20000; i++) {
        double t0 = now();
        ssize_t n = sendto(s, buf, sizeof buf, 0, (struct sockaddr *)&ra, sizeof ra);
        double dt = now() - t0;
        if (dt > worst) worst = dt;
        if (n == (ssize_t)sizeof buf) ok++;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) again++;
        else other++;
    }
    printf("blocking sends: %d sent, %d EAGAIN, %d other\n", ok, again, other);
    CHECK(worst < 0.19);
    ok = again = other = 0;
    for (int i = 0; i < 20000; i++) {
        ssize_t n = sendto(s, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&ra, sizeof ra);
        if (n == (ssize_t)sizeof buf) ok++;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) again++;
        else other++;
    }
    printf("nonblocking sends: %d sent, %d EAGAIN, %d other\n", ok, again, other);
    close(s); close(r);
    puts("OK sndtimeo");
}

static int bound_to(unsigned short port, int reuseaddr, int reuseport) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    int one = 1;
    if (reuseaddr) CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0);
    if (reuseport) CHECK(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one) == 0);
    struct sockaddr_in a = loop4(port);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) { int e = errno; close(fd); errno = e; return -1; }
    return fd;
}

static void t_reuse(void) {
    struct sockaddr_in pa;
    int a = udp4(&pa);
    unsigned short port = pa.sin_port;
    int b = bound_to(port, 0, 0);
    show("second bind, no options", b);
    close(a);
    a = bound_to(0, 1, 0);
    socklen_t l = sizeof pa;
    CHECK(getsockname(a, (struct sockaddr *)&pa, &l) == 0);
    port = pa.sin_port;
    b = bound_to(port, 0, 0);
    show("second bind, only the first SO_REUSEADDR", b);
    b = bound_to(port, 1, 0);
    printf("second bind, both SO_REUSEADDR: %s\n", b >= 0 ? "ok" : strerrorname_np(errno));
    int v = -1; l = sizeof v;
    CHECK(getsockopt(a, SOL_SOCKET, SO_REUSEADDR, &v, &l) == 0); printf("SO_REUSEADDR %d\n", v);
    if (b >= 0) close(b);
    close(a);
    /* SO_REUSEPORT: the kernel spreads datagrams of many sources over the group */
    a = bound_to(0, 0, 1);
    l = sizeof pa;
    CHECK(getsockname(a, (struct sockaddr *)&pa, &l) == 0);
    port = pa.sin_port;
    b = bound_to(port, 0, 0);
    show("second bind, only the first SO_REUSEPORT", b);
    b = bound_to(port, 0, 1);
    CHECK(b >= 0);
    l = sizeof v; CHECK(getsockopt(b, SOL_SOCKET, SO_REUSEPORT, &v, &l) == 0); printf("SO_REUSEPORT %d\n", v);
    enum { N = 64 };
    int src[N];
    for (int i = 0; i < N; i++) {
        struct sockaddr_in ca;
        src[i] = udp4(&ca);
        CHECK(sendto(src[i], &i, sizeof i, 0, (struct sockaddr *)&pa, sizeof pa) == sizeof i);
    }
    int got[2] = { 0, 0 }, seen[N] = { 0 };
    double t0 = now();
    while (got[0] + got[1] < N && now() - t0 < 5) {
        struct pollfd p[2] = { { .fd = a, .events = POLLIN }, { .fd = b, .events = POLLIN } };
        if (poll(p, 2, 500) <= 0) continue;
        for (int k = 0; k < 2; k++) {
            int x;
            if ((p[k].revents & POLLIN) && recv(p[k].fd, &x, sizeof x, MSG_DONTWAIT) == sizeof x) {
                CHECK(x >= 0 && x < N && !seen[x]);
                seen[x] = 1;
                got[k]++;
            }
        }
    }
    printf("reuseport group: %d datagrams, both members got some: %d\n", got[0] + got[1], got[0] > 0 && got[1] > 0);
    for (int i = 0; i < N; i++) close(src[i]);
    close(a); close(b);
    puts("OK reuse");
}

/* -------------------------------------------------------------- shutdown */

struct blocked { int fd; long r; int e; };
static void *blocked_recv(void *arg) {
    struct blocked *b = arg;
    char buf[16];
    b->r = recv(b->fd, buf, sizeof buf, 0);
    b->e = errno;
    return NULL;
}

static void shutdown_one(int connected, int how, const char *name) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[16], line[96];
    if (connected) {
        CHECK(connect(s, (struct sockaddr *)&ca, sizeof ca) == 0);
        CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    }
    const char *kind = connected ? "connected" : "unconnected";
    /* the socket in use first, one datagram left queued */
    CHECK(sendto(c, "one", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(sendto(c, "two", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(readable(s, 2000) == 1);
    CHECK(recv(s, b, sizeof b, 0) == 3);
    CHECK(readable(s, 2000) == 1);
    snprintf(line, sizeof line, "%s %s", kind, name); show(line, shutdown(s, how));
    struct pollfd p = { .fd = s, .events = POLLIN | POLLOUT | POLLRDHUP };
    poll(&p, 1, 0);
    printf("%s %s: revents %#x\n", kind, name, p.revents);
    snprintf(line, sizeof line, "%s %s: recv queued", kind, name); show(line, recv(s, b, sizeof b, MSG_DONTWAIT));
    snprintf(line, sizeof line, "%s %s: recv empty nonblocking", kind, name); show(line, recv(s, b, sizeof b, MSG_DONTWAIT));
    struct timeval tv = { 1, 0 };
    CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    snprintf(line, sizeof line, "%s %s: recv empty blocking", kind, name); show(line, recv(s, b, sizeof b, 0));
    CHECK(sendto(c, "three", 5, 0, (struct sockaddr *)&sa, sizeof sa) == 5);
    usleep(20000);
    snprintf(line, sizeof line, "%s %s: recv after", kind, name); show(line, recv(s, b, sizeof b, MSG_DONTWAIT));
    got_usr1 = 0;
    snprintf(line, sizeof line, "%s %s: send", kind, name); show(line, sendto(s, "back", 4, 0, (struct sockaddr *)&ca, sizeof ca));
    close(s); close(c);
}

static void t_shutdown(void) {
    signal(SIGPIPE, SIG_IGN);
    for (int connected = 0; connected < 2; connected++) {
        shutdown_one(connected, SHUT_RD, "SHUT_RD");
        shutdown_one(connected, SHUT_WR, "SHUT_WR");
        shutdown_one(connected, SHUT_RDWR, "SHUT_RDWR");
    }
    struct sockaddr_in sa;
    int s = udp4(&sa);
    show("shutdown how=7", shutdown(s, 7));
    close(s);
    signal(SIGPIPE, SIG_DFL);
    puts("OK shutdown");
}

/* A receive blocked in another thread wakes with 0 on shutdown(SHUT_RD). */
static void t_shutdown_wakes(void) {
    /* with SO_RCVTIMEO, unconnected and connected; then without a timeout */
    for (int connected = 0; connected < 3; connected++) {
        struct sockaddr_in sa, ca;
        int s = udp4(&sa), c = udp4(&ca);
        char b[8];
        if (connected == 1) CHECK(connect(s, (struct sockaddr *)&ca, sizeof ca) == 0);
        CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
        CHECK(recv(s, b, sizeof b, 0) == 1);
        struct timeval tv = { 3, 0 };
        if (connected < 2) CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
        struct blocked bl = { .fd = s, .r = -2 };
        pthread_t th;
        CHECK(pthread_create(&th, NULL, blocked_recv, &bl) == 0);
        usleep(200000);
        double t0 = now();
        show(connected == 1 ? "connected shutdown(SHUT_RD) while blocked" : connected ? "shutdown(SHUT_RD) while blocked without a timeout" : "unconnected shutdown(SHUT_RD) while blocked", shutdown(s, SHUT_RD));
        pthread_join(th, NULL);
        errno = bl.e;
        show("blocked recv", bl.r);
        CHECK(now() - t0 < 2.0);
        close(s); close(c);
    }
    puts("OK shutdown_wakes");
}

/* ------------------------------------------- waits with a signal mask */

static void t_pselect(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    usr1_handler();
    sigset_t block, old, none;
    sigemptyset(&block); sigaddset(&block, SIGUSR1); sigemptyset(&none);
    CHECK(sigprocmask(SIG_BLOCK, &block, &old) == 0);
    got_usr1 = 0;
    raise(SIGUSR1);
    fd_set r; FD_ZERO(&r); FD_SET(s, &r);
    struct timespec ts = { 0, 100000000 };
    double t0 = now();
    show("pselect, signal blocked by the mask", pselect(s + 1, &r, NULL, NULL, &ts, &block));
    CHECK(now() - t0 > 0.08);
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    FD_ZERO(&r); FD_SET(s, &r);
    ts.tv_sec = 3; ts.tv_nsec = 0;
    t0 = now();
    show("pselect, signal unblocked by the mask", pselect(s + 1, &r, NULL, NULL, &ts, &none));
    CHECK(now() - t0 < 1.5);
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    CHECK(sendto(c, "y", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    FD_ZERO(&r); FD_SET(s, &r);
    show("pselect, data", pselect(s + 1, &r, NULL, NULL, &ts, &block));
    printf("readable %d\n", FD_ISSET(s, &r) ? 1 : 0);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    CHECK(sigprocmask(SIG_SETMASK, &old, NULL) == 0);
    signal(SIGUSR1, SIG_DFL);
    close(s); close(c);
    puts("OK pselect");
}

struct late { int fd; struct sockaddr_in to; int ms; };
static void *late_send(void *arg) {
    struct late *l = arg;
    usleep(l->ms * 1000);
    sendto(l->fd, "late", 4, 0, (struct sockaddr *)&l->to, sizeof l->to);
    return NULL;
}

static void t_ppoll(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    usr1_handler();
    sigset_t block, old, none;
    sigemptyset(&block); sigaddset(&block, SIGUSR1); sigemptyset(&none);
    CHECK(sigprocmask(SIG_BLOCK, &block, &old) == 0);
    got_usr1 = 0;
    struct pollfd p = { .fd = s, .events = POLLIN };
    struct timespec ts = { 0, 150000000 };
    double t0 = now();
    show("ppoll, timeout", ppoll(&p, 1, &ts, &block));
    double dt = now() - t0;
    CHECK(dt > 0.13 && dt < 1.0);
    raise(SIGUSR1);
    ts.tv_nsec = 100000000;
    show("ppoll, signal blocked by the mask", ppoll(&p, 1, &ts, &block));
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    t0 = now();
    show("ppoll, signal unblocked by the mask, no timeout", ppoll(&p, 1, NULL, &none));
    CHECK(now() - t0 < 1.5);
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    struct late l = { c, sa, 100 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, late_send, &l) == 0);
    p.revents = 0;
    show("ppoll, data from a thread", ppoll(&p, 1, NULL, &block));
    printf("revents %#x\n", p.revents);
    pthread_join(th, NULL);
    CHECK(recv(s, b, sizeof b, 0) == 4);
    CHECK(sigprocmask(SIG_SETMASK, &old, NULL) == 0);
    signal(SIGUSR1, SIG_DFL);
    close(s); close(c);
    puts("OK ppoll");
}

static void t_epoll_pwait(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 7 }, out[4];
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    usr1_handler();
    sigset_t block, old, none;
    sigemptyset(&block); sigaddset(&block, SIGUSR1); sigemptyset(&none);
    CHECK(sigprocmask(SIG_BLOCK, &block, &old) == 0);
    got_usr1 = 0;
    raise(SIGUSR1);
    show("epoll_pwait, signal blocked by the mask", epoll_pwait(ep, out, 4, 100, &block));
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    show("epoll_pwait, signal unblocked by the mask", epoll_pwait(ep, out, 4, 3000, &none));
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    int n = epoll_pwait(ep, out, 4, 3000, &block);
    show("epoll_pwait, data", n);
    if (n > 0) printf("data %llu events %#x\n", (unsigned long long)out[0].data.u64, out[0].events);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    /* epoll_pwait2: a timespec timeout */
    struct timespec ts = { 0, 120000000 };
    double t0 = now();
    show("epoll_pwait2, timeout", epoll_pwait2(ep, out, 4, &ts, &block));
    double dt = now() - t0;
    CHECK(dt > 0.1 && dt < 1.0);
    raise(SIGUSR1);
    show("epoll_pwait2, signal blocked by the mask", epoll_pwait2(ep, out, 4, &ts, &block));
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    show("epoll_pwait2, signal unblocked by the mask", epoll_pwait2(ep, out, 4, NULL, &none));
    printf("pending %d, handled %d\n", usr1_pending(), got_usr1);
    struct late l = { c, sa, 100 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, late_send, &l) == 0);
    n = epoll_pwait2(ep, out, 4, NULL, &block);
    show("epoll_pwait2, data from a thread", n);
    if (n > 0) printf("data %llu events %#x\n", (unsigned long long)out[0].data.u64, out[0].events);
    pthread_join(th, NULL);
    CHECK(recv(s, b, sizeof b, 0) == 4);
    CHECK(sigprocmask(SIG_SETMASK, &old, NULL) == 0);
    signal(SIGUSR1, SIG_DFL);
    close(ep); close(s); close(c);
    puts("OK epoll_pwait");
}

/* ----------------------------------------------------------- epoll modes */

static void t_epoll_oneshot(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT, .data.u64 = 5 }, out[4];
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    show("oneshot, nothing yet", epoll_wait(ep, out, 4, 0));
    for (int i = 0; i < 3; i++) CHECK(sendto(c, "abc", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(readable(s, 2000) == 1);
    usleep(20000);
    show("oneshot, first", epoll_wait(ep, out, 4, 2000));
    show("oneshot, disarmed", epoll_wait(ep, out, 4, 100));
    CHECK(recv(s, b, sizeof b, 0) == 3);
    show("oneshot, disarmed after a receive", epoll_wait(ep, out, 4, 100));
    ev.events = EPOLLIN | EPOLLONESHOT;
    show("EPOLL_CTL_MOD re-arm", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    show("oneshot, re-armed", epoll_wait(ep, out, 4, 2000));
    show("oneshot, disarmed again", epoll_wait(ep, out, 4, 100));
    CHECK(recv(s, b, sizeof b, 0) == 3);
    CHECK(recv(s, b, sizeof b, 0) == 3);
    ev.events = EPOLLIN | EPOLLONESHOT;
    show("EPOLL_CTL_MOD re-arm, empty", epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
    show("oneshot, armed, empty", epoll_wait(ep, out, 4, 100));
    CHECK(sendto(c, "late", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    show("oneshot, armed, new datagram", epoll_wait(ep, out, 4, 2000));
    show("oneshot, disarmed by it", epoll_wait(ep, out, 4, 100));
    CHECK(recv(s, b, sizeof b, 0) == 4);
    /* re-armed for output only: no input report */
    CHECK(sendto(c, "more", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    CHECK(readable(s, 2000) == 1);
    ev.events = EPOLLOUT | EPOLLONESHOT;
    CHECK(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev) == 0);
    int n = epoll_wait(ep, out, 4, 2000);
    show("oneshot, re-armed for output", n);
    if (n > 0) printf("events %#x\n", out[0].events);
    show("oneshot, output disarmed", epoll_wait(ep, out, 4, 100));
    close(ep); close(s); close(c);
    puts("OK epoll_oneshot");
}

static void t_epoll_exclusive(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    int e1 = epoll_create1(0), e2 = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN | EPOLLEXCLUSIVE, .data.u64 = 1 }, out[4];
    show("EPOLLEXCLUSIVE add", epoll_ctl(e1, EPOLL_CTL_ADD, s, &ev));
    ev.data.u64 = 2;
    show("EPOLLEXCLUSIVE add, second epoll", epoll_ctl(e2, EPOLL_CTL_ADD, s, &ev));
    show("EPOLLEXCLUSIVE mod", epoll_ctl(e1, EPOLL_CTL_MOD, s, &ev));
    ev.events = EPOLLIN | EPOLLEXCLUSIVE | EPOLLONESHOT;
    int e3 = epoll_create1(0);
    show("EPOLLEXCLUSIVE with EPOLLONESHOT", epoll_ctl(e3, EPOLL_CTL_ADD, s, &ev));
    show("exclusive, nothing yet", epoll_wait(e1, out, 4, 0));
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    int n = epoll_wait(e1, out, 4, 2000);
    show("exclusive, first epoll", n);
    if (n > 0) printf("data %llu events %#x\n", (unsigned long long)out[0].data.u64, out[0].events);
    n = epoll_wait(e2, out, 4, 2000);
    show("exclusive, second epoll", n);
    if (n > 0) printf("data %llu events %#x\n", (unsigned long long)out[0].data.u64, out[0].events);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    show("exclusive, drained", epoll_wait(e1, out, 4, 50));
    show("EPOLL_CTL_DEL", epoll_ctl(e1, EPOLL_CTL_DEL, s, NULL));
    CHECK(sendto(c, "y", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    CHECK(readable(s, 2000) == 1);
    show("deleted epoll", epoll_wait(e1, out, 4, 50));
    show("other epoll", epoll_wait(e2, out, 4, 2000));
    close(e1); close(e2); close(e3); close(s); close(c);
    puts("OK epoll_exclusive");
}

static int sorted_data(int ep, int ms, unsigned long long *d, int max) {
    struct epoll_event out[8];
    int n = epoll_wait(ep, out, 8, ms);
    for (int i = 0; i < n && i < max; i++) d[i] = out[i].data.u64;
    for (int i = 0; i < n; i++) for (int j = i + 1; j < n; j++) if (d[j] < d[i]) { unsigned long long t = d[i]; d[i] = d[j]; d[j] = t; }
    return n;
}

static void t_epoll_dup(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    unsigned long long d[8];
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    int dd = dup(s);
    CHECK(dd >= 0);
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 10 };
    show("add the duplicate", epoll_ctl(ep, EPOLL_CTL_ADD, dd, &ev));
    CHECK(sendto(c, "a", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    int n = sorted_data(ep, 2000, d, 8);
    printf("duplicate only: %d events, first data %llu\n", n, n > 0 ? d[0] : 0);
    ev.data.u64 = 11;
    show("add the original too", epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
    n = sorted_data(ep, 2000, d, 8);
    printf("both: %d events:", n);
    for (int i = 0; i < n; i++) printf(" %llu", d[i]);
    printf("\n");
    CHECK(recv(dd, b, sizeof b, 0) == 1);
    show("both, drained", epoll_wait(ep, (struct epoll_event[4]){}, 4, 50));
    show("delete the original", epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL));
    CHECK(sendto(c, "b", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    n = sorted_data(ep, 2000, d, 8);
    printf("after deleting the original: %d events, first data %llu\n", n, n > 0 ? d[0] : 0);
    CHECK(recv(s, b, sizeof b, 0) == 1);
    /* the original closed: the duplicate's registration stays */
    close(s);
    CHECK(sendto(c, "c", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    n = sorted_data(ep, 2000, d, 8);
    printf("original closed: %d events, first data %llu\n", n, n > 0 ? d[0] : 0);
    CHECK(recv(dd, b, sizeof b, 0) == 1 && b[0] == 'c');
    show("duplicate drained", epoll_wait(ep, (struct epoll_event[4]){}, 4, 50));
    close(ep); close(dd); close(c);
    puts("OK epoll_dup");
}

/* ---------------------------------------------------------------- sends */

static void t_sendmmsg_partial(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    static char big[70000], b[128];
    char small[100]; memset(small, 's', sizeof small);
    struct iovec iv[3] = { { small, sizeof small }, { big, sizeof big }, { small, 10 } };
    struct mmsghdr m[3];
    memset(m, 0, sizeof m);
    for (int i = 0; i < 3; i++) {
        m[i].msg_hdr.msg_iov = &iv[i]; m[i].msg_hdr.msg_iovlen = 1;
        m[i].msg_hdr.msg_name = &sa; m[i].msg_hdr.msg_namelen = sizeof sa;
        m[i].msg_len = 12345;
    }
    show("sendmmsg, second too big", sendmmsg(c, m, 3, 0));
    printf("msg_len %u %u %u\n", m[0].msg_len, m[1].msg_len, m[2].msg_len);
    show("sendmmsg, first too big", sendmmsg(c, m + 1, 2, 0));
    show("recv", recv(s, b, sizeof b, 0));
    show("recv, nothing more", recv(s, b, sizeof b, MSG_DONTWAIT));
    /* connected, the last one too big */
    CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct mmsghdr n2[3];
    memset(n2, 0, sizeof n2);
    struct iovec jv[3] = { { small, 1 }, { small, 2 }, { big, 65508 } };
    for (int i = 0; i < 3; i++) { n2[i].msg_hdr.msg_iov = &jv[i]; n2[i].msg_hdr.msg_iovlen = 1; }
    show("sendmmsg connected, third too big", sendmmsg(c, n2, 3, 0));
    show("recv", recv(s, b, sizeof b, 0));
    show("recv", recv(s, b, sizeof b, 0));
    show("recv, nothing more", recv(s, b, sizeof b, MSG_DONTWAIT));
    close(s); close(c);
    puts("OK sendmmsg_partial");
}

static void t_sizes(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    static char big[65600], in[65600];
    for (int i = 0; i < (int)sizeof big; i++) big[i] = (char)(i * 13);
    show("send 65507", sendto(c, big, 65507, 0, (struct sockaddr *)&sa, sizeof sa));
    show("send 65508", sendto(c, big, 65508, 0, (struct sockaddr *)&sa, sizeof sa));
    show("send 65535", sendto(c, big, 65535, 0, (struct sockaddr *)&sa, sizeof sa));
    struct sockaddr_in from; socklen_t fl = sizeof from;
    ssize_t r = recvfrom(s, in, sizeof in, 0, (struct sockaddr *)&from, &fl);
    show("recv 65507", r);
    printf("same bytes %d, from the sender %d\n", r == 65507 && memcmp(in, big, 65507) == 0, from.sin_port == ca.sin_port);
    show("recv, nothing more", recv(s, in, sizeof in, MSG_DONTWAIT));
    CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    show("connected send 65507", send(c, big, 65507, 0));
    show("connected send 65508", send(c, big, 65508, 0));
    struct iovec iv[2] = { { big, 60000 }, { big + 60000, 5508 } };
    show("connected writev 65508", writev(c, iv, 2));
    iv[1].iov_len = 5507;
    show("connected writev 65507", writev(c, iv, 2));
    show("recv", recv(s, in, sizeof in, 0));
    show("recv", recv(s, in, sizeof in, 0));
    printf("same bytes %d\n", memcmp(in, big, 65507) == 0);
    close(s); close(c);
    struct sockaddr_in6 s6, c6;
    s = udp6(&s6); c = udp6(&c6);
    show("v6 send 65527", sendto(c, big, 65527, 0, (struct sockaddr *)&s6, sizeof s6));
    show("v6 send 65528", sendto(c, big, 65528, 0, (struct sockaddr *)&s6, sizeof s6));
    show("v6 recv 65527", recv(s, in, sizeof in, 0));
    close(s); close(c);
    puts("OK sizes");
}

/* Zero-length datagrams are real datagrams for send/recv; read/write of
 * zero bytes on a socket do nothing (return 0 at once). */
static void t_zero(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[16];
    show("sendto 0 bytes", sendto(c, "", 0, 0, (struct sockaddr *)&sa, sizeof sa));
    struct sockaddr_in from = { 0 }; socklen_t fl = sizeof from;
    show("recvfrom", recvfrom(s, b, sizeof b, 0, (struct sockaddr *)&from, &fl));
    printf("source given %d, is the sender %d\n", fl == sizeof from, from.sin_port == ca.sin_port && from.sin_addr.s_addr == ca.sin_addr.s_addr);
    CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    struct msghdr m = { 0 };
    struct iovec iv = { b, 0 };
    for (int k = 0; k < 4; k++) {
        static const char *what[] = { "send 0 bytes", "sendmsg no iovec", "write 0 bytes", "writev 0 bytes" };
        long r = k == 0 ? send(c, NULL, 0, 0) : k == 1 ? sendmsg(c, &m, 0) : k == 2 ? write(c, "", 0) : writev(c, &iv, 1);
        show(what[k], r);
        CHECK(send(c, "end", 3, 0) == 3);
        CHECK(readable(s, 2000) == 1);
        usleep(20000);
        for (int i = 0; i < 4; i++) {
            long n = recv(s, b, sizeof b, MSG_DONTWAIT);
            show("  recv", n);
            if (n != 0) break;
        }
    }
    /* read/readv of 0 bytes neither wait nor take a datagram */
    show("read 0 bytes, empty", read(s, b, 0));
    show("readv 0 bytes, empty", readv(s, &iv, 1));
    CHECK(send(c, "abcd", 4, 0) == 4);
    CHECK(readable(s, 2000) == 1);
    show("read 0 bytes, queued", read(s, b, 0));
    show("readv 0 bytes, queued", readv(s, &iv, 1));
    show("recv 0 bytes takes it", recv(s, b, 0, 0));
    show("then", recv(s, b, sizeof b, MSG_DONTWAIT));
    CHECK(send(c, "abcd", 4, 0) == 4);
    CHECK(readable(s, 2000) == 1);
    show("recv 0 bytes MSG_TRUNC", recv(s, b, 0, MSG_TRUNC));
    show("then", recv(s, b, sizeof b, MSG_DONTWAIT));
    close(s); close(c);
    puts("OK zero");
}

static void t_waitall(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[100];
    CHECK(sendto(c, "0123456789", 10, 0, (struct sockaddr *)&sa, sizeof sa) == 10);
    CHECK(sendto(c, "abcdefghij", 10, 0, (struct sockaddr *)&sa, sizeof sa) == 10);
    static char big[200];
    CHECK(sendto(c, big, sizeof big, 0, (struct sockaddr *)&sa, sizeof sa) == sizeof big);
    show("recv MSG_WAITALL", recv(s, b, sizeof b, MSG_WAITALL));
    show("recv MSG_WAITALL", recv(s, b, sizeof b, MSG_WAITALL));
    show("recv MSG_WAITALL, datagram larger than the buffer", recv(s, b, sizeof b, MSG_WAITALL));
    struct late l = { c, sa, 100 };
    pthread_t th;
    CHECK(pthread_create(&th, NULL, late_send, &l) == 0);
    show("recv MSG_WAITALL, waits for one", recv(s, b, sizeof b, MSG_WAITALL));
    pthread_join(th, NULL);
    show("recv MSG_WAITALL|MSG_DONTWAIT", recv(s, b, sizeof b, MSG_WAITALL | MSG_DONTWAIT));
    close(s); close(c);
    puts("OK waitall");
}

/* ------------------------------------------------------- ICMP and errors */

/* A port with no socket: bound once, then closed. */
static struct sockaddr_in closed_port(void) {
    struct sockaddr_in a;
    int fd = udp4(&a);
    close(fd);
    return a;
}

static void t_refused(void) {
    char b[8];
    struct sockaddr_in dead = closed_port();
    for (int step = 0; step < 4; step++) {
        struct sockaddr_in ca;
        int c = udp4(&ca);
        CHECK(connect(c, (struct sockaddr *)&dead, sizeof dead) == 0);
        show("send to a closed port", send(c, "x", 1, 0));
        struct pollfd p = { .fd = c, .events = POLLIN };
        int n = poll(&p, 1, 2000);
        printf("poll %d revents %#x\n", n, p.revents);
        int v = -1; socklen_t l = sizeof v;
        switch (step) {
        case 0:
            CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &l) == 0);
            printf("SO_ERROR %s\n", v ? strerrorname_np(v) : "0");
            l = sizeof v; CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &l) == 0);
            printf("SO_ERROR again %s\n", v ? strerrorname_np(v) : "0");
            show("send after", send(c, "x", 1, 0));
            break;
        case 1:
            show("send", send(c, "y", 1, 0));
            show("send again", send(c, "y", 1, 0));
            break;
        case 2:
            show("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
            show("recv again", recv(c, b, sizeof b, MSG_DONTWAIT));
            break;
        case 3: {
            struct timeval tv = { 1, 0 };
            CHECK(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
            show("blocking recv", recv(c, b, sizeof b, 0));
            break;
        }
        }
        p.revents = 0;
        n = poll(&p, 1, 300);
        printf("then poll %d revents %#x\n", n, p.revents);
        close(c);
    }
    /* unconnected: the kernel drops the ICMP error (no IP_RECVERR) */
    struct sockaddr_in ca;
    int c = udp4(&ca);
    show("unconnected sendto a closed port", sendto(c, "x", 1, 0, (struct sockaddr *)&dead, sizeof dead));
    usleep(50000);
    int v = -1; socklen_t l = sizeof v;
    CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &l) == 0);
    printf("SO_ERROR %s\n", v ? strerrorname_np(v) : "0");
    show("sendto again", sendto(c, "x", 1, 0, (struct sockaddr *)&dead, sizeof dead));
    show("recv", recv(c, b, sizeof b, MSG_DONTWAIT));
    close(c);
    puts("OK refused");
}

static void print_errqueue(int fd) {
    char data[16], ctl[512];
    struct sockaddr_in off = { 0 };
    struct iovec iv = { data, sizeof data };
    struct msghdr m = { .msg_name = &off, .msg_namelen = sizeof off, .msg_iov = &iv, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    ssize_t r = recvmsg(fd, &m, MSG_ERRQUEUE);
    show("recvmsg MSG_ERRQUEUE", r);
    if (r < 0) return;
    printf("flags %#x payload %.*s\n", m.msg_flags, (int)r, data);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        printf("cmsg level %d type %d", c->cmsg_level, c->cmsg_type);
        if (c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_RECVERR) {
            struct sock_extended_err *e = (struct sock_extended_err *)CMSG_DATA(c);
            struct sockaddr_in *o = (struct sockaddr_in *)SO_EE_OFFENDER(e);
            printf(" errno %s origin %u type %u code %u offender %s", strerrorname_np(e->ee_errno), e->ee_origin, e->ee_type, e->ee_code, inet_ntoa(o->sin_addr));
        }
        printf("\n");
    }
}

static void t_errqueue(void) {
    struct sockaddr_in dead = closed_port();
    /* a socket beside them, without IP_RECVERR, gets the same errors */
    struct sockaddr_in pa;
    int plain = udp4(&pa);
    CHECK(connect(plain, (struct sockaddr *)&dead, sizeof dead) == 0);
    show("plain socket, send to a closed port", send(plain, "ping", 4, 0));
    struct pollfd pp = { .fd = plain, .events = POLLIN };
    int pn = poll(&pp, 1, 2000);
    printf("plain socket: poll %d revents %#x\n", pn, pp.revents);
    show("plain socket, recvmsg MSG_ERRQUEUE", recv(plain, pa.sin_zero, sizeof pa.sin_zero, MSG_ERRQUEUE | MSG_DONTWAIT));
    show("plain socket, recv", recv(plain, pa.sin_zero, sizeof pa.sin_zero, MSG_DONTWAIT));
    close(plain);
    for (int connected = 0; connected < 2; connected++) {
        struct sockaddr_in ca;
        int c = udp4(&ca), one = 1;
        show("IP_RECVERR", setsockopt(c, IPPROTO_IP, IP_RECVERR, &one, sizeof one));
        if (connected) CHECK(connect(c, (struct sockaddr *)&dead, sizeof dead) == 0);
        show("send to a closed port", sendto(c, "ping", 4, 0, connected ? NULL : (struct sockaddr *)&dead, connected ? 0 : sizeof dead));
        struct pollfd p = { .fd = c, .events = 0 };
        int n = poll(&p, 1, 2000);
        printf("poll %d revents %#x\n", n, p.revents);
        print_errqueue(c);
        int v = -1; socklen_t l = sizeof v;
        CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &l) == 0);
        printf("SO_ERROR %s\n", v ? strerrorname_np(v) : "0");
        print_errqueue(c);
        show("send after", sendto(c, "ping", 4, 0, connected ? NULL : (struct sockaddr *)&dead, connected ? 0 : sizeof dead));
        close(c);
    }
    puts("OK errqueue");
}

/* ------------------------------------------------------- TOS and TTL */

static void print_cmsgs(int fd) {
    char data[16], ctl[256];
    struct iovec iv = { data, sizeof data };
    struct msghdr m = { .msg_iov = &iv, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    ssize_t r = recvmsg(fd, &m, 0);
    show("recvmsg", r);
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        int v = c->cmsg_level == IPPROTO_IP && c->cmsg_type == IP_TOS ? *(unsigned char *)CMSG_DATA(c) : *(int *)CMSG_DATA(c);
        printf("cmsg level %d type %d value %d\n", c->cmsg_level, c->cmsg_type, v);
    }
}

/* "before" from `c` to `s`, arrived (and on the engine, read into the
 * ring) before the receiver asks for control messages. */
static void in_flight(int c, int s, void *to, socklen_t tolen) {
    CHECK(sendto(c, "before", 6, 0, (struct sockaddr *)to, tolen) == 6);
    CHECK(readable(s, 2000) == 1);
    usleep(20000);
}

/* Sends "cmsg" with a TTL (hop limit) of 3 and a TOS (traffic class) of
 * 0x48 in control messages of `level`. */
static ssize_t send_ttl_tos(int fd, void *to, socklen_t tolen, int level, int ttl_type, int tos_type) {
    char ctl[CMSG_SPACE(sizeof(int)) * 2];
    memset(ctl, 0, sizeof ctl);
    struct iovec iv = { "cmsg", 4 };
    struct msghdr m = { .msg_name = to, .msg_namelen = tolen, .msg_iov = &iv, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
    cm->cmsg_level = level; cm->cmsg_type = ttl_type; cm->cmsg_len = CMSG_LEN(sizeof(int));
    *(int *)CMSG_DATA(cm) = 3;
    cm = CMSG_NXTHDR(&m, cm);
    cm->cmsg_level = level; cm->cmsg_type = tos_type; cm->cmsg_len = CMSG_LEN(sizeof(int));
    *(int *)CMSG_DATA(cm) = 0x48;
    return sendmsg(fd, &m, 0);
}

/* IP_TOS/IP_TTL set on the sender, seen by a receiver that asked for
 * IP_RECVTOS/IP_RECVTTL (the engine keeps every message's TOS and TTL; a
 * sender of per-datagram control messages moves to the kernel path). `early`: the
 * receiver ran on the engine before it asked, and a datagram was already
 * on its way in. */
static void tos_ttl(int early) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca), one = 1;
    char b[8];
    if (early) {
        CHECK(sendto(c, "a", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
        CHECK(recv(s, b, sizeof b, 0) == 1);
    }
    int tos = 0x28, ttl = 9, v = -1; socklen_t l = sizeof v;
    show("IP_TOS", setsockopt(c, IPPROTO_IP, IP_TOS, &tos, sizeof tos));
    show("IP_TTL", setsockopt(c, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl));
    CHECK(getsockopt(c, IPPROTO_IP, IP_TOS, &v, &l) == 0); printf("IP_TOS %#x\n", v);
    l = sizeof v; CHECK(getsockopt(c, IPPROTO_IP, IP_TTL, &v, &l) == 0); printf("IP_TTL %d\n", v);
    if (early) in_flight(c, s, &sa, sizeof sa);
    show("IP_RECVTOS", setsockopt(s, IPPROTO_IP, IP_RECVTOS, &one, sizeof one));
    show("IP_RECVTTL", setsockopt(s, IPPROTO_IP, IP_RECVTTL, &one, sizeof one));
    if (early) print_cmsgs(s);
    CHECK(sendto(c, "opt", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    print_cmsgs(s);
    /* per-datagram values in sendmsg control messages */
    show("sendmsg with IP_TTL and IP_TOS", send_ttl_tos(c, &sa, sizeof sa, IPPROTO_IP, IP_TTL, IP_TOS));
    print_cmsgs(s);
    CHECK(sendto(c, "opt", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    print_cmsgs(s);
    close(s); close(c);
}

static void t_tos_ttl(void) { tos_ttl(0); puts("OK tos_ttl"); }
static void t_tos_ttl_early(void) { tos_ttl(1); puts("OK tos_ttl_early"); }

static void print_v6_opts(int fd) {
    int v = -1; socklen_t l = sizeof v;
    CHECK(getsockopt(fd, IPPROTO_IPV6, IPV6_RECVTCLASS, &v, &l) == 0); printf("IPV6_RECVTCLASS %d\n", v);
    l = sizeof v; CHECK(getsockopt(fd, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &v, &l) == 0); printf("IPV6_RECVHOPLIMIT %d\n", v);
}

/* IPv6: IPV6_TCLASS/IPV6_UNICAST_HOPS set on the sender, seen by a
 * receiver that asked for IPV6_RECVTCLASS/IPV6_RECVHOPLIMIT (the engine
 * keeps every message's traffic class and hop limit), then an IPv4
 * sender's datagram to the same dual-stack socket. `early` as for
 * tos_ttl. */
static void tclass_hlim(int early) {
    struct sockaddr_in6 sa = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT }, ca;
    int s = socket(AF_INET6, SOCK_DGRAM, 0), c = udp6(&ca), one = 1, zero = 0;
    CHECK(s >= 0 && bind(s, (struct sockaddr *)&sa, sizeof sa) == 0);
    socklen_t sl = sizeof sa;
    CHECK(getsockname(s, (struct sockaddr *)&sa, &sl) == 0);
    sa.sin6_addr = in6addr_loopback;
    char b[8];
    if (early) {
        CHECK(sendto(c, "a", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
        CHECK(recv(s, b, sizeof b, 0) == 1);
    }
    print_v6_opts(s);
    int tclass = 0x28, hops = 9, v = -1; socklen_t l = sizeof v;
    show("IPV6_TCLASS", setsockopt(c, IPPROTO_IPV6, IPV6_TCLASS, &tclass, sizeof tclass));
    show("IPV6_UNICAST_HOPS", setsockopt(c, IPPROTO_IPV6, IPV6_UNICAST_HOPS, &hops, sizeof hops));
    CHECK(getsockopt(c, IPPROTO_IPV6, IPV6_TCLASS, &v, &l) == 0); printf("IPV6_TCLASS %#x\n", v);
    if (early) in_flight(c, s, &sa, sizeof sa);
    show("IPV6_RECVTCLASS", setsockopt(s, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof one));
    show("IPV6_RECVHOPLIMIT", setsockopt(s, IPPROTO_IPV6, IPV6_RECVHOPLIMIT, &one, sizeof one));
    print_v6_opts(s);
    if (early) print_cmsgs(s);
    CHECK(sendto(c, "opt", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    print_cmsgs(s);
    /* an IPv4 sender (the socket is bound to the wildcard, dual-stack) */
    struct sockaddr_in fa, to = loop4(sa.sin6_port);
    int f = udp4(&fa), tos = 0x48, ttl = 7;
    CHECK(setsockopt(f, IPPROTO_IP, IP_TOS, &tos, sizeof tos) == 0);
    CHECK(setsockopt(f, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) == 0);
    CHECK(sendto(f, "v4", 2, 0, (struct sockaddr *)&to, sizeof to) == 2);
    print_cmsgs(s);
    /* one option off again */
    show("IPV6_RECVTCLASS off", setsockopt(s, IPPROTO_IPV6, IPV6_RECVTCLASS, &zero, sizeof zero));
    print_v6_opts(s);
    CHECK(sendto(c, "half", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    print_cmsgs(s);
    /* per-datagram values in sendmsg control messages */
    show("sendmsg with IPV6_HOPLIMIT and IPV6_TCLASS", send_ttl_tos(c, &sa, sizeof sa, IPPROTO_IPV6, IPV6_HOPLIMIT, IPV6_TCLASS));
    show("IPV6_RECVTCLASS on", setsockopt(s, IPPROTO_IPV6, IPV6_RECVTCLASS, &one, sizeof one));
    print_cmsgs(s);
    close(s); close(c); close(f);
}

static void t_tclass_hlim(void) { tclass_hlim(0); puts("OK tclass_hlim"); }
static void t_tclass_hlim_early(void) { tclass_hlim(1); puts("OK tclass_hlim_early"); }

/* ------------------------------------------- fallback with a sleeper */

struct sleeper { int fd; char got[16]; ssize_t n; };

static void *sleep_in_recv(void *arg) {
    struct sleeper *z = arg;
    z->n = recv(z->fd, z->got, sizeof z->got - 1, 0);
    return NULL;
}

/* A thread sleeps in a blocking recv on an idle socket while another
 * moves the socket to the kernel path (SO_TIMESTAMP, `how` 0; an
 * EPOLLONESHOT registration, 1): the option call returns at once, as on
 * the kernel, and the sleeper then gets the next datagram, the main thread
 * the ones after it, in order. Ten rounds; the slowest call must stay
 * well under the time a fixed wait for the sleeper would take. */
static void fallback_sleeper(int how) {
    double worst = 0;
    for (int round = 0; round < 10; round++) {
        struct sockaddr_in sa, ca;
        int s = udp4(&sa), c = udp4(&ca), one = 1;
        char b[16];
        CHECK(sendto(c, "warm", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
        CHECK(recv(s, b, sizeof b, 0) == 4);
        struct sleeper z = { .fd = s };
        pthread_t th;
        CHECK(pthread_create(&th, NULL, sleep_in_recv, &z) == 0);
        usleep(30000);
        int ep = -1;
        double t0 = now();
        if (how == 0) {
            CHECK(setsockopt(s, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) == 0);
        } else {
            ep = epoll_create1(0);
            struct epoll_event ev = { .events = EPOLLIN | EPOLLONESHOT, .data.fd = s };
            CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
        }
        double dt = now() - t0;
        if (dt > worst) worst = dt;
        /* The sleeper still sleeps: nothing for anyone else. */
        ssize_t none = recv(s, b, sizeof b, MSG_DONTWAIT);
        if (round == 0) show("while it sleeps", none);
        for (int i = 0; i < 3; i++) {
            char m[8];
            snprintf(m, sizeof m, "d%d", i);
            CHECK(sendto(c, m, strlen(m), 0, (struct sockaddr *)&sa, sizeof sa) == (ssize_t)strlen(m));
        }
        CHECK(pthread_join(th, NULL) == 0);
        CHECK(z.n == 2);
        z.got[z.n] = 0;
        if (round == 0) printf("sleeper got %s\n", z.got);
        for (int i = 1; i < 3; i++) {
            CHECK(readable(s, 2000) == 1);
            ssize_t n = recv(s, b, sizeof b - 1, MSG_DONTWAIT);
            CHECK(n == 2);
            b[n] = 0;
            if (round == 0) printf("then %s\n", b);
        }
        show("then nothing", recv(s, b, sizeof b, MSG_DONTWAIT));
        if (ep >= 0) close(ep);
        close(s); close(c);
    }
    within_ms("slowest fallback call", worst, 0, 0.05);
}

static void t_fallback_sleeper(void) { fallback_sleeper(0); fallback_sleeper(1); puts("OK fallback_sleeper"); }

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *only = argc > 1 ? argv[1] : NULL;
#define RUN(t) if (!only || strcmp(only, #t) == 0) { alarm(20); t_##t(); alarm(0); }
    RUN(sockopts);
    RUN(sndtimeo);
    RUN(reuse);
    RUN(shutdown);
    RUN(shutdown_wakes);
    RUN(pselect);
    RUN(ppoll);
    RUN(epoll_pwait);
    RUN(epoll_oneshot);
    RUN(epoll_exclusive);
    RUN(epoll_dup);
    RUN(sendmmsg_partial);
    RUN(sizes);
    RUN(zero);
    RUN(waitall);
    RUN(refused);
    RUN(errqueue);
    RUN(tos_ttl);
    RUN(tos_ttl_early);
    RUN(tclass_hlim);
    RUN(tclass_hlim_early);
    RUN(fallback_sleeper);
    puts("ALL OK");
    return 0;
}
