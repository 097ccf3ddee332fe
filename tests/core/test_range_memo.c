/* A transport's memory of a peer's answers about remote ranges (lib/core/range_memo.c). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "core/clock.h"
#include "core/range_memo.h"

static void test_empty_knows_nothing(void **state)
{
    (void)state;
    struct orb_range_memo m = {0};
    assert_int_equal(orb_range_memo_lookup(&m, 0, 1, 0), -1);
    assert_int_equal(orb_range_memo_lookup(&m, UINT64_MAX - 1, 1, 5), -1);
}

static void test_extents_contain_exactly(void **state)
{
    (void)state;
    struct orb_range_memo m = {0};
    orb_range_memo_remember(&m, 4096, 8192, true, 0);
    assert_int_equal(orb_range_memo_lookup(&m, 4096, 8192, 100), 1);    /* the whole extent */
    assert_int_equal(orb_range_memo_lookup(&m, 4097, 1, 100), 1);
    assert_int_equal(orb_range_memo_lookup(&m, 12287, 1, 100), 1);      /* its last byte */
    assert_int_equal(orb_range_memo_lookup(&m, 12287, 2, 100), -1);     /* one past */
    assert_int_equal(orb_range_memo_lookup(&m, 4095, 2, 100), -1);      /* one before */
    assert_int_equal(orb_range_memo_lookup(&m, 4096, 8193, 100), -1);
    assert_int_equal(orb_range_memo_lookup(&m, UINT64_MAX, 2, 100), -1); /* wraps */
    /* Kept for good. */
    assert_int_equal(orb_range_memo_lookup(&m, 4096, 1, UINT64_MAX - 1), 1);
}

static void test_refusals_are_exact_and_expire(void **state)
{
    (void)state;
    struct orb_range_memo m = {0};
    orb_range_memo_remember(&m, 100, 10, false, 1000);
    assert_int_equal(orb_range_memo_lookup(&m, 100, 10, 999), 0);
    assert_int_equal(orb_range_memo_lookup(&m, 100, 9, 999), -1); /* only that range */
    assert_int_equal(orb_range_memo_lookup(&m, 101, 9, 999), -1);
    assert_int_equal(orb_range_memo_lookup(&m, 100, 10, 1000), -1); /* expired */
}

static void test_forget_overlaps_only(void **state)
{
    (void)state;
    struct orb_range_memo m = {0};
    orb_range_memo_remember(&m, 0, 100, true, 0);
    orb_range_memo_remember(&m, 200, 100, true, 0);
    orb_range_memo_forget(&m, 99, 2); /* touches the first only */
    assert_int_equal(orb_range_memo_lookup(&m, 0, 10, 1), -1);
    assert_int_equal(orb_range_memo_lookup(&m, 200, 10, 1), 1);
    orb_range_memo_forget(&m, 300, 5); /* just past the second */
    assert_int_equal(orb_range_memo_lookup(&m, 200, 10, 1), 1);
}

static void test_the_oldest_goes_first(void **state)
{
    (void)state;
    struct orb_range_memo m = {0};
    for (uint64_t i = 0; i < ORB_RANGE_MEMO_MAX; i++)
        orb_range_memo_remember(&m, i * 1000, 10, true, 0);
    assert_int_equal(orb_range_memo_lookup(&m, 0, 10, 1), 1);
    orb_range_memo_remember(&m, 999999, 10, true, 0); /* replaces the first */
    assert_int_equal(orb_range_memo_lookup(&m, 0, 10, 1), -1);
    assert_int_equal(orb_range_memo_lookup(&m, 1000, 10, 1), 1);
    assert_int_equal(orb_range_memo_lookup(&m, 999999, 10, 1), 1);
    assert_int_equal(m.count, ORB_RANGE_MEMO_MAX);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_knows_nothing),
        cmocka_unit_test(test_extents_contain_exactly),
        cmocka_unit_test(test_refusals_are_exact_and_expire),
        cmocka_unit_test(test_forget_overlaps_only),
        cmocka_unit_test(test_the_oldest_goes_first),
    };
    return cmocka_run_group_tests_name("range_memo", tests, NULL, NULL);
}
