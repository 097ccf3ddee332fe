/* Two processes on one host, through the public API only: the requester here, the source in a
 * separate process (source_proc.c). Every transfer is verified byte for byte. Requests name
 * ORB_TRANSPORT_TCP, or with `--transport shm` the same-host transport (the requester's buffer
 * then comes from orb_host_memory_alloc_shared()). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <orbite/orbite.h>

#include "source_proc.h"

#define SEC 1000000000ull
#define HALF_LEN ((64u << 20) + 8192u)
#define LOCAL_LEN (2u * HALF_LEN)

/* The transport every request names. */
static enum orb_transport g_transport = ORB_TRANSPORT_TCP;

struct fixture {
    struct src_proc src;
    orb_engine *engine;
    orb_segment *segment;
    orb_host_memory *local;
    uint8_t *lp;
    uint64_t laddr;
    orb_reg_id lid;
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static orb_engine *new_requester_polling(uint32_t busy_poll_us)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.busy_poll_us = busy_poll_us;
    orb_engine *e = NULL;
    int rc = orb_engine_create(&cfg, &e);
    if (rc != 0)
        fail_msg("orb_engine_create: %s", orb_last_error());
    return e;
}

static orb_engine *new_requester(void)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    return new_requester_polling(cfg.busy_poll_us);
}

static int setup(void **state)
{
    struct fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    f->src.cmd_fd = -1;
    assert_int_equal(src_start(&f->src, 0), 0);
    f->engine = new_requester();
    if (g_transport == ORB_TRANSPORT_SHM)
        assert_int_equal(orb_host_memory_alloc_shared(LOCAL_LEN, 0, &f->local), 0);
    else
        assert_int_equal(orb_host_memory_alloc(LOCAL_LEN, 0, &f->local), 0);
    f->lp = orb_host_memory_data(f->local);
    f->laddr = (uint64_t)(uintptr_t)f->lp;
    assert_int_equal(orb_register_host_memory(f->engine, f->local, 0, LOCAL_LEN, ORB_PERM_LOCAL, &f->lid), 0);
    int rc = orb_open_segment(f->engine, f->src.info.endpoint, &f->src.info.epoch, 5 * SEC, &f->segment);
    if (rc != 0)
        fail_msg("orb_open_segment: %s", orb_last_error());
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    orb_segment_close(f->segment);
    orb_unregister_memory(f->engine, f->lid);
    orb_host_memory_unref(f->local);
    assert_int_equal(orb_engine_close(f->engine, 5 * SEC), 0);
    orb_engine_free(f->engine);
    src_stop(&f->src);
    free(f);
    return 0;
}

static struct orb_request req(enum orb_op op, uint64_t local, uint64_t remote, uint64_t len)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.transport = g_transport;
    r.op = op;
    r.local_addr = local;
    r.remote_addr = remote;
    r.length = len;
    return r;
}

static int run(struct fixture *f, const struct orb_request *reqs, size_t n,
               struct orb_batch_report *rep)
{
    return orb_submit_and_wait(f->engine, f->segment, reqs, n, NULL, 30 * SEC, rep);
}

static void fill(uint8_t *p, uint64_t len, uint32_t seed)
{
    for (uint64_t i = 0; i < len; i++)
        p[i] = pattern_byte(seed, i);
}

/* WRITE local pattern `seed` to the remote rw buffer at `roff`, check it there, READ it back
 * into another local place and check it again. */
static void write_then_read(struct fixture *f, uint64_t loff, uint64_t roff, uint64_t len, uint32_t seed)
{
    struct orb_batch_report rep;
    fill(f->lp + loff, len, seed);
    struct orb_request w = req(ORB_OP_WRITE, f->laddr + loff, f->src.info.rw_addr + roff, len);
    int rc = run(f, &w, 1, &rep);
    if (rc != 0)
        fail_msg("WRITE %llu bytes: %s", (unsigned long long)len, orb_last_error());
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(rep.completed_bytes, len);
    assert_true(rep.done);
    assert_true(rep.local_drained);

    uint8_t *remote = malloc(len);
    assert_non_null(remote);
    assert_int_equal(src_get(&f->src, f->src.info.rw_addr + roff, remote, len), 0);
    assert_memory_equal(remote, f->lp + loff, len);
    free(remote);

    uint64_t back = HALF_LEN + loff % 7; /* never overlaps [loff, +len) */
    memset(f->lp + back, 0, len);
    struct orb_request r = req(ORB_OP_READ, f->laddr + back, f->src.info.rw_addr + roff, len);
    rc = run(f, &r, 1, &rep);
    if (rc != 0)
        fail_msg("READ %llu bytes: %s", (unsigned long long)len, orb_last_error());
    assert_int_equal(rep.completed_bytes, len);
    assert_memory_equal(f->lp + back, f->lp + loff, len);
}

static void test_sizes(void **state)
{
    struct fixture *f = *state;
    write_then_read(f, 0, 0, 1, 11);
    write_then_read(f, 3, 5, 1, 12);          /* unaligned both sides */
    write_then_read(f, 1, 7, 4093, 13);
    write_then_read(f, 0, 0, 4096, 14);
    write_then_read(f, 4096, 8192, 64u << 20, 15);
}

static void test_random_sizes(void **state)
{
    struct fixture *f = *state;
    srand(1234);
    for (int i = 0; i < 25; i++) {
        uint64_t len = 1 + (uint64_t)rand() % (3u << 20);
        uint64_t loff = (uint64_t)rand() % 4096;
        uint64_t roff = (uint64_t)rand() % (SRC_RW_LEN - len);
        write_then_read(f, loff, roff, len, 100 + (uint32_t)i);
    }
}

static void test_read_source_pattern(void **state)
{
    struct fixture *f = *state;
    struct orb_batch_report rep;
    uint64_t len = SRC_RO_LEN;
    struct orb_request r = req(ORB_OP_READ, f->laddr + 1, f->src.info.ro_addr, len);
    assert_int_equal(run(f, &r, 1, &rep), 0);
    for (uint64_t i = 0; i < len; i++)
        if (f->lp[1 + i] != pattern_byte(2, i))
            fail_msg("byte %llu differs", (unsigned long long)i);
}

static void test_many_requests_per_batch(void **state)
{
    struct fixture *f = *state;
    enum { N = 2000, LEN = 4096 };
    struct orb_request *reqs = calloc(N, sizeof *reqs);
    assert_non_null(reqs);
    fill(f->lp, (uint64_t)N * LEN, 77);
    for (int i = 0; i < N; i++)
        reqs[i] = req(ORB_OP_WRITE, f->laddr + (uint64_t)i * LEN,
                      f->src.info.rw_addr + (uint64_t)(N - 1 - i) * LEN, LEN);
    struct orb_batch_report rep;
    int rc = run(f, reqs, N, &rep);
    if (rc != 0)
        fail_msg("%s", orb_last_error());
    assert_int_equal(rep.completed_requests, N);
    assert_int_equal(rep.completed_bytes, (uint64_t)N * LEN);
    uint8_t *remote = malloc((size_t)N * LEN);
    assert_non_null(remote);
    assert_int_equal(src_get(&f->src, f->src.info.rw_addr, remote, (uint64_t)N * LEN), 0);
    for (int i = 0; i < N; i++)
        assert_memory_equal(remote + (size_t)(N - 1 - i) * LEN, f->lp + (size_t)i * LEN, LEN);
    /* Mixed READs of the same data into a second area. */
    uint8_t *dst = f->lp + (32u << 20);
    for (int i = 0; i < N; i++)
        reqs[i] = req(ORB_OP_READ, (uint64_t)(uintptr_t)(dst + (size_t)i * LEN),
                      f->src.info.rw_addr + (uint64_t)i * LEN, LEN);
    assert_int_equal(run(f, reqs, N, &rep), 0);
    assert_memory_equal(dst, remote, (size_t)N * LEN);
    free(remote);
    free(reqs);
}

static void test_write_to_read_only_region(void **state)
{
    struct fixture *f = *state;
    struct orb_batch_report rep;
    fill(f->lp, 8192, 99);
    struct orb_request w = req(ORB_OP_WRITE, f->laddr, f->src.info.ro_addr + 100, 8192);
    int rc = run(f, &w, 1, &rep);
    assert_int_equal(rc, ORB_EPERM);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 1);
    assert_int_equal(rep.failure.status, ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(rep.completed_requests, 0);
    uint8_t *remote = malloc(SRC_RO_LEN);
    assert_non_null(remote);
    assert_int_equal(src_get(&f->src, f->src.info.ro_addr, remote, SRC_RO_LEN), 0);
    for (uint64_t i = 0; i < SRC_RO_LEN; i++)
        if (remote[i] != pattern_byte(2, i))
            fail_msg("read-only byte %llu changed", (unsigned long long)i);
    free(remote);
    /* The connection still serves. */
    write_then_read(f, 0, 0, 4096, 5);
}

static void test_one_byte_outside(void **state)
{
    struct fixture *f = *state;
    struct orb_batch_report rep;
    uint8_t before[64];
    uint64_t end = f->src.info.rw_addr + SRC_RW_LEN;
    assert_int_equal(src_get(&f->src, end - 32, before, 32), 0);

    /* Remote range one byte past the end: fails before any effect. */
    struct orb_request w = req(ORB_OP_WRITE, f->laddr, end - 32, 33);
    memset(f->lp, 0xAB, 64);
    int rc = run(f, &w, 1, &rep);
    assert_true(rc == ORB_ENOENT || rc == ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    uint8_t after[64];
    assert_int_equal(src_get(&f->src, end - 32, after, 32), 0);
    assert_memory_equal(before, after, 32);

    /* One byte before the start. */
    struct orb_request r = req(ORB_OP_READ, f->laddr, f->src.info.rw_addr - 1, 16);
    assert_int_not_equal(run(f, &r, 1, &rep), 0);
    assert_int_equal(rep.completed_requests, 0);

    /* Local range one byte outside its registration: rejected before anything is sent. */
    struct orb_request l = req(ORB_OP_READ, f->laddr + LOCAL_LEN - 15, f->src.info.rw_addr, 16);
    rc = run(f, &l, 1, &rep);
    assert_int_equal(rc, ORB_ENOENT);
    assert_int_equal(rep.completed_requests, 0);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 0);
}

static void test_failure_span_in_batch(void **state)
{
    struct fixture *f = *state;
    /* r0 ok, r1 and r2 write to the read-only region, r3 ok: prefix 1, a span from index 1
     * through the last attempted request. r2 is attempted whenever r3 is (one stripe's frames
     * leave in order, or both before the refusal returns); a refused WRITE changes nothing, so
     * the effect is unknown exactly when r3, which landed, is in the span. */
    struct orb_request reqs[4] = {
        req(ORB_OP_WRITE, f->laddr, f->src.info.rw_addr, 4096),
        req(ORB_OP_WRITE, f->laddr, f->src.info.ro_addr, 4096),
        req(ORB_OP_WRITE, f->laddr, f->src.info.ro_addr + 4096, 4096),
        req(ORB_OP_WRITE, f->laddr, f->src.info.rw_addr + 4096, 4096),
    };
    struct orb_batch_report rep;
    int rc = run(f, reqs, 4, &rep);
    assert_int_equal(rc, ORB_EPERM);
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(rep.completed_bytes, 4096);
    assert_int_equal(rep.failure.request_index, 1);
    assert_true(rep.failure.affected_requests >= 1 && rep.failure.affected_requests <= 3);
    assert_int_equal(rep.failure.remote_effect, rep.failure.affected_requests == 3
                                                    ? ORB_REMOTE_EFFECT_UNKNOWN
                                                    : ORB_REMOTE_EFFECT_NONE);
}

static void test_wrong_epoch(void **state)
{
    struct fixture *f = *state;
    struct orb_epoch wrong = f->src.info.epoch;
    wrong.bytes[7] ^= 0x40;
    orb_segment *s = NULL;
    assert_int_equal(orb_open_segment(f->engine, f->src.info.endpoint, &wrong, 5 * SEC, &s), ORB_ESTALE);
    assert_null(s);
    assert_true(strlen(orb_last_error()) > 0);
}

static uint16_t port_of(const char *endpoint)
{
    const char *colon = strrchr(endpoint, ':');
    return (uint16_t)atoi(colon + 1);
}

static void test_restarted_peer(void **state)
{
    struct fixture *f = *state;
    uint16_t port = port_of(f->src.info.endpoint);
    struct orb_epoch old_epoch = f->src.info.epoch;
    uint64_t old_rw = f->src.info.rw_addr;
    src_kill(&f->src);
    int started = -1;
    for (int i = 0; i < 50 && started != 0; i++) { /* the port may linger briefly */
        started = src_start(&f->src, port);
        if (started != 0)
            usleep(100000);
    }
    assert_int_equal(started, 0);
    assert_int_equal(port_of(f->src.info.endpoint), port);

    /* The old handle never reaches the new process's memory. */
    struct orb_batch_report rep;
    fill(f->lp, 4096, 3);
    struct orb_request w = req(ORB_OP_WRITE, f->laddr, old_rw, 4096);
    int rc = run(f, &w, 1, &rep);
    if (rc != ORB_ESTALE)
        fail_msg("a WRITE through the restarted peer's old segment: %s (%s), not ESTALE", orb_strerror(rc),
                 orb_last_error());
    assert_int_equal(rep.completed_requests, 0);
    /* Neither does the old epoch. */
    orb_segment *s = NULL;
    assert_int_equal(orb_open_segment(f->engine, f->src.info.endpoint, &old_epoch, 5 * SEC, &s), ORB_ESTALE);
    /* The new epoch works. */
    orb_segment_close(f->segment);
    assert_int_equal(orb_open_segment(f->engine, f->src.info.endpoint, &f->src.info.epoch, 5 * SEC, &f->segment), 0);
    write_then_read(f, 0, 0, 4096, 8);
}

static void killed_mid_batch(struct fixture *f, enum orb_op op)
{
    enum { N = 64, LEN = 1u << 20 };
    struct orb_request reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = req(op, f->laddr + (uint64_t)i * LEN, f->src.info.rw_addr + (uint64_t)i * LEN, LEN);
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->segment, &b), 0);
    assert_int_equal(orb_batch_submit(b, reqs, N), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    usleep(2000);
    src_kill(&f->src);
    uint64_t t0 = now_ns();
    struct orb_batch_report rep;
    int rc = orb_batch_wait(b, 20 * SEC, &rep);
    uint64_t took = now_ns() - t0;
    assert_true(took < 15 * SEC);
    if (rc == 0) {
        /* Everything landed before the kill: legal, but then the report must say so. */
        assert_int_equal(rep.completed_requests, N);
    } else {
        assert_true(rc == ORB_EPEER || rc == ORB_ESTALE);
        assert_true(rep.done);
        assert_true(rep.local_drained);
        assert_true(rep.has_failure);
        assert_true(rep.completed_requests < N);
        assert_int_equal(rep.failure.request_index, rep.completed_requests);
        assert_true(rep.failure.affected_requests >= 1);
        if (op == ORB_OP_WRITE)
            assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
        else
            assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    }
    assert_int_equal(orb_batch_free(b), 0);
    /* Later use of the dead peer fails fast, without a hang. */
    struct orb_request one = req(ORB_OP_READ, f->laddr, f->src.info.rw_addr, 16);
    t0 = now_ns();
    assert_int_not_equal(orb_submit_and_wait(f->engine, f->segment, &one, 1, NULL, 10 * SEC, &rep), 0);
    assert_true(now_ns() - t0 < 5 * SEC);
}

static void test_peer_killed_mid_write(void **state)
{
    killed_mid_batch(*state, ORB_OP_WRITE);
}

static void test_peer_killed_mid_read(void **state)
{
    killed_mid_batch(*state, ORB_OP_READ);
}

static void test_close_with_work_in_flight(void **state)
{
    struct fixture *f = *state;
    enum { N = 32, LEN = 1u << 20 };
    struct orb_request reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = req(i % 2 ? ORB_OP_READ : ORB_OP_WRITE, f->laddr + (uint64_t)i * LEN,
                      f->src.info.rw_addr + (uint64_t)i * LEN, LEN);
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->segment, &b), 0);
    assert_int_equal(orb_batch_submit(b, reqs, N), 0);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    int closed = orb_engine_close(f->engine, 0);
    if (g_transport == ORB_TRANSPORT_SHM && closed == ORB_EUNQUIESCED) {
        /* The same-host source writes this process's buffers itself: while its copies are in
         * flight, no zero-time close can prove they ended. Asked again, close waits for them. */
        assert_non_null(strstr(orb_last_error(), "in flight"));
        closed = orb_engine_close(f->engine, 5 * SEC);
    }
    assert_int_equal(closed, 0);
    struct orb_batch_report rep;
    int rc = orb_batch_wait(b, 10 * SEC, &rep);
    assert_true(rep.done);
    assert_true(rep.local_drained);
    assert_true(rc == 0 || rc == ORB_ECLOSED);
    if (rc != 0)
        assert_true(rep.completed_requests < N);
    assert_int_equal(orb_batch_free(b), 0);
    /* Closed: new work is refused. */
    assert_int_equal(orb_batch_open(f->engine, f->segment, &b), ORB_ECLOSED);
}

static void test_notification_after_data(void **state)
{
    struct fixture *f = *state;
    enum { N = 8, LEN = 256u << 10 };
    for (int round = 0; round < 10; round++) {
        /* Each round writes its own range, so a later round cannot change what an earlier
         * notification announced before the source looks at it. */
        uint64_t base = (uint64_t)round * N * LEN;
        fill(f->lp, (uint64_t)N * LEN, 500 + (uint32_t)round);
        struct orb_request reqs[N];
        for (int i = 0; i < N; i++)
            reqs[i] = req(ORB_OP_WRITE, f->laddr + (uint64_t)i * LEN,
                          f->src.info.rw_addr + base + (uint64_t)i * LEN, LEN);
        struct note_payload np = {f->src.info.rw_addr + base, (uint64_t)N * LEN,
                                  checksum(f->lp, (uint64_t)N * LEN)};
        struct orb_notification note = {&np, sizeof np};
        struct orb_batch_report rep;
        int rc = orb_submit_and_wait(f->engine, f->segment, reqs, N, &note, 30 * SEC, &rep);
        if (rc != 0)
            fail_msg("%s", orb_last_error());
        assert_int_equal(rep.notification, ORB_NOTIFY_DELIVERED);
    }
    uint64_t ok = 0, bad = 0;
    for (int i = 0; i < 500 && ok + bad < 10; i++) { /* up to 5 s */
        assert_int_equal(src_notes(&f->src, &ok, &bad), 0);
        usleep(10000);
    }
    assert_int_equal(ok, 10);
    assert_int_equal(bad, 0);
}

static void test_notification_skipped_on_failure(void **state)
{
    struct fixture *f = *state;
    struct orb_request w = req(ORB_OP_WRITE, f->laddr, f->src.info.ro_addr, 4096);
    struct note_payload np = {0, 0, 0};
    struct orb_notification note = {&np, sizeof np};
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(f->engine, f->segment, &w, 1, &note, 30 * SEC, &rep), ORB_EPERM);
    assert_int_equal(rep.notification, ORB_NOTIFY_SKIPPED);
    uint64_t ok = 1, bad = 1;
    usleep(20000);
    assert_int_equal(src_notes(&f->src, &ok, &bad), 0);
    assert_int_equal(ok + bad, 0);
}

static void test_deadline(void **state)
{
    struct fixture *f = *state;
    /* After a deadline, started READs may still land: aim them at [32 MiB, 64 MiB), which
     * the checks below never use. */
    enum { N = 64, LEN = 1u << 19 };
    struct orb_request reqs[N];
    for (int i = 0; i < N; i++)
        reqs[i] = req(ORB_OP_READ, f->laddr + (32u << 20) + (uint64_t)i * LEN, f->src.info.rw_addr, LEN);
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(f->engine, f->segment, reqs, N, NULL, 1000, &rep);
    if (rc == 0) /* improbably fast: still a consistent report */
        assert_int_equal(rep.completed_requests, N);
    else {
        assert_int_equal(rc, ORB_ETIMEDOUT);
        assert_true(rep.has_failure);
        assert_int_equal(rep.failure.status, ORB_ETIMEDOUT);
        assert_int_equal(rep.failure.request_index, rep.completed_requests);
    }
    /* The engine stays usable; withdrawn work never ran, started work drains. The check uses a
     * remote range the late READs do not touch. */
    write_then_read(f, 0, 16u << 20, 4096, 21);
}

static void test_async_groups(void **state)
{
    struct fixture *f = *state;
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->segment, &b), 0);
    fill(f->lp, 1u << 20, 31);
    for (int g = 0; g < 4; g++) {
        struct orb_request r = req(ORB_OP_WRITE, f->laddr + (uint64_t)g * 65536,
                                   f->src.info.rw_addr + (uint64_t)g * 65536, 65536);
        assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    }
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN); /* unsealed */
    assert_int_equal(orb_batch_wait(b, SEC, &rep), ORB_EINVAL);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    assert_int_equal(orb_batch_seal(b, NULL), ORB_EBUSY);
    struct orb_request late = req(ORB_OP_READ, f->laddr, f->src.info.rw_addr, 1);
    assert_int_equal(orb_batch_submit(b, &late, 1), ORB_EBUSY);
    assert_int_equal(orb_batch_wait(b, 30 * SEC, &rep), 0);
    assert_int_equal(rep.submitted_requests, 4);
    assert_int_equal(rep.completed_requests, 4);
    assert_int_equal(orb_batch_free(b), 0);
    uint8_t *remote = malloc(4 * 65536);
    assert_non_null(remote);
    assert_int_equal(src_get(&f->src, f->src.info.rw_addr, remote, 4 * 65536), 0);
    assert_memory_equal(remote, f->lp, 4 * 65536);
    free(remote);
}

/* Open, fill and seal a batch of `n` WRITEs of `len` bytes from local offset `loff` to the
 * remote rw buffer at the same offset (the local bytes hold pattern `seed`). */
static orb_batch *writes_batch(struct fixture *f, uint64_t loff, unsigned n, uint64_t len, uint32_t seed)
{
    orb_batch *b = NULL;
    assert_int_equal(orb_batch_open(f->engine, f->segment, &b), 0);
    fill(f->lp + loff, n * len, seed);
    for (unsigned i = 0; i < n; i++) {
        struct orb_request r = req(ORB_OP_WRITE, f->laddr + loff + i * len, f->src.info.rw_addr + loff + i * len, len);
        assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    }
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    return b;
}

static void assert_remote_is_local(struct fixture *f, uint64_t off, uint64_t len)
{
    uint8_t *remote = malloc(len);
    assert_non_null(remote);
    assert_int_equal(src_get(&f->src, f->src.info.rw_addr + off, remote, len), 0);
    assert_memory_equal(remote, f->lp + off, len);
    free(remote);
}

/* A batch that nobody waits on completes all the same, also right after the caller waited
 * (and took completions itself) for another batch of the same segment: the transport's own
 * progress takes over from a caller that stops polling. Looked at with orb_batch_poll() only. */
static void test_a_batch_nobody_waits_on(void **state)
{
    struct fixture *f = *state;
    for (int round = 0; round < 20; round++) {
        /* The quick one first: it completes while the slow one is still in flight. */
        orb_batch *quick = writes_batch(f, 32u << 20, 1, 4096, (uint32_t)round + 100);
        orb_batch *slow = writes_batch(f, 0, 8, 2u << 20, (uint32_t)round);
        struct orb_batch_report rep;
        assert_int_equal(orb_batch_wait(quick, 30 * SEC, &rep), 0);
        assert_int_equal(orb_batch_free(quick), 0);
        uint64_t deadline = now_ns() + 20 * SEC;
        int rc;
        while ((rc = orb_batch_poll(slow, &rep)) == ORB_EAGAIN && now_ns() < deadline) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        if (rc != 0)
            fail_msg("round %d: the batch nobody waited on: %s", round, orb_strerror(rc));
        assert_int_equal(rep.completed_requests, 8);
        assert_int_equal(orb_batch_free(slow), 0);
        assert_remote_is_local(f, 0, 16u << 20);
        assert_remote_is_local(f, 32u << 20, 4096);
    }
}

/* A caller whose polling window (busy_poll_us) ends before its batch does goes to sleep and is
 * woken when the batch completes: with a window of 1 us nearly every wait ends that way. */
static void test_a_waiter_past_its_polling_window(void **state)
{
    struct fixture *f = *state;
    orb_engine *e = new_requester_polling(1);
    orb_reg_id lid;
    assert_int_equal(orb_register_host_memory(e, f->local, 0, LOCAL_LEN, ORB_PERM_LOCAL, &lid), 0);
    orb_segment *seg = NULL;
    int rc = orb_open_segment(e, f->src.info.endpoint, &f->src.info.epoch, 5 * SEC, &seg);
    if (rc != 0)
        fail_msg("orb_open_segment: %s", orb_last_error());
    for (int round = 0; round < 50; round++) {
        uint64_t len = round % 2 ? 4096 : 4u << 20;
        fill(f->lp, len, (uint32_t)round + 7);
        struct orb_request w = req(ORB_OP_WRITE, f->laddr, f->src.info.rw_addr, len);
        struct orb_batch_report rep;
        uint64_t t0 = now_ns();
        rc = orb_submit_and_wait(e, seg, &w, 1, NULL, 30 * SEC, &rep);
        if (rc != 0)
            fail_msg("round %d: %s", round, orb_last_error());
        /* Woken by the transport, not by the deadline. */
        assert_true(now_ns() - t0 < 10 * SEC);
        assert_int_equal(rep.completed_bytes, len);
        assert_remote_is_local(f, 0, len);
    }
    orb_segment_close(seg);
    assert_int_equal(orb_unregister_memory(e, lid), 0);
    assert_int_equal(orb_engine_close(e, 5 * SEC), 0);
    orb_engine_free(e);
}

static void test_describe(void **state)
{
    struct fixture *f = *state;
    struct orb_region_desc *regions = NULL;
    size_t n = 0;
    assert_int_equal(orb_segment_describe(f->segment, 5 * SEC, &regions, &n), 0);
    assert_int_equal(n, 2);
    int seen_rw = 0, seen_ro = 0;
    for (size_t i = 0; i < n; i++) {
        if (regions[i].addr == f->src.info.rw_addr && regions[i].length == SRC_RW_LEN &&
            regions[i].perm == ORB_PERM_REMOTE_WRITE)
            seen_rw = 1;
        if (regions[i].addr == f->src.info.ro_addr && regions[i].length == SRC_RO_LEN &&
            regions[i].perm == ORB_PERM_REMOTE_READ)
            seen_ro = 1;
    }
    assert_true(seen_rw && seen_ro);
    orb_region_descs_free(regions);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--source") == 0)
        return src_main(atoi(argv[2]), (uint16_t)atoi(argv[3]));
    if (argc == 3 && strcmp(argv[1], "--transport") == 0 && strcmp(argv[2], "shm") == 0)
        g_transport = ORB_TRANSPORT_SHM;
    else if (argc != 1) {
        fprintf(stderr, "usage: %s [--transport shm]\n", argv[0]);
        return 2;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_wrong_epoch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_describe, setup, teardown),
        cmocka_unit_test_setup_teardown(test_one_byte_outside, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_to_read_only_region, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failure_span_in_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_read_source_pattern, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_sizes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_requests_per_batch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_async_groups, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_batch_nobody_waits_on, setup, teardown),
        cmocka_unit_test_setup_teardown(test_a_waiter_past_its_polling_window, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notification_after_data, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notification_skipped_on_failure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_restarted_peer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_killed_mid_write, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_killed_mid_read, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_with_work_in_flight, setup, teardown),
    };
    return cmocka_run_group_tests_name(g_transport == ORB_TRANSPORT_SHM ? "two_process_shm" : "two_process", tests,
                                       NULL, NULL);
}
