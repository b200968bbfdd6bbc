/* Sends COUNT datagrams of 100 bytes to 127.0.0.1:PORT, says "sent" and
 * waits for a signal. MODE "default" leaves SIGTERM and SIGINT at their
 * default action (and reports what sigaction says of them after the
 * sends: "dfl 1" when the default); MODE "handler" installs its own
 * SIGTERM handler and exits with status 7 once it ran. */
#include <arpa/inet.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t got;

static void on_term(int sig) {
    (void)sig;
    got = 1;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: sig_flush PORT COUNT default|handler\n");
        return 2;
    }
    int port = atoi(argv[1]), count = atoi(argv[2]);
    int own = strcmp(argv[3], "handler") == 0;
    if (own) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_term;
        sigaction(SIGTERM, &sa, NULL);
    }
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in dst = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    char buf[100];
    for (int i = 0; i < count; i++) {
        memset(buf, 'a' + i % 26, sizeof buf);
        memcpy(buf, &i, sizeof i);
        if (sendto(fd, buf, sizeof buf, 0, (struct sockaddr *)&dst, sizeof dst) != (ssize_t)sizeof buf) {
            perror("sendto");
            return 1;
        }
    }
    struct sigaction old;
    sigaction(SIGTERM, NULL, &old);
    int dfl = old.sa_handler == SIG_DFL;
    sigaction(SIGINT, NULL, &old);
    dfl = dfl && (own || old.sa_handler == SIG_DFL);
    printf("dfl %d\nsent\n", dfl);
    fflush(stdout);
    for (int i = 0; i < 60000 && !got; i++)
        usleep(1000);
    if (got) {
        printf("handled\n");
        return 7;
    }
    return 3;
}
