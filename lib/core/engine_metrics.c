/* orb_engine_metrics(): the engine's counters and gauges as a struct, and as JSON. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/engine_internal.h"
#include "core/error.h"

/* The CUDA module's call, weak here: the engine core is also linked without that module. */
#pragma weak orb_cuda_retained_resources

ORB_EXPORT int orb_engine_metrics(const orb_engine *engine, struct orb_metrics *out)
{
    if (engine == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_metrics: NULL argument");
    orb_engine *e = (orb_engine *)engine;
    struct orb_metrics m;
    memset(&m, 0, sizeof m);
    orb_metrics_sum(&e->metrics, &m);
    m.registrations = orb_registry_count(e->registry);
    m.batches_live = atomic_load(&e->live_batches);
    pthread_mutex_lock(&e->lock); /* the notification queue's length: a read, not the data path */
    m.notifications_queued = e->notes_count;
    pthread_mutex_unlock(&e->lock);
    const struct orb_tp_slot *rdma = &e->tp[ORB_TRANSPORT_RDMA];
    if (rdma->ops != NULL && rdma->ops->stats != NULL && rdma->ops->stats(rdma->state, &m.rdma, sizeof m.rdma) == 0)
        m.comp_mask |= ORB_METRICS_RDMA;
    else
        memset(&m.rdma, 0, sizeof m.rdma);
    if (orb_cuda_retained_resources != NULL) /* absent from test builds without the CUDA module */
        (void)orb_cuda_retained_resources(&m.cuda_retained);
    *out = m;
    return 0;
}

/* ---- JSON ------------------------------------------------------------------------------------- */

static const char *const transport_name[ORB_METRICS_TRANSPORTS] = {"unspec", "tcp", "rdma", "nvlink", "shm"};

/* {"tcp": {"read": {...}, "write": {...}}, ...} for the transports with any count. */
static json_t *transfers_json(const struct orb_metrics_transfers t[ORB_METRICS_TRANSPORTS][2])
{
    json_t *o = json_object();
    for (unsigned k = 1; o != NULL && k < ORB_METRICS_TRANSPORTS; k++) {
        json_t *ops = json_pack("{s:{s:I,s:I,s:I},s:{s:I,s:I,s:I}}", "read", "requests",
                                (json_int_t)t[k][ORB_OP_READ].requests, "bytes", (json_int_t)t[k][ORB_OP_READ].bytes,
                                "failed", (json_int_t)t[k][ORB_OP_READ].failed, "write", "requests",
                                (json_int_t)t[k][ORB_OP_WRITE].requests, "bytes",
                                (json_int_t)t[k][ORB_OP_WRITE].bytes, "failed", (json_int_t)t[k][ORB_OP_WRITE].failed);
        if (ops == NULL || json_object_set_new(o, transport_name[k], ops) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *failures_json(const uint64_t failures[17])
{
    json_t *o = json_object();
    for (int s = 1; o != NULL && s < 17; s++) {
        if (failures[s] == 0)
            continue;
        if (json_object_set_new(o, orb_strerror(-s), json_integer((json_int_t)failures[s])) != 0) {
            json_decref(o);
            return NULL;
        }
    }
    return o;
}

static json_t *latency_json(const struct orb_metrics *m)
{
    json_t *bounds = json_array(), *counts = json_array();
    for (unsigned i = 0; bounds != NULL && counts != NULL && i < ORB_METRICS_LATENCY_BUCKETS; i++) {
        json_t *b = m->latency_bound_us[i] == UINT64_MAX ? json_null() : json_integer((json_int_t)m->latency_bound_us[i]);
        if (json_array_append_new(bounds, b) != 0 ||
            json_array_append_new(counts, json_integer((json_int_t)m->latency_buckets[i])) != 0)
            break;
    }
    json_t *o = json_pack("{s:o*,s:o*,s:I,s:I}", "bound_us", bounds, "buckets", counts, "sum_ns",
                          (json_int_t)m->latency_sum_ns, "batches", (json_int_t)m->batches);
    return o;
}

static json_t *rdma_json(const struct orb_rdma_stats *r)
{
    json_t *o = json_object();
#define RDMA(f) \
    if (o != NULL && json_object_set_new(o, #f, json_integer((json_int_t)r->f)) != 0) { \
        json_decref(o);                                                                 \
        o = NULL;                                                                       \
    }
    RDMA(nics_open) RDMA(rails) RDMA(helper) RDMA(completed_reads) RDMA(completed_writes) RDMA(payload_send_cqes)
    RDMA(errors) RDMA(registrations) RDMA(memory_regions) RDMA(registered_bytes) RDMA(kept_memory_regions)
    RDMA(requests_in_flight) RDMA(grants_active) RDMA(grants_served) RDMA(staging_bytes) RDMA(staged_transfers)
    RDMA(slot_deferrals) RDMA(deadline_drops) RDMA(reconnects) RDMA(connections) RDMA(source_connections)
    RDMA(rail_errors) RDMA(rail_open_pairs) RDMA(rail_probes) RDMA(rail_recoveries) RDMA(monitor_ticks)
    RDMA(route_queries) RDMA(route_recoveries) RDMA(routes_down) RDMA(kept_queue_pairs) RDMA(read_replays)
    RDMA(progress_recoveries) RDMA(dmabuf_registrations) RDMA(peermem_registrations) RDMA(staged_slots)
    RDMA(private_grants) RDMA(reuse_grants) RDMA(reuse_probe_failures) RDMA(kept_keys)
    RDMA(own_connection_grants) RDMA(grant_round_trips) RDMA(ack_messages)
#undef RDMA
    return o;
}

/* The RDMA NICs' load as an array (empty without RDMA). */
static json_t *nics_json(const orb_engine *engine)
{
    json_t *a = json_array();
    size_t count = 0;
    if (a == NULL || orb_engine_rdma_nic_load(engine, NULL, 0, &count) != 0 || count == 0)
        return a; /* no RDMA transport: no NICs */
    struct orb_rdma_nic_load *l = calloc(count, sizeof *l);
    if (l == NULL || orb_engine_rdma_nic_load(engine, l, count, &count) != 0)
        count = 0;
    for (size_t i = 0; i < count; i++) {
        json_t *n = json_pack("{s:i,s:s,s:i,s:b,s:b,s:I,s:I,s:f,s:f,s:I,s:I,s:I,s:I,s:I,s:I,s:I}", "rail",
                              (int)l[i].rail, "name", l[i].name, "port", (int)l[i].port, "healthy", (int)l[i].healthy,
                              "port_active", (int)l[i].port_active, "link_mbps", (json_int_t)l[i].link_mbps,
                              "effective_mbps", (json_int_t)l[i].effective_mbps, "selection_bps",
                              l[i].selection_bps, "transmit_bps", l[i].transmit_bps, "charged_bytes",
                              (json_int_t)l[i].charged_bytes, "posted_bytes", (json_int_t)l[i].posted_bytes,
                              "completed_bytes", (json_int_t)l[i].completed_bytes, "allocated_bytes",
                              (json_int_t)l[i].allocated_bytes, "rail_errors", (json_int_t)l[i].rail_errors,
                              "rail_probes", (json_int_t)l[i].rail_probes, "rail_open_pairs",
                              (json_int_t)l[i].rail_open_pairs);
        if (n == NULL || json_array_append_new(a, n) != 0) {
            json_decref(a);
            a = NULL;
            break;
        }
    }
    free(l);
    return a;
}

ORB_EXPORT int orb_engine_metrics_json(const orb_engine *engine, char *buf, size_t len, size_t *needed)
{
    if (engine == NULL || (buf == NULL && len > 0))
        return orb_fail(ORB_EINVAL, "orb_engine_metrics_json: NULL argument");
    struct orb_metrics m;
    int rc = orb_engine_metrics(engine, &m);
    if (rc != 0)
        return rc;
    const struct orb_cuda_retained *c = &m.cuda_retained;
    json_t *doc = json_pack(
        "{s:I,s:o*,s:I,s:o*,s:o*,s:o*,s:I,s:{s:I,s:I,s:I},s:o*,s:o*,s:{s:I,s:I,s:I,s:I,s:I,s:I}}", "uptime_ns",
        (json_int_t)m.uptime_ns, "requested", transfers_json(m.requested), "withdrawn_requests",
        (json_int_t)m.withdrawn_requests, "failures", failures_json(m.failures), "served",
        transfers_json(m.served), "batch_latency", latency_json(&m), "notifications_received",
        (json_int_t)m.notifications_received, "gauges", "registrations", (json_int_t)m.registrations, "batches_live",
        (json_int_t)m.batches_live, "notifications_queued", (json_int_t)m.notifications_queued, "rdma",
        (m.comp_mask & ORB_METRICS_RDMA) ? rdma_json(&m.rdma) : json_null(), "nics", nics_json(engine),
        "cuda_retained", "device_allocations", (json_int_t)c->device_allocations, "device_bytes",
        (json_int_t)c->device_bytes, "host_allocations", (json_int_t)c->host_allocations, "host_bytes",
        (json_int_t)c->host_bytes, "contexts", (json_int_t)c->contexts, "imports", (json_int_t)c->imports);
    if (doc == NULL)
        return orb_fail(ORB_ENOMEM, "orb_engine_metrics_json: no memory for the document");
    char *text = json_dumps(doc, JSON_COMPACT);
    json_decref(doc);
    if (text == NULL)
        return orb_fail(ORB_ENOMEM, "orb_engine_metrics_json: no memory for the text");
    size_t n = strlen(text) + 1;
    if (needed != NULL)
        *needed = n;
    if (n > len) {
        free(text);
        return buf == NULL ? 0 : orb_fail(ORB_EINVAL, "orb_engine_metrics_json: %zu bytes given, %zu needed", len, n);
    }
    memcpy(buf, text, n);
    free(text);
    return 0;
}
