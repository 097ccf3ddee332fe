/* The transport's registered staging (see rdma_data.h): for host memory under the Staged policy,
 * and for memory without a CPU view (device memory) always.
 *
 * Host memory: one arena per transport of max_staging_bytes, made on first use: anonymous memory
 * registered on every open NIC (a local MR for this process's own work requests and a MW_BIND
 * parent for the source's windows), cut into per-request extents. Device memory: chunks of the
 * engine's staging pool, which TCP shares (core/stage_pool.h), registered the same way the first
 * time a request stages through them. Their keys never leave the process; peers see only the
 * one-use windows bound to one request's staging. A request that does not fit now waits
 * (bounded) for others to give theirs back. */
#include "rdma/rdma_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/engine.h"
#include "core/log.h"
#include "core/stage_pool.h"
#include "rdma/rdma_transport.h"

#define STAGE_GRANULE 4096u
#define STAGE_WAIT_STEP_NS (50ull * 1000000ull)

int rdma_staging_start(struct orb_rdma_tp *tp)
{
    /* Device memory is always staged; host memory when host_memory says so. The arena is mapped
     * on its first use only. */
    tp->host_staged = tp->cfg->host_memory == ORB_RDMA_HOST_STAGED;
    struct rdma_staging *s = calloc(1, sizeof *s);
    if (s == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for the staging arena");
    uint64_t size = (tp->cfg->max_staging_bytes + STAGE_GRANULE - 1) / STAGE_GRANULE * STAGE_GRANULE;
    int rc = orb_rdma_extents_init(&s->ext, size, STAGE_GRANULE);
    if (rc != 0) {
        free(s);
        return rc;
    }
    struct orb_stage_pool *pool = orb_engine_stage_pool(tp->engine);
    s->nchunks = orb_stage_pool_max_chunks(pool);
    if ((s->chunk_mrs = calloc(s->nchunks, sizeof *s->chunk_mrs)) == NULL) {
        free(s);
        return orb_fail(ORB_ENOMEM, "rdma: out of memory for the staging pool's registrations");
    }
    pthread_mutex_init(&s->lock, NULL);
    (void)orb_cond_init_monotonic(&s->cond);
    tp->staging = s;
    return 0;
}

/* Whether `reg`'s memory is staged through the engine's pool (device memory) or the arena. */
static bool pooled_kind(const struct orb_reg *reg)
{
    return reg->kind->kind == ORB_MEM_CUDA;
}

/* A chunk of the engine's pool, registered on every open NIC (the first time it is used here). */
static int pool_take(struct orb_rdma_tp *tp, const struct orb_reg *reg, uint64_t len, uint64_t deadline, bool source,
                     struct rdma_stage *out)
{
    struct rdma_staging *s = tp->staging;
    struct orb_stage_pool *pool = orb_engine_stage_pool(tp->engine);
    if (len > orb_stage_pool_chunk_bytes(pool))
        return orb_fail(ORB_ERESOURCE, "rdma: %llu bytes of device memory staged at once; the staging pool's chunks "
                        "hold %zu", (unsigned long long)len, orb_stage_pool_chunk_bytes(pool));
    enum orb_stage_taker who = source ? ORB_STAGE_FOR_SOURCE : ORB_STAGE_FOR_REQUESTER;
    uint8_t *c = NULL;
    uint32_t i = 0;
    int rc;
    if (deadline == 0) {
        rc = orb_stage_pool_take(pool, reg, who, NULL, &c, &i);
    } else {
        /* In short waits, so that a stopping transport does not wait out a whole deadline. */
        for (;;) {
            uint64_t now = orb_now_ns(), step = now + STAGE_WAIT_STEP_NS;
            rc = orb_stage_pool_take_wait(pool, reg, who, step < deadline ? step : deadline, &c, &i);
            if (rc != ORB_ETIMEDOUT)
                break;
            if (orb_now_ns() >= deadline) {
                rc = orb_fail_wrap(ORB_ERESOURCE, "rdma: device staging stayed full until io_timeout_s");
                break;
            }
            if (atomic_load(&tp->stopping))
                return orb_fail(ORB_ECLOSED, "rdma: the transport is stopped");
        }
    }
    if (rc != 0)
        return rc;
    pthread_mutex_lock(&s->lock);
    if (s->chunk_mrs[i] == NULL) {
        struct orb_rdma_reg_mrs *m = NULL;
        size_t bytes = orb_stage_pool_chunk_bytes(pool);
        rc = orb_rdma_reg_mrs_create(tp->env.mr_ops, tp->ops_impl, &tp->dev, c, (uint64_t)(uintptr_t)c, bytes, true,
                                     &m);
        if (rc != 0) {
            pthread_mutex_unlock(&s->lock);
            rc = orb_fail_wrap(rc, "rdma: registering a %zu-byte chunk of the staging pool", bytes);
            if (m != NULL) {
                /* A NIC refused to deregister what it had: the chunk stays registered for good. */
                struct orb_reg kept_for = {.kind = reg->kind};
                orb_stage_pool_keep(pool, &kept_for, c);
                return rc;
            }
            orb_stage_pool_put(pool, c);
            return rc;
        }
        s->chunk_mrs[i] = m;
    }
    s->pooled_taken++;
    pthread_mutex_unlock(&s->lock);
    *out = (struct rdma_stage){.cpu = c, .off = 0, .len = len, .pooled = true, .chunk = i, .kind = reg->kind};
    atomic_fetch_add(&tp->staged_transfers, 1);
    return 0;
}

/* Map and register the arena (s->lock held). A failure is remembered: every later take gets it. */
static int arena_make(struct orb_rdma_tp *tp, struct rdma_staging *s)
{
    if (s->made_rc != 0)
        return orb_fail(s->made_rc, "%s", s->made_why);
    if (s->base != NULL)
        return 0;
    int rc;
    void *p = mmap(NULL, s->ext.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        rc = orb_fail(ORB_ENOMEM, "rdma: cannot map %llu bytes of staging (max_staging_bytes): %s",
                      (unsigned long long)s->ext.size, strerror(errno));
        goto remember;
    }
    struct orb_rdma_reg_mrs *m = NULL;
    rc = orb_rdma_reg_mrs_create(tp->env.mr_ops, tp->ops_impl, &tp->dev, p, (uint64_t)(uintptr_t)p, s->ext.size,
                                 true, &m);
    if (rc != 0) {
        rc = orb_fail_wrap(rc, "rdma: registering %llu bytes of staging (max_staging_bytes)",
                           (unsigned long long)s->ext.size);
        if (m != NULL) {
            s->kept = m; /* a NIC refused to deregister: the bytes stay mapped for good */
            goto remember;
        }
        (void)munmap(p, s->ext.size);
        goto remember;
    }
    s->base = p;
    s->mrs = m;
    ORB_LOGI("rdma: %llu bytes of staging registered on %u MR(s)", (unsigned long long)s->ext.size, m->count);
    return 0;

remember:
    s->made_rc = rc;
    snprintf(s->made_why, sizeof s->made_why, "%s", orb_last_error());
    return rc;
}

int rdma_stage_take(struct orb_rdma_tp *tp, const struct orb_reg *reg, uint64_t len, uint64_t deadline, bool source,
                    struct rdma_stage *out)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: this engine has no staging");
    if (atomic_load(&tp->stopping))
        return orb_fail(ORB_ECLOSED, "rdma: the transport is stopped");
    if (pooled_kind(reg))
        return pool_take(tp, reg, len, deadline, source, out);
    pthread_mutex_lock(&s->lock);
    int rc = arena_make(tp, s);
    uint64_t off = 0;
    while (rc == 0) {
        rc = orb_rdma_extents_take(&s->ext, len, &off);
        if (rc != ORB_EAGAIN)
            break;
        if (atomic_load(&tp->stopping)) {
            rc = orb_fail(ORB_ECLOSED, "rdma: the transport is stopped");
            break;
        }
        if (deadline == 0)
            break; /* ORB_EAGAIN: the caller does not wait */
        if (orb_now_ns() >= deadline) {
            rc = orb_fail(ORB_ERESOURCE, "rdma: staging stayed full (%llu of %llu bytes of max_staging_bytes in "
                          "use) for %llu bytes", (unsigned long long)s->ext.in_use,
                          (unsigned long long)s->ext.size, (unsigned long long)len);
            break;
        }
        s->waiters++;
        struct timespec ts = orb_deadline_timespec(deadline);
        (void)pthread_cond_timedwait(&s->cond, &s->lock, &ts);
        s->waiters--;
        rc = 0;
    }
    if (rc == 0) {
        *out = (struct rdma_stage){.cpu = s->base + off, .off = off, .len = len};
        atomic_fetch_add(&tp->staged_transfers, 1);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

void rdma_stage_put(struct orb_rdma_tp *tp, struct rdma_stage *st)
{
    struct rdma_staging *s = tp->staging;
    if (st->cpu == NULL)
        return;
    if (st->pooled) {
        struct orb_stage_pool *pool = orb_engine_stage_pool(tp->engine);
        pthread_mutex_lock(&s->lock);
        s->pooled_taken--;
        pthread_mutex_unlock(&s->lock);
        if (st->held) {
            /* Taken for good (its MRs stay until the transport stops; the bytes stay for good). */
            ORB_LOGE("rdma: a staging chunk is kept: a device copy through it was not proven to end");
            struct orb_reg kept_for = {.kind = st->kind};
            orb_stage_pool_keep(pool, &kept_for, st->cpu);
        } else {
            orb_stage_pool_put(pool, st->cpu);
        }
        *st = (struct rdma_stage){0};
        return;
    }
    if (st->held) {
        /* Taken for good: the arena is kept at destroy, as with any extent still out. */
        ORB_LOGE("rdma: a staging extent of %llu bytes is kept: a device copy through it was not proven to end",
                 (unsigned long long)st->len);
        st->cpu = NULL;
        st->held = false;
        return;
    }
    pthread_mutex_lock(&s->lock);
    orb_rdma_extents_put(&s->ext, st->off, st->len);
    if (s->waiters > 0)
        pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
    st->cpu = NULL;
}

uint32_t rdma_stage_slot_shift(const struct orb_rdma_tp *tp, const struct orb_reg *reg)
{
    /* A quarter of max_staging_bytes, so that several requests' slots are staged at once, as a
     * power of two of at least a page (the whole arena when it is that small); for device memory
     * at most one chunk of the pool (a power of two), which holds the slot. */
    uint64_t size = tp->staging != NULL ? tp->staging->ext.size : STAGE_GRANULE;
    uint64_t want = size / 4 > STAGE_GRANULE ? size / 4 : STAGE_GRANULE;
    if (pooled_kind(reg)) {
        uint64_t chunk = orb_stage_pool_chunk_bytes(orb_engine_stage_pool(tp->engine));
        want = want < chunk ? want : chunk;
    }
    uint32_t shift = ORB_RDMA_SLOT_SHIFT_MIN;
    while (shift < ORB_RDMA_SLOT_SHIFT_MAX && (2ull << shift) <= want)
        shift++;
    return shift;
}

const struct orb_rdma_reg_mr *rdma_stage_mr(const struct orb_rdma_tp *tp, const struct rdma_stage *st, uint32_t nic)
{
    /* Read without the lock: the arena's and a chunk's MRs are written once, before the first
     * extent of them is handed out, and the caller holds one. */
    if (st->pooled)
        return orb_rdma_reg_mrs_on(tp->staging->chunk_mrs[st->chunk], nic);
    return orb_rdma_reg_mrs_on(tp->staging->mrs, nic);
}

uint64_t rdma_staging_in_use(struct orb_rdma_tp *tp)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->ext.in_use + (uint64_t)s->pooled_taken * orb_stage_pool_chunk_bytes(orb_engine_stage_pool(tp->engine));
    pthread_mutex_unlock(&s->lock);
    return n;
}

void rdma_staging_abandon(struct orb_rdma_tp *tp)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return;
    /* The staging itself stays in place: where the stop failed, lanes may still use it. */
    struct orb_stage_pool *pool = orb_engine_stage_pool(tp->engine);
    uint32_t n = 0;
    pthread_mutex_lock(&s->lock); /* the pool's lock is never held when this one is taken */
    for (uint32_t i = 0; i < s->nchunks; i++)
        if (s->chunk_mrs[i] != NULL) {
            orb_stage_pool_retire(pool, i);
            n++;
        }
    pthread_mutex_unlock(&s->lock);
    if (n > 0)
        ORB_LOGE("rdma: %u chunks of the staging pool stay registered with the NICs: they are kept", n);
}

void rdma_staging_destroy(struct orb_rdma_tp *tp)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return;
    if (s->ext.ntaken > 0 || s->pooled_taken > 0) {
        ORB_LOGE("rdma: %u staging extents and %u pool chunks are still in use at destroy: they are kept",
                 s->ext.ntaken, s->pooled_taken);
        rdma_staging_abandon(tp);
        tp->staging = NULL;
        return;
    }
    tp->staging = NULL;
    for (uint32_t i = 0; i < s->nchunks; i++) {
        if (s->chunk_mrs[i] != NULL && orb_rdma_reg_mrs_destroy(tp->env.mr_ops, tp->ops_impl, s->chunk_mrs[i]) != 0) {
            ORB_LOGE("rdma: a NIC refused to deregister a chunk of the staging pool: it is kept, with its MRs");
            orb_stage_pool_retire(orb_engine_stage_pool(tp->engine), i); /* the NIC may still reach it */
        }
    }
    free(s->chunk_mrs);
    if (s->mrs != NULL) {
        if (orb_rdma_reg_mrs_destroy(tp->env.mr_ops, tp->ops_impl, s->mrs) != 0) {
            ORB_LOGE("rdma: a NIC refused to deregister the staging arena: its %llu bytes are kept",
                     (unsigned long long)s->ext.size);
            s->base = NULL; /* the device may still map them */
        }
        s->mrs = NULL;
    }
    if (s->base != NULL)
        (void)munmap(s->base, s->ext.size);
    pthread_cond_destroy(&s->cond);
    pthread_mutex_destroy(&s->lock);
    free(s);
}
