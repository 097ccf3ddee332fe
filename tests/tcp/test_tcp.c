/* The TCP transport, source and requester in one process over loopback: epoch checks, transfers
 * of every size with byte-for-byte checks, pipelining, permissions and ranges, malformed frames
 * from raw sockets, failures of the source mid-transfer, timeouts, notifications, DESCRIBE,
 * slicing, withdrawal, fences and budgets. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/stage_pool.h"
#include "core/stager.h"
#include "harness.h"
#include "tcp/tcp_conn.h"
#include "tcp/tcp_internal.h"
#include "wire/wire.h"

#define MIB (1024u * 1024u)

static const struct orb_transport_ops *const T = &orb_tcp_transport;

static orb_engine *requester_engine(void)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 2;
    cfg.tcp_local_stripes = 2;
    cfg.tcp_workers = 2;
    cfg.io_timeout_s = 5;
    return th_engine_new(&cfg);
}

/* A region that is no registration of anyone: a local buffer for the requester side. */
static uint8_t *local_buf(size_t len, uint8_t seed)
{
    uint8_t *p = malloc(len);
    assert_non_null(p);
    th_fill(p, len, seed);
    return p;
}

/* inflight() drops right after orb_xfer_done() returns: wait for it a little. */
static uint64_t settled_inflight(orb_engine *e)
{
    uint64_t deadline = orb_deadline_after(5 * TH_SEC);
    while (T->inflight(e->tp) != 0 && orb_now_ns() < deadline)
        usleep(1000);
    return T->inflight(e->tp);
}

/* ---- fake source: answers HELLO, then misbehaves ------------------------------------------- */

enum fake_mode {
    FAKE_SILENT,     /* swallow every request */
    FAKE_WRONG_TYPE, /* answer each request with WRITE_RESP */
    FAKE_WRONG_TAG   /* answer each request with the right type but another tag */
};

struct fake_source {
    int listen_fd;
    char endpoint[64];
    struct orb_epoch epoch;
    enum fake_mode mode;
    atomic_int drop_next;  /* close this many new connections at once, before HELLO */
    atomic_int accepted;
    atomic_int stop;
    pthread_t thread;
    int fds[32];
    int authed[32];
    int nfds;
};

static int recv_exact(int fd, uint8_t *buf, size_t len)
{
    return recv(fd, buf, len, MSG_WAITALL) == (ssize_t)len ? 0 : -1;
}

/* Serve one readable connection; -1 when it is finished. */
static int fake_serve(struct fake_source *f, int i)
{
    int fd = f->fds[i];
    uint8_t buf[ORB_WIRE_HEADER_LEN + 64];
    if (!f->authed[i]) {
        if (recv_exact(fd, buf, ORB_WIRE_HEADER_LEN + 40) != 0)
            return -1;
        struct orb_wire_hello_ok ok = {.epoch = f->epoch, .max_payload = ORB_WIRE_MAX_PAYLOAD};
        size_t len;
        assert_int_equal(orb_wire_hello_ok_encode(&ok, buf, sizeof buf, &len), 0);
        f->authed[i] = 1;
        return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
    }
    if (f->mode == FAKE_SILENT) {
        uint8_t sink[65536];
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        return n > 0 ? 0 : -1;
    }
    struct orb_wire_header h;
    if (recv_exact(fd, buf, ORB_WIRE_HEADER_LEN) != 0 || orb_wire_header_decode(buf, &h) != 0)
        return -1;
    if (h.body_len > 0 && recv_exact(fd, buf, h.body_len) != 0)
        return -1;
    uint64_t tag = f->mode == FAKE_WRONG_TAG ? h.tag + 1000 : h.tag;
    uint8_t type = f->mode == FAKE_WRONG_TAG ? ORB_WIRE_NOTIFY_RESP : ORB_WIRE_WRITE_RESP;
    size_t len;
    assert_int_equal(orb_wire_empty_encode(type, tag, buf, sizeof buf, &len), 0);
    return send(fd, buf, len, MSG_NOSIGNAL) == (ssize_t)len ? 0 : -1;
}

static void *fake_main(void *arg)
{
    struct fake_source *f = arg;
    while (!atomic_load(&f->stop)) {
        struct pollfd p[33];
        p[0].fd = f->listen_fd;
        p[0].events = POLLIN;
        for (int i = 0; i < f->nfds; i++) {
            p[1 + i].fd = f->fds[i];
            p[1 + i].events = POLLIN;
        }
        if (poll(p, (nfds_t)(1 + f->nfds), 50) <= 0)
            continue;
        if ((p[0].revents & POLLIN) && f->nfds < 32) {
            int fd = accept(f->listen_fd, NULL, NULL);
            if (fd >= 0)
                atomic_fetch_add(&f->accepted, 1);
            if (fd >= 0 && atomic_load(&f->drop_next) > 0) {
                atomic_fetch_sub(&f->drop_next, 1);
                close(fd); /* as a source dropping its oldest stranger would */
            } else if (fd >= 0) {
                f->authed[f->nfds] = 0;
                f->fds[f->nfds++] = fd;
            }
        }
        for (int i = 0; i < f->nfds && i < (int)(sizeof p / sizeof p[0]) - 1; i++) {
            if (!(p[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (fake_serve(f, i) != 0) {
                close(f->fds[i]);
                f->fds[i] = -1; /* poll ignores negative fds */
            }
        }
    }
    return NULL;
}

static struct fake_source *fake_start(enum fake_mode mode)
{
    struct fake_source *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->mode = mode;
    f->epoch.bytes[0] = 0x5a;
    f->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(f->listen_fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(f->listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(f->listen_fd, 16), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(f->listen_fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(f->endpoint, sizeof f->endpoint, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    atomic_init(&f->stop, 0);
    atomic_init(&f->drop_next, 0);
    atomic_init(&f->accepted, 0);
    assert_int_equal(pthread_create(&f->thread, NULL, fake_main, f), 0);
    return f;
}

static void fake_stop(struct fake_source *f)
{
    atomic_store(&f->stop, 1);
    pthread_join(f->thread, NULL);
    for (int i = 0; i < f->nfds; i++)
        if (f->fds[i] >= 0)
            close(f->fds[i]);
    close(f->listen_fd);
    free(f);
}

static void *fake_open(orb_engine *req, struct fake_source *f)
{
    void *peer = NULL;
    assert_int_equal(T->peer_open(req->tp, f->endpoint, &f->epoch, orb_deadline_after(5 * TH_SEC), NULL,
                                  &peer),
                     0);
    return peer;
}

/* ---- opening peers --------------------------------------------------------------------------- */

static void test_open_wrong_epoch_is_stale(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    char ep[ORB_ENDPOINT_MAX];
    th_endpoint(src, ep, sizeof ep);
    struct orb_epoch wrong = src->epoch;
    wrong.bytes[15] ^= 1;
    void *peer = NULL;
    assert_int_equal(T->peer_open(req->tp, ep, &wrong, orb_deadline_after(5 * TH_SEC), NULL, &peer),
                     ORB_ESTALE);
    assert_null(peer);
    /* The source keeps serving the right epoch. */
    peer = th_open(req, src);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
}

static void test_open_refused_is_epeer(void **state)
{
    (void)state;
    /* A port nobody listens on: bind one, note it, close it. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    close(fd);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    orb_engine *req = requester_engine();
    struct orb_epoch any = {{1}};
    void *peer = NULL;
    assert_int_equal(T->peer_open(req->tp, ep, &any, orb_deadline_after(TH_SEC), NULL, &peer), ORB_EPEER);
    assert_int_equal(T->peer_open(req->tp, "no-port", &any, orb_deadline_after(TH_SEC), NULL, &peer),
                     ORB_EINVAL);
    assert_null(peer);
    th_engine_free(req);
}

/* A connection the source closes before it answers HELLO (it dropped us as its oldest
 * stranger) is dialled again; a source that drops every one is given up after a few tries. */
static void test_open_redials_a_dropped_hello(void **state)
{
    (void)state;
    struct fake_source *f = fake_start(FAKE_SILENT);
    orb_engine *req = requester_engine();
    atomic_store(&f->drop_next, 2);
    void *peer = fake_open(req, f);
    assert_int_equal(atomic_load(&f->accepted), 3 + 2); /* control, two stripes, two redials */
    T->peer_release(peer);

    atomic_store(&f->accepted, 0);
    atomic_store(&f->drop_next, 1000);
    uint64_t start = orb_now_ns();
    peer = NULL;
    assert_int_equal(T->peer_open(req->tp, f->endpoint, &f->epoch, orb_deadline_after(5 * TH_SEC), NULL,
                                  &peer),
                     ORB_EPEER);
    assert_null(peer);
    assert_true(orb_now_ns() - start < TH_SEC);
    assert_int_equal(atomic_load(&f->accepted), 4);
    th_engine_free(req);
    fake_stop(f);
}

static void test_open_honours_deadline(void **state)
{
    (void)state;
    /* A listener that never accepts: connect succeeds, HELLO_OK never comes. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(lfd, 8), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(lfd, (struct sockaddr *)&sa, &sl), 0);
    char ep[64];
    snprintf(ep, sizeof ep, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
    orb_engine *req = requester_engine();
    struct orb_epoch any = {{1}};
    void *peer = NULL;
    uint64_t t0 = orb_now_ns();
    assert_int_equal(T->peer_open(req->tp, ep, &any, orb_deadline_after(200 * 1000 * 1000), NULL, &peer),
                     ORB_ETIMEDOUT);
    uint64_t took = orb_now_ns() - t0;
    assert_true(took >= 150ull * 1000 * 1000 && took < 3 * TH_SEC);
    close(lfd);
    th_engine_free(req);
}

static void test_endpoint_needs_source(void **state)
{
    (void)state;
    orb_engine *req = requester_engine();
    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(T->endpoint(req->tp, ep, sizeof ep), ORB_EUNAVAILABLE);
    th_engine_free(req);

    orb_engine *src = th_engine_new(NULL);
    char tiny[4];
    assert_int_equal(T->endpoint(src->tp, tiny, sizeof tiny), ORB_EINVAL);
    th_endpoint(src, ep, sizeof ep);
    assert_non_null(strstr(ep, "127.0.0.1:"));
    assert_true(atoi(strchr(ep, ':') + 1) > 0);
    th_engine_free(src);
}

static void test_restarted_source_is_stale(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    struct orb_epoch old_epoch = src->epoch;
    char ep[ORB_ENDPOINT_MAX];
    th_endpoint(src, ep, sizeof ep);
    th_engine_free(src);

    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", ep);
    orb_engine *again = th_engine_new(&cfg);
    orb_engine *req = requester_engine();
    void *peer = NULL;
    assert_int_equal(T->peer_open(req->tp, ep, &old_epoch, orb_deadline_after(5 * TH_SEC), NULL, &peer),
                     ORB_ESTALE);
    th_engine_free(req);
    th_engine_free(again);
}

/* ---- transfers ------------------------------------------------------------------------------- */

/* READ `len` bytes at `off` of a remote region into a local buffer, then WRITE them back
 * shifted, checking every byte and that nothing around the range changed. */
static void roundtrip(void *peer, uint8_t *remote, size_t remote_len, size_t off, size_t len)
{
    uint8_t *local = local_buf(len + 2, 0x33);
    uint8_t *before = malloc(remote_len);
    assert_non_null(before);
    memcpy(before, remote, remote_len);

    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local + 1, remote + off, len, NULL);
    assert_int_equal(th_run(peer, &t, 30 * TH_SEC), 0);
    assert_memory_equal(local + 1, remote + off, len);

    th_fill(local + 1, len, 0x77);
    th_xfer_init(&t, ORB_XFER_WRITE, local + 1, remote + off, len, NULL);
    assert_int_equal(th_run(peer, &t, 30 * TH_SEC), 0);
    assert_int_equal(t.effect, ORB_REMOTE_EFFECT_NONE);
    assert_memory_equal(remote + off, local + 1, len);
    assert_memory_equal(remote, before, off);
    assert_memory_equal(remote + off + len, before + off + len, remote_len - off - len);
    free(before);
    free(local);
}

static void test_read_write_small_and_unaligned(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 3 * 4096, ORB_PERM_REMOTE_WRITE, 1, &owner);
    void *peer = th_open(req, src);
    roundtrip(peer, remote, 3 * 4096, 0, 1);               /* 1 byte */
    roundtrip(peer, remote, 3 * 4096, 3 * 4096 - 1, 1);    /* the last byte */
    roundtrip(peer, remote, 3 * 4096, 7, 4093);            /* unaligned both ends */
    roundtrip(peer, remote, 3 * 4096, 4096, 4096);         /* one page */
    roundtrip(peer, remote, 3 * 4096, 1, 3 * 4096 - 2);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

static void test_read_write_64mib(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    size_t len = ORB_WIRE_MAX_PAYLOAD;
    uint8_t *remote = th_region(src, len, ORB_PERM_REMOTE_WRITE, 2, &owner);
    void *peer = th_open(req, src);
    uint8_t *local = local_buf(len, 9);

    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, remote, len, NULL);
    assert_int_equal(th_run(peer, &t, 60 * TH_SEC), 0);
    assert_memory_equal(local, remote, len);

    th_fill(local, len, 10);
    th_xfer_init(&t, ORB_XFER_WRITE, local, remote, len, NULL);
    assert_int_equal(th_run(peer, &t, 60 * TH_SEC), 0);
    assert_memory_equal(remote, local, len);

    /* One request above the largest payload is refused before anything is accepted. */
    th_xfer_init(&t, ORB_XFER_READ, local, remote, (uint64_t)len + 1, NULL);
    struct orb_xfer *xp = &t.x;
    assert_int_equal(T->peer_submit(peer, &xp, 1), ORB_EINVAL);
    assert_int_equal(th_done_calls(&t), 0);

    free(local);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

static void test_many_pipelined(void **state)
{
    (void)state;
    enum { N = 600, SZ = 4096 + 13 };
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, (size_t)N * SZ, ORB_PERM_REMOTE_WRITE, 3, &owner);
    uint8_t *local = local_buf((size_t)N * SZ, 4);
    uint8_t *expect = malloc((size_t)N * SZ);
    assert_non_null(expect);
    struct th_xfer *t = calloc(N, sizeof *t);
    struct orb_xfer **xp = calloc(N, sizeof *xp);
    assert_non_null(t);
    assert_non_null(xp);
    /* Even slots READ (remote -> local), odd slots WRITE (local -> remote). */
    for (size_t i = 0; i < N; i++) {
        size_t off = i * SZ;
        if (i % 2 == 0)
            memcpy(expect + off, remote + off, SZ);
        else
            memcpy(expect + off, local + off, SZ);
        th_xfer_init(&t[i], i % 2 ? ORB_XFER_WRITE : ORB_XFER_READ, local + off, remote + off, SZ,
                     NULL);
        xp[i] = &t[i].x;
    }
    void *peer = th_open(req, src);
    assert_int_equal(T->peer_submit(peer, xp, N), 0);
    assert_int_equal(th_wait(t, N, 60 * TH_SEC), 0);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(t[i].done_calls, 1);
        assert_int_equal(t[i].status, 0);
        assert_int_equal(atomic_load(&t[i].may_start_calls), 1);
        size_t off = i * SZ;
        assert_memory_equal(i % 2 ? remote + off : local + off, expect + off, SZ);
    }
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(xp);
    free(t);
    free(expect);
    free(local);
}

static void test_sequential_access_across_stripes(void **state)
{
    (void)state;
    /* READ a range on stripe 1 (stripe 0 is busy), then WRITE it on stripe 0, then READ it back:
     * the source serves them on different workers, ordered only by the answers in between. A
     * race detector must see that order too. */
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 8 * MIB, ORB_PERM_REMOTE_WRITE, 22, &owner);
    uint8_t *local = local_buf(8 * MIB, 23);
    void *peer = th_open(req, src);
    for (int round = 0; round < 3; round++) {
        struct th_xfer t[2];
        th_xfer_init(&t[0], ORB_XFER_READ, local + 4 * MIB, remote + 4 * MIB, 4 * MIB, NULL);
        th_xfer_init(&t[1], ORB_XFER_READ, local, remote, 4096, NULL);
        struct orb_xfer *xp[2] = {&t[0].x, &t[1].x};
        assert_int_equal(T->peer_submit(peer, xp, 2), 0);
        assert_int_equal(th_wait(t, 2, 30 * TH_SEC), 0);
        assert_int_equal(t[0].status, 0);
        assert_int_equal(t[1].status, 0);
        th_fill(local, 4096, (uint8_t)(30 + round));
        th_xfer_init(&t[0], ORB_XFER_WRITE, local, remote, 4096, NULL);
        assert_int_equal(th_run(peer, &t[0], 10 * TH_SEC), 0);
        /* Read back through the source (memcmp, unlike cmocka's compare, is seen by race
         * detectors): the READ that follows the WRITE runs on the other worker. */
        th_xfer_init(&t[1], ORB_XFER_READ, local + 4096, remote, 4096, NULL);
        assert_int_equal(th_run(peer, &t[1], 10 * TH_SEC), 0);
        assert_int_equal(memcmp(local + 4096, local, 4096), 0);
    }
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(local);
}

static void test_may_start_asked_once(void **state)
{
    (void)state;
    /* More frames than one sendmsg() carries, on one stripe: every frame is asked once, even
     * when it was gathered before and did not fit. */
    enum { N = 40, SZ = 512 * 1024 };
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = th_engine_new(&cfg);
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, (size_t)N * SZ, ORB_PERM_REMOTE_WRITE, 20, &owner);
    uint8_t *local = local_buf((size_t)N * SZ, 21);
    struct th_xfer *t = calloc(N, sizeof *t);
    struct orb_xfer *xp[N];
    for (size_t i = 0; i < N; i++) {
        th_xfer_init(&t[i], ORB_XFER_WRITE, local + i * SZ, remote + i * SZ, SZ, NULL);
        xp[i] = &t[i].x;
    }
    void *peer = th_open(req, src);
    assert_int_equal(T->peer_submit(peer, xp, N), 0);
    assert_int_equal(th_wait(t, N, 60 * TH_SEC), 0);
    for (size_t i = 0; i < N; i++) {
        assert_int_equal(t[i].status, 0);
        assert_int_equal(atomic_load(&t[i].may_start_calls), 1);
    }
    assert_memory_equal(remote, local, (size_t)N * SZ);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(local);
    free(t);
}

struct submitter {
    void *peer;
    uint8_t *remote;
    uint8_t *local;
    int ok;
};

static void *submit_thread(void *arg)
{
    struct submitter *s = arg;
    enum { N = 100, SZ = 8192 };
    struct th_xfer t[8];
    s->ok = 1;
    for (int round = 0; round < N / 8; round++) {
        struct orb_xfer *xp[8];
        for (int i = 0; i < 8; i++) {
            th_xfer_init(&t[i], ORB_XFER_READ, s->local + (size_t)i * SZ, s->remote + (size_t)i * SZ,
                         SZ, NULL);
            xp[i] = &t[i].x;
        }
        if (T->peer_submit(s->peer, xp, 8) != 0 || th_wait(t, 8, 30 * TH_SEC) != 0) {
            s->ok = 0;
            return NULL;
        }
        for (int i = 0; i < 8; i++)
            if (t[i].status != 0 || memcmp(s->local + (size_t)i * SZ, s->remote + (size_t)i * SZ, SZ))
                s->ok = 0;
    }
    return NULL;
}

static void test_concurrent_submitters(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 8 * 8192, ORB_PERM_REMOTE_READ, 5, &owner);
    void *peer = th_open(req, src);
    struct submitter s[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        s[i] = (struct submitter){.peer = peer, .remote = remote, .local = local_buf(8 * 8192, 0)};
        assert_int_equal(pthread_create(&th[i], NULL, submit_thread, &s[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(s[i].ok);
        free(s[i].local);
    }
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* ---- permissions and ranges ------------------------------------------------------------------ */

static void test_write_to_read_only_is_eperm(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    size_t len = 2 * MIB;
    uint8_t *remote = th_region(src, len, ORB_PERM_REMOTE_READ, 6, &owner);
    uint8_t *before = malloc(len);
    memcpy(before, remote, len);
    uint8_t *local = local_buf(len, 7);
    void *peer = th_open(req, src);

    /* A large refused WRITE: its payload is drained, the stream stays in step. */
    struct th_xfer t[3];
    th_xfer_init(&t[0], ORB_XFER_WRITE, local, remote, len, NULL);
    th_xfer_init(&t[1], ORB_XFER_WRITE, local, remote + 5, 1, NULL);
    th_xfer_init(&t[2], ORB_XFER_READ, local, remote + 100, 4096, NULL);
    struct orb_xfer *xp[3] = {&t[0].x, &t[1].x, &t[2].x};
    assert_int_equal(T->peer_submit(peer, xp, 3), 0);
    assert_int_equal(th_wait(t, 3, 30 * TH_SEC), 0);
    assert_int_equal(t[0].status, ORB_EPERM);
    assert_non_null(strstr(t[0].why, "the source answered")); /* the cause comes with the status */
    assert_int_equal(t[0].effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(t[1].status, ORB_EPERM);
    assert_int_equal(t[2].status, 0);
    assert_memory_equal(local, remote + 100, 4096);
    assert_memory_equal(remote, before, len);

    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(local);
    free(before);
}

static void test_local_only_and_outside_ranges(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *lo_owner, *rw_owner;
    uint8_t *local_only = th_region(src, 4096, ORB_PERM_LOCAL, 8, &lo_owner);
    uint8_t *rw = th_region(src, 4096, ORB_PERM_REMOTE_WRITE, 9, &rw_owner);
    uint8_t *local = local_buf(4096, 10);
    void *peer = th_open(req, src);
    struct th_xfer t;

    /* Local-only memory does not exist for peers: the same answer as unregistered memory. */
    th_xfer_init(&t, ORB_XFER_READ, local, local_only, 16, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_ENOENT);
    th_xfer_init(&t, ORB_XFER_WRITE, local, local_only, 16, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_ENOENT);
    assert_int_equal(t.effect, ORB_REMOTE_EFFECT_NONE);
    /* One byte past either end. */
    th_xfer_init(&t, ORB_XFER_READ, local, rw + 1, 4096, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_ENOENT);
    th_xfer_init(&t, ORB_XFER_WRITE, local, rw - 1, 2, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_ENOENT);
    assert_int_equal(t.effect, ORB_REMOTE_EFFECT_NONE);
    /* The exact range still works on the same connections. */
    th_xfer_init(&t, ORB_XFER_READ, local, rw, 4096, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    assert_memory_equal(local, rw, 4096);

    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(lo_owner);
    orb_host_memory_unref(rw_owner);
    free(local);
}

/* ---- malformed frames ------------------------------------------------------------------------ */

static void send_header(int fd, uint32_t magic, uint8_t type, uint32_t body_len, uint64_t tag)
{
    uint8_t h[ORB_WIRE_HEADER_LEN];
    struct orb_wire_header hdr = {.type = type, .body_len = body_len, .tag = tag};
    orb_wire_header_encode(&hdr, h);
    if (magic != ORB_WIRE_MAGIC) {
        h[0] = (uint8_t)magic;
        h[1] = (uint8_t)(magic >> 8);
        h[2] = (uint8_t)(magic >> 16);
        h[3] = (uint8_t)(magic >> 24);
    }
    assert_int_equal(send(fd, h, sizeof h, MSG_NOSIGNAL), (ssize_t)sizeof h);
}

/* After `fd` was closed by the source, a normal peer still reads. */
static void assert_still_serving(orb_engine *req, orb_engine *src, uint8_t *remote)
{
    void *peer = th_open(req, src);
    uint8_t local[64];
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, remote, sizeof local, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    assert_memory_equal(local, remote, sizeof local);
    T->peer_release(peer);
}

static void test_malformed_frames_close_only_their_connection(void **state)
{
    (void)state;
    th_log_capture();
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_WRITE, 11, &owner);
    uint8_t *before = malloc(4096);
    memcpy(before, remote, 4096);
    void *bystander = th_open(req, src); /* an established peer that must survive */

    /* Bad magic as the first frame. */
    int fd = th_raw_connect(src);
    send_header(fd, 0xdeadbeef, ORB_WIRE_HELLO, 40, 0);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);
    assert_true(th_log_contains("bad frame header"));

    /* A request before HELLO. */
    fd = th_raw_connect(src);
    send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_READ_REQ, 32, 1);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);
    assert_true(th_log_contains("frame before HELLO"));

    /* Wrong epoch: ERROR, then closed. */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 0), ORB_WIRE_ERROR);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);

    /* A second HELLO. */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_HELLO, 40, 0);
    assert_int_equal(send(fd, before, 40, MSG_NOSIGNAL), 40);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);
    assert_true(th_log_contains("second HELLO"));

    /* An oversized body_len for a WRITE_REQ (and a payload that must never land). */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_WRITE_REQ, ORB_WIRE_MAX_BODY + 1, 7);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);

    /* A response type sent by a requester. */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_WRITE_RESP, 0, 3);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);
    assert_true(th_log_contains("not a request"));

    /* An unknown type. */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    send_header(fd, ORB_WIRE_MAGIC, 99, 0, 3);
    assert_true(th_raw_closed(fd, 5 * TH_SEC));
    close(fd);

    /* A WRITE_REQ with a range outside the region: refused, payload drained, still open. */
    fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    uint8_t frame[ORB_WIRE_HEADER_LEN + 32 + 8];
    size_t len;
    struct orb_wire_xfer wx = {.addr = (uint64_t)(uintptr_t)remote + 4090, .length = 8,
                               .request_addr = (uint64_t)(uintptr_t)remote + 4090,
                               .request_length = 8};
    assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_WRITE_REQ, 9, &wx, frame, sizeof frame, &len), 0);
    memset(frame + len, 0xee, 8);
    assert_int_equal(send(fd, frame, len + 8, MSG_NOSIGNAL), (ssize_t)(len + 8));
    uint8_t answer[ORB_WIRE_HEADER_LEN];
    assert_int_equal(recv(fd, answer, sizeof answer, MSG_WAITALL), (ssize_t)sizeof answer);
    struct orb_wire_header ah;
    assert_int_equal(orb_wire_header_decode(answer, &ah), 0);
    assert_int_equal(ah.type, ORB_WIRE_ERROR);
    assert_int_equal(ah.tag, 9);
    /* Then a truncated header, and the client hangs up. */
    assert_int_equal(send(fd, frame, 10, MSG_NOSIGNAL), 10);
    close(fd);

    assert_memory_equal(remote, before, 4096);
    assert_still_serving(req, src, remote);
    /* The established peer was never disturbed. */
    uint8_t local[32];
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, remote + 1, sizeof local, NULL);
    assert_int_equal(th_run(bystander, &t, 10 * TH_SEC), 0);
    assert_memory_equal(local, remote + 1, sizeof local);
    T->peer_release(bystander);

    th_engine_free(req);
    th_engine_free(src);
    th_log_stop();
    orb_host_memory_unref(owner);
    free(before);
}

/* A peer that asks DESCRIBE again and again without reading holds few built answers at the
 * source: the source stops reading it (the NOTIFY behind the asks waits) until the answers go
 * out, then serves the rest in order. */
static void test_describe_answers_wait_for_their_reader(void **state)
{
    (void)state;
    enum { REGIONS = 30000, ASKS = 16 }; /* answers of 720 KiB: 11 MiB asked for in all */
    orb_engine *src = th_engine_new(NULL);
    orb_host_memory *owner = NULL;
    assert_int_equal(orb_host_memory_alloc((size_t)REGIONS * 64, 0, &owner), 0);
    for (uint64_t i = 0; i < REGIONS; i++) {
        orb_reg_id id;
        assert_int_equal(orb_registry_add(src->registry, owner, i * 64, 64, ORB_PERM_REMOTE_READ, &id), 0);
    }
    int fd = th_raw_connect(src);
    /* Little buffered on the way (a window below loopback's 64 KiB segment would stall it). */
    int small = 128 * 1024;
    assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small), 0);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    for (uint64_t tag = 1; tag <= ASKS; tag++)
        send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_DESCRIBE_REQ, 0, tag);
    uint8_t frame[ORB_WIRE_HEADER_LEN + 8];
    size_t len;
    struct orb_wire_notify note = {.length = 4, .data = (const uint8_t *)"ping"};
    assert_int_equal(orb_wire_notify_encode(ASKS + 1, &note, frame, sizeof frame, &len), 0);
    assert_int_equal(send(fd, frame, len, MSG_NOSIGNAL), (ssize_t)len);
    usleep(300 * 1000);
    assert_int_equal(th_notes(src, NULL, 0), 0); /* not read: the answers before it wait */

    /* Read everything: every answer whole and in order, then the NOTIFY's. */
    size_t body_len = 8 + (size_t)REGIONS * ORB_WIRE_REGION_LEN;
    uint8_t *body = malloc(body_len);
    assert_non_null(body);
    for (uint64_t tag = 1; tag <= ASKS + 1; tag++) {
        uint8_t h[ORB_WIRE_HEADER_LEN];
        assert_int_equal(recv(fd, h, sizeof h, MSG_WAITALL), (ssize_t)sizeof h);
        struct orb_wire_header hdr;
        assert_int_equal(orb_wire_header_decode(h, &hdr), 0);
        assert_int_equal(hdr.tag, tag);
        assert_int_equal(hdr.type, tag <= ASKS ? ORB_WIRE_DESCRIBE_RESP : ORB_WIRE_NOTIFY_RESP);
        assert_int_equal(hdr.body_len, tag <= ASKS ? body_len : 0);
        if (hdr.body_len > 0)
            assert_int_equal(recv(fd, body, hdr.body_len, MSG_WAITALL), (ssize_t)hdr.body_len);
    }
    assert_int_equal(th_notes(src, NULL, 0), 1);
    close(fd);
    free(body);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

static void test_truncated_frame_is_logged(void **state)
{
    (void)state;
    th_log_capture();
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_WRITE, 12, &owner);
    int fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    send_header(fd, ORB_WIRE_MAGIC, ORB_WIRE_READ_REQ, 32, 5);
    assert_int_equal(send(fd, "abc", 3, MSG_NOSIGNAL), 3); /* 3 of 32 body bytes */
    close(fd);
    uint64_t deadline = orb_deadline_after(5 * TH_SEC);
    while (!th_log_contains("in the middle of a message") && orb_now_ns() < deadline)
        usleep(1000);
    assert_true(th_log_contains("in the middle of a message"));
    assert_still_serving(req, src, remote);
    th_engine_free(req);
    th_engine_free(src);
    th_log_stop();
    orb_host_memory_unref(owner);
}

/* ---- the requester facing a misbehaving source ---------------------------------------------- */

static void check_requester_proto_error(enum fake_mode mode, const char *logged)
{
    th_log_capture();
    struct fake_source *f = fake_start(mode);
    orb_engine *req = requester_engine();
    void *peer = fake_open(req, f);
    uint8_t local[16];
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, (void *)(uintptr_t)0x1000, sizeof local, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_EPROTO);
    assert_true(th_log_contains(logged));
    /* The peer is dead now: no reconnection, no replay. Later work hears why: the peer broke
     * the protocol (not "the peer failed", which would send the engine probing for a restart). */
    struct orb_xfer *xp = &t.x;
    th_xfer_init(&t, ORB_XFER_READ, local, (void *)(uintptr_t)0x1000, sizeof local, NULL);
    assert_int_equal(T->peer_submit(peer, &xp, 1), ORB_EPROTO);
    T->peer_release(peer);
    th_engine_free(req);
    fake_stop(f);
    th_log_stop();
}

static void test_requester_rejects_wrong_response_type(void **state)
{
    (void)state;
    check_requester_proto_error(FAKE_WRONG_TYPE, "wrong response type");
}

static void test_requester_rejects_wrong_tag(void **state)
{
    (void)state;
    check_requester_proto_error(FAKE_WRONG_TAG, "answers no pending request");
}

static void test_io_timeout_fails_pending_work(void **state)
{
    (void)state;
    th_log_capture();
    struct fake_source *f = fake_start(FAKE_SILENT);
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    cfg.io_timeout_s = 1;
    orb_engine *req = th_engine_new(&cfg);
    void *peer = fake_open(req, f);
    uint8_t *local = local_buf(4096, 13);
    struct th_xfer t[2];
    th_xfer_init(&t[0], ORB_XFER_WRITE, local, (void *)(uintptr_t)0x1000, 4096, NULL);
    th_xfer_init(&t[1], ORB_XFER_READ, local, (void *)(uintptr_t)0x1000, 4096, NULL);
    struct orb_xfer *xp[2] = {&t[0].x, &t[1].x};
    assert_int_equal(T->peer_submit(peer, xp, 2), 0);
    assert_int_equal(T->inflight(req->tp), 2);
    assert_int_equal(th_wait(t, 2, 10 * TH_SEC), 0);
    assert_int_equal(t[0].status, ORB_EPEER);
    assert_int_equal(t[0].effect, ORB_REMOTE_EFFECT_UNKNOWN); /* its payload went out */
    assert_int_equal(t[1].status, ORB_EPEER);
    assert_int_equal(t[1].effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(settled_inflight(req), 0);
    assert_true(th_log_contains("no progress"));
    assert_int_equal(T->peer_submit(peer, xp, 1), ORB_EPEER);
    T->peer_release(peer);
    th_engine_free(req);
    fake_stop(f);
    th_log_stop();
    free(local);
}

static void test_stop_requester_completes_with_eclosed(void **state)
{
    (void)state;
    struct fake_source *f = fake_start(FAKE_SILENT);
    orb_engine *req = requester_engine();
    void *peer = fake_open(req, f);
    uint8_t local[256];
    struct th_xfer t[4];
    struct orb_xfer *xp[4];
    for (int i = 0; i < 4; i++) {
        th_xfer_init(&t[i], ORB_XFER_READ, local, (void *)(uintptr_t)0x1000, 64, NULL);
        xp[i] = &t[i].x;
    }
    assert_int_equal(T->peer_submit(peer, xp, 4), 0);
    assert_int_equal(T->stop(req->tp, orb_deadline_after(1000000000ull)), 0);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(th_done_calls(&t[i]), 1); /* done before stop() returned */
        assert_int_equal(t[i].status, ORB_ECLOSED);
    }
    assert_int_equal(T->inflight(req->tp), 0); /* stop() joined the workers */
    assert_int_equal(T->peer_submit(peer, xp, 1), ORB_ECLOSED);
    struct orb_region_desc *regions;
    size_t count;
    assert_int_equal(T->peer_describe(peer, orb_deadline_after(TH_SEC), &regions, &count),
                     ORB_ECLOSED);
    T->peer_release(peer); /* after stop: still safe */
    th_engine_free(req);
    fake_stop(f);
}

static void test_source_stop_mid_transfer(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    size_t len = 16 * MIB;
    /* READs come from the first half, WRITEs go to the second: no two touch the same bytes. */
    uint8_t *remote = th_region(src, 2 * len, ORB_PERM_REMOTE_WRITE, 14, &owner);
    void *peer = th_open(req, src);
    enum { N = 4 };
    uint8_t *local = local_buf((size_t)N * len, 15);
    struct th_xfer t[N];
    struct orb_xfer *xp[N];
    for (int i = 0; i < N; i++) {
        th_xfer_init(&t[i], i % 2 ? ORB_XFER_WRITE : ORB_XFER_READ, local + (size_t)i * len,
                     remote + (i % 2 ? len : 0), len, NULL);
        xp[i] = &t[i].x;
    }
    assert_int_equal(T->peer_submit(peer, xp, N), 0);
    th_engine_free(src); /* stop mid-transfer: pins released, nothing touched afterwards */
    assert_int_equal(th_wait(t, N, 30 * TH_SEC), 0);
    int failed = 0;
    for (int i = 0; i < N; i++) {
        assert_int_equal(t[i].done_calls, 1);
        assert_true(t[i].status == 0 || t[i].status == ORB_EPEER || t[i].status == ORB_ECLOSED);
        if (t[i].status != 0) {
            failed++;
            if (t[i].x.op == ORB_XFER_READ)
                assert_int_equal(t[i].effect, ORB_REMOTE_EFFECT_NONE);
        }
    }
    assert_true(failed > 0);
    assert_int_equal(settled_inflight(req), 0);
    assert_int_equal(T->peer_submit(peer, xp, 1), ORB_EPEER);
    T->peer_release(peer);
    th_engine_free(req);
    orb_host_memory_unref(owner);
    free(local);
}

/* ---- notifications, DESCRIBE, slicing, withdrawal ------------------------------------------- */

static void test_notification_delivery(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    void *peer = th_open(req, src);
    uint8_t msg[ORB_NOTIFY_MAX];
    th_fill(msg, sizeof msg, 16);
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_NOTIFY, msg, NULL, sizeof msg, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    struct orb_notification_msg got;
    assert_int_equal(th_notes(src, &got, 0), 1);
    assert_int_equal(got.length, sizeof msg);
    assert_memory_equal(got.data, msg, sizeof msg);
    assert_memory_equal(got.sender.bytes, req->epoch.bytes, sizeof got.sender.bytes);

    /* The source refuses: the status comes back, the connection stays. */
    th_set_notify_status(ORB_ERESOURCE);
    th_xfer_init(&t, ORB_XFER_NOTIFY, msg, NULL, 1, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), ORB_ERESOURCE);
    th_set_notify_status(0);
    th_xfer_init(&t, ORB_XFER_NOTIFY, msg, NULL, 1, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    assert_int_equal(th_notes(src, NULL, 0), 2);

    /* Too long a notification is refused up front. */
    th_xfer_init(&t, ORB_XFER_NOTIFY, msg, NULL, ORB_NOTIFY_MAX + 1, NULL);
    struct orb_xfer *xp = &t.x;
    assert_int_equal(T->peer_submit(peer, &xp, 1), ORB_EINVAL);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
}

static void test_notification_orders_data(void **state)
{
    (void)state;
    /* Data WRITTEN on a stripe, then a notification on CONTROL (another source worker): whoever
     * takes the notification from the queue may read the data (the point of notifications). */
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 65536, ORB_PERM_REMOTE_WRITE, 24, &owner);
    uint8_t *local = local_buf(65536, 25);
    void *peer = th_open(req, src);
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_WRITE, local, remote, 65536, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    th_xfer_init(&t, ORB_XFER_NOTIFY, local, NULL, 8, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    struct orb_notification_msg got;
    assert_int_equal(th_notes(src, &got, 0), 1); /* synchronises with the delivery */
    assert_int_equal(memcmp(remote, local, 65536), 0); /* memcmp: seen by race detectors */
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(local);
}

static void test_describe(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *a, *b, *c;
    uint8_t *ra = th_region(src, 4096, ORB_PERM_REMOTE_READ, 1, &a);
    uint8_t *rb = th_region(src, 8192, ORB_PERM_REMOTE_WRITE, 2, &b);
    (void)th_region(src, 4096, ORB_PERM_LOCAL, 3, &c);
    void *peer = th_open(req, src);
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    assert_int_equal(T->peer_describe(peer, orb_deadline_after(5 * TH_SEC), &regions, &count), 0);
    assert_int_equal(count, 2);
    int seen_a = 0, seen_b = 0;
    for (size_t i = 0; i < count; i++) {
        if (regions[i].addr == (uint64_t)(uintptr_t)ra) {
            seen_a = regions[i].length == 4096 && regions[i].perm == ORB_PERM_REMOTE_READ;
        } else if (regions[i].addr == (uint64_t)(uintptr_t)rb) {
            seen_b = regions[i].length == 8192 && regions[i].perm == ORB_PERM_REMOTE_WRITE;
        }
    }
    assert_true(seen_a && seen_b);
    free(regions);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(a);
    orb_host_memory_unref(b);
    orb_host_memory_unref(c);
}

static void test_describe_deadline(void **state)
{
    (void)state;
    struct fake_source *f = fake_start(FAKE_SILENT);
    orb_engine *req = requester_engine();
    void *peer = fake_open(req, f);
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    assert_int_equal(T->peer_describe(peer, orb_deadline_after(100 * 1000 * 1000), &regions, &count),
                     ORB_ETIMEDOUT);
    assert_null(regions);
    T->peer_release(peer);
    th_engine_free(req);
    fake_stop(f);
}

/* Another transport's control messages over the control connection: the answer comes back to
 * the caller byte for byte, the source's refusal with its status and text, a source that has no
 * such transport says so, and every wait has a deadline. */
static int echo_control(orb_engine *e, uint8_t transport, const uint8_t *req, size_t len, uint8_t *resp,
                        size_t cap, size_t *resp_len)
{
    (void)e;
    assert_int_equal(transport, ORB_TRANSPORT_RDMA);
    assert_true(cap >= ORB_CONTROL_MAX);
    if (len == 1 && req[0] == 'X')
        return orb_fail(ORB_EPERM, "scripted refusal of the grant");
    if (len == 1 && req[0] == 'S') {
        usleep(300 * 1000); /* an answer that comes too late */
        resp[0] = 's';
        *resp_len = 1;
        return 0;
    }
    for (size_t i = 0; i < len; i++) /* the answer: the request reversed */
        resp[i] = req[len - 1 - i];
    *resp_len = len;
    return 0;
}

static void test_control_calls(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    void *peer = th_open(req, src);
    uint8_t in[ORB_CONTROL_MAX], out[ORB_CONTROL_MAX];
    size_t got = 0;
    /* No such transport at the source. */
    in[0] = 1;
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 1, out, sizeof out, &got,
                                     orb_deadline_after(5 * TH_SEC)), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no transport 2 here"));
    src->control = echo_control;
    /* Every size up to the largest, byte for byte. */
    static const size_t sizes[] = {1, 2, 141, 4095, ORB_CONTROL_MAX};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t n = sizes[k];
        for (size_t i = 0; i < n; i++)
            in[i] = (uint8_t)(i * 7 + k);
        if (n == 1)
            in[0] = 'a';
        assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, n, out, sizeof out, &got,
                                         orb_deadline_after(5 * TH_SEC)), 0);
        assert_int_equal(got, n);
        for (size_t i = 0; i < n; i++)
            assert_int_equal(out[i], in[n - 1 - i]);
    }
    /* The source knows who asked: the requester engine's epoch from HELLO. */
    assert_memory_equal(src->control_sender.bytes, req->epoch.bytes, sizeof req->epoch.bytes);
    /* A refusal carries the source's status and message; the connection stays usable. */
    in[0] = 'X';
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 1, out, sizeof out, &got,
                                     orb_deadline_after(5 * TH_SEC)), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "scripted refusal"));
    /* Arguments outside the rules never reach the wire. */
    int calls = src->control_calls;
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 0, out, sizeof out, &got, 0), ORB_EINVAL);
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, ORB_CONTROL_MAX + 1, out, sizeof out, &got, 0),
                     ORB_EINVAL);
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_TCP, in, 1, out, sizeof out, &got, 0), ORB_EINVAL);
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 1, out, 16, &got, 0), ORB_EINVAL);
    assert_int_equal(src->control_calls, calls);
    /* The deadline holds; the late answer is dropped when it comes, and the next call works. */
    in[0] = 'S';
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 1, out, sizeof out, &got,
                                     orb_deadline_after(100 * 1000 * 1000)), ORB_ETIMEDOUT);
    in[0] = 'b';
    assert_int_equal(T->peer_control(peer, ORB_TRANSPORT_RDMA, in, 1, out, sizeof out, &got,
                                     orb_deadline_after(5 * TH_SEC)), 0);
    assert_int_equal(got, 1);
    assert_int_equal(out[0], 'b');
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
}

/* The plan TCP makes of one request: even pieces of the stripe length, back to back. */
static void expect_plan(void *peer, uint64_t length, uint64_t piece, uint32_t count)
{
    struct orb_plan plan;
    memset(&plan, 0, sizeof plan);
    struct orb_reg reg = {.base = 4096, .len = UINT64_MAX - 4096, .kind = &orb_memkind_host};
    struct orb_plan_input in = {.op = ORB_XFER_READ, .length = length, .local_reg = &reg,
                                .mem_kind = ORB_MEM_HOST};
    assert_int_equal(T->peer_plan(peer, &in, &plan), 0);
    assert_int_equal(plan.count, count);
    uint64_t off = 0;
    for (uint32_t k = 0; k < plan.count; k++) {
        assert_int_equal(plan.pieces[k].offset, off);
        assert_int_equal(plan.pieces[k].length, k + 1 < count ? piece : length - off);
        assert_int_equal(plan.pieces[k].rail, 0);
        off += plan.pieces[k].length;
    }
    assert_int_equal(off, length);
    if (plan.pieces != plan.inline_pieces)
        free(plan.pieces);
}

static void *no_cpu_view(const struct orb_reg *reg, uint64_t addr)
{
    (void)reg;
    (void)addr;
    return NULL;
}

/* A memory kind without a CPU view, as device memory is. */
static const struct orb_memkind_ops no_cpu_view_kind = {.kind = ORB_MEM_CUDA, .name = "test-device",
                                                        .cpu_view = no_cpu_view};

/* A memory kind that needs staging (no CPU view) over ordinary host memory: its copies are
 * memcpy, so the test sees the source's staging and nothing else. */
static void *staged_cpu_view(const struct orb_reg *reg, uint64_t addr)
{
    (void)reg;
    (void)addr;
    return NULL;
}

/* The test's own reads of staged memory take this lock too: a device's copies are ordered
 * with what a program later reads of its memory. */
static pthread_mutex_t staged_copy_lock = PTHREAD_MUTEX_INITIALIZER;

static int staged_to_host(const struct orb_reg *reg, uint64_t addr, void *host, size_t len, bool *held)
{
    (void)reg;
    *held = false;
    pthread_mutex_lock(&staged_copy_lock);
    memcpy(host, (const void *)(uintptr_t)addr, len);
    pthread_mutex_unlock(&staged_copy_lock);
    return 0;
}

static int staged_from_host(const struct orb_reg *reg, uint64_t addr, const void *host, size_t len, bool *held)
{
    (void)reg;
    *held = false;
    pthread_mutex_lock(&staged_copy_lock);
    memcpy((void *)(uintptr_t)addr, host, len);
    pthread_mutex_unlock(&staged_copy_lock);
    return 0;
}

/* memcmp of staged memory that the source may be copying into. */
static int staged_memcmp(const uint8_t *staged, const uint8_t *want, size_t len)
{
    pthread_mutex_lock(&staged_copy_lock);
    int d = memcmp(staged, want, len);
    pthread_mutex_unlock(&staged_copy_lock);
    return d;
}

static struct orb_memkind_ops staged_kind_named(const char *name)
{
    struct orb_memkind_ops k = orb_memkind_host;
    k.name = name;
    k.cpu_view = staged_cpu_view;
    k.to_host = staged_to_host;
    k.from_host = staged_from_host;
    return k;
}

/* `len` bytes of host memory filled from `seed`, registered at `src` as memory of `kind` (which
 * outlives the registration) with `perm`; their owner into *owner_out. */
static uint8_t *staged_region(orb_engine *src, const struct orb_memkind_ops *kind, size_t len, enum orb_perm perm,
                              uint8_t seed, orb_host_memory **owner_out)
{
    orb_host_memory *owner = NULL;
    assert_int_equal(orb_host_memory_alloc(len, 0, &owner), 0);
    uint8_t *bytes = orb_host_memory_data(owner);
    th_fill(bytes, len, seed);
    struct orb_reg_range range = {.kind = kind, .owner = owner, .offset = 0, .length = len, .perm = perm};
    orb_reg_id id;
    assert_int_equal(orb_registry_add_ranges(src->registry, &range, 1, &id), 0);
    *owner_out = owner;
    return bytes;
}

/* Every chunk of `pool`, as another taker would hold them; *n_out of them. */
static uint8_t **pool_take_all(struct orb_stage_pool *pool, uint32_t *n_out)
{
    struct orb_reg pool_reg = {.kind = &orb_memkind_host};
    uint32_t n = orb_stage_pool_max_chunks(pool);
    uint8_t **held = calloc(n, sizeof *held);
    assert_non_null(held);
    for (uint32_t i = 0; i < n; i++)
        assert_int_equal(orb_stage_pool_take(pool, &pool_reg, ORB_STAGE_FOR_SOURCE, NULL, &held[i], NULL), 0);
    *n_out = n;
    return held;
}

/* Give back what pool_take_all() took (NULL places: given back already) and free the array. */
static void pool_put_all(struct orb_stage_pool *pool, uint8_t **held, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        orb_stage_pool_put(pool, held[i]);
    free(held);
}

/* The source stages through the engine's one pool: while the pool lends every chunk, a READ's
 * answer and a WRITE's payload wait (nothing fails, nothing is half done); one chunk back and
 * both complete, every byte right; afterwards the source holds no chunk. */
static void test_a_staged_source_waits_for_the_pool(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    struct orb_memkind_ops staged_kind = staged_kind_named("test-staged");
    size_t len = 3 * MIB + 12345; /* several chunks and a tail */
    orb_host_memory *owner = NULL;
    uint8_t *remote = staged_region(src, &staged_kind, 2 * len, ORB_PERM_REMOTE_READ | ORB_PERM_REMOTE_WRITE, 4,
                                    &owner);

    /* Every chunk of the source's pool is lent elsewhere. */
    uint32_t nchunks = 0;
    uint8_t **held = pool_take_all(src->stage_pool, &nchunks);

    void *peer = th_open(req, src);
    uint8_t *local_r = local_buf(len, 7);
    uint8_t *local_w = local_buf(len, 8);
    struct th_xfer t[2];
    th_xfer_init(&t[0], ORB_XFER_READ, local_r, remote, len, NULL);
    th_xfer_init(&t[1], ORB_XFER_WRITE, local_w, remote + len, len, NULL);
    struct orb_xfer *xp[2] = {&t[0].x, &t[1].x};
    assert_int_equal(T->peer_submit(peer, &xp[0], 1), 0);
    assert_int_equal(T->peer_submit(peer, &xp[1], 1), 0);
    usleep(300 * 1000);
    assert_int_equal(th_done_calls(&t[0]), 0);
    assert_int_equal(th_done_calls(&t[1]), 0);

    orb_stage_pool_put(src->stage_pool, held[0]); /* one chunk serves both, one after the other */
    held[0] = NULL;
    assert_int_equal(th_wait(t, 2, 30 * TH_SEC), 0);
    assert_int_equal(t[0].status, 0);
    assert_int_equal(t[1].status, 0);
    assert_memory_equal(local_r, remote, len);
    assert_int_equal(staged_memcmp(remote + len, local_w, len), 0);
    for (uint32_t i = 0; i < 50 && orb_stage_pool_lent(src->stage_pool) != nchunks - 1; i++)
        usleep(10 * 1000);
    assert_int_equal(orb_stage_pool_lent(src->stage_pool), nchunks - 1);

    pool_put_all(src->stage_pool, held, nchunks);
    free(local_r);
    free(local_w);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* A staged kind that lends ranges, as device memory does, and checks that every copy out of it
 * lies inside a range lent at that moment. */
#define LOANS_MAX 64
static pthread_mutex_t loans_lock = PTHREAD_MUTEX_INITIALIZER;
struct test_loan {
    uint64_t addr, len;
    bool live;
};
static struct test_loan loans[LOANS_MAX];
static int copies_outside_a_loan;

static int lending_loan(const struct orb_reg *reg, uint64_t addr, uint64_t len, int writes, void **out)
{
    (void)reg;
    (void)writes;
    pthread_mutex_lock(&loans_lock);
    int rc = ORB_ENOMEM;
    for (int i = 0; i < LOANS_MAX; i++)
        if (!loans[i].live) {
            loans[i].addr = addr;
            loans[i].len = len;
            loans[i].live = true;
            *out = &loans[i];
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&loans_lock);
    return rc;
}

static void lending_loan_end(void *loan)
{
    pthread_mutex_lock(&loans_lock);
    ((struct test_loan *)loan)->live = false;
    pthread_mutex_unlock(&loans_lock);
}

static int lending_to_host(const struct orb_reg *reg, uint64_t addr, void *host, size_t len, bool *held)
{
    pthread_mutex_lock(&loans_lock);
    bool inside = false;
    for (int i = 0; i < LOANS_MAX && !inside; i++)
        inside = loans[i].live && addr >= loans[i].addr && addr + len <= loans[i].addr + loans[i].len;
    if (!inside)
        copies_outside_a_loan++;
    pthread_mutex_unlock(&loans_lock);
    return staged_to_host(reg, addr, host, len, held);
}

/* A peer that asks for staged READs of lent memory and stops reading: the source gives back
 * every chunk, the one holding a payload's tail too (its loan ended when it was copied out: its
 * unsent bytes move to the heap rather than being copied again), so that the peer holds no
 * staging and no byte is ever copied out of the memory outside a loan. When the peer reads on,
 * every answer arrives whole and right. */
static void test_a_stalled_reader_never_copies_outside_a_loan(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    struct orb_memkind_ops lending_kind = staged_kind_named("test-lending");
    lending_kind.to_host = lending_to_host;
    lending_kind.loan = lending_loan;
    lending_kind.loan_end = lending_loan_end;
    const size_t len = 48 * MIB;
    orb_host_memory *owner = NULL;
    uint8_t *remote = staged_region(src, &lending_kind, len, ORB_PERM_REMOTE_READ, 12, &owner);
    copies_outside_a_loan = 0;
    /* Payloads of a chunk and a half (the socket blocks in a first chunk or a tail), then of less
     * than a chunk (every chunk is a tail). */
    const size_t sizes[] = {3 * MIB / 2, 700 * 1024};
    uint8_t *got = malloc(sizes[0]);
    assert_non_null(got);
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const size_t each = sizes[t], n = len / each;
        int fr = th_raw_connect(src);
        assert_int_equal(th_raw_hello(fr, src, 1), ORB_WIRE_HELLO_OK);
        uint8_t frame[ORB_WIRE_HEADER_LEN + 256];
        size_t flen = 0;
        for (uint64_t k = 0; k < n; k++) {
            struct orb_wire_xfer r = {.addr = (uint64_t)(uintptr_t)remote + k * each, .length = each,
                                      .request_addr = (uint64_t)(uintptr_t)remote + k * each,
                                      .request_length = each};
            assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, 200 + k, &r, frame, sizeof frame, &flen), 0);
            assert_int_equal(send(fr, frame, flen, MSG_NOSIGNAL), (ssize_t)flen);
        }
        usleep(500 * 1000); /* the socket fills; then the source waits for its peer */
        for (int i = 0; i < 500 && orb_stage_pool_lent(src->stage_pool) != 0; i++)
            usleep(10 * 1000);
        assert_int_equal(orb_stage_pool_lent(src->stage_pool), 0);
        /* The peer reads on: every answer, whole. */
        for (uint64_t k = 0; k < n; k++) {
            uint8_t head[ORB_WIRE_HEADER_LEN + 64];
            assert_int_equal(recv(fr, head, ORB_WIRE_HEADER_LEN, MSG_WAITALL), ORB_WIRE_HEADER_LEN);
            struct orb_wire_header h;
            assert_int_equal(orb_wire_header_decode(head, &h), 0);
            assert_int_equal(h.type, ORB_WIRE_READ_RESP);
            assert_true(h.body_len <= 64);
            assert_int_equal(recv(fr, head + ORB_WIRE_HEADER_LEN, h.body_len, MSG_WAITALL), (ssize_t)h.body_len);
            size_t at = 0;
            while (at < each) {
                ssize_t r = recv(fr, got + at, each - at, MSG_WAITALL);
                assert_true(r > 0);
                at += (size_t)r;
            }
            assert_memory_equal(got, remote + k * each, each);
        }
        assert_int_equal(copies_outside_a_loan, 0);
        for (int i = 0; i < 50 && orb_stage_pool_lent(src->stage_pool) != 0; i++)
            usleep(10 * 1000);
        assert_int_equal(orb_stage_pool_lent(src->stage_pool), 0);
        close(fr);
    }
    free(got);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* A peer that stops sending a staged WRITE's payload, or never reads the answers of staged READs
 * it asked for, holds no chunk of the source's staging pool while the source waits for it: what
 * a WRITE's chunk held goes in and the chunk goes back; a READ's chunk that the socket would not
 * take goes back. Other requests then find the whole pool. */
static void test_a_stalled_peer_holds_no_staging(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    struct orb_memkind_ops staged_kind = staged_kind_named("test-staged");
    const size_t len = 64 * MIB;
    orb_host_memory *owner = NULL;
    uint8_t *remote = staged_region(src, &staged_kind, len, ORB_PERM_REMOTE_READ | ORB_PERM_REMOTE_WRITE, 0, &owner);
    memset(remote, 0, len);
    uint8_t frame[ORB_WIRE_HEADER_LEN + 256];
    size_t flen = 0;

    /* A WRITE of 400 KiB whose peer sends the first 300000 bytes and then nothing. */
    int fw = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fw, src, 1), ORB_WIRE_HELLO_OK);
    struct orb_wire_xfer w = {.addr = (uint64_t)(uintptr_t)remote, .length = 400 * 1024,
                              .request_addr = (uint64_t)(uintptr_t)remote, .request_length = 400 * 1024};
    assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_WRITE_REQ, 1, &w, frame, sizeof frame, &flen), 0);
    assert_int_equal(send(fw, frame, flen, MSG_NOSIGNAL), (ssize_t)flen);
    uint8_t *part = local_buf(300000, 3);
    assert_int_equal(send(fw, part, 300000, MSG_NOSIGNAL), 300000);
    for (int i = 0; i < 300 && staged_memcmp(remote, part, 300000) != 0; i++)
        usleep(10 * 1000);
    assert_int_equal(staged_memcmp(remote, part, 300000), 0); /* what came in went in */
    usleep(200 * 1000);
    assert_int_equal(orb_stage_pool_lent(src->stage_pool), 0);

    /* 64 READs of 1 MiB whose peer never reads the answers: the socket fills. */
    int fr = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fr, src, 1), ORB_WIRE_HELLO_OK);
    for (uint64_t k = 0; k < 64; k++) {
        struct orb_wire_xfer r = {.addr = (uint64_t)(uintptr_t)remote + k * MIB, .length = MIB,
                                  .request_addr = (uint64_t)(uintptr_t)remote + k * MIB, .request_length = MIB};
        assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, 100 + k, &r, frame, sizeof frame, &flen), 0);
        assert_int_equal(send(fr, frame, flen, MSG_NOSIGNAL), (ssize_t)flen);
    }
    usleep(500 * 1000);
    assert_int_equal(orb_stage_pool_lent(src->stage_pool), 0);

    /* Meanwhile the whole pool is there for others. */
    uint32_t nchunks = 0;
    uint8_t **held = pool_take_all(src->stage_pool, &nchunks);
    pool_put_all(src->stage_pool, held, nchunks);
    close(fw);
    close(fr);
    free(part);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

static void test_slice_len(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL); /* 2 stripes, threshold 1 MiB */
    orb_engine *req = requester_engine();
    void *peer = th_open(req, src);
    assert_int_equal(tcp_peer_slice_len(peer, 0), 1);
    assert_int_equal(tcp_peer_slice_len(peer, 1), 1);
    assert_int_equal(tcp_peer_slice_len(peer, MIB), MIB);
    assert_int_equal(tcp_peer_slice_len(peer, MIB + 1), 9 * 65536);     /* ceil(/2) up to 64 KiB */
    assert_int_equal(tcp_peer_slice_len(peer, 8 * MIB), 4 * MIB);
    assert_int_equal(tcp_peer_slice_len(peer, 1ull << 30), ORB_WIRE_MAX_PAYLOAD);
    assert_int_equal(tcp_peer_slice_len(peer, UINT64_MAX), ORB_WIRE_MAX_PAYLOAD);
    expect_plan(peer, 1, 1, 1);
    expect_plan(peer, MIB, MIB, 1);
    expect_plan(peer, MIB + 1, 9 * 65536, 2);
    expect_plan(peer, 8 * MIB, 4 * MIB, 2);
    expect_plan(peer, 1ull << 30, ORB_WIRE_MAX_PAYLOAD, (uint32_t)((1ull << 30) / ORB_WIRE_MAX_PAYLOAD));
    /* Memory without a CPU view is staged by the core, one chunk per piece at most, whatever
     * the stripes would give. */
    struct orb_plan plan;
    memset(&plan, 0, sizeof plan);
    struct orb_reg reg = {.base = 4096, .len = 64 * MIB, .kind = &no_cpu_view_kind};
    struct orb_plan_input in = {.op = ORB_XFER_READ, .length = 8 * MIB + 1, .local_reg = &reg,
                                .mem_kind = ORB_MEM_CUDA};
    assert_int_equal(T->peer_plan(peer, &in, &plan), 0);
    assert_int_equal(plan.count, 9);
    for (uint32_t k = 0; k < plan.count; k++) {
        assert_int_equal(plan.pieces[k].offset, (uint64_t)k * ORB_STAGE_CHUNK);
        assert_int_equal(plan.pieces[k].length, k < 8 ? ORB_STAGE_CHUNK : 1);
    }
    if (plan.pieces != plan.inline_pieces)
        free(plan.pieces);
    memset(&plan, 0, sizeof plan);
    in.length = 4096; /* below a chunk: the stripes' plan */
    assert_int_equal(T->peer_plan(peer, &in, &plan), 0);
    assert_int_equal(plan.count, 1);
    assert_int_equal(plan.pieces[0].length, 4096);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
}

static void test_withdrawn_xfers_are_not_sent(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_WRITE, 17, &owner);
    uint8_t *before = malloc(4096);
    memcpy(before, remote, 4096);
    uint8_t *local = local_buf(4096, 18);
    void *peer = th_open(req, src);
    struct orb_batch withdrawn_batch, live_batch;
    atomic_init(&withdrawn_batch.withdraw, 1);
    atomic_init(&live_batch.withdraw, 0);
    struct th_xfer t[3];
    th_xfer_init(&t[0], ORB_XFER_WRITE, local, remote, 4096, &withdrawn_batch);
    th_xfer_init(&t[1], ORB_XFER_READ, local + 100, remote + 100, 100, &live_batch);
    th_xfer_init(&t[2], ORB_XFER_WRITE, local, remote, 4096, &withdrawn_batch);
    struct orb_xfer *xp[3] = {&t[0].x, &t[1].x, &t[2].x};
    assert_int_equal(T->peer_submit(peer, xp, 3), 0);
    assert_int_equal(th_wait(t, 3, 10 * TH_SEC), 0);
    assert_int_equal(t[0].status, ORB_ETIMEDOUT);
    assert_int_equal(t[0].effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(atomic_load(&t[0].may_start_calls), 1);
    assert_int_equal(t[2].status, ORB_ETIMEDOUT);
    assert_int_equal(t[1].status, 0);
    assert_memory_equal(remote, before, 4096);
    assert_int_equal(settled_inflight(req), 0);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(before);
    free(local);
}

/* ---- fences, release, budgets ---------------------------------------------------------------- */

static unsigned source_conns(orb_engine *src)
{
    return atomic_load(&((struct tcp_transport *)src->tp)->source_conns);
}

static int wait_source_conns(orb_engine *src, unsigned want)
{
    uint64_t deadline = orb_deadline_after(5 * TH_SEC);
    while (source_conns(src) != want && orb_now_ns() < deadline)
        usleep(1000);
    return source_conns(src) == want;
}

static void test_release_closes_connections(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    void *peer = th_open(req, src);
    assert_true(wait_source_conns(src, 3)); /* CONTROL + 2 stripes */
    T->peer_release(peer);
    assert_true(wait_source_conns(src, 0));
    th_engine_free(req);
    th_engine_free(src);
}

static void test_close_source(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = requester_engine();
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_READ, 19, &owner);
    void *peer = th_open(req, src);
    char ep[ORB_ENDPOINT_MAX];
    th_endpoint(src, ep, sizeof ep);
    atomic_store(&src->source_open, 0);
    T->close_source(src->tp);
    T->close_source(src->tp); /* idempotent */
    assert_true(wait_source_conns(src, 0));
    uint8_t local[16];
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, remote, sizeof local, NULL);
    struct orb_xfer *xp = &t.x;
    int rc = T->peer_submit(peer, &xp, 1);
    if (rc == 0) {
        assert_int_equal(th_wait(&t, 1, 10 * TH_SEC), 0);
        rc = t.status;
    }
    assert_int_equal(rc, ORB_EPEER);
    void *again = NULL;
    assert_int_equal(T->peer_open(req->tp, ep, &src->epoch, orb_deadline_after(TH_SEC), NULL, &again),
                     ORB_EPEER);
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* The stripes a peer on this host gets: tcp_local_stripes when set, else tcp_stripes capped at
 * one per two usable CPUs (at least 1); counted as the source's connections (CONTROL + DATA). */
static void expect_stripes_to_this_host(uint32_t stripes, uint32_t local_stripes, unsigned want)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = stripes;
    cfg.tcp_local_stripes = local_stripes;
    orb_engine *src = th_engine_new(NULL);
    orb_engine *req = th_engine_new(&cfg);
    void *peer = th_open(req, src);
    assert_true(wait_source_conns(src, 1 + want));
    usleep(20000); /* and not more a moment later */
    assert_int_equal(source_conns(src), 1 + want);
    T->peer_release(peer);
    assert_true(wait_source_conns(src, 0));
    th_engine_free(req);
    th_engine_free(src);
}

static void test_stripes_to_a_peer_on_this_host(void **state)
{
    (void)state;
    cpu_set_t all;
    assert_int_equal(sched_getaffinity(0, sizeof all, &all), 0);
    unsigned cpus = (unsigned)CPU_COUNT(&all);
    unsigned half = cpus / 2 < 1 ? 1 : cpus / 2;
    expect_stripes_to_this_host(4, 0, half < 4 ? half : 4);
    expect_stripes_to_this_host(1, 0, 1);
    expect_stripes_to_this_host(4, 3, 3);
    expect_stripes_to_this_host(1, 5, 5);

    /* One CPU: one stripe, whatever tcp_stripes says (engines read the mask when created). */
    cpu_set_t one;
    CPU_ZERO(&one);
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &all)) {
            CPU_SET(c, &one);
            break;
        }
    assert_int_equal(sched_setaffinity(0, sizeof one, &one), 0);
    expect_stripes_to_this_host(8, 0, 1);
    assert_int_equal(sched_setaffinity(0, sizeof all, &all), 0);
}

/* Connect to `addr` (IPv4 or IPv6, listening socket bound to its family's any address) and
 * answer what tcp_peer_on_this_host() says of both ends; -1 when the address cannot be used. */
static int on_this_host_over(const struct sockaddr *addr, socklen_t len)
{
    int lfd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0)
        return -1;
    struct sockaddr_storage any = {0};
    any.ss_family = addr->sa_family;
    struct sockaddr_storage where;
    socklen_t wlen = sizeof where;
    int cfd = -1, afd = -1, answer = -1;
    if (bind(lfd, (struct sockaddr *)&any, len) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&where, &wlen) != 0)
        goto close_listener;
    struct sockaddr_storage to;
    memcpy(&to, addr, len);
    if (addr->sa_family == AF_INET)
        ((struct sockaddr_in *)&to)->sin_port = ((struct sockaddr_in *)&where)->sin_port;
    else
        ((struct sockaddr_in6 *)&to)->sin6_port = ((struct sockaddr_in6 *)&where)->sin6_port;
    cfd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (cfd < 0 || connect(cfd, (struct sockaddr *)&to, len) != 0)
        goto close_client;
    afd = accept(lfd, NULL, NULL);
    if (afd < 0)
        goto close_client;
    answer = tcp_peer_on_this_host(cfd);
    assert_int_equal(tcp_peer_on_this_host(afd), answer); /* the same from either end */
    close(afd);
close_client:
    if (cfd >= 0)
        close(cfd);
close_listener:
    close(lfd);
    return answer;
}

static void test_peer_on_this_host(void **state)
{
    (void)state;
    struct sockaddr_in v4 = { .sin_family = AF_INET };
    v4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(on_this_host_over((struct sockaddr *)&v4, sizeof v4), 1);
    v4.sin_addr.s_addr = htonl(0x7f000102); /* 127.0.1.2: all of 127/8 is loopback */
    assert_int_equal(on_this_host_over((struct sockaddr *)&v4, sizeof v4), 1);
    struct sockaddr_in6 v6 = { .sin6_family = AF_INET6, .sin6_addr = IN6ADDR_LOOPBACK_INIT };
    int r = on_this_host_over((struct sockaddr *)&v6, sizeof v6);
    assert_true(r == 1 || r == -1); /* -1: no IPv6 here */

    /* An address of this host that is not loopback is this host too. */
    struct ifaddrs *list = NULL;
    assert_int_equal(getifaddrs(&list), 0);
    int tried = 0;
    for (struct ifaddrs *i = list; i != NULL; i = i->ifa_next) {
        if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK) ||
            !(i->ifa_flags & IFF_UP))
            continue;
        struct sockaddr_in a;
        memcpy(&a, i->ifa_addr, sizeof a);
        r = on_this_host_over((struct sockaddr *)&a, sizeof a);
        if (r != -1) {
            assert_int_equal(r, 1);
            tried++;
        }
    }
    freeifaddrs(list);
    if (tried == 0)
        print_message("no non-loopback IPv4 address here: only loopback was checked\n");

    /* Not a connected socket: no. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(tcp_peer_on_this_host(fd), 0);
    close(fd);
    assert_int_equal(tcp_peer_on_this_host(-1), 0);
}

static void test_max_connections(void **state)
{
    (void)state;
    th_log_capture();
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.max_connections = 2;
    orb_engine *src = th_engine_new(&cfg);
    orb_engine *req = requester_engine(); /* needs 3 connections */
    char ep[ORB_ENDPOINT_MAX];
    th_endpoint(src, ep, sizeof ep);
    void *peer = NULL;
    /* The third connection is refused at HELLO with a reason, not dropped at accept. */
    assert_int_equal(T->peer_open(req->tp, ep, &src->epoch, orb_deadline_after(5 * TH_SEC), NULL, &peer),
                     ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "max_connections"));
    assert_true(th_log_contains("max_connections"));
    assert_true(wait_source_conns(src, 0));
    th_engine_free(req);
    th_engine_free(src);
    th_log_stop();
}

/* Large payloads raise the receive low-water mark; whatever comes next (a small frame, nothing
 * more for a while) must never wait for bytes that will not come. One request at a time, sizes
 * alternating around the thresholds, on one stripe, each bounded well below the io timeout. */
static void test_receive_low_water_never_stalls(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    cfg.tcp_stripe_threshold = 64u << 20; /* no slicing: each request is one frame */
    cfg.io_timeout_s = 30;
    orb_engine *req = th_engine_new(&cfg);
    const size_t cap = 4u << 20;
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, cap, ORB_PERM_REMOTE_WRITE, 21, &owner);
    uint8_t *local = local_buf(cap, 22);
    void *peer = th_open(req, src);
    const size_t sizes[] = {1u << 20, 40, (700u << 10) + 3, 3, (2u << 20) + 5, 16u << 10,
                            (16u << 10) + 1, 600u << 10, 1, 3u << 20, 4096, 512u << 10};
    for (int op = 0; op < 2; op++) {
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            struct th_xfer t;
            size_t len = sizes[i];
            if (op == 0) {
                th_xfer_init(&t, ORB_XFER_READ, local, remote, len, NULL);
            } else {
                th_fill(local, len, (uint8_t)(30 + i));
                th_xfer_init(&t, ORB_XFER_WRITE, local, remote, len, NULL);
            }
            struct orb_xfer *xp = &t.x;
            assert_int_equal(T->peer_submit(peer, &xp, 1), 0);
            if (th_wait(&t, 1, 5 * TH_SEC) != 0)
                fail_msg("%s of %zu bytes (after %zu) stalled", op ? "WRITE" : "READ", len,
                         i ? sizes[i - 1] : 0);
            assert_int_equal(t.status, 0);
            assert_memory_equal(local, remote, len);
        }
    }
    T->peer_release(peer);
    th_engine_free(req);
    th_engine_free(src);
    orb_host_memory_unref(owner);
    free(local);
}

/* ---- admission of strangers ------------------------------------------------------------------ */

static orb_engine *source_with(uint32_t hello_timeout_ms, uint32_t max_unauthenticated,
                               uint32_t max_connections)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.hello_timeout_ms = hello_timeout_ms;
    cfg.max_unauthenticated = max_unauthenticated;
    cfg.max_connections = max_connections;
    cfg.io_timeout_s = 30; /* longer than every HELLO deadline here: that one must act */
    return th_engine_new(&cfg);
}

/* A connection that never completes HELLO is closed at its deadline, however it trickles. */
static void test_hello_deadline(void **state)
{
    (void)state;
    orb_engine *src = source_with(300, 32, 256);
    int idle = th_raw_connect(src);
    int trickle = th_raw_connect(src);
    uint64_t start = orb_now_ns();
    uint8_t hello[ORB_WIRE_HEADER_LEN + 40];
    struct orb_wire_hello h = {.expected = src->epoch, .role = ORB_WIRE_ROLE_CONTROL};
    size_t len;
    assert_int_equal(orb_wire_hello_encode(&h, hello, sizeof hello, &len), 0);
    /* One byte every 40 ms: always progressing, never done before the deadline. */
    int closed = 0;
    for (size_t i = 0; i < len - 1 && !closed; i++) {
        if (send(trickle, hello + i, 1, MSG_NOSIGNAL) != 1)
            closed = 1;
        else
            closed = th_raw_closed(trickle, 40ull * 1000 * 1000);
    }
    assert_true(closed || th_raw_closed(trickle, 2 * TH_SEC));
    uint64_t took = orb_now_ns() - start;
    assert_true(th_raw_closed(idle, 2 * TH_SEC));
    /* The deadline (300 ms), give or take the 250 ms scan, never the 30 s io timeout. */
    assert_true(took >= 250ull * 1000 * 1000 && took < 2 * TH_SEC);
    assert_true(wait_source_conns(src, 0));
    close(idle);
    close(trickle);
    th_engine_free(src);
}

/* Strangers have their own budget: the oldest makes room for a new one, and none of them takes
 * a slot an authenticated peer needs. */
static void test_strangers_budget(void **state)
{
    (void)state;
    orb_engine *src = source_with(30000, 4, 3);
    int fds[10];
    for (int i = 0; i < 10; i++)
        fds[i] = th_raw_connect(src);
    /* The six oldest were dropped; the four newest wait. */
    for (int i = 0; i < 6; i++)
        assert_true(th_raw_closed(fds[i], 5 * TH_SEC));
    assert_true(wait_source_conns(src, 4));
    for (int i = 6; i < 10; i++)
        assert_false(th_raw_closed(fds[i], 10ull * 1000 * 1000));
    /* A peer needing all three authenticated slots still gets in. */
    orb_engine *req = requester_engine();
    void *peer = th_open(req, src);
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_READ, 3, &owner);
    uint8_t local[4096];
    struct th_xfer t;
    th_xfer_init(&t, ORB_XFER_READ, local, remote, sizeof local, NULL);
    assert_int_equal(th_run(peer, &t, 10 * TH_SEC), 0);
    assert_memory_equal(local, remote, sizeof local);
    T->peer_release(peer);
    th_engine_free(req);
    for (int i = 0; i < 10; i++)
        close(fds[i]);
    assert_true(wait_source_conns(src, 0));
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* HELLO and a request in one write: the request, staged while the connection authenticates on
 * the listener's worker, is served after the connection moves to its own worker. */
static void test_pipelined_hello_and_request(void **state)
{
    (void)state;
    orb_engine *src = th_engine_new(NULL);
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 4096, ORB_PERM_REMOTE_READ, 4, &owner);
    for (int round = 0; round < 8; round++) { /* rounds land on either worker */
        int fd = th_raw_connect(src);
        uint8_t out[ORB_WIRE_HEADER_LEN * 2 + 40 + 32];
        struct orb_wire_hello h = {.expected = src->epoch, .role = ORB_WIRE_ROLE_DATA};
        size_t a, b;
        assert_int_equal(orb_wire_hello_encode(&h, out, sizeof out, &a), 0);
        struct orb_wire_xfer rx = {.addr = (uint64_t)(uintptr_t)remote + 100, .length = 64,
                                   .request_addr = (uint64_t)(uintptr_t)remote + 100,
                                   .request_length = 64};
        assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, 5, &rx, out + a, sizeof out - a,
                                              &b), 0);
        assert_int_equal(send(fd, out, a + b, MSG_NOSIGNAL), (ssize_t)(a + b));
        uint8_t in[ORB_WIRE_HEADER_LEN + 20 + ORB_WIRE_HEADER_LEN + 16 + 64];
        assert_int_equal(recv(fd, in, sizeof in, MSG_WAITALL), (ssize_t)sizeof in);
        struct orb_wire_header hdr;
        assert_int_equal(orb_wire_header_decode(in, &hdr), 0);
        assert_int_equal(hdr.type, ORB_WIRE_HELLO_OK);
        assert_int_equal(orb_wire_header_decode(in + ORB_WIRE_HEADER_LEN + 20, &hdr), 0);
        assert_int_equal(hdr.type, ORB_WIRE_READ_RESP);
        assert_int_equal(hdr.tag, 5);
        assert_memory_equal(in + sizeof in - 64, remote + 100, 64);
        close(fd);
    }
    assert_true(wait_source_conns(src, 0));
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_open_wrong_epoch_is_stale),
        cmocka_unit_test(test_stripes_to_a_peer_on_this_host),
        cmocka_unit_test(test_peer_on_this_host),
        cmocka_unit_test(test_open_refused_is_epeer),
        cmocka_unit_test(test_open_honours_deadline),
        cmocka_unit_test(test_open_redials_a_dropped_hello),
        cmocka_unit_test(test_endpoint_needs_source),
        cmocka_unit_test(test_restarted_source_is_stale),
        cmocka_unit_test(test_malformed_frames_close_only_their_connection),
        cmocka_unit_test(test_truncated_frame_is_logged),
        cmocka_unit_test(test_requester_rejects_wrong_response_type),
        cmocka_unit_test(test_requester_rejects_wrong_tag),
        cmocka_unit_test(test_io_timeout_fails_pending_work),
        cmocka_unit_test(test_stop_requester_completes_with_eclosed),
        cmocka_unit_test(test_source_stop_mid_transfer),
        cmocka_unit_test(test_write_to_read_only_is_eperm),
        cmocka_unit_test(test_local_only_and_outside_ranges),
        cmocka_unit_test(test_withdrawn_xfers_are_not_sent),
        cmocka_unit_test(test_close_source),
        cmocka_unit_test(test_max_connections),
        cmocka_unit_test(test_receive_low_water_never_stalls),
        cmocka_unit_test(test_hello_deadline),
        cmocka_unit_test(test_strangers_budget),
        cmocka_unit_test(test_pipelined_hello_and_request),
        cmocka_unit_test(test_release_closes_connections),
        cmocka_unit_test(test_slice_len),
        cmocka_unit_test(test_a_staged_source_waits_for_the_pool),
        cmocka_unit_test(test_a_stalled_peer_holds_no_staging),
        cmocka_unit_test(test_a_stalled_reader_never_copies_outside_a_loan),
        cmocka_unit_test(test_describe),
        cmocka_unit_test(test_describe_deadline),
        cmocka_unit_test(test_control_calls),
        cmocka_unit_test(test_notification_delivery),
        cmocka_unit_test(test_notification_orders_data),
        cmocka_unit_test(test_read_write_small_and_unaligned),
        cmocka_unit_test(test_many_pipelined),
        cmocka_unit_test(test_may_start_asked_once),
        cmocka_unit_test(test_sequential_access_across_stripes),
        cmocka_unit_test(test_concurrent_submitters),
        cmocka_unit_test(test_read_write_64mib),
        cmocka_unit_test(test_describe_answers_wait_for_their_reader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
