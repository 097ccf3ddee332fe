/* The same-host transport's messages (shm_msg.h): control-connection and socket messages, and
 * the request and completion ring entries. */
#include "samehost/shm_msg.h"

#include <stdbool.h>
#include <string.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "samehost/ring.h"

#define HEADER_LEN 4u
#define SHM_PAGE 4096u

/* The lowest status code of orbite.h; every value from it to -1 is a defined code, so a status on
 * the wire is known exactly when it lies in [STATUS_MIN, 0]. */
#define STATUS_MIN ORB_EAGAIN

_Static_assert(ORB_SH_RING_ENTRY == 64, "ring entries are 64 bytes");
_Static_assert(ORB_SHM_RING_MAX <= ORB_SH_RING_MAX_CAPACITY, "a SETUP capacity the ring allows");

/* ---- bounds-checked little-endian writer and reader ------------------------------------------ */

struct shm_writer {
    uint8_t *buf;
    size_t cap;
    size_t pos;
    bool failed;
};

static void writer_init(struct shm_writer *w, uint8_t *buf, size_t cap)
{
    w->buf = buf;
    w->cap = cap;
    w->pos = 0;
    w->failed = false;
}

static void put_le(struct shm_writer *w, uint64_t v, size_t n)
{
    if (w->failed || w->cap - w->pos < n) {
        w->failed = true;
        return;
    }
    for (size_t i = 0; i < n; i++)
        w->buf[w->pos + i] = (uint8_t)(v >> (8 * i));
    w->pos += n;
}

static void put_u8(struct shm_writer *w, uint8_t v) { put_le(w, v, 1); }
static void put_u16(struct shm_writer *w, uint16_t v) { put_le(w, v, 2); }
static void put_u32(struct shm_writer *w, uint32_t v) { put_le(w, v, 4); }
static void put_u64(struct shm_writer *w, uint64_t v) { put_le(w, v, 8); }

static void put_bytes(struct shm_writer *w, const void *p, size_t n)
{
    if (w->failed || w->cap - w->pos < n) {
        w->failed = true;
        return;
    }
    if (n > 0)
        memcpy(w->buf + w->pos, p, n);
    w->pos += n;
}

static void put_zero(struct shm_writer *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_u8(w, 0);
}

static void put_header(struct shm_writer *w, uint8_t kind)
{
    put_u8(w, kind);
    put_u8(w, ORB_SHM_VERSION);
    put_u16(w, 0);
}

struct shm_reader {
    const uint8_t *buf;
    size_t len;
    size_t pos;
    bool failed;
};

static void reader_init(struct shm_reader *r, const uint8_t *buf, size_t len)
{
    r->buf = buf;
    r->len = len;
    r->pos = 0;
    r->failed = false;
}

static uint64_t get_le(struct shm_reader *r, size_t n)
{
    if (r->failed || r->len - r->pos < n) {
        r->failed = true;
        return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++)
        v |= (uint64_t)r->buf[r->pos + i] << (8 * i);
    r->pos += n;
    return v;
}

static uint8_t get_u8(struct shm_reader *r) { return (uint8_t)get_le(r, 1); }
static uint32_t get_u32(struct shm_reader *r) { return (uint32_t)get_le(r, 4); }
static uint64_t get_u64(struct shm_reader *r) { return get_le(r, 8); }

static const uint8_t *get_bytes(struct shm_reader *r, size_t n)
{
    if (r->failed || r->len - r->pos < n) {
        r->failed = true;
        return NULL;
    }
    const uint8_t *p = r->buf + r->pos;
    r->pos += n;
    return p;
}

/* Whether n bytes from the reader's position are all zero (consumed). */
static bool get_zero(struct shm_reader *r, size_t n)
{
    const uint8_t *p = get_bytes(r, n);
    if (p == NULL)
        return false;
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return false;
    return true;
}

/* ---- shared checks ---------------------------------------------------------------------------- */

static bool status_known(int32_t status)
{
    return status <= 0 && status >= STATUS_MIN;
}

static bool capacity_ok(uint32_t capacity)
{
    return capacity >= ORB_SHM_RING_MIN && capacity <= ORB_SHM_RING_MAX && (capacity & (capacity - 1)) == 0 &&
           orb_sh_ring_bytes(capacity) != 0;
}

static bool range_ok(uint64_t addr, uint64_t length)
{
    return length > 0 && addr + length >= addr; /* unsigned: wraps on overflow */
}

static bool map_length_ok(uint64_t length)
{
    return length > 0 && length % SHM_PAGE == 0 && length <= ORB_SHM_MAP_LEN_MAX;
}

static bool op_ok(uint8_t op)
{
    return op == ORB_OP_READ || op == ORB_OP_WRITE;
}

static bool printable(uint8_t c)
{
    return c >= 0x20 && c <= 0x7e;
}

/* An encoder's buffer: non-NULL and at least `need` bytes. */
static int check_out(const char *name, const uint8_t *buf, size_t cap, const size_t *len_out, size_t need)
{
    if (buf == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "shm: %s: NULL buffer or length", name);
    if (cap < need)
        return orb_fail(ORB_EINVAL, "shm: %s: a buffer of %zu bytes, %zu needed", name, cap, need);
    return 0;
}

static int finish(const char *name, const struct shm_writer *w, size_t want, size_t *len_out)
{
    if (w->failed || w->pos != want)
        return orb_fail(ORB_EINVAL, "shm: %s: does not fit in %zu bytes", name, w->cap);
    *len_out = w->pos;
    return 0;
}

/* A message that must be `kind` and exactly `want` bytes; the reader is left after its header. */
static int open_msg(struct shm_reader *r, const char *name, uint8_t kind, size_t want, const uint8_t *buf,
                    size_t len)
{
    if (buf == NULL)
        return orb_fail(ORB_EINVAL, "shm: %s: NULL buffer", name);
    if (len != want)
        return orb_fail(ORB_EPROTO, "shm: %s: length %zu, not %zu", name, len, want);
    if (buf[0] != kind)
        return orb_fail(ORB_EPROTO, "shm: %s: kind %u, not %u", name, buf[0], kind);
    if (buf[1] != ORB_SHM_VERSION)
        return orb_fail(ORB_EPROTO, "shm: %s: version %u, not %u", name, buf[1], ORB_SHM_VERSION);
    if (buf[2] != 0 || buf[3] != 0)
        return orb_fail(ORB_EPROTO, "shm: %s: reserved header bytes are not zero", name);
    reader_init(r, buf, len);
    (void)get_bytes(r, HEADER_LEN);
    return 0;
}

/* Every byte read, none left (the exact length was checked already: a safety net). */
static int close_msg(const struct shm_reader *r, const char *name)
{
    if (r->failed || r->pos != r->len)
        return orb_fail(ORB_EPROTO, "shm: %s: length %zu does not match its fields", name, r->len);
    return 0;
}

int orb_shm_peek_kind(const uint8_t *buf, size_t len, uint8_t *kind_out)
{
    if (kind_out == NULL || (buf == NULL && len > 0))
        return orb_fail(ORB_EINVAL, "shm: peek: NULL argument");
    if (len < HEADER_LEN)
        return orb_fail(ORB_EPROTO, "shm: message: length %zu is shorter than its header", len);
    if (buf[1] != ORB_SHM_VERSION)
        return orb_fail(ORB_EPROTO, "shm: message: version %u, not %u", buf[1], ORB_SHM_VERSION);
    if (buf[2] != 0 || buf[3] != 0)
        return orb_fail(ORB_EPROTO, "shm: message: reserved header bytes are not zero");
    *kind_out = buf[0];
    return 0;
}

/* ---- SETUP memory ----------------------------------------------------------------------------- */

uint64_t orb_shm_setup_completion_offset(uint32_t request_capacity)
{
    if (!capacity_ok(request_capacity))
        return 0;
    uint64_t ring = orb_sh_ring_bytes(request_capacity);
    return (ring + ORB_SH_RING_LINE - 1) / ORB_SH_RING_LINE * ORB_SH_RING_LINE;
}

uint64_t orb_shm_setup_bytes(uint32_t request_capacity, uint32_t completion_capacity)
{
    if (!capacity_ok(request_capacity) || !capacity_ok(completion_capacity))
        return 0;
    uint64_t end = orb_shm_setup_completion_offset(request_capacity) + orb_sh_ring_bytes(completion_capacity);
    return (end + SHM_PAGE - 1) / SHM_PAGE * SHM_PAGE;
}

/* ---- control connection ----------------------------------------------------------------------- */

int orb_shm_info_encode(uint8_t *buf, size_t cap, size_t *len_out)
{
    int rc = check_out("INFO", buf, cap, len_out, ORB_SHM_INFO_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_INFO);
    put_u32(&w, 0);
    return finish("INFO", &w, ORB_SHM_INFO_LEN, len_out);
}

int orb_shm_info_decode(const uint8_t *buf, size_t len)
{
    struct shm_reader r = {0};
    int rc = open_msg(&r, "INFO", ORB_SHM_INFO, ORB_SHM_INFO_LEN, buf, len);
    if (rc != 0)
        return rc;
    if (!get_zero(&r, 4))
        return orb_fail(ORB_EPROTO, "shm: INFO: reserved bytes are not zero");
    return close_msg(&r, "INFO");
}

int orb_shm_info_ok_encode(const struct orb_shm_info *in, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: INFO_OK: NULL message");
    if (!orb_samehost_boot_id_valid(in->boot_id, strnlen(in->boot_id, sizeof in->boot_id)))
        return orb_fail(ORB_EINVAL, "shm: INFO_OK: boot id is not a boot id");
    int rc = check_out("INFO_OK", buf, cap, len_out, ORB_SHM_INFO_OK_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_INFO_OK);
    put_u32(&w, 0);
    put_bytes(&w, in->boot_id, ORB_BOOT_ID_LEN);
    put_u32(&w, 0);
    put_bytes(&w, in->id, ORB_SHM_ID_LEN);
    return finish("INFO_OK", &w, ORB_SHM_INFO_OK_LEN, len_out);
}

int orb_shm_info_ok_decode(const uint8_t *buf, size_t len, struct orb_shm_info *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: INFO_OK: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "INFO_OK", ORB_SHM_INFO_OK, ORB_SHM_INFO_OK_LEN, buf, len);
    if (rc != 0)
        return rc;
    bool zero0 = get_zero(&r, 4);
    const uint8_t *boot = get_bytes(&r, ORB_BOOT_ID_LEN);
    bool zero1 = get_zero(&r, 4);
    const uint8_t *id = get_bytes(&r, ORB_SHM_ID_LEN);
    if ((rc = close_msg(&r, "INFO_OK")) != 0)
        return rc;
    if (!zero0 || !zero1)
        return orb_fail(ORB_EPROTO, "shm: INFO_OK: reserved bytes are not zero");
    if (!orb_samehost_boot_id_valid((const char *)boot, ORB_BOOT_ID_LEN))
        return orb_fail(ORB_EPROTO, "shm: INFO_OK: boot id is not a boot id");
    struct orb_shm_info m;
    memcpy(m.boot_id, boot, ORB_BOOT_ID_LEN);
    m.boot_id[ORB_BOOT_ID_LEN] = '\0';
    memcpy(m.id, id, ORB_SHM_ID_LEN);
    *out = m;
    return 0;
}

int orb_shm_query_encode(const struct orb_shm_query *in, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: QUERY: NULL message");
    if (!op_ok(in->op))
        return orb_fail(ORB_EINVAL, "shm: QUERY: op %u is not READ or WRITE", in->op);
    if (!range_ok(in->addr, in->length))
        return orb_fail(ORB_EINVAL, "shm: QUERY: length %llu at %#llx is empty or wraps",
                        (unsigned long long)in->length, (unsigned long long)in->addr);
    int rc = check_out("QUERY", buf, cap, len_out, ORB_SHM_QUERY_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_QUERY);
    put_u8(&w, in->op);
    put_zero(&w, 3);
    put_u64(&w, in->addr);
    put_u64(&w, in->length);
    return finish("QUERY", &w, ORB_SHM_QUERY_LEN, len_out);
}

int orb_shm_query_decode(const uint8_t *buf, size_t len, struct orb_shm_query *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: QUERY: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "QUERY", ORB_SHM_QUERY, ORB_SHM_QUERY_LEN, buf, len);
    if (rc != 0)
        return rc;
    struct orb_shm_query m;
    m.op = get_u8(&r);
    bool zero = get_zero(&r, 3);
    m.addr = get_u64(&r);
    m.length = get_u64(&r);
    if ((rc = close_msg(&r, "QUERY")) != 0)
        return rc;
    if (!op_ok(m.op))
        return orb_fail(ORB_EPROTO, "shm: QUERY: op %u is not READ or WRITE", m.op);
    if (!zero)
        return orb_fail(ORB_EPROTO, "shm: QUERY: reserved bytes are not zero");
    if (!range_ok(m.addr, m.length))
        return orb_fail(ORB_EPROTO, "shm: QUERY: length %llu at %#llx is empty or wraps",
                        (unsigned long long)m.length, (unsigned long long)m.addr);
    *out = m;
    return 0;
}

/* QUERY_OK's consistency, the same for both directions; NULL when it holds, else what is wrong. */
static const char *query_ok_wrong(const struct orb_shm_query_ok *m)
{
    if (!status_known(m->status))
        return "status is not 0 or a known code";
    if (m->status == 0 && !range_ok(m->base, m->length))
        return "length is empty or the range wraps with status 0";
    if (m->status != 0 && (m->base != 0 || m->length != 0))
        return "base and length are not 0 with a refusal";
    return NULL;
}

int orb_shm_query_ok_encode(const struct orb_shm_query_ok *in, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: QUERY_OK: NULL message");
    const char *wrong = query_ok_wrong(in);
    if (wrong != NULL)
        return orb_fail(ORB_EINVAL, "shm: QUERY_OK: %s (status %d)", wrong, in->status);
    int rc = check_out("QUERY_OK", buf, cap, len_out, ORB_SHM_QUERY_OK_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_QUERY_OK);
    put_u32(&w, (uint32_t)in->status);
    put_u64(&w, in->base);
    put_u64(&w, in->length);
    return finish("QUERY_OK", &w, ORB_SHM_QUERY_OK_LEN, len_out);
}

int orb_shm_query_ok_decode(const uint8_t *buf, size_t len, struct orb_shm_query_ok *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: QUERY_OK: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "QUERY_OK", ORB_SHM_QUERY_OK, ORB_SHM_QUERY_OK_LEN, buf, len);
    if (rc != 0)
        return rc;
    struct orb_shm_query_ok m;
    m.status = (int32_t)get_u32(&r);
    m.base = get_u64(&r);
    m.length = get_u64(&r);
    if ((rc = close_msg(&r, "QUERY_OK")) != 0)
        return rc;
    const char *wrong = query_ok_wrong(&m);
    if (wrong != NULL)
        return orb_fail(ORB_EPROTO, "shm: QUERY_OK: %s (status %d)", wrong, m.status);
    *out = m;
    return 0;
}

/* ---- Unix socket ------------------------------------------------------------------------------ */

int orb_shm_setup_encode(const struct orb_shm_setup *in, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: SETUP: NULL message");
    if (!capacity_ok(in->request_capacity) || !capacity_ok(in->completion_capacity))
        return orb_fail(ORB_EINVAL, "shm: SETUP: capacity %u/%u is not a power of two in [%u, %u]",
                        in->request_capacity, in->completion_capacity, ORB_SHM_RING_MIN, ORB_SHM_RING_MAX);
    if (in->bytes != orb_shm_setup_bytes(in->request_capacity, in->completion_capacity))
        return orb_fail(ORB_EINVAL, "shm: SETUP: bytes %llu are not the rings' %llu", (unsigned long long)in->bytes,
                        (unsigned long long)orb_shm_setup_bytes(in->request_capacity, in->completion_capacity));
    int rc = check_out("SETUP", buf, cap, len_out, ORB_SHM_SETUP_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_SETUP);
    put_u32(&w, in->request_capacity);
    put_u32(&w, in->completion_capacity);
    put_u32(&w, 0);
    put_u64(&w, in->bytes);
    return finish("SETUP", &w, ORB_SHM_SETUP_LEN, len_out);
}

int orb_shm_setup_decode(const uint8_t *buf, size_t len, struct orb_shm_setup *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: SETUP: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "SETUP", ORB_SHM_SETUP, ORB_SHM_SETUP_LEN, buf, len);
    if (rc != 0)
        return rc;
    struct orb_shm_setup m;
    m.request_capacity = get_u32(&r);
    m.completion_capacity = get_u32(&r);
    bool zero = get_zero(&r, 4);
    m.bytes = get_u64(&r);
    if ((rc = close_msg(&r, "SETUP")) != 0)
        return rc;
    if (!capacity_ok(m.request_capacity))
        return orb_fail(ORB_EPROTO, "shm: SETUP: request capacity %u is not a power of two in [%u, %u]",
                        m.request_capacity, ORB_SHM_RING_MIN, ORB_SHM_RING_MAX);
    if (!capacity_ok(m.completion_capacity))
        return orb_fail(ORB_EPROTO, "shm: SETUP: completion capacity %u is not a power of two in [%u, %u]",
                        m.completion_capacity, ORB_SHM_RING_MIN, ORB_SHM_RING_MAX);
    if (!zero)
        return orb_fail(ORB_EPROTO, "shm: SETUP: reserved bytes are not zero");
    uint64_t want = orb_shm_setup_bytes(m.request_capacity, m.completion_capacity);
    if (m.bytes != want)
        return orb_fail(ORB_EPROTO, "shm: SETUP: bytes %llu, not the rings' %llu", (unsigned long long)m.bytes,
                        (unsigned long long)want);
    *out = m;
    return 0;
}

/* A MAP's consistency, the same for both directions; NULL when it holds, else what is wrong. */
static const char *map_wrong(const struct orb_shm_map *m)
{
    if (m->map_id == 0 || m->map_id > ORB_SHM_MAPS_MAX)
        return "map id is outside 1..ORB_SHM_MAPS_MAX";
    if (m->writable > 1)
        return "writable is not 0 or 1";
    if (m->file_offset % SHM_PAGE != 0)
        return "file offset is not a multiple of 4096";
    if (!map_length_ok(m->length))
        return "length is not a multiple of 4096 in (0, 2^46]";
    if (!range_ok(m->file_offset, m->length))
        return "file offset + length wraps";
    return NULL;
}

int orb_shm_map_encode(const struct orb_shm_map *in, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: MAP: NULL message");
    const char *wrong = map_wrong(in);
    if (wrong != NULL)
        return orb_fail(ORB_EINVAL, "shm: MAP: %s (map id %u, writable %u, file offset %llu, length %llu)", wrong,
                        in->map_id, in->writable, (unsigned long long)in->file_offset,
                        (unsigned long long)in->length);
    int rc = check_out("MAP", buf, cap, len_out, ORB_SHM_MAP_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_MAP);
    put_u32(&w, in->map_id);
    put_u8(&w, in->writable);
    put_zero(&w, 7);
    put_u64(&w, in->file_offset);
    put_u64(&w, in->length);
    return finish("MAP", &w, ORB_SHM_MAP_LEN, len_out);
}

int orb_shm_map_decode(const uint8_t *buf, size_t len, struct orb_shm_map *out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: MAP: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "MAP", ORB_SHM_MAP, ORB_SHM_MAP_LEN, buf, len);
    if (rc != 0)
        return rc;
    struct orb_shm_map m;
    m.map_id = get_u32(&r);
    m.writable = get_u8(&r);
    bool zero = get_zero(&r, 7);
    m.file_offset = get_u64(&r);
    m.length = get_u64(&r);
    if ((rc = close_msg(&r, "MAP")) != 0)
        return rc;
    if (!zero)
        return orb_fail(ORB_EPROTO, "shm: MAP: reserved bytes are not zero");
    const char *wrong = map_wrong(&m);
    if (wrong != NULL)
        return orb_fail(ORB_EPROTO, "shm: MAP: %s (map id %u, writable %u, file offset %llu, length %llu)", wrong,
                        m.map_id, m.writable, (unsigned long long)m.file_offset, (unsigned long long)m.length);
    *out = m;
    return 0;
}

static const char *status_name(uint8_t kind)
{
    return kind == ORB_SHM_SETUP_OK ? "SETUP_OK" : "MAP_OK";
}

int orb_shm_status_encode(uint8_t kind, const struct orb_shm_status *in, uint8_t *buf, size_t cap,
                          size_t *len_out)
{
    if (kind != ORB_SHM_SETUP_OK && kind != ORB_SHM_MAP_OK)
        return orb_fail(ORB_EINVAL, "shm: status: kind %u is not SETUP_OK or MAP_OK", kind);
    const char *name = status_name(kind);
    if (in == NULL)
        return orb_fail(ORB_EINVAL, "shm: %s: NULL message", name);
    if (!status_known(in->status))
        return orb_fail(ORB_EINVAL, "shm: %s: status %d is not 0 or a known code", name, in->status);
    if (kind == ORB_SHM_SETUP_OK && in->map_id != 0)
        return orb_fail(ORB_EINVAL, "shm: SETUP_OK: map id %u is not 0", in->map_id);
    if (kind == ORB_SHM_MAP_OK && in->map_id == 0)
        return orb_fail(ORB_EINVAL, "shm: MAP_OK: map id is 0");
    size_t want = kind == ORB_SHM_SETUP_OK ? ORB_SHM_SETUP_OK_LEN : ORB_SHM_MAP_OK_LEN;
    int rc = check_out(name, buf, cap, len_out, want);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, kind);
    if (kind == ORB_SHM_MAP_OK)
        put_u32(&w, in->map_id);
    put_u32(&w, (uint32_t)in->status);
    if (kind == ORB_SHM_MAP_OK)
        put_u32(&w, 0);
    return finish(name, &w, want, len_out);
}

int orb_shm_status_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_shm_status *out)
{
    if (kind != ORB_SHM_SETUP_OK && kind != ORB_SHM_MAP_OK)
        return orb_fail(ORB_EINVAL, "shm: status: kind %u is not SETUP_OK or MAP_OK", kind);
    const char *name = status_name(kind);
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "shm: %s: NULL output", name);
    size_t want = kind == ORB_SHM_SETUP_OK ? ORB_SHM_SETUP_OK_LEN : ORB_SHM_MAP_OK_LEN;
    struct shm_reader r = {0};
    int rc = open_msg(&r, name, kind, want, buf, len);
    if (rc != 0)
        return rc;
    struct orb_shm_status m;
    bool zero = true;
    m.map_id = kind == ORB_SHM_MAP_OK ? get_u32(&r) : 0;
    m.status = (int32_t)get_u32(&r);
    if (kind == ORB_SHM_MAP_OK)
        zero = get_zero(&r, 4);
    if ((rc = close_msg(&r, name)) != 0)
        return rc;
    if (kind == ORB_SHM_MAP_OK && m.map_id == 0)
        return orb_fail(ORB_EPROTO, "shm: MAP_OK: map id is 0");
    if (!status_known(m.status))
        return orb_fail(ORB_EPROTO, "shm: %s: status %d is not 0 or a known code", name, m.status);
    if (!zero)
        return orb_fail(ORB_EPROTO, "shm: %s: reserved bytes are not zero", name);
    *out = m;
    return 0;
}

int orb_shm_unmap_encode(uint32_t map_id, uint8_t *buf, size_t cap, size_t *len_out)
{
    if (map_id == 0)
        return orb_fail(ORB_EINVAL, "shm: UNMAP: map id is 0");
    int rc = check_out("UNMAP", buf, cap, len_out, ORB_SHM_UNMAP_LEN);
    if (rc != 0)
        return rc;
    struct shm_writer w;
    writer_init(&w, buf, cap);
    put_header(&w, ORB_SHM_UNMAP);
    put_u32(&w, map_id);
    return finish("UNMAP", &w, ORB_SHM_UNMAP_LEN, len_out);
}

int orb_shm_unmap_decode(const uint8_t *buf, size_t len, uint32_t *map_id_out)
{
    if (map_id_out == NULL)
        return orb_fail(ORB_EINVAL, "shm: UNMAP: NULL output");
    struct shm_reader r = {0};
    int rc = open_msg(&r, "UNMAP", ORB_SHM_UNMAP, ORB_SHM_UNMAP_LEN, buf, len);
    if (rc != 0)
        return rc;
    uint32_t map_id = get_u32(&r);
    if ((rc = close_msg(&r, "UNMAP")) != 0)
        return rc;
    if (map_id == 0)
        return orb_fail(ORB_EPROTO, "shm: UNMAP: map id is 0");
    *map_id_out = map_id;
    return 0;
}

/* ---- ring entries ----------------------------------------------------------------------------- */

/* A REQUEST's consistency, the same for both directions; NULL when it holds, else what is wrong. */
static const char *request_wrong(const struct orb_shm_request *m)
{
    if (!op_ok(m->op))
        return "op is not READ or WRITE";
    if (m->map_id == 0)
        return "map id is 0";
    if (m->length == 0)
        return "length is 0";
    if (!range_ok(m->map_offset, m->length))
        return "map offset + length wraps";
    if (!range_ok(m->remote_addr, m->length))
        return "remote addr + length wraps";
    if (!range_ok(m->request_addr, m->request_length))
        return "request length is 0 or request addr + request length wraps";
    if (m->remote_addr < m->request_addr || m->remote_addr + m->length > m->request_addr + m->request_length)
        return "request range does not contain the piece";
    return NULL;
}

int orb_shm_request_encode(const struct orb_shm_request *in, uint8_t entry[64])
{
    if (in == NULL || entry == NULL)
        return orb_fail(ORB_EINVAL, "shm: REQUEST: NULL argument");
    const char *wrong = request_wrong(in);
    if (wrong != NULL)
        return orb_fail(ORB_EINVAL, "shm: REQUEST: %s", wrong);
    struct shm_writer w;
    writer_init(&w, entry, ORB_SH_RING_ENTRY);
    put_u64(&w, in->tag);
    put_u8(&w, in->op);
    put_zero(&w, 3);
    put_u32(&w, in->map_id);
    put_u64(&w, in->map_offset);
    put_u64(&w, in->remote_addr);
    put_u64(&w, in->length);
    put_u64(&w, in->request_addr);
    put_u64(&w, in->request_length);
    put_u64(&w, 0);
    size_t len = 0;
    return finish("REQUEST", &w, ORB_SH_RING_ENTRY, &len);
}

int orb_shm_request_decode(const uint8_t entry[64], struct orb_shm_request *out)
{
    if (entry == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "shm: REQUEST: NULL argument");
    struct shm_reader r = {0};
    reader_init(&r, entry, ORB_SH_RING_ENTRY);
    struct orb_shm_request m;
    m.tag = get_u64(&r);
    m.op = get_u8(&r);
    bool zero0 = get_zero(&r, 3);
    m.map_id = get_u32(&r);
    m.map_offset = get_u64(&r);
    m.remote_addr = get_u64(&r);
    m.length = get_u64(&r);
    m.request_addr = get_u64(&r);
    m.request_length = get_u64(&r);
    bool zero1 = get_zero(&r, 8);
    int rc = close_msg(&r, "REQUEST");
    if (rc != 0)
        return rc;
    if (!zero0 || !zero1)
        return orb_fail(ORB_EPROTO, "shm: REQUEST: reserved bytes are not zero");
    const char *wrong = request_wrong(&m);
    if (wrong != NULL)
        return orb_fail(ORB_EPROTO, "shm: REQUEST: %s", wrong);
    *out = m;
    return 0;
}

int orb_shm_completion_encode(const struct orb_shm_completion *in, uint8_t entry[64])
{
    if (in == NULL || entry == NULL)
        return orb_fail(ORB_EINVAL, "shm: COMPLETION: NULL argument");
    if (!status_known(in->status))
        return orb_fail(ORB_EINVAL, "shm: COMPLETION: status %d is not 0 or a known code", in->status);
    if (in->effect != ORB_REMOTE_EFFECT_NONE && in->effect != ORB_REMOTE_EFFECT_UNKNOWN)
        return orb_fail(ORB_EINVAL, "shm: COMPLETION: effect %u is not a remote effect", in->effect);
    uint8_t why[ORB_SHM_WHY_MAX] = {0};
    size_t n = strnlen(in->why, ORB_SHM_WHY_MAX);
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)in->why[i];
        why[i] = printable(c) ? c : (uint8_t)'?';
    }
    struct shm_writer w;
    writer_init(&w, entry, ORB_SH_RING_ENTRY);
    put_u64(&w, in->tag);
    put_u32(&w, (uint32_t)in->status);
    put_u8(&w, in->effect);
    put_zero(&w, 3);
    put_bytes(&w, why, ORB_SHM_WHY_MAX);
    size_t len = 0;
    return finish("COMPLETION", &w, ORB_SH_RING_ENTRY, &len);
}

int orb_shm_completion_decode(const uint8_t entry[64], struct orb_shm_completion *out)
{
    if (entry == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "shm: COMPLETION: NULL argument");
    struct shm_reader r = {0};
    reader_init(&r, entry, ORB_SH_RING_ENTRY);
    struct orb_shm_completion m;
    m.tag = get_u64(&r);
    m.status = (int32_t)get_u32(&r);
    m.effect = get_u8(&r);
    bool zero = get_zero(&r, 3);
    const uint8_t *why = get_bytes(&r, ORB_SHM_WHY_MAX);
    int rc = close_msg(&r, "COMPLETION");
    if (rc != 0)
        return rc;
    if (!status_known(m.status))
        return orb_fail(ORB_EPROTO, "shm: COMPLETION: status %d is not 0 or a known code", m.status);
    if (m.effect != ORB_REMOTE_EFFECT_NONE && m.effect != ORB_REMOTE_EFFECT_UNKNOWN)
        return orb_fail(ORB_EPROTO, "shm: COMPLETION: effect %u is not a remote effect", m.effect);
    if (!zero)
        return orb_fail(ORB_EPROTO, "shm: COMPLETION: reserved bytes are not zero");
    size_t n = 0;
    while (n < ORB_SHM_WHY_MAX && why[n] != 0) {
        if (!printable(why[n]))
            return orb_fail(ORB_EPROTO, "shm: COMPLETION: why byte %zu is %#x, not printable ASCII", n, why[n]);
        n++;
    }
    for (size_t i = n; i < ORB_SHM_WHY_MAX; i++)
        if (why[i] != 0)
            return orb_fail(ORB_EPROTO, "shm: COMPLETION: why byte %zu is %#x after its NUL", i, why[i]);
    memcpy(m.why, why, n);
    memset(m.why + n, 0, sizeof m.why - n);
    *out = m;
    return 0;
}
