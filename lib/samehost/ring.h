/* Internal: a one-producer, one-consumer ring of fixed-size entries in memory shared by two
 * processes, for the same-host transport's requests and completions.
 *
 * The memory is shared with a peer that may be hostile, so nothing in it is trusted:
 *  - each side keeps its own index and the capacity in private memory and only publishes them;
 *    the other's published index is checked on every read (a consumer's head can never pass the
 *    producer's tail, and the producer's tail never runs more than a capacity ahead), and the
 *    first impossible value breaks the ring for good (ORB_EPROTO); it is read only when what was
 *    read last says the ring is full (producer) or empty (consumer), so that neither side pulls
 *    the other's index line over for every entry;
 *  - an entry is copied out before anyone looks at it, so a peer rewriting it meanwhile changes
 *    only the copy's bytes, never what was checked after the copy.
 *
 * Layout (`orb_sh_ring_bytes()`): three cache lines of indices (tail, written by the producer;
 * head, written by the consumer; the consumer's "asleep" word), then `capacity` entries of
 * ORB_SH_RING_ENTRY bytes. The consumer waits by polling for a while, then on a futex on the
 * tail word; the producer wakes it only when it said it sleeps, so a polling consumer costs the
 * producer no system call. */
#ifndef ORB_SAMEHOST_RING_H
#define ORB_SAMEHOST_RING_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <orbite/orbite.h>

#define ORB_SH_RING_ENTRY 64u
#define ORB_SH_RING_MAX_CAPACITY 4096u
#define ORB_SH_RING_LINE 64u

enum orb_sh_ring_role { ORB_SH_RING_PRODUCER = 1, ORB_SH_RING_CONSUMER = 2 };

/* One side's view; private memory. */
struct orb_sh_ring {
    uint8_t *shared;   /* the ring's memory (borrowed) */
    uint32_t capacity; /* agreed out of band, never read from the shared memory */
    uint32_t index;    /* this side's own index: the producer's tail or the consumer's head */
    uint32_t peer;     /* the other side's index as last read (and checked): read again only
                        * when the ring looks full (producer) or empty (consumer) from it */
    int role;          /* enum orb_sh_ring_role */
    int broken;        /* 0, or ORB_EPROTO once the peer published an impossible index */
};

/* Bytes of shared memory a ring of `capacity` entries takes; 0 when capacity is not a power of
 * two in [1, ORB_SH_RING_MAX_CAPACITY]. */
size_t orb_sh_ring_bytes(uint32_t capacity);

/* Take `len` bytes at `mem` (ORB_SH_RING_LINE-aligned, at least orb_sh_ring_bytes(capacity)) as
 * one side of a ring. `fresh` 1: this side creates it (zeroes the indices; do it before the peer
 * is given the memory); 0: attach to a ring the other side created. Errors: ORB_EINVAL. */
int orb_sh_ring_open(struct orb_sh_ring *r, void *mem, size_t len, uint32_t capacity, enum orb_sh_ring_role role,
                     int fresh);

/* Producer: append one entry (ORB_SH_RING_ENTRY bytes copied from `entry`) and wake the consumer
 * if it sleeps. 0; ORB_EAGAIN when the ring is full; ORB_EPROTO when the consumer's published
 * head is impossible (the ring is broken from then on); ORB_EINVAL (not the producer). */
int orb_sh_ring_push(struct orb_sh_ring *r, const void *entry);

/* Producer, in two steps, for several entries at once: stage one entry (checked and copied as by
 * orb_sh_ring_push, not yet visible to the consumer; the same errors), then publish every staged
 * entry with one store and, if the consumer sleeps, one wake-up. */
int orb_sh_ring_stage(struct orb_sh_ring *r, const void *entry);
void orb_sh_ring_publish(struct orb_sh_ring *r);

/* Consumer: 1 when an entry is published and not yet taken (a peek: the next pop checks it). */
int orb_sh_ring_pending(const struct orb_sh_ring *r);

/* Consumer: take the oldest entry into `entry` (ORB_SH_RING_ENTRY bytes). 0; ORB_EAGAIN when the
 * ring is empty; ORB_EPROTO when the producer's published tail is impossible (broken from then
 * on); ORB_EINVAL (not the consumer). */
int orb_sh_ring_pop(struct orb_sh_ring *r, void *entry);

/* Consumer: wait until an entry can be taken, polling for up to `poll_ns` first, then sleeping
 * on the futex until `deadline` (CLOCK_MONOTONIC ns; UINT64_MAX: none). 0 when one is there, the
 * ring broke or someone called orb_sh_ring_wake() (the next pop says which); ORB_ETIMEDOUT;
 * ORB_EINVAL (not the consumer). */
int orb_sh_ring_wait(struct orb_sh_ring *r, uint64_t poll_ns, uint64_t deadline);

/* The same for a consumer whose pops other threads may make meanwhile (under their own lock):
 * wait until the producer publishes past `index`, the consumer's index that the caller read
 * under that lock, touching nothing of `r` but the shared memory. */
int orb_sh_ring_wait_at(struct orb_sh_ring *r, uint32_t index, uint64_t poll_ns, uint64_t deadline);

/* Consumer, for a process whose threads share the consuming (a background thread that dozes
 * while callers poll): `on` 1 asks the producer to wake a sleeper at its next publication, 0 asks
 * it not to (a caller polls, so a wake-up would only cost both sides). Sequentially consistent
 * with the producer's publication: a tail published after this store sees it. */
void orb_sh_ring_want_wake(struct orb_sh_ring *r, int on);

/* Consumer: sleep on the futex until `deadline` or a wake-up (orb_sh_ring_wake(), or a
 * publication while orb_sh_ring_want_wake() asked for one), whatever the tail does meanwhile:
 * for a thread that stands back while others take the entries. 0 when woken; ORB_ETIMEDOUT;
 * ORB_EINVAL (not the consumer). */
int orb_sh_ring_doze(struct orb_sh_ring *r, uint64_t deadline);

/* Wake the consumer if it sleeps in orb_sh_ring_wait(), without adding an entry: for a thread of
 * the consumer's own process that has news for it (the connection ended). Any role; never fails. */
void orb_sh_ring_wake(struct orb_sh_ring *r);

#endif
