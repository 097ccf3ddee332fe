/* Batch reports over real TCP under pipelining: the failure span runs from the first failed
 * request through the last one that was attempted, its remote effect says whether a WRITE in it
 * may have changed peer bytes, and no request after it touched a byte. The ground truth is the
 * memory itself: which blocks changed at the source (WRITE) or in the requester (READ). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

#define NREQ 8
#define SRC_SEED 0x21
#define LOCAL_SEED 0x42

struct fixture {
    struct eu_pair pair;
    size_t block;
};

static void fixture_open(struct fixture *f, uint32_t stripes, size_t block)
{
    f->block = block;
    eu_pair_open(&f->pair, stripes, 64 * 1024, NREQ * block, SRC_SEED, LOCAL_SEED);
}

enum block_state { UNTOUCHED, PARTLY_MOVED, MOVED };

/* What request i did to its destination block: request i moves block i of one side into block i
 * of the other, and the two sides start with different patterns. A request cut into slices may
 * have moved some of them when it is in a failure's span. */
static enum block_state block_state(const struct fixture *f, enum orb_op op, size_t i)
{
    const struct eu_region *dst = op == ORB_OP_WRITE ? &f->pair.remote : &f->pair.local;
    const struct eu_region *src = op == ORB_OP_WRITE ? &f->pair.local : &f->pair.remote;
    uint8_t seed = op == ORB_OP_WRITE ? SRC_SEED : LOCAL_SEED;
    const uint8_t *d = dst->base + i * f->block, *s = src->base + i * f->block;
    if (memcmp(d, s, f->block) == 0)
        return MOVED;
    uint8_t *want = malloc(dst->alloc_len);
    assert_non_null(want);
    eu_fill(want, dst->alloc_len, seed);
    size_t off = (size_t)(d - dst->alloc);
    int untouched = memcmp(d, want + off, f->block) == 0;
    free(want);
    return untouched ? UNTOUCHED : PARTLY_MOVED;
}

static int block_moved(const struct fixture *f, enum orb_op op, size_t i)
{
    return block_state(f, op, i) == MOVED;
}

static void check_pipelined_span(uint32_t stripes, size_t block, enum orb_op op, size_t fail,
                                 int async)
{
    struct fixture f;
    fixture_open(&f, stripes, block);
    struct orb_request reqs[NREQ];
    for (size_t i = 0; i < NREQ; i++)
        reqs[i] = eu_req(op, f.pair.local.base + i * block, f.pair.remote.base + i * block, block);
    /* The failing request crosses the end of the source's registration. */
    reqs[fail].remote_addr = (uint64_t)(uintptr_t)(f.pair.remote.base + NREQ * block - block / 2);

    struct orb_batch_report rep;
    int rc;
    if (!async) {
        rc = orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, NREQ, NULL, 30 * EU_SEC, &rep);
    } else {
        orb_batch *b;
        assert_int_equal(orb_batch_open(f.pair.req, f.pair.seg, &b), 0);
        assert_int_equal(orb_batch_submit(b, reqs, NREQ / 2), 0);
        int rc2 = orb_batch_submit(b, reqs + NREQ / 2, NREQ / 2);
        /* The second group is refused only if the first group's failure was already known. */
        assert_true(rc2 == 0 || (rc2 == ORB_ENOENT && fail < NREQ / 2));
        assert_int_equal(orb_batch_seal(b, NULL), 0);
        rc = orb_batch_wait(b, 30 * EU_SEC, &rep);
        assert_int_equal(orb_batch_free(b), 0);
        if (rc2 != 0)
            assert_int_equal(rep.submitted_requests, NREQ / 2); /* the refused group adds nothing */
    }
    size_t submitted = rep.submitted_requests;
    assert_int_equal(rc, ORB_ENOENT);
    assert_true(rep.done);
    assert_true(rep.local_drained);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.status, ORB_ENOENT);

    /* The ground truth: which requests touched their bytes. */
    size_t last = fail;
    for (size_t i = 0; i < NREQ; i++) {
        enum block_state st = block_state(&f, op, i);
        if (i < fail && st != MOVED)
            fail_msg("request %zu before the failure did not complete", i);
        if (i == fail && st != UNTOUCHED)
            fail_msg("the refused request %zu touched bytes", i);
        if (i >= submitted && st != UNTOUCHED)
            fail_msg("request %zu of a refused group touched bytes", i);
        if (i > fail && st != UNTOUCHED)
            last = i;
    }
    assert_int_equal(rep.completed_requests, fail);
    assert_int_equal(rep.completed_bytes, fail * block);
    assert_int_equal(rep.failure.request_index, fail);
    /* Every request after the span is untouched; the span ends at the last one that touched. */
    if (rep.failure.affected_requests != last - fail + 1)
        fail_msg("%s %zu B, %u stripes, fail at %zu, %s: span %zu, last touched %zu",
                 op == ORB_OP_WRITE ? "WRITE" : "READ", block, (unsigned)stripes, fail,
                 async ? "async" : "sync", rep.failure.affected_requests, last);
    enum orb_remote_effect want = op == ORB_OP_WRITE && last > fail ? ORB_REMOTE_EFFECT_UNKNOWN
                                                                     : ORB_REMOTE_EFFECT_NONE;
    assert_int_equal(rep.failure.remote_effect, want);
    eu_pair_close(&f.pair);
}

static void test_spans_one_stripe(void **state)
{
    (void)state;
    const size_t positions[3] = {0, 3, NREQ - 1};
    const enum orb_op ops[2] = {ORB_OP_WRITE, ORB_OP_READ};
    for (int o = 0; o < 2; o++)
        for (int p = 0; p < 3; p++)
            for (int a = 0; a < 2; a++)
                check_pipelined_span(1, 4096, ops[o], positions[p], a);
}

static void test_spans_eight_stripes(void **state)
{
    (void)state;
    const size_t positions[3] = {0, 3, NREQ - 1};
    const enum orb_op ops[2] = {ORB_OP_WRITE, ORB_OP_READ};
    for (int o = 0; o < 2; o++)
        for (int p = 0; p < 3; p++)
            for (int a = 0; a < 2; a++) {
                check_pipelined_span(8, 4096, ops[o], positions[p], a);
                /* Requests of several slices each, spread over the stripes. */
                check_pipelined_span(8, 256 * 1024, ops[o], positions[p], a);
            }
}

/* With one stripe, small requests leave in one burst: every later request is attempted before
 * the refusal comes back, so the span is exactly [fail, NREQ). */
static void test_one_burst_span_is_exact(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 1, 4096);
    struct orb_request reqs[NREQ];
    for (size_t i = 0; i < NREQ; i++)
        reqs[i] = eu_req(ORB_OP_WRITE, f.pair.local.base + i * 4096, f.pair.remote.base + i * 4096, 4096);
    reqs[3].remote_addr = (uint64_t)(uintptr_t)(f.pair.remote.base + NREQ * 4096 - 100);
    struct orb_batch_report rep;
    assert_int_equal(orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, NREQ, NULL, 30 * EU_SEC, &rep),
                     ORB_ENOENT);
    assert_int_equal(rep.completed_requests, 3);
    assert_int_equal(rep.failure.request_index, 3);
    assert_int_equal(rep.failure.affected_requests, NREQ - 3);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_UNKNOWN);
    for (size_t i = 4; i < NREQ; i++)
        assert_true(block_moved(&f, ORB_OP_WRITE, i));
    eu_pair_close(&f.pair);
}

/* A call refused before any work reports it the same way whatever refused it: done, nothing
 * submitted or attempted, and the failure naming the rejected request, or every request when
 * the call was refused as a whole. */
static void assert_refused(int rc, int want, const struct orb_batch_report *rep, size_t index, size_t count,
                           int notified)
{
    assert_int_equal(rc, want);
    assert_int_equal(rep->done, 1);
    assert_int_equal(rep->status, want);
    assert_int_equal(rep->submitted_requests, 0);
    assert_int_equal(rep->completed_requests, 0);
    assert_int_equal(rep->has_failure, 1);
    assert_int_equal(rep->failure.status, want);
    assert_int_equal(rep->failure.request_index, index);
    assert_int_equal(rep->failure.affected_requests, count);
    assert_int_equal(rep->failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(rep->local_drained, 1);
    assert_int_equal(rep->notification, notified ? ORB_NOTIFY_SKIPPED : ORB_NOTIFY_NONE);
}

static void test_refusals_before_any_work(void **state)
{
    (void)state;
    struct fixture f;
    fixture_open(&f, 1, 4096);
    struct orb_request reqs[2] = {eu_req(ORB_OP_READ, f.pair.local.base, f.pair.remote.base, 16),
                                  eu_req(ORB_OP_READ, f.pair.local.base + 16, f.pair.remote.base, 16)};
    struct orb_notification note = {.data = "x", .length = 1};
    struct orb_batch_report rep;

    /* One malformed request: that one is named. */
    reqs[1].length = 0;
    memset(&rep, 0xee, sizeof rep);
    assert_refused(orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, 2, &note, EU_SEC, &rep), ORB_EINVAL, &rep, 1,
                   1, 1);
    reqs[1].length = 16;

    /* A notification too long: the call as a whole. */
    struct orb_notification big = {.data = f.pair.local.base, .length = ORB_NOTIFY_MAX + 1};
    memset(&rep, 0xee, sizeof rep);
    assert_refused(orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, 2, &big, EU_SEC, &rep), ORB_EINVAL, &rep, 0,
                   2, 1);

    /* More requests than a batch holds. */
    size_t many = 65537;
    struct orb_request *all = calloc(many, sizeof *all);
    assert_non_null(all);
    for (size_t i = 0; i < many; i++)
        all[i] = reqs[0];
    memset(&rep, 0xee, sizeof rep);
    assert_refused(orb_submit_and_wait(f.pair.req, f.pair.seg, all, many, NULL, EU_SEC, &rep), ORB_ERESOURCE, &rep,
                   0, many, 0);
    free(all);

    /* Every batch taken. */
    static orb_batch *open[1025];
    size_t nopen = 0;
    while (nopen < 1025 && orb_batch_open(f.pair.req, f.pair.seg, &open[nopen]) == 0)
        nopen++;
    assert_int_equal(nopen, 1024); /* max_batches (1024 by default) was reached */
    memset(&rep, 0xee, sizeof rep);
    assert_refused(orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, 2, &note, EU_SEC, &rep), ORB_ERESOURCE, &rep,
                   0, 2, 1);
    for (size_t i = 0; i < nopen; i++)
        orb_batch_free(open[i]);

    /* The requester side closed. */
    assert_int_equal(orb_engine_close_requester(f.pair.req), 0);
    memset(&rep, 0xee, sizeof rep);
    assert_refused(orb_submit_and_wait(f.pair.req, f.pair.seg, reqs, 2, NULL, EU_SEC, &rep), ORB_ECLOSED, &rep, 0,
                   2, 0);
    eu_pair_close(&f.pair);
}

/* A segment whose endpoint now runs another engine: describe says ESTALE, as transfers do. */
static void test_describe_after_restart_is_stale(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(2, 0);
    orb_segment *seg = eu_open(req, src);
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    assert_int_equal(orb_segment_describe(seg, 5 * EU_SEC, &regions, &count), 0);
    char ep[ORB_ENDPOINT_MAX];
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    orb_engine_free(src);

    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    snprintf(cfg.endpoint, sizeof cfg.endpoint, "%s", ep);
    orb_engine *again = eu_engine(&cfg);
    /* The old connections may take a moment to be seen dead; every answer must be ESTALE. */
    int rc = orb_segment_describe(seg, 5 * EU_SEC, &regions, &count);
    assert_int_equal(rc, ORB_ESTALE);
    assert_non_null(strstr(orb_last_error(), "another source epoch"));
    rc = orb_segment_describe(seg, 5 * EU_SEC, &regions, &count);
    assert_int_equal(rc, ORB_ESTALE);
    orb_segment_close(seg);
    orb_engine_free(req);
    orb_engine_free(again);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_burst_span_is_exact),
        cmocka_unit_test(test_spans_one_stripe),
        cmocka_unit_test(test_spans_eight_stripes),
        cmocka_unit_test(test_describe_after_restart_is_stale),
        cmocka_unit_test(test_refusals_before_any_work),
    };
    return cmocka_run_group_tests_name("reports", tests, NULL, NULL);
}
