/* Internal: cutting one RDMA request into slices, each of which selects its own rail.
 *
 * The plan follows TENT's slicing: a 64 KiB base block, at most 64 slices for a READ into host
 * memory and 32 for a WRITE or for a READ whose local buffer is device memory; a request that
 * would need more base blocks than that gets a larger block (a whole number of base blocks), and
 * a last slice shorter than a quarter block is folded into the slice before it. Unlike TENT's
 * planner, a slice is never empty: the count is derived from the block, never the other way
 * round. A zero-length request is planned as one slice of length 0, so that per-slice accounting
 * (one completion per slice) still reaches a terminal state.
 *
 * Pure arithmetic: no allocation, no locking, safe from any thread. A slice can be larger than
 * one work request may carry; splitting it into WRs is the transport's business. */
#ifndef ORB_TOPO_SLICING_H
#define ORB_TOPO_SLICING_H

#include <stdbool.h>
#include <stdint.h>

#define ORB_SLICE_BASE_BLOCK 65536u   /* bytes; blocks are whole multiples of it */
#define ORB_SLICE_MAX 64u             /* host-local READ */
#define ORB_SLICE_MAX_NARROW 32u      /* WRITE, or READ into device memory */

struct orb_slice {
    uint64_t offset;                  /* from the start of the request */
    uint64_t length;
};

/* The slice limit for an operation: ORB_SLICE_MAX_NARROW when `is_write` or when the local
 * buffer is device memory, otherwise ORB_SLICE_MAX. */
uint32_t orb_slice_limit(bool is_write, bool device_memory);

/* Plan `length` bytes into at most `max_slices` slices (1..ORB_SLICE_MAX), written to
 * out[0..*count) in offset order; the lengths sum to `length`, every slice but the last is
 * exactly *block bytes, and the last, unless it is the only one, carries at least a quarter
 * block and less than 1.25 blocks. `block` may be NULL. Returns 0, or ORB_EINVAL for a bad
 * max_slices or NULL out/count (outputs untouched). The caller owns `out`, which must hold
 * ORB_SLICE_MAX entries or at least `max_slices`. */
int orb_slice_plan(uint64_t length, uint32_t max_slices, struct orb_slice *out, uint32_t *count,
                   uint64_t *block);

#endif
