/* Peer segments: a proven connection to one source epoch, with one peer per transport. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "error.h"
#include "log.h"

/* The order in which ORB_TRANSPORT_UNSPEC tries transports: the fastest path first. */
static const enum orb_transport unspec_preference[] = { ORB_TRANSPORT_NVLINK, ORB_TRANSPORT_SHM,
                                                        ORB_TRANSPORT_RDMA, ORB_TRANSPORT_TCP };

static const char *transport_name(enum orb_transport t)
{
    switch (t) {
    case ORB_TRANSPORT_TCP: return "TCP";
    case ORB_TRANSPORT_RDMA: return "RDMA";
    case ORB_TRANSPORT_NVLINK: return "NVLink";
    case ORB_TRANSPORT_SHM: return "same-host";
    default: return "unspecified";
    }
}

static void release_peers(orb_segment *segment)
{
    orb_engine *engine = segment->engine;
    for (unsigned i = ORB_TRANSPORT_SLOTS; i-- > 0;) {
        if (segment->peer[i] != NULL)
            engine->tp[i].ops->peer_release(segment->peer[i]);
        segment->peer[i] = NULL;
    }
}

ORB_EXPORT int orb_open_segment(orb_engine *engine, const char *endpoint,
                                const struct orb_epoch *expected, uint64_t timeout_ns,
                                orb_segment **out)
{
    if (engine == NULL || endpoint == NULL || expected == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_open_segment: engine, endpoint, expected and out are "
                                    "required (the expected epoch comes from the source's owner)");
    if (strnlen(endpoint, ORB_ENDPOINT_MAX) >= ORB_ENDPOINT_MAX)
        return orb_fail(ORB_EINVAL, "orb_open_segment: endpoint longer than %d bytes",
                        ORB_ENDPOINT_MAX - 1);
    if (!atomic_load(&engine->requester_open))
        return orb_fail(ORB_ECLOSED, "orb_open_segment: the requester side is closed");
    uint64_t deadline = orb_deadline_after(timeout_ns);
    orb_engine_reap(engine);

    orb_segment *segment = calloc(1, sizeof *segment);
    if (segment == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate a segment");
    atomic_init(&segment->refs, 1);
    segment->engine = engine;
    memcpy(segment->endpoint, endpoint, strlen(endpoint) + 1);
    segment->expected = *expected;
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++)
        segment->peer_status[i] = ORB_EUNAVAILABLE;

    /* TCP first: it proves the epoch and carries the other transports' handshakes. */
    const struct orb_tp_slot *tcp = &engine->tp[ORB_TRANSPORT_TCP];
    int rc = tcp->ops->peer_open(tcp->state, endpoint, expected, deadline, NULL,
                                 &segment->peer[ORB_TRANSPORT_TCP]);
    if (rc != 0) {
        free(segment);
        return orb_fail_wrap(rc, "cannot open segment %s", endpoint);
    }
    segment->peer_status[ORB_TRANSPORT_TCP] = 0;
    segment->control.peer = segment->peer[ORB_TRANSPORT_TCP];
    segment->control.call = tcp->ops->peer_control;
    segment->control.lost = tcp->ops->peer_lost;
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++) {
        const struct orb_tp_slot *t = &engine->tp[i];
        if (i == ORB_TRANSPORT_TCP || t->ops == NULL)
            continue;
        void *peer = NULL;
        rc = t->ops->peer_open(t->state, endpoint, expected, deadline, &segment->control, &peer);
        segment->peer_status[i] = rc;
        if (rc == 0)
            segment->peer[i] = peer;
        /* The epoch is wrong or the engine is closing: no transport may carry on. */
        if (rc == ORB_ESTALE || rc == ORB_ECLOSED) {
            rc = orb_fail_wrap(rc, "cannot open segment %s", endpoint);
            release_peers(segment);
            free(segment);
            return rc;
        }
        if (rc != 0) {
            snprintf(segment->peer_why[i], sizeof segment->peer_why[i], "%s", orb_last_error());
            ORB_LOGI("segment %s: no %s path (%s); requests use the others", endpoint,
                     t->ops->name, segment->peer_why[i]);
        }
    }
    orb_engine_ref(engine);
    *out = segment;
    return 0;
}

int orb_segment_pick(const struct orb_segment *segment, enum orb_transport requested,
                     unsigned *slot_out)
{
    if (requested == ORB_TRANSPORT_UNSPEC) {
        for (size_t k = 0; k < sizeof unspec_preference / sizeof unspec_preference[0]; k++) {
            unsigned i = (unsigned)unspec_preference[k];
            /* A transport that takes only some requests is chosen later, by orb_segment_prefer. */
            if (segment->peer[i] != NULL && segment->engine->tp[i].ops->peer_accepts == NULL) {
                *slot_out = i;
                return 0;
            }
        }
        return orb_fail(ORB_EUNAVAILABLE, "no transport has a path to %s", segment->endpoint);
    }
    if (requested != ORB_TRANSPORT_TCP && requested != ORB_TRANSPORT_RDMA &&
        requested != ORB_TRANSPORT_NVLINK && requested != ORB_TRANSPORT_SHM)
        return orb_fail(ORB_EINVAL, "unknown transport %d", (int)requested);
    unsigned i = (unsigned)requested;
    if (segment->peer[i] != NULL) {
        *slot_out = i;
        return 0;
    }
    const struct orb_tp_slot *t = &segment->engine->tp[i];
    if (t->ops == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "the %s transport is not available in this engine%s%s",
                        transport_name(requested), t->absent_why[0] != '\0' ? ": " : "",
                        t->absent_why);
    return orb_fail(ORB_EUNAVAILABLE, "the %s transport has no path to %s (%s: %s)",
                    transport_name(requested), segment->endpoint,
                    orb_strerror(segment->peer_status[i]), segment->peer_why[i]);
}

unsigned orb_segment_prefer(const struct orb_segment *segment, unsigned slot, const struct orb_reg *local, uint8_t op,
                            uint64_t remote_addr, uint64_t length, uint64_t deadline)
{
    for (size_t k = 0; k < sizeof unspec_preference / sizeof unspec_preference[0]; k++) {
        unsigned i = (unsigned)unspec_preference[k];
        if (i == slot)
            break;
        const struct orb_transport_ops *ops = segment->engine->tp[i].ops;
        if (segment->peer[i] != NULL && ops->peer_accepts != NULL &&
            ops->peer_accepts(segment->peer[i], op, local, remote_addr, length, deadline) == 1)
            return i;
    }
    return slot;
}

ORB_EXPORT int orb_segment_describe(orb_segment *segment, uint64_t timeout_ns,
                                    struct orb_region_desc **regions_out, size_t *count_out)
{
    if (segment == NULL || regions_out == NULL || count_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_segment_describe: NULL argument");
    if (!atomic_load(&segment->engine->requester_open))
        return orb_fail(ORB_ECLOSED, "orb_segment_describe: the requester side is closed");
    const struct orb_tp_slot *tcp = &segment->engine->tp[ORB_TRANSPORT_TCP];
    int rc = tcp->ops->peer_describe(segment->peer[ORB_TRANSPORT_TCP],
                                     orb_deadline_after(timeout_ns), regions_out, count_out);
    /* A dead peer may have been restarted: then the answer is ESTALE, as for transfers. */
    return rc == ORB_EPEER ? orb_segment_classify_failure(segment, rc) : rc;
}

ORB_EXPORT void orb_region_descs_free(struct orb_region_desc *regions)
{
    free(regions);
}

/* How long a dead peer's endpoint is asked for its epoch. */
#define ORB_STALE_PROBE_NS (500ull * 1000 * 1000)

int orb_segment_classify_failure(struct orb_segment *segment, int status)
{
    if (status != ORB_EPEER)
        return status;
    void *probe = NULL;
    const struct orb_tp_slot *tcp = &segment->engine->tp[ORB_TRANSPORT_TCP];
    int rc = tcp->ops->peer_open(tcp->state, segment->endpoint, &segment->expected,
                                 orb_deadline_after(ORB_STALE_PROBE_NS), NULL, &probe);
    if (rc == 0) {
        tcp->ops->peer_release(probe);
        return status;
    }
    if (rc == ORB_ESTALE)
        return orb_fail(ORB_ESTALE, "peer %s was restarted: it now runs another source epoch",
                        segment->endpoint);
    return status;
}

void orb_segment_ref(struct orb_segment *segment)
{
    atomic_fetch_add(&segment->refs, 1);
}

void orb_segment_unref(struct orb_segment *segment)
{
    if (segment == NULL || atomic_fetch_sub(&segment->refs, 1) != 1)
        return;
    orb_engine *engine = segment->engine;
    release_peers(segment);
    free(segment);
    orb_engine_unref(engine);
}

ORB_EXPORT void orb_segment_close(orb_segment *segment)
{
    orb_segment_unref(segment);
}
