/* Datagrams queued for a socket when it leaves the engine, and vfork.
 *
 * Each case queues a burst of distinct datagrams for an accelerated
 * receiver, then moves it to the kernel path (or vforks), then receives
 * every datagram and checks it whole and in order, readiness included.
 * The burst is sent by a kernel socket with UDP_SEGMENT (GSO): runs of
 * equal-sized datagrams, each run's last one shorter, which a receiver
 * with UDP_GRO on gets as one coalesced message. The first half is sent
 * a while before the second, so some sit in the engine's ring and some
 * in the kernel's queue (see queue_burst).
 *
 * usage: fallback_paths CASE    (cases: shutdown fork epoll vfork_cloexec
 *                                vfork_inherit atexit)
 * Prints "OK CASE" on success; anything else is a failure (exit 1).
 * The process id goes to stderr as "pid N" (for the test's stats). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef SOL_UDP
#define SOL_UDP 17
#endif

#define RUNS 30
#define PER_RUN 10
#define N (RUNS * PER_RUN)

static const char *cas = "?";

#define CHECK(c, ...)                                                        \
    do {                                                                     \
        if (!(c)) {                                                          \
            printf("FAIL %s line %d: ", cas, __LINE__);                      \
            printf(__VA_ARGS__);                                             \
            printf(" (errno %d)\n", errno);                                  \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static size_t run_size(int r) { return 40 + (size_t)((r * 131) % 1100); }

static size_t dgram_len(int i) {
    size_t s = run_size(i / PER_RUN);
    return i % PER_RUN == PER_RUN - 1 ? s / 2 : s;
}

static void fill(unsigned char *p, int i) {
    size_t n = dgram_len(i);
    memcpy(p, &i, 4);
    for (size_t j = 4; j < n; j++)
        p[j] = (unsigned char)(i * 31 + j);
}

static void check(const unsigned char *p, ssize_t n, int i) {
    CHECK(n == (ssize_t)dgram_len(i), "datagram %d: %zd bytes, want %zu", i, n, dgram_len(i));
    int got;
    memcpy(&got, p, 4);
    CHECK(got == i, "datagram %d: got %d (order or boundary lost)", i, got);
    for (ssize_t j = 4; j < n; j++)
        CHECK(p[j] == (unsigned char)(i * 31 + j), "datagram %d: byte %zd", i, j);
}

static int udp(int cloexec) {
    int s = socket(AF_INET, SOCK_DGRAM | (cloexec ? SOCK_CLOEXEC : 0), 0);
    CHECK(s >= 0, "socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    CHECK(bind(s, (struct sockaddr *)&a, sizeof a) == 0, "bind");
    return s;
}

static struct sockaddr_in addr_of(int s) {
    struct sockaddr_in a;
    socklen_t l = sizeof a;
    CHECK(getsockname(s, (struct sockaddr *)&a, &l) == 0, "getsockname");
    return a;
}

/* Runs first..last (exclusive) from the GSO socket g, one send per run. */
static void send_runs(int g, struct sockaddr_in *to, int first, int last) {
    static unsigned char buf[PER_RUN * 2048];
    for (int r = first; r < last; r++) {
        size_t seg = run_size(r), off = 0;
        for (int k = 0; k < PER_RUN; k++) {
            fill(buf + off, r * PER_RUN + k);
            off += dgram_len(r * PER_RUN + k);
        }
        CHECK(setsockopt(g, SOL_UDP, UDP_SEGMENT, &(int){(int)seg}, sizeof(int)) == 0, "UDP_SEGMENT");
        CHECK(sendto(g, buf, off, 0, (struct sockaddr *)to, sizeof *to) == (ssize_t)off, "sendto run %d", r);
    }
}

static void ms(int n) { nanosleep(&(struct timespec){n / 1000, (n % 1000) * 1000000L}, NULL); }

/* The receiver b on the engine (a first receive), then the burst: the
 * first half in the engine's ring, the second in the kernel's queue. */
static void queue_burst(int b, int g, int a) {
    struct sockaddr_in bb = addr_of(b);
    CHECK(setsockopt(b, SOL_SOCKET, SO_RCVBUF, &(int){1 << 20}, sizeof(int)) == 0, "SO_RCVBUF");
    char c[8];
    CHECK(sendto(a, "ping", 4, 0, (struct sockaddr *)&bb, sizeof bb) == 4, "ping");
    CHECK(recv(b, c, sizeof c, 0) == 4, "ping back");
    send_runs(g, &bb, 0, RUNS / 2);
    ms(50); /* the engine takes these into the ring */
    /* A receive call: the engine leaves b's socket to this thread for a
     * while, so the second half stays in the kernel's queue (a loopback
     * send is queued at the receiver when sendto returns). */
    CHECK(recv(b, c, sizeof c, MSG_PEEK | MSG_DONTWAIT) == sizeof c, "peek");
    send_runs(g, &bb, RUNS / 2, RUNS);
}

/* Every datagram back, whole and in order, through every receive call;
 * each announced by poll (or epoll when ep >= 0) first. */
static void receive_all(int b, int ep) {
    static unsigned char buf[4096], buf2[4096];
    int i = 0;
    while (i < N) {
        if (ep >= 0) {
            struct epoll_event ev;
            CHECK(epoll_wait(ep, &ev, 1, 2000) == 1, "epoll_wait before datagram %d", i);
        } else {
            struct pollfd p = {.fd = b, .events = POLLIN};
            CHECK(poll(&p, 1, 2000) == 1 && (p.revents & POLLIN), "poll before datagram %d", i);
        }
        ssize_t n;
        int way = i % 7;
        if (way == 0) {
            int q = -1;
            CHECK(ioctl(b, FIONREAD, &q) == 0 && q == (int)dgram_len(i), "FIONREAD %d before datagram %d", q, i);
            n = recv(b, buf, sizeof buf, MSG_DONTWAIT);
        } else if (way == 1) {
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            n = recvfrom(b, buf, sizeof buf, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
            CHECK(n < 0 || (fl == sizeof from && from.sin_port != 0), "source of datagram %d", i);
        } else if (way == 2) {
            n = read(b, buf, sizeof buf);
        } else if (way == 3) {
            struct iovec v[2] = {{buf, 7}, {buf + 7, sizeof buf - 7}};
            n = readv(b, v, 2);
        } else if (way == 4) {
            n = recv(b, buf2, sizeof buf2, MSG_PEEK | MSG_DONTWAIT);
            check(buf2, n, i);
            struct iovec v = {buf, sizeof buf};
            struct msghdr m = {.msg_iov = &v, .msg_iovlen = 1};
            n = recvmsg(b, &m, MSG_DONTWAIT);
            CHECK(!(m.msg_flags & MSG_TRUNC), "MSG_TRUNC on datagram %d", i);
        } else if (way == 5) {
            n = recv(b, buf, 4, MSG_DONTWAIT | MSG_TRUNC);
            CHECK(n == (ssize_t)dgram_len(i), "MSG_TRUNC length %zd of datagram %d", n, i);
            i++;
            continue;
        } else {
            enum { V = 3 };
            static unsigned char bufs[V][2048];
            struct iovec v[V];
            struct mmsghdr mm[V];
            memset(mm, 0, sizeof mm);
            for (int k = 0; k < V; k++) {
                v[k] = (struct iovec){bufs[k], sizeof bufs[k]};
                mm[k].msg_hdr.msg_iov = &v[k];
                mm[k].msg_hdr.msg_iovlen = 1;
            }
            int got = recvmmsg(b, mm, N - i < V ? N - i : V, MSG_DONTWAIT, NULL);
            CHECK(got >= 1, "recvmmsg at datagram %d", i);
            for (int k = 0; k < got; k++)
                check(bufs[k], mm[k].msg_len, i + k);
            i += got;
            continue;
        }
        CHECK(n >= 0, "receive of datagram %d", i);
        check(buf, n, i);
        i++;
    }
    struct pollfd p = {.fd = b, .events = POLLIN};
    CHECK(poll(&p, 1, 0) == 0, "readable after the last datagram");
    if (ep >= 0) {
        struct epoll_event ev;
        CHECK(epoll_wait(ep, &ev, 1, 0) == 0, "epoll reports after the last datagram");
    }
}

/* The receiver still works afterwards: a datagram from the accelerated a. */
static void still_works(int a, int b) {
    struct sockaddr_in bb = addr_of(b);
    char c[8];
    CHECK(sendto(a, "last", 4, 0, (struct sockaddr *)&bb, sizeof bb) == 4, "last");
    struct pollfd p = {.fd = b, .events = POLLIN};
    CHECK(poll(&p, 1, 2000) == 1, "poll for the last datagram");
    CHECK(recv(b, c, sizeof c, 0) == 4 && memcmp(c, "last", 4) == 0, "last datagram");
}

static void vfork_exec(int b) {
    pid_t pid = vfork();
    CHECK(pid >= 0, "vfork");
    if (pid == 0) {
        close(b);
        closefrom(3);
        execl("/bin/true", "true", (char *)NULL);
        _exit(127);
    }
    int st;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
}

/* A fallback with datagrams queued, run by an exit handler: after this
 * thread's locals are destroyed (glibc runs their destructors first). */
static int exit_fd = -1;
static void shutdown_at_exit(void) { shutdown(exit_fd, SHUT_WR); }

int main(int argc, char **argv) {
    if (argc != 2)
        return 2;
    cas = argv[1];
    fprintf(stderr, "pid %d\n", (int)getpid());
    int cloexec = strcmp(cas, "vfork_cloexec") == 0;
    int a = udp(cloexec), b = udp(cloexec), g = udp(cloexec);
    int ep = -1;
    if (strcmp(cas, "epoll") == 0) {
        /* Registered while b is on the engine. */
        char c[8];
        struct sockaddr_in bb = addr_of(b);
        CHECK(sendto(a, "warm", 4, 0, (struct sockaddr *)&bb, sizeof bb) == 4, "warm");
        CHECK(recv(b, c, sizeof c, 0) == 4, "warm back");
        ep = epoll_create1(EPOLL_CLOEXEC);
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = b};
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, b, &ev) == 0, "epoll_ctl");
    }
    queue_burst(b, g, a);
    if (strcmp(cas, "shutdown") == 0 || strcmp(cas, "epoll") == 0) {
        shutdown(b, SHUT_WR); /* ENOTCONN on an unconnected socket; receiving goes on */
    } else if (strcmp(cas, "fork") == 0) {
        pid_t pid = fork();
        CHECK(pid >= 0, "fork");
        if (pid == 0)
            _exit(0);
        int st;
        CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
    } else if (strcmp(cas, "atexit") == 0) {
        exit_fd = b;
        atexit(shutdown_at_exit);
        printf("OK %s\n", cas);
        return 0;
    } else if (strcmp(cas, "vfork_cloexec") == 0 || strcmp(cas, "vfork_inherit") == 0) {
        vfork_exec(b);
    } else {
        printf("unknown case %s\n", cas);
        return 2;
    }
    receive_all(b, ep);
    still_works(a, b);
    printf("OK %s\n", cas);
    return 0;
}
