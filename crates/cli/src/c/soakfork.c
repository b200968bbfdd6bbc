/* soakfork: the fork-heavy workload of `eudp bench --soak` (crates/cli/src/soak/).
 *
 *   soakfork echo PORT
 *       echoes every datagram on UDP PORT back to its sender until SIGTERM
 *       or SIGINT, then prints {"received":N,"echoed":N} on one line.
 *   soakfork client ADDR PORT SECS EVERY_MS
 *       every EVERY_MS forks a child that opens its own UDP socket, sends
 *       PER_CHILD datagrams to ADDR:PORT, waits for their echoes (at most
 *       CHILD_WAIT_MS in all) and exits 0 when every one came back; for SECS
 *       seconds (or until SIGTERM); the parent itself echoes one datagram
 *       per child on a socket of its own, so every fork happens with the
 *       parent's engine running. Then it prints one JSON line: children
 *       started, succeeded and failed, datagrams sent and got back (children
 *       and parent), the longest time between two successful children, and
 *       every such gap over 100 ms as [start, end] seconds after its start
 *       (the MAX_GAPS longest, so the longest is always listed).
 *
 * A child reports its counts to the parent through a pipe, so the parent
 * sums what every child did, including a child that failed. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PER_CHILD 4
#define CHILD_WAIT_MS 500
#define MAX_GAPS 500

static volatile sig_atomic_t stop;

static void on_stop(int sig) {
    (void)sig;
    stop = 1;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void handle_stop(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    /* No SA_RESTART: a blocked receive returns at once with EINTR. */
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

static int echo(int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("soakfork echo: bind");
        return 1;
    }
    handle_stop();
    unsigned long long received = 0, echoed = 0;
    char buf[2048];
    while (!stop) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(fd, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n < 0)
            continue;
        received++;
        if (sendto(fd, buf, n, 0, (struct sockaddr *)&from, fl) == n)
            echoed++;
    }
    printf("{\"received\":%llu,\"echoed\":%llu}\n", received, echoed);
    fflush(stdout);
    return 0;
}

/* One child's work; its counts go to `out` as "sent received\n". */
static int child(const struct sockaddr_in *dst, int out, unsigned seq) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    int sent = 0, got = 0;
    if (fd >= 0) {
        char msg[64];
        for (int i = 0; i < PER_CHILD; i++) {
            int n = snprintf(msg, sizeof msg, "soak %u %d", seq, i);
            if (sendto(fd, msg, n, 0, (const struct sockaddr *)dst, sizeof *dst) == n)
                sent++;
        }
        double deadline = now() + CHILD_WAIT_MS / 1000.0;
        while (got < sent) {
            int left = (int)((deadline - now()) * 1000);
            if (left <= 0)
                break;
            struct pollfd p = {.fd = fd, .events = POLLIN};
            if (poll(&p, 1, left) <= 0)
                continue;
            char buf[128];
            if (recv(fd, buf, sizeof buf, MSG_DONTWAIT) > 0)
                got++;
        }
        close(fd);
    }
    dprintf(out, "%d %d\n", sent, got);
    return sent == PER_CHILD && got == PER_CHILD ? 0 : 1;
}

static double gaps[MAX_GAPS][2];
static int ngaps;

/* Lists the gap [a, b] (seconds after the start) if it is over 100 ms;
 * once MAX_GAPS are listed, in place of the shortest when longer. */
static void note_gap(double a, double b) {
    if (b - a <= 0.1)
        return;
    int at = ngaps;
    if (ngaps == MAX_GAPS) {
        at = 0;
        for (int i = 1; i < MAX_GAPS; i++)
            if (gaps[i][1] - gaps[i][0] < gaps[at][1] - gaps[at][0])
                at = i;
        if (gaps[at][1] - gaps[at][0] >= b - a)
            return;
    } else {
        ngaps++;
    }
    gaps[at][0] = a;
    gaps[at][1] = b;
}

static int client(const char *addr, int port, double secs, int every_ms) {
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, addr, &dst.sin_addr) != 1) {
        fprintf(stderr, "soakfork client: bad address %s\n", addr);
        return 2;
    }
    int pfd[2];
    if (pipe(pfd) < 0) {
        perror("soakfork client: pipe");
        return 1;
    }
    int own = socket(AF_INET, SOCK_DGRAM, 0);
    if (own < 0) {
        perror("soakfork client: socket");
        return 1;
    }
    handle_stop();
    unsigned long long started = 0, ok = 0, failed = 0, sent = 0, got = 0;
    double t0 = now(), last_ok = t0, longest_gap = 0;
    FILE *counts = fdopen(pfd[0], "r");
    while (!stop && now() - t0 < secs) {
        if (sendto(own, "parent", 6, 0, (const struct sockaddr *)&dst, sizeof dst) == 6) {
            sent++;
            struct pollfd p = {.fd = own, .events = POLLIN};
            char buf[128];
            if (poll(&p, 1, 200) > 0 && recv(own, buf, sizeof buf, MSG_DONTWAIT) > 0)
                got++;
        }
        pid_t pid = fork();
        if (pid == 0) {
            close(pfd[0]);
            close(own);
            /* exit, not _exit: the shim writes each child's final report at exit. */
            exit(child(&dst, pfd[1], (unsigned)started));
        }
        if (pid < 0) {
            failed++;
        } else {
            started++;
            int st = 0;
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            int s = 0, g = 0;
            if (fscanf(counts, "%d %d", &s, &g) == 2) {
                sent += s;
                got += g;
            }
            if (WIFEXITED(st) && WEXITSTATUS(st) == 0) {
                ok++;
                double t = now();
                if (t - last_ok > longest_gap)
                    longest_gap = t - last_ok;
                note_gap(last_ok - t0, t - t0);
                last_ok = t;
            } else {
                failed++;
            }
        }
        struct timespec pause = {.tv_sec = every_ms / 1000, .tv_nsec = (every_ms % 1000) * 1000000L};
        nanosleep(&pause, NULL);
    }
    /* The parent's last echoes may still be on their way: wait for them a
     * little, so that what is missing at the end is lost, not late. */
    double drain_until = now() + 0.5;
    while (got < sent && now() < drain_until) {
        struct pollfd p = {.fd = own, .events = POLLIN};
        char buf[128];
        if (poll(&p, 1, 50) > 0 && recv(own, buf, sizeof buf, MSG_DONTWAIT) > 0)
            got++;
    }
    double end = now();
    if (end - last_ok > longest_gap)
        longest_gap = end - last_ok;
    note_gap(last_ok - t0, end - t0);
    printf("{\"children\":%llu,\"succeeded\":%llu,\"failed\":%llu,\"sent\":%llu,\"received\":%llu,"
           "\"longest_gap_ms\":%.1f,\"secs\":%.3f,\"gaps\":[",
           started, ok, failed, sent, got, longest_gap * 1000, end - t0);
    for (int i = 0; i < ngaps; i++)
        printf("%s[%.3f,%.3f]", i ? "," : "", gaps[i][0], gaps[i][1]);
    printf("]}\n");
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 3 && strcmp(argv[1], "echo") == 0)
        return echo(atoi(argv[2]));
    if (argc == 6 && strcmp(argv[1], "client") == 0)
        return client(argv[2], atoi(argv[3]), atof(argv[4]), atoi(argv[5]));
    fprintf(stderr, "usage: soakfork echo PORT | soakfork client ADDR PORT SECS EVERY_MS\n");
    return 2;
}
