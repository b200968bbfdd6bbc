/* fork_log FORKS: a thread keeps the shim logging (EUDP_LOG=debug: each
 * socket it puts on the engine and moves to the kernel path writes lines)
 * while the main thread forks FORKS children one after another. Each child
 * does the same once (so it logs too) and exits; a child that has not
 * ended 5 s after its fork is killed and counted as hung.
 * Prints "hung N of FORKS"; exit status 0 when none hung. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

/* One socket on the engine (its first send), then on the kernel path (an
 * option the engine does not honour), then closed: three log lines. */
static void churn(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0)
        return;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(9), .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    sendto(s, "x", 1, 0, (struct sockaddr *)&a, sizeof a);
    int on = 1;
    setsockopt(s, SOL_SOCKET, SO_TIMESTAMP, &on, sizeof on);
    close(s);
}

static void *logger(void *arg) {
    (void)arg;
    while (!stop)
        churn();
    return NULL;
}

int main(int argc, char **argv) {
    int forks = argc > 1 ? atoi(argv[1]) : 100;
    pthread_t t;
    pthread_create(&t, NULL, logger, NULL);
    int hung = 0;
    for (int i = 0; i < forks; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 2;
        }
        if (pid == 0) {
            alarm(5);
            churn();
            exit(0);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            hung++;
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("hung %d of %d\n", hung, forks);
    return hung ? 1 : 0;
}
