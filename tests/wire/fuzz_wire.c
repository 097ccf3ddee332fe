/* Fuzz target for the wire codec. The input is treated as a frame: the header is decoded, the
 * declared body is decoded as the header's type, and everything after the header is also decoded
 * as the body of every type. Any decoder result other than 0 or ORB_EPROTO, or a successful decode
 * that does not re-encode to the very same bytes, aborts. Built with -fsanitize=fuzzer under clang
 * and replayed over the committed corpus by fuzz_wire_replay in every build. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "wire/wire.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_wire: %s\n", what);
        abort();
    }
}

static void check_rc(int rc, const char *what)
{
    if (rc != 0 && rc != ORB_EPROTO) {
        fprintf(stderr, "fuzz_wire: %s returned %d\n", what, rc);
        abort();
    }
}

/* Largest frame the re-encoding below produces from a fuzz input (inputs are kept far smaller than
 * a full DESCRIBE_RESP by the fuzzer's -max_len; larger ones skip the comparison). */
#define FUZZ_OUT_MAX (ORB_WIRE_HEADER_LEN + 8u + 256u * ORB_WIRE_REGION_LEN)

/* Decode `body` as `type`. With `h` non-NULL the body is the frame's own, and a successful decode
 * must re-encode to exactly the header + body that came in. */
static void decode_as(uint8_t type, const uint8_t *frame_bytes, const struct orb_wire_header *h,
                      const uint8_t *body, size_t len)
{
    static uint8_t out[FUZZ_OUT_MAX];
    size_t out_len = 0;
    int rc, enc = 1; /* enc: the re-encode status; 1 when there is nothing to compare */
    switch (type) {
    case ORB_WIRE_HELLO: {
        struct orb_wire_hello m;
        rc = orb_wire_hello_decode(body, len, &m);
        check_rc(rc, "hello_decode");
        if (rc == 0 && h)
            enc = orb_wire_hello_encode(&m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_HELLO_OK: {
        struct orb_wire_hello_ok m;
        rc = orb_wire_hello_ok_decode(body, len, &m);
        check_rc(rc, "hello_ok_decode");
        if (rc == 0 && h)
            enc = orb_wire_hello_ok_encode(&m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_ERROR: {
        struct orb_wire_error m;
        rc = orb_wire_error_decode(body, len, &m);
        check_rc(rc, "error_decode");
        if (rc == 0) {
            check(strlen(m.text) == len - 8, "error text length");
            if (h)
                enc = orb_wire_error_encode(h->tag, &m, out, sizeof out, &out_len);
        }
        break;
    }
    case ORB_WIRE_DESCRIBE_RESP: {
        struct orb_region_desc *regions = NULL;
        size_t count = 0;
        rc = orb_wire_describe_resp_decode(body, len, &regions, &count);
        check_rc(rc, "describe_resp_decode");
        if (rc == 0) {
            check((count == 0) == (regions == NULL), "describe_resp array vs count");
            for (size_t i = 0; i < count; i++)
                check(regions[i].length != 0 && regions[i].addr + regions[i].length >= regions[i].addr,
                      "describe_resp region range");
            if (h && orb_wire_describe_resp_size(count) <= sizeof out)
                enc = orb_wire_describe_resp_encode(h->tag, regions, count, out, sizeof out, &out_len);
        }
        free(regions);
        break;
    }
    case ORB_WIRE_READ_REQ:
    case ORB_WIRE_READ_RESP:
    case ORB_WIRE_WRITE_REQ: {
        struct orb_wire_xfer m;
        rc = orb_wire_xfer_decode(type, body, len, &m);
        check_rc(rc, "xfer_decode");
        if (rc == 0)
            check(m.request_addr <= m.addr && m.addr - m.request_addr <= m.request_length &&
                      m.length <= m.request_length - (m.addr - m.request_addr),
                  "xfer piece inside its request");
        if (rc == 0 && h)
            enc = orb_wire_xfer_encode(type, h->tag, &m, out, sizeof out, &out_len);
        break;
    }
    case ORB_WIRE_NOTIFY: {
        struct orb_wire_notify m;
        rc = orb_wire_notify_decode(body, len, &m);
        check_rc(rc, "notify_decode");
        if (rc == 0) {
            check(m.data == body + 4 && m.length == len - 4, "notify data bounds");
            if (h)
                enc = orb_wire_notify_encode(h->tag, &m, out, sizeof out, &out_len);
        }
        break;
    }
    case ORB_WIRE_CONTROL_REQ:
    case ORB_WIRE_CONTROL_RESP: {
        struct orb_wire_control m;
        rc = orb_wire_control_decode(body, len, &m);
        check_rc(rc, "control_decode");
        if (rc == 0) {
            check(m.data == body + 4 && m.length == len - 4 && m.length >= 1 && m.length <= ORB_WIRE_MAX_CONTROL,
                  "control data bounds");
            if (h)
                enc = orb_wire_control_encode(type, h->tag, &m, out, sizeof out, &out_len);
        }
        break;
    }
    case ORB_WIRE_DESCRIBE_REQ:
        if (h)
            enc = orb_wire_describe_req_encode(h->tag, out, sizeof out, &out_len);
        break;
    default: /* WRITE_RESP, NOTIFY_RESP: no body decoder, the header decode checked len == 0 */
        if (h)
            enc = orb_wire_empty_encode(type, h->tag, out, sizeof out, &out_len);
        break;
    }
    if (enc != 1) {
        check(enc == 0, "re-encode of a decoded frame failed");
        check(out_len == ORB_WIRE_HEADER_LEN + len, "re-encoded length differs");
        check(memcmp(out, frame_bytes, out_len) == 0, "re-encoded bytes differ");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Exercise the cursor on the raw input: reads never go past the end. */
    struct orb_cursor c;
    orb_cursor_init(&c, data, size);
    while (!c.failed) {
        (void)orb_cursor_u64(&c);
        (void)orb_cursor_u16(&c);
        (void)orb_cursor_bytes(&c, 3);
    }
    check(c.pos <= size && orb_cursor_finish(&c) == ORB_EPROTO, "cursor state");

    if (size < ORB_WIRE_HEADER_LEN)
        return 0;
    const uint8_t *rest = data + ORB_WIRE_HEADER_LEN;
    size_t rest_len = size - ORB_WIRE_HEADER_LEN;
    for (uint8_t t = ORB_WIRE_HELLO; t <= ORB_WIRE_TYPE_MAX; t++)
        decode_as(t, data, NULL, rest, rest_len);

    struct orb_wire_header h;
    int rc = orb_wire_header_decode(data, &h);
    check_rc(rc, "header_decode");
    if (rc != 0)
        return 0;
    uint32_t lo, hi;
    orb_wire_body_limits(h.type, &lo, &hi);
    check(h.body_len >= lo && h.body_len <= hi, "header body_len outside its limits");
    if (rest_len >= h.body_len)
        decode_as(h.type, data, &h, rest, h.body_len);
    return 0;
}
