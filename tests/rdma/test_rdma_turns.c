/* Looking at a list in turns (lib/rdma/turns.h): a list that fits is taken whole from its head;
 * a longer one is taken a room's worth at a time, and every entry comes up within
 * ceil(total / room) + 1 passes, whatever the position the passes start from. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "rdma/turns.h"

/* One pass over a list of `total` with room `room` from *from, as the callers walk it: skip,
 * then take up to room of what is left; marks what it took in seen[]. The number taken. */
static uint32_t pass(uint32_t *from, uint32_t total, uint32_t room, uint32_t *seen)
{
    uint32_t skip = orb_turn_skip(*from, total, room), taken = 0;
    for (uint32_t i = 0; i < total && taken < room; i++) {
        if (skip > 0) {
            skip--;
            continue;
        }
        seen[i]++;
        taken++;
    }
    *from = orb_turn_next(*from, taken, total);
    return taken;
}

static void test_a_list_that_fits_is_taken_whole_from_its_head(void **state)
{
    (void)state;
    for (uint32_t total = 0; total <= 40; total++) {
        uint32_t seen[40] = {0}, from = 0;
        assert_int_equal(pass(&from, total, 40, seen), total);
        assert_int_equal(from, 0);
        for (uint32_t i = 0; i < total; i++)
            assert_int_equal(seen[i], 1);
    }
    /* Whatever position an earlier, longer list left behind. */
    assert_int_equal(orb_turn_skip(37, 10, 10), 0);
    assert_int_equal(orb_turn_next(37, 10, 10), 0);
}

static void test_every_entry_comes_up_in_turns(void **state)
{
    (void)state;
    enum { MAX = 300 };
    for (uint32_t total = 1; total <= MAX; total += 7) {
        for (uint32_t room = 1; room < total; room += 5) {
            for (uint32_t start = 0; start < 3 * total; start += total / 2 + 1) {
                uint32_t seen[MAX];
                memset(seen, 0, sizeof seen);
                uint32_t from = start, passes = (total + room - 1) / room + 1;
                for (uint32_t k = 0; k < passes; k++)
                    assert_true(pass(&from, total, room, seen) > 0);
                for (uint32_t i = 0; i < total; i++)
                    if (seen[i] == 0)
                        fail_msg("%u entries, room %u, from %u: entry %u never came up in %u passes", total, room,
                                 start, i, passes);
            }
        }
    }
}

static void test_a_list_that_shrank_below_the_position_wraps(void **state)
{
    (void)state;
    uint32_t seen[8] = {0}, from = 1000;
    assert_int_equal(orb_turn_skip(from, 8, 3), 1000 % 8);
    uint32_t passes = 0;
    while (passes < 5) {
        (void)pass(&from, 8, 3, seen);
        passes++;
    }
    for (uint32_t i = 0; i < 8; i++)
        assert_true(seen[i] > 0);
    /* The list grows past the room again: the position still leads somewhere inside it. */
    assert_true(orb_turn_skip(from, 5, 2) < 5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_list_that_fits_is_taken_whole_from_its_head),
        cmocka_unit_test(test_every_entry_comes_up_in_turns),
        cmocka_unit_test(test_a_list_that_shrank_below_the_position_wraps),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
