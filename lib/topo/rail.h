/* Internal: rail health per (peer epoch, local NIC, remote NIC) pair -- a circuit breaker.
 *
 *   healthy --(threshold failures inside the window)--> open (paused for the cooldown)
 *   open --(cooldown over, probe interval since the last admission, no trial running)-->
 *        one admitted half-open trial
 *   trial --(that trial's positive receipt)--> healthy (cooldown back to its base)
 *   trial --(that trial fails)--> open again, cooldown doubled up to the maximum
 *   trial --(cancelled before it was posted)--> open; the trial slot is free again
 *
 * Failures while open leave the cooldown as it is; successes of any attempt other than the
 * current trial never reopen a paused pair. A pair without an entry is healthy: entries are
 * created by a first failure, so a success path never touches the table's capacity. The table
 * holds at most max_rail_pairs entries; when full it evicts the least recently used healthy
 * entry with no failure left inside the window, never an open pair, a pair with a trial or a
 * pair with recent failures, and otherwise refuses with ORB_ERESOURCE.
 *
 * Thread-safe: one mutex; the usable-mask lookup skips it while no pair is paused. Time comes
 * from the injected clock. */
#ifndef ORB_TOPO_RAIL_H
#define ORB_TOPO_RAIL_H

#include <stdbool.h>
#include <stdint.h>
#include <orbite/orbite.h>

#include "topo_clock.h"

#define ORB_RAIL_MAX_NICS 64              /* local NIC ids 0..63 (masks are 64 bits) */
#define ORB_RAIL_MAX_THRESHOLD 8
#define ORB_RAIL_MAX_PAIRS (1u << 20)

#define ORB_RAIL_DEFAULT_THRESHOLD 3
#define ORB_RAIL_DEFAULT_WINDOW_NS 10000000000ull       /* 10 s */
#define ORB_RAIL_DEFAULT_COOLDOWN_NS 30000000000ull     /* 30 s */
#define ORB_RAIL_DEFAULT_MAX_COOLDOWN_NS 300000000000ull /* 5 min */
#define ORB_RAIL_DEFAULT_PROBE_INTERVAL_NS 1000000000ull /* 1 s */
#define ORB_RAIL_DEFAULT_MAX_PAIRS 4096

struct orb_rail_config {
    uint32_t error_threshold;    /* failures inside the window that open a pair, 1..8 */
    uint64_t error_window_ns;    /* > 0; a failure counts while its age is below this */
    uint64_t cooldown_ns;        /* first pause; 0 allows a trial at once */
    uint64_t max_cooldown_ns;    /* doubling stops here; >= cooldown_ns */
    uint64_t probe_interval_ns;  /* least spacing of trial admissions; 0: an immediate trial */
    uint32_t max_rail_pairs;     /* 1..ORB_RAIL_MAX_PAIRS */
};

void orb_rail_config_default(struct orb_rail_config *cfg);

struct orb_rail_key {
    struct orb_epoch peer;       /* the peer engine's source epoch */
    uint16_t local_nic;          /* < ORB_RAIL_MAX_NICS */
    uint16_t remote_nic;         /* the peer's NIC id */
};

enum orb_rail_state {
    ORB_RAIL_HEALTHY = 0,
    ORB_RAIL_OPEN = 1,           /* paused: cooling down, or waiting for a trial */
    ORB_RAIL_TRIAL = 2,          /* paused with its one half-open trial admitted */
};

struct orb_rail_pair_info {
    enum orb_rail_state state;
    uint32_t recent_failures;    /* failures still inside the window */
    uint64_t cooldown_ns;        /* the current (possibly doubled) cooldown */
    uint64_t resume_ns;          /* earliest trial admission time when paused */
    bool trial_posted;
};

struct orb_rail_stats {
    uint64_t errors;             /* failures recorded, every state */
    uint64_t open_pairs;         /* pairs paused now (open or in trial) */
    uint64_t probes;             /* trials posted */
    uint64_t recoveries;         /* trials whose positive receipt reopened a pair */
    uint64_t pairs;              /* entries held now */
};

struct orb_rail_nic_stats {
    uint64_t errors;
    uint64_t probes;
    uint64_t open_pairs;
};

struct orb_rail_table;

/* Errors: ORB_EINVAL (NULL, a config value out of range), ORB_ENOMEM. */
int orb_rail_table_new(const struct orb_rail_config *cfg, const struct orb_clock *clock,
                       struct orb_rail_table **out);
void orb_rail_table_free(struct orb_rail_table *t);

/* A failed attempt on the pair (not a trial's verdict: orb_rail_trial_failed reports that and
 * counts its error, so the caller reports a trial's failure there only).
 * Healthy: counts toward the threshold and may open the pair. Paused: counted in the stats
 * only; the cooldown stays intact. Errors: ORB_EINVAL, ORB_ERESOURCE (a new pair and the table
 * is full of pairs it must keep; the failure is not tracked). */
int orb_rail_record_failure(struct orb_rail_table *t, const struct orb_rail_key *key);

/* A positive receipt of an ordinary attempt. Healthy: forgets its failures (as TENT's
 * markRecovered). Paused: ignored -- a late success of an older attempt proves nothing about
 * the pair now. */
void orb_rail_record_success(struct orb_rail_table *t, const struct orb_rail_key *key);

/* Is the pair healthy now? Never admits a trial. False for NULL or an out-of-range NIC id. */
bool orb_rail_usable(struct orb_rail_table *t, const struct orb_rail_key *key);

/* Of the local NIC ids in `local_mask`, those whose pair with remote_of_local[id] for `peer`
 * is healthy. A paused pair stays out even after its cooldown: only an explicit trial brings
 * it back, so a lookup never arms a probe. */
uint64_t orb_rail_usable_mask(struct orb_rail_table *t, const struct orb_epoch *peer,
                              uint64_t local_mask,
                              const uint16_t remote_of_local[ORB_RAIL_MAX_NICS]);

/* Admit the pair's one half-open trial; *token names it in the calls below.
 * Errors: ORB_EINVAL (NULL, pair not paused), ORB_EBUSY (a trial is already admitted),
 * ORB_EAGAIN (cooldown or probe interval not over yet). */
int orb_rail_trial_begin(struct orb_rail_table *t, const struct orb_rail_key *key,
                         uint64_t *token);

/* The trial's work request was posted: it can no longer be cancelled. Counts a probe.
 * Errors: ORB_EINVAL, ORB_ESTALE (not the current trial). */
int orb_rail_trial_posted(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token);

/* Give back an unposted trial's slot (the pair stays paused; another trial may be admitted
 * once the probe interval since this one's admission has passed).
 * Errors: ORB_EINVAL, ORB_ESTALE (not the current trial), ORB_EBUSY (already posted). */
int orb_rail_trial_cancel(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token);

/* The current trial's positive receipt: the pair is healthy again. Only a trial marked posted
 * (orb_rail_trial_posted) can succeed. Errors: ORB_EINVAL (NULL, or the trial was never posted:
 * nothing changes), ORB_ESTALE (not the current trial: nothing changes). */
int orb_rail_trial_succeeded(struct orb_rail_table *t, const struct orb_rail_key *key,
                             uint64_t token);

/* The current trial failed: paused again with the cooldown doubled (capped).
 * Errors: ORB_EINVAL, ORB_ESTALE (not the current trial: nothing changes). */
int orb_rail_trial_failed(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token);

/* Drop every entry of a peer epoch that is gone (its segment closed); returns how many. */
uint32_t orb_rail_forget_peer(struct orb_rail_table *t, const struct orb_epoch *peer);

/* Errors: ORB_EINVAL (NULL). A pair without an entry reads as healthy with no failures. */
int orb_rail_pair_info(struct orb_rail_table *t, const struct orb_rail_key *key,
                       struct orb_rail_pair_info *out);

void orb_rail_stats(struct orb_rail_table *t, struct orb_rail_stats *out);

/* Errors: ORB_EINVAL (NULL, nic >= ORB_RAIL_MAX_NICS). */
int orb_rail_nic_stats(struct orb_rail_table *t, uint32_t local_nic,
                       struct orb_rail_nic_stats *out);

#endif
