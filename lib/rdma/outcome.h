/* Internal: what a failed RDMA request attempt leads to -- asked again, or ended with which
 * remote effect. Pure rules, kept in one place so that they can be tested as a table.
 *
 * A request's attempt is everything from its grant to the completion of its last work request.
 * Its outcome is decided only once all of them have completed (nothing of it can still land),
 * so the rules see a finished attempt. */
#ifndef ORB_RDMA_OUTCOME_H
#define ORB_RDMA_OUTCOME_H

#include <stdbool.h>
#include <stdint.h>

#include "orbite/orbite.h"

struct orb_rdma_attempt {
    bool read;                 /* an RDMA READ (else a WRITE) */
    int status;                /* its first failure: a negative ORB_E* code (0: it succeeded) */
    bool qp_died;              /* a queue pair that carried it died (an error completion, a
                                * flush, a post refused on a dead queue pair), whatever the
                                * cause: the path, the device, a local error */
    bool acked;                /* the source's ACK came (its grant ended there) */
    bool payload_posted;       /* a payload work request of it may have reached the device (posted,
                                * or refused without proof that it was not taken) */
    uint32_t replays;          /* times it was asked again already */
    uint32_t max_replays;      /* read_replays */
    bool deadline_passed;      /* its batch's deadline is behind */
    bool stopping;             /* the transport is stopping */
};

struct orb_rdma_outcome {
    bool replay;               /* ask for a new grant and run it again */
    enum orb_remote_effect effect; /* when it ends: what it may have done at the source */
};

/* The outcome of finished attempt `a`. A READ repeats no effect at the source, so one that a
 * dying queue pair failed (ORB_EPEER; not a refusal of the source's authority, its ACK's status,
 * a deadline or a stop) is asked again while replays, time and the transport last; a WRITE never is (its
 * first attempt may have changed the source's bytes), and its effect is unknown once a payload
 * work request may have reached the device, whatever happened to the queue pair afterwards
 * (none while every one was refused with proof that it was not taken). A READ's
 * effect is always none. */
struct orb_rdma_outcome orb_rdma_attempt_outcome(const struct orb_rdma_attempt *a);

#endif
