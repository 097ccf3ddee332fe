/* Rail health: a bounded table of per-pair circuit breakers (see rail.h). */
#include "rail.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

#define NO_INDEX (-1)

struct rail_pair {
    struct orb_rail_key key;
    int32_t next;                 /* hash chain when in use, free list otherwise */
    uint8_t in_use;
    uint8_t state;                /* enum orb_rail_state */
    uint8_t trial_posted;
    uint8_t admitted_once;        /* admitted_ns is meaningful */
    uint32_t nfail;
    uint64_t fail_ns[ORB_RAIL_MAX_THRESHOLD]; /* recent failures, oldest first */
    uint64_t cooldown_ns;
    uint64_t resume_ns;
    uint64_t admitted_ns;         /* last trial admission, for the probe interval */
    uint64_t trial_token;         /* 0: no trial */
    uint64_t last_use;            /* LRU tick */
};

struct orb_rail_table {
    pthread_mutex_t lock;
    struct orb_rail_config cfg;
    struct orb_clock clock;
    struct rail_pair *pairs;      /* cfg.max_rail_pairs entries */
    int32_t *buckets;
    uint32_t bucket_mask;
    int32_t free_head;
    uint32_t used;
    uint64_t tick;
    uint64_t next_token;
    atomic_uint_fast64_t paused;  /* pairs open or in trial: the mask fast path reads it */
    struct orb_rail_stats stats;  /* open_pairs and pairs are filled in on read */
    struct orb_rail_nic_stats nic[ORB_RAIL_MAX_NICS];
};

void orb_rail_config_default(struct orb_rail_config *cfg)
{
    cfg->error_threshold = ORB_RAIL_DEFAULT_THRESHOLD;
    cfg->error_window_ns = ORB_RAIL_DEFAULT_WINDOW_NS;
    cfg->cooldown_ns = ORB_RAIL_DEFAULT_COOLDOWN_NS;
    cfg->max_cooldown_ns = ORB_RAIL_DEFAULT_MAX_COOLDOWN_NS;
    cfg->probe_interval_ns = ORB_RAIL_DEFAULT_PROBE_INTERVAL_NS;
    cfg->max_rail_pairs = ORB_RAIL_DEFAULT_MAX_PAIRS;
}

static int check_config(const struct orb_rail_config *c)
{
    if (c->error_threshold < 1 || c->error_threshold > ORB_RAIL_MAX_THRESHOLD)
        return orb_fail(ORB_EINVAL, "rail_error_threshold %u outside 1..%d", c->error_threshold,
                        ORB_RAIL_MAX_THRESHOLD);
    if (c->error_window_ns == 0)
        return orb_fail(ORB_EINVAL, "rail_error_window is zero");
    if (c->max_cooldown_ns < c->cooldown_ns)
        return orb_fail(ORB_EINVAL, "rail maximum cooldown %llu ns is below the cooldown %llu ns",
                        (unsigned long long)c->max_cooldown_ns,
                        (unsigned long long)c->cooldown_ns);
    if (c->max_rail_pairs < 1 || c->max_rail_pairs > ORB_RAIL_MAX_PAIRS)
        return orb_fail(ORB_EINVAL, "max_rail_pairs %u outside 1..%u", c->max_rail_pairs,
                        ORB_RAIL_MAX_PAIRS);
    return 0;
}

int orb_rail_table_new(const struct orb_rail_config *cfg, const struct orb_clock *clock,
                       struct orb_rail_table **out)
{
    if (!cfg || !clock || !clock->now_ns || !out)
        return orb_fail(ORB_EINVAL, "rail table: NULL config, clock or output");
    int rc = check_config(cfg);
    if (rc)
        return rc;
    struct orb_rail_table *t = calloc(1, sizeof(*t));
    if (!t)
        return orb_fail(ORB_ENOMEM, "rail table: out of memory");
    uint32_t nbuckets = 1;
    while (nbuckets < cfg->max_rail_pairs)
        nbuckets <<= 1;
    t->pairs = calloc(cfg->max_rail_pairs, sizeof(*t->pairs));
    t->buckets = malloc((size_t)nbuckets * sizeof(*t->buckets));
    if (!t->pairs || !t->buckets) {
        rc = orb_fail(ORB_ENOMEM, "rail table: out of memory for %u pairs", cfg->max_rail_pairs);
        goto fail_arrays;
    }
    if (pthread_mutex_init(&t->lock, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "rail table: cannot create its mutex");
        goto fail_arrays;
    }
    for (uint32_t i = 0; i < nbuckets; i++)
        t->buckets[i] = NO_INDEX;
    for (uint32_t i = 0; i < cfg->max_rail_pairs; i++)
        t->pairs[i].next = i + 1 < cfg->max_rail_pairs ? (int32_t)(i + 1) : NO_INDEX;
    t->free_head = 0;
    t->bucket_mask = nbuckets - 1;
    t->cfg = *cfg;
    t->clock = *clock;
    atomic_init(&t->paused, 0);
    *out = t;
    return 0;

fail_arrays:
    free(t->pairs);
    free(t->buckets);
    free(t);
    return rc;
}

void orb_rail_table_free(struct orb_rail_table *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->pairs);
    free(t->buckets);
    free(t);
}

/* ---- lookup (callers hold the lock) --------------------------------------------------------- */

static uint32_t key_hash(const struct orb_rail_key *k)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof(k->peer.bytes); i++)
        h = (h ^ k->peer.bytes[i]) * 0x100000001b3ull;
    h = (h ^ k->local_nic) * 0x100000001b3ull;
    h = (h ^ k->remote_nic) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

static bool key_equal(const struct orb_rail_key *a, const struct orb_rail_key *b)
{
    return a->local_nic == b->local_nic && a->remote_nic == b->remote_nic &&
           memcmp(a->peer.bytes, b->peer.bytes, sizeof(a->peer.bytes)) == 0;
}

static struct rail_pair *find(struct orb_rail_table *t, const struct orb_rail_key *k)
{
    for (int32_t i = t->buckets[key_hash(k) & t->bucket_mask]; i != NO_INDEX; i = t->pairs[i].next)
        if (key_equal(&t->pairs[i].key, k))
            return &t->pairs[i];
    return NULL;
}

static void unlink_pair(struct orb_rail_table *t, struct rail_pair *p)
{
    int32_t idx = (int32_t)(p - t->pairs);
    int32_t *link = &t->buckets[key_hash(&p->key) & t->bucket_mask];
    while (*link != idx)
        link = &t->pairs[*link].next;
    *link = p->next;
    if (p->state != ORB_RAIL_HEALTHY) {
        atomic_fetch_sub(&t->paused, 1);
        t->nic[p->key.local_nic].open_pairs--;
    }
    memset(p, 0, sizeof(*p));
    p->next = t->free_head;
    t->free_head = idx;
    t->used--;
}

/* Drop failures whose age reached the window; a clock read out of order keeps them. */
static void prune_failures(const struct orb_rail_table *t, struct rail_pair *p, uint64_t now)
{
    uint32_t keep = 0;
    for (uint32_t i = 0; i < p->nfail; i++)
        if (p->fail_ns[i] > now || now - p->fail_ns[i] < t->cfg.error_window_ns)
            p->fail_ns[keep++] = p->fail_ns[i];
    p->nfail = keep;
}

static bool evictable(const struct orb_rail_table *t, struct rail_pair *p, uint64_t now)
{
    if (p->state != ORB_RAIL_HEALTHY)
        return false;
    prune_failures(t, p, now);
    return p->nfail == 0; /* recent failures make the pair unproven: keep it */
}

static struct rail_pair *insert(struct orb_rail_table *t, const struct orb_rail_key *k,
                                uint64_t now)
{
    if (t->free_head == NO_INDEX) {
        struct rail_pair *victim = NULL;
        for (uint32_t i = 0; i < t->cfg.max_rail_pairs; i++) {
            struct rail_pair *p = &t->pairs[i];
            if (p->in_use && evictable(t, p, now) && (!victim || p->last_use < victim->last_use))
                victim = p;
        }
        if (!victim)
            return NULL;
        unlink_pair(t, victim);
    }
    int32_t idx = t->free_head;
    struct rail_pair *p = &t->pairs[idx];
    t->free_head = p->next;
    memset(p, 0, sizeof(*p));
    p->key = *k;
    p->in_use = 1;
    p->state = ORB_RAIL_HEALTHY;
    p->cooldown_ns = t->cfg.cooldown_ns;
    uint32_t b = key_hash(k) & t->bucket_mask;
    p->next = t->buckets[b];
    t->buckets[b] = idx;
    t->used++;
    return p;
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static void pause_pair(struct orb_rail_table *t, struct rail_pair *p, uint64_t now)
{
    if (p->state == ORB_RAIL_HEALTHY) {
        atomic_fetch_add(&t->paused, 1);
        t->nic[p->key.local_nic].open_pairs++;
    }
    p->state = ORB_RAIL_OPEN;
    p->resume_ns = sat_add(now, p->cooldown_ns);
    p->trial_token = 0;
    p->trial_posted = 0;
    p->nfail = 0;
}

static int check_key(const struct orb_rail_key *key)
{
    if (!key)
        return orb_fail(ORB_EINVAL, "rail: NULL pair");
    if (key->local_nic >= ORB_RAIL_MAX_NICS)
        return orb_fail(ORB_EINVAL, "rail: local NIC id %u is not below %d", key->local_nic,
                        ORB_RAIL_MAX_NICS);
    return 0;
}

/* ---- observations ------------------------------------------------------------------------------ */

int orb_rail_record_failure(struct orb_rail_table *t, const struct orb_rail_key *key)
{
    if (!t)
        return orb_fail(ORB_EINVAL, "rail: NULL table");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    uint64_t now = orb_clock_now(&t->clock);
    struct rail_pair *p = find(t, key);
    if (!p)
        p = insert(t, key, now);
    if (!p) {
        pthread_mutex_unlock(&t->lock);
        return orb_fail(ORB_ERESOURCE,
                        "rail: all %u pair entries are paused or have recent failures "
                        "(max_rail_pairs)", t->cfg.max_rail_pairs);
    }
    p->last_use = ++t->tick;
    t->stats.errors++;
    t->nic[key->local_nic].errors++;
    if (p->state == ORB_RAIL_HEALTHY) {
        prune_failures(t, p, now);
        /* nfail < threshold <= ORB_RAIL_MAX_THRESHOLD here: the pair opens on reaching it. */
        p->fail_ns[p->nfail++] = now;
        if (p->nfail >= t->cfg.error_threshold)
            pause_pair(t, p, now);
    }
    /* Paused: an early failure leaves the cooldown intact. */
    pthread_mutex_unlock(&t->lock);
    return 0;
}

void orb_rail_record_success(struct orb_rail_table *t, const struct orb_rail_key *key)
{
    if (!t || !key)
        return;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = find(t, key);
    if (p && p->state == ORB_RAIL_HEALTHY) {
        p->nfail = 0;
        p->last_use = ++t->tick;
    }
    pthread_mutex_unlock(&t->lock);
}

bool orb_rail_usable(struct orb_rail_table *t, const struct orb_rail_key *key)
{
    if (!t || !key || key->local_nic >= ORB_RAIL_MAX_NICS)
        return false;
    if (atomic_load_explicit(&t->paused, memory_order_acquire) == 0)
        return true;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = find(t, key);
    bool ok = !p || p->state == ORB_RAIL_HEALTHY;
    pthread_mutex_unlock(&t->lock);
    return ok;
}

uint64_t orb_rail_usable_mask(struct orb_rail_table *t, const struct orb_epoch *peer,
                              uint64_t local_mask,
                              const uint16_t remote_of_local[ORB_RAIL_MAX_NICS])
{
    if (!t || !peer || !remote_of_local)
        return 0;
    if (atomic_load_explicit(&t->paused, memory_order_acquire) == 0)
        return local_mask;
    uint64_t out = 0;
    struct orb_rail_key k = {.peer = *peer};
    pthread_mutex_lock(&t->lock);
    for (uint64_t m = local_mask; m; m &= m - 1) {
        unsigned nic = (unsigned)__builtin_ctzll(m);
        k.local_nic = (uint16_t)nic;
        k.remote_nic = remote_of_local[nic];
        struct rail_pair *p = find(t, &k);
        if (!p || p->state == ORB_RAIL_HEALTHY)
            out |= 1ull << nic;
    }
    pthread_mutex_unlock(&t->lock);
    return out;
}

/* ---- half-open trials ---------------------------------------------------------------------------- */

int orb_rail_trial_begin(struct orb_rail_table *t, const struct orb_rail_key *key,
                         uint64_t *token)
{
    if (!t || !token)
        return orb_fail(ORB_EINVAL, "rail trial: NULL table or token");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    uint64_t now = orb_clock_now(&t->clock);
    struct rail_pair *p = find(t, key);
    if (!p || p->state == ORB_RAIL_HEALTHY) {
        rc = orb_fail(ORB_EINVAL, "rail trial: the pair is not paused");
    } else if (p->state == ORB_RAIL_TRIAL) {
        rc = orb_fail(ORB_EBUSY, "rail trial: the pair's one trial is already admitted");
    } else if (now < p->resume_ns) {
        rc = orb_fail(ORB_EAGAIN, "rail trial: cooldown has %llu ns left",
                      (unsigned long long)(p->resume_ns - now));
    } else if (p->admitted_once && now >= p->admitted_ns &&
               now - p->admitted_ns < t->cfg.probe_interval_ns) {
        rc = orb_fail(ORB_EAGAIN, "rail trial: probe interval has %llu ns left",
                      (unsigned long long)(t->cfg.probe_interval_ns - (now - p->admitted_ns)));
    } else {
        p->state = ORB_RAIL_TRIAL;
        p->trial_token = ++t->next_token;
        p->trial_posted = 0;
        p->admitted_ns = now;
        p->admitted_once = 1;
        p->last_use = ++t->tick;
        *token = p->trial_token;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* The pair whose current trial is `token`, or NULL with the error set. Lock held. */
static struct rail_pair *current_trial(struct orb_rail_table *t, const struct orb_rail_key *key,
                                       uint64_t token, int *rc)
{
    struct rail_pair *p = find(t, key);
    if (!p || p->state != ORB_RAIL_TRIAL || token == 0 || p->trial_token != token) {
        *rc = orb_fail(ORB_ESTALE, "rail trial: token %llu is not the pair's current trial",
                       (unsigned long long)token);
        return NULL;
    }
    *rc = 0;
    return p;
}

int orb_rail_trial_posted(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token)
{
    if (!t)
        return orb_fail(ORB_EINVAL, "rail trial: NULL table");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = current_trial(t, key, token, &rc);
    if (p && !p->trial_posted) {
        p->trial_posted = 1;
        t->stats.probes++;
        t->nic[key->local_nic].probes++;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int orb_rail_trial_cancel(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token)
{
    if (!t)
        return orb_fail(ORB_EINVAL, "rail trial: NULL table");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = current_trial(t, key, token, &rc);
    if (p && p->trial_posted) {
        rc = orb_fail(ORB_EBUSY, "rail trial: already posted; only its verdict ends it");
    } else if (p) {
        p->state = ORB_RAIL_OPEN;
        p->trial_token = 0;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int orb_rail_trial_succeeded(struct orb_rail_table *t, const struct orb_rail_key *key,
                             uint64_t token)
{
    if (!t)
        return orb_fail(ORB_EINVAL, "rail trial: NULL table");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = current_trial(t, key, token, &rc);
    if (p && !p->trial_posted) {
        /* A receipt for work that was never posted proves nothing about the pair. */
        rc = orb_fail(ORB_EINVAL, "rail trial: token %llu was never posted; only a posted trial's receipt reopens",
                      (unsigned long long)token);
        p = NULL;
    }
    if (p) {
        p->state = ORB_RAIL_HEALTHY;
        p->trial_token = 0;
        p->trial_posted = 0;
        p->admitted_once = 0;
        p->nfail = 0;
        p->cooldown_ns = t->cfg.cooldown_ns;
        p->last_use = ++t->tick;
        atomic_fetch_sub(&t->paused, 1);
        t->nic[key->local_nic].open_pairs--;
        t->stats.recoveries++;
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int orb_rail_trial_failed(struct orb_rail_table *t, const struct orb_rail_key *key,
                          uint64_t token)
{
    if (!t)
        return orb_fail(ORB_EINVAL, "rail trial: NULL table");
    int rc = check_key(key);
    if (rc)
        return rc;
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = current_trial(t, key, token, &rc);
    if (p) {
        uint64_t now = orb_clock_now(&t->clock);
        uint64_t doubled = sat_add(p->cooldown_ns, p->cooldown_ns);
        p->cooldown_ns = doubled < t->cfg.max_cooldown_ns ? doubled : t->cfg.max_cooldown_ns;
        p->last_use = ++t->tick;
        t->stats.errors++;
        t->nic[key->local_nic].errors++;
        pause_pair(t, p, now);
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

/* ---- housekeeping and statistics ------------------------------------------------------------------ */

uint32_t orb_rail_forget_peer(struct orb_rail_table *t, const struct orb_epoch *peer)
{
    if (!t || !peer)
        return 0;
    uint32_t dropped = 0;
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->cfg.max_rail_pairs; i++) {
        struct rail_pair *p = &t->pairs[i];
        if (p->in_use && memcmp(p->key.peer.bytes, peer->bytes, sizeof(peer->bytes)) == 0) {
            unlink_pair(t, p);
            dropped++;
        }
    }
    pthread_mutex_unlock(&t->lock);
    return dropped;
}

int orb_rail_pair_info(struct orb_rail_table *t, const struct orb_rail_key *key,
                       struct orb_rail_pair_info *out)
{
    if (!t || !out)
        return orb_fail(ORB_EINVAL, "rail: NULL table or output");
    int rc = check_key(key);
    if (rc)
        return rc;
    struct orb_rail_pair_info info = {.state = ORB_RAIL_HEALTHY,
                                      .cooldown_ns = t->cfg.cooldown_ns};
    pthread_mutex_lock(&t->lock);
    struct rail_pair *p = find(t, key);
    if (p) {
        if (p->state == ORB_RAIL_HEALTHY)
            prune_failures(t, p, orb_clock_now(&t->clock));
        info.state = (enum orb_rail_state)p->state;
        info.recent_failures = p->nfail;
        info.cooldown_ns = p->cooldown_ns;
        info.resume_ns = p->state == ORB_RAIL_HEALTHY ? 0 : p->resume_ns;
        info.trial_posted = p->trial_posted != 0;
    }
    pthread_mutex_unlock(&t->lock);
    *out = info;
    return 0;
}

void orb_rail_stats(struct orb_rail_table *t, struct orb_rail_stats *out)
{
    if (!t || !out)
        return;
    pthread_mutex_lock(&t->lock);
    *out = t->stats;
    out->open_pairs = atomic_load(&t->paused);
    out->pairs = t->used;
    pthread_mutex_unlock(&t->lock);
}

int orb_rail_nic_stats(struct orb_rail_table *t, uint32_t local_nic,
                       struct orb_rail_nic_stats *out)
{
    if (!t || !out)
        return orb_fail(ORB_EINVAL, "rail: NULL table or output");
    if (local_nic >= ORB_RAIL_MAX_NICS)
        return orb_fail(ORB_EINVAL, "rail: local NIC id %u is not below %d", local_nic,
                        ORB_RAIL_MAX_NICS);
    pthread_mutex_lock(&t->lock);
    *out = t->nic[local_nic];
    pthread_mutex_unlock(&t->lock);
    return 0;
}
