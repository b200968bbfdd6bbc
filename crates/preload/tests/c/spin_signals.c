/* spin_signals.c: how signals end poll, select and epoll_wait, run on the
 * kernel and under the shim (with a spin far longer than each wait, the
 * shim's waits spin in user space while the signal comes).
 *
 *   spin_signals kinds      every case below; prints one line per check
 *   spin_signals rounds N   N polls, each ended by a datagram that a second
 *                           thread sends 300 us into it, with a SIGALRM
 *                           handler without SA_RESTART installed (as
 *                           sockperf does); for counting system calls
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
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
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d %s (errno %d)\n", __FILE__, __LINE__, #c, errno); exit(1); } } while (0)

static volatile sig_atomic_t got;
static void on_alarm(int sig) { (void)sig; got++; }

static int udp4(struct sockaddr_in *a) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof *a;
    CHECK(s >= 0 && bind(s, (struct sockaddr *)a, sizeof *a) == 0);
    CHECK(getsockname(s, (struct sockaddr *)a, &l) == 0);
    return s;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void alarm_in_ms(int ms) {
    struct itimerval it = { { 0, 0 }, { 0, ms * 1000 } };
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
}

/* A child process that sends one datagram to `to` after `ms`. */
static pid_t send_later(int c, const struct sockaddr_in *to, int ms) {
    pid_t pid = fork();
    if (pid == 0) { usleep(ms * 1000); sendto(c, "late", 4, 0, (const struct sockaddr *)to, sizeof *to); _exit(0); }
    return pid;
}

/* What a wait returned: "ready" (one descriptor), "EINTR" or "other". */
static const char *verdict(int r) {
    return r == 1 ? "ready" : r < 0 && errno == EINTR ? "EINTR" : "other";
}

/* One wait's line: its verdict, whether the handler ran, whether it ended
 * well before its 3 s; a datagram that ended it is read. */
static void said(const char *what, const char *call, int r, double t0, int s) {
    const char *v = verdict(r);
    char b[8];
    printf("%s %s %s handler %d fast %d\n", what, call, v, (int)got, now_s() - t0 < 1.5);
    if (r == 1) CHECK(recv(s, b, sizeof b, 0) == 4);
}

/* poll, select and epoll_wait of 3 s on a quiet socket, with SIGALRM due
 * in 100 ms. */
static void three_waits(const char *what, int s, int ep) {
    got = 0;
    alarm_in_ms(100);
    double t0 = now_s();
    struct pollfd p = { .fd = s, .events = POLLIN };
    said(what, "poll", poll(&p, 1, 3000), t0, s);
    got = 0;
    alarm_in_ms(100);
    t0 = now_s();
    fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs);
    struct timeval tv = { 3, 0 };
    said(what, "select", select(s + 1, &rs, NULL, NULL, &tv), t0, s);
    got = 0;
    alarm_in_ms(100);
    t0 = now_s();
    struct epoll_event out[2];
    said(what, "epoll_wait", epoll_wait(ep, out, 2, 3000), t0, s);
}

static void kinds(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    /* on the engine (and its ring in use) before the waits */
    CHECK(sendto(s, "self", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    CHECK(recv(s, b, sizeof b, 0) == 4);
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = s };
    CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);

    /* a handler without SA_RESTART, one with it, one from signal(): each
     * ends the three waits with EINTR (the kernel never restarts them) */
    struct sigaction act = { .sa_handler = on_alarm };
    sigemptyset(&act.sa_mask);
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    three_waits("no_restart", s, ep);
    act.sa_flags = SA_RESTART;
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    three_waits("restart", s, ep);
    CHECK(signal(SIGALRM, on_alarm) != SIG_ERR);
    /* signal() reads back as installed, with BSD semantics */
    struct sigaction q;
    CHECK(sigaction(SIGALRM, NULL, &q) == 0 && q.sa_handler == on_alarm && (q.sa_flags & SA_RESTART));
    CHECK(signal(SIGALRM, on_alarm) == on_alarm);
    three_waits("signal_fn", s, ep);

    /* an ignored signal ends nothing: each wait goes on to its datagram */
    CHECK(signal(SIGALRM, SIG_IGN) == on_alarm);
    pid_t pid = send_later(c, &sa, 300);
    alarm_in_ms(100);
    struct pollfd p = { .fd = s, .events = POLLIN };
    int r = poll(&p, 1, 3000);
    printf("ignored poll %s\n", verdict(r));
    CHECK(r != 1 || recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);
    pid = send_later(c, &sa, 300);
    alarm_in_ms(100);
    struct epoll_event out[2];
    r = epoll_wait(ep, out, 2, 3000);
    printf("ignored epoll_wait %s\n", verdict(r));
    CHECK(r != 1 || recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);

    /* ppoll and epoll_pwait with a mask that blocks SIGALRM: not ended by
     * it; the handler runs once the call has put the thread's mask back */
    act.sa_flags = 0;
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    sigset_t block; sigemptyset(&block); sigaddset(&block, SIGALRM);
    got = 0;
    pid = send_later(c, &sa, 300);
    alarm_in_ms(100);
    struct timespec ts = { 3, 0 };
    r = ppoll(&p, 1, &ts, &block);
    printf("masked ppoll %s handler %d\n", verdict(r), (int)got);
    CHECK(r != 1 || recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);
    got = 0;
    pid = send_later(c, &sa, 300);
    alarm_in_ms(100);
    r = epoll_pwait(ep, out, 2, 3000, &block);
    printf("masked epoll_pwait %s handler %d\n", verdict(r), (int)got);
    CHECK(r != 1 || recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);

    /* the thread blocks SIGALRM; ppoll's mask lets it in: EINTR */
    sigset_t old;
    CHECK(pthread_sigmask(SIG_BLOCK, &block, &old) == 0);
    sigset_t none; sigemptyset(&none);
    got = 0;
    alarm_in_ms(100);
    r = ppoll(&p, 1, &ts, &none);
    printf("unmasked ppoll %s handler %d\n", verdict(r), (int)got);
    /* and a plain poll of that thread is not ended by the (blocked) signal */
    pid = send_later(c, &sa, 300);
    got = 0;
    alarm_in_ms(100);
    r = poll(&p, 1, 3000);
    printf("blocked poll %s handler %d\n", verdict(r), (int)got);
    CHECK(r != 1 || recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);
    CHECK(pthread_sigmask(SIG_SETMASK, &old, NULL) == 0);
    printf("pending after unblock %d\n", (int)got);

    signal(SIGALRM, SIG_DFL);
    close(ep); close(s); close(c);
    puts("OK kinds");
}

struct peer { int c; struct sockaddr_in to; int n; };

static void *sender(void *arg) {
    struct peer *p = arg;
    for (int i = 0; i < p->n; i++) {
        usleep(300);
        CHECK(sendto(p->c, "x", 1, 0, (struct sockaddr *)&p->to, sizeof p->to) == 1);
        /* the next datagram only once the poller took this one */
        while (__atomic_load_n(&got, __ATOMIC_SEQ_CST) == 0) usleep(50);
        __atomic_store_n(&got, 0, __ATOMIC_SEQ_CST);
    }
    return NULL;
}

static void rounds(int n) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[8];
    CHECK(sendto(s, "self", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    CHECK(recv(s, b, sizeof b, 0) == 4);
    struct sigaction act = { .sa_handler = on_alarm };
    sigemptyset(&act.sa_mask);
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    struct peer pe = { .c = c, .to = sa, .n = n };
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sender, &pe) == 0);
    int ready = 0;
    for (int i = 0; i < n; i++) {
        struct pollfd p = { .fd = s, .events = POLLIN };
        int r = poll(&p, 1, 3000);
        CHECK(r == 1 && recv(s, b, sizeof b, 0) == 1);
        ready += r;
        __atomic_store_n(&got, 1, __ATOMIC_SEQ_CST);
    }
    pthread_join(t, NULL);
    printf("rounds %d ready %d\n", n, ready);
    close(s); close(c);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && strcmp(argv[1], "kinds") == 0) kinds();
    else if (argc > 2 && strcmp(argv[1], "rounds") == 0) rounds(atoi(argv[2]));
    else { fprintf(stderr, "usage: spin_signals kinds | rounds N\n"); return 2; }
    return 0;
}
