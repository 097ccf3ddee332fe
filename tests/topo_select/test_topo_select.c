/* Slicing, port rate decoding, the bandwidth estimators and the device selector: every rule,
 * TENT's vectors, randomised properties, allocation/system-call counts and two-thread
 * contention. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <orbite/orbite.h>

#include "call_counter.h"
#include "topo/estimator.h"
#include "topo/selector.h"
#include "topo/slicing.h"

#define KIB 1024ull
#define MIB (1024ull * 1024ull)
#define BLOCK ORB_SLICE_BASE_BLOCK

/* ---- helpers ---- */

/* A deterministic clock that counts how often it is read. */
struct fake_clock {
    atomic_uint_fast64_t now;
    atomic_uint_fast64_t reads;
};

static uint64_t fake_now(void *ctx)
{
    struct fake_clock *c = ctx;
    atomic_fetch_add(&c->reads, 1);
    return atomic_load(&c->now);
}

static struct orb_clock clock_of(struct fake_clock *c)
{
    return (struct orb_clock){fake_now, c};
}

static uint64_t xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    return x;
}

static void fill_tiers(uint8_t tier[ORB_TOPO_MAX_NICS], uint8_t value)
{
    memset(tier, value, ORB_TOPO_MAX_NICS);
}

static struct orb_selector *make_selector(const struct orb_selector_config *cfg, uint32_t nnics,
                                          const uint64_t *links, struct fake_clock *fc)
{
    struct orb_clock clock = clock_of(fc);
    struct orb_selector *sel = NULL;
    assert_int_equal(orb_selector_create(cfg, nnics, links, &clock, &sel), 0);
    assert_non_null(sel);
    return sel;
}

static struct orb_selector *default_selector(uint32_t nnics, struct fake_clock *fc)
{
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    return make_selector(&cfg, nnics, NULL, fc);
}

static struct orb_nic_load load_of(struct orb_selector *sel, uint32_t nic)
{
    struct orb_nic_load loads[ORB_TOPO_MAX_NICS];
    uint32_t n = 0;
    assert_int_equal(orb_selector_load_stats(sel, loads, ORB_TOPO_MAX_NICS, &n), 0);
    assert_true(nic < n);
    return loads[nic];
}

static uint64_t charged_total(struct orb_selector *sel)
{
    struct orb_nic_load loads[ORB_TOPO_MAX_NICS];
    uint32_t n = 0;
    assert_int_equal(orb_selector_load_stats(sel, loads, ORB_TOPO_MAX_NICS, &n), 0);
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++)
        sum += loads[i].charged_bytes;
    return sum;
}

/* n equal slices of `len` bytes. */
static void equal_slices(struct orb_slice *s, uint32_t n, uint64_t len)
{
    for (uint32_t i = 0; i < n; i++)
        s[i] = (struct orb_slice){i * len, len};
}

static void count_by_nic(const struct orb_lease *lease, uint32_t counts[ORB_TOPO_MAX_NICS])
{
    memset(counts, 0, ORB_TOPO_MAX_NICS * sizeof counts[0]);
    for (uint32_t s = 0; s < lease->nslices; s++)
        counts[orb_lease_nic(lease, s)]++;
}

static int near(double a, double b, double rel)
{
    return fabs(a - b) <= rel * fabs(b);
}

/* ==== slicing ==== */

static void test_slice_limits(void **state)
{
    (void)state;
    assert_int_equal(orb_slice_limit(false, false), 64);
    assert_int_equal(orb_slice_limit(true, false), 32);
    assert_int_equal(orb_slice_limit(false, true), 32);
    assert_int_equal(orb_slice_limit(true, true), 32);
}

static void test_slice_rejects_bad_arguments(void **state)
{
    (void)state;
    struct orb_slice out[ORB_SLICE_MAX];
    uint32_t count = 77;
    uint64_t block = 99;
    assert_int_equal(orb_slice_plan(1000, 0, out, &count, &block), ORB_EINVAL);
    assert_int_equal(orb_slice_plan(1000, 65, out, &count, &block), ORB_EINVAL);
    assert_int_equal(orb_slice_plan(1000, 64, NULL, &count, &block), ORB_EINVAL);
    assert_int_equal(orb_slice_plan(1000, 64, out, NULL, &block), ORB_EINVAL);
    assert_int_equal(count, 77);
    assert_int_equal(block, 99);
}

static void test_slice_zero_length_is_one_empty_slice(void **state)
{
    (void)state;
    struct orb_slice out[ORB_SLICE_MAX];
    uint32_t count = 0;
    uint64_t block = 0;
    assert_int_equal(orb_slice_plan(0, 64, out, &count, &block), 0);
    assert_int_equal(count, 1);
    assert_int_equal(out[0].offset, 0);
    assert_int_equal(out[0].length, 0);
    assert_int_equal(block, BLOCK);
}

static void expect_plan(uint64_t length, uint32_t max, const uint64_t *lengths, uint32_t n,
                        uint64_t block)
{
    struct orb_slice out[ORB_SLICE_MAX];
    uint32_t count = 0;
    uint64_t got_block = 0;
    assert_int_equal(orb_slice_plan(length, max, out, &count, &got_block), 0);
    assert_int_equal(count, n);
    assert_int_equal(got_block, block);
    uint64_t offset = 0;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(out[i].offset, offset);
        assert_int_equal(out[i].length, lengths[i]);
        offset += out[i].length;
    }
    assert_int_equal(offset, length);
}

static void test_slice_small_requests(void **state)
{
    (void)state;
    expect_plan(1, 64, (const uint64_t[]){1}, 1, BLOCK);
    expect_plan(BLOCK, 64, (const uint64_t[]){BLOCK}, 1, BLOCK);
    /* 64K + 16K - 1: the 16K-1 tail is under a quarter block, so it joins the first slice. */
    expect_plan(BLOCK + 16 * KIB - 1, 64, (const uint64_t[]){BLOCK + 16 * KIB - 1}, 1, BLOCK);
    /* Exactly a quarter block is not folded. */
    expect_plan(BLOCK + 16 * KIB, 64, (const uint64_t[]){BLOCK, 16 * KIB}, 2, BLOCK);
    expect_plan(BLOCK + 1, 32, (const uint64_t[]){BLOCK + 1}, 1, BLOCK);
}

static void test_slice_tent_head_vectors_have_no_empty_slice(void **state)
{
    (void)state;
    /* TENT's HEAD plans 196618 bytes as [131072, 65546, 0]. */
    const uint64_t expect_196618[] = {BLOCK, BLOCK, BLOCK + 10};
    expect_plan(196618, 64, expect_196618, 3, BLOCK);
    expect_plan(196618, 32, expect_196618, 3, BLOCK);
    /* ...and 1048577 bytes as 16 slices, 7 of them empty. */
    uint64_t expect_1m[16];
    for (int i = 0; i < 16; i++)
        expect_1m[i] = BLOCK;
    expect_1m[15] = BLOCK + 1;
    expect_plan(1048577, 64, expect_1m, 16, BLOCK);
    expect_plan(1048577, 32, expect_1m, 16, BLOCK);
}

static void test_slice_adaptive_block(void **state)
{
    (void)state;
    /* 64 base blocks fit the READ limit exactly; WRITE doubles the block. */
    uint64_t lens[64];
    for (int i = 0; i < 64; i++)
        lens[i] = BLOCK;
    expect_plan(64 * BLOCK, 64, lens, 64, BLOCK);
    for (int i = 0; i < 32; i++)
        lens[i] = 2 * BLOCK;
    expect_plan(64 * BLOCK, 32, lens, 32, 2 * BLOCK);
    /* One byte more than 64 blocks: the block becomes 128K and the 1-byte tail folds. */
    lens[31] = 2 * BLOCK + 1;
    expect_plan(64 * BLOCK + 1, 64, lens, 32, 2 * BLOCK);
    /* A 100 MiB READ: ceil(100M / 64) = 1638400 = 25 blocks exactly. */
    for (int i = 0; i < 64; i++)
        lens[i] = 25 * BLOCK;
    expect_plan(100 * MIB, 64, lens, 64, 25 * BLOCK);
    /* One slice maximum: the whole request, whatever its size. */
    expect_plan(10 * MIB + 3, 1, (const uint64_t[]){10 * MIB + 3}, 1, 10 * MIB + BLOCK);
}

static void check_plan_invariants(uint64_t length, uint32_t max)
{
    struct orb_slice out[ORB_SLICE_MAX];
    uint32_t count = 0;
    uint64_t block = 0;
    assert_int_equal(orb_slice_plan(length, max, out, &count, &block), 0);
    assert_true(count >= 1 && count <= max);
    assert_true(block >= BLOCK);
    if (count > 1)
        assert_int_equal(block % BLOCK, 0);
    /* Base blocks unless the request needs more than `max` of them. */
    if (length / BLOCK + (length % BLOCK != 0) <= max)
        assert_int_equal(block, BLOCK);
    uint64_t offset = 0;
    for (uint32_t i = 0; i < count; i++) {
        assert_int_equal(out[i].offset, offset);
        if (length != 0)
            assert_true(out[i].length > 0);
        if (i + 1 < count) {
            assert_int_equal(out[i].length, block);
        } else if (count > 1) {
            assert_true(out[i].length >= block / 4);
            assert_true(out[i].length - block < block / 4 || out[i].length <= block);
        }
        assert_true(out[i].length <= length - offset);
        offset += out[i].length;
    }
    assert_int_equal(offset, length);
}

static void test_slice_huge_lengths_do_not_overflow(void **state)
{
    (void)state;
    const uint64_t lengths[] = {UINT64_MAX, UINT64_MAX - 1, UINT64_MAX - BLOCK,
                                UINT64_MAX / 2 + 1, (uint64_t)1 << 63, ((uint64_t)1 << 40) + 7};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        check_plan_invariants(lengths[i], 64);
        check_plan_invariants(lengths[i], 32);
        check_plan_invariants(lengths[i], 2);
        check_plan_invariants(lengths[i], 1);
    }
    struct orb_slice out[ORB_SLICE_MAX];
    uint32_t count = 0;
    uint64_t block = 0;
    assert_int_equal(orb_slice_plan(UINT64_MAX, 64, out, &count, &block), 0);
    assert_int_equal(block, (uint64_t)1 << 58);
    assert_int_equal(count, 64);
    assert_int_equal(out[63].length, ((uint64_t)1 << 58) - 1);
    assert_int_equal(orb_slice_plan(UINT64_MAX, 1, out, &count, &block), 0);
    assert_int_equal(count, 1);
    assert_int_equal(out[0].length, UINT64_MAX);
}

static void test_slice_random_lengths_property(void **state)
{
    (void)state;
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 20000; i++) {
        uint64_t r = xorshift(&rng);
        uint64_t length;
        switch (r % 4) {
        case 0: length = r >> 40; break;                    /* up to 16 MiB */
        case 1: length = (r >> 20) % (8 * MIB); break;
        case 2: length = xorshift(&rng) >> (r % 64); break; /* any magnitude */
        default: length = ((r >> 8) % 200) * BLOCK + (r >> 56); break; /* near block edges */
        }
        uint32_t max = (uint32_t)(xorshift(&rng) % 64) + 1;
        check_plan_invariants(length, max);
    }
}

/* ==== port rates ==== */

static void test_port_rate_decoding(void **state)
{
    (void)state;
    const struct { uint32_t code; uint32_t mbps; } speeds[] = {
        {1, 2500}, {2, 5000}, {4, 10000}, {8, 10000}, {16, 14000}, {32, 25000},
        {64, 50000}, {128, 100000}, {256, 200000}};
    for (size_t i = 0; i < sizeof speeds / sizeof speeds[0]; i++)
        assert_int_equal(orb_port_lane_mbps(speeds[i].code), speeds[i].mbps);
    const uint32_t bad_speeds[] = {0, 3, 5, 7, 9, 255, 257, 512, UINT32_MAX};
    for (size_t i = 0; i < sizeof bad_speeds / sizeof bad_speeds[0]; i++)
        assert_int_equal(orb_port_lane_mbps(bad_speeds[i]), 0);

    const struct { uint8_t code; uint32_t lanes; } widths[] = {
        {1, 1}, {2, 4}, {4, 8}, {8, 12}, {16, 2}};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        assert_int_equal(orb_port_lanes(widths[i].code), widths[i].lanes);
    const uint8_t bad_widths[] = {0, 3, 5, 32, 255};
    for (size_t i = 0; i < sizeof bad_widths / sizeof bad_widths[0]; i++)
        assert_int_equal(orb_port_lanes(bad_widths[i]), 0);
}

static void test_port_link_rate(void **state)
{
    (void)state;
    /* NDR 4x = 400 Gb/s; EDR 1x = 25; HDR 2x = 100. */
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_NDR, .active_width = ORB_WIDTH_4X}),
                     400000);
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_EDR, .active_width = ORB_WIDTH_1X}),
                     25000);
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_HDR, .active_width = ORB_WIDTH_2X}),
                     100000);
    /* XDR exists only in the extended field, which wins over the classic one. */
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_NDR, .active_speed_ex = ORB_SPEED_XDR,
                         .active_width = ORB_WIDTH_4X}),
                     800000);
    /* A LAG rate (100 Mb/s units) wins over speed x width. */
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_HDR, .active_width = ORB_WIDTH_4X,
                         .lag_speed_100mbps = 4000}),
                     400000);
    /* Unknown encodings decode to 0 (unknown), as does an absurd LAG rate. */
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = 3, .active_width = ORB_WIDTH_4X}),
                     0);
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .active_speed = ORB_SPEED_NDR, .active_width = 3}),
                     0);
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){
                         .lag_speed_100mbps = UINT64_MAX}),
                     0);
    assert_int_equal(orb_port_link_mbps(&(struct orb_port_rate_query){0}), 0);
    assert_int_equal(orb_port_link_mbps(NULL), 0);
}

static void test_effective_rate_falls_back_to_default(void **state)
{
    (void)state;
    struct orb_estimator_config cfg;
    orb_estimator_config_default(&cfg);
    assert_true(orb_estimator_effective_gbps(&cfg, 0) == 400.0);
    assert_true(orb_estimator_effective_gbps(&cfg, 25000) == 25.0);
    assert_true(orb_estimator_effective_gbps(&cfg, 2400000) == 2400.0);
    assert_true(orb_estimator_effective_gbps(&cfg, 999) == 400.0);      /* < 1 Gb/s */
    assert_true(orb_estimator_effective_gbps(&cfg, 3200001) == 400.0);  /* > 3200 Gb/s */
    cfg.default_bandwidth_gbps = 100.0;
    assert_true(orb_estimator_effective_gbps(&cfg, 0) == 100.0);
}

static void test_estimator_config_check(void **state)
{
    (void)state;
    struct orb_estimator_config good;
    orb_estimator_config_default(&good);
    assert_int_equal(orb_estimator_config_check(&good), 0);
    assert_int_equal(orb_estimator_config_check(NULL), ORB_EINVAL);

    struct orb_estimator_config bad;
#define EXPECT_BAD(field, value)                                        \
    do {                                                                \
        bad = good;                                                     \
        bad.field = value;                                              \
        assert_int_equal(orb_estimator_config_check(&bad), ORB_ECONFIG); \
    } while (0)
    EXPECT_BAD(default_bandwidth_gbps, 0.0);
    EXPECT_BAD(default_bandwidth_gbps, NAN);
    EXPECT_BAD(default_bandwidth_gbps, 5000.0);
    EXPECT_BAD(min_bandwidth_gbps, -1.0);
    EXPECT_BAD(min_bandwidth_gbps, 4000.0);
    EXPECT_BAD(max_bandwidth_gbps, INFINITY);
    EXPECT_BAD(clamp_low, 0.0);
    EXPECT_BAD(clamp_low, 1.5);
    EXPECT_BAD(clamp_high, 0.5);
    EXPECT_BAD(clamp_high, INFINITY);
    EXPECT_BAD(selection_old_weight, -0.1);
    EXPECT_BAD(selection_old_weight, 1.1);
    EXPECT_BAD(transmit_old_weight, NAN);
    EXPECT_BAD(transmit_interval_ns, 0);
    EXPECT_BAD(transmit_window_ns, 1000);
#undef EXPECT_BAD
}

/* ==== estimators ==== */

static void test_estimator_tent_vectors(void **state)
{
    (void)state;
    struct orb_estimator_config cfg;
    orb_estimator_config_default(&cfg);
    struct orb_nic_estimator e;

    /* 25 Gb/s seeds 3.125e9 B/s. */
    orb_estimator_init(&e, &cfg, 25000);
    assert_true(orb_estimator_seed_bps(&e) == 3.125e9);
    assert_true(orb_estimator_selection_bps(&e) == 3.125e9);
    assert_true(orb_estimator_transmit_bps(&e) == 3.125e9);

    /* 64 samples at 3.1e9 B/s converge within 2%. */
    for (int i = 0; i < 64; i++)
        orb_estimator_learn(&e, &cfg, 3100000, 1000000);
    assert_true(near(orb_estimator_selection_bps(&e), 3.1e9, 0.02));

    /* From the seed, a 1e13 B/s sample clamps to 10x, a 1e3 B/s one to 0.1x. */
    orb_estimator_init(&e, &cfg, 25000);
    orb_estimator_learn(&e, &cfg, 10000000000000ull, 1000000000);
    assert_true(orb_estimator_selection_bps(&e) == 31.25e9);
    orb_estimator_init(&e, &cfg, 25000);
    orb_estimator_learn(&e, &cfg, 1000, 1000000000);
    assert_true(orb_estimator_selection_bps(&e) == 0.3125e9);
    /* The transmit estimate is independent of selection samples. */
    assert_true(orb_estimator_transmit_bps(&e) == 3.125e9);
}

static void test_estimator_selection_weights_and_ignored_samples(void **state)
{
    (void)state;
    struct orb_estimator_config cfg;
    orb_estimator_config_default(&cfg);
    struct orb_nic_estimator e;
    orb_estimator_init(&e, &cfg, 100000); /* 12.5e9 B/s */
    /* One 10e9 B/s sample: 0.01 x 12.5e9 + 0.99 x 10e9. */
    orb_estimator_learn(&e, &cfg, 10000000, 1000000);
    assert_true(near(orb_estimator_selection_bps(&e), 0.01 * 12.5e9 + 0.99 * 10e9, 1e-12));
    double before = orb_estimator_selection_bps(&e);
    /* No bytes or no time is no information. */
    orb_estimator_learn(&e, &cfg, 0, 1000);
    orb_estimator_learn(&e, &cfg, 1000, 0);
    assert_true(orb_estimator_selection_bps(&e) == before);

    /* The inverse the selector multiplies by follows every update. */
    assert_true(orb_estimator_selection_inverse(&e) == 1.0 / orb_estimator_selection_bps(&e));

    /* Re-seeding after a rescan restarts the estimates but keeps the counters. */
    orb_estimator_completed(&e, 4096);
    orb_estimator_set_link(&e, &cfg, 0);
    assert_true(orb_estimator_seed_bps(&e) == 50e9); /* 400 Gb/s default */
    assert_true(orb_estimator_selection_bps(&e) == 50e9);
    assert_true(orb_estimator_selection_inverse(&e) == 1.0 / 50e9);
    assert_int_equal(orb_estimator_completed_bytes(&e), 4096);
}

struct learner {
    struct orb_nic_estimator *e;
    const struct orb_estimator_config *cfg;
    uint64_t seed;
};

static void *learn_many(void *arg)
{
    struct learner *l = arg;
    for (int i = 0; i < 20000; i++)
        orb_estimator_learn(l->e, l->cfg, xorshift(&l->seed) % 10000000 + 1, 1000000);
    return NULL;
}

/* Two threads feeding one NIC: every sample lands inside the clamp and the inverse ends up
 * consistent with the estimate. */
static void test_estimator_concurrent_learning(void **state)
{
    (void)state;
    struct orb_estimator_config cfg;
    orb_estimator_config_default(&cfg);
    struct orb_nic_estimator e;
    orb_estimator_init(&e, &cfg, 100000);
    struct learner l[2] = {{&e, &cfg, 11}, {&e, &cfg, 29}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, learn_many, &l[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    double bps = orb_estimator_selection_bps(&e);
    assert_true(bps >= 0.1 * 12.5e9 && bps <= 10.0 * 12.5e9);
    assert_true(orb_estimator_selection_inverse(&e) == 1.0 / bps);
}

static void test_estimator_transmit_meter(void **state)
{
    (void)state;
    struct orb_estimator_config cfg;
    orb_estimator_config_default(&cfg);
    struct orb_nic_estimator e;
    orb_estimator_init(&e, &cfg, 100000); /* 12.5e9 B/s */
    struct fake_clock fc = {0};
    struct orb_clock clock = clock_of(&fc);
    const uint64_t ms = 1000000;

    /* The first sample only sets the baselines (even at time 0). */
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 0), 0);

    /* Busy for 5 ms moving 50 MB, then idle for 5 ms: 10 GB/s, the idle gap not charged. */
    orb_estimator_posted(&e, 30000000, &clock);
    atomic_store(&fc.now, 2 * ms);
    orb_estimator_posted(&e, 20000000, &clock); /* already busy: no clock read */
    assert_int_equal(atomic_load(&fc.reads), 1);
    atomic_store(&fc.now, 5 * ms);
    orb_estimator_completed(&e, 50000000);
    orb_estimator_post_ended(&e, 30000000, &clock); /* still 20 MB outstanding: no read */
    assert_int_equal(atomic_load(&fc.reads), 1);
    orb_estimator_post_ended(&e, 20000000, &clock);
    assert_int_equal(atomic_load(&fc.reads), 2);
    assert_int_equal(orb_estimator_posted_bytes(&e), 0);

    /* Before the 10 ms interval: nothing. */
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 9 * ms), 0);
    assert_true(orb_estimator_transmit_bps(&e) == 12.5e9);
    /* At 10 ms: one sample of 50 MB / 5 ms busy, with old-value weight 0.9. */
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 10 * ms), 1);
    assert_true(near(orb_estimator_transmit_bps(&e), 0.9 * 12.5e9 + 0.1 * 10e9, 1e-12));
    double after_first = orb_estimator_transmit_bps(&e);
    /* The selection estimate is untouched by the meter. */
    assert_true(orb_estimator_selection_bps(&e) == 12.5e9);

    /* An open stretch counts up to the sample: busy from 12 ms to 20 ms, 40 MB done. */
    atomic_store(&fc.now, 12 * ms);
    orb_estimator_posted(&e, 64 * MIB, &clock);
    orb_estimator_completed(&e, 40000000);
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 20 * ms), 1);
    assert_true(near(orb_estimator_transmit_bps(&e), 0.9 * after_first + 0.1 * 5e9, 1e-12));
    double after_second = orb_estimator_transmit_bps(&e);

    /* An interval longer than the 50 ms window is dropped, but re-baselines. */
    orb_estimator_completed(&e, 1000000);
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 71 * ms), 0);
    assert_true(orb_estimator_transmit_bps(&e) == after_second);

    /* A failed or uncertain post invalidates the interval: the next sample only re-baselines. */
    orb_estimator_completed(&e, 1000000);
    orb_estimator_invalidate(&e);
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 90 * ms), 0);
    assert_true(orb_estimator_transmit_bps(&e) == after_second);
    /* No completed bytes in an interval: no sample. */
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 100 * ms), 0);
    /* A timestamp older than the last sample cannot move the baseline back. */
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 50 * ms), 0);

    /* Possible native debt stays posted until it is drained; over-ending clamps at zero. */
    assert_int_equal(orb_estimator_posted_bytes(&e), 64 * MIB);
    orb_estimator_post_ended(&e, 128 * MIB, &clock);
    assert_int_equal(orb_estimator_posted_bytes(&e), 0);

    /* A huge sample clamps to 10x the seed. */
    atomic_store(&fc.now, 200 * ms);
    orb_estimator_sample_transmit(&e, &cfg, 200 * ms); /* re-baseline after the long gap */
    orb_estimator_posted(&e, 1, &clock);
    orb_estimator_completed(&e, 1000000000000ull);
    atomic_store(&fc.now, 200 * ms + 1);
    orb_estimator_post_ended(&e, 1, &clock);
    assert_int_equal(orb_estimator_sample_transmit(&e, &cfg, 215 * ms), 1);
    assert_true(orb_estimator_transmit_bps(&e) == 125e9);
}

/* ==== selector: construction and arguments ==== */

static void test_selector_create_rejects(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_clock clock = clock_of(&fc);
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    struct orb_selector *sel = (struct orb_selector *)&fc; /* sentinel: must stay untouched */
    struct orb_selector *const untouched = sel;

    assert_int_equal(orb_selector_create(&cfg, 0, NULL, &clock, &sel), ORB_EINVAL);
    assert_int_equal(orb_selector_create(&cfg, 65, NULL, &clock, &sel), ORB_EINVAL);
    assert_int_equal(orb_selector_create(NULL, 2, NULL, &clock, &sel), ORB_EINVAL);
    assert_int_equal(orb_selector_create(&cfg, 2, NULL, NULL, &sel), ORB_EINVAL);
    struct orb_clock no_fn = {NULL, NULL};
    assert_int_equal(orb_selector_create(&cfg, 2, NULL, &no_fn, &sel), ORB_EINVAL);
    const double bad_weights[] = {0.0, -1.0, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad_weights / sizeof bad_weights[0]; i++) {
        struct orb_selector_config bad = cfg;
        bad.tier_weights[i % ORB_SELECT_TIERS] = bad_weights[i];
        assert_int_equal(orb_selector_create(&bad, 2, NULL, &clock, &sel), ORB_ECONFIG);
        assert_non_null(strstr(orb_last_error(), "tier_weights"));
    }
    struct orb_selector_config bad = cfg;
    bad.estimator.default_bandwidth_gbps = -5;
    assert_int_equal(orb_selector_create(&bad, 2, NULL, &clock, &sel), ORB_ECONFIG);
    assert_non_null(strstr(orb_last_error(), "default_bandwidth_gbps"));
    assert_ptr_equal(sel, untouched);

    orb_selector_free(NULL);
    assert_int_equal(orb_selector_create(&cfg, 64, NULL, &clock, &sel), 0);
    assert_int_equal(orb_selector_nic_count(sel), 64);
    orb_selector_free(sel);
}

static void test_selector_select_rejects_bad_arguments(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slices[ORB_SLICE_MAX + 1];
    equal_slices(slices, ORB_SLICE_MAX + 1, BLOCK);
    struct orb_lease lease;
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 0, &lease), ORB_EINVAL);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 65, &lease), ORB_EINVAL);
    assert_int_equal(orb_selector_select(NULL, tier, ~0ull, slices, 1, &lease), ORB_EINVAL);
    assert_int_equal(orb_selector_select(sel, NULL, ~0ull, slices, 1, &lease), ORB_EINVAL);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, NULL, 1, &lease), ORB_EINVAL);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 1, NULL), ORB_EINVAL);
    assert_int_equal(orb_selector_set_healthy(sel, 2, false), ORB_EINVAL);
    assert_int_equal(orb_selector_set_link(sel, 2, 1000), ORB_EINVAL);
    assert_int_equal(orb_selector_observe(sel, 2, 1, 1), ORB_EINVAL);
    assert_int_equal(orb_selector_note_posted(sel, 2, 1), ORB_EINVAL);
    assert_int_equal(orb_selector_note_post_ended(sel, 2, 1), ORB_EINVAL);
    assert_int_equal(orb_selector_note_completed(sel, 2, 1), ORB_EINVAL);
    assert_int_equal(orb_selector_invalidate_transmit(sel, 2), ORB_EINVAL);
    assert_null(orb_selector_estimator(sel, 2));
    struct orb_nic_load loads[1];
    uint32_t n = 9;
    assert_int_equal(orb_selector_load_stats(sel, loads, 1, &n), ORB_EINVAL);
    assert_int_equal(n, 9);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

/* The rate predictions use: the measured transmit estimate once there is one, else the
 * selection estimate, else 0. */
static void test_nic_load_rate(void **state)
{
    (void)state;
    struct orb_nic_load l;
    memset(&l, 0, sizeof l);
    assert_true(orb_nic_load_rate(&l) == 0);
    l.selection_bps = 3.125e9;
    assert_true(orb_nic_load_rate(&l) == 3.125e9);
    l.transmit_bps = 1.5e9;
    assert_true(orb_nic_load_rate(&l) == 1.5e9);
}

/* ==== selector: eligibility ==== */

static void test_selector_no_eligible_nic(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(4, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    struct orb_slice slices[4];
    equal_slices(slices, 4, BLOCK);
    struct orb_lease lease;
    memset(&lease, 0xab, sizeof lease);
    struct orb_lease untouched;
    memcpy(&untouched, &lease, sizeof lease);

    /* Every way of excluding all four: the tier row, invalid tiers, the peer mask, health, and
     * rows that only admit NICs the selector does not have. */
    fill_tiers(tier, ORB_SELECT_EXCLUDED);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 4, &lease), ORB_EUNAVAILABLE);
    fill_tiers(tier, 3);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 1, &lease), ORB_EUNAVAILABLE);
    fill_tiers(tier, 0);
    assert_int_equal(orb_selector_select(sel, tier, 0, slices, 4, &lease), ORB_EUNAVAILABLE);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull << 4, slices, 4, &lease),
                     ORB_EUNAVAILABLE);
    for (uint32_t i = 0; i < 4; i++)
        assert_int_equal(orb_selector_set_healthy(sel, i, false), 0);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 2, &lease), ORB_EUNAVAILABLE);
    assert_non_null(strstr(orb_last_error(), "no eligible NIC"));

    assert_memory_equal(&lease, &untouched, sizeof lease);
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(load_of(sel, 0).allocated_bytes, 0);
    orb_selector_free(sel);
}

static void test_selector_respects_every_exclusion(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(6, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    tier[0] = ORB_SELECT_EXCLUDED; /* the location's row excludes it */
    tier[1] = 7;                   /* an invalid rank fails closed */
    uint64_t peer = ~(1ull << 2);  /* no compatible peer path */
    assert_int_equal(orb_selector_set_healthy(sel, 3, false), 0); /* failed rail */
    /* Only NICs 4 and 5 remain; both modes and every path must stay on them. */
    struct orb_slice slices[ORB_SLICE_MAX];
    equal_slices(slices, ORB_SLICE_MAX, BLOCK);
    for (uint32_t round = 0; round < 300; round++) {
        uint32_t n = round % 3 == 0 ? 1 : (round % 3 == 1 ? 8 : 64);
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, peer, slices, n, &lease), 0);
        for (uint32_t s = 0; s < n; s++) {
            uint8_t nic = orb_lease_nic(&lease, s);
            assert_true(nic == 4 || nic == 5);
        }
        assert_int_equal(orb_lease_abandon(&lease), n);
    }
    /* Restoring health makes NIC 3 selectable again. */
    assert_int_equal(orb_selector_set_healthy(sel, 3, true), 0);
    struct orb_lease hold[2];
    assert_int_equal(orb_selector_select(sel, tier, peer, slices, 1, &hold[0]), 0);
    assert_int_equal(orb_selector_select(sel, tier, peer, slices, 1, &hold[1]), 0);
    struct orb_lease third;
    assert_int_equal(orb_selector_select(sel, tier, peer, slices, 1, &third), 0);
    uint32_t seen = (1u << orb_lease_nic(&hold[0], 0)) | (1u << orb_lease_nic(&hold[1], 0)) |
                    (1u << orb_lease_nic(&third, 0));
    assert_int_equal(seen, (1u << 3) | (1u << 4) | (1u << 5));
    orb_lease_abandon(&hold[0]);
    orb_lease_abandon(&hold[1]);
    orb_lease_abandon(&third);
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(load_of(sel, 3).healthy, 1);
    orb_selector_free(sel);
}

/* ==== selector: single-slice scoring ==== */

static void test_selector_single_slice_rotates_ties(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(3, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slice = {0, BLOCK};
    uint32_t counts[3] = {0};
    uint8_t previous = ORB_SELECT_EXCLUDED;
    for (int i = 0; i < 30; i++) {
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &lease), 0);
        uint8_t nic = orb_lease_nic(&lease, 0);
        assert_true(nic != previous); /* equal idle NICs never repeat back to back */
        previous = nic;
        counts[nic]++;
        assert_int_equal(orb_lease_consume(&lease, 0), 0);
    }
    assert_int_equal(counts[0], 10);
    assert_int_equal(counts[1], 10);
    assert_int_equal(counts[2], 10);
    orb_selector_free(sel);
}

static void test_selector_single_slice_lowest_score(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    /* NIC 0: 100 Gb/s, NIC 1: 400 Gb/s. Idle, NIC 1 wins on bandwidth. */
    const uint64_t links[] = {100000, 400000};
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    struct orb_selector *sel = make_selector(&cfg, 2, links, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slice = {0, MIB};
    struct orb_lease held[8];
    /* NIC 1 is 4x faster, so it takes slices until its charge is 4x NIC 0's: scores
     * (c1 + 1M)/4 vs (c0 + 1M). Starting empty: 1, 1, 1, then 0 (1M/1 = 4M/4 tie rotates). */
    for (int i = 0; i < 3; i++) {
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[i]), 0);
        assert_int_equal(orb_lease_nic(&held[i], 0), 1);
    }
    assert_int_equal(load_of(sel, 1).charged_bytes, 3 * MIB);
    assert_int_equal(load_of(sel, 0).charged_bytes, 0);
    for (int i = 0; i < 3; i++)
        orb_lease_abandon(&held[i]);

    /* A learned slowdown moves selection: NIC 1 measured at 1 GB/s, clamped at 0.1 x 50e9. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(orb_selector_observe(sel, 1, 1000000, 1000000), 0);
    assert_true(load_of(sel, 1).selection_bps == 5e9);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[0]), 0);
    assert_int_equal(orb_lease_nic(&held[0], 0), 0);
    orb_lease_abandon(&held[0]);

    /* An enormous charge (beyond 2^63) still scores as heavy, never as negative. */
    struct orb_slice huge = {0, ((uint64_t)1 << 63) + 5};
    assert_int_equal(orb_selector_select(sel, tier, 1ull << 0, &huge, 1, &held[0]), 0);
    assert_int_equal(orb_lease_nic(&held[0], 0), 0);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[1]), 0);
    assert_int_equal(orb_lease_nic(&held[1], 0), 1);
    orb_lease_abandon(&held[0]);
    orb_lease_abandon(&held[1]);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

static void test_selector_tier_weights_favour_idle_lower_rank(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, ORB_SELECT_EXCLUDED);
    tier[0] = 1; /* weight 5 */
    tier[1] = 0; /* weight 1 */
    struct orb_slice slice = {0, BLOCK};
    struct orb_lease held[8];
    /* NIC 1 takes slices while (c1 + s) < 5 (c0 + s) = 5s: four of them; the fifth ties
     * (5s vs 5s) and rotation gives it to either. */
    for (int i = 0; i < 4; i++) {
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[i]), 0);
        assert_int_equal(orb_lease_nic(&held[i], 0), 1);
    }
    /* Make NIC 1 clearly busier: now the idle rank-1 NIC wins. */
    struct orb_slice big = {0, 16 * BLOCK};
    assert_int_equal(orb_selector_select(sel, tier, 1ull << 1, &big, 1, &held[4]), 0);
    assert_int_equal(orb_lease_nic(&held[4], 0), 1);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[5]), 0);
    assert_int_equal(orb_lease_nic(&held[5], 0), 0);
    for (int i = 0; i < 6; i++)
        orb_lease_abandon(&held[i]);

    /* Configured weights apply: with equal weights, idle equal NICs tie and rotate. */
    orb_selector_free(sel);
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    cfg.tier_weights[1] = 1.0;
    sel = make_selector(&cfg, 2, NULL, &fc);
    uint32_t counts[2] = {0};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[0]), 0);
        counts[orb_lease_nic(&held[0], 0)]++;
        orb_lease_consume(&held[0], 0);
    }
    assert_int_equal(counts[0], 2);
    assert_int_equal(counts[1], 2);
    orb_selector_free(sel);
}

/* ==== selector: multi-slice parents ==== */

static void test_selector_multi_slice_weighted_split(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(3, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, ORB_SELECT_EXCLUDED);
    tier[0] = 2; /* weight 10 */
    tier[1] = 0; /* weight 1 */
    tier[2] = 1; /* weight 5 */
    struct orb_slice slices[ORB_SLICE_MAX];
    equal_slices(slices, ORB_SLICE_MAX, BLOCK);
    struct orb_lease lease;
    /* w proportional to 1, 1/5, 1/10 (sum 1.3): 64 slices -> floors 49, 9, 4 = 62, and the two
     * leftovers go to the best (NIC 1). Slices are consecutive in score order. */
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 64, &lease), 0);
    uint32_t counts[ORB_TOPO_MAX_NICS];
    count_by_nic(&lease, counts);
    assert_int_equal(counts[1], 51);
    assert_int_equal(counts[2], 9);
    assert_int_equal(counts[0], 4);
    for (uint32_t s = 0; s < 49; s++)
        assert_int_equal(orb_lease_nic(&lease, s), 1);
    for (uint32_t s = 49; s < 58; s++)
        assert_int_equal(orb_lease_nic(&lease, s), 2);
    for (uint32_t s = 58; s < 62; s++)
        assert_int_equal(orb_lease_nic(&lease, s), 0);
    assert_int_equal(orb_lease_nic(&lease, 62), 1);
    assert_int_equal(orb_lease_nic(&lease, 63), 1);
    assert_int_equal(orb_lease_nic(&lease, 64), ORB_SELECT_EXCLUDED);
    /* Charges are the exact slice lengths. */
    assert_int_equal(load_of(sel, 1).charged_bytes, 51 * BLOCK);
    assert_int_equal(load_of(sel, 2).charged_bytes, 9 * BLOCK);
    assert_int_equal(load_of(sel, 0).charged_bytes, 4 * BLOCK);
    assert_int_equal(orb_lease_abandon(&lease), 64);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

static void test_selector_multi_slice_leftovers_rotate_among_ties(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(3, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slices[8];
    equal_slices(slices, 8, BLOCK);
    /* Three equal idle NICs, 8 slices: 2 each plus 2 leftovers to the tied best, which
     * rotates from parent to parent. */
    uint32_t extra[3] = {0};
    for (int round = 0; round < 6; round++) {
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 8, &lease), 0);
        uint32_t counts[ORB_TOPO_MAX_NICS];
        count_by_nic(&lease, counts);
        int winners = 0;
        for (int i = 0; i < 3; i++) {
            assert_true(counts[i] == 2 || counts[i] == 4);
            if (counts[i] == 4) {
                extra[i]++;
                winners++;
            }
        }
        assert_int_equal(winners, 1);
        assert_int_equal(orb_lease_abandon(&lease), 8);
    }
    assert_int_equal(extra[0], 2);
    assert_int_equal(extra[1], 2);
    assert_int_equal(extra[2], 2);
    orb_selector_free(sel);
}

/* k identical idle NICs and k * m equal slices: exactly m each, whatever k and m (the floating
 * sum of equal weights must not floor a share of m to m - 1). */
static void test_selector_identical_nics_share_exactly(void **state)
{
    (void)state;
    for (uint32_t k = 2; k <= 16; k++) {
        for (uint32_t m = 1; m * k <= ORB_SLICE_MAX; m++) {
            struct fake_clock fc = {0};
            struct orb_selector_config cfg;
            orb_selector_config_default(&cfg);
            cfg.probe_interval = 0;
            struct orb_selector *sel = make_selector(&cfg, k, NULL, &fc);
            uint8_t tier[ORB_TOPO_MAX_NICS];
            fill_tiers(tier, 0);
            struct orb_slice slices[ORB_SLICE_MAX];
            equal_slices(slices, k * m, 128 * 1024);
            struct orb_lease lease;
            assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, k * m, &lease), 0);
            uint32_t counts[ORB_TOPO_MAX_NICS];
            count_by_nic(&lease, counts);
            for (uint32_t i = 0; i < k; i++)
                if (counts[i] != m)
                    fail_msg("%u identical NICs, %u slices: NIC %u got %u, expected %u", k, k * m, i, counts[i], m);
            assert_int_equal(orb_lease_abandon(&lease), k * m);
            orb_selector_free(sel);
        }
    }
    /* The two cases seen: 5 NICs x 5 slices, and a 4 MiB WRITE (32 x 128 KiB) over 16 NICs. With
     * n not a multiple of k, every NIC gets its floor and only the leftovers go to the best. */
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(16, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slices[ORB_SLICE_MAX];
    equal_slices(slices, 35, 128 * 1024);
    struct orb_lease lease;
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 35, &lease), 0);
    uint32_t counts[ORB_TOPO_MAX_NICS];
    count_by_nic(&lease, counts);
    uint32_t with_extra = 0;
    for (uint32_t i = 0; i < 16; i++) {
        assert_true(counts[i] == 2 || counts[i] == 5);
        with_extra += counts[i] == 5;
    }
    assert_int_equal(with_extra, 1);
    assert_int_equal(orb_lease_abandon(&lease), 35);
    orb_selector_free(sel);
}

static void test_selector_probe_every_100th_parent(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(4, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, ORB_SELECT_EXCLUDED);
    tier[0] = 0;
    tier[1] = 1;
    tier[2] = 2;
    tier[3] = 0;
    assert_int_equal(orb_selector_set_healthy(sel, 3, false), 0); /* never probed */
    struct orb_slice slices[6];
    equal_slices(slices, 6, BLOCK);
    struct orb_slice one = {0, BLOCK};
    for (int parent = 1; parent <= 300; parent++) {
        /* Single-slice parents do not count towards the probe. */
        struct orb_lease single;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &one, 1, &single), 0);
        assert_int_equal(orb_lease_nic(&single, 0), 0);
        orb_lease_abandon(&single);

        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 6, &lease), 0);
        uint32_t counts[ORB_TOPO_MAX_NICS];
        count_by_nic(&lease, counts);
        assert_int_equal(counts[3], 0);
        if (parent % 100 == 0) {
            /* Dealt round-robin over every eligible NIC, whatever its score. */
            assert_int_equal(counts[0], 2);
            assert_int_equal(counts[1], 2);
            assert_int_equal(counts[2], 2);
            for (uint32_t s = 1; s < 6; s++)
                assert_int_not_equal(orb_lease_nic(&lease, s), orb_lease_nic(&lease, s - 1));
        } else {
            /* Shares 4.6, 0.9, 0.5: floors 4, 0, 0 and both leftovers to NIC 0. */
            assert_int_equal(counts[0], 6);
        }
        orb_lease_abandon(&lease);
    }
    orb_selector_free(sel);

    /* probe_interval 0 never probes. */
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    cfg.probe_interval = 0;
    sel = make_selector(&cfg, 4, NULL, &fc);
    for (int parent = 1; parent <= 200; parent++) {
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 6, &lease), 0);
        uint32_t counts[ORB_TOPO_MAX_NICS];
        count_by_nic(&lease, counts);
        assert_int_equal(counts[0] + counts[3], 6);
        orb_lease_abandon(&lease);
    }
    orb_selector_free(sel);
}

static void test_selector_round_robin_when_smart_off(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    cfg.smart_selection = false;
    const uint64_t links[] = {100000, 400000, 200000, 25000};
    struct orb_selector *sel = make_selector(&cfg, 4, links, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, ORB_SELECT_EXCLUDED);
    tier[0] = 1;
    tier[1] = 1;
    tier[2] = 0;
    tier[3] = 0;
    struct orb_slice slices[5];
    equal_slices(slices, 5, BLOCK);
    /* Only the lowest non-empty tier (NICs 2 and 3), alternating across parents too, whatever
     * their rates; nothing is charged but everything is counted as allocated. */
    struct orb_lease lease;
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 5, &lease), 0);
    uint8_t expect = orb_lease_nic(&lease, 0);
    assert_true(expect == 2 || expect == 3);
    for (uint32_t s = 0; s < 5; s++) {
        assert_int_equal(orb_lease_nic(&lease, s), expect);
        expect = expect == 2 ? 3 : 2;
        assert_int_equal(lease.charge[s], 0);
    }
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(load_of(sel, 2).allocated_bytes + load_of(sel, 3).allocated_bytes,
                     5 * BLOCK);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 1, &lease), 0);
    assert_int_equal(orb_lease_nic(&lease, 0), expect);
    assert_int_equal(orb_lease_consume(&lease, 0), 0);
    assert_int_equal(orb_lease_consume(&lease, 0), ORB_EINVAL); /* still once only */

    /* The first tier excluded: round-robin over the next one. */
    assert_int_equal(orb_selector_set_healthy(sel, 2, false), 0);
    assert_int_equal(orb_selector_select(sel, tier, ~(1ull << 3), slices, 4, &lease), 0);
    uint32_t counts[ORB_TOPO_MAX_NICS];
    count_by_nic(&lease, counts);
    assert_int_equal(counts[0], 2);
    assert_int_equal(counts[1], 2);
    orb_lease_abandon(&lease);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

/* ==== selector: leases ==== */

static void test_lease_consume_and_abandon(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    /* A plan with a folded tail: the last slice is charged its exact, longer length. */
    struct orb_slice slices[ORB_SLICE_MAX];
    uint32_t n = 0;
    assert_int_equal(orb_slice_plan(4 * BLOCK + 100, 32, slices, &n, NULL), 0);
    assert_int_equal(n, 4);
    struct orb_lease lease;
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, n, &lease), 0);
    assert_int_equal(charged_total(sel), 4 * BLOCK + 100);
    assert_int_equal(load_of(sel, 0).allocated_bytes + load_of(sel, 1).allocated_bytes,
                     4 * BLOCK + 100);

    /* Out of range and repeated consumes change nothing. */
    assert_int_equal(orb_lease_consume(&lease, 4), ORB_EINVAL);
    assert_int_equal(orb_lease_consume(NULL, 0), ORB_EINVAL);
    assert_int_equal(orb_lease_consume(&lease, 3), 0); /* the folded BLOCK + 100 */
    assert_int_equal(charged_total(sel), 3 * BLOCK);
    assert_int_equal(orb_lease_consume(&lease, 3), ORB_EINVAL);
    assert_non_null(strstr(orb_last_error(), "already returned"));
    assert_int_equal(charged_total(sel), 3 * BLOCK);
    assert_int_equal(orb_lease_consume(&lease, 0), 0);

    /* Abandon returns only the two unconsumed slices, once. */
    assert_int_equal(orb_lease_abandon(&lease), 2);
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(orb_lease_abandon(&lease), 0);
    assert_int_equal(orb_lease_consume(&lease, 1), ORB_EINVAL);
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(orb_lease_abandon(NULL), 0);
    /* Allocated bytes are lifetime: they stay. */
    assert_int_equal(load_of(sel, 0).allocated_bytes + load_of(sel, 1).allocated_bytes,
                     4 * BLOCK + 100);

    /* A zero-length request: one empty slice, selected, nothing charged. */
    assert_int_equal(orb_slice_plan(0, 64, slices, &n, NULL), 0);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, n, &lease), 0);
    assert_true(orb_lease_nic(&lease, 0) < 2);
    assert_int_equal(charged_total(sel), 0);
    assert_int_equal(orb_lease_consume(&lease, 0), 0);

    /* A full 64-slice lease works end to end. */
    equal_slices(slices, 64, 1000);
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, 64, &lease), 0);
    assert_int_equal(orb_lease_consume(&lease, 63), 0);
    assert_int_equal(orb_lease_abandon(&lease), 63);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

/* ==== selector: statistics, estimates and clock use ==== */

static void test_selector_load_stats_and_links(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    const uint64_t links[] = {25000, 0, 5000000};
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    struct orb_selector *sel = make_selector(&cfg, 3, links, &fc);
    struct orb_nic_load loads[3];
    uint32_t n = 0;
    assert_int_equal(orb_selector_load_stats(sel, loads, 3, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(loads[0].nic, 0);
    assert_int_equal(loads[0].link_mbps, 25000);
    assert_int_equal(loads[0].effective_mbps, 25000);
    assert_true(loads[0].selection_bps == 3.125e9);
    assert_true(loads[0].transmit_bps == 3.125e9);
    assert_int_equal(loads[1].link_mbps, 0);          /* unknown */
    assert_int_equal(loads[1].effective_mbps, 400000); /* default */
    assert_int_equal(loads[2].link_mbps, 5000000);    /* out of range */
    assert_int_equal(loads[2].effective_mbps, 400000);
    assert_true(loads[2].selection_bps == 50e9);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(loads[i].healthy, 1);
        assert_int_equal(loads[i].charged_bytes, 0);
        assert_int_equal(loads[i].posted_bytes, 0);
        assert_int_equal(loads[i].completed_bytes, 0);
        assert_int_equal(loads[i].allocated_bytes, 0);
    }

    assert_int_equal(orb_selector_set_link(sel, 1, 200000), 0);
    assert_int_equal(orb_selector_set_healthy(sel, 2, false), 0);
    assert_int_equal(orb_selector_note_posted(sel, 0, 4096), 0);
    assert_int_equal(orb_selector_note_completed(sel, 0, 1024), 0);
    assert_int_equal(orb_selector_load_stats(sel, loads, 3, &n), 0);
    assert_int_equal(loads[1].effective_mbps, 200000);
    assert_true(loads[1].selection_bps == 25e9);
    assert_int_equal(loads[2].healthy, 0);
    assert_int_equal(loads[0].posted_bytes, 4096);
    assert_int_equal(loads[0].completed_bytes, 1024);

    /* The estimator handle is the same one the stats read. */
    struct orb_nic_estimator *e = orb_selector_estimator(sel, 0);
    assert_non_null(e);
    assert_int_equal(orb_estimator_posted_bytes(e), 4096);
    assert_true(orb_selector_estimator_config(sel)->default_bandwidth_gbps == 400.0);
    orb_selector_free(sel);
}

static void test_selector_transmit_uses_injected_clock(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc); /* 50e9 B/s seeds */
    const uint64_t ms = 1000000;
    assert_int_equal(orb_selector_sample_transmit(sel), 0); /* baselines */
    assert_int_equal(atomic_load(&fc.reads), 1);
    assert_int_equal(orb_selector_note_posted(sel, 0, 1000), 0); /* idle -> busy: one read */
    assert_int_equal(orb_selector_note_posted(sel, 0, 1000), 0); /* busy: none */
    assert_int_equal(atomic_load(&fc.reads), 2);
    atomic_store(&fc.now, 4 * ms);
    assert_int_equal(orb_selector_note_completed(sel, 0, 20000000), 0);
    assert_int_equal(orb_selector_note_post_ended(sel, 0, 1000), 0); /* still busy: none */
    assert_int_equal(atomic_load(&fc.reads), 2);
    assert_int_equal(orb_selector_note_post_ended(sel, 0, 1000), 0); /* busy -> idle: one */
    assert_int_equal(atomic_load(&fc.reads), 3);
    atomic_store(&fc.now, 10 * ms);
    /* 20 MB over 4 ms busy = 5e9 B/s on NIC 0 only. */
    assert_int_equal(orb_selector_sample_transmit(sel), 1);
    assert_true(near(load_of(sel, 0).transmit_bps, 0.9 * 50e9 + 0.1 * 5e9, 1e-12));
    assert_true(load_of(sel, 1).transmit_bps == 50e9);
    /* Invalidation: the next sample learns nothing. */
    assert_int_equal(orb_selector_note_posted(sel, 0, 1000), 0);
    atomic_store(&fc.now, 15 * ms);
    assert_int_equal(orb_selector_note_completed(sel, 0, 1000000), 0);
    assert_int_equal(orb_selector_invalidate_transmit(sel, 0), 0);
    atomic_store(&fc.now, 25 * ms);
    assert_int_equal(orb_selector_sample_transmit(sel), 0);
    orb_selector_free(sel);
}

/* Selection, consumption and abandonment in every mode allocate nothing, make no system call
 * and never read the clock. */
static void test_selector_no_allocation_no_syscall(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector_config smart_cfg, rr_cfg;
    orb_selector_config_default(&smart_cfg);
    orb_selector_config_default(&rr_cfg);
    rr_cfg.smart_selection = false;
    struct orb_selector *smart = make_selector(&smart_cfg, 16, NULL, &fc);
    struct orb_selector *rr = make_selector(&rr_cfg, 16, NULL, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    for (int i = 0; i < ORB_TOPO_MAX_NICS; i++)
        tier[i] = (uint8_t)(i % 3);
    struct orb_slice slices[ORB_SLICE_MAX];
    struct orb_lease lease;

    uint64_t heap_before = orb_test_heap_calls();
    uint64_t sys_before = orb_test_system_calls();
    uint64_t reads_before = atomic_load(&fc.reads);
    for (int round = 0; round < 1000; round++) {
        struct orb_selector *sel = round % 2 ? smart : rr;
        uint32_t count = 0;
        assert_int_equal(orb_slice_plan((uint64_t)round * 7919, 64, slices, &count, NULL), 0);
        if (round % 3 == 0)
            count = 1;
        if (orb_selector_select(sel, tier, ~0ull, slices, count, &lease) != 0)
            fail();
        for (uint32_t s = 0; s < count / 2; s++)
            orb_lease_consume(&lease, s);
        orb_lease_abandon(&lease);
        orb_selector_observe(sel, (uint32_t)round % 16, 65536, 10000);
        orb_selector_note_completed(sel, 1, 100);
    }
    assert_int_equal(orb_test_heap_calls() - heap_before, 0);
    assert_int_equal(orb_test_system_calls() - sys_before, 0);
    assert_int_equal(atomic_load(&fc.reads) - reads_before, 0);
    assert_int_equal(charged_total(smart), 0);

    /* The counters do count: creating a selector allocates, a real clock calls the kernel
     * interface. */
    struct orb_selector *extra = make_selector(&smart_cfg, 1, NULL, &fc);
    assert_true(orb_test_heap_calls() > heap_before);
    orb_selector_free(extra);
    struct orb_selector *real = NULL;
    assert_int_equal(orb_selector_create(&smart_cfg, 1, NULL, &orb_clock_monotonic, &real), 0);
    orb_selector_note_posted(real, 0, 1);
    assert_true(orb_test_system_calls() > sys_before);
    orb_selector_free(real);

    orb_selector_free(smart);
    orb_selector_free(rr);
}

/* ==== properties over random inputs ==== */

struct held_lease {
    struct orb_lease lease;
    bool live;
};

static void test_selector_random_property(void **state)
{
    (void)state;
    uint64_t rng = 0x2545f4914f6cdd1dull;
    static struct held_lease held[32];
    for (int trial = 0; trial < 40; trial++) {
        struct fake_clock fc = {0};
        struct orb_selector_config cfg;
        orb_selector_config_default(&cfg);
        cfg.smart_selection = trial % 5 != 4;
        cfg.probe_interval = (uint32_t)(xorshift(&rng) % 4) * 7; /* 0, 7, 14, 21 */
        uint32_t nnics = (uint32_t)(xorshift(&rng) % 16) + 1;
        uint64_t links[16];
        for (uint32_t i = 0; i < nnics; i++)
            links[i] = (xorshift(&rng) % 8) * 50000; /* 0 (unknown) .. 350 Gb/s */
        struct orb_selector *sel = make_selector(&cfg, nnics, links, &fc);
        memset(held, 0, sizeof held);
        uint64_t assigned = 0;

        for (int op = 0; op < 400; op++) {
            uint64_t r = xorshift(&rng);
            if (r % 9 == 0) {
                orb_selector_set_healthy(sel, (uint32_t)(r >> 8) % nnics, (r >> 20) % 3 != 0);
                continue;
            }
            if (r % 9 == 1) {
                orb_selector_observe(sel, (uint32_t)(r >> 8) % nnics, (r >> 16) % 100000000 + 1,
                                     (r >> 40) % 10000000 + 1);
                continue;
            }
            struct held_lease *h = &held[(r >> 8) % 32];
            if (h->live) {
                /* Retire some slices, maybe abandon the rest. */
                for (uint32_t s = 0; s < h->lease.nslices; s++) {
                    if (xorshift(&rng) % 2)
                        orb_lease_consume(&h->lease, s);
                }
                if (xorshift(&rng) % 2) {
                    orb_lease_abandon(&h->lease);
                    h->live = false;
                }
                continue;
            }
            uint8_t tier[ORB_TOPO_MAX_NICS];
            for (int i = 0; i < ORB_TOPO_MAX_NICS; i++) {
                uint64_t t = xorshift(&rng) % 5;
                tier[i] = t < 3 ? (uint8_t)t : (t == 3 ? ORB_SELECT_EXCLUDED : 9);
            }
            uint64_t peer = xorshift(&rng) | xorshift(&rng);
            struct orb_nic_load before[ORB_TOPO_MAX_NICS];
            uint32_t n = 0;
            assert_int_equal(orb_selector_load_stats(sel, before, ORB_TOPO_MAX_NICS, &n), 0);
            uint64_t eligible = 0;
            for (uint32_t i = 0; i < nnics; i++) {
                if (tier[i] < 3 && before[i].healthy && ((peer >> i) & 1))
                    eligible |= 1ull << i;
            }
            struct orb_slice slices[ORB_SLICE_MAX];
            uint32_t count = 0;
            uint64_t length = xorshift(&rng) % (64 * MIB);
            assert_int_equal(orb_slice_plan(length, (uint32_t)(r >> 32) % 64 + 1, slices, &count,
                                            NULL), 0);
            int rc = orb_selector_select(sel, tier, peer, slices, count, &h->lease);
            if (eligible == 0) {
                assert_int_equal(rc, ORB_EUNAVAILABLE);
                continue;
            }
            assert_int_equal(rc, 0);
            h->live = true;
            assigned += length;
            uint32_t lowest_tier = 3;
            for (uint32_t i = 0; i < nnics; i++) {
                if (((eligible >> i) & 1) && tier[i] < lowest_tier)
                    lowest_tier = tier[i];
            }
            for (uint32_t s = 0; s < count; s++) {
                uint8_t nic = orb_lease_nic(&h->lease, s);
                assert_true(nic < nnics);
                assert_true((eligible >> nic) & 1); /* never excluded, failed or peerless */
                if (!cfg.smart_selection)
                    assert_int_equal(tier[nic], lowest_tier);
            }
        }
        for (int i = 0; i < 32; i++) {
            if (held[i].live)
                orb_lease_abandon(&held[i].lease);
        }
        /* Every charge returned; every assigned byte counted once. */
        struct orb_nic_load after[ORB_TOPO_MAX_NICS];
        uint32_t n = 0;
        assert_int_equal(orb_selector_load_stats(sel, after, ORB_TOPO_MAX_NICS, &n), 0);
        uint64_t allocated = 0;
        for (uint32_t i = 0; i < n; i++) {
            assert_int_equal(after[i].charged_bytes, 0);
            allocated += after[i].allocated_bytes;
        }
        assert_int_equal(allocated, assigned);
        orb_selector_free(sel);
    }
}

/* The multi-slice split over random loads matches the rule computed independently: every NIC
 * but the best gets floor(w_i / sum(w) x n); the best gets the rest. */
static void test_selector_leftover_distribution_property(void **state)
{
    (void)state;
    uint64_t rng = 0xda942042e4dd58b5ull;
    for (int trial = 0; trial < 300; trial++) {
        struct fake_clock fc = {0};
        struct orb_selector_config cfg;
        orb_selector_config_default(&cfg);
        cfg.probe_interval = 0;
        uint32_t nnics = (uint32_t)(xorshift(&rng) % 16) + 1;
        uint64_t links[16];
        for (uint32_t i = 0; i < nnics; i++)
            links[i] = (xorshift(&rng) % 16 + 1) * 25000;
        struct orb_selector *sel = make_selector(&cfg, nnics, links, &fc);
        uint8_t tier[ORB_TOPO_MAX_NICS];
        for (int i = 0; i < ORB_TOPO_MAX_NICS; i++)
            tier[i] = (uint8_t)(xorshift(&rng) % 3);
        /* Random standing load through single-slice leases of random size. */
        struct orb_lease load[8];
        for (int i = 0; i < 8; i++) {
            struct orb_slice s = {0, xorshift(&rng) % (32 * MIB) + 1};
            assert_int_equal(orb_selector_select(sel, tier, ~0ull, &s, 1, &load[i]), 0);
        }
        struct orb_nic_load before[ORB_TOPO_MAX_NICS];
        uint32_t n = 0;
        assert_int_equal(orb_selector_load_stats(sel, before, ORB_TOPO_MAX_NICS, &n), 0);

        uint32_t nslices = (uint32_t)(xorshift(&rng) % 63) + 2;
        struct orb_slice slices[ORB_SLICE_MAX];
        equal_slices(slices, nslices, BLOCK);
        double share[ORB_TOPO_MAX_NICS];
        double total = 0.0, best_score = INFINITY;
        for (uint32_t i = 0; i < nnics; i++) {
            double score = ((double)before[i].charged_bytes + BLOCK) / before[i].selection_bps *
                           cfg.tier_weights[tier[i]];
            share[i] = 1.0 / (score + 1e-12);
            total += share[i];
            if (score < best_score)
                best_score = score;
        }
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, nslices, &lease), 0);
        uint32_t counts[ORB_TOPO_MAX_NICS];
        count_by_nic(&lease, counts);
        uint32_t floors = 0, extra_holders = 0;
        for (uint32_t i = 0; i < nnics; i++) {
            double exact = share[i] / total * nslices;
            uint32_t lo = (uint32_t)floor(exact * (1 - 1e-9));
            uint32_t hi = (uint32_t)floor(exact * (1 + 1e-9));
            floors += lo;
            if (counts[i] > hi) {
                extra_holders++;
                double score = 1.0 / share[i] - 1e-12;
                assert_true(score <= best_score * (1 + 1e-6)); /* only the best gets leftovers */
            } else {
                assert_true(counts[i] >= lo);
            }
        }
        assert_true(extra_holders <= 1);
        assert_true(floors <= nslices);
        orb_lease_abandon(&lease);
        for (int i = 0; i < 8; i++)
            orb_lease_abandon(&load[i]);
        assert_int_equal(charged_total(sel), 0);
        orb_selector_free(sel);
    }
}

/* ==== two threads contending ==== */

struct contender {
    struct orb_selector *sel;
    uint64_t seed;
    uint64_t assigned;
    uint64_t bad_choices;
    uint64_t failures;
    pthread_mutex_t *handoff_lock;
    struct orb_lease *handoff;      /* leases passed to the other thread to consume */
    atomic_int *handoff_ready;
};

#define CONTEND_ROUNDS 20000

static void *contend(void *arg)
{
    struct contender *c = arg;
    uint8_t tier[ORB_TOPO_MAX_NICS];
    for (int i = 0; i < ORB_TOPO_MAX_NICS; i++)
        tier[i] = (uint8_t)(i % 4 == 3 ? ORB_SELECT_EXCLUDED : i % 3);
    for (int round = 0; round < CONTEND_ROUNDS; round++) {
        struct orb_slice slices[ORB_SLICE_MAX];
        uint32_t n = 0;
        uint64_t length = xorshift(&c->seed) % (8 * MIB);
        if (orb_slice_plan(length, round % 2 ? 64 : 32, slices, &n, NULL) != 0) {
            c->failures++;
            continue;
        }
        struct orb_lease lease;
        if (orb_selector_select(c->sel, tier, ~0ull, slices, n, &lease) != 0) {
            c->failures++;
            continue;
        }
        c->assigned += length;
        for (uint32_t s = 0; s < n; s++) {
            uint8_t nic = orb_lease_nic(&lease, s);
            if (nic % 4 == 3 || nic == 5)
                c->bad_choices++;
        }
        if (round % 7 == 0 && c->handoff != NULL) {
            /* Hand the lease to the other thread, which consumes it there. */
            pthread_mutex_lock(c->handoff_lock);
            if (atomic_load(c->handoff_ready) == 0) {
                *c->handoff = lease;
                atomic_store(c->handoff_ready, 1);
                pthread_mutex_unlock(c->handoff_lock);
                continue;
            }
            pthread_mutex_unlock(c->handoff_lock);
        }
        if (round % 3 == 0) {
            orb_lease_abandon(&lease);
        } else {
            for (uint32_t s = 0; s < n; s++)
                orb_lease_consume(&lease, s);
        }
        /* Take a handed-over lease, if any, and retire it from this thread. */
        if (c->handoff != NULL && atomic_load(c->handoff_ready) == 1) {
            pthread_mutex_lock(c->handoff_lock);
            if (atomic_load(c->handoff_ready) == 1) {
                struct orb_lease taken = *c->handoff;
                atomic_store(c->handoff_ready, 0);
                pthread_mutex_unlock(c->handoff_lock);
                for (uint32_t s = 0; s < taken.nslices; s += 2)
                    orb_lease_consume(&taken, s);
                orb_lease_abandon(&taken);
            } else {
                pthread_mutex_unlock(c->handoff_lock);
            }
        }
        if (round % 50 == 0)
            orb_selector_observe(c->sel, (uint32_t)round % 8, 1000000, 100000);
    }
    return NULL;
}

static void test_selector_two_threads_contending(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(8, &fc);
    assert_int_equal(orb_selector_set_healthy(sel, 5, false), 0);
    pthread_mutex_t handoff_lock = PTHREAD_MUTEX_INITIALIZER;
    struct orb_lease handoff;
    atomic_int ready = 0;
    struct contender c[2] = {
        {.sel = sel, .seed = 0x1234567, .handoff_lock = &handoff_lock, .handoff = &handoff,
         .handoff_ready = &ready},
        {.sel = sel, .seed = 0x7654321, .handoff_lock = &handoff_lock, .handoff = &handoff,
         .handoff_ready = &ready},
    };
    uint64_t heap_before = orb_test_heap_calls();
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, contend, &c[i]), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    (void)heap_before; /* pthread_create's own allocations are not ours to count here */
    if (atomic_load(&ready) == 1)
        orb_lease_abandon(&handoff);

    for (int i = 0; i < 2; i++) {
        assert_int_equal(c[i].failures, 0);
        assert_int_equal(c[i].bad_choices, 0);
    }
    struct orb_nic_load loads[ORB_TOPO_MAX_NICS];
    uint32_t n = 0;
    assert_int_equal(orb_selector_load_stats(sel, loads, ORB_TOPO_MAX_NICS, &n), 0);
    uint64_t allocated = 0;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(loads[i].charged_bytes, 0);
        allocated += loads[i].allocated_bytes;
    }
    assert_int_equal(allocated, c[0].assigned + c[1].assigned);
    assert_int_equal(loads[3].allocated_bytes, 0);
    assert_int_equal(loads[5].allocated_bytes, 0);
    assert_int_equal(loads[7].allocated_bytes, 0);
    orb_selector_free(sel);
}

/* ==== charges kept per thread ==== */

struct holder {
    struct orb_selector *sel;
    uint64_t nic_mask;
    uint64_t length;
    struct orb_lease lease;
    int rc;
};

static void *hold_one(void *arg)
{
    struct holder *h = arg;
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slice = {0, h->length};
    h->rc = orb_selector_select(h->sel, tier, h->nic_mask, &slice, 1, &h->lease);
    return NULL;
}

/* Place `parents` parents of `width` MiB slices (each returned at once, so this thread's own
 * charges stay zero); once `*placed` reaches ORB_SELECT_OTHERS_REFRESH, every slice must go to
 * NIC `expected`. */
static void place_and_expect(struct orb_selector *sel, uint32_t width, uint32_t parents,
                             uint32_t *placed, uint8_t expected)
{
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slices[ORB_SLICE_MAX];
    for (uint32_t s = 0; s < width; s++)
        slices[s] = (struct orb_slice){s * MIB, MIB};
    for (uint32_t p = 0; p < parents; p++) {
        struct orb_lease lease;
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, slices, width, &lease), 0);
        for (uint32_t s = 0; s < width; s++) {
            if (*placed >= ORB_SELECT_OTHERS_REFRESH)
                assert_int_equal(orb_lease_nic(&lease, s), expected);
        }
        *placed += width;
        assert_int_equal(orb_lease_abandon(&lease), width);
    }
}

/* Another thread's charge: exact at once in the statistics, and seen by this thread's
 * selections, of one slice or several, before they have placed ORB_SELECT_OTHERS_REFRESH slices
 * more. A charge returned on a thread other than the one that took it leaves every total exact. */
static void test_selector_threads_see_each_others_charges(void **state)
{
    (void)state;
    for (uint32_t width = 1; width <= 8; width *= 2) {
        struct fake_clock fc = {0};
        struct orb_selector *sel = default_selector(2, &fc);
        uint32_t placed = 0;
        /* This thread's first selection sums the others (none yet). */
        place_and_expect(sel, 1, 1, &placed, 0);

        struct holder h = {.sel = sel, .nic_mask = 1ull << 1, .length = 1024 * MIB};
        pthread_t t;
        assert_int_equal(pthread_create(&t, NULL, hold_one, &h), 0);
        assert_int_equal(pthread_join(t, NULL), 0);
        assert_int_equal(h.rc, 0);
        assert_int_equal(orb_lease_nic(&h.lease, 0), 1);
        assert_int_equal(load_of(sel, 1).charged_bytes, 1024 * MIB);
        assert_int_equal(load_of(sel, 0).charged_bytes, 0);

        uint32_t parents = (ORB_SELECT_OTHERS_REFRESH + 32) / width;
        place_and_expect(sel, width, parents, &placed, 0);
        /* Returned here, taken there: the totals are exact again. */
        assert_int_equal(orb_lease_consume(&h.lease, 0), 0);
        assert_int_equal(charged_total(sel), 0);
        assert_int_equal(load_of(sel, 0).allocated_bytes + load_of(sel, 1).allocated_bytes,
                         (1024 + 1 + parents * width) * MIB);
        /* Once this thread sums again, NIC 1 is idle for it: slices spread over both NICs. */
        uint8_t tier[ORB_TOPO_MAX_NICS];
        fill_tiers(tier, 0);
        struct orb_slice slice = {0, MIB};
        uint32_t on_one = 0;
        for (uint32_t i = 0; i < 2 * ORB_SELECT_OTHERS_REFRESH; i++) {
            struct orb_lease lease;
            assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &lease), 0);
            on_one += orb_lease_nic(&lease, 0) == 1;
            assert_int_equal(orb_lease_consume(&lease, 0), 0);
        }
        assert_true(on_one >= ORB_SELECT_OTHERS_REFRESH / 4);
        orb_selector_free(sel);
    }
}

struct returner {
    struct orb_lease *leases;
    uint32_t n;
};

static void *return_all(void *arg)
{
    struct returner *r = arg;
    for (uint32_t i = 0; i < r->n; i++)
        orb_lease_consume(&r->leases[i], 0);
    return NULL;
}

/* Charges returned on another thread are gone for the thread that took them at once (they go
 * back to its shard): after 32 slices forced onto NIC 1 and returned elsewhere, the next ones
 * spread evenly, with no sum of the others in between. And orb_selector_refresh() makes another
 * thread's charge count at once. */
static void test_selector_returns_reach_the_taker_at_once(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice slice = {0, MIB};
    static struct orb_lease forced[32], held[8];
    for (uint32_t i = 0; i < 32; i++)
        assert_int_equal(orb_selector_select(sel, tier, 1ull << 1, &slice, 1, &forced[i]), 0);
    struct returner ret = {.leases = forced, .n = 32};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, return_all, &ret), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(charged_total(sel), 0);
    uint32_t on[2] = {0, 0};
    for (uint32_t i = 0; i < 8; i++) {
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &held[i]), 0);
        on[orb_lease_nic(&held[i], 0)]++;
    }
    assert_int_equal(on[0], 4);
    assert_int_equal(on[1], 4);
    for (uint32_t i = 0; i < 8; i++)
        orb_lease_abandon(&held[i]);

    /* Another thread charges NIC 1 heavily; a refresh here sees it before the next selection. */
    struct orb_lease probe;
    struct holder h = {.sel = sel, .nic_mask = 1ull << 1, .length = 1024 * MIB};
    assert_int_equal(pthread_create(&t, NULL, hold_one, &h), 0);
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(h.rc, 0);
    orb_selector_refresh(sel);
    orb_selector_refresh(NULL);
    for (uint32_t i = 0; i < 4; i++) {
        assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &probe), 0);
        assert_int_equal(orb_lease_nic(&probe, 0), 0);
        assert_int_equal(orb_lease_consume(&probe, 0), 0);
    }
    orb_lease_abandon(&h.lease);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

/* A charge beyond ORB_SELECT_CHARGE_MAX is charged at the cap, returned exactly, and still scores
 * as heavy; lifetime bytes count the whole length. */
static void test_selector_charge_is_capped(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(2, &fc);
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice huge[2] = {{0, UINT64_MAX / 2}, {UINT64_MAX / 2, UINT64_MAX / 2}};
    struct orb_lease a, b, c;
    assert_int_equal(orb_selector_select(sel, tier, 1ull << 0, huge, 1, &a), 0);
    assert_int_equal(orb_selector_select(sel, tier, 1ull << 0, huge, 2, &b), 0);
    assert_int_equal(load_of(sel, 0).charged_bytes, 3 * ORB_SELECT_CHARGE_MAX);
    assert_int_equal(load_of(sel, 0).allocated_bytes, 3 * (UINT64_MAX / 2));
    struct orb_slice slice = {0, MIB};
    assert_int_equal(orb_selector_select(sel, tier, ~0ull, &slice, 1, &c), 0);
    assert_int_equal(orb_lease_nic(&c, 0), 1);
    orb_lease_abandon(&a);
    orb_lease_abandon(&b);
    orb_lease_abandon(&c);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

#define PAIR_PARENTS 2000          /* at least this many parents per round */
#define PAIR_HELD_MAX 8192
#define PAIR_READS 64              /* and at least this many reads during the round */
#define PAIR_ROUNDS 20

struct pair_writer {
    struct orb_selector *sel;
    pthread_barrier_t *round_end;
    atomic_int placed_all;          /* 1 once this round's parents are all placed */
    atomic_uint reads;              /* the reader's reads this round */
    int failures;
    struct orb_lease held[PAIR_HELD_MAX];
};

/* Rounds of parents of two equal slices over two idle NICs (one slice each), held until the
 * round ends, so that charges only grow while the reader reads. A round lasts until the reader
 * has read a few times, however the two threads are scheduled. */
static void *place_pairs(void *arg)
{
    struct pair_writer *w = arg;
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_slice two[2] = {{0, MIB}, {MIB, MIB}};
    for (int round = 0; round < PAIR_ROUNDS; round++) {
        uint32_t held = 0;
        while (held < PAIR_PARENTS || atomic_load(&w->reads) < PAIR_READS) {
            if (held == PAIR_HELD_MAX) {
                sched_yield();
                continue;
            }
            struct orb_lease *l = &w->held[held];
            if (orb_selector_select(w->sel, tier, ~0ull, two, 2, l) != 0) {
                w->failures++;
                break;
            }
            held++;
            if (orb_lease_nic(l, 0) == orb_lease_nic(l, 1))
                w->failures++;
        }
        atomic_store(&w->placed_all, 1);
        pthread_barrier_wait(w->round_end); /* the reader has stopped reading */
        for (uint32_t i = 0; i < held; i++)
            orb_lease_abandon(&w->held[i]);
        atomic_store(&w->reads, 0);
        atomic_store(&w->placed_all, 0);
        pthread_barrier_wait(w->round_end); /* the reader may read again */
    }
    return NULL;
}

/* A multi-slice parent's charges are seen all or none. Another thread keeps placing parents of
 * one slice on each of two idle NICs (charged in NIC order, NIC 0 first) while the statistics
 * are read (NIC 0 first): with charges only growing, NIC 0 can never read above NIC 1 unless a
 * parent was seen half charged. */
static void test_selector_parent_charges_seen_whole(void **state)
{
    (void)state;
    struct fake_clock fc = {0};
    struct orb_selector_config cfg;
    orb_selector_config_default(&cfg);
    cfg.probe_interval = 0; /* every parent split by score: one slice per idle NIC */
    struct orb_selector *sel = make_selector(&cfg, 2, NULL, &fc);
    pthread_barrier_t round_end;
    assert_int_equal(pthread_barrier_init(&round_end, NULL, 2), 0);
    struct pair_writer *w = calloc(1, sizeof *w);
    assert_non_null(w);
    w->sel = sel;
    w->round_end = &round_end;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, place_pairs, w), 0);
    uint64_t torn = 0, in_flight = 0;
    for (int round = 0; round < PAIR_ROUNDS; round++) {
        while (atomic_load(&w->placed_all) == 0) {
            struct orb_nic_load loads[2];
            uint32_t n = 0;
            assert_int_equal(orb_selector_load_stats(sel, loads, 2, &n), 0);
            torn += loads[0].charged_bytes > loads[1].charged_bytes;
            in_flight += loads[0].charged_bytes != 0 && loads[1].charged_bytes != 0;
            atomic_fetch_add(&w->reads, 1);
        }
        pthread_barrier_wait(&round_end);
        pthread_barrier_wait(&round_end);
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    pthread_barrier_destroy(&round_end);
    assert_int_equal(w->failures, 0);
    assert_true(in_flight > 0);
    assert_int_equal(torn, 0);
    assert_int_equal(charged_total(sel), 0);
    free(w);
    orb_selector_free(sel);
}

#define CROWD 12

struct crowd_member {
    struct orb_selector *sel;
    pthread_barrier_t *claimed;
    uint32_t shard;
    uint64_t assigned;
    int failures;
};

static void *crowd_run(void *arg)
{
    struct crowd_member *m = arg;
    m->shard = orb_selector_thread_shard();
    pthread_barrier_wait(m->claimed); /* every member holds its claim at once */
    uint8_t tier[ORB_TOPO_MAX_NICS];
    fill_tiers(tier, 0);
    struct orb_lease held[4];
    for (uint32_t round = 0; round < 4000; round++) {
        struct orb_slice slices[3] = {{0, 4096 + round}, {8192, 4096}, {16384, 4096}};
        uint32_t n = round % 5 == 0 ? 3 : 1;
        struct orb_lease *l = &held[round % 4];
        if (round >= 4)
            orb_lease_abandon(l);
        if (orb_selector_select(m->sel, tier, ~0ull, slices, n, l) != 0) {
            m->failures++;
            continue;
        }
        for (uint32_t s = 0; s < n; s++)
            m->assigned += slices[s].length;
    }
    for (int i = 0; i < 4; i++)
        orb_lease_abandon(&held[i]);
    return NULL;
}

/* More threads than owned shards: the first ones own theirs, the rest share one, totals stay
 * exact; an exited thread's shard goes to the next thread; a forked child's threads find the
 * parent's other threads' claims gone. */
static void test_selector_more_threads_than_shards(void **state)
{
    (void)state;
    uint32_t main_shard = orb_selector_thread_shard();
    assert_true(main_shard <= ORB_SELECT_OWNED_SHARDS);
    assert_int_equal(orb_selector_thread_shard(), main_shard); /* claimed once */
    struct fake_clock fc = {0};
    struct orb_selector *sel = default_selector(8, &fc);
    pthread_barrier_t claimed;
    assert_int_equal(pthread_barrier_init(&claimed, NULL, CROWD), 0);
    struct crowd_member m[CROWD];
    pthread_t t[CROWD];
    for (int i = 0; i < CROWD; i++) {
        m[i] = (struct crowd_member){.sel = sel, .claimed = &claimed};
        assert_int_equal(pthread_create(&t[i], NULL, crowd_run, &m[i]), 0);
    }
    for (int i = 0; i < CROWD; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&claimed);
    uint32_t owned_mask = main_shard < ORB_SELECT_OWNED_SHARDS ? 1u << main_shard : 0;
    uint32_t shared = 0;
    uint64_t assigned = 0;
    for (int i = 0; i < CROWD; i++) {
        assert_int_equal(m[i].failures, 0);
        assigned += m[i].assigned;
        if (m[i].shard == ORB_SELECT_OWNED_SHARDS) {
            shared++;
            continue;
        }
        assert_true(m[i].shard < ORB_SELECT_OWNED_SHARDS);
        assert_int_equal(owned_mask & (1u << m[i].shard), 0); /* owned by one thread only */
        owned_mask |= 1u << m[i].shard;
    }
    assert_int_equal(owned_mask, (1u << ORB_SELECT_OWNED_SHARDS) - 1);
    uint32_t owned_by_crowd = ORB_SELECT_OWNED_SHARDS - (main_shard < ORB_SELECT_OWNED_SHARDS);
    assert_int_equal(shared, CROWD - owned_by_crowd);
    struct orb_nic_load loads[ORB_TOPO_MAX_NICS];
    uint32_t n = 0;
    assert_int_equal(orb_selector_load_stats(sel, loads, ORB_TOPO_MAX_NICS, &n), 0);
    uint64_t allocated = 0;
    for (uint32_t i = 0; i < n; i++) {
        assert_int_equal(loads[i].charged_bytes, 0);
        allocated += loads[i].allocated_bytes;
    }
    assert_int_equal(allocated, assigned);

    /* The crowd has exited: a new thread owns a shard again. */
    struct crowd_member late = {.sel = sel};
    pthread_barrier_t alone;
    assert_int_equal(pthread_barrier_init(&alone, NULL, 1), 0);
    late.claimed = &alone;
    pthread_t lt;
    assert_int_equal(pthread_create(&lt, NULL, crowd_run, &late), 0);
    assert_int_equal(pthread_join(lt, NULL), 0);
    pthread_barrier_destroy(&alone);
    assert_true(late.shard < ORB_SELECT_OWNED_SHARDS);
    assert_int_equal(charged_total(sel), 0);
    orb_selector_free(sel);
}

struct claim_hold {
    pthread_barrier_t *claimed;
    pthread_barrier_t *release;
    uint32_t shard;
};

static void *claim_and_wait(void *arg)
{
    struct claim_hold *c = arg;
    c->shard = orb_selector_thread_shard();
    pthread_barrier_wait(c->claimed);
    pthread_barrier_wait(c->release);
    return NULL;
}

static void *claim_only(void *arg)
{
    *(uint32_t *)arg = orb_selector_thread_shard();
    return NULL;
}

/* Every owned shard held by live threads, then fork: in the child only the forking thread's
 * claim is left. (The child starts no thread: sanitizers do not support that after a fork of a
 * multi-threaded process.) */
static void test_selector_shards_after_fork(void **state)
{
    (void)state;
    uint32_t main_shard = orb_selector_thread_shard();
    assert_true(main_shard < ORB_SELECT_OWNED_SHARDS); /* the crowd before has exited */
    pthread_barrier_t claimed, release;
    assert_int_equal(pthread_barrier_init(&claimed, NULL, ORB_SELECT_OWNED_SHARDS + 1), 0);
    assert_int_equal(pthread_barrier_init(&release, NULL, ORB_SELECT_OWNED_SHARDS + 1), 0);
    struct claim_hold c[ORB_SELECT_OWNED_SHARDS];
    pthread_t t[ORB_SELECT_OWNED_SHARDS];
    for (uint32_t i = 0; i < ORB_SELECT_OWNED_SHARDS; i++) {
        c[i] = (struct claim_hold){.claimed = &claimed, .release = &release};
        assert_int_equal(pthread_create(&t[i], NULL, claim_and_wait, &c[i]), 0);
    }
    pthread_barrier_wait(&claimed);
    /* The main thread and 8 more: every owned shard is taken, so one more thread shares. */
    uint32_t extra = 0;
    pthread_t et;
    assert_int_equal(pthread_create(&et, NULL, claim_only, &extra), 0);
    assert_int_equal(pthread_join(et, NULL), 0);
    assert_int_equal(extra, ORB_SELECT_OWNED_SHARDS);
    assert_int_equal(orb_selector_owned_shards(), (1u << ORB_SELECT_OWNED_SHARDS) - 1);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(orb_selector_owned_shards() == 1u << main_shard &&
              orb_selector_thread_shard() == main_shard ? 0 : 1);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    pthread_barrier_wait(&release);
    for (uint32_t i = 0; i < ORB_SELECT_OWNED_SHARDS; i++)
        assert_int_equal(pthread_join(t[i], NULL), 0);
    pthread_barrier_destroy(&claimed);
    pthread_barrier_destroy(&release);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nic_load_rate),
        cmocka_unit_test(test_slice_limits),
        cmocka_unit_test(test_slice_rejects_bad_arguments),
        cmocka_unit_test(test_slice_zero_length_is_one_empty_slice),
        cmocka_unit_test(test_slice_small_requests),
        cmocka_unit_test(test_slice_tent_head_vectors_have_no_empty_slice),
        cmocka_unit_test(test_slice_adaptive_block),
        cmocka_unit_test(test_slice_huge_lengths_do_not_overflow),
        cmocka_unit_test(test_slice_random_lengths_property),
        cmocka_unit_test(test_port_rate_decoding),
        cmocka_unit_test(test_port_link_rate),
        cmocka_unit_test(test_effective_rate_falls_back_to_default),
        cmocka_unit_test(test_estimator_config_check),
        cmocka_unit_test(test_estimator_tent_vectors),
        cmocka_unit_test(test_estimator_selection_weights_and_ignored_samples),
        cmocka_unit_test(test_estimator_concurrent_learning),
        cmocka_unit_test(test_estimator_transmit_meter),
        cmocka_unit_test(test_selector_create_rejects),
        cmocka_unit_test(test_selector_select_rejects_bad_arguments),
        cmocka_unit_test(test_selector_no_eligible_nic),
        cmocka_unit_test(test_selector_respects_every_exclusion),
        cmocka_unit_test(test_selector_single_slice_rotates_ties),
        cmocka_unit_test(test_selector_single_slice_lowest_score),
        cmocka_unit_test(test_selector_tier_weights_favour_idle_lower_rank),
        cmocka_unit_test(test_selector_multi_slice_weighted_split),
        cmocka_unit_test(test_selector_multi_slice_leftovers_rotate_among_ties),
        cmocka_unit_test(test_selector_identical_nics_share_exactly),
        cmocka_unit_test(test_selector_probe_every_100th_parent),
        cmocka_unit_test(test_selector_round_robin_when_smart_off),
        cmocka_unit_test(test_lease_consume_and_abandon),
        cmocka_unit_test(test_selector_load_stats_and_links),
        cmocka_unit_test(test_selector_transmit_uses_injected_clock),
        cmocka_unit_test(test_selector_no_allocation_no_syscall),
        cmocka_unit_test(test_selector_random_property),
        cmocka_unit_test(test_selector_leftover_distribution_property),
        cmocka_unit_test(test_selector_two_threads_contending),
        cmocka_unit_test(test_selector_threads_see_each_others_charges),
        cmocka_unit_test(test_selector_returns_reach_the_taker_at_once),
        cmocka_unit_test(test_selector_charge_is_capped),
        cmocka_unit_test(test_selector_parent_charges_seen_whole),
        cmocka_unit_test(test_selector_more_threads_than_shards),
        cmocka_unit_test(test_selector_shards_after_fork),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
