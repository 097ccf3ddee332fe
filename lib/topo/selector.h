/* Internal: the device selector, which picks a local NIC for every slice of an RDMA request.
 *
 * Eligibility is a hard limit computed per call: a NIC is a candidate only when the caller's
 * tier row admits it (rank 0..2; ORB_SELECT_EXCLUDED or anything >= ORB_SELECT_TIERS excludes
 * it; the row already folds in the device mask, the location's matrix ranks and strict NUMA),
 * when the selector's own health mask has it healthy, and when the caller's peer mask has it
 * (a compatible path to the peer exists). Weights can favour an idle lower-ranked NIC but never
 * admit an excluded or failed one.
 *
 * Smart selection (the default) scores each candidate as
 *     score = (charged_bytes + slice_bytes) / selection_bandwidth x tier_weight[tier]
 * where slice_bytes is the parent's first slice (the plan's block). A one-slice parent takes the
 * lowest score; scores within a relative 1e-9 of the lowest are ties and rotate through a
 * per-thread counter. A parent of n >= 2 slices gives each candidate,
 * in ascending score order, floor(w_i / sum(w) x n) consecutive slices with
 * w_i = 1 / (score_i + 1e-12), and the leftovers to the best candidate (the tie-rotated lowest
 * score). Every probe_interval-th multi-slice parent (100) of a thread instead deals its slices
 * round-robin over all candidates, so that every eligible NIC keeps producing samples. With smart
 * selection off, slices go round-robin over the candidates of the lowest non-empty tier, and
 * nothing is charged.
 *
 * Charges are kept per thread, so that threads selecting at once neither wait for each other
 * nor pass cache lines back and forth: each of the first ORB_SELECT_OWNED_SHARDS threads that
 * select owns a shard of counters until it exits (later threads share one more); its leases'
 * charges are added there and returned there, from whichever thread retires them, and a NIC's
 * exact charge is the sum over the shards (what orb_selector_load_stats reports). A selection
 * scores with its own thread's charges, exact, plus the other threads' as summed before the
 * thread placed its last ORB_SELECT_OTHERS_REFRESH slices at most, or since its last
 * orb_selector_refresh(); so two threads may load the same NIC for a while, as they could one
 * after the other an instant apart. (Measured: with two threads and 16 NICs, 4 to 6 x less time
 * per slice than one shared set of counters; see docs/performance.md, "Selection
 * micro-benchmark".) No lock is taken: all of a multi-slice parent's charges become visible as
 * one (a sequence count per shard), so a sum sees all of them or none. The charges (the slice
 * lengths, each capped at ORB_SELECT_CHARGE_MAX; 0 with smart selection off) move into a lease
 * the caller stores. orb_lease_consume() returns one slice's charge when its bytes retire;
 * orb_lease_abandon() returns every charge not yet consumed. A slice is returned at most once,
 * so a late or duplicate completion cannot repay someone else's charge. allocated_bytes counts
 * every assigned byte in both modes.
 *
 * Cost: selection and lease operations make no heap allocation and no system call (threads
 * beyond the owned shards take a process-private mutex for a multi-slice parent, which enters
 * the kernel only when contended), and read no clock; the exception is a thread's first call,
 * which claims its shard (and, once per process, creates a thread key and registers a fork
 * handler). The injected clock is read only by the transmit bookkeeping
 * (orb_selector_note_posted/_ended on an idle/busy edge, orb_selector_sample_transmit).
 *
 * Thread safety: every function may be called from any thread, except orb_selector_free (no
 * other call, and no live lease, may overlap it). A lease may be consumed from several threads,
 * and may be copied (handed to another thread) as long as only one copy is used afterwards. */
#ifndef ORB_TOPO_SELECTOR_H
#define ORB_TOPO_SELECTOR_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "estimator.h"
#include "inventory.h"
#include "slicing.h"
#include "topo_clock.h"

#define ORB_SELECT_TIERS 3
#define ORB_SELECT_EXCLUDED 255         /* a tier row entry that excludes the NIC */
#define ORB_SELECT_OWNED_SHARDS 8u      /* threads with charge counters of their own */
#define ORB_SELECT_OTHERS_REFRESH 64u   /* slices a thread places from one sum of the others */
#define ORB_SELECT_CHARGE_MAX (UINT64_C(1) << 48) /* a slice's charge: its length, at most this */

struct orb_selector_config {
    bool smart_selection;               /* true */
    double tier_weights[ORB_SELECT_TIERS]; /* {1, 5, 10}: finite, positive */
    uint32_t probe_interval;            /* 100: every Nth multi-slice parent probes; 0 never */
    struct orb_estimator_config estimator;
};

void orb_selector_config_default(struct orb_selector_config *cfg);

struct orb_selector;

/* What one parent was given: its slices' NICs and the charges they hold. Caller storage, fixed
 * size; filled by orb_selector_select and emptied by consume/abandon. It refers to its selector,
 * which must outlive it. */
struct orb_lease {
    struct orb_selector *selector;
    _Atomic uint64_t pending;           /* bit i: slice i's charge not yet returned */
    uint32_t nslices;
    uint8_t shard;                      /* the charge shard of the thread that selected */
    uint8_t nic[ORB_SLICE_MAX];         /* the NIC chosen for each slice */
    uint64_t charge[ORB_SLICE_MAX];     /* bytes charged for each slice */
};

/* Create a selector for NICs 0..nnics-1 (nnics 1..ORB_TOPO_MAX_NICS), all healthy and seeded
 * from link_mbps[i] (NULL or 0 entries: unknown, so default_bandwidth_gbps). `clock` is
 * copied; its ctx must outlive the selector. Returns 0 and *out, or ORB_EINVAL / ORB_ECONFIG
 * naming the bad field, or ORB_ENOMEM. */
int orb_selector_create(const struct orb_selector_config *cfg, uint32_t nnics,
                        const uint64_t *link_mbps, const struct orb_clock *clock,
                        struct orb_selector **out);

/* NULL-safe. No lease may still hold charges (they would simply be dropped). */
void orb_selector_free(struct orb_selector *sel);

uint32_t orb_selector_nic_count(const struct orb_selector *sel);

/* Mark a NIC healthy (selectable) or failed (never selected, never probed). ORB_EINVAL for an
 * unknown NIC. Charges already made stay until their leases return them. */
int orb_selector_set_healthy(struct orb_selector *sel, uint32_t nic, bool healthy);

/* Record a port rescan's rate (0 = unknown or failed query: the caller keeps the last value by
 * not calling) and re-seed the NIC's estimates from it. ORB_EINVAL for an unknown NIC. */
int orb_selector_set_link(struct orb_selector *sel, uint32_t nic, uint64_t link_mbps);

/* Choose a NIC for each of `nslices` (1..ORB_SLICE_MAX) slices and charge them, as one.
 * tier[i] is NIC i's rank for the request's location (entries >= nnics are ignored);
 * peer_mask bit i says NIC i has a compatible path to the peer. On success fills *lease (its
 * previous content is overwritten, so it must not hold charges) and returns 0; ORB_EINVAL for
 * bad arguments, ORB_EUNAVAILABLE when no NIC is eligible (nothing charged, lease untouched). */
int orb_selector_select(struct orb_selector *sel, const uint8_t tier[ORB_TOPO_MAX_NICS],
                        uint64_t peer_mask, const struct orb_slice *slices, uint32_t nslices,
                        struct orb_lease *lease);

/* Sum the other threads' charges for the calling thread's next selections now, instead of after
 * its next ORB_SELECT_OTHERS_REFRESH slices at most: for a thread that selects in bursts, once per
 * burst. No heap allocation, no system call, no lock. NULL-safe. */
void orb_selector_refresh(struct orb_selector *sel);

/* The NIC chosen for slice `slice` of a filled lease (ORB_SELECT_EXCLUDED when out of range). */
uint8_t orb_lease_nic(const struct orb_lease *lease, uint32_t slice);

/* Return slice `slice`'s charge: its bytes retired (completed, or failed and drained). Returns 0,
 * or ORB_EINVAL when the slice is out of range or was already returned (nothing changes). */
int orb_lease_consume(struct orb_lease *lease, uint32_t slice);

/* Return every charge not yet consumed; afterwards the lease holds nothing. Returns the number
 * of slices whose charges were returned here. */
uint32_t orb_lease_abandon(struct orb_lease *lease);

/* One successful selection sample for a NIC (see orb_estimator_learn); failed or uncertain
 * transfers must not be offered. ORB_EINVAL for an unknown NIC. */
int orb_selector_observe(struct orb_selector *sel, uint32_t nic, uint64_t bytes,
                         uint64_t elapsed_ns);

/* Transmit bookkeeping per NIC (see estimator.h), timed by the injected clock. */
int orb_selector_note_posted(struct orb_selector *sel, uint32_t nic, uint64_t bytes);
int orb_selector_note_post_ended(struct orb_selector *sel, uint32_t nic, uint64_t bytes);
int orb_selector_note_completed(struct orb_selector *sel, uint32_t nic, uint64_t bytes);
int orb_selector_invalidate_transmit(struct orb_selector *sel, uint32_t nic);

/* Offer every NIC a transmit sample at the clock's current time; returns how many learned. */
uint32_t orb_selector_sample_transmit(struct orb_selector *sel);

/* The selector's view of one NIC (bytes and bytes/s). */
struct orb_nic_load {
    uint8_t nic;
    uint8_t healthy;
    uint64_t link_mbps;                 /* as reported; 0 unknown */
    uint64_t effective_mbps;            /* what the estimates are seeded from */
    double selection_bps;
    double transmit_bps;
    uint64_t charged_bytes;             /* held by live leases */
    uint64_t posted_bytes;              /* payload debt on the NIC */
    uint64_t completed_bytes;           /* lifetime successful payload */
    uint64_t allocated_bytes;           /* lifetime bytes assigned by selection */
};

/* The rate to predict a NIC's time with: its measured transmit estimate, else the estimate
 * slices are scored with (0 when neither is known). */
double orb_nic_load_rate(const struct orb_nic_load *load);

/* Snapshot every NIC into out[0..*count) (cap >= nnics, else ORB_EINVAL). No device is probed;
 * the fields are read one at a time, so a snapshot taken under traffic is not one instant. */
int orb_selector_load_stats(const struct orb_selector *sel, struct orb_nic_load *out,
                            uint32_t cap, uint32_t *count);

/* The estimator of one NIC, for callers that feed its transmit meter directly (NULL for an
 * unknown NIC), and the configuration its functions take. Selection samples must go through
 * orb_selector_observe() (and link changes through orb_selector_set_link()): the selector keeps
 * a packed copy of the selection estimate for its scan and refreshes it only there. */
struct orb_nic_estimator *orb_selector_estimator(struct orb_selector *sel, uint32_t nic);
const struct orb_estimator_config *orb_selector_estimator_config(const struct orb_selector *sel);

/* For tests: the calling thread's charge shard (0..ORB_SELECT_OWNED_SHARDS - 1 owned,
 * ORB_SELECT_OWNED_SHARDS shared), claimed on first use; and which owned shards live threads
 * of the process hold (bit s). */
uint32_t orb_selector_thread_shard(void);
uint32_t orb_selector_owned_shards(void);

#endif
