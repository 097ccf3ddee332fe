/* A settable clock for the topology tests: time moves only when a test moves it. */
#ifndef ORB_TEST_FAKE_CLOCK_H
#define ORB_TEST_FAKE_CLOCK_H

#include <stdatomic.h>
#include <stdint.h>

#include "topo/topo_clock.h"

struct fake_clock {
    atomic_uint_fast64_t now;
    struct orb_clock clock;
};

static inline uint64_t fake_clock_read(void *ctx)
{
    struct fake_clock *fc = ctx;
    return atomic_load(&fc->now);
}

static inline void fake_clock_init(struct fake_clock *fc, uint64_t start)
{
    atomic_init(&fc->now, start);
    fc->clock.now_ns = fake_clock_read;
    fc->clock.ctx = fc;
}

static inline void fake_clock_set(struct fake_clock *fc, uint64_t t)
{
    atomic_store(&fc->now, t);
}

static inline void fake_clock_advance(struct fake_clock *fc, uint64_t d)
{
    atomic_fetch_add(&fc->now, d);
}

#define MS 1000000ull
#define SEC 1000000000ull

#endif
