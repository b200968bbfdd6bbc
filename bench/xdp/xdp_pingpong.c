// xdp_pingpong.c — 64-byte UDP ping-pong over kernel sockets vs. AF_XDP.
//
// Feasibility experiment for eudp: does an AF_XDP data path halve the UDP
// round-trip time compared with kernel sockets on a veth testbed?
//
// Roles: server | client.  Modes: kernel | kernel-spin | xdp.
// No libbpf/libxdp: the XDP program is hand-assembled and loaded with bpf(2),
// attached with BPF_LINK_CREATE (native first, then generic), falling back to
// rtnetlink IFLA_XDP if bpf links are unavailable.
//
// Build: gcc -O2 -Wall -o xdp_pingpong xdp_pingpong.c

#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <linux/bpf.h>
#include <linux/if_link.h>
#include <linux/if_xdp.h>
#include <linux/rtnetlink.h>

#ifndef AF_XDP
#define AF_XDP 44
#endif
#ifndef SOL_XDP
#define SOL_XDP 283
#endif

#define PAYLOAD_LEN 64
#define HDR_LEN (14 + 20 + 8)
#define FRAME_LEN (HDR_LEN + PAYLOAD_LEN)
#define NUM_FRAMES 4096
#define FRAME_SIZE 2048
#define RING_SIZE 2048
#define MAGIC 0x58445050u /* "XDPP" */
#define T_PING 1u
#define T_STOP 2u
#define MAX_LOST 10

struct payload {
    uint32_t magic;
    uint32_t type;
    uint64_t seq;
    uint8_t pad[PAYLOAD_LEN - 16];
};
_Static_assert(sizeof(struct payload) == PAYLOAD_LEN, "payload size");

/* ------------------------------------------------------------------ */
/* options */

static struct {
    int server;
    const char *mode;
    const char *ifname;
    uint16_t port;
    struct in_addr local_ip, peer_ip;
    uint8_t peer_mac[6];
    int have_peer_mac;
    long n, warmup;
    double duration; /* server lifetime bound, seconds */
    const char *xdp_mode; /* auto | drv | skb */
    const char *bind_mode; /* copy | zc | auto */
} opt = {
    .port = 9099, .n = 100000, .warmup = 1000, .duration = 120.0,
    .xdp_mode = "auto", .bind_mode = "copy",
};

static volatile sig_atomic_t g_stop;
static void on_signal(int s) { (void)s; g_stop = 1; }

static void die(const char *what)
{
    fprintf(stderr, "xdp_pingpong: %s: %s\n", what, strerror(errno));
    exit(1);
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ */
/* checksums */

static uint32_t csum_add(uint32_t sum, const void *data, size_t len)
{
    const uint8_t *p = data;
    while (len > 1) {
        sum += (uint32_t)p[0] << 8 | p[1];
        p += 2;
        len -= 2;
    }
    if (len)
        sum += (uint32_t)p[0] << 8;
    return sum;
}

static uint16_t csum_fold(uint32_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return htons((uint16_t)~sum);
}

/* IPv4 header at ip (20 bytes), UDP header+payload at udp (udp_len bytes) */
static void fill_checksums(uint8_t *ip, uint8_t *udp, size_t udp_len)
{
    ip[10] = ip[11] = 0;
    uint16_t c = csum_fold(csum_add(0, ip, 20));
    memcpy(ip + 10, &c, 2);
    udp[6] = udp[7] = 0;
    uint32_t s = csum_add(0, ip + 12, 8); /* src+dst addr */
    s += 17;                              /* protocol */
    s += (uint32_t)udp_len;
    s = csum_add(s, udp, udp_len);
    c = csum_fold(s);
    if (c == 0)
        c = 0xffff;
    memcpy(udp + 6, &c, 2);
}

/* ------------------------------------------------------------------ */
/* bpf(2) and the XDP program */

static long sys_bpf(int cmd, union bpf_attr *attr)
{
    return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

#define INSN(c, d, s, o, i) \
    ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})
#define LDX(sz, d, s, o) INSN(BPF_LDX | BPF_MEM | (sz), d, s, o, 0)
#define MOV64_REG(d, s) INSN(BPF_ALU64 | BPF_MOV | BPF_X, d, s, 0, 0)
#define MOV64_IMM(d, i) INSN(BPF_ALU64 | BPF_MOV | BPF_K, d, 0, 0, i)
#define ADD64_IMM(d, i) INSN(BPF_ALU64 | BPF_ADD | BPF_K, d, 0, 0, i)
#define AND64_IMM(d, i) INSN(BPF_ALU64 | BPF_AND | BPF_K, d, 0, 0, i)
#define JGT_REG(d, s, o) INSN(BPF_JMP | BPF_JGT | BPF_X, d, s, o, 0)
#define JNE_IMM(d, i, o) INSN(BPF_JMP | BPF_JNE | BPF_K, d, 0, o, i)
#define CALL(f) INSN(BPF_JMP | BPF_CALL, 0, 0, 0, f)
#define EXIT() INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)

/*
 * r2 = ctx->data; r3 = ctx->data_end
 * if (data + 42 > data_end) pass
 * if (eth.type != 0x0800 || ip.ver_ihl != 0x45 || ip.proto != 17
 *     || (ip.frag_off & 0x3fff) || udp.dport != port) pass
 * return bpf_redirect_map(&xsks, 0, XDP_PASS)
 */
static int load_prog(int map_fd, uint16_t port)
{
    struct bpf_insn prog[] = {
        /*  0 */ LDX(BPF_W, 2, 1, 0),
        /*  1 */ LDX(BPF_W, 3, 1, 4),
        /*  2 */ MOV64_REG(4, 2),
        /*  3 */ ADD64_IMM(4, HDR_LEN),
        /*  4 */ JGT_REG(4, 3, 17),
        /*  5 */ LDX(BPF_H, 5, 2, 12),
        /*  6 */ JNE_IMM(5, htons(0x0800), 15),
        /*  7 */ LDX(BPF_B, 5, 2, 14),
        /*  8 */ JNE_IMM(5, 0x45, 13),
        /*  9 */ LDX(BPF_B, 5, 2, 23),
        /* 10 */ JNE_IMM(5, 17, 11),
        /* 11 */ LDX(BPF_H, 5, 2, 20),
        /* 12 */ AND64_IMM(5, htons(0x3fff)),
        /* 13 */ JNE_IMM(5, 0, 8),
        /* 14 */ LDX(BPF_H, 5, 2, 36),
        /* 15 */ JNE_IMM(5, htons(port), 6),
        /* 16 */ INSN(BPF_LD | BPF_DW | BPF_IMM, 1, BPF_PSEUDO_MAP_FD, 0, map_fd),
        /* 17 */ INSN(0, 0, 0, 0, 0),
        /* 18 */ MOV64_IMM(2, 0),
        /* 19 */ MOV64_IMM(3, XDP_PASS),
        /* 20 */ CALL(BPF_FUNC_redirect_map),
        /* 21 */ EXIT(),
        /* 22 pass: */ MOV64_IMM(0, XDP_PASS),
        /* 23 */ EXIT(),
    };
    static char log[65536];
    union bpf_attr a;
    memset(&a, 0, sizeof(a));
    a.prog_type = BPF_PROG_TYPE_XDP;
    a.insns = (uint64_t)(uintptr_t)prog;
    a.insn_cnt = sizeof(prog) / sizeof(prog[0]);
    a.license = (uint64_t)(uintptr_t) "GPL";
    a.expected_attach_type = BPF_XDP;
    strncpy(a.prog_name, "xdp_pingpong", sizeof(a.prog_name) - 1);
    int fd = (int)sys_bpf(BPF_PROG_LOAD, &a);
    if (fd >= 0)
        return fd;
    int e = errno;
    a.log_level = 1;
    a.log_buf = (uint64_t)(uintptr_t)log;
    a.log_size = sizeof(log);
    if (sys_bpf(BPF_PROG_LOAD, &a) < 0)
        fprintf(stderr, "verifier log:\n%s\n", log);
    errno = e;
    die("BPF_PROG_LOAD");
    return -1;
}

/* rtnetlink IFLA_XDP attach/detach (fallback when BPF_LINK_CREATE fails) */
static int netlink_xdp(int ifindex, int prog_fd, uint32_t flags)
{
    struct {
        struct nlmsghdr nh;
        struct ifinfomsg ifi;
        char attrs[64];
    } req;
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_len = NLMSG_LENGTH(sizeof(struct ifinfomsg));
    req.nh.nlmsg_type = RTM_SETLINK;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
    req.nh.nlmsg_seq = 1;
    req.ifi.ifi_family = AF_UNSPEC;
    req.ifi.ifi_index = ifindex;
    struct rtattr *nest = (struct rtattr *)((char *)&req + NLMSG_ALIGN(req.nh.nlmsg_len));
    nest->rta_type = IFLA_XDP | NLA_F_NESTED;
    nest->rta_len = RTA_LENGTH(0);
    struct rtattr *ra = (struct rtattr *)((char *)nest + RTA_ALIGN(nest->rta_len));
    ra->rta_type = IFLA_XDP_FD;
    ra->rta_len = RTA_LENGTH(sizeof(int));
    memcpy(RTA_DATA(ra), &prog_fd, sizeof(int));
    nest->rta_len += RTA_ALIGN(ra->rta_len);
    ra = (struct rtattr *)((char *)nest + RTA_ALIGN(nest->rta_len));
    ra->rta_type = IFLA_XDP_FLAGS;
    ra->rta_len = RTA_LENGTH(sizeof(uint32_t));
    memcpy(RTA_DATA(ra), &flags, sizeof(uint32_t));
    nest->rta_len += RTA_ALIGN(ra->rta_len);
    req.nh.nlmsg_len = NLMSG_ALIGN(req.nh.nlmsg_len) + RTA_ALIGN(nest->rta_len);

    int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
    if (s < 0)
        return -errno;
    struct sockaddr_nl sa = {.nl_family = AF_NETLINK};
    if (sendto(s, &req, req.nh.nlmsg_len, 0, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        int e = -errno;
        close(s);
        return e;
    }
    struct timeval tv = {.tv_sec = 2};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[4096];
    ssize_t n = recv(s, buf, sizeof(buf), 0);
    close(s);
    if (n < 0)
        return -errno;
    struct nlmsghdr *nh = (struct nlmsghdr *)buf;
    if (NLMSG_OK(nh, (size_t)n) && nh->nlmsg_type == NLMSG_ERROR) {
        struct nlmsgerr *err = NLMSG_DATA(nh);
        return err->error; /* 0 = ack */
    }
    return -EPROTO;
}

/* ------------------------------------------------------------------ */
/* AF_XDP socket */

struct ring {
    uint32_t *prod, *cons, *flags;
    void *desc;
    void *map;
    size_t map_len;
    uint32_t mask;
    uint32_t size;
};

struct xsk {
    int fd;
    uint8_t *umem;
    struct ring fq, cq, rx, tx;
    uint64_t freelist[NUM_FRAMES];
    uint32_t nfree;
    int ifindex;
    uint8_t mac[6];
    int map_fd, prog_fd, link_fd;
    int nl_ifindex; /* nonzero when attached with netlink */
    uint32_t nl_flags;
    const char *attach_mode;
    const char *bind_mode;
    uint64_t tx_pending; /* frames sent but not yet completed */
};

static struct xsk *g_xsk; /* for the atexit detach */

static void map_ring(struct xsk *x, struct ring *r, const struct xdp_ring_offset *o,
                     uint64_t pgoff, size_t desc_size)
{
    r->size = RING_SIZE;
    r->mask = RING_SIZE - 1;
    r->map_len = o->desc + RING_SIZE * desc_size;
    r->map = mmap(NULL, r->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, x->fd,
                  (off_t)pgoff);
    if (r->map == MAP_FAILED)
        die("mmap ring");
    r->prod = (uint32_t *)((uint8_t *)r->map + o->producer);
    r->cons = (uint32_t *)((uint8_t *)r->map + o->consumer);
    r->flags = (uint32_t *)((uint8_t *)r->map + o->flags);
    r->desc = (uint8_t *)r->map + o->desc;
}

/* fill ring: producer is us */
static void fq_put(struct xsk *x, uint64_t addr)
{
    uint32_t prod = *x->fq.prod; /* only we write it */
    uint32_t cons = __atomic_load_n(x->fq.cons, __ATOMIC_ACQUIRE);
    if (prod - cons >= x->fq.size) { /* cannot happen: fewer frames than slots */
        x->freelist[x->nfree++] = addr;
        return;
    }
    ((uint64_t *)x->fq.desc)[prod & x->fq.mask] = addr;
    __atomic_store_n(x->fq.prod, prod + 1, __ATOMIC_RELEASE);
}

/* completion ring: consumer is us; to_fill decides where the frames go */
static void cq_reap(struct xsk *x, int to_fill)
{
    uint32_t cons = *x->cq.cons;
    uint32_t prod = __atomic_load_n(x->cq.prod, __ATOMIC_ACQUIRE);
    if (cons == prod)
        return;
    while (cons != prod) {
        uint64_t addr = ((uint64_t *)x->cq.desc)[cons & x->cq.mask];
        addr &= ~(uint64_t)(FRAME_SIZE - 1);
        if (to_fill)
            fq_put(x, addr);
        else if (x->nfree < NUM_FRAMES)
            x->freelist[x->nfree++] = addr;
        cons++;
        x->tx_pending--;
    }
    __atomic_store_n(x->cq.cons, cons, __ATOMIC_RELEASE);
}

static int tx_push(struct xsk *x, uint64_t addr, uint32_t len)
{
    uint32_t prod = *x->tx.prod;
    uint32_t cons = __atomic_load_n(x->tx.cons, __ATOMIC_ACQUIRE);
    if (prod - cons >= x->tx.size)
        return -1;
    struct xdp_desc *d = &((struct xdp_desc *)x->tx.desc)[prod & x->tx.mask];
    d->addr = addr;
    d->len = len;
    d->options = 0;
    __atomic_store_n(x->tx.prod, prod + 1, __ATOMIC_RELEASE);
    x->tx_pending++;
    /* copy mode: the kick transmits synchronously */
    for (int i = 0; i < 100; i++) {
        if (sendto(x->fd, NULL, 0, MSG_DONTWAIT, NULL, 0) >= 0)
            break;
        if (errno != EAGAIN && errno != EBUSY && errno != ENOBUFS && errno != EINTR) {
            if (errno == ENETDOWN || errno == ENXIO)
                die("xsk kick");
            break;
        }
    }
    return 0;
}

/* RX ring: consumer is us. Returns 1 and the descriptor if one is ready. */
static inline int rx_peek(struct xsk *x, struct xdp_desc *out)
{
    uint32_t cons = *x->rx.cons;
    uint32_t prod = __atomic_load_n(x->rx.prod, __ATOMIC_ACQUIRE);
    if (cons == prod)
        return 0;
    *out = ((struct xdp_desc *)x->rx.desc)[cons & x->rx.mask];
    __atomic_store_n(x->rx.cons, cons + 1, __ATOMIC_RELEASE);
    return 1;
}

static int xsk_try_bind(struct xsk *x, uint16_t flags)
{
    struct sockaddr_xdp sxdp;
    memset(&sxdp, 0, sizeof(sxdp));
    sxdp.sxdp_family = AF_XDP;
    sxdp.sxdp_ifindex = (uint32_t)x->ifindex;
    sxdp.sxdp_queue_id = 0;
    sxdp.sxdp_flags = flags;
    return bind(x->fd, (struct sockaddr *)&sxdp, sizeof(sxdp));
}

static void xsk_close_socket(struct xsk *x)
{
    struct ring *rs[] = {&x->fq, &x->cq, &x->rx, &x->tx};
    for (int i = 0; i < 4; i++)
        if (rs[i]->map && rs[i]->map != MAP_FAILED)
            munmap(rs[i]->map, rs[i]->map_len);
    close(x->fd);
    munmap(x->umem, (size_t)NUM_FRAMES * FRAME_SIZE);
}

/* create socket + UMEM + rings and bind; returns 0 or -errno from bind */
static int xsk_open(struct xsk *x, uint16_t bind_flags)
{
    x->fd = socket(AF_XDP, SOCK_RAW | SOCK_CLOEXEC, 0);
    if (x->fd < 0)
        die("socket(AF_XDP)");
    x->umem = mmap(NULL, (size_t)NUM_FRAMES * FRAME_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (x->umem == MAP_FAILED)
        die("mmap umem");
    struct xdp_umem_reg mr;
    memset(&mr, 0, sizeof(mr)); /* padding matters: newer kernels read tx_metadata_len there */
    mr.addr = (uint64_t)(uintptr_t)x->umem;
    mr.len = (uint64_t)NUM_FRAMES * FRAME_SIZE;
    mr.chunk_size = FRAME_SIZE;
    mr.headroom = 0;
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_REG, &mr, sizeof(mr)) < 0)
        die("XDP_UMEM_REG");
    int sz = RING_SIZE;
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_FILL_RING, &sz, sizeof(sz)) < 0)
        die("XDP_UMEM_FILL_RING");
    if (setsockopt(x->fd, SOL_XDP, XDP_UMEM_COMPLETION_RING, &sz, sizeof(sz)) < 0)
        die("XDP_UMEM_COMPLETION_RING");
    if (setsockopt(x->fd, SOL_XDP, XDP_RX_RING, &sz, sizeof(sz)) < 0)
        die("XDP_RX_RING");
    if (setsockopt(x->fd, SOL_XDP, XDP_TX_RING, &sz, sizeof(sz)) < 0)
        die("XDP_TX_RING");
    struct xdp_mmap_offsets off;
    socklen_t ol = sizeof(off);
    if (getsockopt(x->fd, SOL_XDP, XDP_MMAP_OFFSETS, &off, &ol) < 0)
        die("XDP_MMAP_OFFSETS");
    if (ol != sizeof(off)) {
        fprintf(stderr, "xdp_pingpong: unexpected XDP_MMAP_OFFSETS size %u\n", ol);
        exit(1);
    }
    map_ring(x, &x->fq, &off.fr, XDP_UMEM_PGOFF_FILL_RING, sizeof(uint64_t));
    map_ring(x, &x->cq, &off.cr, XDP_UMEM_PGOFF_COMPLETION_RING, sizeof(uint64_t));
    map_ring(x, &x->rx, &off.rx, XDP_PGOFF_RX_RING, sizeof(struct xdp_desc));
    map_ring(x, &x->tx, &off.tx, XDP_PGOFF_TX_RING, sizeof(struct xdp_desc));

    /* half of the frames to the fill ring (RX), half on the TX free list */
    x->nfree = 0;
    x->tx_pending = 0;
    for (uint32_t i = 0; i < NUM_FRAMES / 2; i++)
        ((uint64_t *)x->fq.desc)[i] = (uint64_t)i * FRAME_SIZE;
    __atomic_store_n(x->fq.prod, NUM_FRAMES / 2, __ATOMIC_RELEASE);
    for (uint32_t i = NUM_FRAMES / 2; i < NUM_FRAMES; i++)
        x->freelist[x->nfree++] = (uint64_t)i * FRAME_SIZE;

    /* a previous socket on this queue is released asynchronously after close():
     * retry EBUSY for a bounded time */
    for (int i = 0; i < 40; i++) {
        if (xsk_try_bind(x, bind_flags) == 0)
            return 0;
        if (errno != EBUSY)
            break;
        usleep(50000);
    }
    return -errno;
}

static void xdp_detach(void)
{
    struct xsk *x = g_xsk;
    if (!x)
        return;
    if (x->link_fd >= 0) {
        close(x->link_fd); /* the bpf_link (and the attachment) goes away with its last fd */
        x->link_fd = -1;
    }
    if (x->nl_ifindex) {
        int r = netlink_xdp(x->nl_ifindex, -1, x->nl_flags);
        if (r < 0)
            fprintf(stderr, "xdp_pingpong: netlink detach: %s\n", strerror(-r));
        x->nl_ifindex = 0;
    }
}

static struct xsk *xsk_setup(void)
{
    struct xsk *x = calloc(1, sizeof(*x));
    if (!x)
        die("calloc");
    x->link_fd = -1;
    x->ifindex = (int)if_nametoindex(opt.ifname);
    if (!x->ifindex)
        die("if_nametoindex");

    /* own MAC */
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strncpy(ifr.ifr_name, opt.ifname, IFNAMSIZ - 1);
    if (ioctl(s, SIOCGIFHWADDR, &ifr) < 0)
        die("SIOCGIFHWADDR");
    memcpy(x->mac, ifr.ifr_hwaddr.sa_data, 6);
    close(s);

    struct rlimit rl = {RLIM_INFINITY, RLIM_INFINITY};
    setrlimit(RLIMIT_MEMLOCK, &rl);

    /* socket + bind */
    int r;
    if (!strcmp(opt.bind_mode, "zc") || !strcmp(opt.bind_mode, "auto")) {
        r = xsk_open(x, XDP_ZEROCOPY);
        if (r == 0) {
            x->bind_mode = "zerocopy";
        } else {
            fprintf(stderr, "xdp_pingpong: bind XDP_ZEROCOPY failed: %s\n", strerror(-r));
            xsk_close_socket(x);
            if (!strcmp(opt.bind_mode, "zc"))
                exit(1);
        }
    }
    if (!x->bind_mode) {
        r = xsk_open(x, XDP_COPY);
        if (r < 0) {
            errno = -r;
            die("bind(AF_XDP, XDP_COPY)");
        }
        x->bind_mode = "copy";
    }

    /* XSKMAP with our socket at key 0 */
    union bpf_attr a;
    memset(&a, 0, sizeof(a));
    a.map_type = BPF_MAP_TYPE_XSKMAP;
    a.key_size = 4;
    a.value_size = 4;
    a.max_entries = 1;
    strncpy(a.map_name, "xsks_pingpong", sizeof(a.map_name) - 1);
    x->map_fd = (int)sys_bpf(BPF_MAP_CREATE, &a);
    if (x->map_fd < 0)
        die("BPF_MAP_CREATE(XSKMAP)");
    uint32_t key = 0, val = (uint32_t)x->fd;
    memset(&a, 0, sizeof(a));
    a.map_fd = (uint32_t)x->map_fd;
    a.key = (uint64_t)(uintptr_t)&key;
    a.value = (uint64_t)(uintptr_t)&val;
    a.flags = BPF_ANY;
    if (sys_bpf(BPF_MAP_UPDATE_ELEM, &a) < 0)
        die("BPF_MAP_UPDATE_ELEM(XSKMAP)");

    x->prog_fd = load_prog(x->map_fd, opt.port);

    /* attach: bpf_link native, bpf_link generic, then netlink native/generic */
    g_xsk = x;
    atexit(xdp_detach);
    struct {
        uint32_t flags;
        const char *name;
    } modes[2];
    int nmodes = 0;
    if (strcmp(opt.xdp_mode, "skb"))
        modes[nmodes++] = (typeof(modes[0])){XDP_FLAGS_DRV_MODE, "drv"};
    if (strcmp(opt.xdp_mode, "drv"))
        modes[nmodes++] = (typeof(modes[0])){XDP_FLAGS_SKB_MODE, "skb"};
    for (int i = 0; i < nmodes && !x->attach_mode; i++) {
        memset(&a, 0, sizeof(a));
        a.link_create.prog_fd = (uint32_t)x->prog_fd;
        a.link_create.target_ifindex = (uint32_t)x->ifindex;
        a.link_create.attach_type = BPF_XDP;
        a.link_create.flags = modes[i].flags;
        int fd = (int)sys_bpf(BPF_LINK_CREATE, &a);
        if (fd >= 0) {
            x->link_fd = fd;
            x->attach_mode = modes[i].name;
            fprintf(stderr, "xdp_pingpong: attached via bpf_link in %s mode\n", modes[i].name);
        } else {
            fprintf(stderr, "xdp_pingpong: BPF_LINK_CREATE %s mode failed: %s\n", modes[i].name,
                    strerror(errno));
        }
    }
    for (int i = 0; i < nmodes && !x->attach_mode; i++) {
        uint32_t fl = modes[i].flags | XDP_FLAGS_UPDATE_IF_NOEXIST;
        int rr = netlink_xdp(x->ifindex, x->prog_fd, fl);
        if (rr == 0) {
            x->nl_ifindex = x->ifindex;
            x->nl_flags = modes[i].flags;
            x->attach_mode = modes[i].name;
            fprintf(stderr, "xdp_pingpong: attached via netlink in %s mode\n", modes[i].name);
        } else {
            fprintf(stderr, "xdp_pingpong: netlink attach %s mode failed: %s\n", modes[i].name,
                    strerror(-rr));
        }
    }
    if (!x->attach_mode) {
        fprintf(stderr, "xdp_pingpong: could not attach the XDP program\n");
        exit(1);
    }
    return x;
}

static void xsk_teardown(struct xsk *x)
{
    xdp_detach();
    close(x->prog_fd);
    close(x->map_fd);
    xsk_close_socket(x);
    g_xsk = NULL;
    free(x);
}

/* ------------------------------------------------------------------ */
/* frame helpers */

static int frame_ok(const uint8_t *f, uint32_t len)
{
    if (len < FRAME_LEN)
        return 0;
    if (f[12] != 0x08 || f[13] != 0x00 || f[14] != 0x45 || f[23] != 17)
        return 0;
    uint16_t dport;
    memcpy(&dport, f + 36, 2);
    if (ntohs(dport) != opt.port)
        return 0;
    const struct payload *p = (const void *)(f + HDR_LEN);
    return p->magic == MAGIC;
}

static void build_frame(uint8_t *f, const uint8_t *src_mac, uint32_t type, uint64_t seq)
{
    memcpy(f, opt.peer_mac, 6);
    memcpy(f + 6, src_mac, 6);
    f[12] = 0x08;
    f[13] = 0x00;
    uint8_t *ip = f + 14;
    ip[0] = 0x45;
    ip[1] = 0;
    uint16_t v = htons(20 + 8 + PAYLOAD_LEN);
    memcpy(ip + 2, &v, 2);
    ip[4] = ip[5] = 0;    /* id */
    ip[6] = 0x40;         /* DF */
    ip[7] = 0;
    ip[8] = 64;           /* ttl */
    ip[9] = 17;           /* udp */
    memcpy(ip + 12, &opt.local_ip, 4);
    memcpy(ip + 16, &opt.peer_ip, 4);
    uint8_t *udp = ip + 20;
    v = htons(opt.port);
    memcpy(udp, &v, 2);
    memcpy(udp + 2, &v, 2);
    v = htons(8 + PAYLOAD_LEN);
    memcpy(udp + 4, &v, 2);
    struct payload *p = (struct payload *)(udp + 8);
    memset(p, 0, sizeof(*p));
    p->magic = MAGIC;
    p->type = type;
    p->seq = seq;
    fill_checksums(ip, udp, 8 + PAYLOAD_LEN);
}

/* ------------------------------------------------------------------ */
/* kernel sockets */

static int udp_socket(int nonblock)
{
    int fd = socket(AF_INET, SOCK_DGRAM | (nonblock ? SOCK_NONBLOCK : 0), 0);
    if (fd < 0)
        die("socket(UDP)");
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(opt.port),
                             .sin_addr = opt.local_ip};
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
        die("bind(UDP)");
    return fd;
}

static int run_server_kernel(int spin)
{
    int fd = udp_socket(spin);
    if (!spin) {
        struct timeval tv = {.tv_sec = 0, .tv_usec = 200000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    }
    fprintf(stderr, "READY\n");
    uint64_t deadline = now_ns() + (uint64_t)(opt.duration * 1e9);
    uint64_t echoed = 0, iter = 0;
    int stopped = 0;
    struct payload p;
    while (!g_stop) {
        struct sockaddr_in from;
        socklen_t fl = sizeof(from);
        ssize_t n = recvfrom(fd, &p, sizeof(p), spin ? MSG_DONTWAIT : 0, (struct sockaddr *)&from,
                             &fl);
        if (n < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                die("recvfrom");
            if ((!spin || (++iter & 1023) == 0) && now_ns() > deadline)
                break;
            continue;
        }
        if (n == sizeof(p) && p.magic == MAGIC && p.type == T_STOP) {
            stopped = 1;
            break;
        }
        if (sendto(fd, &p, (size_t)n, 0, (struct sockaddr *)&from, fl) < 0 && errno != EAGAIN)
            die("sendto");
        echoed++;
    }
    close(fd);
    printf("{\"role\":\"server\",\"mode\":\"%s\",\"echoed\":%llu,\"stopped_by_client\":%s}\n",
           opt.mode, (unsigned long long)echoed, stopped ? "true" : "false");
    return 0;
}

static int run_server_xdp(void)
{
    struct xsk *x = xsk_setup();
    fprintf(stderr, "READY\n");
    uint64_t deadline = now_ns() + (uint64_t)(opt.duration * 1e9);
    uint64_t echoed = 0, dropped = 0, iter = 0;
    int stopped = 0;
    struct xdp_desc d;
    while (!g_stop) {
        if (!rx_peek(x, &d)) {
            if ((++iter & 4095) == 0) {
                cq_reap(x, 1);
                if (now_ns() > deadline)
                    break;
            }
            continue;
        }
        uint64_t addr = d.addr;
        uint8_t *f = x->umem + addr;
        if (!frame_ok(f, d.len)) {
            dropped++;
            fq_put(x, addr & ~(uint64_t)(FRAME_SIZE - 1));
            continue;
        }
        struct payload *p = (struct payload *)(f + HDR_LEN);
        if (p->type == T_STOP) {
            stopped = 1;
            fq_put(x, addr & ~(uint64_t)(FRAME_SIZE - 1));
            break;
        }
        /* echo in place: swap MACs, IPs and ports. Swapping alone would keep the
         * checksums valid, but a veth peer with TX checksum offload hands us frames
         * whose UDP checksum is only the pseudo-header part (CHECKSUM_PARTIAL), so
         * a kernel receiver would drop the echo: recompute both checksums. */
        uint8_t tmp[6];
        memcpy(f, f + 6, 6);
        memcpy(f + 6, x->mac, 6);
        memcpy(tmp, f + 26, 4);
        memcpy(f + 26, f + 30, 4);
        memcpy(f + 30, tmp, 4);
        memcpy(tmp, f + 34, 2);
        memcpy(f + 34, f + 36, 2);
        memcpy(f + 36, tmp, 2);
        uint16_t ulen;
        memcpy(&ulen, f + 38, 2);
        ulen = ntohs(ulen);
        if (ulen < 8 || ulen > d.len - 34)
            ulen = (uint16_t)(d.len - 34);
        fill_checksums(f + 14, f + 34, ulen);
        if (tx_push(x, addr, d.len) < 0) {
            dropped++;
            fq_put(x, addr & ~(uint64_t)(FRAME_SIZE - 1));
        } else {
            echoed++;
        }
        cq_reap(x, 1);
    }
    const char *am = x->attach_mode, *bm = x->bind_mode;
    xsk_teardown(x);
    printf("{\"role\":\"server\",\"mode\":\"xdp\",\"xdp_attach\":\"%s\",\"xsk_bind\":\"%s\","
           "\"echoed\":%llu,\"dropped\":%llu,\"stopped_by_client\":%s}\n",
           am, bm, (unsigned long long)echoed, (unsigned long long)dropped,
           stopped ? "true" : "false");
    return 0;
}

/* ------------------------------------------------------------------ */
/* client */

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* one round trip: returns 1 ok, 0 lost; *mism counts wrong-sequence replies */
typedef int (*rt_fn)(void *ctx, uint64_t seq, uint64_t *mism);

struct kctx {
    int fd;
    int spin;
};

static int rt_kernel(void *vctx, uint64_t seq, uint64_t *mism)
{
    struct kctx *c = vctx;
    struct payload p;
    memset(&p, 0, sizeof(p));
    p.magic = MAGIC;
    p.type = T_PING;
    p.seq = seq;
    uint64_t t0 = now_ns();
    if (send(c->fd, &p, sizeof(p), 0) != sizeof(p))
        return 0;
    uint64_t deadline = t0 + 1000000000ull;
    unsigned iter = 0;
    for (;;) {
        ssize_t n = recv(c->fd, &p, sizeof(p), c->spin ? MSG_DONTWAIT : 0);
        if (n == sizeof(p)) {
            if (p.magic == MAGIC && p.seq == seq)
                return 1;
            (*mism)++;
        } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                   errno != ECONNREFUSED) {
            die("recv");
        }
        if ((!c->spin || (++iter & 63) == 0) && now_ns() > deadline)
            return 0;
        if (g_stop)
            return 0;
    }
}

static int rt_xdp(void *vctx, uint64_t seq, uint64_t *mism)
{
    struct xsk *x = vctx;
    cq_reap(x, 0);
    if (!x->nfree)
        return 0;
    uint64_t addr = x->freelist[--x->nfree];
    build_frame(x->umem + addr, x->mac, T_PING, seq);
    uint64_t deadline = now_ns() + 1000000000ull;
    if (tx_push(x, addr, FRAME_LEN) < 0) {
        x->freelist[x->nfree++] = addr;
        return 0;
    }
    struct xdp_desc d;
    unsigned iter = 0;
    for (;;) {
        if (rx_peek(x, &d)) {
            uint8_t *f = x->umem + d.addr;
            int ok = frame_ok(f, d.len);
            uint64_t rseq = ok ? ((struct payload *)(f + HDR_LEN))->seq : 0;
            fq_put(x, d.addr & ~(uint64_t)(FRAME_SIZE - 1));
            if (ok && rseq == seq)
                return 1;
            (*mism)++;
        }
        if ((++iter & 255) == 0) {
            if (now_ns() > deadline || g_stop)
                return 0;
        }
    }
}

static void send_stop_kernel(int fd)
{
    struct payload p;
    memset(&p, 0, sizeof(p));
    p.magic = MAGIC;
    p.type = T_STOP;
    for (int i = 0; i < 3; i++)
        send(fd, &p, sizeof(p), 0);
}

static void send_stop_xdp(struct xsk *x)
{
    for (int i = 0; i < 3; i++) {
        cq_reap(x, 0);
        if (!x->nfree)
            break;
        uint64_t addr = x->freelist[--x->nfree];
        build_frame(x->umem + addr, x->mac, T_STOP, 0);
        tx_push(x, addr, FRAME_LEN);
    }
    usleep(10000);
    cq_reap(x, 0);
}

static int run_client(void)
{
    int xdp = !strcmp(opt.mode, "xdp");
    int spin = !strcmp(opt.mode, "kernel-spin");
    struct kctx kc = {-1, spin};
    struct xsk *x = NULL;
    rt_fn fn;
    void *ctx;
    if (xdp) {
        if (!opt.have_peer_mac) {
            fprintf(stderr, "xdp_pingpong: xdp client needs --peer-mac\n");
            return 2;
        }
        x = xsk_setup();
        fn = rt_xdp;
        ctx = x;
    } else {
        kc.fd = udp_socket(spin);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(opt.port),
                                 .sin_addr = opt.peer_ip};
        if (connect(kc.fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
            die("connect");
        if (!spin) {
            struct timeval tv = {.tv_sec = 1, .tv_usec = 0};
            setsockopt(kc.fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        }
        fn = rt_kernel;
        ctx = &kc;
    }

    uint64_t *rtt = malloc(sizeof(uint64_t) * (size_t)opt.n);
    if (!rtt)
        die("malloc");
    uint64_t mism = 0, warm_lost = 0, lost = 0;
    long done = 0;
    uint64_t seq = 1;
    /* warm-up; losses here are tolerated up to MAX_LOST too (server start-up) */
    for (long i = 0; i < opt.warmup && !g_stop; i++) {
        if (!fn(ctx, seq++, &mism) && ++warm_lost >= MAX_LOST)
            break;
    }
    uint64_t wall0 = now_ns();
    if (warm_lost < MAX_LOST) {
        for (long i = 0; i < opt.n && !g_stop; i++) {
            uint64_t t0 = now_ns();
            int ok = fn(ctx, seq++, &mism);
            uint64_t t1 = now_ns();
            if (!ok) {
                if (++lost >= MAX_LOST)
                    break;
                continue;
            }
            rtt[done++] = t1 - t0;
        }
    }
    double wall = (double)(now_ns() - wall0) / 1e9;

    const char *am = "none", *bm = "none";
    if (xdp) {
        send_stop_xdp(x);
        am = x->attach_mode;
        bm = x->bind_mode;
    } else {
        send_stop_kernel(kc.fd);
        close(kc.fd);
    }

    double p50 = 0, p90 = 0, p99 = 0, mean = 0, mn = 0, mx = 0;
    if (done > 0) {
        qsort(rtt, (size_t)done, sizeof(uint64_t), cmp_u64);
        long double sum = 0;
        for (long i = 0; i < done; i++)
            sum += rtt[i];
        mean = (double)(sum / done) / 1e3;
        p50 = rtt[(done * 50) / 100] / 1e3;
        p90 = rtt[(done * 90) / 100] / 1e3;
        p99 = rtt[(done * 99) / 100] / 1e3;
        mn = rtt[0] / 1e3;
        mx = rtt[done - 1] / 1e3;
    }
    printf("{\"role\":\"client\",\"mode\":\"%s\",\"xdp_attach\":\"%s\",\"xsk_bind\":\"%s\","
           "\"udp_csum\":\"%s\",\"n\":%ld,\"completed\":%ld,\"lost\":%llu,\"warmup_lost\":%llu,"
           "\"mismatched\":%llu,\"p50_us\":%.3f,\"p90_us\":%.3f,\"p99_us\":%.3f,"
           "\"mean_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,\"wall_s\":%.3f}\n",
           opt.mode, am, bm, xdp ? "computed" : "kernel", opt.n, done, (unsigned long long)lost,
           (unsigned long long)warm_lost, (unsigned long long)mism, p50, p90, p99, mean, mn, mx,
           wall);
    fflush(stdout);
    free(rtt);
    if (x)
        xsk_teardown(x);
    return (done == opt.n) ? 0 : 3;
}

/* ------------------------------------------------------------------ */

static void usage(void)
{
    fprintf(stderr,
            "usage: xdp_pingpong server|client --mode kernel|kernel-spin|xdp\n"
            "         --local-ip A --peer-ip B [--port P] [--ifname IF] [--peer-mac MAC]\n"
            "         [-n N] [--warmup W] [--duration SECONDS] [--xdp-mode auto|drv|skb]\n"
            "         [--bind copy|zc|auto]\n");
    exit(2);
}

static int parse_mac(const char *s, uint8_t *m)
{
    unsigned v[6];
    if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
        return -1;
    for (int i = 0; i < 6; i++)
        m[i] = (uint8_t)v[i];
    return 0;
}

static int in_testnet(struct in_addr a)
{
    uint32_t h = ntohl(a.s_addr);
    return (h >> 24) == 127 || (h & 0xfffe0000u) == 0xc6120000u; /* 127/8, 198.18/15 */
}

int main(int argc, char **argv)
{
    if (argc < 2)
        usage();
    if (!strcmp(argv[1], "server"))
        opt.server = 1;
    else if (strcmp(argv[1], "client"))
        usage();
    int have_local = 0, have_peer = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        i++;
        if (!strcmp(a, "--mode"))
            opt.mode = v;
        else if (!strcmp(a, "--ifname"))
            opt.ifname = v;
        else if (!strcmp(a, "--port"))
            opt.port = (uint16_t)atoi(v);
        else if (!strcmp(a, "--local-ip"))
            have_local = inet_pton(AF_INET, v, &opt.local_ip) == 1;
        else if (!strcmp(a, "--peer-ip"))
            have_peer = inet_pton(AF_INET, v, &opt.peer_ip) == 1;
        else if (!strcmp(a, "--peer-mac"))
            opt.have_peer_mac = parse_mac(v, opt.peer_mac) == 0;
        else if (!strcmp(a, "-n"))
            opt.n = atol(v);
        else if (!strcmp(a, "--warmup"))
            opt.warmup = atol(v);
        else if (!strcmp(a, "--duration"))
            opt.duration = atof(v);
        else if (!strcmp(a, "--xdp-mode"))
            opt.xdp_mode = v;
        else if (!strcmp(a, "--bind"))
            opt.bind_mode = v;
        else
            usage();
    }
    if (!opt.mode || !have_local || (!opt.server && !have_peer) || opt.n <= 0 || opt.port == 0)
        usage();
    if (strcmp(opt.mode, "kernel") && strcmp(opt.mode, "kernel-spin") && strcmp(opt.mode, "xdp"))
        usage();
    if (!in_testnet(opt.local_ip) || (have_peer && !in_testnet(opt.peer_ip))) {
        fprintf(stderr, "xdp_pingpong: addresses must be in 127/8 or 198.18.0.0/15\n");
        return 2;
    }
    if (!strcmp(opt.mode, "xdp") && !opt.ifname) {
        fprintf(stderr, "xdp_pingpong: xdp mode needs --ifname\n");
        return 2;
    }
    if (opt.duration <= 0 || opt.duration > 3600)
        opt.duration = 120;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    setvbuf(stdout, NULL, _IOLBF, 0);
    setvbuf(stderr, NULL, _IOLBF, 0);

    if (opt.server)
        return !strcmp(opt.mode, "xdp") ? run_server_xdp() : run_server_kernel(!strcmp(opt.mode, "kernel-spin"));
    return run_client();
}
