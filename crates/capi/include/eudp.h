/*
 * eudp.h — C interface of the eudp user-space UDP offload engine.
 *
 * An eudp endpoint behaves like a UDP socket whose per-packet work (GSO/GRO
 * batching, sendmmsg/recvmmsg) is done by an engine thread. Endpoints live
 * on one process-wide engine, started on first use and configured by the
 * EUDP_* environment variables (see docs/capi.md).
 *
 * Conventions (as for socket calls):
 *  - Functions return -1 (or NULL) on failure and set errno to the value the
 *    kernel would set on an equivalent UDP socket: EMSGSIZE, ECONNREFUSED,
 *    EAGAIN, EAFNOSUPPORT, EDESTADDRREQ, ...
 *  - A NULL pointer where one is required, or an impossible length, is
 *    EINVAL (the kernel would say EFAULT for a bad pointer).
 *  - An internal failure of the library is reported as EIO; nothing aborts.
 *  - An endpoint may be used from several threads at once, like a socket,
 *    but eudp_close() must not race with other calls on the same endpoint.
 *  - Addresses are struct sockaddr_in / sockaddr_in6 in network byte order.
 *    AF_INET6 endpoints are dual-stack and report IPv4 peers as
 *    ::ffff:a.b.c.d (AF_INET6), as the kernel does.
 *
 * Link with -leudp_capi (shared) or libeudp_capi.a plus
 * -lpthread -ldl -lm -lrt -lutil -lgcc_s (static).
 */
#ifndef EUDP_H
#define EUDP_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <netinet/in.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Receive flags; the values equal the kernel's MSG_* flags. */
/** Leave the datagram queued; the next receive returns it again. */
#define EUDP_MSG_PEEK     0x02
/** Input: return the datagram's full length even when it was truncated.
 *  In eudp_rxmsg.flags (output): the datagram was truncated. */
#define EUDP_MSG_TRUNC    0x20
/** Do not block for this call (EAGAIN when nothing is waiting). */
#define EUDP_MSG_DONTWAIT 0x40

/** Buckets of eudp_stats.batch_hist. */
#define EUDP_HIST_BUCKETS 10

/** An endpoint (opaque). */
typedef struct eudp_endpoint eudp_endpoint;

/** One datagram for eudp_send_batch(). */
struct eudp_txmsg {
    const void *buf;             /* payload */
    size_t len;                  /* payload length */
    const struct sockaddr *addr; /* destination, or NULL for the connected peer */
    socklen_t addrlen;           /* length of *addr */
};

/** One datagram for eudp_recvmsg() / eudp_recv_batch(). */
struct eudp_rxmsg {
    void *buf;                    /* in: where to copy the payload (NULL if cap is 0) */
    size_t cap;                   /* in: capacity of buf */
    size_t len;                   /* out: bytes copied into buf */
    size_t full_len;              /* out: the datagram's length (> len: truncated) */
    struct sockaddr_storage addr; /* out: sender */
    socklen_t addrlen;            /* out: length of addr */
    int flags;                    /* out: EUDP_MSG_TRUNC when truncated, else 0 */
};

/** Counters of one endpoint (a copy; see eudp_stats()). */
struct eudp_stats {
    uint64_t direct_posts;     /* sends posted on the caller's thread (L1 empty, L2 room) */
    uint64_t queued_posts;     /* sends queued in L1 for the engine */
    uint64_t send_full;        /* sends that found L1 full (blocked or EAGAIN) */
    uint64_t engine_batches;   /* backend send calls made by the engine */
    uint64_t datagrams_sent;   /* datagrams accepted by the kernel */
    uint64_t bytes_sent;
    uint64_t send_calls;       /* send syscalls, direct and engine */
    uint64_t gso_messages;     /* GSO super-packets among the engine's messages */
    double send_calls_per_datagram; /* send_calls / datagrams_sent (0 when none) */
    uint64_t batch_hist[EUDP_HIST_BUCKETS]; /* engine calls of 2^i .. 2^(i+1)-1 datagrams */
    uint64_t drop_send_error;  /* queued datagrams the kernel refused (error reported) */
    uint64_t drop_shutdown;    /* queued datagrams lost because close could not flush */
    uint64_t gso_fallbacks;    /* times GSO was turned off after the kernel rejected it */
    uint64_t datagrams_received;
    uint64_t bytes_received;
    uint64_t recv_calls;       /* receive syscalls (engine and caller) */
    uint64_t gro_superpackets; /* received messages carrying more than one datagram */
    uint64_t direct_recv_calls;/* receive syscalls made on the caller's thread */
    uint64_t drop_ring_full;   /* datagrams dropped because the receive ring was full */
    uint64_t drop_truncated;   /* datagrams dropped: larger than the engine's 64 KiB buffer */
    uint64_t errors_surfaced;  /* asynchronous errors reported to the caller */
};

/* ------------------------------------------------------------------------
 * Lifecycle
 * ---------------------------------------------------------------------- */

/**
 * Creates an unbound endpoint. family: AF_INET, or AF_INET6 (dual-stack).
 * Returns NULL with errno EAFNOSUPPORT for another family, or the error of
 * socket(2) / of starting the engine.
 */
eudp_endpoint *eudp_endpoint_new(int family);

/**
 * Like close(2): flushes what was accepted (waiting up to 5 s; datagrams
 * still queued then are counted in drop_shutdown) and frees the endpoint and
 * its poll fd. Remove the poll fd from any epoll set first. ep is invalid
 * afterwards. Returns 0, or -1/EINVAL for NULL.
 */
int eudp_close(eudp_endpoint *ep);

/* ------------------------------------------------------------------------
 * Addressing
 * ---------------------------------------------------------------------- */

/**
 * Binds to a local address (port 0: ephemeral), like bind(2).
 * AF_INET endpoints take a sockaddr_in, AF_INET6 endpoints a sockaddr_in6
 * (an IPv4 address as ::ffff:a.b.c.d). Errors: EINVAL (short addrlen),
 * EAFNOSUPPORT (wrong family), EADDRINUSE, EADDRNOTAVAIL, ...
 */
int eudp_bind(eudp_endpoint *ep, const struct sockaddr *addr, socklen_t addrlen);

/**
 * Sets the default destination and accepts datagrams only from it, like
 * connect(2) on a UDP socket; AF_UNSPEC dissolves the association.
 * Datagrams already queued are flushed first (they keep their destination).
 * AF_INET6 endpoints accept AF_INET addresses.
 */
int eudp_connect(eudp_endpoint *ep, const struct sockaddr *addr, socklen_t addrlen);

/** Dissolves the association (connect to AF_UNSPEC). */
int eudp_disconnect(eudp_endpoint *ep);

/**
 * The local address, like getsockname(2): *addrlen is the room in *addr on
 * input; on output the address's full length (larger: truncated copy).
 */
int eudp_local_addr(eudp_endpoint *ep, struct sockaddr_storage *addr, socklen_t *addrlen);

/** The connected peer, like getpeername(2); ENOTCONN when not connected. */
int eudp_peer_addr(eudp_endpoint *ep, struct sockaddr_storage *addr, socklen_t *addrlen);

/* ------------------------------------------------------------------------
 * Sending
 *
 * A datagram is accepted when the call returns its length: it is sent on
 * the caller's thread when the queue is idle, otherwise queued for the
 * engine. A blocking endpoint waits for room when the queue is full (up to
 * the send timeout, then EAGAIN); a nonblocking one fails with EAGAIN. An
 * error the kernel reports later for a queued datagram (e.g. ECONNREFUSED
 * from an ICMP port unreachable on a connected endpoint) is returned by the
 * next send or receive call, as with a socket.
 * ---------------------------------------------------------------------- */

/**
 * Sends len bytes to the connected peer. Returns len, or -1 with errno:
 * EDESTADDRREQ (not connected), EMSGSIZE (len > 65507 over IPv4, 65527 over
 * IPv6), EAGAIN, ECONNREFUSED (earlier ICMP), ...
 */
ssize_t eudp_send(eudp_endpoint *ep, const void *buf, size_t len);

/**
 * Sends len bytes to addr (NULL: the connected peer), like sendto(2).
 * Errors as eudp_send(), and EINVAL (short addrlen, port 0), EAFNOSUPPORT
 * (an AF_INET6 address on an AF_INET endpoint).
 */
ssize_t eudp_sendto(eudp_endpoint *ep, const void *buf, size_t len,
                    const struct sockaddr *addr, socklen_t addrlen);

/**
 * Sends n datagrams in order, like sendmmsg(2). Returns how many were
 * accepted (< n: message [return value] failed or would block — retry from
 * there to see its error); -1 with errno only when the first one fails.
 */
ssize_t eudp_send_batch(eudp_endpoint *ep, const struct eudp_txmsg *msgs, size_t n);

/**
 * Waits until everything accepted has been handed to the kernel.
 * timeout_ms: -1 waits without limit. Returns 0 when drained, -1/ETIMEDOUT
 * otherwise.
 */
int eudp_flush(eudp_endpoint *ep, int timeout_ms);

/* ------------------------------------------------------------------------
 * Receiving
 *
 * Flags: EUDP_MSG_PEEK, EUDP_MSG_DONTWAIT, EUDP_MSG_TRUNC; others are
 * EOPNOTSUPP. A datagram longer than the buffer is truncated and the rest
 * discarded (unless peeking). A blocking endpoint waits up to the receive
 * timeout, then fails with EAGAIN.
 * ---------------------------------------------------------------------- */

/**
 * Receives one datagram, like recv(2). Returns the bytes copied (with
 * EUDP_MSG_TRUNC: the datagram's full length), or -1 with errno EAGAIN
 * (nothing waiting / timeout), ECONNREFUSED (earlier ICMP), ...
 */
ssize_t eudp_recv(eudp_endpoint *ep, void *buf, size_t len, int flags);

/**
 * As eudp_recv(), also returning the sender like recvfrom(2): when addr is
 * not NULL, *addrlen is its room on input and the address's full length on
 * output.
 */
ssize_t eudp_recvfrom(eudp_endpoint *ep, void *buf, size_t len, int flags,
                      struct sockaddr *addr, socklen_t *addrlen);

/**
 * Receives one datagram into msg (buf/cap in; len, full_len, addr, addrlen
 * and flags out; flags has EUDP_MSG_TRUNC when truncated). Returns msg->len
 * (with EUDP_MSG_TRUNC: msg->full_len).
 */
ssize_t eudp_recvmsg(eudp_endpoint *ep, struct eudp_rxmsg *msg, int flags);

/**
 * Receives up to n datagrams, like recvmmsg(2) with MSG_WAITFORONE: waits
 * (per the endpoint's mode and timeouts, or not with EUDP_MSG_DONTWAIT) for
 * the first, then takes only what is already waiting. Returns the count
 * filled; an error met after the first datagram is returned by the next
 * call. EUDP_MSG_PEEK is EINVAL here.
 */
ssize_t eudp_recv_batch(eudp_endpoint *ep, struct eudp_rxmsg *msgs, size_t n, int flags);

/**
 * Datagrams waiting in the receive ring and the length of the next one
 * (0 when none). Either pointer may be NULL.
 */
int eudp_pending(eudp_endpoint *ep, size_t *datagrams, size_t *next_len);

/**
 * A file descriptor that is readable exactly while a datagram (or an
 * asynchronous error) waits, for poll/select/epoll (level-triggered or
 * edge-triggered). Owned by the endpoint: do not read, write or close it;
 * it stays the same until eudp_close().
 */
int eudp_poll_fd(eudp_endpoint *ep);

/* ------------------------------------------------------------------------
 * Options and counters
 * ---------------------------------------------------------------------- */

/** Nonblocking mode on (on != 0) or off: calls that would wait fail with EAGAIN. */
int eudp_set_nonblocking(eudp_endpoint *ep, int on);

/**
 * Receive and send timeouts in milliseconds (SO_RCVTIMEO / SO_SNDTIMEO).
 * -1: none (wait forever, the default); 0: do not wait; < -1: EINVAL.
 * The send timeout applies when the queue is full.
 */
int eudp_set_timeouts(eudp_endpoint *ep, int recv_ms, int send_ms);

/** SO_SNDBUF; the queue's byte bound follows what the kernel grants. */
int eudp_set_send_buffer_size(eudp_endpoint *ep, size_t bytes);

/** SO_RCVBUF; the receive ring's byte bound follows what the kernel grants. */
int eudp_set_recv_buffer_size(eudp_endpoint *ep, size_t bytes);

/** IP_RECVERR / IPV6_RECVERR: ICMP errors on unconnected endpoints. */
int eudp_set_recv_err(eudp_endpoint *ep, int on);

/** Copies the endpoint's counters into *out. */
int eudp_stats(eudp_endpoint *ep, struct eudp_stats *out);

/* ------------------------------------------------------------------------
 * EMP: reliable tagged messages (docs/emp.md)
 *
 * An eudp_emp endpoint binds one UDP socket and runs the EMP protocol on
 * its own engine thread: messages of up to 16 MiB to the peers of its
 * address vector, delivered exactly once and in order per peer, matched
 * by tag against receives posted beforehand. A message whose first frame
 * matches no posted receive is dropped and counted (unmatched); its sender
 * sends it again on its retransmission timer, so it arrives once a receive
 * is posted. Every send and receive ends in exactly one completion, read
 * with eudp_emp_cq_read() / eudp_emp_cq_wait().
 *
 * Conventions as above: -1 (or NULL) and errno. An endpoint may be used by
 * several threads at once; eudp_emp_close() must not race with other calls.
 * ---------------------------------------------------------------------- */

/** An EMP endpoint (opaque). */
typedef struct eudp_emp eudp_emp;

/** A peer id that names no peer: "any peer" for eudp_emp_trecv() and the
 *  whole endpoint for eudp_emp_counters(); in a completion: no peer. */
#define EUDP_EMP_ANY_PEER 0xffffffffu
/** eudp_emp_completion.op of a send. */
#define EUDP_EMP_OP_SEND 1
/** eudp_emp_completion.op of a receive. */
#define EUDP_EMP_OP_RECV 2
/** Largest message, in bytes (16 MiB). */
#define EUDP_EMP_MAX_MESSAGE (16u << 20)

/** Knobs of an endpoint for eudp_emp_open(); a zero field takes its default. */
struct eudp_emp_config {
    uint32_t frame_payload;   /* payload bytes per frame (default 1440: a 1500-byte MTU) */
    uint32_t ack_group;       /* receiver acks every ack_group frames (default 16; at most window) */
    uint32_t window;          /* frames in flight unacknowledged (default 512) */
    uint32_t rto_initial_us;  /* first retransmission timeout (default 20 ms) */
    uint32_t rto_max_us;      /* the timeout doubles up to this (default 500 ms) */
    uint32_t deadline_ms;     /* a flow without progress this long fails its sends (default 5 s) */
    uint64_t send_queue_bytes;    /* bytes queued per peer before EAGAIN (default 4 MiB) */
    uint64_t unexpected_messages; /* unexpected-message queue: messages (0: off, EMP's rule) */
    uint64_t unexpected_bytes;    /* unexpected-message queue: bytes (0: off) */
    uint64_t socket_buffer;       /* bytes asked for the socket's send and receive buffers (default 8 MiB) */
    uint32_t poll_spin_us;        /* eudp_emp_cq_wait() polls the socket this long before sleeping (0: off) */
    uint32_t ack_delay_us;        /* a message's last frame's ack waits this long for a reply to carry it
                                     (default 200 us; EUDP_EMP_ACK_NOW: at once) */
};

/** eudp_emp_config.ack_delay_us: acknowledge at once. */
#define EUDP_EMP_ACK_NOW 0xffffffffu

/** One finished send or receive. */
struct eudp_emp_completion {
    uint64_t context;  /* the caller's context given to eudp_emp_tsend() / eudp_emp_trecv() */
    uint64_t tag;      /* the message's tag (a receive: the tag as sent) */
    void *buf;         /* a receive's buffer as posted (NULL for a send) */
    size_t len;        /* bytes sent, or bytes copied into buf */
    size_t full_len;   /* the message's length (a receive: > len when truncated) */
    uint32_t peer;     /* peer sent to or received from; EUDP_EMP_ANY_PEER when none */
    int op;            /* EUDP_EMP_OP_SEND or EUDP_EMP_OP_RECV */
    /* 0 on success, else an errno value:
     *   ETIMEDOUT  a send whose peer made no progress within the deadline
     *   EMSGSIZE   a receive whose message was longer than cap (truncated:
     *              buf holds the first cap bytes), or a send too long
     *   ECANCELED  a receive cancelled by eudp_emp_cancel()
     *   ESHUTDOWN  the peer was removed or the endpoint stopped first */
    int status;
    uint32_t flags;    /* EUDP_EMP_TRUNCATED or 0 */
};

/** eudp_emp_completion.flags: the message was longer than the receive's
 *  buffer (as libfabric's FI_ETRUNC); len of its full_len bytes landed. */
#define EUDP_EMP_TRUNCATED 1u

/** Counters of one peer or of a whole endpoint (a copy; see eudp_emp_counters()). */
struct eudp_emp_counters {
    uint64_t frames_sent;       /* data, ACK and NAK frames sent */
    uint64_t frames_received;   /* frames received and parsed (from a known peer) */
    uint64_t retransmits;       /* data frames sent again */
    uint64_t acks_sent;         /* ACK frames sent alone */
    uint64_t acks_received;     /* acknowledgments received, alone or on data frames */
    uint64_t naks_sent;
    uint64_t naks_received;
    uint64_t duplicates;        /* data frames below the expected one, and copies of held ones, dropped */
    uint64_t gaps;              /* data frames above the expected one beyond the window, dropped */
    uint64_t unmatched;         /* first frames dropped for want of a posted receive */
    uint64_t unexpected;        /* messages taken into the unexpected-message queue */
    uint64_t truncated;         /* messages longer than the receive that took them */
    uint64_t stale;             /* frames of another incarnation of a flow, ignored */
    uint64_t timeouts;          /* retransmission timer expiries */
    uint64_t give_ups;          /* flows that gave up at their deadline */
    uint64_t messages_sent;     /* messages acknowledged whole */
    uint64_t messages_failed;   /* sends that completed with an error */
    uint64_t messages_received; /* messages received whole */
    uint64_t malformed;         /* datagrams that are not EMP frames (endpoint only) */
    uint64_t unknown_peer;      /* frames from addresses not in the address vector (endpoint only) */
    uint64_t go_backs;          /* frames the socket did not take (full buffer), sent again */
    uint64_t held;              /* data frames above the expected one within the window, held until the gap fills */
    uint64_t acks_piggybacked;  /* acknowledgments sent on data frames of the reverse flow */
};

/**
 * Opens an endpoint bound to addr (a sockaddr_in or sockaddr_in6; port 0:
 * ephemeral) and starts its engine thread. cfg: NULL for the defaults.
 * Returns NULL with errno EINVAL (NULL or short addr), EAFNOSUPPORT,
 * EADDRINUSE, EADDRNOTAVAIL, or the error of creating the socket/thread.
 */
eudp_emp *eudp_emp_open(const struct sockaddr *addr, socklen_t addrlen, const struct eudp_emp_config *cfg);

/**
 * Stops the engine thread and frees the endpoint and its fds. Sends not
 * yet acknowledged are abandoned and completions not yet read are
 * discarded; the library no longer touches any receive buffer. ep is
 * invalid afterwards. Returns 0, or -1/EINVAL for NULL.
 */
int eudp_emp_close(eudp_emp *ep);

/**
 * The bound address, like getsockname(2): *addrlen is the room in *addr on
 * input, the address's full length on output.
 */
int eudp_emp_local_addr(eudp_emp *ep, struct sockaddr_storage *addr, socklen_t *addrlen);

/**
 * Adds a peer to the address vector. a.b.c.d (AF_INET) and ::ffff:a.b.c.d
 * (AF_INET6) name the same peer on either endpoint (an AF_INET6 endpoint
 * is dual-stack and talks to IPv4 peers); other IPv6 addresses need an
 * AF_INET6 endpoint. An address already present, in either form, gives
 * its id again; each insert is undone by one eudp_emp_av_remove().
 * Returns the peer's id (>= 0, never EUDP_EMP_ANY_PEER), or -1 with errno
 * EINVAL (NULL or short addr), EAFNOSUPPORT.
 */
int64_t eudp_emp_av_insert(eudp_emp *ep, const struct sockaddr *addr, socklen_t addrlen);

/**
 * Undoes one eudp_emp_av_insert() of a peer; the last one removes it: its
 * sends not yet acknowledged complete with ESHUTDOWN, and frames from its
 * address count as unknown_peer. Returns 0, or -1 with
 * errno ENOENT (no such peer).
 */
int eudp_emp_av_remove(eudp_emp *ep, uint32_t peer);

/**
 * Sends len bytes as one message with tag to peer. The bytes are copied:
 * buf may be reused when the call returns. The send's completion (with
 * context) comes when the peer has acknowledged the whole message, or with
 * ETIMEDOUT when the peer makes no progress within the deadline.
 * Returns 0, or -1 with errno ENOENT (no such peer), EMSGSIZE (len >
 * EUDP_EMP_MAX_MESSAGE), EAGAIN (the peer's queue holds send_queue_bytes;
 * read completions and retry), ESHUTDOWN (the engine thread stopped).
 */
int eudp_emp_tsend(eudp_emp *ep, uint32_t peer, uint64_t tag, const void *buf, size_t len, uint64_t context);

/**
 * Pre-posts a receive for one message from peer (or EUDP_EMP_ANY_PEER)
 * whose tag equals tag in every bit not set in ignore. A message matches
 * the first posted receive that fits it, in posting order. Its bytes (up
 * to cap; a longer message completes with EMSGSIZE and EUDP_EMP_TRUNCATED)
 * land in buf as its frames arrive, copied once, straight from each frame.
 * Ownership: buf belongs to the library from
 * this call until its completion has been returned by eudp_emp_cq_read()
 * or eudp_emp_cq_wait() (or until eudp_emp_close()), also after a cancel;
 * do not free or read it before. Returns 0, or -1 with errno EINVAL (NULL
 * buf with cap > 0), ENOENT (no such peer), ESHUTDOWN.
 */
int eudp_emp_trecv(eudp_emp *ep, uint32_t peer, uint64_t tag, uint64_t ignore,
                   void *buf, size_t cap, uint64_t context);

/**
 * Cancels every posted receive whose completion has not been read and
 * whose context is context. Each completes with ECANCELED, or normally if
 * a message had matched it already. Returns 0, or -1 with errno ENOENT
 * (none has this context).
 */
int eudp_emp_cancel(eudp_emp *ep, uint64_t context);

/**
 * Reads up to max completions, oldest first, without waiting (it makes
 * progress on the protocol itself first when nothing is ready). Returns
 * the count (0: none ready), or -1 with errno EINVAL (NULL out, max > 0).
 */
ssize_t eudp_emp_cq_read(eudp_emp *ep, struct eudp_emp_completion *out, size_t max);

/**
 * Waits for one completion, making progress on the protocol while it
 * waits. timeout_ms: -1 waits without limit, 0 does not wait. Returns 1,
 * or -1 with errno ETIMEDOUT (none within timeout_ms > 0), EAGAIN (none,
 * timeout_ms 0), ESHUTDOWN (the engine thread stopped), EINVAL.
 */
int eudp_emp_cq_wait(eudp_emp *ep, struct eudp_emp_completion *out, int timeout_ms);

/**
 * A file descriptor readable while completions are pending, for
 * poll/select/epoll (level-triggered). Owned by the endpoint: do not read,
 * write or close it; it stays the same until eudp_emp_close().
 */
int eudp_emp_cq_fd(eudp_emp *ep);

/**
 * Copies the counters of peer, or of the whole endpoint with
 * EUDP_EMP_ANY_PEER (every peer, past and present, plus what no peer can
 * be charged with), as of the engine's last round. Returns 0, or -1 with
 * errno ENOENT (no such peer), EINVAL (NULL out).
 */
int eudp_emp_counters(eudp_emp *ep, uint32_t peer, struct eudp_emp_counters *out);

/* ------------------------------------------------------------------------
 * Asynchronous sends from the caller's buffers (docs/async.md)
 *
 * An eudp_async sender owns one UDP socket. eudp_async_send() sends each
 * datagram from the caller's buffer where it lies (MSG_ZEROCOPY, or
 * io_uring SEND_ZC with EUDP_ASYNC_URING): the kernel may read the buffer
 * after the call returns. Ownership: a buffer
 * belongs to the library from eudp_async_send() until its completion has
 * been returned by eudp_async_completions(); do not write, free or reuse
 * it before. Each datagram gets exactly one completion, with its token,
 * its buffer, its result and whether the kernel copied the payload after
 * all (EUDP_ASYNC_COPIED: always so on loopback and veth, whose receivers
 * need bytes of their own, and for copying sends). Consecutive datagrams
 * of one call to one destination with one size go out as GSO runs.
 * The handle may be used from several threads; calls on it are serialised,
 * except the wait of eudp_async_wait(), which holds no lock (several
 * threads may wait at once while others send).
 * ------------------------------------------------------------------------ */

/** A sender (opaque). */
typedef struct eudp_async eudp_async;

/** eudp_async_config.flags: copy every send (no zero-copy). */
#define EUDP_ASYNC_COPY   1u
/** eudp_async_config.flags: send every datagram alone (no GSO runs). */
#define EUDP_ASYNC_NO_GSO 2u
/**
 * eudp_async_config.flags: send through io_uring SEND_ZC (SENDMSG_ZC for
 * GSO runs) instead of sendmsg(MSG_ZEROCOPY); eudp_async_open() fails with
 * EOPNOTSUPP where the kernel lacks it (before Linux 6.1).
 */
#define EUDP_ASYNC_URING  4u
/** eudp_async_completion.flags: the kernel copied the payload. */
#define EUDP_ASYNC_COPIED 1u
/** eudp_async_engine(): every send copies. */
#define EUDP_ASYNC_ENGINE_COPY         0
/** eudp_async_engine(): sendmsg(MSG_ZEROCOPY), notifications on the error queue. */
#define EUDP_ASYNC_ENGINE_MSG_ZEROCOPY 1
/** eudp_async_engine(): io_uring SEND_ZC / SENDMSG_ZC. */
#define EUDP_ASYNC_ENGINE_URING        2

/** Knobs of a sender for eudp_async_open(); a zero field takes its default. */
struct eudp_async_config {
    uint32_t max_in_flight;      /* most buffers the library holds at once (1024) */
    uint32_t flags;              /* EUDP_ASYNC_COPY | EUDP_ASYNC_NO_GSO | EUDP_ASYNC_URING */
};

/** One datagram for eudp_async_send(). */
struct eudp_async_msg {
    const void *buf;             /* payload: the library's until its completion */
    size_t len;                  /* payload length */
    const struct sockaddr *addr; /* destination, or NULL for the connected peer */
    socklen_t addrlen;           /* length of *addr */
    uint64_t token;              /* the caller's, returned in the completion */
};

/** The end of one datagram's send. */
struct eudp_async_completion {
    uint64_t token;              /* as given to eudp_async_send() */
    const void *buf;             /* the datagram's buffer: the caller's again */
    int64_t result;              /* bytes sent, or -errno: -EMSGSIZE, -ECONNREFUSED,
                                    -ENOBUFS, ... for a datagram the kernel refused */
    uint32_t flags;              /* EUDP_ASYNC_COPIED */
    uint32_t reserved;
};

/**
 * Opens a sender bound to addr (port 0: ephemeral), connected to peer
 * unless peer is NULL. cfg: NULL for the defaults. Where the kernel has no
 * SO_ZEROCOPY every send copies. Returns NULL with errno EINVAL,
 * EAFNOSUPPORT, EADDRINUSE, ... on failure.
 */
eudp_async *eudp_async_open(const struct sockaddr *addr, socklen_t addrlen,
                            const struct sockaddr *peer, socklen_t peerlen,
                            const struct eudp_async_config *cfg);

/**
 * Waits up to a second for the kernel to be done with the buffers, then
 * frees the sender; completions not read are discarded. A buffer the
 * kernel still holds then is never touched by the library again.
 */
int eudp_async_close(eudp_async *s);

/** The bound address, like getsockname(2). */
int eudp_async_local_addr(eudp_async *s, struct sockaddr_storage *addr, socklen_t *addrlen);

/**
 * Sends n datagrams, in order. Returns how many were sent: n, or fewer
 * when the socket's send buffer filled (the rest are the caller's; poll
 * the completion fd or wait a moment, then send them again). Returns -1
 * with errno EAGAIN when none was sent: the n would take the held buffers
 * past max_in_flight (read completions and retry) or the send buffer is
 * full; EINVAL. Errors of single datagrams come in
 * their completions; an ICMP error such as ECONNREFUSED on a connected
 * sender comes with the next datagram, which the kernel refuses for it.
 */
ssize_t eudp_async_send(eudp_async *s, const struct eudp_async_msg *msgs, size_t n);

/** Reads up to max completions without waiting; returns how many (0: none). */
ssize_t eudp_async_completions(eudp_async *s, struct eudp_async_completion *out, size_t max);

/**
 * Waits up to timeout_ms (-1: no limit) for completions: 1 ready, 0
 * timeout. Holds no lock while it waits: other threads send and read
 * completions meanwhile, and several threads may wait on one sender (each
 * returns 1 while completions wait to be read).
 */
int eudp_async_wait(eudp_async *s, int timeout_ms);

/**
 * Registers n buffer regions with an EUDP_ASYNC_URING sender, once
 * (IORING_REGISTER_BUFFERS): a datagram whose bytes lie inside one region
 * is sent from that region's pages, pinned now, instead of pinning its own
 * pages per send. Each region must stay mapped at its address while the
 * sender lives. -1 with EOPNOTSUPP for other engines, EBUSY when regions
 * are registered already, EINVAL, ENOMEM (the locked-memory limit).
 */
int eudp_async_register(eudp_async *s, const struct iovec *regions, size_t n);

/** The engine in use: EUDP_ASYNC_ENGINE_COPY, _MSG_ZEROCOPY or _URING. */
int eudp_async_engine(eudp_async *s);

/**
 * A file descriptor readable while completions wait to be read (poll,
 * select, epoll; level-triggered). Owned by the sender: do not read or
 * close it.
 */
int eudp_async_fd(eudp_async *s);

/** 1 when sends are zero-copy (asked for and accepted by the kernel), else 0. */
int eudp_async_zerocopy(eudp_async *s);

/** Buffers the library holds: sent and not completed, or completed and not read. */
ssize_t eudp_async_in_flight(eudp_async *s);

/* ------------------------------------------------------------------------
 * Asynchronous receives into the library's buffers (docs/async.md)
 *
 * An eudp_async_rx receiver owns one bound UDP socket and an io_uring
 * multishot receive into a ring of its buffers (Linux 6.0 or later). The
 * kernel writes each datagram (or GRO run of datagrams) into a buffer;
 * eudp_async_recv_next() lends buffers to the caller by reference, without
 * a copy, and eudp_async_recv_release() gives each back to the ring. A
 * lent buffer's bytes stay valid and unchanged until its release. While the
 * caller holds every buffer the receive pauses (datagrams wait in the
 * socket's buffer) and resumes once every buffer is back, or at the next
 * eudp_async_recv_next() or eudp_async_recv_arm().
 * ------------------------------------------------------------------------ */

/** A receiver (opaque). */
typedef struct eudp_async_rx eudp_async_rx;

/** eudp_async_rx_config.flags: take datagrams one by one (no UDP_GRO). */
#define EUDP_ASYNC_RX_NO_GRO    1u
/** eudp_async_rx_datagram.flags: the datagram did not fit its buffer. */
#define EUDP_ASYNC_RX_TRUNCATED 1u

/** Knobs of a receiver for eudp_async_recv_open(); a zero field takes its default. */
struct eudp_async_rx_config {
    uint32_t buffers;            /* buffers in the ring, a power of two (64) */
    uint32_t buffer_size;        /* bytes per buffer, about 300 of them headers (65536 + 512) */
    uint32_t flags;              /* EUDP_ASYNC_RX_NO_GRO */
    uint32_t reserved;
};

/** One lent buffer. */
struct eudp_async_rx_datagram {
    const void *data;            /* the payload in place: one datagram, or a GRO run's
                                    datagrams back to back, each segment bytes but the last */
    size_t len;                  /* payload bytes */
    uint32_t segment;            /* GRO segment size; 0 for a lone datagram */
    uint32_t flags;              /* EUDP_ASYNC_RX_TRUNCATED */
    uint64_t lease;              /* for eudp_async_recv_release() */
    struct sockaddr_storage src; /* the sender */
    socklen_t srclen;
    uint32_t reserved;
};

/**
 * Opens a receiver bound to addr with its receive armed. cfg: NULL for the
 * defaults. NULL with errno ENOSYS or EINVAL where the kernel lacks io_uring
 * provided-buffer rings, EADDRINUSE, ENOMEM, ...
 */
eudp_async_rx *eudp_async_recv_open(const struct sockaddr *addr, socklen_t addrlen,
                                    const struct eudp_async_rx_config *cfg);

/** Frees the receiver; pointers of buffers not released become invalid. */
int eudp_async_recv_close(eudp_async_rx *r);

/** The bound address, like getsockname(2). */
int eudp_async_recv_local_addr(eudp_async_rx *r, struct sockaddr_storage *addr, socklen_t *addrlen);

/**
 * Arms the receive unless it is armed. Opening arms it; after the ring ran
 * dry, the release that brings the last buffer back and
 * eudp_async_recv_next() arm it again; call it before polling the fd to be
 * sure.
 */
int eudp_async_recv_arm(eudp_async_rx *r);

/**
 * Lends up to max received buffers, waiting up to timeout_ms (-1: no
 * limit, 0: none) for the first; returns how many (0: none in time). The
 * wait holds no lock. Call it until it returns fewer than max before
 * polling the fd again: buffers the library already took from the kernel
 * do not make the fd readable.
 */
ssize_t eudp_async_recv_next(eudp_async_rx *r, struct eudp_async_rx_datagram *out, size_t max,
                             int timeout_ms);

/** Gives a lent buffer back; -1 with ENOENT for a lease not lent. */
int eudp_async_recv_release(eudp_async_rx *r, uint64_t lease);

/** A descriptor readable while received datagrams wait (poll, select, epoll). */
int eudp_async_recv_fd(eudp_async_rx *r);

#ifdef __cplusplus
}
#endif

#endif /* EUDP_H */
