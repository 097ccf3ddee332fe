/* Internal: per-NIC bandwidth estimates and port rate decoding.
 *
 * Each NIC keeps two independent estimates, both clamped to [clamp_low, clamp_high] x its seed
 * (the effective link rate in bytes/s):
 *   - the selection estimate, an EWMA over successful payload samples (bytes moved over the time
 *     from the first post to the last payload completion), which the device selector divides
 *     into its charged bytes; old-value weight 0.01, so it follows the latest samples closely;
 *   - the transmit estimate, for deadline arbitration and admission: bytes completed over the
 *     time the NIC had posted payload outstanding ("busy" time), sampled at most once per 10 ms
 *     interval, dropped when the interval spans more than 50 ms of wall time, with old-value
 *     weight 0.9. Idle gaps between bursts are not charged, so a NIC that waits for work does
 *     not read as a slow link.
 * Failed or uncertain work never feeds either estimate: its selection sample is simply not
 * offered, and orb_estimator_invalidate() abandons the transmit interval it belonged to. Posted
 * debt that may still be on the wire stays posted until its completion or drain is reported.
 *
 * Thread safety: every field is atomic; updates from several worker threads and reads from the
 * selector may overlap. Two threads offering selection samples at once both land (compare and
 * swap). The busy-time bookkeeping is lock-free and may, in a rare race between one burst ending
 * and the next starting, drop that instant's busy time: it can only read the link slightly fast,
 * and the smoothing absorbs it.
 *
 * Time comes from an injected clock or is passed in (monotonic nanoseconds), so tests are exact. */
#ifndef ORB_TOPO_ESTIMATOR_H
#define ORB_TOPO_ESTIMATOR_H

#include <stdatomic.h>
#include <stdint.h>

#include "topo_clock.h"

/* ---- port rate decoding (the kernel's ib_port_speed / ib_port_width encodings, which
 * ibv_query_port reports in active_speed, active_speed_ex and active_width) ---- */

enum orb_port_speed {
    ORB_SPEED_SDR = 1,      /* 2.5 Gb/s per lane */
    ORB_SPEED_DDR = 2,      /* 5 */
    ORB_SPEED_QDR = 4,      /* 10 */
    ORB_SPEED_FDR10 = 8,    /* 10 */
    ORB_SPEED_FDR = 16,     /* 14 */
    ORB_SPEED_EDR = 32,     /* 25 */
    ORB_SPEED_HDR = 64,     /* 50 */
    ORB_SPEED_NDR = 128,    /* 100 */
    ORB_SPEED_XDR = 256     /* 200: only representable in active_speed_ex */
};

enum orb_port_width {
    ORB_WIDTH_1X = 1, ORB_WIDTH_4X = 2, ORB_WIDTH_8X = 4, ORB_WIDTH_12X = 8, ORB_WIDTH_2X = 16
};

/* What a port query returned. Zero means "not reported" for every field. */
struct orb_port_rate_query {
    uint8_t active_speed;
    uint8_t active_width;
    uint32_t active_speed_ex;       /* preferred over active_speed when non-zero */
    uint64_t lag_speed_100mbps;     /* ibv_query_port_speed()'s effective rate in 100 Mb/s units;
                                       preferred over speed x width when non-zero */
};

/* Per-lane rate in Mb/s for a speed code, 0 for an unknown code. */
uint32_t orb_port_lane_mbps(uint32_t speed);

/* Lane count for a width code, 0 for an unknown code. */
uint32_t orb_port_lanes(uint8_t width);

/* The link rate in Mb/s a query describes: the LAG rate when given, else the extended speed (or
 * the classic one) times the lane count; 0 when that cannot be decoded. */
uint64_t orb_port_link_mbps(const struct orb_port_rate_query *q);

/* ---- configuration ---- */

struct orb_estimator_config {
    double default_bandwidth_gbps;  /* 400: used for unknown or out-of-range link rates */
    double min_bandwidth_gbps;      /* 1: a decoded rate below this is out of range */
    double max_bandwidth_gbps;      /* 3200: a decoded rate above this is out of range */
    double clamp_low;               /* 0.1 x seed */
    double clamp_high;              /* 10 x seed */
    double selection_old_weight;    /* 0.01 */
    double transmit_old_weight;     /* 0.9 */
    uint64_t transmit_interval_ns;  /* 10 ms between transmit samples */
    uint64_t transmit_window_ns;    /* 50 ms: a longer interval is dropped, not learned */
};

void orb_estimator_config_default(struct orb_estimator_config *cfg);

/* ORB_ECONFIG naming the field when a value is not finite, not positive, or inconsistent
 * (min > max, default outside [min, max], clamp_low > 1 or clamp_high < 1, a weight outside
 * [0, 1], a zero interval or a window shorter than the interval). */
int orb_estimator_config_check(const struct orb_estimator_config *cfg);

/* The rate a link of `link_mbps` is seeded with, in Gb/s: link_mbps / 1000 when within
 * [min, max], otherwise default_bandwidth_gbps. */
double orb_estimator_effective_gbps(const struct orb_estimator_config *cfg, uint64_t link_mbps);

/* ---- per-NIC estimator ---- */

struct orb_nic_estimator {
    _Atomic uint64_t link_mbps;     /* as decoded; 0 unknown */
    _Atomic uint64_t seed_bits;     /* doubles stored as their bit patterns */
    _Atomic uint64_t selection_bits;
    _Atomic uint64_t selection_inverse_bits; /* 1 / selection, so a score needs no division */
    _Atomic uint64_t transmit_bits;
    _Atomic uint64_t posted_bytes;  /* payload debt handed to the NIC, not yet ended */
    _Atomic uint64_t completed_bytes; /* successful payload, monotonic */
    _Atomic uint64_t busy_ns;       /* banked time with debt outstanding */
    _Atomic uint64_t busy_since;    /* start of the current busy stretch */
    _Atomic uint64_t meter_ts;      /* last transmit sample time + 1; 0: no baseline */
    _Atomic uint64_t meter_completed;
    _Atomic uint64_t meter_busy_ns;
};

/* Seed both estimates from `link_mbps` (0 = unknown) and reset the transmit meter. Not
 * thread-safe against other calls on the same estimator: use it before the NIC carries traffic
 * or when its link renegotiates under the caller's own exclusion. */
void orb_estimator_init(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                        uint64_t link_mbps);

/* Re-seed after a port rescan; counters are kept, estimates restart from the new seed. */
void orb_estimator_set_link(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                            uint64_t link_mbps);

double orb_estimator_seed_bps(const struct orb_nic_estimator *e);
/* 1 / orb_estimator_selection_bps (seconds per byte), kept beside it for the selector's scan;
 * after concurrent updates settle the two agree. */
double orb_estimator_selection_inverse(const struct orb_nic_estimator *e);
double orb_estimator_selection_bps(const struct orb_nic_estimator *e);
double orb_estimator_transmit_bps(const struct orb_nic_estimator *e);

/* One successful selection sample: `bytes` of payload over `elapsed_ns` from first post to last
 * payload completion. A zero byte count or duration is ignored (no information). */
void orb_estimator_learn(struct orb_nic_estimator *e, const struct orb_estimator_config *cfg,
                         uint64_t bytes, uint64_t elapsed_ns);

/* Transmit bookkeeping. `posted` when payload WRs reach the NIC; `post_ended` when they leave it
 * (completion, flush or drain: every posted byte ends exactly once); `completed` for the bytes of
 * successful payload completions; `invalidate` when a post failed or its outcome is uncertain
 * (the interval is abandoned: the next sample only sets a baseline). `clock` is read only on an
 * idle <-> busy edge, so a steady stream of posts costs no clock reads. */
void orb_estimator_posted(struct orb_nic_estimator *e, uint64_t bytes,
                          const struct orb_clock *clock);
void orb_estimator_post_ended(struct orb_nic_estimator *e, uint64_t bytes,
                              const struct orb_clock *clock);
void orb_estimator_completed(struct orb_nic_estimator *e, uint64_t bytes);
void orb_estimator_invalidate(struct orb_nic_estimator *e);

/* Learn one transmit sample if at least transmit_interval_ns passed since the last one (one
 * caller per interval wins). Returns 1 when the estimate changed, else 0. */
int orb_estimator_sample_transmit(struct orb_nic_estimator *e,
                                  const struct orb_estimator_config *cfg, uint64_t now_ns);

/* Outstanding posted debt, and lifetime successful payload bytes. */
uint64_t orb_estimator_posted_bytes(const struct orb_nic_estimator *e);
uint64_t orb_estimator_completed_bytes(const struct orb_nic_estimator *e);

#endif
