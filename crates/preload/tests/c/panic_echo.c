/* A UDP echo server (a thread) and its client in one program: the client
 * sends ROUNDS requests one at a time and waits for each answer (sent
 * again after a second without one). Exits 0 when every request was
 * answered; the panic tests inject a panic into the shim or eudp's
 * threads meanwhile (EUDP_TEST_PANIC) and expect the program not to
 * notice. */
#include "udp_echo.h"
#include <pthread.h>
#include <sys/time.h>
#include <unistd.h>

#define ROUNDS 300

static int server;

static void *serve(void *arg) {
    (void)arg;
    char buf[256];
    for (;;) {
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(server, buf, sizeof buf, 0, (struct sockaddr *)&from, &fl);
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN)
                continue;
            perror("server recvfrom");
            exit(3);
        }
        if (n == 4 && memcmp(buf, "QUIT", 4) == 0)
            return NULL;
        if (sendto(server, buf, n, 0, (struct sockaddr *)&from, fl) < 0) {
            perror("server sendto");
            exit(3);
        }
    }
}

int main(void) {
    struct sockaddr_in sa, ca;
    server = bound(&sa);
    int client = bound(&ca);
    struct timeval tv = {1, 0};
    setsockopt(client, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    pthread_t t;
    pthread_create(&t, NULL, serve, NULL);
    int answered = 0;
    for (int i = 0; i < ROUNDS; i++) {
        char req[64], rep[64];
        int len = snprintf(req, sizeof req, "request %d", i);
        for (int tries = 0; tries < 5; tries++) {
            if (sendto(client, req, len, 0, (struct sockaddr *)&sa, sizeof sa) != len) {
                perror("client sendto");
                return 2;
            }
            ssize_t n;
            /* Answers to an earlier try of this request may still come. */
            while ((n = recv(client, rep, sizeof rep, 0)) >= 0) {
                if (n == len && memcmp(rep, req, len) == 0)
                    break;
            }
            if (n >= 0) {
                answered++;
                break;
            }
            if (errno != EAGAIN && errno != EINTR) {
                perror("client recv");
                return 2;
            }
        }
    }
    sendto(client, "QUIT", 4, 0, (struct sockaddr *)&sa, sizeof sa);
    pthread_join(t, NULL);
    printf("answered %d of %d\n", answered, ROUNDS);
    return answered == ROUNDS ? 0 : 1;
}
