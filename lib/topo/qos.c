/* Priority tiers, promotion, deadline arbitration and admission (see qos.h). */
#include "qos.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>

#include "core/error.h"

#define ARBITER_MAX_CAPACITY (1u << 20)

void orb_qos_config_default(struct orb_qos_config *cfg)
{
    cfg->promotion_timeout_ns = ORB_QOS_PROMOTION_TIMEOUT_NS;
    cfg->promotion_per_entry = false;
}

int orb_qos_set_init(struct orb_qos_set *set, const struct orb_qos_config *cfg,
                     const struct orb_clock *clock)
{
    if (!set || !cfg || !clock || !clock->now_ns)
        return orb_fail(ORB_EINVAL, "qos set: NULL set, config or clock");
    for (int p = 0; p < ORB_QOS_NPRIO; p++) {
        set->head[p] = NULL;
        set->tail[p] = NULL;
        set->count[p] = 0;
    }
    set->cfg = *cfg;
    set->clock = *clock;
    set->next_check_ns = 0;
    set->promoted = 0;
    return 0;
}

static void append(struct orb_qos_set *set, struct orb_qos_entry *e)
{
    unsigned p = e->priority;
    e->next = NULL;
    e->queued = 1;
    if (set->tail[p])
        set->tail[p]->next = e;
    else
        set->head[p] = e;
    set->tail[p] = e;
    set->count[p]++;
}

static int check_entry(const struct orb_qos_entry *e)
{
    if (!e)
        return orb_fail(ORB_EINVAL, "qos enqueue: NULL entry");
    if (e->priority >= ORB_QOS_NPRIO)
        return orb_fail(ORB_EINVAL, "qos enqueue: priority %u out of range", e->priority);
    if (e->queued)
        return orb_fail(ORB_EBUSY, "qos enqueue: entry is already queued");
    return 0;
}

/* Validate entries[0..n) before linking any, marking each queued so that one repeated in the
 * array is caught as already queued; on failure the marks made are undone. */
static int mark_all(const struct orb_qos_set *set, struct orb_qos_entry *const *entries, size_t n, const char *op)
{
    if (!set || (n && !entries))
        return orb_fail(ORB_EINVAL, "qos %s: NULL set or entries", op);
    for (size_t i = 0; i < n; i++) {
        int rc = check_entry(entries[i]);
        if (rc) {
            for (size_t j = 0; j < i; j++)
                entries[j]->queued = 0;
            return rc == ORB_EBUSY ? orb_fail(ORB_EBUSY, "qos %s: entry %zu is queued or repeated", op, i) : rc;
        }
        entries[i]->queued = 1;
    }
    return 0;
}

int orb_qos_enqueue(struct orb_qos_set *set, struct orb_qos_entry *const *entries, size_t n)
{
    int rc = mark_all(set, entries, n, "enqueue");
    if (rc)
        return rc;
    uint64_t now = orb_clock_now(&set->clock);
    for (size_t i = 0; i < n; i++) {
        entries[i]->enqueue_ns = now;
        append(set, entries[i]);
    }
    return 0;
}

int orb_qos_push_front(struct orb_qos_set *set, struct orb_qos_entry *const *entries, size_t n)
{
    int rc = mark_all(set, entries, n, "push_front");
    if (rc)
        return rc;
    /* Last first, so that entries[0] ends up at the head of its tier. */
    for (size_t i = n; i-- > 0;) {
        struct orb_qos_entry *e = entries[i];
        unsigned p = e->priority;
        e->next = set->head[p];
        set->head[p] = e;
        if (!set->tail[p])
            set->tail[p] = e;
        set->count[p]++;
    }
    return 0;
}

int orb_qos_requeue(struct orb_qos_set *set, struct orb_qos_entry *entry)
{
    if (!set)
        return orb_fail(ORB_EINVAL, "qos requeue: NULL set");
    int rc = check_entry(entry);
    if (rc)
        return rc;
    append(set, entry);
    return 0;
}

static struct orb_qos_entry *pop_head(struct orb_qos_set *set, unsigned p)
{
    struct orb_qos_entry *e = set->head[p];
    set->head[p] = e->next;
    if (!set->head[p])
        set->tail[p] = NULL;
    set->count[p]--;
    e->next = NULL;
    e->queued = 0;
    return e;
}

static int first_tier(const struct orb_qos_set *set, unsigned allowed_tiers)
{
    for (unsigned p = 0; p < ORB_QOS_NPRIO; p++)
        if ((allowed_tiers & (1u << p)) && set->head[p])
            return (int)p;
    return -1;
}

struct orb_qos_entry *orb_qos_pop(struct orb_qos_set *set, unsigned allowed_tiers)
{
    int p = set ? first_tier(set, allowed_tiers) : -1;
    return p < 0 ? NULL : pop_head(set, (unsigned)p);
}

struct orb_qos_entry *orb_qos_peek(const struct orb_qos_set *set, unsigned allowed_tiers)
{
    int p = set ? first_tier(set, allowed_tiers) : -1;
    return p < 0 ? NULL : set->head[p];
}

size_t orb_qos_total(const struct orb_qos_set *set)
{
    return set ? set->count[0] + set->count[1] + set->count[2] : 0;
}

size_t orb_qos_pop_tier(struct orb_qos_set *set, unsigned allowed_tiers,
                        struct orb_qos_entry **out, size_t max)
{
    int p = (set && out) ? first_tier(set, allowed_tiers) : -1;
    size_t got = 0;
    if (p < 0)
        return 0;
    while (got < max && set->head[p])
        out[got++] = pop_head(set, (unsigned)p);
    return got;
}

/* Unlink e, whose predecessor in tier p is prev (NULL: e is the head); it is the caller's
 * (still marked queued, with its next pointer). */
static void unlink_entry(struct orb_qos_set *set, unsigned p, struct orb_qos_entry *prev, struct orb_qos_entry *e)
{
    if (prev)
        prev->next = e->next;
    else
        set->head[p] = e->next;
    if (set->tail[p] == e)
        set->tail[p] = prev;
    set->count[p]--;
}

int orb_qos_remove(struct orb_qos_set *set, struct orb_qos_entry *entry)
{
    if (!set || !entry)
        return orb_fail(ORB_EINVAL, "qos remove: NULL set or entry");
    if (!entry->queued || entry->priority >= ORB_QOS_NPRIO)
        return orb_fail(ORB_ENOENT, "qos remove: entry is not queued");
    unsigned p = entry->priority;
    struct orb_qos_entry *prev = NULL;
    for (struct orb_qos_entry *e = set->head[p]; e; prev = e, e = e->next) {
        if (e != entry)
            continue;
        unlink_entry(set, p, prev, e);
        e->next = NULL;
        e->queued = 0;
        return 0;
    }
    return orb_fail(ORB_ENOENT, "qos remove: entry is not queued in this set");
}

size_t orb_qos_take_where(struct orb_qos_set *set, unsigned allowed_tiers,
                          enum orb_qos_take (*filter)(void *ctx, struct orb_qos_entry *e), void *ctx,
                          struct orb_qos_entry **out, size_t max)
{
    if (!set || !filter || !out)
        return 0;
    size_t n = 0;
    for (unsigned p = 0; p < ORB_QOS_NPRIO && n < max; p++) {
        if (!(allowed_tiers & (1u << p)))
            continue;
        struct orb_qos_entry *prev = NULL, *e = set->head[p];
        while (e != NULL && n < max) {
            enum orb_qos_take verdict = filter(ctx, e);
            if (verdict == ORB_QOS_STOP)
                return n;
            struct orb_qos_entry *next = e->next;
            if (verdict != ORB_QOS_TAKE) {
                prev = e;
                e = next;
                continue;
            }
            unlink_entry(set, p, prev, e);
            e->next = NULL;
            e->queued = 0;
            out[n++] = e;
            e = next;
        }
    }
    return n;
}

static bool timed_out(const struct orb_qos_entry *e, uint64_t now, uint64_t timeout)
{
    /* now < enqueue_ns guards the unsigned subtraction against a clock read out of order. */
    return e->enqueue_ns != 0 && now >= e->enqueue_ns && now - e->enqueue_ns >= timeout;
}

/* Move the entries the policy selects from tier `from` to the tail of `from - 1`. */
static size_t promote_tier(struct orb_qos_set *set, unsigned from, uint64_t now)
{
    unsigned to = from - 1;
    uint64_t timeout = set->cfg.promotion_timeout_ns;
    size_t moved = 0;
    struct orb_qos_entry *head = set->head[from];
    if (!head)
        return 0;
    if (!set->cfg.promotion_per_entry) {
        if (!timed_out(head, now, timeout))
            return 0;
        for (struct orb_qos_entry *e = head; e; e = e->next)
            e->priority = (uint8_t)to;
        /* Splice the whole tier after the tail of the next one. */
        if (set->tail[to])
            set->tail[to]->next = head;
        else
            set->head[to] = head;
        set->tail[to] = set->tail[from];
        moved = set->count[from];
        set->count[to] += moved;
        set->head[from] = set->tail[from] = NULL;
        set->count[from] = 0;
        return moved;
    }
    struct orb_qos_entry *prev = NULL, *e = head;
    while (e) {
        struct orb_qos_entry *next = e->next;
        if (timed_out(e, now, timeout)) {
            unlink_entry(set, from, prev, e);
            e->priority = (uint8_t)to;
            e->next = NULL;
            if (set->tail[to])
                set->tail[to]->next = e;
            else
                set->head[to] = e;
            set->tail[to] = e;
            set->count[to]++;
            moved++;
        } else {
            prev = e;
        }
        e = next;
    }
    return moved;
}

size_t orb_qos_promote(struct orb_qos_set *set)
{
    if (!set || set->cfg.promotion_timeout_ns == 0)
        return 0;
    uint64_t now = orb_clock_now(&set->clock);
    if (now < set->next_check_ns)
        return 0;
    set->next_check_ns = now + ORB_QOS_PROMOTION_CHECK_NS;
    /* One tier per pass: a Low entry needs two passes to reach High. */
    size_t moved = promote_tier(set, ORB_PRIO_MEDIUM, now);
    if (!moved)
        moved = promote_tier(set, ORB_PRIO_LOW, now);
    set->promoted += moved;
    return moved;
}

/* ---- deadline arbitration ------------------------------------------------------------------ */

static bool has_deadline(uint64_t deadline_ns)
{
    return deadline_ns != ORB_QOS_NO_DEADLINE && deadline_ns != UINT64_MAX;
}

double orb_qos_deadline_mlu(uint64_t bytes_ahead, uint64_t length, uint64_t deadline_ns,
                            uint64_t now_ns, double bw_bytes_per_s)
{
    if (!has_deadline(deadline_ns) || !(bw_bytes_per_s > 0.0))
        return 0.0;
    if (deadline_ns <= now_ns)
        return DBL_MAX;
    double window_s = (double)(deadline_ns - now_ns) / 1e9;
    double predicted_s = ((double)bytes_ahead + (double)length) / bw_bytes_per_s;
    return predicted_s / window_s;
}

struct orb_qos_arbiter {
    uint32_t capacity;
    double *mlu;                    /* per original index */
    uint8_t *taken;                 /* per original index */
    uint32_t *order;                /* result, original indices */
    uint32_t *scratch;              /* merge sort buffer */
    struct orb_qos_entry **copy;    /* the candidates in their original order */
};

int orb_qos_arbiter_new(uint32_t capacity, struct orb_qos_arbiter **out)
{
    if (!out || capacity == 0 || capacity > ARBITER_MAX_CAPACITY)
        return orb_fail(ORB_EINVAL, "qos arbiter: capacity %u outside 1..%u", capacity,
                        ARBITER_MAX_CAPACITY);
    struct orb_qos_arbiter *a = calloc(1, sizeof(*a));
    if (!a)
        return orb_fail(ORB_ENOMEM, "qos arbiter: out of memory");
    a->capacity = capacity;
    a->mlu = calloc(capacity, sizeof(*a->mlu));
    a->taken = calloc(capacity, sizeof(*a->taken));
    a->order = calloc(capacity, sizeof(*a->order));
    a->scratch = calloc(capacity, sizeof(*a->scratch));
    a->copy = calloc(capacity, sizeof(*a->copy));
    if (!a->mlu || !a->taken || !a->order || !a->scratch || !a->copy) {
        orb_qos_arbiter_free(a);
        return orb_fail(ORB_ENOMEM, "qos arbiter: out of memory for %u candidates", capacity);
    }
    *out = a;
    return 0;
}

void orb_qos_arbiter_free(struct orb_qos_arbiter *arb)
{
    if (!arb)
        return;
    free(arb->mlu);
    free(arb->taken);
    free(arb->order);
    free(arb->scratch);
    free(arb->copy);
    free(arb);
}

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* Stable merge sort of idx[0..n) by mlu descending (equal keys keep their order). */
static void sort_by_urgency(uint32_t *idx, uint32_t *tmp, size_t n, const double *mlu)
{
    for (size_t width = 1; width < n; width *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * width) {
            size_t mid = lo + width < n ? lo + width : n;
            size_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi)
                tmp[k++] = (mlu[idx[b]] > mlu[idx[a]]) ? idx[b++] : idx[a++];
            while (a < mid)
                tmp[k++] = idx[a++];
            while (b < hi)
                tmp[k++] = idx[b++];
        }
        for (size_t i = 0; i < n; i++)
            idx[i] = tmp[i];
    }
}

int orb_qos_arbitrate(struct orb_qos_arbiter *arb, struct orb_qos_entry **cands, size_t n,
                      uint64_t bytes_ahead, double bw_bytes_per_s, uint64_t now_ns)
{
    if (!arb || (n && !cands))
        return orb_fail(ORB_EINVAL, "qos arbitrate: NULL arbiter or candidates");
    if (n > arb->capacity)
        return orb_fail(ORB_ERESOURCE, "qos arbitrate: %zu candidates over capacity %u", n,
                        arb->capacity);
    for (size_t i = 0; i < n; i++) {
        if (!cands[i])
            return orb_fail(ORB_EINVAL, "qos arbitrate: candidate %zu is NULL", i);
        if (cands[i]->nic != cands[0]->nic || cands[i]->priority != cands[0]->priority)
            return orb_fail(ORB_EINVAL,
                            "qos arbitrate: candidate %zu is on NIC %u tier %u, not NIC %u tier %u",
                            i, cands[i]->nic, cands[i]->priority, cands[0]->nic,
                            cands[0]->priority);
    }
    if (n < 2 || !(bw_bytes_per_s > 0.0))
        return 0; /* nothing to reorder, or no estimate: FIFO */

    for (size_t i = 0; i < n; i++) {
        arb->copy[i] = cands[i];
        arb->taken[i] = 0;
    }
    uint64_t ahead = bytes_ahead;
    size_t greedy = n < ORB_QOS_GREEDY_PICKS ? n : ORB_QOS_GREEDY_PICKS;
    size_t placed = 0;
    for (; placed < greedy; placed++) {
        size_t best = n;
        double best_mlu = 0.0;
        for (size_t i = 0; i < n; i++) {
            if (arb->taken[i])
                continue;
            const struct orb_qos_entry *e = arb->copy[i];
            double mlu = orb_qos_deadline_mlu(ahead, e->bytes, e->deadline_ns, now_ns,
                                              bw_bytes_per_s);
            /* Strictly greater: a tie stays with the earlier candidate (FIFO). */
            if (best == n || mlu > best_mlu) {
                best = i;
                best_mlu = mlu;
            }
        }
        arb->taken[best] = 1;
        arb->order[placed] = (uint32_t)best;
        ahead = sat_add(ahead, arb->copy[best]->bytes);
    }
    if (placed < n) {
        /* The backlog: ranked once against the bytes the greedy slots accumulated. */
        size_t rest = 0;
        for (size_t i = 0; i < n; i++) {
            if (arb->taken[i])
                continue;
            const struct orb_qos_entry *e = arb->copy[i];
            double mlu = orb_qos_deadline_mlu(ahead, e->bytes, e->deadline_ns, now_ns,
                                              bw_bytes_per_s);
            arb->mlu[i] = mlu;
            arb->order[placed + rest++] = (uint32_t)i;
        }
        sort_by_urgency(arb->order + placed, arb->scratch, rest, arb->mlu);
    }
    for (size_t i = 0; i < n; i++)
        cands[i] = arb->copy[arb->order[i]];
    return 0;
}

/* ---- admission ------------------------------------------------------------------------------ */

int orb_qos_admit(const struct orb_qos_admission *in, enum orb_qos_verdict *verdict,
                  double *mlu_out)
{
    if (!in || !verdict)
        return orb_fail(ORB_EINVAL, "qos admission: NULL input or verdict");
    if (!(in->mlu_threshold > 0.0) || !isfinite(in->mlu_threshold))
        return orb_fail(ORB_EINVAL, "qos admission: MLU threshold %g is not a positive number",
                        in->mlu_threshold);
    double mlu = 0.0;
    enum orb_qos_verdict v;
    if (!has_deadline(in->deadline_ns)) {
        v = ORB_QOS_ADMIT;
    } else if (in->deadline_ns <= in->now_ns) {
        v = ORB_QOS_DROP_EXPIRED;
        mlu = DBL_MAX;
    } else if (in->nic_unmeasured || in->recovery_owns_route || !(in->bw_bytes_per_s > 0.0)) {
        v = ORB_QOS_ADMIT_UNMEASURED;
    } else {
        mlu = orb_qos_deadline_mlu(in->bytes_ahead, in->length, in->deadline_ns, in->now_ns,
                                   in->bw_bytes_per_s);
        v = mlu >= in->mlu_threshold ? ORB_QOS_DROP_INFEASIBLE : ORB_QOS_ADMIT;
    }
    *verdict = v;
    if (mlu_out)
        *mlu_out = mlu;
    return 0;
}
