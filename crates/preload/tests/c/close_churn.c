/* Sockets opened and closed by several threads at once under a descriptor
 * limit with no room above it (soft = hard), so the shim lends itself
 * numbers at the top of the program's space.
 *
 *   close_churn THREADS LIFECYCLES
 *
 * Sets soft = hard RLIMIT_NOFILE = 1024. Each thread runs LIFECYCLES
 * socket lifecycles: a UDP socket bound on 127.0.0.1, one datagram to
 * itself, received, closed. Prints "lifecycles N received M". Under the
 * shim every lifecycle puts the socket on the engine (three private
 * descriptors) and its close gives them back, so one thread's close and
 * another's placement meet all the time. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int lifecycles;
static long received[64];

static void *churn(void *arg) {
    long me = (long)arg;
    for (int i = 0; i < lifecycles; i++) {
        int s = socket(AF_INET, SOCK_DGRAM, 0);
        if (s < 0) {
            perror("socket");
            exit(1);
        }
        struct timeval tv = {2, 0};
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        if (bind(s, (struct sockaddr *)&a, sizeof a) || getsockname(s, (struct sockaddr *)&a, &len)) {
            perror("bind");
            exit(1);
        }
        char msg[32], buf[64];
        int k = snprintf(msg, sizeof msg, "%ld %d", me, i);
        if (sendto(s, msg, k, 0, (struct sockaddr *)&a, sizeof a) != k) {
            perror("sendto");
            exit(1);
        }
        ssize_t n = recv(s, buf, sizeof buf, 0);
        if (n == k && memcmp(buf, msg, k) == 0)
            received[me]++;
        close(s);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    int threads = atoi(argv[1]);
    lifecycles = atoi(argv[2]);
    if (threads < 1 || threads > 64)
        return 2;
    struct rlimit r = {1024, 1024};
    if (setrlimit(RLIMIT_NOFILE, &r)) {
        perror("setrlimit");
        return 1;
    }
    pthread_t t[64];
    for (long i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, churn, (void *)i);
    long total = 0;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        total += received[i];
    }
    printf("lifecycles %d received %ld\n", threads * lifecycles, total);
    return 0;
}
