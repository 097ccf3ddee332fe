/* Batch semantics through the public API, over a scripted transport that the test completes
 * slice by slice: prefixes, failure spans, remote effects, withdrawal, notifications, deadlines,
 * budgets and pins. */
#include <pthread.h>
#include <stdatomic.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/engine_internal.h"
#include "core/error.h"

/* ---- the scripted transport -------------------------------------------------------------- */

#define MAX_PENDING 4096

static pthread_mutex_t fake_lock = PTHREAD_MUTEX_INITIALIZER;
static struct orb_xfer *pending[MAX_PENDING];
static size_t npending;
static uint64_t fake_slice_len = 1000;
static int fake_submit_status;       /* non-zero: peer_submit refuses with it */
static int fake_open_status;         /* non-zero: peer_open fails with it */
static uint64_t notified_len;
static int notified_count;
static int peers_released;

static int fake_start(orb_engine *engine, void **tp)
{
    (void)engine;
    *tp = &fake_lock;
    return 0;
}
static int fake_endpoint(void *tp, char *buf, size_t len)
{
    (void)tp;
    snprintf(buf, len, "fake:1");
    return 0;
}
static void fake_close_source(void *tp)
{
    (void)tp;
}
static struct orb_xfer *take(size_t i)
{
    pthread_mutex_lock(&fake_lock);
    assert_true(i < npending);
    struct orb_xfer *x = pending[i];
    memmove(&pending[i], &pending[i + 1], (npending - i - 1) * sizeof pending[0]);
    npending--;
    pthread_mutex_unlock(&fake_lock);
    return x;
}
/* Run pending slice `i` to the end with `status` (started if the batch lets it). */
static int complete(size_t i, int status, enum orb_remote_effect effect)
{
    struct orb_xfer *x = take(i);
    int started = orb_xfer_may_start(x);
    if (x->op == ORB_XFER_NOTIFY && started && status == 0) {
        notified_len = x->length;
        notified_count++;
    }
    orb_xfer_done(x, started ? status : ORB_ETIMEDOUT, started ? effect : ORB_REMOTE_EFFECT_NONE);
    return started;
}
static int fake_stop(void *tp, uint64_t deadline)
{
    (void)tp, (void)deadline;
    while (npending > 0) {
        struct orb_xfer *x = take(0);
        orb_xfer_done(x, ORB_ECLOSED, ORB_REMOTE_EFFECT_NONE);
    }
    return 0;
}
static void fake_destroy(void *tp)
{
    (void)tp;
}
static uint64_t fake_inflight(void *tp)
{
    (void)tp;
    pthread_mutex_lock(&fake_lock);
    uint64_t n = npending;
    pthread_mutex_unlock(&fake_lock);
    return n;
}
static int fake_peer_open(void *tp, const char *endpoint, const struct orb_epoch *expected,
                          uint64_t deadline, const struct orb_control_path *ctl, void **peer)
{
    (void)tp, (void)endpoint, (void)deadline, (void)ctl;
    if (fake_open_status != 0)
        return fake_open_status;
    if (expected->bytes[0] == 0xEE)
        return ORB_ESTALE;
    *peer = &npending;
    return 0;
}
static int fake_peer_describe(void *peer, uint64_t deadline, struct orb_region_desc **r, size_t *n)
{
    (void)peer, (void)deadline;
    *r = NULL;
    *n = 0;
    return 0;
}
static bool fake_slice_len_shrinks; /* each answer smaller than the last: asked twice, it would show */
static unsigned fake_slice_len_asked;
/* How the scripted plan goes wrong, if it does. */
enum bad_plan { PLAN_GOOD, PLAN_GAP, PLAN_OVERLAP, PLAN_SHORT, PLAN_LONG, PLAN_EMPTY_PIECE,
                PLAN_NO_PIECES, PLAN_ERROR };
static enum bad_plan fake_bad_plan;
static int fake_peer_plan(void *peer, const struct orb_plan_input *in, struct orb_plan *plan)
{
    (void)peer;
    fake_slice_len_asked++;
    uint64_t answer = fake_slice_len;
    if (fake_slice_len_shrinks && fake_slice_len > 100)
        fake_slice_len /= 2;
    if (fake_bad_plan == PLAN_ERROR)
        return orb_fail(ORB_ERESOURCE, "scripted plan failure");
    if (fake_bad_plan == PLAN_NO_PIECES)
        return 0;
    int rc = orb_plan_even(plan, in->length, answer);
    if (rc != 0)
        return rc;
    struct orb_plan_piece *last = &plan->pieces[plan->count - 1];
    switch (fake_bad_plan) {
    case PLAN_GAP: last->offset += 1; last->length -= 1; break;
    case PLAN_OVERLAP: last->offset -= 1; break;
    case PLAN_SHORT: last->length -= 1; break;
    case PLAN_LONG: last->length += 1; break;
    case PLAN_EMPTY_PIECE: plan->pieces[0].length = 0; break;
    default: break;
    }
    return 0;
}
static int fake_peer_submit(void *peer, struct orb_xfer *const *xfers, size_t n)
{
    (void)peer;
    if (fake_submit_status != 0)
        return fake_submit_status;
    pthread_mutex_lock(&fake_lock);
    assert_true(npending + n <= MAX_PENDING);
    for (size_t i = 0; i < n; i++)
        pending[npending++] = xfers[i];
    pthread_mutex_unlock(&fake_lock);
    return 0;
}
static void fake_peer_release(void *peer)
{
    (void)peer;
    peers_released++;
}

/* This test links no real transport: the scripted one takes the TCP slot. */
const struct orb_transport_ops orb_tcp_transport = {
    .id = ORB_TRANSPORT_TCP,
    .name = "scripted",
    .start = fake_start,
    .endpoint = fake_endpoint,
    .close_source = fake_close_source,
    .stop = fake_stop,
    .destroy = fake_destroy,
    .inflight = fake_inflight,
    .peer_open = fake_peer_open,
    .peer_describe = fake_peer_describe,
    .peer_plan = fake_peer_plan,
    .peer_submit = fake_peer_submit,
    .peer_release = fake_peer_release,
};

/* ... and the RDMA slot stays empty: it is never on this host. */
static int absent_start(orb_engine *engine, void **tp)
{
    (void)engine, (void)tp;
    (void)orb_fail(ORB_EUNAVAILABLE, "no RDMA in this test");
    return ORB_TP_NOT_HERE;
}
const struct orb_transport_ops orb_rdma_transport = {
    .id = ORB_TRANSPORT_RDMA,
    .name = "absent",
    .start = absent_start,
};
const struct orb_transport_ops orb_nvlink_transport = {
    .id = ORB_TRANSPORT_NVLINK,
    .name = "absent",
    .start = absent_start,
};
const struct orb_transport_ops orb_shm_transport = {
    .id = ORB_TRANSPORT_SHM,
    .name = "absent",
    .start = absent_start,
};

/* ---- fixture ----------------------------------------------------------------------------- */

struct fx {
    orb_engine *engine;
    orb_segment *seg;
    uint8_t *mem;
    uint64_t base;
    orb_reg_id id;
    atomic_int released;           /* callbacks run on the engine's release thread */
    pthread_t release_thread;
};

#define MEM_LEN 65536

static void count_release(void *ptr, size_t len, void *ctx)
{
    (void)len;
    free(ptr);
    struct fx *f = ctx;
    f->release_thread = pthread_self();
    atomic_fetch_add(&f->released, 1);
}

/* Releases run on the release thread, soon after the last pin drops: wait for `n` of them. */
static void wait_released(struct fx *f, int n)
{
    for (int i = 0; i < 5000 && atomic_load(&f->released) < n; i++)
        usleep(1000);
    assert_int_equal(atomic_load(&f->released), n);
}

static int setup_cfg(void **state, const struct orb_engine_config *cfg)
{
    struct fx *f = calloc(1, sizeof *f);
    assert_non_null(f);
    npending = 0;
    fake_slice_len = 1000;
    fake_slice_len_shrinks = false;
    fake_slice_len_asked = 0;
    fake_bad_plan = PLAN_GOOD;
    fake_submit_status = 0;
    fake_open_status = 0;
    notified_count = 0;
    assert_int_equal(orb_engine_create(cfg, &f->engine), 0);
    f->mem = malloc(MEM_LEN);
    assert_non_null(f->mem);
    f->base = (uint64_t)(uintptr_t)f->mem;
    assert_int_equal(orb_register_memory(f->engine, f->mem, MEM_LEN, ORB_PERM_LOCAL, count_release,
                                         f, &f->id), 0);
    struct orb_epoch e = {{1}};
    assert_int_equal(orb_open_segment(f->engine, "fake:1", &e, 1000000000ull, &f->seg), 0);
    *state = f;
    return 0;
}

static int setup(void **state)
{
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.busy_poll_us = 0;
    return setup_cfg(state, &cfg);
}

static int teardown(void **state)
{
    struct fx *f = *state;
    orb_segment_close(f->seg);
    orb_unregister_memory(f->engine, f->id);
    orb_engine_free(f->engine);
    /* Freeing the engine runs every release still queued. */
    assert_int_equal(atomic_load(&f->released), 1);
    free(f);
    return 0;
}

static struct orb_request rq(struct fx *f, enum orb_op op, uint64_t off, uint64_t len)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.op = op;
    r.local_addr = f->base + off;
    r.remote_addr = 0x10000 + off;
    r.length = len;
    return r;
}

static orb_batch *open_submit(struct fx *f, const struct orb_request *r, size_t n)
{
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, r, n), 0);
    return b;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void test_rejections_attempt_nothing(void **state)
{
    struct fx *f = *state;
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    struct orb_request good = rq(f, ORB_OP_READ, 0, 10);
    struct orb_request bad[5];
    for (int i = 0; i < 5; i++)
        bad[i] = good;
    bad[0].length = 0;
    bad[1].op = (enum orb_op)7;
    bad[2].transport = ORB_TRANSPORT_RDMA;
    bad[3].local_addr = f->base + MEM_LEN - 5; /* one byte outside */
    bad[4].priority = (enum orb_priority)9;
    const int want[5] = {ORB_EINVAL, ORB_EINVAL, ORB_EUNAVAILABLE, ORB_ENOENT, ORB_EINVAL};
    for (int i = 0; i < 5; i++) {
        struct orb_request pair[2] = {good, bad[i]};
        assert_int_equal(orb_batch_submit(b, pair, 2), want[i]);
        assert_non_null(strstr(orb_last_error(), "request 1"));
        assert_int_equal(npending, 0);
    }
    assert_int_equal(orb_batch_submit(b, NULL, 1), ORB_EINVAL);
    assert_int_equal(orb_batch_submit(b, &good, 0), ORB_EINVAL);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    assert_int_equal(orb_batch_wait(b, 0, &rep), 0);
    assert_int_equal(rep.submitted_requests, 0);
    assert_true(rep.done);
    assert_int_equal(orb_batch_free(b), 0);

    /* submit_and_wait reports the rejected index without attempting anything. */
    struct orb_request pair[2] = {good, bad[3]};
    assert_int_equal(orb_submit_and_wait(f->engine, f->seg, pair, 2, NULL, 1000000, &rep), ORB_ENOENT);
    assert_true(rep.has_failure);
    assert_true(rep.done);
    assert_int_equal(rep.failure.request_index, 1);
    assert_int_equal(rep.failure.affected_requests, 1);
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(rep.submitted_requests, 0); /* a rejected group adds nothing */
    assert_int_equal(npending, 0);

    /* A rejected group after an accepted one leaves the count at the accepted requests. */
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_submit(b, &good, 1), 0);
    assert_int_equal(orb_batch_submit(b, pair, 2), ORB_ENOENT);
    fake_submit_status = ORB_EPEER; /* the transport refuses a whole group */
    assert_int_equal(orb_batch_submit(b, &good, 1), ORB_EPEER);
    fake_submit_status = 0;
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    orb_fail(ORB_EINVAL, "an earlier, unrelated failure");
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN);
    assert_non_null(strstr(orb_last_error(), "has not ended yet")); /* not the stale text */
    assert_int_equal(rep.submitted_requests, 1);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
    assert_int_equal(rep.submitted_requests, 1);
    assert_int_equal(rep.completed_requests, 1);
    assert_false(rep.has_failure);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_slicing(void **state)
{
    struct fx *f = *state;
    struct orb_request r = rq(f, ORB_OP_WRITE, 7, 2500);
    orb_batch *b = open_submit(f, &r, 1);
    assert_int_equal(npending, 3);
    assert_int_equal(pending[0]->length, 1000);
    assert_int_equal(pending[1]->length, 1000);
    assert_int_equal(pending[2]->length, 500);
    for (int i = 0; i < 3; i++) {
        assert_ptr_equal(orb_xfer_local_cpu(pending[i]), f->mem + 7 + 1000 * i);
        assert_int_equal(pending[i]->local_offset, 7 + 1000 * (uint64_t)i);
        assert_int_equal(pending[i]->local_reg->base, f->base);
        assert_int_equal(pending[i]->mem_kind, ORB_MEM_HOST);
        assert_int_equal(pending[i]->piece_index, i);
        assert_int_equal(pending[i]->rail, 0);
        assert_int_equal(pending[i]->remote_addr, 0x10007 + 1000 * (uint64_t)i);
        assert_int_equal(pending[i]->request_index, 0);
    }
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    struct orb_batch_report rep;
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN);
    assert_int_equal(rep.completed_requests, 0); /* a request counts only when every slice is in */
    assert_false(rep.local_drained);
    assert_int_equal(orb_batch_free(b), ORB_EBUSY);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_poll(b, &rep), 0);
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(rep.completed_bytes, 2500);
    assert_true(rep.local_drained);
    assert_int_equal(orb_batch_free(b), 0);
}

/* A transport's plan that does not cover its request back to back is refused before anything
 * is queued: the request's group is rejected, its pins are dropped, the message names the
 * transport, and the batch stays usable. */
static void test_bad_plans_are_refused(void **state)
{
    struct fx *f = *state;
    const enum bad_plan bad[] = { PLAN_GAP, PLAN_OVERLAP, PLAN_SHORT, PLAN_LONG, PLAN_EMPTY_PIECE,
                                  PLAN_NO_PIECES, PLAN_ERROR };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        orb_batch *b;
        assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
        /* Request 1 of the group carries the bad plan (4 pieces: beyond the inline ones too). */
        struct orb_request r[2] = {rq(f, ORB_OP_WRITE, 0, 100), rq(f, ORB_OP_READ, 8192, 3500)};
        fake_bad_plan = PLAN_GOOD;
        fake_slice_len = 1000;
        assert_int_equal(orb_batch_submit(b, &r[0], 1), 0);
        fake_bad_plan = bad[k];
        int rc = orb_batch_submit(b, &r[1], 1);
        assert_int_equal(rc, bad[k] == PLAN_ERROR ? ORB_ERESOURCE : ORB_EINVAL);
        assert_non_null(strstr(orb_last_error(), "request 1"));
        assert_non_null(strstr(orb_last_error(), "scripted"));
        assert_int_equal(npending, 1); /* only the first group's piece */
        fake_bad_plan = PLAN_GOOD;
        assert_int_equal(orb_batch_seal(b, NULL), 0);
        complete(0, 0, ORB_REMOTE_EFFECT_NONE);
        struct orb_batch_report rep;
        assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), 0);
        assert_int_equal(rep.submitted_requests, 1);
        assert_int_equal(orb_batch_free(b), 0);
    }
    /* Every pin of the refused requests was dropped: the registration retires at once. */
    assert_int_equal(orb_unregister_memory(f->engine, f->id), 0);
    wait_released(f, 1);
    assert_int_equal(orb_register_memory(f->engine, malloc(MEM_LEN), MEM_LEN, ORB_PERM_LOCAL,
                                         count_release, f, &f->id), 0);
    atomic_store(&f->released, 0);
}

/* The transport is asked for a request's slice length once: the pieces follow the same answer as
 * their count, even from a transport whose answer changes from one call to the next (asked
 * twice, the second pass would cut more pieces than were counted). */
static void test_slice_length_is_asked_once(void **state)
{
    struct fx *f = *state;
    fake_slice_len_shrinks = true;
    struct orb_request r[2] = {rq(f, ORB_OP_READ, 0, 2500), rq(f, ORB_OP_READ, 4096, 2500)};
    orb_batch *b = open_submit(f, r, 2);
    assert_int_equal(fake_slice_len_asked, 2);
    /* 1000 for the first request (3 pieces), 500 for the second (5 pieces). */
    assert_int_equal(npending, 8);
    uint64_t sum[2] = {0, 0};
    for (size_t i = 0; i < npending; i++)
        sum[pending[i]->request_index] += pending[i]->length;
    assert_int_equal(sum[0], 2500);
    assert_int_equal(sum[1], 2500);
    assert_int_equal(pending[0]->length, 1000);
    assert_int_equal(pending[3]->length, 500);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    while (npending > 0)
        complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_poll(b, &rep), 0);
    assert_int_equal(rep.completed_requests, 2);
    assert_int_equal(rep.completed_bytes, 5000);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_prefix_and_failure_span(void **state)
{
    struct fx *f = *state;
    struct orb_request r[6];
    for (int i = 0; i < 6; i++)
        r[i] = rq(f, ORB_OP_READ, (uint64_t)i * 100, 100);
    orb_batch *b = open_submit(f, r, 6);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    /* Out of order: 2 fails first, then 1 with the same status; 0 succeeds. Once 1 failed,
     * nothing after it may start: 3, 4 and 5 are withdrawn, never attempted. */
    assert_int_equal(complete(2, ORB_EPERM, ORB_REMOTE_EFFECT_NONE), 1);
    assert_int_equal(complete(1, ORB_EPERM, ORB_REMOTE_EFFECT_NONE), 1);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 1);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 0);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 0);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), ORB_EPERM);
    assert_true(rep.done);
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(rep.completed_bytes, 100);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 1);
    assert_int_equal(rep.failure.affected_requests, 2);
    assert_int_equal(rep.failure.status, ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_free(b), 0);

    /* A failed, unsealed batch refuses more work with its status. */
    b = open_submit(f, r, 1);
    complete(0, ORB_EPEER, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_submit(b, r, 1), ORB_EPEER);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_write_effect_unknown(void **state)
{
    struct fx *f = *state;
    struct orb_request r = rq(f, ORB_OP_WRITE, 0, 2000); /* two slices */
    orb_batch *b = open_submit(f, &r, 1);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);           /* first half landed */
    complete(0, ORB_EPEER, ORB_REMOTE_EFFECT_NONE);   /* second refused */
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EPEER);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(orb_batch_free(b), 0);

    /* A READ failure never has a remote effect. */
    r.op = ORB_OP_READ;
    b = open_submit(f, &r, 1);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    complete(0, ORB_EPEER, ORB_REMOTE_EFFECT_UNKNOWN);
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EPEER);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_peer_refuses_submission(void **state)
{
    struct fx *f = *state;
    fake_submit_status = ORB_EPEER;
    struct orb_request r[3] = {rq(f, ORB_OP_READ, 0, 10), rq(f, ORB_OP_READ, 10, 10),
                               rq(f, ORB_OP_WRITE, 20, 10)};
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(f->engine, f->seg, r, 3, NULL, 1000000000ull, &rep);
    assert_int_equal(rc, ORB_EPEER);
    assert_int_equal(rep.submitted_requests, 0);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 3);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_true(rep.local_drained);

    /* A peer that was restarted answers with another epoch: ESTALE, not EPEER. */
    fake_open_status = ORB_ESTALE;
    rc = orb_submit_and_wait(f->engine, f->seg, r, 1, NULL, 1000000000ull, &rep);
    assert_int_equal(rc, ORB_ESTALE);
    fake_open_status = 0;
    fake_submit_status = 0;
}

static void test_notification_order(void **state)
{
    struct fx *f = *state;
    struct orb_request r = rq(f, ORB_OP_WRITE, 0, 1500);
    orb_batch *b = open_submit(f, &r, 1);
    const char msg[] = "kv-ready";
    struct orb_notification n = {msg, sizeof msg};
    assert_int_equal(orb_batch_seal(b, &n), 0);
    /* Not sent while data slices are pending. */
    assert_int_equal(npending, 2);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN);
    assert_int_equal(rep.notification, ORB_NOTIFY_PENDING);
    assert_int_equal(npending, 1);
    assert_int_not_equal(pending[0]->op, ORB_XFER_NOTIFY);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_poll(b, &rep), ORB_EAGAIN); /* this poll sends it */
    assert_int_equal(npending, 1);
    assert_int_equal(pending[0]->op, ORB_XFER_NOTIFY);
    assert_int_equal(pending[0]->length, sizeof msg);
    assert_memory_equal(orb_xfer_local_cpu(pending[0]), msg, sizeof msg);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_poll(b, &rep), 0);
    assert_int_equal(rep.notification, ORB_NOTIFY_DELIVERED);
    assert_int_equal(notified_count, 1);
    assert_int_equal(orb_batch_free(b), 0);

    /* Failure: skipped, never sent. */
    b = open_submit(f, &r, 1);
    assert_int_equal(orb_batch_seal(b, &n), 0);
    complete(0, ORB_EPERM, ORB_REMOTE_EFFECT_NONE);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_wait(b, 1000000000ull, &rep), ORB_EPERM);
    assert_int_equal(rep.notification, ORB_NOTIFY_SKIPPED);
    assert_int_equal(npending, 0);
    assert_int_equal(notified_count, 1);
    assert_int_equal(orb_batch_free(b), 0);

    /* A failed delivery is the batch's status. */
    b = open_submit(f, &r, 1);
    assert_int_equal(orb_batch_seal(b, &n), 0);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    orb_batch_poll(b, &rep);
    complete(0, ORB_ERESOURCE, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_poll(b, &rep), ORB_ERESOURCE);
    assert_int_equal(rep.notification, ORB_NOTIFY_FAILED);
    assert_int_equal(rep.notification_status, ORB_ERESOURCE);
    assert_int_equal(rep.completed_requests, 1);
    assert_int_equal(orb_batch_free(b), 0);

    /* Bad notifications are refused at seal. */
    b = open_submit(f, &r, 1);
    struct orb_notification empty = {msg, 0}, huge = {msg, ORB_NOTIFY_MAX + 1}, no_data = {NULL, 3};
    assert_int_equal(orb_batch_seal(b, &empty), ORB_EINVAL);
    assert_int_equal(orb_batch_seal(b, &huge), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "not 4097"));
    assert_int_equal(orb_batch_seal(b, &no_data), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "data is NULL"));
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(orb_batch_wait(b, 0, &rep), 0);
    assert_int_equal(rep.notification, ORB_NOTIFY_NONE);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_deadline_withdraws_and_orphans(void **state)
{
    struct fx *f = *state;
    struct orb_request r[2] = {rq(f, ORB_OP_WRITE, 0, 1000), rq(f, ORB_OP_WRITE, 1000, 1000)};
    /* Start slice 0 by hand from another "worker" before the deadline: keep it simple and let
     * nothing run; the deadline withdraws both. */
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(f->engine, f->seg, r, 2, NULL, 2000000, &rep);
    assert_int_equal(rc, ORB_ETIMEDOUT);
    assert_false(rep.done);
    assert_false(rep.local_drained);
    assert_int_equal(rep.failure.status, ORB_ETIMEDOUT);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(npending, 2);
    /* The user region can be unregistered: the backing stays until the work drains. */
    assert_int_equal(orb_unregister_memory(f->engine, f->id), 0);
    usleep(20000);
    assert_int_equal(atomic_load(&f->released), 0);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 0); /* withdrawn */
    usleep(20000);
    assert_int_equal(atomic_load(&f->released), 0);
    assert_int_equal(complete(0, 0, ORB_REMOTE_EFFECT_NONE), 0);
    wait_released(f, 1);
    /* The callback ran on the engine's release thread, not on the thread that dropped the
     * last pin (here the test, standing in for a transport worker). */
    assert_false(pthread_equal(f->release_thread, pthread_self()));
    /* Re-register for teardown's unregister (it expects one live id). */
    uint8_t *again = malloc(MEM_LEN);
    assert_non_null(again);
    atomic_store(&f->released, 0);
    assert_int_equal(orb_register_memory(f->engine, again, MEM_LEN, ORB_PERM_LOCAL, count_release,
                                         f, &f->id), 0);
    f->mem = again;
    f->base = (uint64_t)(uintptr_t)again;
    /* The orphaned batch was parked; the next call frees it (ASan checks no leak). */
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_free(b), 0);
}

static void test_budgets_and_close(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    orb_engine_config_init(&cfg);
    cfg.max_batches = 2;
    cfg.max_batch_requests = 3;
    void *st;
    setup_cfg(&st, &cfg);
    struct fx *f = st;
    orb_batch *a, *b, *c;
    assert_int_equal(orb_batch_open(f->engine, f->seg, &a), 0);
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
    assert_int_equal(orb_batch_open(f->engine, f->seg, &c), ORB_ERESOURCE);
    struct orb_request r[4];
    for (int i = 0; i < 4; i++)
        r[i] = rq(f, ORB_OP_READ, (uint64_t)i, 1);
    assert_int_equal(orb_batch_submit(a, r, 4), ORB_ERESOURCE);
    assert_int_equal(orb_batch_submit(a, r, 2), 0);
    assert_int_equal(orb_batch_submit(a, r, 2), ORB_ERESOURCE);
    assert_int_equal(orb_batch_free(b), 0);
    assert_int_equal(orb_engine_close_requester(f->engine), 0);
    assert_int_equal(orb_batch_open(f->engine, f->seg, &b), ORB_ECLOSED);
    assert_int_equal(orb_batch_submit(a, r, 1), ORB_ECLOSED);
    orb_segment *s2;
    struct orb_epoch e = {{1}};
    assert_int_equal(orb_open_segment(f->engine, "fake:1", &e, 1000, &s2), ORB_ECLOSED);
    /* Whole close fails what is still live with ECLOSED. */
    assert_int_equal(orb_batch_seal(a, NULL), 0);
    assert_int_equal(orb_engine_close(f->engine, 1000000), 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(a, 0, &rep), ORB_ECLOSED);
    assert_true(rep.local_drained);
    assert_int_equal(orb_batch_free(a), 0);
    uint8_t dummy[4];
    orb_reg_id id;
    assert_int_equal(orb_register_memory(f->engine, dummy, 4, ORB_PERM_LOCAL, NULL, NULL, &id), ORB_ECLOSED);
    teardown(&st);
}

static void test_register_memory_twice(void **state)
{
    struct fx *f = *state;
    /* The fixture's bytes are owned by registration f->id: a second hand-over is refused and
     * neither callback runs. */
    orb_reg_id id;
    assert_int_equal(orb_register_memory(f->engine, f->mem, MEM_LEN, ORB_PERM_REMOTE_READ,
                                         count_release, f, &id), ORB_EEXIST);
    assert_int_equal(atomic_load(&f->released), 0);
    struct orb_local_region region;
    assert_int_equal(orb_resolve_local_address(f->engine, f->base, MEM_LEN, &region), 0);
    assert_int_equal(region.id, f->id);
    assert_int_equal(region.perm, ORB_PERM_LOCAL);
}

static void test_open_segment_checks(void **state)
{
    struct fx *f = *state;
    orb_segment *s = NULL;
    struct orb_epoch stale = {{0xEE}};
    assert_int_equal(orb_open_segment(f->engine, "fake:1", &stale, 1000, &s), ORB_ESTALE);
    assert_null(s);
    assert_int_equal(orb_open_segment(f->engine, "fake:1", NULL, 1000, &s), ORB_EINVAL);
    char longname[ORB_ENDPOINT_MAX + 8];
    memset(longname, 'a', sizeof longname);
    longname[sizeof longname - 1] = '\0';
    assert_int_equal(orb_open_segment(f->engine, longname, &stale, 1000, &s), ORB_EINVAL);
}

static void test_segment_outlives_handle(void **state)
{
    struct fx *f = *state;
    struct orb_request r = rq(f, ORB_OP_READ, 0, 10);
    orb_segment *s2;
    struct orb_epoch e = {{2}};
    assert_int_equal(orb_open_segment(f->engine, "fake:1", &e, 1000000, &s2), 0);
    orb_batch *b;
    assert_int_equal(orb_batch_open(f->engine, s2, &b), 0);
    assert_int_equal(orb_batch_submit(b, &r, 1), 0);
    int before = peers_released;
    orb_segment_close(s2); /* the batch keeps it alive */
    assert_int_equal(peers_released, before);
    assert_int_equal(orb_batch_seal(b, NULL), 0);
    complete(0, 0, ORB_REMOTE_EFFECT_NONE);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(b, 1000000, &rep), 0);
    assert_int_equal(orb_batch_free(b), 0);
    assert_int_equal(peers_released, before + 1);
}

/* ---- failure spans under pipelining ------------------------------------------------------ */

/* The pending slice of request `index` (slices of one request each here). */
static size_t pending_of(uint32_t index)
{
    pthread_mutex_lock(&fake_lock);
    for (size_t i = 0; i < npending; i++) {
        if (pending[i]->request_index == index && pending[i]->op != ORB_XFER_NOTIFY) {
            pthread_mutex_unlock(&fake_lock);
            return i;
        }
    }
    pthread_mutex_unlock(&fake_lock);
    fail_msg("request %u has no pending slice", (unsigned)index);
    return 0;
}

/* A script for SPAN_N one-slice requests: which requests reach the wire before the failure of
 * request `fail` is known (`early[i]`), then the failure, then the rest (which the batch
 * withdraws). Returns the number of requests that were started. */
#define SPAN_N 8
struct span_script {
    size_t fail;
    int early[SPAN_N];
    int started[SPAN_N];
};

static void run_span_script(struct span_script *sc)
{
    struct orb_xfer *x[SPAN_N];
    for (uint32_t i = 0; i < SPAN_N; i++)
        x[i] = pending[pending_of(i)];
    /* Requests before the failure and the early ones start now, as a pipelining transport
     * would put them on the wire back to back. */
    for (size_t i = 0; i < SPAN_N; i++)
        if (i < sc->fail || sc->early[i] || i == sc->fail)
            sc->started[i] = orb_xfer_may_start(x[i]);
    /* Early requests after the failure complete first, then the failure itself. */
    for (size_t i = sc->fail + 1; i < SPAN_N; i++) {
        if (sc->early[i]) {
            (void)take(pending_of((uint32_t)i));
            orb_xfer_done(x[i], 0, ORB_REMOTE_EFFECT_NONE);
        }
    }
    (void)take(pending_of((uint32_t)sc->fail));
    orb_xfer_done(x[sc->fail], ORB_EPERM, ORB_REMOTE_EFFECT_NONE);
    for (size_t i = 0; i < SPAN_N; i++) {
        if (i == sc->fail || (i > sc->fail && sc->early[i]))
            continue;
        (void)take(pending_of((uint32_t)i));
        if (i > sc->fail) {
            sc->started[i] = orb_xfer_may_start(x[i]);
            orb_xfer_done(x[i], sc->started[i] ? 0 : ORB_ETIMEDOUT, ORB_REMOTE_EFFECT_NONE);
        } else {
            orb_xfer_done(x[i], 0, ORB_REMOTE_EFFECT_NONE);
        }
    }
}

/* The report the rules require for a script. */
static void assert_span_report(const struct span_script *sc, enum orb_op op, int rc,
                               const struct orb_batch_report *rep)
{
    size_t last = sc->fail;
    for (size_t i = sc->fail + 1; i < SPAN_N; i++)
        if (sc->early[i])
            last = i;
    /* Nothing after the span started, everything up to its end did. */
    for (size_t i = 0; i < SPAN_N; i++)
        assert_int_equal(sc->started[i], i <= last && (i <= sc->fail || sc->early[i]));
    assert_int_equal(rc, ORB_EPERM);
    assert_true(rep->done);
    assert_int_equal(rep->submitted_requests, SPAN_N);
    assert_int_equal(rep->completed_requests, sc->fail);
    assert_int_equal(rep->completed_bytes, 100 * sc->fail);
    assert_true(rep->has_failure);
    assert_int_equal(rep->failure.request_index, sc->fail);
    assert_int_equal(rep->failure.affected_requests, last - sc->fail + 1);
    assert_int_equal(rep->failure.status, ORB_EPERM);
    /* The failed WRITE itself was refused (effect none); a later WRITE in the span landed. */
    int unknown = op == ORB_OP_WRITE && last > sc->fail;
    assert_int_equal(rep->failure.remote_effect,
                     unknown ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE);
    assert_true(rep->local_drained);
}

struct sync_run {
    struct fx *f;
    struct orb_request reqs[SPAN_N];
    struct orb_batch_report rep;
    int rc;
};

static void *sync_submitter(void *arg)
{
    struct sync_run *run = arg;
    run->rc = orb_submit_and_wait(run->f->engine, run->f->seg, run->reqs, SPAN_N, NULL,
                                  10000000000ull, &run->rep);
    return NULL;
}

static void wait_pending(size_t n)
{
    for (int i = 0; i < 10000; i++) {
        pthread_mutex_lock(&fake_lock);
        size_t have = npending;
        pthread_mutex_unlock(&fake_lock);
        if (have >= n)
            return;
        usleep(1000);
    }
    fail_msg("%zu slices never arrived", n);
}

static void check_span(struct fx *f, enum orb_op op, size_t fail, const int early_mask, int sync,
                       int groups)
{
    struct span_script sc;
    memset(&sc, 0, sizeof sc);
    sc.fail = fail;
    for (size_t i = 0; i < SPAN_N; i++)
        sc.early[i] = i > fail && (early_mask >> i & 1);
    struct orb_request reqs[SPAN_N];
    for (size_t i = 0; i < SPAN_N; i++)
        reqs[i] = rq(f, op, (uint64_t)i * 100, 100);
    struct orb_batch_report rep;
    int rc;
    if (sync) {
        struct sync_run run = {.f = f};
        memcpy(run.reqs, reqs, sizeof reqs);
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, sync_submitter, &run), 0);
        wait_pending(SPAN_N);
        run_span_script(&sc);
        pthread_join(t, NULL);
        rc = run.rc;
        rep = run.rep;
    } else {
        orb_batch *b;
        assert_int_equal(orb_batch_open(f->engine, f->seg, &b), 0);
        /* `groups` groups of equal size: the span crosses group boundaries. */
        size_t per = SPAN_N / (size_t)groups;
        for (size_t g = 0; g < (size_t)groups; g++)
            assert_int_equal(orb_batch_submit(b, reqs + g * per, per), 0);
        assert_int_equal(orb_batch_seal(b, NULL), 0);
        run_span_script(&sc);
        rc = orb_batch_wait(b, 1000000000ull, &rep);
        assert_int_equal(orb_batch_free(b), 0);
    }
    assert_span_report(&sc, op, rc, &rep);
    assert_int_equal(npending, 0);
}

static void test_span_runs_through_last_attempted(void **state)
{
    struct fx *f = *state;
    const enum orb_op ops[2] = {ORB_OP_WRITE, ORB_OP_READ};
    const size_t positions[3] = {0, 3, SPAN_N - 1};
    /* Which later requests were already on the wire when the failure became known: all of
     * them, none, the next one only, and a gap (5 withdrawn, 6 started). */
    const int masks[4] = {0xff, 0x00, 0x10, 0x50};
    for (int o = 0; o < 2; o++)
        for (int p = 0; p < 3; p++)
            for (int m = 0; m < 4; m++)
                for (int mode = 0; mode < 3; mode++) /* sync, async one group, async 4 groups */
                    check_span(f, ops[o], positions[p], masks[m], mode == 0, mode == 2 ? 4 : 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_rejections_attempt_nothing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_segment_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_register_memory_twice, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slicing, setup, teardown),
        cmocka_unit_test_setup_teardown(test_slice_length_is_asked_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_plans_are_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefix_and_failure_span, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_effect_unknown, setup, teardown),
        cmocka_unit_test_setup_teardown(test_span_runs_through_last_attempted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_refuses_submission, setup, teardown),
        cmocka_unit_test_setup_teardown(test_notification_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deadline_withdraws_and_orphans, setup, teardown),
        cmocka_unit_test_setup_teardown(test_segment_outlives_handle, setup, teardown),
        cmocka_unit_test(test_budgets_and_close),
    };
    return cmocka_run_group_tests_name("batch", tests, NULL, NULL);
}
