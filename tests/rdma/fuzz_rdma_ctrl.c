/* Fuzz target for the RDMA transport's messages (lib/rdma/ctrl.c). The input is decoded as every
 * kind of message; beyond memory safety it checks (abort on failure):
 *  - the only outcomes are 0 and ORB_EPROTO;
 *  - a decoded message satisfies the decoder's promises (counts, ranges, non-zero keys);
 *  - it encodes back to exactly the input bytes. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <orbite/orbite.h>

#include "rdma/ctrl.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(int cond, const char *what)
{
    if (!cond) {
        fprintf(stderr, "fuzz_rdma_ctrl: invariant broken: %s (last error: %s)\n", what, orb_last_error());
        abort();
    }
}

static void check_rc(int rc, const char *what)
{
    check(rc == 0 || rc == ORB_EPROTO, what);
}

static void same(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, const char *what)
{
    check(alen == blen && memcmp(a, b, alen) == 0, what);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t out[8192];
    size_t len = 0;
    uint8_t kind;
    check_rc(orb_rdma_ctrl_kind(data, size, &kind), "kind");

    for (uint8_t k = ORB_RDMA_CONNECT; k <= ORB_RDMA_CONNECT_OK; k++) {
        struct orb_rdma_connect m;
        int rc = orb_rdma_connect_decode(k, data, size, &m);
        check_rc(rc, "connect decode");
        if (rc == 0) {
            check(m.nqps >= 1 && m.nqps <= ORB_RDMA_MAX_RAILS, "connect queue pairs");
            check(m.lanes >= 1 && m.nqps % m.lanes == 0, "connect lanes");
            check(orb_rdma_connect_encode(k, &m, out, sizeof out, &len) == 0, "connect re-encode");
            same(out, len, data, size, "connect bytes");
        }
    }
    struct orb_rdma_grant_req gr;
    int rc = orb_rdma_grant_req_decode(data, size, &gr);
    check_rc(rc, "grant request decode");
    if (rc == 0) {
        check(gr.count >= 1 && gr.count <= ORB_RDMA_GRANT_BATCH, "grant request count");
        for (uint32_t i = 0; i < gr.count; i++)
            check(gr.ask[i].length > 0 && gr.ask[i].addr + gr.ask[i].length >= gr.ask[i].addr &&
                  gr.ask[i].rail_mask != 0, "grant request range");
        check(orb_rdma_grant_req_encode(&gr, out, sizeof out, &len) == 0, "grant request re-encode");
        same(out, len, data, size, "grant request bytes");
    }
    static struct orb_rdma_grants g;
    rc = orb_rdma_grants_decode(data, size, &g);
    check_rc(rc, "grant decode");
    if (rc == 0) {
        check(g.count >= 1 && g.count <= ORB_RDMA_GRANT_BATCH, "grant count");
        for (uint32_t e = 0; e < g.count; e++) {
            check(g.g[e].status <= 0 && g.g[e].status >= ORB_EAGAIN, "grant status");
            check(strlen(g.g[e].why) <= ORB_RDMA_WHY_MAX, "grant cause");
            for (uint32_t i = 0; i < g.g[e].nkeys; i++)
                check(g.g[e].rkeys[i] != 0, "grant key");
        }
        check(orb_rdma_grants_encode(&g, out, sizeof out, &len) == 0, "grant re-encode");
        same(out, len, data, size, "grant bytes");
    }
    uint64_t inc;
    rc = orb_rdma_disconnect_decode(data, size, &inc);
    check_rc(rc, "disconnect decode");
    if (rc == 0) {
        check(orb_rdma_disconnect_encode(inc, out, sizeof out, &len) == 0, "disconnect re-encode");
        same(out, len, data, size, "disconnect bytes");
    }
    uint64_t nonce;
    rc = orb_rdma_ping_decode(data, size, &nonce);
    check_rc(rc, "ping decode");
    if (rc == 0) {
        check(orb_rdma_ping_encode(nonce, out, sizeof out, &len) == 0, "ping re-encode");
        same(out, len, data, size, "ping bytes");
    }
    static struct orb_rdma_pgrant_req pgq;
    rc = orb_rdma_pgrant_req_decode(data, size, &pgq);
    check_rc(rc, "private grant request decode");
    if (rc == 0) {
        check(pgq.nqps >= 1 && pgq.nqps <= ORB_RDMA_MAX_RAILS &&
                  pgq.nqps == (uint32_t)__builtin_popcount(pgq.rail_mask) && pgq.length > 0 &&
                  pgq.addr + pgq.length >= pgq.addr,
              "private grant request fields");
        check(orb_rdma_pgrant_req_encode(&pgq, out, sizeof out, &len) == 0, "private grant request re-encode");
        same(out, len, data, size, "private grant request bytes");
    }
    static struct orb_rdma_pgrant pg;
    rc = orb_rdma_pgrant_decode(data, size, &pg);
    check_rc(rc, "private grant decode");
    if (rc == 0) {
        if (pg.status == 0) {
            check(pg.nqps >= 1 && pg.nqps <= ORB_RDMA_MAX_RAILS, "private grant queue pairs");
            for (uint32_t i = 0; i < pg.nqps; i++)
                check(pg.rkeys[i] != 0 && pg.qps[i].qpn != 0, "private grant key and queue pair");
        } else {
            check(pg.status < 0 && strlen(pg.why) <= ORB_RDMA_WHY_MAX, "private grant refusal");
        }
        check(orb_rdma_pgrant_encode(&pg, out, sizeof out, &len) == 0, "private grant re-encode");
        same(out, len, data, size, "private grant bytes");
    }
    struct orb_rdma_pin_req pq;
    rc = orb_rdma_pin_decode(data, size, &pq);
    check_rc(rc, "pin decode");
    if (rc == 0) {
        check(pq.length > 0 && pq.addr + pq.length >= pq.addr && pq.op <= ORB_OP_WRITE, "pin range");
        check(orb_rdma_pin_encode(&pq, out, sizeof out, &len) == 0, "pin re-encode");
        same(out, len, data, size, "pin bytes");
    }
    struct orb_rdma_pinned pd;
    rc = orb_rdma_pinned_decode(data, size, &pd);
    check_rc(rc, "pinned decode");
    if (rc == 0) {
        check(pd.status == 0 ? pd.pin >= 1 && pd.pin <= ORB_RDMA_MAX_PINS && pd.generation != 0
                             : pd.pin == 0 && pd.status >= ORB_EAGAIN, "pinned fields");
        check(strlen(pd.why) <= ORB_RDMA_WHY_MAX, "pinned cause");
        check(orb_rdma_pinned_encode(&pd, out, sizeof out, &len) == 0, "pinned re-encode");
        same(out, len, data, size, "pinned bytes");
    }
    struct orb_rdma_unpin uq;
    rc = orb_rdma_unpin_decode(data, size, &uq);
    check_rc(rc, "unpin decode");
    if (rc == 0) {
        check(uq.pin >= 1 && uq.pin <= ORB_RDMA_MAX_PINS && uq.generation != 0, "unpin fields");
        check(orb_rdma_unpin_encode(&uq, out, sizeof out, &len) == 0, "unpin re-encode");
        same(out, len, data, size, "unpin bytes");
    }
    int32_t ust;
    rc = orb_rdma_unpinned_decode(data, size, &ust);
    check_rc(rc, "unpinned decode");
    if (rc == 0) {
        check(ust <= 0 && ust >= ORB_EAGAIN, "unpinned status");
        check(orb_rdma_unpinned_encode(ust, out, sizeof out, &len) == 0, "unpinned re-encode");
        same(out, len, data, size, "unpinned bytes");
    }
    struct orb_rdma_binding b;
    rc = orb_rdma_binding_decode(data, size, &b);
    check_rc(rc, "binding decode");
    if (rc == 0) {
        check(b.rkey != 0 && b.rail_bytes <= b.length, "binding fields");
        orb_rdma_binding_encode(&b, out);
        same(out, ORB_RDMA_BINDING_LEN, data, size, "binding bytes");
    }
    struct orb_rdma_ack a[ORB_RDMA_ACKS_MAX];
    uint32_t na = 0;
    rc = orb_rdma_acks_decode(data, size, a, &na);
    check_rc(rc, "ack decode");
    if (rc == 0) {
        check(na >= 1 && na <= ORB_RDMA_ACKS_MAX, "ack count");
        for (uint32_t i = 0; i < na; i++)
            check(a[i].status <= 0, "ack status");
        size_t alen = orb_rdma_acks_encode(a, na, out);
        same(out, alen, data, size, "ack bytes");
    }
    return 0;
}
