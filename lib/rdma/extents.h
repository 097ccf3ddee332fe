/* Internal: first-fit extents of one fixed range, the staging arena's allocator.
 *
 * Offsets and lengths are rounded up to the granule. The free list is a fixed array sorted by
 * offset and coalesced on every put, so a put never allocates and never fails; the number of
 * extents taken at once is bounded (ORB_RDMA_EXTENTS_MAX), which bounds the list. */
#ifndef ORB_RDMA_EXTENTS_H
#define ORB_RDMA_EXTENTS_H

#include <stdint.h>

#define ORB_RDMA_EXTENTS_MAX 1024u   /* extents taken at once */

struct orb_rdma_extent {
    uint64_t off, len;
};

struct orb_rdma_extents {
    uint64_t size, granule, in_use;
    uint32_t nfree, ntaken;
    struct orb_rdma_extent free[ORB_RDMA_EXTENTS_MAX + 1];
};

/* `size` bytes in `granule`-byte units (a power of two; size a multiple of it). ORB_EINVAL. */
int orb_rdma_extents_init(struct orb_rdma_extents *e, uint64_t size, uint64_t granule);

/* The lowest free extent of `len` bytes (rounded up). Errors: ORB_EINVAL (len 0),
 * ORB_ERESOURCE (larger than the whole range: it can never fit), ORB_EAGAIN (not free now, or
 * ORB_RDMA_EXTENTS_MAX extents are taken). */
int orb_rdma_extents_take(struct orb_rdma_extents *e, uint64_t len, uint64_t *off_out);

/* Give back what a take of `len` at `off` returned. */
void orb_rdma_extents_put(struct orb_rdma_extents *e, uint64_t off, uint64_t len);

#endif
