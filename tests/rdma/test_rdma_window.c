/* Memory windows and their key history (lib/rdma/window.c) on a scripted allocator: a bind WR
 * grants exactly the range and one direction; an index never repeats a key and is parked once
 * its keys are spent; every index ever allocated counts against max_window_key_indices; only a
 * real invalidation of the key ends a binding. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "rdma/window.h"

static int allocs, deallocs, fail_alloc;
static uint32_t next_index = 7;
static int reissue = -1;        /* >= 0: the next allocation gets this index again */
static uint32_t first_key = 0x3a; /* a provider's random first key byte */

static struct ibv_mw *f_alloc(void *impl, struct ibv_pd *pd)
{
    (void)impl, (void)pd;
    if (fail_alloc) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    struct ibv_mw *mw = calloc(1, sizeof *mw);
    assert_non_null(mw);
    uint32_t index = reissue >= 0 ? (uint32_t)reissue : next_index++;
    reissue = -1;
    mw->rkey = (index << 8) | first_key;
    mw->type = IBV_MW_TYPE_2;
    allocs++;
    return mw;
}

static int f_dealloc(void *impl, struct ibv_mw *mw)
{
    (void)impl;
    free(mw);
    deallocs++;
    return 0;
}

static const struct orb_rdma_mw_ops ops = {.alloc_mw = f_alloc, .dealloc_mw = f_dealloc};

static uint8_t bytes[8192];
static struct ibv_mr parent = {.addr = bytes, .length = sizeof bytes};

static int reset(void **state)
{
    (void)state;
    allocs = deallocs = fail_alloc = 0;
    reissue = -1;
    first_key = 0x3a;
    return 0;
}

static void test_bind_grants_exactly(void **state)
{
    (void)state;
    struct orb_rdma_window_pool p;
    orb_rdma_window_pool_init(&p, &ops, NULL, NULL, 16);
    struct orb_rdma_window *w;
    assert_int_equal(orb_rdma_window_take(&p, &w), 0);
    struct ibv_send_wr wr;
    uint32_t key;
    uint64_t addr = (uint64_t)(uintptr_t)bytes + 100;
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, addr, 1000, ORB_OP_READ, 42, &wr, &key), 0);
    assert_int_equal(wr.opcode, IBV_WR_BIND_MW);
    assert_int_equal(wr.wr_id, 42);
    assert_true(wr.send_flags & IBV_SEND_SIGNALED);
    assert_ptr_equal(wr.bind_mw.bind_info.mr, &parent);
    assert_int_equal(wr.bind_mw.bind_info.addr, addr);
    assert_int_equal(wr.bind_mw.bind_info.length, 1000);
    assert_int_equal(wr.bind_mw.bind_info.mw_access_flags, IBV_ACCESS_REMOTE_READ); /* nothing else */
    assert_int_equal(wr.bind_mw.rkey, key);
    assert_int_equal(key >> 8, w->mw->rkey >> 8);       /* same index */
    assert_int_not_equal(key, w->mw->rkey);              /* a new key */
    orb_rdma_window_bound(w, key);
    /* Bound: no second bind until it is over. */
    struct ibv_send_wr wr2;
    uint32_t key2;
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, addr, 10, ORB_OP_WRITE, 43, &wr2, &key2), ORB_EINVAL);
    orb_rdma_window_put(&p, w);

    assert_int_equal(orb_rdma_window_take(&p, &w), 0);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, addr, 10, ORB_OP_WRITE, 44, &wr, &key2), 0);
    assert_int_equal(wr.bind_mw.bind_info.mw_access_flags, IBV_ACCESS_REMOTE_WRITE);
    assert_int_not_equal(key2, key);
    orb_rdma_window_put(&p, w);

    /* Ranges outside the parent and unknown operations are refused. */
    assert_int_equal(orb_rdma_window_take(&p, &w), 0);
    uint64_t base = (uint64_t)(uintptr_t)bytes;
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base - 1, 10, ORB_OP_READ, 1, &wr, &key), ORB_EINVAL);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base + 8000, 193, ORB_OP_READ, 1, &wr, &key), ORB_EINVAL);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base + 8192, 1, ORB_OP_READ, 1, &wr, &key), ORB_EINVAL);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base, 0, ORB_OP_READ, 1, &wr, &key), ORB_EINVAL);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base, 10, 7, 1, &wr, &key), ORB_EINVAL);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, base + 8000, 192, ORB_OP_READ, 1, &wr, &key), 0);
    orb_rdma_window_put(&p, w);
    assert_int_equal(orb_rdma_window_pool_fini(&p), 0);
    assert_int_equal(deallocs, allocs);
}

/* An index gives 255 distinct keys after its first, never one twice, then it is parked for good;
 * an index the device hands out again after a discard never carries an old key either. */
static void test_key_history(void **state)
{
    (void)state;
    struct orb_rdma_window_pool p;
    orb_rdma_window_pool_init(&p, &ops, NULL, NULL, 2);
    bool used[256];
    memset(used, 0, sizeof used);
    struct orb_rdma_window *first = NULL;
    uint32_t index = 0;
    for (unsigned i = 0; i < 255; i++) {
        struct orb_rdma_window *w;
        assert_int_equal(orb_rdma_window_take(&p, &w), 0);
        if (first == NULL) {
            first = w;
            index = w->mw->rkey >> 8;
            used[w->mw->rkey & 0xff] = true; /* the allocation's key counts as used */
        }
        assert_ptr_equal(w, first); /* the free window is reused while it has keys */
        assert_int_equal(orb_rdma_window_keys_left(&p, w), 255 - i);
        struct ibv_send_wr wr;
        uint32_t key;
        assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, (uint64_t)(uintptr_t)bytes, 64, ORB_OP_READ, i,
                                                 &wr, &key), 0);
        assert_int_equal(key >> 8, index);
        assert_false(used[key & 0xff]); /* never a key this index had */
        used[key & 0xff] = true;
        orb_rdma_window_bound(w, key);
        orb_rdma_window_put(&p, w);
    }
    assert_int_equal(p.parked, 1);
    assert_int_equal(allocs, 1);
    /* The spent index is never handed out again: the next grant takes a new index. */
    struct orb_rdma_window *w;
    assert_int_equal(orb_rdma_window_take(&p, &w), 0);
    assert_ptr_not_equal(w, first);
    assert_int_not_equal(w->mw->rkey >> 8, index);
    /* Two indices in the history: the budget of 2 is spent for any third. While w is in use
     * that is "not now" (w comes back with keys left); with none in use, "never". */
    struct orb_rdma_window *w2;
    assert_int_equal(orb_rdma_window_take(&p, &w2), ORB_EAGAIN);
    assert_non_null(strstr(orb_last_error(), "max_window_key_indices"));
    assert_non_null(strstr(orb_last_error(), "1 window(s) in use"));
    assert_int_equal(deallocs, 1); /* the untracked one went back at once */
    orb_rdma_window_put(&p, w);
    assert_int_equal(orb_rdma_window_take(&p, &w2), 0);
    assert_ptr_equal(w2, w); /* the one that came back */
    assert_int_equal(allocs, 3);

    /* Bind w once, discard it (its QP failed), and have the device hand its index out again
     * with the very key byte it had: the next bind skips every key the index ever carried. */
    uint32_t windex = w->mw->rkey >> 8, wfirst = w->mw->rkey & 0xff;
    struct ibv_send_wr wr;
    uint32_t k1, k2;
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, (uint64_t)(uintptr_t)bytes, 64, ORB_OP_WRITE, 1,
                                             &wr, &k1), 0);
    orb_rdma_window_discard(&p, w);
    reissue = (int)windex;
    first_key = wfirst;
    assert_int_equal(orb_rdma_window_take(&p, &w), 0);
    assert_int_equal(w->mw->rkey >> 8, windex);
    assert_int_equal(orb_rdma_window_bind_wr(&p, w, &parent, (uint64_t)(uintptr_t)bytes, 64, ORB_OP_READ, 2,
                                             &wr, &k2), 0);
    assert_int_not_equal(k2, k1);
    assert_int_not_equal(k2 & 0xff, wfirst);
    orb_rdma_window_put(&p, w);

    /* A spent index handed out again is held (parked), never bound, and another one is asked
     * for (here a third index, beyond the history's budget of 2). */
    assert_int_equal(orb_rdma_window_take(&p, &w2), 0);
    assert_ptr_equal(w2, w);
    orb_rdma_window_discard(&p, w2);
    reissue = (int)index;
    first_key = 0x10;
    assert_int_equal(p.in_use, 0);
    assert_int_equal(orb_rdma_window_take(&p, &w), ORB_ERESOURCE);
    assert_non_null(strstr(orb_last_error(), "max_window_key_indices"));
    assert_int_equal(p.parked, 2);
    assert_int_equal(orb_rdma_window_pool_fini(&p), 0);
    assert_int_equal(deallocs, allocs);
}

static void test_allocation_failure(void **state)
{
    (void)state;
    struct orb_rdma_window_pool p;
    orb_rdma_window_pool_init(&p, &ops, NULL, NULL, 4);
    fail_alloc = 1;
    struct orb_rdma_window *w;
    assert_int_equal(orb_rdma_window_take(&p, &w), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "type-2"));
    assert_int_equal(p.allocated, 0);
    assert_int_equal(orb_rdma_window_pool_fini(&p), 0);
}

static void test_invalidation_recognised(void **state)
{
    (void)state;
    struct ibv_wc wc;
    memset(&wc, 0, sizeof wc);
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV;
    wc.invalidated_rkey = 0x1234;
    wc.wc_flags = IBV_WC_WITH_INV;
    assert_true(orb_rdma_wc_invalidates(&wc, 0x1234));
    assert_false(orb_rdma_wc_invalidates(&wc, 0x1235));        /* another key */
    wc.wc_flags = 0;                                            /* soft-RoCE: no flag */
    assert_true(orb_rdma_wc_invalidates(&wc, 0x1234));
    wc.wc_flags = IBV_WC_WITH_IMM;                              /* immediate data, not a key */
    assert_false(orb_rdma_wc_invalidates(&wc, 0x1234));
    wc.wc_flags = IBV_WC_WITH_INV;
    wc.status = IBV_WC_WR_FLUSH_ERR;                            /* a flushed receive */
    assert_false(orb_rdma_wc_invalidates(&wc, 0x1234));
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RDMA_READ;                               /* not a receive */
    assert_false(orb_rdma_wc_invalidates(&wc, 0x1234));
    wc.opcode = IBV_WC_RECV;
    wc.invalidated_rkey = 0;
    assert_false(orb_rdma_wc_invalidates(&wc, 0));              /* key 0 is never a grant */
    assert_false(orb_rdma_wc_invalidates(NULL, 1));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_bind_grants_exactly, reset),
        cmocka_unit_test_setup(test_key_history, reset),
        cmocka_unit_test_setup(test_allocation_failure, reset),
        cmocka_unit_test_setup(test_invalidation_recognised, reset),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
