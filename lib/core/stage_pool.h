/* Internal: the engine's one bounded pool of host staging chunks for memory without a CPU view
 * (device memory), shared by every transport that stages: the requester's stager (TCP), the TCP
 * source's connections and the RDMA transport's device staging.
 *
 * Chunks are ORB_STAGE_CHUNK bytes, at most ORB_STAGE_POOL_BYTES together, made as needed from
 * the memory kind's own staging memory (pinned host memory for device memory) and kept until the
 * engine goes. Each has a fixed index (0..max-1), so that a transport can keep per-chunk state
 * (RDMA keeps its memory regions on a chunk) for the pool's life.
 *
 * Two classes of taker, so that staging cannot deadlock an engine that serves its own requests:
 * a requester's piece holds its chunk while it waits for a source, never the reverse. Sources
 * (the TCP source, an RDMA source's grant) may take every chunk; requesters leave the last
 * ORB_STAGE_SOURCE_RESERVE to them. A source holds a chunk only while it moves bytes that need no
 * other chunk, so every source makes progress and gives its chunk back.
 *
 * Thread-safe. Lock order: the pool's lock is taken under transport locks; a waiter's wake()
 * runs under it and may take only leaf locks (a worker's poke lock, the stager's lock). */
#ifndef ORB_CORE_STAGE_POOL_H
#define ORB_CORE_STAGE_POOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define ORB_STAGE_CHUNK (1u << 20)
#define ORB_STAGE_POOL_BYTES (64u << 20)
#define ORB_STAGE_SOURCE_RESERVE 4u

struct orb_reg;
struct orb_stage_pool;

enum orb_stage_taker {
    ORB_STAGE_FOR_REQUESTER, /* leaves the reserve to sources */
    ORB_STAGE_FOR_SOURCE,
};

/* Someone who found the pool empty and is told once when a chunk comes back. Embedded in its
 * owner; wake() runs under the pool's lock (see above) and must not call the pool. */
struct orb_stage_waiter {
    struct orb_stage_waiter *next;
    bool queued;
    void (*wake)(struct orb_stage_waiter *w);
};

/* A pool of at most pool_bytes / chunk_bytes chunks (chunk_bytes a multiple of 4096, reserve
 * below the count). Errors: ORB_EINVAL, ORB_ENOMEM. */
int orb_stage_pool_new(size_t chunk_bytes, size_t pool_bytes, uint32_t source_reserve,
                       struct orb_stage_pool **out);

/* A chunk for staging `reg`'s bytes into *out (its index into *index_out when not NULL): one that
 * came back, or a new one while the pool may grow (allocated by reg's memory kind). Never waits.
 * ORB_EAGAIN when none is free for this taker now; `w` (may be NULL) is then queued, atomically
 * with the refusal, and woken once by the next chunk that comes back. ORB_ENOMEM when a new chunk
 * could not be allocated, ORB_ERESOURCE when so many chunks are kept for good that this taker
 * could never have one (nothing is queued either way: the caller fails its work). ORB_ECLOSED
 * once the pool is closed. */
int orb_stage_pool_take(struct orb_stage_pool *p, const struct orb_reg *reg, enum orb_stage_taker who,
                        struct orb_stage_waiter *w, uint8_t **out, uint32_t *index_out);

/* As orb_stage_pool_take(), waiting until `deadline` (orb_now_ns() clock) for a chunk.
 * ORB_ETIMEDOUT naming the pool when none came in time; ORB_ENOMEM, ORB_ERESOURCE, ORB_ECLOSED as
 * above. */
int orb_stage_pool_take_wait(struct orb_stage_pool *p, const struct orb_reg *reg, enum orb_stage_taker who,
                             uint64_t deadline, uint8_t **out, uint32_t *index_out);

/* Take `w` off the waiters (no-op when it is not queued). After this returns, its wake() is not
 * running and will not run. */
void orb_stage_pool_unwait(struct orb_stage_pool *p, struct orb_stage_waiter *w);

/* Give chunk `c` back. NULL is a no-op. */
void orb_stage_pool_put(struct orb_stage_pool *p, uint8_t *c);

/* The device of `reg` may still use chunk `c` (a copy through it was not proven to end): it is
 * never lent or freed again, and counted as retained by its memory kind. */
void orb_stage_pool_keep(struct orb_stage_pool *p, const struct orb_reg *reg, uint8_t *c);

/* Chunk i is kept for good (a device may still reach it: a NIC refused to deregister it, or a
 * transport went without proving its work's end): never lent or freed again; a chunk lent now is
 * kept when it comes back. No-op for a chunk not made or already kept. */
void orb_stage_pool_retire(struct orb_stage_pool *p, uint32_t i);

/* Chunk i's bytes, or NULL while it is not made (or i is out of range). */
uint8_t *orb_stage_pool_chunk(struct orb_stage_pool *p, uint32_t i);

size_t orb_stage_pool_chunk_bytes(const struct orb_stage_pool *p);
uint32_t orb_stage_pool_max_chunks(const struct orb_stage_pool *p);
/* Chunks lent now (kept ones excluded). */
uint32_t orb_stage_pool_lent(struct orb_stage_pool *p);

/* Refuse every later take with ORB_ECLOSED and wake every waiter. Idempotent; NULL is a no-op. */
void orb_stage_pool_close(struct orb_stage_pool *p);

/* Close, then free the chunks and the pool. Chunks still lent (to work whose end could not be
 * proven) are leaked with the pool on purpose. NULL is a no-op. */
void orb_stage_pool_free(struct orb_stage_pool *p);

#endif
