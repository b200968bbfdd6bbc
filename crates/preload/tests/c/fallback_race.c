/* A socket moved to the kernel path while threads are blocked receiving
 * on it, and epoll's view of ICMP errors. Each case prints the same lines
 * on the kernel and under the shim (driver: tests/fallback_race.rs).
 *
 *   race       three threads blocked in recv, recvmsg and recvmmsg on one
 *              socket; the main thread sends a few datagrams, moves the
 *              socket to the kernel path (fork, shutdown, an option the
 *              engine does not serve, EPOLLONESHOT) and sends a burst:
 *              every datagram must be received exactly once, whole, and
 *              each thread must see them in sending order. 20 rounds.
 *   reenter    a receive that begins on the engine while the main thread
 *              moves the socket to the kernel path (shutdown,
 *              SO_TIMESTAMP) after sending datagrams to it: the receive
 *              must wait for the hand-over and take what it kept first,
 *              never read the kernel socket around it. The driver widens
 *              that window with EUDP_TEST_RACE_PAUSE_US. 12 rounds of 96;
 *              every datagram once, whole, in order.
 *   sendrace   one thread sends numbered datagrams without pause (queued
 *              and batched on the engine) while the main thread moves
 *              its socket to the kernel path (SO_TIMESTAMP): the
 *              receiver must see them in sending order, i.e. a send on
 *              the kernel path waits for the fallback's flush of what
 *              the engine still queued. 60 rounds of 5 ms.
 *   epoll_err  a connected socket whose peer port is closed: epoll (level
 *              and edge triggered) reports EPOLLERR, the next send or
 *              receive fails with ECONNREFUSED, and then nothing is
 *              reported. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(x) do { if (!(x)) { printf("FAIL %s:%d %s (%s)\n", __FILE__, __LINE__, #x, strerror(errno)); fflush(stdout); _exit(1); } } while (0)

static int udp4(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(bind(fd, (struct sockaddr *)a, sizeof *a) == 0);
    socklen_t l = sizeof *a;
    CHECK(getsockname(fd, (struct sockaddr *)a, &l) == 0);
    return fd;
}

/* ------------------------------------------------------------- race */

#define N 200     /* numbered datagrams per round */
#define EARLY 8   /* of them sent before the fallback */
#define LEN 64
#define THREADS 3
#define ROUNDS 20

static int sock;
static atomic_int received, done_threads;
static atomic_int count[N];
static int bad[THREADS], disorder[THREADS];

static void fill(char *b, int n) {
    snprintf(b, LEN, "%08d", n);
    for (int i = 8; i < LEN; i++) b[i] = (char)('a' + (n * 7 + i) % 26);
}

/* Counts one received datagram; returns 1 for the end marker. */
static int take(int who, const char *b, ssize_t len, int *last) {
    if (len == 3 && memcmp(b, "END", 3) == 0) return 1;
    char want[LEN];
    int n = atoi(b);
    if (len != LEN || n < 0 || n >= N) { bad[who]++; return 0; }
    fill(want, n);
    if (memcmp(b, want, LEN) != 0) { bad[who]++; return 0; }
    if (n <= *last) disorder[who]++;
    *last = n;
    atomic_fetch_add(&count[n], 1);
    atomic_fetch_add(&received, 1);
    return 0;
}

static void *receiver(void *arg) {
    int who = (int)(long)arg, last = -1, end = 0;
    while (!end) {
        char b[4][LEN + 16];
        if (who == 0) {
            ssize_t r = recv(sock, b[0], sizeof b[0], 0);
            if (r < 0) { if (errno == EINTR) continue; break; }
            end = take(who, b[0], r, &last);
        } else if (who == 1) {
            struct iovec iv = { b[0], sizeof b[0] };
            struct msghdr m = { .msg_iov = &iv, .msg_iovlen = 1 };
            ssize_t r = recvmsg(sock, &m, 0);
            if (r < 0) { if (errno == EINTR) continue; break; }
            end = take(who, b[0], r, &last);
        } else {
            struct mmsghdr mm[4];
            struct iovec iv[4];
            memset(mm, 0, sizeof mm);
            for (int i = 0; i < 4; i++) {
                iv[i].iov_base = b[i]; iv[i].iov_len = sizeof b[i];
                mm[i].msg_hdr.msg_iov = &iv[i]; mm[i].msg_hdr.msg_iovlen = 1;
            }
            int r = recvmmsg(sock, mm, 4, MSG_WAITFORONE, NULL);
            if (r < 0) { if (errno == EINTR) continue; break; }
            for (int i = 0; i < r; i++) end |= take(who, b[i], mm[i].msg_len, &last);
        }
    }
    atomic_fetch_add(&done_threads, 1);
    return NULL;
}

static const char *trigger(int round, int c) {
    switch (round % 4) {
    case 0: {
        pid_t p = fork();
        CHECK(p >= 0);
        if (p == 0) _exit(0);
        CHECK(waitpid(p, NULL, 0) == p);
        return "fork";
    }
    case 1:
        /* An unconnected socket: ENOTCONN, but the socket is shut down
         * for sending all the same (receiving is unaffected). */
        CHECK(shutdown(sock, SHUT_WR) == -1 && errno == ENOTCONN);
        return "shutdown";
    case 2: {
        int one = 1;
        CHECK(setsockopt(sock, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) == 0);
        return "SO_TIMESTAMP";
    }
    default: {
        int ep = epoll_create1(0);
        struct epoll_event e = { .events = EPOLLIN | EPOLLONESHOT };
        CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, sock, &e) == 0);
        close(ep);
        (void)c;
        return "EPOLLONESHOT";
    }
    }
}

static void t_race(void) {
    for (int round = 0; round < ROUNDS; round++) {
        struct sockaddr_in sa, ca;
        sock = udp4(&sa);
        int c = udp4(&ca), big = 1 << 20;
        CHECK(setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &big, sizeof big) == 0);
        char b[LEN + 16];
        /* On the engine before the threads block. */
        CHECK(sendto(c, "w", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
        CHECK(recv(sock, b, sizeof b, 0) == 1);
        atomic_store(&received, 0);
        atomic_store(&done_threads, 0);
        for (int i = 0; i < N; i++) atomic_store(&count[i], 0);
        memset(bad, 0, sizeof bad);
        memset(disorder, 0, sizeof disorder);
        pthread_t th[THREADS];
        for (long i = 0; i < THREADS; i++) CHECK(pthread_create(&th[i], NULL, receiver, (void *)i) == 0);
        usleep(20000); /* all three blocked */
        int n = 0;
        for (; n < EARLY; n++) { fill(b, n); CHECK(sendto(c, b, LEN, 0, (struct sockaddr *)&sa, sizeof sa) == LEN); }
        const char *why = trigger(round, c);
        for (; n < N; n++) { fill(b, n); CHECK(sendto(c, b, LEN, 0, (struct sockaddr *)&sa, sizeof sa) == LEN); }
        for (int i = 0; i < 2000 && atomic_load(&received) < N; i++) usleep(1000);
        /* One end marker per thread still receiving (bounded). */
        for (int i = 0; i < 2000 && atomic_load(&done_threads) < THREADS; i++) {
            CHECK(sendto(c, "END", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
            usleep(1000);
        }
        if (atomic_load(&done_threads) < THREADS) {
            printf("round %d (%s): a receiver never returned\n", round, why);
            fflush(stdout);
            _exit(1);
        }
        for (int i = 0; i < THREADS; i++) pthread_join(th[i], NULL);
        int missing = 0, dup = 0, nbad = 0, nord = 0;
        for (int i = 0; i < N; i++) {
            int k = atomic_load(&count[i]);
            missing += k == 0;
            dup += k > 1;
        }
        for (int i = 0; i < THREADS; i++) { nbad += bad[i]; nord += disorder[i]; }
        printf("round %d (%s): %d missing, %d twice, %d damaged, %d out of order\n", round, why, missing, dup, nbad, nord);
        close(sock); close(c);
    }
    puts("OK race");
}

/* ---------------------------------------------------------- reenter */

#define RE_ROUNDS 12
#define RE_N 96

static atomic_int re_done;
static int re_got[RE_N], re_bad, re_dis;

static void *re_receiver(void *arg) {
    (void)arg;
    int last = -1;
    for (;;) {
        char b[LEN + 16];
        ssize_t r = recv(sock, b, sizeof b, 0);
        if (r < 0) { if (errno == EINTR) continue; break; }
        if (r == 3 && memcmp(b, "END", 3) == 0) break;
        char want[LEN];
        int n = atoi(b);
        if (r != LEN || n < 0 || n >= RE_N) { re_bad++; continue; }
        fill(want, n);
        if (memcmp(b, want, LEN) != 0) { re_bad++; continue; }
        if (n <= last) re_dis++;
        last = n;
        re_got[n]++;
    }
    atomic_store(&re_done, 1);
    return NULL;
}

static void t_reenter(void) {
    int missing = 0, dup = 0, bad = 0, dis = 0;
    for (int round = 0; round < RE_ROUNDS; round++) {
        struct sockaddr_in sa, ca;
        sock = udp4(&sa);
        int c = udp4(&ca), big = 1 << 20, one = 1;
        CHECK(setsockopt(sock, SOL_SOCKET, SO_RCVBUF, &big, sizeof big) == 0);
        char b[LEN + 16];
        CHECK(sendto(c, "w", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
        CHECK(recv(sock, b, sizeof b, 0) == 1);
        memset(re_got, 0, sizeof re_got);
        re_bad = re_dis = 0;
        atomic_store(&re_done, 0);
        pthread_t th;
        CHECK(pthread_create(&th, NULL, re_receiver, NULL) == 0);
        usleep(5000); /* its receive has begun (under the test's pause, not yet asleep) */
        int n = 0, early = 8 + round * 4;
        for (; n < early; n++) { fill(b, n); CHECK(sendto(c, b, LEN, 0, (struct sockaddr *)&sa, sizeof sa) == LEN); }
        usleep(2000); /* they are in the socket or the ring */
        if (round % 2)
            CHECK(setsockopt(sock, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) == 0);
        else
            CHECK(shutdown(sock, SHUT_WR) == -1 && errno == ENOTCONN);
        for (; n < RE_N; n++) { fill(b, n); CHECK(sendto(c, b, LEN, 0, (struct sockaddr *)&sa, sizeof sa) == LEN); }
        for (int i = 0; i < 2000 && !atomic_load(&re_done); i++) {
            CHECK(sendto(c, "END", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
            usleep(1000);
        }
        if (!atomic_load(&re_done)) {
            printf("reenter round %d: the receiver never returned\n", round);
            fflush(stdout);
            _exit(1);
        }
        pthread_join(th, NULL);
        for (int i = 0; i < RE_N; i++) { missing += re_got[i] == 0; dup += re_got[i] > 1; }
        bad += re_bad;
        dis += re_dis;
        close(sock); close(c);
    }
    printf("reenter: %d rounds: %d missing, %d twice, %d damaged, %d out of order\n", RE_ROUNDS, missing, dup, bad, dis);
    puts("OK reenter");
}

/* --------------------------------------------------------- sendrace */

#define SR_ROUNDS 60

static int sr_sock;
static struct sockaddr_in sr_dst;
static atomic_int sr_stop;

static void *sr_sender(void *arg) {
    (void)arg;
    unsigned n = 0;
    char b[LEN];
    memset(b, 'x', sizeof b);
    while (!atomic_load(&sr_stop)) {
        memcpy(b, &n, sizeof n);
        if (sendto(sr_sock, b, LEN, 0, (struct sockaddr *)&sr_dst, sizeof sr_dst) == LEN)
            n++;
        else
            CHECK(errno == EAGAIN || errno == ENOBUFS);
    }
    return NULL;
}

static void t_sendrace(void) {
    int disorder = 0, got = 0;
    for (int round = 0; round < SR_ROUNDS; round++) {
        int r = udp4(&sr_dst), big = 8 << 20, one = 1;
        setsockopt(r, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof big);
        sr_sock = socket(AF_INET, SOCK_DGRAM, 0);
        CHECK(sr_sock >= 0);
        atomic_store(&sr_stop, 0);
        pthread_t th;
        CHECK(pthread_create(&th, NULL, sr_sender, NULL) == 0);
        usleep(3000);
        /* The sending socket moves to the kernel path mid-stream. */
        CHECK(setsockopt(sr_sock, SOL_SOCKET, SO_TIMESTAMP, &one, sizeof one) == 0);
        usleep(2000);
        atomic_store(&sr_stop, 1);
        pthread_join(th, NULL);
        unsigned last = 0;
        int first = 1;
        char b[LEN + 16];
        ssize_t k;
        while ((k = recv(r, b, sizeof b, MSG_DONTWAIT)) > 0) {
            unsigned n;
            memcpy(&n, b, sizeof n);
            if (!first && n <= last) disorder++;
            last = n;
            first = 0;
            got++;
        }
        close(r);
        close(sr_sock);
    }
    printf("sendrace: %d rounds, %s, %d out of order\n", SR_ROUNDS, got > 0 ? "received" : "nothing received", disorder);
    puts("OK sendrace");
}

/* -------------------------------------------------------- epoll_err */

static void show_wait(int ep, const char *what) {
    struct epoll_event ev[4];
    int n = epoll_wait(ep, ev, 4, 50);
    printf("%s: %d event(s)", what, n);
    for (int i = 0; i < n; i++)
        printf(" [%s%s%s]", ev[i].events & EPOLLIN ? "IN " : "", ev[i].events & EPOLLERR ? "ERR " : "", ev[i].events & EPOLLOUT ? "OUT " : "");
    printf("\n");
}

static void t_epoll_err(void) {
    for (int et = 0; et < 2; et++) {
        for (int by_recv = 0; by_recv < 2; by_recv++) {
            struct sockaddr_in closed;
            int d = udp4(&closed);
            close(d);
            int s = socket(AF_INET, SOCK_DGRAM, 0);
            CHECK(connect(s, (struct sockaddr *)&closed, sizeof closed) == 0);
            int ep = epoll_create1(0);
            struct epoll_event e = { .events = EPOLLIN | (et ? EPOLLET : 0) };
            CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &e) == 0);
            printf("%s, error taken by %s\n", et ? "edge-triggered" : "level-triggered", by_recv ? "recv" : "send");
            CHECK(send(s, "x", 1, 0) == 1);
            usleep(50000);
            show_wait(ep, "after the refused send");
            show_wait(ep, "again");
            char b[8];
            ssize_t r = by_recv ? recv(s, b, sizeof b, MSG_DONTWAIT) : send(s, "y", 1, 0);
            printf("%s: %zd %s\n", by_recv ? "recv" : "send", r, r < 0 ? strerror(errno) : "");
            show_wait(ep, "after it");
            r = recv(s, b, sizeof b, MSG_DONTWAIT);
            printf("recv: %zd %s\n", r, r < 0 ? strerror(errno) : "");
            close(ep); close(s);
        }
    }
    puts("OK epoll_err");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *only = argc > 1 ? argv[1] : NULL;
    if (!only || !strcmp(only, "race")) t_race();
    if (!only || !strcmp(only, "reenter")) t_reenter();
    if (!only || !strcmp(only, "sendrace")) t_sendrace();
    if (!only || !strcmp(only, "epoll_err")) t_epoll_err();
    puts("ALL OK");
    return 0;
}
