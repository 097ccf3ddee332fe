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
    struct orb_rdma_binding b;
    rc = orb_rdma_binding_decode(data, size, &b);
    check_rc(rc, "binding decode");
    if (rc == 0) {
        check(b.rkey != 0 && b.rail_bytes <= b.length, "binding fields");
        orb_rdma_binding_encode(&b, out);
        same(out, ORB_RDMA_BINDING_LEN, data, size, "binding bytes");
    }
    struct orb_rdma_ack a;
    rc = orb_rdma_ack_decode(data, size, &a);
    check_rc(rc, "ack decode");
    if (rc == 0) {
        check(a.status <= 0, "ack status");
        orb_rdma_ack_encode(&a, out);
        same(out, ORB_RDMA_ACK_LEN, data, size, "ack bytes");
    }
    return 0;
}
