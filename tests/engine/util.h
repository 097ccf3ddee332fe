/* Helpers for the in-process engine tests: engines over loopback through the public API only,
 * host regions with guard bytes, byte patterns and reports. */
#ifndef ORB_TESTS_ENGINE_UTIL_H
#define ORB_TESTS_ENGINE_UTIL_H

#include <stddef.h>
#include <stdint.h>
#include <orbite/orbite.h>

#define EU_SEC 1000000000ull
#define EU_GUARD 65536u /* unregistered bytes on each side of a region */

/* A registered range inside a larger allocation: [base, base + len) is registered, EU_GUARD
 * bytes on each side are not, so a stray write past either end is visible. */
struct eu_region {
    orb_host_memory *owner;
    uint8_t *alloc;      /* the whole allocation */
    size_t alloc_len;
    uint8_t *base;       /* the registered bytes */
    size_t len;
    orb_reg_id id;
};

/* Create an engine from `cfg` (NULL: defaults), asserting success. */
orb_engine *eu_engine(const struct orb_engine_config *cfg);
/* A requester-only engine with `stripes` stripes and `threshold` (0: default). */
orb_engine *eu_requester(uint32_t stripes, uint64_t threshold);
/* Open a segment of `req` to `src`, asserting success. */
orb_segment *eu_open(orb_engine *req, orb_engine *src);

/* Two engines over loopback: a source with a `len`-byte region peers may write (`remote`, filled
 * with `remote_seed`'s pattern), a requester from eu_requester(stripes, threshold) with a local
 * `len`-byte region (`local_seed`), and a segment between them. */
struct eu_pair {
    orb_engine *src, *req;
    orb_segment *seg;
    struct eu_region remote, local;
};
void eu_pair_open(struct eu_pair *p, uint32_t stripes, uint64_t threshold, size_t len,
                  uint8_t remote_seed, uint8_t local_seed);
void eu_pair_close(struct eu_pair *p);

/* Allocate len + 2 * EU_GUARD bytes, fill them all with `seed`'s pattern, register the middle
 * `len` with `perm`. */
void eu_region_new(orb_engine *e, size_t len, enum orb_perm perm, uint8_t seed,
                   struct eu_region *out);
void eu_region_free(orb_engine *e, struct eu_region *r);

void eu_fill(uint8_t *p, size_t len, uint8_t seed);
/* Index of the first byte where p differs from seed's pattern, or SIZE_MAX. */
size_t eu_first_mismatch(const uint8_t *p, size_t len, uint8_t seed);

struct orb_request eu_req(enum orb_op op, const void *local, const void *remote, uint64_t len);
/* The same by address (device memory has no pointer of the CPU's). */
struct orb_request eu_req_at(enum orb_op op, uint64_t local, uint64_t remote, uint64_t len);

#endif
