/* The device selector: see selector.h. */
#include "selector.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/spin.h"

#define TIE_RELATIVE 1e-9   /* scores this close to the lowest are ties */
#define WEIGHT_EPSILON 1e-12

/* Layout: the lock and the counters it guards share the first cache line, which moves between
 * contending threads anyway; read-mostly fields follow; the per-NIC counters are packed so that
 * a scan over 16 NICs touches two lines. (The allocation is 64-byte aligned.) */
struct orb_selector {
    pthread_mutex_t lock;               /* serialises choosing and charging a multi-slice parent */
    /* Under `lock` (32-bit: wrapping only shifts a rotation once in 2^32 parents): */
    uint32_t multi_parents;             /* counts multi-slice parents, for probing */
    uint32_t probe_turn;                /* where the next probe starts */
    uint32_t rr_turn;                   /* round-robin position with smart selection off */
    /* Odd while a multi-slice parent's charges are being added (written under `lock`): a
     * single-slice selection, which takes no lock, scores again rather than see half of them.
     * Alone in its line: lockless selections only read it. */
    _Alignas(64) _Atomic uint32_t commit_seq;
    _Alignas(64) _Atomic uint64_t healthy; /* bit i: NIC i may be selected */
    uint64_t all_nics;                  /* bits 0..nnics-1 */
    uint32_t nnics;
    struct orb_clock clock;             /* copied; its ctx is borrowed */
    struct orb_selector_config cfg;
    _Alignas(64) _Atomic uint64_t charged[ORB_TOPO_MAX_NICS];
    /* Seconds per byte of each NIC's selection estimate (double bits), mirrored from est[] so
     * that a scan over 16 NICs reads two cache lines instead of one estimator each. */
    _Alignas(64) _Atomic uint64_t inverse[ORB_TOPO_MAX_NICS];
    _Atomic uint64_t allocated[ORB_TOPO_MAX_NICS];
    struct orb_nic_estimator est[ORB_TOPO_MAX_NICS];
};

_Static_assert(offsetof(struct orb_selector, rr_turn) + sizeof(uint32_t) <= 64,
               "the lock and its counters should share one cache line");

void orb_selector_config_default(struct orb_selector_config *cfg)
{
    cfg->smart_selection = true;
    cfg->tier_weights[0] = 1.0;
    cfg->tier_weights[1] = 5.0;
    cfg->tier_weights[2] = 10.0;
    cfg->probe_interval = 100;
    orb_estimator_config_default(&cfg->estimator);
}

int orb_selector_create(const struct orb_selector_config *cfg, uint32_t nnics,
                        const uint64_t *link_mbps, const struct orb_clock *clock,
                        struct orb_selector **out)
{
    if (cfg == NULL || clock == NULL || clock->now_ns == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "selector: NULL config, clock or output");
    if (nnics == 0 || nnics > ORB_TOPO_MAX_NICS)
        return orb_fail(ORB_EINVAL, "selector: NIC count %u is outside 1..%u", nnics,
                        ORB_TOPO_MAX_NICS);
    for (int t = 0; t < ORB_SELECT_TIERS; t++) {
        if (!isfinite(cfg->tier_weights[t]) || cfg->tier_weights[t] <= 0.0)
            return orb_fail(ORB_ECONFIG, "scheduling.tier_weights[%d]: must be finite and > 0",
                            t);
    }
    int rc = orb_estimator_config_check(&cfg->estimator);
    if (rc != 0)
        return orb_fail_wrap(rc, "scheduling");

    struct orb_selector *sel = NULL;
    size_t size = (sizeof *sel + 63) / 64 * 64;
    sel = aligned_alloc(64, size);
    if (sel == NULL)
        return orb_fail(ORB_ENOMEM, "selector: cannot allocate %zu bytes", size);
    memset(sel, 0, size);

    pthread_mutexattr_t attr;
    if (pthread_mutexattr_init(&attr) != 0) {
        rc = orb_fail(ORB_ENOMEM, "selector: cannot initialise a mutex attribute");
        goto free_selector;
    }
    /* Spin briefly before sleeping: the critical section is a few hundred nanoseconds. */
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    int err = pthread_mutex_init(&sel->lock, &attr);
    pthread_mutexattr_destroy(&attr);
    if (err != 0) {
        rc = orb_fail(orb_status_from_errno(err), "selector: cannot initialise its lock");
        goto free_selector;
    }

    sel->cfg = *cfg;
    sel->clock = *clock;
    sel->nnics = nnics;
    sel->all_nics = nnics == 64 ? UINT64_MAX : (UINT64_C(1) << nnics) - 1;
    atomic_init(&sel->healthy, sel->all_nics);
    for (uint32_t i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        atomic_init(&sel->charged[i], 0);
        atomic_init(&sel->allocated[i], 0);
        orb_estimator_init(&sel->est[i], &sel->cfg.estimator,
                           link_mbps != NULL && i < nnics ? link_mbps[i] : 0);
        atomic_init(&sel->inverse[i],
                    atomic_load_explicit(&sel->est[i].selection_inverse_bits, memory_order_relaxed));
    }
    *out = sel;
    return 0;

free_selector:
    free(sel);
    return rc;
}

void orb_selector_free(struct orb_selector *sel)
{
    if (sel == NULL)
        return;
    pthread_mutex_destroy(&sel->lock);
    free(sel);
}

uint32_t orb_selector_nic_count(const struct orb_selector *sel)
{
    return sel->nnics;
}

/* Copy NIC `nic`'s inverse estimate into the packed mirror; repeated if a concurrent learner
 * moved it meanwhile, so that the last writer leaves the two equal. */
static void mirror_inverse(struct orb_selector *sel, uint32_t nic)
{
    const struct orb_nic_estimator *e = &sel->est[nic];
    for (;;) {
        uint64_t bits = atomic_load_explicit(&e->selection_inverse_bits, memory_order_relaxed);
        atomic_store_explicit(&sel->inverse[nic], bits, memory_order_relaxed);
        if (atomic_load_explicit(&e->selection_inverse_bits, memory_order_relaxed) == bits)
            return;
    }
}

static int check_nic(const struct orb_selector *sel, uint32_t nic)
{
    if (sel == NULL || nic >= sel->nnics)
        return orb_fail(ORB_EINVAL, "selector: unknown NIC %u", nic);
    return 0;
}

int orb_selector_set_healthy(struct orb_selector *sel, uint32_t nic, bool healthy)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    uint64_t bit = UINT64_C(1) << nic;
    if (healthy)
        atomic_fetch_or_explicit(&sel->healthy, bit, memory_order_relaxed);
    else
        atomic_fetch_and_explicit(&sel->healthy, ~bit, memory_order_relaxed);
    return 0;
}

int orb_selector_set_link(struct orb_selector *sel, uint32_t nic, uint64_t link_mbps)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_set_link(&sel->est[nic], &sel->cfg.estimator, link_mbps);
    mirror_inverse(sel, nic);
    return 0;
}

/* ---- selection ---- */

struct candidate {
    double score;
    uint8_t nic;
    uint8_t tier;
};

/* Seconds per byte by the selection estimate, read inline from the packed mirror: the hot loop
 * runs once per eligible NIC, and multiplying by the kept inverse spares it a division. */
static inline double selection_inverse(const struct orb_selector *sel, unsigned nic)
{
    uint64_t bits = atomic_load_explicit(&sel->inverse[nic], memory_order_relaxed);
    double v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

/* Candidates in NIC id order, and the lowest score in *low. Returns their count. */
static uint32_t gather(struct orb_selector *sel, const uint8_t *tier, uint64_t peer_mask,
                       uint64_t slice_bytes, struct candidate *cand, double *low)
{
    uint64_t eligible = sel->all_nics & peer_mask &
                        atomic_load_explicit(&sel->healthy, memory_order_relaxed);
    double slice = (double)slice_bytes;
    double lowest = INFINITY;
    uint32_t n = 0;
    while (eligible != 0) {
        unsigned i = (unsigned)__builtin_ctzll(eligible);
        eligible &= eligible - 1;
        uint8_t t = tier[i];
        if (t >= ORB_SELECT_TIERS)
            continue;
        /* Acquire: a charge seen here means the commit_seq bump before it is seen too. */
        uint64_t charged = atomic_load_explicit(&sel->charged[i], memory_order_acquire);
        double score = ((double)charged + slice) * selection_inverse(sel, i) *
                       sel->cfg.tier_weights[t];
        cand[n].score = score;
        cand[n].nic = (uint8_t)i;
        cand[n].tier = t;
        lowest = score < lowest ? score : lowest;
        n++;
    }
    *low = lowest;
    return n;
}

/* Rotation among tied best scores, per thread: a shared counter would be written by every
 * selection of every thread, and its cache line would bounce between them. */
static _Thread_local uint32_t tie_turn;

/* Among the candidates whose score ties `low` (the lowest), the one whose turn it is. */
static uint32_t best_with_ties(struct orb_selector *sel, const struct candidate *cand, uint32_t n,
                               double low)
{
    (void)sel;
    double limit = low + low * TIE_RELATIVE;
    uint8_t tied[ORB_TOPO_MAX_NICS];
    uint32_t ties = 0;
    for (uint32_t i = 0; i < n; i++) {
        tied[ties] = (uint8_t)i;
        ties += cand[i].score <= limit;
    }
    return ties <= 1 ? tied[0] : tied[tie_turn++ % ties];
}

/* Ascending score, NIC id breaking exact ties; insertion sort (n <= 64, usually <= 16). */
static void sort_by_score(struct candidate *cand, uint32_t n)
{
    for (uint32_t i = 1; i < n; i++) {
        struct candidate c = cand[i];
        uint32_t j = i;
        while (j > 0 && (cand[j - 1].score > c.score ||
                         (cand[j - 1].score == c.score && cand[j - 1].nic > c.nic))) {
            cand[j] = cand[j - 1];
            j--;
        }
        cand[j] = c;
    }
}

/* TENT's multi-path split: floor shares by inverse score in score order, leftovers to the best.
 * Floors are exact: identical NICs get identical shares. */
static void split_by_weight(struct orb_selector *sel, struct candidate *cand, uint32_t n,
                            uint32_t nslices, uint8_t *chosen)
{
    sort_by_score(cand, n);
    uint32_t best = best_with_ties(sel, cand, n, cand[0].score);
    double weights[ORB_TOPO_MAX_NICS];
    double total = 0.0;
    for (uint32_t i = 0; i < n; i++) {
        weights[i] = 1.0 / (cand[i].score + WEIGHT_EPSILON);
        total += weights[i];
    }
    /* The floating sum of k equal weights can exceed k * w by a few ulps, which would floor an
     * exact share of m to m - 1 and pile every such slice onto the best NIC (5 identical NICs x
     * 5 slices gave 5, 0, 0, 0, 0). The relative error of `total` and of a share is below
     * (n + 2) ulps: a share that close under an integer is that integer. */
    const double exact = 1.0 + (double)(n + 2) * DBL_EPSILON;
    uint32_t next = 0;
    for (uint32_t i = 0; i < n && next < nslices; i++) {
        double share = weights[i] / total * (double)nslices * exact;
        uint32_t take = share >= (double)(nslices - next) ? nslices - next : (uint32_t)share;
        for (uint32_t s = 0; s < take; s++)
            chosen[next++] = cand[i].nic;
    }
    while (next < nslices)
        chosen[next++] = cand[best].nic;
}

/* Probe: deal the slices over every candidate in turn, starting where the last probe stopped. */
static void deal_round_robin(uint32_t *turn, const struct candidate *cand, uint32_t n,
                             uint32_t nslices, uint8_t *chosen)
{
    uint32_t start = *turn;
    for (uint32_t s = 0; s < nslices; s++)
        chosen[s] = cand[(start + s) % n].nic;
    *turn = start + nslices;
}

/* Add a NIC's share of a parent: its charge and its lifetime bytes. */
static inline void commit(struct orb_selector *sel, uint8_t nic, uint64_t charge, uint64_t bytes)
{
    /* Release: whoever sees this charge sees the commit_seq bump made before it. */
    if (charge != 0)
        atomic_fetch_add_explicit(&sel->charged[nic], charge, memory_order_release);
    atomic_fetch_add_explicit(&sel->allocated[nic], bytes, memory_order_relaxed);
}

/* A single-slice parent with smart selection: the common case, and the one threads contend on.
 * It scores without the lock (every input is an atomic) and charges with one atomic add, so
 * threads selecting at once do not queue behind each other; it only waits out a multi-slice
 * parent's commit so as to see all of its charges or none. Returns 0, or 1 when no NIC is
 * eligible. */
static int select_one_lockless(struct orb_selector *sel, const uint8_t *tier, uint64_t peer_mask,
                               const struct orb_slice *slice, struct orb_lease *lease)
{
    struct candidate cand[ORB_TOPO_MAX_NICS];
    double low;
    uint32_t n;
    for (;;) {
        uint32_t seq = atomic_load_explicit(&sel->commit_seq, memory_order_acquire);
        if (seq & 1u) {
            orb_cpu_relax();
            continue;
        }
        n = gather(sel, tier, peer_mask, slice->length, cand, &low); /* acquire loads */
        if (atomic_load_explicit(&sel->commit_seq, memory_order_relaxed) == seq)
            break;
    }
    if (n == 0)
        return 1;
    uint8_t nic = cand[best_with_ties(sel, cand, n, low)].nic;
    commit(sel, nic, slice->length, slice->length);
    lease->nic[0] = nic;
    lease->charge[0] = slice->length;
    return 0;
}

/* The lease's owner and pending slices, published last. */
static void lease_arm(struct orb_lease *lease, struct orb_selector *sel, uint32_t nslices)
{
    lease->selector = sel;
    lease->nslices = nslices;
    atomic_store_explicit(&lease->pending, nslices == 64 ? UINT64_MAX : (UINT64_C(1) << nslices) - 1,
                          memory_order_release);
}

int orb_selector_select(struct orb_selector *sel, const uint8_t tier[ORB_TOPO_MAX_NICS],
                        uint64_t peer_mask, const struct orb_slice *slices, uint32_t nslices,
                        struct orb_lease *lease)
{
    if (sel == NULL || tier == NULL || slices == NULL || lease == NULL)
        return orb_fail(ORB_EINVAL, "select: NULL argument");
    if (nslices == 0 || nslices > ORB_SLICE_MAX)
        return orb_fail(ORB_EINVAL, "select: slice count %u is outside 1..%u", nslices,
                        ORB_SLICE_MAX);

    struct candidate cand[ORB_TOPO_MAX_NICS];
    uint8_t chosen[ORB_SLICE_MAX];
    bool smart = sel->cfg.smart_selection;

    if (smart && nslices == 1) {
        if (select_one_lockless(sel, tier, peer_mask, &slices[0], lease) != 0)
            return orb_fail(ORB_EUNAVAILABLE,
                            "select: no eligible NIC (tier row, health and peer mask %#llx exclude "
                            "all %u)", (unsigned long long)peer_mask, sel->nnics);
        lease_arm(lease, sel, 1);
        return 0;
    }
    pthread_mutex_lock(&sel->lock);
    double low; /* unused here: the multi-slice split ranks the candidates itself */
    uint32_t n = gather(sel, tier, peer_mask, slices[0].length, cand, &low);
    if (n == 0) {
        pthread_mutex_unlock(&sel->lock);
        return orb_fail(ORB_EUNAVAILABLE,
                        "select: no eligible NIC (tier row, health and peer mask %#llx exclude "
                        "all %u)", (unsigned long long)peer_mask, sel->nnics);
    }
    if (!smart) {
        /* Round-robin within the lowest non-empty tier: keep only that tier's candidates. */
        uint8_t first_tier = ORB_SELECT_TIERS;
        for (uint32_t i = 0; i < n; i++) {
            if (cand[i].tier < first_tier)
                first_tier = cand[i].tier;
        }
        uint32_t kept = 0;
        for (uint32_t i = 0; i < n; i++) {
            if (cand[i].tier == first_tier)
                cand[kept++] = cand[i];
        }
        n = kept; /* the commit below walks cand[0..n) once per NIC */
        deal_round_robin(&sel->rr_turn, cand, n, nslices, chosen);
    } else if (sel->cfg.probe_interval != 0 &&
               ++sel->multi_parents % sel->cfg.probe_interval == 0) {
        deal_round_robin(&sel->probe_turn, cand, n, nslices, chosen);
    } else {
        split_by_weight(sel, cand, n, nslices, chosen);
    }
    if (nslices == 1) {
        /* Smart single-slice parents never get here (select_one_lockless): no charge. */
        commit(sel, chosen[0], 0, slices[0].length);
        lease->nic[0] = chosen[0];
        lease->charge[0] = 0;
    } else {
        /* Sum per NIC first: one atomic add per chosen NIC instead of one per slice. Every
         * chosen NIC is a candidate, so clearing the candidates' sums is enough. Lockless
         * single-slice selections see all of these charges or none (commit_seq). */
        uint64_t charge_sum[ORB_TOPO_MAX_NICS];
        uint64_t byte_sum[ORB_TOPO_MAX_NICS];
        for (uint32_t i = 0; i < n; i++) {
            charge_sum[cand[i].nic] = 0;
            byte_sum[cand[i].nic] = 0;
        }
        for (uint32_t s = 0; s < nslices; s++) {
            uint8_t nic = chosen[s];
            uint64_t charge = smart ? slices[s].length : 0;
            charge_sum[nic] += charge;
            byte_sum[nic] += slices[s].length;
            lease->nic[s] = nic;
            lease->charge[s] = charge;
        }
        uint32_t seq = atomic_load_explicit(&sel->commit_seq, memory_order_relaxed);
        atomic_store_explicit(&sel->commit_seq, seq + 1, memory_order_relaxed); /* published by commit() */
        for (uint32_t i = 0; i < n; i++) {
            uint8_t nic = cand[i].nic;
            if (byte_sum[nic] != 0 || charge_sum[nic] != 0)
                commit(sel, nic, charge_sum[nic], byte_sum[nic]);
        }
        atomic_store_explicit(&sel->commit_seq, seq + 2, memory_order_release);
    }
    pthread_mutex_unlock(&sel->lock);
    lease_arm(lease, sel, nslices);
    return 0;
}

uint8_t orb_lease_nic(const struct orb_lease *lease, uint32_t slice)
{
    return lease != NULL && slice < lease->nslices ? lease->nic[slice] : ORB_SELECT_EXCLUDED;
}

static void give_back(struct orb_lease *lease, uint32_t slice)
{
    uint64_t charge = lease->charge[slice];
    if (charge != 0)
        atomic_fetch_sub_explicit(&lease->selector->charged[lease->nic[slice]], charge,
                                  memory_order_relaxed);
}

int orb_lease_consume(struct orb_lease *lease, uint32_t slice)
{
    if (lease == NULL || slice >= lease->nslices)
        return orb_fail(ORB_EINVAL, "lease: slice %u out of range", slice);
    uint64_t bit = UINT64_C(1) << slice;
    uint64_t before = atomic_fetch_and_explicit(&lease->pending, ~bit, memory_order_acq_rel);
    if ((before & bit) == 0)
        return orb_fail(ORB_EINVAL, "lease: slice %u was already returned", slice);
    give_back(lease, slice);
    return 0;
}

uint32_t orb_lease_abandon(struct orb_lease *lease)
{
    if (lease == NULL)
        return 0;
    uint64_t left = atomic_exchange_explicit(&lease->pending, 0, memory_order_acq_rel);
    uint32_t returned = 0;
    while (left != 0) {
        uint32_t slice = (uint32_t)__builtin_ctzll(left);
        left &= left - 1;
        give_back(lease, slice);
        returned++;
    }
    return returned;
}

/* ---- estimates ---- */

int orb_selector_observe(struct orb_selector *sel, uint32_t nic, uint64_t bytes,
                         uint64_t elapsed_ns)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_learn(&sel->est[nic], &sel->cfg.estimator, bytes, elapsed_ns);
    mirror_inverse(sel, nic);
    return 0;
}

int orb_selector_note_posted(struct orb_selector *sel, uint32_t nic, uint64_t bytes)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_posted(&sel->est[nic], bytes, &sel->clock);
    return 0;
}

int orb_selector_note_post_ended(struct orb_selector *sel, uint32_t nic, uint64_t bytes)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_post_ended(&sel->est[nic], bytes, &sel->clock);
    return 0;
}

int orb_selector_note_completed(struct orb_selector *sel, uint32_t nic, uint64_t bytes)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_completed(&sel->est[nic], bytes);
    return 0;
}

int orb_selector_invalidate_transmit(struct orb_selector *sel, uint32_t nic)
{
    int rc = check_nic(sel, nic);
    if (rc != 0)
        return rc;
    orb_estimator_invalidate(&sel->est[nic]);
    return 0;
}

uint32_t orb_selector_sample_transmit(struct orb_selector *sel)
{
    uint64_t now = orb_clock_now(&sel->clock);
    uint32_t learned = 0;
    for (uint32_t i = 0; i < sel->nnics; i++)
        learned += (uint32_t)orb_estimator_sample_transmit(&sel->est[i], &sel->cfg.estimator,
                                                           now);
    return learned;
}

double orb_nic_load_rate(const struct orb_nic_load *load)
{
    return load->transmit_bps > 0 ? load->transmit_bps : load->selection_bps;
}

int orb_selector_load_stats(const struct orb_selector *sel, struct orb_nic_load *out,
                            uint32_t cap, uint32_t *count)
{
    if (sel == NULL || out == NULL || count == NULL)
        return orb_fail(ORB_EINVAL, "load stats: NULL argument");
    if (cap < sel->nnics)
        return orb_fail(ORB_EINVAL, "load stats: room for %u NICs, %u needed", cap, sel->nnics);
    uint64_t healthy = atomic_load_explicit(&sel->healthy, memory_order_relaxed);
    for (uint32_t i = 0; i < sel->nnics; i++) {
        const struct orb_nic_estimator *e = &sel->est[i];
        uint64_t link = atomic_load_explicit(&e->link_mbps, memory_order_relaxed);
        out[i] = (struct orb_nic_load){
            .nic = (uint8_t)i,
            .healthy = (uint8_t)((healthy >> i) & 1),
            .link_mbps = link,
            .effective_mbps = (uint64_t)(
                orb_estimator_effective_gbps(&sel->cfg.estimator, link) * 1000.0 + 0.5),
            .selection_bps = orb_estimator_selection_bps(e),
            .transmit_bps = orb_estimator_transmit_bps(e),
            .charged_bytes = atomic_load_explicit(&sel->charged[i], memory_order_relaxed),
            .posted_bytes = orb_estimator_posted_bytes(e),
            .completed_bytes = orb_estimator_completed_bytes(e),
            .allocated_bytes = atomic_load_explicit(&sel->allocated[i], memory_order_relaxed),
        };
    }
    *count = sel->nnics;
    return 0;
}

struct orb_nic_estimator *orb_selector_estimator(struct orb_selector *sel, uint32_t nic)
{
    return sel != NULL && nic < sel->nnics ? &sel->est[nic] : NULL;
}

const struct orb_estimator_config *orb_selector_estimator_config(const struct orb_selector *sel)
{
    return &sel->cfg.estimator;
}
