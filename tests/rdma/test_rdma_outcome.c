/* What a failed RDMA request attempt leads to (lib/rdma/outcome.h): the whole rule table --
 * every combination of the attempt's facts -- checked against the rules written out once more,
 * plus the cases that matter most spelled out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "rdma/outcome.h"

/* A READ that a dying queue pair failed on its first attempt, with one replay allowed. */
static struct orb_rdma_attempt path_failed_read(void)
{
    return (struct orb_rdma_attempt){.read = true, .status = ORB_EPEER, .qp_died = true, .payload_posted = true,
                                     .max_replays = 1};
}

static void test_a_success_is_neither_replayed_nor_has_an_effect(void **state)
{
    (void)state;
    struct orb_rdma_attempt a = path_failed_read();
    a.status = 0;
    struct orb_rdma_outcome o = orb_rdma_attempt_outcome(&a);
    assert_false(o.replay);
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_NONE);
    a.read = false;
    o = orb_rdma_attempt_outcome(&a);
    assert_false(o.replay);
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_NONE);
}

static void test_a_read_a_dead_queue_pair_failed_is_replayed_once(void **state)
{
    (void)state;
    struct orb_rdma_attempt a = path_failed_read();
    struct orb_rdma_outcome o = orb_rdma_attempt_outcome(&a);
    assert_true(o.replay);
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_NONE);
    a.replays = 1; /* the budget is spent */
    o = orb_rdma_attempt_outcome(&a);
    assert_false(o.replay);
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_NONE);
    a.max_replays = 0; /* read_replays 0: never */
    a.replays = 0;
    assert_false(orb_rdma_attempt_outcome(&a).replay);
}

static void test_a_write_is_never_replayed(void **state)
{
    (void)state;
    struct orb_rdma_attempt a = path_failed_read();
    a.read = false;
    a.max_replays = 8;
    struct orb_rdma_outcome o = orb_rdma_attempt_outcome(&a);
    assert_false(o.replay);
    /* Its payload reached the device: the source's bytes may have changed, whatever the queue
     * pair did afterwards. */
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_UNKNOWN);
    a.payload_posted = false; /* failed before anything of it was posted */
    o = orb_rdma_attempt_outcome(&a);
    assert_false(o.replay);
    assert_int_equal(o.effect, ORB_REMOTE_EFFECT_NONE);
}

static void test_a_read_failed_otherwise_is_not_replayed(void **state)
{
    (void)state;
    static const int not_the_path[] = {ORB_EPERM, ORB_ETIMEDOUT, ORB_ECLOSED, ORB_ESTALE, ORB_EPROTO, ORB_ERESOURCE};
    for (size_t i = 0; i < sizeof not_the_path / sizeof not_the_path[0]; i++) {
        struct orb_rdma_attempt a = path_failed_read();
        a.status = not_the_path[i];
        assert_false(orb_rdma_attempt_outcome(&a).replay);
    }
    struct orb_rdma_attempt a = path_failed_read();
    a.qp_died = false; /* no queue pair of it died: the source's answer, say */
    assert_false(orb_rdma_attempt_outcome(&a).replay);
    a = path_failed_read();
    a.acked = true; /* the source ended its grant: it answered, the path did not fail it */
    assert_false(orb_rdma_attempt_outcome(&a).replay);
    a = path_failed_read();
    a.deadline_passed = true;
    assert_false(orb_rdma_attempt_outcome(&a).replay);
    a = path_failed_read();
    a.stopping = true;
    assert_false(orb_rdma_attempt_outcome(&a).replay);
}

/* Every combination of the facts, against the rules written out independently. */
static void test_the_whole_table(void **state)
{
    (void)state;
    static const int statuses[] = {0, ORB_EPEER, ORB_EPERM, ORB_ETIMEDOUT, ORB_ECLOSED};
    size_t rows = 0, replays = 0;
    for (size_t si = 0; si < sizeof statuses / sizeof statuses[0]; si++)
        for (unsigned bits = 0; bits < 64; bits++)
            for (uint32_t used = 0; used <= 2; used++) {
                struct orb_rdma_attempt a = {.read = bits & 1, .status = statuses[si], .qp_died = (bits >> 1) & 1,
                                             .acked = (bits >> 2) & 1, .payload_posted = (bits >> 3) & 1,
                                             .deadline_passed = (bits >> 4) & 1, .stopping = (bits >> 5) & 1,
                                             .replays = used, .max_replays = 1};
                struct orb_rdma_outcome o = orb_rdma_attempt_outcome(&a);
                bool failed = a.status != 0;
                bool want_replay = failed && a.read && a.status == ORB_EPEER && a.qp_died && !a.acked &&
                                   a.replays < a.max_replays && !a.deadline_passed && !a.stopping;
                enum orb_remote_effect want_effect =
                    failed && !a.read && a.payload_posted ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE;
                if (o.replay != want_replay || o.effect != want_effect)
                    fail_msg("status %d, facts 0x%x, %u replay(s) used: replay %d effect %d, want %d and %d",
                             a.status, bits, used, o.replay, o.effect, want_replay, want_effect);
                /* Invariants whatever the rules' details: a WRITE never replays; a READ never
                 * has an effect; a replay is never also an unknown effect. */
                assert_false(o.replay && !a.read);
                assert_false(a.read && o.effect != ORB_REMOTE_EFFECT_NONE);
                rows++;
                replays += o.replay;
            }
    assert_int_equal(rows, 5 * 64 * 3);
    /* Two rows: a READ that a dead queue pair failed (EPEER), not acknowledged, its deadline ahead,
     * the transport running and its replay left; its payload posted or not. */
    assert_int_equal(replays, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_success_is_neither_replayed_nor_has_an_effect),
        cmocka_unit_test(test_a_read_a_dead_queue_pair_failed_is_replayed_once),
        cmocka_unit_test(test_a_write_is_never_replayed),
        cmocka_unit_test(test_a_read_failed_otherwise_is_not_replayed),
        cmocka_unit_test(test_the_whole_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
