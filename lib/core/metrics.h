/* Internal: an engine's counters for orb_engine_metrics(). The data path adds to them with
 * relaxed atomics on one of a few cache-line-sized stripes, chosen per thread, so that threads
 * completing requests at the same time rarely touch the same line; a snapshot sums the stripes
 * (it takes no lock, and may see one thread's updates of a request before another's). */
#ifndef ORB_CORE_METRICS_H
#define ORB_CORE_METRICS_H

#include <stdatomic.h>
#include <stdint.h>

#include <orbite/orbite.h>

#define ORB_METRICS_STRIPES 8u
#define ORB_METRICS_STATUSES 17u /* -status for ORB_EINVAL (1) .. ORB_EAGAIN (16); 0 unused */

struct orb_metrics_stripe {
    _Alignas(64) atomic_uint_fast64_t requested[ORB_METRICS_TRANSPORTS][2][3]; /* requests, bytes, failed */
    atomic_uint_fast64_t served[ORB_METRICS_TRANSPORTS][2][3];
    atomic_uint_fast64_t withdrawn;
    atomic_uint_fast64_t failures[ORB_METRICS_STATUSES];
    atomic_uint_fast64_t latency[ORB_METRICS_LATENCY_BUCKETS];
    atomic_uint_fast64_t latency_sum_ns;
    atomic_uint_fast64_t notifications_received;
};

struct orb_metrics_counters {
    uint64_t created_ns;
    struct orb_metrics_stripe stripe[ORB_METRICS_STRIPES];
};

void orb_metrics_init(struct orb_metrics_counters *m);

/* A request of this engine ended: carried by transport `tp` (its id), `op` an enum orb_op,
 * `status` 0 (completed: `bytes` moved), negative (failed), or 1 for withdrawn before it started. */
void orb_metrics_requested(struct orb_metrics_counters *m, unsigned tp, unsigned op, uint64_t bytes, int status);

/* A peer's request, or a piece of one, served by this engine's source on transport `tp`:
 * `status` 0 when its `bytes` moved (`ends` 1 when it is the request's last piece: the request
 * counts then), negative when it was refused or failed. */
void orb_metrics_served(struct orb_metrics_counters *m, unsigned tp, unsigned op, uint64_t bytes, int ends, int status);

/* A batch settled `ns` after its first submission. */
void orb_metrics_batch(struct orb_metrics_counters *m, uint64_t ns);

void orb_metrics_notification(struct orb_metrics_counters *m);

/* The counters summed into the counter fields of *out (the caller fills gauges and the rest). */
void orb_metrics_sum(const struct orb_metrics_counters *m, struct orb_metrics *out);

#endif
