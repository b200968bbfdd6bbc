/* Descriptor numbers and limits as the program sees them: each case prints
 * what it observes, and the output must be the same on the kernel and
 * under the shim (tests/fd_space.rs). Every socket does UDP traffic over
 * loopback first, so under the shim it is on the engine and the shim's and
 * the engine's own descriptors exist while the program opens, counts and
 * closes its own. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#define CHECK(c) do { if (!(c)) { printf("FAIL %s:%d %s errno=%d\n", __FILE__, __LINE__, #c, errno); fflush(stdout); exit(1); } } while (0)

static int udp(void) {
    return socket(AF_INET, SOCK_DGRAM, 0);
}

/* Binds to a loopback port, sends itself one datagram, waits for it with
 * select (the way that makes the shim create the ring's eventfd) and reads
 * it: afterwards the socket is on the engine under the shim. */
static int traffic(int fd) {
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    socklen_t len = sizeof a;
    if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) return -1;
    if (a.sin_port == 0) {
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) return -1;
        len = sizeof a;
        if (getsockname(fd, (struct sockaddr *)&a, &len) != 0) return -1;
    }
    if (sendto(fd, "x", 1, 0, (struct sockaddr *)&a, sizeof a) != 1) return -1;
    if (fd < FD_SETSIZE) {
        fd_set r;
        FD_ZERO(&r);
        FD_SET(fd, &r);
        struct timeval tv = { 5, 0 };
        if (select(fd + 1, &r, NULL, NULL, &tv) != 1) return -1;
    }
    char b[8];
    return recv(fd, b, sizeof b, 0) == 1 ? 0 : -1;
}

static void set_soft(rlim_t soft) {
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
    r.rlim_cur = soft < r.rlim_max ? soft : r.rlim_max;
    CHECK(setrlimit(RLIMIT_NOFILE, &r) == 0);
}

static void print_limits(void) {
    struct rlimit r, p;
    CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
    CHECK(prlimit(0, RLIMIT_NOFILE, NULL, &p) == 0);
    printf("limits getrlimit %lu prlimit %lu getdtablesize %d sysconf %ld\n", (unsigned long)r.rlim_cur, (unsigned long)p.rlim_cur,
           getdtablesize(), sysconf(_SC_OPEN_MAX));
}

/* How many of this process's descriptors are below `n`. */
static int open_below(int n) {
    int c = 0;
    DIR *d = opendir("/proc/self/fd");
    CHECK(d);
    int own = dirfd(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        int f = atoi(e->d_name);
        if (e->d_name[0] != '.' && f != own && f < n) c++;
    }
    closedir(d);
    return c;
}

/* Numbers of descriptors opened after UDP traffic. */
static void numbers(void) {
    int s[5];
    for (int i = 0; i < 5; i++) {
        s[i] = udp();
        CHECK(s[i] >= 0 && traffic(s[i]) == 0);
    }
    int p[2];
    CHECK(pipe(p) == 0);
    int f = open("/dev/null", O_RDONLY);
    int t = socket(AF_INET, SOCK_STREAM, 0);
    int e = eventfd(0, 0);
    int u = udp();
    CHECK(u >= 0 && traffic(u) == 0);
    int d = dup(s[0]);
    printf("udp %d %d %d %d %d pipe %d %d file %d tcp %d eventfd %d udp %d dup %d\n", s[0], s[1], s[2], s[3], s[4], p[0], p[1], f, t, e, u, d);
    printf("open below 1024: %d\n", open_below(1024));
    close(s[2]);
    int again = udp();
    CHECK(again >= 0 && traffic(again) == 0);
    printf("reused %d\n", again);
}

/* Sockets up to a soft limit of 256, each on the engine. */
static void limit(void) {
    set_soft(256);
    int n = 0, err = 0, last = -1;
    for (int i = 0; i < 10000; i++) {
        int fd = udp();
        if (fd < 0) {
            err = errno;
            break;
        }
        CHECK(traffic(fd) == 0);
        last = fd;
        n++;
    }
    printf("sockets %d last %d then %s\n", n, last, err == EMFILE ? "EMFILE" : strerror(err));
    errno = 0;
    printf("open %d\n", open("/dev/null", O_RDONLY) < 0 ? -errno : 0);
    printf("dup2 onto 256: %d\n", dup2(3, 256) < 0 ? -errno : 0);
    printf("F_DUPFD 256: %d\n", fcntl(3, F_DUPFD, 256) < 0 ? -errno : 0);
    CHECK(close(last) == 0 && close(last - 1) == 0);
    int p[2];
    CHECK(pipe(p) == 0);
    printf("pipe %d %d\n", p[0], p[1]);
    print_limits();
    set_soft(200);
    print_limits();
}

/* select over 400 sockets under a soft limit of 1024. */
static void many_select(void) {
    struct rlimit r;
    CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
    if (r.rlim_max < 1024) {
        printf("hard limit below 1024: skipped\n");
        return;
    }
    set_soft(1024);
    enum { N = 400 };
    int s[N], hi = -1;
    for (int i = 0; i < N; i++) {
        s[i] = udp();
        CHECK(s[i] >= 0 && s[i] < FD_SETSIZE);
        CHECK(traffic(s[i]) == 0);
        if (s[i] > hi) hi = s[i];
    }
    for (int i = 0; i < N; i++) {
        struct sockaddr_in a;
        socklen_t len = sizeof a;
        CHECK(getsockname(s[i], (struct sockaddr *)&a, &len) == 0);
        CHECK(sendto(s[i], "y", 1, 0, (struct sockaddr *)&a, len) == 1);
    }
    int got = 0;
    for (int round = 0; round < 100 && got < N; round++) {
        fd_set rd;
        FD_ZERO(&rd);
        for (int i = 0; i < N; i++) FD_SET(s[i], &rd);
        struct timeval tv = { 1, 0 };
        int k = select(hi + 1, &rd, NULL, NULL, &tv);
        CHECK(k >= 0);
        for (int i = 0; i < N; i++) {
            char b[8];
            if (FD_ISSET(s[i], &rd)) {
                CHECK(recv(s[i], b, sizeof b, 0) == 1);
                got++;
            }
        }
    }
    printf("highest %d received %d\n", hi, got);
}

/* Closing by number: close loops, close_range, closefrom and dup2 over
 * everything above the program's sockets leave those working; closefrom(3)
 * closes them as on the kernel and the next socket works. */
static void closing(void) {
    set_soft(1024);
    int a = udp(), b = udp(), c = udp();
    CHECK(a >= 0 && b >= 0 && c >= 0);
    CHECK(traffic(a) == 0 && traffic(b) == 0 && traffic(c) == 0);
    int closed = 0;
    for (int n = c + 1; n < 1024; n++)
        if ((n % 2 ? close(n) : syscall(SYS_close, n)) == 0) closed++;
    printf("close loop closed %d\n", closed);
    int duped = 0;
    for (int n = c + 1; n < 1024; n++)
        if (dup2(a, n) == n && close(n) == 0) duped++;
    printf("dup2 loop %d, onto 1024: %d\n", duped, dup2(a, 1024) < 0 ? -errno : 0);
    printf("close_range %d\n", close_range(c + 1, ~0U, 0));
    printf("close_range syscall %ld\n", syscall(SYS_close_range, c + 1, ~0U, 0));
    closefrom(c + 1);
    for (int r = 0; r < 3; r++)
        printf("traffic %d\n", traffic(a) == 0 && traffic(b) == 0 && traffic(c) == 0);
    closefrom(3);
    char x;
    printf("after closefrom(3): recv %d\n", recv(a, &x, 1, MSG_DONTWAIT) < 0 ? -errno : 0);
    int d = udp();
    printf("new socket %d traffic %d\n", d, traffic(d) == 0);
    int e = udp();
    printf("new socket %d traffic %d\n", e, traffic(e) == 0);
}

/* The program's view of its limit while other threads put sockets on the
 * engine (each costing the shim private descriptors). */
static volatile int done;

static void *opener(void *arg) {
    (void)arg;
    for (int i = 0; i < 60; i++) {
        int fd = udp();
        CHECK(fd >= 0 && traffic(fd) == 0);
        if (i % 3 == 0) close(fd);
    }
    return NULL;
}

static void *setter(void *arg) {
    (void)arg;
    while (!done) set_soft(512);
    return NULL;
}

static void rlimit_race(void) {
    set_soft(512);
    pthread_t o[2], s;
    CHECK(pthread_create(&o[0], NULL, opener, NULL) == 0);
    CHECK(pthread_create(&o[1], NULL, opener, NULL) == 0);
    CHECK(pthread_create(&s, NULL, setter, NULL) == 0);
    long seen = 0, wrong = 0;
    int joined = 0;
    while (!joined && seen < 10000000) {
        struct rlimit r;
        CHECK(getrlimit(RLIMIT_NOFILE, &r) == 0);
        if (r.rlim_cur != 512 || getdtablesize() != 512 || sysconf(_SC_OPEN_MAX) != 512) wrong++;
        seen++;
        if (seen % 64 == 0 && pthread_tryjoin_np(o[0], NULL) == 0) {
            CHECK(pthread_join(o[1], NULL) == 0);
            joined = 1;
        }
    }
    done = 1;
    CHECK(pthread_join(s, NULL) == 0);
    if (!joined) {
        CHECK(pthread_join(o[0], NULL) == 0 && pthread_join(o[1], NULL) == 0);
    }
    fprintf(stderr, "checked %ld times\n", seen);
    printf("limit seen other than 512: %ld times\n", wrong);
    print_limits();
}

int main(int argc, char **argv) {
    alarm(60);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc < 2) return 2;
    const char *c = argv[1];
    if (!strcmp(c, "numbers")) numbers();
    else if (!strcmp(c, "limit")) limit();
    else if (!strcmp(c, "select")) many_select();
    else if (!strcmp(c, "closing")) closing();
    else if (!strcmp(c, "rlimit_race")) rlimit_race();
    else return 2;
    return 0;
}
