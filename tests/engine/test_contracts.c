/* Contracts of the header, through the public API: where release callbacks run, that bytes are
 * handed over at most once however registrations race, and that the failure text stays put. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "util.h"

/* ---- release callbacks ------------------------------------------------------------------- */

struct blocking_release {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int entered, finished, let_go;
    pthread_t thread;
    orb_engine *engine;
    int resolve_rc;   /* what an OrbiTE call made from the callback returned */
    void *ptr;
};

static void blocking_release_fn(void *ptr, size_t len, void *ctx)
{
    (void)len;
    struct blocking_release *b = ctx;
    struct orb_local_region region;
    /* Calling back into OrbiTE is allowed: the range is retired, so it is unknown now. */
    int rc = orb_resolve_local_address(b->engine, (uint64_t)(uintptr_t)ptr, 1, &region);
    pthread_mutex_lock(&b->lock);
    b->resolve_rc = rc;
    b->thread = pthread_self();
    b->ptr = ptr;
    b->entered = 1;
    pthread_cond_broadcast(&b->cond);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    while (!b->let_go)
        if (pthread_cond_timedwait(&b->cond, &b->lock, &until) != 0)
            break;
    b->finished = 1;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
    free(ptr);
}

static int wait_flag(struct blocking_release *b, int *flag)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 10;
    pthread_mutex_lock(&b->lock);
    while (!*flag)
        if (pthread_cond_timedwait(&b->cond, &b->lock, &until) != 0)
            break;
    int v = *flag;
    pthread_mutex_unlock(&b->lock);
    return v;
}

static void release_init(struct blocking_release *b, orb_engine *e)
{
    memset(b, 0, sizeof *b);
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->cond, NULL);
    b->engine = e;
    b->resolve_rc = 1;
}

static void release_let_go(struct blocking_release *b)
{
    pthread_mutex_lock(&b->lock);
    b->let_go = 1;
    pthread_cond_broadcast(&b->cond);
    pthread_mutex_unlock(&b->lock);
}

/* A transfer drops the last pin of a retired registration on a transport worker: the callback
 * runs on the release thread instead, and while it blocks, the only worker keeps moving data. */
static void test_release_runs_off_the_data_path(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.tcp_workers = 1;
    orb_engine *src = eu_engine(&cfg);
    cfg.enable_source = 0;
    cfg.tcp_stripes = 1;
    orb_engine *req = eu_engine(&cfg);
    struct eu_region remote, spare;
    const size_t len = 1u << 20;
    eu_region_new(src, len, ORB_PERM_REMOTE_WRITE, 0x31, &remote);
    eu_region_new(req, len, ORB_PERM_LOCAL, 0x32, &spare);
    orb_segment *seg = eu_open(req, src);

    struct blocking_release b;
    release_init(&b, req);
    uint8_t *mine = malloc(len);
    assert_non_null(mine);
    orb_reg_id id;
    assert_int_equal(orb_register_memory(req, mine, len, ORB_PERM_LOCAL, blocking_release_fn, &b,
                                         &id), 0);
    orb_batch *batch;
    assert_int_equal(orb_batch_open(req, seg, &batch), 0);
    struct orb_request r = eu_req(ORB_OP_READ, mine, remote.base, len);
    r.transport = ORB_TRANSPORT_UNSPEC; /* handed-over heap bytes: no same-host source may map them */
    assert_int_equal(orb_batch_submit(batch, &r, 1), 0);
    /* Retired while the READ is in flight: the READ keeps the bytes until it ends. */
    assert_int_equal(orb_unregister_memory(req, id), 0);
    assert_int_equal(orb_batch_seal(batch, NULL), 0);
    struct orb_batch_report rep;
    assert_int_equal(orb_batch_wait(batch, 10 * EU_SEC, &rep), 0);
    assert_int_equal(orb_batch_free(batch), 0);

    assert_true(wait_flag(&b, &b.entered));
    assert_false(pthread_equal(b.thread, pthread_self()));
    assert_int_equal(b.resolve_rc, ORB_ENOENT);
    assert_ptr_equal(b.ptr, mine);
    /* The callback is blocked; the engine's single worker must still serve transfers. */
    struct orb_request again = eu_req(ORB_OP_READ, spare.base, remote.base, len);
    assert_int_equal(orb_submit_and_wait(req, seg, &again, 1, NULL, 5 * EU_SEC, &rep), 0);
    assert_memory_equal(spare.base, remote.base, len);
    release_let_go(&b);
    assert_true(wait_flag(&b, &b.finished));

    orb_segment_close(seg);
    eu_region_free(req, &spare);
    eu_region_free(src, &remote);
    orb_engine_free(req);
    orb_engine_free(src);
}

/* Unregistering with nothing in flight: the callback still runs on the release thread, and
 * freeing the engine waits for it. */
static void test_release_thread_and_engine_free(void **state)
{
    (void)state;
    orb_engine *e = eu_engine(NULL);
    struct blocking_release b;
    release_init(&b, e);
    b.let_go = 1;
    uint8_t *mine = malloc(4096);
    assert_non_null(mine);
    orb_reg_id id;
    assert_int_equal(orb_register_memory(e, mine, 4096, ORB_PERM_REMOTE_READ, blocking_release_fn,
                                         &b, &id), 0);
    assert_int_equal(orb_unregister_memory(e, id), 0);
    assert_true(wait_flag(&b, &b.finished));
    assert_false(pthread_equal(b.thread, pthread_self()));

    /* Registered when the engine is freed: the release has run when orb_engine_free returns. */
    struct blocking_release late;
    release_init(&late, e);
    late.let_go = 1;
    mine = malloc(4096);
    assert_non_null(mine);
    assert_int_equal(orb_register_memory(e, mine, 4096, ORB_PERM_LOCAL, blocking_release_fn,
                                         &late, &id), 0);
    orb_engine_free(e);
    assert_int_equal(late.finished, 1);
}

/* ---- handing bytes over at most once ----------------------------------------------------- */

#define RACERS 4
#define ROUNDS 2000

struct hand_over {
    orb_engine *engine;
    uint8_t *bytes;
    atomic_int successes, refused, callbacks, others;
};

static void count_callback(void *ptr, size_t len, void *ctx)
{
    struct hand_over *h = ctx;
    if (ptr != h->bytes || len != 4096)
        atomic_fetch_add(&h->others, 1);
    atomic_fetch_add(&h->callbacks, 1);
}

static void *racer(void *arg)
{
    struct hand_over *h = arg;
    for (int i = 0; i < ROUNDS; i++) {
        orb_reg_id id;
        int rc = orb_register_memory(h->engine, h->bytes, 4096, ORB_PERM_LOCAL, count_callback, h,
                                     &id);
        if (rc == 0) {
            atomic_fetch_add(&h->successes, 1);
            if (orb_unregister_memory(h->engine, id) != 0)
                atomic_fetch_add(&h->others, 1);
        } else if (rc == ORB_EEXIST) {
            atomic_fetch_add(&h->refused, 1);
        } else {
            atomic_fetch_add(&h->others, 1);
        }
    }
    return NULL;
}

static void test_register_memory_hands_over_once(void **state)
{
    (void)state;
    struct hand_over h;
    memset(&h, 0, sizeof h);
    h.engine = eu_engine(NULL);
    static uint8_t bytes[4096];
    h.bytes = bytes;
    pthread_t t[RACERS];
    for (int i = 0; i < RACERS; i++)
        assert_int_equal(pthread_create(&t[i], NULL, racer, &h), 0);
    for (int i = 0; i < RACERS; i++)
        pthread_join(t[i], NULL);
    orb_engine_free(h.engine); /* every release has run */
    assert_int_equal(atomic_load(&h.others), 0);
    assert_int_equal(atomic_load(&h.successes) + atomic_load(&h.refused), RACERS * ROUNDS);
    assert_true(atomic_load(&h.successes) > 0);
    /* One release per accepted hand-over, none for a refused one. */
    assert_int_equal(atomic_load(&h.callbacks), atomic_load(&h.successes));
}

/* ---- the failure text --------------------------------------------------------------------- */

static void test_last_error_stays_until_next_call(void **state)
{
    (void)state;
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    assert_int_equal(orb_engine_config_load_json(&cfg, "{\"tcp_stripes\": 99}"), ORB_ECONFIG);
    char copy[256];
    snprintf(copy, sizeof copy, "%s", orb_last_error());
    assert_non_null(strstr(copy, "tcp_stripes"));
    /* Reading it, and naming statuses, do not change it. */
    assert_string_equal(orb_last_error(), copy);
    (void)orb_strerror(ORB_EPEER);
    assert_string_equal(orb_last_error(), copy);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_release_thread_and_engine_free),
        cmocka_unit_test(test_release_runs_off_the_data_path),
        cmocka_unit_test(test_register_memory_hands_over_once),
        cmocka_unit_test(test_last_error_stays_until_next_call),
    };
    return cmocka_run_group_tests_name("contracts", tests, NULL, NULL);
}
