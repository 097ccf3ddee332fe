/* The NVLink transport's control messages (nvlink_msg.h). */
#include "nvlink/nvlink_msg.h"

#include <string.h>

#include <orbite/orbite.h>

#include "core/error.h"
#include "wire/wire.h"

#define PREFIX_LEN 4u
#define RANGE_LEN 24u                              /* u8 op | 7 x u8 0 | u64 addr | u64 length */
#define ALLOC_LEN (24u + ORB_NVL_HANDLE_LEN)       /* u64 base | u64 size | u8 share | 7 x u8 0 | handle */
#define GRANT_FIXED 8u                             /* i32 status | u16 alloc | u8 why_len | u8 0 */

static void put_prefix(struct orb_writer *w, uint8_t kind)
{
    orb_writer_u8(w, kind);
    orb_writer_u8(w, ORB_NVL_VERSION);
    orb_writer_u16(w, 0);
}

static int finish_writer(const struct orb_writer *w, const char *what, size_t *len_out)
{
    if (w->failed)
        return orb_fail(ORB_EINVAL, "nvlink control: %s does not fit in %zu bytes", what, w->cap);
    *len_out = w->pos;
    return 0;
}

int orb_nvl_kind_of(const uint8_t *buf, size_t len, uint8_t *kind_out)
{
    if (buf == NULL || len < PREFIX_LEN)
        return orb_fail(ORB_EPROTO, "nvlink control: a message of %zu bytes is shorter than its prefix", len);
    if (buf[1] != ORB_NVL_VERSION)
        return orb_fail(ORB_EPROTO, "nvlink control: version %u, not %u", buf[1], ORB_NVL_VERSION);
    if (buf[2] != 0 || buf[3] != 0)
        return orb_fail(ORB_EPROTO, "nvlink control: reserved prefix bytes are not zero");
    if (buf[0] < ORB_NVL_HELLO || buf[0] > ORB_NVL_FETCH_OK)
        return orb_fail(ORB_EPROTO, "nvlink control: unknown message kind %u", buf[0]);
    *kind_out = buf[0];
    return 0;
}

/* The prefix of a message that must be `kind`, consumed. */
static int open_cursor(struct orb_cursor *c, uint8_t kind, const uint8_t *buf, size_t len)
{
    uint8_t k = 0;
    int rc = orb_nvl_kind_of(buf, len, &k);
    if (rc != 0)
        return rc;
    if (k != kind)
        return orb_fail(ORB_EPROTO, "nvlink control: message kind %u where %u was expected", k, kind);
    orb_cursor_init(c, buf, len);
    (void)orb_cursor_bytes(c, PREFIX_LEN);
    return 0;
}

static int close_cursor(const struct orb_cursor *c, const char *what)
{
    if (c->failed)
        return orb_fail(ORB_EPROTO, "nvlink control: %s is truncated", what);
    if (c->pos != c->len)
        return orb_fail(ORB_EPROTO, "nvlink control: %zu bytes after the end of %s", c->len - c->pos, what);
    return 0;
}

int orb_nvl_hello_encode(uint8_t kind, const struct orb_nvl_hello *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if ((kind != ORB_NVL_HELLO && kind != ORB_NVL_HELLO_OK) || m == NULL || out == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "nvlink control: bad HELLO arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_bytes(&w, m->boot, ORB_NVL_ID_LEN);
    orb_writer_u64(&w, m->ipc_namespace);
    return finish_writer(&w, "a HELLO", len_out);
}

int orb_nvl_hello_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_hello *m)
{
    struct orb_cursor c;
    int rc = open_cursor(&c, kind, buf, len);
    if (rc != 0)
        return rc;
    struct orb_nvl_hello h;
    const uint8_t *p = orb_cursor_bytes(&c, ORB_NVL_ID_LEN);
    if (p != NULL)
        memcpy(h.boot, p, ORB_NVL_ID_LEN);
    h.ipc_namespace = orb_cursor_u64(&c);
    if ((rc = close_cursor(&c, "a HELLO")) != 0)
        return rc;
    *m = h;
    return 0;
}

int orb_nvl_begin_encode(uint8_t kind, const struct orb_nvl_begin *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if ((kind != ORB_NVL_BEGIN && kind != ORB_NVL_QUERY) || m == NULL || out == NULL || len_out == NULL ||
        m->group == 0 || m->count == 0 || m->count > ORB_NVL_GROUP_MAX)
        return orb_fail(ORB_EINVAL, "nvlink control: a BEGIN needs a group id and 1..%u requests", ORB_NVL_GROUP_MAX);
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_u64(&w, m->group);
    orb_writer_u16(&w, (uint16_t)m->count);
    orb_writer_u16(&w, 0);
    orb_writer_u32(&w, 0);
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_nvl_range *r = &m->ranges[i];
        if ((r->op != ORB_OP_READ && r->op != ORB_OP_WRITE) || r->length == 0 || r->addr + r->length < r->addr)
            return orb_fail(ORB_EINVAL, "nvlink control: BEGIN request %u is not a READ or WRITE of a range", i);
        orb_writer_u8(&w, r->op);
        for (int k = 0; k < 7; k++)
            orb_writer_u8(&w, 0);
        orb_writer_u64(&w, r->addr);
        orb_writer_u64(&w, r->length);
    }
    return finish_writer(&w, "a BEGIN", len_out);
}

int orb_nvl_begin_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_begin *m)
{
    struct orb_cursor c;
    if (kind != ORB_NVL_BEGIN && kind != ORB_NVL_QUERY)
        return orb_fail(ORB_EINVAL, "nvlink control: kind %u is not a BEGIN or QUERY", kind);
    int rc = open_cursor(&c, kind, buf, len);
    if (rc != 0)
        return rc;
    uint64_t group = orb_cursor_u64(&c);
    uint32_t count = orb_cursor_u16(&c);
    uint32_t pad = orb_cursor_u16(&c);
    pad |= orb_cursor_u32(&c);
    if (c.failed)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN is truncated");
    if (group == 0)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN with group id 0");
    if (count == 0 || count > ORB_NVL_GROUP_MAX)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN of %u requests (1..%u)", count, ORB_NVL_GROUP_MAX);
    if (pad != 0)
        return orb_fail(ORB_EPROTO, "nvlink control: reserved BEGIN bytes are not zero");
    if (len - c.pos != (size_t)count * RANGE_LEN)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN of %u requests has %zu bytes of them, not %u", count,
                        len - c.pos, count * RANGE_LEN);
    m->group = group;
    m->count = count;
    for (uint32_t i = 0; i < count; i++) {
        struct orb_nvl_range *r = &m->ranges[i];
        r->op = orb_cursor_u8(&c);
        uint8_t zero = 0;
        for (int k = 0; k < 7; k++)
            zero |= orb_cursor_u8(&c);
        r->addr = orb_cursor_u64(&c);
        r->length = orb_cursor_u64(&c);
        if (r->op != ORB_OP_READ && r->op != ORB_OP_WRITE)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN request %u has operation %u", i, r->op);
        if (zero != 0)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN request %u has non-zero reserved bytes", i);
        if (r->length == 0 || r->addr + r->length < r->addr)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN request %u has an empty or wrapping range", i);
    }
    return close_cursor(&c, "a BEGIN");
}

int orb_nvl_begin_ok_encode(uint8_t kind, const struct orb_nvl_begin_ok *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if ((kind != ORB_NVL_BEGIN_OK && kind != ORB_NVL_QUERY_OK) || m == NULL || out == NULL || len_out == NULL ||
        m->group == 0 || m->count == 0 || m->count > ORB_NVL_GROUP_MAX || m->nallocs > m->count)
        return orb_fail(ORB_EINVAL, "nvlink control: bad BEGIN_OK arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_u64(&w, m->group);
    orb_writer_u16(&w, (uint16_t)m->count);
    orb_writer_u16(&w, (uint16_t)m->nallocs);
    orb_writer_u32(&w, 0);
    for (uint32_t i = 0; i < m->nallocs; i++) {
        orb_writer_u64(&w, m->allocs[i].base);
        orb_writer_u64(&w, m->allocs[i].size);
        if (m->allocs[i].share != ORB_NVL_SHARE_LEGACY && m->allocs[i].share != ORB_NVL_SHARE_FD)
            return orb_fail(ORB_EINVAL, "nvlink control: BEGIN_OK allocation %u is shared in no known way", i);
        orb_writer_u8(&w, m->allocs[i].share);
        orb_writer_bytes(&w, (const uint8_t[7]){0}, 7);
        orb_writer_bytes(&w, m->allocs[i].handle, ORB_NVL_HANDLE_LEN);
    }
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_nvl_grant *g = &m->grants[i];
        size_t why = strnlen(g->why, ORB_NVL_WHY_MAX);
        if (g->status > 0 || g->status < ORB_EAGAIN || (g->status == 0 && g->alloc >= m->nallocs))
            return orb_fail(ORB_EINVAL, "nvlink control: BEGIN_OK grant %u is inconsistent", i);
        orb_writer_u32(&w, (uint32_t)g->status);
        orb_writer_u16(&w, g->status == 0 ? g->alloc : 0);
        orb_writer_u8(&w, (uint8_t)why);
        orb_writer_u8(&w, 0);
        orb_writer_bytes(&w, g->why, why);
    }
    return finish_writer(&w, "a BEGIN_OK", len_out);
}

int orb_nvl_begin_ok_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_nvl_begin_ok *m)
{
    struct orb_cursor c;
    if (kind != ORB_NVL_BEGIN_OK && kind != ORB_NVL_QUERY_OK)
        return orb_fail(ORB_EINVAL, "nvlink control: kind %u is not a BEGIN_OK or QUERY_OK", kind);
    int rc = open_cursor(&c, kind, buf, len);
    if (rc != 0)
        return rc;
    uint64_t group = orb_cursor_u64(&c);
    uint32_t count = orb_cursor_u16(&c);
    uint32_t nallocs = orb_cursor_u16(&c);
    uint32_t pad = orb_cursor_u32(&c);
    if (c.failed)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN_OK is truncated");
    if (group == 0 || count == 0 || count > ORB_NVL_GROUP_MAX || nallocs > count || pad != 0)
        return orb_fail(ORB_EPROTO, "nvlink control: a BEGIN_OK of group %llu with %u requests and %u allocations",
                        (unsigned long long)group, count, nallocs);
    m->group = group;
    m->count = count;
    m->nallocs = nallocs;
    for (uint32_t i = 0; i < nallocs; i++) {
        struct orb_nvl_alloc *a = &m->allocs[i];
        a->base = orb_cursor_u64(&c);
        a->size = orb_cursor_u64(&c);
        a->share = orb_cursor_u8(&c);
        const uint8_t *pad7 = orb_cursor_bytes(&c, 7);
        const uint8_t *h = orb_cursor_bytes(&c, ORB_NVL_HANDLE_LEN);
        if (h == NULL || pad7 == NULL)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK allocation %u is truncated", i);
        if ((a->share != ORB_NVL_SHARE_LEGACY && a->share != ORB_NVL_SHARE_FD) || memcmp(pad7, "\0\0\0\0\0\0\0", 7))
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK allocation %u is shared as %u, or its reserved "
                            "bytes are set", i, a->share);
        memcpy(a->handle, h, ORB_NVL_HANDLE_LEN);
        if (a->size == 0 || a->base + a->size < a->base)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK allocation %u is empty or wraps", i);
    }
    for (uint32_t i = 0; i < count; i++) {
        struct orb_nvl_grant *g = &m->grants[i];
        g->status = (int32_t)orb_cursor_u32(&c);
        g->alloc = orb_cursor_u16(&c);
        uint32_t why = orb_cursor_u8(&c);
        uint8_t zero = orb_cursor_u8(&c);
        if (c.failed)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK grant %u is truncated", i);
        if (g->status > 0 || g->status < ORB_EAGAIN)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK grant %u has status %d", i, g->status);
        if ((g->status == 0 && g->alloc >= nallocs) || (g->status != 0 && g->alloc != 0))
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK grant %u names allocation %u of %u", i, g->alloc,
                            nallocs);
        if (why > ORB_NVL_WHY_MAX || zero != 0)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK grant %u has a cause of %u bytes", i, why);
        const uint8_t *text = why > 0 ? orb_cursor_bytes(&c, why) : NULL;
        if (why > 0 && text == NULL)
            return orb_fail(ORB_EPROTO, "nvlink control: BEGIN_OK grant %u's cause is truncated", i);
        for (uint32_t k = 0; k < why; k++)
            g->why[k] = (char)(text[k] >= 0x20 && text[k] < 0x7f ? text[k] : '?'); /* printable only */
        g->why[why] = '\0';
    }
    return close_cursor(&c, "a BEGIN_OK");
}

int orb_nvl_end_encode(uint8_t kind, uint64_t group, uint8_t *out, size_t cap, size_t *len_out)
{
    if ((kind != ORB_NVL_END && kind != ORB_NVL_END_OK) || group == 0 || out == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "nvlink control: bad END arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_u64(&w, group);
    return finish_writer(&w, "an END", len_out);
}

int orb_nvl_end_decode(uint8_t kind, const uint8_t *buf, size_t len, uint64_t *group_out)
{
    struct orb_cursor c;
    int rc = open_cursor(&c, kind, buf, len);
    if (rc != 0)
        return rc;
    uint64_t group = orb_cursor_u64(&c);
    if ((rc = close_cursor(&c, "an END")) != 0)
        return rc;
    if (group == 0)
        return orb_fail(ORB_EPROTO, "nvlink control: an END of group 0");
    *group_out = group;
    return 0;
}

/* ---- descriptors ----------------------------------------------------------------------------- */

void orb_nvl_fd_handle_pack(const struct orb_nvl_fd_handle *h, uint8_t out[ORB_NVL_HANDLE_LEN])
{
    struct orb_writer w;
    orb_writer_init(&w, out, ORB_NVL_HANDLE_LEN);
    orb_writer_bytes(&w, h->channel, ORB_NVL_ID_LEN);
    orb_writer_u64(&w, h->serial);
    orb_writer_u64(&w, 0);
    orb_writer_bytes(&w, h->token, ORB_NVL_TOKEN_LEN);
}

int orb_nvl_fd_handle_unpack(const uint8_t in[ORB_NVL_HANDLE_LEN], struct orb_nvl_fd_handle *h)
{
    struct orb_cursor c;
    orb_cursor_init(&c, in, ORB_NVL_HANDLE_LEN);
    memcpy(h->channel, orb_cursor_bytes(&c, ORB_NVL_ID_LEN), ORB_NVL_ID_LEN);
    h->serial = orb_cursor_u64(&c);
    uint64_t zero = orb_cursor_u64(&c);
    memcpy(h->token, orb_cursor_bytes(&c, ORB_NVL_TOKEN_LEN), ORB_NVL_TOKEN_LEN);
    if (zero != 0)
        return orb_fail(ORB_EPROTO, "nvlink control: a descriptor handle's reserved bytes are set");
    return 0;
}

int orb_nvl_fetch_encode(const struct orb_nvl_fetch *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || m->alloc >= ORB_NVL_GROUP_MAX)
        return orb_fail(ORB_EINVAL, "nvlink control: bad FETCH arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_NVL_FETCH);
    orb_writer_u32(&w, m->alloc);
    orb_writer_u32(&w, 0);
    orb_writer_bytes(&w, m->token, ORB_NVL_TOKEN_LEN);
    return finish_writer(&w, "a FETCH", len_out);
}

int orb_nvl_fetch_decode(const uint8_t *buf, size_t len, struct orb_nvl_fetch *m)
{
    struct orb_cursor c;
    int rc = open_cursor(&c, ORB_NVL_FETCH, buf, len);
    if (rc != 0)
        return rc;
    uint32_t alloc = orb_cursor_u32(&c);
    uint32_t zero = orb_cursor_u32(&c);
    const uint8_t *token = orb_cursor_bytes(&c, ORB_NVL_TOKEN_LEN);
    if ((rc = close_cursor(&c, "a FETCH")) != 0)
        return rc;
    if (alloc >= ORB_NVL_GROUP_MAX || zero != 0)
        return orb_fail(ORB_EPROTO, "nvlink control: a FETCH of allocation %u, or with reserved bytes set", alloc);
    m->alloc = alloc;
    memcpy(m->token, token, ORB_NVL_TOKEN_LEN);
    return 0;
}

int orb_nvl_fetch_ok_encode(const struct orb_nvl_fetch_ok *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || m->status > 0 || m->status < ORB_EAGAIN ||
        (m->status == 0) != (m->size != 0))
        return orb_fail(ORB_EINVAL, "nvlink control: bad FETCH_OK arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_NVL_FETCH_OK);
    orb_writer_u32(&w, (uint32_t)m->status);
    orb_writer_u32(&w, 0);
    orb_writer_u64(&w, m->size);
    return finish_writer(&w, "a FETCH_OK", len_out);
}

int orb_nvl_fetch_ok_decode(const uint8_t *buf, size_t len, struct orb_nvl_fetch_ok *m)
{
    struct orb_cursor c;
    int rc = open_cursor(&c, ORB_NVL_FETCH_OK, buf, len);
    if (rc != 0)
        return rc;
    int32_t status = (int32_t)orb_cursor_u32(&c);
    uint32_t zero = orb_cursor_u32(&c);
    uint64_t size = orb_cursor_u64(&c);
    if ((rc = close_cursor(&c, "a FETCH_OK")) != 0)
        return rc;
    if (status > 0 || status < ORB_EAGAIN || zero != 0 || (status == 0) != (size != 0))
        return orb_fail(ORB_EPROTO, "nvlink control: a FETCH_OK with status %d and %llu bytes", status,
                        (unsigned long long)size);
    m->status = status;
    m->size = size;
    return 0;
}
