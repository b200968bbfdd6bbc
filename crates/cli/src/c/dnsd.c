/* dnsd: a DNS-server-shaped program for `eudp bench --sockets`.
 *
 *   dnsd serve N PORTFILE SECS   open N UDP sockets on 127.0.0.1 (port 0),
 *                                one epoll set; write their ports to
 *                                PORTFILE, print "ready"; answer queries
 *                                until each socket has answered one (or
 *                                SECS pass); print one JSON line.
 *   dnsd query PORTFILE WINDOW SECS
 *                                send one query to each port, WINDOW at a
 *                                time, and check every answer; print one
 *                                JSON line.
 *
 * A query asks for the A record of "s<index>.bench."; the answer carries
 * 10.x.y.z = index, so the client knows the right socket answered. On a
 * setup error the server prints its JSON line (with "error") instead of
 * "ready" and exits 1. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Opened before the sockets, so they can still be read when the
 * descriptor limit is reached; re-read from the start each time. */
static DIR *fd_dir;
static FILE *status_file;

/* Descriptors open, not counting the two above. */
static long fds_in_use(void) {
    if (!fd_dir)
        return -1;
    rewinddir(fd_dir);
    long n = 0;
    struct dirent *e;
    while ((e = readdir(fd_dir)))
        if (e->d_name[0] != '.')
            n++;
    return n - 2;
}

static long vmhwm_kib(void) {
    char line[256];
    long v = -1;
    if (!status_file)
        return -1;
    rewind(status_file);
    while (fgets(line, sizeof line, status_file))
        if (sscanf(line, "VmHWM: %ld", &v) == 1)
            break;
    return v;
}

/* Query for index i into q; returns its length. */
static int query(uint8_t *q, uint32_t i) {
    memset(q, 0, 12);
    q[0] = i >> 8, q[1] = i; /* id */
    q[2] = 0x01;             /* RD */
    q[5] = 1;                /* QDCOUNT */
    int n = 12;
    char label[16];
    int l = snprintf(label, sizeof label, "s%u", i);
    q[n++] = l;
    memcpy(q + n, label, l), n += l;
    q[n++] = 5;
    memcpy(q + n, "bench", 5), n += 5;
    q[n++] = 0;
    q[n++] = 0, q[n++] = 1; /* A */
    q[n++] = 0, q[n++] = 1; /* IN */
    return n;
}

static int serve(long count, const char *portfile, double secs) {
    fd_dir = opendir("/proc/self/fd");
    status_file = fopen("/proc/self/status", "r");
    if (status_file)
        setvbuf(status_file, NULL, _IONBF, 0);
    double t0 = now();
    int ep = epoll_create1(0);
    int *fds = calloc(count, sizeof *fds);
    unsigned char *done = calloc(count, 1);
    char err[160] = "";
    long opened = 0;
    if (ep < 0)
        snprintf(err, sizeof err, "epoll_create1: %s", strerror(errno));
    for (long i = 0; !err[0] && i < count; i++) {
        int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK, 0);
        if (fd < 0) {
            snprintf(err, sizeof err, "socket %ld: %s", i, strerror(errno));
            break;
        }
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        struct epoll_event ev = {.events = EPOLLIN, .data.u64 = (uint64_t)i};
        if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
            snprintf(err, sizeof err, "bind %ld: %s", i, strerror(errno));
            close(fd);
            break;
        }
        if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
            snprintf(err, sizeof err, "epoll_ctl %ld: %s", i, strerror(errno));
            close(fd);
            break;
        }
        fds[i] = fd;
        opened++;
    }
    double open_secs = now() - t0;
    long fds_open = fds_in_use();
    FILE *pf = err[0] ? NULL : fopen(portfile, "w");
    if (!err[0] && !pf)
        snprintf(err, sizeof err, "%s: %s", portfile, strerror(errno));
    for (long i = 0; pf && i < count; i++) {
        struct sockaddr_in a;
        socklen_t al = sizeof a;
        if (getsockname(fds[i], (struct sockaddr *)&a, &al) < 0) {
            snprintf(err, sizeof err, "getsockname %ld: %s", i, strerror(errno));
            break;
        }
        fprintf(pf, "%u\n", ntohs(a.sin_port));
    }
    if (pf)
        fclose(pf);
    long answered = 0, bad = 0, send_errors = 0;
    double first = 0, last = 0;
    if (!err[0]) {
        printf("ready\n");
        fflush(stdout);
        struct epoll_event evs[256];
        double deadline = now() + secs;
        while (answered < count && now() < deadline) {
            int n = epoll_wait(ep, evs, 256, 100);
            if (n < 0 && errno != EINTR) {
                snprintf(err, sizeof err, "epoll_wait: %s", strerror(errno));
                break;
            }
            for (int k = 0; k < n; k++) {
                long i = (long)evs[k].data.u64;
                uint8_t b[512];
                struct sockaddr_in from;
                socklen_t fl = sizeof from;
                ssize_t m = recvfrom(fds[i], b, sizeof b - 16, 0, (struct sockaddr *)&from, &fl);
                if (m < 0)
                    continue;
                if (first == 0)
                    first = now();
                if (m < 12) {
                    bad++;
                    continue;
                }
                /* Answer: header with QR|RD|RA, ANCOUNT 1; the question; an A record. */
                b[2] = 0x81, b[3] = 0x80;
                b[6] = 0, b[7] = 1;
                uint8_t *r = b + m;
                *r++ = 0xc0, *r++ = 12;            /* name: pointer to the question */
                *r++ = 0, *r++ = 1, *r++ = 0, *r++ = 1; /* A, IN */
                *r++ = 0, *r++ = 0, *r++ = 0, *r++ = 60; /* TTL */
                *r++ = 0, *r++ = 4;
                *r++ = 10, *r++ = i >> 16, *r++ = i >> 8, *r++ = i;
                if (sendto(fds[i], b, r - b, 0, (struct sockaddr *)&from, fl) < 0) {
                    send_errors++;
                    continue;
                }
                last = now();
                if (!done[i]) {
                    done[i] = 1;
                    answered++;
                }
            }
        }
    }
    printf("{\"count\":%ld,\"opened\":%ld,\"open_secs\":%.6f,\"fds_in_use\":%ld,\"answered\":%ld,\"answer_secs\":%.6f,"
           "\"bad_queries\":%ld,\"send_errors\":%ld,\"vmhwm_kib\":%ld,\"error\":",
           count, opened, open_secs, fds_open, answered, last > first ? last - first : 0.0, bad, send_errors, vmhwm_kib());
    if (err[0])
        printf("\"%s\"}\n", err);
    else
        printf("null}\n");
    fflush(stdout);
    return err[0] ? 1 : 0;
}

static int client(const char *portfile, int window, double secs) {
    FILE *pf = fopen(portfile, "r");
    if (!pf) {
        printf("{\"error\":\"%s: %s\"}\n", portfile, strerror(errno));
        return 1;
    }
    long cap = 1024, n = 0;
    uint16_t *ports = malloc(cap * sizeof *ports);
    unsigned p;
    while (fscanf(pf, "%u", &p) == 1) {
        if (n == cap)
            ports = realloc(ports, (cap *= 2) * sizeof *ports);
        ports[n++] = p;
    }
    fclose(pf);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    unsigned char *ok = calloc(n ? n : 1, 1);
    long answered = 0, wrong = 0;
    double t0 = now(), deadline = t0 + secs, last = t0;
    for (long base = 0; base < n && now() < deadline; base += window) {
        long end = base + window < n ? base + window : n;
        for (long i = base; i < end; i++) {
            uint8_t q[64];
            int l = query(q, (uint32_t)i);
            struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(ports[i]), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
            sendto(fd, q, l, 0, (struct sockaddr *)&a, sizeof a);
        }
        long want = end - base, got = 0;
        double wdl = now() + 2.0;
        while (got < want && now() < wdl) {
            uint8_t b[512];
            ssize_t m = recv(fd, b, sizeof b, 0);
            if (m < 0)
                continue;
            /* The index is in the record's address (last 4 bytes). */
            long i = m >= 16 ? ((long)b[m - 3] << 16 | (long)b[m - 2] << 8 | b[m - 1]) : -1;
            uint8_t q[64];
            int l = i >= 0 && i < n ? query(q, (uint32_t)i) : 0;
            if (l == 0 || m != l + 16 || b[2] != 0x81 || memcmp(b + 12, q + 12, l - 12) != 0 || b[m - 4] != 10) {
                wrong++;
                continue;
            }
            if (i >= base && i < end && !ok[i]) {
                ok[i] = 1;
                answered++;
                got++;
                last = now();
            }
        }
    }
    printf("{\"ports\":%ld,\"answered\":%ld,\"wrong\":%ld,\"secs\":%.6f}\n", n, answered, wrong, last - t0);
    return answered == n ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "serve") == 0)
        return serve(atol(argv[2]), argv[3], atof(argv[4]));
    if (argc == 5 && strcmp(argv[1], "query") == 0)
        return client(argv[2], atoi(argv[3]) > 0 ? atoi(argv[3]) : 1, atof(argv[4]));
    fprintf(stderr, "usage: dnsd serve N PORTFILE SECS | dnsd query PORTFILE WINDOW SECS\n");
    return 2;
}
