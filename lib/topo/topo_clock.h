/* Internal: an injected clock, so that time-based rules (promotion, slots, rail health,
 * estimators) are exact and instant in tests. */
#ifndef ORB_TOPO_CLOCK_H
#define ORB_TOPO_CLOCK_H

#include <stdint.h>

struct orb_clock {
    uint64_t (*now_ns)(void *ctx); /* monotonic nanoseconds */
    void *ctx;
};

/* The real CLOCK_MONOTONIC clock. */
extern const struct orb_clock orb_clock_monotonic;

static inline uint64_t orb_clock_now(const struct orb_clock *c)
{
    return c->now_ns(c->ctx);
}

#endif
