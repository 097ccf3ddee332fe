/* The RDMA transport's own messages (see ctrl.h). */
#include "rdma/ctrl.h"

#include <string.h>

#include "core/error.h"
#include "wire/wire.h"

#define PREFIX_LEN 4u
#define RAIL_LEN 28u
#define GRANT_ASK_LEN 32u

static void put_prefix(struct orb_writer *w, uint8_t kind)
{
    orb_writer_u8(w, kind);
    orb_writer_u8(w, ORB_RDMA_CTRL_VERSION);
    orb_writer_u16(w, 0);
}

static int finish_encode(const char *what, const struct orb_writer *w, size_t *len_out)
{
    if (w->failed)
        return orb_fail(ORB_EINVAL, "rdma %s encode: the buffer is too small", what);
    *len_out = w->pos;
    return 0;
}

int orb_rdma_ctrl_kind(const uint8_t *buf, size_t len, uint8_t *kind_out)
{
    if (buf == NULL || kind_out == NULL || len < PREFIX_LEN)
        return orb_fail(ORB_EPROTO, "rdma control: a message of %zu bytes is shorter than its prefix", len);
    if (buf[1] != ORB_RDMA_CTRL_VERSION)
        return orb_fail(ORB_EPROTO, "rdma control: version %u, not %u", buf[1], ORB_RDMA_CTRL_VERSION);
    if (buf[2] != 0 || buf[3] != 0)
        return orb_fail(ORB_EPROTO, "rdma control: reserved prefix bytes are not zero");
    *kind_out = buf[0];
    return 0;
}

/* The prefix of `buf` names `kind`; the cursor is left after it. */
static int begin_decode(const char *what, uint8_t kind, const uint8_t *buf, size_t len, struct orb_cursor *c)
{
    uint8_t got = 0;
    int rc = orb_rdma_ctrl_kind(buf, len, &got);
    if (rc != 0)
        return rc;
    if (got != kind)
        return orb_fail(ORB_EPROTO, "rdma %s: the message is of kind %u", what, got);
    orb_cursor_init(c, buf, len);
    (void)orb_cursor_u32(c);
    return 0;
}

static int zero_bytes(struct orb_cursor *c, size_t n)
{
    const uint8_t *p = orb_cursor_bytes(c, n);
    if (p == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            return -1;
    return 0;
}

/* ---- CONNECT / CONNECT_OK -------------------------------------------------------------------- */

static int qp_addr_ok(const struct orb_rdma_qp_addr *a)
{
    return a->qpn != 0 && a->qpn <= 0xffffffu && a->psn <= 0xffffffu && a->mtu >= IBV_MTU_256 &&
           a->mtu <= IBV_MTU_4096;
}

int orb_rdma_connect_encode(uint8_t kind, const struct orb_rdma_connect *m, uint8_t *out, size_t cap,
                            size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || (kind != ORB_RDMA_CONNECT && kind != ORB_RDMA_CONNECT_OK))
        return orb_fail(ORB_EINVAL, "rdma connect encode: bad arguments");
    if (m->nqps == 0 || m->nqps > ORB_RDMA_MAX_RAILS)
        return orb_fail(ORB_EINVAL, "rdma connect encode: %u queue pairs, not 1..%u", m->nqps, ORB_RDMA_MAX_RAILS);
    if (m->lanes == 0 || m->nqps % m->lanes != 0)
        return orb_fail(ORB_EINVAL, "rdma connect encode: %u lanes do not divide %u queue pairs", m->lanes, m->nqps);
    for (uint32_t i = 0; i < m->nqps; i++)
        if (!qp_addr_ok(&m->qps[i].qp) || m->qps[i].nic >= 64)
            return orb_fail(ORB_EINVAL, "rdma connect encode: queue pair %u has a malformed address", i);
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u8(&w, (uint8_t)m->nqps);
    uint8_t depth = 0; /* the fewest any rail answers */
    for (uint32_t i = 0; i < m->nqps && i < ORB_RDMA_MAX_RAILS; i++)
        if (m->qps[i].qp.read_depth != 0 && (depth == 0 || m->qps[i].qp.read_depth < depth))
            depth = m->qps[i].qp.read_depth;
    orb_writer_u8(&w, depth);
    orb_writer_u8(&w, (uint8_t)m->lanes);
    orb_writer_u8(&w, 0);
    for (uint32_t i = 0; i < m->nqps; i++) {
        const struct orb_rdma_rail_addr *r = &m->qps[i];
        orb_writer_u8(&w, (uint8_t)(r->nic | (r->unconnected ? ORB_RDMA_RAIL_UNCONNECTED : 0u)));
        orb_writer_u8(&w, r->qp.mtu);
        orb_writer_u16(&w, r->qp.lid);
        orb_writer_u32(&w, r->qp.qpn);
        orb_writer_u32(&w, r->qp.psn);
        orb_writer_bytes(&w, r->qp.gid, sizeof r->qp.gid);
    }
    return finish_encode("connect", &w, len_out);
}

int orb_rdma_connect_decode(uint8_t kind, const uint8_t *buf, size_t len, struct orb_rdma_connect *m)
{
    struct orb_cursor c;
    int rc = begin_decode(kind == ORB_RDMA_CONNECT ? "CONNECT" : "CONNECT_OK", kind, buf, len, &c);
    if (rc != 0)
        return rc;
    if (m == NULL)
        return orb_fail(ORB_EPROTO, "rdma connect: NULL message");
    struct orb_rdma_connect d;
    memset(&d, 0, sizeof d);
    d.incarnation = orb_cursor_u64(&c);
    d.nqps = orb_cursor_u8(&c);
    uint8_t depth = orb_cursor_u8(&c);
    d.lanes = orb_cursor_u8(&c);
    if (zero_bytes(&c, 1) != 0 || c.failed)
        return orb_fail(ORB_EPROTO, "rdma connect: malformed head");
    if (d.nqps == 0 || d.nqps > ORB_RDMA_MAX_RAILS)
        return orb_fail(ORB_EPROTO, "rdma connect: %u queue pairs, not 1..%u", d.nqps, ORB_RDMA_MAX_RAILS);
    if (d.lanes == 0 || d.nqps % d.lanes != 0)
        return orb_fail(ORB_EPROTO, "rdma connect: %u lanes do not divide %u queue pairs", d.lanes, d.nqps);
    if (len != PREFIX_LEN + 12u + (size_t)d.nqps * RAIL_LEN)
        return orb_fail(ORB_EPROTO, "rdma connect: %zu bytes for %u queue pairs", len, d.nqps);
    for (uint32_t i = 0; i < d.nqps; i++) {
        struct orb_rdma_rail_addr *r = &d.qps[i];
        r->nic = orb_cursor_u8(&c);
        r->unconnected = (r->nic & ORB_RDMA_RAIL_UNCONNECTED) != 0;
        r->nic &= (uint8_t)~ORB_RDMA_RAIL_UNCONNECTED;
        r->qp.mtu = orb_cursor_u8(&c);
        r->qp.lid = orb_cursor_u16(&c);
        r->qp.qpn = orb_cursor_u32(&c);
        r->qp.psn = orb_cursor_u32(&c);
        const uint8_t *gid = orb_cursor_bytes(&c, sizeof r->qp.gid);
        if (gid == NULL)
            return orb_fail(ORB_EPROTO, "rdma connect: truncated queue pair %u", i);
        memcpy(r->qp.gid, gid, sizeof r->qp.gid);
        r->qp.read_depth = depth;
        if (r->nic >= 64 || !qp_addr_ok(&r->qp))
            return orb_fail(ORB_EPROTO, "rdma connect: queue pair %u: NIC %u, qpn %u, psn %u, mtu %u", i, r->nic,
                            r->qp.qpn, r->qp.psn, r->qp.mtu);
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma connect: trailing bytes");
    *m = d;
    return 0;
}

/* ---- GRANT_REQ / GRANT ------------------------------------------------------------------------ */

static int rail_mask_ok(uint32_t mask)
{
    return mask != 0 && (mask >> ORB_RDMA_MAX_RAILS) == 0;
}

static int ask_ok(const struct orb_rdma_grant_ask *a)
{
    return (a->op == ORB_OP_READ || a->op == ORB_OP_WRITE) && rail_mask_ok(a->rail_mask) && a->length > 0 &&
           a->addr + a->length >= a->addr && a->pin <= ORB_RDMA_MAX_PINS && (a->pin == 0) == (a->pin_generation == 0);
}

int orb_rdma_grant_req_encode(const struct orb_rdma_grant_req *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "rdma grant request encode: NULL argument");
    if (m->count == 0 || m->count > ORB_RDMA_GRANT_BATCH)
        return orb_fail(ORB_EINVAL, "rdma grant request encode: %u requests", m->count);
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_GRANT_REQ);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u8(&w, (uint8_t)m->count);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, 0);
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_rdma_grant_ask *a = &m->ask[i];
        if (!ask_ok(a))
            return orb_fail(ORB_EINVAL, "rdma grant request encode: request %u: op %u, rails 0x%x, [0x%llx, +%llu)",
                            i, a->op, a->rail_mask, (unsigned long long)a->addr, (unsigned long long)a->length);
        orb_writer_u64(&w, a->request);
        orb_writer_u8(&w, a->op);
        orb_writer_u8(&w, a->pin);
        orb_writer_u16(&w, a->pin_generation);
        orb_writer_u32(&w, a->rail_mask);
        orb_writer_u64(&w, a->addr);
        orb_writer_u64(&w, a->length);
    }
    return finish_encode("grant request", &w, len_out);
}

int orb_rdma_grant_req_decode(const uint8_t *buf, size_t len, struct orb_rdma_grant_req *m)
{
    struct orb_cursor c;
    int rc = begin_decode("GRANT_REQ", ORB_RDMA_GRANT_REQ, buf, len, &c);
    if (rc != 0)
        return rc;
    if (m == NULL)
        return orb_fail(ORB_EPROTO, "rdma grant request: NULL message");
    struct orb_rdma_grant_req d;
    memset(&d, 0, sizeof d);
    d.incarnation = orb_cursor_u64(&c);
    d.count = orb_cursor_u8(&c);
    if (zero_bytes(&c, 3) != 0 || c.failed)
        return orb_fail(ORB_EPROTO, "rdma grant request: malformed head");
    if (d.count == 0 || d.count > ORB_RDMA_GRANT_BATCH ||
        len != PREFIX_LEN + 12u + (size_t)GRANT_ASK_LEN * d.count)
        return orb_fail(ORB_EPROTO, "rdma grant request: %u requests in %zu bytes", d.count, len);
    for (uint32_t i = 0; i < d.count; i++) {
        struct orb_rdma_grant_ask *a = &d.ask[i];
        a->request = orb_cursor_u64(&c);
        a->op = orb_cursor_u8(&c);
        a->pin = orb_cursor_u8(&c);
        a->pin_generation = orb_cursor_u16(&c);
        a->rail_mask = orb_cursor_u32(&c);
        a->addr = orb_cursor_u64(&c);
        a->length = orb_cursor_u64(&c);
        if (c.failed)
            return orb_fail(ORB_EPROTO, "rdma grant request: request %u is malformed", i);
        if (!ask_ok(a))
            return orb_fail(ORB_EPROTO, "rdma grant request: request %u: op %u, rails 0x%x, [0x%llx, +%llu)", i,
                            a->op, a->rail_mask, (unsigned long long)a->addr, (unsigned long long)a->length);
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma grant request: trailing bytes");
    *m = d;
    return 0;
}

static int status_ok(int32_t status)
{
    return status < 0 && status >= ORB_EAGAIN;
}

/* A refusal's staging slot: none, or a bounded power of two with ORB_ERESOURCE only. */
static int slot_ok(uint32_t shift, int32_t status)
{
    return shift == 0 || (status == ORB_ERESOURCE && shift >= ORB_RDMA_SLOT_SHIFT_MIN && shift <= ORB_RDMA_SLOT_SHIFT_MAX);
}

/* A refusal's hint byte: a staging slot, or "private only" with ORB_EUNAVAILABLE only. */
static int hint_ok(uint32_t hint, int32_t status)
{
    return slot_ok(hint, status) || (hint == ORB_RDMA_HINT_PRIVATE && status == ORB_EUNAVAILABLE);
}

static int why_ok(const char *why, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (why[i] < 0x20 || why[i] > 0x7e)
            return 0;
    return 1;
}

int orb_rdma_grants_encode(const struct orb_rdma_grants *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || m->count == 0 || m->count > ORB_RDMA_GRANT_BATCH)
        return orb_fail(ORB_EINVAL, "rdma grant encode: bad arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_GRANT);
    orb_writer_u8(&w, (uint8_t)m->count);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, 0);
    for (uint32_t i = 0; i < m->count; i++) {
        const struct orb_rdma_grant *g = &m->g[i];
        orb_writer_u32(&w, (uint32_t)g->status);
        if (g->status != 0) {
            /* A refusal and its cause, cut to ORB_RDMA_WHY_MAX printable bytes. */
            if (!status_ok(g->status) || g->lost_qps > 0xffffu || (g->lost_qps != 0 && g->status != ORB_EPEER) ||
                !slot_ok(g->slot_shift, g->status) || (g->private_only && (g->slot_shift != 0 ||
                                                                           g->status != ORB_EUNAVAILABLE)))
                return orb_fail(ORB_EINVAL, "rdma grant encode: entry %u: status %d, lost queue pairs 0x%x, slot %u%s",
                                i, g->status, g->lost_qps, g->slot_shift, g->private_only ? ", private" : "");
            char why[ORB_RDMA_WHY_MAX];
            size_t n = 0;
            for (; n < sizeof why && g->why[n] != '\0'; n++)
                why[n] = g->why[n] >= 0x20 && g->why[n] <= 0x7e ? g->why[n] : '?';
            orb_writer_u8(&w, (uint8_t)n);
            orb_writer_u8(&w, g->private_only ? (uint8_t)ORB_RDMA_HINT_PRIVATE : (uint8_t)g->slot_shift);
            orb_writer_u16(&w, (uint16_t)g->lost_qps);
            orb_writer_bytes(&w, why, n);
            continue;
        }
        if (g->nkeys == 0 || g->nkeys > ORB_RDMA_MAX_RAILS)
            return orb_fail(ORB_EINVAL, "rdma grant encode: entry %u: %u keys", i, g->nkeys);
        orb_writer_u8(&w, (uint8_t)g->nkeys);
        orb_writer_u8(&w, 0);
        orb_writer_u16(&w, 0);
        orb_writer_u64(&w, g->grant);
        orb_writer_u64(&w, g->generation);
        orb_writer_bytes(&w, g->nonce, sizeof g->nonce);
        orb_writer_u64(&w, g->target);
        for (uint32_t k = 0; k < g->nkeys; k++)
            orb_writer_u32(&w, g->rkeys[k]);
    }
    return finish_encode("grant", &w, len_out);
}

int orb_rdma_grants_decode(const uint8_t *buf, size_t len, struct orb_rdma_grants *m)
{
    struct orb_cursor c;
    int rc = begin_decode("GRANT", ORB_RDMA_GRANT, buf, len, &c);
    if (rc != 0)
        return rc;
    if (m == NULL)
        return orb_fail(ORB_EPROTO, "rdma grant: NULL message");
    uint32_t count = orb_cursor_u8(&c);
    if (zero_bytes(&c, 3) != 0 || c.failed || count == 0 || count > ORB_RDMA_GRANT_BATCH)
        return orb_fail(ORB_EPROTO, "rdma grant: malformed head (%u entries)", count);
    for (uint32_t i = 0; i < count; i++) {
        struct orb_rdma_grant *g = &m->g[i];
        memset(g, 0, sizeof *g);
        g->status = (int32_t)orb_cursor_u32(&c);
        uint32_t n = orb_cursor_u8(&c);
        uint32_t slot = orb_cursor_u8(&c);
        uint32_t lost = orb_cursor_u16(&c);
        if (c.failed || (lost != 0 && g->status != ORB_EPEER))
            return orb_fail(ORB_EPROTO, "rdma grant: entry %u: lost queue pairs 0x%x with status %d", i, lost,
                            g->status);
        if (!hint_ok(slot, g->status))
            return orb_fail(ORB_EPROTO, "rdma grant: entry %u: hint %u with status %d", i, slot, g->status);
        if (g->status != 0) {
            const uint8_t *why = orb_cursor_bytes(&c, n);
            if (!status_ok(g->status) || n > ORB_RDMA_WHY_MAX || why == NULL || !why_ok((const char *)why, n))
                return orb_fail(ORB_EPROTO, "rdma grant: entry %u: a refusal with status %d and %u bytes of cause",
                                i, g->status, n);
            g->lost_qps = lost;
            g->private_only = slot == ORB_RDMA_HINT_PRIVATE;
            g->slot_shift = g->private_only ? 0 : slot;
            memcpy(g->why, why, n);
            g->why[n] = '\0';
            continue;
        }
        g->nkeys = n;
        g->grant = orb_cursor_u64(&c);
        g->generation = orb_cursor_u64(&c);
        const uint8_t *nonce = orb_cursor_bytes(&c, sizeof g->nonce);
        g->target = orb_cursor_u64(&c);
        if (nonce == NULL || c.failed || n == 0 || n > ORB_RDMA_MAX_RAILS)
            return orb_fail(ORB_EPROTO, "rdma grant: entry %u: %u keys", i, n);
        memcpy(g->nonce, nonce, sizeof g->nonce);
        for (uint32_t k = 0; k < n; k++) {
            g->rkeys[k] = orb_cursor_u32(&c);
            if (c.failed || g->rkeys[k] == 0)
                return orb_fail(ORB_EPROTO, "rdma grant: entry %u: key %u is missing or 0", i, k);
        }
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma grant: trailing bytes");
    m->count = count;
    return 0;
}

/* DISCONNECT and PING: the prefix and one u64. */
static int u64_body_encode(uint8_t kind, const char *what, uint64_t v, uint8_t *out, size_t cap, size_t *len_out)
{
    if (out == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "rdma %s encode: NULL argument", what);
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, kind);
    orb_writer_u64(&w, v);
    return finish_encode(what, &w, len_out);
}

static int u64_body_decode(uint8_t kind, const char *what, const uint8_t *buf, size_t len, uint64_t *v_out)
{
    struct orb_cursor c;
    int rc = begin_decode(what, kind, buf, len, &c);
    if (rc != 0)
        return rc;
    uint64_t v = orb_cursor_u64(&c);
    if (v_out == NULL || orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma %s: %zu bytes, not 12", what, len);
    *v_out = v;
    return 0;
}

int orb_rdma_disconnect_encode(uint64_t incarnation, uint8_t *out, size_t cap, size_t *len_out)
{
    return u64_body_encode(ORB_RDMA_DISCONNECT, "DISCONNECT", incarnation, out, cap, len_out);
}

int orb_rdma_disconnect_decode(const uint8_t *buf, size_t len, uint64_t *incarnation)
{
    return u64_body_decode(ORB_RDMA_DISCONNECT, "DISCONNECT", buf, len, incarnation);
}

int orb_rdma_ping_encode(uint64_t nonce, uint8_t *out, size_t cap, size_t *len_out)
{
    return u64_body_encode(ORB_RDMA_PING, "PING", nonce, out, cap, len_out);
}

int orb_rdma_ping_decode(const uint8_t *buf, size_t len, uint64_t *nonce)
{
    return u64_body_decode(ORB_RDMA_PING, "PING", buf, len, nonce);
}

/* ---- PIN, PINNED, UNPIN and UNPINNED ---------------------------------------------------------- */

static int range_ok(uint8_t op, uint64_t addr, uint64_t length)
{
    return (op == ORB_OP_READ || op == ORB_OP_WRITE) && length > 0 && addr + length >= addr;
}

int orb_rdma_pin_encode(const struct orb_rdma_pin_req *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || !range_ok(m->op, m->addr, m->length))
        return orb_fail(ORB_EINVAL, "rdma pin encode: bad arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_PIN);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u64(&w, m->request);
    orb_writer_u8(&w, m->op);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, 0);
    orb_writer_u32(&w, 0);
    orb_writer_u64(&w, m->addr);
    orb_writer_u64(&w, m->length);
    return finish_encode("pin", &w, len_out);
}

int orb_rdma_pin_decode(const uint8_t *buf, size_t len, struct orb_rdma_pin_req *m)
{
    struct orb_cursor c;
    int rc = begin_decode("PIN", ORB_RDMA_PIN, buf, len, &c);
    if (rc != 0)
        return rc;
    struct orb_rdma_pin_req d;
    d.incarnation = orb_cursor_u64(&c);
    d.request = orb_cursor_u64(&c);
    d.op = orb_cursor_u8(&c);
    int bad = zero_bytes(&c, 7);
    d.addr = orb_cursor_u64(&c);
    d.length = orb_cursor_u64(&c);
    if (m == NULL || bad != 0 || orb_cursor_finish(&c) != 0 || !range_ok(d.op, d.addr, d.length))
        return orb_fail(ORB_EPROTO, "rdma pin: malformed (%zu bytes)", len);
    *m = d;
    return 0;
}

static int pinned_ok(const struct orb_rdma_pinned *m)
{
    if (m->status == 0)
        return m->pin >= 1 && m->pin <= ORB_RDMA_MAX_PINS && m->generation != 0 && m->generation <= 0xffffu &&
               (m->slot_shift == 0 || (m->slot_shift >= ORB_RDMA_SLOT_SHIFT_MIN && m->slot_shift <= ORB_RDMA_SLOT_SHIFT_MAX));
    return status_ok(m->status) && m->pin == 0 && m->generation == 0 && m->slot_shift == 0;
}

int orb_rdma_pinned_encode(const struct orb_rdma_pinned *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || !pinned_ok(m))
        return orb_fail(ORB_EINVAL, "rdma pinned encode: bad arguments");
    char why[ORB_RDMA_WHY_MAX];
    size_t n = 0;
    for (; m->status != 0 && n < sizeof why && m->why[n] != '\0'; n++)
        why[n] = m->why[n] >= 0x20 && m->why[n] <= 0x7e ? m->why[n] : '?';
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_PINNED);
    orb_writer_u32(&w, (uint32_t)m->status);
    orb_writer_u8(&w, (uint8_t)m->pin);
    orb_writer_u8(&w, (uint8_t)m->slot_shift);
    orb_writer_u16(&w, (uint16_t)m->generation);
    orb_writer_u8(&w, (uint8_t)n);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, 0);
    orb_writer_bytes(&w, why, n);
    return finish_encode("pinned", &w, len_out);
}

int orb_rdma_pinned_decode(const uint8_t *buf, size_t len, struct orb_rdma_pinned *m)
{
    struct orb_cursor c;
    int rc = begin_decode("PINNED", ORB_RDMA_PINNED, buf, len, &c);
    if (rc != 0)
        return rc;
    struct orb_rdma_pinned d;
    memset(&d, 0, sizeof d);
    d.status = (int32_t)orb_cursor_u32(&c);
    d.pin = orb_cursor_u8(&c);
    d.slot_shift = orb_cursor_u8(&c);
    d.generation = orb_cursor_u16(&c);
    uint32_t n = orb_cursor_u8(&c);
    int bad = zero_bytes(&c, 3);
    const uint8_t *why = c.failed || n > ORB_RDMA_WHY_MAX ? NULL : orb_cursor_bytes(&c, n);
    if (m == NULL || bad != 0 || why == NULL || orb_cursor_finish(&c) != 0 || !pinned_ok(&d) ||
        (d.status == 0 && n != 0) || !why_ok((const char *)why, n))
        return orb_fail(ORB_EPROTO, "rdma pinned: malformed (%zu bytes)", len);
    memcpy(d.why, why, n);
    d.why[n] = '\0';
    *m = d;
    return 0;
}

int orb_rdma_unpin_encode(const struct orb_rdma_unpin *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || m->pin == 0 || m->pin > ORB_RDMA_MAX_PINS ||
        m->generation == 0 || m->generation > 0xffffu)
        return orb_fail(ORB_EINVAL, "rdma unpin encode: bad arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_UNPIN);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u8(&w, (uint8_t)m->pin);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, (uint16_t)m->generation);
    orb_writer_u32(&w, 0);
    return finish_encode("unpin", &w, len_out);
}

int orb_rdma_unpin_decode(const uint8_t *buf, size_t len, struct orb_rdma_unpin *m)
{
    struct orb_cursor c;
    int rc = begin_decode("UNPIN", ORB_RDMA_UNPIN, buf, len, &c);
    if (rc != 0)
        return rc;
    struct orb_rdma_unpin d;
    d.incarnation = orb_cursor_u64(&c);
    d.pin = orb_cursor_u8(&c);
    int bad = zero_bytes(&c, 1);
    d.generation = orb_cursor_u16(&c);
    bad |= zero_bytes(&c, 4);
    if (m == NULL || bad != 0 || orb_cursor_finish(&c) != 0 || d.pin == 0 || d.pin > ORB_RDMA_MAX_PINS ||
        d.generation == 0)
        return orb_fail(ORB_EPROTO, "rdma unpin: malformed (%zu bytes)", len);
    *m = d;
    return 0;
}

int orb_rdma_unpinned_encode(int32_t status, uint8_t *out, size_t cap, size_t *len_out)
{
    if (out == NULL || len_out == NULL || (status != 0 && !status_ok(status)))
        return orb_fail(ORB_EINVAL, "rdma unpinned encode: bad arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_UNPINNED);
    orb_writer_u32(&w, (uint32_t)status);
    orb_writer_u32(&w, 0);
    return finish_encode("unpinned", &w, len_out);
}

int orb_rdma_unpinned_decode(const uint8_t *buf, size_t len, int32_t *status)
{
    struct orb_cursor c;
    int rc = begin_decode("UNPINNED", ORB_RDMA_UNPINNED, buf, len, &c);
    if (rc != 0)
        return rc;
    int32_t st = (int32_t)orb_cursor_u32(&c);
    int bad = zero_bytes(&c, 4);
    if (status == NULL || bad != 0 || orb_cursor_finish(&c) != 0 || (st != 0 && !status_ok(st)))
        return orb_fail(ORB_EPROTO, "rdma unpinned: malformed (%zu bytes)", len);
    *status = st;
    return 0;
}

/* ---- PGRANT_REQ and PGRANT -------------------------------------------------------------------- */

#define PGRANT_REQ_HEAD 48u
#define PGRANT_HEAD 68u

static void put_qp(struct orb_writer *w, const struct orb_rdma_qp_addr *a)
{
    orb_writer_u8(w, 0);
    orb_writer_u8(w, a->mtu);
    orb_writer_u16(w, a->lid);
    orb_writer_u32(w, a->qpn);
    orb_writer_u32(w, a->psn);
    orb_writer_bytes(w, a->gid, sizeof a->gid);
}

static int get_qp(struct orb_cursor *c, struct orb_rdma_qp_addr *a)
{
    memset(a, 0, sizeof *a);
    if (zero_bytes(c, 1) != 0)
        return -1;
    a->mtu = orb_cursor_u8(c);
    a->lid = orb_cursor_u16(c);
    a->qpn = orb_cursor_u32(c);
    a->psn = orb_cursor_u32(c);
    const uint8_t *gid = orb_cursor_bytes(c, sizeof a->gid);
    if (gid == NULL || c->failed)
        return -1;
    memcpy(a->gid, gid, sizeof a->gid);
    return qp_addr_ok(a) ? 0 : -1;
}

static int pgrant_req_ok(const struct orb_rdma_pgrant_req *m)
{
    return range_ok(m->op, m->addr, m->length) && rail_mask_ok(m->rail_mask) &&
           m->nqps == (uint32_t)__builtin_popcount(m->rail_mask) && m->pin <= ORB_RDMA_MAX_PINS &&
           (m->pin == 0) == (m->pin_generation == 0);
}

int orb_rdma_pgrant_req_encode(const struct orb_rdma_pgrant_req *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || !pgrant_req_ok(m))
        return orb_fail(ORB_EINVAL, "rdma private grant request encode: bad arguments");
    for (uint32_t i = 0; i < m->nqps; i++)
        if (!qp_addr_ok(&m->qps[i]))
            return orb_fail(ORB_EINVAL, "rdma private grant request encode: queue pair %u has a malformed address",
                            i);
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_PGRANT_REQ);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u64(&w, m->request);
    orb_writer_u8(&w, m->op);
    orb_writer_u8(&w, (uint8_t)m->nqps);
    orb_writer_u8(&w, m->pin);
    orb_writer_u8(&w, 0);
    orb_writer_u16(&w, m->pin_generation);
    orb_writer_u16(&w, 0);
    orb_writer_u32(&w, m->rail_mask);
    orb_writer_u64(&w, m->addr);
    orb_writer_u64(&w, m->length);
    for (uint32_t i = 0; i < m->nqps; i++)
        put_qp(&w, &m->qps[i]);
    return finish_encode("private grant request", &w, len_out);
}

struct orb_rdma_grant_ask orb_rdma_pgrant_ask(const struct orb_rdma_pgrant_req *m)
{
    return (struct orb_rdma_grant_ask){.request = m->request, .op = m->op, .pin = m->pin,
                                       .pin_generation = m->pin_generation, .rail_mask = m->rail_mask,
                                       .addr = m->addr, .length = m->length};
}

int orb_rdma_pgrant_req_decode(const uint8_t *buf, size_t len, struct orb_rdma_pgrant_req *m)
{
    struct orb_cursor c;
    int rc = begin_decode("PGRANT_REQ", ORB_RDMA_PGRANT_REQ, buf, len, &c);
    if (rc != 0)
        return rc;
    if (m == NULL)
        return orb_fail(ORB_EPROTO, "rdma private grant request: NULL message");
    struct orb_rdma_pgrant_req d;
    memset(&d, 0, sizeof d);
    d.incarnation = orb_cursor_u64(&c);
    d.request = orb_cursor_u64(&c);
    d.op = orb_cursor_u8(&c);
    d.nqps = orb_cursor_u8(&c);
    d.pin = orb_cursor_u8(&c);
    if (zero_bytes(&c, 1) != 0)
        return orb_fail(ORB_EPROTO, "rdma private grant request: malformed head");
    d.pin_generation = orb_cursor_u16(&c);
    if (zero_bytes(&c, 2) != 0)
        return orb_fail(ORB_EPROTO, "rdma private grant request: malformed head");
    d.rail_mask = orb_cursor_u32(&c);
    d.addr = orb_cursor_u64(&c);
    d.length = orb_cursor_u64(&c);
    if (c.failed || !pgrant_req_ok(&d) || len != PGRANT_REQ_HEAD + (size_t)d.nqps * RAIL_LEN)
        return orb_fail(ORB_EPROTO, "rdma private grant request: op %u, rails 0x%x, %u queue pairs, pin %u/%u, "
                        "[0x%llx, +%llu) in %zu bytes", d.op, d.rail_mask, d.nqps, d.pin, d.pin_generation,
                        (unsigned long long)d.addr, (unsigned long long)d.length, len);
    for (uint32_t i = 0; i < d.nqps; i++)
        if (get_qp(&c, &d.qps[i]) != 0)
            return orb_fail(ORB_EPROTO, "rdma private grant request: queue pair %u is malformed", i);
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma private grant request: trailing bytes");
    *m = d;
    return 0;
}

int orb_rdma_pgrant_encode(const struct orb_rdma_pgrant *m, uint8_t *out, size_t cap, size_t *len_out)
{
    if (m == NULL || out == NULL || len_out == NULL || (m->status != 0 && !status_ok(m->status)) ||
        (m->status != 0 && !slot_ok(m->slot_shift, m->status)) || (m->status == 0 && m->slot_shift != 0) ||
        (m->status == 0 && m->keys > ORB_RDMA_PGRANT_WINDOWS))
        return orb_fail(ORB_EINVAL, "rdma private grant encode: bad arguments");
    struct orb_writer w;
    orb_writer_init(&w, out, cap);
    put_prefix(&w, ORB_RDMA_PGRANT);
    orb_writer_u32(&w, (uint32_t)m->status);
    if (m->status != 0) {
        char why[ORB_RDMA_WHY_MAX];
        size_t n = 0;
        for (; n < sizeof why && m->why[n] != '\0'; n++)
            why[n] = m->why[n] >= 0x20 && m->why[n] <= 0x7e ? m->why[n] : '?';
        orb_writer_u8(&w, (uint8_t)n);
        orb_writer_u8(&w, (uint8_t)m->slot_shift);
        orb_writer_u16(&w, 0);
        orb_writer_bytes(&w, why, n);
        return finish_encode("private grant", &w, len_out);
    }
    if (m->nqps == 0 || m->nqps > ORB_RDMA_MAX_RAILS)
        return orb_fail(ORB_EINVAL, "rdma private grant encode: %u queue pairs", m->nqps);
    for (uint32_t i = 0; i < m->nqps; i++)
        if (m->rkeys[i] == 0 || !qp_addr_ok(&m->qps[i]))
            return orb_fail(ORB_EINVAL, "rdma private grant encode: queue pair %u: key 0 or a malformed address", i);
    orb_writer_u8(&w, (uint8_t)m->nqps);
    orb_writer_u8(&w, m->keys);
    orb_writer_u16(&w, 0);
    orb_writer_u64(&w, m->grant);
    orb_writer_u64(&w, m->generation);
    orb_writer_bytes(&w, m->nonce, sizeof m->nonce);
    orb_writer_u64(&w, m->target);
    for (uint32_t i = 0; i < m->nqps; i++) {
        orb_writer_u32(&w, m->rkeys[i]);
        put_qp(&w, &m->qps[i]);
    }
    return finish_encode("private grant", &w, len_out);
}

int orb_rdma_pgrant_decode(const uint8_t *buf, size_t len, struct orb_rdma_pgrant *m)
{
    struct orb_cursor c;
    int rc = begin_decode("PGRANT", ORB_RDMA_PGRANT, buf, len, &c);
    if (rc != 0)
        return rc;
    if (m == NULL)
        return orb_fail(ORB_EPROTO, "rdma private grant: NULL message");
    struct orb_rdma_pgrant d;
    memset(&d, 0, sizeof d);
    d.status = (int32_t)orb_cursor_u32(&c);
    uint32_t n = orb_cursor_u8(&c);
    uint32_t hint = orb_cursor_u8(&c); /* a refusal's staging slot, a grant's kind of keys */
    if (zero_bytes(&c, 2) != 0 || c.failed)
        return orb_fail(ORB_EPROTO, "rdma private grant: malformed head");
    if (d.status != 0) {
        const uint8_t *why = orb_cursor_bytes(&c, n);
        if (!status_ok(d.status) || !slot_ok(hint, d.status) || n > ORB_RDMA_WHY_MAX || why == NULL ||
            !why_ok((const char *)why, n) || orb_cursor_finish(&c) != 0)
            return orb_fail(ORB_EPROTO, "rdma private grant: a refusal with status %d and %u bytes of cause in %zu",
                            d.status, n, len);
        memcpy(d.why, why, n);
        d.why[n] = '\0';
        d.slot_shift = hint;
        *m = d;
        return 0;
    }
    if (hint > ORB_RDMA_PGRANT_WINDOWS)
        return orb_fail(ORB_EPROTO, "rdma private grant: unknown kind of keys %u", hint);
    d.keys = (uint8_t)hint;
    d.nqps = n;
    d.grant = orb_cursor_u64(&c);
    d.generation = orb_cursor_u64(&c);
    const uint8_t *nonce = orb_cursor_bytes(&c, sizeof d.nonce);
    d.target = orb_cursor_u64(&c);
    if (nonce == NULL || c.failed || n == 0 || n > ORB_RDMA_MAX_RAILS ||
        len != PGRANT_HEAD + (size_t)n * (RAIL_LEN + 4u))
        return orb_fail(ORB_EPROTO, "rdma private grant: %u queue pairs in %zu bytes", n, len);
    memcpy(d.nonce, nonce, sizeof d.nonce);
    for (uint32_t i = 0; i < n; i++) {
        d.rkeys[i] = orb_cursor_u32(&c);
        if (c.failed || d.rkeys[i] == 0 || get_qp(&c, &d.qps[i]) != 0)
            return orb_fail(ORB_EPROTO, "rdma private grant: queue pair %u: key 0 or a malformed address", i);
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma private grant: trailing bytes");
    *m = d;
    return 0;
}

/* ---- BINDING and ACK ------------------------------------------------------------------------- */

void orb_rdma_binding_encode(const struct orb_rdma_binding *m, uint8_t out[ORB_RDMA_BINDING_LEN])
{
    struct orb_writer w;
    orb_writer_init(&w, out, ORB_RDMA_BINDING_LEN);
    orb_writer_u32(&w, ORB_RDMA_BINDING_MAGIC);
    orb_writer_u8(&w, ORB_RDMA_CTRL_VERSION);
    orb_writer_u8(&w, 1);
    orb_writer_u16(&w, m->rail);
    orb_writer_bytes(&w, m->requester.bytes, sizeof m->requester.bytes);
    orb_writer_bytes(&w, m->source.bytes, sizeof m->source.bytes);
    orb_writer_u64(&w, m->incarnation);
    orb_writer_u64(&w, m->request);
    orb_writer_u64(&w, m->grant);
    orb_writer_u64(&w, m->generation);
    orb_writer_bytes(&w, m->nonce, sizeof m->nonce);
    orb_writer_u64(&w, m->addr);
    orb_writer_u64(&w, m->length);
    orb_writer_u32(&w, m->rkey);
    orb_writer_u8(&w, m->op);
    orb_writer_u32(&w, m->rail_wrs);
    orb_writer_u64(&w, m->rail_bytes);
    orb_writer_u32(&w, 0);
}

int orb_rdma_binding_decode(const uint8_t *buf, size_t len, struct orb_rdma_binding *m)
{
    if (buf == NULL || m == NULL || len != ORB_RDMA_BINDING_LEN)
        return orb_fail(ORB_EPROTO, "rdma binding: %zu bytes, not %u", len, ORB_RDMA_BINDING_LEN);
    struct orb_cursor c;
    orb_cursor_init(&c, buf, len);
    struct orb_rdma_binding d;
    memset(&d, 0, sizeof d);
    uint32_t magic = orb_cursor_u32(&c);
    uint8_t version = orb_cursor_u8(&c);
    uint8_t kind = orb_cursor_u8(&c);
    d.rail = orb_cursor_u16(&c);
    const uint8_t *req = orb_cursor_bytes(&c, 16);
    const uint8_t *src = orb_cursor_bytes(&c, 16);
    d.incarnation = orb_cursor_u64(&c);
    d.request = orb_cursor_u64(&c);
    d.grant = orb_cursor_u64(&c);
    d.generation = orb_cursor_u64(&c);
    const uint8_t *nonce = orb_cursor_bytes(&c, ORB_RDMA_NONCE_LEN);
    d.addr = orb_cursor_u64(&c);
    d.length = orb_cursor_u64(&c);
    d.rkey = orb_cursor_u32(&c);
    d.op = orb_cursor_u8(&c);
    d.rail_wrs = orb_cursor_u32(&c);
    d.rail_bytes = orb_cursor_u64(&c);
    uint32_t zero = orb_cursor_u32(&c);
    if (orb_cursor_finish(&c) != 0 || req == NULL || src == NULL || nonce == NULL)
        return orb_fail(ORB_EPROTO, "rdma binding: malformed");
    if (magic != ORB_RDMA_BINDING_MAGIC || version != ORB_RDMA_CTRL_VERSION || kind != 1 || zero != 0)
        return orb_fail(ORB_EPROTO, "rdma binding: magic 0x%x, version %u, kind %u", magic, version, kind);
    if (d.rail >= ORB_RDMA_MAX_RAILS || (d.op != ORB_OP_READ && d.op != ORB_OP_WRITE) || d.rkey == 0 ||
        d.rail_bytes > d.length)
        return orb_fail(ORB_EPROTO, "rdma binding: rail %u, op %u, key 0x%x", d.rail, d.op, d.rkey);
    memcpy(d.requester.bytes, req, 16);
    memcpy(d.source.bytes, src, 16);
    memcpy(d.nonce, nonce, sizeof d.nonce);
    *m = d;
    return 0;
}

size_t orb_rdma_acks_encode(const struct orb_rdma_ack *m, uint32_t n, uint8_t out[ORB_RDMA_ACKS_LEN_MAX])
{
    if (m == NULL || out == NULL || n == 0 || n > ORB_RDMA_ACKS_MAX)
        return 0;
    struct orb_writer w;
    orb_writer_init(&w, out, ORB_RDMA_ACKS_LEN(n));
    orb_writer_u32(&w, ORB_RDMA_ACK_MAGIC);
    orb_writer_u8(&w, ORB_RDMA_CTRL_VERSION);
    orb_writer_u8(&w, 2);
    orb_writer_u16(&w, (uint16_t)n);
    for (uint32_t i = 0; i < n; i++) {
        orb_writer_u64(&w, m[i].request);
        orb_writer_u64(&w, m[i].grant);
        orb_writer_u32(&w, (uint32_t)m[i].status);
        orb_writer_u32(&w, 0);
    }
    return ORB_RDMA_ACKS_LEN(n);
}

void orb_rdma_ack_encode(const struct orb_rdma_ack *m, uint8_t out[ORB_RDMA_ACK_LEN])
{
    uint8_t buf[ORB_RDMA_ACKS_LEN_MAX];
    (void)orb_rdma_acks_encode(m, 1, buf);
    memcpy(out, buf, ORB_RDMA_ACK_LEN);
}

int orb_rdma_acks_decode(const uint8_t *buf, size_t len, struct orb_rdma_ack out[ORB_RDMA_ACKS_MAX], uint32_t *n_out)
{
    if (buf == NULL || out == NULL || n_out == NULL || len < ORB_RDMA_ACKS_LEN(1) || len > ORB_RDMA_ACKS_LEN_MAX)
        return orb_fail(ORB_EPROTO, "rdma ack: %zu bytes, not %u to %u", len, ORB_RDMA_ACKS_LEN(1),
                        ORB_RDMA_ACKS_LEN_MAX);
    struct orb_cursor c;
    orb_cursor_init(&c, buf, len);
    uint32_t magic = orb_cursor_u32(&c);
    uint8_t version = orb_cursor_u8(&c);
    uint8_t kind = orb_cursor_u8(&c);
    uint16_t n = orb_cursor_u16(&c);
    if (magic != ORB_RDMA_ACK_MAGIC || version != ORB_RDMA_CTRL_VERSION || kind != 2)
        return orb_fail(ORB_EPROTO, "rdma ack: magic 0x%x, version %u, kind %u", magic, version, kind);
    if (n == 0 || n > ORB_RDMA_ACKS_MAX || len != ORB_RDMA_ACKS_LEN(n))
        return orb_fail(ORB_EPROTO, "rdma ack: %u entries in %zu bytes", n, len);
    struct orb_rdma_ack d[ORB_RDMA_ACKS_MAX];
    for (uint32_t i = 0; i < n; i++) {
        d[i].request = orb_cursor_u64(&c);
        d[i].grant = orb_cursor_u64(&c);
        d[i].status = (int32_t)orb_cursor_u32(&c);
        uint32_t zero = orb_cursor_u32(&c);
        if (zero != 0)
            return orb_fail(ORB_EPROTO, "rdma ack: entry %u: nonzero padding", i);
        if (d[i].status > 0 || d[i].status < ORB_EAGAIN)
            return orb_fail(ORB_EPROTO, "rdma ack: entry %u: status %d", i, d[i].status);
    }
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "rdma ack: malformed");
    memcpy(out, d, (size_t)n * sizeof d[0]);
    *n_out = n;
    return 0;
}

size_t orb_rdma_acks_len(const uint8_t *msg, size_t cap)
{
    if (msg == NULL || cap < ORB_RDMA_ACKS_LEN(1))
        return 0;
    uint32_t n = (uint32_t)msg[6] | (uint32_t)msg[7] << 8;
    if (n == 0 || n > ORB_RDMA_ACKS_MAX || ORB_RDMA_ACKS_LEN(n) > cap)
        return 0;
    return ORB_RDMA_ACKS_LEN(n);
}
