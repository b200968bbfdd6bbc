/* epoll_spin.c: the CPU time one thread spends in an epoll_wait of 200 ms
 * that nothing ends, on an epoll set holding a UDP socket ("cpu_ms N"):
 * about 0 when the wait sleeps, most of the 200 ms when it spins first.
 * Also the thread's context switches during the wait ("vcsw N ivcsw N"):
 * a spin that yields stays runnable, so on a busy machine, where it gets
 * little CPU, each yield that gives the CPU away counts as involuntary. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double cpu_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(void) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0) { perror("socket"); return 1; }
    int ep = epoll_create1(0);
    struct epoll_event ev = { .events = EPOLLIN, .data.fd = s }, out[1];
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev) != 0) { perror("epoll"); return 1; }
    struct rusage r0, r1;
    getrusage(RUSAGE_THREAD, &r0);
    double c0 = cpu_ms();
    int n = epoll_wait(ep, out, 1, 200);
    double used = cpu_ms() - c0;
    getrusage(RUSAGE_THREAD, &r1);
    printf("events %d vcsw %ld ivcsw %ld cpu_ms %.0f\n", n, r1.ru_nvcsw - r0.ru_nvcsw, r1.ru_nivcsw - r0.ru_nivcsw, used);
    close(ep);
    close(s);
    return n == 0 ? 0 : 1;
}
