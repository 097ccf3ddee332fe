/* Priority tiers, promotion (TENT's head-only and per-entry vectors), deadline arbitration
 * (TENT's ordering vectors, the greedy prefix and the ranked backlog), admission, a random
 * model-checked property test, and a proof that dispatch allocates nothing. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <float.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "topo/qos.h"
#include "fake_clock.h"

/* ---- allocation counting (the link wraps malloc/calloc/realloc) ---------------------------- */

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t size);
void *__wrap_realloc(void *p, size_t n);

static atomic_long allocations;

void *__wrap_malloc(size_t n)
{
    atomic_fetch_add(&allocations, 1);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t size)
{
    atomic_fetch_add(&allocations, 1);
    return __real_calloc(n, size);
}

void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add(&allocations, 1);
    return __real_realloc(p, n);
}

/* ---- helpers ------------------------------------------------------------------------------------ */

static struct fake_clock fclock;

static void init_set(struct orb_qos_set *set, bool per_entry, uint64_t timeout)
{
    struct orb_qos_config cfg;
    orb_qos_config_default(&cfg);
    cfg.promotion_per_entry = per_entry;
    cfg.promotion_timeout_ns = timeout;
    assert_int_equal(orb_qos_set_init(set, &cfg, &fclock.clock), 0);
}

static void entry_init(struct orb_qos_entry *e, enum orb_qos_priority p)
{
    memset(e, 0, sizeof(*e));
    e->priority = (uint8_t)p;
}

static void enqueue_one(struct orb_qos_set *set, struct orb_qos_entry *e)
{
    assert_int_equal(orb_qos_enqueue(set, &e, 1), 0);
}

/* The entries of tier p, head first, must be exactly want[0..n). */
static void expect_tier(const struct orb_qos_set *set, enum orb_qos_priority p,
                        struct orb_qos_entry *const *want, size_t n)
{
    assert_int_equal(orb_qos_count(set, p), n);
    const struct orb_qos_entry *e = set->head[p];
    for (size_t i = 0; i < n; i++) {
        assert_ptr_equal(e, want[i]);
        assert_int_equal(e->priority, p);
        assert_int_equal(e->queued, 1);
        e = e->next;
    }
    assert_null(e);
    if (n)
        assert_ptr_equal(set->tail[p], want[n - 1]);
    else
        assert_null(set->tail[p]);
}

static int setup(void **state)
{
    (void)state;
    fake_clock_init(&fclock, 1 * SEC);
    return 0;
}

/* ---- queues ------------------------------------------------------------------------------------------ */

static void test_init_rejects_null(void **state)
{
    (void)state;
    struct orb_qos_set set;
    struct orb_qos_config cfg;
    orb_qos_config_default(&cfg);
    assert_int_equal(cfg.promotion_timeout_ns, 10 * MS);
    assert_false(cfg.promotion_per_entry);
    assert_int_equal(orb_qos_set_init(NULL, &cfg, &fclock.clock), ORB_EINVAL);
    assert_int_equal(orb_qos_set_init(&set, NULL, &fclock.clock), ORB_EINVAL);
    assert_int_equal(orb_qos_set_init(&set, &cfg, NULL), ORB_EINVAL);
    struct orb_clock broken = {NULL, NULL};
    assert_int_equal(orb_qos_set_init(&set, &cfg, &broken), ORB_EINVAL);
}

static void test_enqueue_rejects_bad_batches_whole(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    struct orb_qos_entry a, b, bad;
    entry_init(&a, ORB_PRIO_HIGH);
    entry_init(&b, ORB_PRIO_LOW);
    entry_init(&bad, ORB_PRIO_LOW);
    bad.priority = 3;

    struct orb_qos_entry *with_bad[] = {&a, &b, &bad};
    assert_int_equal(orb_qos_enqueue(&set, with_bad, 3), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "priority 3"));
    struct orb_qos_entry *with_null[] = {&a, NULL};
    assert_int_equal(orb_qos_enqueue(&set, with_null, 2), ORB_EINVAL);
    struct orb_qos_entry *repeated[] = {&a, &b, &a};
    assert_int_equal(orb_qos_enqueue(&set, repeated, 3), ORB_EBUSY);
    assert_int_equal(orb_qos_enqueue(&set, NULL, 1), ORB_EINVAL);
    assert_int_equal(orb_qos_enqueue(NULL, with_bad, 1), ORB_EINVAL);
    /* Nothing was linked and no entry was left marked. */
    for (int p = 0; p < ORB_QOS_NPRIO; p++)
        assert_int_equal(orb_qos_count(&set, (enum orb_qos_priority)p), 0);
    assert_int_equal(a.queued, 0);
    assert_int_equal(b.queued, 0);

    enqueue_one(&set, &a);
    assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&b, &a}, 2), ORB_EBUSY);
    assert_int_equal(b.queued, 0);
    assert_int_equal(orb_qos_requeue(&set, &a), ORB_EBUSY);
    assert_int_equal(orb_qos_requeue(&set, NULL), ORB_EINVAL);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&a}, 1);
    assert_int_equal(orb_qos_count(&set, ORB_PRIO_LOW), 0);
    assert_int_equal(orb_qos_enqueue(&set, NULL, 0), 0);
}

static void test_pop_order_is_tier_then_fifo(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    struct orb_qos_entry e[8];
    const enum orb_qos_priority prio[8] = {ORB_PRIO_LOW,  ORB_PRIO_HIGH, ORB_PRIO_MEDIUM,
                                           ORB_PRIO_HIGH, ORB_PRIO_LOW,  ORB_PRIO_MEDIUM,
                                           ORB_PRIO_HIGH, ORB_PRIO_LOW};
    struct orb_qos_entry *batch[8];
    for (int i = 0; i < 8; i++) {
        entry_init(&e[i], prio[i]);
        batch[i] = &e[i];
    }
    assert_int_equal(orb_qos_enqueue(&set, batch, 8), 0);
    for (int i = 0; i < 8; i++)
        assert_int_equal(e[i].enqueue_ns, 1 * SEC); /* one stamp for the batch */
    /* High in batch order, then Medium, then Low. */
    const int want[8] = {1, 3, 6, 2, 5, 0, 4, 7};
    for (int i = 0; i < 8; i++) {
        struct orb_qos_entry *got = orb_qos_pop(&set, ORB_QOS_ALL_TIERS);
        assert_ptr_equal(got, &e[want[i]]);
        assert_int_equal(got->queued, 0);
        assert_null(got->next);
    }
    assert_null(orb_qos_pop(&set, ORB_QOS_ALL_TIERS));
    assert_null(orb_qos_pop(NULL, ORB_QOS_ALL_TIERS));
}

/* A popped run of a tier, reordered and pushed back, goes in front of what stayed, in the new
 * order, keeping its age; a bad entry leaves the set as it was. */
static void test_push_front_restores_a_reordered_run(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    struct orb_qos_entry e[5], low;
    struct orb_qos_entry *all[5];
    for (int i = 0; i < 5; i++) {
        entry_init(&e[i], ORB_PRIO_HIGH);
        all[i] = &e[i];
    }
    entry_init(&low, ORB_PRIO_LOW);
    assert_int_equal(orb_qos_enqueue(&set, all, 5), 0);
    enqueue_one(&set, &low);
    fake_clock_set(&fclock, 2 * SEC);
    struct orb_qos_entry *run[3];
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, run, 3), 3);
    struct orb_qos_entry *reordered[3] = {run[2], run[0], run[1]};
    assert_int_equal(orb_qos_push_front(&set, reordered, 3), 0);
    struct orb_qos_entry *want[5] = {&e[2], &e[0], &e[1], &e[3], &e[4]};
    expect_tier(&set, ORB_PRIO_HIGH, want, 5);
    for (int i = 0; i < 5; i++)
        assert_int_equal(e[i].enqueue_ns, 1 * SEC); /* the age stays */
    struct orb_qos_entry *lows[1] = {&low};
    expect_tier(&set, ORB_PRIO_LOW, lows, 1);
    /* Into an empty tier: head and tail are set. */
    struct orb_qos_entry m;
    entry_init(&m, ORB_PRIO_MEDIUM);
    struct orb_qos_entry *one[1] = {&m};
    assert_int_equal(orb_qos_push_front(&set, one, 1), 0);
    expect_tier(&set, ORB_PRIO_MEDIUM, one, 1);
    /* Already queued, or a repeat: refused whole. */
    struct orb_qos_entry fresh;
    entry_init(&fresh, ORB_PRIO_HIGH);
    struct orb_qos_entry *bad[2] = {&fresh, &e[0]};
    assert_int_equal(orb_qos_push_front(&set, bad, 2), ORB_EBUSY);
    assert_int_equal(fresh.queued, 0);
    expect_tier(&set, ORB_PRIO_HIGH, want, 5);
    struct orb_qos_entry *twice[2] = {&fresh, &fresh};
    assert_int_equal(orb_qos_push_front(&set, twice, 2), ORB_EBUSY);
    assert_int_equal(fresh.queued, 0);
    assert_int_equal(orb_qos_push_front(NULL, twice, 1), ORB_EINVAL);
    assert_int_equal(orb_qos_push_front(&set, NULL, 1), ORB_EINVAL);
}

static void test_pop_honours_allowed_tiers(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    struct orb_qos_entry h1, h2, m1, l1, l2, l3;
    entry_init(&h1, ORB_PRIO_HIGH);
    entry_init(&h2, ORB_PRIO_HIGH);
    entry_init(&m1, ORB_PRIO_MEDIUM);
    entry_init(&l1, ORB_PRIO_LOW);
    entry_init(&l2, ORB_PRIO_LOW);
    entry_init(&l3, ORB_PRIO_LOW);
    assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&l1, &h1, &m1, &l2, &h2, &l3}, 6), 0);

    assert_null(orb_qos_pop(&set, 0));
    assert_null(orb_qos_peek(&set, 0));
    assert_null(orb_qos_peek(NULL, ORB_QOS_ALL_TIERS));
    assert_int_equal(orb_qos_total(&set), 6);
    assert_int_equal(orb_qos_total(NULL), 0);
    /* Peeking shows what a pop takes, and takes nothing. */
    assert_ptr_equal(orb_qos_peek(&set, ORB_QOS_ALL_TIERS), &h1);
    assert_ptr_equal(orb_qos_peek(&set, 1u << ORB_PRIO_LOW), &l1);
    assert_int_equal(orb_qos_total(&set), 6);
    assert_ptr_equal(orb_qos_pop(&set, 1u << ORB_PRIO_LOW), &l1);
    assert_int_equal(orb_qos_total(&set), 5);
    assert_ptr_equal(orb_qos_pop(&set, 1u << ORB_PRIO_MEDIUM | 1u << ORB_PRIO_LOW), &m1);

    /* A pass takes from the most urgent allowed tier only, up to max. */
    struct orb_qos_entry *out[4] = {0};
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, 1), 1);
    assert_ptr_equal(out[0], &h1);
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, 4), 1);
    assert_ptr_equal(out[0], &h2);
    assert_int_equal(orb_qos_pop_tier(&set, 1u << ORB_PRIO_HIGH, out, 4), 0);
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, 0), 0);
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, NULL, 4), 0);
    assert_int_equal(orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, 4), 2);
    assert_ptr_equal(out[0], &l2);
    assert_ptr_equal(out[1], &l3);
}

static void test_remove_head_middle_tail(void **state)
{
    (void)state;
    struct orb_qos_set set, other;
    init_set(&set, false, 10 * MS);
    init_set(&other, false, 10 * MS);
    struct orb_qos_entry e[4], stranger;
    for (int i = 0; i < 4; i++)
        entry_init(&e[i], ORB_PRIO_MEDIUM);
    entry_init(&stranger, ORB_PRIO_MEDIUM);
    assert_int_equal(orb_qos_remove(&set, &e[0]), ORB_ENOENT); /* not queued */
    assert_int_equal(orb_qos_remove(&set, NULL), ORB_EINVAL);
    assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&e[0], &e[1], &e[2], &e[3]}, 4), 0);
    enqueue_one(&other, &stranger);
    assert_int_equal(orb_qos_remove(&set, &stranger), ORB_ENOENT); /* queued elsewhere */
    assert_int_equal(stranger.queued, 1);

    assert_int_equal(orb_qos_remove(&set, &e[1]), 0);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&e[0], &e[2], &e[3]}, 3);
    assert_int_equal(orb_qos_remove(&set, &e[3]), 0);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&e[0], &e[2]}, 2);
    assert_int_equal(orb_qos_remove(&set, &e[0]), 0);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&e[2]}, 1);
    assert_int_equal(orb_qos_remove(&set, &e[2]), 0);
    expect_tier(&set, ORB_PRIO_MEDIUM, NULL, 0);
    assert_int_equal(e[2].queued, 0);
    /* The tail pointer was repaired: appending works. */
    enqueue_one(&set, &e[1]);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&e[1]}, 1);
}

/* A filter over entries tagged by their nic field: tags in `blocked` stay queued; the first
 * other tag seen is the one taken, and the walk stops at `stop_tag`. */
struct take_filter {
    uint16_t blocked, stop_tag;
    int chosen;   /* -1 until the first takeable entry */
    size_t asked; /* entries the filter was asked about */
};

static enum orb_qos_take take_filter(void *ctx, struct orb_qos_entry *e)
{
    struct take_filter *f = ctx;
    f->asked++;
    if (e->nic == f->stop_tag)
        return ORB_QOS_STOP;
    if (e->nic & f->blocked)
        return ORB_QOS_LEAVE;
    if (f->chosen < 0)
        f->chosen = e->nic;
    return e->nic == f->chosen ? ORB_QOS_TAKE : ORB_QOS_LEAVE;
}

static void test_take_where_skips_what_cannot_go(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    /* High: a1 b1 a2 b2 a3; Medium: b3; Low: c1. Tags: a=1, b=2, c=4. */
    struct orb_qos_entry a1, a2, a3, b1, b2, b3, c1;
    struct orb_qos_entry *all[] = {&a1, &b1, &a2, &b2, &a3};
    for (int i = 0; i < 5; i++) {
        entry_init(all[i], ORB_PRIO_HIGH);
        all[i]->nic = all[i] == &a1 || all[i] == &a2 || all[i] == &a3 ? 1 : 2;
    }
    entry_init(&b3, ORB_PRIO_MEDIUM);
    b3.nic = 2;
    entry_init(&c1, ORB_PRIO_LOW);
    c1.nic = 4;
    assert_int_equal(orb_qos_enqueue(&set, all, 5), 0);
    enqueue_one(&set, &b3);
    enqueue_one(&set, &c1);

    struct orb_qos_entry *out[8] = {0};
    assert_int_equal(orb_qos_take_where(NULL, ORB_QOS_ALL_TIERS, take_filter, NULL, out, 8), 0);
    assert_int_equal(orb_qos_take_where(&set, ORB_QOS_ALL_TIERS, NULL, NULL, out, 8), 0);

    /* Tag a blocked at the head: b's entries go past it, in order, across tiers; a's stay in
     * their places, and the walk ends at max. */
    struct take_filter f = {.blocked = 1, .stop_tag = 0xffff, .chosen = -1};
    assert_int_equal(orb_qos_take_where(&set, ORB_QOS_ALL_TIERS, take_filter, &f, out, 2), 2);
    assert_ptr_equal(out[0], &b1);
    assert_ptr_equal(out[1], &b2);
    assert_int_equal(b1.queued, 0);
    assert_null(b2.next);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&a1, &a2, &a3}, 3);
    assert_int_equal(orb_qos_take_where(&set, ORB_QOS_ALL_TIERS, take_filter, &f, out, 8), 1);
    assert_ptr_equal(out[0], &b3);
    expect_tier(&set, ORB_PRIO_MEDIUM, NULL, 0);

    /* Allowed tiers are honoured; a STOP ends the walk with the entry still queued. */
    f = (struct take_filter){.blocked = 0, .stop_tag = 0xffff, .chosen = -1};
    assert_int_equal(orb_qos_take_where(&set, 1u << ORB_PRIO_LOW, take_filter, &f, out, 8), 1);
    assert_ptr_equal(out[0], &c1);
    expect_tier(&set, ORB_PRIO_LOW, NULL, 0);
    f = (struct take_filter){.blocked = 0, .stop_tag = 1, .chosen = -1};
    assert_int_equal(orb_qos_take_where(&set, ORB_QOS_ALL_TIERS, take_filter, &f, out, 8), 0);
    assert_int_equal(f.asked, 1);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&a1, &a2, &a3}, 3);

    /* Taking the tail repairs the tail pointer; taking everything empties the tier. */
    f = (struct take_filter){.blocked = 0, .stop_tag = 0xffff, .chosen = -1};
    assert_int_equal(orb_qos_take_where(&set, ORB_QOS_ALL_TIERS, take_filter, &f, out, 8), 3);
    assert_ptr_equal(out[0], &a1);
    assert_ptr_equal(out[2], &a3);
    expect_tier(&set, ORB_PRIO_HIGH, NULL, 0);
    assert_int_equal(orb_qos_total(&set), 0);
    enqueue_one(&set, &a2);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&a2}, 1);
}

/* ---- promotion ----------------------------------------------------------------------------------------- */

#define TENT_TIMEOUT 10000ull   /* TENT's promotion_policy_test units */
#define TENT_NOW 1000000ull

/* Queue three Medium entries with the given enqueue stamps, run one pass at TENT_NOW. */
static void tent_promotion_case(bool per_entry, const uint64_t stamps[3], const int *want_high,
                                size_t nwant)
{
    struct orb_qos_set set;
    init_set(&set, per_entry, TENT_TIMEOUT);
    struct orb_qos_entry e[3];
    for (int i = 0; i < 3; i++) {
        entry_init(&e[i], ORB_PRIO_MEDIUM);
        e[i].enqueue_ns = stamps[i];
        assert_int_equal(orb_qos_requeue(&set, &e[i]), 0);
        assert_int_equal(e[i].enqueue_ns, stamps[i]); /* requeue keeps the age */
    }
    fake_clock_set(&fclock, TENT_NOW);
    assert_int_equal(orb_qos_promote(&set), nwant);
    struct orb_qos_entry *high[3], *rest[3];
    size_t nrest = 0;
    for (size_t i = 0; i < nwant; i++)
        high[i] = &e[want_high[i]];
    for (int i = 0; i < 3; i++) {
        bool promoted = false;
        for (size_t j = 0; j < nwant; j++)
            promoted |= want_high[j] == i;
        if (!promoted)
            rest[nrest++] = &e[i];
        assert_int_equal(e[i].enqueue_ns, stamps[i]); /* original age kept */
    }
    expect_tier(&set, ORB_PRIO_HIGH, high, nwant);
    expect_tier(&set, ORB_PRIO_MEDIUM, rest, nrest);
}

static void test_tent_vector_head_timed_out(void **state)
{
    (void)state;
    const uint64_t timed_out = TENT_NOW - TENT_TIMEOUT - 1, fresh = TENT_NOW - 1;
    const uint64_t q[3] = {timed_out, fresh, fresh};
    tent_promotion_case(false, q, (const int[]){0, 1, 2}, 3); /* head-only: the whole tier */
    tent_promotion_case(true, q, (const int[]){0}, 1);        /* per-entry: just the head */
}

static void test_tent_vector_tail_timed_out(void **state)
{
    (void)state;
    const uint64_t timed_out = TENT_NOW - TENT_TIMEOUT - 1, fresh = TENT_NOW - 1;
    const uint64_t q[3] = {fresh, timed_out, timed_out};
    tent_promotion_case(false, q, NULL, 0);                /* head-only: none */
    tent_promotion_case(true, q, (const int[]){1, 2}, 2);  /* per-entry: exactly 1 and 2 */
}

static void test_tent_vector_all_timed_out_and_zero_stamps(void **state)
{
    (void)state;
    const uint64_t timed_out = TENT_NOW - TENT_TIMEOUT - 1;
    const uint64_t all[3] = {timed_out, timed_out, timed_out};
    tent_promotion_case(false, all, (const int[]){0, 1, 2}, 3);
    tent_promotion_case(true, all, (const int[]){0, 1, 2}, 3);
    const uint64_t zero[3] = {0, 0, 0};
    tent_promotion_case(false, zero, NULL, 0);
    tent_promotion_case(true, zero, NULL, 0);
    /* A zero stamp at the head blocks head-only even with aged entries behind it. */
    const uint64_t zero_head[3] = {0, timed_out, timed_out};
    tent_promotion_case(false, zero_head, NULL, 0);
    tent_promotion_case(true, zero_head, (const int[]){1, 2}, 2);
}

static void test_promotion_boundary_and_clock_order(void **state)
{
    (void)state;
    /* Age exactly the timeout promotes; one nanosecond less does not; a stamp after now
     * (a clock read out of order) never does. */
    const uint64_t at = TENT_NOW - TENT_TIMEOUT, below = TENT_NOW - TENT_TIMEOUT + 1;
    tent_promotion_case(true, (const uint64_t[]){below, at, TENT_NOW + 5}, (const int[]){1}, 1);
}

static void test_promotion_rate_limit_and_one_tier_per_pass(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 10 * MS);
    struct orb_qos_entry high, med, low;
    entry_init(&high, ORB_PRIO_HIGH);
    entry_init(&med, ORB_PRIO_MEDIUM);
    entry_init(&low, ORB_PRIO_LOW);
    fake_clock_set(&fclock, 100 * MS);
    assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&high, &med, &low}, 3), 0);

    /* The first pass runs at once (nothing aged), and sets the next check 1 ms later. */
    assert_int_equal(orb_qos_promote(&set), 0);
    fake_clock_set(&fclock, 109 * MS);
    assert_int_equal(orb_qos_promote(&set), 0); /* not aged yet (9 ms) */
    fake_clock_set(&fclock, 110 * MS);
    /* Both tiers aged, but only Medium -> High moves in this pass. */
    assert_int_equal(orb_qos_promote(&set), 1);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&high, &med}, 2);
    expect_tier(&set, ORB_PRIO_LOW, (struct orb_qos_entry *[]){&low}, 1);
    /* Checked at most once per millisecond. */
    fake_clock_set(&fclock, 111 * MS - 1);
    assert_int_equal(orb_qos_promote(&set), 0);
    expect_tier(&set, ORB_PRIO_LOW, (struct orb_qos_entry *[]){&low}, 1);
    fake_clock_set(&fclock, 111 * MS);
    assert_int_equal(orb_qos_promote(&set), 1);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&low}, 1);
    /* Its original age carries into Medium: the next pass moves it on to High. */
    fake_clock_set(&fclock, 112 * MS);
    assert_int_equal(orb_qos_promote(&set), 1);
    expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&high, &med, &low}, 3);
    assert_int_equal(low.enqueue_ns, 100 * MS);
    assert_int_equal(set.promoted, 3);
}

static void test_promoted_entries_join_the_tail_in_order(void **state)
{
    (void)state;
    for (int per_entry = 0; per_entry < 2; per_entry++) {
        struct orb_qos_set set;
        init_set(&set, per_entry, 10 * MS);
        struct orb_qos_entry m1, m2, h1, h2;
        entry_init(&m1, ORB_PRIO_MEDIUM);
        entry_init(&m2, ORB_PRIO_MEDIUM);
        entry_init(&h1, ORB_PRIO_HIGH);
        entry_init(&h2, ORB_PRIO_HIGH);
        fake_clock_set(&fclock, 50 * MS);
        assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&m1, &m2}, 2), 0);
        fake_clock_set(&fclock, 55 * MS);
        assert_int_equal(orb_qos_enqueue(&set, (struct orb_qos_entry *[]){&h1, &h2}, 2), 0);
        fake_clock_set(&fclock, 60 * MS);
        assert_int_equal(orb_qos_promote(&set), 2);
        expect_tier(&set, ORB_PRIO_HIGH, (struct orb_qos_entry *[]){&h1, &h2, &m1, &m2}, 4);
        expect_tier(&set, ORB_PRIO_MEDIUM, NULL, 0);
        /* The emptied tier still appends correctly. */
        struct orb_qos_entry m3;
        entry_init(&m3, ORB_PRIO_MEDIUM);
        enqueue_one(&set, &m3);
        expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&m3}, 1);
    }
}

static void test_per_entry_keeps_fresh_entries_linked(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, true, 10 * MS);
    struct orb_qos_entry e[5];
    const uint64_t stamps[5] = {1 * MS, 30 * MS, 2 * MS, 3 * MS, 30 * MS};
    for (int i = 0; i < 5; i++) {
        entry_init(&e[i], ORB_PRIO_LOW);
        e[i].enqueue_ns = stamps[i];
        assert_int_equal(orb_qos_requeue(&set, &e[i]), 0);
    }
    fake_clock_set(&fclock, 35 * MS);
    assert_int_equal(orb_qos_promote(&set), 3);
    expect_tier(&set, ORB_PRIO_MEDIUM, (struct orb_qos_entry *[]){&e[0], &e[2], &e[3]}, 3);
    expect_tier(&set, ORB_PRIO_LOW, (struct orb_qos_entry *[]){&e[1], &e[4]}, 2);
}

static void test_zero_timeout_disables_aging(void **state)
{
    (void)state;
    struct orb_qos_set set;
    init_set(&set, false, 0);
    struct orb_qos_entry low;
    entry_init(&low, ORB_PRIO_LOW);
    enqueue_one(&set, &low);
    fake_clock_advance(&fclock, 1000 * SEC);
    assert_int_equal(orb_qos_promote(&set), 0);
    expect_tier(&set, ORB_PRIO_LOW, (struct orb_qos_entry *[]){&low}, 1);
    assert_int_equal(orb_qos_promote(NULL), 0);
}

/* ---- DeadlineMlu and arbitration (TENT's bw_arbitration_test vectors) ---------------------------------- */

#define ARB_NOW 1000000000ull   /* 1 s */
#define ARB_BW 1e9              /* 1 GB/s: one byte per nanosecond */

static void assert_double_eq(double got, double want)
{
    if (!(fabs(got - want) <= 1e-12 * fabs(want) + 1e-15))
        fail_msg("got %.17g, want %.17g", got, want);
}

static void test_deadline_mlu_values(void **state)
{
    (void)state;
    assert_double_eq(orb_qos_deadline_mlu(0, 16, ARB_NOW + 32, ARB_NOW, ARB_BW), 0.5);
    assert_double_eq(orb_qos_deadline_mlu(16, 16, ARB_NOW + 32, ARB_NOW, ARB_BW), 1.0);
    assert_double_eq(orb_qos_deadline_mlu(64, 0, ARB_NOW + 32, ARB_NOW, ARB_BW), 2.0);
    assert_true(orb_qos_deadline_mlu(0, 16, 0, ARB_NOW, ARB_BW) == 0.0);
    assert_true(orb_qos_deadline_mlu(0, 16, UINT64_MAX, ARB_NOW, ARB_BW) == 0.0);
    assert_true(orb_qos_deadline_mlu(0, 16, ARB_NOW + 32, ARB_NOW, 0.0) == 0.0);
    assert_true(orb_qos_deadline_mlu(0, 16, ARB_NOW + 32, ARB_NOW, -1.0) == 0.0);
    assert_true(orb_qos_deadline_mlu(0, 16, ARB_NOW + 32, ARB_NOW, NAN) == 0.0);
    assert_true(orb_qos_deadline_mlu(0, 16, ARB_NOW, ARB_NOW, ARB_BW) == DBL_MAX);
    assert_true(orb_qos_deadline_mlu(0, 16, ARB_NOW - 1, ARB_NOW, ARB_BW) == DBL_MAX);
}

struct flows {
    struct orb_qos_entry e[80];
    struct orb_qos_entry *cands[80];
    size_t n;
};

static void flow_add(struct flows *f, uint64_t deadline, uint64_t len)
{
    struct orb_qos_entry *e = &f->e[f->n];
    entry_init(e, ORB_PRIO_MEDIUM);
    e->deadline_ns = deadline;
    e->bytes = len;
    e->nic = 3;
    f->cands[f->n] = e;
    f->n++;
}

static void flow_window(struct flows *f, uint64_t window, uint64_t len)
{
    flow_add(f, ARB_NOW + window, len);
}

/* Arbitrate and compare the resulting order with original indices want[0..n). */
static void expect_order(struct orb_qos_arbiter *arb, struct flows *f, uint64_t ahead, double bw,
                         const int *want)
{
    assert_int_equal(orb_qos_arbitrate(arb, f->cands, f->n, ahead, bw, ARB_NOW), 0);
    for (size_t i = 0; i < f->n; i++)
        if (f->cands[i] != &f->e[want[i]])
            fail_msg("slot %zu holds flow %td, want %d", i, f->cands[i] - f->e, want[i]);
}

static int arbiter_setup(void **state)
{
    struct orb_qos_arbiter *arb = NULL;
    assert_int_equal(orb_qos_arbiter_new(128, &arb), 0);
    *state = arb;
    return 0;
}

static int arbiter_teardown(void **state)
{
    orb_qos_arbiter_free(*state);
    return 0;
}

static void test_arbiter_rejects(void **state)
{
    struct orb_qos_arbiter *arb = *state, *none = NULL;
    assert_int_equal(orb_qos_arbiter_new(0, &none), ORB_EINVAL);
    assert_int_equal(orb_qos_arbiter_new((1u << 20) + 1, &none), ORB_EINVAL);
    assert_int_equal(orb_qos_arbiter_new(4, NULL), ORB_EINVAL);
    assert_null(none);
    orb_qos_arbiter_free(NULL);

    struct orb_qos_arbiter *small = NULL;
    assert_int_equal(orb_qos_arbiter_new(2, &small), 0);
    struct flows f = {.n = 0};
    flow_window(&f, 1000, 10);
    flow_window(&f, 10, 10);
    flow_window(&f, 1, 10);
    assert_int_equal(orb_qos_arbitrate(small, f.cands, 3, 0, ARB_BW, ARB_NOW), ORB_ERESOURCE);
    assert_ptr_equal(f.cands[0], &f.e[0]);
    orb_qos_arbiter_free(small);

    f.e[1].nic = 4; /* another NIC */
    assert_int_equal(orb_qos_arbitrate(arb, f.cands, 3, 0, ARB_BW, ARB_NOW), ORB_EINVAL);
    f.e[1].nic = 3;
    f.e[2].priority = ORB_PRIO_HIGH; /* another tier */
    assert_int_equal(orb_qos_arbitrate(arb, f.cands, 3, 0, ARB_BW, ARB_NOW), ORB_EINVAL);
    for (int i = 0; i < 3; i++)
        assert_ptr_equal(f.cands[i], &f.e[i]); /* unchanged on error */
    f.cands[1] = NULL;
    assert_int_equal(orb_qos_arbitrate(arb, f.cands, 3, 0, ARB_BW, ARB_NOW), ORB_EINVAL);
    assert_int_equal(orb_qos_arbitrate(NULL, f.cands, 3, 0, ARB_BW, ARB_NOW), ORB_EINVAL);
    assert_int_equal(orb_qos_arbitrate(arb, NULL, 0, 0, ARB_BW, ARB_NOW), 0);
}

static void test_tent_tighter_deadline_first(void **state)
{
    struct flows f = {.n = 0};
    flow_window(&f, 1000000, 4096); /* 1 ms: loosest */
    flow_window(&f, 10000, 4096);   /* 10 us: tightest */
    flow_window(&f, 100000, 4096);  /* 100 us */
    expect_order(*state, &f, 0, ARB_BW, (const int[]){1, 2, 0});
}

static void test_tent_no_deadline_last_past_deadline_first(void **state)
{
    struct flows f = {.n = 0};
    flow_add(&f, 0, 4096);
    flow_window(&f, 50000, 4096);
    expect_order(*state, &f, 0, ARB_BW, (const int[]){1, 0});

    struct flows g = {.n = 0};
    flow_add(&g, UINT64_MAX, 4096); /* OrbiTE's ORB_DEADLINE_NONE is "no deadline" too */
    flow_window(&g, 50000, 4096);
    expect_order(*state, &g, 0, ARB_BW, (const int[]){1, 0});

    struct flows h = {.n = 0};
    flow_window(&h, 50000, 4096);
    flow_add(&h, ARB_NOW - 1, 4096);
    expect_order(*state, &h, 0, ARB_BW, (const int[]){1, 0});
}

static void test_tent_ties_and_unknown_bandwidth_keep_fifo(void **state)
{
    struct flows f = {.n = 0};
    for (int i = 0; i < 3; i++)
        flow_window(&f, 50000, 4096);
    expect_order(*state, &f, 0, ARB_BW, (const int[]){0, 1, 2});

    struct flows g = {.n = 0};
    flow_add(&g, 0, 1);
    flow_add(&g, 0, 2);
    flow_add(&g, 0, 3);
    expect_order(*state, &g, 0, ARB_BW, (const int[]){0, 1, 2});

    const double unknown[] = {0.0, -1.0, NAN};
    for (int k = 0; k < 3; k++) {
        struct flows h = {.n = 0};
        flow_window(&h, 1000000, 4096);
        flow_window(&h, 10000, 4096);
        expect_order(*state, &h, 0, unknown[k], (const int[]){0, 1});
    }
    /* Several past deadlines tie at DBL_MAX and keep their order. */
    struct flows p = {.n = 0};
    flow_window(&p, 50000, 4096);
    flow_add(&p, ARB_NOW - 5, 16);
    flow_add(&p, ARB_NOW, 65536);
    expect_order(*state, &p, 0, ARB_BW, (const int[]){1, 2, 0});
}

static void test_tent_longer_transfer_first_at_same_window(void **state)
{
    struct flows f = {.n = 0};
    flow_window(&f, 50000, 4096);
    flow_window(&f, 50000, 65536);
    expect_order(*state, &f, 0, ARB_BW, (const int[]){1, 0});
}

static void test_tent_bytes_ahead_favour_the_tighter_window(void **state)
{
    struct flows f = {.n = 0};
    flow_window(&f, 100000, 4096); /* idle NIC: 0.041 */
    flow_window(&f, 30000, 1024);  /* idle NIC: 0.034 */
    expect_order(*state, &f, 0, ARB_BW, (const int[]){0, 1});
    struct flows g = {.n = 0};
    flow_window(&g, 100000, 4096);
    flow_window(&g, 30000, 1024);
    expect_order(*state, &g, 65536, ARB_BW, (const int[]){1, 0});
}

static void test_tent_each_slot_scored_behind_the_ones_before(void **state)
{
    struct flows f = {.n = 0};
    flow_window(&f, 40000, 100000); /* 2.50 */
    flow_window(&f, 100000, 20000); /* 0.20, but 1.20 behind flow 0 */
    flow_window(&f, 50000, 5000);   /* 0.10, but 2.10 behind flow 0 */
    expect_order(*state, &f, 0, ARB_BW, (const int[]){0, 2, 1});
}

static void test_backlog_past_64_is_ranked_once_with_fifo_ties(void **state)
{
    /* 64 zero-length past-deadline flows fill the greedy slots in FIFO order without adding
     * bytes; the backlog is then ranked once against the same bytes: by its own MLU (0, 1, 2
     * as in the previous test's single-pass order, not the greedy 0, 2, 1), ties FIFO. */
    struct flows f = {.n = 0};
    flow_window(&f, 50000, 5000);    /* 64: 0.10 */
    for (int i = 0; i < 32; i++)
        flow_add(&f, ARB_NOW - 1, 0);
    flow_window(&f, 100000, 20000);  /* 33: 0.20 */
    for (int i = 0; i < 32; i++)
        flow_add(&f, ARB_NOW - 1, 0);
    flow_window(&f, 40000, 100000);  /* 66: 2.50 */
    flow_window(&f, 100000, 20000);  /* 67: 0.20, tie with 33 */
    flow_add(&f, 0, 7);              /* 68: no deadline */
    assert_int_equal(f.n, 69);
    int want[69];
    int k = 0;
    for (int i = 1; i <= 32; i++)
        want[k++] = i;
    for (int i = 34; i <= 65; i++)
        want[k++] = i;
    want[k++] = 66;
    want[k++] = 33;
    want[k++] = 67;
    want[k++] = 0;
    want[k++] = 68;
    expect_order(*state, &f, 0, ARB_BW, want);
}

static void test_greedy_prefix_is_exactly_64(void **state)
{
    /* 63 fillers leave exactly one greedy slot for the three-flow case: it takes flow X
     * (2.50); Y and Z are ranked behind X's bytes: Z (105/50 = 2.10) before Y (120/100 =
     * 1.20). Had greedy stopped at 63, X, Y, Z would be ranked once at 2.50, 0.20, 0.10 (the
     * previous test shows that order with 64 fillers, where 65 greedy slots would give X, Z,
     * Y): so the prefix is exactly 64. */
    struct flows f = {.n = 0};
    for (int i = 0; i < 63; i++)
        flow_add(&f, ARB_NOW - 1, 0);
    flow_window(&f, 40000, 100000); /* 63: X */
    flow_window(&f, 100000, 20000); /* 64: Y */
    flow_window(&f, 50000, 5000);   /* 65: Z */
    int want[66];
    for (int i = 0; i < 64; i++)
        want[i] = i;
    want[64] = 65;
    want[65] = 64;
    expect_order(*state, &f, 0, ARB_BW, want);
}

/* ---- admission ------------------------------------------------------------------------------------------ */

static struct orb_qos_admission admission(uint64_t window, uint64_t len)
{
    struct orb_qos_admission in = {.bytes_ahead = 0,
                                   .length = len,
                                   .deadline_ns = ARB_NOW + window,
                                   .now_ns = ARB_NOW,
                                   .bw_bytes_per_s = ARB_BW,
                                   .mlu_threshold = 1.5};
    return in;
}

static void test_admission_rejects_bad_thresholds(void **state)
{
    (void)state;
    enum orb_qos_verdict v = (enum orb_qos_verdict)77;
    const double bad[] = {0.0, -1.0, NAN, INFINITY};
    for (int i = 0; i < 4; i++) {
        struct orb_qos_admission in = admission(10, 16);
        in.mlu_threshold = bad[i];
        assert_int_equal(orb_qos_admit(&in, &v, NULL), ORB_EINVAL);
        assert_int_equal(v, 77);
    }
    struct orb_qos_admission in = admission(10, 16);
    assert_int_equal(orb_qos_admit(NULL, &v, NULL), ORB_EINVAL);
    assert_int_equal(orb_qos_admit(&in, NULL, NULL), ORB_EINVAL);
}

static void test_tent_admission_drop_vector(void **state)
{
    (void)state;
    enum orb_qos_verdict v;
    double mlu = -1;
    struct orb_qos_admission tight = admission(10, 16); /* 16 ns of a 10 ns window: 1.6 */
    assert_int_equal(orb_qos_admit(&tight, &v, &mlu), 0);
    assert_int_equal(v, ORB_QOS_DROP_INFEASIBLE);
    assert_double_eq(mlu, 1.6);
    struct orb_qos_admission loose = admission(1000000, 16);
    assert_int_equal(orb_qos_admit(&loose, &v, &mlu), 0);
    assert_int_equal(v, ORB_QOS_ADMIT);
    assert_double_eq(mlu, 16.0 / 1e6);
}

static void test_admission_boundary_and_bytes_ahead(void **state)
{
    (void)state;
    enum orb_qos_verdict v;
    struct orb_qos_admission in = admission(32, 16);
    in.mlu_threshold = 1.0;
    in.bytes_ahead = 16; /* (16 + 16) / 32 = 1.0: at the threshold drops */
    assert_int_equal(orb_qos_admit(&in, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_DROP_INFEASIBLE);
    in.bytes_ahead = 15;
    assert_int_equal(orb_qos_admit(&in, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_ADMIT);
}

static void test_admission_leave_eligible_and_expiry(void **state)
{
    (void)state;
    enum orb_qos_verdict v;
    double mlu = -1;
    struct orb_qos_admission in = admission(10, 16); /* would drop at 1.6 */
    in.nic_unmeasured = true;
    assert_int_equal(orb_qos_admit(&in, &v, &mlu), 0);
    assert_int_equal(v, ORB_QOS_ADMIT_UNMEASURED);
    assert_true(mlu == 0.0);
    in.nic_unmeasured = false;
    in.recovery_owns_route = true;
    assert_int_equal(orb_qos_admit(&in, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_ADMIT_UNMEASURED);
    in.recovery_owns_route = false;
    in.bw_bytes_per_s = 0.0;
    assert_int_equal(orb_qos_admit(&in, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_ADMIT_UNMEASURED);

    /* No deadline admits whatever the load. */
    struct orb_qos_admission none = admission(0, 1ull << 40);
    none.deadline_ns = 0;
    assert_int_equal(orb_qos_admit(&none, &v, &mlu), 0);
    assert_int_equal(v, ORB_QOS_ADMIT);
    none.deadline_ns = UINT64_MAX;
    assert_int_equal(orb_qos_admit(&none, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_ADMIT);

    /* A passed deadline is known without an estimate: dropped even when unmeasured. */
    struct orb_qos_admission late = admission(0, 16);
    assert_int_equal(orb_qos_admit(&late, &v, &mlu), 0);
    assert_int_equal(v, ORB_QOS_DROP_EXPIRED);
    assert_true(mlu == DBL_MAX);
    late.deadline_ns = ARB_NOW - 1;
    late.nic_unmeasured = true;
    assert_int_equal(orb_qos_admit(&late, &v, NULL), 0);
    assert_int_equal(v, ORB_QOS_DROP_EXPIRED);
}

/* ---- no allocation per dispatch ----------------------------------------------------------------------- */

static void test_dispatch_allocates_nothing(void **state)
{
    struct orb_qos_arbiter *arb = *state;
    struct orb_qos_set set;
    init_set(&set, true, 10 * MS);
    static struct orb_qos_entry e[96];
    struct orb_qos_entry *out[96];
    long before = atomic_load(&allocations);
    for (int round = 0; round < 50; round++) {
        for (int i = 0; i < 96; i++) {
            entry_init(&e[i], (enum orb_qos_priority)(i % 3));
            e[i].bytes = 4096u * (unsigned)(i + 1);
            e[i].deadline_ns = (i % 5) ? ARB_NOW + 1000u * (unsigned)(97 - i) : 0;
        }
        for (int i = 0; i < 96; i++)
            out[i] = &e[i];
        assert_int_equal(orb_qos_enqueue(&set, out, 96), 0);
        fake_clock_advance(&fclock, 4 * MS);
        (void)orb_qos_promote(&set);
        size_t got;
        while ((got = orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, 96)) > 0) {
            /* Candidates of one tier; give them one NIC for the arbitration call. */
            for (size_t i = 0; i < got; i++)
                out[i]->nic = 0;
            assert_int_equal(orb_qos_arbitrate(arb, out, got, 1 << 20, ARB_BW, ARB_NOW), 0);
        }
        struct orb_qos_admission in = admission(1000, 4096);
        enum orb_qos_verdict v;
        assert_int_equal(orb_qos_admit(&in, &v, NULL), 0);
    }
    assert_int_equal(atomic_load(&allocations) - before, 0);
    /* The counter is live: creating an arbiter allocates. */
    struct orb_qos_arbiter *other = NULL;
    assert_int_equal(orb_qos_arbiter_new(8, &other), 0);
    assert_true(atomic_load(&allocations) > before);
    orb_qos_arbiter_free(other);
}

/* ---- property: a random schedule checked against a plain model ---------------------------------------- */

#define PROP_ENTRIES 64

struct model {
    int tier[ORB_QOS_NPRIO][PROP_ENTRIES];
    int len[ORB_QOS_NPRIO];
    uint64_t next_check;
};

static uint64_t rng_state;

static uint32_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}

static void model_append(struct model *m, int p, int id)
{
    m->tier[p][m->len[p]++] = id;
}

static void model_remove_at(struct model *m, int p, int idx)
{
    memmove(&m->tier[p][idx], &m->tier[p][idx + 1], sizeof(int) * (size_t)(m->len[p] - idx - 1));
    m->len[p]--;
}

static bool model_aged(const struct orb_qos_entry *e, uint64_t now, uint64_t timeout)
{
    return e->enqueue_ns && now >= e->enqueue_ns && now - e->enqueue_ns >= timeout;
}

static size_t model_promote_tier(struct model *m, struct orb_qos_entry *e, int from, uint64_t now,
                                 bool per_entry, uint64_t timeout)
{
    size_t moved = 0;
    if (!m->len[from])
        return 0;
    if (!per_entry) {
        if (!model_aged(&e[m->tier[from][0]], now, timeout))
            return 0;
        for (int i = 0; i < m->len[from]; i++)
            model_append(m, from - 1, m->tier[from][i]);
        moved = (size_t)m->len[from];
        m->len[from] = 0;
        return moved;
    }
    for (int i = 0; i < m->len[from];) {
        int id = m->tier[from][i];
        if (model_aged(&e[id], now, timeout)) {
            model_remove_at(m, from, i);
            model_append(m, from - 1, id);
            moved++;
        } else {
            i++;
        }
    }
    return moved;
}

static void check_against_model(const struct orb_qos_set *set, const struct model *m,
                                struct orb_qos_entry *e)
{
    int seen[PROP_ENTRIES] = {0};
    for (int p = 0; p < ORB_QOS_NPRIO; p++) {
        assert_int_equal(orb_qos_count(set, (enum orb_qos_priority)p), m->len[p]);
        const struct orb_qos_entry *x = set->head[p];
        for (int i = 0; i < m->len[p]; i++) {
            assert_ptr_equal(x, &e[m->tier[p][i]]);
            assert_int_equal(x->priority, p);
            seen[x - e]++;
            x = x->next;
        }
        assert_null(x);
    }
    for (int i = 0; i < PROP_ENTRIES; i++)
        assert_int_equal(seen[i], e[i].queued); /* queued ones exactly once, others never */
}

static void run_property(bool per_entry, uint64_t seed)
{
    const uint64_t timeout = 10 * MS;
    struct orb_qos_set set;
    init_set(&set, per_entry, timeout);
    struct model m = {.next_check = 0};
    struct orb_qos_entry e[PROP_ENTRIES];
    long popped[PROP_ENTRIES] = {0}, enqueued[PROP_ENTRIES] = {0};
    for (int i = 0; i < PROP_ENTRIES; i++)
        entry_init(&e[i], ORB_PRIO_HIGH);
    rng_state = seed;
    fake_clock_set(&fclock, 1 * SEC);

    for (int step = 0; step < 4000; step++) {
        uint32_t op = rng() % 6;
        uint64_t now = atomic_load(&fclock.now);
        if (op == 0) { /* a batch of free entries, random tiers */
            struct orb_qos_entry *batch[8];
            int n = 0, want = 1 + (int)(rng() % 8);
            for (int tries = 0; tries < 16 && n < want; tries++) {
                int id = (int)(rng() % PROP_ENTRIES);
                bool dup = false;
                for (int j = 0; j < n; j++)
                    dup |= batch[j] == &e[id];
                if (e[id].queued || dup)
                    continue;
                e[id].priority = (uint8_t)(rng() % 3);
                batch[n++] = &e[id];
            }
            assert_int_equal(orb_qos_enqueue(&set, batch, (size_t)n), 0);
            for (int j = 0; j < n; j++) {
                model_append(&m, batch[j]->priority, (int)(batch[j] - e));
                enqueued[batch[j] - e]++;
            }
        } else if (op == 1) { /* pop with a random mask */
            unsigned mask = rng() % 8;
            struct orb_qos_entry *got = orb_qos_pop(&set, mask);
            int want = -1;
            for (int p = 0; p < 3 && want < 0; p++)
                if ((mask & (1u << p)) && m.len[p]) {
                    want = m.tier[p][0];
                    model_remove_at(&m, p, 0);
                }
            if (want < 0) {
                assert_null(got);
            } else {
                assert_ptr_equal(got, &e[want]);
                popped[want]++;
            }
        } else if (op == 2) { /* a worker pass */
            struct orb_qos_entry *out[5];
            size_t max = rng() % 6;
            size_t got = orb_qos_pop_tier(&set, ORB_QOS_ALL_TIERS, out, max);
            int p = 0;
            while (p < 3 && !m.len[p])
                p++;
            size_t want = p < 3 ? ((size_t)m.len[p] < max ? (size_t)m.len[p] : max) : 0;
            assert_int_equal(got, want);
            for (size_t j = 0; j < got; j++) {
                assert_ptr_equal(out[j], &e[m.tier[p][0]]);
                popped[m.tier[p][0]]++;
                model_remove_at(&m, p, 0);
            }
        } else if (op == 3) { /* cancel a random queued entry */
            int id = (int)(rng() % PROP_ENTRIES);
            if (e[id].queued) {
                int p = e[id].priority, idx = 0;
                while (m.tier[p][idx] != id)
                    idx++;
                model_remove_at(&m, p, idx);
                assert_int_equal(orb_qos_remove(&set, &e[id]), 0);
                popped[id]++;
            } else {
                assert_int_equal(orb_qos_remove(&set, &e[id]), ORB_ENOENT);
            }
        } else if (op == 4) {
            fake_clock_advance(&fclock, rng() % (3 * MS));
        } else {
            size_t want = 0;
            if (now >= m.next_check) {
                m.next_check = now + ORB_QOS_PROMOTION_CHECK_NS;
                want = model_promote_tier(&m, e, ORB_PRIO_MEDIUM, now, per_entry, timeout);
                if (!want)
                    want = model_promote_tier(&m, e, ORB_PRIO_LOW, now, per_entry, timeout);
            }
            assert_int_equal(orb_qos_promote(&set), want);
        }
        check_against_model(&set, &m, e);
    }
    /* Drain: every entry leaves exactly as often as it entered. */
    struct orb_qos_entry *x;
    while ((x = orb_qos_pop(&set, ORB_QOS_ALL_TIERS)) != NULL)
        popped[x - e]++;
    for (int i = 0; i < PROP_ENTRIES; i++) {
        assert_int_equal(popped[i], enqueued[i]);
        assert_int_equal(e[i].queued, 0);
    }
}

static void test_property_random_schedules(void **state)
{
    (void)state;
    for (uint64_t seed = 1; seed <= 6; seed++) {
        run_property(false, 0x9e3779b97f4a7c15ull * seed);
        run_property(true, 0xbf58476d1ce4e5b9ull * seed);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_init_rejects_null, setup),
        cmocka_unit_test_setup(test_enqueue_rejects_bad_batches_whole, setup),
        cmocka_unit_test_setup(test_pop_order_is_tier_then_fifo, setup),
        cmocka_unit_test_setup(test_pop_honours_allowed_tiers, setup),
        cmocka_unit_test_setup(test_push_front_restores_a_reordered_run, setup),
        cmocka_unit_test_setup(test_remove_head_middle_tail, setup),
        cmocka_unit_test_setup(test_take_where_skips_what_cannot_go, setup),
        cmocka_unit_test_setup(test_tent_vector_head_timed_out, setup),
        cmocka_unit_test_setup(test_tent_vector_tail_timed_out, setup),
        cmocka_unit_test_setup(test_tent_vector_all_timed_out_and_zero_stamps, setup),
        cmocka_unit_test_setup(test_promotion_boundary_and_clock_order, setup),
        cmocka_unit_test_setup(test_promotion_rate_limit_and_one_tier_per_pass, setup),
        cmocka_unit_test_setup(test_promoted_entries_join_the_tail_in_order, setup),
        cmocka_unit_test_setup(test_per_entry_keeps_fresh_entries_linked, setup),
        cmocka_unit_test_setup(test_zero_timeout_disables_aging, setup),
        cmocka_unit_test(test_deadline_mlu_values),
        cmocka_unit_test_setup_teardown(test_arbiter_rejects, arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_tighter_deadline_first, arbiter_setup,
                                        arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_no_deadline_last_past_deadline_first,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_ties_and_unknown_bandwidth_keep_fifo,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_longer_transfer_first_at_same_window,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_bytes_ahead_favour_the_tighter_window,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_tent_each_slot_scored_behind_the_ones_before,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_backlog_past_64_is_ranked_once_with_fifo_ties,
                                        arbiter_setup, arbiter_teardown),
        cmocka_unit_test_setup_teardown(test_greedy_prefix_is_exactly_64, arbiter_setup,
                                        arbiter_teardown),
        cmocka_unit_test(test_admission_rejects_bad_thresholds),
        cmocka_unit_test(test_tent_admission_drop_vector),
        cmocka_unit_test(test_admission_boundary_and_bytes_ahead),
        cmocka_unit_test(test_admission_leave_eligible_and_expiry),
        cmocka_unit_test_setup_teardown(test_dispatch_allocates_nothing, arbiter_setup,
                                        arbiter_teardown),
        cmocka_unit_test_setup(test_property_random_schedules, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
