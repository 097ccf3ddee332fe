/* DEVX_VERIFY's key-context checks against a fake device that answers QUERY_MKEY with a key
 * context built here in the PRM layout, field by field, and that refuses an object handle the
 * way the kernel does: no such object, or an object whose mkey index is not the command's. */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "core/error.h"
#include "helper/devx.h"

/* A key as the device would describe it. */
struct fake_key {
    uint8_t status, free, umr_en, atomic, rw, rr, lw, lr, access_mode, length64, bsf_en;
    uint32_t qpn;
    uint8_t variant;
    uint64_t start_addr, len;
    uint32_t translations;
    struct {
        uint32_t byte_count, key;
        uint64_t addr;
    } klm[2];
};

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static void put_be64(uint8_t *p, uint64_t v)
{
    put_be32(p, (uint32_t)(v >> 32));
    put_be32(p + 4, (uint32_t)v);
}

/* The mlx5 PRM query_mkey_out layout, written independently of the decoder. */
static void encode_key(const struct fake_key *k, uint8_t *out)
{
    memset(out, 0, ORB_DEVX_QUERY_OUT_LEN);
    out[0] = k->status;
    put_be32(out + 4, k->status ? 0x1234u : 0);
    uint8_t *mkc = out + 16;
    mkc[0] = (uint8_t)(k->free << 6 | ((k->access_mode >> 2) & 7u) << 2);
    mkc[2] = (uint8_t)(k->umr_en << 7 | k->atomic << 6 | k->rw << 5 | k->rr << 4 | k->lw << 3 | k->lr << 2 |
                       (k->access_mode & 3u));
    put_be32(mkc + 4, k->qpn << 8 | k->variant);
    mkc[12] = (uint8_t)(k->length64 << 7 | k->bsf_en << 6);
    put_be64(mkc + 16, k->start_addr);
    put_be64(mkc + 24, k->len);
    put_be32(mkc + 52, k->translations);
    for (int i = 0; i < 2; i++) {
        uint8_t *e = out + 272 + 16 * i;
        put_be32(e, k->klm[i].byte_count);
        put_be32(e + 4, k->klm[i].key);
        put_be64(e + 8, k->klm[i].addr);
    }
}

struct fake_device {
    struct fake_key key;
    uint32_t obj_handle;   /* the one DevX object of the context ... */
    uint32_t obj_index;    /* ... and the mkey index it created */
    int answer;            /* what query_mkey returns once the handle is accepted */
    uint32_t asked_key, asked_handle;
    int asked_fd;
    int calls;
};

static int fake_query(void *impl, int dev_fd, uint32_t obj_handle, uint32_t key, uint8_t *out, size_t out_len)
{
    struct fake_device *d = impl;
    d->calls++;
    d->asked_key = key;
    d->asked_handle = obj_handle;
    d->asked_fd = dev_fd;
    assert_int_equal(out_len, ORB_DEVX_QUERY_OUT_LEN);
    if (obj_handle != d->obj_handle)
        return orb_devx_query_errno_status(ENOENT, obj_handle, key);
    /* The kernel compares the object's mkey index with the one in the command input. */
    uint8_t in[ORB_DEVX_QUERY_IN_LEN];
    orb_devx_encode_query(key, in);
    uint32_t index = (uint32_t)in[9] << 16 | (uint32_t)in[10] << 8 | in[11];
    if (index != d->obj_index)
        return orb_devx_query_errno_status(EINVAL, obj_handle, key);
    if (d->answer != 0)
        return d->answer;
    encode_key(&d->key, out);
    return 0;
}

static const struct orb_devx_ops fake_ops = {.query_mkey = fake_query};

#define KEY 0x00ABCD42u
#define HANDLE 5u
#define PARENT 0x00001100u
#define ADDR 0x7f0000001000ull
#define LEN 0x200000ull

static struct orb_hp_devx_verify request(uint32_t access)
{
    struct orb_hp_devx_verify r;
    memset(&r, 0, sizeof r);
    strcpy(r.nic, "mlx5_0");
    r.obj_handle = HANDLE;
    r.key = KEY;
    r.qpn = 0x1c2;
    r.addr = ADDR;
    r.length = LEN;
    r.access = access;
    return r;
}

/* A key granting exactly request(READ). */
static struct fake_device good_device(void)
{
    struct fake_device d;
    memset(&d, 0, sizeof d);
    d.obj_handle = HANDLE;
    d.obj_index = KEY >> 8;
    d.key.access_mode = ORB_DEVX_ACCESS_MODE_KLMS;
    d.key.rr = 1;
    d.key.lr = 1;
    d.key.lw = 1;
    d.key.qpn = 0x1c2;
    d.key.variant = KEY & 0xFF;
    d.key.start_addr = ADDR;
    d.key.len = LEN;
    d.key.translations = 1;
    d.key.klm[0].byte_count = (uint32_t)LEN;
    d.key.klm[0].key = PARENT;
    d.key.klm[0].addr = ADDR;
    return d;
}

static int verify(struct fake_device *d, uint32_t access)
{
    struct orb_hp_devx_verify r = request(access);
    return orb_devx_verify(&fake_ops, d, 17, &r);
}

/* ---- arguments and device failures ------------------------------------------------------------ */

static void test_null_arguments(void **state)
{
    (void)state;
    struct orb_hp_devx_verify r = request(1);
    assert_int_equal(orb_devx_verify(NULL, NULL, 3, &r), ORB_EINVAL);
    assert_int_equal(orb_devx_verify(&fake_ops, NULL, 3, NULL), ORB_EINVAL);
    uint8_t out[ORB_DEVX_QUERY_OUT_LEN] = {0};
    struct orb_devx_mkey m;
    assert_int_equal(orb_devx_decode_mkey(out, sizeof out - 1, &m), ORB_EINVAL);
    assert_int_equal(orb_devx_check_mkey(NULL, &r), ORB_EINVAL);
}

static void test_device_refusal_is_passed_through(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    d.answer = ORB_EUNAVAILABLE;
    assert_int_equal(verify(&d, 1), ORB_EUNAVAILABLE);
    assert_int_equal(d.calls, 1);
}

static void test_unknown_handle_is_refused(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    struct orb_hp_devx_verify r = request(1);
    r.obj_handle = HANDLE + 1;
    assert_int_equal(orb_devx_verify(&fake_ops, &d, 17, &r), ORB_EPERM);
    assert_int_equal(d.asked_handle, HANDLE + 1);
    assert_non_null(strstr(orb_last_error(), "no object with handle 6"));
}

static void test_handle_of_another_key_is_refused(void **state)
{
    (void)state;
    /* The handle names a key object, but not this key: the kernel refuses the query. */
    struct fake_device d = good_device();
    d.obj_index = (KEY >> 8) + 1;
    assert_int_equal(verify(&d, 1), ORB_EPERM);
    assert_int_equal(d.calls, 1);
    /* Same mkey index, another variant: the kernel accepts, the variant check refuses. */
    d = good_device();
    struct orb_hp_devx_verify r = request(1);
    r.key = (KEY & ~0xFFu) | 0x07u;
    assert_int_equal(orb_devx_verify(&fake_ops, &d, 17, &r), ORB_EPERM);
    assert_non_null(strstr(orb_last_error(), "variant"));
}

static void test_kernel_errno_mapping(void **state)
{
    (void)state;
    /* No object query on this device: DevX verification is unavailable here. */
    static const int unavailable[] = {ENOTTY, EOPNOTSUPP, EPROTONOSUPPORT, ENOSYS};
    for (size_t i = 0; i < sizeof unavailable / sizeof unavailable[0]; i++)
        assert_int_equal(orb_devx_query_errno_status(unavailable[i], 1, KEY), ORB_EUNAVAILABLE);
    /* Anything else refuses the key: unknown handle, another object, a failed command, and
     * errors that prove nothing. */
    static const int refused[] = {ENOENT, EINVAL, EREMOTEIO, EACCES, EPERM, EFAULT, ENOMEM, EIO};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        assert_int_equal(orb_devx_query_errno_status(refused[i], 1, KEY), ORB_EPERM);
}

static void test_failed_command_is_refused(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    d.key.status = 0x05; /* the firmware does not know the key in this context */
    assert_int_equal(verify(&d, 1), ORB_EPERM);
}

static void test_bad_access_value(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    assert_int_equal(verify(&d, 3), ORB_EINVAL);
    assert_int_equal(verify(&d, 0), ORB_EINVAL);
}

/* ---- every field that must match --------------------------------------------------------------- */

static void test_each_mismatch_is_refused(void **state)
{
    (void)state;
    /* Written out so that each case names the field it spoils. */
    struct fake_device d;
#define EXPECT_REFUSED(stmt)                                                                              \
    do {                                                                                                  \
        d = good_device();                                                                                \
        stmt;                                                                                             \
        print_message("spoiled: %s\n", #stmt);                                                            \
        assert_int_equal(verify(&d, 1), ORB_EPERM);                                                       \
    } while (0)
    EXPECT_REFUSED(d.key.free = 1);
    EXPECT_REFUSED(d.key.variant ^= 1);
    EXPECT_REFUSED(d.key.access_mode = 1);                  /* MTT: direct, not KLM */
    EXPECT_REFUSED(d.key.access_mode = 3);                  /* KSM */
    EXPECT_REFUSED(d.key.access_mode = 2 | 4);              /* high mode bits set */
    EXPECT_REFUSED(d.key.umr_en = 1);
    EXPECT_REFUSED(d.key.bsf_en = 1);
    EXPECT_REFUSED(d.key.length64 = 1);
    EXPECT_REFUSED(d.key.atomic = 1);
    EXPECT_REFUSED(d.key.qpn = ORB_DEVX_QPN_WILDCARD);
    EXPECT_REFUSED(d.key.qpn = 0x1c3);
    EXPECT_REFUSED(d.key.rw = 1);                           /* both directions */
    EXPECT_REFUSED((d.key.rr = 0, d.key.rw = 1));           /* WRITE for a READ grant */
    EXPECT_REFUSED(d.key.rr = 0);                           /* no remote access at all */
    EXPECT_REFUSED(d.key.start_addr -= 1);
    EXPECT_REFUSED(d.key.len += 1);
    EXPECT_REFUSED(d.key.translations = 0);
    EXPECT_REFUSED(d.key.translations = 3);
    EXPECT_REFUSED(d.key.klm[0].byte_count = 0);
    EXPECT_REFUSED(d.key.klm[0].byte_count -= 1);           /* sum short of the length */
    EXPECT_REFUSED(d.key.klm[0].addr += 4096);              /* shifted window */
    EXPECT_REFUSED(d.key.klm[0].key = KEY);                 /* points at itself */
    EXPECT_REFUSED(d.key.klm[0].key = (KEY & ~0xFFu) | 7);  /* itself, other variant */
    EXPECT_REFUSED((d.key.translations = 2, d.key.klm[1].byte_count = 1, d.key.klm[1].key = PARENT,
                    d.key.klm[1].addr = ADDR + LEN));        /* covers one byte too many */
#undef EXPECT_REFUSED
}

/* ---- keys that pass ---------------------------------------------------------------------------- */

static void test_exact_read_key_passes_and_query_names_the_key(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    assert_int_equal(verify(&d, 1), 0);
    assert_int_equal(d.asked_key, KEY);
    assert_int_equal(d.asked_handle, HANDLE);
    assert_int_equal(d.asked_fd, 17);
}

static void test_exact_write_key_passes(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    d.key.rr = 0;
    d.key.rw = 1;
    assert_int_equal(verify(&d, 2), 0);
    assert_int_equal(verify(&d, 1), ORB_EPERM); /* the same key is no READ grant */
}

static void test_two_contiguous_entries_pass(void **state)
{
    (void)state;
    struct fake_device d = good_device();
    d.key.translations = 2;
    d.key.klm[0].byte_count = 0x1000;
    d.key.klm[1].byte_count = (uint32_t)LEN - 0x1000;
    d.key.klm[1].key = PARENT + 0x100; /* a second registration, contiguous in VA */
    d.key.klm[1].addr = ADDR + 0x1000;
    assert_int_equal(verify(&d, 1), 0);
    d.key.klm[1].addr += 1;
    assert_int_equal(verify(&d, 1), ORB_EPERM);
}

static void test_decode_reads_the_prm_fields(void **state)
{
    (void)state;
    struct fake_key k;
    memset(&k, 0, sizeof k);
    k.status = 0;
    k.free = 1;
    k.umr_en = 1;
    k.atomic = 1;
    k.rw = 1;
    k.access_mode = 0x1E; /* every mode bit but the lowest: 4_2 = 7, 1_0 = 2 */
    k.length64 = 1;
    k.qpn = 0xABCDEF;
    k.variant = 0x5A;
    k.start_addr = 0x0102030405060708ull;
    k.len = 0x1112131415161718ull;
    k.translations = 0x21222324;
    k.klm[1].byte_count = 0x31323334;
    k.klm[1].key = 0x41424344;
    k.klm[1].addr = 0x5152535455565758ull;
    uint8_t out[ORB_DEVX_QUERY_OUT_LEN];
    encode_key(&k, out);
    struct orb_devx_mkey m;
    assert_int_equal(orb_devx_decode_mkey(out, sizeof out, &m), 0);
    assert_int_equal(m.free, 1);
    assert_int_equal(m.umr_en, 1);
    assert_int_equal(m.atomic, 1);
    assert_int_equal(m.rw, 1);
    assert_int_equal(m.rr, 0);
    assert_int_equal(m.access_mode, 0x1E);
    assert_int_equal(m.length64, 1);
    assert_int_equal(m.bsf_en, 0);
    assert_int_equal(m.qpn, 0xABCDEF);
    assert_int_equal(m.variant, 0x5A);
    assert_int_equal(m.start_addr, 0x0102030405060708ull);
    assert_int_equal(m.len, 0x1112131415161718ull);
    assert_int_equal(m.translations, 0x21222324);
    assert_int_equal(m.klm[0].byte_count, 0);
    assert_int_equal(m.klm[1].byte_count, 0x31323334);
    assert_int_equal(m.klm[1].key, 0x41424344);
    assert_int_equal(m.klm[1].addr, 0x5152535455565758ull);

    /* QUERY_MKEY input: opcode 0x201, mkey index = key >> 8 at bytes 9..11, the rest zero. */
    uint8_t in[ORB_DEVX_QUERY_IN_LEN];
    orb_devx_encode_query(0xA1B2C3D4u, in);
    static const uint8_t expected[ORB_DEVX_QUERY_IN_LEN] = {0x02, 0x01, 0, 0, 0, 0, 0, 0,
                                                            0, 0xA1, 0xB2, 0xC3, 0, 0, 0, 0};
    assert_memory_equal(in, expected, sizeof expected);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_null_arguments),
        cmocka_unit_test(test_device_refusal_is_passed_through),
        cmocka_unit_test(test_unknown_handle_is_refused),
        cmocka_unit_test(test_handle_of_another_key_is_refused),
        cmocka_unit_test(test_kernel_errno_mapping),
        cmocka_unit_test(test_failed_command_is_refused),
        cmocka_unit_test(test_bad_access_value),
        cmocka_unit_test(test_each_mismatch_is_refused),
        cmocka_unit_test(test_exact_read_key_passes_and_query_names_the_key),
        cmocka_unit_test(test_exact_write_key_passes),
        cmocka_unit_test(test_two_contiguous_entries_pass),
        cmocka_unit_test(test_decode_reads_the_prm_fields),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
