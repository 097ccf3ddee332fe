/* Helpers for the in-process engine tests. */
#include "util.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

/* ORB_TEST_TRANSPORT=shm runs a suite on the same-host transport: every region is shareable
 * memory and every request names ORB_TRANSPORT_SHM, so that a request it cannot carry fails
 * rather than quietly going by TCP. */
static int use_shm(void)
{
    const char *t = getenv("ORB_TEST_TRANSPORT");
    return t != NULL && strcmp(t, "shm") == 0;
}

orb_engine *eu_engine(const struct orb_engine_config *cfg)
{
    struct orb_engine_config def;
    if (cfg == NULL) {
        assert_int_equal(orb_engine_config_init(&def), 0);
        cfg = &def;
    }
    orb_engine *e = NULL;
    int rc = orb_engine_create(cfg, &e);
    if (rc != 0)
        fail_msg("orb_engine_create: %s", orb_last_error());
    return e;
}

orb_engine *eu_requester(uint32_t stripes, uint64_t threshold)
{
    struct orb_engine_config cfg;
    assert_int_equal(orb_engine_config_init(&cfg), 0);
    cfg.enable_source = 0;
    cfg.tcp_stripes = stripes;
    cfg.tcp_local_stripes = stripes; /* the peers are on this host: exactly this many */
    if (threshold != 0)
        cfg.tcp_stripe_threshold = threshold;
    return eu_engine(&cfg);
}

orb_segment *eu_open(orb_engine *req, orb_engine *src)
{
    char ep[ORB_ENDPOINT_MAX];
    struct orb_epoch epoch;
    assert_int_equal(orb_engine_endpoint(src, ep, sizeof ep), 0);
    assert_int_equal(orb_engine_source_epoch(src, &epoch), 0);
    orb_segment *s = NULL;
    int rc = orb_open_segment(req, ep, &epoch, 5 * EU_SEC, &s);
    if (rc != 0)
        fail_msg("orb_open_segment %s: %s", ep, orb_last_error());
    return s;
}

void eu_pair_open(struct eu_pair *p, uint32_t stripes, uint64_t threshold, size_t len,
                  uint8_t remote_seed, uint8_t local_seed)
{
    p->src = eu_engine(NULL);
    p->req = eu_requester(stripes, threshold);
    eu_region_new(p->src, len, ORB_PERM_REMOTE_WRITE, remote_seed, &p->remote);
    eu_region_new(p->req, len, ORB_PERM_LOCAL, local_seed, &p->local);
    p->seg = eu_open(p->req, p->src);
}

void eu_pair_close(struct eu_pair *p)
{
    orb_segment_close(p->seg);
    eu_region_free(p->req, &p->local);
    eu_region_free(p->src, &p->remote);
    orb_engine_free(p->req);
    orb_engine_free(p->src);
}

void eu_fill(uint8_t *p, size_t len, uint8_t seed)
{
    uint32_t x = 0x9e3779b9u * (seed + 1u);
    for (size_t i = 0; i < len; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        p[i] = (uint8_t)(x >> 24);
    }
}

size_t eu_first_mismatch(const uint8_t *p, size_t len, uint8_t seed)
{
    uint8_t *want = malloc(len);
    assert_non_null(want);
    eu_fill(want, len, seed);
    size_t at = SIZE_MAX;
    if (memcmp(p, want, len) != 0)
        for (size_t i = 0; i < len; i++)
            if (p[i] != want[i]) {
                at = i;
                break;
            }
    free(want);
    return at;
}

void eu_region_new(orb_engine *e, size_t len, enum orb_perm perm, uint8_t seed,
                   struct eu_region *out)
{
    memset(out, 0, sizeof *out);
    out->alloc_len = len + 2 * (size_t)EU_GUARD;
    if (use_shm())
        assert_int_equal(orb_host_memory_alloc_shared(out->alloc_len, 0, &out->owner), 0);
    else
        assert_int_equal(orb_host_memory_alloc(out->alloc_len, 0, &out->owner), 0);
    out->alloc = orb_host_memory_data(out->owner);
    eu_fill(out->alloc, out->alloc_len, seed);
    out->base = out->alloc + EU_GUARD;
    out->len = len;
    assert_int_equal(orb_register_host_memory(e, out->owner, EU_GUARD, len, perm, &out->id), 0);
}

void eu_region_free(orb_engine *e, struct eu_region *r)
{
    if (e != NULL)
        assert_int_equal(orb_unregister_memory(e, r->id), 0);
    orb_host_memory_unref(r->owner);
    memset(r, 0, sizeof *r);
}

struct orb_request eu_req_at(enum orb_op op, uint64_t local, uint64_t remote, uint64_t len)
{
    struct orb_request r;
    memset(&r, 0, sizeof r);
    r.transport = use_shm() ? ORB_TRANSPORT_SHM : ORB_TRANSPORT_UNSPEC;
    r.op = op;
    r.local_addr = local;
    r.remote_addr = remote;
    r.length = len;
    return r;
}

struct orb_request eu_req(enum orb_op op, const void *local, const void *remote, uint64_t len)
{
    return eu_req_at(op, (uint64_t)(uintptr_t)local, (uint64_t)(uintptr_t)remote, len);
}
