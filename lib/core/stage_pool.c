/* The engine's shared staging pool: see stage_pool.h. */
#include "stage_pool.h"

#include <pthread.h>
#include <stdlib.h>

#include "clock.h"
#include "error.h"
#include "log.h"
#include "registry.h"

enum chunk_state { CHUNK_UNMADE, CHUNK_MAKING, CHUNK_FREE, CHUNK_LENT, CHUNK_KEPT };

struct chunk {
    uint8_t *bytes;
    void (*free_fn)(void *);
    enum chunk_state state;
    bool retire_on_put;   /* retired while lent: kept for good when it comes back */
};

struct orb_stage_pool {
    size_t chunk_bytes;
    uint32_t max_chunks, reserve;
    pthread_mutex_t lock;
    pthread_cond_t cond; /* a chunk came back, or the pool closed (blocking takers) */
    /* lock: */
    struct chunk *chunks;
    uint32_t *free_stack; /* indices of CHUNK_FREE chunks */
    uint32_t nfree;
    uint32_t unmade;      /* CHUNK_UNMADE chunks */
    uint32_t lent;
    uint32_t kept;        /* CHUNK_KEPT chunks, gone for good */
    uint32_t sleepers;    /* blocking takers */
    struct orb_stage_waiter *waiters;
    bool closed;
};

int orb_stage_pool_new(size_t chunk_bytes, size_t pool_bytes, uint32_t source_reserve,
                       struct orb_stage_pool **out)
{
    if (out == NULL || chunk_bytes == 0 || chunk_bytes % 4096 != 0 || pool_bytes < chunk_bytes ||
        pool_bytes / chunk_bytes > UINT32_MAX || source_reserve >= pool_bytes / chunk_bytes)
        return orb_fail(ORB_EINVAL, "staging pool: chunks of %zu bytes in %zu, %u reserved for sources",
                        chunk_bytes, pool_bytes, source_reserve);
    struct orb_stage_pool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return orb_fail(ORB_ENOMEM, "staging pool: out of memory");
    p->chunk_bytes = chunk_bytes;
    p->max_chunks = (uint32_t)(pool_bytes / chunk_bytes);
    p->reserve = source_reserve;
    p->unmade = p->max_chunks;
    p->chunks = calloc(p->max_chunks, sizeof *p->chunks);
    p->free_stack = calloc(p->max_chunks, sizeof *p->free_stack);
    if (p->chunks == NULL || p->free_stack == NULL) {
        free(p->chunks);
        free(p->free_stack);
        free(p);
        return orb_fail(ORB_ENOMEM, "staging pool: out of memory");
    }
    pthread_mutex_init(&p->lock, NULL);
    (void)orb_cond_init_monotonic(&p->cond);
    *out = p;
    return 0;
}

/* Whether `who` may have a chunk now (lock held). */
static bool room_for(const struct orb_stage_pool *p, enum orb_stage_taker who)
{
    uint32_t available = p->nfree + p->unmade;
    return who == ORB_STAGE_FOR_SOURCE ? available > 0 : available > p->reserve;
}

/* Wake every queued waiter and blocking taker (lock held). */
static void wake_all_locked(struct orb_stage_pool *p)
{
    struct orb_stage_waiter *w = p->waiters;
    p->waiters = NULL;
    while (w != NULL) {
        struct orb_stage_waiter *next = w->next;
        w->next = NULL;
        w->queued = false;
        w->wake(w);
        w = next;
    }
    if (p->sleepers > 0)
        pthread_cond_broadcast(&p->cond);
}

/* One chunk for `who`, made if need be with the lock dropped (the driver takes a while to pin
 * memory); ORB_EAGAIN when there is none now, ORB_ENOMEM when none could be made (lock held on
 * entry and return). */
static int take_locked(struct orb_stage_pool *p, const struct orb_reg *reg, enum orb_stage_taker who,
                       uint8_t **out, uint32_t *index_out)
{
    if (p->closed)
        return orb_fail(ORB_ECLOSED, "staging pool: the engine is closing");
    /* Kept chunks never come back: a taker that could never have one fails instead of waiting. */
    uint32_t usable = p->max_chunks - (who == ORB_STAGE_FOR_SOURCE ? 0 : p->reserve);
    if (p->kept >= usable)
        return orb_fail(ORB_ERESOURCE, "staging pool: %u of its %u chunks are kept for good (copies through them "
                        "were not proven to end, or a NIC would not let go of them): none is left for %s", p->kept,
                        p->max_chunks, who == ORB_STAGE_FOR_SOURCE ? "sources" : "requests");
    if (!room_for(p, who))
        return ORB_EAGAIN;
    uint32_t i;
    if (p->nfree > 0) {
        i = p->free_stack[--p->nfree];
    } else {
        for (i = 0; i < p->max_chunks && p->chunks[i].state != CHUNK_UNMADE; i++) {
        }
        p->chunks[i].state = CHUNK_MAKING;
        p->unmade--;
        pthread_mutex_unlock(&p->lock);
        void (*free_fn)(void *) = NULL;
        uint8_t *c = orb_reg_stage_alloc(reg, p->chunk_bytes, &free_fn);
        pthread_mutex_lock(&p->lock);
        if (c == NULL) {
            /* Out of memory: said to this taker (nothing may come back to wake it); those refused
             * while the chunk was being made try again. */
            p->chunks[i].state = CHUNK_UNMADE;
            p->unmade++;
            wake_all_locked(p);
            return orb_fail(ORB_ENOMEM, "staging pool: no memory for a chunk of %zu bytes", p->chunk_bytes);
        }
        p->chunks[i].bytes = c;
        p->chunks[i].free_fn = free_fn;
    }
    p->chunks[i].state = CHUNK_LENT;
    p->lent++;
    *out = p->chunks[i].bytes;
    if (index_out != NULL)
        *index_out = i;
    return 0;
}

int orb_stage_pool_take(struct orb_stage_pool *p, const struct orb_reg *reg, enum orb_stage_taker who,
                        struct orb_stage_waiter *w, uint8_t **out, uint32_t *index_out)
{
    pthread_mutex_lock(&p->lock);
    int rc = take_locked(p, reg, who, out, index_out);
    if (rc == ORB_EAGAIN) {
        if (w != NULL && !w->queued) {
            w->queued = true;
            w->next = p->waiters;
            p->waiters = w;
        }
        rc = orb_fail(ORB_EAGAIN, "staging pool: all %u chunks of %zu bytes are lent%s", p->max_chunks,
                      p->chunk_bytes, who == ORB_STAGE_FOR_REQUESTER ? " (or reserved for sources)" : "");
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

int orb_stage_pool_take_wait(struct orb_stage_pool *p, const struct orb_reg *reg, enum orb_stage_taker who,
                             uint64_t deadline, uint8_t **out, uint32_t *index_out)
{
    pthread_mutex_lock(&p->lock);
    int rc;
    while ((rc = take_locked(p, reg, who, out, index_out)) == ORB_EAGAIN) {
        if (orb_now_ns() >= deadline) {
            rc = orb_fail(ORB_ETIMEDOUT, "staging pool: all %u chunks of %zu bytes stayed lent%s", p->max_chunks,
                          p->chunk_bytes, who == ORB_STAGE_FOR_REQUESTER ? " (or reserved for sources)" : "");
            break;
        }
        p->sleepers++;
        struct timespec ts = orb_deadline_timespec(deadline);
        (void)pthread_cond_timedwait(&p->cond, &p->lock, &ts);
        p->sleepers--;
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

void orb_stage_pool_unwait(struct orb_stage_pool *p, struct orb_stage_waiter *w)
{
    pthread_mutex_lock(&p->lock);
    if (w->queued) {
        for (struct orb_stage_waiter **at = &p->waiters; *at != NULL; at = &(*at)->next)
            if (*at == w) {
                *at = w->next;
                break;
            }
        w->next = NULL;
        w->queued = false;
    }
    pthread_mutex_unlock(&p->lock);
}

/* The index of lent chunk `c` (lock held); max_chunks when it is not one. */
static uint32_t lent_index_locked(const struct orb_stage_pool *p, const uint8_t *c)
{
    for (uint32_t i = 0; i < p->max_chunks; i++)
        if (p->chunks[i].bytes == c && p->chunks[i].state == CHUNK_LENT)
            return i;
    return p->max_chunks;
}

void orb_stage_pool_put(struct orb_stage_pool *p, uint8_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    uint32_t i = lent_index_locked(p, c);
    if (i == p->max_chunks) {
        pthread_mutex_unlock(&p->lock);
        ORB_LOGE("staging pool: a chunk given back that is not lent (%p): ignored", (void *)c);
        return;
    }
    p->lent--;
    if (p->chunks[i].retire_on_put) {
        p->chunks[i].state = CHUNK_KEPT;
        p->kept++;
        ORB_LOGE("staging pool: a chunk of %zu bytes retired while lent is kept for good: a device may still reach "
                 "it", p->chunk_bytes);
    } else {
        p->chunks[i].state = CHUNK_FREE;
        p->free_stack[p->nfree++] = i;
    }
    wake_all_locked(p); /* a chunk to take, or a waiter that can now never have one fails */
    pthread_mutex_unlock(&p->lock);
}

void orb_stage_pool_keep(struct orb_stage_pool *p, const struct orb_reg *reg, uint8_t *c)
{
    if (c == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    uint32_t i = lent_index_locked(p, c);
    if (i < p->max_chunks) {
        p->chunks[i].state = CHUNK_KEPT;
        p->lent--;
        p->kept++;
        orb_reg_stage_keep(reg, c, p->chunks[i].free_fn);
        wake_all_locked(p); /* a waiter that can now never have a chunk fails */
    }
    pthread_mutex_unlock(&p->lock);
}

void orb_stage_pool_retire(struct orb_stage_pool *p, uint32_t i)
{
    pthread_mutex_lock(&p->lock);
    if (i < p->max_chunks && p->chunks[i].state == CHUNK_LENT)
        p->chunks[i].retire_on_put = true;
    if (i < p->max_chunks && p->chunks[i].state == CHUNK_FREE) {
        for (uint32_t k = 0; k < p->nfree; k++)
            if (p->free_stack[k] == i) {
                p->free_stack[k] = p->free_stack[--p->nfree];
                break;
            }
        p->chunks[i].state = CHUNK_KEPT;
        p->kept++;
        wake_all_locked(p);
        ORB_LOGE("staging pool: a chunk of %zu bytes is kept for good: a device mapping of it could not be undone",
                 p->chunk_bytes);
    }
    pthread_mutex_unlock(&p->lock);
}

uint8_t *orb_stage_pool_chunk(struct orb_stage_pool *p, uint32_t i)
{
    if (i >= p->max_chunks)
        return NULL;
    pthread_mutex_lock(&p->lock);
    uint8_t *c = p->chunks[i].state >= CHUNK_FREE ? p->chunks[i].bytes : NULL;
    pthread_mutex_unlock(&p->lock);
    return c;
}

size_t orb_stage_pool_chunk_bytes(const struct orb_stage_pool *p)
{
    return p->chunk_bytes;
}

uint32_t orb_stage_pool_max_chunks(const struct orb_stage_pool *p)
{
    return p->max_chunks;
}

uint32_t orb_stage_pool_lent(struct orb_stage_pool *p)
{
    pthread_mutex_lock(&p->lock);
    uint32_t n = p->lent;
    pthread_mutex_unlock(&p->lock);
    return n;
}

void orb_stage_pool_close(struct orb_stage_pool *p)
{
    if (p == NULL)
        return;
    pthread_mutex_lock(&p->lock);
    p->closed = true;
    wake_all_locked(p);
    pthread_mutex_unlock(&p->lock);
}

void orb_stage_pool_free(struct orb_stage_pool *p)
{
    if (p == NULL)
        return;
    orb_stage_pool_close(p);
    pthread_mutex_lock(&p->lock);
    uint32_t lent = p->lent;
    pthread_mutex_unlock(&p->lock);
    if (lent > 0) {
        ORB_LOGE("staging pool: %u chunks are still lent to work whose end is unproven: kept", lent);
        return;
    }
    for (uint32_t i = 0; i < p->max_chunks; i++)
        if (p->chunks[i].state == CHUNK_FREE)
            p->chunks[i].free_fn(p->chunks[i].bytes);
    free(p->chunks);
    free(p->free_stack);
    pthread_cond_destroy(&p->cond);
    pthread_mutex_destroy(&p->lock);
    free(p);
}
