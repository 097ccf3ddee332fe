/* The NVLink transport's control messages (lib/nvlink/nvlink_msg.c): what each decodes to, the
 * refusals of broken ones (each naming its field), and encoders refusing what no decoder would
 * take. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include <orbite/orbite.h>

#include "nvlink/nvlink_msg.h"

static void test_prefixes_are_checked(void **state)
{
    (void)state;
    uint8_t kind = 0;
    const uint8_t ok[4] = {ORB_NVL_END, ORB_NVL_VERSION, 0, 0};
    assert_int_equal(orb_nvl_kind_of(ok, 4, &kind), 0);
    assert_int_equal(kind, ORB_NVL_END);
    assert_int_equal(orb_nvl_kind_of(ok, 3, &kind), ORB_EPROTO);
    assert_int_equal(orb_nvl_kind_of(NULL, 4, &kind), ORB_EPROTO);
    const uint8_t version[4] = {ORB_NVL_END, 1, 0, 0}, reserved[4] = {ORB_NVL_END, ORB_NVL_VERSION, 0, 1};
    const uint8_t unknown[4] = {0, ORB_NVL_VERSION, 0, 0}, high[4] = {11, ORB_NVL_VERSION, 0, 0};
    assert_int_equal(orb_nvl_kind_of(version, 4, &kind), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "version"));
    assert_int_equal(orb_nvl_kind_of(reserved, 4, &kind), ORB_EPROTO);
    assert_int_equal(orb_nvl_kind_of(unknown, 4, &kind), ORB_EPROTO);
    assert_int_equal(orb_nvl_kind_of(high, 4, &kind), ORB_EPROTO);
}

static void test_hello_and_end_round_trip(void **state)
{
    (void)state;
    struct orb_nvl_hello h = {.ipc_namespace = 0xabcdef};
    for (int i = 0; i < 16; i++)
        h.boot[i] = (uint8_t)(100 + i);
    uint8_t buf[256];
    size_t len = 0;
    assert_int_equal(orb_nvl_hello_encode(ORB_NVL_HELLO, &h, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 4 + 16 + 8);
    struct orb_nvl_hello back;
    assert_int_equal(orb_nvl_hello_decode(ORB_NVL_HELLO_OK, buf, len, &back), ORB_EPROTO); /* the other kind */
    assert_int_equal(orb_nvl_hello_decode(ORB_NVL_HELLO, buf, len - 1, &back), ORB_EPROTO);
    assert_int_equal(orb_nvl_hello_decode(ORB_NVL_HELLO, buf, len, &back), 0);
    assert_memory_equal(&back, &h, sizeof h);
    assert_int_equal(orb_nvl_hello_encode(ORB_NVL_HELLO, &h, buf, len - 1, &len), ORB_EINVAL); /* no room */
    assert_int_equal(orb_nvl_hello_encode(ORB_NVL_END, &h, buf, sizeof buf, &len), ORB_EINVAL);

    uint64_t g = 0;
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END, 0, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_nvl_end_encode(ORB_NVL_END_OK, 42, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_nvl_end_decode(ORB_NVL_END, buf, len, &g), ORB_EPROTO);
    assert_int_equal(orb_nvl_end_decode(ORB_NVL_END_OK, buf, len, &g), 0);
    assert_int_equal(g, 42);
}

static void test_begin_checks_every_range(void **state)
{
    (void)state;
    struct orb_nvl_begin b = {.group = 9, .count = 2};
    b.ranges[0] = (struct orb_nvl_range){.op = ORB_OP_READ, .addr = 0x1000, .length = 10};
    b.ranges[1] = (struct orb_nvl_range){.op = ORB_OP_WRITE, .addr = UINT64_MAX - 10, .length = 10};
    uint8_t buf[1024];
    size_t len = 0;
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 4 + 16 + 2 * 24);
    struct orb_nvl_begin back;
    assert_int_equal(orb_nvl_begin_decode(ORB_NVL_BEGIN, buf, len, &back), 0);
    assert_int_equal(back.count, 2);
    assert_true(back.ranges[1].addr == UINT64_MAX - 10 && back.ranges[1].op == ORB_OP_WRITE);
    assert_int_equal(orb_nvl_begin_decode(ORB_NVL_QUERY, buf, len, &back), ORB_EPROTO); /* a BEGIN, not a QUERY */
    assert_int_equal(orb_nvl_begin_decode(ORB_NVL_BEGIN, buf, len - 24, &back), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "2 requests"));

    buf[4 + 16 + 24 + 0] = 2; /* the second request's operation */
    assert_int_equal(orb_nvl_begin_decode(ORB_NVL_BEGIN, buf, len, &back), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "operation 2"));
    buf[4 + 16 + 24 + 0] = ORB_OP_WRITE;
    buf[4 + 16 + 24 + 16] = 11; /* length 11 from UINT64_MAX - 10 wraps */
    assert_int_equal(orb_nvl_begin_decode(ORB_NVL_BEGIN, buf, len, &back), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "wrapping"));

    b.count = 0;
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, buf, sizeof buf, &len), ORB_EINVAL);
    b.count = ORB_NVL_GROUP_MAX + 1;
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, buf, sizeof buf, &len), ORB_EINVAL);
    b.count = 1;
    b.ranges[0].length = 0;
    assert_int_equal(orb_nvl_begin_encode(ORB_NVL_BEGIN, &b, buf, sizeof buf, &len), ORB_EINVAL);
}

static void test_begin_ok_names_allocations_and_causes(void **state)
{
    (void)state;
    struct orb_nvl_begin_ok m;
    memset(&m, 0, sizeof m);
    m.group = 5;
    m.count = 3;
    m.nallocs = 1;
    m.allocs[0] = (struct orb_nvl_alloc){.base = 0xd000, .size = 4096, .share = ORB_NVL_SHARE_LEGACY};
    memset(m.allocs[0].handle, 0xab, sizeof m.allocs[0].handle);
    m.grants[1].status = ORB_EPERM;
    strcpy(m.grants[1].why, "not whole");
    uint8_t buf[4096];
    size_t len = 0;
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), 0);
    struct orb_nvl_begin_ok back;
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), 0);
    assert_int_equal(back.nallocs, 1);
    assert_memory_equal(back.allocs[0].handle, m.allocs[0].handle, ORB_NVL_HANDLE_LEN);
    assert_int_equal(back.grants[1].status, ORB_EPERM);
    assert_string_equal(back.grants[1].why, "not whole");
    assert_string_equal(back.grants[2].why, "");

    /* A cause's bytes reach a log and a report: unprintable ones are replaced. */
    size_t at = len - 8 - 9 + 2; /* "not whole" (before the last grant): its third byte */
    assert_int_equal(buf[at], 't');
    buf[at] = '\n';
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), 0);
    assert_string_equal(back.grants[1].why, "no? whole");

    /* An answer may not name an allocation it does not carry, nor one for a refusal. */
    m.grants[2].alloc = 1;
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), ORB_EINVAL);
    m.grants[2].alloc = 0;
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), 0);
    size_t grant2 = len - 8; /* the last grant: i32 status | u16 alloc | u8 why | u8 0 */
    buf[grant2 + 4] = 1;
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), ORB_EPROTO);
    assert_non_null(strstr(orb_last_error(), "allocation 1 of 1"));
    buf[grant2 + 4] = 0;
    buf[grant2] = 3; /* a positive status */
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), ORB_EPROTO);
    m.nallocs = 4; /* more allocations than requests */
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), ORB_EINVAL);
}

/* An allocation says how it is shared: by a legacy handle or a descriptor's, nothing else; a
 * descriptor's handle packs its channel, serial and token with reserved bytes zero. */
static void test_allocations_say_how_they_are_shared(void **state)
{
    (void)state;
    struct orb_nvl_begin_ok m;
    memset(&m, 0, sizeof m);
    m.group = 9;
    m.count = 1;
    m.nallocs = 1;
    struct orb_nvl_fd_handle h = {.serial = 77};
    for (int i = 0; i < 16; i++)
        h.channel[i] = (uint8_t)(i + 1);
    for (int i = 0; i < 32; i++)
        h.token[i] = (uint8_t)(0x80 + i);
    m.allocs[0] = (struct orb_nvl_alloc){.base = 0xe000, .size = 2u << 20, .share = ORB_NVL_SHARE_FD};
    orb_nvl_fd_handle_pack(&h, m.allocs[0].handle);
    uint8_t buf[1024];
    size_t len = 0;
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), 0);
    struct orb_nvl_begin_ok back;
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), 0);
    assert_int_equal(back.allocs[0].share, ORB_NVL_SHARE_FD);
    struct orb_nvl_fd_handle hb;
    assert_int_equal(orb_nvl_fd_handle_unpack(back.allocs[0].handle, &hb), 0);
    assert_memory_equal(hb.channel, h.channel, sizeof h.channel);
    assert_memory_equal(hb.token, h.token, sizeof h.token);
    assert_true(hb.serial == 77);
    back.allocs[0].handle[16 + 8 + 3] = 1; /* a reserved byte of the handle */
    assert_int_equal(orb_nvl_fd_handle_unpack(back.allocs[0].handle, &hb), ORB_EPROTO);
    size_t share_at = 4 + 16 + 16; /* prefix, header, base and size */
    assert_int_equal(buf[share_at], ORB_NVL_SHARE_FD);
    buf[share_at] = 3;
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), ORB_EPROTO);
    buf[share_at] = ORB_NVL_SHARE_FD;
    buf[share_at + 2] = 1; /* its padding */
    assert_int_equal(orb_nvl_begin_ok_decode(ORB_NVL_BEGIN_OK, buf, len, &back), ORB_EPROTO);
    m.allocs[0].share = 0;
    assert_int_equal(orb_nvl_begin_ok_encode(ORB_NVL_BEGIN_OK, &m, buf, sizeof buf, &len), ORB_EINVAL);
}

/* FETCH and FETCH_OK: every field checked, a refusal carries no size and a success one. */
static void test_fetch_round_trip(void **state)
{
    (void)state;
    struct orb_nvl_fetch f = {.alloc = 15};
    memset(f.token, 0x5c, sizeof f.token);
    uint8_t buf[128];
    size_t len = 0;
    assert_int_equal(orb_nvl_fetch_encode(&f, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 44);
    struct orb_nvl_fetch fb;
    assert_int_equal(orb_nvl_fetch_decode(buf, len, &fb), 0);
    assert_int_equal(fb.alloc, 15);
    assert_memory_equal(fb.token, f.token, sizeof f.token);
    assert_int_equal(orb_nvl_fetch_decode(buf, len - 1, &fb), ORB_EPROTO);
    buf[4] = 16;
    assert_int_equal(orb_nvl_fetch_decode(buf, len, &fb), ORB_EPROTO);
    f.alloc = 16;
    assert_int_equal(orb_nvl_fetch_encode(&f, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_nvl_fetch_encode(&(struct orb_nvl_fetch){.alloc = 0}, buf, 43, &len), ORB_EINVAL);

    struct orb_nvl_fetch_ok ok = {.status = 0, .size = 4u << 20}, okb;
    assert_int_equal(orb_nvl_fetch_ok_encode(&ok, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 20);
    assert_int_equal(orb_nvl_fetch_ok_decode(buf, len, &okb), 0);
    assert_true(okb.status == 0 && okb.size == 4u << 20);
    assert_int_equal(orb_nvl_fetch_decode(buf, len, &fb), ORB_EPROTO); /* another kind */
    ok = (struct orb_nvl_fetch_ok){.status = ORB_ENOENT, .size = 0};
    assert_int_equal(orb_nvl_fetch_ok_encode(&ok, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_nvl_fetch_ok_decode(buf, len, &okb), 0);
    assert_int_equal(okb.status, ORB_ENOENT);
    ok.size = 1; /* a refusal with a size */
    assert_int_equal(orb_nvl_fetch_ok_encode(&ok, buf, sizeof buf, &len), ORB_EINVAL);
    ok = (struct orb_nvl_fetch_ok){.status = 0, .size = 0}; /* a success without one */
    assert_int_equal(orb_nvl_fetch_ok_encode(&ok, buf, sizeof buf, &len), ORB_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prefixes_are_checked),
        cmocka_unit_test(test_hello_and_end_round_trip),
        cmocka_unit_test(test_begin_checks_every_range),
        cmocka_unit_test(test_begin_ok_names_allocations_and_causes),
        cmocka_unit_test(test_allocations_say_how_they_are_shared),
        cmocka_unit_test(test_fetch_round_trip),
    };
    return cmocka_run_group_tests_name("nvlink_msg", tests, NULL, NULL);
}
