/* Peer segments: a proven connection to one source epoch. */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "engine_internal.h"
#include "error.h"

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
    segment->tp = engine->tcp;
    memcpy(segment->endpoint, endpoint, strlen(endpoint) + 1);
    segment->expected = *expected;
    int rc = segment->tp->peer_open(engine->tcp_state, endpoint, expected, deadline, &segment->peer);
    if (rc != 0) {
        free(segment);
        return orb_fail_wrap(rc, "cannot open segment %s", endpoint);
    }
    orb_engine_ref(engine);
    *out = segment;
    return 0;
}

ORB_EXPORT int orb_segment_describe(orb_segment *segment, uint64_t timeout_ns,
                                    struct orb_region_desc **regions_out, size_t *count_out)
{
    if (segment == NULL || regions_out == NULL || count_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_segment_describe: NULL argument");
    if (!atomic_load(&segment->engine->requester_open))
        return orb_fail(ORB_ECLOSED, "orb_segment_describe: the requester side is closed");
    int rc = segment->tp->peer_describe(segment->peer, orb_deadline_after(timeout_ns), regions_out,
                                        count_out);
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
    orb_engine *engine = segment->engine;
    int rc = segment->tp->peer_open(engine->tcp_state, segment->endpoint, &segment->expected,
                                    orb_deadline_after(ORB_STALE_PROBE_NS), &probe);
    if (rc == 0) {
        segment->tp->peer_release(probe);
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
    segment->tp->peer_release(segment->peer);
    free(segment);
    orb_engine_unref(engine);
}

ORB_EXPORT void orb_segment_close(orb_segment *segment)
{
    orb_segment_unref(segment);
}
