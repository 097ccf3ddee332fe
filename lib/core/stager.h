/* Internal: host staging for memory without a CPU view (device memory), for transports that
 * move bytes through the CPU (TCP), on the requester's side.
 *
 * One stager per engine, made on first use: one thread that copies, with chunks from the engine's
 * staging pool (stage_pool.h), which the transports share. A staged piece is at most one chunk
 * long (transports plan such pieces that way). A WRITE piece takes a chunk, is copied from the
 * device into it, and only then goes to its transport with the chunk as its CPU view; a READ
 * piece takes a chunk and goes to its transport, which receives into the chunk; once it reports
 * success the stager copies the chunk to the device, and only then is the piece reported. Either
 * way the chunk goes back when the piece ends. Copies and socket I/O overlap (the thread copies
 * the next pieces while the transport's workers move the earlier ones) and no request is ever
 * copied whole: a request holds at most as many chunks as the pool lends requesters.
 *
 * Thread-safe. Lock order: the stager's lock is a leaf (taken under transport and batch locks,
 * and under the pool's lock by its wake-up; it never holds another); the thread calls the pool,
 * transports and orb_xfer_done_why() with no lock held. */
#ifndef ORB_CORE_STAGER_H
#define ORB_CORE_STAGER_H

#include <stddef.h>
#include <stdint.h>

#include "stage_pool.h"
#include "transport.h"

/* A staged piece's way through the stager, embedded in the piece. */
struct orb_stage_job {
    struct orb_stage_job *next;
    struct orb_xfer *x;
    const struct orb_transport_ops *ops; /* the transport that carries it */
    void *peer;                          /* its peer (kept alive by the piece's batch) */
};

struct orb_stager;

/* A stager taking its chunks from `pool` (which must outlive it), and its thread. Errors:
 * ORB_EINVAL, ORB_ENOMEM, ORB_EUNAVAILABLE (no thread). */
int orb_stager_new(struct orb_stage_pool *pool, struct orb_stager **out);

/* Queue `n` staged pieces for their chunk (and, for a WRITE, the copy) and then their
 * transport's peer_submit(). Never fails: a piece that cannot go (the stager stopped, a copy or
 * the transport refused) is reported through orb_xfer_done_why() with the cause. */
void orb_stager_submit(struct orb_stager *st, struct orb_stage_job *const *jobs, size_t n);

/* From orb_xfer_done_why() for a piece holding a chunk (x->stage): a successful READ is landed
 * (copied to the device, then reported again with the copy's outcome, x->stage NULL) on the
 * stager's thread, or in the caller's once the stager stopped; returns 1 then and the caller
 * stops. Otherwise the chunk goes back, x->stage is cleared and 0 tells the caller to go on. */
int orb_stager_piece_ended(struct orb_stager *st, struct orb_stage_job *job, int status);

/* Pieces queued or being copied (not yet with their transport, or not yet landed). */
uint64_t orb_stager_inflight(struct orb_stager *st);

/* Fail queued submissions with ORB_ECLOSED, land what already arrived, join the thread. Later
 * pieces are handled in the callers' threads. Idempotent; NULL is a no-op. */
void orb_stager_stop(struct orb_stager *st);

/* Stop, then free the stager (its chunks belong to the pool). NULL is a no-op. */
void orb_stager_free(struct orb_stager *st);

#endif
