/* The queue pair's pure rules (lib/rdma/qp.c): READ depths within the device's limits, the
 * signalling interval, and exact WR identity: old, duplicate and foreign completions retire
 * nothing; a completion retires its WR and every older one, in order; a refused post withdraws
 * exactly its suffix; the queue never holds more than its depth. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <orbite/orbite.h>

#include "rdma/qp.h"

static void test_rd_atomic_depth(void **state)
{
    (void)state;
    assert_int_equal(orb_rdma_rd_atomic_depth(0, 16), 0);  /* zero stays zero */
    assert_int_equal(orb_rdma_rd_atomic_depth(0, 0), 0);
    assert_int_equal(orb_rdma_rd_atomic_depth(16, 16), 16);
    assert_int_equal(orb_rdma_rd_atomic_depth(16, 4), 4);  /* capped at the device's */
    assert_int_equal(orb_rdma_rd_atomic_depth(3, 128), 3);
    assert_int_equal(orb_rdma_rd_atomic_depth(16, 0), 1);  /* a device reporting 0: one */
    assert_int_equal(orb_rdma_rd_atomic_depth(255, 255), 255);
    /* Towards a peer: never more than it answers; an unstated depth (0) leaves ours. */
    assert_int_equal(orb_rdma_rd_atomic_for_peer(16, 4), 4);
    assert_int_equal(orb_rdma_rd_atomic_for_peer(16, 0), 16);
    assert_int_equal(orb_rdma_rd_atomic_for_peer(4, 16), 4);
    assert_int_equal(orb_rdma_rd_atomic_for_peer(0, 16), 0);
    assert_int_equal(orb_rdma_rd_atomic_for_peer(255, 255), 255);
}

static void test_signal_every(void **state)
{
    (void)state;
    assert_int_equal(orb_rdma_signal_every(1, 16), 1);
    assert_int_equal(orb_rdma_signal_every(4, 16), 4);
    assert_int_equal(orb_rdma_signal_every(64, 16), 8);   /* half the send queue */
    assert_int_equal(orb_rdma_signal_every(64, 1), 1);    /* at least one */
    assert_int_equal(orb_rdma_signal_every(0, 16), 1);
    assert_int_equal(orb_rdma_signal_every(9, 17), 8);
}

struct seen {
    uint64_t cookies[64];
    bool is_this[64];
    int n;
};

static void note(void *ctx, uint64_t cookie, bool is_this)
{
    struct seen *s = ctx;
    s->cookies[s->n] = cookie;
    s->is_this[s->n] = is_this;
    s->n++;
}

static void test_track_in_order_and_exact(void **state)
{
    (void)state;
    struct orb_rdma_wr_track t;
    assert_int_equal(orb_rdma_wr_track_init(&t, 8, 5), 0);
    uint64_t cookies[6] = {10, 11, 12, 13, 14, 15}, ids[6];
    assert_int_equal(orb_rdma_wr_track_add(&t, 6, cookies, ids), 0);
    for (int i = 1; i < 6; i++)
        assert_true(ids[i] != ids[i - 1]);
    /* Full: two more fit, three do not, and a refusal records nothing. */
    uint64_t more[3];
    assert_int_equal(orb_rdma_wr_track_add(&t, 3, NULL, more), ORB_ERESOURCE);
    assert_int_equal(t.count, 6);
    assert_true(orb_rdma_wr_track_room(&t, 2));

    /* A foreign id, an id of another incarnation and id 0 retire nothing. */
    struct seen s;
    memset(&s, 0, sizeof s);
    assert_int_equal(orb_rdma_wr_track_complete(&t, 0, note, &s), ORB_EPROTO);
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[2] ^ (UINT64_C(1) << 40), note, &s), ORB_EPROTO);
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[5] + 1, note, &s), ORB_EPROTO);
    assert_int_equal(s.n, 0);
    assert_int_equal(t.count, 6);

    /* The signaled third WR retires the first three, oldest first. */
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[2], note, &s), 3);
    assert_int_equal(s.n, 3);
    assert_int_equal(s.cookies[0], 10);
    assert_int_equal(s.cookies[2], 12);
    assert_false(s.is_this[0]);
    assert_true(s.is_this[2]);
    /* The same completion again, or an older one, repays nothing. */
    s.n = 0;
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[2], note, &s), ORB_EPROTO);
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[0], note, &s), ORB_EPROTO);
    assert_int_equal(s.n, 0);
    assert_int_equal(t.count, 3);
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[5], note, &s), 3);
    assert_int_equal(t.count, 0);
    orb_rdma_wr_track_free(&t);
}

static void test_track_withdraw_suffix(void **state)
{
    (void)state;
    struct orb_rdma_wr_track t;
    assert_int_equal(orb_rdma_wr_track_init(&t, 4, 1), 0);
    uint64_t ids[4];
    assert_int_equal(orb_rdma_wr_track_add(&t, 4, NULL, ids), 0);
    /* The post refused ids[2] and ids[3]. */
    assert_int_equal(orb_rdma_wr_track_withdraw(&t, ids[2]), 0);
    assert_int_equal(t.count, 2);
    /* Their completion can never arrive, and would retire nothing. */
    assert_int_equal(orb_rdma_wr_track_complete(&t, ids[3], NULL, NULL), ORB_EPROTO);
    /* A withdrawal of an unknown WR changes nothing. */
    assert_int_equal(orb_rdma_wr_track_withdraw(&t, ids[3]), ORB_EPROTO);
    assert_int_equal(t.count, 2);
    /* New ids are never the withdrawn ones. */
    uint64_t again[2];
    assert_int_equal(orb_rdma_wr_track_add(&t, 2, NULL, again), 0);
    assert_true(again[0] != ids[2] && again[0] != ids[3] && again[1] != ids[2] && again[1] != ids[3]);
    assert_int_equal(orb_rdma_wr_track_complete(&t, again[1], NULL, NULL), 4);
    orb_rdma_wr_track_free(&t);
}

/* Many wraps of the ring: every completion retires exactly what was posted before it. */
static void test_track_long_run(void **state)
{
    (void)state;
    struct orb_rdma_wr_track t;
    assert_int_equal(orb_rdma_wr_track_init(&t, 16, 77), 0);
    uint64_t posted = 0, retired = 0;
    uint32_t rng = 12345;
    for (int round = 0; round < 20000; round++) {
        rng = rng * 1103515245u + 12345u;
        uint32_t n = 1 + (rng >> 16) % 16;
        if (!orb_rdma_wr_track_room(&t, n))
            n = t.cap - t.count;
        if (n == 0) {
            uint64_t last = t.ring[(t.head + t.count - 1) % t.cap].id;
            int r = orb_rdma_wr_track_complete(&t, last, NULL, NULL);
            assert_true(r > 0);
            retired += (uint64_t)r;
            continue;
        }
        uint64_t ids[16], cookies[16];
        for (uint32_t i = 0; i < n; i++)
            cookies[i] = posted + i;
        assert_int_equal(orb_rdma_wr_track_add(&t, n, cookies, ids), 0);
        posted += n;
        /* Complete a random one of the outstanding. */
        uint32_t k = (rng >> 8) % t.count;
        uint64_t id = t.ring[(t.head + k) % t.cap].id;
        struct seen s;
        memset(&s, 0, sizeof s);
        int r = orb_rdma_wr_track_complete(&t, id, note, &s);
        assert_int_equal(r, (int)k + 1);
        for (int i = 0; i < r; i++)
            assert_int_equal(s.cookies[i], retired + (uint64_t)i); /* in post order */
        retired += (uint64_t)r;
    }
    assert_int_equal(posted - retired, t.count);
    orb_rdma_wr_track_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rd_atomic_depth),
        cmocka_unit_test(test_signal_every),
        cmocka_unit_test(test_track_in_order_and_exact),
        cmocka_unit_test(test_track_withdraw_suffix),
        cmocka_unit_test(test_track_long_run),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
