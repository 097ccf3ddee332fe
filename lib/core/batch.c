/* Batches: request checks and pins, slicing, per-slice completion, reports, notifications. */
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "error.h"
#include "log.h"
#include "spin.h"
#include "stager.h"

struct orb_req {
    uint64_t length;
    uint8_t op;
    atomic_uchar attempted;      /* a slice got past orb_xfer_may_start(): bytes may have moved */
    uint8_t effect_unknown;      /* a started WRITE slice may have changed peer bytes; lock */
    uint8_t tp_slot;             /* the transport that carries it (its id) */
    uint8_t staged;              /* its local bytes go through the engine's host staging */
    struct orb_reg *local_pin;   /* released when the last slice ends */
    void *local_loan;            /* the range's loan (memory without a CPU view), with the pin */
    void *tp_private;            /* the transport's per-request space, in the group's block */
    uint32_t remaining;          /* slices not yet ended; batch lock */
    uint32_t withdrawn;          /* slices the batch withdrew before they started */
    uint32_t started;            /* slices that went to the wire */
    int status;                  /* first slice failure, 0 if none */
};

/* One piece of a request as a transport carries it: the unit of work, built from one entry of
 * the request's plan (lib/topo's struct orb_slice is an RDMA plan's offset and length). */
struct orb_piece {
    struct orb_xfer x;           /* first member: transports see only this */
    struct orb_req *req;
    struct orb_stage_job stage_job; /* a staged piece's way through the stager */
    /* Set once by orb_xfer_may_start(), on whatever thread the transport calls it from, and
     * read when the piece ends, possibly on another: atomics, whatever the transport's locks. */
    _Atomic uint8_t started;
    _Atomic uint8_t withdrawn;
};

struct orb_group {
    struct orb_group *next;
    size_t first_index;
    size_t n;
    size_t nslices;
    struct orb_piece *slices;    /* ordered by transport, then request, then plan */
    struct orb_xfer **xfer_ptrs; /* the same order */
    void *private_block;         /* every request's tp_private */
    struct orb_req reqs[];
};

static void group_free(struct orb_group *g)
{
    free(g->slices);
    free(g->xfer_ptrs);
    free(g->private_block);
    free(g);
}

/* Reports are built from counters that completions keep current, so that neither a poll nor a
 * wait walks the requests under the lock; only a failure's span (which ends at the last attempted
 * request) is walked, and only while the report is built.
 *
 * Report rules (struct orb_batch_report):
 *  - the completed prefix: requests 0..prefix-1 all succeeded (prefix_reqs, prefix_bytes);
 *  - the failure starts at the first request that did not succeed and runs through the last
 *    request that was attempted, whatever each one's own outcome; a request is attempted once
 *    one of its slices got past orb_xfer_may_start(), so every request after the span was, by
 *    construction, never attempted. Once every slice ended that is started_end - 1, exact;
 *    while slices are live it is attempted_end - 1, which may count a slice that is about to be
 *    withdrawn but never misses one that started;
 *  - the remote effect is UNKNOWN when any WRITE of the span may have changed peer bytes. */
struct orb_batch {
    orb_engine *engine;          /* referenced */
    orb_segment *segment;        /* referenced */
    pthread_mutex_t lock;
    pthread_cond_t cond;         /* CLOCK_MONOTONIC */
    struct orb_group *groups, *groups_tail;
    size_t n_reqs;               /* accepted requests */
    size_t rejected_index;       /* request named by the last rejected submission */
    size_t rejected_count;       /* requests that share that rejection */
    size_t first_failed;         /* lowest failed request index, SIZE_MAX if none; lock */
    size_t why_index;            /* the request fail_why belongs to, SIZE_MAX if none; lock */
    char fail_why[256];          /* the transport's cause for that request's failure; lock */
    size_t prefix_reqs;          /* leading requests that succeeded; lock */
    uint64_t prefix_bytes;       /* their bytes; lock */
    const struct orb_group *prefix_group; /* the group holding request prefix_reqs; lock */
    atomic_size_t attempted_end; /* 1 + the highest request index that may have started; a
                                  * slice raises it before its last withdrawal check, so it
                                  * never misses a start (and rarely counts one that lost) */
    size_t started_end;          /* 1 + the highest index with a started slice, once ended; lock */
    atomic_size_t withdraw_above;/* requests with a larger index may not start */
    atomic_int withdraw_all;     /* deadline passed: nothing new may start */
    atomic_uint_fast64_t live;   /* slices + notification accepted by a transport, not ended */
    uint64_t slices_live;        /* lock */
    int sealed;
    int waiters;
    int timed_out;
    int orphaned;                /* the user's handle is gone; free when live reaches 0 */
    uint64_t deadline_ns;        /* orb_submit_and_wait's deadline (ORB_DEADLINE_NONE: none) */
    uint64_t first_submit_ns;    /* when its first group was accepted (0: none yet); lock */
    int latency_counted;         /* its latency went to the engine's metrics; lock */
    struct orb_batch *reap_next;
    /* notification */
    enum orb_notify_state notify_state;
    int notify_status;
    int notify_sent;
    size_t notify_len;
    struct orb_piece notify_slice;
    uint8_t notify_data[ORB_NOTIFY_MAX];
};

static struct orb_piece *slice_of(struct orb_xfer *x)
{
    return (struct orb_piece *)((char *)x - offsetof(struct orb_piece, x));
}

static int submit_staged(orb_engine *engine, struct orb_xfer *const *xs, size_t n);

/* ---- transport callbacks ----------------------------------------------------------------- */

static int xfer_withdrawn(const struct orb_batch *b, const struct orb_xfer *x)
{
    return atomic_load(&b->withdraw_all) || x->request_index > atomic_load(&b->withdraw_above);
}

int orb_xfer_may_start(struct orb_xfer *x)
{
    struct orb_piece *s = slice_of(x);
    struct orb_batch *b = x->batch;
    if (x->op == ORB_XFER_NOTIFY) {
        atomic_store_explicit(&s->started, 1, memory_order_release);
        return 1;
    }
    if (xfer_withdrawn(b, x)) {
        atomic_store_explicit(&s->withdrawn, 1, memory_order_release);
        return 0;
    }
    /* Record the attempt before the final check: a report that withdraws everything (the
     * deadline) and then reads attempted_end cannot miss a slice that passes the check (both
     * sides store, then load, sequentially consistent). */
    atomic_store(&s->req->attempted, 1);
    size_t end = (size_t)x->request_index + 1;
    size_t seen = atomic_load(&b->attempted_end);
    while (seen < end && !atomic_compare_exchange_weak(&b->attempted_end, &seen, end)) {
    }
    if (xfer_withdrawn(b, x)) {
        atomic_store_explicit(&s->withdrawn, 1, memory_order_release);
        return 0;
    }
    atomic_store_explicit(&s->started, 1, memory_order_release);
    return 1;
}

/* The request at `index`, searching forward from *gp (callers walk indices in order). */
static struct orb_req *req_at(size_t index, const struct orb_group **gp)
{
    const struct orb_group *g = *gp;
    while (g != NULL && index >= g->first_index + g->n)
        g = g->next;
    *gp = g;
    return g != NULL ? (struct orb_req *)&g->reqs[index - g->first_index] : NULL;
}

static int req_succeeded(const struct orb_req *r)
{
    return r->remaining == 0 && r->status == 0 && r->withdrawn == 0;
}

/* Move the completed-prefix cursor over requests that ended successfully (lock held). Each
 * request is passed once, so completions cost O(1) amortised. */
static void advance_prefix(struct orb_batch *b)
{
    const struct orb_group *g = b->prefix_group != NULL ? b->prefix_group : b->groups;
    while (b->prefix_reqs < b->n_reqs) {
        const struct orb_req *r = req_at(b->prefix_reqs, &g);
        if (r == NULL || !req_succeeded(r))
            break;
        b->prefix_reqs++;
        b->prefix_bytes += r->length;
    }
    b->prefix_group = g;
}

/* Once a sealed batch has nothing live, its latency goes to the metrics, once (lock held). */
static void count_latency_locked(struct orb_batch *b)
{
    if (b->sealed && !b->latency_counted && b->first_submit_ns != 0 && atomic_load(&b->live) == 0) {
        b->latency_counted = 1;
        orb_metrics_batch(&b->engine->metrics, orb_now_ns() - b->first_submit_ns);
    }
}

static void batch_live_drop(struct orb_batch *b)
{
    /* Called with b->lock held; waiters only care about the batch settling. */
    if (atomic_fetch_sub(&b->live, 1) == 1) {
        count_latency_locked(b);
        if (b->waiters > 0)
            pthread_cond_broadcast(&b->cond);
    }
}

void orb_xfer_done(struct orb_xfer *x, int status, enum orb_remote_effect effect)
{
    orb_xfer_done_why(x, status, effect, NULL);
}

void orb_xfer_done_why(struct orb_xfer *x, int status, enum orb_remote_effect effect, const char *why)
{
    struct orb_piece *s = slice_of(x);
    struct orb_batch *b = x->batch;
    struct orb_reg *unpin = NULL;

    /* A staged READ's bytes are still in its chunk: they reach the device before it ends. */
    if (x->stage != NULL && orb_stager_piece_ended(b->engine->stager, &s->stage_job, status))
        return;

    pthread_mutex_lock(&b->lock);
    if (x->op == ORB_XFER_NOTIFY) {
        b->notify_state = status == 0 ? ORB_NOTIFY_DELIVERED : ORB_NOTIFY_FAILED;
        b->notify_status = status;
    } else {
        struct orb_req *r = s->req;
        bool started = atomic_load_explicit(&s->started, memory_order_acquire) != 0;
        bool withdrawn = atomic_load_explicit(&s->withdrawn, memory_order_acquire) != 0;
        if (withdrawn && !started) {
            r->withdrawn++;
        } else {
            if (started) {
                r->started++;
                if (x->request_index >= b->started_end)
                    b->started_end = (size_t)x->request_index + 1;
            }
            if (status != 0 && r->status == 0)
                r->status = status;
            if (status != 0 && why != NULL && why[0] != '\0' && x->request_index < b->why_index) {
                b->why_index = x->request_index;
                snprintf(b->fail_why, sizeof b->fail_why, "%s", why);
            }
            if (r->op == ORB_OP_WRITE && started &&
                (status == 0 || effect == ORB_REMOTE_EFFECT_UNKNOWN))
                r->effect_unknown = 1;
        }
        if (--r->remaining == 0) {
            orb_metrics_requested(&b->engine->metrics, r->tp_slot, r->op, r->length,
                                  r->status != 0 ? r->status : r->withdrawn != 0 ? 1 : 0);
            unpin = r->local_pin;
            r->local_pin = NULL;
            /* Before the request's end can be seen: its bytes are free for the next one then. */
            if (r->local_loan != NULL)
                orb_reg_loan_end(unpin, r->local_loan);
            r->local_loan = NULL;
            if (r->status != 0 && x->request_index < b->first_failed) {
                b->first_failed = x->request_index;
                atomic_store(&b->withdraw_above, x->request_index);
            }
            if (x->request_index == b->prefix_reqs)
                advance_prefix(b);
        }
        b->slices_live--;
    }
    batch_live_drop(b);
    int park = b->orphaned && atomic_load(&b->live) == 0;
    orb_engine *engine = b->engine;
    pthread_mutex_unlock(&b->lock);

    orb_registry_release(unpin);
    if (park)
        orb_engine_defer_free(engine, b);
}

/* ---- life cycle -------------------------------------------------------------------------- */

static int batch_new(orb_engine *engine, orb_segment *segment, struct orb_batch **out)
{
    if (!atomic_load(&engine->requester_open))
        return orb_fail(ORB_ECLOSED, "the requester side of this engine is closed");
    if (segment->engine != engine)
        return orb_fail(ORB_EINVAL, "the segment belongs to another engine");
    unsigned live = atomic_fetch_add(&engine->live_batches, 1);
    if (live >= engine->cfg.max_batches) {
        atomic_fetch_sub(&engine->live_batches, 1);
        return orb_fail(ORB_ERESOURCE, "too many live batches (max_batches=%u)",
                        engine->cfg.max_batches);
    }
    int rc;
    struct orb_batch *b = calloc(1, sizeof *b);
    if (b == NULL) {
        rc = orb_fail(ORB_ENOMEM, "cannot allocate a batch");
        goto uncount;
    }
    b->deadline_ns = ORB_DEADLINE_NONE;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    int cond_rc = pthread_cond_init(&b->cond, &attr);
    pthread_condattr_destroy(&attr);
    if (cond_rc != 0) {
        rc = orb_fail(ORB_ENOMEM, "cannot initialise a batch condition variable");
        goto free_batch;
    }
    if (pthread_mutex_init(&b->lock, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "cannot initialise a batch lock");
        goto destroy_cond;
    }
    b->engine = engine;
    b->segment = segment;
    b->first_failed = SIZE_MAX;
    b->why_index = SIZE_MAX;
    atomic_init(&b->withdraw_above, SIZE_MAX);
    atomic_init(&b->withdraw_all, 0);
    atomic_init(&b->attempted_end, 0);
    atomic_init(&b->live, 0);
    b->notify_state = ORB_NOTIFY_NONE;
    orb_engine_ref(engine);
    orb_segment_ref(segment);
    *out = b;
    return 0;

destroy_cond:
    pthread_cond_destroy(&b->cond);
free_batch:
    free(b);
uncount:
    atomic_fetch_sub(&engine->live_batches, 1);
    return rc;
}

void orb_batch_destroy(struct orb_batch *b)
{
    orb_engine *engine = b->engine;
    struct orb_group *g = b->groups;
    while (g != NULL) {
        struct orb_group *next = g->next;
        group_free(g);
        g = next;
    }
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->cond);
    orb_segment_unref(b->segment);
    free(b);
    atomic_fetch_sub(&engine->live_batches, 1);
    orb_engine_unref(engine);
}

struct orb_batch *orb_batch_reap_next(struct orb_batch *b)
{
    return b->reap_next;
}

void orb_batch_set_reap_next(struct orb_batch *b, struct orb_batch *next)
{
    b->reap_next = next;
}

ORB_EXPORT int orb_batch_open(orb_engine *engine, orb_segment *segment, orb_batch **out)
{
    if (engine == NULL || segment == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_batch_open: NULL argument");
    orb_engine_reap(engine);
    return batch_new(engine, segment, out);
}

ORB_EXPORT int orb_batch_free(orb_batch *b)
{
    if (b == NULL)
        return 0;
    pthread_mutex_lock(&b->lock);
    uint64_t live = atomic_load(&b->live);
    pthread_mutex_unlock(&b->lock);
    if (live > 0)
        return orb_fail(ORB_EBUSY, "orb_batch_free: %llu transfers of this batch are still live",
                        (unsigned long long)live);
    orb_engine *engine = b->engine;
    orb_batch_destroy(b);
    orb_engine_reap(engine);
    return 0;
}

/* ---- submission -------------------------------------------------------------------------- */

static int check_request(const struct orb_segment *seg, const struct orb_request *r, size_t index,
                         unsigned *slot_out)
{
    if (r->comp_mask != 0)
        return orb_fail(ORB_EINVAL, "request %zu: comp_mask 0x%x names optional fields this "
                        "library does not know", index, (unsigned)r->comp_mask);
    for (size_t k = 0; k < sizeof r->reserved / sizeof r->reserved[0]; k++)
        if (r->reserved[k] != 0)
            return orb_fail(ORB_EINVAL, "request %zu: reserved[%zu] is not zero", index, k);
    int rc = orb_segment_pick(seg, r->transport, slot_out);
    if (rc != 0)
        return orb_fail_wrap(rc, "request %zu", index);
    if (r->op != ORB_OP_READ && r->op != ORB_OP_WRITE)
        return orb_fail(ORB_EINVAL, "request %zu: unknown op %d", index, (int)r->op);
    if (r->priority != ORB_PRIORITY_HIGH && r->priority != ORB_PRIORITY_MEDIUM &&
        r->priority != ORB_PRIORITY_LOW)
        return orb_fail(ORB_EINVAL, "request %zu: unknown priority %d", index, (int)r->priority);
    if (r->length == 0)
        return orb_fail(ORB_EINVAL, "request %zu: length is zero", index);
    if (r->local_addr > UINT64_MAX - r->length || r->remote_addr > UINT64_MAX - r->length)
        return orb_fail(ORB_EINVAL, "request %zu: address + length overflows", index);
    return 0;
}

static void release_group_pins(struct orb_group *g, size_t upto)
{
    for (size_t i = 0; i < upto; i++) {
        if (g->reqs[i].local_loan != NULL)
            orb_reg_loan_end(g->reqs[i].local_pin, g->reqs[i].local_loan);
        orb_registry_release(g->reqs[i].local_pin);
    }
}

/* A plan must cover [0, length) back to back with non-empty pieces: then the pieces the core
 * allocates from its count are exactly the ones it fills. */
static int plan_check(const struct orb_plan *p, uint64_t length, const char *tp_name, size_t index)
{
    if (p->count == 0 || p->count > ORB_PLAN_MAX_PIECES || p->pieces == NULL)
        return orb_fail(ORB_EINVAL, "request %zu: the %s transport planned %u pieces", index,
                        tp_name, (unsigned)p->count);
    uint64_t next = 0;
    for (uint32_t k = 0; k < p->count; k++) {
        const struct orb_plan_piece *q = &p->pieces[k];
        if (q->offset != next || q->length == 0 || q->length > length - next)
            return orb_fail(ORB_EINVAL, "request %zu: the %s transport planned piece %u at "
                            "[%llu, +%llu), not back to back inside %llu bytes", index, tp_name,
                            (unsigned)k, (unsigned long long)q->offset,
                            (unsigned long long)q->length, (unsigned long long)length);
        next += q->length;
    }
    if (next != length)
        return orb_fail(ORB_EINVAL, "request %zu: the %s transport planned %llu of %llu bytes",
                        index, tp_name, (unsigned long long)next, (unsigned long long)length);
    return 0;
}

static void plan_release(struct orb_plan *p)
{
    if (p->pieces != NULL && p->pieces != p->inline_pieces)
        free(p->pieces);
    p->pieces = NULL;
    p->count = 0;
}

/* Bytes of per-request space a transport gets, rounded so that every request's space is
 * aligned for any type. */
static size_t private_stride(const struct orb_transport_ops *ops)
{
    size_t a = _Alignof(max_align_t);
    return (ops->request_private_size + a - 1) / a * a;
}

static int build_group(struct orb_batch *b, const struct orb_request *reqs, size_t n,
                       size_t first_index, struct orb_group **out, size_t *bad_index)
{
    orb_engine *engine = b->engine;
    struct orb_segment *seg = b->segment;
    struct orb_group *g = calloc(1, sizeof *g + n * sizeof g->reqs[0]);
    struct orb_plan *plans = calloc(n, sizeof *plans);
    if (g == NULL || plans == NULL) {
        free(g);
        free(plans);
        return orb_fail(ORB_ENOMEM, "cannot allocate %zu requests", n);
    }
    g->first_index = first_index;
    g->n = n;

    int rc;
    size_t pinned = 0;
    size_t private_total = 0;
    for (size_t i = 0; i < n; i++) {
        const struct orb_request *r = &reqs[i];
        *bad_index = first_index + i;
        unsigned slot;
        rc = check_request(seg, r, first_index + i, &slot);
        if (rc != 0)
            goto unpin;
        rc = orb_registry_acquire(engine->registry, r->local_addr, r->length, ORB_PERM_LOCAL,
                                  &g->reqs[i].local_pin);
        if (rc != 0) {
            rc = orb_fail_wrap(rc, "request %zu: local range [0x%llx, +%llu)", first_index + i,
                               (unsigned long long)r->local_addr, (unsigned long long)r->length);
            goto unpin;
        }
        pinned++;
        /* A producer's recorded GPU work on the bytes ends before anything touches them. */
        rc = orb_reg_ready(g->reqs[i].local_pin);
        if (rc != 0) {
            rc = orb_fail_wrap(rc, "request %zu: local range [0x%llx, +%llu)", first_index + i,
                               (unsigned long long)r->local_addr, (unsigned long long)r->length);
            goto unpin;
        }
        /* Device bytes are lent to one request at a time where it writes them. */
        rc = orb_reg_loan(g->reqs[i].local_pin, r->local_addr, r->length, r->op == ORB_OP_READ,
                          &g->reqs[i].local_loan);
        if (rc != 0) {
            rc = orb_fail_wrap(rc, "request %zu: local range [0x%llx, +%llu)", first_index + i,
                               (unsigned long long)r->local_addr, (unsigned long long)r->length);
            goto unpin;
        }
        /* Memory without a CPU view (device memory): a transport that moves bytes through the
         * CPU gets it through host staging; the best transport for it is then one that does. */
        const struct orb_memkind_ops *kind = g->reqs[i].local_pin->kind;
        bool no_cpu_view = kind->to_host != NULL;
        if (no_cpu_view && r->transport == ORB_TRANSPORT_UNSPEC && !engine->tp[slot].ops->stages_through_cpu &&
            !engine->tp[slot].ops->moves_device_memory && seg->peer[ORB_TRANSPORT_TCP] != NULL)
            slot = ORB_TRANSPORT_TCP;
        if (r->transport == ORB_TRANSPORT_UNSPEC)
            slot = orb_segment_prefer(seg, slot, g->reqs[i].local_pin, (uint8_t)r->op, r->remote_addr, r->length,
                                      b->deadline_ns);
        g->reqs[i].staged = no_cpu_view && engine->tp[slot].ops->stages_through_cpu;
        g->reqs[i].tp_slot = (uint8_t)slot;
        g->reqs[i].length = r->length;
        g->reqs[i].op = (uint8_t)r->op;
        atomic_init(&g->reqs[i].attempted, 0);
        private_total += private_stride(engine->tp[slot].ops);
    }
    if (private_total > 0) {
        g->private_block = calloc(1, private_total);
        if (g->private_block == NULL) {
            rc = orb_fail(ORB_ENOMEM, "cannot allocate %zu bytes of transport state", private_total);
            goto unpin;
        }
    }

    /* Each request is planned once, by its transport; the pieces come from that one answer. */
    size_t nslices = 0;
    size_t private_off = 0;
    for (size_t i = 0; i < n; i++) {
        const struct orb_request *r = &reqs[i];
        struct orb_req *q = &g->reqs[i];
        const struct orb_transport_ops *ops = engine->tp[q->tp_slot].ops;
        size_t stride = private_stride(ops);
        q->tp_private = stride > 0 ? (char *)g->private_block + private_off : NULL;
        private_off += stride;
        *bad_index = first_index + i;
        struct orb_plan_input in = {
            .op = (uint8_t)r->op,
            .priority = (uint8_t)r->priority,
            .mem_kind = (uint8_t)q->local_pin->kind->kind,
            .length = r->length,
            .remote_addr = r->remote_addr,
            .local_reg = q->local_pin,
            .local_offset = r->local_addr - q->local_pin->base,
            .request_private = q->tp_private,
        };
        rc = ops->peer_plan(seg->peer[q->tp_slot], &in, &plans[i]);
        if (rc != 0) {
            rc = orb_fail_wrap(rc, "request %zu: the %s transport cannot plan it",
                               first_index + i, ops->name);
            goto free_plans;
        }
        rc = plan_check(&plans[i], r->length, ops->name, first_index + i);
        if (rc != 0)
            goto free_plans;
        for (uint32_t p = 0; q->staged && p < plans[i].count; p++)
            if (plans[i].pieces[p].length > ORB_STAGE_CHUNK) {
                rc = orb_fail(ORB_EINVAL, "request %zu: the %s transport planned a staged piece of %llu bytes "
                              "(at most %u)", first_index + i, ops->name,
                              (unsigned long long)plans[i].pieces[p].length, ORB_STAGE_CHUNK);
                goto free_plans;
            }
        q->remaining = plans[i].count;
        nslices += plans[i].count;
    }

    g->slices = calloc(nslices, sizeof *g->slices);
    g->xfer_ptrs = calloc(nslices, sizeof *g->xfer_ptrs);
    if (g->slices == NULL || g->xfer_ptrs == NULL) {
        rc = orb_fail(ORB_ENOMEM, "cannot allocate %zu slices", nslices);
        goto free_plans;
    }
    g->nslices = nslices;
    /* Ordered by transport so that each transport gets one contiguous submission; within a
     * transport, requests keep their order. */
    size_t k = 0;
    for (unsigned slot = 0; slot < ORB_TRANSPORT_SLOTS; slot++) {
        for (size_t i = 0; i < n; i++) {
            struct orb_req *q = &g->reqs[i];
            if (q->tp_slot != slot)
                continue;
            const struct orb_request *r = &reqs[i];
            uint64_t local_offset = r->local_addr - q->local_pin->base;
            for (uint32_t p = 0; p < plans[i].count; p++) {
                const struct orb_plan_piece *piece = &plans[i].pieces[p];
                struct orb_piece *s = &g->slices[k];
                s->req = q;
                s->x.batch = b;
                s->x.request_index = (uint32_t)(first_index + i);
                s->x.op = (uint8_t)r->op;
                s->x.priority = (uint8_t)r->priority;
                s->x.deadline_ns = b->deadline_ns;
                s->x.mem_kind = (uint8_t)q->local_pin->kind->kind;
                s->x.rail = piece->rail;
                s->x.piece_index = p;
                s->x.local_reg = q->local_pin;
                s->x.local_offset = local_offset + piece->offset;
                s->x.remote_addr = r->remote_addr + piece->offset;
                s->x.length = piece->length;
                s->x.request_remote_addr = r->remote_addr;
                s->x.request_length = r->length;
                s->x.request_private = q->tp_private;
                s->stage_job.x = &s->x;
                s->stage_job.ops = engine->tp[slot].ops;
                s->stage_job.peer = seg->peer[slot];
                g->xfer_ptrs[k] = &s->x;
                k++;
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        plan_release(&plans[i]);
    free(plans);
    *out = g;
    return 0;

free_plans:
    for (size_t i = 0; i < n; i++)
        plan_release(&plans[i]);
unpin:
    free(plans);
    release_group_pins(g, pinned);
    group_free(g);
    return rc;
}

/* The failure status, if the batch already failed (lock held). */
static int batch_failed_status(struct orb_batch *b)
{
    if (b->first_failed == SIZE_MAX)
        return 0;
    const struct orb_group *g = b->groups;
    const struct orb_req *r = req_at(b->first_failed, &g);
    return r != NULL ? r->status : 0;
}

/* Take back the group just appended, of which the transport accepted nothing: a group rejected
 * at submission adds nothing to the batch. Only the submitting thread touches the group list
 * outside the lock, and no completion can name this group's slices. */
static void withdraw_group(struct orb_batch *b, struct orb_group *g)
{
    pthread_mutex_lock(&b->lock);
    struct orb_group *prev = NULL;
    for (struct orb_group *it = b->groups; it != g; it = it->next)
        prev = it;
    if (prev != NULL)
        prev->next = NULL;
    else
        b->groups = NULL;
    b->groups_tail = prev;
    if (b->prefix_group == g)
        b->prefix_group = prev;
    b->n_reqs -= g->n;
    b->slices_live -= g->nslices;
    atomic_fetch_sub(&b->live, g->nslices);
    pthread_mutex_unlock(&b->lock);
    release_group_pins(g, g->n);
    group_free(g);
}

ORB_EXPORT int orb_batch_submit(orb_batch *b, const struct orb_request *reqs, size_t n)
{
    if (b == NULL || reqs == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "orb_batch_submit: batch and at least one request required");
    orb_engine *engine = b->engine;
    pthread_mutex_lock(&b->lock);
    int sealed = b->sealed;
    int failed = batch_failed_status(b);
    size_t first_index = b->n_reqs;
    pthread_mutex_unlock(&b->lock);
    /* A refusal of the group as a whole names all of it (orb_submit_and_wait's report). */
    b->rejected_index = first_index;
    b->rejected_count = n;
    if (!atomic_load(&engine->requester_open))
        return orb_fail(ORB_ECLOSED, "orb_batch_submit: the requester side is closed");
    if (sealed)
        return orb_fail(ORB_EBUSY, "orb_batch_submit: the batch is sealed");
    if (failed != 0)
        return orb_fail(failed, "orb_batch_submit: the batch already failed (%s)",
                        orb_strerror(failed));
    if (n > engine->cfg.max_batch_requests || first_index > engine->cfg.max_batch_requests - n)
        return orb_fail(ORB_ERESOURCE, "batch would hold %zu requests (max_batch_requests=%u)",
                        first_index + n, engine->cfg.max_batch_requests);

    struct orb_group *g = NULL;
    b->rejected_count = 1;
    int rc = build_group(b, reqs, n, first_index, &g, &b->rejected_index);
    if (rc != 0)
        return rc;

    pthread_mutex_lock(&b->lock);
    if (b->groups_tail != NULL)
        b->groups_tail->next = g;
    else
        b->groups = g;
    b->groups_tail = g;
    if (b->n_reqs == 0)
        b->first_submit_ns = orb_now_ns();
    b->n_reqs += n;
    b->slices_live += g->nslices;
    atomic_fetch_add(&b->live, g->nslices);
    pthread_mutex_unlock(&b->lock);

    /* One submission per transport. Once one accepted, the group is in the batch: a later
     * transport's refusal fails its pieces (never started) in the report instead. */
    struct orb_segment *seg = b->segment;
    size_t start = 0;
    while (start < g->nslices) {
        const struct orb_req *first = slice_of(g->xfer_ptrs[start])->req;
        unsigned slot = first->tp_slot;
        size_t end = start + 1;
        while (end < g->nslices && slice_of(g->xfer_ptrs[end])->req->tp_slot == slot &&
               slice_of(g->xfer_ptrs[end])->req->staged == first->staged)
            end++;
        const struct orb_transport_ops *ops = engine->tp[slot].ops;
        if (first->staged)
            rc = submit_staged(engine, &g->xfer_ptrs[start], end - start);
        else
            rc = ops->peer_submit(seg->peer[slot], &g->xfer_ptrs[start], end - start);
        if (rc != 0 && start == 0) {
            /* Nothing was accepted, so nothing was attempted: the whole group is rejected. */
            rc = orb_segment_classify_failure(seg, rc);
            char why[256];
            snprintf(why, sizeof why, "%s", orb_last_error());
            withdraw_group(b, g);
            b->rejected_index = first_index;
            b->rejected_count = n;
            return orb_fail(rc, "orb_batch_submit: %s", why);
        }
        if (rc != 0) {
            ORB_LOGW("batch: the %s transport refused %zu pieces (%s); they fail unattempted",
                     ops->name, end - start, orb_last_error());
            for (size_t j = start; j < end; j++)
                orb_xfer_done(g->xfer_ptrs[j], rc, ORB_REMOTE_EFFECT_NONE);
        }
        start = end;
    }
    return 0;
}

/* Hand staged pieces to the engine's stager, made on first use. 0 (each piece is then
 * reported through orb_xfer_done, whatever happens to it), or why the stager cannot start. */
static int submit_staged(orb_engine *engine, struct orb_xfer *const *xs, size_t n)
{
    struct orb_stager *st = orb_engine_stager(engine);
    if (st == NULL)
        return orb_fail_wrap(ORB_EUNAVAILABLE, "host staging for memory without a CPU view");
    struct orb_stage_job *jobs[64];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 64 ? n - done : 64;
        for (size_t i = 0; i < k; i++)
            jobs[i] = &slice_of(xs[done + i])->stage_job;
        orb_stager_submit(st, jobs, k);
        done += k;
    }
    return 0;
}

/* ---- notification ------------------------------------------------------------------------ */

static int copy_notification(struct orb_batch *b, const struct orb_notification *notify)
{
    if (notify == NULL) {
        b->notify_state = ORB_NOTIFY_NONE;
        return 0;
    }
    if (notify->data == NULL)
        return orb_fail(ORB_EINVAL, "the notification's data is NULL");
    if (notify->length == 0 || notify->length > ORB_NOTIFY_MAX)
        return orb_fail(ORB_EINVAL, "a notification holds 1..%d bytes, not %zu", ORB_NOTIFY_MAX, notify->length);
    memcpy(b->notify_data, notify->data, notify->length);
    b->notify_len = notify->length;
    b->notify_state = ORB_NOTIFY_PENDING;
    return 0;
}

/* Send the notification once the data is in place. Runs only on user threads (never in a
 * transport callback), so it may call into the transport. */
static void maybe_send_notification(struct orb_batch *b)
{
    pthread_mutex_lock(&b->lock);
    int ready = b->sealed && b->notify_state == ORB_NOTIFY_PENDING && !b->notify_sent &&
                b->slices_live == 0;
    if (ready) {
        /* Every request ended; they all succeeded exactly when the prefix covers them. */
        int clean = b->first_failed == SIZE_MAX && !b->timed_out && b->prefix_reqs == b->n_reqs;
        if (!clean) {
            b->notify_state = ORB_NOTIFY_SKIPPED;
            ready = 0;
        } else {
            b->notify_sent = 1;
            atomic_fetch_add(&b->live, 1);
        }
    }
    pthread_mutex_unlock(&b->lock);
    if (!ready)
        return;

    struct orb_piece *s = &b->notify_slice;
    memset(s, 0, sizeof *s);
    s->x.batch = b;
    s->x.op = ORB_XFER_NOTIFY;
    s->x.mem_kind = ORB_MEM_HOST;
    s->x.notify_data = b->notify_data;
    s->x.length = b->notify_len;
    struct orb_xfer *xp = &s->x;
    /* Notifications travel on the control connection. */
    struct orb_segment *seg = b->segment;
    const struct orb_tp_slot *tcp = &b->engine->tp[ORB_TRANSPORT_TCP];
    int rc = tcp->ops->peer_submit(seg->peer[ORB_TRANSPORT_TCP], &xp, 1);
    if (rc != 0)
        orb_xfer_done(&s->x, rc, ORB_REMOTE_EFFECT_NONE);
}

ORB_EXPORT int orb_batch_seal(orb_batch *b, const struct orb_notification *notify_or_null)
{
    if (b == NULL)
        return orb_fail(ORB_EINVAL, "orb_batch_seal: NULL batch");
    pthread_mutex_lock(&b->lock);
    int rc = 0;
    if (b->sealed)
        rc = orb_fail(ORB_EBUSY, "orb_batch_seal: already sealed");
    else if ((rc = copy_notification(b, notify_or_null)) == 0)
        b->sealed = 1;
    if (rc == 0)
        count_latency_locked(b); /* everything may have ended already */
    pthread_mutex_unlock(&b->lock);
    if (rc == 0)
        maybe_send_notification(b);
    return rc;
}

/* ---- reports ----------------------------------------------------------------------------- */

/* Fill `rep` (lock held) and return the batch's status for it (ORB_EAGAIN while running). Costs
 * O(1) without a failure and O(span) with one; never a walk over every request. */
static int fill_report(struct orb_batch *b, struct orb_batch_report *rep)
{
    memset(rep, 0, sizeof *rep);
    rep->submitted_requests = b->n_reqs;
    rep->local_drained = b->slices_live == 0;
    rep->completed_requests = b->prefix_reqs;
    rep->completed_bytes = b->prefix_bytes;

    int failed = b->first_failed != SIZE_MAX;
    if (failed || (b->timed_out && b->prefix_reqs < b->n_reqs)) {
        /* Without a deadline the first request that did not succeed is the first failed one
         * (nothing before it is withdrawn); after one it may be a request the deadline withdrew
         * or left running. */
        size_t f = b->timed_out ? b->prefix_reqs : b->first_failed;
        /* Settled, the started slices are exact; while slices are live, count every request
         * that may have started (attempted_end over-approximates, never under). */
        size_t end = b->slices_live == 0 ? b->started_end : atomic_load(&b->attempted_end);
        size_t last = end > f + 1 ? end - 1 : f;
        if (last >= b->n_reqs)
            last = b->n_reqs - 1;
        const struct orb_group *g = b->prefix_group != NULL ? b->prefix_group : b->groups;
        const struct orb_req *fr = req_at(f, &g);
        int unknown = 0;
        for (size_t j = f; j <= last && !unknown; j++) {
            const struct orb_req *r = req_at(j, &g);
            unknown = r->op == ORB_OP_WRITE &&
                      (r->effect_unknown || (r->remaining > 0 && atomic_load(&r->attempted)));
        }
        rep->has_failure = 1;
        rep->failure.request_index = f;
        rep->failure.status = fr->status != 0 ? fr->status : ORB_ETIMEDOUT;
        rep->failure.affected_requests = last - f + 1;
        rep->failure.remote_effect = unknown ? ORB_REMOTE_EFFECT_UNKNOWN : ORB_REMOTE_EFFECT_NONE;
    }

    rep->notification = b->notify_state;
    rep->notification_status = b->notify_status;
    int running = !b->sealed || atomic_load(&b->live) > 0 ||
                  (b->notify_state == ORB_NOTIFY_PENDING && !b->timed_out);
    if (b->timed_out && b->notify_state == ORB_NOTIFY_PENDING && b->slices_live == 0)
        rep->notification = ORB_NOTIFY_SKIPPED;
    rep->done = !running;
    if (rep->has_failure)
        rep->status = rep->failure.status;
    else if (rep->notification == ORB_NOTIFY_FAILED)
        rep->status = rep->notification_status;
    if (!rep->done)
        return b->timed_out ? ORB_ETIMEDOUT : ORB_EAGAIN;
    return rep->status;
}

/* The transport's cause of the report's first failure, or "" (lock held). */
static void failure_why(const struct orb_batch *b, const struct orb_batch_report *rep, char *out, size_t cap)
{
    out[0] = '\0';
    if (rep->has_failure && b->why_index == rep->failure.request_index)
        snprintf(out, cap, "%s", b->fail_why);
}

/* The report's message; `why` is the batch's fail_why when it belongs to the first failure. */
static void report_failure_message(int status, const struct orb_batch_report *rep, const char *why)
{
    if (status == 0)
        return;
    if (status == ORB_EAGAIN)
        orb_fail(status, "the batch has not ended yet: it runs, or it is not sealed");
    else if (rep->has_failure)
        orb_fail(status, "request %zu failed (%s%s%s); %zu request(s) from there were attempted or "
                 "share the failure, remote effect %s",
                 rep->failure.request_index, orb_strerror(rep->failure.status), why[0] != '\0' ? ": " : "", why,
                 rep->failure.affected_requests,
                 rep->failure.remote_effect == ORB_REMOTE_EFFECT_UNKNOWN ? "unknown" : "none");
    else if (status == ORB_ETIMEDOUT)
        orb_fail(status, "the batch is still running at the deadline");
    else
        orb_fail(status, "the notification failed (%s)", orb_strerror(status));
}

ORB_EXPORT int orb_batch_poll(orb_batch *b, struct orb_batch_report *report)
{
    if (b == NULL || report == NULL)
        return orb_fail(ORB_EINVAL, "orb_batch_poll: NULL argument");
    if (atomic_load_explicit(&b->live, memory_order_acquire) == 0)
        maybe_send_notification(b);
    pthread_mutex_lock(&b->lock);
    int rc = fill_report(b, report);
    char why[256];
    failure_why(b, report, why, sizeof why);
    pthread_mutex_unlock(&b->lock);
    report_failure_message(rc, report, why);
    return rc;
}

/* 1 once nothing of the batch is live and no notification is waiting to be sent (lock held). */
static int batch_settled(const struct orb_batch *b)
{
    return atomic_load(&b->live) == 0 &&
           !(b->notify_state == ORB_NOTIFY_PENDING && !b->notify_sent && b->slices_live == 0 &&
             b->sealed);
}

/* Wait until nothing is live or the deadline passes; returns 0 or ORB_ETIMEDOUT. While the
 * engine may spin (its threads fit the CPUs), the caller first spins on the live counter for up
 * to busy_poll_us, without the lock and without yielding, so that a completion arriving within
 * that time costs no wake-up; then it sleeps on the condition variable. */
/* Poll the completions of the batch's peers that let a caller take them (peer_poll) while the
 * batch is live, for at most busy_poll_us (and not past `deadline`), then hand back to their
 * threads. Each completion that lands meanwhile extends the window: a caller that keeps
 * getting answers keeps polling. */
static void poll_peers(struct orb_batch *b, uint64_t deadline)
{
    struct orb_segment *seg = b->segment;
    const struct orb_engine *e = b->engine;
    if (seg == NULL || !e->poll_allowed)
        return;
    unsigned ids[ORB_TRANSPORT_SLOTS], n = 0;
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++)
        if (seg->peer[i] != NULL && e->tp[i].ops != NULL && e->tp[i].ops->peer_poll != NULL)
            ids[n++] = i;
    if (n == 0)
        return;
    uint64_t window = (uint64_t)e->cfg.busy_poll_us * 1000u;
    for (unsigned k = 0; k < n; k++)
        e->tp[ids[k]].ops->peer_poll(seg->peer[ids[k]], ORB_POLL_BEGIN);
    uint64_t live = atomic_load_explicit(&b->live, memory_order_acquire);
    uint64_t end = orb_now_ns() + window;
    int step = ORB_POLL_END;
    for (unsigned spins = 1; live > 0; spins++) {
        int busy = 0;
        for (unsigned k = 0; k < n; k++)
            busy |= e->tp[ids[k]].ops->peer_poll(seg->peer[ids[k]], ORB_POLL_STEP);
        uint64_t now_live = atomic_load_explicit(&b->live, memory_order_acquire);
        if (!busy || now_live == 0)
            break;
        if (now_live != live) { /* progress: keep going */
            live = now_live;
            end = orb_now_ns() + window;
        }
        orb_cpu_relax();
        if ((spins & 63) == 0) {
            uint64_t now = orb_now_ns();
            if (now >= end || now >= deadline) {
                step = ORB_POLL_HANDOFF; /* the caller goes on waiting without polling */
                break;
            }
        }
    }
    for (unsigned k = 0; k < n; k++)
        e->tp[ids[k]].ops->peer_poll(seg->peer[ids[k]], step);
}

static int wait_settled(struct orb_batch *b, uint64_t deadline)
{
    poll_peers(b, deadline);
    uint64_t spin_ns = b->engine->spin_allowed ? (uint64_t)b->engine->cfg.busy_poll_us * 1000u : 0;
    uint64_t spin_end = spin_ns ? orb_now_ns() + spin_ns : 0;
    if (spin_end > deadline)
        spin_end = deadline;
    for (;;) {
        if (atomic_load_explicit(&b->live, memory_order_acquire) == 0) {
            maybe_send_notification(b);
            pthread_mutex_lock(&b->lock);
            int settled = batch_settled(b);
            pthread_mutex_unlock(&b->lock);
            if (settled)
                return 0;
            continue;
        }
        if (spin_end != 0) {
            for (unsigned k = 1; atomic_load_explicit(&b->live, memory_order_acquire) > 0; k++) {
                orb_cpu_relax();
                if ((k & 63) == 0 && orb_now_ns() >= spin_end) {
                    spin_end = 0;
                    break;
                }
            }
            continue;
        }
        if (orb_now_ns() >= deadline)
            return ORB_ETIMEDOUT;
        pthread_mutex_lock(&b->lock);
        if (atomic_load(&b->live) > 0) {
            b->waiters++;
            if (deadline == ORB_DEADLINE_NONE) {
                pthread_cond_wait(&b->cond, &b->lock);
            } else {
                struct timespec ts = orb_deadline_timespec(deadline);
                pthread_cond_timedwait(&b->cond, &b->lock, &ts);
            }
            b->waiters--;
        }
        pthread_mutex_unlock(&b->lock);
    }
}

ORB_EXPORT int orb_batch_wait(orb_batch *b, uint64_t timeout_ns, struct orb_batch_report *report)
{
    if (b == NULL || report == NULL)
        return orb_fail(ORB_EINVAL, "orb_batch_wait: NULL argument");
    pthread_mutex_lock(&b->lock);
    int sealed = b->sealed;
    pthread_mutex_unlock(&b->lock);
    if (!sealed)
        return orb_fail(ORB_EINVAL, "orb_batch_wait: seal the batch first");
    uint64_t deadline = orb_deadline_after(timeout_ns);
    int waited = wait_settled(b, deadline);
    pthread_mutex_lock(&b->lock);
    int rc = fill_report(b, report);
    char why[256];
    failure_why(b, report, why, sizeof why);
    pthread_mutex_unlock(&b->lock);
    if (waited == ORB_ETIMEDOUT && rc == ORB_EAGAIN)
        rc = ORB_ETIMEDOUT;
    report_failure_message(rc, report, why);
    return rc;
}

/* The report of a batch whose only group was rejected at submission: nothing was accepted or
 * attempted; the failure names the rejected request (or the first of a group the transport
 * refused as a whole). */
static void report_rejected(struct orb_batch_report *report, int rc, size_t index, size_t count,
                            const struct orb_notification *notify_or_null)
{
    memset(report, 0, sizeof *report);
    report->done = 1;
    report->status = rc;
    report->submitted_requests = 0;
    report->has_failure = 1;
    report->failure.request_index = index;
    report->failure.affected_requests = count;
    report->failure.status = rc;
    report->failure.remote_effect = ORB_REMOTE_EFFECT_NONE;
    report->local_drained = 1;
    report->notification = notify_or_null ? ORB_NOTIFY_SKIPPED : ORB_NOTIFY_NONE;
}

ORB_EXPORT int orb_submit_and_wait(orb_engine *engine, orb_segment *segment,
                                   const struct orb_request *reqs, size_t n,
                                   const struct orb_notification *notify_or_null,
                                   uint64_t timeout_ns, struct orb_batch_report *report)
{
    if (engine == NULL || segment == NULL || reqs == NULL || n == 0 || report == NULL)
        return orb_fail(ORB_EINVAL, "orb_submit_and_wait: engine, segment, requests (n >= 1) "
                                    "and report are required");
    uint64_t deadline = orb_deadline_after(timeout_ns);
    orb_engine_reap(engine);
    struct orb_batch *b;
    int rc = batch_new(engine, segment, &b);
    if (rc != 0)
        goto refuse_all;
    pthread_mutex_lock(&b->lock);
    rc = copy_notification(b, notify_or_null);
    b->deadline_ns = deadline; /* its requests' deadline, for transports that order by it */
    pthread_mutex_unlock(&b->lock);
    if (rc != 0) {
        orb_batch_destroy(b);
        goto refuse_all;
    }
    rc = orb_batch_submit(b, reqs, n);
    if (rc != 0) {
        /* The only group was rejected: the batch holds nothing. */
        size_t bad = b->rejected_index, count = b->rejected_count;
        char why[512];
        snprintf(why, sizeof why, "%s", orb_last_error());
        orb_batch_destroy(b);
        orb_fail(rc, "%s", why);
        report_rejected(report, rc, bad, count, notify_or_null);
        return rc;
    }
    pthread_mutex_lock(&b->lock);
    b->sealed = 1;
    count_latency_locked(b); /* everything may have ended already */
    pthread_mutex_unlock(&b->lock);

    int waited = wait_settled(b, deadline);
    pthread_mutex_lock(&b->lock);
    if (waited == ORB_ETIMEDOUT) {
        b->timed_out = 1;
        atomic_store(&b->withdraw_all, 1);
    }
    rc = fill_report(b, report);
    char why[256];
    failure_why(b, report, why, sizeof why);
    if (rc == ORB_EAGAIN)
        rc = ORB_ETIMEDOUT;
    int live = atomic_load(&b->live) > 0;
    if (live)
        b->orphaned = 1; /* the last completion parks it for reaping */
    pthread_mutex_unlock(&b->lock);
    report_failure_message(rc, report, why);
    if (!live)
        orb_batch_destroy(b);
    return rc;

refuse_all:
    /* The call was refused as a whole (no batch, a bad notification): every request with it. */
    report_rejected(report, rc, 0, n, notify_or_null);
    return rc;
}
