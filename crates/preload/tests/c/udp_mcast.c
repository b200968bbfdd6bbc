/* Multicast semantics: which sockets receive which group's datagrams,
 * any-source and source-specific membership, loopback on and off, leaving,
 * many groups on one socket, a burst to a group, membership across fork,
 * and a port shared by several sockets and processes. `./prog CASE` runs
 * one case inside a network namespace whose interface MC_IF (default mc0)
 * holds 198.18.200.1/24 and 2001:2:0:c8::1/64 and leads to a peer
 * namespace (MC_PEER_NS) that holds no sockets: every datagram received
 * comes back through IP_MULTICAST_LOOP, except in the `share` cases, whose
 * datagrams come from a sender in the peer namespace. Every line printed
 * must be the same on the kernel and under libeudp_preload.so (no ports,
 * pids or timings). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

#define PORT 5140
#define HOST4 "198.18.200.1"
#define OTHER4 "198.18.200.9"
#define HOST6 "2001:2:0:c8::1"
#define OTHER6 "2001:2:0:c8::9"
#define PEER4 "198.18.200.2"
#define PEER6 "2001:2:0:c8::2"

static const char *ifname(void) {
    const char *n = getenv("MC_IF");
    return n ? n : "mc0";
}

static struct in_addr a4(const char *s) {
    struct in_addr a;
    CHECK(inet_pton(AF_INET, s, &a) == 1);
    return a;
}

static struct in6_addr a6(const char *s) {
    struct in6_addr a;
    CHECK(inet_pton(AF_INET6, s, &a) == 1);
    return a;
}

static void setint(int fd, int level, int name, int v) {
    CHECK(setsockopt(fd, level, name, &v, sizeof v) == 0);
}

static int getint(int fd, int level, int name) {
    int v = -1;
    socklen_t l = sizeof v;
    CHECK(getsockopt(fd, level, name, &v, &l) == 0);
    return v;
}

/* A receiver bound to the wildcard (or `bind_to`) on PORT, sharing the port. */
static int receiver(int v6, const char *bind_to, int mcast_all) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    setint(fd, SOL_SOCKET, SO_REUSEADDR, 1);
    /* MC_NO_REUSEPORT: shared by SO_REUSEADDR alone, which the xdp transport keeps on the engine. */
    if (!getenv("MC_NO_REUSEPORT")) setint(fd, SOL_SOCKET, SO_REUSEPORT, 1);
    if (v6) {
        setint(fd, IPPROTO_IPV6, IPV6_V6ONLY, 1);
        if (!mcast_all) setint(fd, IPPROTO_IPV6, IPV6_MULTICAST_ALL, 0);
        struct sockaddr_in6 b = { .sin6_family = AF_INET6, .sin6_port = htons(PORT), .sin6_addr = in6addr_any };
        if (bind_to) b.sin6_addr = a6(bind_to);
        CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    } else {
        if (!mcast_all) setint(fd, IPPROTO_IP, IP_MULTICAST_ALL, 0);
        struct sockaddr_in b = { .sin_family = AF_INET, .sin_port = htons(PORT), .sin_addr.s_addr = htonl(INADDR_ANY) };
        if (bind_to) b.sin_addr = a4(bind_to);
        CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    }
    /* A first (empty) receive puts the socket on the engine under the shim
     * before anything arrives. */
    char c;
    CHECK(recv(fd, &c, 1, MSG_DONTWAIT) < 0 && errno == EAGAIN);
    return fd;
}

static void join4(int fd, const char *g) {
    struct ip_mreq m = { .imr_multiaddr = a4(g), .imr_interface = a4(HOST4) };
    CHECK(setsockopt(fd, IPPROTO_IP, IP_ADD_MEMBERSHIP, &m, sizeof m) == 0);
}

static void leave4(int fd, const char *g) {
    struct ip_mreq m = { .imr_multiaddr = a4(g), .imr_interface = a4(HOST4) };
    CHECK(setsockopt(fd, IPPROTO_IP, IP_DROP_MEMBERSHIP, &m, sizeof m) == 0);
}

static void source4(int fd, int name, const char *g, const char *src) {
    struct ip_mreq_source m = { .imr_multiaddr = a4(g), .imr_interface = a4(HOST4), .imr_sourceaddr = a4(src) };
    CHECK(setsockopt(fd, IPPROTO_IP, name, &m, sizeof m) == 0);
}

/* The protocol-independent forms (MCAST_*), used for IPv6 and for one IPv4 group. */
static void group_req(int fd, int v6, int name, const char *g) {
    struct group_req r = { .gr_interface = if_nametoindex(ifname()) };
    CHECK(r.gr_interface != 0);
    if (v6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&r.gr_group;
        s->sin6_family = AF_INET6;
        s->sin6_addr = a6(g);
    } else {
        struct sockaddr_in *s = (struct sockaddr_in *)&r.gr_group;
        s->sin_family = AF_INET;
        s->sin_addr = a4(g);
    }
    CHECK(setsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, name, &r, sizeof r) == 0);
}

static void source_req(int fd, int v6, int name, const char *g, const char *src) {
    struct group_source_req r = { .gsr_interface = if_nametoindex(ifname()) };
    if (v6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&r.gsr_group, *t = (struct sockaddr_in6 *)&r.gsr_source;
        s->sin6_family = t->sin6_family = AF_INET6;
        s->sin6_addr = a6(g);
        t->sin6_addr = a6(src);
    } else {
        struct sockaddr_in *s = (struct sockaddr_in *)&r.gsr_group, *t = (struct sockaddr_in *)&r.gsr_source;
        s->sin_family = t->sin_family = AF_INET;
        s->sin_addr = a4(g);
        t->sin_addr = a4(src);
    }
    CHECK(setsockopt(fd, v6 ? IPPROTO_IPV6 : IPPROTO_IP, name, &r, sizeof r) == 0);
}

static void join6(int fd, const char *g) {
    struct ipv6_mreq m = { .ipv6mr_multiaddr = a6(g), .ipv6mr_interface = if_nametoindex(ifname()) };
    CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_JOIN_GROUP, &m, sizeof m) == 0);
}

static void leave6(int fd, const char *g) {
    struct ipv6_mreq m = { .ipv6mr_multiaddr = a6(g), .ipv6mr_interface = if_nametoindex(ifname()) };
    CHECK(setsockopt(fd, IPPROTO_IPV6, IPV6_LEAVE_GROUP, &m, sizeof m) == 0);
}

/* A sender whose group datagrams leave by MC_IF and loop back. */
static int sender(int v6) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    if (v6) {
        setint(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, (int)if_nametoindex(ifname()));
        setint(fd, IPPROTO_IPV6, IPV6_MULTICAST_HOPS, 1);
        setint(fd, IPPROTO_IPV6, IPV6_MULTICAST_LOOP, 1);
    } else {
        struct in_addr i = a4(HOST4);
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &i, sizeof i) == 0);
        setint(fd, IPPROTO_IP, IP_MULTICAST_TTL, 1);
        setint(fd, IPPROTO_IP, IP_MULTICAST_LOOP, 1);
    }
    return fd;
}

static void send_to(int fd, int v6, const char *g, const char *msg) {
    ssize_t r;
    if (v6) {
        struct sockaddr_in6 d = { .sin6_family = AF_INET6, .sin6_port = htons(PORT), .sin6_addr = a6(g) };
        r = sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&d, sizeof d);
    } else {
        struct sockaddr_in d = { .sin_family = AF_INET, .sin_port = htons(PORT), .sin_addr = a4(g) };
        r = sendto(fd, msg, strlen(msg), 0, (struct sockaddr *)&d, sizeof d);
    }
    CHECK(r == (ssize_t)strlen(msg));
}

/* Everything `fd` receives until it stays quiet for 150 ms, on one line;
 * with `uni`, unicast datagrams (which socket of a reuseport group gets
 * one is the kernel's hash) are only counted there, and sources are not
 * shown. */
static void drain_groups(const char *name, int fd, int *uni) {
    char buf[2048], host[INET6_ADDRSTRLEN];
    printf("  %s:", name);
    for (;;) {
        struct pollfd p = { .fd = fd, .events = POLLIN };
        int n = poll(&p, 1, 150);
        CHECK(n >= 0);
        if (n == 0) break;
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t r = recvfrom(fd, buf, sizeof buf - 1, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (r < 0 && errno == EAGAIN) continue;
        CHECK(r >= 0);
        buf[r] = 0;
        if (uni) {
            if (buf[0] == 'u') (*uni)++;
            else printf(" %s", buf);
            continue;
        }
        const void *src = from.ss_family == AF_INET6 ? (const void *)&((struct sockaddr_in6 *)&from)->sin6_addr
                                                     : (const void *)&((struct sockaddr_in *)&from)->sin_addr;
        CHECK(inet_ntop(from.ss_family, src, host, sizeof host));
        printf(" %s(from %s)", buf, host);
    }
    printf("\n");
}

static void drain(const char *name, int fd) {
    drain_groups(name, fd, NULL);
}

/* Which receivers get which groups' datagrams: any-source and
 * source-specific joins, IP_MULTICAST_ALL on and off, a socket bound to a
 * group address, leave, loopback off and on. */
static void groups(int v6) {
    const char *g1 = v6 ? "ff15::e0d1" : "239.18.0.1";
    const char *g2 = v6 ? "ff15::e0d2" : "239.18.0.2";
    const char *g3 = v6 ? "ff15::e0d3" : "239.18.0.3";
    const char *g4 = v6 ? "ff15::e0d4" : "239.18.0.4";
    const char *g5 = v6 ? "ff15::e0d5" : "239.18.0.5";
    const char *host = v6 ? HOST6 : HOST4, *other = v6 ? OTHER6 : OTHER4;
    int s = sender(v6);
    int r1 = receiver(v6, NULL, 0), r2 = receiver(v6, NULL, 0), r3 = receiver(v6, g1, 0);
    int r4 = receiver(v6, NULL, 1); /* joins nothing, IP_MULTICAST_ALL on */
    if (v6) {
        join6(r1, g1);
        join6(r1, g2);
        group_req(r2, 1, MCAST_JOIN_GROUP, g2);
        source_req(r2, 1, MCAST_JOIN_SOURCE_GROUP, g3, host);
        source_req(r2, 1, MCAST_JOIN_SOURCE_GROUP, g4, other);
        join6(r3, g1);
    } else {
        join4(r1, g1);
        join4(r1, g2);
        group_req(r2, 0, MCAST_JOIN_GROUP, g2);
        source4(r2, IP_ADD_SOURCE_MEMBERSHIP, g3, host);
        source_req(r2, 0, MCAST_JOIN_SOURCE_GROUP, g4, other);
        join4(r3, g1);
    }
    int lv = v6 ? IPPROTO_IPV6 : IPPROTO_IP;
    printf("sender loop %d hops %d; r1 all %d; r4 all %d\n", getint(s, lv, v6 ? IPV6_MULTICAST_LOOP : IP_MULTICAST_LOOP),
           getint(s, lv, v6 ? IPV6_MULTICAST_HOPS : IP_MULTICAST_TTL),
           getint(r1, lv, v6 ? IPV6_MULTICAST_ALL : IP_MULTICAST_ALL),
           getint(r4, lv, v6 ? IPV6_MULTICAST_ALL : IP_MULTICAST_ALL));
    if (!v6) {
        struct in_addr i;
        socklen_t l = sizeof i;
        CHECK(getsockopt(s, IPPROTO_IP, IP_MULTICAST_IF, &i, &l) == 0);
        printf("sender if %s\n", inet_ntoa(i));
    } else {
        printf("sender if is %s: %d\n", ifname(), getint(s, IPPROTO_IPV6, IPV6_MULTICAST_IF) == (int)if_nametoindex(ifname()));
    }
    const char *gs[] = { g1, g2, g3, g4, g5 };
    const char *phases[] = { "joined", "r1 left g2, r2 left g3", "loop off", "loop on" };
    for (int ph = 0; ph < 4; ph++) {
        if (ph == 1) {
            if (v6) {
                leave6(r1, g2);
                source_req(r2, 1, MCAST_LEAVE_SOURCE_GROUP, g3, host);
            } else {
                leave4(r1, g2);
                source4(r2, IP_DROP_SOURCE_MEMBERSHIP, g3, host);
            }
        }
        if (ph == 2) setint(s, lv, v6 ? IPV6_MULTICAST_LOOP : IP_MULTICAST_LOOP, 0);
        if (ph == 3) setint(s, lv, v6 ? IPV6_MULTICAST_LOOP : IP_MULTICAST_LOOP, 1);
        printf("phase %s\n", phases[ph]);
        for (int g = 0; g < 5; g++) {
            char msg[32];
            snprintf(msg, sizeof msg, "%c-g%d", 'a' + ph, g + 1);
            send_to(s, v6, gs[g], msg);
        }
        drain("r1", r1);
        drain("r2", r2);
        drain("r3", r3);
        drain("r4", r4);
    }
    close(s);
    close(r1);
    close(r2);
    close(r3);
    close(r4);
}

/* One socket in many groups; a burst into each, received whole and in order. */
static void many(int v6) {
    int s = sender(v6), r = receiver(v6, NULL, 0);
    int buf = 4 << 20;
    CHECK(setsockopt(r, SOL_SOCKET, SO_RCVBUFFORCE, &buf, sizeof buf) == 0);
    char g[64];
    for (int i = 1; i <= 16; i++) {
        if (v6) {
            snprintf(g, sizeof g, "ff15::e1:%x", i);
            join6(r, g);
        } else {
            snprintf(g, sizeof g, "239.18.1.%d", i);
            join4(r, g);
        }
    }
    /* 16 groups x 40 datagrams of 200 bytes, round robin: the engine batches
     * consecutive datagrams to one group (GSO), so the groups change often
     * here and stay the same below. */
    char msg[201];
    for (int k = 0; k < 40; k++) {
        for (int i = 1; i <= 16; i++) {
            if (v6) snprintf(g, sizeof g, "ff15::e1:%x", i);
            else snprintf(g, sizeof g, "239.18.1.%d", i);
            memset(msg, 'a' + (k + i) % 26, 200);
            snprintf(msg, 12, "%02d:%03d:", i, k);
            msg[7] = 'x';
            msg[200] = 0;
            send_to(s, v6, g, msg);
        }
    }
    if (v6) snprintf(g, sizeof g, "ff15::e1:%x", 3);
    else snprintf(g, sizeof g, "239.18.1.%d", 3);
    for (int k = 0; k < 200; k++) {
        memset(msg, 'A' + k % 26, 200);
        snprintf(msg, 12, "burst%04d", k);
        msg[9] = 'x';
        msg[200] = 0;
        send_to(s, v6, g, msg);
    }
    int next[17] = { 0 }, burst = 0, bad = 0, n = 0;
    for (;;) {
        struct pollfd p = { .fd = r, .events = POLLIN };
        if (poll(&p, 1, 300) <= 0) break;
        char b[2048];
        ssize_t len = recv(r, b, sizeof b, MSG_DONTWAIT);
        if (len < 0 && errno == EAGAIN) continue;
        CHECK(len >= 0);
        n++;
        int gi, k;
        if (len != 200) bad++;
        else if (sscanf(b, "%2d:%3d:", &gi, &k) == 2 && gi >= 1 && gi <= 16) {
            if (k != next[gi]++ || b[199] != 'a' + (k + gi) % 26) bad++;
        } else if (sscanf(b, "burst%4d", &k) == 1) {
            if (k != burst++ || b[199] != 'A' + k % 26) bad++;
        } else bad++;
    }
    printf("received %d datagrams, %d out of order or damaged, burst %d\n", n, bad, burst);
    for (int i = 1; i <= 16; i++)
        if (next[i] != 40) printf("group %d: %d\n", i, next[i]);
    close(s);
    close(r);
}

/* A socket in a group, on the engine, then shared with a fork child: the
 * child receives the group's datagrams on it, the parent again once the
 * child is gone, and the membership ends only with the parent's leave. */
static void forked(int v6) {
    const char *g = v6 ? "ff15::e0f1" : "239.18.0.241";
    int s = sender(v6), r = receiver(v6, NULL, 0);
    if (v6) join6(r, g);
    else join4(r, g);
    send_to(s, v6, g, "before-fork");
    drain("parent", r);
    fflush(stdout);
    pid_t c = fork();
    CHECK(c >= 0);
    if (c == 0) {
        send_to(s, v6, g, "in-child");
        drain("child", r);
        fflush(stdout);
        _exit(0);
    }
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    send_to(s, v6, g, "after-child");
    drain("parent", r);
    if (v6) leave6(r, g);
    else leave4(r, g);
    send_to(s, v6, g, "after-leave");
    drain("parent", r);
    close(s);
    close(r);
}

/* ---- `share`: a group port shared by SO_REUSEADDR and SO_REUSEPORT, in
 * one process and then with a second one, the datagrams coming from the
 * peer namespace (MC_PEER_NS; on the xdp transport they arrive as frames
 * on MC_IF, not through IP_MULTICAST_LOOP). */

/* Runs `argv` (a path) and waits for it to succeed; `plain`: without
 * LD_PRELOAD. posix_spawn: a fork under the shim would share the
 * receivers with the child. */
static void spawn_wait(char *const argv[], int plain, posix_spawn_file_actions_t *fa) {
    static char *env[256];
    char **e = environ;
    if (plain) {
        int n = 0;
        for (char **x = environ; *x && n < 255; x++)
            if (strncmp(*x, "LD_PRELOAD=", 11)) env[n++] = *x;
        env[n] = NULL;
        e = env;
    }
    pid_t c;
    CHECK(posix_spawnp(&c, argv[0], fa, NULL, argv, e) == 0);
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static char self_exe[4096];

/* The peer namespace's sender: three datagrams to each group in `gs`
 * (NULL-ended) and three unicast ones to this host's address, from one
 * socket. */
static void remote_send(int v6, const char *phase, const char *const *gs) {
    fflush(stdout);
    char *argv[16] = { "ip", "netns", "exec", getenv("MC_PEER_NS"), self_exe, v6 ? "send6" : "send4", (char *)phase };
    int n = 7;
    for (; *gs && n < 15; gs++) argv[n++] = (char *)*gs;
    argv[n] = NULL;
    CHECK(argv[3] != NULL);
    spawn_wait(argv, 1, NULL);
}

static void peer_sender(int v6, const char *phase, char **gs, int ng) {
    int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    if (v6) {
        setint(fd, IPPROTO_IPV6, IPV6_MULTICAST_IF, (int)if_nametoindex("mcp"));
    } else {
        struct in_addr i = a4(PEER4);
        CHECK(setsockopt(fd, IPPROTO_IP, IP_MULTICAST_IF, &i, sizeof i) == 0);
    }
    char msg[64];
    for (int k = 0; k < 3; k++) {
        for (int g = 0; g < ng; g++) {
            snprintf(msg, sizeof msg, "%s-%s-%d", phase, gs[g], k);
            send_to(fd, v6, gs[g], msg);
        }
        snprintf(msg, sizeof msg, "u-%s-%d", phase, k);
        send_to(fd, v6, v6 ? HOST6 : HOST4, msg);
    }
    close(fd);
}

/* One phase of `share`: the peer sends `gs`, then r1..r3 are drained;
 * the unicast datagrams they got. */
static int share_phase(int v6, const char *phase, const char *const *gs, const int *r) {
    remote_send(v6, phase, gs);
    int uni = 0;
    drain_groups("r1", r[0], &uni);
    drain_groups("r2", r[1], &uni);
    drain_groups("r3", r[2], &uni);
    return uni;
}

/* The second process of `share`: a member of the first group on the same
 * port; says it is ready on descriptor 3, drains when its standard input
 * says so, and writes the number of unicast datagrams it got on 3 (which
 * socket of the reuseport group gets them is the kernel's hash). */
static void share_member(int v6, const char *g) {
    int r = receiver(v6, NULL, 0);
    if (v6) join6(r, g);
    else join4(r, g);
    CHECK(write(3, "r", 1) == 1);
    char c;
    CHECK(read(0, &c, 1) == 1);
    int uni = 0;
    drain_groups("other process", r, &uni);
    fflush(stdout);
    unsigned char u = (unsigned char)uni;
    CHECK(write(3, &u, 1) == 1);
    close(r);
}

static void share(int v6) {
    const char *g1 = v6 ? "ff15::e0e1" : "239.18.0.225";
    const char *g2 = v6 ? "ff15::e0e2" : "239.18.0.226";
    const char *g3 = v6 ? "ff15::e0e3" : "239.18.0.227";
    const char *both[] = { g1, g2, NULL }, *first[] = { g1, NULL };
    ssize_t l = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    CHECK(l > 0);
    self_exe[l] = 0;
    /* r1, r2 in g1; r1 and r3 in g2; all on one port (each with both options). */
    int r1 = receiver(v6, NULL, 0), r2 = receiver(v6, NULL, 0), r3 = receiver(v6, NULL, 0);
    if (v6) {
        join6(r1, g1);
        join6(r2, g1);
        join6(r1, g2);
        group_req(r3, 1, MCAST_JOIN_GROUP, g2);
    } else {
        join4(r1, g1);
        join4(r2, g1);
        join4(r1, g2);
        group_req(r3, 0, MCAST_JOIN_GROUP, g2);
    }
    printf("reuseport %d %d %d\n", getint(r1, SOL_SOCKET, SO_REUSEPORT), getint(r2, SOL_SOCKET, SO_REUSEPORT),
           getint(r3, SOL_SOCKET, SO_REUSEPORT));
    const int r[3] = { r1, r2, r3 };
    printf("phase one process\n");
    printf("  unicast %d\n", share_phase(v6, "a", both, r));

    /* A second process joins g1 on the port. */
    int ready[2], go[2];
    CHECK(pipe(ready) == 0 && pipe(go) == 0);
    posix_spawn_file_actions_t fa;
    CHECK(posix_spawn_file_actions_init(&fa) == 0);
    CHECK(posix_spawn_file_actions_adddup2(&fa, ready[1], 3) == 0);
    CHECK(posix_spawn_file_actions_adddup2(&fa, go[0], 0) == 0);
    fflush(stdout);
    char *argv[] = { self_exe, v6 ? "member6" : "member4", (char *)g1, NULL };
    pid_t c;
    CHECK(posix_spawn(&c, self_exe, &fa, NULL, argv, environ) == 0);
    close(ready[1]);
    close(go[0]);
    char b;
    CHECK(read(ready[0], &b, 1) == 1);
    /* A membership change here: the shim's transport reads the host's
     * sockets at once (its watcher would within 20 ms). */
    if (v6) join6(r1, g3);
    else join4(r1, g3);
    printf("phase two processes\n");
    int uni = share_phase(v6, "b", first, r);
    fflush(stdout);
    CHECK(write(go[1], "g", 1) == 1);
    unsigned char u;
    CHECK(read(ready[0], &u, 1) == 1);
    int st;
    CHECK(waitpid(c, &st, 0) == c && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    printf("  unicast in both processes %d\n", uni + u);
    posix_spawn_file_actions_destroy(&fa);
    close(ready[0]);
    close(go[1]);

    /* The second process is gone: the first one's sockets alone again. */
    if (v6) leave6(r1, g3);
    else leave4(r1, g3);
    printf("phase one process again\n");
    printf("  unicast %d\n", share_phase(v6, "c", first, r));
    close(r1);
    close(r2);
    close(r3);
}

int main(int argc, char **argv) {
    CHECK(argc >= 2);
    setvbuf(stdout, NULL, _IOLBF, 0);
    alarm(30);
    const char *c = argv[1];
    /* Helpers of the `share` cases (not cases themselves). */
    if (!strcmp(c, "send4") || !strcmp(c, "send6")) {
        CHECK(argc >= 3);
        peer_sender(c[4] == '6', argv[2], argv + 3, argc - 3);
        return 0;
    }
    if (!strcmp(c, "member4") || !strcmp(c, "member6")) {
        CHECK(argc == 3);
        share_member(c[6] == '6', argv[2]);
        return 0;
    }
    CHECK(argc == 2);
    if (!strcmp(c, "groups4")) groups(0);
    else if (!strcmp(c, "groups6")) groups(1);
    else if (!strcmp(c, "many4")) many(0);
    else if (!strcmp(c, "many6")) many(1);
    else if (!strcmp(c, "fork4")) forked(0);
    else if (!strcmp(c, "fork6")) forked(1);
    else if (!strcmp(c, "share4")) share(0);
    else if (!strcmp(c, "share6")) share(1);
    else {
        fprintf(stderr, "unknown case %s\n", c);
        return 2;
    }
    printf("OK %s\n", c);
    return 0;
}
