/* The same-host transport's messages (lib/samehost/shm_msg.c): one literal byte vector of each
 * kind (so that a layout change fails here), round trips, and for every decoder its refusals
 * (reserved bytes, lengths, kind and version, each field's limits), each of which must leave the
 * output untouched; the encoders' refusals; the SETUP memory's arithmetic. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include <orbite/orbite.h>

#include "samehost/ring.h"
#include "samehost/shm_msg.h"

#define GOOD_ID "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
#define ENTRY ORB_SH_RING_ENTRY

/* ---- the literal vectors ---------------------------------------------------------------------- */

static const uint8_t info_bytes[ORB_SHM_INFO_LEN] = {0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};

static const uint8_t info_ok_bytes[ORB_SHM_INFO_OK_LEN] = {
    0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    '0', 'f', '1', 'e', '2', 'd', '3', 'c', '-', '4', 'b', '5', 'a', '-', '6', '9', '7', '8', '-',
    '8', '7', '9', '6', '-', 'a', '5', 'b', '4', 'c', '3', 'd', '2', 'e', '1', 'f', '0',
    0x00, 0x00, 0x00, 0x00,
    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
};

/* WRITE of 0x1000 bytes at 0x1122334455667788. */
static const uint8_t query_bytes[ORB_SHM_QUERY_LEN] = {
    0x03, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x88, 0x77, 0x66, 0x55,
    0x44, 0x33, 0x22, 0x11, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* status 0, registration of 0x10000 bytes at 0x1122334455667000. */
static const uint8_t query_ok_bytes[ORB_SHM_QUERY_OK_LEN] = {
    0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x70, 0x66, 0x55,
    0x44, 0x33, 0x22, 0x11, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* request capacity 256, completion capacity 64, 0x6000 bytes (192 + 256 x 64 = 16576, then
 * 192 + 64 x 64 = 4288: 20864, rounded up to the page). */
static const uint8_t setup_bytes[ORB_SHM_SETUP_LEN] = {
    0x10, 0x01, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x60, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* SETUP_OK refused with ORB_EBUSY (-7). */
static const uint8_t setup_ok_bytes[ORB_SHM_SETUP_OK_LEN] = {0x11, 0x01, 0x00, 0x00, 0xf9, 0xff, 0xff, 0xff};

/* map 7, writable, 2 MiB at offset 0x3000 of its file. */
static const uint8_t map_bytes[ORB_SHM_MAP_LEN] = {
    0x12, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x30, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00,
};

/* MAP_OK of map 7, status 0. */
static const uint8_t map_ok_bytes[ORB_SHM_MAP_OK_LEN] = {
    0x13, 0x01, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

static const uint8_t unmap_bytes[ORB_SHM_UNMAP_LEN] = {0x14, 0x01, 0x00, 0x00, 0x04, 0x03, 0x02, 0x01};

/* tag 0x0102030405060708, READ, map 3 at offset 0x1000, 0x800 bytes at 0x7f0000001000 of the
 * request [0x7f0000000000, +0x4000). */
static const uint8_t request_bytes[ENTRY] = {
    0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01, /* tag */
    0x00, 0x00, 0x00, 0x00,                         /* op, 3 zero */
    0x03, 0x00, 0x00, 0x00,                         /* map id */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* map offset */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, /* remote addr */
    0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* length */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, /* request addr */
    0x00, 0x40, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* request length */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* 0 */
};

/* tag 0x1112131415161718, ORB_EPERM (-4), effect UNKNOWN, "denied". */
static const uint8_t completion_bytes[ENTRY] = {
    0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11, /* tag */
    0xfc, 0xff, 0xff, 0xff,                         /* status */
    0x01, 0x00, 0x00, 0x00,                         /* effect, 3 zero */
    'd', 'e', 'n', 'i', 'e', 'd', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
};

/* ---- a table of decoders ---------------------------------------------------------------------- */

union any_out {
    struct orb_shm_info info;
    struct orb_shm_query query;
    struct orb_shm_query_ok query_ok;
    struct orb_shm_setup setup;
    struct orb_shm_map map;
    struct orb_shm_status status;
    uint32_t map_id;
    struct orb_shm_request request;
    struct orb_shm_completion completion;
    uint8_t raw[160];
};

static int dec_info(const uint8_t *b, size_t n, union any_out *o) { (void)o; return orb_shm_info_decode(b, n); }
static int dec_info_ok(const uint8_t *b, size_t n, union any_out *o) { return orb_shm_info_ok_decode(b, n, &o->info); }
static int dec_query(const uint8_t *b, size_t n, union any_out *o) { return orb_shm_query_decode(b, n, &o->query); }
static int dec_query_ok(const uint8_t *b, size_t n, union any_out *o)
{
    return orb_shm_query_ok_decode(b, n, &o->query_ok);
}
static int dec_setup(const uint8_t *b, size_t n, union any_out *o) { return orb_shm_setup_decode(b, n, &o->setup); }
static int dec_setup_ok(const uint8_t *b, size_t n, union any_out *o)
{
    return orb_shm_status_decode(ORB_SHM_SETUP_OK, b, n, &o->status);
}
static int dec_map(const uint8_t *b, size_t n, union any_out *o) { return orb_shm_map_decode(b, n, &o->map); }
static int dec_map_ok(const uint8_t *b, size_t n, union any_out *o)
{
    return orb_shm_status_decode(ORB_SHM_MAP_OK, b, n, &o->status);
}
static int dec_unmap(const uint8_t *b, size_t n, union any_out *o) { return orb_shm_unmap_decode(b, n, &o->map_id); }
static int dec_request(const uint8_t *b, size_t n, union any_out *o)
{
    assert_int_equal(n, ENTRY);
    return orb_shm_request_decode(b, &o->request);
}
static int dec_completion(const uint8_t *b, size_t n, union any_out *o)
{
    assert_int_equal(n, ENTRY);
    return orb_shm_completion_decode(b, &o->completion);
}

struct decoder {
    const char *name;
    int (*decode)(const uint8_t *, size_t, union any_out *);
    const uint8_t *golden;
    size_t len;
    int message; /* 1: a message with a header and a length; 0: a ring entry */
    uint8_t reserved[16]; /* offsets of reserved bytes beyond the header's (0 ends the list) */
};

static const struct decoder decoders[] = {
    {"INFO", dec_info, info_bytes, sizeof info_bytes, 1, {4, 5, 6, 7}},
    {"INFO_OK", dec_info_ok, info_ok_bytes, sizeof info_ok_bytes, 1, {4, 5, 6, 7, 44, 45, 46, 47}},
    {"QUERY", dec_query, query_bytes, sizeof query_bytes, 1, {5, 6, 7}},
    {"QUERY_OK", dec_query_ok, query_ok_bytes, sizeof query_ok_bytes, 1, {0}},
    {"SETUP", dec_setup, setup_bytes, sizeof setup_bytes, 1, {12, 13, 14, 15}},
    {"SETUP_OK", dec_setup_ok, setup_ok_bytes, sizeof setup_ok_bytes, 1, {0}},
    {"MAP", dec_map, map_bytes, sizeof map_bytes, 1, {9, 10, 11, 12, 13, 14, 15}},
    {"MAP_OK", dec_map_ok, map_ok_bytes, sizeof map_ok_bytes, 1, {12, 13, 14, 15}},
    {"UNMAP", dec_unmap, unmap_bytes, sizeof unmap_bytes, 1, {0}},
    {"REQUEST", dec_request, request_bytes, ENTRY, 0, {9, 10, 11, 56, 57, 58, 59, 60, 61, 62, 63}},
    {"COMPLETION", dec_completion, completion_bytes, ENTRY, 0, {13, 14, 15}},
};
#define NDECODERS (sizeof decoders / sizeof decoders[0])

static const struct decoder *find(const char *name)
{
    for (size_t i = 0; i < NDECODERS; i++)
        if (strcmp(decoders[i].name, name) == 0)
            return &decoders[i];
    fail_msg("no decoder %s", name);
    return NULL;
}

/* `buf` (len bytes) is refused with ORB_EPROTO and the output is left as it was. */
static void expect_refused(const struct decoder *d, const uint8_t *buf, size_t len, const char *why)
{
    union any_out out;
    memset(&out, 0xA5, sizeof out);
    int rc = d->decode(buf, len, &out);
    if (rc != ORB_EPROTO)
        fail_msg("%s (%s): decode returned %d, not ORB_EPROTO", d->name, why, rc);
    for (size_t i = 0; i < sizeof out; i++)
        if (out.raw[i] != 0xA5)
            fail_msg("%s (%s): output byte %zu written by a refused decode", d->name, why, i);
    if (strstr(orb_last_error(), "shm: ") == NULL)
        fail_msg("%s (%s): message \"%s\" does not start with shm:", d->name, why, orb_last_error());
}

static void set_le(uint8_t *p, size_t off, uint64_t v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        p[off + i] = (uint8_t)(v >> (8 * i));
}

/* The golden bytes of `name` with `n` bytes at `off` set to v, refused. */
static void refuse_field(const char *name, size_t off, uint64_t v, size_t n, const char *why)
{
    const struct decoder *d = find(name);
    uint8_t buf[ENTRY + 8];
    memcpy(buf, d->golden, d->len);
    set_le(buf, off, v, n);
    expect_refused(d, buf, d->len, why);
}

/* The same, accepted. */
static void accept_field(const char *name, size_t off, uint64_t v, size_t n)
{
    const struct decoder *d = find(name);
    uint8_t buf[ENTRY + 8];
    memcpy(buf, d->golden, d->len);
    set_le(buf, off, v, n);
    union any_out out;
    if (d->decode(buf, d->len, &out) != 0)
        fail_msg("%s: %llu at %zu refused: %s", name, (unsigned long long)v, off, orb_last_error());
}

/* ---- tests ------------------------------------------------------------------------------------ */

static void test_golden_vectors_decode(void **state)
{
    (void)state;
    union any_out o;
    assert_int_equal(orb_shm_info_decode(info_bytes, sizeof info_bytes), 0);

    assert_int_equal(orb_shm_info_ok_decode(info_ok_bytes, sizeof info_ok_bytes, &o.info), 0);
    assert_string_equal(o.info.boot_id, GOOD_ID);
    for (unsigned i = 0; i < ORB_SHM_ID_LEN; i++)
        assert_int_equal(o.info.id[i], 0xa0 + i);

    assert_int_equal(orb_shm_query_decode(query_bytes, sizeof query_bytes, &o.query), 0);
    assert_int_equal(o.query.op, ORB_OP_WRITE);
    assert_true(o.query.addr == 0x1122334455667788ull && o.query.length == 0x1000);

    assert_int_equal(orb_shm_query_ok_decode(query_ok_bytes, sizeof query_ok_bytes, &o.query_ok), 0);
    assert_int_equal(o.query_ok.status, 0);
    assert_true(o.query_ok.base == 0x1122334455667000ull && o.query_ok.length == 0x10000);

    assert_int_equal(orb_shm_setup_decode(setup_bytes, sizeof setup_bytes, &o.setup), 0);
    assert_int_equal(o.setup.request_capacity, 256);
    assert_int_equal(o.setup.completion_capacity, 64);
    assert_true(o.setup.bytes == 0x6000);

    memset(&o, 0xA5, sizeof o);
    assert_int_equal(orb_shm_status_decode(ORB_SHM_SETUP_OK, setup_ok_bytes, sizeof setup_ok_bytes, &o.status), 0);
    assert_int_equal(o.status.status, ORB_EBUSY);
    assert_int_equal(o.status.map_id, 0);

    assert_int_equal(orb_shm_map_decode(map_bytes, sizeof map_bytes, &o.map), 0);
    assert_int_equal(o.map.map_id, 7);
    assert_int_equal(o.map.writable, 1);
    assert_true(o.map.file_offset == 0x3000);
    assert_true(o.map.length == 2u << 20);

    assert_int_equal(orb_shm_status_decode(ORB_SHM_MAP_OK, map_ok_bytes, sizeof map_ok_bytes, &o.status), 0);
    assert_int_equal(o.status.map_id, 7);
    assert_int_equal(o.status.status, 0);

    assert_int_equal(orb_shm_unmap_decode(unmap_bytes, sizeof unmap_bytes, &o.map_id), 0);
    assert_int_equal(o.map_id, 0x01020304);

    assert_int_equal(orb_shm_request_decode(request_bytes, &o.request), 0);
    assert_true(o.request.tag == 0x0102030405060708ull);
    assert_int_equal(o.request.op, ORB_OP_READ);
    assert_int_equal(o.request.map_id, 3);
    assert_true(o.request.map_offset == 0x1000 && o.request.remote_addr == 0x7f0000001000ull &&
                o.request.length == 0x800 && o.request.request_addr == 0x7f0000000000ull &&
                o.request.request_length == 0x4000);

    memset(&o, 0xA5, sizeof o);
    assert_int_equal(orb_shm_completion_decode(completion_bytes, &o.completion), 0);
    assert_true(o.completion.tag == 0x1112131415161718ull);
    assert_int_equal(o.completion.status, ORB_EPERM);
    assert_int_equal(o.completion.effect, ORB_REMOTE_EFFECT_UNKNOWN);
    assert_string_equal(o.completion.why, "denied");
    for (size_t i = strlen("denied"); i < sizeof o.completion.why; i++)
        assert_int_equal(o.completion.why[i], 0);
}

/* Encode `len` bytes into a buffer one byte larger than needed and compare with `want`. */
#define EXPECT_BYTES(call, want)                                                                  \
    do {                                                                                          \
        uint8_t buf_[sizeof(want) + 1];                                                           \
        memset(buf_, 0xEE, sizeof buf_);                                                          \
        size_t len_ = 0;                                                                          \
        assert_int_equal(call, 0);                                                                \
        assert_int_equal(len_, sizeof(want));                                                     \
        assert_memory_equal(buf_, want, sizeof(want));                                            \
        assert_int_equal(buf_[sizeof(want)], 0xEE);                                               \
    } while (0)

static void test_golden_vectors_encode(void **state)
{
    (void)state;
    EXPECT_BYTES(orb_shm_info_encode(buf_, sizeof buf_, &len_), info_bytes);

    struct orb_shm_info info = {GOOD_ID, {0}};
    for (unsigned i = 0; i < ORB_SHM_ID_LEN; i++)
        info.id[i] = (uint8_t)(0xa0 + i);
    EXPECT_BYTES(orb_shm_info_ok_encode(&info, buf_, sizeof buf_, &len_), info_ok_bytes);

    struct orb_shm_query q = {ORB_OP_WRITE, 0x1122334455667788ull, 0x1000};
    EXPECT_BYTES(orb_shm_query_encode(&q, buf_, sizeof buf_, &len_), query_bytes);

    struct orb_shm_query_ok qok = {0, 0x1122334455667000ull, 0x10000};
    EXPECT_BYTES(orb_shm_query_ok_encode(&qok, buf_, sizeof buf_, &len_), query_ok_bytes);

    struct orb_shm_setup s = {256, 64, 0x6000};
    EXPECT_BYTES(orb_shm_setup_encode(&s, buf_, sizeof buf_, &len_), setup_bytes);

    struct orb_shm_status st = {0, ORB_EBUSY};
    EXPECT_BYTES(orb_shm_status_encode(ORB_SHM_SETUP_OK, &st, buf_, sizeof buf_, &len_), setup_ok_bytes);

    struct orb_shm_map m = {7, 1, 0x3000, 2u << 20};
    EXPECT_BYTES(orb_shm_map_encode(&m, buf_, sizeof buf_, &len_), map_bytes);

    struct orb_shm_status mok = {7, 0};
    EXPECT_BYTES(orb_shm_status_encode(ORB_SHM_MAP_OK, &mok, buf_, sizeof buf_, &len_), map_ok_bytes);

    EXPECT_BYTES(orb_shm_unmap_encode(0x01020304, buf_, sizeof buf_, &len_), unmap_bytes);

    uint8_t e[ENTRY];
    struct orb_shm_request r = {0x0102030405060708ull, ORB_OP_READ, 3, 0x1000, 0x7f0000001000ull, 0x800,
                                0x7f0000000000ull, 0x4000};
    memset(e, 0xEE, sizeof e);
    assert_int_equal(orb_shm_request_encode(&r, e), 0);
    assert_memory_equal(e, request_bytes, ENTRY);

    struct orb_shm_completion c = {0x1112131415161718ull, ORB_EPERM, ORB_REMOTE_EFFECT_UNKNOWN, "denied"};
    memset(e, 0xEE, sizeof e);
    assert_int_equal(orb_shm_completion_encode(&c, e), 0);
    assert_memory_equal(e, completion_bytes, ENTRY);
}

static void test_round_trips(void **state)
{
    (void)state;
    uint8_t buf[ORB_SHM_INFO_OK_LEN];
    size_t len = 0;

    struct orb_shm_info info = {"ffffffff-0000-1111-2222-abcdef012345", {0}}, info2;
    memset(info.id, 0xff, sizeof info.id);
    assert_int_equal(orb_shm_info_ok_encode(&info, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_shm_info_ok_decode(buf, len, &info2), 0);
    assert_memory_equal(&info, &info2, sizeof info);

    static const struct orb_shm_query queries[] = {
        {ORB_OP_READ, 0, 1}, {ORB_OP_WRITE, UINT64_MAX - 1, 1}, {ORB_OP_READ, 1, UINT64_MAX - 1}};
    for (size_t i = 0; i < sizeof queries / sizeof queries[0]; i++) {
        struct orb_shm_query q2;
        assert_int_equal(orb_shm_query_encode(&queries[i], buf, sizeof buf, &len), 0);
        assert_int_equal(len, ORB_SHM_QUERY_LEN);
        assert_int_equal(orb_shm_query_decode(buf, len, &q2), 0);
        assert_true(q2.op == queries[i].op && q2.addr == queries[i].addr && q2.length == queries[i].length);
    }

    for (int32_t status = ORB_EAGAIN; status <= 0; status++) {
        struct orb_shm_query_ok q = {status, status == 0 ? 4096 : 0, status == 0 ? 8192 : 0}, q2;
        assert_int_equal(orb_shm_query_ok_encode(&q, buf, sizeof buf, &len), 0);
        assert_int_equal(orb_shm_query_ok_decode(buf, len, &q2), 0);
        assert_true(q2.status == q.status && q2.base == q.base && q2.length == q.length);

        struct orb_shm_status s = {0, status}, s2;
        assert_int_equal(orb_shm_status_encode(ORB_SHM_SETUP_OK, &s, buf, sizeof buf, &len), 0);
        assert_int_equal(len, ORB_SHM_SETUP_OK_LEN);
        assert_int_equal(orb_shm_status_decode(ORB_SHM_SETUP_OK, buf, len, &s2), 0);
        assert_true(s2.map_id == 0 && s2.status == status);
        s.map_id = UINT32_MAX;
        assert_int_equal(orb_shm_status_encode(ORB_SHM_MAP_OK, &s, buf, sizeof buf, &len), 0);
        assert_int_equal(len, ORB_SHM_MAP_OK_LEN);
        assert_int_equal(orb_shm_status_decode(ORB_SHM_MAP_OK, buf, len, &s2), 0);
        assert_true(s2.map_id == UINT32_MAX && s2.status == status);

        struct orb_shm_completion c = {(uint64_t)-status, status, (uint8_t)(status & 1), "", }, c2;
        snprintf(c.why, sizeof c.why, "status %d", status);
        uint8_t e[ENTRY];
        assert_int_equal(orb_shm_completion_encode(&c, e), 0);
        assert_int_equal(orb_shm_completion_decode(e, &c2), 0);
        assert_true(c2.tag == c.tag && c2.status == c.status && c2.effect == c.effect);
        assert_string_equal(c2.why, c.why);
    }

    for (uint32_t rc = 1; rc <= ORB_SHM_RING_MAX; rc <<= 1)
        for (uint32_t cc = 1; cc <= ORB_SHM_RING_MAX; cc <<= 1) {
            struct orb_shm_setup s = {rc, cc, orb_shm_setup_bytes(rc, cc)}, s2;
            assert_int_equal(orb_shm_setup_encode(&s, buf, sizeof buf, &len), 0);
            assert_int_equal(orb_shm_setup_decode(buf, len, &s2), 0);
            assert_true(s2.request_capacity == rc && s2.completion_capacity == cc && s2.bytes == s.bytes);
        }

    static const struct orb_shm_map maps[] = {
        {1, 0, 0, 4096}, {ORB_SHM_MAPS_MAX, 1, 1ull << 63, ORB_SHM_MAP_LEN_MAX}, {2, 0, UINT64_MAX - 8191, 4096}};
    for (size_t i = 0; i < sizeof maps / sizeof maps[0]; i++) {
        struct orb_shm_map m2;
        assert_int_equal(orb_shm_map_encode(&maps[i], buf, sizeof buf, &len), 0);
        assert_int_equal(orb_shm_map_decode(buf, len, &m2), 0);
        assert_true(m2.map_id == maps[i].map_id && m2.writable == maps[i].writable &&
                    m2.file_offset == maps[i].file_offset && m2.length == maps[i].length);
    }

    uint32_t id = 0;
    assert_int_equal(orb_shm_unmap_encode(UINT32_MAX, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_shm_unmap_decode(buf, len, &id), 0);
    assert_int_equal(id, UINT32_MAX);

    /* A piece that is the whole request, one at its end, and one ending at the top of memory. */
    static const struct orb_shm_request reqs[] = {
        {1, ORB_OP_WRITE, 1, 0, 100, 50, 100, 50},
        {2, ORB_OP_READ, 9, 4096, 0x2000, 0x1000, 0x1000, 0x2000},
        {3, ORB_OP_READ, 9, 0, UINT64_MAX - 10, 10, UINT64_MAX - 20, 20},
    };
    for (size_t i = 0; i < sizeof reqs / sizeof reqs[0]; i++) {
        uint8_t e[ENTRY];
        struct orb_shm_request r2;
        assert_int_equal(orb_shm_request_encode(&reqs[i], e), 0);
        assert_int_equal(orb_shm_request_decode(e, &r2), 0);
        assert_true(r2.tag == reqs[i].tag && r2.op == reqs[i].op && r2.map_id == reqs[i].map_id &&
                    r2.map_offset == reqs[i].map_offset && r2.remote_addr == reqs[i].remote_addr &&
                    r2.length == reqs[i].length && r2.request_addr == reqs[i].request_addr &&
                    r2.request_length == reqs[i].request_length);
    }
}

static void test_completion_why_sanitised(void **state)
{
    (void)state;
    uint8_t e[ENTRY];
    struct orb_shm_completion c = {1, ORB_EPROTO, 0, "", }, c2;
    memcpy(c.why, "a\x01" "b\x7f" "c\xff" "d\n", 8);
    assert_int_equal(orb_shm_completion_encode(&c, e), 0);
    assert_memory_equal(e + 16, "a?b?c?d?", 8);
    for (size_t i = 24; i < ENTRY; i++)
        assert_int_equal(e[i], 0);
    assert_int_equal(orb_shm_completion_decode(e, &c2), 0);
    assert_string_equal(c2.why, "a?b?c?d?");

    /* Longer than the field: its first ORB_SHM_WHY_MAX bytes, decoded NUL-terminated. */
    memset(c.why, 'x', sizeof c.why);
    assert_int_equal(orb_shm_completion_encode(&c, e), 0);
    for (size_t i = 16; i < ENTRY; i++)
        assert_int_equal(e[i], 'x');
    memset(&c2, 0xA5, sizeof c2);
    assert_int_equal(orb_shm_completion_decode(e, &c2), 0);
    assert_int_equal(strlen(c2.why), ORB_SHM_WHY_MAX);
    assert_int_equal(c2.why[ORB_SHM_WHY_MAX], 0);
}

static void test_refusals_common(void **state)
{
    (void)state;
    for (size_t i = 0; i < NDECODERS; i++) {
        const struct decoder *d = &decoders[i];
        uint8_t buf[ENTRY + 8];
        char why[64];
        /* The golden bytes decode. */
        union any_out out;
        assert_int_equal(d->decode(d->golden, d->len, &out), 0);
        /* Every reserved byte, alone, set. */
        uint8_t offs[20];
        size_t n = 0;
        if (d->message) {
            offs[n++] = 2;
            offs[n++] = 3;
        }
        for (size_t k = 0; k < sizeof d->reserved && d->reserved[k] != 0; k++)
            offs[n++] = d->reserved[k];
        for (size_t k = 0; k < n; k++)
            for (unsigned v = 0x01; v <= 0x80; v <<= 7) {
                memcpy(buf, d->golden, d->len);
                buf[offs[k]] = (uint8_t)v;
                snprintf(why, sizeof why, "reserved byte %u = %#x", offs[k], v);
                expect_refused(d, buf, d->len, why);
            }
        if (!d->message)
            continue;
        /* Lengths. */
        memset(buf, 0, sizeof buf);
        memcpy(buf, d->golden, d->len);
        expect_refused(d, buf, d->len - 1, "len - 1");
        expect_refused(d, buf, d->len + 1, "len + 1");
        expect_refused(d, buf, 0, "len 0");
        expect_refused(d, buf, 3, "len 3");
        /* Kind and version. */
        static const uint8_t kinds[] = {0, 1, 2, 3, 4, 5, 15, 16, 17, 18, 19, 20, 21, 255};
        for (size_t k = 0; k < sizeof kinds; k++) {
            if (kinds[k] == d->golden[0])
                continue;
            memcpy(buf, d->golden, d->len);
            buf[0] = kinds[k];
            snprintf(why, sizeof why, "kind %u", kinds[k]);
            expect_refused(d, buf, d->len, why);
        }
        static const uint8_t versions[] = {0, 2, 255};
        for (size_t k = 0; k < sizeof versions; k++) {
            memcpy(buf, d->golden, d->len);
            buf[1] = versions[k];
            snprintf(why, sizeof why, "version %u", versions[k]);
            expect_refused(d, buf, d->len, why);
        }
    }
}

static void test_refusals_control(void **state)
{
    (void)state;
    /* INFO_OK: the boot id. */
    refuse_field("INFO_OK", 8, 'A', 1, "boot id upper case");
    refuse_field("INFO_OK", 8, 'g', 1, "boot id not hex");
    refuse_field("INFO_OK", 16, '0', 1, "boot id dash missing");
    refuse_field("INFO_OK", 17, '-', 1, "boot id dash misplaced");
    refuse_field("INFO_OK", 43, 0, 1, "boot id NUL");
    accept_field("INFO_OK", 48, 0, 8); /* the id is any 16 bytes */

    /* QUERY: op, length, overflow. */
    refuse_field("QUERY", 4, 2, 1, "op 2");
    refuse_field("QUERY", 4, 7, 1, "op 7");
    refuse_field("QUERY", 4, 255, 1, "op 255");
    refuse_field("QUERY", 16, 0, 8, "length 0");
    refuse_field("QUERY", 8, UINT64_MAX, 8, "addr + length overflows");
    refuse_field("QUERY", 8, UINT64_MAX - 0xfff, 8, "addr + length is 2^64");
    accept_field("QUERY", 8, UINT64_MAX - 0x1000, 8);
    accept_field("QUERY", 4, ORB_OP_READ, 1);

    /* QUERY_OK: status, and its range. */
    refuse_field("QUERY_OK", 4, 1, 4, "status 1");
    refuse_field("QUERY_OK", 4, (uint32_t)(ORB_EAGAIN - 1), 4, "status below the codes");
    refuse_field("QUERY_OK", 4, 0x80000000u, 4, "status INT32_MIN");
    refuse_field("QUERY_OK", 16, 0, 8, "status 0, length 0");
    refuse_field("QUERY_OK", 8, UINT64_MAX - 0xffff, 8, "status 0, range overflows");
    {
        const struct decoder *d = find("QUERY_OK");
        uint8_t buf[ORB_SHM_QUERY_OK_LEN];
        union any_out out;
        memcpy(buf, d->golden, sizeof buf);
        set_le(buf, 4, (uint32_t)ORB_ENOENT, 4);
        expect_refused(d, buf, sizeof buf, "refusal with base and length");
        set_le(buf, 8, 0, 8);
        expect_refused(d, buf, sizeof buf, "refusal with a length");
        set_le(buf, 8, 1, 8);
        set_le(buf, 16, 0, 8);
        expect_refused(d, buf, sizeof buf, "refusal with a base");
        set_le(buf, 8, 0, 8);
        assert_int_equal(d->decode(buf, sizeof buf, &out), 0);
        assert_int_equal(out.query_ok.status, ORB_ENOENT);
    }
}

static void test_refusals_socket(void **state)
{
    (void)state;
    /* SETUP: capacities and bytes. */
    static const uint32_t bad_caps[] = {0, 3, 6, 8192, 0x80000000u, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_caps / sizeof bad_caps[0]; i++) {
        refuse_field("SETUP", 4, bad_caps[i], 4, "request capacity");
        refuse_field("SETUP", 8, bad_caps[i], 4, "completion capacity");
    }
    refuse_field("SETUP", 16, 0x6001, 8, "bytes + 1");
    refuse_field("SETUP", 16, 0x5000, 8, "bytes - 4096");
    refuse_field("SETUP", 16, 0x7000, 8, "bytes + 4096");
    refuse_field("SETUP", 16, 0, 8, "bytes 0");
    refuse_field("SETUP", 4, 64, 4, "capacities swapped, bytes of the other pair"); /* 64/64: 0x3000 */

    /* SETUP_OK / MAP_OK: status, map id. */
    refuse_field("SETUP_OK", 4, 1, 4, "status 1");
    refuse_field("SETUP_OK", 4, (uint32_t)(ORB_EAGAIN - 1), 4, "status below the codes");
    refuse_field("MAP_OK", 8, 1, 4, "status 1");
    refuse_field("MAP_OK", 8, (uint32_t)(ORB_EAGAIN - 1), 4, "status below the codes");
    refuse_field("MAP_OK", 4, 0, 4, "map id 0");
    for (int32_t s = ORB_EAGAIN; s <= 0; s++) {
        accept_field("SETUP_OK", 4, (uint32_t)s, 4);
        accept_field("MAP_OK", 8, (uint32_t)s, 4);
    }

    /* MAP: id, writable, length. */
    refuse_field("MAP", 4, 0, 4, "map id 0");
    refuse_field("MAP", 4, ORB_SHM_MAPS_MAX + 1, 4, "map id over ORB_SHM_MAPS_MAX");
    refuse_field("MAP", 4, UINT32_MAX, 4, "map id UINT32_MAX");
    refuse_field("MAP", 8, 2, 1, "writable 2");
    refuse_field("MAP", 8, 255, 1, "writable 255");
    refuse_field("MAP", 16, 0x3001, 8, "file offset not a page multiple");
    refuse_field("MAP", 16, 0x800, 8, "file offset half a page");
    refuse_field("MAP", 16, UINT64_MAX - 4095, 8, "file offset + length overflows");
    refuse_field("MAP", 16, 0xFFFFFFFFFFE00000ull, 8, "file offset + length is 2^64");
    refuse_field("MAP", 24, 0, 8, "length 0");
    refuse_field("MAP", 24, 4095, 8, "length 4095");
    refuse_field("MAP", 24, 4097, 8, "length 4097");
    refuse_field("MAP", 24, 0x200800, 8, "length not a page multiple");
    refuse_field("MAP", 24, ORB_SHM_MAP_LEN_MAX + 4096, 8, "length over 2^46");
    refuse_field("MAP", 24, UINT64_MAX - 4095, 8, "length huge");
    accept_field("MAP", 24, ORB_SHM_MAP_LEN_MAX, 8);
    accept_field("MAP", 16, 0, 8);
    accept_field("MAP", 16, 0xFFFFFFFFFFDFF000ull, 8);
    accept_field("MAP", 4, ORB_SHM_MAPS_MAX, 4);
    accept_field("MAP", 4, 1, 4);
    accept_field("MAP", 8, 0, 1);

    /* UNMAP. */
    refuse_field("UNMAP", 4, 0, 4, "map id 0");
}

static void test_refusals_entries(void **state)
{
    (void)state;
    /* REQUEST: offsets 8 op, 12 map id, 16 map offset, 24 remote addr, 32 length, 40 request
     * addr, 48 request length. The golden piece is [0x7f0000001000, +0x800) of
     * [0x7f0000000000, +0x4000). */
    refuse_field("REQUEST", 8, 2, 1, "op 2");
    refuse_field("REQUEST", 8, 7, 1, "op 7");
    refuse_field("REQUEST", 12, 0, 4, "map id 0");
    refuse_field("REQUEST", 32, 0, 8, "length 0");
    refuse_field("REQUEST", 16, UINT64_MAX - 0x7ff, 8, "map offset + length is 2^64");
    refuse_field("REQUEST", 16, UINT64_MAX, 8, "map offset + length overflows");
    refuse_field("REQUEST", 24, UINT64_MAX - 0x7ff, 8, "remote addr + length overflows");
    refuse_field("REQUEST", 48, UINT64_MAX, 8, "request range overflows");
    refuse_field("REQUEST", 48, 0, 8, "request length 0");
    refuse_field("REQUEST", 24, 0x7effffffff00ull, 8, "piece before the request");
    refuse_field("REQUEST", 24, 0x7f0000003900ull, 8, "piece after the request's end");
    refuse_field("REQUEST", 24, 0x7f0000004000ull, 8, "piece just past the request");
    refuse_field("REQUEST", 32, 0x3001, 8, "piece longer than the rest of the request");
    refuse_field("REQUEST", 40, 0x7f0000001001ull, 8, "request starting inside the piece");
    accept_field("REQUEST", 24, 0x7f0000003800ull, 8); /* the request's last bytes */
    accept_field("REQUEST", 24, 0x7f0000000000ull, 8); /* its first */
    accept_field("REQUEST", 16, UINT64_MAX - 0x800, 8);
    {
        /* A piece longer than the whole request, at its start. */
        const struct decoder *d = find("REQUEST");
        uint8_t buf[ENTRY];
        memcpy(buf, d->golden, ENTRY);
        set_le(buf, 24, 0x7f0000000000ull, 8);
        set_le(buf, 32, 0x4001, 8);
        expect_refused(d, buf, ENTRY, "piece longer than its request");
    }

    /* COMPLETION: status, effect, why. */
    refuse_field("COMPLETION", 8, 1, 4, "status 1");
    refuse_field("COMPLETION", 8, (uint32_t)(ORB_EAGAIN - 1), 4, "status below the codes");
    refuse_field("COMPLETION", 8, 0x7fffffffu, 4, "status INT32_MAX");
    refuse_field("COMPLETION", 12, 2, 1, "effect 2");
    refuse_field("COMPLETION", 12, 255, 1, "effect 255");
    refuse_field("COMPLETION", 18, 0x7f, 1, "why with DEL");
    refuse_field("COMPLETION", 16, 0x1f, 1, "why with a control byte");
    refuse_field("COMPLETION", 17, 0x80, 1, "why with a high byte");
    refuse_field("COMPLETION", 23, 'x', 1, "why with a byte after its NUL");
    refuse_field("COMPLETION", 63, 'x', 1, "why with a last byte after its NUL");
    refuse_field("COMPLETION", 16, 0, 1, "why starting with NUL, then text");
    accept_field("COMPLETION", 22, '~', 1);
    accept_field("COMPLETION", 12, 0, 1);
    for (int32_t s = ORB_EAGAIN; s <= 0; s++)
        accept_field("COMPLETION", 8, (uint32_t)s, 4);
}

static void test_peek_kind(void **state)
{
    (void)state;
    for (size_t i = 0; i < NDECODERS; i++) {
        if (!decoders[i].message)
            continue;
        uint8_t k = 0;
        assert_int_equal(orb_shm_peek_kind(decoders[i].golden, decoders[i].len, &k), 0);
        assert_int_equal(k, decoders[i].golden[0]);
        assert_int_equal(orb_shm_peek_kind(decoders[i].golden, 4, &k), 0);
    }
    static const uint8_t bad[][4] = {{16, 0, 0, 0}, {16, 2, 0, 0}, {16, 1, 1, 0}, {16, 1, 0, 0x80}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint8_t k = 0xA5;
        assert_int_equal(orb_shm_peek_kind(bad[i], 4, &k), ORB_EPROTO);
        assert_int_equal(k, 0xA5);
    }
    uint8_t k = 0xA5;
    assert_int_equal(orb_shm_peek_kind(setup_bytes, 3, &k), ORB_EPROTO);
    assert_int_equal(orb_shm_peek_kind(setup_bytes, 0, &k), ORB_EPROTO);
    assert_int_equal(k, 0xA5);
    assert_int_equal(orb_shm_peek_kind(setup_bytes, 4, NULL), ORB_EINVAL);
}

static void test_encoder_refusals(void **state)
{
    (void)state;
    uint8_t buf[ORB_SHM_INFO_OK_LEN];
    size_t len = 0;
    struct orb_shm_info info = {GOOD_ID, {0}};
    struct orb_shm_query q = {ORB_OP_READ, 4096, 4096};
    struct orb_shm_query_ok qok = {0, 4096, 4096};
    struct orb_shm_setup s = {256, 64, 0x6000};
    struct orb_shm_map m = {7, 1, 0, 4096};
    struct orb_shm_status st = {7, 0}, st0 = {0, 0};

    /* NULL buffers, NULL lengths, buffers one byte short. */
    assert_int_equal(orb_shm_info_encode(NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_info_encode(buf, sizeof buf, NULL), ORB_EINVAL);
    assert_int_equal(orb_shm_info_encode(buf, ORB_SHM_INFO_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_info_ok_encode(&info, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_info_ok_encode(&info, buf, ORB_SHM_INFO_OK_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_info_ok_encode(NULL, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_query_encode(&q, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_query_encode(&q, buf, ORB_SHM_QUERY_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_query_encode(NULL, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_query_ok_encode(&qok, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_query_ok_encode(&qok, buf, ORB_SHM_QUERY_OK_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_setup_encode(&s, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_setup_encode(&s, buf, ORB_SHM_SETUP_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_map_encode(&m, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_map_encode(&m, buf, ORB_SHM_MAP_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_status_encode(ORB_SHM_MAP_OK, &st, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_status_encode(ORB_SHM_MAP_OK, &st, buf, ORB_SHM_MAP_OK_LEN - 1, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_status_encode(ORB_SHM_SETUP_OK, &st0, buf, ORB_SHM_SETUP_OK_LEN - 1, &len),
                     ORB_EINVAL);
    assert_int_equal(orb_shm_unmap_encode(7, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_unmap_encode(7, buf, ORB_SHM_UNMAP_LEN - 1, &len), ORB_EINVAL);

    /* Fields out of their limits. */
    struct orb_shm_info bad_info = {"0F1E2D3C-4B5A-6978-8796-A5B4C3D2E1F0", {0}};
    assert_int_equal(orb_shm_info_ok_encode(&bad_info, buf, sizeof buf, &len), ORB_EINVAL);
    struct orb_shm_query bq = {2, 4096, 4096};
    assert_int_equal(orb_shm_query_encode(&bq, buf, sizeof buf, &len), ORB_EINVAL);
    bq = (struct orb_shm_query){ORB_OP_READ, 4096, 0};
    assert_int_equal(orb_shm_query_encode(&bq, buf, sizeof buf, &len), ORB_EINVAL);
    bq = (struct orb_shm_query){ORB_OP_READ, UINT64_MAX, 1};
    assert_int_equal(orb_shm_query_encode(&bq, buf, sizeof buf, &len), ORB_EINVAL);
    struct orb_shm_query_ok bqok = {ORB_ENOENT, 4096, 0};
    assert_int_equal(orb_shm_query_ok_encode(&bqok, buf, sizeof buf, &len), ORB_EINVAL);
    bqok = (struct orb_shm_query_ok){1, 0, 0};
    assert_int_equal(orb_shm_query_ok_encode(&bqok, buf, sizeof buf, &len), ORB_EINVAL);
    bqok = (struct orb_shm_query_ok){0, 4096, 0};
    assert_int_equal(orb_shm_query_ok_encode(&bqok, buf, sizeof buf, &len), ORB_EINVAL);
    struct orb_shm_setup bs = {3, 64, 0x6000};
    assert_int_equal(orb_shm_setup_encode(&bs, buf, sizeof buf, &len), ORB_EINVAL);
    bs = (struct orb_shm_setup){256, 64, 0x6001};
    assert_int_equal(orb_shm_setup_encode(&bs, buf, sizeof buf, &len), ORB_EINVAL);
    struct orb_shm_map bm = {0, 1, 0, 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){ORB_SHM_MAPS_MAX + 1, 1, 0, 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){1, 2, 0, 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){1, 1, 0, 100};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){1, 1, 100, 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){1, 1, UINT64_MAX - 4095, 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    bm = (struct orb_shm_map){1, 1, 0, ORB_SHM_MAP_LEN_MAX + 4096};
    assert_int_equal(orb_shm_map_encode(&bm, buf, sizeof buf, &len), ORB_EINVAL);
    struct orb_shm_status bst = {0, 0};
    assert_int_equal(orb_shm_status_encode(ORB_SHM_MAP_OK, &bst, buf, sizeof buf, &len), ORB_EINVAL);
    bst = (struct orb_shm_status){7, 0};
    assert_int_equal(orb_shm_status_encode(ORB_SHM_SETUP_OK, &bst, buf, sizeof buf, &len), ORB_EINVAL);
    bst = (struct orb_shm_status){7, 1};
    assert_int_equal(orb_shm_status_encode(ORB_SHM_MAP_OK, &bst, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_status_encode(ORB_SHM_SETUP, &st, buf, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_shm_unmap_encode(0, buf, sizeof buf, &len), ORB_EINVAL);

    uint8_t e[ENTRY];
    struct orb_shm_request r = {1, ORB_OP_WRITE, 1, 0, 100, 50, 100, 50};
    assert_int_equal(orb_shm_request_encode(&r, NULL), ORB_EINVAL);
    assert_int_equal(orb_shm_request_encode(NULL, e), ORB_EINVAL);
    r.request_addr = 101;
    assert_int_equal(orb_shm_request_encode(&r, e), ORB_EINVAL);
    r = (struct orb_shm_request){1, ORB_OP_WRITE, 0, 0, 100, 50, 100, 50};
    assert_int_equal(orb_shm_request_encode(&r, e), ORB_EINVAL);
    struct orb_shm_completion c = {1, 0, 0, "ok"};
    assert_int_equal(orb_shm_completion_encode(&c, NULL), ORB_EINVAL);
    assert_int_equal(orb_shm_completion_encode(NULL, e), ORB_EINVAL);
    c.effect = 2;
    assert_int_equal(orb_shm_completion_encode(&c, e), ORB_EINVAL);
    c.effect = 0;
    c.status = ORB_EAGAIN - 1;
    assert_int_equal(orb_shm_completion_encode(&c, e), ORB_EINVAL);

    /* NULL outputs and inputs of decoders are the caller's mistake. */
    assert_int_equal(orb_shm_info_ok_decode(info_ok_bytes, sizeof info_ok_bytes, NULL), ORB_EINVAL);
    assert_int_equal(orb_shm_info_decode(NULL, 8), ORB_EINVAL);
    assert_int_equal(orb_shm_status_decode(ORB_SHM_MAP, map_ok_bytes, sizeof map_ok_bytes, &st), ORB_EINVAL);
    assert_int_equal(orb_shm_request_decode(request_bytes, NULL), ORB_EINVAL);
    assert_int_equal(orb_shm_completion_decode(NULL, &c), ORB_EINVAL);
}

static void test_setup_memory(void **state)
{
    (void)state;
    /* 192 bytes of indices, then 64 per entry; the completion ring on the next cache line; the
     * whole rounded up to the page. */
    assert_true(orb_shm_setup_completion_offset(1) == 256);
    assert_true(orb_shm_setup_completion_offset(256) == 16576);
    assert_true(orb_shm_setup_completion_offset(4096) == 262336);
    assert_true(orb_shm_setup_bytes(1, 1) == 4096);
    assert_true(orb_shm_setup_bytes(256, 64) == 0x6000);
    assert_true(orb_shm_setup_bytes(64, 64) == 0x3000);
    assert_true(orb_shm_setup_bytes(4096, 4096) == 528384);
    static const uint32_t bad[] = {0, 3, 5, 4095, 8192, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_true(orb_shm_setup_bytes(bad[i], 64) == 0);
        assert_true(orb_shm_setup_bytes(64, bad[i]) == 0);
        assert_true(orb_shm_setup_completion_offset(bad[i]) == 0);
    }
    for (uint32_t rc = 1; rc <= ORB_SHM_RING_MAX; rc <<= 1)
        for (uint32_t cc = 1; cc <= ORB_SHM_RING_MAX; cc <<= 1) {
            uint64_t off = orb_shm_setup_completion_offset(rc), bytes = orb_shm_setup_bytes(rc, cc);
            assert_true(off % ORB_SH_RING_LINE == 0 && off >= orb_sh_ring_bytes(rc));
            assert_true(bytes % 4096 == 0 && bytes >= off + orb_sh_ring_bytes(cc) &&
                        bytes < off + orb_sh_ring_bytes(cc) + 4096);
        }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_vectors_decode),
        cmocka_unit_test(test_golden_vectors_encode),
        cmocka_unit_test(test_round_trips),
        cmocka_unit_test(test_completion_why_sanitised),
        cmocka_unit_test(test_refusals_common),
        cmocka_unit_test(test_refusals_control),
        cmocka_unit_test(test_refusals_socket),
        cmocka_unit_test(test_refusals_entries),
        cmocka_unit_test(test_peek_kind),
        cmocka_unit_test(test_encoder_refusals),
        cmocka_unit_test(test_setup_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
