/* fork_stat FORKS: a process with a UDP socket on the engine (so the shim
 * writes its stats report periodically) forks FORKS children one after
 * another, each exiting at once, and prints the longest fork() in ms as
 * "longest N". Ends with _exit (no final report). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 10;
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (s < 0 || sendto(s, "x", 1, 0, (struct sockaddr *)&a, sizeof a) != 1) {
        perror("fork_stat: sendto");
        return 2;
    }
    /* The periodic writer is at work from here on. */
    usleep(300 * 1000);
    double longest = 0;
    for (int i = 0; i < forks; i++) {
        double t = now_ms();
        pid_t pid = fork();
        if (pid == 0)
            _exit(0);
        if (pid < 0) {
            perror("fork_stat: fork");
            return 2;
        }
        double took = now_ms() - t;
        if (took > longest)
            longest = took;
        waitpid(pid, NULL, 0);
        usleep(20 * 1000);
    }
    printf("longest %.0f\n", longest);
    fflush(stdout);
    _exit(0);
}
