/* The RDMA transport's messages (lib/rdma/ctrl.c): every kind round-trips field for field, the
 * fixed sizes hold (a 141-byte binding, a 32-byte ACK), and the decoders refuse what the rules
 * exclude: wrong kind or version, counts beyond the maxima, zero keys, bad ranges, trailing or
 * missing bytes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "rdma/ctrl.h"

static void test_connect_round_trip(void **state)
{
    (void)state;
    struct orb_rdma_connect m;
    memset(&m, 0, sizeof m);
    m.incarnation = 0x0102030405060708ull;
    m.nqps = 3;
    m.lanes = 3;
    for (uint32_t i = 0; i < 3; i++) {
        m.qps[i].nic = (uint8_t)(i + 2);
        m.qps[i].qp.qpn = 100 + i;
        m.qps[i].qp.psn = 0xabcdef - i;
        m.qps[i].qp.mtu = IBV_MTU_1024;
        m.qps[i].qp.lid = (uint16_t)i;
        m.qps[i].qp.read_depth = (uint8_t)(16 - 4 * i); /* the message carries the fewest: 8 */
        memset(m.qps[i].qp.gid, (int)(0x40 + i), 16);
    }
    m.qps[1].unconnected = true; /* the sender's port of it is down */
    uint8_t buf[1024];
    size_t len = 0;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 4 + 12 + 3 * 28);
    uint8_t kind = 0;
    assert_int_equal(orb_rdma_ctrl_kind(buf, len, &kind), 0);
    assert_int_equal(kind, ORB_RDMA_CONNECT);
    struct orb_rdma_connect d;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), 0);
    assert_int_equal(d.incarnation, m.incarnation);
    assert_int_equal(d.nqps, 3);
    assert_int_equal(d.lanes, 3);
    for (uint32_t i = 0; i < 3; i++) {
        assert_int_equal(d.qps[i].nic, m.qps[i].nic);
        assert_int_equal(d.qps[i].unconnected, i == 1);
        assert_int_equal(d.qps[i].qp.qpn, m.qps[i].qp.qpn);
        assert_int_equal(d.qps[i].qp.psn, m.qps[i].qp.psn);
        assert_int_equal(d.qps[i].qp.mtu, m.qps[i].qp.mtu);
        assert_int_equal(d.qps[i].qp.lid, m.qps[i].qp.lid);
        assert_int_equal(d.qps[i].qp.read_depth, 8);
        assert_memory_equal(d.qps[i].qp.gid, m.qps[i].qp.gid, 16);
    }
    /* The NIC byte's bit 7 says unconnected; bit 6 is never set. */
    assert_int_equal(buf[4 + 12 + 28], 3 | ORB_RDMA_RAIL_UNCONNECTED);
    buf[4 + 12] |= 0x40;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), ORB_EPROTO);
    buf[4 + 12] &= (uint8_t)~0x40;
    /* The byte after the lanes is reserved; the lanes divide the queue pairs. */
    buf[4 + 11] = 1;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), ORB_EPROTO);
    buf[4 + 11] = 0;
    const uint8_t bad_lanes[] = {0, 2, 4, 255};
    for (size_t i = 0; i < sizeof bad_lanes; i++) {
        buf[4 + 10] = bad_lanes[i];
        assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), ORB_EPROTO);
    }
    buf[4 + 10] = 1;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), 0);
    assert_int_equal(d.lanes, 1);
    /* A read depth of 0 (not stated) stays 0 on every rail. */
    buf[4 + 9] = 0;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), 0);
    assert_int_equal(d.qps[2].qp.read_depth, 0);
    /* The other kind, a short buffer, a trailing byte. */
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT_OK, buf, len, &d), ORB_EPROTO);
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len - 1, &d), ORB_EPROTO);
    buf[len] = 0;
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len + 1, &d), ORB_EPROTO);
    /* Encoders refuse what decoders would. */
    m.qps[1].qp.qpn = 0;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), ORB_EINVAL);
    m.qps[1].qp.qpn = 5;
    m.nqps = ORB_RDMA_MAX_RAILS + 1;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), ORB_EINVAL);
    m.nqps = 3;
    m.lanes = 2;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), ORB_EINVAL);
    m.lanes = 0;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), ORB_EINVAL);
    m.lanes = 1;
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, 20, &len), ORB_EINVAL);
    /* A different version. */
    assert_int_equal(orb_rdma_connect_encode(ORB_RDMA_CONNECT, &m, buf, sizeof buf, &len), 0);
    buf[1] = ORB_RDMA_CTRL_VERSION - 1; /* the layout before ACKs ended several grants */
    assert_int_equal(orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &d), ORB_EPROTO);
}

static void test_grant_round_trip(void **state)
{
    (void)state;
    struct orb_rdma_grant_req r;
    memset(&r, 0, sizeof r);
    r.incarnation = 5;
    r.count = 2;
    r.ask[0] = (struct orb_rdma_grant_ask){.request = 77, .op = ORB_OP_WRITE, .rail_mask = 0x5,
                                           .addr = 0x7f0000000000ull, .length = 1u << 20};
    r.ask[1] = (struct orb_rdma_grant_ask){.request = 78, .op = ORB_OP_READ, .rail_mask = 0x1, .addr = 4096,
                                           .length = 1};
    uint8_t buf[4096];
    size_t len = 0;
    assert_int_equal(orb_rdma_grant_req_encode(&r, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 4 + 12 + 2 * 32);
    struct orb_rdma_grant_req rd;
    assert_int_equal(orb_rdma_grant_req_decode(buf, len, &rd), 0);
    assert_int_equal(rd.incarnation, 5);
    assert_int_equal(rd.count, 2);
    assert_int_equal(rd.ask[0].request, 77);
    assert_int_equal(rd.ask[0].op, ORB_OP_WRITE);
    assert_int_equal(rd.ask[0].rail_mask, 0x5);
    assert_int_equal(rd.ask[0].addr, r.ask[0].addr);
    assert_int_equal(rd.ask[0].length, r.ask[0].length);
    assert_int_equal(rd.ask[1].request, 78);
    assert_int_equal(rd.ask[1].length, 1);
    /* Short by one byte, or one entry missing. */
    assert_int_equal(orb_rdma_grant_req_decode(buf, len - 1, &rd), ORB_EPROTO);
    assert_int_equal(orb_rdma_grant_req_decode(buf, len - 32, &rd), ORB_EPROTO);
    r.ask[1].length = 0;
    assert_int_equal(orb_rdma_grant_req_encode(&r, buf, sizeof buf, &len), ORB_EINVAL);
    r.ask[1].length = 2;
    r.ask[1].addr = UINT64_MAX;
    assert_int_equal(orb_rdma_grant_req_encode(&r, buf, sizeof buf, &len), ORB_EINVAL);
    r.ask[1].addr = 0;
    r.count = ORB_RDMA_GRANT_BATCH + 1;
    assert_int_equal(orb_rdma_grant_req_encode(&r, buf, sizeof buf, &len), ORB_EINVAL);
    r.count = 0;
    assert_int_equal(orb_rdma_grant_req_encode(&r, buf, sizeof buf, &len), ORB_EINVAL);

    /* A granted entry, a refusal with its cause, a refusal whose cause is cut and cleaned. */
    static struct orb_rdma_grants g, gd;
    memset(&g, 0, sizeof g);
    g.count = 3;
    g.g[0].grant = 9;
    g.g[0].generation = 2;
    for (int i = 0; i < 32; i++)
        g.g[0].nonce[i] = (uint8_t)(i * 3);
    g.g[0].target = 0x7f1234560000ull;
    g.g[0].nkeys = 2;
    g.g[0].rkeys[0] = 0x1101;
    g.g[0].rkeys[1] = 0x2202;
    g.g[1].status = ORB_EPERM;
    snprintf(g.g[1].why, sizeof g.g[1].why, "no remote WRITE here");
    g.g[2].status = ORB_EAGAIN;
    memset(g.g[2].why, 'x', ORB_RDMA_WHY_MAX);
    g.g[2].why[3] = '\n';
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 4 + 4 + (8 + 56 + 8) + (8 + 20) + (8 + ORB_RDMA_WHY_MAX));
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), 0);
    assert_int_equal(gd.count, 3);
    assert_int_equal(gd.g[0].status, 0);
    assert_int_equal(gd.g[0].grant, 9);
    assert_int_equal(gd.g[0].generation, 2);
    assert_memory_equal(gd.g[0].nonce, g.g[0].nonce, 32);
    assert_int_equal(gd.g[0].target, 0x7f1234560000ull);
    assert_int_equal(gd.g[0].nkeys, 2);
    assert_int_equal(gd.g[0].rkeys[1], 0x2202);
    assert_int_equal(gd.g[1].status, ORB_EPERM);
    assert_string_equal(gd.g[1].why, "no remote WRITE here");
    assert_int_equal(gd.g[2].status, ORB_EAGAIN);
    assert_int_equal(strlen(gd.g[2].why), ORB_RDMA_WHY_MAX);
    assert_int_equal(gd.g[2].why[3], '?');
    /* A grant is not a grant request. */
    assert_int_equal(orb_rdma_grant_req_decode(buf, len, &rd), ORB_EPROTO);
    /* A zero key is never a grant. */
    g.count = 1;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), 0);
    buf[len - 1] = buf[len - 2] = buf[len - 3] = buf[len - 4] = 0;
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), ORB_EPROTO);
    /* A status that is no ORB_E* code cannot be sent. */
    g.g[0].status = -100;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);

    /* Lost queue pairs travel with an ORB_EPEER refusal only, and in 16 bits. */
    memset(&g, 0, sizeof g);
    g.count = 1;
    g.g[0].status = ORB_EPEER;
    g.g[0].lost_qps = 0x8002;
    snprintf(g.g[0].why, sizeof g.g[0].why, "queue pair 1 is failed");
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), 0);
    assert_int_equal(gd.g[0].status, ORB_EPEER);
    assert_int_equal(gd.g[0].lost_qps, 0x8002);
    assert_string_equal(gd.g[0].why, "queue pair 1 is failed");
    buf[8] = (uint8_t)ORB_EAGAIN; /* the same bytes with another status */
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), ORB_EPROTO);
    g.g[0].lost_qps = 0x10000;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g.g[0].lost_qps = 1;
    g.g[0].status = ORB_EAGAIN;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);

    /* A staging slot travels with an ORB_ERESOURCE refusal only, 2^12..2^40 bytes. */
    memset(&g, 0, sizeof g);
    g.count = 1;
    g.g[0].status = ORB_ERESOURCE;
    g.g[0].slot_shift = 24;
    snprintf(g.g[0].why, sizeof g.g[0].why, "staged in slots");
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(buf[13], 24); /* after the prefix, count, 3 pad, i32 status, cause length */
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), 0);
    assert_int_equal(gd.g[0].status, ORB_ERESOURCE);
    assert_int_equal(gd.g[0].slot_shift, 24);
    assert_int_equal(gd.g[0].lost_qps, 0);
    assert_string_equal(gd.g[0].why, "staged in slots");
    buf[8] = (uint8_t)ORB_EAGAIN; /* the same slot with another status */
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), ORB_EPROTO);
    buf[8] = (uint8_t)ORB_ERESOURCE;
    buf[13] = 11;
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), ORB_EPROTO);
    buf[13] = 41;
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), ORB_EPROTO);
    buf[13] = 40;
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gd), 0);
    assert_int_equal(gd.g[0].slot_shift, 40);
    g.g[0].slot_shift = 11;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g.g[0].slot_shift = 24;
    g.g[0].status = ORB_EAGAIN;
    assert_int_equal(orb_rdma_grants_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
}

static void test_binding_and_ack(void **state)
{
    (void)state;
    struct orb_rdma_binding b;
    memset(&b, 0, sizeof b);
    b.rail = 3;
    memset(b.requester.bytes, 1, 16);
    memset(b.source.bytes, 2, 16);
    b.incarnation = 4;
    b.request = 5;
    b.grant = 6;
    b.generation = 7;
    memset(b.nonce, 8, 32);
    b.addr = 0x1000;
    b.length = 65536;
    b.rkey = 0x777;
    b.op = ORB_OP_READ;
    b.rail_wrs = 11;
    b.rail_bytes = 32768;
    uint8_t buf[ORB_RDMA_BINDING_LEN + 1];
    orb_rdma_binding_encode(&b, buf);
    struct orb_rdma_binding d;
    assert_int_equal(orb_rdma_binding_decode(buf, ORB_RDMA_BINDING_LEN, &d), 0);
    assert_memory_equal(&d.requester, &b.requester, 16);
    assert_memory_equal(&d.source, &b.source, 16);
    assert_int_equal(d.rail, 3);
    assert_int_equal(d.grant, 6);
    assert_int_equal(d.generation, 7);
    assert_memory_equal(d.nonce, b.nonce, 32);
    assert_int_equal(d.rkey, 0x777);
    assert_int_equal(d.rail_wrs, 11);
    assert_int_equal(d.rail_bytes, 32768);
    assert_int_equal(orb_rdma_binding_decode(buf, ORB_RDMA_BINDING_LEN - 1, &d), ORB_EPROTO);
    assert_int_equal(orb_rdma_binding_decode(buf, ORB_RDMA_BINDING_LEN + 1, &d), ORB_EPROTO);
    buf[0] ^= 1;
    assert_int_equal(orb_rdma_binding_decode(buf, ORB_RDMA_BINDING_LEN, &d), ORB_EPROTO);

    struct orb_rdma_ack a = {.request = 5, .grant = 6, .status = ORB_EPERM}, ad[ORB_RDMA_ACKS_MAX];
    uint32_t n = 0;
    uint8_t abuf[ORB_RDMA_ACKS_LEN_MAX + 1];
    orb_rdma_ack_encode(&a, abuf);
    assert_int_equal(orb_rdma_acks_len(abuf, sizeof abuf), ORB_RDMA_ACK_LEN);
    assert_int_equal(orb_rdma_acks_decode(abuf, ORB_RDMA_ACK_LEN, ad, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ad[0].request, 5);
    assert_int_equal(ad[0].grant, 6);
    assert_int_equal(ad[0].status, ORB_EPERM);
    assert_int_equal(orb_rdma_acks_decode(abuf, ORB_RDMA_ACK_LEN - 1, ad, &n), ORB_EPROTO);
    assert_int_equal(orb_rdma_acks_decode(abuf, ORB_RDMA_ACK_LEN + 1, ad, &n), ORB_EPROTO);
    a.status = 3; /* not a status */
    orb_rdma_ack_encode(&a, abuf);
    assert_int_equal(orb_rdma_acks_decode(abuf, ORB_RDMA_ACK_LEN, ad, &n), ORB_EPROTO);
}

/* An ACK ends 1 to ORB_RDMA_ACKS_MAX grants, its length exactly what its count says; a count of
 * 0 or past the maximum, a length that disagrees, a bad entry anywhere fails the whole message,
 * and nothing is written then. */
static void test_acks_of_several_grants(void **state)
{
    (void)state;
    struct orb_rdma_ack a[ORB_RDMA_ACKS_MAX + 1], d[ORB_RDMA_ACKS_MAX];
    for (uint32_t i = 0; i <= ORB_RDMA_ACKS_MAX; i++)
        a[i] = (struct orb_rdma_ack){.request = 100 + i, .grant = 200 + i, .status = i % 3 == 2 ? ORB_EPEER : 0};
    uint8_t buf[ORB_RDMA_ACKS_LEN_MAX + 32];
    assert_int_equal(orb_rdma_acks_encode(a, 0, buf), 0);
    assert_int_equal(orb_rdma_acks_encode(a, ORB_RDMA_ACKS_MAX + 1, buf), 0);
    for (uint32_t n = 1; n <= ORB_RDMA_ACKS_MAX; n++) {
        memset(buf, 0xcc, sizeof buf);
        size_t len = orb_rdma_acks_encode(a, n, buf);
        assert_int_equal(len, ORB_RDMA_ACKS_LEN(n));
        assert_int_equal(buf[len], 0xcc); /* nothing past its length */
        assert_int_equal(orb_rdma_acks_len(buf, sizeof buf), len);
        assert_int_equal(orb_rdma_acks_len(buf, len - 1), 0);
        uint32_t got = 0;
        assert_int_equal(orb_rdma_acks_decode(buf, len, d, &got), 0);
        assert_int_equal(got, n);
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(d[i].request, a[i].request);
            assert_int_equal(d[i].grant, a[i].grant);
            assert_int_equal(d[i].status, a[i].status);
        }
        /* The length must be the count's: one entry more or less, or a byte, fails. */
        uint32_t untouched = 77;
        assert_int_equal(orb_rdma_acks_decode(buf, len - 1, d, &untouched), ORB_EPROTO);
        assert_int_equal(orb_rdma_acks_decode(buf, len + 1, d, &untouched), ORB_EPROTO);
        if (n > 1)
            assert_int_equal(orb_rdma_acks_decode(buf, len - ORB_RDMA_ACK_ENTRY_LEN, d, &untouched), ORB_EPROTO);
        assert_int_equal(untouched, 77);
        /* A bad entry, the last one: padding, then a status that is none. */
        buf[len - 1] = 1;
        assert_int_equal(orb_rdma_acks_decode(buf, len, d, &untouched), ORB_EPROTO);
        buf[len - 1] = 0;
        buf[len - 5] = 0x01; /* status 0x..01: positive or out of range */
        buf[len - 8] = 0x05;
        assert_int_equal(orb_rdma_acks_decode(buf, len, d, &untouched), ORB_EPROTO);
        assert_int_equal(untouched, 77);
    }
    /* Counts the length cannot hold: 0, and one past the maximum. */
    size_t len = orb_rdma_acks_encode(a, 1, buf);
    buf[6] = 0;
    uint32_t got = 0;
    assert_int_equal(orb_rdma_acks_decode(buf, len, d, &got), ORB_EPROTO);
    assert_int_equal(orb_rdma_acks_len(buf, sizeof buf), 0);
    buf[6] = (uint8_t)(ORB_RDMA_ACKS_MAX + 1);
    assert_int_equal(orb_rdma_acks_len(buf, sizeof buf), 0);
    memset(buf + len, 0, sizeof buf - len);
    assert_int_equal(orb_rdma_acks_decode(buf, ORB_RDMA_ACKS_LEN(ORB_RDMA_ACKS_MAX + 1), d, &got), ORB_EPROTO);
    /* Another version or kind. */
    len = orb_rdma_acks_encode(a, 2, buf);
    buf[4] = ORB_RDMA_CTRL_VERSION - 1;
    assert_int_equal(orb_rdma_acks_decode(buf, len, d, &got), ORB_EPROTO);
    buf[4] = ORB_RDMA_CTRL_VERSION;
    buf[5] = 1;
    assert_int_equal(orb_rdma_acks_decode(buf, len, d, &got), ORB_EPROTO);
}

/* DISCONNECT and PING: one u64 each, decoded only from their own kind and length. */
static void test_disconnect_and_ping(void **state)
{
    (void)state;
    uint8_t buf[16];
    size_t len = 0;
    uint64_t v = 0;
    assert_int_equal(orb_rdma_ping_encode(0x0102030405060708ull, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 12);
    assert_int_equal(buf[0], ORB_RDMA_PING);
    assert_int_equal(buf[1], ORB_RDMA_CTRL_VERSION);
    assert_int_equal(orb_rdma_ping_decode(buf, len, &v), 0);
    assert_true(v == 0x0102030405060708ull);
    /* A PING is not a DISCONNECT, and neither has room for more or less than its u64. */
    assert_int_equal(orb_rdma_disconnect_decode(buf, len, &v), ORB_EPROTO);
    assert_int_equal(orb_rdma_ping_decode(buf, len - 1, &v), ORB_EPROTO);
    assert_int_equal(orb_rdma_ping_decode(buf, len + 1, &v), ORB_EPROTO);
    assert_int_equal(orb_rdma_ping_encode(1, buf, 11, &len), ORB_EINVAL);
    assert_int_equal(orb_rdma_ping_encode(1, NULL, sizeof buf, &len), ORB_EINVAL);
    assert_int_equal(orb_rdma_disconnect_encode(9, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_ping_decode(buf, len, &v), ORB_EPROTO);
    assert_int_equal(orb_rdma_disconnect_decode(buf, len, &v), 0);
    assert_true(v == 9);
    buf[2] = 1; /* a reserved prefix byte */
    assert_int_equal(orb_rdma_disconnect_decode(buf, len, &v), ORB_EPROTO);
}

/* Whether any decoder takes `buf`. */
static bool some_decoder_takes(const uint8_t *buf, size_t len)
{
    static struct orb_rdma_grants g;
    struct orb_rdma_connect c;
    struct orb_rdma_grant_req q;
    struct orb_rdma_pin_req p;
    struct orb_rdma_pinned pd;
    struct orb_rdma_unpin u;
    struct orb_rdma_binding b;
    struct orb_rdma_ack a[ORB_RDMA_ACKS_MAX];
    uint32_t na;
    static struct orb_rdma_pgrant_req pq;
    static struct orb_rdma_pgrant pg;
    uint64_t v;
    int32_t st;
    return orb_rdma_pgrant_req_decode(buf, len, &pq) == 0 || orb_rdma_pgrant_decode(buf, len, &pg) == 0 ||
           orb_rdma_connect_decode(ORB_RDMA_CONNECT, buf, len, &c) == 0 ||
           orb_rdma_connect_decode(ORB_RDMA_CONNECT_OK, buf, len, &c) == 0 ||
           orb_rdma_grant_req_decode(buf, len, &q) == 0 || orb_rdma_grants_decode(buf, len, &g) == 0 ||
           orb_rdma_disconnect_decode(buf, len, &v) == 0 || orb_rdma_ping_decode(buf, len, &v) == 0 ||
           orb_rdma_pin_decode(buf, len, &p) == 0 || orb_rdma_pinned_decode(buf, len, &pd) == 0 ||
           orb_rdma_unpin_decode(buf, len, &u) == 0 || orb_rdma_unpinned_decode(buf, len, &st) == 0 ||
           orb_rdma_binding_decode(buf, len, &b) == 0 || orb_rdma_acks_decode(buf, len, a, &na) == 0;
}

/* The corpus says what it holds: every valid-* file is some message, no bad-* file is any. */
static void test_corpus_names_hold(void **state)
{
    (void)state;
    DIR *d = opendir(CTRL_CORPUS_DIR);
    assert_non_null(d);
    unsigned valid = 0, bad = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        bool is_valid = strncmp(e->d_name, "valid-", 6) == 0;
        if (!is_valid && strncmp(e->d_name, "bad-", 4) != 0)
            continue;
        char path[512];
        snprintf(path, sizeof path, "%s/%s", CTRL_CORPUS_DIR, e->d_name);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        static uint8_t buf[8192];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        if (some_decoder_takes(buf, n) != is_valid)
            fail_msg("%s is %s", e->d_name, is_valid ? "no message" : "taken as a message");
        is_valid ? valid++ : bad++;
    }
    closedir(d);
    assert_true(valid >= 20 && bad >= 40);
}

/* PIN, PINNED, UNPIN and UNPINNED round-trip, and their rules hold both ways. */
static void test_pins(void **state)
{
    (void)state;
    uint8_t buf[512];
    size_t len = 0;
    struct orb_rdma_pin_req p = {.incarnation = 5, .request = 6, .op = ORB_OP_WRITE, .addr = 0x1000, .length = 3};
    struct orb_rdma_pin_req pd;
    assert_int_equal(orb_rdma_pin_encode(&p, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 44);
    assert_int_equal(orb_rdma_pin_decode(buf, len, &pd), 0);
    assert_int_equal(pd.incarnation, 5);
    assert_int_equal(pd.request, 6);
    assert_int_equal(pd.op, ORB_OP_WRITE);
    assert_int_equal(pd.addr, 0x1000);
    assert_int_equal(pd.length, 3);
    assert_int_equal(orb_rdma_pin_decode(buf, len - 1, &pd), ORB_EPROTO);
    p.length = 0;
    assert_int_equal(orb_rdma_pin_encode(&p, buf, sizeof buf, &len), ORB_EINVAL);

    struct orb_rdma_pinned k = {.status = 0, .pin = 16, .slot_shift = 24, .generation = 0xffff};
    struct orb_rdma_pinned kd;
    assert_int_equal(orb_rdma_pinned_encode(&k, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 16);
    assert_int_equal(orb_rdma_pinned_decode(buf, len, &kd), 0);
    assert_int_equal(kd.pin, 16);
    assert_int_equal(kd.slot_shift, 24);
    assert_int_equal(kd.generation, 0xffff);
    k.pin = 17;
    assert_int_equal(orb_rdma_pinned_encode(&k, buf, sizeof buf, &len), ORB_EINVAL);
    k = (struct orb_rdma_pinned){.status = ORB_ENOENT};
    snprintf(k.why, sizeof k.why, "no such\nrange");
    assert_int_equal(orb_rdma_pinned_encode(&k, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_pinned_decode(buf, len, &kd), 0);
    assert_int_equal(kd.status, ORB_ENOENT);
    assert_string_equal(kd.why, "no such?range");
    k.pin = 1; /* a refusal names no pin */
    assert_int_equal(orb_rdma_pinned_encode(&k, buf, sizeof buf, &len), ORB_EINVAL);

    struct orb_rdma_unpin u = {.incarnation = 9, .pin = 1, .generation = 2}, ud;
    assert_int_equal(orb_rdma_unpin_encode(&u, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 20);
    assert_int_equal(orb_rdma_unpin_decode(buf, len, &ud), 0);
    assert_int_equal(ud.incarnation, 9);
    assert_int_equal(ud.pin, 1);
    assert_int_equal(ud.generation, 2);
    u.generation = 0;
    assert_int_equal(orb_rdma_unpin_encode(&u, buf, sizeof buf, &len), ORB_EINVAL);
    int32_t st = 1;
    assert_int_equal(orb_rdma_unpinned_encode(ORB_ENOENT, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 12);
    assert_int_equal(orb_rdma_unpinned_decode(buf, len, &st), 0);
    assert_int_equal(st, ORB_ENOENT);
    assert_int_equal(orb_rdma_unpinned_encode(3, buf, sizeof buf, &len), ORB_EINVAL);
    /* A message of one kind is none of the others. */
    assert_int_equal(orb_rdma_pin_decode(buf, len, &pd), ORB_EPROTO);

    /* A grant request names a pin with its generation, or neither. */
    struct orb_rdma_grant_req q;
    memset(&q, 0, sizeof q);
    q.count = 1;
    q.ask[0] = (struct orb_rdma_grant_ask){.request = 1, .op = ORB_OP_READ, .pin = 4, .pin_generation = 9,
                                           .rail_mask = 1, .addr = 64, .length = 64};
    struct orb_rdma_grant_req qd;
    assert_int_equal(orb_rdma_grant_req_encode(&q, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_grant_req_decode(buf, len, &qd), 0);
    assert_int_equal(qd.ask[0].pin, 4);
    assert_int_equal(qd.ask[0].pin_generation, 9);
    q.ask[0].pin_generation = 0;
    assert_int_equal(orb_rdma_grant_req_encode(&q, buf, sizeof buf, &len), ORB_EINVAL);
}

/* PGRANT_REQ and PGRANT: the requester's queue pairs in, the source's keys and queue pairs out;
 * a GRANT refusal saying "private only" with ORB_EUNAVAILABLE alone. */
static void test_private_grants(void **state)
{
    (void)state;
    static uint8_t buf[1024];
    size_t len = 0;
    struct orb_rdma_pgrant_req q = {.incarnation = 7, .request = 8, .op = ORB_OP_READ, .rail_mask = 0x5,
                                    .addr = 0xd000000000001000ull, .length = 4097, .nqps = 2};
    for (uint32_t i = 0; i < 2; i++)
        q.qps[i] = (struct orb_rdma_qp_addr){.qpn = 100 + i, .psn = 7, .mtu = IBV_MTU_1024, .lid = 3};
    q.qps[1].gid[15] = 9;
    struct orb_rdma_pgrant_req qd;
    assert_int_equal(orb_rdma_pgrant_req_encode(&q, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 48 + 2 * 28);
    assert_int_equal(orb_rdma_pgrant_req_decode(buf, len, &qd), 0);
    assert_int_equal(qd.incarnation, 7);
    assert_int_equal(qd.request, 8);
    assert_int_equal(qd.rail_mask, 0x5);
    assert_int_equal(qd.addr, 0xd000000000001000ull);
    assert_int_equal(qd.length, 4097);
    assert_int_equal(qd.nqps, 2);
    assert_int_equal(qd.qps[1].qpn, 101);
    assert_int_equal(qd.qps[1].gid[15], 9);
    assert_int_equal(qd.qps[0].mtu, IBV_MTU_1024);
    assert_int_equal(qd.pin, 0);
    assert_int_equal(orb_rdma_pgrant_req_decode(buf, len - 1, &qd), ORB_EPROTO);
    q.pin = 2;
    q.pin_generation = 0x1234;
    assert_int_equal(orb_rdma_pgrant_req_encode(&q, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_pgrant_req_decode(buf, len, &qd), 0);
    assert_int_equal(qd.pin, 2);
    assert_int_equal(qd.pin_generation, 0x1234);
    q.pin_generation = 0; /* a pin names its generation */
    assert_int_equal(orb_rdma_pgrant_req_encode(&q, buf, sizeof buf, &len), ORB_EINVAL);
    q.pin = 0;
    q.nqps = 1; /* not the rails' count */
    assert_int_equal(orb_rdma_pgrant_req_encode(&q, buf, sizeof buf, &len), ORB_EINVAL);
    q.nqps = 2;
    q.qps[0].qpn = 0;
    assert_int_equal(orb_rdma_pgrant_req_encode(&q, buf, sizeof buf, &len), ORB_EINVAL);

    struct orb_rdma_pgrant g = {.status = 0, .grant = 11, .generation = 1, .target = 0xd000000000001000ull,
                                .nqps = 2, .rkeys = {0x99, 0x77}};
    memset(g.nonce, 0xab, sizeof g.nonce);
    g.qps[0] = (struct orb_rdma_qp_addr){.qpn = 5, .mtu = IBV_MTU_4096};
    g.qps[1] = (struct orb_rdma_qp_addr){.qpn = 6, .mtu = IBV_MTU_256, .psn = 0xffffff};
    static struct orb_rdma_pgrant gd;
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(len, 68 + 2 * 32);
    assert_int_equal(orb_rdma_pgrant_decode(buf, len, &gd), 0);
    assert_int_equal(gd.grant, 11);
    assert_int_equal(gd.nqps, 2);
    assert_int_equal(gd.rkeys[1], 0x77);
    assert_int_equal(gd.qps[1].psn, 0xffffff);
    assert_int_equal(gd.target, 0xd000000000001000ull);
    assert_memory_equal(gd.nonce, g.nonce, sizeof g.nonce);
    assert_int_equal(gd.keys, ORB_RDMA_PGRANT_REGIONS);
    g.keys = ORB_RDMA_PGRANT_WINDOWS; /* windows bound through the grant's own queue pairs */
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(buf[9], ORB_RDMA_PGRANT_WINDOWS);
    assert_int_equal(orb_rdma_pgrant_decode(buf, len, &gd), 0);
    assert_int_equal(gd.keys, ORB_RDMA_PGRANT_WINDOWS);
    buf[9] = 2; /* an unknown kind of keys */
    assert_int_equal(orb_rdma_pgrant_decode(buf, len, &gd), ORB_EPROTO);
    g.keys = 2;
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g.keys = ORB_RDMA_PGRANT_REGIONS;
    g.slot_shift = 20; /* a slot only with a refusal */
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g.slot_shift = 0;
    g.rkeys[1] = 0;
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g = (struct orb_rdma_pgrant){.status = ORB_EAGAIN};
    snprintf(g.why, sizeof g.why, "max_grants\tspent");
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_pgrant_decode(buf, len, &gd), 0);
    assert_int_equal(gd.status, ORB_EAGAIN);
    assert_string_equal(gd.why, "max_grants?spent");
    assert_int_equal(gd.slot_shift, 0);
    /* A staging source's slot, with ORB_ERESOURCE only and within the slot bounds. */
    g = (struct orb_rdma_pgrant){.status = ORB_ERESOURCE, .slot_shift = 20};
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_pgrant_decode(buf, len, &gd), 0);
    assert_int_equal(gd.status, ORB_ERESOURCE);
    assert_int_equal(gd.slot_shift, 20);
    g.slot_shift = ORB_RDMA_SLOT_SHIFT_MIN - 1;
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g = (struct orb_rdma_pgrant){.status = ORB_EAGAIN, .slot_shift = 20};
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    g.status = 4;
    assert_int_equal(orb_rdma_pgrant_encode(&g, buf, sizeof buf, &len), ORB_EINVAL);
    /* A message of one kind is none of the others. */
    assert_int_equal(orb_rdma_pgrant_req_decode(buf, len, &qd), ORB_EPROTO);

    /* The GRANT refusal that sends a request to PGRANT_REQ. */
    static struct orb_rdma_grants gs, gsd;
    gs.count = 1;
    gs.g[0] = (struct orb_rdma_grant){.status = ORB_EUNAVAILABLE, .private_only = true};
    assert_int_equal(orb_rdma_grants_encode(&gs, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gsd), 0);
    assert_true(gsd.g[0].private_only);
    assert_int_equal(gsd.g[0].slot_shift, 0);
    gs.g[0].status = ORB_ERESOURCE;
    assert_int_equal(orb_rdma_grants_encode(&gs, buf, sizeof buf, &len), ORB_EINVAL);
    gs.g[0] = (struct orb_rdma_grant){.status = ORB_EUNAVAILABLE};
    assert_int_equal(orb_rdma_grants_encode(&gs, buf, sizeof buf, &len), 0);
    assert_int_equal(orb_rdma_grants_decode(buf, len, &gsd), 0);
    assert_false(gsd.g[0].private_only);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_connect_round_trip),
        cmocka_unit_test(test_grant_round_trip),
        cmocka_unit_test(test_binding_and_ack),
        cmocka_unit_test(test_acks_of_several_grants),
        cmocka_unit_test(test_disconnect_and_ping),
        cmocka_unit_test(test_pins),
        cmocka_unit_test(test_private_grants),
        cmocka_unit_test(test_corpus_names_hold),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
