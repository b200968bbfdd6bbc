/* Shared by the request/response test programs (rr_paths.c,
 * poll_direct.c): a UDP socket bound to a free loopback port, and one
 * echo round that answers every queued request until EAGAIN. */
#ifndef UDP_ECHO_H
#define UDP_ECHO_H
#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A socket bound to 127.0.0.1 on a free port; its address in *a. */
static int bound(struct sockaddr_in *a) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    memset(a, 0, sizeof *a);
    a->sin_family = AF_INET;
    a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || bind(fd, (struct sockaddr *)a, sizeof *a) < 0) {
        perror("socket/bind");
        exit(1);
    }
    socklen_t l = sizeof *a;
    getsockname(fd, (struct sockaddr *)a, &l);
    return fd;
}

/* Echoes what the nonblocking socket fd holds back to each sender until
 * EAGAIN (0) or a "QUIT" request (1). */
static int echo_drain(int fd) {
    for (;;) {
        char b[256];
        struct sockaddr_in f;
        socklen_t fl = sizeof f;
        ssize_t n = recvfrom(fd, b, sizeof b, 0, (struct sockaddr *)&f, &fl);
        if (n < 0 && errno == EAGAIN)
            return 0;
        if (n < 0) {
            perror("echo recvfrom");
            exit(1);
        }
        if (n == 4 && !memcmp(b, "QUIT", 4))
            return 1;
        sendto(fd, b, n, 0, (struct sockaddr *)&f, fl);
    }
}
#endif
