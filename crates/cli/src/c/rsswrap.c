/* rsswrap: runs a program and writes its resource usage as one JSON line.
 *
 *   rsswrap OUT [-n NOFILE|SOFT:HARD] [VAR=VALUE...] PROGRAM [ARGS...]
 *
 * Used by the benches (crates/cli/src/rss.rs). The program runs as a forked
 * child of this small process, so wait4()'s ru_maxrss is the program's own
 * peak: the kernel keeps the largest resident set of every image a process
 * has had, and the only image before the program's is this wrapper's
 * copied-on-fork anonymous pages (a few hundred KiB), not the bench's or a
 * launcher's. VAR=VALUE words are put in the program's environment here
 * (not through env(1), whose image would count too); -n sets
 * RLIMIT_NOFILE soft = hard = NOFILE (or SOFT:HARD) for the program. SIGINT, SIGTERM,
 * SIGHUP and SIGQUIT are passed on to the program; if this process dies
 * the program is killed. The program starts with only descriptors 0-2
 * open (what the caller's shell leaked would count against its limit and
 * in its figures). The exit status is the program's (128 + signal
 * when it was killed). */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile pid_t child = 0;

static void forward(int sig) {
    if (child > 0)
        kill(child, sig);
}

static void write_out(const char *path, const char *json) {
    FILE *f = fopen(path, "w");
    if (!f)
        return;
    fputs(json, f);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: rsswrap OUT [-n NOFILE|SOFT:HARD] [VAR=VALUE...] PROGRAM [ARGS...]\n");
        return 2;
    }
    const char *out = argv[1];
    int i = 2;
    char buf[512];
    if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
        struct rlimit rl;
        char *end;
        rl.rlim_cur = rl.rlim_max = strtoul(argv[i + 1], &end, 10);
        if (*end == ':')
            rl.rlim_max = strtoul(end + 1, NULL, 10);
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            snprintf(buf, sizeof buf, "{\"error\":\"setrlimit RLIMIT_NOFILE %s: %s\"}\n", argv[i + 1], strerror(errno));
            write_out(out, buf);
            fputs(buf, stderr);
            return 126;
        }
        i += 2;
    }
    for (; i < argc && strchr(argv[i], '=') && argv[i][0] != '='; i++)
        putenv(argv[i]);
    if (i >= argc) {
        fprintf(stderr, "rsswrap: no program\n");
        return 2;
    }
    pid_t parent = getpid();
    struct timeval t0, t1;
    gettimeofday(&t0, NULL);
    pid_t pid = fork();
    if (pid < 0) {
        perror("rsswrap: fork");
        return 126;
    }
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(126);
        if (syscall(SYS_close_range, 3, ~0U, 0) != 0) {
            long max = sysconf(_SC_OPEN_MAX);
            for (long fd = 3; fd < max; fd++)
                close((int)fd);
        }
        execvp(argv[i], argv + i);
        fprintf(stderr, "rsswrap: %s: %s\n", argv[i], strerror(errno));
        _exit(errno == ENOENT ? 127 : 126);
    }
    child = pid;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
    for (unsigned k = 0; k < sizeof sigs / sizeof sigs[0]; k++)
        sigaction(sigs[k], &sa, NULL);
    int st = 0;
    struct rusage ru;
    while (wait4(pid, &st, 0, &ru) < 0) {
        if (errno != EINTR) {
            perror("rsswrap: wait4");
            return 126;
        }
    }
    gettimeofday(&t1, NULL);
    int code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    snprintf(buf, sizeof buf,
             "{\"max_rss_kib\":%ld,\"user_secs\":%.6f,\"sys_secs\":%.6f,\"wall_secs\":%.6f,\"exit_code\":%d,\"signal\":%d}\n",
             ru.ru_maxrss, ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6, ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6,
             (t1.tv_sec - t0.tv_sec) + (t1.tv_usec - t0.tv_usec) / 1e6, WIFEXITED(st) ? WEXITSTATUS(st) : -1,
             WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    write_out(out, buf);
    return code;
}
