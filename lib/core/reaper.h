/* Internal: the engine's release thread, the one context where owners' release callbacks run.
 *
 * The last pin of a retired registration can drop on any thread: a transport worker finishing a
 * transfer (with its locks held), a submitter completing another batch's withdrawn slices, the
 * source's worker. A user's release callback must run on none of them: it may block, take its own
 * locks or call back into OrbiTE. So the registry hands each retired registration whose owner has
 * a release callback to the reaper, whose thread drops the owner reference with no OrbiTE lock
 * held. Owners without a callback (library-allocated or wrapped without one) are dropped in place:
 * that only frees memory. Thread-safe. */
#ifndef ORB_CORE_REAPER_H
#define ORB_CORE_REAPER_H

#include "memory.h"

struct orb_reaper;

/* One deferred reference drop, embedded in the object that hands it over (no allocation on the
 * release path). `finish` runs on the release thread right after the owner reference is
 * dropped; it typically frees the containing object. */
struct orb_reap_node {
    struct orb_reap_node *next;
    /* Runs first, when not NULL: undoes what transports attached to the object (memory regions
     * over the owner's bytes must go before the bytes may be released). May block. Non-zero
     * means some of it could not be undone (a device still maps the bytes): the owner reference
     * is then kept for the process's lifetime, so the bytes are never released under a device. */
    int (*retire)(struct orb_reap_node *node);
    void *owner;                      /* dropped with unref (NULL: nothing to drop) */
    void (*unref)(void *owner);
    int defers;                       /* 1: the drop may block or run user code */
    void (*finish)(struct orb_reap_node *node);
};

/* Start the release thread. Errors: ORB_ENOMEM, ORB_EUNAVAILABLE (cannot start a thread). */
int orb_reaper_new(struct orb_reaper **out);

/* Run node->retire, drop `node->owner`'s reference, then run node->finish, on the release
 * thread. Never blocks and never fails: with `r` NULL, or once the reaper is stopping, all three
 * happen in the caller's thread. A node without retire work whose drop does not defer (an owner
 * without a release callback) is also handled in place, since dropping it only frees memory. */
void orb_reaper_defer(struct orb_reaper *r, struct orb_reap_node *node);

/* 1 when the calling thread is the release thread. */
int orb_reaper_is_current(const struct orb_reaper *r);

/* Run every queued release, stop the thread and free. Called from the release thread itself
 * (a callback that drops the engine's last handle), it runs the queue to the end right there,
 * before it returns (the caller may destroy the transports that queued retire work next), and
 * leaves the thread to free itself. NULL is a no-op. */
void orb_reaper_free(struct orb_reaper *r);

#endif
