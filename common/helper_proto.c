/* The library <-> orbite-helper message codec and datagram I/O. The layout is in helper_proto.h
 * and docs/helper-protocol.md. Every encoder validates its input with the same rules its decoder
 * applies, so a message decodes if and only if an encoder could have produced it, and decoding
 * then re-encoding gives back the very same bytes. */
#include "common/helper_proto.h"

#include <errno.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/error.h"
#include "wire/wire.h"

/* ---- limits of the inventory items on the wire ------------------------------------------------
 * Strings are u16 length + bytes. Inventory NIC names must fit the model's buffer (63 bytes + NUL),
 * one byte shorter than ORB_HP_NAME_MAX; PCI strings likewise (15 bytes + NUL). */
#define HP_INV_NAME_MAX (ORB_TOPO_NAME_MAX - 1u)
#define HP_PCI_MAX (ORB_TOPO_PCI_MAX - 1u)
#define HP_NUMA_ID_MAX 65535 /* the sysfs reader's bound on node ids */
#define HP_STR(max) (2u + (max))
#define HP_PATH_MAX (1u + ORB_TOPO_PCI_DEPTH * HP_STR(HP_PCI_MAX))
#define HP_GID_LEN (16u + 2u + 1u + 1u)
#define HP_PORT_MAX (8u + ORB_TOPO_MAX_GIDS * HP_GID_LEN)
#define HP_NIC_MAX                                                                                 \
    (1u + 1u + HP_STR(HP_INV_NAME_MAX) + 8u + HP_STR(HP_PCI_MAX) + 4u + HP_PATH_MAX + 1u +          \
     ORB_TOPO_MAX_PORTS * HP_PORT_MAX)
#define HP_GPU_MAX (4u + HP_STR(HP_PCI_MAX) + 4u + HP_PATH_MAX)
#define HP_NUMA_MAX (4u + 1u + ORB_TOPO_MAX_NUMA)
#define HP_ITEM_MAX HP_NIC_MAX /* the largest of the three */
#define HP_POLICY_FIXED (8u + 8u + 4u + 4u + 8u + 4u + 4u + 4u)
#define HP_DEVX_FIXED (4u + 4u + 4u + 8u + 8u + 4u) /* obj_handle key qpn addr length access */

/* A NIC with every port and every GID kept still fits one datagram: no item is ever split. */
_Static_assert(HP_NIC_MAX >= HP_GPU_MAX && HP_NIC_MAX >= HP_NUMA_MAX, "HP_ITEM_MAX is the NIC");
_Static_assert(ORB_HP_HEADER_LEN + 4u + 4u + HP_ITEM_MAX <= ORB_HP_MAX_MSG,
               "a full NIC inventory item must fit one helper datagram");
_Static_assert(ORB_HP_HEADER_LEN + 4u + HP_POLICY_FIXED + ORB_HP_MAX_SLOTS * HP_STR(ORB_HP_NAME_MAX) <=
                   ORB_HP_MAX_MSG,
               "a full POLICY reply must fit one helper datagram");
_Static_assert(ORB_HP_MAX_SLOTS <= UINT8_MAX && ORB_HP_NAME_MAX <= UINT16_MAX, "wire field widths");

/* Room for more descriptors than any caller allows, so that a peer sending too many is seen
 * (and every one of them closed) rather than silently cut by the kernel. */
#define HP_RECV_FD_ROOM 8u

/* ---- small helpers ------------------------------------------------------------------------------ */

const char *orb_hp_type_name(uint16_t type)
{
    switch (type) {
    case ORB_HP_HELLO: return "HELLO";
    case ORB_HP_HELLO_REPLY: return "HELLO_REPLY";
    case ORB_HP_INVENTORY: return "INVENTORY";
    case ORB_HP_INVENTORY_REPLY: return "INVENTORY_REPLY";
    case ORB_HP_POLICY: return "POLICY";
    case ORB_HP_POLICY_REPLY: return "POLICY_REPLY";
    case ORB_HP_OPEN_DEVICE: return "OPEN_DEVICE";
    case ORB_HP_OPEN_DEVICE_REPLY: return "OPEN_DEVICE_REPLY";
    case ORB_HP_PEERMEM_PROBE: return "PEERMEM_PROBE";
    case ORB_HP_PEERMEM_REPLY: return "PEERMEM_REPLY";
    case ORB_HP_SLOT_ATTACH: return "SLOT_ATTACH";
    case ORB_HP_SLOT_REPLY: return "SLOT_REPLY";
    case ORB_HP_DEVX_VERIFY: return "DEVX_VERIFY";
    case ORB_HP_DEVX_REPLY: return "DEVX_REPLY";
    default: return "unknown";
    }
}

void orb_hp_body_limits(uint16_t type, uint32_t *min_len, uint32_t *max_len)
{
    uint32_t lo = 0, hi = 0;
    switch (type) {
    case ORB_HP_HELLO: lo = hi = 4; break;
    case ORB_HP_HELLO_REPLY: lo = 4; hi = 4 + 16; break;
    case ORB_HP_INVENTORY: lo = hi = 8; break;
    case ORB_HP_INVENTORY_REPLY: lo = 4; hi = 4 + 4 + HP_ITEM_MAX; break;
    case ORB_HP_POLICY: lo = hi = 0; break;
    case ORB_HP_POLICY_REPLY:
        lo = 4;
        hi = 4 + HP_POLICY_FIXED + ORB_HP_MAX_SLOTS * HP_STR(ORB_HP_NAME_MAX);
        break;
    case ORB_HP_OPEN_DEVICE: lo = HP_STR(1); hi = HP_STR(ORB_HP_NAME_MAX); break;
    case ORB_HP_OPEN_DEVICE_REPLY: lo = 4; hi = 8; break;
    case ORB_HP_PEERMEM_PROBE: lo = hi = 0; break;
    case ORB_HP_PEERMEM_REPLY: lo = 4; hi = 8; break;
    case ORB_HP_SLOT_ATTACH: lo = HP_STR(1) + 8; hi = HP_STR(ORB_HP_NAME_MAX) + 8; break;
    case ORB_HP_SLOT_REPLY: lo = 4; hi = 8; break;
    case ORB_HP_DEVX_VERIFY:
        lo = HP_STR(1) + HP_DEVX_FIXED;
        hi = HP_STR(ORB_HP_NAME_MAX) + HP_DEVX_FIXED;
        break;
    case ORB_HP_DEVX_REPLY: lo = hi = 4; break;
    default: break;
    }
    if (min_len)
        *min_len = lo;
    if (max_len)
        *max_len = hi;
}

int orb_hp_name_valid(const char *name, size_t len)
{
    if (name == NULL || len == 0 || len > ORB_HP_NAME_MAX)
        return 0;
    if ((len == 1 && name[0] == '.') || (len == 2 && name[0] == '.' && name[1] == '.'))
        return 0;
    for (size_t i = 0; i < len; i++) {
        char c = name[i];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '.' || c == '-'))
            return 0;
    }
    return 1;
}

void orb_hp_close_fds(int *fds, size_t n)
{
    for (size_t i = 0; fds != NULL && i < n; i++) {
        if (fds[i] >= 0) {
            (void)close(fds[i]);
            fds[i] = -1;
        }
    }
}

/* 0 or a negative ORB_E* code the library defines. */
static bool status_valid(int32_t status)
{
    return status <= 0 && status >= ORB_EAGAIN;
}

/* Length of the NUL-terminated string in a fixed buffer of `cap` bytes, or cap when there is no
 * NUL in it (an unterminated field, which every caller refuses). */
static size_t field_len(const char *s, size_t cap)
{
    return strnlen(s, cap);
}

static bool is_hex_lower(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* A PCI bus id as sysfs spells it ("0000:3b:00.0"): lowercase hex digits, ':' and '.' only.
 * The characters are checked, not the exact shape: enough to keep it one harmless path
 * component, and the helper only ever sends what its own strict sysfs reader accepted. */
static bool pci_bus_id_valid(const char *s, size_t len)
{
    if (len == 0 || len > HP_PCI_MAX)
        return false;
    for (size_t i = 0; i < len; i++)
        if (!is_hex_lower(s[i]) && s[i] != ':' && s[i] != '.')
            return false;
    return true;
}

/* A root complex "pci0000:00": "pci" then lowercase hex digits and ':'. */
static bool pci_root_valid(const char *s, size_t len)
{
    if (len < 4 || len > HP_PCI_MAX || memcmp(s, "pci", 3) != 0)
        return false;
    for (size_t i = 3; i < len; i++)
        if (!is_hex_lower(s[i]) && s[i] != ':')
            return false;
    return true;
}

/* ---- header ------------------------------------------------------------------------------------ */

int orb_hp_parse(const uint8_t *buf, size_t len, struct orb_hp_msg *out)
{
    if (out == NULL || (buf == NULL && len != 0))
        return orb_fail(ORB_EINVAL, "helper protocol: parse: NULL argument");
    if (len < ORB_HP_HEADER_LEN)
        return orb_fail(ORB_EPROTO, "helper protocol: datagram of %zu bytes is shorter than the header", len);
    if (len > ORB_HP_MAX_MSG)
        return orb_fail(ORB_EPROTO, "helper protocol: datagram of %zu bytes exceeds %u", len, ORB_HP_MAX_MSG);
    struct orb_cursor c;
    orb_cursor_init(&c, buf, ORB_HP_HEADER_LEN);
    uint32_t magic = orb_cursor_u32(&c);
    uint16_t version = orb_cursor_u16(&c);
    uint16_t type = orb_cursor_u16(&c);
    uint32_t length = orb_cursor_u32(&c);
    uint32_t sequence = orb_cursor_u32(&c);
    if (orb_cursor_finish(&c) != 0)
        return orb_fail(ORB_EPROTO, "helper protocol: short header");
    if (magic != ORB_HP_MAGIC)
        return orb_fail(ORB_EPROTO, "helper protocol: bad magic 0x%08x", magic);
    if (version != ORB_HP_VERSION)
        return orb_fail(ORB_EPROTO, "helper protocol: version %u, expected %u", version, ORB_HP_VERSION);
    if (type < ORB_HP_HELLO || type > ORB_HP_TYPE_MAX)
        return orb_fail(ORB_EPROTO, "helper protocol: unknown message type %u", type);
    uint32_t min_body, max_body;
    orb_hp_body_limits(type, &min_body, &max_body);
    if (length != len)
        return orb_fail(ORB_EPROTO, "helper protocol: %s: length field %u but datagram of %zu bytes",
                        orb_hp_type_name(type), length, len);
    size_t body_len = len - ORB_HP_HEADER_LEN;
    if (body_len < min_body || body_len > max_body)
        return orb_fail(ORB_EPROTO, "helper protocol: %s: body of %zu bytes outside %u..%u",
                        orb_hp_type_name(type), body_len, min_body, max_body);
    out->hdr.type = type;
    out->hdr.length = length;
    out->hdr.sequence = sequence;
    out->body = buf + ORB_HP_HEADER_LEN;
    out->body_len = body_len;
    return 0;
}

/* ---- encoding ---------------------------------------------------------------------------------- */

/* Start a datagram in buf[ORB_HP_MAX_MSG]; the length field is patched by msg_end(). */
static void msg_begin(struct orb_writer *w, uint8_t *buf, uint16_t type, uint32_t seq)
{
    orb_writer_init(w, buf, ORB_HP_MAX_MSG);
    orb_writer_u32(w, ORB_HP_MAGIC);
    orb_writer_u16(w, ORB_HP_VERSION);
    orb_writer_u16(w, type);
    orb_writer_u32(w, 0); /* length: patched below */
    orb_writer_u32(w, seq);
}

static int msg_end(struct orb_writer *w, uint16_t type, size_t *len_out)
{
    /* Unreachable with the static size checks above; kept so that a future field fails closed. */
    if (w->failed)
        return orb_fail(ORB_EINVAL, "helper protocol: %s does not fit %u bytes", orb_hp_type_name(type),
                        ORB_HP_MAX_MSG);
    struct orb_writer len_w;
    orb_writer_init(&len_w, w->buf + 8, 4);
    orb_writer_u32(&len_w, (uint32_t)w->pos);
    *len_out = w->pos;
    return 0;
}

static void put_str(struct orb_writer *w, const char *s, size_t len)
{
    orb_writer_u16(w, (uint16_t)len);
    orb_writer_bytes(w, s, len);
}

static void put_i32(struct orb_writer *w, int32_t v)
{
    orb_writer_u32(w, (uint32_t)v);
}

/* Arguments every encoder needs. */
static int enc_args(const uint8_t *buf, const size_t *len_out, uint16_t type)
{
    if (buf == NULL || len_out == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: encode %s: NULL buffer", orb_hp_type_name(type));
    return 0;
}

static int enc_bad(uint16_t type, const char *what)
{
    return orb_fail(ORB_EINVAL, "helper protocol: encode %s: %s", orb_hp_type_name(type), what);
}

/* ---- decoding ---------------------------------------------------------------------------------- */

static int dec_bad(const struct orb_hp_msg *m, const char *what)
{
    return orb_fail(ORB_EPROTO, "helper protocol: %s: %s", orb_hp_type_name(m->hdr.type), what);
}

/* Check the message is `type` and open a cursor on its body. */
static int dec_begin(const struct orb_hp_msg *m, uint16_t type, struct orb_cursor *c)
{
    if (m == NULL || (m->body == NULL && m->body_len != 0))
        return orb_fail(ORB_EINVAL, "helper protocol: decode %s: NULL message", orb_hp_type_name(type));
    if (m->hdr.type != type)
        return orb_fail(ORB_EPROTO, "helper protocol: expected %s, got %s (%u)", orb_hp_type_name(type),
                        orb_hp_type_name(m->hdr.type), m->hdr.type);
    orb_cursor_init(c, m->body, m->body_len);
    return 0;
}

static int dec_finish(const struct orb_hp_msg *m, const struct orb_cursor *c)
{
    if (c->failed)
        return dec_bad(m, "truncated or malformed body");
    if (c->pos != c->len)
        return dec_bad(m, "trailing bytes");
    return 0;
}

/* Read a reply's status. *more is set when the status is 0 and the body continues; a failure
 * status must be the whole body. */
static int dec_status(const struct orb_hp_msg *m, struct orb_cursor *c, int32_t *status, bool *more)
{
    int32_t s = (int32_t)orb_cursor_u32(c);
    if (c->failed)
        return dec_bad(m, "truncated status");
    if (!status_valid(s))
        return dec_bad(m, "status out of range");
    if (s != 0) {
        int rc = dec_finish(m, c);
        if (rc != 0)
            return rc;
    }
    *status = s;
    *more = s == 0;
    return 0;
}

/* Read a u16-length string of at most `max` bytes into out[max + 1], NUL-terminated. A NUL
 * byte inside is malformed: it would silently shorten the string that the rules then check. */
static bool get_str(struct orb_cursor *c, size_t max, char *out, size_t *len_out)
{
    uint16_t len = orb_cursor_u16(c);
    if (c->failed || len > max) {
        c->failed = 1;
        return false;
    }
    const uint8_t *p = orb_cursor_bytes(c, len);
    if (p == NULL)
        return false;
    if (len != 0 && memchr(p, '\0', len) != NULL) {
        c->failed = 1;
        return false;
    }
    if (len != 0)
        memcpy(out, p, len);
    out[len] = '\0';
    *len_out = len;
    return true;
}

/* ---- inventory item rules (shared by encoders and decoders) ----------------------------------- */

static const char *path_problem(const struct orb_pci_path *p)
{
    if (p->depth > ORB_TOPO_PCI_DEPTH)
        return "PCI path too deep";
    for (uint8_t i = 0; i < p->depth; i++) {
        size_t len = field_len(p->hops[i], sizeof p->hops[i]);
        if (i == 0 ? !pci_root_valid(p->hops[i], len) : !pci_bus_id_valid(p->hops[i], len))
            return "bad PCI path hop";
    }
    return NULL;
}

static const char *pci_problem(const char *pci)
{
    size_t len = field_len(pci, ORB_TOPO_PCI_MAX);
    if (len != 0 && !pci_bus_id_valid(pci, len))
        return "bad PCI bus id";
    return len < ORB_TOPO_PCI_MAX ? NULL : "unterminated PCI bus id";
}

static bool numa_node_valid(int32_t node)
{
    return node == ORB_TOPO_NUMA_UNKNOWN || (node >= 0 && node <= HP_NUMA_ID_MAX);
}

static const char *gid_problem(const struct orb_topo_gid *g)
{
    static const uint8_t zero[sizeof g->raw];
    if (memcmp(g->raw, zero, sizeof zero) == 0)
        return "all-zero GID";
    if (g->type > ORB_GID_ROCE_V2)
        return "bad GID type";
    if (g->is_ipv4 > 1)
        return "bad GID is_ipv4 flag";
    return NULL;
}

static const char *port_problem(const struct orb_topo_port *p)
{
    if (p->num == 0)
        return "port number 0";
    if (p->state > ORB_PORT_ACTIVE_DEFER)
        return "bad port state";
    if (p->link_layer > ORB_LINK_ETHERNET)
        return "bad link layer";
    if (p->ngids > ORB_TOPO_MAX_GIDS)
        return "too many GIDs";
    for (uint8_t i = 0; i < p->ngids; i++) {
        const char *why = gid_problem(&p->gids[i]);
        if (why)
            return why;
    }
    return NULL;
}

static const char *nic_problem(const struct orb_topo_nic *n)
{
    if (n->id >= ORB_TOPO_MAX_NICS)
        return "NIC id out of range";
    if (n->usable > 1)
        return "bad usable flag";
    if (n->nports > ORB_TOPO_MAX_PORTS)
        return "too many ports";
    size_t len = field_len(n->name, sizeof n->name);
    /* An unusable slot may have lost its name (the device's name itself was invalid). */
    if (len == sizeof n->name || (len == 0 && n->usable) || (len != 0 && !orb_hp_name_valid(n->name, len)))
        return "bad NIC name";
    const char *why = pci_problem(n->pci);
    if (why)
        return why;
    if (!numa_node_valid(n->numa_node))
        return "NUMA node out of range";
    if ((why = path_problem(&n->path)) != NULL)
        return why;
    for (uint8_t i = 0; i < n->nports; i++)
        if ((why = port_problem(&n->ports[i])) != NULL)
            return why;
    return NULL;
}

static const char *gpu_problem(const struct orb_topo_gpu *g)
{
    if (g->ordinal >= ORB_TOPO_MAX_GPUS)
        return "GPU ordinal out of range";
    const char *why = pci_problem(g->pci);
    if (why)
        return why;
    if (!numa_node_valid(g->numa_node))
        return "NUMA node out of range";
    return path_problem(&g->path);
}

static const char *numa_problem(const struct orb_topo_numa *n)
{
    if (n->id < 0 || n->id > HP_NUMA_ID_MAX)
        return "NUMA node id out of range";
    if (n->ndistances > ORB_TOPO_MAX_NUMA)
        return "too many NUMA distances";
    return NULL;
}

/* ---- inventory item encoding -------------------------------------------------------------------
 * Only the first nports ports, ngids GIDs and depth hops are sent: entries past the counts are not
 * part of the model, and skipping them is what keeps every item within one datagram. */

static void put_path(struct orb_writer *w, const struct orb_pci_path *p)
{
    orb_writer_u8(w, p->depth);
    for (uint8_t i = 0; i < p->depth; i++)
        put_str(w, p->hops[i], field_len(p->hops[i], sizeof p->hops[i]));
}

static void put_nic(struct orb_writer *w, const struct orb_topo_nic *n)
{
    orb_writer_u8(w, n->id);
    orb_writer_u8(w, n->usable);
    put_str(w, n->name, field_len(n->name, sizeof n->name));
    orb_writer_u64(w, n->node_guid);
    put_str(w, n->pci, field_len(n->pci, sizeof n->pci));
    put_i32(w, n->numa_node);
    put_path(w, &n->path);
    orb_writer_u8(w, n->nports);
    for (uint8_t i = 0; i < n->nports; i++) {
        const struct orb_topo_port *p = &n->ports[i];
        orb_writer_u8(w, p->num);
        orb_writer_u8(w, p->state);
        orb_writer_u8(w, p->link_layer);
        orb_writer_u8(w, p->ngids);
        orb_writer_u32(w, p->rate_mbps);
        for (uint8_t j = 0; j < p->ngids; j++) {
            const struct orb_topo_gid *g = &p->gids[j];
            orb_writer_bytes(w, g->raw, sizeof g->raw);
            orb_writer_u16(w, g->index);
            orb_writer_u8(w, g->type);
            orb_writer_u8(w, g->is_ipv4);
        }
    }
}

static void put_gpu(struct orb_writer *w, const struct orb_topo_gpu *g)
{
    orb_writer_u32(w, g->ordinal);
    put_str(w, g->pci, field_len(g->pci, sizeof g->pci));
    put_i32(w, g->numa_node);
    put_path(w, &g->path);
}

static void put_numa(struct orb_writer *w, const struct orb_topo_numa *n)
{
    put_i32(w, n->id);
    orb_writer_u8(w, n->ndistances);
    orb_writer_bytes(w, n->distance, n->ndistances);
}

/* ---- inventory item decoding: counts are bounded before any entry is read --------------------- */

static void get_path(struct orb_cursor *c, struct orb_pci_path *p)
{
    p->depth = orb_cursor_u8(c);
    if (p->depth > ORB_TOPO_PCI_DEPTH) {
        c->failed = 1;
        return;
    }
    for (uint8_t i = 0; i < p->depth && !c->failed; i++) {
        size_t len;
        (void)get_str(c, HP_PCI_MAX, p->hops[i], &len);
    }
}

static void get_nic(struct orb_cursor *c, struct orb_topo_nic *n)
{
    size_t len;
    n->id = orb_cursor_u8(c);
    n->usable = orb_cursor_u8(c);
    if (!get_str(c, HP_INV_NAME_MAX, n->name, &len))
        return;
    n->node_guid = orb_cursor_u64(c);
    if (!get_str(c, HP_PCI_MAX, n->pci, &len))
        return;
    n->numa_node = (int32_t)orb_cursor_u32(c);
    get_path(c, &n->path);
    n->nports = orb_cursor_u8(c);
    if (c->failed || n->nports > ORB_TOPO_MAX_PORTS) {
        c->failed = 1;
        return;
    }
    for (uint8_t i = 0; i < n->nports && !c->failed; i++) {
        struct orb_topo_port *p = &n->ports[i];
        p->num = orb_cursor_u8(c);
        p->state = orb_cursor_u8(c);
        p->link_layer = orb_cursor_u8(c);
        p->ngids = orb_cursor_u8(c);
        p->rate_mbps = orb_cursor_u32(c);
        if (c->failed || p->ngids > ORB_TOPO_MAX_GIDS) {
            c->failed = 1;
            return;
        }
        for (uint8_t j = 0; j < p->ngids && !c->failed; j++) {
            struct orb_topo_gid *g = &p->gids[j];
            const uint8_t *raw = orb_cursor_bytes(c, sizeof g->raw);
            if (raw == NULL)
                return;
            memcpy(g->raw, raw, sizeof g->raw);
            g->index = orb_cursor_u16(c);
            g->type = orb_cursor_u8(c);
            g->is_ipv4 = orb_cursor_u8(c);
        }
    }
}

static void get_gpu(struct orb_cursor *c, struct orb_topo_gpu *g)
{
    size_t len;
    g->ordinal = orb_cursor_u32(c);
    if (!get_str(c, HP_PCI_MAX, g->pci, &len))
        return;
    g->numa_node = (int32_t)orb_cursor_u32(c);
    get_path(c, &g->path);
}

static void get_numa(struct orb_cursor *c, struct orb_topo_numa *n)
{
    n->id = (int32_t)orb_cursor_u32(c);
    n->ndistances = orb_cursor_u8(c);
    if (c->failed || n->ndistances > ORB_TOPO_MAX_NUMA) {
        c->failed = 1;
        return;
    }
    const uint8_t *d = orb_cursor_bytes(c, n->ndistances);
    if (d != NULL && n->ndistances != 0)
        memcpy(n->distance, d, n->ndistances);
}

/* ---- HELLO ------------------------------------------------------------------------------------- */

int orb_hp_encode_hello(uint32_t seq, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_HELLO);
    if (rc != 0)
        return rc;
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_HELLO, seq);
    orb_writer_u32(&w, ORB_HP_VERSION);
    return msg_end(&w, ORB_HP_HELLO, len_out);
}

int orb_hp_decode_hello(const struct orb_hp_msg *m, uint32_t *version)
{
    if (version == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode HELLO: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_HELLO, &c);
    if (rc != 0)
        return rc;
    uint32_t v = orb_cursor_u32(&c);
    if ((rc = dec_finish(m, &c)) != 0)
        return rc;
    if (v != ORB_HP_VERSION) /* exact match: no version is compatible with another */
        return dec_bad(m, "protocol version mismatch");
    *version = v;
    return 0;
}

int orb_hp_encode_hello_reply(uint32_t seq, int32_t status, uint32_t uid, uint32_t gid, uint32_t caps_kept,
                              uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_HELLO_REPLY);
    if (rc != 0)
        return rc;
    if (!status_valid(status))
        return enc_bad(ORB_HP_HELLO_REPLY, "status out of range");
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_HELLO_REPLY, seq);
    put_i32(&w, status);
    if (status == 0) {
        orb_writer_u32(&w, ORB_HP_VERSION);
        orb_writer_u32(&w, uid);
        orb_writer_u32(&w, gid);
        orb_writer_u32(&w, caps_kept);
    }
    return msg_end(&w, ORB_HP_HELLO_REPLY, len_out);
}

int orb_hp_decode_hello_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *version, uint32_t *uid,
                              uint32_t *gid, uint32_t *caps_kept)
{
    if (!status || !version || !uid || !gid || !caps_kept)
        return orb_fail(ORB_EINVAL, "helper protocol: decode HELLO_REPLY: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_HELLO_REPLY, &c);
    if (rc != 0)
        return rc;
    int32_t st = 0;
    bool more = false;
    if ((rc = dec_status(m, &c, &st, &more)) != 0)
        return rc;
    uint32_t v = 0, u = 0, g = 0, caps = 0;
    if (more) {
        v = orb_cursor_u32(&c);
        u = orb_cursor_u32(&c);
        g = orb_cursor_u32(&c);
        caps = orb_cursor_u32(&c);
        if ((rc = dec_finish(m, &c)) != 0)
            return rc;
        if (v != ORB_HP_VERSION)
            return dec_bad(m, "protocol version mismatch");
    }
    *status = st;
    *version = v;
    *uid = u;
    *gid = g;
    *caps_kept = caps;
    return 0;
}

/* ---- INVENTORY --------------------------------------------------------------------------------- */

static bool inv_kind_valid(uint32_t kind)
{
    return kind <= ORB_HP_INV_NUMA;
}

/* Items of each kind the model holds: indexes and totals are bounded by it. */
static uint32_t inv_kind_max(uint8_t kind)
{
    switch (kind) {
    case ORB_HP_INV_NIC: return ORB_TOPO_MAX_NICS;
    case ORB_HP_INV_GPU: return ORB_TOPO_MAX_GPUS;
    default: return ORB_TOPO_MAX_NUMA;
    }
}

int orb_hp_encode_inventory(uint32_t seq, uint8_t kind, uint32_t index, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_INVENTORY);
    if (rc != 0)
        return rc;
    if (!inv_kind_valid(kind))
        return enc_bad(ORB_HP_INVENTORY, "unknown item kind");
    if (index >= inv_kind_max(kind))
        return enc_bad(ORB_HP_INVENTORY, "index out of range");
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_INVENTORY, seq);
    orb_writer_u8(&w, kind);
    orb_writer_u8(&w, 0);
    orb_writer_u8(&w, 0);
    orb_writer_u8(&w, 0);
    orb_writer_u32(&w, index);
    return msg_end(&w, ORB_HP_INVENTORY, len_out);
}

int orb_hp_decode_inventory(const struct orb_hp_msg *m, uint8_t *kind, uint32_t *index)
{
    if (kind == NULL || index == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode INVENTORY: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_INVENTORY, &c);
    if (rc != 0)
        return rc;
    uint8_t k = orb_cursor_u8(&c);
    uint8_t pad0 = orb_cursor_u8(&c), pad1 = orb_cursor_u8(&c), pad2 = orb_cursor_u8(&c);
    uint32_t i = orb_cursor_u32(&c);
    if ((rc = dec_finish(m, &c)) != 0)
        return rc;
    if (!inv_kind_valid(k))
        return dec_bad(m, "unknown item kind");
    if (pad0 != 0 || pad1 != 0 || pad2 != 0)
        return dec_bad(m, "non-zero padding");
    if (i >= inv_kind_max(k))
        return dec_bad(m, "index out of range");
    *kind = k;
    *index = i;
    return 0;
}

int orb_hp_encode_inventory_reply(uint32_t seq, int32_t status, uint32_t total, uint8_t kind,
                                  const struct orb_topo_nic *nic, const struct orb_topo_gpu *gpu,
                                  const struct orb_topo_numa *numa, uint8_t *buf, size_t *len_out)
{
    const uint16_t type = ORB_HP_INVENTORY_REPLY;
    int rc = enc_args(buf, len_out, type);
    if (rc != 0)
        return rc;
    if (!status_valid(status))
        return enc_bad(type, "status out of range");
    if (!inv_kind_valid(kind))
        return enc_bad(type, "unknown item kind");
    if (status == 0) {
        if (total == 0 || total > inv_kind_max(kind))
            return enc_bad(type, "total out of range");
        const char *why = NULL;
        switch (kind) {
        case ORB_HP_INV_NIC: why = nic ? nic_problem(nic) : "NULL NIC"; break;
        case ORB_HP_INV_GPU: why = gpu ? gpu_problem(gpu) : "NULL GPU"; break;
        default: why = numa ? numa_problem(numa) : "NULL NUMA node"; break;
        }
        if (why)
            return enc_bad(type, why);
    }
    struct orb_writer w;
    msg_begin(&w, buf, type, seq);
    put_i32(&w, status);
    if (status == 0) {
        orb_writer_u32(&w, total);
        switch (kind) {
        case ORB_HP_INV_NIC: put_nic(&w, nic); break;
        case ORB_HP_INV_GPU: put_gpu(&w, gpu); break;
        default: put_numa(&w, numa); break;
        }
    }
    return msg_end(&w, type, len_out);
}

int orb_hp_decode_inventory_reply(const struct orb_hp_msg *m, uint8_t kind, int32_t *status, uint32_t *total,
                                  struct orb_topo_nic *nic, struct orb_topo_gpu *gpu,
                                  struct orb_topo_numa *numa)
{
    if (status == NULL || total == NULL || !inv_kind_valid(kind) ||
        (kind == ORB_HP_INV_NIC && nic == NULL) || (kind == ORB_HP_INV_GPU && gpu == NULL) ||
        (kind == ORB_HP_INV_NUMA && numa == NULL))
        return orb_fail(ORB_EINVAL, "helper protocol: decode INVENTORY_REPLY: bad kind or NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_INVENTORY_REPLY, &c);
    if (rc != 0)
        return rc;
    int32_t st = 0;
    bool more = false;
    if ((rc = dec_status(m, &c, &st, &more)) != 0)
        return rc;
    /* Decoded into zeroed locals, so that fields past the counts are zero and nothing is written
     * on failure. */
    union {
        struct orb_topo_nic nic;
        struct orb_topo_gpu gpu;
        struct orb_topo_numa numa;
    } item;
    memset(&item, 0, sizeof item);
    uint32_t t = 0;
    if (more) {
        t = orb_cursor_u32(&c);
        const char *why;
        switch (kind) {
        case ORB_HP_INV_NIC: get_nic(&c, &item.nic); break;
        case ORB_HP_INV_GPU: get_gpu(&c, &item.gpu); break;
        default: get_numa(&c, &item.numa); break;
        }
        if ((rc = dec_finish(m, &c)) != 0)
            return rc;
        if (t == 0 || t > inv_kind_max(kind))
            return dec_bad(m, "total out of range");
        switch (kind) {
        case ORB_HP_INV_NIC: why = nic_problem(&item.nic); break;
        case ORB_HP_INV_GPU: why = gpu_problem(&item.gpu); break;
        default: why = numa_problem(&item.numa); break;
        }
        if (why)
            return dec_bad(m, why);
    }
    *status = st;
    *total = t;
    switch (kind) {
    case ORB_HP_INV_NIC: *nic = item.nic; break;
    case ORB_HP_INV_GPU: *gpu = item.gpu; break;
    default: *numa = item.numa; break;
    }
    return 0;
}

/* ---- empty requests and status-only replies ---------------------------------------------------- */

static bool empty_request(uint16_t type)
{
    return type == ORB_HP_POLICY || type == ORB_HP_PEERMEM_PROBE;
}

int orb_hp_encode_empty(uint16_t type, uint32_t seq, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, type);
    if (rc != 0)
        return rc;
    if (!empty_request(type))
        return enc_bad(type, "not a request with an empty body");
    struct orb_writer w;
    msg_begin(&w, buf, type, seq);
    return msg_end(&w, type, len_out);
}

int orb_hp_decode_empty(const struct orb_hp_msg *m)
{
    if (m == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode: NULL message");
    if (!empty_request(m->hdr.type))
        return dec_bad(m, "not a request with an empty body");
    if (m->body_len != 0)
        return dec_bad(m, "trailing bytes");
    return 0;
}

/* A bare status is a whole reply of any type when it reports a failure; DEVX_REPLY is the one
 * reply whose success is a bare status too. */
int orb_hp_encode_status(uint16_t type, uint32_t seq, int32_t status, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, type);
    if (rc != 0)
        return rc;
    if (type < ORB_HP_HELLO_REPLY || type > ORB_HP_TYPE_MAX || type % 2 == 0)
        return enc_bad(type, "not a reply type");
    if (!status_valid(status))
        return enc_bad(type, "status out of range");
    if (status == 0 && type != ORB_HP_DEVX_REPLY)
        return enc_bad(type, "success needs the reply's own encoder");
    struct orb_writer w;
    msg_begin(&w, buf, type, seq);
    put_i32(&w, status);
    return msg_end(&w, type, len_out);
}

int orb_hp_decode_status(const struct orb_hp_msg *m, int32_t *status)
{
    if (m == NULL || status == NULL || (m->body == NULL && m->body_len != 0))
        return orb_fail(ORB_EINVAL, "helper protocol: decode status: NULL argument");
    uint16_t type = m->hdr.type;
    if (type < ORB_HP_HELLO_REPLY || type > ORB_HP_TYPE_MAX || type % 2 == 0)
        return dec_bad(m, "not a reply");
    struct orb_cursor c;
    orb_cursor_init(&c, m->body, m->body_len);
    int32_t st = (int32_t)orb_cursor_u32(&c);
    int rc = dec_finish(m, &c);
    if (rc != 0)
        return rc;
    if (!status_valid(st))
        return dec_bad(m, "status out of range");
    if (st == 0 && type != ORB_HP_DEVX_REPLY)
        return dec_bad(m, "success without the reply's body");
    *status = st;
    return 0;
}

/* ---- POLICY_REPLY ------------------------------------------------------------------------------ */

static const char *policy_problem(const struct orb_hp_policy *p)
{
    if (p->transports & ~(uint32_t)(ORB_HP_T_TCP | ORB_HP_T_RDMA | ORB_HP_T_NVLINK))
        return "unknown transport bits";
    if (p->gpudirect_routes & ~(uint32_t)(ORB_HP_R_DMABUF | ORB_HP_R_PEERMEM))
        return "unknown GPUDirect route bits";
    if (p->nslots > ORB_HP_MAX_SLOTS)
        return "too many slot names";
    for (uint32_t i = 0; i < p->nslots; i++) {
        size_t len = field_len(p->slots[i], sizeof p->slots[i]);
        if (!orb_hp_name_valid(p->slots[i], len))
            return "bad slot name";
    }
    return NULL;
}

int orb_hp_encode_policy_reply(uint32_t seq, int32_t status, const struct orb_hp_policy *p, uint8_t *buf,
                               size_t *len_out)
{
    const uint16_t type = ORB_HP_POLICY_REPLY;
    int rc = enc_args(buf, len_out, type);
    if (rc != 0)
        return rc;
    if (!status_valid(status))
        return enc_bad(type, "status out of range");
    if (status == 0) {
        const char *why = p ? policy_problem(p) : "NULL policy";
        if (why)
            return enc_bad(type, why);
    }
    struct orb_writer w;
    msg_begin(&w, buf, type, seq);
    put_i32(&w, status);
    if (status == 0) {
        orb_writer_u64(&w, p->nic_mask);
        orb_writer_u64(&w, p->gpu_mask);
        orb_writer_u32(&w, p->transports);
        orb_writer_u32(&w, p->gpudirect_routes);
        orb_writer_u64(&w, p->max_registered_bytes);
        orb_writer_u32(&w, p->max_endpoints);
        orb_writer_u32(&w, p->max_grants);
        orb_writer_u32(&w, p->nslots);
        for (uint32_t i = 0; i < p->nslots; i++)
            put_str(&w, p->slots[i], field_len(p->slots[i], sizeof p->slots[i]));
    }
    return msg_end(&w, type, len_out);
}

int orb_hp_decode_policy_reply(const struct orb_hp_msg *m, int32_t *status, struct orb_hp_policy *p)
{
    if (status == NULL || p == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode POLICY_REPLY: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_POLICY_REPLY, &c);
    if (rc != 0)
        return rc;
    int32_t st = 0;
    bool more = false;
    if ((rc = dec_status(m, &c, &st, &more)) != 0)
        return rc;
    struct orb_hp_policy v;
    memset(&v, 0, sizeof v);
    if (more) {
        v.nic_mask = orb_cursor_u64(&c);
        v.gpu_mask = orb_cursor_u64(&c);
        v.transports = orb_cursor_u32(&c);
        v.gpudirect_routes = orb_cursor_u32(&c);
        v.max_registered_bytes = orb_cursor_u64(&c);
        v.max_endpoints = orb_cursor_u32(&c);
        v.max_grants = orb_cursor_u32(&c);
        v.nslots = orb_cursor_u32(&c);
        if (!c.failed && v.nslots > ORB_HP_MAX_SLOTS)
            return dec_bad(m, "too many slot names");
        for (uint32_t i = 0; i < v.nslots && !c.failed; i++) {
            size_t len;
            (void)get_str(&c, ORB_HP_NAME_MAX, v.slots[i], &len);
        }
        if ((rc = dec_finish(m, &c)) != 0)
            return rc;
        const char *why = policy_problem(&v);
        if (why)
            return dec_bad(m, why);
    }
    *status = st;
    *p = v;
    return 0;
}

/* ---- OPEN_DEVICE and the fd-carrying replies --------------------------------------------------- */

/* Length of a caller's name argument when valid, else 0. */
static size_t arg_name_len(const char *name)
{
    if (name == NULL)
        return 0;
    size_t len = strnlen(name, ORB_HP_NAME_MAX + 1);
    return orb_hp_name_valid(name, len) ? len : 0;
}

int orb_hp_encode_open_device(uint32_t seq, const char *nic, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_OPEN_DEVICE);
    if (rc != 0)
        return rc;
    size_t len = arg_name_len(nic);
    if (len == 0)
        return enc_bad(ORB_HP_OPEN_DEVICE, "bad NIC name");
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_OPEN_DEVICE, seq);
    put_str(&w, nic, len);
    return msg_end(&w, ORB_HP_OPEN_DEVICE, len_out);
}

int orb_hp_decode_open_device(const struct orb_hp_msg *m, char nic[ORB_HP_NAME_MAX + 1])
{
    if (nic == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode OPEN_DEVICE: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_OPEN_DEVICE, &c);
    if (rc != 0)
        return rc;
    char name[ORB_HP_NAME_MAX + 1];
    size_t len = 0;
    (void)get_str(&c, ORB_HP_NAME_MAX, name, &len);
    if ((rc = dec_finish(m, &c)) != 0)
        return rc;
    if (!orb_hp_name_valid(name, len))
        return dec_bad(m, "bad NIC name");
    memcpy(nic, name, len + 1);
    return 0;
}

static bool fd_reply_type(uint16_t type)
{
    return type == ORB_HP_OPEN_DEVICE_REPLY || type == ORB_HP_SLOT_REPLY;
}

int orb_hp_encode_fd_reply(uint16_t type, uint32_t seq, int32_t status, uint32_t nfds, uint8_t *buf,
                           size_t *len_out)
{
    int rc = enc_args(buf, len_out, type);
    if (rc != 0)
        return rc;
    if (!fd_reply_type(type))
        return enc_bad(type, "not a reply that carries descriptors");
    if (!status_valid(status))
        return enc_bad(type, "status out of range");
    if (status == 0 ? (nfds == 0 || nfds > ORB_HP_MAX_FDS) : nfds != 0)
        return enc_bad(type, "descriptor count out of range");
    struct orb_writer w;
    msg_begin(&w, buf, type, seq);
    put_i32(&w, status);
    if (status == 0)
        orb_writer_u32(&w, nfds);
    return msg_end(&w, type, len_out);
}

int orb_hp_decode_fd_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *nfds)
{
    if (m == NULL || status == NULL || nfds == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode fd reply: NULL argument");
    if (!fd_reply_type(m->hdr.type))
        return dec_bad(m, "not a reply that carries descriptors");
    struct orb_cursor c;
    int rc = dec_begin(m, m->hdr.type, &c);
    if (rc != 0)
        return rc;
    int32_t st = 0;
    bool more = false;
    if ((rc = dec_status(m, &c, &st, &more)) != 0)
        return rc;
    uint32_t n = 0;
    if (more) {
        n = orb_cursor_u32(&c);
        if ((rc = dec_finish(m, &c)) != 0)
            return rc;
        if (n == 0 || n > ORB_HP_MAX_FDS)
            return dec_bad(m, "descriptor count out of range");
    }
    *status = st;
    *nfds = n;
    return 0;
}

/* ---- PEERMEM ----------------------------------------------------------------------------------- */

#define HP_PEERMEM_FOUND_MASK 0x7u /* NCCL's three candidate version files */

int orb_hp_encode_peermem_reply(uint32_t seq, int32_t status, uint32_t found, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_PEERMEM_REPLY);
    if (rc != 0)
        return rc;
    if (!status_valid(status))
        return enc_bad(ORB_HP_PEERMEM_REPLY, "status out of range");
    if (status == 0 && (found & ~HP_PEERMEM_FOUND_MASK) != 0)
        return enc_bad(ORB_HP_PEERMEM_REPLY, "unknown candidate bits");
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_PEERMEM_REPLY, seq);
    put_i32(&w, status);
    if (status == 0)
        orb_writer_u32(&w, found);
    return msg_end(&w, ORB_HP_PEERMEM_REPLY, len_out);
}

int orb_hp_decode_peermem_reply(const struct orb_hp_msg *m, int32_t *status, uint32_t *found)
{
    if (status == NULL || found == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode PEERMEM_REPLY: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_PEERMEM_REPLY, &c);
    if (rc != 0)
        return rc;
    int32_t st = 0;
    bool more = false;
    if ((rc = dec_status(m, &c, &st, &more)) != 0)
        return rc;
    uint32_t f = 0;
    if (more) {
        f = orb_cursor_u32(&c);
        if ((rc = dec_finish(m, &c)) != 0)
            return rc;
        if ((f & ~HP_PEERMEM_FOUND_MASK) != 0)
            return dec_bad(m, "unknown candidate bits");
    }
    *status = st;
    *found = f;
    return 0;
}

/* ---- SLOT_ATTACH ------------------------------------------------------------------------------- */

int orb_hp_encode_slot_attach(uint32_t seq, const char *slot, uint64_t interval_ns, uint8_t *buf,
                              size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_SLOT_ATTACH);
    if (rc != 0)
        return rc;
    size_t len = arg_name_len(slot);
    if (len == 0)
        return enc_bad(ORB_HP_SLOT_ATTACH, "bad slot name");
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_SLOT_ATTACH, seq);
    put_str(&w, slot, len);
    orb_writer_u64(&w, interval_ns);
    return msg_end(&w, ORB_HP_SLOT_ATTACH, len_out);
}

int orb_hp_decode_slot_attach(const struct orb_hp_msg *m, char slot[ORB_HP_NAME_MAX + 1],
                              uint64_t *interval_ns)
{
    if (slot == NULL || interval_ns == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode SLOT_ATTACH: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_SLOT_ATTACH, &c);
    if (rc != 0)
        return rc;
    char name[ORB_HP_NAME_MAX + 1];
    size_t len = 0;
    (void)get_str(&c, ORB_HP_NAME_MAX, name, &len);
    uint64_t interval = orb_cursor_u64(&c);
    if ((rc = dec_finish(m, &c)) != 0)
        return rc;
    if (!orb_hp_name_valid(name, len))
        return dec_bad(m, "bad slot name");
    memcpy(slot, name, len + 1);
    *interval_ns = interval;
    return 0;
}

/* ---- DEVX_VERIFY ------------------------------------------------------------------------------- */

#define HP_QPN_MAX 0xFFFFFFu /* QP numbers are 24 bits */

static const char *devx_problem(const struct orb_hp_devx_verify *v)
{
    size_t len = field_len(v->nic, sizeof v->nic);
    if (!orb_hp_name_valid(v->nic, len))
        return "bad NIC name";
    if (v->qpn > HP_QPN_MAX)
        return "QP number out of range";
    if (v->length == 0 || v->addr + v->length < v->addr)
        return "empty or wrapping range";
    if (v->access != 1 && v->access != 2)
        return "access must be READ (1) or WRITE (2)";
    return NULL;
}

int orb_hp_encode_devx_verify(uint32_t seq, const struct orb_hp_devx_verify *v, uint8_t *buf, size_t *len_out)
{
    int rc = enc_args(buf, len_out, ORB_HP_DEVX_VERIFY);
    if (rc != 0)
        return rc;
    const char *why = v ? devx_problem(v) : "NULL request";
    if (why)
        return enc_bad(ORB_HP_DEVX_VERIFY, why);
    struct orb_writer w;
    msg_begin(&w, buf, ORB_HP_DEVX_VERIFY, seq);
    put_str(&w, v->nic, field_len(v->nic, sizeof v->nic));
    orb_writer_u32(&w, v->obj_handle);
    orb_writer_u32(&w, v->key);
    orb_writer_u32(&w, v->qpn);
    orb_writer_u64(&w, v->addr);
    orb_writer_u64(&w, v->length);
    orb_writer_u32(&w, v->access);
    return msg_end(&w, ORB_HP_DEVX_VERIFY, len_out);
}

int orb_hp_decode_devx_verify(const struct orb_hp_msg *m, struct orb_hp_devx_verify *v)
{
    if (v == NULL)
        return orb_fail(ORB_EINVAL, "helper protocol: decode DEVX_VERIFY: NULL output");
    struct orb_cursor c;
    int rc = dec_begin(m, ORB_HP_DEVX_VERIFY, &c);
    if (rc != 0)
        return rc;
    struct orb_hp_devx_verify d;
    memset(&d, 0, sizeof d);
    size_t len = 0;
    (void)get_str(&c, ORB_HP_NAME_MAX, d.nic, &len);
    d.obj_handle = orb_cursor_u32(&c);
    d.key = orb_cursor_u32(&c);
    d.qpn = orb_cursor_u32(&c);
    d.addr = orb_cursor_u64(&c);
    d.length = orb_cursor_u64(&c);
    d.access = orb_cursor_u32(&c);
    if ((rc = dec_finish(m, &c)) != 0)
        return rc;
    const char *why = devx_problem(&d);
    if (why)
        return dec_bad(m, why);
    *v = d;
    return 0;
}

/* ---- datagram I/O ------------------------------------------------------------------------------ */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int send_datagram(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds, int timeout_ms)
{
    if (sock < 0 || buf == NULL || len < ORB_HP_HEADER_LEN || len > ORB_HP_MAX_MSG)
        return orb_fail(ORB_EINVAL, "helper protocol: send: bad socket or datagram of %zu bytes", len);
    if (nfds > ORB_HP_MAX_FDS || (nfds != 0 && fds == NULL))
        return orb_fail(ORB_EINVAL, "helper protocol: send: %zu descriptors (at most %u)", nfds,
                        ORB_HP_MAX_FDS);
    for (size_t i = 0; i < nfds; i++)
        if (fds[i] < 0)
            return orb_fail(ORB_EINVAL, "helper protocol: send: negative descriptor");

    struct iovec iov = {.iov_base = (void *)(uintptr_t)buf, .iov_len = len};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * ORB_HP_MAX_FDS)];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (nfds != 0) {
        msg.msg_control = control.bytes;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    ssize_t n;
    uint64_t deadline = timeout_ms >= 0 ? mono_ms() + (uint64_t)timeout_ms : 0;
    for (;;) {
        /* A closed peer is ORB_EPEER, never SIGPIPE. */
        n = sendmsg(sock, &msg, MSG_NOSIGNAL | (timeout_ms >= 0 ? MSG_DONTWAIT : 0));
        if (n >= 0)
            break;
        if (errno == EINTR)
            continue;
        if (timeout_ms < 0 || (errno != EAGAIN && errno != EWOULDBLOCK))
            break;
        uint64_t now = mono_ms();
        if (now >= deadline)
            return orb_fail(ORB_ETIMEDOUT, "helper protocol: the peer took no datagram for %d ms", timeout_ms);
        struct pollfd p = {.fd = sock, .events = POLLOUT, .revents = 0};
        if (poll(&p, 1, (int)(deadline - now)) < 0 && errno != EINTR)
            return orb_fail(ORB_EUNAVAILABLE, "helper protocol: poll: %s", strerror(errno));
    }
    if (n < 0) {
        int err = errno;
        return orb_fail(orb_status_from_errno(err), "helper protocol: sendmsg: %s", strerror(err));
    }
    if ((size_t)n != len)
        return orb_fail(ORB_EPROTO, "helper protocol: sent %zd of %zu bytes", n, len);
    return 0;
}

int orb_hp_send(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds)
{
    return send_datagram(sock, buf, len, fds, nfds, -1);
}

int orb_hp_send_deadline(int sock, const uint8_t *buf, size_t len, const int *fds, size_t nfds, int timeout_ms)
{
    if (timeout_ms < 0)
        return orb_fail(ORB_EINVAL, "helper protocol: send: negative deadline");
    return send_datagram(sock, buf, len, fds, nfds, timeout_ms);
}

/* Collect every descriptor of a received message's SCM_RIGHTS into got[HP_RECV_FD_ROOM]; returns
 * false when any other control message is present. Descriptors that do not fit are closed. */
static bool collect_fds(struct msghdr *msg, int *got, size_t *ngot, size_t *nseen)
{
    bool clean = true;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(msg); cm != NULL; cm = CMSG_NXTHDR(msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) {
            clean = false;
            continue;
        }
        size_t count = cm->cmsg_len >= CMSG_LEN(0) ? (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int) : 0;
        const unsigned char *data = CMSG_DATA(cm);
        for (size_t i = 0; i < count; i++) {
            int fd;
            memcpy(&fd, data + i * sizeof(int), sizeof fd);
            (*nseen)++;
            if (*ngot < HP_RECV_FD_ROOM)
                got[(*ngot)++] = fd;
            else
                (void)close(fd);
        }
    }
    return clean;
}

int orb_hp_recv(int sock, uint8_t *buf, size_t *len_out, int *fds, size_t max_fds, size_t *nfds_out,
                int timeout_ms)
{
    if (sock < 0 || buf == NULL || len_out == NULL || nfds_out == NULL || timeout_ms < -1)
        return orb_fail(ORB_EINVAL, "helper protocol: recv: bad argument");
    if (max_fds > ORB_HP_MAX_FDS || (max_fds != 0 && fds == NULL))
        return orb_fail(ORB_EINVAL, "helper protocol: recv: room for %zu descriptors (at most %u)", max_fds,
                        ORB_HP_MAX_FDS);
    uint64_t deadline =
        timeout_ms < 0 ? ORB_DEADLINE_NONE : orb_deadline_after((uint64_t)timeout_ms * 1000000u);
    for (;;) {
        struct pollfd pfd = {.fd = sock, .events = POLLIN, .revents = 0};
        int ready = poll(&pfd, 1, orb_deadline_poll_ms(deadline));
        if (ready < 0) {
            int err = errno;
            if (err == EINTR)
                continue; /* the deadline is absolute: retrying does not extend it */
            return orb_fail(orb_status_from_errno(err), "helper protocol: poll: %s", strerror(err));
        }
        if (ready == 0)
            return orb_fail(ORB_ETIMEDOUT, "helper protocol: no message within %d ms", timeout_ms);
        if (pfd.revents & POLLNVAL)
            return orb_fail(ORB_EINVAL, "helper protocol: recv: descriptor %d is not open", sock);

        struct iovec iov = {.iov_base = buf, .iov_len = ORB_HP_MAX_MSG};
        union {
            struct cmsghdr align;
            char bytes[CMSG_SPACE(sizeof(int) * HP_RECV_FD_ROOM) + CMSG_SPACE(sizeof(struct ucred))];
        } control;
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.bytes;
        msg.msg_controllen = sizeof control.bytes;
        /* MSG_DONTWAIT: another reader may have taken the datagram poll announced. */
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0) {
            int err = errno;
            if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK)
                continue;
            return orb_fail(orb_status_from_errno(err), "helper protocol: recvmsg: %s", strerror(err));
        }

        int got[HP_RECV_FD_ROOM];
        size_t ngot = 0, nseen = 0;
        bool clean = collect_fds(&msg, got, &ngot, &nseen);
        int rc = 0;
        if (msg.msg_flags & MSG_CTRUNC)
            rc = orb_fail(ORB_EPROTO, "helper protocol: control data truncated (too many descriptors)");
        else if (msg.msg_flags & MSG_TRUNC)
            rc = orb_fail(ORB_EPROTO, "helper protocol: datagram larger than %u bytes", ORB_HP_MAX_MSG);
        else if (!clean)
            rc = orb_fail(ORB_EPROTO, "helper protocol: unexpected control message");
        else if (nseen > max_fds)
            rc = orb_fail(ORB_EPROTO, "helper protocol: %zu descriptors received, at most %zu allowed", nseen,
                          max_fds);
        else if (n == 0)
            rc = orb_fail(ORB_EPEER, "helper protocol: the peer closed the socket");
        if (rc != 0) {
            orb_hp_close_fds(got, ngot);
            return rc;
        }
        if (ngot != 0)
            memcpy(fds, got, ngot * sizeof got[0]);
        *nfds_out = ngot;
        *len_out = (size_t)n;
        return 0;
    }
}
