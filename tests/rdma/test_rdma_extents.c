/* The staging arena's extent allocator (lib/rdma/extents.h): bounds, first fit, coalescing, and
 * a random sequence checked against a page map (no two extents overlap, everything comes back). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "rdma/extents.h"

static struct orb_rdma_extents ext;

static void test_init_rejects(void **state)
{
    (void)state;
    assert_int_equal(orb_rdma_extents_init(&ext, 0, 4096), ORB_EINVAL);
    assert_int_equal(orb_rdma_extents_init(&ext, 8192, 3000), ORB_EINVAL);
    assert_int_equal(orb_rdma_extents_init(&ext, 8192 + 1, 4096), ORB_EINVAL);
    assert_int_equal(orb_rdma_extents_init(NULL, 8192, 4096), ORB_EINVAL);
}

static void test_bounds(void **state)
{
    (void)state;
    uint64_t off = 99;
    assert_int_equal(orb_rdma_extents_init(&ext, 16 * 4096, 4096), 0);
    assert_int_equal(orb_rdma_extents_take(&ext, 0, &off), ORB_EINVAL);
    assert_int_equal(orb_rdma_extents_take(&ext, 16 * 4096 + 1, &off), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "max_staging_bytes"));
    assert_int_equal(off, 99); /* untouched on failure */
    /* The whole range fits; then nothing does, for now. */
    assert_int_equal(orb_rdma_extents_take(&ext, 16 * 4096, &off), 0);
    assert_int_equal(off, 0);
    assert_int_equal(ext.in_use, 16 * 4096);
    assert_int_equal(orb_rdma_extents_take(&ext, 1, &off), ORB_EAGAIN);
    orb_rdma_extents_put(&ext, 0, 16 * 4096);
    assert_int_equal(ext.in_use, 0);
    assert_int_equal(ext.nfree, 1);
}

static void test_first_fit_and_coalescing(void **state)
{
    (void)state;
    uint64_t a, b, c, d;
    assert_int_equal(orb_rdma_extents_init(&ext, 16 * 4096, 4096), 0);
    assert_int_equal(orb_rdma_extents_take(&ext, 1, &a), 0);        /* one byte: one page */
    assert_int_equal(orb_rdma_extents_take(&ext, 4097, &b), 0);     /* two pages */
    assert_int_equal(orb_rdma_extents_take(&ext, 3 * 4096, &c), 0);
    assert_int_equal(a, 0);
    assert_int_equal(b, 4096);
    assert_int_equal(c, 3 * 4096);
    assert_int_equal(ext.in_use, 6 * 4096);
    /* A hole of two pages at 4096: a two-page extent lands there, a three-page one after c. */
    orb_rdma_extents_put(&ext, b, 4097);
    assert_int_equal(ext.nfree, 2);
    assert_int_equal(orb_rdma_extents_take(&ext, 3 * 4096, &d), 0);
    assert_int_equal(d, 6 * 4096);
    assert_int_equal(orb_rdma_extents_take(&ext, 2 * 4096, &b), 0);
    assert_int_equal(b, 4096);
    /* Give back in an order that merges left, right and both sides. */
    orb_rdma_extents_put(&ext, b, 2 * 4096);
    orb_rdma_extents_put(&ext, a, 1);            /* merges with b's hole on its right */
    assert_int_equal(ext.free[0].off, 0);
    assert_int_equal(ext.free[0].len, 3 * 4096);
    orb_rdma_extents_put(&ext, d, 3 * 4096);     /* merges with the tail */
    orb_rdma_extents_put(&ext, c, 3 * 4096);     /* closes the last gap: both sides */
    assert_int_equal(ext.nfree, 1);
    assert_int_equal(ext.free[0].len, 16 * 4096);
    assert_int_equal(ext.ntaken, 0);
    assert_int_equal(ext.in_use, 0);
}

static void test_taken_bound(void **state)
{
    (void)state;
    static uint64_t offs[ORB_RDMA_EXTENTS_MAX];
    assert_int_equal(orb_rdma_extents_init(&ext, (ORB_RDMA_EXTENTS_MAX + 8) * 64ull, 64), 0);
    for (uint32_t i = 0; i < ORB_RDMA_EXTENTS_MAX; i++)
        assert_int_equal(orb_rdma_extents_take(&ext, 1, &offs[i]), 0);
    uint64_t off;
    assert_int_equal(orb_rdma_extents_take(&ext, 1, &off), ORB_EAGAIN); /* room, but no more extents */
    /* Every other one back: the most fragmented list there can be. */
    for (uint32_t i = 0; i < ORB_RDMA_EXTENTS_MAX; i += 2)
        orb_rdma_extents_put(&ext, offs[i], 1);
    assert_int_equal(ext.nfree, ORB_RDMA_EXTENTS_MAX / 2 + 1);
    for (uint32_t i = 1; i < ORB_RDMA_EXTENTS_MAX; i += 2)
        orb_rdma_extents_put(&ext, offs[i], 1);
    assert_int_equal(ext.nfree, 1);
    assert_int_equal(ext.in_use, 0);
}

#define PAGES 256u
static void test_random_against_page_map(void **state)
{
    (void)state;
    uint8_t map[PAGES];
    struct { uint64_t off, len; } live[200];
    uint32_t nlive = 0;
    memset(map, 0, sizeof map);
    srand(7);
    assert_int_equal(orb_rdma_extents_init(&ext, PAGES * 4096ull, 4096), 0);
    for (int step = 0; step < 20000; step++) {
        if (nlive < 200 && (rand() % 3 != 0 || nlive == 0)) {
            uint64_t len = 1 + (uint64_t)rand() % (24 * 4096);
            uint64_t off;
            int rc = orb_rdma_extents_take(&ext, len, &off);
            if (rc == ORB_EAGAIN)
                continue;
            assert_int_equal(rc, 0);
            assert_int_equal(off % 4096, 0);
            assert_true(off + len <= PAGES * 4096ull);
            for (uint64_t p = off / 4096; p < (off + len + 4095) / 4096; p++) {
                assert_int_equal(map[p], 0); /* never handed out twice */
                map[p] = 1;
            }
            live[nlive].off = off;
            live[nlive++].len = len;
        } else {
            uint32_t i = (uint32_t)rand() % nlive;
            for (uint64_t p = live[i].off / 4096; p < (live[i].off + live[i].len + 4095) / 4096; p++)
                map[p] = 0;
            orb_rdma_extents_put(&ext, live[i].off, live[i].len);
            live[i] = live[--nlive];
        }
        uint64_t used = 0;
        for (uint32_t p = 0; p < PAGES; p++)
            used += map[p];
        assert_int_equal(ext.in_use, used * 4096);
        for (uint32_t f = 1; f < ext.nfree; f++) /* sorted, coalesced */
            assert_true(ext.free[f - 1].off + ext.free[f - 1].len < ext.free[f].off);
    }
    while (nlive > 0) {
        nlive--;
        orb_rdma_extents_put(&ext, live[nlive].off, live[nlive].len);
    }
    assert_int_equal(ext.nfree, 1);
    assert_int_equal(ext.free[0].len, PAGES * 4096ull);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_init_rejects),
        cmocka_unit_test(test_bounds),
        cmocka_unit_test(test_first_fit_and_coalescing),
        cmocka_unit_test(test_taken_bound),
        cmocka_unit_test(test_random_against_page_map),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
