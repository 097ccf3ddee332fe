/* DevX grant keys (lib/rdma/devx_key.c) against a model of the device and the helper's own check.
 *
 * The model takes the CREATE_MKEY command the library builds, keeps the key context and KLM
 * entries it names (as the device would; a "wildcard firmware" mode binds every key to the
 * wildcard QP instead), and answers the helper's query with them in QUERY_MKEY's layout. The
 * verification is the helper's real decoder and checker (helper/devx.c), so a key passes only if
 * the command really asks for exactly the range, QP and direction. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "helper/devx.h"
#include "rdma/devx_key.h"
#include "rdma/window.h"

#define MAX_OBJECTS 16

struct model {
    uint32_t pdn;
    int pdn_status;              /* pdn() answers this when nonzero */
    bool wildcard;               /* the device binds keys to the wildcard QP whatever is asked */
    uint8_t fail_status;         /* CREATE_MKEY's status byte (0: success) */
    int destroy_status;          /* destroy() answers this when nonzero */
    uint32_t indices[8];         /* the mkey indices the device hands out, in turn */
    unsigned n_indices, next_index;
    struct {
        bool live;
        uint32_t index;
        uint8_t cmd[ORB_DEVX_CREATE_IN_MAX];
        size_t cmd_len;
    } obj[MAX_OBJECTS];
    unsigned creates, destroys, verifies;
    struct orb_hp_devx_verify last_verify;
};

static int model_pdn(void *impl, struct ibv_pd *pd, uint32_t *pdn_out)
{
    struct model *m = impl;
    (void)pd;
    if (m->pdn_status != 0)
        return orb_fail(m->pdn_status, "model: no PD number");
    *pdn_out = m->pdn;
    return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static int model_create(void *impl, struct ibv_context *ctx, const uint8_t *in, size_t in_len, uint8_t *out,
                        size_t out_len, uint32_t *handle_out)
{
    struct model *m = impl;
    (void)ctx;
    assert_true(in_len <= ORB_DEVX_CREATE_IN_MAX);
    assert_int_equal(out_len, ORB_DEVX_CREATE_OUT_LEN);
    assert_int_equal((in[0] << 8) | in[1], ORB_DEVX_CMD_CREATE_MKEY);
    assert_true(m->creates < MAX_OBJECTS);
    unsigned h = m->creates++;
    m->obj[h].live = true;
    m->obj[h].index = m->indices[m->next_index % m->n_indices];
    m->next_index++;
    memcpy(m->obj[h].cmd, in, in_len);
    m->obj[h].cmd_len = in_len;
    if (m->wildcard)
        put_be32(m->obj[h].cmd + ORB_DEVX_CREATE_MKC_OFFSET + 4,
                 0xFFFFFFu << 8 | m->obj[h].cmd[ORB_DEVX_CREATE_MKC_OFFSET + 7]);
    memset(out, 0, out_len);
    out[0] = m->fail_status;
    if (m->fail_status != 0)
        put_be32(out + 4, 0xBADu);
    put_be32(out + 8, m->obj[h].index);
    *handle_out = h + 100;
    return 0;
}

static int model_destroy(void *impl, struct ibv_context *ctx, uint32_t handle)
{
    struct model *m = impl;
    (void)ctx;
    assert_true(handle >= 100 && handle < 100 + m->creates);
    assert_true(m->obj[handle - 100].live);
    if (m->destroy_status != 0)
        return orb_fail(m->destroy_status, "model: destroy refused");
    m->obj[handle - 100].live = false;
    m->destroys++;
    return 0;
}

/* The helper's side: QUERY_MKEY through the object, as the kernel answers it, then the real check. */
static int model_verify(void *impl, const struct orb_hp_devx_verify *v)
{
    struct model *m = impl;
    m->verifies++;
    m->last_verify = *v;
    assert_true(v->obj_handle >= 100 && v->obj_handle < 100 + m->creates);
    unsigned h = v->obj_handle - 100;
    if (!m->obj[h].live || m->obj[h].index != (v->key >> 8))
        return orb_fail(ORB_EPERM, "model: the handle is not this key's object");
    uint8_t out[ORB_DEVX_QUERY_OUT_LEN];
    memset(out, 0, sizeof out);
    /* The context and the KLM entries sit at the same offsets in both layouts. */
    memcpy(out + ORB_DEVX_MKC_OFFSET, m->obj[h].cmd + ORB_DEVX_CREATE_MKC_OFFSET, 64);
    size_t klm_bytes = m->obj[h].cmd_len - ORB_DEVX_CREATE_KLM_OFFSET;
    memcpy(out + ORB_DEVX_KLM_OFFSET, m->obj[h].cmd + ORB_DEVX_CREATE_KLM_OFFSET, klm_bytes);
    struct orb_devx_mkey k;
    int rc = orb_devx_decode_mkey(out, sizeof out, &k);
    if (rc != 0)
        return rc;
    return orb_devx_check_mkey(&k, v);
}

static const struct orb_devx_key_ops model_ops = {
    .pdn = model_pdn,
    .create = model_create,
    .destroy = model_destroy,
};

/* The history's pool allocates no window here. */
static struct ibv_mw *no_alloc_mw(void *impl, struct ibv_pd *pd)
{
    (void)impl;
    (void)pd;
    errno = EOPNOTSUPP;
    return NULL;
}

static int no_dealloc_mw(void *impl, struct ibv_mw *mw)
{
    (void)impl;
    (void)mw;
    return 0;
}

static const struct orb_rdma_mw_ops no_mw_ops = {.alloc_mw = no_alloc_mw, .dealloc_mw = no_dealloc_mw};

struct fixture {
    struct model m;
    struct orb_rdma_window_pool history;
    struct orb_devx_key_site site;
};

static void setup_site(struct fixture *f, uint32_t max_indices)
{
    memset(f, 0, sizeof *f);
    f->m.pdn = 0x00ABCDu;
    f->m.indices[0] = 0x000123u;
    f->m.n_indices = 1;
    orb_rdma_window_pool_init(&f->history, &no_mw_ops, NULL, NULL, max_indices);
    f->site = (struct orb_devx_key_site){
        .ops = &model_ops,
        .impl = &f->m,
        .verify = model_verify,
        .verify_impl = &f->m,
        .nic = "mlx5_0",
        .history = &f->history,
    };
}

static void teardown_site(struct fixture *f)
{
    assert_int_equal(orb_rdma_window_pool_fini(&f->history), 0);
}

static unsigned live_objects(const struct model *m)
{
    unsigned n = 0;
    for (unsigned i = 0; i < m->creates; i++)
        n += m->obj[i].live;
    return n;
}

/* ---- edge cases first ---- */

static void test_encode_refuses_what_no_key_may_grant(void **state)
{
    (void)state;
    uint8_t in[ORB_DEVX_CREATE_IN_MAX];
    size_t len = 0;
    struct orb_devx_key_spec ok = {.pdn = 1, .qpn = 0x42, .parent_lkey = 7, .addr = 0x1000, .len = 4096,
                                   .op = ORB_OP_READ};
    struct orb_devx_key_spec s = ok;
    s.qpn = 0xFFFFFFu; /* the wildcard */
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.qpn = 0x1000000u;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.pdn = 0x1000000u;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.len = 0;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.len = ORB_DEVX_KEY_LEN_MAX + 1;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.addr = UINT64_MAX - 10;
    s.len = 11;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    s = ok;
    s.op = 7;
    assert_int_equal(orb_devx_key_encode(&s, in, &len), ORB_EINVAL);
    assert_int_equal(len, 0); /* never written on failure */
    assert_int_equal(orb_devx_key_encode(NULL, in, &len), ORB_EINVAL);
}

static void test_a_failed_command_is_named(void **state)
{
    (void)state;
    uint8_t out[ORB_DEVX_CREATE_OUT_LEN] = {0x05, 0, 0, 0, 0x00, 0x12, 0x34, 0x56, 0, 0, 0, 9};
    uint32_t index = 77;
    assert_int_equal(orb_devx_key_decode_created(out, &index), ORB_EUNAVAILABLE);
    assert_int_equal(index, 77);
    assert_non_null(strstr(orb_last_error(), "0x00123456"));
    out[0] = 0;
    out[8] = 0xFF; /* reserved bits above the 24-bit index are not the index */
    assert_int_equal(orb_devx_key_decode_created(out, &index), 0);
    assert_int_equal(index, 9);
}

static void test_the_command_asks_for_exactly_one_right(void **state)
{
    (void)state;
    for (int op = ORB_OP_READ; op <= ORB_OP_WRITE; op++) {
        uint8_t in[ORB_DEVX_CREATE_IN_MAX];
        size_t len = 0;
        struct orb_devx_key_spec s = {.pdn = 0x0A0B0C, .qpn = 0x123456, .parent_lkey = 0xDEADBEEF,
                                      .variant = 0x5A, .addr = 0x7f0000001000ull, .len = 65536, .op = op};
        assert_int_equal(orb_devx_key_encode(&s, in, &len), 0);
        assert_int_equal(len, ORB_DEVX_CREATE_KLM_OFFSET + 16);
        const uint8_t *mkc = in + ORB_DEVX_CREATE_MKC_OFFSET;
        /* free 0, access_mode_4_2 0 */
        assert_int_equal(mkc[0], 0);
        /* umr_en 0, a 0, exactly one of rw/rr, lr, lw, KLMs */
        assert_int_equal(mkc[2] & 0xC0, 0);
        assert_int_equal(mkc[2] & 0x30, op == ORB_OP_READ ? 0x10 : 0x20);
        assert_int_equal(mkc[2] & 0x03, ORB_DEVX_ACCESS_MODE_KLMS);
        /* qpn and our low byte */
        assert_memory_equal(mkc + 4, ((uint8_t[]){0x12, 0x34, 0x56, 0x5A}), 4);
        /* no 64-bit length, no signature, remote invalidation on; the PD */
        assert_int_equal(mkc[12], 0x01);
        assert_memory_equal(mkc + 13, ((uint8_t[]){0x0A, 0x0B, 0x0C}), 3);
        /* one translation, and one actual entry */
        assert_memory_equal(mkc + 52, ((uint8_t[]){0, 0, 0, 1}), 4);
        assert_memory_equal(in + ORB_DEVX_CREATE_ACTUAL_SIZE_OFFSET, ((uint8_t[]){0, 0, 0, 1}), 4);
        /* the entry: the whole length, onto the parent, from the address */
        const uint8_t *klm = in + ORB_DEVX_CREATE_KLM_OFFSET;
        assert_memory_equal(klm, ((uint8_t[]){0, 1, 0, 0, 0xDE, 0xAD, 0xBE, 0xEF}), 8);
        assert_memory_equal(klm + 8, ((uint8_t[]){0, 0, 0x7f, 0, 0, 0, 0x10, 0}), 8);
    }
}

static void test_a_device_that_binds_only_the_wildcard_fails_the_check(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 64);
    f.m.wildcard = true;
    struct orb_devx_key k = {.handle = 1234, .key = 5678};
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "not bound to one QP"));
    assert_int_equal(k.handle, 1234); /* untouched */
    assert_int_equal(f.m.verifies, 1);
    assert_int_equal(live_objects(&f.m), 0); /* the failed key was destroyed */
    /* Its key stays spent: it never carries authority again. */
    assert_true(orb_rdma_key_history_used(&f.history, f.m.last_verify.key));
    teardown_site(&f);
}

static void test_a_key_that_cannot_be_destroyed_is_unquiesced(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 64);
    f.m.wildcard = true;
    f.m.destroy_status = ORB_EUNAVAILABLE;
    struct orb_devx_key k;
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_WRITE, &k), ORB_EUNQUIESCED);
    assert_non_null(strstr(orb_last_error(), "could not be destroyed"));
    assert_int_equal(live_objects(&f.m), 1);
    teardown_site(&f);
}

static void test_a_refused_command_or_pd_makes_no_key(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 64);
    f.m.fail_status = 0x03;
    struct orb_devx_key k;
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_EUNAVAILABLE);
    assert_int_equal(live_objects(&f.m), 0);
    assert_int_equal(f.m.verifies, 0);
    f.m.fail_status = 0;
    f.m.pdn_status = ORB_EUNAVAILABLE;
    unsigned creates = f.m.creates;
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_EUNAVAILABLE);
    assert_int_equal(f.m.creates, creates);
    assert_int_equal(orb_devx_key_make(NULL, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_EINVAL);
    teardown_site(&f);
}

static void test_a_spent_key_is_never_handed_out_again(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 64);
    /* Every key the device could make first is spent already. */
    for (uint32_t b = 0; b < 256; b++)
        if (b != 0x77)
            assert_int_equal(orb_rdma_key_history_claim(&f.history, 0x000123u << 8 | b), 0);
    struct orb_devx_key k;
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), 0);
    assert_int_equal(k.key, 0x000123u << 8 | 0x77); /* the one byte the index never carried */
    assert_int_equal(live_objects(&f.m), 1);
    assert_int_equal(f.m.destroys, f.m.creates - 1);
    /* Now the index has nothing left: the next key is refused, and nothing stays. */
    assert_int_equal(orb_devx_key_destroy(&f.site, &k), 0);
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_ERESOURCE);
    assert_int_equal(live_objects(&f.m), 0);
    teardown_site(&f);
}

static void test_a_full_key_history_refuses_a_new_index(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 1);
    assert_int_equal(orb_rdma_key_history_claim(&f.history, 0x000999u << 8 | 1), 0);
    struct orb_devx_key k;
    assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), ORB_ERESOURCE);
    assert_int_equal(live_objects(&f.m), 0);
    assert_int_equal(f.m.verifies, 0);
    teardown_site(&f);
}

static void test_key_history_claims(void **state)
{
    (void)state;
    struct orb_rdma_window_pool p;
    orb_rdma_window_pool_init(&p, &no_mw_ops, NULL, NULL, 4);
    assert_true(orb_rdma_key_history_used(&p, 0)); /* key 0 is never handed out */
    assert_false(orb_rdma_key_history_used(&p, 0x500));
    assert_int_equal(orb_rdma_key_history_claim(&p, 0x500), 0);
    assert_true(orb_rdma_key_history_used(&p, 0x500));
    assert_int_equal(orb_rdma_key_history_claim(&p, 0x500), ORB_EINVAL);
    assert_int_equal(orb_rdma_key_history_next(&p, 0x500, 0), 1);
    assert_int_equal(orb_rdma_key_history_next(&p, 0x600, 0xFF), 0); /* unknown index: any byte */
    assert_int_equal(orb_rdma_key_history_next(&p, 0x000, 0xFF), 1); /* but never the whole key 0 */
    assert_int_equal(orb_rdma_window_pool_fini(&p), 0);
}

/* ---- the keys themselves ---- */

static void test_keys_of_every_size_pass_the_helper_check(void **state)
{
    (void)state;
    const uint64_t lengths[] = {1, 4095, 4096, 1u << 20, ORB_DEVX_KLM_BYTES_MAX - 1, ORB_DEVX_KLM_BYTES_MAX,
                                ORB_DEVX_KLM_BYTES_MAX + 1, ORB_DEVX_KEY_LEN_MAX};
    for (int op = ORB_OP_READ; op <= ORB_OP_WRITE; op++) {
        for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
            struct fixture f;
            setup_site(&f, 64);
            f.m.indices[0] = 0x000010u + (uint32_t)i;
            uint64_t addr = 0x7f1200000000ull + 3;
            struct orb_devx_key k;
            assert_int_equal(orb_devx_key_make(&f.site, 0x0ABCDE, 0x4321, addr, lengths[i], op, &k), 0);
            assert_int_equal(k.key >> 8, f.m.indices[0]);
            assert_int_equal(k.handle, 100);
            assert_int_equal(f.m.verifies, 1);
            const struct orb_hp_devx_verify *v = &f.m.last_verify;
            assert_string_equal(v->nic, "mlx5_0");
            assert_int_equal(v->obj_handle, k.handle);
            assert_int_equal(v->key, k.key);
            assert_int_equal(v->qpn, 0x0ABCDE);
            assert_int_equal(v->addr, addr);
            assert_int_equal(v->length, lengths[i]);
            assert_int_equal(v->access, op == ORB_OP_READ ? ORB_DEVX_READ : ORB_DEVX_WRITE);
            assert_true(orb_rdma_key_history_used(&f.history, k.key));
            /* The device got the PD and the entries the length needs. */
            assert_memory_equal(f.m.obj[0].cmd + ORB_DEVX_CREATE_MKC_OFFSET + 13, ((uint8_t[]){0x00, 0xAB, 0xCD}), 3);
            assert_int_equal(f.m.obj[0].cmd_len,
                             ORB_DEVX_CREATE_KLM_OFFSET + (lengths[i] > ORB_DEVX_KLM_BYTES_MAX ? 32 : 16));
            assert_int_equal(orb_devx_key_destroy(&f.site, &k), 0);
            assert_int_equal(live_objects(&f.m), 0);
            teardown_site(&f);
        }
    }
}

static void test_successive_keys_differ(void **state)
{
    (void)state;
    struct fixture f;
    setup_site(&f, 64);
    uint32_t keys[8];
    for (int i = 0; i < 8; i++) {
        struct orb_devx_key k;
        assert_int_equal(orb_devx_key_make(&f.site, 0x42, 7, 0x10000, 4096, ORB_OP_READ, &k), 0);
        keys[i] = k.key;
        for (int j = 0; j < i; j++)
            assert_int_not_equal(keys[i], keys[j]);
        assert_int_equal(orb_devx_key_destroy(&f.site, &k), 0); /* the device reuses the index */
    }
    teardown_site(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_encode_refuses_what_no_key_may_grant),
        cmocka_unit_test(test_a_failed_command_is_named),
        cmocka_unit_test(test_the_command_asks_for_exactly_one_right),
        cmocka_unit_test(test_a_device_that_binds_only_the_wildcard_fails_the_check),
        cmocka_unit_test(test_a_key_that_cannot_be_destroyed_is_unquiesced),
        cmocka_unit_test(test_a_refused_command_or_pd_makes_no_key),
        cmocka_unit_test(test_a_spent_key_is_never_handed_out_again),
        cmocka_unit_test(test_a_full_key_history_refuses_a_new_index),
        cmocka_unit_test(test_key_history_claims),
        cmocka_unit_test(test_keys_of_every_size_pass_the_helper_check),
        cmocka_unit_test(test_successive_keys_differ),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
