/* Helper protocol: name rule, header parsing, golden byte vectors for every message type, every
 * malformed case (truncation at every length, trailing bytes, bad names, out-of-range fields),
 * encoder refusals, the largest messages, a deterministic mutation run, and datagram I/O over a
 * real socketpair (descriptor passing, truncation, extra descriptors, EOF, timeouts, EINTR). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "common/helper_proto.h"
#include "core/error.h"
#include "hp_check.h"

/* ---- golden datagrams: written out by hand from the tables in docs/helper-protocol.md -------- */

/* magic "HBRO" | version 1 | type | length | sequence (all little-endian) */
#define HDR(type, len0, len1, s0, s1, s2, s3)                                                        \
    0x48, 0x42, 0x52, 0x4f, 0x01, 0x00, (type), 0x00, (len0), (len1), 0x00, 0x00, (s0), (s1), (s2), (s3)

static const uint8_t golden_hello[] = {
    HDR(0x02, 0x14, 0x00, 0x01, 0x00, 0x00, 0x00),
    0x01, 0x00, 0x00, 0x00, /* version 1 */
};

static const uint8_t golden_hello_reply[] = {
    HDR(0x03, 0x24, 0x00, 0x01, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00, /* status 0 */
    0x01, 0x00, 0x00, 0x00, /* version 1 */
    0xe8, 0x03, 0x00, 0x00, /* uid 1000 */
    0xe9, 0x03, 0x00, 0x00, /* gid 1001 */
    0x00, 0x20, 0x00, 0x00, /* caps_kept: bit 13 (CAP_NET_RAW) */
};

static const uint8_t golden_hello_reply_fail[] = {
    HDR(0x03, 0x14, 0x00, 0x01, 0x00, 0x00, 0x00),
    0xfc, 0xff, 0xff, 0xff, /* status -4 (ORB_EPERM), nothing after it */
};

static const uint8_t golden_inventory[] = {
    HDR(0x04, 0x18, 0x00, 0x02, 0x00, 0x00, 0x00),
    0x01, 0x00, 0x00, 0x00, /* kind GPU, pad */
    0x03, 0x00, 0x00, 0x00, /* index 3 */
};

static const uint8_t golden_inv_nic[] = {
    HDR(0x05, 0x74, 0x00, 0x03, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00,                         /* status 0 */
    0x02, 0x00, 0x00, 0x00,                         /* total 2 */
    0x01,                                           /* id 1 */
    0x01,                                           /* usable */
    0x06, 0x00, 'm', 'l', 'x', '5', '_', '1',       /* name */
    0xcc, 0xbb, 0xaa, 0x00, 0x03, 0xa1, 0x42, 0x0c, /* node_guid 0x0c42a10300aabbcc */
    0x0c, 0x00, '0', '0', '0', '0', ':', '3', 'b', ':', '0', '0', '.', '0', /* pci */
    0x00, 0x00, 0x00, 0x00,                         /* numa_node 0 */
    0x02,                                           /* path depth 2 */
    0x0a, 0x00, 'p', 'c', 'i', '0', '0', '0', '0', ':', '3', 'a',
    0x0c, 0x00, '0', '0', '0', '0', ':', '3', 'b', ':', '0', '0', '.', '0',
    0x01,                                           /* nports 1 */
    0x01, 0x04, 0x02, 0x01,                         /* port 1, ACTIVE, ETHERNET, 1 GID */
    0xa0, 0x86, 0x01, 0x00,                         /* rate 100000 Mb/s */
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0xff, 0x0a, 0x00, 0x00, 0x01,
    0x03, 0x00,                                     /* GID index 3 */
    0x02,                                           /* RoCE v2 */
    0x01,                                           /* IPv4-mapped */
};

static const uint8_t golden_inv_gpu[] = {
    HDR(0x05, 0x2f, 0x00, 0x04, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00, /* status 0 */
    0x01, 0x00, 0x00, 0x00, /* total 1 */
    0x00, 0x00, 0x00, 0x00, /* ordinal 0 */
    0x0c, 0x00, '0', '0', '0', '0', ':', '1', 'a', ':', '0', '0', '.', '0',
    0x01, 0x00, 0x00, 0x00, /* numa_node 1 */
    0x00,                   /* path unknown */
};

static const uint8_t golden_inv_numa[] = {
    HDR(0x05, 0x1f, 0x00, 0x05, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00, /* status 0 */
    0x02, 0x00, 0x00, 0x00, /* total 2 */
    0x01, 0x00, 0x00, 0x00, /* node 1 */
    0x02, 0x15, 0x0a,       /* 2 distances: 21, 10 */
};

static const uint8_t golden_inv_fail[] = {
    HDR(0x05, 0x14, 0x00, 0x06, 0x00, 0x00, 0x00),
    0xfb, 0xff, 0xff, 0xff, /* status -5 (ORB_ENOENT) */
};

static const uint8_t golden_policy[] = {
    HDR(0x06, 0x10, 0x00, 0x07, 0x00, 0x00, 0x00),
};

static const uint8_t golden_policy_reply[] = {
    HDR(0x07, 0x4e, 0x00, 0x07, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00,                         /* status 0 */
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* nic_mask */
    0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* gpu_mask */
    0x03, 0x00, 0x00, 0x00,                         /* transports TCP | RDMA */
    0x01, 0x00, 0x00, 0x00,                         /* routes DMABUF */
    0x00, 0x00, 0x00, 0x40, 0x00, 0x00, 0x00, 0x00, /* max_registered_bytes 1 GiB */
    0x10, 0x00, 0x00, 0x00,                         /* max_endpoints 16 */
    0x00, 0x01, 0x00, 0x00,                         /* max_grants 256 */
    0x02, 0x00, 0x00, 0x00,                         /* nslots 2 */
    0x02, 0x00, 'k', 'v',
    0x08, 0x00, 'r', 'a', 'n', 'k', '.', '0', '-', 'a',
};

static const uint8_t golden_open_device[] = {
    HDR(0x08, 0x18, 0x00, 0x08, 0x00, 0x00, 0x00),
    0x06, 0x00, 'm', 'l', 'x', '5', '_', '0',
};

static const uint8_t golden_open_device_reply[] = {
    HDR(0x09, 0x18, 0x00, 0x08, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00, /* status 0 */
    0x01, 0x00, 0x00, 0x00, /* one descriptor */
};

static const uint8_t golden_open_device_reply_fail[] = {
    HDR(0x09, 0x14, 0x00, 0x08, 0x00, 0x00, 0x00),
    0xfc, 0xff, 0xff, 0xff, /* ORB_EPERM, no descriptor */
};

static const uint8_t golden_peermem_probe[] = {
    HDR(0x0a, 0x10, 0x00, 0x09, 0x00, 0x00, 0x00),
};

static const uint8_t golden_peermem_reply[] = {
    HDR(0x0b, 0x18, 0x00, 0x09, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00, /* status 0 */
    0x05, 0x00, 0x00, 0x00, /* candidates 0 and 2 found */
};

static const uint8_t golden_slot_attach[] = {
    HDR(0x0c, 0x1c, 0x00, 0x0a, 0x00, 0x00, 0x00),
    0x02, 0x00, 'k', 'v',
    0x40, 0x42, 0x0f, 0x00, 0x00, 0x00, 0x00, 0x00, /* interval 1 ms */
};

static const uint8_t golden_slot_reply[] = {
    HDR(0x0d, 0x18, 0x00, 0x0a, 0x00, 0x00, 0x00),
    0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x00, 0x00,
};

static const uint8_t golden_devx_verify[] = {
    HDR(0x0e, 0x38, 0x00, 0x04, 0x03, 0x02, 0x01), /* sequence 0x01020304 */
    0x06, 0x00, 'm', 'l', 'x', '5', '_', '0',
    0x45, 0x23, 0x01, 0x00,                         /* obj_handle 0x12345 */
    0xcd, 0xab, 0x34, 0x12,                         /* key 0x1234abcd */
    0x01, 0x01, 0x00, 0x00,                         /* qpn 0x101 */
    0x00, 0x10, 0x00, 0x00, 0x00, 0x7f, 0x00, 0x00, /* addr 0x7f0000001000 */
    0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, /* length 0x10000 */
    0x01, 0x00, 0x00, 0x00,                         /* READ */
};

static const uint8_t golden_devx_reply[] = {
    HDR(0x0f, 0x14, 0x00, 0x04, 0x03, 0x02, 0x01),
    0x00, 0x00, 0x00, 0x00,
};

static const uint8_t golden_devx_reply_unavailable[] = {
    HDR(0x0f, 0x14, 0x00, 0x04, 0x03, 0x02, 0x01),
    0xfd, 0xff, 0xff, 0xff, /* ORB_EUNAVAILABLE */
};

/* ---- the values the golden datagrams hold -------------------------------------------------------- */

static void golden_nic(struct orb_topo_nic *n)
{
    memset(n, 0, sizeof *n);
    n->id = 1;
    n->usable = 1;
    n->nports = 1;
    strcpy(n->name, "mlx5_1");
    n->node_guid = 0x0c42a10300aabbccull;
    strcpy(n->pci, "0000:3b:00.0");
    n->numa_node = 0;
    n->path.depth = 2;
    strcpy(n->path.hops[0], "pci0000:3a");
    strcpy(n->path.hops[1], "0000:3b:00.0");
    n->ports[0].num = 1;
    n->ports[0].state = ORB_PORT_ACTIVE;
    n->ports[0].link_layer = ORB_LINK_ETHERNET;
    n->ports[0].ngids = 1;
    n->ports[0].rate_mbps = 100000;
    static const uint8_t gid[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1};
    memcpy(n->ports[0].gids[0].raw, gid, sizeof gid);
    n->ports[0].gids[0].index = 3;
    n->ports[0].gids[0].type = ORB_GID_ROCE_V2;
    n->ports[0].gids[0].is_ipv4 = 1;
}

static void golden_gpu(struct orb_topo_gpu *g)
{
    memset(g, 0, sizeof *g);
    g->ordinal = 0;
    strcpy(g->pci, "0000:1a:00.0");
    g->numa_node = 1;
}

static void golden_numa(struct orb_topo_numa *n)
{
    memset(n, 0, sizeof *n);
    n->id = 1;
    n->ndistances = 2;
    n->distance[0] = 21;
    n->distance[1] = 10;
}

static void golden_policy_value(struct orb_hp_policy *p)
{
    memset(p, 0, sizeof *p);
    p->nic_mask = 5;
    p->gpu_mask = 3;
    p->transports = ORB_HP_T_TCP | ORB_HP_T_RDMA;
    p->gpudirect_routes = ORB_HP_R_DMABUF;
    p->max_registered_bytes = 1ull << 30;
    p->max_endpoints = 16;
    p->max_grants = 256;
    p->nslots = 2;
    strcpy(p->slots[0], "kv");
    strcpy(p->slots[1], "rank.0-a");
}

static void golden_devx(struct orb_hp_devx_verify *v)
{
    memset(v, 0, sizeof *v);
    strcpy(v->nic, "mlx5_0");
    v->obj_handle = 0x12345;
    v->key = 0x1234abcd;
    v->qpn = 0x101;
    v->addr = 0x7f0000001000ull;
    v->length = 0x10000;
    v->access = 1;
}

/* ---- the golden table: each datagram with the encoder call that must produce it ---------------- */

static int enc_hello(uint8_t *b, size_t *n)
{
    return orb_hp_encode_hello(1, b, n);
}
static int enc_hello_reply(uint8_t *b, size_t *n)
{
    return orb_hp_encode_hello_reply(1, 0, 1000, 1001, 1u << 13, b, n);
}
static int enc_hello_reply_fail(uint8_t *b, size_t *n)
{
    return orb_hp_encode_hello_reply(1, ORB_EPERM, 7, 7, 7, b, n);
}
static int enc_inventory(uint8_t *b, size_t *n)
{
    return orb_hp_encode_inventory(2, ORB_HP_INV_GPU, 3, b, n);
}
static int enc_inv_nic(uint8_t *b, size_t *n)
{
    struct orb_topo_nic nic;
    golden_nic(&nic);
    return orb_hp_encode_inventory_reply(3, 0, 2, ORB_HP_INV_NIC, &nic, NULL, NULL, b, n);
}
static int enc_inv_gpu(uint8_t *b, size_t *n)
{
    struct orb_topo_gpu gpu;
    golden_gpu(&gpu);
    return orb_hp_encode_inventory_reply(4, 0, 1, ORB_HP_INV_GPU, NULL, &gpu, NULL, b, n);
}
static int enc_inv_numa(uint8_t *b, size_t *n)
{
    struct orb_topo_numa numa;
    golden_numa(&numa);
    return orb_hp_encode_inventory_reply(5, 0, 2, ORB_HP_INV_NUMA, NULL, NULL, &numa, b, n);
}
static int enc_inv_fail(uint8_t *b, size_t *n)
{
    return orb_hp_encode_inventory_reply(6, ORB_ENOENT, 0, ORB_HP_INV_NIC, NULL, NULL, NULL, b, n);
}
static int enc_policy(uint8_t *b, size_t *n)
{
    return orb_hp_encode_empty(ORB_HP_POLICY, 7, b, n);
}
static int enc_policy_reply(uint8_t *b, size_t *n)
{
    struct orb_hp_policy p;
    golden_policy_value(&p);
    return orb_hp_encode_policy_reply(7, 0, &p, b, n);
}
static int enc_open_device(uint8_t *b, size_t *n)
{
    return orb_hp_encode_open_device(8, "mlx5_0", b, n);
}
static int enc_open_device_reply(uint8_t *b, size_t *n)
{
    return orb_hp_encode_fd_reply(ORB_HP_OPEN_DEVICE_REPLY, 8, 0, 1, b, n);
}
static int enc_open_device_reply_fail(uint8_t *b, size_t *n)
{
    return orb_hp_encode_fd_reply(ORB_HP_OPEN_DEVICE_REPLY, 8, ORB_EPERM, 0, b, n);
}
static int enc_peermem_probe(uint8_t *b, size_t *n)
{
    return orb_hp_encode_empty(ORB_HP_PEERMEM_PROBE, 9, b, n);
}
static int enc_peermem_reply(uint8_t *b, size_t *n)
{
    return orb_hp_encode_peermem_reply(9, 0, 5, b, n);
}
static int enc_slot_attach(uint8_t *b, size_t *n)
{
    return orb_hp_encode_slot_attach(10, "kv", 1000000, b, n);
}
static int enc_slot_reply(uint8_t *b, size_t *n)
{
    return orb_hp_encode_fd_reply(ORB_HP_SLOT_REPLY, 10, 0, 1, b, n);
}
static int enc_devx_verify(uint8_t *b, size_t *n)
{
    struct orb_hp_devx_verify v;
    golden_devx(&v);
    return orb_hp_encode_devx_verify(0x01020304, &v, b, n);
}
static int enc_devx_reply(uint8_t *b, size_t *n)
{
    return orb_hp_encode_status(ORB_HP_DEVX_REPLY, 0x01020304, 0, b, n);
}
static int enc_devx_reply_unavailable(uint8_t *b, size_t *n)
{
    return orb_hp_encode_status(ORB_HP_DEVX_REPLY, 0x01020304, ORB_EUNAVAILABLE, b, n);
}

struct golden {
    const char *name;
    const uint8_t *bytes;
    size_t len;
    int (*encode)(uint8_t *buf, size_t *len);
};

#define G(n) {#n, golden_##n, sizeof golden_##n, enc_##n}
static const struct golden goldens[] = {
    G(hello),          G(hello_reply),     G(hello_reply_fail),       G(inventory),
    G(inv_nic),        G(inv_gpu),         G(inv_numa),               G(inv_fail),
    G(policy),         G(policy_reply),    G(open_device),            G(open_device_reply),
    G(open_device_reply_fail),             G(peermem_probe),          G(peermem_reply),
    G(slot_attach),    G(slot_reply),      G(devx_verify),            G(devx_reply),
    G(devx_reply_unavailable),
};
#define NGOLDENS (sizeof goldens / sizeof goldens[0])

/* ---- helpers ------------------------------------------------------------------------------------- */

static struct orb_hp_msg parse_ok(const uint8_t *buf, size_t len)
{
    struct orb_hp_msg m;
    assert_int_equal(orb_hp_parse(buf, len, &m), 0);
    return m;
}

static void put_le32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* A datagram builder independent of the codec, for malformed bodies. */
struct builder {
    uint8_t b[2 * ORB_HP_MAX_MSG];
    size_t n;
};
static void b_u8(struct builder *b, uint8_t v)
{
    assert_true(b->n < sizeof b->b);
    b->b[b->n++] = v;
}
static void b_u16(struct builder *b, uint16_t v) { b_u8(b, (uint8_t)v); b_u8(b, (uint8_t)(v >> 8)); }
static void b_u32(struct builder *b, uint32_t v) { b_u16(b, (uint16_t)v); b_u16(b, (uint16_t)(v >> 16)); }
static void b_u64(struct builder *b, uint64_t v) { b_u32(b, (uint32_t)v); b_u32(b, (uint32_t)(v >> 32)); }
static void b_bytes(struct builder *b, const void *p, size_t n)
{
    assert_true(n <= sizeof b->b - b->n);
    memcpy(b->b + b->n, p, n);
    b->n += n;
}
static void b_str(struct builder *b, const char *s, size_t n) { b_u16(b, (uint16_t)n); b_bytes(b, s, n); }
static void b_begin(struct builder *b, uint16_t type)
{
    b->n = 0;
    b_u32(b, ORB_HP_MAGIC);
    b_u16(b, 1);
    b_u16(b, type);
    b_u32(b, 0);
    b_u32(b, 77);
}
static void b_end(struct builder *b) { put_le32(b->b + 8, (uint32_t)b->n); }

/* Parse and decode with every decoder of the datagram's own type: none may accept it. An
 * INVENTORY_REPLY carries no kind (the request named it), so the same bytes may well be a valid
 * item of another kind: with kind >= 0 only that kind must refuse it. */
static void assert_rejected_kind(const uint8_t *buf, size_t len, int kind)
{
    struct orb_hp_msg m;
    int rc = orb_hp_parse(buf, len, &m);
    if (rc != 0) {
        assert_int_equal(rc, ORB_EPROTO);
        return;
    }
    int accepted = hp_check_own_type(&m, buf, len); /* the contract, whatever the kind */
    if (kind < 0 || m.hdr.type != ORB_HP_INVENTORY_REPLY) {
        assert_int_equal(accepted, 0);
        return;
    }
    struct orb_topo_nic nic;
    struct orb_topo_gpu gpu;
    struct orb_topo_numa numa;
    int32_t st;
    uint32_t total;
    assert_int_equal(orb_hp_decode_inventory_reply(&m, (uint8_t)kind, &st, &total, &nic, &gpu, &numa),
                     ORB_EPROTO);
}

static void assert_rejected(const uint8_t *buf, size_t len)
{
    assert_rejected_kind(buf, len, -1);
}

static void assert_accepted(const uint8_t *buf, size_t len)
{
    struct orb_hp_msg m = parse_ok(buf, len);
    assert_true(hp_check_own_type(&m, buf, len) > 0);
}

static void b_rejected(struct builder *b)
{
    b_end(b);
    assert_rejected(b->b, b->n);
}

static void b_rejected_nic(struct builder *b)
{
    b_end(b);
    assert_rejected_kind(b->b, b->n, ORB_HP_INV_NIC);
}

static void b_accepted(struct builder *b)
{
    b_end(b);
    assert_accepted(b->b, b->n);
}

/* The item kind an inventory golden holds; -1 for the other messages. */
static int golden_kind(const uint8_t *golden)
{
    if (golden == golden_inv_nic)
        return ORB_HP_INV_NIC;
    if (golden == golden_inv_gpu)
        return ORB_HP_INV_GPU;
    if (golden == golden_inv_numa)
        return ORB_HP_INV_NUMA;
    return -1;
}

/* Copy a golden datagram, set one byte at `off`, and require rejection. */
static void patched_rejected(const uint8_t *golden, size_t len, size_t off, uint8_t value)
{
    uint8_t buf[ORB_HP_MAX_MSG];
    memcpy(buf, golden, len);
    assert_true(off < len);
    buf[off] = value;
    assert_rejected_kind(buf, len, golden_kind(golden));
}

/* ---- name rule ----------------------------------------------------------------------------------- */

static void test_name_rule(void **state)
{
    (void)state;
    char long_name[ORB_HP_NAME_MAX + 2];
    memset(long_name, 'a', sizeof long_name);
    assert_false(orb_hp_name_valid(NULL, 1));
    assert_false(orb_hp_name_valid("", 0));
    assert_false(orb_hp_name_valid(long_name, ORB_HP_NAME_MAX + 1));
    assert_false(orb_hp_name_valid(".", 1));
    assert_false(orb_hp_name_valid("..", 2));
    assert_false(orb_hp_name_valid("a/b", 3));
    assert_false(orb_hp_name_valid("/", 1));
    assert_false(orb_hp_name_valid("../x", 4));
    assert_false(orb_hp_name_valid("a\0b", 3));
    assert_false(orb_hp_name_valid("a b", 3));
    assert_false(orb_hp_name_valid("caf\xc3\xa9", 5));
    assert_false(orb_hp_name_valid("a\n", 2));
    assert_true(orb_hp_name_valid(long_name, ORB_HP_NAME_MAX));
    assert_true(orb_hp_name_valid("a", 1));
    assert_true(orb_hp_name_valid("...", 3));
    assert_true(orb_hp_name_valid(".hidden", 7));
    assert_true(orb_hp_name_valid("mlx5_0", 6));
    assert_true(orb_hp_name_valid("Rank-0.kv_A", 11));
}

static void test_type_names_and_limits(void **state)
{
    (void)state;
    assert_string_equal(orb_hp_type_name(ORB_HP_HELLO), "HELLO");
    assert_string_equal(orb_hp_type_name(ORB_HP_DEVX_REPLY), "DEVX_REPLY");
    assert_string_equal(orb_hp_type_name(0), "unknown");
    assert_string_equal(orb_hp_type_name(16), "unknown");
    uint32_t lo = 99, hi = 99;
    orb_hp_body_limits(1, &lo, &hi);
    assert_int_equal(lo, 0);
    assert_int_equal(hi, 0);
    orb_hp_body_limits(ORB_HP_HELLO, &lo, &hi);
    assert_int_equal(lo, 4);
    assert_int_equal(hi, 4);
    for (uint16_t t = ORB_HP_HELLO; t <= ORB_HP_TYPE_MAX; t++) {
        orb_hp_body_limits(t, &lo, &hi);
        assert_true(lo <= hi);
        assert_true(ORB_HP_HEADER_LEN + hi <= ORB_HP_MAX_MSG);
        if (t % 2 == 1)
            assert_int_equal(lo, 4); /* every reply can be a bare failure status */
    }
}

/* ---- header parsing -------------------------------------------------------------------------------- */

static void test_parse_rejects_bad_headers(void **state)
{
    (void)state;
    uint8_t buf[ORB_HP_MAX_MSG + 16];
    struct orb_hp_msg m;
    memset(&m, 0xa5, sizeof m);
    struct orb_hp_msg untouched = m;

    assert_int_equal(orb_hp_parse(NULL, 20, &m), ORB_EINVAL);
    assert_int_equal(orb_hp_parse(golden_hello, sizeof golden_hello, NULL), ORB_EINVAL);
    assert_int_equal(orb_hp_parse(NULL, 0, &m), ORB_EPROTO); /* empty datagram */

    /* Shorter than the header, at every length. */
    for (size_t len = 0; len < ORB_HP_HEADER_LEN; len++)
        assert_int_equal(orb_hp_parse(golden_hello, len, &m), ORB_EPROTO);

    /* Magic, each byte. */
    for (size_t i = 0; i < 4; i++) {
        memcpy(buf, golden_hello, sizeof golden_hello);
        buf[i] ^= 0x20;
        assert_int_equal(orb_hp_parse(buf, sizeof golden_hello, &m), ORB_EPROTO);
    }
    /* Version: 0, 2 and a high byte. */
    static const uint8_t versions[][2] = {{0, 0}, {2, 0}, {1, 1}, {0xff, 0xff}};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0]; i++) {
        memcpy(buf, golden_hello, sizeof golden_hello);
        buf[4] = versions[i][0];
        buf[5] = versions[i][1];
        assert_int_equal(orb_hp_parse(buf, sizeof golden_hello, &m), ORB_EPROTO);
    }
    /* Unknown types, whatever the body. */
    static const uint16_t bad_types[] = {0, 1, 16, 17, 0x0102, 0xffff};
    for (size_t i = 0; i < sizeof bad_types / sizeof bad_types[0]; i++) {
        memcpy(buf, golden_devx_reply, sizeof golden_devx_reply);
        buf[6] = (uint8_t)bad_types[i];
        buf[7] = (uint8_t)(bad_types[i] >> 8);
        assert_int_equal(orb_hp_parse(buf, sizeof golden_devx_reply, &m), ORB_EPROTO);
    }
    /* Length field differs from the datagram, both ways and in the high bytes. */
    static const uint32_t lengths[] = {0, 16, 19, 21, 0x00010014, 0xffffffff};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        memcpy(buf, golden_hello, sizeof golden_hello);
        put_le32(buf + 8, lengths[i]);
        assert_int_equal(orb_hp_parse(buf, sizeof golden_hello, &m), ORB_EPROTO);
    }
    /* Longer than the maximum, even with a matching length field. */
    memset(buf, 0, sizeof buf);
    memcpy(buf, golden_policy_reply, sizeof golden_policy_reply);
    put_le32(buf + 8, ORB_HP_MAX_MSG + 1);
    assert_int_equal(orb_hp_parse(buf, ORB_HP_MAX_MSG + 1, &m), ORB_EPROTO);
    /* Body outside the type's limits: HELLO with 3 and 5 body bytes, POLICY with one. */
    memcpy(buf, golden_hello, sizeof golden_hello);
    put_le32(buf + 8, 19);
    assert_int_equal(orb_hp_parse(buf, 19, &m), ORB_EPROTO);
    buf[20] = 0;
    put_le32(buf + 8, 21);
    assert_int_equal(orb_hp_parse(buf, 21, &m), ORB_EPROTO);
    memcpy(buf, golden_policy, sizeof golden_policy);
    buf[16] = 0;
    put_le32(buf + 8, 17);
    assert_int_equal(orb_hp_parse(buf, 17, &m), ORB_EPROTO);

    assert_memory_equal(&m, &untouched, sizeof m); /* never written on failure */
}

static void test_parse_splits_header_and_body(void **state)
{
    (void)state;
    struct orb_hp_msg m = parse_ok(golden_devx_verify, sizeof golden_devx_verify);
    assert_int_equal(m.hdr.type, ORB_HP_DEVX_VERIFY);
    assert_int_equal(m.hdr.length, sizeof golden_devx_verify);
    assert_int_equal(m.hdr.sequence, 0x01020304);
    assert_ptr_equal(m.body, golden_devx_verify + ORB_HP_HEADER_LEN);
    assert_int_equal(m.body_len, sizeof golden_devx_verify - ORB_HP_HEADER_LEN);
    m = parse_ok(golden_policy, sizeof golden_policy);
    assert_int_equal(m.body_len, 0);
}

/* ---- malformed bodies ------------------------------------------------------------------------------ */

static void test_truncation_at_every_length(void **state)
{
    (void)state;
    for (size_t g = 0; g < NGOLDENS; g++) {
        const struct golden *gv = &goldens[g];
        uint8_t buf[ORB_HP_MAX_MSG];
        for (size_t len = 0; len < gv->len; len++) {
            /* Cut short with the original length field: the header no longer matches. */
            struct orb_hp_msg m;
            assert_int_equal(orb_hp_parse(gv->bytes, len, &m), ORB_EPROTO);
            /* Cut short with a consistent length field: the body itself is incomplete. */
            if (len >= ORB_HP_HEADER_LEN) {
                memcpy(buf, gv->bytes, len);
                put_le32(buf + 8, (uint32_t)len);
                assert_rejected_kind(buf, len, golden_kind(gv->bytes));
            }
        }
    }
}

static void test_trailing_bytes(void **state)
{
    (void)state;
    static const uint8_t extra[] = {0x00, 0x01, 0xff};
    for (size_t g = 0; g < NGOLDENS; g++) {
        const struct golden *gv = &goldens[g];
        for (size_t e = 0; e < sizeof extra; e++) {
            for (size_t count = 1; count <= 4; count++) {
                uint8_t buf[ORB_HP_MAX_MSG];
                memcpy(buf, gv->bytes, gv->len);
                memset(buf + gv->len, extra[e], count);
                put_le32(buf + 8, (uint32_t)(gv->len + count));
                assert_rejected_kind(buf, gv->len + count, golden_kind(gv->bytes));
            }
        }
    }
}

static void test_decoders_refuse_other_types(void **state)
{
    (void)state;
    /* Each golden message is accepted by its own decoder(s) only: hp_check_own_type aborts if a
     * decoder of another type accepts it. */
    for (size_t g = 0; g < NGOLDENS; g++) {
        struct orb_hp_msg m = parse_ok(goldens[g].bytes, goldens[g].len);
        assert_true(hp_check_own_type(&m, goldens[g].bytes, goldens[g].len) > 0);
    }
    /* Direct: a HELLO given to the others. */
    struct orb_hp_msg m = parse_ok(golden_hello, sizeof golden_hello);
    int32_t st;
    uint32_t u32;
    uint8_t kind;
    char name[ORB_HP_NAME_MAX + 1];
    struct orb_hp_policy p;
    struct orb_hp_devx_verify v;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &st, &u32, &u32, &u32, &u32), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_inventory(&m, &kind, &u32), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_policy_reply(&m, &st, &p), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_open_device(&m, name), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &st, &u32), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_peermem_reply(&m, &st, &u32), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_devx_verify(&m, &v), ORB_EPROTO);
    assert_int_equal(orb_hp_decode_status(&m, &st), ORB_EPROTO); /* a request is no reply */
    assert_int_equal(orb_hp_decode_empty(&m), ORB_EPROTO);
    /* Replies with a body are not bare statuses. */
    m = parse_ok(golden_peermem_reply, sizeof golden_peermem_reply);
    assert_int_equal(orb_hp_decode_status(&m, &st), ORB_EPROTO);
    /* NULL arguments are the caller's error. */
    assert_int_equal(orb_hp_decode_hello(NULL, &u32), ORB_EINVAL);
    assert_int_equal(orb_hp_decode_hello(&m, NULL), ORB_EINVAL);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, 3, &st, &u32, NULL, NULL, NULL), ORB_EINVAL);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_GPU, &st, &u32, NULL, NULL, NULL),
                     ORB_EINVAL);
}

static void test_bad_status_values(void **state)
{
    (void)state;
    /* Positive statuses and codes below the last ORB_E* are refused in every reply. */
    static const uint32_t bad[] = {1, 0x7fffffff, (uint32_t)(ORB_EAGAIN - 1), 0x80000000u};
    static const uint16_t replies[] = {ORB_HP_HELLO_REPLY, ORB_HP_INVENTORY_REPLY, ORB_HP_POLICY_REPLY,
                                       ORB_HP_OPEN_DEVICE_REPLY, ORB_HP_PEERMEM_REPLY, ORB_HP_SLOT_REPLY,
                                       ORB_HP_DEVX_REPLY};
    struct builder b;
    for (size_t r = 0; r < sizeof replies / sizeof replies[0]; r++) {
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            b_begin(&b, replies[r]);
            b_u32(&b, bad[i]);
            b_rejected(&b);
        }
        /* The lowest code is fine as a bare failure. */
        b_begin(&b, replies[r]);
        b_u32(&b, (uint32_t)ORB_EAGAIN);
        b_accepted(&b);
        /* A failure status followed by anything is refused. */
        b_begin(&b, replies[r]);
        b_u32(&b, (uint32_t)ORB_EPERM);
        b_u32(&b, 1);
        b_rejected(&b);
    }
}

static void test_hello_versions(void **state)
{
    (void)state;
    struct builder b;
    b_begin(&b, ORB_HP_HELLO);
    b_u32(&b, 2);
    b_rejected(&b);
    b_begin(&b, ORB_HP_HELLO);
    b_u32(&b, 0);
    b_rejected(&b);
    b_begin(&b, ORB_HP_HELLO_REPLY);
    b_u32(&b, 0);
    b_u32(&b, 2); /* version */
    b_u32(&b, 1000);
    b_u32(&b, 1000);
    b_u32(&b, 0);
    b_rejected(&b);
}

static void test_inventory_request_fields(void **state)
{
    (void)state;
    size_t body = ORB_HP_HEADER_LEN;
    patched_rejected(golden_inventory, sizeof golden_inventory, body + 0, 3);    /* kind */
    patched_rejected(golden_inventory, sizeof golden_inventory, body + 0, 0xff);
    for (size_t pad = 1; pad <= 3; pad++)
        patched_rejected(golden_inventory, sizeof golden_inventory, body + pad, 1);
    patched_rejected(golden_inventory, sizeof golden_inventory, body + 4, 64);   /* index */
    patched_rejected(golden_inventory, sizeof golden_inventory, body + 7, 1);
    uint8_t buf[sizeof golden_inventory];
    memcpy(buf, golden_inventory, sizeof buf);
    buf[body + 4] = 63;
    assert_accepted(buf, sizeof buf);
}

static void test_inventory_nic_fields(void **state)
{
    (void)state;
    const uint8_t *g = golden_inv_nic;
    size_t n = sizeof golden_inv_nic;
    const size_t B = ORB_HP_HEADER_LEN; /* body offsets from the golden layout above */
    patched_rejected(g, n, B + 4, 0);     /* total 0 */
    patched_rejected(g, n, B + 4, 65);    /* total over the model's 64 */
    patched_rejected(g, n, B + 8, 64);    /* id */
    patched_rejected(g, n, B + 9, 2);     /* usable */
    patched_rejected(g, n, B + 12, '/');  /* name */
    patched_rejected(g, n, B + 13, 0);    /* NUL in the name */
    patched_rejected(g, n, B + 14, ' ');
    patched_rejected(g, n, B + 28, 'A');  /* pci: uppercase */
    patched_rejected(g, n, B + 32, '/');
    patched_rejected(g, n, B + 42, 0x01); /* numa 65536 */
    patched_rejected(g, n, B + 44, 17);   /* depth over 16 */
    patched_rejected(g, n, B + 44, 1);    /* depth 1: the second hop becomes trailing junk */
    patched_rejected(g, n, B + 47, 'P');  /* root hop must start "pci" */
    patched_rejected(g, n, B + 61, '/');  /* bus id hop */
    patched_rejected(g, n, B + 71, 5);    /* nports over 4 */
    patched_rejected(g, n, B + 71, 0);    /* nports 0: the port becomes trailing junk */
    patched_rejected(g, n, B + 72, 0);    /* port number 0 */
    patched_rejected(g, n, B + 73, 6);    /* port state */
    patched_rejected(g, n, B + 74, 3);    /* link layer */
    patched_rejected(g, n, B + 75, 17);   /* ngids over 16 */
    patched_rejected(g, n, B + 98, 3);    /* GID type */
    patched_rejected(g, n, B + 99, 2);    /* is_ipv4 */

    /* numa_node 254 is merely a large node id. */
    uint8_t buf[sizeof golden_inv_nic];
    memcpy(buf, g, n);
    buf[B + 40] = 0xfe;
    assert_accepted(buf, n);
    /* numa_node -1 (unknown) is fine, -2 is not. */
    memset(buf + B + 40, 0xff, 4);
    assert_accepted(buf, n);
    buf[B + 40] = 0xfe;
    assert_rejected_kind(buf, n, ORB_HP_INV_NIC);
    /* An all-zero GID is never sent. */
    memcpy(buf, g, n);
    memset(buf + B + 80, 0, 16);
    assert_rejected_kind(buf, n, ORB_HP_INV_NIC);
}

/* A minimal NIC reply body with a chosen name (bytes as given). */
static void b_nic(struct builder *b, uint8_t usable, const char *name, size_t len)
{
    b_begin(b, ORB_HP_INVENTORY_REPLY);
    b_u32(b, 0);
    b_u32(b, 1);
    b_u8(b, 0);
    b_u8(b, usable);
    b_str(b, name, len);
    b_u64(b, 0);
    b_str(b, "", 0);
    b_u32(b, (uint32_t)ORB_TOPO_NUMA_UNKNOWN);
    b_u8(b, 0);
    b_u8(b, 0);
}

static void test_inventory_nic_names(void **state)
{
    (void)state;
    char name[80];
    memset(name, 'n', sizeof name);
    struct builder b;
    b_nic(&b, 1, name, 63);
    b_accepted(&b);
    b_nic(&b, 1, name, 64); /* the model keeps 63 bytes + NUL */
    b_rejected_nic(&b);
    b_nic(&b, 1, name, 65);
    b_rejected_nic(&b);
    b_nic(&b, 1, "", 0);
    b_rejected_nic(&b);
    b_nic(&b, 0, "", 0); /* an unusable slot may have lost its name */
    b_accepted(&b);
    b_nic(&b, 0, "..", 2);
    b_rejected_nic(&b);
    b_nic(&b, 1, ".", 1);
    b_rejected_nic(&b);
    b_nic(&b, 1, "a/b", 3);
    b_rejected_nic(&b);
    b_nic(&b, 1, "a\0b", 3);
    b_rejected_nic(&b);
    /* A string length running past the datagram. */
    b_begin(&b, ORB_HP_INVENTORY_REPLY);
    b_u32(&b, 0);
    b_u32(&b, 1);
    b_u8(&b, 0);
    b_u8(&b, 1);
    b_u16(&b, 0xffff);
    b_bytes(&b, "mlx5_0", 6);
    b_rejected_nic(&b);
}

/* A NIC reply with `nhops` path hops, `nports` ports and `ngids` GIDs in the first port, every
 * entry present and well-formed: only the counts can be wrong. */
static void b_nic_counts(struct builder *b, uint8_t nhops, uint8_t nports, uint8_t ngids)
{
    b_begin(b, ORB_HP_INVENTORY_REPLY);
    b_u32(b, 0);
    b_u32(b, 1);
    b_u8(b, 0);
    b_u8(b, 1);
    b_str(b, "mlx5_0", 6);
    b_u64(b, 1);
    b_str(b, "0000:3b:00.0", 12);
    b_u32(b, 0);
    b_u8(b, nhops);
    for (uint8_t i = 0; i < nhops; i++)
        b_str(b, i == 0 ? "pci0000:00" : "0000:00:01.0", i == 0 ? 10 : 12);
    b_u8(b, nports);
    for (uint8_t p = 0; p < nports; p++) {
        uint8_t n = p == 0 ? ngids : 0;
        b_u8(b, (uint8_t)(p + 1));
        b_u8(b, ORB_PORT_ACTIVE);
        b_u8(b, ORB_LINK_INFINIBAND);
        b_u8(b, n);
        b_u32(b, 200000);
        for (uint8_t g = 0; g < n; g++) {
            uint8_t raw[16];
            memset(raw, 0xfe, sizeof raw);
            b_bytes(b, raw, sizeof raw);
            b_u16(b, g);
            b_u8(b, ORB_GID_IB);
            b_u8(b, 0);
        }
    }
}

static void test_inventory_counts_over_the_maxima(void **state)
{
    (void)state;
    struct builder b;
    b_nic_counts(&b, ORB_TOPO_PCI_DEPTH, ORB_TOPO_MAX_PORTS, ORB_TOPO_MAX_GIDS);
    b_accepted(&b);
    b_nic_counts(&b, ORB_TOPO_PCI_DEPTH + 1, 1, 1);
    b_rejected_nic(&b);
    b_nic_counts(&b, 2, ORB_TOPO_MAX_PORTS + 1, 1);
    b_rejected_nic(&b);
    b_nic_counts(&b, 2, 1, ORB_TOPO_MAX_GIDS + 1);
    b_rejected_nic(&b);
    /* Large counts: as many hops as the datagram limit allows, and the largest a byte can claim. */
    b_nic_counts(&b, 110, 1, 1);
    b_rejected_nic(&b);
    b_nic_counts(&b, 255, 1, 1);
    b_rejected_nic(&b);
    b_nic_counts(&b, 2, 255, 1);
    b_rejected_nic(&b);
    b_nic_counts(&b, 2, 1, 255);
    b_rejected_nic(&b);
    /* NUMA: 65 distances, all present. */
    b_begin(&b, ORB_HP_INVENTORY_REPLY);
    b_u32(&b, 0);
    b_u32(&b, 1);
    b_u32(&b, 0);
    b_u8(&b, ORB_TOPO_MAX_NUMA + 1);
    for (int i = 0; i <= ORB_TOPO_MAX_NUMA; i++)
        b_u8(&b, 10);
    b_end(&b);
    assert_rejected_kind(b.b, b.n, ORB_HP_INV_NUMA);
    b_begin(&b, ORB_HP_INVENTORY_REPLY);
    b_u32(&b, 0);
    b_u32(&b, 1);
    b_u32(&b, 0);
    b_u8(&b, 255);
    for (int i = 0; i < 255; i++)
        b_u8(&b, 10);
    b_end(&b);
    assert_rejected_kind(b.b, b.n, ORB_HP_INV_NUMA);
}

static void test_inventory_gpu_and_numa_fields(void **state)
{
    (void)state;
    const size_t B = ORB_HP_HEADER_LEN;
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 8, 64);   /* ordinal */
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 11, 0x80);
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 12, 13);  /* pci length */
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 14, 'x');
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 29, 0xff); /* numa high byte */
    patched_rejected(golden_inv_gpu, sizeof golden_inv_gpu, B + 30, 1);   /* depth 1, no hop */
    patched_rejected(golden_inv_numa, sizeof golden_inv_numa, B + 11, 0x80); /* negative id */
    patched_rejected(golden_inv_numa, sizeof golden_inv_numa, B + 10, 0x01); /* id 65537 */
    patched_rejected(golden_inv_numa, sizeof golden_inv_numa, B + 12, 3);  /* ndistances too many */
    patched_rejected(golden_inv_numa, sizeof golden_inv_numa, B + 12, 1);  /* too few */
    patched_rejected(golden_inv_numa, sizeof golden_inv_numa, B + 12, 65);

    uint8_t buf[sizeof golden_inv_numa];
    memcpy(buf, golden_inv_numa, sizeof buf);
    memset(buf + B + 8, 0xff, 4); /* -1 means "unknown" for a device, never a node's own id */
    assert_rejected_kind(buf, sizeof buf, ORB_HP_INV_NUMA);

    /* A GPU decodes as a GPU only: the same bytes as NUMA or NIC items fail. */
    struct orb_hp_msg m = parse_ok(golden_inv_gpu, sizeof golden_inv_gpu);
    int32_t st;
    uint32_t total;
    struct orb_topo_nic nic;
    struct orb_topo_numa numa;
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &st, &total, &nic, NULL, NULL),
                     ORB_EPROTO);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NUMA, &st, &total, NULL, NULL, &numa),
                     ORB_EPROTO);
}

/* POLICY_REPLY body with chosen slot names. */
static void b_policy(struct builder *b, uint32_t nslots, const char *const *names, const size_t *lens)
{
    b_begin(b, ORB_HP_POLICY_REPLY);
    b_u32(b, 0);
    b_u64(b, 1);
    b_u64(b, 1);
    b_u32(b, ORB_HP_T_TCP);
    b_u32(b, 0);
    b_u64(b, UINT64_MAX);
    b_u32(b, 1);
    b_u32(b, 1);
    b_u32(b, nslots);
    for (uint32_t i = 0; i < nslots; i++)
        b_str(b, names[i], lens[i]);
}

static void test_policy_reply_fields(void **state)
{
    (void)state;
    const size_t B = ORB_HP_HEADER_LEN;
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 20, 0x08); /* transport bit 3 */
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 23, 0x80);
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 24, 0x04); /* route bit 2 */
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 44, 3);    /* nslots vs names */
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 44, 1);
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 44, 17);
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 47, 0x80);
    patched_rejected(golden_policy_reply, sizeof golden_policy_reply, B + 51, '/');

    char long_name[80];
    memset(long_name, 's', sizeof long_name);
    struct builder b;
    const char *names[1];
    size_t lens[1];
    static const struct {
        const char *s;
        size_t len;
        int ok;
    } cases[] = {{"", 0, 0}, {".", 1, 0}, {"..", 2, 0}, {"a/b", 3, 0}, {"/", 1, 0}, {"a\0", 2, 0},
                 {"x y", 3, 0}, {"kv", 2, 1}, {"a..b", 4, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        names[0] = cases[i].s;
        lens[0] = cases[i].len;
        b_policy(&b, 1, names, lens);
        if (cases[i].ok)
            b_accepted(&b);
        else
            b_rejected(&b);
    }
    names[0] = long_name;
    lens[0] = 64;
    b_policy(&b, 1, names, lens);
    b_accepted(&b);
    lens[0] = 65;
    b_policy(&b, 1, names, lens);
    b_rejected(&b);
    b_policy(&b, 0, names, lens);
    b_accepted(&b);

    /* 17 well-formed names: one more than the model holds, refused before any is stored. */
    const char *many[ORB_HP_MAX_SLOTS + 1];
    size_t many_lens[ORB_HP_MAX_SLOTS + 1];
    for (size_t i = 0; i <= ORB_HP_MAX_SLOTS; i++) {
        many[i] = "kv";
        many_lens[i] = 2;
    }
    many[ORB_HP_MAX_SLOTS] = long_name; /* a long extra name would land past the array */
    many_lens[ORB_HP_MAX_SLOTS] = 64;
    b_policy(&b, ORB_HP_MAX_SLOTS, many, many_lens);
    b_accepted(&b);
    b_policy(&b, ORB_HP_MAX_SLOTS + 1, many, many_lens);
    b_rejected(&b);
}

static void test_name_requests(void **state)
{
    (void)state;
    char long_name[80];
    memset(long_name, 'd', sizeof long_name);
    static const struct {
        const char *s;
        size_t len;
        int ok;
    } cases[] = {{"", 0, 0}, {".", 1, 0}, {"..", 2, 0}, {"a/b", 3, 0}, {"../uverbs0", 10, 0},
                 {"mlx\0", 4, 0}, {"\xff", 1, 0}, {"mlx5_0", 6, 1}, {NULL, 64, 1}, {NULL, 65, 0}};
    struct builder b;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *s = cases[i].s ? cases[i].s : long_name;
        for (int which = 0; which < 3; which++) {
            if (which == 0) {
                b_begin(&b, ORB_HP_OPEN_DEVICE);
                b_str(&b, s, cases[i].len);
            } else if (which == 1) {
                b_begin(&b, ORB_HP_SLOT_ATTACH);
                b_str(&b, s, cases[i].len);
                b_u64(&b, 1000000);
            } else {
                b_begin(&b, ORB_HP_DEVX_VERIFY);
                b_str(&b, s, cases[i].len);
                b_u32(&b, 7);
                b_u32(&b, 1);
                b_u32(&b, 1);
                b_u64(&b, 0x1000);
                b_u64(&b, 0x1000);
                b_u32(&b, 2);
            }
            if (cases[i].ok)
                b_accepted(&b);
            else
                b_rejected(&b);
        }
    }
    /* The name length field claiming more or fewer bytes than follow. */
    uint8_t buf[sizeof golden_open_device];
    memcpy(buf, golden_open_device, sizeof buf);
    buf[ORB_HP_HEADER_LEN] = 7;
    assert_rejected(buf, sizeof buf);
    buf[ORB_HP_HEADER_LEN] = 5;
    assert_rejected(buf, sizeof buf);
    buf[ORB_HP_HEADER_LEN] = 6;
    buf[ORB_HP_HEADER_LEN + 1] = 1; /* 262 */
    assert_rejected(buf, sizeof buf);
}

static void test_fd_peermem_devx_fields(void **state)
{
    (void)state;
    const size_t B = ORB_HP_HEADER_LEN;
    /* A success must declare one descriptor, no more. */
    patched_rejected(golden_open_device_reply, sizeof golden_open_device_reply, B + 4, 0);
    patched_rejected(golden_open_device_reply, sizeof golden_open_device_reply, B + 4, 2);
    patched_rejected(golden_slot_reply, sizeof golden_slot_reply, B + 7, 0x80);
    patched_rejected(golden_peermem_reply, sizeof golden_peermem_reply, B + 4, 0x08);
    patched_rejected(golden_peermem_reply, sizeof golden_peermem_reply, B + 7, 0x01);
    /* DEVX_VERIFY: obj_handle, key, qpn, addr, length, access at body offsets 8, 12, 16, 20,
     * 28, 36. */
    patched_rejected(golden_devx_verify, sizeof golden_devx_verify, B + 19, 0x01); /* qpn over 24 bits */
    patched_rejected(golden_devx_verify, sizeof golden_devx_verify, B + 36, 0);    /* access 0 */
    patched_rejected(golden_devx_verify, sizeof golden_devx_verify, B + 36, 3);
    patched_rejected(golden_devx_verify, sizeof golden_devx_verify, B + 39, 0x01);
    uint8_t buf[sizeof golden_devx_verify];
    memcpy(buf, golden_devx_verify, sizeof buf);
    memset(buf + B + 28, 0, 8); /* empty range */
    assert_rejected(buf, sizeof buf);
    memcpy(buf, golden_devx_verify, sizeof buf);
    memset(buf + B + 20, 0xff, 8); /* addr + length wraps */
    assert_rejected(buf, sizeof buf);
    memcpy(buf, golden_devx_verify, sizeof buf);
    memset(buf + B + 20, 0, 8);
    memset(buf + B + 28, 0xff, 8); /* 0 + UINT64_MAX does not wrap */
    assert_accepted(buf, sizeof buf);
    memcpy(buf, golden_devx_verify, sizeof buf);
    memset(buf + B + 8, 0xff, 4); /* any handle value */
    buf[B + 12] = 0xff; /* any key value */
    buf[B + 18] = 0xff; /* qpn 0xff0101 */
    buf[B + 36] = 2;    /* WRITE */
    assert_accepted(buf, sizeof buf);
    /* The layout without the object handle: four bytes short of what its name length implies. */
    uint8_t old[sizeof golden_devx_verify - 4];
    memcpy(old, golden_devx_verify, B + 8);
    memcpy(old + B + 8, golden_devx_verify + B + 12, sizeof old - B - 8);
    old[8] = (uint8_t)sizeof old; /* header length field, low byte */
    assert_rejected(old, sizeof old);
}

/* ---- golden vectors -------------------------------------------------------------------------------- */

static void test_golden_encode(void **state)
{
    (void)state;
    for (size_t g = 0; g < NGOLDENS; g++) {
        uint8_t buf[ORB_HP_MAX_MSG];
        size_t len = 0;
        memset(buf, 0xee, sizeof buf);
        assert_int_equal(goldens[g].encode(buf, &len), 0);
        if (len != goldens[g].len || memcmp(buf, goldens[g].bytes, len) != 0)
            fail_msg("golden %s: encoding differs", goldens[g].name);
        assert_int_equal(buf[len], 0xee); /* nothing written past the datagram */
    }
}

static void test_golden_decode(void **state)
{
    (void)state;
    int32_t st;
    uint32_t version, uid, gid, caps, total, u32;

    struct orb_hp_msg m = parse_ok(golden_hello, sizeof golden_hello);
    assert_int_equal(m.hdr.sequence, 1);
    assert_int_equal(orb_hp_decode_hello(&m, &version), 0);
    assert_int_equal(version, ORB_HP_VERSION);

    m = parse_ok(golden_hello_reply, sizeof golden_hello_reply);
    assert_int_equal(orb_hp_decode_hello_reply(&m, &st, &version, &uid, &gid, &caps), 0);
    assert_int_equal(st, 0);
    assert_int_equal(version, 1);
    assert_int_equal(uid, 1000);
    assert_int_equal(gid, 1001);
    assert_int_equal(caps, 1u << 13);

    m = parse_ok(golden_hello_reply_fail, sizeof golden_hello_reply_fail);
    uid = gid = caps = version = 5;
    assert_int_equal(orb_hp_decode_hello_reply(&m, &st, &version, &uid, &gid, &caps), 0);
    assert_int_equal(st, ORB_EPERM);
    assert_int_equal(version | uid | gid | caps, 0); /* zeroed after a failure status */

    uint8_t kind;
    m = parse_ok(golden_inventory, sizeof golden_inventory);
    assert_int_equal(orb_hp_decode_inventory(&m, &kind, &u32), 0);
    assert_int_equal(kind, ORB_HP_INV_GPU);
    assert_int_equal(u32, 3);

    struct orb_topo_nic nic, want_nic;
    memset(&nic, 0x5a, sizeof nic);
    golden_nic(&want_nic);
    m = parse_ok(golden_inv_nic, sizeof golden_inv_nic);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &st, &total, &nic, NULL, NULL), 0);
    assert_int_equal(st, 0);
    assert_int_equal(total, 2);
    assert_int_equal(nic.id, 1);
    assert_int_equal(nic.usable, 1);
    assert_string_equal(nic.name, "mlx5_1");
    assert_int_equal(nic.node_guid, 0x0c42a10300aabbccull);
    assert_string_equal(nic.pci, "0000:3b:00.0");
    assert_int_equal(nic.numa_node, 0);
    assert_int_equal(nic.path.depth, 2);
    assert_string_equal(nic.path.hops[0], "pci0000:3a");
    assert_string_equal(nic.path.hops[1], "0000:3b:00.0");
    assert_int_equal(nic.path.hops[2][0], 0); /* past the counts: zero, not stale */
    assert_int_equal(nic.nports, 1);
    assert_int_equal(nic.ports[0].num, 1);
    assert_int_equal(nic.ports[0].state, ORB_PORT_ACTIVE);
    assert_int_equal(nic.ports[0].link_layer, ORB_LINK_ETHERNET);
    assert_int_equal(nic.ports[0].ngids, 1);
    assert_int_equal(nic.ports[0].rate_mbps, 100000);
    assert_memory_equal(nic.ports[0].gids[0].raw, want_nic.ports[0].gids[0].raw, 16);
    assert_int_equal(nic.ports[0].gids[0].index, 3);
    assert_int_equal(nic.ports[0].gids[0].type, ORB_GID_ROCE_V2);
    assert_int_equal(nic.ports[0].gids[0].is_ipv4, 1);
    assert_int_equal(nic.ports[0].gids[1].index, 0);
    assert_int_equal(nic.ports[1].num, 0);

    struct orb_topo_gpu gpu;
    m = parse_ok(golden_inv_gpu, sizeof golden_inv_gpu);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_GPU, &st, &total, NULL, &gpu, NULL), 0);
    assert_int_equal(total, 1);
    assert_int_equal(gpu.ordinal, 0);
    assert_string_equal(gpu.pci, "0000:1a:00.0");
    assert_int_equal(gpu.numa_node, 1);
    assert_int_equal(gpu.path.depth, 0);

    struct orb_topo_numa numa;
    m = parse_ok(golden_inv_numa, sizeof golden_inv_numa);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NUMA, &st, &total, NULL, NULL, &numa), 0);
    assert_int_equal(total, 2);
    assert_int_equal(numa.id, 1);
    assert_int_equal(numa.ndistances, 2);
    assert_int_equal(numa.distance[0], 21);
    assert_int_equal(numa.distance[1], 10);

    m = parse_ok(golden_inv_fail, sizeof golden_inv_fail);
    memset(&nic, 0x5a, sizeof nic);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &st, &total, &nic, NULL, NULL), 0);
    assert_int_equal(st, ORB_ENOENT);
    assert_int_equal(total, 0);
    assert_int_equal(nic.nports, 0);
    assert_int_equal(nic.name[0], 0);

    m = parse_ok(golden_policy, sizeof golden_policy);
    assert_int_equal(orb_hp_decode_empty(&m), 0);
    m = parse_ok(golden_peermem_probe, sizeof golden_peermem_probe);
    assert_int_equal(orb_hp_decode_empty(&m), 0);

    struct orb_hp_policy p;
    m = parse_ok(golden_policy_reply, sizeof golden_policy_reply);
    assert_int_equal(orb_hp_decode_policy_reply(&m, &st, &p), 0);
    assert_int_equal(st, 0);
    assert_int_equal(p.nic_mask, 5);
    assert_int_equal(p.gpu_mask, 3);
    assert_int_equal(p.transports, ORB_HP_T_TCP | ORB_HP_T_RDMA);
    assert_int_equal(p.gpudirect_routes, ORB_HP_R_DMABUF);
    assert_int_equal(p.max_registered_bytes, 1ull << 30);
    assert_int_equal(p.max_endpoints, 16);
    assert_int_equal(p.max_grants, 256);
    assert_int_equal(p.nslots, 2);
    assert_string_equal(p.slots[0], "kv");
    assert_string_equal(p.slots[1], "rank.0-a");
    assert_int_equal(p.slots[2][0], 0);

    char name[ORB_HP_NAME_MAX + 1];
    m = parse_ok(golden_open_device, sizeof golden_open_device);
    assert_int_equal(orb_hp_decode_open_device(&m, name), 0);
    assert_string_equal(name, "mlx5_0");

    m = parse_ok(golden_open_device_reply, sizeof golden_open_device_reply);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &st, &u32), 0);
    assert_int_equal(st, 0);
    assert_int_equal(u32, 1);
    m = parse_ok(golden_open_device_reply_fail, sizeof golden_open_device_reply_fail);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &st, &u32), 0);
    assert_int_equal(st, ORB_EPERM);
    assert_int_equal(u32, 0);
    assert_int_equal(orb_hp_decode_status(&m, &st), 0); /* a failure is also a bare status */
    assert_int_equal(st, ORB_EPERM);

    m = parse_ok(golden_peermem_reply, sizeof golden_peermem_reply);
    assert_int_equal(orb_hp_decode_peermem_reply(&m, &st, &u32), 0);
    assert_int_equal(u32, 5);

    uint64_t interval;
    m = parse_ok(golden_slot_attach, sizeof golden_slot_attach);
    assert_int_equal(orb_hp_decode_slot_attach(&m, name, &interval), 0);
    assert_string_equal(name, "kv");
    assert_int_equal(interval, 1000000);

    m = parse_ok(golden_slot_reply, sizeof golden_slot_reply);
    assert_int_equal(orb_hp_decode_fd_reply(&m, &st, &u32), 0);
    assert_int_equal(u32, 1);

    struct orb_hp_devx_verify v;
    m = parse_ok(golden_devx_verify, sizeof golden_devx_verify);
    assert_int_equal(m.hdr.sequence, 0x01020304);
    assert_int_equal(orb_hp_decode_devx_verify(&m, &v), 0);
    assert_string_equal(v.nic, "mlx5_0");
    assert_int_equal(v.obj_handle, 0x12345);
    assert_int_equal(v.key, 0x1234abcd);
    assert_int_equal(v.qpn, 0x101);
    assert_int_equal(v.addr, 0x7f0000001000ull);
    assert_int_equal(v.length, 0x10000);
    assert_int_equal(v.access, 1);

    m = parse_ok(golden_devx_reply, sizeof golden_devx_reply);
    st = 99;
    assert_int_equal(orb_hp_decode_status(&m, &st), 0);
    assert_int_equal(st, 0);
    m = parse_ok(golden_devx_reply_unavailable, sizeof golden_devx_reply_unavailable);
    assert_int_equal(orb_hp_decode_status(&m, &st), 0);
    assert_int_equal(st, ORB_EUNAVAILABLE);
}

/* ---- encoder refusals ------------------------------------------------------------------------------ */

static void test_encoders_refuse_bad_input(void **state)
{
    (void)state;
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 12345;
    memset(buf, 0xee, sizeof buf);

    assert_int_equal(orb_hp_encode_hello(1, NULL, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_hello(1, buf, NULL), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_hello_reply(1, 1, 0, 0, 0, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_hello_reply(1, ORB_EAGAIN - 1, 0, 0, 0, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_inventory(1, 3, 0, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_inventory(1, ORB_HP_INV_NIC, 64, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_empty(ORB_HP_HELLO, 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_empty(ORB_HP_POLICY_REPLY, 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_status(ORB_HP_HELLO, 1, ORB_EPERM, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_status(16, 1, ORB_EPERM, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_status(ORB_HP_POLICY_REPLY, 1, 0, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_status(ORB_HP_DEVX_REPLY, 1, 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_open_device(1, NULL, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_open_device(1, "", buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_open_device(1, "..", buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_open_device(1, "../uverbs0", buf, &len), ORB_EINVAL);
    char long_name[ORB_HP_NAME_MAX + 2];
    memset(long_name, 'x', sizeof long_name - 1);
    long_name[sizeof long_name - 1] = '\0';
    assert_int_equal(orb_hp_encode_open_device(1, long_name, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_slot_attach(1, "a/b", 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_fd_reply(ORB_HP_DEVX_REPLY, 1, 0, 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_fd_reply(ORB_HP_SLOT_REPLY, 1, 0, 0, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_fd_reply(ORB_HP_SLOT_REPLY, 1, 0, 2, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_fd_reply(ORB_HP_SLOT_REPLY, 1, ORB_EPERM, 1, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_peermem_reply(1, 0, 8, buf, &len), ORB_EINVAL);

    struct orb_hp_policy p;
    golden_policy_value(&p);
    p.nslots = ORB_HP_MAX_SLOTS + 1;
    assert_int_equal(orb_hp_encode_policy_reply(1, 0, &p, buf, &len), ORB_EINVAL);
    golden_policy_value(&p);
    p.transports = 8;
    assert_int_equal(orb_hp_encode_policy_reply(1, 0, &p, buf, &len), ORB_EINVAL);
    golden_policy_value(&p);
    memset(p.slots[1], 'a', sizeof p.slots[1]); /* unterminated */
    assert_int_equal(orb_hp_encode_policy_reply(1, 0, &p, buf, &len), ORB_EINVAL);
    assert_int_equal(orb_hp_encode_policy_reply(1, 0, NULL, buf, &len), ORB_EINVAL);

    struct orb_hp_devx_verify v;
    golden_devx(&v);
    v.access = 3;
    assert_int_equal(orb_hp_encode_devx_verify(1, &v, buf, &len), ORB_EINVAL);
    golden_devx(&v);
    v.length = 0;
    assert_int_equal(orb_hp_encode_devx_verify(1, &v, buf, &len), ORB_EINVAL);
    golden_devx(&v);
    v.qpn = 1u << 24;
    assert_int_equal(orb_hp_encode_devx_verify(1, &v, buf, &len), ORB_EINVAL);

    struct orb_topo_nic nic;
    golden_nic(&nic);
    nic.nports = ORB_TOPO_MAX_PORTS + 1;
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, ORB_HP_INV_NIC, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL);
    golden_nic(&nic);
    nic.ports[0].ngids = ORB_TOPO_MAX_GIDS + 1;
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, ORB_HP_INV_NIC, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL);
    golden_nic(&nic);
    memset(nic.name, 'a', sizeof nic.name); /* unterminated */
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, ORB_HP_INV_NIC, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL);
    golden_nic(&nic);
    nic.path.depth = ORB_TOPO_PCI_DEPTH + 1;
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, ORB_HP_INV_NIC, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL);
    golden_nic(&nic);
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 0, ORB_HP_INV_NIC, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL); /* total 0 */
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, ORB_HP_INV_GPU, &nic, NULL, NULL, buf, &len),
                     ORB_EINVAL); /* the GPU is missing */
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 1, 3, &nic, NULL, NULL, buf, &len), ORB_EINVAL);

    /* Nothing was written by any refused call. */
    assert_int_equal(len, 12345);
    for (size_t i = 0; i < sizeof buf; i++)
        assert_int_equal(buf[i], 0xee);
}

/* ---- the largest messages -------------------------------------------------------------------------- */

static void full_nic(struct orb_topo_nic *n)
{
    memset(n, 0, sizeof *n);
    n->id = ORB_TOPO_MAX_NICS - 1;
    n->usable = 1;
    memset(n->name, 'n', ORB_TOPO_NAME_MAX - 1);
    n->node_guid = UINT64_MAX;
    strcpy(n->pci, "fffffff:ff:1f.7"); /* 15 bytes, the most the model keeps */
    n->numa_node = 65535;
    n->path.depth = ORB_TOPO_PCI_DEPTH;
    strcpy(n->path.hops[0], "pci0000000:00:0"); /* every hop 15 bytes, the most the model keeps */
    for (size_t i = 1; i < ORB_TOPO_PCI_DEPTH; i++)
        snprintf(n->path.hops[i], sizeof n->path.hops[i], "%07x:00:1f.7", (unsigned)(i & 0xff));
    n->nports = ORB_TOPO_MAX_PORTS;
    for (uint8_t p = 0; p < ORB_TOPO_MAX_PORTS; p++) {
        struct orb_topo_port *port = &n->ports[p];
        port->num = (uint8_t)(p + 1);
        port->state = ORB_PORT_ACTIVE_DEFER;
        port->link_layer = ORB_LINK_INFINIBAND;
        port->ngids = ORB_TOPO_MAX_GIDS;
        port->rate_mbps = UINT32_MAX;
        for (uint8_t g = 0; g < ORB_TOPO_MAX_GIDS; g++) {
            memset(port->gids[g].raw, 0xfe, 16);
            port->gids[g].raw[0] = (uint8_t)(p * 16 + g);
            port->gids[g].index = (uint16_t)(UINT16_MAX - g);
            port->gids[g].type = (uint8_t)(g % 3);
            port->gids[g].is_ipv4 = (uint8_t)(g % 2);
        }
    }
}

static void test_full_nic_fits(void **state)
{
    (void)state;
    struct orb_topo_nic nic, back;
    full_nic(&nic);
    assert_int_equal(strlen(nic.pci), ORB_TOPO_PCI_MAX - 1);
    static uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_inventory_reply(9, 0, ORB_TOPO_MAX_NICS, ORB_HP_INV_NIC, &nic, NULL, NULL,
                                                   buf, &len),
                     0);
    uint32_t lo, hi;
    orb_hp_body_limits(ORB_HP_INVENTORY_REPLY, &lo, &hi);
    assert_int_equal(len, ORB_HP_HEADER_LEN + hi); /* the limit is exactly the largest NIC */
    assert_true(len <= ORB_HP_MAX_MSG);
    struct orb_hp_msg m = parse_ok(buf, len);
    int32_t st;
    uint32_t total;
    memset(&back, 0x5a, sizeof back);
    assert_int_equal(orb_hp_decode_inventory_reply(&m, ORB_HP_INV_NIC, &st, &total, &back, NULL, NULL), 0);
    assert_int_equal(total, ORB_TOPO_MAX_NICS);
    assert_string_equal(back.name, nic.name);
    assert_string_equal(back.pci, nic.pci);
    assert_int_equal(back.node_guid, UINT64_MAX);
    assert_int_equal(back.numa_node, 65535);
    for (size_t i = 0; i < ORB_TOPO_PCI_DEPTH; i++)
        assert_string_equal(back.path.hops[i], nic.path.hops[i]);
    for (uint8_t p = 0; p < ORB_TOPO_MAX_PORTS; p++) {
        assert_int_equal(back.ports[p].num, p + 1);
        assert_int_equal(back.ports[p].rate_mbps, UINT32_MAX);
        for (uint8_t g = 0; g < ORB_TOPO_MAX_GIDS; g++) {
            assert_memory_equal(back.ports[p].gids[g].raw, nic.ports[p].gids[g].raw, 16);
            assert_int_equal(back.ports[p].gids[g].index, nic.ports[p].gids[g].index);
            assert_int_equal(back.ports[p].gids[g].type, nic.ports[p].gids[g].type);
            assert_int_equal(back.ports[p].gids[g].is_ipv4, nic.ports[p].gids[g].is_ipv4);
        }
    }
    assert_true(hp_check_own_type(&m, buf, len) > 0);
    /* One more GID byte on the wire and the datagram is over the type's limit. */
    buf[len] = 0;
    put_le32(buf + 8, (uint32_t)len + 1);
    struct orb_hp_msg m2;
    assert_int_equal(orb_hp_parse(buf, len + 1, &m2), ORB_EPROTO);
}

static void test_full_policy_fits(void **state)
{
    (void)state;
    struct orb_hp_policy p, back;
    memset(&p, 0, sizeof p);
    p.nic_mask = p.gpu_mask = p.max_registered_bytes = UINT64_MAX;
    p.transports = ORB_HP_T_TCP | ORB_HP_T_RDMA | ORB_HP_T_NVLINK;
    p.gpudirect_routes = ORB_HP_R_DMABUF | ORB_HP_R_PEERMEM;
    p.max_endpoints = p.max_grants = UINT32_MAX;
    p.nslots = ORB_HP_MAX_SLOTS;
    for (size_t i = 0; i < ORB_HP_MAX_SLOTS; i++) {
        memset(p.slots[i], 'a' + (int)i, ORB_HP_NAME_MAX);
        p.slots[i][ORB_HP_NAME_MAX] = '\0';
    }
    uint8_t buf[ORB_HP_MAX_MSG];
    size_t len = 0;
    assert_int_equal(orb_hp_encode_policy_reply(3, 0, &p, buf, &len), 0);
    uint32_t lo, hi;
    orb_hp_body_limits(ORB_HP_POLICY_REPLY, &lo, &hi);
    assert_int_equal(len, ORB_HP_HEADER_LEN + hi);
    struct orb_hp_msg m = parse_ok(buf, len);
    int32_t st;
    assert_int_equal(orb_hp_decode_policy_reply(&m, &st, &back), 0);
    assert_int_equal(back.nslots, ORB_HP_MAX_SLOTS);
    for (size_t i = 0; i < ORB_HP_MAX_SLOTS; i++)
        assert_string_equal(back.slots[i], p.slots[i]);
    assert_int_equal(back.max_grants, UINT32_MAX);
}

/* ---- deterministic mutation -------------------------------------------------------------------------- */

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    /* xorshift64*: a fixed seed, so every run visits the same inputs. */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dull;
}
static size_t rng_below(size_t n)
{
    return (size_t)(rng_next() % n);
}

static void test_mutated_messages_decode_or_fail_closed(void **state)
{
    (void)state;
    enum { ITERATIONS = 1500 };
    static const uint8_t boundary[] = {0x00, 0x01, 0x02, 0x0f, 0x10, 0x3f, 0x40, 0x41, 0x7f, 0x80, 0xfe, 0xff,
                                       '.', '/', 'a', ':'};
    /* Seeds: every golden datagram and the two largest messages. */
    static uint8_t seeds[NGOLDENS + 2][ORB_HP_MAX_MSG];
    size_t seed_len[NGOLDENS + 2];
    for (size_t g = 0; g < NGOLDENS; g++) {
        memcpy(seeds[g], goldens[g].bytes, goldens[g].len);
        seed_len[g] = goldens[g].len;
    }
    struct orb_topo_nic nic;
    full_nic(&nic);
    assert_int_equal(orb_hp_encode_inventory_reply(1, 0, 64, ORB_HP_INV_NIC, &nic, NULL, NULL,
                                                   seeds[NGOLDENS], &seed_len[NGOLDENS]),
                     0);
    struct orb_hp_policy p;
    golden_policy_value(&p);
    p.nslots = ORB_HP_MAX_SLOTS;
    for (size_t i = 2; i < ORB_HP_MAX_SLOTS; i++)
        snprintf(p.slots[i], sizeof p.slots[i], "slot-%zu", i);
    assert_int_equal(orb_hp_encode_policy_reply(1, 0, &p, seeds[NGOLDENS + 1], &seed_len[NGOLDENS + 1]), 0);

    rng_state = 0x4b1d5eedull;
    size_t parsed = 0, accepted = 0;
    static uint8_t buf[ORB_HP_MAX_MSG + 64];
    for (size_t s = 0; s < NGOLDENS + 2; s++) {
        for (int it = 0; it < ITERATIONS; it++) {
            size_t len = seed_len[s];
            memcpy(buf, seeds[s], len);
            int edits = 1 + (int)rng_below(4);
            for (int e = 0; e < edits; e++) {
                switch (rng_below(6)) {
                case 0: /* flip a bit */
                    buf[rng_below(len)] ^= (uint8_t)(1u << rng_below(8));
                    break;
                case 1: { /* boundary value, mostly in the body */
                    size_t at = len > ORB_HP_HEADER_LEN && rng_below(4) != 0
                                    ? ORB_HP_HEADER_LEN + rng_below(len - ORB_HP_HEADER_LEN)
                                    : rng_below(len);
                    buf[at] = boundary[rng_below(sizeof boundary)];
                    break;
                }
                case 2: /* truncate */
                    len = rng_below(len + 1);
                    break;
                case 3: /* append */
                    if (len < sizeof buf - 8) {
                        size_t add = 1 + rng_below(8);
                        for (size_t i = 0; i < add; i++)
                            buf[len + i] = (uint8_t)rng_next();
                        len += add;
                    }
                    break;
                case 4: /* delete a byte inside */
                    if (len > 1) {
                        size_t at = rng_below(len);
                        memmove(buf + at, buf + at + 1, len - at - 1);
                        len--;
                    }
                    break;
                default: /* change the type */
                    if (len > 7)
                        buf[6] = (uint8_t)rng_below(ORB_HP_TYPE_MAX + 3);
                    break;
                }
                if (len == 0)
                    break;
            }
            /* Usually keep the header's length consistent so that the body decoders are reached. */
            if (len >= 12 && rng_below(8) != 0)
                put_le32(buf + 8, (uint32_t)len);
            struct orb_hp_msg m;
            int rc = orb_hp_parse(buf, len, &m);
            if (rc != 0) {
                assert_int_equal(rc, ORB_EPROTO);
                continue;
            }
            parsed++;
            if (hp_check_own_type(&m, buf, len) > 0)
                accepted++;
            hp_check_every_type(m.body, m.body_len, m.hdr.sequence);
        }
    }
    /* The run must reach the decoders, and some mutations (a changed sequence, GUID, mask, ...)
     * stay valid. */
    assert_true(parsed > (NGOLDENS + 2) * ITERATIONS / 4);
    assert_true(accepted > 100);
}

/* ---- datagram I/O over a real socketpair ------------------------------------------------------------- */

static int count_open_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.')
            n++;
    closedir(d);
    return n - 1; /* the directory's own descriptor */
}

static void make_pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

/* Send raw bytes with `n` descriptors, bypassing orb_hp_send's limits. */
static void raw_send(int sock, const void *data, size_t len, const int *fds, size_t n)
{
    struct iovec iov = {.iov_base = (void *)(uintptr_t)data, .iov_len = len};
    union {
        struct cmsghdr align;
        char bytes[CMSG_SPACE(sizeof(int) * 64)];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n != 0) {
        assert_true(n <= 64);
        msg.msg_control = control.bytes;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * n);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * n);
    }
    assert_int_equal(sendmsg(sock, &msg, MSG_NOSIGNAL), (ssize_t)len);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void test_io_round_trip(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    uint8_t out[ORB_HP_MAX_MSG], in[ORB_HP_MAX_MSG];
    size_t len = 0, got = 0, nfds = 99;
    assert_int_equal(orb_hp_encode_hello(42, out, &len), 0);
    assert_int_equal(orb_hp_send(sv[0], out, len, NULL, 0), 0);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 1000), 0);
    assert_int_equal(got, len);
    assert_int_equal(nfds, 0);
    struct orb_hp_msg m = parse_ok(in, got);
    assert_int_equal(m.hdr.sequence, 42);
    uint32_t version;
    assert_int_equal(orb_hp_decode_hello(&m, &version), 0);

    /* The largest datagram passes whole. */
    struct orb_topo_nic nic;
    full_nic(&nic);
    assert_int_equal(orb_hp_encode_inventory_reply(43, 0, 64, ORB_HP_INV_NIC, &nic, NULL, NULL, out, &len),
                     0);
    assert_int_equal(orb_hp_send(sv[1], out, len, NULL, 0), 0);
    assert_int_equal(orb_hp_recv(sv[0], in, &got, NULL, 0, &nfds, -1), 0);
    assert_int_equal(got, len);
    assert_memory_equal(in, out, len);
    close(sv[0]);
    close(sv[1]);
}

static void test_io_passes_a_working_cloexec_fd(void **state)
{
    (void)state;
    int sv[2], pipefd[2];
    make_pair(sv);
    assert_int_equal(pipe(pipefd), 0);
    uint8_t out[ORB_HP_MAX_MSG], in[ORB_HP_MAX_MSG];
    size_t len, got, nfds = 0;
    assert_int_equal(orb_hp_encode_fd_reply(ORB_HP_OPEN_DEVICE_REPLY, 5, 0, 1, out, &len), 0);
    assert_int_equal(orb_hp_send(sv[0], out, len, &pipefd[1], 1), 0);
    int fds[ORB_HP_MAX_FDS] = {-1};
    assert_int_equal(orb_hp_recv(sv[1], in, &got, fds, ORB_HP_MAX_FDS, &nfds, 1000), 0);
    assert_int_equal(nfds, 1);
    assert_true(fds[0] >= 0);
    assert_int_not_equal(fds[0], pipefd[1]);
    int flags = fcntl(fds[0], F_GETFD);
    assert_true(flags >= 0 && (flags & FD_CLOEXEC));
    struct orb_hp_msg m = parse_ok(in, got);
    int32_t st;
    uint32_t declared;
    assert_int_equal(orb_hp_decode_fd_reply(&m, &st, &declared), 0);
    assert_int_equal(declared, nfds);
    /* The received descriptor is the pipe's write end. */
    close(pipefd[1]);
    assert_int_equal(write(fds[0], "ok", 2), 2);
    char back[2];
    assert_int_equal(read(pipefd[0], back, 2), 2);
    assert_memory_equal(back, "ok", 2);
    orb_hp_close_fds(fds, nfds);
    assert_int_equal(fds[0], -1);
    close(pipefd[0]);
    close(sv[0]);
    close(sv[1]);
}

static void test_io_oversized_datagram_is_eproto(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    int before = count_open_fds();
    static uint8_t big[ORB_HP_MAX_MSG + 1];
    memset(big, 0x41, sizeof big);
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(devnull >= 0);
    raw_send(sv[0], big, sizeof big, &devnull, 1); /* an fd too, which must be closed */
    close(devnull);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got = 7, nfds = 7;
    int fds[1] = {-1};
    assert_int_equal(orb_hp_recv(sv[1], in, &got, fds, 1, &nfds, 1000), ORB_EPROTO);
    assert_int_equal(got, 7);
    assert_int_equal(nfds, 7);
    assert_int_equal(fds[0], -1);
    assert_int_equal(count_open_fds(), before);
    /* orb_hp_send refuses to produce one. */
    assert_int_equal(orb_hp_send(sv[0], big, sizeof big, NULL, 0), ORB_EINVAL);
    close(sv[0]);
    close(sv[1]);
}

/* Send `n` descriptors (dups of /dev/null) with a valid datagram and expect ORB_EPROTO with every
 * received descriptor closed. */
static void expect_too_many_fds(size_t n, size_t max_fds)
{
    int sv[2];
    make_pair(sv);
    int before = count_open_fds();
    int sent[64];
    assert_true(n <= 64);
    for (size_t i = 0; i < n; i++) {
        sent[i] = open("/dev/null", O_RDONLY | O_CLOEXEC);
        assert_true(sent[i] >= 0);
    }
    raw_send(sv[0], golden_slot_reply, sizeof golden_slot_reply, sent, n);
    for (size_t i = 0; i < n; i++)
        close(sent[i]);
    assert_int_equal(count_open_fds(), before);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got, nfds;
    int fds[ORB_HP_MAX_FDS] = {-1};
    assert_int_equal(orb_hp_recv(sv[1], in, &got, fds, max_fds, &nfds, 1000), ORB_EPROTO);
    /* Checked with the socket still open: the descriptors were closed by orb_hp_recv itself. */
    assert_int_equal(count_open_fds(), before);
    close(sv[0]);
    close(sv[1]);
}

static void test_io_too_many_fds_closes_them_all(void **state)
{
    (void)state;
    expect_too_many_fds(1, 0);
    expect_too_many_fds(2, 1);
    expect_too_many_fds(3, 1);
    expect_too_many_fds(12, 1); /* more than orb_hp_recv keeps: the rest closed as they are seen */
    expect_too_many_fds(40, 1); /* more than the control buffer holds: MSG_CTRUNC */
}

static void test_io_unexpected_control_message(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    int on = 1;
    assert_int_equal(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on), 0);
    int before = count_open_fds();
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    assert_true(devnull >= 0);
    raw_send(sv[0], golden_slot_reply, sizeof golden_slot_reply, &devnull, 1);
    close(devnull);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got, nfds;
    int fds[1] = {-1};
    assert_int_equal(orb_hp_recv(sv[1], in, &got, fds, 1, &nfds, 1000), ORB_EPROTO);
    assert_int_equal(count_open_fds(), before);
    /* Credentials alone are just as unexpected. */
    raw_send(sv[0], golden_hello, sizeof golden_hello, NULL, 0);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 1000), ORB_EPROTO);
    close(sv[0]);
    close(sv[1]);
}

static void test_io_eof_is_epeer(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    close(sv[0]);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got, nfds;
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 1000), ORB_EPEER);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, -1), ORB_EPEER);
    /* Sending to a closed peer is ORB_EPEER, not SIGPIPE. */
    assert_int_equal(orb_hp_send(sv[1], golden_hello, sizeof golden_hello, NULL, 0), ORB_EPEER);
    close(sv[1]);

    /* A datagram already queued is still delivered before the EOF. */
    make_pair(sv);
    assert_int_equal(orb_hp_send(sv[0], golden_hello, sizeof golden_hello, NULL, 0), 0);
    close(sv[0]);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 1000), 0);
    assert_int_equal(got, sizeof golden_hello);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 1000), ORB_EPEER);
    close(sv[1]);
}

static void test_io_timeout(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got = 3, nfds = 3;
    uint64_t t0 = now_ms();
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 60), ORB_ETIMEDOUT);
    assert_true(now_ms() - t0 >= 59);
    assert_int_equal(got, 3);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 0), ORB_ETIMEDOUT);
    close(sv[0]);
    close(sv[1]);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
    (void)sig;
    alarms++;
}

static void test_io_eintr_keeps_the_deadline(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    struct sigaction sa, old;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm; /* no SA_RESTART: poll() returns EINTR */
    sigemptyset(&sa.sa_mask);
    assert_int_equal(sigaction(SIGALRM, &sa, &old), 0);
    struct itimerval every = {.it_interval = {0, 10000}, .it_value = {0, 10000}};
    struct itimerval off = {{0, 0}, {0, 0}};
    alarms = 0;
    assert_int_equal(setitimer(ITIMER_REAL, &every, NULL), 0);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got, nfds;
    uint64_t t0 = now_ms();
    int rc = orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 150);
    uint64_t elapsed = now_ms() - t0;
    assert_int_equal(setitimer(ITIMER_REAL, &off, NULL), 0);
    assert_int_equal(sigaction(SIGALRM, &old, NULL), 0);
    assert_int_equal(rc, ORB_ETIMEDOUT);
    assert_true(alarms >= 2);
    assert_true(elapsed >= 149);
    assert_true(elapsed < 2000); /* interruptions do not restart the full timeout forever */
    close(sv[0]);
    close(sv[1]);
}

static void test_io_bad_arguments(void **state)
{
    (void)state;
    int sv[2];
    make_pair(sv);
    uint8_t in[ORB_HP_MAX_MSG];
    size_t got, nfds;
    int fds[2] = {0, 1};
    int negative = -1;
    assert_int_equal(orb_hp_send(-1, golden_hello, sizeof golden_hello, NULL, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_send(sv[0], NULL, 20, NULL, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_send(sv[0], golden_hello, ORB_HP_HEADER_LEN - 1, NULL, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_send(sv[0], golden_hello, sizeof golden_hello, fds, 2), ORB_EINVAL);
    assert_int_equal(orb_hp_send(sv[0], golden_hello, sizeof golden_hello, NULL, 1), ORB_EINVAL);
    assert_int_equal(orb_hp_send(sv[0], golden_hello, sizeof golden_hello, &negative, 1), ORB_EINVAL);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, fds, 2, &nfds, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 1, &nfds, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, -2), ORB_EINVAL);
    assert_int_equal(orb_hp_recv(sv[1], NULL, &got, NULL, 0, &nfds, 0), ORB_EINVAL);
    assert_int_equal(orb_hp_recv(-1, in, &got, NULL, 0, &nfds, 0), ORB_EINVAL);
    orb_hp_close_fds(NULL, 3); /* NULL-safe */
    close(sv[0]);
    close(sv[1]);
    /* A closed descriptor. */
    assert_int_equal(orb_hp_recv(sv[1], in, &got, NULL, 0, &nfds, 0), ORB_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_name_rule),
        cmocka_unit_test(test_type_names_and_limits),
        cmocka_unit_test(test_parse_rejects_bad_headers),
        cmocka_unit_test(test_parse_splits_header_and_body),
        cmocka_unit_test(test_truncation_at_every_length),
        cmocka_unit_test(test_trailing_bytes),
        cmocka_unit_test(test_decoders_refuse_other_types),
        cmocka_unit_test(test_bad_status_values),
        cmocka_unit_test(test_hello_versions),
        cmocka_unit_test(test_inventory_request_fields),
        cmocka_unit_test(test_inventory_nic_fields),
        cmocka_unit_test(test_inventory_nic_names),
        cmocka_unit_test(test_inventory_counts_over_the_maxima),
        cmocka_unit_test(test_inventory_gpu_and_numa_fields),
        cmocka_unit_test(test_policy_reply_fields),
        cmocka_unit_test(test_name_requests),
        cmocka_unit_test(test_fd_peermem_devx_fields),
        cmocka_unit_test(test_encoders_refuse_bad_input),
        cmocka_unit_test(test_golden_encode),
        cmocka_unit_test(test_golden_decode),
        cmocka_unit_test(test_full_nic_fits),
        cmocka_unit_test(test_full_policy_fits),
        cmocka_unit_test(test_mutated_messages_decode_or_fail_closed),
        cmocka_unit_test(test_io_bad_arguments),
        cmocka_unit_test(test_io_eof_is_epeer),
        cmocka_unit_test(test_io_timeout),
        cmocka_unit_test(test_io_eintr_keeps_the_deadline),
        cmocka_unit_test(test_io_oversized_datagram_is_eproto),
        cmocka_unit_test(test_io_too_many_fds_closes_them_all),
        cmocka_unit_test(test_io_unexpected_control_message),
        cmocka_unit_test(test_io_round_trip),
        cmocka_unit_test(test_io_passes_a_working_cloexec_fd),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
