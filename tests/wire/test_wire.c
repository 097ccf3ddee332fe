/* Wire protocol codec: cursor/writer, malformed input of every kind, golden byte vectors for
 * every message type, and a deterministic mutation run over valid encodings. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/error.h"
#include "wire/wire.h"

/* ---- golden frames: written out by hand from the layout in docs/wire-protocol.md ------------ */

#define HDR(type, len0, len1, tag0, tag1, tag2, tag3, tag4, tag5, tag6, tag7)                       \
    0x4f, 0x52, 0x42, 0x54, 0x05, (type), 0x00, 0x00, (len0), (len1), 0x00, 0x00, 0x00, 0x00, 0x00,  \
        0x00, (tag0), (tag1), (tag2), (tag3), (tag4), (tag5), (tag6), (tag7)

static const uint8_t golden_hello[] = {
    HDR(0x01, 0x28, 0x00, 0, 0, 0, 0, 0, 0, 0, 0),
    /* expected epoch */
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
    /* sender epoch */
    0xf0, 0xf1, 0xf2, 0xf3, 0xf4, 0xf5, 0xf6, 0xf7, 0xf8, 0xf9, 0xfa, 0xfb, 0xfc, 0xfd, 0xfe, 0xff,
    0x01, 0x00, 0x00, 0x00, /* role DATA */
    0x03, 0x00, 0x00, 0x00, /* stripe 3 */
};

static const uint8_t golden_hello_ok[] = {
    HDR(0x02, 0x14, 0x00, 0, 0, 0, 0, 0, 0, 0, 0),
    0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
    0x00, 0x00, 0x10, 0x00, /* max_payload 1 MiB */
};

static const uint8_t golden_error[] = {
    HDR(0x03, 0x0d, 0x00, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01),
    0xf6, 0xff, 0xff, 0xff,       /* status -10 (ORB_ESTALE) */
    0x00, 0x00,                   /* flags: nothing changed */
    0x05, 0x00,                   /* text_len 5 */
    0x73, 0x74, 0x61, 0x6c, 0x65, /* "stale" */
};

static const uint8_t golden_describe_req[] = {
    HDR(0x04, 0x00, 0x00, 0x2a, 0, 0, 0, 0, 0, 0, 0),
};

static const uint8_t golden_describe_resp[] = {
    HDR(0x05, 0x38, 0x00, 0x2b, 0, 0, 0, 0, 0, 0, 0),
    0x02, 0x00, 0x00, 0x00,                         /* count 2 */
    0x00, 0x00, 0x00, 0x00,                         /* reserved */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, /* addr 0x7f0000001000 */
    0x00, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* length 0x2000 */
    0x01, 0x00, 0x00, 0x00,                         /* REMOTE_READ */
    0x00, 0x00, 0x00, 0x00,                         /* HOST, no routes, reserved */
    0xff, 0xef, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, /* addr 0xffffffffffffefff: ends at UINT64_MAX */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* length 0x1000 */
    0x03, 0x00, 0x00, 0x00,                         /* REMOTE_WRITE */
    0x01, 0x02, 0x00, 0x00,                         /* CUDA, registered by peer memory, reserved */
};

static const uint8_t golden_read_req[] = {
    HDR(0x06, 0x20, 0x00, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11),
    0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00, /* addr 0x123456789abc */
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, /* length 0x10000 */
    0xbc, 0x9a, 0x77, 0x56, 0x34, 0x12, 0x00, 0x00, /* request_addr 0x123456779abc */
    0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, /* request_length 0x30000 */
};

static const uint8_t golden_read_resp[] = {
    HDR(0x07, 0x10, 0x00, 0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11),
    0xbc, 0x9a, 0x78, 0x56, 0x34, 0x12, 0x00, 0x00,
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00,
};

static const uint8_t golden_write_req[] = {
    HDR(0x08, 0x20, 0x00, 0x99, 0, 0, 0, 0, 0, 0, 0),
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* addr 0x1000 */
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, /* length 64 MiB (the maximum) */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* request_addr 0x1000: a request of one frame */
    0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, /* request_length 64 MiB */
};

static const uint8_t golden_write_resp[] = {
    HDR(0x09, 0x00, 0x00, 0x99, 0, 0, 0, 0, 0, 0, 0),
};

static const uint8_t golden_notify[] = {
    HDR(0x0a, 0x07, 0x00, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0),
    0x03, 0x00, 0x00, 0x00, /* length 3 */
    0x68, 0x69, 0x21,       /* "hi!" */
};

static const uint8_t golden_notify_resp[] = {
    HDR(0x0b, 0x00, 0x00, 0xef, 0xbe, 0xad, 0xde, 0, 0, 0, 0),
};

struct golden {
    const char *name;
    uint8_t type;
    const uint8_t *bytes;
    size_t len;
};

#define GOLDEN(t, arr) {#arr, (t), (arr), sizeof(arr)}
static const struct golden goldens[] = {
    GOLDEN(ORB_WIRE_HELLO, golden_hello),
    GOLDEN(ORB_WIRE_HELLO_OK, golden_hello_ok),
    GOLDEN(ORB_WIRE_ERROR, golden_error),
    GOLDEN(ORB_WIRE_DESCRIBE_REQ, golden_describe_req),
    GOLDEN(ORB_WIRE_DESCRIBE_RESP, golden_describe_resp),
    GOLDEN(ORB_WIRE_READ_REQ, golden_read_req),
    GOLDEN(ORB_WIRE_READ_RESP, golden_read_resp),
    GOLDEN(ORB_WIRE_WRITE_REQ, golden_write_req),
    GOLDEN(ORB_WIRE_WRITE_RESP, golden_write_resp),
    GOLDEN(ORB_WIRE_NOTIFY, golden_notify),
    GOLDEN(ORB_WIRE_NOTIFY_RESP, golden_notify_resp),
};
#define N_GOLDEN (sizeof goldens / sizeof goldens[0])

/* The messages the golden frames hold. */
static const struct orb_wire_xfer read_xfer = {.addr = 0x123456789abcull, .length = 0x10000,
                                               .request_addr = 0x123456779abcull,
                                               .request_length = 0x30000};
static const struct orb_wire_xfer write_xfer = {.addr = 0x1000, .length = ORB_WIRE_MAX_PAYLOAD,
                                                .request_addr = 0x1000,
                                                .request_length = ORB_WIRE_MAX_PAYLOAD};
static const struct orb_region_desc golden_regions[2] = {
    {.addr = 0x7f0000001000ull, .length = 0x2000, .perm = ORB_PERM_REMOTE_READ},
    {.addr = 0xffffffffffffefffull, .length = 0x1000, .perm = ORB_PERM_REMOTE_WRITE,
     .memory_kind = ORB_MEMORY_CUDA, .gpu_direct_routes = ORB_GPU_ROUTE_PEERMEM},
};
static const uint8_t notify_text[3] = {'h', 'i', '!'};

static struct orb_wire_hello golden_hello_msg(void)
{
    struct orb_wire_hello m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 16; i++) {
        m.expected.bytes[i] = (uint8_t)i;
        m.sender.bytes[i] = (uint8_t)(0xf0 + i);
    }
    m.role = ORB_WIRE_ROLE_DATA;
    m.stripe = 3;
    return m;
}

static struct orb_wire_hello_ok golden_hello_ok_msg(void)
{
    struct orb_wire_hello_ok m;
    memset(&m, 0, sizeof m);
    for (int i = 0; i < 16; i++)
        m.epoch.bytes[i] = (uint8_t)(0xa0 + i);
    m.max_payload = 1u << 20;
    return m;
}

/* Encode the message golden frame `g` describes; returns the encoder's status. */
static int encode_golden(const struct golden *g, uint8_t *out, size_t cap, size_t *len)
{
    switch (g->type) {
    case ORB_WIRE_HELLO: {
        struct orb_wire_hello m = golden_hello_msg();
        return orb_wire_hello_encode(&m, out, cap, len);
    }
    case ORB_WIRE_HELLO_OK: {
        struct orb_wire_hello_ok m = golden_hello_ok_msg();
        return orb_wire_hello_ok_encode(&m, out, cap, len);
    }
    case ORB_WIRE_ERROR: {
        struct orb_wire_error m;
        memset(&m, 0, sizeof m);
        m.status = ORB_ESTALE;
        strcpy(m.text, "stale");
        return orb_wire_error_encode(0x0102030405060708ull, &m, out, cap, len);
    }
    case ORB_WIRE_DESCRIBE_REQ: return orb_wire_describe_req_encode(0x2a, out, cap, len);
    case ORB_WIRE_DESCRIBE_RESP:
        return orb_wire_describe_resp_encode(0x2b, golden_regions, 2, out, cap, len);
    case ORB_WIRE_READ_REQ:
    case ORB_WIRE_READ_RESP:
        return orb_wire_xfer_encode(g->type, 0x1122334455667788ull, &read_xfer, out, cap, len);
    case ORB_WIRE_WRITE_REQ: return orb_wire_xfer_encode(g->type, 0x99, &write_xfer, out, cap, len);
    case ORB_WIRE_WRITE_RESP: return orb_wire_empty_encode(g->type, 0x99, out, cap, len);
    case ORB_WIRE_NOTIFY: {
        struct orb_wire_notify m = {.length = 3, .data = notify_text};
        return orb_wire_notify_encode(0xdeadbeef, &m, out, cap, len);
    }
    case ORB_WIRE_NOTIFY_RESP: return orb_wire_empty_encode(g->type, 0xdeadbeef, out, cap, len);
    default: fail_msg("no encoder for type %u", (unsigned)g->type); return -1;
    }
}

/* Decode `len` body bytes as message `type`; 0 for the empty-bodied types when len is 0. */
static int decode_body_as(uint8_t type, const uint8_t *body, size_t len)
{
    switch (type) {
    case ORB_WIRE_HELLO: {
        struct orb_wire_hello m;
        return orb_wire_hello_decode(body, len, &m);
    }
    case ORB_WIRE_HELLO_OK: {
        struct orb_wire_hello_ok m;
        return orb_wire_hello_ok_decode(body, len, &m);
    }
    case ORB_WIRE_ERROR: {
        struct orb_wire_error m;
        return orb_wire_error_decode(body, len, &m);
    }
    case ORB_WIRE_DESCRIBE_RESP: {
        struct orb_region_desc *regions = NULL;
        size_t count = 0;
        int rc = orb_wire_describe_resp_decode(body, len, &regions, &count);
        free(regions);
        return rc;
    }
    case ORB_WIRE_READ_REQ:
    case ORB_WIRE_READ_RESP:
    case ORB_WIRE_WRITE_REQ: {
        struct orb_wire_xfer m;
        return orb_wire_xfer_decode(type, body, len, &m);
    }
    case ORB_WIRE_NOTIFY: {
        struct orb_wire_notify m;
        return orb_wire_notify_decode(body, len, &m);
    }
    default: return len == 0 ? 0 : ORB_EPROTO;
    }
}

/* Copy of a golden frame that tests may modify. */
static uint8_t frame[ORB_WIRE_HEADER_LEN + 512];
static size_t load(uint8_t type)
{
    for (size_t i = 0; i < N_GOLDEN; i++) {
        if (goldens[i].type == type) {
            memcpy(frame, goldens[i].bytes, goldens[i].len);
            return goldens[i].len;
        }
    }
    fail_msg("no golden frame of type %u", (unsigned)type);
    return 0;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void assert_error_mentions(const char *word)
{
    const char *msg = orb_last_error();
    if (strstr(msg, word) == NULL)
        fail_msg("error message \"%s\" does not mention \"%s\"", msg, word);
}

/* Header decode must fail with ORB_EPROTO naming `word`, and leave `out` untouched. */
static void assert_header_rejected(const uint8_t *hdr, const char *word)
{
    struct orb_wire_header h = {.type = 0xee, .body_len = 0xeeeeeeee, .tag = 0xeeeeeeeeeeeeeeeeull};
    orb_clear_error();
    assert_int_equal(orb_wire_header_decode(hdr, &h), ORB_EPROTO);
    assert_error_mentions(word);
    assert_int_equal(h.type, 0xee);
    assert_int_equal(h.body_len, 0xeeeeeeee);
    assert_true(h.tag == 0xeeeeeeeeeeeeeeeeull);
}

static void set_body_len(uint8_t *hdr, uint32_t body_len)
{
    put_u32(hdr + 8, body_len);
}

/* ---- cursor and writer ----------------------------------------------------------------------- */

static void test_cursor_past_end_is_sticky(void **state)
{
    (void)state;
    const uint8_t buf[5] = {0x01, 0x02, 0x03, 0x04, 0x05};
    struct orb_cursor c;
    orb_cursor_init(&c, buf, sizeof buf);
    assert_int_equal(orb_cursor_u32(&c), 0x04030201u);
    assert_int_equal(orb_cursor_u16(&c), 0); /* one byte left: fails */
    assert_true(c.failed);
    assert_int_equal(orb_cursor_u8(&c), 0); /* still failed although one byte remains */
    assert_null(orb_cursor_bytes(&c, 0));
    assert_int_equal(orb_cursor_finish(&c), ORB_EPROTO);

    orb_cursor_init(&c, buf, sizeof buf);
    assert_int_equal(orb_cursor_u64(&c), 0);
    assert_int_equal(orb_cursor_finish(&c), ORB_EPROTO);

    orb_cursor_init(&c, buf, sizeof buf);
    assert_null(orb_cursor_bytes(&c, 6));
    assert_null(orb_cursor_bytes(&c, SIZE_MAX));
    assert_int_equal(orb_cursor_finish(&c), ORB_EPROTO);
}

static void test_cursor_trailing_bytes_fail_finish(void **state)
{
    (void)state;
    const uint8_t buf[3] = {0xaa, 0xbb, 0xcc};
    struct orb_cursor c;
    orb_cursor_init(&c, buf, sizeof buf);
    assert_int_equal(orb_cursor_u16(&c), 0xbbaa);
    assert_int_equal(orb_cursor_finish(&c), ORB_EPROTO);
    assert_int_equal(orb_cursor_u8(&c), 0xcc);
    assert_int_equal(orb_cursor_finish(&c), 0);

    /* An empty cursor over NULL: zero-length borrows succeed, anything else fails. */
    orb_cursor_init(&c, NULL, 0);
    assert_non_null(orb_cursor_bytes(&c, 0));
    assert_int_equal(orb_cursor_finish(&c), 0);
    assert_int_equal(orb_cursor_u8(&c), 0);
    assert_int_equal(orb_cursor_finish(&c), ORB_EPROTO);
}

static void test_cursor_reads_little_endian(void **state)
{
    (void)state;
    const uint8_t buf[15] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x88, 0x11, 0x22, 0x33, 0x44, 0xfe, 0xff, 0x7a};
    struct orb_cursor c;
    orb_cursor_init(&c, buf, sizeof buf);
    assert_true(orb_cursor_u64(&c) == 0x8807060504030201ull);
    assert_int_equal(orb_cursor_u32(&c), 0x44332211u);
    assert_int_equal(orb_cursor_u16(&c), 0xfffe);
    const uint8_t *p = orb_cursor_bytes(&c, 1);
    assert_ptr_equal(p, buf + 14);
    assert_int_equal(orb_cursor_finish(&c), 0);
}

static void test_writer_overflow_is_sticky(void **state)
{
    (void)state;
    uint8_t buf[8];
    memset(buf, 0x5a, sizeof buf);
    struct orb_writer w;
    orb_writer_init(&w, buf, 6);
    orb_writer_u32(&w, 0x44332211u);
    orb_writer_u32(&w, 0xdeadbeefu); /* does not fit: nothing written */
    assert_true(w.failed);
    orb_writer_u8(&w, 0x77); /* fits, but the writer has failed */
    assert_int_equal(w.pos, 4);
    const uint8_t want[8] = {0x11, 0x22, 0x33, 0x44, 0x5a, 0x5a, 0x5a, 0x5a};
    assert_memory_equal(buf, want, sizeof want);

    orb_writer_init(&w, buf, sizeof buf);
    orb_writer_u16(&w, 0xbeef);
    orb_writer_u8(&w, 0x01);
    orb_writer_bytes(&w, "xyz", 3);
    orb_writer_bytes(&w, NULL, 0);
    orb_writer_u64(&w, 1); /* 6 used, 8 more do not fit */
    assert_true(w.failed);
    assert_int_equal(w.pos, 6);
    const uint8_t want2[6] = {0xef, 0xbe, 0x01, 'x', 'y', 'z'};
    assert_memory_equal(buf, want2, sizeof want2);

    orb_writer_init(&w, buf, sizeof buf);
    orb_writer_u64(&w, 0x0102030405060708ull);
    assert_false(w.failed);
    const uint8_t want3[8] = {0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01};
    assert_memory_equal(buf, want3, sizeof want3);
}

/* ---- header ---------------------------------------------------------------------------------- */

static void test_header_bad_magic(void **state)
{
    (void)state;
    for (int i = 0; i < 4; i++) {
        load(ORB_WIRE_READ_REQ);
        frame[i] ^= 0x20;
        assert_header_rejected(frame, "magic");
    }
    load(ORB_WIRE_READ_REQ);
    memcpy(frame, "TBRO", 4); /* the magic in the wrong byte order */
    assert_header_rejected(frame, "magic");
}

static void test_header_bad_version(void **state)
{
    (void)state;
    const uint8_t versions[] = {0, 1, 2, 3, 4, 6, 0x81, 0xff};
    for (size_t i = 0; i < sizeof versions; i++) {
        load(ORB_WIRE_READ_REQ);
        frame[4] = versions[i];
        assert_header_rejected(frame, "version");
    }
}

/* CONTROL_REQ carrying 3 RDMA bytes, tag 0x21, by hand. */
static const uint8_t golden_control[] = {
    0x4f, 0x52, 0x42, 0x54, 0x05, 0x0c, 0x00, 0x00, 0x07, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* header: CONTROL_REQ, body_len 7, tag 0x21 */
    0x02, 0x00, 0x00, 0x00,                         /* transport RDMA, reserved */
    0xaa, 0xbb, 0xcc,                               /* the transport's bytes */
};

static void test_control_golden_and_rules(void **state)
{
    (void)state;
    const uint8_t data[3] = {0xaa, 0xbb, 0xcc};
    struct orb_wire_control m = {.transport = ORB_TRANSPORT_RDMA, .length = 3, .data = data};
    uint8_t out[64];
    size_t len = 0;
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_CONTROL_REQ, 0x21, &m, out, sizeof out, &len), 0);
    assert_int_equal(len, sizeof golden_control);
    assert_memory_equal(out, golden_control, sizeof golden_control);
    struct orb_wire_header h;
    assert_int_equal(orb_wire_header_decode(golden_control, &h), 0);
    assert_int_equal(h.type, ORB_WIRE_CONTROL_REQ);
    struct orb_wire_control d;
    assert_int_equal(orb_wire_control_decode(golden_control + 24, 7, &d), 0);
    assert_int_equal(d.transport, ORB_TRANSPORT_RDMA);
    assert_int_equal(d.length, 3);
    assert_ptr_equal(d.data, golden_control + 28);
    /* TCP and unknown transports carry no control messages; reserved bytes must be 0; an empty
     * payload, or one past the maximum, is refused both ways. */
    uint8_t body[8] = {0x01, 0, 0, 0, 1};
    assert_int_equal(orb_wire_control_decode(body, 5, &d), ORB_EPROTO);
    body[0] = 5;
    assert_int_equal(orb_wire_control_decode(body, 5, &d), ORB_EPROTO);
    body[0] = 4; /* the same-host transport's */
    assert_int_equal(orb_wire_control_decode(body, 5, &d), 0);
    assert_int_equal(d.transport, ORB_TRANSPORT_SHM);
    body[0] = 2;
    body[1] = 1;
    assert_int_equal(orb_wire_control_decode(body, 5, &d), ORB_EPROTO);
    body[1] = 0;
    body[3] = 1;
    assert_int_equal(orb_wire_control_decode(body, 5, &d), ORB_EPROTO);
    body[3] = 0;
    assert_int_equal(orb_wire_control_decode(body, 4, &d), ORB_EPROTO);
    assert_int_equal(orb_wire_control_decode(body, 5, &d), 0);
    m.transport = ORB_TRANSPORT_TCP;
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_CONTROL_REQ, 1, &m, out, sizeof out, &len), ORB_EINVAL);
    m.transport = ORB_TRANSPORT_RDMA;
    m.length = 0;
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_CONTROL_REQ, 1, &m, out, sizeof out, &len), ORB_EINVAL);
    m.length = ORB_WIRE_MAX_CONTROL + 1;
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_CONTROL_RESP, 1, &m, out, sizeof out, &len), ORB_EINVAL);
    m.length = 3;
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_CONTROL_RESP, 0, &m, out, sizeof out, &len), ORB_EINVAL);
    assert_int_equal(orb_wire_control_encode(ORB_WIRE_NOTIFY, 1, &m, out, sizeof out, &len), ORB_EINVAL);
}

static void test_header_unknown_type(void **state)
{
    (void)state;
    const uint8_t types[] = {0, 14, 15, 0x80, 255};
    for (size_t i = 0; i < sizeof types; i++) {
        load(ORB_WIRE_DESCRIBE_REQ); /* body_len 0, tag non-zero */
        frame[5] = types[i];
        assert_header_rejected(frame, "type");
    }
}

static void test_header_nonzero_flags_and_reserved(void **state)
{
    (void)state;
    for (int i = 6; i < 8; i++) {
        for (int bit = 0; bit < 8; bit++) {
            load(ORB_WIRE_READ_REQ);
            frame[i] = (uint8_t)(1u << bit);
            assert_header_rejected(frame, "flags");
        }
    }
    for (int i = 12; i < 16; i++) {
        for (int bit = 0; bit < 8; bit++) {
            load(ORB_WIRE_READ_REQ);
            frame[i] = (uint8_t)(1u << bit);
            assert_header_rejected(frame, "reserved");
        }
    }
}

static void test_header_body_len_out_of_range_for_every_type(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GOLDEN; i++) {
        uint8_t type = goldens[i].type;
        uint32_t lo, hi;
        orb_wire_body_limits(type, &lo, &hi);
        assert_true(lo <= hi);
        memcpy(frame, goldens[i].bytes, ORB_WIRE_HEADER_LEN);
        const uint32_t bad[] = {lo - 1, hi + 1, hi + 20, 0x7fffffffu, 0xffffffffu};
        for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
            /* for the empty-bodied types lo - 1 wraps to 0xffffffff, still out of range */
            set_body_len(frame, bad[k]);
            assert_header_rejected(frame, "body_len");
        }
        /* Both ends of the range are accepted (DESCRIBE_RESP's maximum is 8 + n x 24). */
        struct orb_wire_header h;
        set_body_len(frame, lo);
        assert_int_equal(orb_wire_header_decode(frame, &h), 0);
        assert_int_equal(h.body_len, lo);
        set_body_len(frame, hi);
        assert_int_equal(orb_wire_header_decode(frame, &h), 0);
        assert_int_equal(h.body_len, hi);
    }
}

static void test_header_body_limits_table(void **state)
{
    (void)state;
    struct {
        uint8_t type;
        uint32_t lo, hi;
    } want[] = {
        {ORB_WIRE_HELLO, 40, 40},
        {ORB_WIRE_HELLO_OK, 20, 20},
        {ORB_WIRE_ERROR, 8, 8 + ORB_WIRE_MAX_ERROR_TEXT},
        {ORB_WIRE_DESCRIBE_REQ, 0, 0},
        {ORB_WIRE_DESCRIBE_RESP, 8, ORB_WIRE_MAX_BODY},
        {ORB_WIRE_READ_REQ, 32, 32},
        {ORB_WIRE_READ_RESP, 16, 16},
        {ORB_WIRE_WRITE_REQ, 32, 32},
        {ORB_WIRE_WRITE_RESP, 0, 0},
        {ORB_WIRE_NOTIFY, 5, 4 + ORB_NOTIFY_MAX},
        {ORB_WIRE_NOTIFY_RESP, 0, 0},
        {ORB_WIRE_CONTROL_REQ, 5, 4 + ORB_WIRE_MAX_CONTROL},
        {ORB_WIRE_CONTROL_RESP, 5, 4 + ORB_WIRE_MAX_CONTROL},
        {0, 0, 0},
        {14, 0, 0},
        {255, 0, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        uint32_t lo = 99, hi = 99;
        orb_wire_body_limits(want[i].type, &lo, &hi);
        assert_int_equal(lo, want[i].lo);
        assert_int_equal(hi, want[i].hi);
    }
    assert_int_equal(ORB_WIRE_MAX_BODY, 8u + 65536u * 24u);
    orb_wire_body_limits(ORB_WIRE_HELLO, NULL, NULL); /* NULL outputs are allowed */
    assert_string_equal(orb_wire_type_name(ORB_WIRE_WRITE_REQ), "WRITE_REQ");
    assert_string_equal(orb_wire_type_name(0), "unknown");
    assert_string_equal(orb_wire_type_name(12), "CONTROL_REQ");
    assert_string_equal(orb_wire_type_name(14), "unknown");
}

static void test_header_describe_resp_len_not_in_region_steps(void **state)
{
    (void)state;
    load(ORB_WIRE_DESCRIBE_RESP);
    const uint32_t bad[] = {9, 31, 33, 8 + 24 * 2 + 1, ORB_WIRE_MAX_BODY - 1};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        set_body_len(frame, bad[i]);
        assert_header_rejected(frame, "body_len");
    }
    struct orb_wire_header h;
    set_body_len(frame, 32);
    assert_int_equal(orb_wire_header_decode(frame, &h), 0);
}

static void test_header_tag_rules(void **state)
{
    (void)state;
    /* HELLO and HELLO_OK carry tag 0. */
    load(ORB_WIRE_HELLO);
    frame[16] = 1;
    assert_header_rejected(frame, "tag");
    load(ORB_WIRE_HELLO_OK);
    frame[23] = 0x80;
    assert_header_rejected(frame, "tag");
    /* Requests and their responses carry a non-zero tag. */
    const uint8_t tagged[] = {ORB_WIRE_DESCRIBE_REQ, ORB_WIRE_DESCRIBE_RESP, ORB_WIRE_READ_REQ,
                              ORB_WIRE_READ_RESP,    ORB_WIRE_WRITE_REQ,     ORB_WIRE_WRITE_RESP,
                              ORB_WIRE_NOTIFY,       ORB_WIRE_NOTIFY_RESP};
    for (size_t i = 0; i < sizeof tagged; i++) {
        load(tagged[i]);
        memset(frame + 16, 0, 8);
        assert_header_rejected(frame, "tag");
    }
    /* ERROR may name the connection (tag 0). */
    struct orb_wire_header h;
    load(ORB_WIRE_ERROR);
    memset(frame + 16, 0, 8);
    assert_int_equal(orb_wire_header_decode(frame, &h), 0);
    assert_true(h.tag == 0);
}

/* ---- bodies: truncation and trailing bytes ---------------------------------------------------- */

static void test_every_body_truncated_at_every_length(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GOLDEN; i++) {
        const struct golden *g = &goldens[i];
        size_t body_len = g->len - ORB_WIRE_HEADER_LEN;
        for (size_t cut = 0; cut < body_len; cut++) {
            /* A heap copy of exactly `cut` bytes, so a read past the end is a sanitizer error. */
            uint8_t *body = malloc(cut ? cut : 1);
            assert_non_null(body);
            memcpy(body, g->bytes + ORB_WIRE_HEADER_LEN, cut);
            orb_clear_error();
            int rc = decode_body_as(g->type, body, cut);
            free(body);
            if (rc != ORB_EPROTO)
                fail_msg("%s truncated to %zu body bytes: rc %d", g->name, cut, rc);
            assert_true(orb_last_error()[0] != '\0' || body_len == 0);
        }
    }
}

static void test_every_body_with_trailing_bytes(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GOLDEN; i++) {
        const struct golden *g = &goldens[i];
        size_t body_len = g->len - ORB_WIRE_HEADER_LEN;
        for (size_t extra = 1; extra <= 21; extra += 4) {
            uint8_t body[128];
            memset(body, 0, sizeof body);
            memcpy(body, g->bytes + ORB_WIRE_HEADER_LEN, body_len);
            int rc = decode_body_as(g->type, body, body_len + extra);
            if (rc != ORB_EPROTO)
                fail_msg("%s with %zu trailing bytes: rc %d", g->name, extra, rc);
        }
    }
}

/* ---- bodies: field values --------------------------------------------------------------------- */

static void test_hello_bad_fields(void **state)
{
    (void)state;
    struct orb_wire_hello m;
    memset(&m, 0x5a, sizeof m);
    uint8_t *body = frame + ORB_WIRE_HEADER_LEN;
    const uint32_t roles[] = {2, 0x100, 0xffffffffu};
    for (size_t i = 0; i < 3; i++) {
        load(ORB_WIRE_HELLO);
        put_u32(body + 32, roles[i]);
        assert_int_equal(orb_wire_hello_decode(body, 40, &m), ORB_EPROTO);
        assert_error_mentions("role");
    }
    const uint32_t stripes[] = {64, 65, 0x80000000u};
    for (size_t i = 0; i < 3; i++) {
        load(ORB_WIRE_HELLO);
        put_u32(body + 36, stripes[i]);
        assert_int_equal(orb_wire_hello_decode(body, 40, &m), ORB_EPROTO);
        assert_error_mentions("stripe");
    }
    load(ORB_WIRE_HELLO);
    put_u32(body + 32, ORB_WIRE_ROLE_CONTROL); /* stripe 3 on CONTROL */
    assert_int_equal(orb_wire_hello_decode(body, 40, &m), ORB_EPROTO);
    assert_error_mentions("CONTROL");
    /* Failed decodes left the message alone. */
    assert_int_equal(m.role, 0x5a5a5a5a);

    /* Boundaries that are accepted: DATA stripe 63, CONTROL stripe 0. */
    load(ORB_WIRE_HELLO);
    put_u32(body + 36, 63);
    assert_int_equal(orb_wire_hello_decode(body, 40, &m), 0);
    assert_int_equal(m.stripe, 63);
    put_u32(body + 32, ORB_WIRE_ROLE_CONTROL);
    put_u32(body + 36, 0);
    assert_int_equal(orb_wire_hello_decode(body, 40, &m), 0);
    assert_int_equal(m.role, ORB_WIRE_ROLE_CONTROL);
}

static void test_hello_ok_bad_max_payload(void **state)
{
    (void)state;
    struct orb_wire_hello_ok m;
    uint8_t *body = frame + ORB_WIRE_HEADER_LEN;
    const uint32_t bad[] = {0, 1, 4095, ORB_WIRE_MAX_PAYLOAD + 1, 0xffffffffu};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        load(ORB_WIRE_HELLO_OK);
        put_u32(body + 16, bad[i]);
        assert_int_equal(orb_wire_hello_ok_decode(body, 20, &m), ORB_EPROTO);
        assert_error_mentions("max_payload");
    }
    const uint32_t good[] = {4096, ORB_WIRE_MAX_PAYLOAD};
    for (size_t i = 0; i < 2; i++) {
        load(ORB_WIRE_HELLO_OK);
        put_u32(body + 16, good[i]);
        assert_int_equal(orb_wire_hello_ok_decode(body, 20, &m), 0);
        assert_int_equal(m.max_payload, good[i]);
    }
}

static void test_error_bad_status(void **state)
{
    (void)state;
    struct orb_wire_error m;
    uint8_t *body = frame + ORB_WIRE_HEADER_LEN;
    const uint32_t bad[] = {0, 1, 0x7fffffffu, (uint32_t)(ORB_EAGAIN - 1), 0x80000000u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        load(ORB_WIRE_ERROR);
        put_u32(body, bad[i]);
        assert_int_equal(orb_wire_error_decode(body, 13, &m), ORB_EPROTO);
        assert_error_mentions("status");
    }
    const int32_t good[] = {ORB_EAGAIN, ORB_EINVAL, ORB_EPROTO};
    for (size_t i = 0; i < 3; i++) {
        load(ORB_WIRE_ERROR);
        put_u32(body, (uint32_t)good[i]);
        assert_int_equal(orb_wire_error_decode(body, 13, &m), 0);
        assert_int_equal(m.status, good[i]);
    }
}

static void test_error_text_length_and_content(void **state)
{
    (void)state;
    struct orb_wire_error m;
    uint8_t body[8 + 300];
    put_u32(body, (uint32_t)ORB_EPEER);
    body[4] = body[5] = 0; /* flags */

    /* text_len over the maximum, with the bytes present. */
    body[6] = (uint8_t)(257 & 0xff);
    body[7] = (uint8_t)(257 >> 8);
    memset(body + 8, 'x', 257);
    assert_int_equal(orb_wire_error_decode(body, 8 + 257, &m), ORB_EPROTO);
    assert_error_mentions("text_len");
    /* text_len disagreeing with the body in both directions. */
    body[6] = 10;
    body[7] = 0;
    assert_int_equal(orb_wire_error_decode(body, 8 + 9, &m), ORB_EPROTO);
    assert_error_mentions("text_len");
    assert_int_equal(orb_wire_error_decode(body, 8 + 11, &m), ORB_EPROTO);
    assert_error_mentions("text_len");
    /* Exactly the maximum is fine and NUL-terminated. */
    body[6] = (uint8_t)(256 & 0xff);
    body[7] = (uint8_t)(256 >> 8);
    assert_int_equal(orb_wire_error_decode(body, 8 + 256, &m), 0);
    assert_int_equal(strlen(m.text), 256);
    /* An empty text is fine too. */
    body[6] = 0;
    body[7] = 0;
    assert_int_equal(orb_wire_error_decode(body, 8, &m), 0);
    assert_string_equal(m.text, "");
    /* Control bytes (NUL, newline, escape, DEL) are refused. */
    const uint8_t controls[] = {0x00, 0x0a, 0x1b, 0x7f};
    for (size_t i = 0; i < sizeof controls; i++) {
        body[6] = 4;
        memcpy(body + 8, "abcd", 4);
        body[8 + 2] = controls[i];
        assert_int_equal(orb_wire_error_decode(body, 12, &m), ORB_EPROTO);
        assert_error_mentions("control");
    }
    /* Bytes >= 0x80 (UTF-8) pass through. */
    body[6] = 2;
    body[8] = 0xc3;
    body[9] = 0xa9;
    assert_int_equal(orb_wire_error_decode(body, 10, &m), 0);
    assert_string_equal(m.text, "\xc3\xa9");
    assert_int_equal(m.effect_unknown, 0);
    /* The one flag says a WRITE may have changed bytes; any other flag is refused. */
    body[4] = 0x01;
    assert_int_equal(orb_wire_error_decode(body, 10, &m), 0);
    assert_int_equal(m.effect_unknown, 1);
    const uint8_t bad_flags[][2] = {{0x02, 0x00}, {0x00, 0x80}, {0x03, 0x00}, {0xff, 0xff}};
    for (size_t i = 0; i < sizeof bad_flags / sizeof bad_flags[0]; i++) {
        body[4] = bad_flags[i][0];
        body[5] = bad_flags[i][1];
        assert_int_equal(orb_wire_error_decode(body, 10, &m), ORB_EPROTO);
        assert_error_mentions("flags");
    }
}

static void test_describe_resp_bad_count_and_reserved(void **state)
{
    (void)state;
    struct orb_region_desc *regions = (struct orb_region_desc *)0x1;
    size_t count = 77;
    uint8_t *body = frame + ORB_WIRE_HEADER_LEN;
    const uint32_t counts[] = {0, 1, 3, ORB_WIRE_MAX_REGIONS, ORB_WIRE_MAX_REGIONS + 1, 0xffffffffu};
    for (size_t i = 0; i < sizeof counts / sizeof counts[0]; i++) {
        load(ORB_WIRE_DESCRIBE_RESP);
        put_u32(body, counts[i]);
        assert_int_equal(orb_wire_describe_resp_decode(body, 48, &regions, &count), ORB_EPROTO);
        assert_error_mentions("count");
    }
    load(ORB_WIRE_DESCRIBE_RESP);
    body[4] = 1;
    assert_int_equal(orb_wire_describe_resp_decode(body, 48, &regions, &count), ORB_EPROTO);
    assert_error_mentions("reserved");
    /* Outputs untouched by failures. */
    assert_ptr_equal(regions, (struct orb_region_desc *)0x1);
    assert_int_equal(count, 77);

    /* Zero regions: NULL array. */
    const uint8_t empty[8] = {0};
    assert_int_equal(orb_wire_describe_resp_decode(empty, sizeof empty, &regions, &count), 0);
    assert_null(regions);
    assert_int_equal(count, 0);
}

static void test_describe_resp_bad_regions(void **state)
{
    (void)state;
    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    uint8_t *body = frame + ORB_WIRE_HEADER_LEN;
    /* Second region at body + 32: addr, length at +8, perm at +16, memory kind at +20, its
     * routes at +21, reserved at +22. */
    const uint32_t perms[] = {ORB_PERM_LOCAL, 2, 4, 0xffffffffu};
    for (size_t i = 0; i < sizeof perms / sizeof perms[0]; i++) {
        load(ORB_WIRE_DESCRIBE_RESP);
        put_u32(body + 32 + 16, perms[i]);
        assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
        assert_error_mentions("perm");
    }
    const uint32_t kinds[] = {2, 3, 0x80u, 0xffu};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        load(ORB_WIRE_DESCRIBE_RESP);
        put_u32(body + 8 + 20, kinds[i]);
        assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
        assert_error_mentions("memory kind");
    }
    /* Routes: only the two bits, and only on device memory. */
    const uint8_t routes[] = {4, 0x80, 0xff};
    for (size_t i = 0; i < sizeof routes; i++) {
        load(ORB_WIRE_DESCRIBE_RESP);
        body[32 + 21] = routes[i];
        assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
        assert_error_mentions("routes");
    }
    load(ORB_WIRE_DESCRIBE_RESP);
    body[8 + 21] = 1; /* the first region is host memory */
    assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
    assert_error_mentions("routes");
    for (size_t off = 22; off < 24; off++) {
        load(ORB_WIRE_DESCRIBE_RESP);
        body[32 + off] = 1;
        assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
        assert_error_mentions("reserved");
    }
    load(ORB_WIRE_DESCRIBE_RESP);
    put_u64(body + 8 + 8, 0); /* first region length 0 */
    assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
    assert_error_mentions("length");
    load(ORB_WIRE_DESCRIBE_RESP);
    put_u64(body + 32 + 8, 0x1001); /* second region now ends one past UINT64_MAX */
    assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
    assert_error_mentions("overflow");
    load(ORB_WIRE_DESCRIBE_RESP);
    put_u64(body + 8, UINT64_MAX);
    put_u64(body + 16, UINT64_MAX);
    assert_int_equal(orb_wire_describe_resp_decode(body, 56, &regions, &count), ORB_EPROTO);
    assert_error_mentions("overflow");
    assert_null(regions);
}

/* A READ_REQ / WRITE_REQ body: the piece and the whole request it belongs to. */
static void put_xfer_req(uint8_t body[32], uint64_t addr, uint64_t length, uint64_t req_addr,
                         uint64_t req_length)
{
    put_u64(body, addr);
    put_u64(body + 8, length);
    put_u64(body + 16, req_addr);
    put_u64(body + 24, req_length);
}

static void test_xfer_bad_length_and_overflow(void **state)
{
    (void)state;
    struct orb_wire_xfer m = {.addr = 5, .length = 6};
    uint8_t body[32];
    const uint64_t bad_len[] = {0, ORB_WIRE_MAX_PAYLOAD + 1ull, 1ull << 32, UINT64_MAX};
    for (size_t i = 0; i < sizeof bad_len / sizeof bad_len[0]; i++) {
        put_u64(body, 0x1000);
        put_u64(body + 8, bad_len[i]);
        assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, 16, &m), ORB_EPROTO);
        assert_error_mentions("length");
        put_xfer_req(body, 0x1000, bad_len[i], 0x1000, UINT64_MAX - 0x1000);
        assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_REQ, body, 32, &m), ORB_EPROTO);
        assert_error_mentions("length");
    }
    put_u64(body, UINT64_MAX - 4095);
    put_u64(body + 8, 4097);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, 16, &m), ORB_EPROTO);
    assert_error_mentions("overflow");
    put_u64(body, UINT64_MAX);
    put_u64(body + 8, 1);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, 16, &m), ORB_EPROTO);
    assert_true(m.addr == 5 && m.length == 6);
    /* Ending exactly at UINT64_MAX is allowed; a READ_RESP's request range is its own. */
    put_u64(body, UINT64_MAX - 4096);
    put_u64(body + 8, 4096);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, 16, &m), 0);
    assert_true(m.addr == UINT64_MAX - 4096 && m.length == 4096);
    assert_true(m.request_addr == m.addr && m.request_length == m.length);
    /* Each layout has exactly its own length. */
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP, body, 32, &m), ORB_EPROTO);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_REQ, body, 16, &m), ORB_EPROTO);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_WRITE_RESP, body, 16, &m), ORB_EINVAL);
}

static void test_xfer_request_range(void **state)
{
    (void)state;
    uint8_t body[32];
    const uint8_t types[2] = {ORB_WIRE_READ_REQ, ORB_WIRE_WRITE_REQ};
    for (size_t t = 0; t < 2; t++) {
        struct orb_wire_xfer m = {.addr = 5, .length = 6, .request_addr = 7, .request_length = 8};
        /* The piece must lie inside the request: below its start, past its end, or a request
         * range that is empty or wraps are all refused, and `m` stays as it was. */
        put_xfer_req(body, 0x1000, 0x100, 0x1001, 0x1000);
        assert_int_equal(orb_wire_xfer_decode(types[t], body, 32, &m), ORB_EPROTO);
        assert_error_mentions("outside its request");
        put_xfer_req(body, 0x1f01, 0x100, 0x1000, 0x1000);
        assert_int_equal(orb_wire_xfer_decode(types[t], body, 32, &m), ORB_EPROTO);
        assert_error_mentions("outside its request");
        put_xfer_req(body, 0x1000, 0x100, 0x1000, 0);
        assert_int_equal(orb_wire_xfer_decode(types[t], body, 32, &m), ORB_EPROTO);
        assert_error_mentions("request_length");
        put_xfer_req(body, UINT64_MAX - 0x100, 0x100, UINT64_MAX - 0x100, 0x102);
        assert_int_equal(orb_wire_xfer_decode(types[t], body, 32, &m), ORB_EPROTO);
        assert_error_mentions("overflows");
        assert_true(m.addr == 5 && m.length == 6 && m.request_addr == 7 && m.request_length == 8);
        /* The last piece of a request that ends at UINT64_MAX; a request far larger than one
         * frame may carry. */
        put_xfer_req(body, UINT64_MAX - 0x100, 0x100, 0, UINT64_MAX);
        assert_int_equal(orb_wire_xfer_decode(types[t], body, 32, &m), 0);
        assert_true(m.addr == UINT64_MAX - 0x100 && m.length == 0x100);
        assert_true(m.request_addr == 0 && m.request_length == UINT64_MAX);
    }
    /* Encoders refuse what decoders refuse. */
    struct orb_wire_xfer x = {.addr = 0x1000, .length = 0x100, .request_addr = 0x1001,
                              .request_length = 0x1000};
    uint8_t out[ORB_WIRE_HEADER_LEN + 32];
    size_t len = 77;
    assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_WRITE_REQ, 1, &x, out, sizeof out, &len),
                     ORB_EINVAL);
    assert_int_equal(len, 77);
    x.request_addr = 0x1000;
    assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_WRITE_REQ, 1, &x, out, sizeof out, &len), 0);
    assert_int_equal(len, ORB_WIRE_HEADER_LEN + 32);
    /* A READ_RESP carries no request range, whatever the message says. */
    x.request_addr = 0x5000;
    x.request_length = 0;
    assert_int_equal(orb_wire_xfer_encode(ORB_WIRE_READ_RESP, 1, &x, out, sizeof out, &len), 0);
    assert_int_equal(len, ORB_WIRE_HEADER_LEN + 16);
}

static void test_notify_bad_length(void **state)
{
    (void)state;
    struct orb_wire_notify m = {.length = 9, .data = NULL};
    static uint8_t body[4 + ORB_NOTIFY_MAX + 8];
    memset(body, 'n', sizeof body);
    put_u32(body, 0);
    assert_int_equal(orb_wire_notify_decode(body, 4, &m), ORB_EPROTO);
    assert_error_mentions("length");
    put_u32(body, ORB_NOTIFY_MAX + 1);
    assert_int_equal(orb_wire_notify_decode(body, 4 + ORB_NOTIFY_MAX + 1, &m), ORB_EPROTO);
    assert_error_mentions("length");
    put_u32(body, 5);
    assert_int_equal(orb_wire_notify_decode(body, 4 + 4, &m), ORB_EPROTO);
    assert_int_equal(orb_wire_notify_decode(body, 4 + 6, &m), ORB_EPROTO);
    assert_int_equal(m.length, 9);
    put_u32(body, ORB_NOTIFY_MAX);
    assert_int_equal(orb_wire_notify_decode(body, 4 + ORB_NOTIFY_MAX, &m), 0);
    assert_int_equal(m.length, ORB_NOTIFY_MAX);
    assert_ptr_equal(m.data, body + 4);
}

static void test_decoders_reject_null_arguments(void **state)
{
    (void)state;
    uint8_t hdr[ORB_WIRE_HEADER_LEN] = {0};
    assert_int_equal(orb_wire_header_decode(hdr, NULL), ORB_EINVAL);
    assert_int_equal(orb_wire_hello_decode(NULL, 40, &(struct orb_wire_hello){0}), ORB_EINVAL);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_REQ, golden_read_req + 24, 32, NULL),
                     ORB_EINVAL);
    size_t count;
    assert_int_equal(orb_wire_describe_resp_decode(golden_describe_resp + 24, 56, NULL, &count),
                     ORB_EINVAL);
}

/* ---- encoders: invalid fields and small buffers ----------------------------------------------- */

static uint8_t enc[ORB_WIRE_HEADER_LEN + 8 + 24 * 4 + 300];

/* The encoder must fail with ORB_EINVAL and write neither the buffer nor the length. */
#define ASSERT_ENCODE_REJECTED(call)                                                                \
    do {                                                                                            \
        memset(enc, 0xcc, sizeof enc);                                                              \
        size_t len_ = 0xabcd;                                                                       \
        size_t *len_out = &len_;                                                                    \
        (void)len_out;                                                                              \
        assert_int_equal((call), ORB_EINVAL);                                                       \
        assert_int_equal(len_, 0xabcd);                                                             \
        for (size_t k_ = 0; k_ < sizeof enc; k_++)                                                  \
            assert_int_equal(enc[k_], 0xcc);                                                        \
    } while (0)

static void test_encode_into_too_small_buffers(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GOLDEN; i++) {
        const struct golden *g = &goldens[i];
        const size_t caps[] = {0, 1, ORB_WIRE_HEADER_LEN - 1, ORB_WIRE_HEADER_LEN, g->len - 1};
        for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
            if (caps[k] >= g->len)
                continue; /* the empty-bodied frames fit in a bare header */
            memset(enc, 0xcc, sizeof enc);
            size_t len = 0xabcd;
            orb_clear_error();
            assert_int_equal(encode_golden(g, enc, caps[k], &len), ORB_EINVAL);
            assert_error_mentions("buffer");
            assert_int_equal(len, 0xabcd);
            for (size_t b = 0; b < sizeof enc; b++)
                assert_int_equal(enc[b], 0xcc);
        }
        size_t len = 0;
        assert_int_equal(encode_golden(g, enc, g->len, &len), 0);
        assert_int_equal(len, g->len);
        /* A NULL buffer or length is refused too. */
        assert_int_equal(encode_golden(g, NULL, 4096, &len), ORB_EINVAL);
        assert_int_equal(encode_golden(g, enc, sizeof enc, NULL), ORB_EINVAL);
    }
}

static void test_encode_rejects_bad_fields(void **state)
{
    (void)state;
    struct orb_wire_hello hello = golden_hello_msg();
    hello.role = 2;
    ASSERT_ENCODE_REJECTED(orb_wire_hello_encode(&hello, enc, sizeof enc, len_out));
    hello = golden_hello_msg();
    hello.stripe = 64;
    ASSERT_ENCODE_REJECTED(orb_wire_hello_encode(&hello, enc, sizeof enc, len_out));
    hello.role = ORB_WIRE_ROLE_CONTROL;
    hello.stripe = 1;
    ASSERT_ENCODE_REJECTED(orb_wire_hello_encode(&hello, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_hello_encode(NULL, enc, sizeof enc, len_out));

    struct orb_wire_hello_ok ok = golden_hello_ok_msg();
    ok.max_payload = 4095;
    ASSERT_ENCODE_REJECTED(orb_wire_hello_ok_encode(&ok, enc, sizeof enc, len_out));
    ok.max_payload = ORB_WIRE_MAX_PAYLOAD + 1;
    ASSERT_ENCODE_REJECTED(orb_wire_hello_ok_encode(&ok, enc, sizeof enc, len_out));

    struct orb_wire_error err;
    memset(&err, 0, sizeof err);
    err.status = 0;
    ASSERT_ENCODE_REJECTED(orb_wire_error_encode(1, &err, enc, sizeof enc, len_out));
    err.status = ORB_EAGAIN - 1;
    ASSERT_ENCODE_REJECTED(orb_wire_error_encode(1, &err, enc, sizeof enc, len_out));
    err.status = 3;
    ASSERT_ENCODE_REJECTED(orb_wire_error_encode(1, &err, enc, sizeof enc, len_out));

    struct orb_region_desc bad_regions[2] = {golden_regions[0], golden_regions[1]};
    bad_regions[1].perm = ORB_PERM_LOCAL;
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(1, bad_regions, 2, enc, sizeof enc, len_out));
    bad_regions[1] = golden_regions[1];
    bad_regions[1].length = 0;
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(1, bad_regions, 2, enc, sizeof enc, len_out));
    bad_regions[1].length = 0x1001; /* one past UINT64_MAX */
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(1, bad_regions, 2, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(1, NULL, 1, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(1, golden_regions, ORB_WIRE_MAX_REGIONS + 1,
                                                         enc, sizeof enc, len_out));

    struct orb_wire_xfer x = {.addr = 0, .length = 0, .request_addr = 0, .request_length = 1};
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, 1, &x, enc, sizeof enc, len_out));
    x.length = ORB_WIRE_MAX_PAYLOAD + 1ull;
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_WRITE_REQ, 1, &x, enc, sizeof enc, len_out));
    x.addr = UINT64_MAX;
    x.length = 1;
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_READ_RESP, 1, &x, enc, sizeof enc, len_out));
    x.addr = 0;
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_WRITE_RESP, 1, &x, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_HELLO, 1, &x, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(0, 1, &x, enc, sizeof enc, len_out));

    ASSERT_ENCODE_REJECTED(orb_wire_empty_encode(ORB_WIRE_READ_REQ, 1, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_empty_encode(ORB_WIRE_DESCRIBE_RESP, 1, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_empty_encode(ORB_WIRE_CONTROL_REQ, 1, enc, sizeof enc, len_out));

    static const uint8_t big[ORB_NOTIFY_MAX + 1];
    struct orb_wire_notify n = {.length = 0, .data = big};
    ASSERT_ENCODE_REJECTED(orb_wire_notify_encode(1, &n, enc, sizeof enc, len_out));
    n.length = ORB_NOTIFY_MAX + 1;
    ASSERT_ENCODE_REJECTED(orb_wire_notify_encode(1, &n, enc, sizeof enc, len_out));
    n.length = 1;
    n.data = NULL;
    ASSERT_ENCODE_REJECTED(orb_wire_notify_encode(1, &n, enc, sizeof enc, len_out));
}

static void test_encode_enforces_tag_rules(void **state)
{
    (void)state;
    struct orb_wire_xfer x = {.addr = 0, .length = 1, .request_addr = 0, .request_length = 1};
    ASSERT_ENCODE_REJECTED(orb_wire_xfer_encode(ORB_WIRE_READ_REQ, 0, &x, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_describe_req_encode(0, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_describe_resp_encode(0, NULL, 0, enc, sizeof enc, len_out));
    ASSERT_ENCODE_REJECTED(orb_wire_empty_encode(ORB_WIRE_WRITE_RESP, 0, enc, sizeof enc, len_out));
    const struct orb_wire_notify n = {.length = 1, .data = notify_text};
    ASSERT_ENCODE_REJECTED(orb_wire_notify_encode(0, &n, enc, sizeof enc, len_out));
    /* ERROR for the connection uses tag 0. */
    struct orb_wire_error err;
    memset(&err, 0, sizeof err);
    err.status = ORB_ESTALE;
    size_t len = 0;
    assert_int_equal(orb_wire_error_encode(0, &err, enc, sizeof enc, &len), 0);
    assert_int_equal(len, ORB_WIRE_HEADER_LEN + 8);
}

static void test_error_encode_truncates_and_sanitises_text(void **state)
{
    (void)state;
    struct orb_wire_error err, back;
    memset(&err, 0, sizeof err);
    err.status = ORB_EPROTO;
    memset(err.text, 'e', ORB_WIRE_MAX_ERROR_TEXT); /* the full 256, no room for more anyway */
    err.text[ORB_WIRE_MAX_ERROR_TEXT] = '\0';
    err.text[3] = '\n';
    err.text[4] = '\x1b';
    size_t len = 0;
    assert_int_equal(orb_wire_error_encode(5, &err, enc, sizeof enc, &len), 0);
    assert_int_equal(len, ORB_WIRE_HEADER_LEN + 8 + ORB_WIRE_MAX_ERROR_TEXT);
    assert_int_equal(enc[ORB_WIRE_HEADER_LEN + 6], 0x00);
    assert_int_equal(enc[ORB_WIRE_HEADER_LEN + 7], 0x01); /* text_len 256 */
    assert_int_equal(orb_wire_error_decode(enc + ORB_WIRE_HEADER_LEN, len - ORB_WIRE_HEADER_LEN, &back), 0);
    assert_int_equal(back.text[3], '?');
    assert_int_equal(back.text[4], '?');
    assert_int_equal(back.text[5], 'e');
    assert_int_equal(strlen(back.text), ORB_WIRE_MAX_ERROR_TEXT);

    /* A text with no NUL in its array is cut at ORB_WIRE_MAX_ERROR_TEXT. */
    memset(err.text, 'z', sizeof err.text);
    assert_int_equal(orb_wire_error_encode(5, &err, enc, sizeof enc, &len), 0);
    assert_int_equal(len, ORB_WIRE_HEADER_LEN + 8 + ORB_WIRE_MAX_ERROR_TEXT);
}

static void test_describe_resp_size(void **state)
{
    (void)state;
    assert_int_equal(orb_wire_describe_resp_size(0), 32);
    assert_int_equal(orb_wire_describe_resp_size(2), sizeof golden_describe_resp);
    assert_int_equal(orb_wire_describe_resp_size(ORB_WIRE_MAX_REGIONS),
                     ORB_WIRE_HEADER_LEN + ORB_WIRE_MAX_BODY);
    assert_true(orb_wire_describe_resp_size(ORB_WIRE_MAX_REGIONS + 1) == SIZE_MAX);
    assert_true(orb_wire_describe_resp_size(SIZE_MAX) == SIZE_MAX);
}

static void test_describe_resp_max_regions_round_trip(void **state)
{
    (void)state;
    size_t n = ORB_WIRE_MAX_REGIONS;
    struct orb_region_desc *regions = calloc(n, sizeof *regions);
    assert_non_null(regions);
    for (size_t i = 0; i < n; i++) {
        regions[i].addr = (uint64_t)i << 20;
        regions[i].length = i + 1;
        regions[i].perm = (i & 1) ? ORB_PERM_REMOTE_WRITE : ORB_PERM_REMOTE_READ;
    }
    size_t cap = orb_wire_describe_resp_size(n);
    uint8_t *buf = malloc(cap);
    assert_non_null(buf);
    size_t len = 0;
    assert_int_equal(orb_wire_describe_resp_encode(3, regions, n, buf, cap, &len), 0);
    assert_int_equal(len, cap);
    struct orb_wire_header h;
    assert_int_equal(orb_wire_header_decode(buf, &h), 0);
    assert_int_equal(h.body_len, ORB_WIRE_MAX_BODY);
    struct orb_region_desc *back = NULL;
    size_t count = 0;
    assert_int_equal(orb_wire_describe_resp_decode(buf + ORB_WIRE_HEADER_LEN, h.body_len, &back, &count), 0);
    assert_int_equal(count, n);
    assert_memory_equal(back, regions, n * sizeof *regions);
    free(back);
    free(buf);
    free(regions);
}

/* ---- golden vectors ---------------------------------------------------------------------------- */

static void test_golden_encode(void **state)
{
    (void)state;
    for (size_t i = 0; i < N_GOLDEN; i++) {
        const struct golden *g = &goldens[i];
        memset(enc, 0xcc, sizeof enc);
        size_t len = 0;
        assert_int_equal(encode_golden(g, enc, sizeof enc, &len), 0);
        if (len != g->len)
            fail_msg("%s: encoded %zu bytes, expected %zu", g->name, len, g->len);
        for (size_t b = 0; b < len; b++) {
            if (enc[b] != g->bytes[b])
                fail_msg("%s: byte %zu is 0x%02x, expected 0x%02x", g->name, b, enc[b], g->bytes[b]);
        }
        assert_int_equal(enc[len], 0xcc); /* nothing written past the frame */
    }
}

static void test_golden_header_decode(void **state)
{
    (void)state;
    const uint64_t tags[N_GOLDEN] = {0, 0, 0x0102030405060708ull, 0x2a, 0x2b, 0x1122334455667788ull,
                                     0x1122334455667788ull, 0x99, 0x99, 0xdeadbeef, 0xdeadbeef};
    for (size_t i = 0; i < N_GOLDEN; i++) {
        const struct golden *g = &goldens[i];
        struct orb_wire_header h;
        assert_int_equal(orb_wire_header_decode(g->bytes, &h), 0);
        assert_int_equal(h.type, g->type);
        assert_int_equal(h.body_len, g->len - ORB_WIRE_HEADER_LEN);
        assert_true(h.tag == tags[i]);
        /* Re-encoding the header gives the same 24 bytes. */
        uint8_t again[ORB_WIRE_HEADER_LEN];
        orb_wire_header_encode(&h, again);
        assert_memory_equal(again, g->bytes, ORB_WIRE_HEADER_LEN);
    }
}

static void test_golden_body_decode(void **state)
{
    (void)state;
    const uint8_t *b;

    struct orb_wire_hello hello;
    struct orb_wire_hello want_hello = golden_hello_msg();
    b = golden_hello + ORB_WIRE_HEADER_LEN;
    assert_int_equal(orb_wire_hello_decode(b, 40, &hello), 0);
    assert_memory_equal(hello.expected.bytes, want_hello.expected.bytes, 16);
    assert_memory_equal(hello.sender.bytes, want_hello.sender.bytes, 16);
    assert_int_equal(hello.role, ORB_WIRE_ROLE_DATA);
    assert_int_equal(hello.stripe, 3);

    struct orb_wire_hello_ok ok;
    struct orb_wire_hello_ok want_ok = golden_hello_ok_msg();
    b = golden_hello_ok + ORB_WIRE_HEADER_LEN;
    assert_int_equal(orb_wire_hello_ok_decode(b, 20, &ok), 0);
    assert_memory_equal(ok.epoch.bytes, want_ok.epoch.bytes, 16);
    assert_int_equal(ok.max_payload, 1u << 20);

    struct orb_wire_error err;
    b = golden_error + ORB_WIRE_HEADER_LEN;
    assert_int_equal(orb_wire_error_decode(b, 13, &err), 0);
    assert_int_equal(err.status, ORB_ESTALE);
    assert_string_equal(err.text, "stale");

    struct orb_region_desc *regions = NULL;
    size_t count = 0;
    b = golden_describe_resp + ORB_WIRE_HEADER_LEN;
    assert_int_equal(orb_wire_describe_resp_decode(b, 56, &regions, &count), 0);
    assert_int_equal(count, 2);
    assert_non_null(regions);
    for (size_t i = 0; i < 2; i++) {
        assert_true(regions[i].addr == golden_regions[i].addr);
        assert_true(regions[i].length == golden_regions[i].length);
        assert_int_equal(regions[i].perm, golden_regions[i].perm);
        assert_int_equal(regions[i].memory_kind, golden_regions[i].memory_kind);
        assert_int_equal(regions[i].gpu_direct_routes, golden_regions[i].gpu_direct_routes);
    }
    free(regions);

    struct orb_wire_xfer x;
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_REQ, golden_read_req + ORB_WIRE_HEADER_LEN,
                                          32, &x), 0);
    assert_true(x.addr == read_xfer.addr && x.length == read_xfer.length);
    assert_true(x.request_addr == read_xfer.request_addr &&
                x.request_length == read_xfer.request_length);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_READ_RESP,
                                          golden_read_resp + ORB_WIRE_HEADER_LEN, 16, &x), 0);
    assert_true(x.addr == read_xfer.addr && x.length == read_xfer.length);
    assert_int_equal(orb_wire_xfer_decode(ORB_WIRE_WRITE_REQ,
                                          golden_write_req + ORB_WIRE_HEADER_LEN, 32, &x), 0);
    assert_true(x.addr == 0x1000 && x.length == ORB_WIRE_MAX_PAYLOAD);
    assert_true(x.request_addr == 0x1000 && x.request_length == ORB_WIRE_MAX_PAYLOAD);

    struct orb_wire_notify n;
    b = golden_notify + ORB_WIRE_HEADER_LEN;
    assert_int_equal(orb_wire_notify_decode(b, 7, &n), 0);
    assert_int_equal(n.length, 3);
    assert_ptr_equal(n.data, b + 4); /* borrowed, not copied */
    assert_memory_equal(n.data, "hi!", 3);
}

/* ---- deterministic mutation -------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    /* xorshift64*: fixed seed, so every run visits the same inputs. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static size_t rng_below(size_t n)
{
    return (size_t)(rng_next() % n);
}

/* Re-encode a successfully decoded frame and require the exact same bytes: the codec is a
 * bijection on valid frames, so no two encodings can mean the same message. */
static void assert_reencodes(const struct orb_wire_header *h, const uint8_t *buf, size_t len)
{
    static uint8_t out[ORB_WIRE_HEADER_LEN + 8 + 24 * 8 + 300];
    const uint8_t *body = buf + ORB_WIRE_HEADER_LEN;
    size_t body_len = h->body_len, out_len = 0;
    int rc = -999;
    switch (h->type) {
    case ORB_WIRE_HELLO: {
        struct orb_wire_hello m;
        assert_int_equal(orb_wire_hello_decode(body, body_len, &m), 0);
        rc = orb_wire_hello_encode(&m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_HELLO_OK: {
        struct orb_wire_hello_ok m;
        assert_int_equal(orb_wire_hello_ok_decode(body, body_len, &m), 0);
        rc = orb_wire_hello_ok_encode(&m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_ERROR: {
        struct orb_wire_error m;
        assert_int_equal(orb_wire_error_decode(body, body_len, &m), 0);
        rc = orb_wire_error_encode(h->tag, &m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_DESCRIBE_REQ: rc = orb_wire_describe_req_encode(h->tag, out, sizeof out, &out_len); break;
    case ORB_WIRE_DESCRIBE_RESP: {
        struct orb_region_desc *r = NULL;
        size_t n = 0;
        assert_int_equal(orb_wire_describe_resp_decode(body, body_len, &r, &n), 0);
        rc = orb_wire_describe_resp_encode(h->tag, r, n, out, sizeof out, &out_len);
        free(r);
        break;
    }
    case ORB_WIRE_READ_REQ:
    case ORB_WIRE_READ_RESP:
    case ORB_WIRE_WRITE_REQ: {
        struct orb_wire_xfer m;
        assert_int_equal(orb_wire_xfer_decode(h->type, body, body_len, &m), 0);
        rc = orb_wire_xfer_encode(h->type, h->tag, &m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_NOTIFY: {
        struct orb_wire_notify m;
        assert_int_equal(orb_wire_notify_decode(body, body_len, &m), 0);
        rc = orb_wire_notify_encode(h->tag, &m, out, sizeof out, &out_len);
        break;
    }
    default: rc = orb_wire_empty_encode(h->type, h->tag, out, sizeof out, &out_len); break;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(out_len, ORB_WIRE_HEADER_LEN + body_len);
    assert_true(out_len <= len);
    assert_memory_equal(out, buf, out_len);
}

static void test_mutated_frames_decode_or_fail_closed(void **state)
{
    (void)state;
    enum { ITERATIONS = 5000, SLACK = 40 };
    rng_state = 0x0b17e5eedull;
    size_t header_ok = 0, frame_ok = 0, rejected = 0;
    for (int it = 0; it < ITERATIONS; it++) {
        const struct golden *g = &goldens[rng_below(N_GOLDEN)];
        uint8_t buf[sizeof golden_describe_resp + SLACK];
        size_t len = g->len;
        memcpy(buf, g->bytes, len);
        int rounds = 1 + (int)rng_below(4);
        for (int r = 0; r < rounds; r++) {
            switch (rng_below(6)) {
            case 0: /* flip one bit */
                if (len)
                    buf[rng_below(len)] ^= (uint8_t)(1u << rng_below(8));
                break;
            case 1: /* overwrite a byte */
                if (len)
                    buf[rng_below(len)] = (uint8_t)rng_next();
                break;
            case 2: /* overwrite a byte of a body field with an extreme value */
                if (len > ORB_WIRE_HEADER_LEN)
                    buf[ORB_WIRE_HEADER_LEN + rng_below(len - ORB_WIRE_HEADER_LEN)] = rng_below(2) ? 0xff : 0x00;
                break;
            case 3: /* truncate */
                len = rng_below(len + 1);
                break;
            case 4: { /* extend with random bytes */
                size_t extra = 1 + rng_below(SLACK / 4);
                for (size_t k = 0; k < extra && len < sizeof buf; k++)
                    buf[len++] = (uint8_t)rng_next();
                break;
            }
            default: /* the body_len field, nudged */
                if (len >= 12)
                    buf[8] = (uint8_t)(buf[8] + (rng_below(2) ? 1 : -1) * (int)(1 + rng_below(20)));
                break;
            }
        }
        /* A heap copy of exactly `len` bytes, so over-reads are sanitizer errors. */
        uint8_t *copy = malloc(len ? len : 1);
        assert_non_null(copy);
        memcpy(copy, buf, len);

        /* The rest after a header, as the body of every type. */
        if (len >= ORB_WIRE_HEADER_LEN) {
            for (uint8_t t = 1; t <= ORB_WIRE_TYPE_MAX; t++) {
                int rc = decode_body_as(t, copy + ORB_WIRE_HEADER_LEN, len - ORB_WIRE_HEADER_LEN);
                assert_true(rc == 0 || rc == ORB_EPROTO);
            }
            struct orb_wire_header h;
            int rc = orb_wire_header_decode(copy, &h);
            assert_true(rc == 0 || rc == ORB_EPROTO);
            if (rc == 0) {
                header_ok++;
                if (len - ORB_WIRE_HEADER_LEN >= h.body_len) {
                    rc = decode_body_as(h.type, copy + ORB_WIRE_HEADER_LEN, h.body_len);
                    assert_true(rc == 0 || rc == ORB_EPROTO);
                    if (rc == 0) {
                        frame_ok++;
                        assert_reencodes(&h, copy, len);
                    } else {
                        rejected++;
                    }
                }
            } else {
                rejected++;
            }
        } else {
            rejected++;
        }
        free(copy);
    }
    /* The run must have exercised both outcomes, or it proved nothing. */
    assert_true(frame_ok > ITERATIONS / 20);
    assert_true(rejected > ITERATIONS / 4);
    assert_true(header_ok > frame_ok); /* some frames have a valid header but a bad body */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cursor_past_end_is_sticky),
        cmocka_unit_test(test_cursor_trailing_bytes_fail_finish),
        cmocka_unit_test(test_writer_overflow_is_sticky),
        cmocka_unit_test(test_header_bad_magic),
        cmocka_unit_test(test_header_bad_version),
        cmocka_unit_test(test_control_golden_and_rules),
        cmocka_unit_test(test_header_unknown_type),
        cmocka_unit_test(test_header_nonzero_flags_and_reserved),
        cmocka_unit_test(test_header_body_len_out_of_range_for_every_type),
        cmocka_unit_test(test_header_describe_resp_len_not_in_region_steps),
        cmocka_unit_test(test_header_tag_rules),
        cmocka_unit_test(test_every_body_truncated_at_every_length),
        cmocka_unit_test(test_every_body_with_trailing_bytes),
        cmocka_unit_test(test_hello_bad_fields),
        cmocka_unit_test(test_hello_ok_bad_max_payload),
        cmocka_unit_test(test_error_bad_status),
        cmocka_unit_test(test_error_text_length_and_content),
        cmocka_unit_test(test_describe_resp_bad_count_and_reserved),
        cmocka_unit_test(test_describe_resp_bad_regions),
        cmocka_unit_test(test_xfer_bad_length_and_overflow),
        cmocka_unit_test(test_xfer_request_range),
        cmocka_unit_test(test_notify_bad_length),
        cmocka_unit_test(test_decoders_reject_null_arguments),
        cmocka_unit_test(test_encode_into_too_small_buffers),
        cmocka_unit_test(test_encode_rejects_bad_fields),
        cmocka_unit_test(test_encode_enforces_tag_rules),
        cmocka_unit_test(test_mutated_frames_decode_or_fail_closed),
        cmocka_unit_test(test_cursor_reads_little_endian),
        cmocka_unit_test(test_header_body_limits_table),
        cmocka_unit_test(test_error_encode_truncates_and_sanitises_text),
        cmocka_unit_test(test_describe_resp_size),
        cmocka_unit_test(test_describe_resp_max_regions_round_trip),
        cmocka_unit_test(test_golden_encode),
        cmocka_unit_test(test_golden_header_decode),
        cmocka_unit_test(test_golden_body_decode),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
