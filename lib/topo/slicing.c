/* Slice planning: see slicing.h. */
#include "slicing.h"

#include <stddef.h>

#include "core/error.h"

uint32_t orb_slice_limit(bool is_write, bool device_memory)
{
    return is_write || device_memory ? ORB_SLICE_MAX_NARROW : ORB_SLICE_MAX;
}

/* ceil(a / b) for b > 0 without the overflow of (a + b - 1) / b. */
static uint64_t div_ceil(uint64_t a, uint64_t b)
{
    return a == 0 ? 0 : (a - 1) / b + 1;
}

int orb_slice_plan(uint64_t length, uint32_t max_slices, struct orb_slice *out, uint32_t *count,
                   uint64_t *block)
{
    if (out == NULL || count == NULL)
        return orb_fail(ORB_EINVAL, "slice plan: NULL output");
    if (max_slices == 0 || max_slices > ORB_SLICE_MAX)
        return orb_fail(ORB_EINVAL, "slice plan: max_slices %u is outside 1..%u", max_slices,
                        ORB_SLICE_MAX);

    uint64_t block_size = ORB_SLICE_BASE_BLOCK;
    if (div_ceil(length, ORB_SLICE_BASE_BLOCK) > max_slices) {
        /* Spread over max_slices, rounded up to whole base blocks. With two or more slices the
         * quotient is at most 2^63, so the round-up fits; with one, a length too close to 2^64
         * to round keeps the unrounded block, which is then the whole request anyway. */
        uint64_t per_slice = div_ceil(length, max_slices);
        uint64_t rem = per_slice % ORB_SLICE_BASE_BLOCK;
        if (rem != 0 && per_slice <= UINT64_MAX - (ORB_SLICE_BASE_BLOCK - rem))
            per_slice += ORB_SLICE_BASE_BLOCK - rem;
        block_size = per_slice;
    }

    /* The count follows from the block, so no slice is left empty; a zero-length request
     * still gets its one (empty) slice. */
    uint64_t n = length == 0 ? 1 : div_ceil(length, block_size);
    if (n > 1) {
        uint64_t tail = length - (n - 1) * block_size;
        /* With two or more slices the block is a whole number of base blocks, so a quarter of
         * it is exact. */
        if (tail < block_size / 4)
            n--;
    }

    uint64_t offset = 0;
    for (uint64_t i = 0; i < n; i++) {
        out[i].offset = offset;
        out[i].length = i + 1 == n ? length - offset : block_size;
        offset += out[i].length;
    }
    *count = (uint32_t)n;
    if (block != NULL)
        *block = block_size;
    return 0;
}
