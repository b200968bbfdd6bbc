/* UDP sockets semantics checks. Must print the same lines and exit 0
 * both on the kernel and under libeudp_preload.so. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "FAIL %s:%d: %s (errno %d %s)\n", __FILE__, __LINE__, #c, errno, strerror(errno)); exit(1); } } while (0)

static int udp4(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    CHECK(fd >= 0);
    struct sockaddr_in b = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(bind(fd, (struct sockaddr *)&b, sizeof b) == 0);
    socklen_t l = sizeof *a;
    CHECK(getsockname(fd, (struct sockaddr *)a, &l) == 0);
    return fd;
}

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec / 1e9; }

static void fill(char *p, int n, int seed) { for (int i = 0; i < n; i++) p[i] = (char)(seed * 31 + i * 7); }

static void t_sendto_recvfrom(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char buf[2000], exp[2000];
    for (int i = 0; i < 60; i++) {
        int n = 1 + (i * 37) % 1472;
        fill(buf, n, i);
        CHECK(sendto(c, buf, n, 0, (struct sockaddr *)&sa, sizeof sa) == n);
    }
    for (int i = 0; i < 60; i++) {
        int n = 1 + (i * 37) % 1472;
        struct sockaddr_in from; socklen_t fl = sizeof from;
        memset(buf, 0, sizeof buf);
        ssize_t r = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        CHECK(r == n);
        fill(exp, n, i);
        CHECK(memcmp(buf, exp, n) == 0);
        CHECK(fl == sizeof from && from.sin_port == ca.sin_port && from.sin_addr.s_addr == ca.sin_addr.s_addr);
    }
    close(s); close(c);
    puts("OK sendto_recvfrom");
}

static void t_connected(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    CHECK(send(c, "x", 1, 0) == -1 && errno == EDESTADDRREQ);
    CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(connect(s, (struct sockaddr *)&ca, sizeof ca) == 0);
    CHECK(write(c, "hello", 5) == 5);
    CHECK(send(c, "world!", 6, 0) == 6);
    char b[64];
    CHECK(read(s, b, sizeof b) == 5 && memcmp(b, "hello", 5) == 0);
    CHECK(recv(s, b, sizeof b, 0) == 6 && memcmp(b, "world!", 6) == 0);
    struct sockaddr_in p; socklen_t pl = sizeof p;
    CHECK(getpeername(c, (struct sockaddr *)&p, &pl) == 0 && p.sin_port == sa.sin_port);
    /* AF_UNSPEC dissolves the association */
    struct sockaddr un = { .sa_family = AF_UNSPEC };
    CHECK(connect(c, &un, sizeof un) == 0);
    CHECK(send(c, "x", 1, 0) == -1 && errno == EDESTADDRREQ);
    struct sockaddr_in ta; int t = udp4(&ta);
    CHECK(sendto(c, "again", 5, 0, (struct sockaddr *)&ta, sizeof ta) == 5);
    CHECK(recv(t, b, sizeof b, 0) == 5);
    close(s); close(c); close(t);
    puts("OK connected");
}

static void t_flags(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[64];
    CHECK(recv(s, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    int fl = fcntl(s, F_GETFL);
    CHECK(fl >= 0 && !(fl & O_NONBLOCK));
    CHECK(fcntl(s, F_SETFL, fl | O_NONBLOCK) == 0);
    CHECK(fcntl(s, F_GETFL) & O_NONBLOCK);
    CHECK(recv(s, b, sizeof b, 0) == -1 && errno == EAGAIN);
    CHECK(fcntl(s, F_SETFL, fl) == 0);
    CHECK(!(fcntl(s, F_GETFL) & O_NONBLOCK));
    int on = 1;
    CHECK(ioctl(s, FIONBIO, &on) == 0);
    CHECK(read(s, b, sizeof b) == -1 && errno == EAGAIN);
    on = 0;
    CHECK(ioctl(s, FIONBIO, &on) == 0);
    int avail = -1;
    CHECK(ioctl(s, FIONREAD, &avail) == 0 && avail == 0);
    CHECK(sendto(c, "0123456789", 10, 0, (struct sockaddr *)&sa, sizeof sa) == 10);
    CHECK(sendto(c, "abc", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    struct pollfd p = { .fd = s, .events = POLLIN };
    CHECK(poll(&p, 1, 2000) == 1 && (p.revents & POLLIN));
    CHECK(ioctl(s, FIONREAD, &avail) == 0 && avail == 10);
    CHECK(recv(s, b, 4, MSG_PEEK) == 4 && memcmp(b, "0123", 4) == 0);
    CHECK(recv(s, b, 4, MSG_PEEK | MSG_TRUNC) == 10);
    struct iovec iv = { b, 4 };
    struct msghdr m = { .msg_iov = &iv, .msg_iovlen = 1 };
    CHECK(recvmsg(s, &m, 0) == 4 && (m.msg_flags & MSG_TRUNC) && memcmp(b, "0123", 4) == 0);
    CHECK(recv(s, b, sizeof b, 0) == 3 && memcmp(b, "abc", 3) == 0);
    CHECK(recv(s, b, sizeof b, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    /* zero-length datagram */
    CHECK(sendto(c, "", 0, 0, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(recv(s, b, sizeof b, 0) == 0);
    close(s); close(c);
    puts("OK flags");
}

static void t_timeout(void) {
    struct sockaddr_in sa;
    int s = udp4(&sa);
    struct timeval tv = { 0, 150000 };
    CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
    char b[8];
    CHECK(recv(s, b, 1, MSG_DONTWAIT) == -1 && errno == EAGAIN);
    double t0 = now();
    CHECK(recv(s, b, sizeof b, 0) == -1 && (errno == EAGAIN || errno == EWOULDBLOCK));
    double dt = now() - t0;
    CHECK(dt > 0.12 && dt < 1.0);
    close(s);
    puts("OK so_rcvtimeo");
}

static void t_iov_mmsg(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char a1[3] = "abc", a2[4] = "defg";
    struct iovec v[2] = { { a1, 3 }, { a2, 4 } };
    struct msghdr m = { .msg_name = &sa, .msg_namelen = sizeof sa, .msg_iov = v, .msg_iovlen = 2 };
    CHECK(sendmsg(c, &m, 0) == 7);
    char r1[2], r2[10];
    struct iovec rv[2] = { { r1, 2 }, { r2, 10 } };
    struct sockaddr_in from;
    struct msghdr rm = { .msg_name = &from, .msg_namelen = sizeof from, .msg_iov = rv, .msg_iovlen = 2 };
    CHECK(recvmsg(s, &rm, 0) == 7 && memcmp(r1, "ab", 2) == 0 && memcmp(r2, "cdefg", 5) == 0);
    CHECK(from.sin_port == ca.sin_port && rm.msg_flags == 0);
    struct mmsghdr mm[8];
    char data[8][32];
    struct iovec mv[8];
    for (int i = 0; i < 8; i++) {
        snprintf(data[i], 32, "mmsg-%d", i);
        mv[i] = (struct iovec){ data[i], strlen(data[i]) };
        mm[i].msg_hdr = (struct msghdr){ .msg_name = &sa, .msg_namelen = sizeof sa, .msg_iov = &mv[i], .msg_iovlen = 1 };
    }
    CHECK(sendmmsg(c, mm, 8, 0) == 8);
    char in[8][32];
    for (int i = 0; i < 8; i++) {
        mv[i] = (struct iovec){ in[i], 32 };
        mm[i].msg_hdr = (struct msghdr){ .msg_iov = &mv[i], .msg_iovlen = 1 };
    }
    int got = 0;
    while (got < 8) {
        int k = recvmmsg(s, mm + got, 8 - got, MSG_WAITFORONE, NULL);
        CHECK(k > 0);
        got += k;
    }
    for (int i = 0; i < 8; i++) {
        char e[32]; snprintf(e, 32, "mmsg-%d", i);
        CHECK(mm[i].msg_len == strlen(e) && memcmp(in[i], e, strlen(e)) == 0);
    }
    CHECK(writev(c, v, 2) == -1 && errno == EDESTADDRREQ);
    CHECK(connect(c, (struct sockaddr *)&sa, sizeof sa) == 0);
    CHECK(writev(c, v, 2) == 7);
    char x[3], y[10];
    struct iovec xv[2] = { { x, 3 }, { y, 10 } };
    CHECK(readv(s, xv, 2) == 7 && memcmp(x, "abc", 3) == 0 && memcmp(y, "defg", 4) == 0);
    /* recvmmsg's timeout is looked at after each datagram: an expired one
       returns after the first; a long one lets MSG_WAITFORONE take the rest
       and gets the time left written back. */
    for (int i = 0; i < 3; i++) CHECK(send(c, "t", 1, 0) == 1);
    /* A send returns once the datagram is accepted; under the engine it may
       still be on its way (as across any network) when a nonblocking read
       looks. Let all three arrive before MSG_WAITFORONE counts them. */
    usleep(50000);
    for (int i = 0; i < 8; i++) {
        mv[i] = (struct iovec){ in[i], 32 };
        mm[i].msg_hdr = (struct msghdr){ .msg_iov = &mv[i], .msg_iovlen = 1 };
    }
    struct timespec zero = { 0, 0 }, longer = { 5, 0 };
    CHECK(recvmmsg(s, mm, 8, 0, &zero) == 1);
    /* After its first datagram MSG_WAITFORONE takes only what has arrived:
       on a loaded machine the last one may not have been delivered after
       the 50 ms (the kernel itself once returned one of two in CI), and is
       then read by a second call. */
    int taken = recvmmsg(s, mm, 8, MSG_WAITFORONE, &longer);
    CHECK(taken == 1 || taken == 2);
    CHECK(longer.tv_sec <= 5 && (longer.tv_sec > 0 || longer.tv_nsec > 0));
    if (taken == 1) {
        struct timespec more = { 5, 0 };
        CHECK(recvmmsg(s, mm, 8, MSG_WAITFORONE, &more) == 1);
    }
    struct timespec bad = { 0, 1000000000 };
    CHECK(recvmmsg(s, mm, 8, MSG_DONTWAIT, &bad) == -1 && errno == EINVAL);
    close(s); close(c);
    puts("OK iov_mmsg");
}

static void t_readiness(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[64];
    CHECK(fcntl(s, F_SETFL, O_NONBLOCK) == 0);
    /* make the socket accelerated before testing readiness */
    CHECK(recv(s, b, sizeof b, 0) == -1 && errno == EAGAIN);
    struct pollfd p[2] = { { .fd = s, .events = POLLIN }, { .fd = c, .events = POLLOUT } };
    CHECK(poll(p, 1, 0) == 0);
    CHECK(poll(p, 2, 0) == 1 && p[1].revents == POLLOUT);
    fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs);
    struct timeval tv = { 0, 0 };
    CHECK(select(s + 1, &rs, NULL, NULL, &tv) == 0);
    int ep = epoll_create1(0), et = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 42 }, out[4];
    CHECK(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    ev.events = EPOLLIN | EPOLLET; ev.data.u64 = 43;
    CHECK(epoll_ctl(et, EPOLL_CTL_ADD, s, &ev) == 0);
    CHECK(epoll_wait(ep, out, 4, 0) == 0);
    for (int round = 0; round < 20; round++) {
        CHECK(sendto(c, "ping", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
        CHECK(sendto(c, "pong", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
        p[0].revents = 0;
        CHECK(poll(p, 1, 2000) == 1 && (p[0].revents & POLLIN));
        FD_ZERO(&rs); FD_SET(s, &rs); tv.tv_sec = 2;
        CHECK(select(s + 1, &rs, NULL, NULL, &tv) == 1 && FD_ISSET(s, &rs));
        int n = epoll_wait(ep, out, 4, 2000);
        CHECK(n >= 1 && out[0].data.u64 == 42 && (out[0].events & EPOLLIN));
        n = epoll_wait(et, out, 4, 2000);
        CHECK(n >= 1 && out[0].data.u64 == 43);
        /* level-triggered stays ready while data waits */
        CHECK(recv(s, b, sizeof b, 0) == 4 && memcmp(b, "ping", 4) == 0);
        double t0 = now();
        int k = 0;
        while (k == 0 && now() - t0 < 2) { k = recv(s, b, sizeof b, 0) == 4 ? 1 : 0; if (!k) { CHECK(errno == EAGAIN); poll(p, 1, 100); } }
        CHECK(k == 1 && memcmp(b, "pong", 4) == 0);
        CHECK(recv(s, b, sizeof b, 0) == -1 && errno == EAGAIN);
        /* edge-triggered: drained, so no event now */
        while (epoll_wait(et, out, 4, 0) > 0) {}
        CHECK(epoll_wait(ep, out, 4, 0) == 0);
        p[0].revents = 0;
        CHECK(poll(p, 1, 0) == 0);
    }
    CHECK(epoll_ctl(ep, EPOLL_CTL_DEL, s, NULL) == 0);
    CHECK(sendto(c, "x", 1, 0, (struct sockaddr *)&sa, sizeof sa) == 1);
    CHECK(poll(p, 1, 2000) == 1);
    CHECK(epoll_wait(ep, out, 4, 50) == 0);
    close(ep); close(et); close(s); close(c);
    puts("OK readiness");
}

static void t_blocking_wakeup(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        usleep(100000);
        for (int i = 0; i < 50; i++) sendto(c, &i, sizeof i, 0, (struct sockaddr *)&sa, sizeof sa);
        _exit(0);
    }
    for (int i = 0; i < 50; i++) {
        int v = -1;
        CHECK(recv(s, &v, sizeof v, 0) == sizeof v && v == i);
    }
    int st; CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(s); close(c);
    puts("OK blocking_wakeup");
}

static void t_fork(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[64];
    /* accelerate both before fork */
    CHECK(sendto(c, "pre", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(s, b, sizeof b, 0) == 3);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        /* child: inherited sockets keep working (blocking semantics too) */
        char cb[64];
        if (sendto(c, "child", 5, 0, (struct sockaddr *)&sa, sizeof sa) != 5) _exit(2);
        struct sockaddr_in sa2, ca2;
        int s2 = udp4(&sa2), c2 = udp4(&ca2);
        if (sendto(c2, "new", 3, 0, (struct sockaddr *)&sa2, sizeof sa2) != 3) _exit(3);
        if (recv(s2, cb, sizeof cb, 0) != 3 || memcmp(cb, "new", 3)) _exit(4);
        int fl = fcntl(c, F_GETFL);
        if (fl & O_NONBLOCK) _exit(5);
        ssize_t r = recv(c, cb, sizeof cb, 0); /* blocks until the parent answers */
        if (r != 6 || memcmp(cb, "parent", 6)) _exit(6);
        _exit(0);
    }
    CHECK(recv(s, b, sizeof b, 0) == 5 && memcmp(b, "child", 5) == 0);
    usleep(100000);
    CHECK(sendto(s, "parent", 6, 0, (struct sockaddr *)&ca, sizeof ca) == 6);
    int st; CHECK(waitpid(pid, &st, 0) == pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "child status %d\n", st); exit(1); }
    CHECK(sendto(c, "after", 5, 0, (struct sockaddr *)&sa, sizeof sa) == 5);
    CHECK(recv(s, b, sizeof b, 0) == 5 && memcmp(b, "after", 5) == 0);
    close(s); close(c);
    puts("OK fork");
}

static void t_dup(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[16];
    CHECK(sendto(c, "one", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(s, b, sizeof b, 0) == 3);
    int d = dup(s), d2 = fcntl(s, F_DUPFD_CLOEXEC, 100), d3 = dup2(s, 200);
    CHECK(d >= 0 && d2 >= 100 && d3 == 200);
    close(s);
    CHECK(sendto(c, "two", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(d, b, sizeof b, 0) == 3 && memcmp(b, "two", 3) == 0);
    close(d);
    CHECK(sendto(c, "six", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(d3, b, sizeof b, 0) == 3 && memcmp(b, "six", 3) == 0);
    close(d3);
    CHECK(sendto(c, "ten", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(d2, b, sizeof b, 0) == 3 && memcmp(b, "ten", 3) == 0);
    close(d2); close(c);
    puts("OK dup");
}

static void t_pktinfo(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    int on = 1;
    CHECK(setsockopt(s, IPPROTO_IP, IP_PKTINFO, &on, sizeof on) == 0);
    CHECK(sendto(c, "pk", 2, 0, (struct sockaddr *)&sa, sizeof sa) == 2);
    char b[16], ctl[256];
    struct iovec v = { b, sizeof b };
    struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof ctl };
    CHECK(recvmsg(s, &m, 0) == 2);
    int found = 0;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
        if (h->cmsg_level == IPPROTO_IP && h->cmsg_type == IP_PKTINFO) {
            struct in_pktinfo pi; memcpy(&pi, CMSG_DATA(h), sizeof pi);
            found = pi.ipi_addr.s_addr == htonl(INADDR_LOOPBACK);
            printf("pktinfo ifindex %d spec %08x addr %08x len %zu\n", pi.ipi_ifindex, ntohl(pi.ipi_spec_dst.s_addr), ntohl(pi.ipi_addr.s_addr), (size_t)h->cmsg_len);
        }
    CHECK(found);
    /* a burst keeps each datagram's information; then a control buffer too
       small for the message: cut and flagged as the kernel does */
    for (int i = 0; i < 20; i++) CHECK(sendto(c, "pk", 2, 0, (struct sockaddr *)&sa, sizeof sa) == 2);
    for (int i = 0; i < 19; i++) {
        m.msg_control = ctl; m.msg_controllen = sizeof ctl;
        CHECK(recvmsg(s, &m, 0) == 2 && CMSG_FIRSTHDR(&m) && CMSG_FIRSTHDR(&m)->cmsg_type == IP_PKTINFO && !(m.msg_flags & MSG_CTRUNC));
    }
    m.msg_control = ctl; m.msg_controllen = sizeof(struct cmsghdr) + 4;
    CHECK(recvmsg(s, &m, 0) == 2);
    printf("short control: flags %x controllen %zu\n", m.msg_flags & MSG_CTRUNC, (size_t)m.msg_controllen);
    /* without the option: no control data */
    int off = 0;
    CHECK(setsockopt(s, IPPROTO_IP, IP_PKTINFO, &off, sizeof off) == 0);
    CHECK(sendto(c, "pk", 2, 0, (struct sockaddr *)&sa, sizeof sa) == 2);
    m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    CHECK(recvmsg(s, &m, 0) == 2 && m.msg_controllen == 0);
    close(s); close(c);
    /* a dual-stack socket asking IPV6_RECVPKTINFO, reached over IPv4 */
    int s6 = socket(AF_INET6, SOCK_DGRAM, 0);
    CHECK(s6 >= 0);
    CHECK(setsockopt(s6, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) == 0);
    CHECK(setsockopt(s6, IPPROTO_IPV6, IPV6_RECVPKTINFO, &on, sizeof on) == 0);
    struct sockaddr_in6 b6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
    CHECK(bind(s6, (struct sockaddr *)&b6, sizeof b6) == 0);
    socklen_t l6 = sizeof b6;
    CHECK(getsockname(s6, (struct sockaddr *)&b6, &l6) == 0);
    c = udp4(&ca);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = b6.sin6_port, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(sendto(c, "p6", 2, 0, (struct sockaddr *)&to, sizeof to) == 2);
    m.msg_control = ctl; m.msg_controllen = sizeof ctl;
    CHECK(recvmsg(s6, &m, 0) == 2);
    found = 0;
    for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
        if (h->cmsg_level == IPPROTO_IPV6 && h->cmsg_type == IPV6_PKTINFO) {
            struct in6_pktinfo pi; memcpy(&pi, CMSG_DATA(h), sizeof pi);
            char a[64]; inet_ntop(AF_INET6, &pi.ipi6_addr, a, sizeof a);
            printf("pktinfo6 ifindex %u addr %s\n", pi.ipi6_ifindex, a);
            found = 1;
        }
    CHECK(found);
    close(s6); close(c);
    puts("OK pktinfo");
}

static void t_v6(void) {
    int s = socket(AF_INET6, SOCK_DGRAM, 0);
    CHECK(s >= 0);
    int off = 0;
    CHECK(setsockopt(s, IPPROTO_IPV6, IPV6_V6ONLY, &off, sizeof off) == 0);
    struct sockaddr_in6 b = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_ANY_INIT };
    CHECK(bind(s, (struct sockaddr *)&b, sizeof b) == 0);
    socklen_t l = sizeof b;
    CHECK(getsockname(s, (struct sockaddr *)&b, &l) == 0);
    struct sockaddr_in ca; int c = udp4(&ca);
    struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = b.sin6_port, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    CHECK(sendto(c, "v4", 2, 0, (struct sockaddr *)&to, sizeof to) == 2);
    struct sockaddr_in6 from; socklen_t fl = sizeof from; char buf[8];
    CHECK(recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl) == 2);
    CHECK(fl == sizeof from && from.sin6_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&from.sin6_addr) && from.sin6_port == ca.sin_port);
    int c6 = socket(AF_INET6, SOCK_DGRAM, 0);
    struct sockaddr_in6 lo = { .sin6_family = AF_INET6, .sin6_port = b.sin6_port, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    CHECK(sendto(c6, "v6", 2, 0, (struct sockaddr *)&lo, sizeof lo) == 2);
    fl = sizeof from;
    CHECK(recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl) == 2 && IN6_IS_ADDR_LOOPBACK(&from.sin6_addr));
    close(s); close(c); close(c6);
    puts("OK v6");
}

static volatile sig_atomic_t got_alarm;
static void on_alarm(int sig) { (void)sig; got_alarm = 1; }
/* 2 when the kernel's siginfo reached the handler */
static void on_alarm_info(int sig, siginfo_t *si, void *uc) { (void)uc; got_alarm = si && si->si_signo == sig ? 2 : 1; }

static void t_signals(void) {
    struct sockaddr_in sa;
    int s = udp4(&sa);
    char b[8];
    /* without SA_RESTART: EINTR */
    struct sigaction act = { .sa_handler = on_alarm };
    sigemptyset(&act.sa_mask);
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    struct itimerval it = { { 0, 0 }, { 0, 100000 } };
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    CHECK(recv(s, b, sizeof b, 0) == -1 && errno == EINTR && got_alarm);
    /* the handler reads back as installed */
    struct sigaction q;
    CHECK(sigaction(SIGALRM, NULL, &q) == 0 && q.sa_handler == on_alarm);
    CHECK(!(q.sa_flags & SA_SIGINFO) && !(q.sa_flags & SA_RESTART));
    /* an SA_SIGINFO handler without SA_RESTART: EINTR, and its siginfo */
    struct sigaction ia = { .sa_sigaction = on_alarm_info, .sa_flags = SA_SIGINFO };
    sigemptyset(&ia.sa_mask);
    CHECK(sigaction(SIGALRM, &ia, &q) == 0 && q.sa_handler == on_alarm);
    got_alarm = 0;
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    CHECK(recv(s, b, sizeof b, 0) == -1 && errno == EINTR && got_alarm == 2);
    /* with SA_RESTART: the receive continues (until the datagram comes) */
    act.sa_flags = SA_RESTART; got_alarm = 0;
    CHECK(sigaction(SIGALRM, &act, &q) == 0 && q.sa_sigaction == on_alarm_info && (q.sa_flags & SA_SIGINFO));
    struct sockaddr_in ca; int c = udp4(&ca);
    pid_t pid = fork();
    if (pid == 0) { usleep(300000); sendto(c, "late", 4, 0, (struct sockaddr *)&sa, sizeof sa); _exit(0); }
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    CHECK(recv(s, b, sizeof b, 0) == 4 && got_alarm);
    waitpid(pid, NULL, 0);
    signal(SIGALRM, SIG_DFL);
    close(s); close(c);
    puts("OK signals");
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* A signal ends a waiting poll/select with EINTR, even a restarting
 * handler's (the kernel never restarts them), however long the wait would
 * have been, and a datagram ends it at once. Run with EUDP_SPIN_US set this
 * checks the spinning wait as well. */
static void t_poll_signal(void) {
    struct sockaddr_in sa;
    int s = udp4(&sa);
    char b[8];
    CHECK(sendto(s, "self", 4, 0, (struct sockaddr *)&sa, sizeof sa) == 4);
    CHECK(recv(s, b, sizeof b, 0) == 4);
    struct sigaction act = { .sa_handler = on_alarm, .sa_flags = SA_RESTART };
    sigemptyset(&act.sa_mask);
    CHECK(sigaction(SIGALRM, &act, NULL) == 0);
    struct itimerval it = { { 0, 0 }, { 0, 100000 } };
    got_alarm = 0;
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    double t0 = now_s();
    struct pollfd p = { .fd = s, .events = POLLIN };
    CHECK(poll(&p, 1, 3000) == -1 && errno == EINTR && got_alarm);
    CHECK(now_s() - t0 < 1.5);
    got_alarm = 0;
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    t0 = now_s();
    fd_set r; FD_ZERO(&r); FD_SET(s, &r);
    struct timeval tv = { 3, 0 };
    CHECK(select(s + 1, &r, NULL, NULL, &tv) == -1 && errno == EINTR && got_alarm);
    CHECK(now_s() - t0 < 1.5);
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = s }, out[2];
    CHECK(ep >= 0 && epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) == 0);
    got_alarm = 0;
    CHECK(setitimer(ITIMER_REAL, &it, NULL) == 0);
    t0 = now_s();
    CHECK(epoll_wait(ep, out, 2, 3000) == -1 && errno == EINTR && got_alarm);
    CHECK(now_s() - t0 < 1.5);
    struct sockaddr_in ca; int c = udp4(&ca);
    pid_t pid = fork();
    if (pid == 0) { usleep(100000); sendto(c, "late", 4, 0, (struct sockaddr *)&sa, sizeof sa); _exit(0); }
    t0 = now_s();
    CHECK(poll(&p, 1, 3000) == 1 && (p.revents & POLLIN));
    CHECK(now_s() - t0 < 1.5 && recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);
    pid = fork();
    if (pid == 0) { usleep(100000); sendto(c, "late", 4, 0, (struct sockaddr *)&sa, sizeof sa); _exit(0); }
    t0 = now_s();
    CHECK(epoll_wait(ep, out, 2, 3000) == 1 && out[0].data.fd == s);
    CHECK(now_s() - t0 < 1.5 && recv(s, b, sizeof b, 0) == 4);
    waitpid(pid, NULL, 0);
    close(ep);
    signal(SIGALRM, SIG_DFL);
    close(s); close(c);
    puts("OK poll_signal");
}

static void t_threads_nb_burst(void) {
    /* nonblocking burst: everything sent arrives (loopback, big rcvbuf) */
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    int big = 4 << 20;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
    fcntl(c, F_SETFL, O_NONBLOCK);
    char buf[1472];
    int sent = 0;
    for (int i = 0; i < 60; i++) {
        fill(buf, 1000, i);
        ssize_t r = sendto(c, buf, 1000, 0, (struct sockaddr *)&sa, sizeof sa);
        if (r == 1000) sent++;
        else { CHECK(errno == EAGAIN || errno == ENOBUFS); usleep(100); i--; }
    }
    for (int i = 0; i < sent; i++) {
        char exp[1000];
        CHECK(recv(s, buf, sizeof buf, 0) == 1000);
        fill(exp, 1000, i);
        CHECK(memcmp(buf, exp, 1000) == 0);
    }
    close(s); close(c);
    puts("OK burst");
}

static struct sockaddr_in echo_addr;
static int echo_fd;
static void *echo_main(void *arg) {
    (void)arg;
    char b[2048];
    for (;;) {
        struct sockaddr_in from; socklen_t fl = sizeof from;
        ssize_t n = recvfrom(echo_fd, b, sizeof b, 0, (struct sockaddr *)&from, &fl);
        if (n < 0) { if (errno == EINTR) continue; return NULL; }
        if (n == 4 && memcmp(b, "stop", 4) == 0) return NULL;
        sendto(echo_fd, b, n, 0, (struct sockaddr *)&from, fl);
    }
}
static void *client_main(void *arg) {
    long id = (long)arg;
    struct sockaddr_in ca; int c = udp4(&ca);
    struct timeval tv = { 5, 0 };
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b[2048], e[2048];
    for (int i = 0; i < 300; i++) {
        int n = 1 + (int)((id * 1000 + i * 13) % 1400);
        fill(e, n, (int)id * 1000 + i);
        if (sendto(c, e, n, 0, (struct sockaddr *)&echo_addr, sizeof echo_addr) != n) return (void *)1;
        if (recv(c, b, sizeof b, 0) != n || memcmp(b, e, n)) return (void *)2;
    }
    close(c);
    return NULL;
}
static void t_threads(void) {
    echo_fd = udp4(&echo_addr);
    pthread_t srv, cl[4];
    CHECK(pthread_create(&srv, NULL, echo_main, NULL) == 0);
    for (long i = 0; i < 4; i++) CHECK(pthread_create(&cl[i], NULL, client_main, (void *)i) == 0);
    for (int i = 0; i < 4; i++) { void *r; CHECK(pthread_join(cl[i], &r) == 0); CHECK(r == NULL); }
    struct sockaddr_in ca; int c = udp4(&ca);
    CHECK(sendto(c, "stop", 4, 0, (struct sockaddr *)&echo_addr, sizeof echo_addr) == 4);
    CHECK(pthread_join(srv, NULL) == 0);
    close(c); close(echo_fd);
    puts("OK threads");
}

/* close() while other threads are sending and receiving on the socket:
 * they see EBADF, and the port is free again the moment close returns
 * (as with the kernel, which the engine's endpoint must not outlive). */
static int busy_fd;
static struct sockaddr_in busy_peer;
static volatile int busy_stop;
/* Threads of close_busy that have started (the feeder once its socket is
   open): busy_fd is closed only after all three, so no socket a late
   thread opens can take busy_fd's number. */
static int busy_started;
static void *busy_send(void *arg) {
    (void)arg;
    char b[256] = { 0 };
    __atomic_add_fetch(&busy_started, 1, __ATOMIC_SEQ_CST);
    for (long i = 0; i < 50000000; i++) {
        if (sendto(busy_fd, b, sizeof b, MSG_DONTWAIT, (struct sockaddr *)&busy_peer, sizeof busy_peer) < 0 && errno == EBADF) return NULL;
    }
    return (void *)1;
}
static void *busy_recv(void *arg) {
    (void)arg;
    char b[2048];
    __atomic_add_fetch(&busy_started, 1, __ATOMIC_SEQ_CST);
    for (long i = 0; i < 50000000; i++) {
        if (recv(busy_fd, b, sizeof b, MSG_DONTWAIT) < 0 && errno == EBADF) return NULL;
    }
    return (void *)1;
}
static void *busy_feed(void *arg) {
    struct sockaddr_in *to = arg;
    struct sockaddr_in fa;
    int f = udp4(&fa);
    char b[256] = { 0 };
    __atomic_add_fetch(&busy_started, 1, __ATOMIC_SEQ_CST);
    while (!busy_stop) sendto(f, b, sizeof b, MSG_DONTWAIT, (struct sockaddr *)to, sizeof *to);
    close(f);
    return NULL;
}
static void t_close_busy(void) {
    for (int round = 0; round < 5; round++) {
        struct sockaddr_in ca;
        int sink = udp4(&busy_peer);
        busy_fd = udp4(&ca);
        busy_stop = 0;
        __atomic_store_n(&busy_started, 0, __ATOMIC_SEQ_CST);
        pthread_t ts, tr, tf;
        CHECK(pthread_create(&tf, NULL, busy_feed, &ca) == 0);
        CHECK(pthread_create(&ts, NULL, busy_send, NULL) == 0);
        CHECK(pthread_create(&tr, NULL, busy_recv, NULL) == 0);
        while (__atomic_load_n(&busy_started, __ATOMIC_SEQ_CST) < 3) usleep(1000);
        usleep(20000);
        CHECK(close(busy_fd) == 0);
        void *r1, *r2;
        CHECK(pthread_join(ts, &r1) == 0 && r1 == NULL);
        CHECK(pthread_join(tr, &r2) == 0 && r2 == NULL);
        busy_stop = 1;
        CHECK(pthread_join(tf, NULL) == 0);
        int again = socket(AF_INET, SOCK_DGRAM, 0);
        CHECK(again >= 0);
        CHECK(bind(again, (struct sockaddr *)&ca, sizeof ca) == 0);
        close(again);
        close(sink);
    }
    puts("OK close_busy");
}

/* exec: sockets survive as plain kernel sockets with the program's flags */
/* A nonblocking sender that meets EAGAIN waits for POLLOUT; once poll says
   writable, the next send is accepted (the shim must not report POLLOUT while
   its send queue has no room). */
/* A select loop over a busy UDP socket and a pipe: every datagram comes
 * out (select never reports a socket that then has nothing), the pipe is
 * reported while the socket is still busy, and the time written back by
 * a select that did not sleep stays within the timeout. */
static void t_select_busy(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    int rcv = 1 << 20;
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &rcv, sizeof rcv);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    enum { N = 300 };
    char buf[64];
    for (int i = 0; i < N; i++) {
        memcpy(buf, &i, sizeof i);
        CHECK(sendto(c, buf, sizeof buf, 0, (struct sockaddr *)&sa, sizeof sa) == sizeof buf);
    }
    int got = 0, pipe_seen_at = -1, calls = 0;
    CHECK(write(pfd[1], "x", 1) == 1);
    while (got < N && calls < 4 * N) {
        fd_set rs; FD_ZERO(&rs); FD_SET(s, &rs); FD_SET(pfd[0], &rs);
        struct timeval tv = { .tv_sec = 2, .tv_usec = 0 };
        int k = select((s > pfd[0] ? s : pfd[0]) + 1, &rs, NULL, NULL, &tv);
        calls++;
        CHECK(k >= 1);
        CHECK(tv.tv_sec >= 0 && (tv.tv_sec < 2 || (tv.tv_sec == 2 && tv.tv_usec == 0)));
        if (FD_ISSET(pfd[0], &rs) && pipe_seen_at < 0) {
            pipe_seen_at = got;
            char x; CHECK(read(pfd[0], &x, 1) == 1);
        }
        if (FD_ISSET(s, &rs)) {
            ssize_t r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
            CHECK(r == sizeof buf);
            int v; memcpy(&v, buf, sizeof v);
            CHECK(v == got);
            got++;
        }
    }
    CHECK(got == N);
    /* The kernel reports the pipe at once; the shim within its bound. */
    CHECK(pipe_seen_at >= 0 && pipe_seen_at <= 100);
    close(s); close(c); close(pfd[0]); close(pfd[1]);
    puts("OK select_busy");
}

/* A sender's select loop (socket in the write set, a pipe in the read
 * set), as iperf3 runs it: every send after "writable" is accepted by the
 * nonblocking socket, and the pipe is reported while the socket stays
 * writable — within the shim's bound when it answers from its queue. */
static void t_select_send(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) == 0);
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    char b[1000];
    memset(b, 's', sizeof b);
    int sent = 0, pipe_seen_at = -1, calls = 0;
    enum { N = 4000 };
    while (sent < N && calls < 4 * N) {
        if (sent == 50 && pipe_seen_at < 0) CHECK(write(pfd[1], "x", 1) == 1);
        fd_set rs, ws; FD_ZERO(&rs); FD_ZERO(&ws); FD_SET(pfd[0], &rs); FD_SET(c, &ws);
        struct timeval tv = { .tv_sec = 2, .tv_usec = 0 };
        int k = select((c > pfd[0] ? c : pfd[0]) + 1, &rs, &ws, NULL, &tv);
        calls++;
        CHECK(k >= 1);
        if (FD_ISSET(pfd[0], &rs) && pipe_seen_at < 0) {
            pipe_seen_at = sent;
            char x; CHECK(read(pfd[0], &x, 1) == 1);
        }
        if (FD_ISSET(c, &ws)) {
            CHECK(sendto(c, b, sizeof b, 0, (struct sockaddr *)&sa, sizeof sa) == (ssize_t)sizeof b);
            sent++;
        }
    }
    CHECK(sent == N);
    /* The shim asks the kernel at least every 1024th call or coarse tick;
     * about one call per send. */
    CHECK(pipe_seen_at >= 50 && pipe_seen_at <= 50 + 1024 + 100);
    close(s); close(c); close(pfd[0]); close(pfd[1]);
    puts("OK select_send");
}

/* select over descriptors on both sides of 64-bit word boundaries (63,
 * 64, 130) and a low pipe: exactly the ready ones are reported, in every
 * set, and a bit at or beyond nfds is ignored as the kernel ignores it. */
static void t_select_high(void) {
    struct sockaddr_in sa, ca;
    int s0 = udp4(&sa), c = udp4(&ca);
    int hi[3] = { 63, 64, 130 };
    int pfd[2];
    CHECK(pipe(pfd) == 0);
    CHECK(dup2(s0, 63) == 63 && dup2(c, 64) == 64);
    struct sockaddr_in xa; int x = udp4(&xa);
    CHECK(dup2(x, 130) == 130);
    close(s0); close(c); close(x);
    /* data for 63 only; 64 and 130 idle */
    CHECK(sendto(64, "abc", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(write(pfd[1], "p", 1) == 1);
    double t0 = now();
    int k = -1;
    fd_set rs, ws;
    for (int tries = 0; tries < 200; tries++) {
        FD_ZERO(&rs); FD_ZERO(&ws);
        for (int i = 0; i < 3; i++) FD_SET(hi[i], &rs);
        FD_SET(pfd[0], &rs);
        FD_SET(64, &ws);
        FD_SET(131, &rs); /* == nfds: not examined */
        FD_SET(200, &rs); /* beyond nfds' last word: left as it was */
        struct timeval tv = { .tv_sec = 1, .tv_usec = 0 };
        k = select(131, &rs, &ws, NULL, &tv);
        if (k == 3) break;
        usleep(1000);
    }
    CHECK(k == 3);
    CHECK(!FD_ISSET(131, &rs) && FD_ISSET(200, &rs));
    CHECK(FD_ISSET(63, &rs) && FD_ISSET(pfd[0], &rs) && FD_ISSET(64, &ws));
    CHECK(!FD_ISSET(64, &rs) && !FD_ISSET(130, &rs) && !FD_ISSET(63, &ws));
    char b[8];
    CHECK(recv(63, b, sizeof b, 0) == 3 && memcmp(b, "abc", 3) == 0);
    /* nothing ready but the write side of 130: one in the write set */
    char pc; CHECK(read(pfd[0], &pc, 1) == 1);
    FD_ZERO(&rs); FD_ZERO(&ws);
    FD_SET(63, &rs); FD_SET(130, &rs); FD_SET(130, &ws);
    struct timeval tv = { .tv_sec = 1, .tv_usec = 0 };
    CHECK(select(131, &rs, &ws, NULL, &tv) == 1);
    CHECK(FD_ISSET(130, &ws) && !FD_ISSET(130, &rs) && !FD_ISSET(63, &rs));
    CHECK(now() - t0 < 5);
    close(63); close(64); close(130); close(pfd[0]); close(pfd[1]);
    puts("OK select_high");
}

/* Several sockets with datagrams waiting and one without, in a select
 * that names them in the read set only (the shim answers such calls from
 * its rings): exactly the ones with data are reported, every time, and
 * bits beyond nfds' last word stay as the caller left them. */
static void t_select_rings(void) {
    struct sockaddr_in a1, a2, a3, ca;
    int s1 = udp4(&a1), s2 = udp4(&a2), s3 = udp4(&a3), c = udp4(&ca);
    enum { N = 20 };
    char b[32];
    for (int i = 0; i < N; i++) {
        CHECK(sendto(c, "one", 3, 0, (struct sockaddr *)&a1, sizeof a1) == 3);
        CHECK(sendto(c, "two", 3, 0, (struct sockaddr *)&a2, sizeof a2) == 3);
    }
    int hi = s1 > s2 ? s1 : s2;
    hi = hi > s3 ? hi : s3;
    int got1 = 0, got2 = 0;
    for (int tries = 0; tries < 4 * N && (got1 < N || got2 < N); tries++) {
        fd_set rs; FD_ZERO(&rs);
        FD_SET(s1, &rs); FD_SET(s2, &rs); FD_SET(s3, &rs);
        FD_SET(700, &rs);
        struct timeval tv = { .tv_sec = 1, .tv_usec = 0 };
        int k = select(hi + 1, &rs, NULL, NULL, &tv);
        CHECK(k >= 1 && k <= 2);
        CHECK(!FD_ISSET(s3, &rs) && FD_ISSET(700, &rs));
        CHECK(k == FD_ISSET(s1, &rs) + FD_ISSET(s2, &rs));
        if (FD_ISSET(s1, &rs)) { CHECK(recv(s1, b, sizeof b, MSG_DONTWAIT) == 3 && memcmp(b, "one", 3) == 0); got1++; }
        if (FD_ISSET(s2, &rs)) { CHECK(recv(s2, b, sizeof b, MSG_DONTWAIT) == 3 && memcmp(b, "two", 3) == 0); got2++; }
    }
    CHECK(got1 == N && got2 == N);
    close(s1); close(s2); close(s3); close(c);
    puts("OK select_rings");
}

static void t_pollout(void) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    int small = 4096;
    CHECK(setsockopt(c, SOL_SOCKET, SO_SNDBUF, &small, sizeof small) == 0);
    CHECK(fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK) == 0);
    char b[1400];
    memset(b, 'p', sizeof b);
    int broken = 0;
    for (int i = 0; i < 20000; i++) {
        if (sendto(c, b, sizeof b, 0, (struct sockaddr *)&sa, sizeof sa) == (ssize_t)sizeof b) continue;
        CHECK(errno == EAGAIN);
        struct pollfd p = { .fd = c, .events = POLLOUT };
        CHECK(poll(&p, 1, 2000) == 1 && (p.revents & POLLOUT));
        if (sendto(c, b, sizeof b, 0, (struct sockaddr *)&sa, sizeof sa) != (ssize_t)sizeof b) broken++;
    }
    CHECK(broken == 0);
    close(s); close(c);
    puts("OK pollout");
}

extern char **environ;

/* how: "execv", or a variadic form, which glibc runs without its execve */
static void t_exec(const char *self, const char *how) {
    struct sockaddr_in sa, ca;
    int s = udp4(&sa), c = udp4(&ca);
    char b[16];
    CHECK(sendto(c, "pre", 3, 0, (struct sockaddr *)&sa, sizeof sa) == 3);
    CHECK(recv(s, b, sizeof b, 0) == 3);
    char fs[16], fc[16];
    snprintf(fs, sizeof fs, "%d", s); snprintf(fc, sizeof fc, "%d", c);
    char *argv[] = { (char *)self, "exec_child", fs, fc, NULL };
    if (strcmp(how, "execl") == 0) execl(self, self, "exec_child", fs, fc, (char *)NULL);
    else if (strcmp(how, "execlp") == 0) execlp(self, self, "exec_child", fs, fc, (char *)NULL);
    else if (strcmp(how, "execle") == 0) execle(self, self, "exec_child", fs, fc, (char *)NULL, environ);
    else execv(self, argv);
    CHECK(0);
}

static int exec_child(int s, int c) {
    CHECK(!(fcntl(s, F_GETFL) & O_NONBLOCK) && !(fcntl(c, F_GETFL) & O_NONBLOCK));
    struct sockaddr_in sa; socklen_t l = sizeof sa;
    CHECK(getsockname(s, (struct sockaddr *)&sa, &l) == 0);
    char b[16];
    for (int i = 0; i < 5; i++) {
        CHECK(sendto(c, "after", 5, 0, (struct sockaddr *)&sa, sizeof sa) == 5);
        CHECK(recv(s, b, sizeof b, 0) == 5 && memcmp(b, "after", 5) == 0);
    }
    puts("OK exec");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    const char *only = argc > 1 ? argv[1] : NULL;
    if (only && strcmp(only, "exec_child") == 0) return exec_child(atoi(argv[2]), atoi(argv[3]));
    if (only && strcmp(only, "exec") == 0) t_exec(argv[0], "execv");
    if (only && strncmp(only, "execl", 5) == 0) t_exec(argv[0], only);
#define RUN(t) if (!only || strcmp(only, #t) == 0) t_##t()
    RUN(sendto_recvfrom);
    RUN(connected);
    RUN(flags);
    RUN(timeout);
    RUN(iov_mmsg);
    RUN(readiness);
    RUN(blocking_wakeup);
    RUN(fork);
    RUN(dup);
    RUN(pktinfo);
    RUN(v6);
    RUN(signals);
    RUN(poll_signal);
    RUN(threads_nb_burst);
    RUN(threads);
    RUN(pollout);
    RUN(select_busy);
    RUN(select_send);
    RUN(select_high);
    RUN(select_rings);
    RUN(close_busy);
    puts("ALL OK");
    return 0;
}
