/* Rail health: TENT's threshold and recovery vectors, the window, cooldown, probe interval and
 * single half-open trial, doubling up to the cap, late and stale receipts, cancellation,
 * mask lookups that never arm a probe, statistics, the bounded table that keeps active and
 * unproven pairs, and concurrent use (run under TSan). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <string.h>

#include "core/error.h"
#include "topo/rail.h"
#include "fake_clock.h"

static struct fake_clock fclock;

static struct orb_epoch epoch_of(uint8_t tag)
{
    struct orb_epoch e;
    memset(e.bytes, 0x40, sizeof(e.bytes));
    e.bytes[15] = tag;
    return e;
}

static struct orb_rail_key pair(uint8_t peer, uint16_t local, uint16_t remote)
{
    struct orb_rail_key k = {.peer = epoch_of(peer), .local_nic = local, .remote_nic = remote};
    return k;
}

static struct orb_rail_table *table_with(const struct orb_rail_config *cfg)
{
    struct orb_rail_table *t = NULL;
    assert_int_equal(orb_rail_table_new(cfg, &fclock.clock, &t), 0);
    return t;
}

static struct orb_rail_table *default_table(void)
{
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    return table_with(&cfg);
}

static void fail_n(struct orb_rail_table *t, const struct orb_rail_key *k, int n)
{
    for (int i = 0; i < n; i++)
        assert_int_equal(orb_rail_record_failure(t, k), 0);
}

static struct orb_rail_pair_info info_of(struct orb_rail_table *t, const struct orb_rail_key *k)
{
    struct orb_rail_pair_info info;
    assert_int_equal(orb_rail_pair_info(t, k, &info), 0);
    return info;
}

static int setup(void **state)
{
    (void)state;
    fake_clock_init(&fclock, 1000 * SEC);
    return 0;
}

/* ---- configuration ---------------------------------------------------------------------------------- */

static void test_config_is_validated(void **state)
{
    (void)state;
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    assert_int_equal(cfg.error_threshold, 3);
    assert_int_equal(cfg.error_window_ns, 10 * SEC);
    assert_int_equal(cfg.cooldown_ns, 30 * SEC);
    assert_int_equal(cfg.max_cooldown_ns, 300 * SEC);
    assert_int_equal(cfg.probe_interval_ns, 1 * SEC);
    struct orb_rail_table *t = NULL;
    struct orb_rail_config bad = cfg;
    bad.error_threshold = 0;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    bad.error_threshold = ORB_RAIL_MAX_THRESHOLD + 1;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    bad = cfg;
    bad.error_window_ns = 0;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    bad = cfg;
    bad.max_cooldown_ns = bad.cooldown_ns - 1;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    bad = cfg;
    bad.max_rail_pairs = 0;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    bad.max_rail_pairs = ORB_RAIL_MAX_PAIRS + 1;
    assert_int_equal(orb_rail_table_new(&bad, &fclock.clock, &t), ORB_EINVAL);
    assert_int_equal(orb_rail_table_new(&cfg, NULL, &t), ORB_EINVAL);
    assert_int_equal(orb_rail_table_new(NULL, &fclock.clock, &t), ORB_EINVAL);
    assert_int_equal(orb_rail_table_new(&cfg, &fclock.clock, NULL), ORB_EINVAL);
    assert_null(t);
    orb_rail_table_free(NULL);
}

static void test_keys_are_checked(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, ORB_RAIL_MAX_NICS, 0);
    uint64_t token = 0;
    struct orb_rail_pair_info info;
    assert_int_equal(orb_rail_record_failure(t, &k), ORB_EINVAL);
    assert_int_equal(orb_rail_record_failure(t, NULL), ORB_EINVAL);
    assert_int_equal(orb_rail_record_failure(NULL, &k), ORB_EINVAL);
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), ORB_EINVAL);
    assert_int_equal(orb_rail_pair_info(t, &k, &info), ORB_EINVAL);
    struct orb_rail_nic_stats ns;
    assert_int_equal(orb_rail_nic_stats(t, ORB_RAIL_MAX_NICS, &ns), ORB_EINVAL);
    assert_int_equal(orb_rail_nic_stats(t, 0, NULL), ORB_EINVAL);
    assert_false(orb_rail_usable(t, NULL));
    assert_false(orb_rail_usable(t, &k)); /* an out-of-range NIC is never usable */
    orb_rail_record_success(t, NULL); /* no-op */
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.errors, 0);
    assert_int_equal(st.pairs, 0);
    orb_rail_table_free(t);
}

/* ---- TENT's rail_monitor_test vectors ------------------------------------------------------------------ */

static void test_tent_three_failures_make_a_rail_unavailable(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 0);
    assert_true(orb_rail_usable(t, &k)); /* unknown pairs are healthy */
    fail_n(t, &k, 2);
    assert_true(orb_rail_usable(t, &k));
    fail_n(t, &k, 1);
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_OPEN);
    orb_rail_table_free(t);
}

static void test_tent_recovered_rail_is_available_again(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 0);
    fail_n(t, &k, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    assert_int_equal(orb_rail_trial_posted(t, &k, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, token), 0);
    assert_true(orb_rail_usable(t, &k));
    orb_rail_table_free(t);
}

static void test_tent_fail_recover_fail_stays_available(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 0);
    fail_n(t, &k, 1);
    orb_rail_record_success(t, &k);
    fail_n(t, &k, 1);
    assert_true(orb_rail_usable(t, &k));
    /* A success forgets the failures before it (TENT's markRecovered): 2 + 2 never opens. */
    fail_n(t, &k, 1);
    orb_rail_record_success(t, &k);
    assert_int_equal(info_of(t, &k).recent_failures, 0);
    fail_n(t, &k, 2);
    assert_true(orb_rail_usable(t, &k));
    fail_n(t, &k, 1);
    assert_false(orb_rail_usable(t, &k));
    orb_rail_table_free(t);
}

/* ---- window, cooldown and trials ------------------------------------------------------------------------- */

static void test_failures_count_only_inside_the_window(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 2, 5);
    /* At 0, 5 s and 10 s the first has aged out exactly at the third: still healthy. */
    fail_n(t, &k, 1);
    fake_clock_advance(&fclock, 5 * SEC);
    fail_n(t, &k, 1);
    fake_clock_advance(&fclock, 5 * SEC);
    fail_n(t, &k, 1);
    assert_true(orb_rail_usable(t, &k));
    assert_int_equal(info_of(t, &k).recent_failures, 2);
    /* One more inside ten seconds of the 5 s one opens it. */
    fake_clock_advance(&fclock, 5 * SEC - 1);
    fail_n(t, &k, 1);
    assert_false(orb_rail_usable(t, &k));
    orb_rail_table_free(t);
}

static void test_cooldown_then_one_trial(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 1);
    uint64_t token = 0, other = 0;
    fail_n(t, &k, 3);
    uint64_t opened = atomic_load(&fclock.now);
    struct orb_rail_pair_info info = info_of(t, &k);
    assert_int_equal(info.resume_ns, opened + 30 * SEC);
    assert_int_equal(info.cooldown_ns, 30 * SEC);

    fake_clock_advance(&fclock, 30 * SEC - 1);
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), ORB_EAGAIN);
    assert_non_null(strstr(orb_last_error(), "cooldown"));
    assert_false(orb_rail_usable(t, &k)); /* expiry alone does not reopen */
    fake_clock_advance(&fclock, 1);
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    assert_int_not_equal(token, 0);
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_TRIAL);
    /* Only one trial at a time. */
    assert_int_equal(orb_rail_trial_begin(t, &k, &other), ORB_EBUSY);
    assert_int_equal(other, 0);
    assert_false(orb_rail_usable(t, &k)); /* the trial runs; ordinary traffic still waits */
    /* Healthy pairs have no trials. */
    struct orb_rail_key healthy = pair(1, 0, 2);
    assert_int_equal(orb_rail_trial_begin(t, &healthy, &other), ORB_EINVAL);
    orb_rail_table_free(t);
}

static void test_failed_trials_double_the_cooldown_up_to_the_cap(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 3, 3);
    fail_n(t, &k, 3);
    const uint64_t want[] = {60, 120, 240, 300, 300};
    uint64_t cooldown = 30 * SEC;
    for (int i = 0; i < 5; i++) {
        fake_clock_advance(&fclock, cooldown);
        uint64_t token = 0;
        assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
        assert_int_equal(orb_rail_trial_posted(t, &k, token), 0);
        assert_int_equal(orb_rail_trial_failed(t, &k, token), 0);
        struct orb_rail_pair_info info = info_of(t, &k);
        assert_int_equal(info.state, ORB_RAIL_OPEN);
        assert_int_equal(info.cooldown_ns, want[i] * SEC);
        assert_int_equal(info.resume_ns, atomic_load(&fclock.now) + want[i] * SEC);
        /* The old token is finished. */
        assert_int_equal(orb_rail_trial_failed(t, &k, token), ORB_ESTALE);
        cooldown = want[i] * SEC;
        fake_clock_advance(&fclock, cooldown - 1);
        assert_int_equal(orb_rail_trial_begin(t, &k, &token), ORB_EAGAIN);
        fake_clock_set(&fclock, atomic_load(&fclock.now) - (cooldown - 1));
    }
    /* Recovery resets the cooldown: the next opening pauses for the base 30 s again. */
    fake_clock_advance(&fclock, 300 * SEC);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    assert_int_equal(orb_rail_trial_posted(t, &k, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, token), 0);
    fail_n(t, &k, 3);
    assert_int_equal(info_of(t, &k).cooldown_ns, 30 * SEC);
    orb_rail_table_free(t);
}

/* A trial admitted but never posted proved nothing: its "receipt" cannot reopen the pair. */
static void test_an_unposted_trial_cannot_reopen(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 2, 3);
    fail_n(t, &k, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, token), ORB_EINVAL);
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_TRIAL);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.recoveries, 0);
    /* Still the current trial: cancelling it works, and a posted one then reopens. */
    assert_int_equal(orb_rail_trial_cancel(t, &k, token), 0);
    fake_clock_advance(&fclock, 30 * SEC);
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    assert_int_equal(orb_rail_trial_posted(t, &k, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, token), 0);
    assert_true(orb_rail_usable(t, &k));
    orb_rail_table_free(t);
}

static void test_only_the_current_trial_reopens(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 4, 4), other_pair = pair(1, 4, 5);
    fail_n(t, &k, 3);
    /* A late positive receipt of an attempt from before the pause proves nothing. */
    orb_rail_record_success(t, &k);
    assert_false(orb_rail_usable(t, &k));
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t first = 0, second = 0, foreign = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &first), 0);
    orb_rail_record_success(t, &k); /* ordinary late success during the trial */
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(orb_rail_trial_cancel(t, &k, first), 0);
    fake_clock_advance(&fclock, 1 * SEC);
    assert_int_equal(orb_rail_trial_begin(t, &k, &second), 0);
    assert_int_not_equal(first, second);
    /* The cancelled trial's receipt, a made-up token and another pair's token are stale. */
    assert_int_equal(orb_rail_trial_succeeded(t, &k, first), ORB_ESTALE);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, 0), ORB_ESTALE);
    fail_n(t, &other_pair, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    assert_int_equal(orb_rail_trial_begin(t, &other_pair, &foreign), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, foreign), ORB_ESTALE);
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_TRIAL);
    /* The current trial's receipt reopens; a late failure verdict afterwards is stale. */
    assert_int_equal(orb_rail_trial_posted(t, &k, second), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, second), 0);
    assert_true(orb_rail_usable(t, &k));
    assert_int_equal(orb_rail_trial_failed(t, &k, second), ORB_ESTALE);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, second), ORB_ESTALE);
    assert_true(orb_rail_usable(t, &k));
    orb_rail_table_free(t);
}

static void test_early_failures_leave_the_cooldown_intact(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 0);
    fail_n(t, &k, 3);
    struct orb_rail_pair_info before = info_of(t, &k);
    fake_clock_advance(&fclock, 10 * SEC);
    fail_n(t, &k, 5); /* stragglers from work posted before the pause */
    struct orb_rail_pair_info after = info_of(t, &k);
    assert_int_equal(after.resume_ns, before.resume_ns);
    assert_int_equal(after.cooldown_ns, before.cooldown_ns);
    /* During a trial, an ordinary failure is not the trial's verdict either. */
    fake_clock_advance(&fclock, 20 * SEC);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &token), 0);
    fail_n(t, &k, 1);
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_TRIAL);
    assert_int_equal(orb_rail_trial_posted(t, &k, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &k, token), 0);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.errors, 9);
    orb_rail_table_free(t);
}

static void test_cancel_returns_the_slot_and_posted_trials_cannot_be_cancelled(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key k = pair(1, 0, 0);
    fail_n(t, &k, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t a = 0, b = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &a), 0);
    assert_int_equal(orb_rail_trial_cancel(t, &k, a), 0);
    assert_int_equal(info_of(t, &k).state, ORB_RAIL_OPEN);
    assert_int_equal(orb_rail_trial_cancel(t, &k, a), ORB_ESTALE);
    /* The slot is back, after the probe interval since that admission. */
    fake_clock_advance(&fclock, 1 * SEC - 1);
    assert_int_equal(orb_rail_trial_begin(t, &k, &b), ORB_EAGAIN);
    assert_non_null(strstr(orb_last_error(), "probe interval"));
    fake_clock_advance(&fclock, 1);
    assert_int_equal(orb_rail_trial_begin(t, &k, &b), 0);
    assert_int_equal(orb_rail_trial_posted(t, &k, b), 0);
    assert_int_equal(orb_rail_trial_posted(t, &k, b), 0); /* idempotent: one probe */
    assert_int_equal(orb_rail_trial_cancel(t, &k, b), ORB_EBUSY);
    assert_true(info_of(t, &k).trial_posted);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.probes, 1); /* the cancelled trial was never a probe */
    assert_int_equal(orb_rail_trial_posted(t, &k, a), ORB_ESTALE);
    orb_rail_table_free(t);
}

static void test_zero_probe_interval_and_zero_cooldown(void **state)
{
    (void)state;
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    cfg.probe_interval_ns = 0;
    struct orb_rail_table *t = table_with(&cfg);
    struct orb_rail_key k = pair(1, 0, 0);
    fail_n(t, &k, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t a = 0, b = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k, &a), 0);
    assert_int_equal(orb_rail_trial_cancel(t, &k, a), 0);
    assert_int_equal(orb_rail_trial_begin(t, &k, &b), 0); /* at once */
    orb_rail_table_free(t);

    cfg.cooldown_ns = 0;
    t = table_with(&cfg);
    fail_n(t, &k, 3);
    assert_false(orb_rail_usable(t, &k));
    assert_int_equal(orb_rail_trial_begin(t, &k, &a), 0); /* no cooldown to wait for */
    assert_int_equal(orb_rail_trial_failed(t, &k, a), 0);
    assert_int_equal(info_of(t, &k).cooldown_ns, 0);   /* doubling zero stays zero */
    assert_int_equal(orb_rail_trial_begin(t, &k, &b), 0);
    orb_rail_table_free(t);
}

static void test_mask_lookups_never_arm_a_probe(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_epoch peer = epoch_of(7), other = epoch_of(8);
    uint16_t remote_of_local[ORB_RAIL_MAX_NICS];
    for (int i = 0; i < ORB_RAIL_MAX_NICS; i++)
        remote_of_local[i] = (uint16_t)(i + 100);
    const uint64_t all = 0xffull | 1ull << 63;
    assert_int_equal(orb_rail_usable_mask(t, &peer, all, remote_of_local), all);
    struct orb_rail_key k2 = {.peer = peer, .local_nic = 2, .remote_nic = 102};
    struct orb_rail_key k63 = {.peer = peer, .local_nic = 63, .remote_nic = 163};
    fail_n(t, &k2, 3);
    fail_n(t, &k63, 3);
    assert_int_equal(orb_rail_usable_mask(t, &peer, all, remote_of_local),
                     all & ~(1ull << 2) & ~(1ull << 63));
    /* Another peer epoch, or another remote NIC for local 2, is a different pair. */
    assert_int_equal(orb_rail_usable_mask(t, &other, all, remote_of_local), all);
    remote_of_local[2] = 5;
    assert_int_equal(orb_rail_usable_mask(t, &peer, 1ull << 2, remote_of_local), 1ull << 2);
    remote_of_local[2] = 102;

    /* Past the cooldown, lookups still exclude the pair and admit no trial. */
    fake_clock_advance(&fclock, 31 * SEC);
    for (int i = 0; i < 10; i++) {
        assert_int_equal(orb_rail_usable_mask(t, &peer, all, remote_of_local) & (1ull << 2), 0);
        assert_false(orb_rail_usable(t, &k2));
    }
    assert_int_equal(info_of(t, &k2).state, ORB_RAIL_OPEN);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.probes, 0);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &k2, &token), 0); /* the slot is still free */
    assert_int_equal(orb_rail_usable_mask(t, &peer, 0, remote_of_local), 0);
    assert_int_equal(orb_rail_usable_mask(t, NULL, all, remote_of_local), 0);
    orb_rail_table_free(t);
}

static void test_stats_and_nic_stats(void **state)
{
    (void)state;
    struct orb_rail_table *t = default_table();
    struct orb_rail_key a = pair(1, 5, 0), b = pair(1, 5, 1), c = pair(2, 6, 0);
    fail_n(t, &a, 3);
    fail_n(t, &b, 3);
    fail_n(t, &c, 1);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.errors, 7);
    assert_int_equal(st.open_pairs, 2);
    assert_int_equal(st.pairs, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t ta = 0, tb = 0;
    assert_int_equal(orb_rail_trial_begin(t, &a, &ta), 0);
    assert_int_equal(orb_rail_trial_posted(t, &a, ta), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &a, ta), 0);
    assert_int_equal(orb_rail_trial_begin(t, &b, &tb), 0);
    assert_int_equal(orb_rail_trial_posted(t, &b, tb), 0);
    assert_int_equal(orb_rail_trial_failed(t, &b, tb), 0);
    orb_rail_stats(t, &st);
    assert_int_equal(st.errors, 8);
    assert_int_equal(st.open_pairs, 1);
    assert_int_equal(st.probes, 2);
    assert_int_equal(st.recoveries, 1);
    struct orb_rail_nic_stats n5, n6, n0;
    assert_int_equal(orb_rail_nic_stats(t, 5, &n5), 0);
    assert_int_equal(orb_rail_nic_stats(t, 6, &n6), 0);
    assert_int_equal(orb_rail_nic_stats(t, 0, &n0), 0);
    assert_int_equal(n5.errors, 7);
    assert_int_equal(n5.probes, 2);
    assert_int_equal(n5.open_pairs, 1);
    assert_int_equal(n6.errors, 1);
    assert_int_equal(n6.open_pairs, 0);
    assert_int_equal(n0.errors, 0);
    /* Forgetting a peer drops its pairs, paused ones included. */
    assert_int_equal(orb_rail_forget_peer(t, &a.peer), 2);
    orb_rail_stats(t, &st);
    assert_int_equal(st.open_pairs, 0);
    assert_int_equal(st.pairs, 1);
    assert_true(orb_rail_usable(t, &b));
    assert_int_equal(orb_rail_nic_stats(t, 5, &n5), 0);
    assert_int_equal(n5.open_pairs, 0);
    orb_rail_table_free(t);
}

/* ---- the bounded table ---------------------------------------------------------------------------------- */

static void test_full_table_keeps_active_and_unproven_pairs(void **state)
{
    (void)state;
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    cfg.max_rail_pairs = 3;
    struct orb_rail_table *t = table_with(&cfg);
    struct orb_rail_key open = pair(1, 0, 0), trial = pair(1, 1, 0), unproven = pair(1, 2, 0);
    struct orb_rail_key newcomer = pair(2, 3, 0);
    fail_n(t, &open, 3);
    fail_n(t, &trial, 3);
    fake_clock_advance(&fclock, 30 * SEC);
    uint64_t token = 0;
    assert_int_equal(orb_rail_trial_begin(t, &trial, &token), 0);
    fail_n(t, &unproven, 1);

    assert_int_equal(orb_rail_record_failure(t, &newcomer), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "max_rail_pairs"));
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.pairs, 3);
    assert_int_equal(st.errors, 7); /* the refused failure is not tracked */
    assert_int_equal(info_of(t, &newcomer).state, ORB_RAIL_HEALTHY);
    /* Successes and lookups never need an entry. */
    orb_rail_record_success(t, &newcomer);
    assert_true(orb_rail_usable(t, &newcomer));

    /* Once the unproven pair's failure leaves the window it is idle and evictable; the open
     * pair and the pair in trial are kept however old. */
    fake_clock_advance(&fclock, 10 * SEC);
    assert_int_equal(orb_rail_record_failure(t, &newcomer), 0);
    assert_int_equal(info_of(t, &newcomer).recent_failures, 1);
    assert_int_equal(info_of(t, &open).state, ORB_RAIL_OPEN);
    assert_int_equal(info_of(t, &trial).state, ORB_RAIL_TRIAL);
    assert_int_equal(info_of(t, &unproven).recent_failures, 0); /* evicted: no memory left */
    assert_int_equal(orb_rail_trial_posted(t, &trial, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &trial, token), 0);

    /* A recovered pair is healthy and idle: the next newcomer may take its entry. */
    struct orb_rail_key third = pair(3, 4, 0);
    assert_int_equal(orb_rail_record_failure(t, &third), 0);
    assert_int_equal(info_of(t, &open).state, ORB_RAIL_OPEN);
    assert_int_equal(info_of(t, &newcomer).recent_failures, 1);
    orb_rail_stats(t, &st);
    assert_int_equal(st.pairs, 3);
    assert_int_equal(st.open_pairs, 1);
    orb_rail_table_free(t);
}

static void test_eviction_takes_idle_pairs_until_all_are_paused(void **state)
{
    (void)state;
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    cfg.max_rail_pairs = 2;
    cfg.error_threshold = 1;
    cfg.cooldown_ns = 0;
    cfg.probe_interval_ns = 0;
    struct orb_rail_table *t = table_with(&cfg);
    struct orb_rail_key a = pair(1, 0, 0), b = pair(1, 1, 0), c = pair(1, 2, 0);
    uint64_t token = 0;
    /* a and b open and recover: healthy, idle entries. */
    fail_n(t, &a, 1);
    assert_int_equal(orb_rail_trial_begin(t, &a, &token), 0);
    assert_int_equal(orb_rail_trial_posted(t, &a, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &a, token), 0);
    fail_n(t, &b, 1);
    assert_int_equal(orb_rail_trial_begin(t, &b, &token), 0);
    assert_int_equal(orb_rail_trial_posted(t, &b, token), 0);
    assert_int_equal(orb_rail_trial_succeeded(t, &b, token), 0);
    /* c takes an idle entry and opens; a gets one too (existing or evicting the idle one). */
    fail_n(t, &c, 1);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    assert_int_equal(st.pairs, 2);
    assert_int_equal(info_of(t, &c).state, ORB_RAIL_OPEN);
    assert_int_equal(orb_rail_record_failure(t, &a), 0);
    assert_int_equal(info_of(t, &c).state, ORB_RAIL_OPEN);
    assert_int_equal(info_of(t, &a).state, ORB_RAIL_OPEN);
    /* Both entries paused: nothing can be evicted, and nothing already held was lost. */
    assert_int_equal(orb_rail_record_failure(t, &b), ORB_ERESOURCE);
    assert_int_equal(info_of(t, &b).state, ORB_RAIL_HEALTHY);
    orb_rail_stats(t, &st);
    assert_int_equal(st.open_pairs, 2);
    orb_rail_table_free(t);
}

/* ---- concurrency ------------------------------------------------------------------------------------------ */

struct worker_arg {
    struct orb_rail_table *t;
    int id;
};

static void *hammer(void *p)
{
    struct worker_arg *w = p;
    uint16_t remote_of_local[ORB_RAIL_MAX_NICS] = {0};
    struct orb_epoch peer = epoch_of(1);
    for (int i = 0; i < 3000; i++) {
        struct orb_rail_key k = pair(1, (uint16_t)((i + w->id) % 4), 0);
        switch ((i * 7 + w->id) % 6) {
        case 0:
        case 1:
            (void)orb_rail_record_failure(w->t, &k);
            break;
        case 2:
            orb_rail_record_success(w->t, &k);
            break;
        case 3: {
            uint64_t token = 0;
            if (orb_rail_trial_begin(w->t, &k, &token) == 0) {
                (void)orb_rail_trial_posted(w->t, &k, token);
                if (i % 2)
                    (void)orb_rail_trial_succeeded(w->t, &k, token);
                else
                    (void)orb_rail_trial_failed(w->t, &k, token);
            }
            break;
        }
        case 4:
            (void)orb_rail_usable_mask(w->t, &peer, 0xf, remote_of_local);
            break;
        default:
            fake_clock_advance(&fclock, 50 * MS);
            break;
        }
    }
    return NULL;
}

static void test_concurrent_use_keeps_counts_consistent(void **state)
{
    (void)state;
    struct orb_rail_config cfg;
    orb_rail_config_default(&cfg);
    cfg.cooldown_ns = 100 * MS;
    cfg.max_cooldown_ns = 400 * MS;
    cfg.probe_interval_ns = 0;
    cfg.max_rail_pairs = 3; /* four keys: the table is contended */
    struct orb_rail_table *t = table_with(&cfg);
    pthread_t th[4];
    struct worker_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (struct worker_arg){t, i};
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    struct orb_rail_stats st;
    orb_rail_stats(t, &st);
    uint64_t paused = 0;
    for (uint16_t n = 0; n < 4; n++) {
        struct orb_rail_key k = pair(1, n, 0);
        paused += info_of(t, &k).state != ORB_RAIL_HEALTHY;
        struct orb_rail_nic_stats ns;
        assert_int_equal(orb_rail_nic_stats(t, n, &ns), 0);
        assert_int_equal(ns.open_pairs, info_of(t, &k).state != ORB_RAIL_HEALTHY);
    }
    assert_int_equal(st.open_pairs, paused);
    assert_true(st.pairs <= 3);
    assert_true(st.errors > 0);
    assert_true(st.recoveries <= st.probes);
    orb_rail_table_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_config_is_validated, setup),
        cmocka_unit_test_setup(test_keys_are_checked, setup),
        cmocka_unit_test_setup(test_tent_three_failures_make_a_rail_unavailable, setup),
        cmocka_unit_test_setup(test_tent_recovered_rail_is_available_again, setup),
        cmocka_unit_test_setup(test_tent_fail_recover_fail_stays_available, setup),
        cmocka_unit_test_setup(test_failures_count_only_inside_the_window, setup),
        cmocka_unit_test_setup(test_cooldown_then_one_trial, setup),
        cmocka_unit_test_setup(test_failed_trials_double_the_cooldown_up_to_the_cap, setup),
        cmocka_unit_test_setup(test_an_unposted_trial_cannot_reopen, setup),
        cmocka_unit_test_setup(test_only_the_current_trial_reopens, setup),
        cmocka_unit_test_setup(test_early_failures_leave_the_cooldown_intact, setup),
        cmocka_unit_test_setup(test_cancel_returns_the_slot_and_posted_trials_cannot_be_cancelled,
                               setup),
        cmocka_unit_test_setup(test_zero_probe_interval_and_zero_cooldown, setup),
        cmocka_unit_test_setup(test_mask_lookups_never_arm_a_probe, setup),
        cmocka_unit_test_setup(test_stats_and_nic_stats, setup),
        cmocka_unit_test_setup(test_full_table_keeps_active_and_unproven_pairs, setup),
        cmocka_unit_test_setup(test_eviction_takes_idle_pairs_until_all_are_paused, setup),
        cmocka_unit_test_setup(test_concurrent_use_keeps_counts_consistent, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
