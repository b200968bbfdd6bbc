/* Many UDP sockets under a tight descriptor limit (a DNS server with one
 * socket per address or per upstream).
 *
 *   many_sockets N HEADROOM epoll|plain|late-epoll|late-poll [HARD]
 *
 * Sets soft = hard RLIMIT_NOFILE = N + HEADROOM (what the kernel needs is
 * N + a few; with HARD, the hard limit is that instead), opens N nonblocking UDP sockets bound on loopback (in epoll
 * mode, each registered for input in one epoll set), sends one datagram to
 * each from one more socket and receives them all (epoll mode: where
 * epoll_wait reports). The late modes first use every socket once (a
 * receive that finds nothing), and only then send and register them in
 * one epoll set, or poll each one alone while its datagram is sent from
 * another thread a moment after the poll began (a poll that sleeps past
 * its datagram counts as a stall; after 3 the program gives up). Then opens a directory (an open the C library makes
 * on its own) to count its descriptors. Prints
 *   "opened N received M fds F hwm_kb K"
 * or where it failed ("skipped" when the hard limit is too low). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHECK_WRITE(x) do { if ((x) < 0) { printf("pipe write failed\n"); return 1; } } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long hwm_kb(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long v = -1;
    if (!f) return -1;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) v = atol(line + 6);
    fclose(f);
    return v;
}

static int tx, wake[2];
static struct sockaddr_in *addr;

/* late-poll: sends datagram i 5 ms after main asks (it polls meanwhile). */
static void *late_sender(void *arg) {
    int i;
    char msg[40];
    (void)arg;
    while (read(wake[0], &i, sizeof i) == sizeof i && i >= 0) {
        struct timespec ts = {0, 5000000};
        nanosleep(&ts, NULL);
        snprintf(msg, sizeof msg, "datagram %d", i);
        sendto(tx, msg, strlen(msg), 0, (struct sockaddr *)&addr[i], sizeof addr[i]);
    }
    return NULL;
}

static int add(int ep, int *fds, int i) {
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = i};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev) != 0) {
        printf("epoll_ctl %d failed: %s\n", i, strerror(errno));
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    int n = atoi(argv[1]), head = atoi(argv[2]);
    int late = !strncmp(argv[3], "late-", 5);
    int use_epoll = !strcmp(argv[3] + (late ? 5 : 0), "epoll");
    int use_poll = !strcmp(argv[3], "late-poll");
    struct rlimit r = {n + head, argc > 4 ? atoi(argv[4]) : n + head}, cur;
    if (getrlimit(RLIMIT_NOFILE, &cur) == 0 && cur.rlim_max < r.rlim_max) {
        printf("skipped: hard limit %lu\n", (unsigned long)cur.rlim_max);
        return 0;
    }
    if (setrlimit(RLIMIT_NOFILE, &r) != 0) {
        printf("setrlimit: %s\n", strerror(errno));
        return 1;
    }
    int ep = use_epoll ? epoll_create1(EPOLL_CLOEXEC) : -1;
    if (use_epoll && ep < 0) {
        printf("epoll_create1: %s\n", strerror(errno));
        return 1;
    }
    int *fds = calloc(n, sizeof *fds);
    addr = calloc(n, sizeof *addr);
    char *got = calloc(n, 1);
    for (int i = 0; i < n; i++) {
        int s = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (s < 0) {
            printf("socket %d failed: %s\n", i, strerror(errno));
            return 1;
        }
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (bind(s, (struct sockaddr *)&a, sizeof a) != 0 || getsockname(s, (struct sockaddr *)&addr[i], &len) != 0) {
            printf("bind %d failed: %s\n", i, strerror(errno));
            return 1;
        }
        fds[i] = s;
        if (late) {
            char b;
            if (recv(s, &b, 1, 0) >= 0 || errno != EAGAIN) {
                printf("first receive %d: %s\n", i, strerror(errno));
                return 1;
            }
        } else if (use_epoll && add(ep, fds, i) != 0) {
            return 1;
        }
    }
    tx = socket(AF_INET, SOCK_DGRAM, 0);
    if (tx < 0) {
        printf("sender socket failed: %s\n", strerror(errno));
        return 1;
    }
    char msg[40], buf[64];
    int stalls = 0, received = 0;
    if (use_poll) {
        pthread_t th;
        if (pipe(wake) != 0 || pthread_create(&th, NULL, late_sender, NULL) != 0) {
            printf("pipe or thread failed\n");
            return 1;
        }
        for (int i = 0; i < n && stalls < 3; i++) {
            struct pollfd p = {.fd = fds[i], .events = POLLIN};
            CHECK_WRITE(write(wake[1], &i, sizeof i));
            int k = poll(&p, 1, 1000);
            if (k == 0) stalls++;
            if (recv(fds[i], buf, sizeof buf, MSG_DONTWAIT) >= 0) {
                got[i] = 1;
                received++;
            }
        }
        int stop = -1;
        CHECK_WRITE(write(wake[1], &stop, sizeof stop));
        pthread_join(th, NULL);
        printf("stalls %d\n", stalls);
    }
    for (int i = 0; i < n && !use_poll; i++) {
        snprintf(msg, sizeof msg, "datagram %d", i);
        if (sendto(tx, msg, strlen(msg), 0, (struct sockaddr *)&addr[i], sizeof addr[i]) < 0) {
            printf("sendto %d failed: %s\n", i, strerror(errno));
            return 1;
        }
    }
    if (late && use_epoll)
        for (int i = 0; i < n; i++)
            if (add(ep, fds, i) != 0) return 1;
    double end = now() + 20;
    while (received < n && now() < end && !use_poll) {
        if (use_epoll) {
            struct epoll_event evs[256];
            int k = epoll_wait(ep, evs, 256, 100);
            if (k < 0) {
                printf("epoll_wait: %s\n", strerror(errno));
                return 1;
            }
            for (int j = 0; j < k; j++) {
                int i = evs[j].data.u32;
                ssize_t m;
                while ((m = recv(fds[i], buf, sizeof buf, 0)) >= 0) {
                    snprintf(msg, sizeof msg, "datagram %d", i);
                    if (m != (ssize_t)strlen(msg) || memcmp(buf, msg, m) || got[i]) {
                        printf("socket %d: wrong or repeated datagram\n", i);
                        return 1;
                    }
                    got[i] = 1;
                    received++;
                }
            }
        } else {
            for (int i = 0; i < n; i++) {
                if (got[i]) continue;
                ssize_t m = recv(fds[i], buf, sizeof buf, 0);
                if (m >= 0) {
                    got[i] = 1;
                    received++;
                }
            }
        }
    }
    int count = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        printf("opendir failed: %s\n", strerror(errno));
        return 1;
    }
    while (readdir(d)) count++;
    closedir(d);
    printf("opened %d received %d fds %d hwm_kb %ld\n", n, received, count - 3, hwm_kb());
    return received == n ? 0 : 1;
}
