/* Whole-request authority over real TCP: a request the source does not allow as a whole changes
 * no byte, at the source or in the requester's buffer, whatever its size and however many
 * stripes carry its slices. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "util.h"

#define SRC_SEED 0x51
#define LOCAL_SEED 0x1c

/* One request that must be refused as a whole: rc ENOENT, nothing attempted that moved a byte. */
static void assert_refused_untouched(orb_engine *req, orb_segment *seg, struct orb_request r,
                                     const struct eu_region *src, const struct eu_region *local,
                                     const char *what)
{
    struct orb_batch_report rep;
    int rc = orb_submit_and_wait(req, seg, &r, 1, NULL, 30 * EU_SEC, &rep);
    if (rc != ORB_ENOENT)
        fail_msg("%s: rc %d (%s), want ORB_ENOENT", what, rc, orb_last_error());
    /* The message names the source's cause, not only the status. */
    if (strstr(orb_last_error(), "the source answered") == NULL)
        fail_msg("%s: the message gives no cause: %s", what, orb_last_error());
    /* and the range refused, on every transport. */
    char at_text[32];
    snprintf(at_text, sizeof at_text, "0x%llx", (unsigned long long)r.remote_addr);
    if (strstr(orb_last_error(), at_text) == NULL)
        fail_msg("%s: the message does not name %s: %s", what, at_text, orb_last_error());
    assert_true(rep.done);
    assert_int_equal(rep.completed_requests, 0);
    assert_int_equal(rep.completed_bytes, 0);
    assert_true(rep.has_failure);
    assert_int_equal(rep.failure.request_index, 0);
    assert_int_equal(rep.failure.affected_requests, 1);
    assert_int_equal(rep.failure.status, ORB_ENOENT);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_true(rep.local_drained);
    size_t at = eu_first_mismatch(src->alloc, src->alloc_len, SRC_SEED);
    if (at != SIZE_MAX)
        fail_msg("%s: source byte %zu (registration offset %lld) changed", what, at,
                 (long long)at - (long long)EU_GUARD);
    at = eu_first_mismatch(local->alloc, local->alloc_len, LOCAL_SEED);
    if (at != SIZE_MAX)
        fail_msg("%s: requester byte %zu changed", what, at);
}

static void check_whole_request(uint32_t stripes, uint64_t threshold, size_t len)
{
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(stripes, threshold);
    struct eu_region remote, local;
    eu_region_new(src, len, ORB_PERM_REMOTE_WRITE, SRC_SEED, &remote);
    /* The local side holds len + 2 bytes in one registration: only the remote side is short. */
    eu_region_new(req, len + 2, ORB_PERM_LOCAL, LOCAL_SEED, &local);
    orb_segment *seg = eu_open(req, src);
    char what[128];

    const struct {
        const char *name;
        enum orb_op op;
        long long off; /* from the remote base */
        size_t length;
    } cases[] = {
        {"WRITE len+1 at the base", ORB_OP_WRITE, 0, len + 1},
        {"WRITE len at base+1", ORB_OP_WRITE, 1, len},
        {"WRITE len+1 at base-1", ORB_OP_WRITE, -1, len + 1},
        {"READ len+1 at the base", ORB_OP_READ, 0, len + 1},
        {"READ len at base+1", ORB_OP_READ, 1, len},
        {"READ len+1 at base-1", ORB_OP_READ, -1, len + 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(what, sizeof what, "%s (len %zu, %u stripes, threshold %llu)", cases[i].name, len,
                 (unsigned)stripes, (unsigned long long)threshold);
        struct orb_request r = eu_req(cases[i].op, local.base, remote.base + cases[i].off,
                                      cases[i].length);
        assert_refused_untouched(req, seg, r, &remote, &local, what);
    }

    /* The same connections still carry the exact range, and the check above can see a change. */
    struct orb_batch_report rep;
    eu_fill(local.base, len, 0x77);
    struct orb_request w = eu_req(ORB_OP_WRITE, local.base, remote.base, len);
    assert_int_equal(orb_submit_and_wait(req, seg, &w, 1, NULL, 30 * EU_SEC, &rep), 0);
    assert_memory_equal(remote.base, local.base, len);
    assert_int_equal(eu_first_mismatch(remote.alloc, EU_GUARD, SRC_SEED), SIZE_MAX);
    eu_fill(local.base, len + 2, 0x78);
    struct orb_request r = eu_req(ORB_OP_READ, local.base + 1, remote.base, len);
    assert_int_equal(orb_submit_and_wait(req, seg, &r, 1, NULL, 30 * EU_SEC, &rep), 0);
    assert_memory_equal(local.base + 1, remote.base, len);

    orb_segment_close(seg);
    eu_region_free(req, &local);
    eu_region_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Below the threshold (one frame) and above it (one slice per stripe), 1, 2 and 8 stripes. */
static void test_whole_request_small_threshold(void **state)
{
    (void)state;
    const uint32_t stripes[3] = {1, 2, 8};
    for (int s = 0; s < 3; s++) {
        check_whole_request(stripes[s], 64 * 1024, 4096);
        check_whole_request(stripes[s], 64 * 1024, 1024 * 1024);
    }
}

/* The reported case: 4 MiB + 1 byte at the base of a 4 MiB registration, default threshold. */
static void test_whole_request_default_threshold(void **state)
{
    (void)state;
    const uint32_t stripes[3] = {1, 2, 8};
    for (int s = 0; s < 3; s++)
        check_whole_request(stripes[s], 0, 4u << 20);
}

/* A WRITE into a region peers may only READ, cut into slices: refused as a whole (EPERM). */
static void test_whole_request_permission(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(8, 64 * 1024);
    struct eu_region remote, local;
    size_t len = 1u << 20;
    eu_region_new(src, len, ORB_PERM_REMOTE_READ, SRC_SEED, &remote);
    eu_region_new(req, len, ORB_PERM_LOCAL, LOCAL_SEED, &local);
    orb_segment *seg = eu_open(req, src);
    struct orb_batch_report rep;
    struct orb_request w = eu_req(ORB_OP_WRITE, local.base, remote.base, len);
    assert_int_equal(orb_submit_and_wait(req, seg, &w, 1, NULL, 30 * EU_SEC, &rep), ORB_EPERM);
    assert_int_equal(rep.failure.remote_effect, ORB_REMOTE_EFFECT_NONE);
    assert_int_equal(eu_first_mismatch(remote.alloc, remote.alloc_len, SRC_SEED), SIZE_MAX);
    orb_segment_close(seg);
    eu_region_free(req, &local);
    eu_region_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Local-only memory of the source answers peers like unregistered memory. */
static void test_local_only_is_invisible(void **state)
{
    (void)state;
    orb_engine *src = eu_engine(NULL);
    orb_engine *req = eu_requester(2, 0);
    struct eu_region hidden, local;
    eu_region_new(src, 8192, ORB_PERM_LOCAL, SRC_SEED, &hidden);
    eu_region_new(req, 8192, ORB_PERM_LOCAL, LOCAL_SEED, &local);
    orb_segment *seg = eu_open(req, src);
    struct orb_batch_report rep;
    const enum orb_op ops[2] = {ORB_OP_READ, ORB_OP_WRITE};
    for (int i = 0; i < 2; i++) {
        struct orb_request r = eu_req(ops[i], local.base, hidden.base, 4096);
        assert_int_equal(orb_submit_and_wait(req, seg, &r, 1, NULL, 30 * EU_SEC, &rep), ORB_ENOENT);
        assert_int_equal(rep.failure.status, ORB_ENOENT);
    }
    struct orb_region_desc *regions = NULL;
    size_t count = 99;
    assert_int_equal(orb_segment_describe(seg, 5 * EU_SEC, &regions, &count), 0);
    assert_int_equal(count, 0);
    assert_null(regions);
    assert_int_equal(eu_first_mismatch(hidden.alloc, hidden.alloc_len, SRC_SEED), SIZE_MAX);
    assert_int_equal(eu_first_mismatch(local.alloc, local.alloc_len, LOCAL_SEED), SIZE_MAX);
    orb_segment_close(seg);
    eu_region_free(req, &local);
    eu_region_free(src, &hidden);
    orb_engine_free(req);
    orb_engine_free(src);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whole_request_small_threshold),
        cmocka_unit_test(test_whole_request_default_threshold),
        cmocka_unit_test(test_whole_request_permission),
        cmocka_unit_test(test_local_only_is_invisible),
    };
    return cmocka_run_group_tests_name("authority", tests, NULL, NULL);
}
