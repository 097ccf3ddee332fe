/* The same-host requester against a hostile source. A real source engine answers the TCP side
 * (HELLO, INFO); its same-host socket is taken over by this test, which then plays the source by
 * hand: completions for requests never made, impossible ring indices, silence. The requester
 * must fail what is in flight with the cause, never report a request done that was not, and never
 * hang. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <orbite/orbite.h>

#include "core/clock.h"
#include "core/engine_internal.h"
#include "samehost/shm_internal.h"

#define SEC 1000000000ull
#define LEN (1u << 20)

/* What the fake source does with the requests it gets. */
enum script {
    FORGE_TAG,        /* answer the first request with a tag never sent */
    IMPOSSIBLE_INDEX, /* publish a completion tail far ahead of its head */
    SILENCE,          /* take requests and never answer */
    LIE               /* answer status 0 without copying: a "success" the test can see is a lie */
};

struct fake {
    orb_engine *src;
    int listen_fd;
    enum script script;
    pthread_t thread;
    int conn;
    uint8_t *rings;
    uint64_t rings_len;
    struct orb_sh_ring req, cpl;
    atomic_int requests_seen;
    atomic_int quit;
};

/* cmocka's assertions belong to the main thread: the fake source's own checks abort. */
#define FAKE_CHECK(cond)                                                                     \
    do {                                                                                     \
        if (!(cond)) {                                                                       \
            fprintf(stderr, "fake source: %s failed (%s)\n", #cond, orb_last_error());       \
            abort();                                                                         \
        }                                                                                    \
    } while (0)

static void *fake_main(void *arg)
{
    struct fake *f = arg;
    struct pollfd p = {.fd = f->listen_fd, .events = POLLIN};
    if (poll(&p, 1, 5000) != 1)
        return NULL;
    f->conn = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (f->conn < 0)
        return NULL;
    uint64_t deadline = orb_deadline_after(5 * SEC);
    uint8_t buf[256];
    size_t n = 0;
    struct orb_samehost_hello h;
    /* The proof, honestly: this process is the source's. */
    if (shm_sock_recv(f->conn, buf, sizeof buf, &n, NULL, deadline) != 0 ||
        orb_samehost_hello_decode(buf, n, &h) != 0)
        return NULL;
    struct orb_samehost_hello self = h;
    self.pid = (uint32_t)getpid();
    FAKE_CHECK(orb_engine_source_epoch(f->src, &self.epoch) == 0);
    uint8_t hello[ORB_SAMEHOST_HELLO_LEN];
    if (orb_samehost_hello_encode(&self, hello) != 0 || shm_sock_send(f->conn, hello, sizeof hello, -1, deadline) != 0)
        return NULL;
    int fd = -1;
    struct orb_shm_setup su;
    if (shm_sock_recv(f->conn, buf, sizeof buf, &n, &fd, deadline) != 0 || orb_shm_setup_decode(buf, n, &su) != 0)
        return NULL;
    void *rings = NULL;
    if (shm_map_peer_file(fd, 0, su.bytes, 1, &rings) != 0)
        return NULL;
    close(fd);
    f->rings = rings;
    f->rings_len = su.bytes;
    uint64_t at = orb_shm_setup_completion_offset(su.request_capacity);
    if (orb_sh_ring_open(&f->req, f->rings, at, su.request_capacity, ORB_SH_RING_CONSUMER, 0) != 0 ||
        orb_sh_ring_open(&f->cpl, f->rings + at, su.bytes - at, su.completion_capacity, ORB_SH_RING_PRODUCER, 0) != 0)
        return NULL;
    struct orb_shm_status ok = {0};
    size_t len = 0;
    if (orb_shm_status_encode(ORB_SHM_SETUP_OK, &ok, buf, sizeof buf, &len) != 0 ||
        shm_sock_send(f->conn, buf, len, -1, deadline) != 0)
        return NULL;
    while (!atomic_load(&f->quit)) {
        /* Buffers handed over: accepted (and dropped). */
        int mfd = -1;
        if (shm_sock_recv(f->conn, buf, sizeof buf, &n, &mfd, orb_deadline_after(SEC / 100)) == 0) {
            struct orb_shm_map mm;
            if (mfd >= 0)
                close(mfd);
            if (orb_shm_map_decode(buf, n, &mm) == 0) {
                struct orb_shm_status st = {.map_id = mm.map_id, .status = 0};
                if (orb_shm_status_encode(ORB_SHM_MAP_OK, &st, buf, sizeof buf, &len) == 0)
                    (void)shm_sock_send(f->conn, buf, len, -1, deadline);
            }
        }
        uint8_t entry[ORB_SH_RING_ENTRY];
        while (orb_sh_ring_pop(&f->req, entry) == 0) {
            struct orb_shm_request rq;
            FAKE_CHECK(orb_shm_request_decode(entry, &rq) == 0);
            atomic_fetch_add(&f->requests_seen, 1);
            struct orb_shm_completion cp = {.tag = rq.tag, .status = 0};
            if (f->script == FORGE_TAG)
                cp.tag = rq.tag ^ (1ull << 40);
            if (f->script == SILENCE)
                continue;
            if (f->script == IMPOSSIBLE_INDEX) {
                _Atomic uint32_t *tail = (_Atomic uint32_t *)(void *)(f->rings + at);
                atomic_store(tail, 100000);
                orb_sh_ring_wake(&f->cpl);
                continue;
            }
            FAKE_CHECK(orb_shm_completion_encode(&cp, entry) == 0);
            FAKE_CHECK(orb_sh_ring_push(&f->cpl, entry) == 0);
        }
    }
    return NULL;
}

struct fx {
    struct fake fake;
    orb_engine *req;
    orb_host_memory *remote_mem, *local_mem;
    uint8_t *remote, *local;
};

static void fx_open(struct fx *x, enum script script)
{
    memset(x, 0, sizeof *x);
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    if (orb_engine_create(&cfg, &x->fake.src) != 0)
        fail_msg("source: %s", orb_last_error());
    cfg.enable_source = 0;
    cfg.io_timeout_s = 1;
    if (orb_engine_create(&cfg, &x->req) != 0)
        fail_msg("requester: %s", orb_last_error());
    assert_int_equal(orb_host_memory_alloc(LEN, 0, &x->remote_mem), 0);
    x->remote = orb_host_memory_data(x->remote_mem);
    memset(x->remote, 0x5a, LEN);
    orb_reg_id id;
    assert_int_equal(orb_register_host_memory(x->fake.src, x->remote_mem, 0, LEN, ORB_PERM_REMOTE_WRITE, &id), 0);
    assert_int_equal(orb_host_memory_alloc_shared(LEN, 0, &x->local_mem), 0);
    x->local = orb_host_memory_data(x->local_mem);
    memset(x->local, 0x11, LEN);
    assert_int_equal(orb_register_host_memory(x->req, x->local_mem, 0, LEN, ORB_PERM_LOCAL, &id), 0);
    /* Take the source's same-host socket over: its accept thread stops looking at it. */
    struct shm_tp *tp = x->fake.src->tp[ORB_TRANSPORT_SHM].state;
    assert_non_null(tp);
    atomic_store(&tp->accept_quit, true);
    usleep(300000); /* it polls every 100 ms */
    x->fake.listen_fd = tp->listen_fd;
    x->fake.script = script;
    x->fake.conn = -1;
    assert_int_equal(pthread_create(&x->fake.thread, NULL, fake_main, &x->fake), 0);
}

static void fx_close(struct fx *x)
{
    atomic_store(&x->fake.quit, 1);
    pthread_join(x->fake.thread, NULL);
    if (x->fake.conn >= 0)
        close(x->fake.conn);
    if (x->fake.rings != NULL)
        munmap(x->fake.rings, x->fake.rings_len);
    assert_int_equal(orb_engine_close(x->req, 5 * SEC), 0);
    orb_engine_free(x->req);
    assert_int_equal(orb_engine_close(x->fake.src, 5 * SEC), 0);
    orb_engine_free(x->fake.src);
    orb_host_memory_unref(x->remote_mem);
    orb_host_memory_unref(x->local_mem);
}

static orb_segment *open_segment(struct fx *x)
{
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(x->fake.src, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(x->fake.src, &epoch), 0);
    orb_segment *s = NULL;
    if (orb_open_segment(x->req, ep, &epoch, 5 * SEC, &s) != 0)
        fail_msg("open: %s", orb_last_error());
    return s;
}

static int one_request(struct fx *x, orb_segment *seg, enum orb_op op, struct orb_batch_report *rep)
{
    struct orb_request r = {.transport = ORB_TRANSPORT_SHM, .op = op, .local_addr = (uint64_t)(uintptr_t)x->local,
                            .remote_addr = (uint64_t)(uintptr_t)x->remote, .length = 4096};
    uint64_t t0 = orb_now_ns();
    int rc = orb_submit_and_wait(x->req, seg, &r, 1, NULL, 10 * SEC, rep);
    assert_true(orb_now_ns() - t0 < 8 * SEC); /* never waits out the caller's deadline */
    return rc;
}

static void assert_failed(const struct orb_batch_report *rep, int rc, int want, enum orb_op op)
{
    if (rc != want)
        fail_msg("rc %d (%s), want %d", rc, orb_last_error(), want);
    assert_true(rep->done);
    assert_int_equal(rep->completed_requests, 0);
    assert_true(rep->has_failure);
    assert_int_equal(rep->failure.status, want);
    assert_int_equal(rep->failure.remote_effect, op == ORB_OP_WRITE ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE);
}

static void test_a_forged_completion_ends_the_path(void **state)
{
    (void)state;
    struct fx x;
    fx_open(&x, FORGE_TAG);
    orb_segment *seg = open_segment(&x);
    struct orb_batch_report rep;
    int rc = one_request(&x, seg, ORB_OP_WRITE, &rep);
    assert_failed(&rep, rc, ORB_EPROTO, ORB_OP_WRITE);
    assert_non_null(strstr(orb_last_error(), "not in flight"));
    /* The same-host path is gone: the next request by it fails at once. */
    rc = one_request(&x, seg, ORB_OP_READ, &rep);
    assert_int_not_equal(rc, 0);
    orb_segment_close(seg);
    fx_close(&x);
}

static void test_an_impossible_completion_index_ends_the_path(void **state)
{
    (void)state;
    struct fx x;
    fx_open(&x, IMPOSSIBLE_INDEX);
    orb_segment *seg = open_segment(&x);
    struct orb_batch_report rep;
    int rc = one_request(&x, seg, ORB_OP_READ, &rep);
    assert_failed(&rep, rc, ORB_EPROTO, ORB_OP_READ);
    assert_non_null(strstr(orb_last_error(), "index"));
    orb_segment_close(seg);
    fx_close(&x);
}

static void test_a_silent_source_times_out(void **state)
{
    (void)state;
    struct fx x;
    fx_open(&x, SILENCE);
    orb_segment *seg = open_segment(&x);
    struct orb_batch_report rep;
    int rc = one_request(&x, seg, ORB_OP_WRITE, &rep); /* io_timeout_s is 1 */
    assert_failed(&rep, rc, ORB_EPEER, ORB_OP_WRITE);
    assert_non_null(strstr(orb_last_error(), "io_timeout_s"));
    assert_int_equal(atomic_load(&x.fake.requests_seen), 1);
    orb_segment_close(seg);
    fx_close(&x);
}

/* A source can lie that it copied: the report then says done, which is all a requester can know
 * from a source it proved; the test shows the lie stays within the request's own bytes. */
static void test_a_lying_source_touches_nothing_else(void **state)
{
    (void)state;
    struct fx x;
    fx_open(&x, LIE);
    orb_segment *seg = open_segment(&x);
    struct orb_batch_report rep;
    assert_int_equal(one_request(&x, seg, ORB_OP_READ, &rep), 0);
    assert_int_equal(rep.completed_requests, 1);
    for (size_t i = 0; i < LEN; i++)
        if (x.local[i] != 0x11)
            fail_msg("requester byte %zu changed", i);
    orb_segment_close(seg);
    fx_close(&x);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_forged_completion_ends_the_path),
        cmocka_unit_test(test_an_impossible_completion_index_ends_the_path),
        cmocka_unit_test(test_a_silent_source_times_out),
        cmocka_unit_test(test_a_lying_source_touches_nothing_else),
    };
    return cmocka_run_group_tests_name("shm_hostile_source", tests, NULL, NULL);
}
