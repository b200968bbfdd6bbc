/* rr_paths: request/response paths of the shim, each printing what a
 * kernel socket gives (the test compares with the kernel run and reads
 * the shim's counters).
 *
 *   eagain N        a nonblocking socket read N times while empty (EAGAIN
 *                   each time), then one datagram read.
 *   turns N         N rounds on socket x: send A to y, y answers, x reads
 *                   the answer, send B to y; y reads A and B in order.
 *   fallback_burst N  x sends N datagrams back to back, then SO_TIMESTAMP
 *                   (moves it to the kernel path), then y reads all N.
 *   epoll_turns N   an echo thread waiting in epoll (level-triggered,
 *                   nonblocking, reads until EAGAIN) answers N requests of
 *                   a client on another socket, each answer checked.
 *   epoll_sparse N  the same with 3 ms between requests, the client also
 *                   waiting in an epoll set.
 *   burst_recv N    x sends N datagrams back to back to a thread that
 *   burst_poll N    answers once it has all N; x then waits for the answer
 *   burst_select N  in a blocking recv, poll, select or epoll_wait. Fails
 *   burst_epoll N   when the answer took 1 s or more (the test sets the
 *                   shim's coalescing interval far longer: the last
 *                   datagrams of the burst must leave when x's thread
 *                   goes to sleep, not when the interval ends).
 *   burst_sleep_usleep N, burst_sleep_nanosleep N,
 *   burst_sleep_clock_nanosleep N
 *                   the same, x sleeping 50 ms at a time in that call and
 *                   looking for the answer without waiting in between. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <poll.h>
#include <time.h>
#include <unistd.h>

#include "udp_echo.h"

static void must_recv(int fd, const char *want) {
    char b[256];
    ssize_t n = recv(fd, b, sizeof b - 1, 0);
    if (n < 0) {
        perror("recv");
        exit(1);
    }
    b[n] = 0;
    if (strcmp(b, want)) {
        printf("got \"%s\", expected \"%s\"\n", b, want);
        exit(1);
    }
}

static struct sockaddr_in srv;
static int srv_fd;
/* Set by the echo thread once its socket is in its epoll set: a request
 * sent before then may be read by the engine, which is not what the
 * epoll cases test. */
static atomic_int registered;

static void *echo(void *arg) {
    (void)arg;
    int ep = epoll_create1(0);
    struct epoll_event e = {.events = EPOLLIN, .data.fd = srv_fd};
    epoll_ctl(ep, EPOLL_CTL_ADD, srv_fd, &e);
    atomic_store(&registered, 1);
    for (;;) {
        if (epoll_wait(ep, &e, 1, 5000) != 1) {
            printf("echo: no request within 5 s\n");
            exit(1);
        }
        if (echo_drain(srv_fd))
            return NULL;
    }
}

static int burst_n;
static int burst_y;
static struct sockaddr_in burst_x;

/* Receives the whole burst in order, then answers x once. */
static void *burst_peer(void *arg) {
    (void)arg;
    char want[32];
    for (int i = 0; i < burst_n; i++) {
        snprintf(want, sizeof want, "b%d", i);
        must_recv(burst_y, want);
    }
    sendto(burst_y, "all", 3, 0, (struct sockaddr *)&burst_x, sizeof burst_x);
    return NULL;
}

static double mono(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int burst(const char *how, int n) {
    struct sockaddr_in ya;
    char b[256];
    int x = bound(&burst_x);
    burst_y = bound(&ya);
    burst_n = n;
    int big = 4 << 20;
    setsockopt(burst_y, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    pthread_t t;
    pthread_create(&t, NULL, burst_peer, NULL);
    for (int i = 0; i < n; i++) {
        snprintf(b, sizeof b, "b%d", i);
        sendto(x, b, strlen(b), 0, (struct sockaddr *)&ya, sizeof ya);
    }
    double start = mono();
    int ready = 1;
    if (!strncmp(how, "sleep_", 6)) {
        /* x sleeps 50 ms at a time and looks without waiting in between:
         * only the sleep itself can have sent the burst's remainder. */
        for (int k = 0; k < 40; k++) {
            if (!strcmp(how, "sleep_usleep")) {
                usleep(50000);
            } else {
                struct timespec ts = {.tv_nsec = 50000000};
                if (!strcmp(how, "sleep_nanosleep"))
                    nanosleep(&ts, NULL);
                else
                    clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL);
            }
            ssize_t r = recv(x, b, sizeof b - 1, MSG_DONTWAIT);
            if (r == 3 && !memcmp(b, "all", 3))
                break;
            if (r >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                printf("burst_%s: unexpected receive %zd\n", how, r);
                return 1;
            }
            if (k == 39) {
                printf("burst_%s: no answer within 2 s\n", how);
                return 1;
            }
        }
    } else if (!strcmp(how, "poll")) {
        struct pollfd p = {.fd = x, .events = POLLIN};
        ready = poll(&p, 1, 10000);
    } else if (!strcmp(how, "select")) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(x, &r);
        struct timeval tv = {.tv_sec = 10};
        ready = select(x + 1, &r, NULL, NULL, &tv);
    } else if (!strcmp(how, "epoll")) {
        int ep = epoll_create1(0);
        struct epoll_event e = {.events = EPOLLIN, .data.fd = x};
        epoll_ctl(ep, EPOLL_CTL_ADD, x, &e);
        ready = epoll_wait(ep, &e, 1, 10000);
        close(ep);
    }
    if (ready != 1) {
        printf("burst_%s: no answer within 10 s\n", how);
        return 1;
    }
    if (strncmp(how, "sleep_", 6))
        must_recv(x, "all");
    double waited = mono() - start;
    pthread_join(t, NULL);
    if (waited >= 1.0) {
        printf("burst_%s: the answer took %.3f s\n", how, waited);
        return 1;
    }
    printf("burst_%s %d answered\n", how, n);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int n = atoi(argv[2]);
    struct sockaddr_in xa, ya;
    char b[256];
    if (!strcmp(argv[1], "eagain")) {
        int x = bound(&xa), y = bound(&ya);
        fcntl(x, F_SETFL, O_NONBLOCK);
        int again = 0;
        for (int i = 0; i < n; i++)
            if (recv(x, b, sizeof b, 0) < 0 && errno == EAGAIN)
                again++;
        sendto(y, "one", 3, 0, (struct sockaddr *)&xa, sizeof xa);
        ssize_t got;
        while ((got = recv(x, b, sizeof b, 0)) < 0 && errno == EAGAIN)
            ;
        printf("eagain %d of %d, then %zd bytes\n", again, n, got);
    } else if (!strcmp(argv[1], "turns")) {
        int x = bound(&xa), y = bound(&ya);
        connect(x, (struct sockaddr *)&ya, sizeof ya);
        connect(y, (struct sockaddr *)&xa, sizeof xa);
        for (int i = 0; i < n; i++) {
            char a[32], r[32], c[32];
            snprintf(a, sizeof a, "A%d", i);
            snprintf(r, sizeof r, "R%d", i);
            snprintf(c, sizeof c, "B%d", i);
            send(x, a, strlen(a), 0);
            must_recv(y, a);
            send(y, r, strlen(r), 0);
            must_recv(x, r);
            send(x, c, strlen(c), 0);
            must_recv(y, c);
        }
        printf("turns %d in order\n", n);
    } else if (!strcmp(argv[1], "fallback_burst")) {
        int x = bound(&xa), y = bound(&ya);
        int big = 4 << 20;
        setsockopt(y, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        for (int i = 0; i < n; i++) {
            snprintf(b, sizeof b, "d%d", i);
            sendto(x, b, strlen(b), 0, (struct sockaddr *)&ya, sizeof ya);
        }
        int on = 1;
        setsockopt(x, SOL_SOCKET, SO_TIMESTAMP, &on, sizeof on);
        for (int i = 0; i < n; i++) {
            snprintf(b, sizeof b, "d%d", i);
            must_recv(y, b);
        }
        printf("fallback_burst %d received in order\n", n);
    } else if (!strcmp(argv[1], "epoll_turns") || !strcmp(argv[1], "epoll_sparse")) {
        int gap = !strcmp(argv[1], "epoll_sparse") ? 3000 : 0;
        srv_fd = bound(&srv);
        fcntl(srv_fd, F_SETFL, O_NONBLOCK);
        pthread_t t;
        pthread_create(&t, NULL, echo, NULL);
        int c = bound(&xa);
        connect(c, (struct sockaddr *)&srv, sizeof srv);
        int cep = epoll_create1(0);
        struct epoll_event ce = {.events = EPOLLIN, .data.fd = c};
        if (gap)
            epoll_ctl(cep, EPOLL_CTL_ADD, c, &ce);
        for (int w = 0; w < 10000 && !atomic_load(&registered); w++)
            usleep(100);
        for (int i = 0; i < n; i++) {
            if (gap)
                usleep(gap);
            snprintf(b, sizeof b, "q%d", i);
            send(c, b, strlen(b), 0);
            if (gap && epoll_wait(cep, &ce, 1, 5000) != 1) {
                printf("client: no answer within 5 s\n");
                exit(1);
            }
            must_recv(c, b);
        }
        send(c, "QUIT", 4, 0);
        pthread_join(t, NULL);
        printf("%s %d answered\n", argv[1], n);
    } else if (!strncmp(argv[1], "burst_", 6)) {
        return burst(argv[1] + 6, n);
    } else {
        return 2;
    }
    return 0;
}
