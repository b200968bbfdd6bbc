/* Fork under the TCP transport (EUDP_TRANSPORT=tcp), driven by
 * tests/tcp_fork.rs. The parent puts its transport to use (a connection,
 * and in `listen` its listener), forks a child that waits, prints the
 * child's pid and exits at once; the test then looks at what the child
 * still holds while it waits.
 *
 *   lane DST_PORT WAIT_MS RESULT: the parent sends "parent" to
 *     127.0.0.1:DST_PORT (the test's listener stands in for the peer host's
 *     UOE); the child waits, then sends "child" there from a new socket.
 *   listen WAIT_MS RESULT: the parent sends a datagram to itself over its
 *     own listener; the child waits, then does the same with new sockets.
 *   exec RESULT: the child runs `ls -l /proc/self/fd` into RESULT; the
 *     parent waits for it.
 *   race DELAY_US: a thread's first datagram starts the transport while the
 *     main thread forks DELAY_US later; the child (alarm: 10 s) must start
 *     a transport of its own and get a datagram to itself. The parent's
 *     thread goes on with 50 datagrams to itself, one at a time, and must
 *     get every one: the fork may come before its transport listens, or
 *     move its sockets to the kernel path mid-exchange. Exit status 0; bit 1 set when the
 *     child failed or hung, bit 4 when the thread's datagram was lost.
 *
 *   slowparent WAIT_MS CHILD_MS: forks at once. The child gets a datagram
 *     to itself (its transport starts while the parent's has not), waits
 *     CHILD_MS and exits. The parent starts its transport WAIT_MS after
 *     the fork (later than the child's wait for it) with a datagram to
 *     itself, prints "bound", waits for the child's end, then sends itself
 *     20 datagrams one at a time and must get each. First line: the
 *     child's pid. Exit status as in `race`.
 *   relay: the parent binds a socket (its transport starts and listens)
 *     and forks; the child gets a datagram to itself (its transport,
 *     without a listener, connects to the parent's) and then stops
 *     (SIGSTOP, by the parent). The parent, which has sent nothing yet,
 *     then sends itself 5 datagrams, one at a time, each to be received
 *     within 1 s, and lets the child go on. Exit status as in `race`.
 *   holderexit COUNT: forks at once; the child gets a datagram to itself
 *     (its transport takes the port: the parent has none yet) and waits.
 *     The parent then starts its transport (it finds the port held, so its
 *     datagrams to itself go through the child's listener), sends itself
 *     one datagram, then COUNT in a burst while it tells the child to
 *     _exit, and must get every one (3 s each). Exit status as in `race`.
 *   blockedfork: a thread blocked in recv on a socket of the transport
 *     while the main thread forks, then sends it a datagram (plain UDP
 *     now): the thread must get it within 1 s. Exit status as in `race`.
 *   recv PORT: binds UDP 127.0.0.1:PORT, prints "ready", then prints
 *     "got <payload>" for every datagram (until killed).
 *   send PORT: sends each line of stdin as one datagram to 127.0.0.1:PORT.
 *
 * The child writes "child ok" (or what failed) to RESULT when done. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static struct sockaddr_in loopback(int port) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return a;
}

static int udp(void) {
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        die("socket");
    return s;
}

static void send_to(int s, int port, const char *msg) {
    struct sockaddr_in a = loopback(port);
    if (sendto(s, msg, strlen(msg), 0, (struct sockaddr *)&a, sizeof a) != (ssize_t)strlen(msg))
        die("sendto");
}

/* Where a fork child stands, for its alarm to report (a hang says which
 * call never returned). The parent's threads set it too, unread there. */
static const char *volatile child_phase = "started";

/* Sends `rounds` datagrams ("<msg> <i>"), one at a time, from a new socket
 * to a new bound one and receives each (5 s). */
static const char *roundtrips(const char *msg, int rounds) {
    child_phase = "socket";
    int r = udp(), s = udp();
    struct sockaddr_in a = loopback(0);
    socklen_t len = sizeof a;
    child_phase = "bind";
    if (bind(r, (struct sockaddr *)&a, sizeof a) || getsockname(r, (struct sockaddr *)&a, &len))
        return "bind";
    struct timeval tv = {5, 0};
    child_phase = "setsockopt";
    setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct sockaddr_in d = loopback(ntohs(a.sin_port));
    for (int i = 0; i < rounds; i++) {
        char want[64], buf[64];
        int k = snprintf(want, sizeof want, "%s %d", msg, i);
        child_phase = "sendto";
        if (sendto(s, want, k, 0, (struct sockaddr *)&d, sizeof d) != k)
            return strerror(errno);
        child_phase = "recv";
        ssize_t n = recv(r, buf, sizeof buf - 1, 0);
        child_phase = "after recv";
        if (n < 0)
            return i == 0 ? "nothing received" : "a later datagram was not received";
        buf[n] = 0;
        if (strcmp(buf, want) != 0)
            return "wrong datagram";
    }
    close(r);
    close(s);
    return NULL;
}

static const char *self_roundtrip(const char *msg) {
    return roundtrips(msg, 1);
}

/* The child's alarm: says where the child stood (async-signal-safe
 * writes only), then dies of the signal as before. */
static void child_alarm(int sig) {
    static const char pre[] = "child: alarm while in ";
    const char *p = child_phase;
    (void)!write(2, pre, sizeof pre - 1);
    (void)!write(2, p, strlen(p));
    (void)!write(2, "\n", 1);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* A fork child's datagram to itself (alarm: `secs`); what failed, if
 * anything. Its exit (the shim's queue drain) is timed by the alarm too. */
static const char *child_roundtrip(int secs) {
    signal(SIGALRM, child_alarm);
    alarm(secs);
    const char *err = self_roundtrip("child");
    if (err)
        fprintf(stderr, "child: %s\n", err);
    child_phase = "exit";
    return err;
}

/* Binds a new socket to 127.0.0.1 (any port) into *r, its address into *a. */
static void bound_socket(int *r, struct sockaddr_in *a) {
    *r = udp();
    *a = loopback(0);
    socklen_t len = sizeof *a;
    if (bind(*r, (struct sockaddr *)a, sizeof *a) || getsockname(*r, (struct sockaddr *)a, &len))
        die("bind");
}

static void result(const char *path, const char *what) {
    FILE *f = fopen(path, "w");
    if (!f)
        die("result");
    fprintf(f, "%s\n", what);
    fclose(f);
}

static const char *thread_err;

/* `blockedfork`: the receiving thread's socket, and how long after the
 * fork its receive returned the datagram (ms; negative: it failed then). */
static int blocked_fd;
static volatile long blocked_ms;
static struct timespec fork_time;

static void *blocked_recv(void *arg) {
    (void)arg;
    char buf[16];
    ssize_t n = recv(blocked_fd, buf, sizeof buf, 0);
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - fork_time.tv_sec) * 1000 + (now.tv_nsec - fork_time.tv_nsec) / 1000000;
    blocked_ms = n == 3 && memcmp(buf, "two", 3) == 0 ? ms : -ms;
    return NULL;
}

static void *first_send(void *arg) {
    (void)arg;
    thread_err = roundtrips("thread", 50);
    if (thread_err)
        fprintf(stderr, "thread: %s\n", thread_err);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 2 || (argc < 3 && strcmp(argv[1], "relay") != 0 && strcmp(argv[1], "blockedfork") != 0))
        return 2;
    const char *mode = argv[1];
    if (strcmp(mode, "race") == 0) {
        pthread_t t;
        pthread_create(&t, NULL, first_send, NULL);
        usleep(atoi(argv[2]));
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0)
            _exit(child_roundtrip(10) ? 1 : 0);
        int st;
        waitpid(pid, &st, 0);
        pthread_join(t, NULL);
        if (WIFSIGNALED(st))
            fprintf(stderr, "child killed by signal %d\n", WTERMSIG(st));
        return (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1) | (thread_err ? 4 : 0);
    }
    if (strcmp(mode, "exec") == 0) {
        const char *err = self_roundtrip("parent");
        if (err) {
            fprintf(stderr, "parent: %s\n", err);
            return 1;
        }
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            int out = open(argv[2], O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (out < 0 || dup2(out, 1) < 0)
                _exit(3);
            close(out);
            execlp("ls", "ls", "-l", "/proc/self/fd", (char *)NULL);
            _exit(4);
        }
        int st;
        waitpid(pid, &st, 0);
        return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1;
    }
    if (strcmp(mode, "slowparent") == 0 && argc >= 4) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            const char *err = child_roundtrip(30);
            sleep_ms(atoi(argv[3]));
            _exit(err ? 1 : 0);
        }
        printf("%d\n", (int)pid);
        fflush(stdout);
        sleep_ms(atoi(argv[2]));
        const char *err = self_roundtrip("parent");
        printf("bound\n");
        fflush(stdout);
        int st;
        waitpid(pid, &st, 0);
        if (!err)
            err = roundtrips("after the child's end", 20);
        if (err)
            fprintf(stderr, "parent: %s\n", err);
        return (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1) | (err ? 4 : 0);
    }
    if (strcmp(mode, "relay") == 0) {
        int r, s = udp(), ready[2];
        struct sockaddr_in a;
        bound_socket(&r, &a);
        if (pipe(ready))
            die("pipe");
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            const char *err = child_roundtrip(30);
            if (write(ready[1], "x", 1) != 1)
                _exit(1);
            sleep_ms(200);
            _exit(err ? 1 : 0);
        }
        char c;
        if (read(ready[0], &c, 1) != 1)
            die("child");
        int st;
        kill(pid, SIGSTOP);
        if (waitpid(pid, &st, WUNTRACED) != pid || !WIFSTOPPED(st))
            die("stop");
        struct timeval tv = {1, 0};
        setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        const char *err = NULL;
        for (int i = 0; i < 5 && !err; i++) {
            char want[32], buf[64];
            int k = snprintf(want, sizeof want, "parent %d", i);
            if (sendto(s, want, k, 0, (struct sockaddr *)&a, sizeof a) != k)
                die("sendto");
            ssize_t n = recv(r, buf, sizeof buf - 1, 0);
            if (n != k || memcmp(buf, want, k) != 0)
                err = "a datagram to itself was not received within 1 s while its child was stopped";
        }
        if (err)
            fprintf(stderr, "parent: %s\n", err);
        kill(pid, SIGCONT);
        waitpid(pid, &st, 0);
        return (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1) | (err ? 4 : 0);
    }
    if (strcmp(mode, "blockedfork") == 0) {
        /* A thread blocked in recv on a socket of the transport while the
         * main thread forks (both sockets leave the engine) and then
         * sends it one datagram, now as plain UDP: the thread must get it
         * within 1 s (SO_RCVTIMEO 5 s). */
        int r, s = udp();
        struct sockaddr_in a;
        bound_socket(&r, &a);
        const char *err = self_roundtrip("parent");
        if (err) {
            fprintf(stderr, "parent: %s\n", err);
            return 4;
        }
        struct timeval tv = {5, 0};
        setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        /* r is on the engine: one datagram through it first. */
        if (sendto(s, "one", 3, 0, (struct sockaddr *)&a, sizeof a) != 3)
            die("sendto");
        char buf[16];
        if (recv(r, buf, sizeof buf, 0) != 3)
            die("recv");
        pthread_t t;
        blocked_fd = r;
        pthread_create(&t, NULL, blocked_recv, NULL);
        sleep_ms(100); /* asleep in its receive */
        clock_gettime(CLOCK_MONOTONIC, &fork_time);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0)
            _exit(0);
        waitpid(pid, NULL, 0);
        if (sendto(s, "two", 3, 0, (struct sockaddr *)&a, sizeof a) != 3)
            die("sendto");
        pthread_join(t, NULL);
        if (blocked_ms < 0 || blocked_ms > 1000) {
            fprintf(stderr, "thread: %s after %ld ms\n", blocked_ms < 0 ? "nothing received" : "received", blocked_ms < 0 ? -blocked_ms : blocked_ms);
            return 4;
        }
        return 0;
    }
    if (strcmp(mode, "holderexit") == 0) {
        int ready[2], go[2], count = atoi(argv[2]);
        if (pipe(ready) || pipe(go))
            die("pipe");
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        char c;
        if (pid == 0) {
            const char *err = child_roundtrip(30);
            if (write(ready[1], "x", 1) != 1 || read(go[0], &c, 1) != 1)
                _exit(1);
            _exit(err ? 1 : 0);
        }
        if (read(ready[0], &c, 1) != 1)
            die("child");
        int r, s = udp();
        struct sockaddr_in a;
        bound_socket(&r, &a);
        int big = 4 << 20;
        setsockopt(r, SOL_SOCKET, SO_RCVBUF, &big, sizeof big);
        struct timeval tv = {3, 0};
        setsockopt(r, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char buf[64];
        const char *err = NULL;
        if (sendto(s, "first", 5, 0, (struct sockaddr *)&a, sizeof a) != 5)
            die("sendto");
        if (recv(r, buf, sizeof buf, 0) != 5)
            err = "the first datagram to itself was not received";
        if (write(go[1], "x", 1) != 1)
            die("go");
        int got = 0;
        for (int i = 0; i < count && !err; i++) {
            int k = snprintf(buf, sizeof buf, "burst %d", i);
            if (sendto(s, buf, k, 0, (struct sockaddr *)&a, sizeof a) != k)
                die("sendto");
        }
        while (!err && got < count && recv(r, buf, sizeof buf, 0) > 0)
            got++;
        if (!err && got < count) {
            fprintf(stderr, "parent: %d of %d datagrams to itself received\n", got, count);
            err = "lost";
        } else if (err)
            fprintf(stderr, "parent: %s\n", err);
        int st;
        waitpid(pid, &st, 0);
        return (WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : 1) | (err ? 4 : 0);
    }
    if (strcmp(mode, "recv") == 0) {
        int r = udp();
        struct sockaddr_in a = loopback(atoi(argv[2]));
        if (bind(r, (struct sockaddr *)&a, sizeof a))
            die("bind");
        printf("ready\n");
        fflush(stdout);
        char buf[2048];
        for (;;) {
            ssize_t n = recv(r, buf, sizeof buf - 1, 0);
            if (n < 0 && errno != EINTR)
                die("recv");
            if (n >= 0) {
                buf[n] = 0;
                printf("got %s\n", buf);
                fflush(stdout);
            }
        }
    }
    if (strcmp(mode, "send") == 0) {
        int s = udp();
        char line[2048];
        while (fgets(line, sizeof line, stdin)) {
            line[strcspn(line, "\n")] = 0;
            send_to(s, atoi(argv[2]), line);
        }
        return 0;
    }
    int lane = strcmp(mode, "lane") == 0;
    if (argc < (lane ? 5 : 4))
        return 2;
    int port = lane ? atoi(argv[2]) : 0;
    int wait_ms = atoi(argv[lane ? 3 : 2]);
    const char *path = argv[lane ? 4 : 3];
    if (lane) {
        send_to(udp(), port, "parent");
    } else {
        const char *err = self_roundtrip("parent");
        if (err) {
            fprintf(stderr, "parent: %s\n", err);
            return 1;
        }
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        sleep_ms(wait_ms);
        const char *err = NULL;
        if (lane)
            send_to(udp(), port, "child");
        else
            err = self_roundtrip("child");
        result(path, err ? err : "child ok");
        exit(0); /* exit, not _exit: what is queued goes out first */
    }
    printf("%d\n", (int)pid);
    fflush(stdout);
    return 0;
}
