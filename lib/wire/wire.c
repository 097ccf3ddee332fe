/* The OrbiTE wire protocol codec: explicit little-endian encoding through bounds-checked cursors.
 * Every decoder validates every field and fails closed with ORB_EPROTO; every encoder checks its
 * arguments and the buffer capacity before writing a single byte. */
#include "wire/wire.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define ORB_WIRE_MAX_STRIPES 64u
#define ORB_WIRE_MIN_MAX_PAYLOAD 4096u

/* Fixed body sizes. */
#define ORB_WIRE_HELLO_LEN 40u
#define ORB_WIRE_HELLO_OK_LEN 20u
#define ORB_WIRE_XFER_LEN 16u     /* READ_RESP */
#define ORB_WIRE_XFER_REQ_LEN 32u /* READ_REQ, WRITE_REQ: with the whole request's range */
#define ORB_WIRE_ERROR_FIXED 8u  /* i32 status + u16 flags + u16 text_len */
#define ORB_WIRE_NOTIFY_FIXED 4u /* u32 length */
#define ORB_WIRE_DESCRIBE_FIXED 8u /* u32 count + u32 reserved */
#define ORB_WIRE_CONTROL_FIXED 4u  /* u8 transport + u8 + u16 reserved */

/* ---- cursor ---------------------------------------------------------------------------------- */

void orb_cursor_init(struct orb_cursor *c, const uint8_t *buf, size_t len)
{
    c->buf = buf;
    c->len = buf ? len : 0;
    c->pos = 0;
    c->failed = 0;
}

/* Borrow `n` bytes or fail (sticky). Never forms a pointer past the buffer. */
static const uint8_t *cursor_take(struct orb_cursor *c, size_t n)
{
    if (c->failed || n > c->len - c->pos) {
        c->failed = 1;
        return NULL;
    }
    const uint8_t *p = c->buf + c->pos;
    c->pos += n;
    return p;
}

uint8_t orb_cursor_u8(struct orb_cursor *c)
{
    const uint8_t *p = cursor_take(c, 1);
    return p ? p[0] : 0;
}

uint16_t orb_cursor_u16(struct orb_cursor *c)
{
    const uint8_t *p = cursor_take(c, 2);
    if (!p)
        return 0;
    return (uint16_t)((uint16_t)p[0] | (uint16_t)p[1] << 8);
}

uint32_t orb_cursor_u32(struct orb_cursor *c)
{
    const uint8_t *p = cursor_take(c, 4);
    if (!p)
        return 0;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t orb_cursor_u64(struct orb_cursor *c)
{
    const uint8_t *p = cursor_take(c, 8);
    if (!p)
        return 0;
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

const uint8_t *orb_cursor_bytes(struct orb_cursor *c, size_t n)
{
    static const uint8_t empty[1];
    if (n == 0 && !c->failed && c->buf == NULL)
        return empty; /* a zero-length borrow of an empty cursor still succeeds */
    return cursor_take(c, n);
}

/* Copy `n` bytes out, or fail (sticky) and leave `dst` untouched. */
static void cursor_copy(struct orb_cursor *c, void *dst, size_t n)
{
    const uint8_t *p = orb_cursor_bytes(c, n);
    if (p && n != 0)
        memcpy(dst, p, n);
}

int orb_cursor_finish(const struct orb_cursor *c)
{
    return (c->failed || c->pos != c->len) ? ORB_EPROTO : 0;
}

/* ---- writer ---------------------------------------------------------------------------------- */

void orb_writer_init(struct orb_writer *w, uint8_t *buf, size_t cap)
{
    w->buf = buf;
    w->cap = buf ? cap : 0;
    w->pos = 0;
    w->failed = 0;
}

/* Reserve `n` bytes or fail (sticky); a failed writer writes nothing more. */
static uint8_t *writer_take(struct orb_writer *w, size_t n)
{
    if (w->failed || n > w->cap - w->pos) {
        w->failed = 1;
        return NULL;
    }
    uint8_t *p = w->buf + w->pos;
    w->pos += n;
    return p;
}

void orb_writer_u8(struct orb_writer *w, uint8_t v)
{
    uint8_t *p = writer_take(w, 1);
    if (p)
        p[0] = v;
}

void orb_writer_u16(struct orb_writer *w, uint16_t v)
{
    uint8_t *p = writer_take(w, 2);
    if (p) {
        p[0] = (uint8_t)v;
        p[1] = (uint8_t)(v >> 8);
    }
}

void orb_writer_u32(struct orb_writer *w, uint32_t v)
{
    uint8_t *p = writer_take(w, 4);
    if (p) {
        for (int i = 0; i < 4; i++)
            p[i] = (uint8_t)(v >> (8 * i));
    }
}

void orb_writer_u64(struct orb_writer *w, uint64_t v)
{
    uint8_t *p = writer_take(w, 8);
    if (p) {
        for (int i = 0; i < 8; i++)
            p[i] = (uint8_t)(v >> (8 * i));
    }
}

void orb_writer_bytes(struct orb_writer *w, const void *src, size_t n)
{
    if (n == 0)
        return;
    uint8_t *p = writer_take(w, n);
    if (p)
        memcpy(p, src, n);
}

/* ---- header ---------------------------------------------------------------------------------- */

const char *orb_wire_type_name(uint8_t type)
{
    switch (type) {
    case ORB_WIRE_HELLO: return "HELLO";
    case ORB_WIRE_HELLO_OK: return "HELLO_OK";
    case ORB_WIRE_ERROR: return "ERROR";
    case ORB_WIRE_DESCRIBE_REQ: return "DESCRIBE_REQ";
    case ORB_WIRE_DESCRIBE_RESP: return "DESCRIBE_RESP";
    case ORB_WIRE_READ_REQ: return "READ_REQ";
    case ORB_WIRE_READ_RESP: return "READ_RESP";
    case ORB_WIRE_WRITE_REQ: return "WRITE_REQ";
    case ORB_WIRE_WRITE_RESP: return "WRITE_RESP";
    case ORB_WIRE_NOTIFY: return "NOTIFY";
    case ORB_WIRE_NOTIFY_RESP: return "NOTIFY_RESP";
    case ORB_WIRE_CONTROL_REQ: return "CONTROL_REQ";
    case ORB_WIRE_CONTROL_RESP: return "CONTROL_RESP";
    default: return "unknown";
    }
}

void orb_wire_body_limits(uint8_t type, uint32_t *min_len, uint32_t *max_len)
{
    uint32_t lo = 0, hi = 0;
    switch (type) {
    case ORB_WIRE_HELLO: lo = hi = ORB_WIRE_HELLO_LEN; break;
    case ORB_WIRE_HELLO_OK: lo = hi = ORB_WIRE_HELLO_OK_LEN; break;
    case ORB_WIRE_ERROR:
        lo = ORB_WIRE_ERROR_FIXED;
        hi = ORB_WIRE_ERROR_FIXED + ORB_WIRE_MAX_ERROR_TEXT;
        break;
    case ORB_WIRE_DESCRIBE_REQ: lo = hi = 0; break;
    case ORB_WIRE_DESCRIBE_RESP:
        lo = ORB_WIRE_DESCRIBE_FIXED;
        hi = ORB_WIRE_MAX_BODY;
        break;
    case ORB_WIRE_READ_REQ:
    case ORB_WIRE_WRITE_REQ: lo = hi = ORB_WIRE_XFER_REQ_LEN; break;
    case ORB_WIRE_READ_RESP: lo = hi = ORB_WIRE_XFER_LEN; break;
    case ORB_WIRE_WRITE_RESP:
    case ORB_WIRE_NOTIFY_RESP: lo = hi = 0; break;
    case ORB_WIRE_NOTIFY:
        lo = ORB_WIRE_NOTIFY_FIXED + 1;
        hi = ORB_WIRE_NOTIFY_FIXED + ORB_NOTIFY_MAX;
        break;
    case ORB_WIRE_CONTROL_REQ:
    case ORB_WIRE_CONTROL_RESP:
        lo = ORB_WIRE_CONTROL_FIXED + 1;
        hi = ORB_WIRE_CONTROL_FIXED + ORB_WIRE_MAX_CONTROL;
        break;
    default: break;
    }
    if (min_len)
        *min_len = lo;
    if (max_len)
        *max_len = hi;
}

/* HELLO and HELLO_OK belong to the connection and carry tag 0; every request and its response
 * carries a non-zero tag, so that an ERROR with tag 0 can only mean "the connection". ERROR may
 * carry either. Returns 0 when `tag` is allowed for `type`. */
static int tag_allowed(uint8_t type, uint64_t tag)
{
    switch (type) {
    case ORB_WIRE_HELLO:
    case ORB_WIRE_HELLO_OK: return tag == 0;
    case ORB_WIRE_ERROR: return 1;
    default: return tag != 0;
    }
}

void orb_wire_header_encode(const struct orb_wire_header *h, uint8_t out[ORB_WIRE_HEADER_LEN])
{
    struct orb_writer w;
    orb_writer_init(&w, out, ORB_WIRE_HEADER_LEN);
    orb_writer_u32(&w, ORB_WIRE_MAGIC);
    orb_writer_u8(&w, ORB_WIRE_VERSION);
    orb_writer_u8(&w, h->type);
    orb_writer_u16(&w, 0);           /* flags */
    orb_writer_u32(&w, h->body_len);
    orb_writer_u32(&w, 0);           /* reserved */
    orb_writer_u64(&w, h->tag);
}

int orb_wire_header_decode(const uint8_t in[ORB_WIRE_HEADER_LEN], struct orb_wire_header *out)
{
    if (!in || !out)
        return orb_fail(ORB_EINVAL, "wire header: NULL argument");
    struct orb_cursor c;
    orb_cursor_init(&c, in, ORB_WIRE_HEADER_LEN);
    uint32_t magic = orb_cursor_u32(&c);
    uint8_t version = orb_cursor_u8(&c);
    uint8_t type = orb_cursor_u8(&c);
    uint16_t flags = orb_cursor_u16(&c);
    uint32_t body_len = orb_cursor_u32(&c);
    uint32_t reserved = orb_cursor_u32(&c);
    uint64_t tag = orb_cursor_u64(&c);
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "wire header: truncated");

    if (magic != ORB_WIRE_MAGIC)
        return orb_fail(ORB_EPROTO, "wire header: bad magic 0x%08x", (unsigned)magic);
    if (version != ORB_WIRE_VERSION)
        return orb_fail(ORB_EPROTO, "wire header: unsupported version %u (expected %u)",
                        (unsigned)version, (unsigned)ORB_WIRE_VERSION);
    if (type < ORB_WIRE_HELLO || type > ORB_WIRE_TYPE_MAX)
        return orb_fail(ORB_EPROTO, "wire header: unknown type %u", (unsigned)type);
    if (flags != 0)
        return orb_fail(ORB_EPROTO, "wire header: flags 0x%04x must be zero", (unsigned)flags);
    if (reserved != 0)
        return orb_fail(ORB_EPROTO, "wire header: reserved 0x%08x must be zero", (unsigned)reserved);

    uint32_t min_len, max_len;
    orb_wire_body_limits(type, &min_len, &max_len);
    if (body_len < min_len || body_len > max_len)
        return orb_fail(ORB_EPROTO, "wire header: body_len %u of %s outside %u..%u", (unsigned)body_len,
                        orb_wire_type_name(type), (unsigned)min_len, (unsigned)max_len);
    if (type == ORB_WIRE_DESCRIBE_RESP &&
        (body_len - ORB_WIRE_DESCRIBE_FIXED) % ORB_WIRE_REGION_LEN != 0)
        return orb_fail(ORB_EPROTO, "wire header: body_len %u of DESCRIBE_RESP is not 8 + n x %u",
                        (unsigned)body_len, (unsigned)ORB_WIRE_REGION_LEN);
    if (!tag_allowed(type, tag))
        return orb_fail(ORB_EPROTO, "wire header: tag %llu not allowed for %s (%s)",
                        (unsigned long long)tag, orb_wire_type_name(type),
                        tag == 0 ? "requests and responses need a non-zero tag"
                                 : "connection frames carry tag 0");

    out->type = type;
    out->body_len = body_len;
    out->tag = tag;
    return 0;
}

/* ---- encoding helpers ------------------------------------------------------------------------ */

/* Check the common encode arguments and that header + `body_len` bytes fit in `cap`. */
static int encode_begin(const char *what, uint8_t type, uint64_t tag, size_t body_len, uint8_t *out,
                        size_t cap, size_t *len_out, struct orb_writer *w)
{
    orb_writer_init(w, NULL, 0); /* a failed writer until the checks pass */
    w->failed = 1;
    if (!out || !len_out)
        return orb_fail(ORB_EINVAL, "%s encode: NULL buffer or length", what);
    if (!tag_allowed(type, tag))
        return orb_fail(ORB_EINVAL, "%s encode: tag %llu not allowed (%s)", what,
                        (unsigned long long)tag,
                        tag == 0 ? "tag 0 is reserved for connection frames"
                                 : "connection frames carry tag 0");
    if (body_len > cap || cap - body_len < ORB_WIRE_HEADER_LEN)
        return orb_fail(ORB_EINVAL, "%s encode: buffer of %zu bytes, need %zu", what, cap,
                        body_len + ORB_WIRE_HEADER_LEN);
    struct orb_wire_header h = {.type = type, .body_len = (uint32_t)body_len, .tag = tag};
    orb_wire_header_encode(&h, out);
    orb_writer_init(w, out, cap);
    w->pos = ORB_WIRE_HEADER_LEN;
    return 0;
}

/* Capacity was checked up front, so a failed writer here is a codec bug; still fail closed. */
static int encode_end(const char *what, const struct orb_writer *w, size_t *len_out)
{
    if (w->failed)
        return orb_fail(ORB_EINVAL, "%s encode: buffer overrun", what);
    *len_out = w->pos;
    return 0;
}

/* Check that a body has exactly `want` bytes. */
static int expect_len(const char *what, size_t len, size_t want)
{
    if (len != want)
        return orb_fail(ORB_EPROTO, "%s: body of %zu bytes, expected %zu", what, len, want);
    return 0;
}

static int body_args_ok(const char *what, const uint8_t *body, size_t len, const void *m)
{
    if (!m || (!body && len != 0))
        return orb_fail(ORB_EINVAL, "%s decode: NULL argument", what);
    return 0;
}

/* ---- HELLO ----------------------------------------------------------------------------------- */

static int hello_fields_ok(int status, const char *what, uint32_t role, uint32_t stripe)
{
    if (role != ORB_WIRE_ROLE_CONTROL && role != ORB_WIRE_ROLE_DATA)
        return orb_fail(status, "%s: unknown role %u", what, (unsigned)role);
    if (stripe >= ORB_WIRE_MAX_STRIPES)
        return orb_fail(status, "%s: stripe %u out of range (< %u)", what, (unsigned)stripe,
                        ORB_WIRE_MAX_STRIPES);
    if (role == ORB_WIRE_ROLE_CONTROL && stripe != 0)
        return orb_fail(status, "%s: stripe %u on a CONTROL connection (must be 0)", what,
                        (unsigned)stripe);
    return 0;
}

int orb_wire_hello_encode(const struct orb_wire_hello *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (!m)
        return orb_fail(ORB_EINVAL, "HELLO encode: NULL message");
    int rc = hello_fields_ok(ORB_EINVAL, "HELLO encode", m->role, m->stripe);
    if (rc != 0)
        return rc;
    struct orb_writer w;
    rc = encode_begin("HELLO", ORB_WIRE_HELLO, 0, ORB_WIRE_HELLO_LEN, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_bytes(&w, m->expected.bytes, sizeof m->expected.bytes);
    orb_writer_bytes(&w, m->sender.bytes, sizeof m->sender.bytes);
    orb_writer_u32(&w, m->role);
    orb_writer_u32(&w, m->stripe);
    return encode_end("HELLO", &w, len_out);
}

int orb_wire_hello_decode(const uint8_t *body, size_t len, struct orb_wire_hello *m)
{
    int rc = body_args_ok("HELLO", body, len, m);
    if (rc == 0)
        rc = expect_len("HELLO", len, ORB_WIRE_HELLO_LEN);
    if (rc != 0)
        return rc;
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    struct orb_wire_hello v;
    cursor_copy(&c, v.expected.bytes, sizeof v.expected.bytes);
    cursor_copy(&c, v.sender.bytes, sizeof v.sender.bytes);
    v.role = orb_cursor_u32(&c);
    v.stripe = orb_cursor_u32(&c);
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "HELLO: malformed body");
    rc = hello_fields_ok(ORB_EPROTO, "HELLO", v.role, v.stripe);
    if (rc != 0)
        return rc;
    *m = v;
    return 0;
}

/* ---- HELLO_OK -------------------------------------------------------------------------------- */

static int max_payload_ok(int status, const char *what, uint32_t max_payload)
{
    if (max_payload < ORB_WIRE_MIN_MAX_PAYLOAD || max_payload > ORB_WIRE_MAX_PAYLOAD)
        return orb_fail(status, "%s: max_payload %u outside %u..%u", what, (unsigned)max_payload,
                        ORB_WIRE_MIN_MAX_PAYLOAD, ORB_WIRE_MAX_PAYLOAD);
    return 0;
}

int orb_wire_hello_ok_encode(const struct orb_wire_hello_ok *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (!m)
        return orb_fail(ORB_EINVAL, "HELLO_OK encode: NULL message");
    int rc = max_payload_ok(ORB_EINVAL, "HELLO_OK encode", m->max_payload);
    if (rc != 0)
        return rc;
    struct orb_writer w;
    rc = encode_begin("HELLO_OK", ORB_WIRE_HELLO_OK, 0, ORB_WIRE_HELLO_OK_LEN, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_bytes(&w, m->epoch.bytes, sizeof m->epoch.bytes);
    orb_writer_u32(&w, m->max_payload);
    return encode_end("HELLO_OK", &w, len_out);
}

int orb_wire_hello_ok_decode(const uint8_t *body, size_t len, struct orb_wire_hello_ok *m)
{
    int rc = body_args_ok("HELLO_OK", body, len, m);
    if (rc == 0)
        rc = expect_len("HELLO_OK", len, ORB_WIRE_HELLO_OK_LEN);
    if (rc != 0)
        return rc;
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    struct orb_wire_hello_ok v;
    cursor_copy(&c, v.epoch.bytes, sizeof v.epoch.bytes);
    v.max_payload = orb_cursor_u32(&c);
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "HELLO_OK: malformed body");
    rc = max_payload_ok(ORB_EPROTO, "HELLO_OK", v.max_payload);
    if (rc != 0)
        return rc;
    *m = v;
    return 0;
}

/* ---- ERROR ----------------------------------------------------------------------------------- */

/* Error text is logged by the receiver, so control bytes (NUL included) never travel: the encoder
 * replaces them with '?', the decoder refuses them. */
static int is_text_byte(uint8_t b)
{
    return b >= 0x20 && b != 0x7f;
}

int orb_wire_error_encode(uint64_t tag, const struct orb_wire_error *m, uint8_t *out, size_t cap,
                          size_t *len_out)
{
    if (!m)
        return orb_fail(ORB_EINVAL, "ERROR encode: NULL message");
    if (m->status < ORB_EAGAIN || m->status > ORB_EINVAL)
        return orb_fail(ORB_EINVAL, "ERROR encode: status %d is not a failure status", (int)m->status);
    if (m->effect_unknown > 1)
        return orb_fail(ORB_EINVAL, "ERROR encode: effect_unknown %u is not 0 or 1", (unsigned)m->effect_unknown);
    size_t text_len = strnlen(m->text, ORB_WIRE_MAX_ERROR_TEXT);
    struct orb_writer w;
    int rc = encode_begin("ERROR", ORB_WIRE_ERROR, tag, ORB_WIRE_ERROR_FIXED + text_len, out, cap,
                          len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_u32(&w, (uint32_t)m->status);
    orb_writer_u16(&w, m->effect_unknown ? ORB_WIRE_ERROR_EFFECT_UNKNOWN : 0);
    orb_writer_u16(&w, (uint16_t)text_len);
    for (size_t i = 0; i < text_len; i++) {
        uint8_t b = (uint8_t)m->text[i];
        orb_writer_u8(&w, is_text_byte(b) ? b : (uint8_t)'?');
    }
    return encode_end("ERROR", &w, len_out);
}

int orb_wire_error_decode(const uint8_t *body, size_t len, struct orb_wire_error *m)
{
    int rc = body_args_ok("ERROR", body, len, m);
    if (rc != 0)
        return rc;
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    int32_t status = (int32_t)orb_cursor_u32(&c);
    uint16_t flags = orb_cursor_u16(&c);
    uint16_t text_len = orb_cursor_u16(&c);
    if (c.failed)
        return orb_fail(ORB_EPROTO, "ERROR: body of %zu bytes is shorter than %u", len,
                        ORB_WIRE_ERROR_FIXED);
    if (status < ORB_EAGAIN || status > ORB_EINVAL)
        return orb_fail(ORB_EPROTO, "ERROR: status %d is not a failure status", (int)status);
    if ((flags & ~ORB_WIRE_ERROR_EFFECT_UNKNOWN) != 0)
        return orb_fail(ORB_EPROTO, "ERROR: unknown flags 0x%04x", (unsigned)flags);
    if (text_len > ORB_WIRE_MAX_ERROR_TEXT)
        return orb_fail(ORB_EPROTO, "ERROR: text_len %u exceeds %u", (unsigned)text_len,
                        ORB_WIRE_MAX_ERROR_TEXT);
    if (text_len != len - ORB_WIRE_ERROR_FIXED)
        return orb_fail(ORB_EPROTO, "ERROR: text_len %u but %zu text bytes in the body",
                        (unsigned)text_len, len - ORB_WIRE_ERROR_FIXED);
    const uint8_t *text = orb_cursor_bytes(&c, text_len);
    if (!text || orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "ERROR: malformed body");
    for (size_t i = 0; i < text_len; i++) {
        if (!is_text_byte(text[i]))
            return orb_fail(ORB_EPROTO, "ERROR: text byte %zu is a control character 0x%02x", i,
                            (unsigned)text[i]);
    }
    m->status = status;
    m->effect_unknown = (flags & ORB_WIRE_ERROR_EFFECT_UNKNOWN) != 0;
    if (text_len != 0)
        memcpy(m->text, text, text_len);
    m->text[text_len] = '\0';
    return 0;
}

/* ---- DESCRIBE -------------------------------------------------------------------------------- */

int orb_wire_describe_req_encode(uint64_t tag, uint8_t *out, size_t cap, size_t *len_out)
{
    struct orb_writer w;
    int rc = encode_begin("DESCRIBE_REQ", ORB_WIRE_DESCRIBE_REQ, tag, 0, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    return encode_end("DESCRIBE_REQ", &w, len_out);
}

size_t orb_wire_describe_resp_size(size_t count)
{
    if (count > ORB_WIRE_MAX_REGIONS)
        return SIZE_MAX;
    return ORB_WIRE_HEADER_LEN + ORB_WIRE_DESCRIBE_FIXED + count * ORB_WIRE_REGION_LEN;
}

static int region_ok(int status, const char *what, size_t index, uint64_t addr, uint64_t length,
                     uint32_t perm, uint32_t kind, uint32_t routes)
{
    if (kind != ORB_MEMORY_HOST && kind != ORB_MEMORY_CUDA)
        return orb_fail(status, "%s: region %zu has memory kind %u (must be HOST or CUDA)", what, index,
                        (unsigned)kind);
    if ((routes & ~(uint32_t)(ORB_GPU_ROUTE_DMABUF | ORB_GPU_ROUTE_PEERMEM)) != 0 ||
        (routes != 0 && kind != ORB_MEMORY_CUDA))
        return orb_fail(status, "%s: region %zu has GPUDirect routes 0x%x (memory kind %u)", what, index,
                        (unsigned)routes, (unsigned)kind);
    if (perm != ORB_PERM_REMOTE_READ && perm != ORB_PERM_REMOTE_WRITE)
        return orb_fail(status, "%s: region %zu has perm %u (must be REMOTE_READ or REMOTE_WRITE)", what,
                        index, (unsigned)perm);
    if (length == 0)
        return orb_fail(status, "%s: region %zu has length 0", what, index);
    if (addr > UINT64_MAX - length)
        return orb_fail(status, "%s: region %zu addr 0x%llx + length %llu overflows", what, index,
                        (unsigned long long)addr, (unsigned long long)length);
    return 0;
}

int orb_wire_describe_resp_encode(uint64_t tag, const struct orb_region_desc *regions, size_t count,
                                  uint8_t *out, size_t cap, size_t *len_out)
{
    if (count > ORB_WIRE_MAX_REGIONS)
        return orb_fail(ORB_EINVAL, "DESCRIBE_RESP encode: %zu regions exceed %u", count,
                        ORB_WIRE_MAX_REGIONS);
    if (count != 0 && !regions)
        return orb_fail(ORB_EINVAL, "DESCRIBE_RESP encode: NULL regions");
    for (size_t i = 0; i < count; i++) {
        int rc = region_ok(ORB_EINVAL, "DESCRIBE_RESP encode", i, regions[i].addr, regions[i].length,
                           (uint32_t)regions[i].perm, regions[i].memory_kind, regions[i].gpu_direct_routes);
        if (rc != 0)
            return rc;
    }
    struct orb_writer w;
    int rc = encode_begin("DESCRIBE_RESP", ORB_WIRE_DESCRIBE_RESP, tag,
                          ORB_WIRE_DESCRIBE_FIXED + count * ORB_WIRE_REGION_LEN, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_u32(&w, (uint32_t)count);
    orb_writer_u32(&w, 0); /* reserved */
    for (size_t i = 0; i < count; i++) {
        orb_writer_u64(&w, regions[i].addr);
        orb_writer_u64(&w, regions[i].length);
        orb_writer_u32(&w, (uint32_t)regions[i].perm);
        orb_writer_u8(&w, (uint8_t)regions[i].memory_kind);
        orb_writer_u8(&w, (uint8_t)regions[i].gpu_direct_routes);
        orb_writer_u16(&w, 0);
    }
    return encode_end("DESCRIBE_RESP", &w, len_out);
}

int orb_wire_describe_resp_decode(const uint8_t *body, size_t len, struct orb_region_desc **regions_out,
                                  size_t *count_out)
{
    if (!regions_out || !count_out || (!body && len != 0))
        return orb_fail(ORB_EINVAL, "DESCRIBE_RESP decode: NULL argument");
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    uint32_t count = orb_cursor_u32(&c);
    uint32_t reserved = orb_cursor_u32(&c);
    if (c.failed)
        return orb_fail(ORB_EPROTO, "DESCRIBE_RESP: body of %zu bytes is shorter than %u", len,
                        ORB_WIRE_DESCRIBE_FIXED);
    if (reserved != 0)
        return orb_fail(ORB_EPROTO, "DESCRIBE_RESP: reserved 0x%08x must be zero", (unsigned)reserved);
    if (count > ORB_WIRE_MAX_REGIONS)
        return orb_fail(ORB_EPROTO, "DESCRIBE_RESP: count %u exceeds %u", (unsigned)count,
                        ORB_WIRE_MAX_REGIONS);
    /* count <= 65536, so this product cannot overflow. */
    size_t want = ORB_WIRE_DESCRIBE_FIXED + (size_t)count * ORB_WIRE_REGION_LEN;
    if (len != want)
        return orb_fail(ORB_EPROTO, "DESCRIBE_RESP: count %u needs a body of %zu bytes, got %zu",
                        (unsigned)count, want, len);

    struct orb_region_desc *regions = NULL;
    if (count != 0) {
        regions = calloc(count, sizeof *regions);
        if (!regions)
            return orb_fail(ORB_ENOMEM, "DESCRIBE_RESP: cannot allocate %u regions", (unsigned)count);
    }
    int rc = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint64_t addr = orb_cursor_u64(&c);
        uint64_t length = orb_cursor_u64(&c);
        uint32_t perm = orb_cursor_u32(&c);
        uint32_t kind = orb_cursor_u8(&c);
        uint32_t routes = orb_cursor_u8(&c);
        uint32_t zero = orb_cursor_u16(&c);
        rc = zero != 0 ? orb_fail(ORB_EPROTO, "DESCRIBE_RESP: region %u has reserved bytes set", (unsigned)i)
                       : region_ok(ORB_EPROTO, "DESCRIBE_RESP", i, addr, length, perm, kind, routes);
        if (rc != 0)
            goto free_regions;
        regions[i].addr = addr;
        regions[i].length = length;
        regions[i].perm = (enum orb_perm)perm;
        regions[i].memory_kind = kind;
        regions[i].gpu_direct_routes = routes;
    }
    if (orb_cursor_finish(&c) != 0) {
        rc = orb_fail(ORB_EPROTO, "DESCRIBE_RESP: malformed body");
        goto free_regions;
    }
    *regions_out = regions;
    *count_out = count;
    return 0;

free_regions:
    free(regions);
    return rc;
}

/* ---- READ_REQ / WRITE_REQ / READ_RESP -------------------------------------------------------- */

static int xfer_ok(int status, const char *what, uint64_t addr, uint64_t length)
{
    if (length == 0 || length > ORB_WIRE_MAX_PAYLOAD)
        return orb_fail(status, "%s: length %llu outside 1..%u", what, (unsigned long long)length,
                        ORB_WIRE_MAX_PAYLOAD);
    if (addr > UINT64_MAX - length)
        return orb_fail(status, "%s: addr 0x%llx + length %llu overflows", what,
                        (unsigned long long)addr, (unsigned long long)length);
    return 0;
}

/* The whole request's range must be a valid range that contains the frame's piece. */
static int request_range_ok(int status, const char *what, const struct orb_wire_xfer *m)
{
    if (m->request_length == 0)
        return orb_fail(status, "%s: request_length is zero", what);
    if (m->request_addr > UINT64_MAX - m->request_length)
        return orb_fail(status, "%s: request_addr 0x%llx + request_length %llu overflows", what,
                        (unsigned long long)m->request_addr,
                        (unsigned long long)m->request_length);
    if (m->addr < m->request_addr ||
        m->addr + m->length > m->request_addr + m->request_length)
        return orb_fail(status, "%s: [0x%llx, +%llu) lies outside its request [0x%llx, +%llu)",
                        what, (unsigned long long)m->addr, (unsigned long long)m->length,
                        (unsigned long long)m->request_addr,
                        (unsigned long long)m->request_length);
    return 0;
}

static int is_xfer_request(uint8_t type)
{
    return type == ORB_WIRE_READ_REQ || type == ORB_WIRE_WRITE_REQ;
}

int orb_wire_xfer_encode(uint8_t type, uint64_t tag, const struct orb_wire_xfer *m, uint8_t *out,
                         size_t cap, size_t *len_out)
{
    if (!is_xfer_request(type) && type != ORB_WIRE_READ_RESP)
        return orb_fail(ORB_EINVAL, "xfer encode: type %u (%s) has no addr/length body", (unsigned)type,
                        orb_wire_type_name(type));
    const char *what = orb_wire_type_name(type);
    if (!m)
        return orb_fail(ORB_EINVAL, "%s encode: NULL message", what);
    int rc = xfer_ok(ORB_EINVAL, what, m->addr, m->length);
    if (rc == 0 && is_xfer_request(type))
        rc = request_range_ok(ORB_EINVAL, what, m);
    if (rc != 0)
        return rc;
    struct orb_writer w;
    size_t body_len = is_xfer_request(type) ? ORB_WIRE_XFER_REQ_LEN : ORB_WIRE_XFER_LEN;
    rc = encode_begin(what, type, tag, body_len, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_u64(&w, m->addr);
    orb_writer_u64(&w, m->length);
    if (is_xfer_request(type)) {
        orb_writer_u64(&w, m->request_addr);
        orb_writer_u64(&w, m->request_length);
    }
    return encode_end(what, &w, len_out);
}

int orb_wire_xfer_decode(uint8_t type, const uint8_t *body, size_t len, struct orb_wire_xfer *m)
{
    if (!is_xfer_request(type) && type != ORB_WIRE_READ_RESP)
        return orb_fail(ORB_EINVAL, "xfer decode: type %u (%s) has no addr/length body",
                        (unsigned)type, orb_wire_type_name(type));
    const char *what = orb_wire_type_name(type);
    int rc = body_args_ok(what, body, len, m);
    if (rc == 0)
        rc = expect_len(what, len, is_xfer_request(type) ? ORB_WIRE_XFER_REQ_LEN : ORB_WIRE_XFER_LEN);
    if (rc != 0)
        return rc;
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    struct orb_wire_xfer v;
    v.addr = orb_cursor_u64(&c);
    v.length = orb_cursor_u64(&c);
    if (is_xfer_request(type)) {
        v.request_addr = orb_cursor_u64(&c);
        v.request_length = orb_cursor_u64(&c);
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "%s: malformed body", what);
    rc = xfer_ok(ORB_EPROTO, what, v.addr, v.length);
    if (rc != 0)
        return rc;
    if (is_xfer_request(type)) {
        rc = request_range_ok(ORB_EPROTO, what, &v);
        if (rc != 0)
            return rc;
    } else {
        v.request_addr = v.addr;
        v.request_length = v.length;
    }
    *m = v;
    return 0;
}

/* ---- empty bodies ---------------------------------------------------------------------------- */

int orb_wire_empty_encode(uint8_t type, uint64_t tag, uint8_t *out, size_t cap, size_t *len_out)
{
    if (type != ORB_WIRE_WRITE_RESP && type != ORB_WIRE_NOTIFY_RESP)
        return orb_fail(ORB_EINVAL, "empty encode: type %u (%s) is not WRITE_RESP or NOTIFY_RESP",
                        (unsigned)type, orb_wire_type_name(type));
    const char *what = orb_wire_type_name(type);
    struct orb_writer w;
    int rc = encode_begin(what, type, tag, 0, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    return encode_end(what, &w, len_out);
}

/* ---- NOTIFY ---------------------------------------------------------------------------------- */

int orb_wire_notify_encode(uint64_t tag, const struct orb_wire_notify *m, uint8_t *out, size_t cap,
                           size_t *len_out)
{
    if (!m)
        return orb_fail(ORB_EINVAL, "NOTIFY encode: NULL message");
    if (m->length == 0 || m->length > ORB_NOTIFY_MAX)
        return orb_fail(ORB_EINVAL, "NOTIFY encode: length %u outside 1..%u", (unsigned)m->length,
                        (unsigned)ORB_NOTIFY_MAX);
    if (!m->data)
        return orb_fail(ORB_EINVAL, "NOTIFY encode: NULL data");
    struct orb_writer w;
    int rc = encode_begin("NOTIFY", ORB_WIRE_NOTIFY, tag, ORB_WIRE_NOTIFY_FIXED + (size_t)m->length, out,
                          cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_u32(&w, m->length);
    orb_writer_bytes(&w, m->data, m->length);
    return encode_end("NOTIFY", &w, len_out);
}

int orb_wire_notify_decode(const uint8_t *body, size_t len, struct orb_wire_notify *m)
{
    int rc = body_args_ok("NOTIFY", body, len, m);
    if (rc != 0)
        return rc;
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    uint32_t length = orb_cursor_u32(&c);
    if (c.failed)
        return orb_fail(ORB_EPROTO, "NOTIFY: body of %zu bytes is shorter than %u", len,
                        ORB_WIRE_NOTIFY_FIXED);
    if (length == 0 || length > ORB_NOTIFY_MAX)
        return orb_fail(ORB_EPROTO, "NOTIFY: length %u outside 1..%u", (unsigned)length,
                        (unsigned)ORB_NOTIFY_MAX);
    if (length != len - ORB_WIRE_NOTIFY_FIXED)
        return orb_fail(ORB_EPROTO, "NOTIFY: length %u but %zu data bytes in the body", (unsigned)length,
                        len - ORB_WIRE_NOTIFY_FIXED);
    const uint8_t *data = orb_cursor_bytes(&c, length);
    if (!data || orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "NOTIFY: malformed body");
    m->length = length;
    m->data = data;
    return 0;
}

static int control_transport_ok(uint8_t transport)
{
    return transport == ORB_TRANSPORT_RDMA || transport == ORB_TRANSPORT_NVLINK || transport == ORB_TRANSPORT_SHM;
}

int orb_wire_control_encode(uint8_t type, uint64_t tag, const struct orb_wire_control *m, uint8_t *out,
                            size_t cap, size_t *len_out)
{
    if (!m)
        return orb_fail(ORB_EINVAL, "CONTROL encode: NULL message");
    if (type != ORB_WIRE_CONTROL_REQ && type != ORB_WIRE_CONTROL_RESP)
        return orb_fail(ORB_EINVAL, "CONTROL encode: type %u is not CONTROL_REQ or CONTROL_RESP", (unsigned)type);
    if (!control_transport_ok(m->transport))
        return orb_fail(ORB_EINVAL, "CONTROL encode: transport %u carries no control messages",
                        (unsigned)m->transport);
    if (m->length == 0 || m->length > ORB_WIRE_MAX_CONTROL || !m->data)
        return orb_fail(ORB_EINVAL, "CONTROL encode: length %u outside 1..%u, or no data", (unsigned)m->length,
                        (unsigned)ORB_WIRE_MAX_CONTROL);
    const char *what = orb_wire_type_name(type);
    struct orb_writer w;
    int rc = encode_begin(what, type, tag, ORB_WIRE_CONTROL_FIXED + (size_t)m->length, out, cap, len_out, &w);
    if (rc != 0)
        return rc;
    orb_writer_u8(&w, m->transport);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, 0);
    orb_writer_bytes(&w, m->data, m->length);
    return encode_end(what, &w, len_out);
}

int orb_wire_control_decode(const uint8_t *body, size_t len, struct orb_wire_control *m)
{
    int rc = body_args_ok("CONTROL", body, len, m);
    if (rc != 0)
        return rc;
    if (len <= ORB_WIRE_CONTROL_FIXED || len > ORB_WIRE_CONTROL_FIXED + ORB_WIRE_MAX_CONTROL)
        return orb_fail(ORB_EPROTO, "CONTROL: body of %zu bytes outside %u..%u", len, ORB_WIRE_CONTROL_FIXED + 1,
                        ORB_WIRE_CONTROL_FIXED + ORB_WIRE_MAX_CONTROL);
    struct orb_cursor c;
    orb_cursor_init(&c, body, len);
    uint8_t transport = orb_cursor_u8(&c);
    uint8_t zero8 = orb_cursor_u8(&c);
    uint16_t zero16 = orb_cursor_u16(&c);
    if (zero8 != 0 || zero16 != 0)
        return orb_fail(ORB_EPROTO, "CONTROL: reserved bytes are not zero");
    if (!control_transport_ok(transport))
        return orb_fail(ORB_EPROTO, "CONTROL: transport %u carries no control messages", (unsigned)transport);
    uint32_t length = (uint32_t)(len - ORB_WIRE_CONTROL_FIXED);
    const uint8_t *data = orb_cursor_bytes(&c, length);
    if (!data || orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "CONTROL: malformed body");
    m->transport = transport;
    m->length = length;
    m->data = data;
    return 0;
}
