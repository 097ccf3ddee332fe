/* The transport's private registered staging (see rdma_data.h): for host memory under the Staged
 * policy, and for memory without a CPU view (device memory) always.
 *
 * One arena per transport of max_staging_bytes, made on first use: anonymous memory registered on
 * every open NIC (a local MR for this process's own work requests and a MW_BIND parent for the
 * source's windows), cut into per-request extents. Its keys never leave the process; peers see
 * only the one-use windows bound to one request's extent. A request that does not fit now waits
 * (bounded) for others to give theirs back. */
#include "rdma/rdma_data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/clock.h"
#include "core/error.h"
#include "core/log.h"
#include "rdma/rdma_transport.h"

#define STAGE_GRANULE 4096u

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
    pthread_mutex_init(&s->lock, NULL);
    (void)orb_cond_init_monotonic(&s->cond);
    tp->staging = s;
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

int rdma_stage_take(struct orb_rdma_tp *tp, uint64_t len, uint64_t deadline, struct rdma_stage *out)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: this engine has no staging");
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
        out->cpu = s->base + off;
        out->off = off;
        out->len = len;
        out->held = false;
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

uint32_t rdma_stage_slot_shift(const struct orb_rdma_tp *tp)
{
    /* A quarter of the arena, so that several requests' slots are staged at once, as a power of
     * two of at least a page (the whole arena when it is that small). */
    uint64_t size = tp->staging != NULL ? tp->staging->ext.size : STAGE_GRANULE;
    uint64_t want = size / 4 > STAGE_GRANULE ? size / 4 : STAGE_GRANULE;
    uint32_t shift = ORB_RDMA_SLOT_SHIFT_MIN;
    while (shift < ORB_RDMA_SLOT_SHIFT_MAX && (2ull << shift) <= want)
        shift++;
    return shift;
}

const struct orb_rdma_reg_mr *rdma_stage_mr(const struct orb_rdma_tp *tp, uint32_t nic)
{
    /* Read without the lock: mrs is written once, before the first extent is handed out, and
     * every caller holds an extent. */
    return orb_rdma_reg_mrs_on(tp->staging->mrs, nic);
}

uint64_t rdma_staging_in_use(struct orb_rdma_tp *tp)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return 0;
    pthread_mutex_lock(&s->lock);
    uint64_t n = s->ext.in_use;
    pthread_mutex_unlock(&s->lock);
    return n;
}

void rdma_staging_destroy(struct orb_rdma_tp *tp)
{
    struct rdma_staging *s = tp->staging;
    if (s == NULL)
        return;
    tp->staging = NULL;
    if (s->ext.ntaken > 0) {
        ORB_LOGE("rdma: %u staging extents are still in use at destroy: the arena is kept", s->ext.ntaken);
        return;
    }
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
