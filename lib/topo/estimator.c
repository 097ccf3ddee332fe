/* Per-NIC bandwidth estimates and port rate decoding: see estimator.h. */
#include "estimator.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#include "core/error.h"

/* ---- port rate decoding ---- */

uint32_t orb_port_lane_mbps(uint32_t speed)
{
    switch (speed) {
    case ORB_SPEED_SDR: return 2500;
    case ORB_SPEED_DDR: return 5000;
    case ORB_SPEED_QDR: return 10000;
    case ORB_SPEED_FDR10: return 10000;
    case ORB_SPEED_FDR: return 14000;
    case ORB_SPEED_EDR: return 25000;
    case ORB_SPEED_HDR: return 50000;
    case ORB_SPEED_NDR: return 100000;
    case ORB_SPEED_XDR: return 200000;
    default: return 0;
    }
}

uint32_t orb_port_lanes(uint8_t width)
{
    switch (width) {
    case ORB_WIDTH_1X: return 1;
    case ORB_WIDTH_2X: return 2;
    case ORB_WIDTH_4X: return 4;
    case ORB_WIDTH_8X: return 8;
    case ORB_WIDTH_12X: return 12;
    default: return 0;
    }
}

uint64_t orb_port_link_mbps(const struct orb_port_rate_query *q)
{
    if (q == NULL)
        return 0;
    /* A bonded port's aggregate rate is what a single lane x width cannot describe. */
    if (q->lag_speed_100mbps != 0)
        return q->lag_speed_100mbps > UINT64_MAX / 100 ? 0 : q->lag_speed_100mbps * 100;
    uint32_t lane = orb_port_lane_mbps(q->active_speed_ex != 0 ? q->active_speed_ex
                                                               : q->active_speed);
    return (uint64_t)lane * orb_port_lanes(q->active_width);
}

/* ---- configuration ---- */

void orb_estimator_config_default(struct orb_estimator_config *cfg)
{
    cfg->default_bandwidth_gbps = 400.0;
    cfg->min_bandwidth_gbps = 1.0;
    cfg->max_bandwidth_gbps = 3200.0;
    cfg->clamp_low = 0.1;
    cfg->clamp_high = 10.0;
    cfg->selection_old_weight = 0.01;
    cfg->transmit_old_weight = 0.9;
    cfg->transmit_interval_ns = 10000000;
    cfg->transmit_window_ns = 50000000;
}

static int positive(double v)
{
    return isfinite(v) && v > 0.0;
}

static int weight(double v)
{
    return isfinite(v) && v >= 0.0 && v <= 1.0;
}

int orb_estimator_config_check(const struct orb_estimator_config *cfg)
{
    if (cfg == NULL)
        return orb_fail(ORB_EINVAL, "estimator config is NULL");
    if (!positive(cfg->min_bandwidth_gbps) || !positive(cfg->max_bandwidth_gbps) ||
        cfg->min_bandwidth_gbps > cfg->max_bandwidth_gbps)
        return orb_fail(ORB_ECONFIG, "min_bandwidth_gbps/max_bandwidth_gbps: need 0 < min <= max");
    if (!positive(cfg->default_bandwidth_gbps) ||
        cfg->default_bandwidth_gbps < cfg->min_bandwidth_gbps ||
        cfg->default_bandwidth_gbps > cfg->max_bandwidth_gbps)
        return orb_fail(ORB_ECONFIG, "default_bandwidth_gbps: must lie within [min, max]");
    if (!positive(cfg->clamp_low) || cfg->clamp_low > 1.0)
        return orb_fail(ORB_ECONFIG, "estimate clamp_low: must be in (0, 1]");
    if (!positive(cfg->clamp_high) || cfg->clamp_high < 1.0)
        return orb_fail(ORB_ECONFIG, "estimate clamp_high: must be finite and >= 1");
    if (!weight(cfg->selection_old_weight))
        return orb_fail(ORB_ECONFIG, "selection_old_weight: must be in [0, 1]");
    if (!weight(cfg->transmit_old_weight))
        return orb_fail(ORB_ECONFIG, "transmit_old_weight: must be in [0, 1]");
    if (cfg->transmit_interval_ns == 0 || cfg->transmit_window_ns < cfg->transmit_interval_ns)
        return orb_fail(ORB_ECONFIG,
                        "transmit interval/window: need 0 < interval <= window");
    return 0;
}

double orb_estimator_effective_gbps(const struct orb_estimator_config *cfg, uint64_t link_mbps)
{
    double gbps = (double)link_mbps / 1000.0;
    if (link_mbps == 0 || gbps < cfg->min_bandwidth_gbps || gbps > cfg->max_bandwidth_gbps)
        return cfg->default_bandwidth_gbps;
    return gbps;
}

/* ---- per-NIC estimator ---- */

static uint64_t bits_of(double v)
{
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    return b;
}

static double double_of(uint64_t b)
{
    double v;
    memcpy(&v, &b, sizeof v);
    return v;
}

static double load_double(const _Atomic uint64_t *slot)
{
    return double_of(atomic_load_explicit(slot, memory_order_relaxed));
}

static void seed(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                 uint64_t link_mbps)
{
    double bps = orb_estimator_effective_gbps(cfg, link_mbps) * 1e9 / 8.0;
    atomic_store_explicit(&e->link_mbps, link_mbps, memory_order_relaxed);
    atomic_store_explicit(&e->seed_bits, bits_of(bps), memory_order_relaxed);
    atomic_store_explicit(&e->selection_bits, bits_of(bps), memory_order_relaxed);
    atomic_store_explicit(&e->selection_inverse_bits, bits_of(1.0 / bps), memory_order_relaxed);
    atomic_store_explicit(&e->transmit_bits, bits_of(bps), memory_order_relaxed);
    atomic_store_explicit(&e->meter_ts, 0, memory_order_relaxed);
}

void orb_estimator_init(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                        uint64_t link_mbps)
{
    atomic_init(&e->posted_bytes, 0);
    atomic_init(&e->completed_bytes, 0);
    atomic_init(&e->busy_ns, 0);
    atomic_init(&e->busy_since, 0);
    atomic_init(&e->meter_completed, 0);
    atomic_init(&e->meter_busy_ns, 0);
    atomic_init(&e->meter_ts, 0);
    atomic_init(&e->link_mbps, 0);
    atomic_init(&e->seed_bits, 0);
    atomic_init(&e->selection_bits, 0);
    atomic_init(&e->selection_inverse_bits, 0);
    atomic_init(&e->transmit_bits, 0);
    seed(e, cfg, link_mbps);
}

void orb_estimator_set_link(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                            uint64_t link_mbps)
{
    seed(e, cfg, link_mbps);
}

double orb_estimator_seed_bps(const struct orb_nic_estimator *e)
{
    return load_double(&e->seed_bits);
}

double orb_estimator_selection_bps(const struct orb_nic_estimator *e)
{
    return load_double(&e->selection_bits);
}

double orb_estimator_selection_inverse(const struct orb_nic_estimator *e)
{
    return load_double(&e->selection_inverse_bits);
}

double orb_estimator_transmit_bps(const struct orb_nic_estimator *e)
{
    return load_double(&e->transmit_bits);
}

/* new = old_weight x old + (1 - old_weight) x sample, clamped to the seed's band; a compare and
 * swap loop so that concurrent samples all land. */
static void learn_into(_Atomic uint64_t *slot, const struct orb_nic_estimator *e,
                       const struct orb_estimator_config *cfg, double old_weight, double sample)
{
    double base = orb_estimator_seed_bps(e);
    double low = cfg->clamp_low * base;
    double high = cfg->clamp_high * base;
    uint64_t old_bits = atomic_load_explicit(slot, memory_order_relaxed);
    for (;;) {
        double next = old_weight * double_of(old_bits) + (1.0 - old_weight) * sample;
        if (!(next >= low)) /* also catches NaN */
            next = low;
        if (next > high)
            next = high;
        if (atomic_compare_exchange_weak_explicit(slot, &old_bits, bits_of(next),
                                                  memory_order_relaxed, memory_order_relaxed))
            return;
    }
}

void orb_estimator_learn(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                         uint64_t bytes, uint64_t elapsed_ns)
{
    if (bytes == 0 || elapsed_ns == 0)
        return;
    learn_into(&e->selection_bits, e, cfg, cfg->selection_old_weight,
               (double)bytes * 1e9 / (double)elapsed_ns);
    /* Publish the inverse of whatever the estimate now is, and again if another learner moved
     * it meanwhile: the last writer to pass the check leaves the two consistent. */
    for (;;) {
        uint64_t bits = atomic_load_explicit(&e->selection_bits, memory_order_relaxed);
        atomic_store_explicit(&e->selection_inverse_bits, bits_of(1.0 / double_of(bits)),
                              memory_order_relaxed);
        if (atomic_load_explicit(&e->selection_bits, memory_order_relaxed) == bits)
            return;
    }
}

void orb_estimator_posted(struct orb_nic_estimator *e, uint64_t bytes,
                          const struct orb_clock *clock)
{
    if (bytes == 0)
        return;
    /* Exactly one poster sees the idle -> busy edge and opens the stretch. */
    if (atomic_fetch_add_explicit(&e->posted_bytes, bytes, memory_order_relaxed) == 0)
        atomic_store_explicit(&e->busy_since, orb_clock_now(clock), memory_order_relaxed);
}

void orb_estimator_post_ended(struct orb_nic_estimator *e, uint64_t bytes,
                              const struct orb_clock *clock)
{
    if (bytes == 0)
        return;
    uint64_t before = atomic_load_explicit(&e->posted_bytes, memory_order_relaxed);
    uint64_t after;
    do {
        /* Never below zero: ending more than was posted is a caller bug, not a wrap. */
        after = before > bytes ? before - bytes : 0;
    } while (!atomic_compare_exchange_weak_explicit(&e->posted_bytes, &before, after,
                                                    memory_order_relaxed, memory_order_relaxed));
    if (before == 0 || after != 0)
        return;
    /* Bank the stretch that just closed. If another poster already opened the next one,
     * busy_since is ahead of now: bank nothing rather than an underflow. */
    uint64_t now_ns = orb_clock_now(clock);
    uint64_t since = atomic_load_explicit(&e->busy_since, memory_order_relaxed);
    if (now_ns > since)
        atomic_fetch_add_explicit(&e->busy_ns, now_ns - since, memory_order_relaxed);
}

void orb_estimator_completed(struct orb_nic_estimator *e, uint64_t bytes)
{
    atomic_fetch_add_explicit(&e->completed_bytes, bytes, memory_order_relaxed);
}

void orb_estimator_invalidate(struct orb_nic_estimator *e)
{
    atomic_store_explicit(&e->meter_ts, 0, memory_order_relaxed);
}

/* Busy time up to `now`: the banked stretches plus the open one. */
static uint64_t busy_at(const struct orb_nic_estimator *e, uint64_t now_ns)
{
    uint64_t busy = atomic_load_explicit(&e->busy_ns, memory_order_relaxed);
    if (atomic_load_explicit(&e->posted_bytes, memory_order_relaxed) != 0) {
        uint64_t since = atomic_load_explicit(&e->busy_since, memory_order_relaxed);
        if (now_ns > since)
            busy += now_ns - since;
    }
    return busy;
}

int orb_estimator_sample_transmit(struct orb_nic_estimator *e,
                                  const struct orb_estimator_config *cfg, uint64_t now_ns)
{
    if (now_ns == UINT64_MAX)
        return 0;
    uint64_t stamp = now_ns + 1; /* 0 is reserved for "no baseline" */
    uint64_t prev = atomic_load_explicit(&e->meter_ts, memory_order_relaxed);
    /* A timestamp older than the last sample (another lane's clock read) must not move the
     * baseline backwards. */
    if (prev != 0 && (stamp <= prev || stamp - prev < cfg->transmit_interval_ns))
        return 0;
    if (!atomic_compare_exchange_strong_explicit(&e->meter_ts, &prev, stamp, memory_order_acq_rel,
                                                 memory_order_relaxed))
        return 0; /* another caller owns this interval */

    uint64_t completed = atomic_load_explicit(&e->completed_bytes, memory_order_relaxed);
    uint64_t completed_before =
        atomic_exchange_explicit(&e->meter_completed, completed, memory_order_relaxed);
    uint64_t busy = busy_at(e, now_ns);
    uint64_t busy_before = atomic_exchange_explicit(&e->meter_busy_ns, busy, memory_order_relaxed);

    if (prev == 0)
        return 0; /* this sample only sets the baselines */
    /* Too long ago to describe the link as it is now, however busy it was. */
    if (stamp - prev > cfg->transmit_window_ns)
        return 0;
    if (completed <= completed_before || busy <= busy_before)
        return 0;
    learn_into(&e->transmit_bits, e, cfg, cfg->transmit_old_weight,
               (double)(completed - completed_before) * 1e9 / (double)(busy - busy_before));
    return 1;
}

uint64_t orb_estimator_posted_bytes(const struct orb_nic_estimator *e)
{
    return atomic_load_explicit(&e->posted_bytes, memory_order_relaxed);
}

uint64_t orb_estimator_completed_bytes(const struct orb_nic_estimator *e)
{
    return atomic_load_explicit(&e->completed_bytes, memory_order_relaxed);
}
