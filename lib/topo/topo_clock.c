/* The monotonic clock behind struct orb_clock. */
#include "topo_clock.h"

#include "core/clock.h"

static uint64_t monotonic_now(void *ctx)
{
    (void)ctx;
    return orb_now_ns();
}

const struct orb_clock orb_clock_monotonic = {monotonic_now, 0};
