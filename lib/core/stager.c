/* Host staging for memory without a CPU view: see stager.h. */
#include "stager.h"

#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "log.h"
#include "registry.h"
#include "thread_name.h"

/* Pieces handed to a transport in one peer_submit(). */
#define STAGE_SUBMIT_BATCH 16u

struct orb_stager {
    struct orb_stage_pool *pool; /* the engine's, shared with the transports */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct orb_stage_waiter waiter;              /* the pool had no chunk for the head piece */
    /* lock: */
    struct orb_stage_job *sub_head, *sub_tail;   /* waiting for a chunk (and a WRITE's copy) */
    struct orb_stage_job *land_head, *land_tail; /* READs whose bytes are in their chunk */
    bool chunk_back;                             /* the pool woke the waiter */
    bool stopping, joined;
    atomic_uint_fast64_t inflight;               /* queued + being copied */
};

static void push(struct orb_stage_job **head, struct orb_stage_job **tail, struct orb_stage_job *j)
{
    j->next = NULL;
    if (*tail != NULL)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

static struct orb_stage_job *pop(struct orb_stage_job **head, struct orb_stage_job **tail)
{
    struct orb_stage_job *j = *head;
    if (j != NULL) {
        *head = j->next;
        if (*head == NULL)
            *tail = NULL;
        j->next = NULL;
    }
    return j;
}

/* The pool's wake-up (under the pool's lock; the stager never calls the pool holding its own). */
static void chunk_came_back(struct orb_stage_waiter *w)
{
    struct orb_stager *st = (struct orb_stager *)(void *)((char *)w - offsetof(struct orb_stager, waiter));
    pthread_mutex_lock(&st->lock);
    st->chunk_back = true;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
}

/* The device of `reg` may still use chunk `c`: it is never lent or freed again, and counted as
 * retained. */
static void chunk_keep(struct orb_stager *st, const struct orb_reg *reg, uint8_t *c)
{
    orb_stage_pool_keep(st->pool, reg, c);
}

static void chunk_put(struct orb_stager *st, uint8_t *c)
{
    orb_stage_pool_put(st->pool, c);
}

/* Copy a landed READ's chunk to the device, give the chunk back and report the piece. */
static void land(struct orb_stager *st, struct orb_stage_job *j)
{
    struct orb_xfer *x = j->x;
    const struct orb_reg *reg = x->local_reg;
    uint8_t *chunk = x->stage;
    bool held = false;
    int rc = reg->kind->from_host(reg, reg->base + x->local_offset, chunk, (size_t)x->length, &held);
    char why[256] = "";
    if (rc != 0)
        snprintf(why, sizeof why, "copying a READ's bytes to %s memory failed: %s", reg->kind->name,
                 orb_last_error());
    if (held) {
        /* The device may still read the chunk: it is never lent again (the pool is one chunk
         * smaller for good). */
        chunk_keep(st, reg, chunk);
        ORB_LOGE("stager: %s; its staging chunk is kept", why);
    } else {
        chunk_put(st, chunk);
    }
    x->stage = NULL;
    orb_xfer_done_why(x, rc, ORB_REMOTE_EFFECT_NONE, why);
}

/* Hand `n` staged pieces of one peer to their transport (no lock held). */
static void hand_over(struct orb_stager *st, struct orb_stage_job **jobs, size_t n)
{
    struct orb_xfer *xs[STAGE_SUBMIT_BATCH];
    for (size_t i = 0; i < n; i++)
        xs[i] = jobs[i]->x;
    int rc = jobs[0]->ops->peer_submit(jobs[0]->peer, xs, n);
    atomic_fetch_sub(&st->inflight, n);
    if (rc == 0)
        return;
    char why[256];
    snprintf(why, sizeof why, "the %s transport refused a staged piece: %s", jobs[0]->ops->name,
             orb_last_error());
    for (size_t i = 0; i < n; i++) {
        chunk_put(st, xs[i]->stage);
        xs[i]->stage = NULL;
        orb_xfer_done_why(xs[i], rc, ORB_REMOTE_EFFECT_NONE, why);
    }
}

/* Give the piece its chunk's bytes: a WRITE's from the device. 0, or the copy's failure (the
 * piece was reported and its chunk went back or, unquiesced, was kept). */
static int prepare(struct orb_stager *st, struct orb_stage_job *j)
{
    struct orb_xfer *x = j->x;
    if (x->op != ORB_XFER_WRITE)
        return 0;
    const struct orb_reg *reg = x->local_reg;
    bool held = false;
    int rc = reg->kind->to_host(reg, reg->base + x->local_offset, x->stage, (size_t)x->length, &held);
    if (rc == 0)
        return 0;
    char why[256];
    snprintf(why, sizeof why, "copying a WRITE's bytes from %s memory failed: %s", reg->kind->name,
             orb_last_error());
    if (held) {
        chunk_keep(st, reg, x->stage);
        ORB_LOGE("stager: %s; its staging chunk is kept", why);
    } else {
        chunk_put(st, x->stage);
    }
    x->stage = NULL;
    atomic_fetch_sub(&st->inflight, 1);
    orb_xfer_done_why(x, rc, ORB_REMOTE_EFFECT_NONE, why);
    return rc;
}

static void *stager_main(void *arg)
{
    struct orb_stager *st = arg;
    orb_thread_name("stager");
    pthread_mutex_lock(&st->lock);
    for (;;) {
        struct orb_stage_job *j = pop(&st->land_head, &st->land_tail);
        if (j != NULL) {
            pthread_mutex_unlock(&st->lock);
            land(st, j);
            atomic_fetch_sub(&st->inflight, 1);
            pthread_mutex_lock(&st->lock);
            continue;
        }
        if (st->stopping && st->sub_head != NULL) {
            j = pop(&st->sub_head, &st->sub_tail);
            pthread_mutex_unlock(&st->lock);
            atomic_fetch_sub(&st->inflight, 1);
            orb_xfer_done_why(j->x, ORB_ECLOSED, ORB_REMOTE_EFFECT_NONE, "the engine is closing");
            pthread_mutex_lock(&st->lock);
            continue;
        }
        /* Submissions, as many of one peer as there are chunks for. */
        struct orb_stage_job *batch[STAGE_SUBMIT_BATCH];
        size_t n = 0;
        bool empty = false;
        st->chunk_back = false;
        while (n < STAGE_SUBMIT_BATCH && st->sub_head != NULL &&
               (n == 0 || (st->sub_head->peer == batch[0]->peer && st->sub_head->ops == batch[0]->ops))) {
            /* Only this thread pops submissions: the head stays while the lock is dropped. */
            const struct orb_reg *reg = st->sub_head->x->local_reg;
            uint8_t *c = NULL;
            pthread_mutex_unlock(&st->lock);
            int rc = orb_stage_pool_take(st->pool, reg, ORB_STAGE_FOR_REQUESTER, &st->waiter, &c, NULL);
            pthread_mutex_lock(&st->lock);
            if (rc != 0 && rc != ORB_EAGAIN) { /* closing, or no memory: the head fails */
                if (n > 0)
                    break;
                char why[256];
                snprintf(why, sizeof why, "%s", rc == ORB_ECLOSED ? "the engine is closing" : orb_last_error());
                struct orb_stage_job *dead = pop(&st->sub_head, &st->sub_tail);
                pthread_mutex_unlock(&st->lock);
                atomic_fetch_sub(&st->inflight, 1);
                orb_xfer_done_why(dead->x, rc, ORB_REMOTE_EFFECT_NONE, why);
                pthread_mutex_lock(&st->lock);
                continue;
            }
            if (rc != 0) {
                empty = true;
                break;
            }
            batch[n] = pop(&st->sub_head, &st->sub_tail);
            batch[n]->x->stage = c;
            n++;
        }
        if (n > 0) {
            pthread_mutex_unlock(&st->lock);
            size_t ready = 0;
            for (size_t i = 0; i < n; i++)
                if (prepare(st, batch[i]) == 0)
                    batch[ready++] = batch[i];
            if (ready > 0)
                hand_over(st, batch, ready);
            pthread_mutex_lock(&st->lock);
            continue;
        }
        if (st->stopping)
            break;
        /* Nothing to do, or no chunk until the pool wakes the waiter (which may have happened
         * while the lock was dropped). */
        if (!(empty && st->chunk_back))
            pthread_cond_wait(&st->cond, &st->lock);
    }
    pthread_mutex_unlock(&st->lock);
    return NULL;
}

int orb_stager_new(struct orb_stage_pool *pool, struct orb_stager **out)
{
    if (out == NULL || pool == NULL)
        return orb_fail(ORB_EINVAL, "stager: NULL %s", out == NULL ? "output" : "pool");
    struct orb_stager *st = calloc(1, sizeof *st);
    if (st == NULL)
        return orb_fail(ORB_ENOMEM, "stager: out of memory");
    st->pool = pool;
    st->waiter.wake = chunk_came_back;
    atomic_init(&st->inflight, 0);
    pthread_mutex_init(&st->lock, NULL);
    pthread_cond_init(&st->cond, NULL);
    int err = pthread_create(&st->thread, NULL, stager_main, st);
    if (err != 0) {
        pthread_cond_destroy(&st->cond);
        pthread_mutex_destroy(&st->lock);
        free(st);
        return orb_fail(ORB_EUNAVAILABLE, "stager: cannot start its thread (%s)", strerror(err));
    }
    *out = st;
    return 0;
}

void orb_stager_submit(struct orb_stager *st, struct orb_stage_job *const *jobs, size_t n)
{
    pthread_mutex_lock(&st->lock);
    bool stopping = st->stopping;
    if (!stopping) {
        for (size_t i = 0; i < n; i++)
            push(&st->sub_head, &st->sub_tail, jobs[i]);
        atomic_fetch_add(&st->inflight, n);
        pthread_cond_broadcast(&st->cond);
    }
    pthread_mutex_unlock(&st->lock);
    if (stopping)
        for (size_t i = 0; i < n; i++)
            orb_xfer_done_why(jobs[i]->x, ORB_ECLOSED, ORB_REMOTE_EFFECT_NONE, "the engine is closing");
}

int orb_stager_piece_ended(struct orb_stager *st, struct orb_stage_job *job, int status)
{
    struct orb_xfer *x = job->x;
    if (status == 0 && x->op == ORB_XFER_READ) {
        pthread_mutex_lock(&st->lock);
        bool stopping = st->stopping;
        if (!stopping) {
            push(&st->land_head, &st->land_tail, job);
            atomic_fetch_add(&st->inflight, 1);
            pthread_cond_broadcast(&st->cond);
        }
        pthread_mutex_unlock(&st->lock);
        if (stopping)
            land(st, job);
        return 1;
    }
    chunk_put(st, x->stage);
    x->stage = NULL;
    return 0;
}

uint64_t orb_stager_inflight(struct orb_stager *st)
{
    return st != NULL ? atomic_load(&st->inflight) : 0;
}

void orb_stager_stop(struct orb_stager *st)
{
    if (st == NULL)
        return;
    pthread_mutex_lock(&st->lock);
    bool join = !st->joined;
    st->stopping = true;
    st->joined = true;
    pthread_cond_broadcast(&st->cond);
    pthread_mutex_unlock(&st->lock);
    if (join)
        pthread_join(st->thread, NULL);
}

void orb_stager_free(struct orb_stager *st)
{
    if (st == NULL)
        return;
    orb_stager_stop(st);
    orb_stage_pool_unwait(st->pool, &st->waiter);
    pthread_cond_destroy(&st->cond);
    pthread_mutex_destroy(&st->lock);
    free(st);
}
