/* What a failed RDMA request attempt leads to (see outcome.h). */
#include "rdma/outcome.h"

struct orb_rdma_outcome orb_rdma_attempt_outcome(const struct orb_rdma_attempt *a)
{
    struct orb_rdma_outcome o = {.replay = false, .effect = ORB_REMOTE_EFFECT_NONE};
    if (a->status == 0)
        return o;
    if (!a->read) {
        if (a->payload_posted)
            o.effect = ORB_REMOTE_EFFECT_UNKNOWN;
        return o;
    }
    /* ORB_EPEER is what a dead queue pair reports; anything else (the source's refusal or
     * status, a deadline, a closed transport) would only come back. */
    o.replay = a->status == ORB_EPEER && a->qp_died && !a->acked && a->replays < a->max_replays &&
               !a->deadline_passed && !a->stopping;
    return o;
}
