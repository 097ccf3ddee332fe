/* The engine's shared staging pool: its bound, the chunks it keeps for sources, one-shot
 * waiters, bounded waits, kept chunks and closing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <cmocka.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/registry.h"
#include "core/stage_pool.h"

#define CHUNK 4096u

/* A memory kind that counts the staging memory it makes, frees and keeps. */
static int made, freed, kept;

static void *counting_alloc(const struct orb_reg *reg, size_t len)
{
    (void)reg;
    made++;
    return aligned_alloc(4096, len);
}

static void counting_free(void *p)
{
    freed++;
    free(p);
}

static void counting_keep(void *p)
{
    (void)p;
    kept++;
}

static const struct orb_memkind_ops counting_kind = {
    .kind = ORB_MEM_HOST,
    .name = "counting",
    .stage_alloc = counting_alloc,
    .stage_free = counting_free,
    .stage_keep = counting_keep,
};

static struct orb_reg reg;

static int setup(void **state)
{
    (void)state;
    memset(&reg, 0, sizeof reg);
    reg.kind = &counting_kind;
    made = freed = kept = 0;
    return 0;
}

static struct orb_stage_pool *pool_of(uint32_t chunks, uint32_t reserve)
{
    struct orb_stage_pool *p = NULL;
    assert_int_equal(orb_stage_pool_new(CHUNK, (size_t)chunks * CHUNK, reserve, &p), 0);
    return p;
}

static void test_bad_shapes_are_refused(void **state)
{
    (void)state;
    struct orb_stage_pool *p = NULL;
    assert_int_equal(orb_stage_pool_new(0, 8 * CHUNK, 0, &p), ORB_EINVAL);
    assert_int_equal(orb_stage_pool_new(CHUNK + 1, 8 * CHUNK, 0, &p), ORB_EINVAL);
    assert_int_equal(orb_stage_pool_new(CHUNK, CHUNK - 1, 0, &p), ORB_EINVAL);
    assert_int_equal(orb_stage_pool_new(CHUNK, 4 * CHUNK, 4, &p), ORB_EINVAL); /* nothing left for requesters */
    assert_int_equal(orb_stage_pool_new(CHUNK, 4 * CHUNK, 0, NULL), ORB_EINVAL);
    assert_null(p);
    orb_stage_pool_free(NULL);
    orb_stage_pool_close(NULL);
}

/* Requesters stop short of the reserve; sources may take every chunk; nothing is made before it
 * is asked for and no chunk is lent twice. */
static void test_the_bound_and_the_reserve(void **state)
{
    (void)state;
    struct orb_stage_pool *p = pool_of(8, 2);
    assert_int_equal(made, 0);
    uint8_t *c[8];
    uint32_t idx[8];
    for (int i = 0; i < 6; i++) {
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &c[i], &idx[i]), 0);
        assert_int_equal(made, i + 1);
    }
    uint8_t *none = NULL;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &none, NULL), ORB_EAGAIN);
    assert_non_null(strstr(orb_last_error(), "reserved for sources"));
    assert_null(none);
    for (int i = 6; i < 8; i++)
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &c[i], &idx[i]), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &none, NULL), ORB_EAGAIN);
    assert_int_equal(orb_stage_pool_lent(p), 8);
    for (int i = 0; i < 8; i++) {
        assert_true(idx[i] < orb_stage_pool_max_chunks(p));
        assert_ptr_equal(orb_stage_pool_chunk(p, idx[i]), c[i]);
        for (int j = 0; j < i; j++) {
            assert_ptr_not_equal(c[i], c[j]);
            assert_int_not_equal(idx[i], idx[j]);
        }
        memset(c[i], i, CHUNK); /* every byte is the taker's */
    }
    assert_null(orb_stage_pool_chunk(p, 8));
    /* A chunk that comes back is lent again, not made again. */
    orb_stage_pool_put(p, c[3]);
    uint8_t *again = NULL;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &again, NULL), 0);
    assert_ptr_equal(again, c[3]);
    assert_int_equal(made, 8);
    for (int i = 0; i < 8; i++)
        orb_stage_pool_put(p, c[i]);
    assert_int_equal(orb_stage_pool_lent(p), 0);
    orb_stage_pool_free(p);
    assert_int_equal(freed, 8);
}

static int wakes;

static void count_wake(struct orb_stage_waiter *w)
{
    (void)w;
    wakes++;
}

/* A waiter is queued with the refusal and woken once by the next chunk back; one taken off is
 * not woken. */
static void test_a_waiter_is_woken_once(void **state)
{
    (void)state;
    wakes = 0;
    struct orb_stage_pool *p = pool_of(2, 1);
    struct orb_stage_waiter w = {.wake = count_wake};
    uint8_t *a = NULL, *b = NULL, *none = NULL;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &a, NULL), 0);
    assert_false(w.queued);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_EAGAIN);
    assert_true(w.queued);
    /* Asking again while queued queues it once. */
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_EAGAIN);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &b, NULL), 0);
    assert_int_equal(wakes, 0);
    orb_stage_pool_put(p, b);
    assert_int_equal(wakes, 1);
    assert_false(w.queued);
    orb_stage_pool_put(p, a);
    assert_int_equal(wakes, 1); /* one-shot */

    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &a, NULL), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_EAGAIN);
    orb_stage_pool_unwait(p, &w);
    assert_false(w.queued);
    orb_stage_pool_unwait(p, &w); /* not queued: nothing */
    orb_stage_pool_put(p, a);
    assert_int_equal(wakes, 1);
    orb_stage_pool_free(p);
}

struct late_put {
    struct orb_stage_pool *p;
    uint8_t *c;
};

static void *put_later(void *arg)
{
    struct late_put *l = arg;
    usleep(50 * 1000);
    orb_stage_pool_put(l->p, l->c);
    return NULL;
}

/* A bounded wait ends with ORB_ETIMEDOUT at its deadline, or with the chunk another thread gives
 * back before it. */
static void test_a_bounded_wait(void **state)
{
    (void)state;
    struct orb_stage_pool *p = pool_of(1, 0);
    uint8_t *a = NULL, *b = NULL;
    assert_int_equal(orb_stage_pool_take_wait(p, &reg, ORB_STAGE_FOR_REQUESTER, orb_deadline_after(1000000000ull),
                                              &a, NULL), 0);
    uint64_t t0 = orb_now_ns();
    assert_int_equal(orb_stage_pool_take_wait(p, &reg, ORB_STAGE_FOR_REQUESTER, orb_deadline_after(30000000ull), &b,
                                              NULL), ORB_ETIMEDOUT);
    assert_true(orb_now_ns() - t0 >= 30000000ull);
    assert_non_null(strstr(orb_last_error(), "stayed lent"));
    assert_null(b);
    struct late_put l = {.p = p, .c = a};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, put_later, &l), 0);
    assert_int_equal(orb_stage_pool_take_wait(p, &reg, ORB_STAGE_FOR_REQUESTER, orb_deadline_after(10000000000ull),
                                              &b, NULL), 0);
    assert_ptr_equal(b, a);
    pthread_join(t, NULL);
    orb_stage_pool_put(p, b);
    orb_stage_pool_free(p);
}

/* A chunk kept (lent, a copy through it unproven: its memory kind counts it) or retired (free,
 * a NIC would not let go of it) is never lent again nor freed. */
static void test_a_kept_or_retired_chunk_is_never_lent_again(void **state)
{
    (void)state;
    for (int retire = 0; retire < 2; retire++) {
        kept = freed = 0;
        struct orb_stage_pool *p = pool_of(2, 0);
        uint8_t *a = NULL, *b = NULL, *c = NULL;
        uint32_t ia = 0, ib = 0;
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &a, &ia), 0);
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &b, &ib), 0);
        if (retire) {
            orb_stage_pool_put(p, a);
            orb_stage_pool_retire(p, ia);
            assert_int_equal(kept, 0);
        } else {
            orb_stage_pool_keep(p, &reg, a);
            assert_int_equal(kept, 1);
            orb_stage_pool_put(p, a); /* not lent any more: ignored */
        }
        assert_int_equal(orb_stage_pool_lent(p), 1);
        orb_stage_pool_put(p, b);
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &c, NULL), 0);
        assert_ptr_equal(c, b);
        assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &c, NULL), ORB_EAGAIN);
        orb_stage_pool_put(p, b);
        orb_stage_pool_free(p);
        assert_int_equal(freed, 1); /* b only */
        free(a);                    /* the chunk the pool never frees */
    }
}

/* A chunk retired while lent is kept when it comes back: never lent again nor freed, and a
 * waiter learns that the pool has nothing left for it. */
static void test_a_chunk_retired_while_lent_is_kept_on_its_return(void **state)
{
    (void)state;
    kept = freed = 0;
    wakes = 0;
    struct orb_stage_pool *p = pool_of(1, 0);
    struct orb_stage_waiter w = {.wake = count_wake};
    uint8_t *a = NULL, *none = NULL;
    uint32_t ia = 0;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &a, &ia), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_EAGAIN);
    orb_stage_pool_retire(p, ia);
    assert_int_equal(wakes, 0);
    assert_int_equal(orb_stage_pool_lent(p), 1);
    orb_stage_pool_put(p, a);
    assert_int_equal(wakes, 1);
    assert_int_equal(orb_stage_pool_lent(p), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &none, NULL), ORB_ERESOURCE);
    assert_null(none);
    orb_stage_pool_retire(p, ia); /* kept already: nothing more */
    orb_stage_pool_free(p);
    assert_int_equal(freed, 0);
    free(a); /* the chunk the pool never frees */
}

/* Once so many chunks are kept that a taker could never have one, it fails at once (a requester
 * when only the sources' reserve would be left, a source when none is), and a waiter is woken
 * to learn it: nothing waits for good. */
static void test_a_pool_kept_away_fails_its_takers(void **state)
{
    (void)state;
    wakes = 0;
    struct orb_stage_pool *p = pool_of(3, 1);
    struct orb_stage_waiter w = {.wake = count_wake};
    uint8_t *a = NULL, *b = NULL, *c = NULL, *none = NULL;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &a, NULL), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &b, NULL), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_EAGAIN);
    orb_stage_pool_keep(p, &reg, a);
    assert_int_equal(wakes, 1);
    orb_stage_pool_keep(p, &reg, b);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &none, NULL), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "kept for good"));
    assert_false(w.queued);
    assert_int_equal(orb_stage_pool_take_wait(p, &reg, ORB_STAGE_FOR_REQUESTER, orb_deadline_after(10000000000ull),
                                              &none, NULL), ORB_ERESOURCE);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &c, NULL), 0);
    orb_stage_pool_keep(p, &reg, c);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &none, NULL), ORB_ERESOURCE);
    assert_int_equal(kept, 3);
    orb_stage_pool_free(p);
    assert_int_equal(freed, 0);
    free(a);
    free(b);
    free(c);
}

/* Closing refuses later takes, wakes waiters and ends bounded waits at once. */
static void test_closing_wakes_everyone(void **state)
{
    (void)state;
    wakes = 0;
    struct orb_stage_pool *p = pool_of(1, 0);
    struct orb_stage_waiter w = {.wake = count_wake};
    uint8_t *a = NULL, *b = NULL;
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, NULL, &a, NULL), 0);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_REQUESTER, &w, &b, NULL), ORB_EAGAIN);
    orb_stage_pool_close(p);
    assert_int_equal(wakes, 1);
    assert_int_equal(orb_stage_pool_take(p, &reg, ORB_STAGE_FOR_SOURCE, NULL, &b, NULL), ORB_ECLOSED);
    assert_int_equal(orb_stage_pool_take_wait(p, &reg, ORB_STAGE_FOR_SOURCE, orb_deadline_after(10000000000ull), &b,
                                              NULL), ORB_ECLOSED);
    orb_stage_pool_put(p, a); /* what was lent still comes back */
    assert_int_equal(orb_stage_pool_lent(p), 0);
    orb_stage_pool_free(p);
    assert_int_equal(freed, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bad_shapes_are_refused, setup),
        cmocka_unit_test_setup(test_the_bound_and_the_reserve, setup),
        cmocka_unit_test_setup(test_a_waiter_is_woken_once, setup),
        cmocka_unit_test_setup(test_a_bounded_wait, setup),
        cmocka_unit_test_setup(test_a_kept_or_retired_chunk_is_never_lent_again, setup),
        cmocka_unit_test_setup(test_a_chunk_retired_while_lent_is_kept_on_its_return, setup),
        cmocka_unit_test_setup(test_a_pool_kept_away_fails_its_takers, setup),
        cmocka_unit_test_setup(test_closing_wakes_everyone, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
