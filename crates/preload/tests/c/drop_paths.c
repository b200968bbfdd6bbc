/* Provokes one drop path of a socket under the shim, sending to itself
 * over loopback (run it in a network namespace of its own so that the
 * kernel's UDP counters are its alone), and prints what it sent, what it
 * received and the kernel's RcvbufErrors delta:
 *   drop_paths fallback_close N K   N datagrams reach the socket on the
 *       engine; it moves to the kernel path (shutdown()), receives K of
 *       the kept datagrams and closes
 *   drop_paths kernel_rcvbuf N      the socket moves to the kernel path,
 *       then a burst of N 1000-byte datagrams meets its small SO_RCVBUF;
 *       it receives what the kernel queued
 *   drop_paths close_unread N K     N datagrams reach the socket on the
 *       engine; it receives K and closes with the rest unread
 *   drop_paths exit_unread N K      the same, but the program exits with
 *       the socket open
 *   drop_paths tcp_exit N           (EUDP_TRANSPORT=tcp) N datagrams to a
 *       host no route reaches wait on their lane as the program exits
 * Output: "sent S received R rcvbuf_errors E". */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static long rcvbuf_errors(void) {
    FILE *f = fopen("/proc/net/snmp", "r");
    char head[1024], vals[1024];
    long r = -1;
    while (f && fgets(head, sizeof head, f)) {
        if (strncmp(head, "Udp:", 4) != 0 || !fgets(vals, sizeof vals, f))
            continue;
        char *hs, *vs;
        char *h = strtok_r(head, " \n", &hs), *v = strtok_r(vals, " \n", &vs);
        while (h && v) {
            if (strcmp(h, "RcvbufErrors") == 0) {
                r = atol(v);
                break;
            }
            h = strtok_r(NULL, " \n", &hs);
            v = strtok_r(NULL, " \n", &vs);
        }
        break;
    }
    if (f)
        fclose(f);
    return r;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int n = atoi(argv[2]), k = argc > 3 ? atoi(argv[3]) : 0;
    int rx = socket(AF_INET, SOCK_DGRAM, 0), tx = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t al = sizeof a;
    if (strcmp(argv[1], "kernel_rcvbuf") == 0)
        setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &(int){16384}, sizeof(int));
    if (bind(rx, (struct sockaddr *)&a, sizeof a) || getsockname(rx, (struct sockaddr *)&a, &al)) {
        perror("bind");
        return 1;
    }
    long before = rcvbuf_errors();
    char buf[2048];
    int sent = 0, got = 0;
    if (strcmp(argv[1], "tcp_exit") == 0) {
        struct sockaddr_in far = {.sin_family = AF_INET, .sin_port = htons(9)};
        inet_pton(AF_INET, "10.9.9.9", &far.sin_addr);
        memset(buf, 'y', 100);
        for (int i = 0; i < n; i++)
            if (sendto(rx, buf, 100, 0, (struct sockaddr *)&far, sizeof far) == 100)
                sent++;
        printf("sent %d received %d rcvbuf_errors %ld\n", sent, got, rcvbuf_errors() - before);
        fflush(stdout);
        exit(0); /* the socket still open, its datagrams on the lane */
    }
    /* On the engine: the first receive adopts the socket. */
    sendto(tx, "go", 2, 0, (struct sockaddr *)&a, sizeof a);
    sent++;
    if (recv(rx, buf, sizeof buf, 0) == 2)
        got++;
    int unread_close = strcmp(argv[1], "close_unread") == 0;
    if (unread_close || strcmp(argv[1], "exit_unread") == 0) {
        for (int i = 0; i < n; i++, sent++)
            sendto(tx, buf, 100, 0, (struct sockaddr *)&a, sizeof a);
        close(tx); /* flushes what the sender queued */
        tx = -1;
        for (int i = 0; i < k; i++)
            if (recv(rx, buf, sizeof buf, 0) >= 0)
                got++;
        usleep(1000000); /* the engine takes the rest into the ring (a loaded host may delay it) */
        if (unread_close)
            close(rx);
    } else if (strcmp(argv[1], "fallback_close") == 0) {
        for (int i = 0; i < n; i++, sent++)
            sendto(tx, buf, 100, 0, (struct sockaddr *)&a, sizeof a);
        usleep(200000);
        shutdown(rx, SHUT_WR); /* moves the socket to the kernel path */
        for (int i = 0; i < k; i++)
            if (recv(rx, buf, sizeof buf, 0) >= 0)
                got++;
        close(rx);
    } else {
        shutdown(rx, SHUT_WR);
        memset(buf, 'x', 1000);
        for (int i = 0; i < n; i++, sent++)
            sendto(tx, buf, 1000, 0, (struct sockaddr *)&a, sizeof a);
        close(tx); /* flushes what the sender queued */
        tx = -1;
        usleep(200000);
        fcntl(rx, F_SETFL, O_NONBLOCK);
        while (recv(rx, buf, sizeof buf, 0) >= 0)
            got++;
        close(rx);
    }
    if (tx >= 0)
        close(tx);
    printf("sent %d received %d rcvbuf_errors %ld\n", sent, got, rcvbuf_errors() - before);
    return 0;
}
