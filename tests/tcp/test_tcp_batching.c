/* System calls per request on the TCP data path, counted with interposed sendmsg(), recv() and
 * readv() (linked with --wrap): the source sends every ready response in one sendmsg(), and the
 * requester receives a run of small responses through its stage in a few recv() calls, without
 * an extra call per frame to hear EAGAIN. The other end of each test is a raw socket on the
 * test's thread, whose calls are not counted. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "core/clock.h"
#include "harness.h"
#include "tcp/tcp_internal.h"
#include "wire/wire.h"

static const struct orb_transport_ops *const T = &orb_tcp_transport;

/* ---- counting interposers ------------------------------------------------------------------ */

ssize_t __real_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags);
ssize_t __real_recv(int fd, void *buf, size_t len, int flags);
ssize_t __wrap_recv(int fd, void *buf, size_t len, int flags);
ssize_t __real_readv(int fd, const struct iovec *iov, int n);
ssize_t __wrap_readv(int fd, const struct iovec *iov, int n);

static pthread_t test_thread;
static atomic_int counted_fd = -1;  /* only calls on this descriptor count */
static atomic_uint sends, receives;

static int counts(int fd)
{
    return fd == atomic_load(&counted_fd) && !pthread_equal(pthread_self(), test_thread);
}

ssize_t __wrap_sendmsg(int fd, const struct msghdr *msg, int flags)
{
    if (counts(fd))
        atomic_fetch_add(&sends, 1);
    return __real_sendmsg(fd, msg, flags);
}

/* Receive calls are counted when they return, so that one which began before the test reset the
 * count and returned the answers after it is counted (a worker preempted between counting and
 * calling once made the count 0). */
ssize_t __wrap_recv(int fd, void *buf, size_t len, int flags)
{
    ssize_t n = __real_recv(fd, buf, len, flags);
    if (counts(fd))
        atomic_fetch_add(&receives, 1);
    return n;
}

ssize_t __wrap_readv(int fd, const struct iovec *iov, int n)
{
    ssize_t got = __real_readv(fd, iov, n);
    if (counts(fd))
        atomic_fetch_add(&receives, 1);
    return got;
}

static void recv_exact(int fd, uint8_t *buf, size_t len)
{
    assert_int_equal(__real_recv(fd, buf, len, MSG_WAITALL), (ssize_t)len);
}

static int same_addr(const struct sockaddr_in *a, const struct sockaddr_in *b)
{
    return a->sin_family == AF_INET && b->sin_family == AF_INET && a->sin_port == b->sin_port &&
           a->sin_addr.s_addr == b->sin_addr.s_addr;
}

/* The library's end of a connection whose other end is the test's `fd`: the descriptor of this
 * process whose own address is fd's peer and whose peer is fd's own address. */
static int library_end(int fd)
{
    struct sockaddr_in mine, theirs;
    socklen_t ml = sizeof mine, tl = sizeof theirs;
    assert_int_equal(getsockname(fd, (struct sockaddr *)&mine, &ml), 0);
    assert_int_equal(getpeername(fd, (struct sockaddr *)&theirs, &tl), 0);
    for (int other = 3; other < 1024; other++) {
        struct sockaddr_in local, peer;
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (other == fd || getsockname(other, (struct sockaddr *)&local, &ll) != 0 ||
            getpeername(other, (struct sockaddr *)&peer, &pl) != 0)
            continue;
        if (same_addr(&local, &theirs) && same_addr(&peer, &mine))
            return other;
    }
    fail_msg("the library's end of descriptor %d was not found", fd);
    return -1;
}

/* Sixteen READ requests arrive in one segment: their sixteen answers leave in one sendmsg()
 * (two when the first arrives alone), not one each. */
static void test_source_answers_together(void **state)
{
    (void)state;
    test_thread = pthread_self();
    orb_engine *src = th_engine_new(NULL);
    orb_host_memory *owner;
    uint8_t *remote = th_region(src, 1 << 20, ORB_PERM_REMOTE_READ, 9, &owner);
    int fd = th_raw_connect(src);
    assert_int_equal(th_raw_hello(fd, src, 1), ORB_WIRE_HELLO_OK);
    usleep(20 * 1000); /* let the connection settle on its worker */
    atomic_store(&counted_fd, library_end(fd));

    enum { N = 16, LEN = 4096 };
    uint8_t out[N * (ORB_WIRE_HEADER_LEN + 32)];
    size_t off = 0;
    for (int i = 0; i < N; i++) {
        uint64_t addr = (uint64_t)(uintptr_t)remote + (uint64_t)i * LEN;
        struct orb_wire_xfer m = {.addr = addr, .length = LEN, .request_addr = addr,
                                  .request_length = LEN};
        size_t len;
        assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, (uint64_t)i + 1, &m, out + off,
                                              sizeof out - off, &len), 0);
        off += len;
    }
    atomic_store(&sends, 0);
    assert_int_equal(send(fd, out, off, MSG_NOSIGNAL), (ssize_t)off);
    static uint8_t in[N * (ORB_WIRE_HEADER_LEN + 16 + LEN)];
    recv_exact(fd, in, sizeof in);
    for (int i = 0; i < N; i++) {
        const uint8_t *frame = in + (size_t)i * (ORB_WIRE_HEADER_LEN + 16 + LEN);
        struct orb_wire_header h;
        assert_int_equal(orb_wire_header_decode(frame, &h), 0);
        assert_int_equal(h.type, ORB_WIRE_READ_RESP);
        assert_int_equal(h.tag, (uint64_t)i + 1);
        assert_memory_equal(frame + ORB_WIRE_HEADER_LEN + 16, remote + (size_t)i * LEN, LEN);
    }
    unsigned n = atomic_load(&sends);
    print_message("source: %u sendmsg() for %d responses\n", n, N);
    assert_true(n >= 1 && n <= 2);
    atomic_store(&counted_fd, -1);
    close(fd);
    th_engine_free(src);
    orb_host_memory_unref(owner);
}

/* ---- a raw source for the requester's side ------------------------------------------------- */

struct raw_source {
    int listen_fd, fd;
    char endpoint[64];
    struct orb_epoch epoch;
};

static void raw_source_open(struct raw_source *r)
{
    memset(r, 0, sizeof *r);
    r->epoch.bytes[0] = 0x42;
    r->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(r->listen_fd >= 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(r->listen_fd, (struct sockaddr *)&sa, sizeof sa), 0);
    assert_int_equal(listen(r->listen_fd, 8), 0);
    socklen_t sl = sizeof sa;
    assert_int_equal(getsockname(r->listen_fd, (struct sockaddr *)&sa, &sl), 0);
    snprintf(r->endpoint, sizeof r->endpoint, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
}

/* Accept one connection and answer its HELLO. */
static int raw_source_accept(struct raw_source *r)
{
    int fd = accept(r->listen_fd, NULL, NULL);
    assert_true(fd >= 0);
    uint8_t buf[ORB_WIRE_HEADER_LEN + 40];
    recv_exact(fd, buf, sizeof buf);
    struct orb_wire_hello_ok ok = {.epoch = r->epoch, .max_payload = ORB_WIRE_MAX_PAYLOAD};
    size_t len;
    assert_int_equal(orb_wire_hello_ok_encode(&ok, buf, sizeof buf, &len), 0);
    assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
    return fd;
}

struct opener {
    orb_engine *req;
    struct raw_source *src;
    void *peer;
    int rc;
};

static void *open_main(void *arg)
{
    struct opener *o = arg;
    o->rc = T->peer_open(o->req->tp, o->src->endpoint, &o->src->epoch,
                         orb_deadline_after(10 * TH_SEC), NULL, &o->peer);
    return NULL;
}

/* Sixteen small READ answers arrive in one segment: the requester takes them in with a few
 * receive calls, not two or three per frame. */
static void test_requester_receives_through_its_stage(void **state)
{
    (void)state;
    test_thread = pthread_self();
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    orb_engine *req = th_engine_new(&cfg);
    struct raw_source rs;
    raw_source_open(&rs);
    struct opener o = {.req = req, .src = &rs};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, open_main, &o), 0);
    int control = raw_source_accept(&rs);
    int data = raw_source_accept(&rs);
    pthread_join(t, NULL);
    assert_int_equal(o.rc, 0);

    enum { N = 16, LEN = 512 };
    static uint8_t local[N * LEN];
    struct th_xfer x[N];
    struct orb_xfer *xp[N];
    for (int i = 0; i < N; i++) {
        th_xfer_init(&x[i], ORB_XFER_READ, local + i * LEN, (void *)(uintptr_t)(0x10000 + i * LEN),
                     LEN, NULL);
        xp[i] = &x[i].x;
    }
    assert_int_equal(T->peer_submit(o.peer, xp, N), 0);
    /* Read the sixteen requests, then answer them all in one send(). */
    uint8_t reqs[N * (ORB_WIRE_HEADER_LEN + 32)];
    recv_exact(data, reqs, sizeof reqs);
    atomic_store(&counted_fd, library_end(data));
    static uint8_t answers[N * (ORB_WIRE_HEADER_LEN + 16 + LEN)];
    size_t off = 0;
    for (int i = 0; i < N; i++) {
        struct orb_wire_header h;
        assert_int_equal(orb_wire_header_decode(reqs + (size_t)i * (ORB_WIRE_HEADER_LEN + 32), &h),
                         0);
        struct orb_wire_xfer m;
        assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_REQ,
                                              reqs + (size_t)i * (ORB_WIRE_HEADER_LEN + 32) +
                                                  ORB_WIRE_HEADER_LEN,
                                              32, &m), 0);
        size_t len;
        assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_RESP, h.tag, &m, answers + off,
                                              sizeof answers - off, &len), 0);
        off += len;
        memset(answers + off, 'a' + i, LEN);
        off += LEN;
    }
    atomic_store(&receives, 0);
    assert_int_equal(send(data, answers, off, MSG_NOSIGNAL), (ssize_t)off);
    assert_int_equal(th_wait(x, N, 10 * TH_SEC), 0);
    for (int i = 0; i < N; i++) {
        assert_int_equal(x[i].status, 0);
        for (int k = 0; k < LEN; k++)
            assert_int_equal(local[i * LEN + k], 'a' + i);
    }
    unsigned n = atomic_load(&receives);
    print_message("requester: %u receive calls for %d responses\n", n, N);
    assert_true(n >= 1 && n <= 4);
    atomic_store(&counted_fd, -1);
    T->peer_release(o.peer);
    th_engine_free(req);
    close(data);
    close(control);
    close(rs.listen_fd);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_source_answers_together),
        cmocka_unit_test(test_requester_receives_through_its_stage),
    };
    return cmocka_run_group_tests_name("tcp_batching", tests, NULL, NULL);
}
