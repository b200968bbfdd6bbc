/* select over a UDP socket receiving a stream from another thread, as
 * iperf3's loops run it. Must print the same lines and exit 0 on the kernel
 * and under libeudp_preload.so (either transport).
 *
 *   rw_stream:   the socket in the read and the write set, a pipe in the
 *                read set: select never sleeps (the socket stays writable).
 *   read_stream: the socket and the pipe in the read set only: select
 *                sleeps whenever the receiver has caught up.
 *   high_stream: rw_stream with the socket at descriptor 130 and the pipe
 *                at 70 (sets of more than one 64-bit word), and a bit set
 *                beyond nfds rounded up to a word, which select leaves as
 *                it was.
 *
 * Every select result is exact for the socket: reported readable means a
 * MSG_DONTWAIT receive returns the next datagram, reported writable is what
 * the kernel says (always), the count matches the bits set; every datagram
 * comes out in order; the pipe, written mid-stream, is reported within a
 * bounded number of calls. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

enum { N = 20000, LEN = 1000, WINDOW = 64, BURST = 16 };

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static int udp4(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in b = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    socklen_t l = sizeof *a;
    CHECK(getsockname(fd, (struct sockaddr *)a, &l) == 0);
    return fd;
}

struct stream {
    int c, pipe_w;
    struct sockaddr_in to;
    atomic_int got;       /* datagrams the receiver took */
    atomic_int calls;     /* selects the receiver made */
    atomic_int pipe_at;   /* the receiver's call count just after the pipe was written */
};

/* Bursts of BURST datagrams, never more than WINDOW ahead of the receiver
 * (no loss on the kernel's loopback either); the pipe is written halfway. */
static void *sender(void *arg) {
    struct stream *st = arg;
    char b[LEN];
    memset(b, 'd', sizeof b);
    for (int i = 0; i < N;) {
        while (i - atomic_load(&st->got) > WINDOW - BURST) usleep(20);
        for (int j = 0; j < BURST && i < N; j++, i++) {
            if (i == N / 2) {
                CHECK(write(st->pipe_w, "x", 1) == 1);
                atomic_store(&st->pipe_at, atomic_load(&st->calls));
            }
            memcpy(b, &i, sizeof i);
            CHECK(sendto(st->c, b, sizeof b, 0, (struct sockaddr *)&st->to, sizeof st->to) == sizeof b);
        }
    }
    return NULL;
}

/* `fd` moved to descriptor `to` (which must be free). */
static int move_fd(int fd, int to) {
    CHECK(dup2(fd, to) == to);
    CHECK(close(fd) == 0);
    return to;
}

enum { HIGH_SOCK = 130, HIGH_PIPE = 70, BEYOND = 1000 };

static void run(const char *name, int with_write, int high) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    if (high) {
        s = move_fd(s, HIGH_SOCK);
        pfd[0] = move_fd(pfd[0], HIGH_PIPE);
    }
    struct stream st = { .c = c, .pipe_w = pfd[1], .to = sa };
    atomic_init(&st.got, 0);
    atomic_init(&st.calls, 0);
    atomic_init(&st.pipe_at, -1);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, sender, &st) == 0);
    int n = (s > pfd[0] ? s : pfd[0]) + 1;
    int got = 0, calls = 0, pipe_seen = -1;
    char buf[LEN + 1];
    double end = now() + 20;
    while (got < N && (calls % 1024 || now() < end)) {
        fd_set rs, ws;
        FD_ZERO(&rs); FD_ZERO(&ws);
        FD_SET(s, &rs); FD_SET(pfd[0], &rs);
        if (with_write) FD_SET(s, &ws);
        if (high) FD_SET(BEYOND, &rs);
        struct timeval tv = { .tv_sec = 5, .tv_usec = 0 };
        int k = select(n, &rs, with_write ? &ws : NULL, NULL, &tv);
        atomic_store(&st.calls, ++calls);
        CHECK(k >= 1);
        if (high) CHECK(FD_ISSET(BEYOND, &rs));
        int bits = FD_ISSET(s, &rs) + FD_ISSET(pfd[0], &rs) + (with_write ? FD_ISSET(s, &ws) : 0);
        CHECK(k == bits);
        if (with_write) CHECK(FD_ISSET(s, &ws));
        if (FD_ISSET(pfd[0], &rs)) {
            char x;
            CHECK(pipe_seen < 0 && read(pfd[0], &x, 1) == 1);
            pipe_seen = calls;
        }
        if (FD_ISSET(s, &rs)) {
            ssize_t r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
            CHECK(r == LEN);
            int v;
            memcpy(&v, buf, sizeof v);
            CHECK(v == got);
            atomic_store(&st.got, ++got);
        }
    }
    if (getenv("SELECT_STREAM_DEBUG")) fprintf(stderr, "%s: %d calls, pipe written at call %d, seen at %d\n", name, calls, atomic_load(&st.pipe_at), pipe_seen);
    CHECK(got == N);
    CHECK(pthread_join(t, NULL) == 0);
    /* The kernel reports the pipe at the next call that starts after the
     * write; the shim, answering from what it knows, asks the kernel at
     * least every 1024th call (or per tick of the coarse clock). A call
     * that did not start after the write may have been counted after it;
     * twice the bound leaves room for that (10 000 calls or more follow
     * the write, so a shim that stopped asking would fail here). */
    int at = atomic_load(&st.pipe_at);
    CHECK(pipe_seen > 0 && at >= 0 && pipe_seen - at <= 2 * 1024);
    close(s); close(c); close(pfd[0]); close(pfd[1]);
    printf("OK %s\n", name);
}

int main(int argc, char **argv) {
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "rw_stream")) run("rw_stream", 1, 0);
    if (!only || !strcmp(only, "read_stream")) run("read_stream", 0, 0);
    if (!only || !strcmp(only, "high_stream")) run("high_stream", 1, 1);
    return 0;
}
