/*
 * emp_pingpong: a tagged EMP ping-pong between two endpoints on 127.0.0.1,
 * one per thread. The server pre-posts a receive for any tag, echoes each
 * message back with its tag and posts the next receive; the client sends
 * message i with tag i and waits for its echo. Prints the round-trip
 * median and the client's counters.
 *
 *   cc -O2 -I crates/capi/include emp_pingpong.c -o emp_pingpong \
 *      -L target/release -leudp_capi -lpthread -Wl,-rpath,"$PWD/target/release"
 *   ./emp_pingpong [messages] [bytes]
 */
#include "eudp.h"

#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WAIT_MS 5000
#define MAX_SIZE 65536

struct server {
    eudp_emp *ep;
    uint32_t client;
    unsigned messages;
    int failed;
};

static int die(const char *what) {
    fprintf(stderr, "emp_pingpong: %s: %s\n", what, strerror(errno));
    return 1;
}

/* Waits for the next receive completion; sends that completed on the way
 * must have succeeded. The message's bytes are in the receive's buffer
 * (c->buf) already, c->len of them. A message longer than the buffer
 * completes with EMSGSIZE and EUDP_EMP_TRUNCATED in c->flags (c->full_len
 * is its length); this program sizes its buffers so that none is. Returns
 * 0, or -1 (errno set) on failure. */
static int next_recv(eudp_emp *ep, struct eudp_emp_completion *c) {
    for (;;) {
        if (eudp_emp_cq_wait(ep, c, WAIT_MS) != 1)
            return -1;
        if (c->flags & EUDP_EMP_TRUNCATED) {
            fprintf(stderr, "emp_pingpong: message of %zu bytes truncated to %zu\n", c->full_len, c->len);
            errno = EMSGSIZE;
            return -1;
        }
        if (c->status != 0) {
            errno = c->status;
            return -1;
        }
        if (c->op == EUDP_EMP_OP_RECV)
            return 0;
    }
}

static void *serve(void *arg) {
    struct server *s = arg;
    static unsigned char buf[MAX_SIZE];
    struct eudp_emp_completion c;
    /* Any tag from the client: ignore every bit. */
    if (eudp_emp_trecv(s->ep, s->client, 0, ~0ull, buf, sizeof buf, 0) != 0)
        goto fail;
    for (unsigned i = 0; i < s->messages; i++) {
        if (next_recv(s->ep, &c) != 0)
            goto fail;
        unsigned char echo[MAX_SIZE];
        size_t n = c.len;
        memcpy(echo, buf, n);
        /* The next receive is posted before the echo leaves, so the
         * client's next message finds it. */
        if (i + 1 < s->messages && eudp_emp_trecv(s->ep, s->client, 0, ~0ull, buf, sizeof buf, i + 1) != 0)
            goto fail;
        if (eudp_emp_tsend(s->ep, s->client, c.tag, echo, n, i) != 0)
            goto fail;
    }
    return NULL;
fail:
    s->failed = errno ? errno : EIO;
    return NULL;
}

static eudp_emp *open_loopback(void) {
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return eudp_emp_open((struct sockaddr *)&a, sizeof a, NULL);
}

static int64_t insert(eudp_emp *ep, eudp_emp *other) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    if (eudp_emp_local_addr(other, &ss, &len) != 0)
        return -1;
    return eudp_emp_av_insert(ep, (struct sockaddr *)&ss, len);
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    unsigned messages = argc > 1 ? (unsigned)atoi(argv[1]) : 1000;
    size_t size = argc > 2 ? (size_t)atol(argv[2]) : 10;
    if (messages == 0 || size == 0 || size > MAX_SIZE) {
        fprintf(stderr, "usage: emp_pingpong [messages > 0] [bytes 1..%d]\n", MAX_SIZE);
        return 2;
    }
    eudp_emp *client = open_loopback(), *server = open_loopback();
    if (!client || !server)
        return die("eudp_emp_open");
    int64_t to_server = insert(client, server), to_client = insert(server, client);
    if (to_server < 0 || to_client < 0)
        return die("eudp_emp_av_insert");

    struct server s = {server, (uint32_t)to_client, messages, 0};
    pthread_t t;
    if (pthread_create(&t, NULL, serve, &s) != 0)
        return die("pthread_create");

    unsigned char *out = malloc(size), *back = malloc(size);
    double *rtt = malloc(messages * sizeof *rtt);
    if (!out || !back || !rtt)
        return die("malloc");
    int rc = 0;
    for (unsigned i = 0; i < messages; i++) {
        for (size_t k = 0; k < size; k++)
            out[k] = (unsigned char)(i + k);
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        struct eudp_emp_completion c;
        if (eudp_emp_trecv(client, (uint32_t)to_server, i, 0, back, size, i) != 0 ||
            eudp_emp_tsend(client, (uint32_t)to_server, i, out, size, i) != 0 || next_recv(client, &c) != 0) {
            rc = die("ping-pong");
            break;
        }
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (c.tag != i || c.len != size || memcmp(out, back, size) != 0) {
            fprintf(stderr, "emp_pingpong: echo %u differs\n", i);
            rc = 1;
            break;
        }
        rtt[i] = (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
    }
    pthread_join(t, NULL);
    if (rc == 0 && s.failed) {
        errno = s.failed;
        rc = die("server");
    }
    if (rc == 0) {
        struct eudp_emp_counters k;
        if (eudp_emp_counters(client, EUDP_EMP_ANY_PEER, &k) != 0)
            return die("eudp_emp_counters");
        qsort(rtt, messages, sizeof *rtt, by_value);
        printf("%u messages of %zu bytes: round trip p50 %.1f us, max %.1f us\n", messages, size,
               rtt[messages / 2], rtt[messages - 1]);
        printf("client: frames sent %llu, received %llu, retransmits %llu, timeouts %llu\n",
               (unsigned long long)k.frames_sent, (unsigned long long)k.frames_received,
               (unsigned long long)k.retransmits, (unsigned long long)k.timeouts);
    }
    free(out);
    free(back);
    free(rtt);
    eudp_emp_close(client);
    eudp_emp_close(server);
    return rc;
}
