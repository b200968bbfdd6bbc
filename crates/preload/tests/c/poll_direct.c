/* poll_direct: an echo thread waiting in poll, ppoll, select or pselect
 * (named by argv[1]) on a nonblocking socket, reading until EAGAIN,
 * answers N requests (argv[2]) of a client on another socket, sent
 * argv[3] microseconds apart; the client waits for each answer with the
 * same call. Prints what a kernel socket gives (the test compares with
 * the kernel run and reads the shim's counters). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <unistd.h>

#include "udp_echo.h"

static const char *how;

/* Waits up to 5 s for input on fd with the call under test: 1 when
 * readable. */
static int wait_in(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    struct timespec ts = {5, 0};
    if (!strcmp(how, "poll"))
        return poll(&p, 1, 5000) == 1 && (p.revents & POLLIN);
    if (!strcmp(how, "ppoll"))
        return ppoll(&p, 1, &ts, NULL) == 1 && (p.revents & POLLIN);
    fd_set r;
    FD_ZERO(&r);
    FD_SET(fd, &r);
    if (!strcmp(how, "select")) {
        struct timeval tv = {5, 0};
        return select(fd + 1, &r, NULL, NULL, &tv) == 1 && FD_ISSET(fd, &r);
    }
    return pselect(fd + 1, &r, NULL, NULL, &ts, NULL) == 1 && FD_ISSET(fd, &r);
}

static int srv_fd;

static void *echo(void *arg) {
    (void)arg;
    for (;;) {
        if (!wait_in(srv_fd)) {
            printf("echo: no request within 5 s\n");
            exit(1);
        }
        if (echo_drain(srv_fd))
            return NULL;
    }
}

int main(int argc, char **argv) {
    if (argc < 4)
        return 2;
    how = argv[1];
    int n = atoi(argv[2]), gap = atoi(argv[3]);
    struct sockaddr_in srv, ca;
    srv_fd = bound(&srv);
    fcntl(srv_fd, F_SETFL, O_NONBLOCK);
    pthread_t t;
    pthread_create(&t, NULL, echo, NULL);
    int c = bound(&ca);
    connect(c, (struct sockaddr *)&srv, sizeof srv);
    for (int i = 0; i < n; i++) {
        char b[32], r[256];
        if (gap)
            usleep(gap);
        snprintf(b, sizeof b, "q%d", i);
        send(c, b, strlen(b), 0);
        if (!wait_in(c)) {
            printf("client: no answer within 5 s\n");
            exit(1);
        }
        ssize_t got = recv(c, r, sizeof r - 1, MSG_DONTWAIT);
        if (got < 0 || (r[got] = 0, strcmp(r, b))) {
            printf("client: answer %d wrong or missing\n", i);
            exit(1);
        }
    }
    send(c, "QUIT", 4, 0);
    pthread_join(t, NULL);
    printf("%s %d answered\n", how, n);
    return 0;
}
