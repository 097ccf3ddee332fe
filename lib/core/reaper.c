/* The engine's release thread: owner references handed over by the registry are dropped here. */
#include "reaper.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "thread_name.h"

struct orb_reaper {
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    struct orb_reap_node *head, *tail; /* lock */
    int stopping;                  /* lock: no more hand-overs, exit once empty */
    int self_free;                 /* lock: stopped from its own thread; it frees the struct */
};

/* Undo transport state, drop the reference (this may run the user's callback), then let the
 * container go. */
static void reap_now(struct orb_reap_node *node)
{
    /* A retirement that could not finish keeps the owner's bytes: the reference is leaked on
     * purpose (the retiring code said why in the log). */
    if ((node->retire == NULL || node->retire(node) == 0) && node->owner != NULL)
        node->unref(node->owner);
    if (node->finish != NULL)
        node->finish(node);
}

/* The oldest queued node, or NULL (lock held). */
static struct orb_reap_node *pop_locked(struct orb_reaper *r)
{
    struct orb_reap_node *node = r->head;
    if (node != NULL) {
        r->head = node->next;
        if (r->head == NULL)
            r->tail = NULL;
    }
    return node;
}

static void *reaper_main(void *arg)
{
    struct orb_reaper *r = arg;
    orb_thread_name("reaper");
    pthread_mutex_lock(&r->lock);
    for (;;) {
        while (r->head == NULL && !r->stopping)
            pthread_cond_wait(&r->cond, &r->lock);
        /* One node at a time, so that a callback that frees the reaper from this thread can
         * run everything still queued itself (orb_reaper_free()). */
        struct orb_reap_node *node = pop_locked(r);
        if (node == NULL && r->stopping)
            break;
        pthread_mutex_unlock(&r->lock);
        reap_now(node);
        pthread_mutex_lock(&r->lock);
    }
    int self_free = r->self_free;
    pthread_mutex_unlock(&r->lock);
    if (self_free) {
        pthread_cond_destroy(&r->cond);
        pthread_mutex_destroy(&r->lock);
        free(r);
    }
    return NULL;
}

int orb_reaper_new(struct orb_reaper **out)
{
    struct orb_reaper *r = calloc(1, sizeof *r);
    if (r == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate the release thread's state");
    int rc;
    if (pthread_mutex_init(&r->lock, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "cannot initialise the release thread's lock");
        goto free_reaper;
    }
    if (pthread_cond_init(&r->cond, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "cannot initialise the release thread's condition");
        goto destroy_lock;
    }
    int err = pthread_create(&r->thread, NULL, reaper_main, r);
    if (err != 0) {
        rc = orb_fail(ORB_EUNAVAILABLE, "cannot start the release thread: %s", strerror(err));
        goto destroy_cond;
    }
    *out = r;
    return 0;

destroy_cond:
    pthread_cond_destroy(&r->cond);
destroy_lock:
    pthread_mutex_destroy(&r->lock);
free_reaper:
    free(r);
    return rc;
}

void orb_reaper_defer(struct orb_reaper *r, struct orb_reap_node *node)
{
    if (r != NULL && (node->retire != NULL || (node->owner != NULL && node->defers))) {
        node->next = NULL;
        pthread_mutex_lock(&r->lock);
        if (!r->stopping) {
            if (r->tail != NULL)
                r->tail->next = node;
            else
                r->head = node;
            r->tail = node;
            pthread_cond_signal(&r->cond);
            pthread_mutex_unlock(&r->lock);
            return;
        }
        pthread_mutex_unlock(&r->lock);
    }
    reap_now(node);
}

int orb_reaper_is_current(const struct orb_reaper *r)
{
    return r != NULL && pthread_equal(pthread_self(), r->thread);
}

void orb_reaper_free(struct orb_reaper *r)
{
    if (r == NULL)
        return;
    int self = orb_reaper_is_current(r);
    pthread_mutex_lock(&r->lock);
    r->stopping = 1;
    r->self_free = self;
    pthread_cond_signal(&r->cond);
    pthread_mutex_unlock(&r->lock);
    if (self) {
        /* Whatever is queued runs now, before the caller goes on to destroy what it needs. */
        for (;;) {
            pthread_mutex_lock(&r->lock);
            struct orb_reap_node *node = pop_locked(r);
            pthread_mutex_unlock(&r->lock);
            if (node == NULL)
                break;
            reap_now(node);
        }
        pthread_detach(r->thread);
        return;
    }
    pthread_join(r->thread, NULL);
    pthread_cond_destroy(&r->cond);
    pthread_mutex_destroy(&r->lock);
    free(r);
}
