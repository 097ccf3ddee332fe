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

/* Charges live in shards. A thread that selects owns one of OWNED_SHARDS shards for as long as
 * it lives (threads beyond that share the last shard); its leases' charges are added there and
 * returned there, from whichever thread retires them, so a shard holds exactly its threads'
 * outstanding charges, and the sum over every shard is exact. A selection scores with its own
 * shard plus its shard's copy of the other shards' sum, taken again once OTHERS_REFRESH of its
 * slices have been placed since the last one, or when its caller asks (orb_selector_refresh).
 * So a thread takes no lock and, but for returns from other threads, touches only lines of its
 * own: the cost that grew with contention was cache lines moving between the threads, and the
 * lock, on every selection. */
#define OWNED_SHARDS ORB_SELECT_OWNED_SHARDS
#define SHARED_SHARD OWNED_SHARDS       /* for threads beyond the owned ones: atomic adds */
#define SELECT_SHARDS (OWNED_SHARDS + 1u)
#define OTHERS_REFRESH ORB_SELECT_OTHERS_REFRESH

struct charge_shard {
    /* Read by whoever sums the shards. `seq` is odd while one of the shard's threads charges a
     * parent of several slices, so that a sum sees all of its charges or none. `charged`: the
     * shard's leases' charges not yet returned (atomic adds: a lease is returned from any
     * thread). */
    _Alignas(64) _Atomic uint32_t seq;
    _Atomic uint64_t charged[ORB_TOPO_MAX_NICS];
    /* Written and read by the shard's threads only (and read by the load statistics): the
     * lifetime bytes its selections assigned, the other shards' charges when last summed, slices
     * left to place before the next sum, and the multi-slice parents counted for probing and
     * where the next probe starts (32-bit: wrapping only shifts a rotation). */
    _Alignas(64) _Atomic uint64_t allocated[ORB_TOPO_MAX_NICS];
    _Atomic uint64_t others[ORB_TOPO_MAX_NICS];
    _Atomic uint32_t until_refresh;
    _Atomic uint32_t multi_parents;
    _Atomic uint32_t probe_turn;
};

/* Layout: read-mostly fields first; each shard starts on its own line. (The allocation is
 * 64-byte aligned.) */
struct orb_selector {
    /* Held by a thread of the shared shard while it charges a parent of several slices: that
     * shard's `seq` then has one writer at a time. Owned shards need no lock. */
    pthread_mutex_t shared_lock;
    _Atomic uint32_t rr_turn;           /* round-robin position with smart selection off */
    _Alignas(64) _Atomic uint64_t healthy; /* bit i: NIC i may be selected */
    _Atomic uint32_t shards_used;       /* bit s: shard s has charged something */
    uint64_t all_nics;                  /* bits 0..nnics-1 */
    uint32_t nnics;
    struct orb_clock clock;             /* copied; its ctx is borrowed */
    struct orb_selector_config cfg;
    /* Seconds per byte of each NIC's selection estimate (double bits), mirrored from est[] so
     * that a scan over 16 NICs reads two cache lines instead of one estimator each. */
    _Alignas(64) _Atomic uint64_t inverse[ORB_TOPO_MAX_NICS];
    struct charge_shard shard[SELECT_SHARDS];
    struct orb_nic_estimator est[ORB_TOPO_MAX_NICS];
};

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
    /* Spin briefly before sleeping: the critical section is a few stores. */
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
    int err = pthread_mutex_init(&sel->shared_lock, &attr);
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
    pthread_mutex_destroy(&sel->shared_lock);
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

/* Rotation among tied best scores, per thread: a shared counter would be written by every
 * selection of every thread, and its cache line would bounce between them. */
static _Thread_local uint32_t tie_turn;

/* Which owned shards live threads hold (bit s), process-wide: a thread's shard index serves
 * every selector. A thread's claim ends with it, through the key's destructor. */
static _Atomic uint32_t shards_owned;
static pthread_once_t shard_key_once = PTHREAD_ONCE_INIT;
static pthread_key_t shard_key;
static bool shard_key_made;
static _Thread_local uint32_t thread_shard = UINT32_MAX;

/* The key's destructor, on the exiting thread: a selection later in its exit (another
 * destructor's) goes to the shared shard, since the next owner may already write this one. */
static void shard_release(void *claim)
{
    uint32_t s = (uint32_t)(uintptr_t)claim - 1;
    thread_shard = SHARED_SHARD;
    atomic_fetch_and_explicit(&shards_owned, ~(1u << s), memory_order_release);
}

/* A forked child has only the thread that forked: the other threads' claims are gone with them. */
static void shards_after_fork(void)
{
    atomic_store_explicit(&shards_owned,
                          thread_shard < OWNED_SHARDS ? 1u << thread_shard : 0u,
                          memory_order_relaxed);
}

static void shard_key_create(void)
{
    shard_key_made = pthread_key_create(&shard_key, shard_release) == 0;
    if (shard_key_made)
        (void)pthread_atfork(NULL, NULL, shards_after_fork);
}

/* A loaded-then-unloaded library must not leave a destructor behind in threads that outlive it. */
__attribute__((destructor)) static void shard_key_delete(void)
{
    if (shard_key_made)
        pthread_key_delete(shard_key);
}

/* Claim a free owned shard, or fall back to the shared one. The claim is made once per thread,
 * outside any selector's hot path in steady state. */
static uint32_t claim_shard(void)
{
    (void)pthread_once(&shard_key_once, shard_key_create);
    if (!shard_key_made)
        return SHARED_SHARD;
    uint32_t owned = atomic_load_explicit(&shards_owned, memory_order_relaxed);
    for (;;) {
        uint32_t free_bits = ~owned & ((1u << OWNED_SHARDS) - 1u);
        if (free_bits == 0)
            return SHARED_SHARD;
        uint32_t s = (uint32_t)__builtin_ctz(free_bits);
        /* Acquire: the last owner's plain stores to the shard are seen before ours. */
        if (atomic_compare_exchange_weak_explicit(&shards_owned, &owned, owned | (1u << s),
                                                  memory_order_acquire, memory_order_relaxed)) {
            if (pthread_setspecific(shard_key, (void *)(uintptr_t)(s + 1)) != 0) {
                shard_release((void *)(uintptr_t)(s + 1));
                return SHARED_SHARD;
            }
            return s;
        }
    }
}

static inline uint32_t this_thread_shard(void)
{
    if (thread_shard == UINT32_MAX) {
        thread_shard = claim_shard();
        tie_turn = thread_shard; /* threads start their rotations among ties apart */
    }
    return thread_shard;
}

/* Add `v` to a counter only the calling thread's shard's threads write (its lifetime bytes): a
 * plain store where the thread owns the shard, an atomic add on the shared one. */
static inline void shard_add(uint32_t shard, _Atomic uint64_t *counter, uint64_t v)
{
    if (shard != SHARED_SHARD)
        atomic_store_explicit(counter, atomic_load_explicit(counter, memory_order_relaxed) + v,
                              memory_order_relaxed);
    else
        atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
}

/* The charge of a slice: its length, capped at 256 TiB, more than any host can pin for a NIC, so
 * that sums of charges over shards cannot wrap. */
static inline uint64_t charge_of(uint64_t length)
{
    return length < ORB_SELECT_CHARGE_MAX ? length : ORB_SELECT_CHARGE_MAX;
}

/* Readers sum only the shards a selector has seen used. */
static inline void mark_shard_used(struct orb_selector *sel, uint32_t shard)
{
    uint32_t bit = 1u << shard;
    if ((atomic_load_explicit(&sel->shards_used, memory_order_relaxed) & bit) == 0)
        atomic_fetch_or_explicit(&sel->shards_used, bit, memory_order_relaxed);
}

/* Add shard `sh`'s charges for NICs 0..nnics-1 into acc[], all of one multi-slice parent or none
 * of it (a writer's seq section is a few stores: waiting it out is short). */
static void add_shard(const struct charge_shard *sh, uint32_t nnics, uint64_t *acc)
{
    uint64_t v[ORB_TOPO_MAX_NICS];
    for (;;) {
        uint32_t seq = atomic_load_explicit(&sh->seq, memory_order_acquire);
        if (seq & 1u) {
            orb_cpu_relax();
            continue;
        }
        /* Acquire: a charge of a parent being added brings its odd seq into view below. */
        for (uint32_t i = 0; i < nnics; i++)
            v[i] = atomic_load_explicit(&sh->charged[i], memory_order_acquire);
        if (atomic_load_explicit(&sh->seq, memory_order_relaxed) == seq)
            break;
    }
    for (uint32_t i = 0; i < nnics; i++)
        acc[i] += v[i];
}

/* The charges of NICs 0..nnics-1 summed over the shards in `shards`. */
static void sum_shards(const struct orb_selector *sel, uint32_t shards, uint64_t *acc)
{
    memset(acc, 0, sel->nnics * sizeof *acc);
    while (shards != 0) {
        unsigned s = (unsigned)__builtin_ctz(shards);
        shards &= shards - 1;
        add_shard(&sel->shard[s], sel->nnics, acc);
    }
}

/* Sum the other shards' charges into `mine`'s copy of them. */
static void sum_others(struct orb_selector *sel, uint32_t mine)
{
    struct charge_shard *own = &sel->shard[mine];
    atomic_store_explicit(&own->until_refresh, OTHERS_REFRESH, memory_order_relaxed);
    uint64_t sum[ORB_TOPO_MAX_NICS];
    sum_shards(sel, atomic_load_explicit(&sel->shards_used, memory_order_relaxed) & ~(1u << mine),
               sum);
    for (unsigned i = 0; i < sel->nnics; i++)
        atomic_store_explicit(&own->others[i], sum[i], memory_order_relaxed);
}

/* Take `nslices` from what `mine`'s copy of the others may still serve, summing them again
 * first when it cannot: each sum serves at most OTHERS_REFRESH of the shard's slices. */
static void refresh_others(struct orb_selector *sel, uint32_t mine, uint32_t nslices)
{
    struct charge_shard *own = &sel->shard[mine];
    uint32_t left = atomic_load_explicit(&own->until_refresh, memory_order_relaxed);
    if (left < nslices) {
        sum_others(sel, mine);
        left = OTHERS_REFRESH;
    }
    atomic_store_explicit(&own->until_refresh, left > nslices ? left - nslices : 0,
                          memory_order_relaxed);
}

/* Candidates in NIC id order, and the lowest score in *low. Returns their count. Charges are as
 * shard `mine` sees them: its own, exact, plus its copy of the others'. */
static uint32_t gather(struct orb_selector *sel, uint32_t mine, const uint8_t *tier,
                       uint64_t peer_mask, uint64_t slice_bytes, struct candidate *cand,
                       double *low)
{
    const struct charge_shard *own = &sel->shard[mine];
    /* Only the shared shard has other writers, whose multi-slice parents are seen whole. */
    bool shared = mine == SHARED_SHARD;
    uint64_t shared_charged[ORB_TOPO_MAX_NICS];
    if (shared)
        sum_shards(sel, 1u << mine, shared_charged);
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
        uint64_t mine_charged =
            shared ? shared_charged[i]
                   : atomic_load_explicit(&own->charged[i], memory_order_relaxed);
        uint64_t seen = mine_charged + atomic_load_explicit(&own->others[i], memory_order_relaxed);
        double score = ((double)seen + slice) * selection_inverse(sel, i) *
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

/* Deal the slices over the candidates in turn from `start`. */
static void deal_round_robin(uint32_t start, const struct candidate *cand, uint32_t n,
                             uint32_t nslices, uint8_t *chosen)
{
    for (uint32_t s = 0; s < nslices; s++)
        chosen[s] = cand[(start + s) % n].nic;
}

/* Keep only the candidates of the lowest tier present; returns how many are left. */
static uint32_t keep_first_tier(struct candidate *cand, uint32_t n)
{
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
    return kept;
}

/* Charge a parent's slices to the calling thread's shard, as one: per NIC, the sum of its
 * slices' charges and lifetime bytes (one store or add per chosen NIC, not per slice); a sum
 * of the shards sees all of a multi-slice parent's charges or none (the shard's seq). */
static void charge_parent(struct orb_selector *sel, uint32_t mine, const struct candidate *cand,
                          uint32_t n, const struct orb_slice *slices, uint32_t nslices,
                          const uint8_t *chosen, bool smart, struct orb_lease *lease)
{
    struct charge_shard *own = &sel->shard[mine];
    if (nslices == 1) {
        uint64_t charge = smart ? charge_of(slices[0].length) : 0;
        if (charge != 0)
            atomic_fetch_add_explicit(&own->charged[chosen[0]], charge, memory_order_relaxed);
        shard_add(mine, &own->allocated[chosen[0]], slices[0].length);
        lease->nic[0] = chosen[0];
        lease->charge[0] = charge;
        return;
    }
    uint64_t charge_sum[ORB_TOPO_MAX_NICS];
    uint64_t byte_sum[ORB_TOPO_MAX_NICS];
    for (uint32_t i = 0; i < n; i++) { /* every chosen NIC is a candidate */
        charge_sum[cand[i].nic] = 0;
        byte_sum[cand[i].nic] = 0;
    }
    for (uint32_t s = 0; s < nslices; s++) {
        uint8_t nic = chosen[s];
        uint64_t charge = smart ? charge_of(slices[s].length) : 0;
        charge_sum[nic] += charge;
        byte_sum[nic] += slices[s].length;
        lease->nic[s] = nic;
        lease->charge[s] = charge;
    }
    bool sectioned = smart; /* several slices: their charges are seen as one */
    uint32_t seq = 0;
    if (sectioned) {
        if (mine == SHARED_SHARD)
            pthread_mutex_lock(&sel->shared_lock);
        seq = atomic_load_explicit(&own->seq, memory_order_relaxed);
        atomic_store_explicit(&own->seq, seq + 1, memory_order_relaxed);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint8_t nic = cand[i].nic;
        /* Release: a reader that sees this charge sees the odd seq stored before it. */
        if (charge_sum[nic] != 0)
            atomic_fetch_add_explicit(&own->charged[nic], charge_sum[nic], memory_order_release);
        if (byte_sum[nic] != 0)
            shard_add(mine, &own->allocated[nic], byte_sum[nic]);
    }
    if (sectioned) {
        atomic_store_explicit(&own->seq, seq + 2, memory_order_release);
        if (mine == SHARED_SHARD)
            pthread_mutex_unlock(&sel->shared_lock);
    }
}

/* The lease's owner and pending slices, published last. */
static void lease_arm(struct orb_lease *lease, struct orb_selector *sel, uint32_t shard,
                      uint32_t nslices)
{
    lease->selector = sel;
    lease->shard = (uint8_t)shard;
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
    uint32_t mine = this_thread_shard();
    mark_shard_used(sel, mine);
    if (smart)
        refresh_others(sel, mine, nslices);
    double low;
    uint32_t n = gather(sel, mine, tier, peer_mask, slices[0].length, cand, &low);
    if (n == 0)
        return orb_fail(ORB_EUNAVAILABLE,
                        "select: no eligible NIC (tier row, health and peer mask %#llx exclude "
                        "all %u)", (unsigned long long)peer_mask, sel->nnics);
    struct charge_shard *own = &sel->shard[mine];
    if (!smart) {
        /* Round-robin within the lowest non-empty tier. */
        n = keep_first_tier(cand, n); /* charge_parent() walks cand[0..n) once per NIC */
        deal_round_robin(atomic_fetch_add_explicit(&sel->rr_turn, nslices, memory_order_relaxed),
                         cand, n, nslices, chosen);
    } else if (nslices == 1) {
        chosen[0] = cand[best_with_ties(sel, cand, n, low)].nic;
    } else if (sel->cfg.probe_interval != 0 &&
               (atomic_load_explicit(&own->multi_parents, memory_order_relaxed) + 1) %
                       sel->cfg.probe_interval == 0) {
        atomic_store_explicit(&own->multi_parents, 0, memory_order_relaxed);
        uint32_t start = atomic_load_explicit(&own->probe_turn, memory_order_relaxed);
        atomic_store_explicit(&own->probe_turn, start + nslices, memory_order_relaxed);
        deal_round_robin(start, cand, n, nslices, chosen);
    } else {
        atomic_store_explicit(&own->multi_parents,
                              atomic_load_explicit(&own->multi_parents, memory_order_relaxed) + 1,
                              memory_order_relaxed);
        split_by_weight(sel, cand, n, nslices, chosen);
    }
    charge_parent(sel, mine, cand, n, slices, nslices, chosen, smart, lease);
    lease_arm(lease, sel, mine, nslices);
    return 0;
}

uint8_t orb_lease_nic(const struct orb_lease *lease, uint32_t slice)
{
    return lease != NULL && slice < lease->nslices ? lease->nic[slice] : ORB_SELECT_EXCLUDED;
}

/* Return one slice's charge to the shard that took it, so that a shard's charges are its own
 * leases' exactly: the thread that charged sees them go at once. */
static void give_back(struct orb_lease *lease, uint32_t slice)
{
    uint64_t charge = lease->charge[slice];
    if (charge != 0)
        atomic_fetch_sub_explicit(&lease->selector->shard[lease->shard].charged[lease->nic[slice]],
                                  charge, memory_order_relaxed);
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
    uint64_t charged[ORB_TOPO_MAX_NICS];
    sum_shards(sel, atomic_load_explicit(&sel->shards_used, memory_order_relaxed), charged);
    for (uint32_t i = 0; i < sel->nnics; i++) {
        const struct orb_nic_estimator *e = &sel->est[i];
        uint64_t allocated = 0;
        for (uint32_t s = 0; s < SELECT_SHARDS; s++)
            allocated += atomic_load_explicit(&sel->shard[s].allocated[i], memory_order_relaxed);
        uint64_t link = atomic_load_explicit(&e->link_mbps, memory_order_relaxed);
        out[i] = (struct orb_nic_load){
            .nic = (uint8_t)i,
            .healthy = (uint8_t)((healthy >> i) & 1),
            .link_mbps = link,
            .effective_mbps = (uint64_t)(
                orb_estimator_effective_gbps(&sel->cfg.estimator, link) * 1000.0 + 0.5),
            .selection_bps = orb_estimator_selection_bps(e),
            .transmit_bps = orb_estimator_transmit_bps(e),
            .charged_bytes = charged[i],
            .posted_bytes = orb_estimator_posted_bytes(e),
            .completed_bytes = orb_estimator_completed_bytes(e),
            .allocated_bytes = allocated,
        };
    }
    *count = sel->nnics;
    return 0;
}

struct orb_nic_estimator *orb_selector_estimator(struct orb_selector *sel, uint32_t nic)
{
    return sel != NULL && nic < sel->nnics ? &sel->est[nic] : NULL;
}

void orb_selector_refresh(struct orb_selector *sel)
{
    if (sel == NULL)
        return;
    uint32_t mine = this_thread_shard();
    mark_shard_used(sel, mine);
    sum_others(sel, mine);
}

uint32_t orb_selector_thread_shard(void)
{
    return this_thread_shard();
}

uint32_t orb_selector_owned_shards(void)
{
    return atomic_load_explicit(&shards_owned, memory_order_relaxed);
}

const struct orb_estimator_config *orb_selector_estimator_config(const struct orb_selector *sel)
{
    return &sel->cfg.estimator;
}
