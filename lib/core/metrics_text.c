/* An engine's metrics in Prometheus's text exposition format (version 0.0.4). */
#include "core/metrics_text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* A growing text buffer; `failed` once an allocation failed (everything after is dropped). */
struct text {
    char *buf;
    size_t len, cap;
    int failed;
};

static void put(struct text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct text *t, const char *fmt, ...)
{
    if (t->failed)
        return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(t->buf + t->len, t->cap - t->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            t->failed = 1;
            return;
        }
        if ((size_t)n < t->cap - t->len) {
            t->len += (size_t)n;
            return;
        }
        size_t cap = t->cap * 2 + (size_t)n;
        char *grown = realloc(t->buf, cap);
        if (grown == NULL) {
            t->failed = 1;
            return;
        }
        t->buf = grown;
        t->cap = cap;
    }
}

static void head(struct text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static const char *const transport[ORB_METRICS_TRANSPORTS] = {"unspec", "tcp", "rdma", "nvlink", "shm"};
static const char *const opname[2] = {"read", "write"};
/* ORB_E* names by -status, for labels. */
static const char *const status_name[17] = {
    "OK", "EINVAL", "ECONFIG", "EUNAVAILABLE", "EPERM", "ENOENT", "EEXIST", "EBUSY", "ERESOURCE",
    "ETIMEDOUT", "ESTALE", "EPEER", "EPROTO", "EUNQUIESCED", "ECLOSED", "ENOMEM", "EAGAIN",
};

/* One counter family over the transport x op table; `which` 0 requests, 1 bytes, 2 failed. */
static void transfers(struct text *t, const char *name, const char *help,
                      const struct orb_metrics_transfers tab[ORB_METRICS_TRANSPORTS][2], int which)
{
    head(t, name, "counter", help);
    for (unsigned k = 1; k < ORB_METRICS_TRANSPORTS; k++)
        for (unsigned op = 0; op < 2; op++) {
            const struct orb_metrics_transfers *x = &tab[k][op];
            uint64_t v = which == 0 ? x->requests : which == 1 ? x->bytes : x->failed;
            put(t, "%s{transport=\"%s\",op=\"%s\"} %llu\n", name, transport[k], opname[op], (unsigned long long)v);
        }
}

static void scalar(struct text *t, const char *name, const char *type, const char *help, uint64_t v)
{
    head(t, name, type, help);
    put(t, "%s %llu\n", name, (unsigned long long)v);
}

/* Prometheus label values escape backslash, quote and newline. */
static void label_value(char *out, size_t cap, const char *in)
{
    size_t o = 0;
    for (; *in != '\0' && o + 3 < cap; in++) {
        if (*in == '\\' || *in == '"') {
            out[o++] = '\\';
            out[o++] = *in;
        } else if (*in == '\n') {
            out[o++] = '\\';
            out[o++] = 'n';
        } else {
            out[o++] = *in;
        }
    }
    out[o] = '\0';
}

static void rdma_text(struct text *t, const struct orb_rdma_stats *r)
{
    struct row {
        const char *name, *type, *help;
        uint64_t v;
    } rows[] = {
        {"orbite_rdma_nics_open", "gauge", "NICs the RDMA transport opened.", r->nics_open},
        {"orbite_rdma_rails", "gauge", "NICs that carry requests.", r->rails},
        {"orbite_helper_up", "gauge", "1 when the RDMA transport's NICs came through orbite-helper.", r->helper},
        {"orbite_rdma_completed_reads_total", "counter", "READ work requests completed.", r->completed_reads},
        {"orbite_rdma_completed_writes_total", "counter", "WRITE work requests completed.", r->completed_writes},
        {"orbite_rdma_payload_send_cqes_total", "counter", "Payload completions received.", r->payload_send_cqes},
        {"orbite_rdma_errors_total", "counter", "Work completions in error and refused posts.", r->errors},
        {"orbite_rdma_registrations", "gauge", "Registrations holding memory regions.", r->registrations},
        {"orbite_rdma_memory_regions", "gauge", "Memory regions across NICs.", r->memory_regions},
        {"orbite_rdma_registered_bytes", "gauge", "Bytes of those registrations.", r->registered_bytes},
        {"orbite_rdma_kept_memory_regions_total", "counter", "Memory regions a NIC refused to deregister.",
         r->kept_memory_regions},
        {"orbite_rdma_requests_in_flight", "gauge", "Requester side requests in flight.", r->requests_in_flight},
        {"orbite_rdma_grants_active", "gauge", "Source side grants published and not ended.", r->grants_active},
        {"orbite_rdma_grants_served_total", "counter", "Source side grants ended and acknowledged.", r->grants_served},
        {"orbite_rdma_staging_bytes", "gauge", "Staging in use.", r->staging_bytes},
        {"orbite_rdma_staged_transfers_total", "counter", "Requests and grants moved through staging.",
         r->staged_transfers},
        {"orbite_rdma_slot_deferrals_total", "counter", "Posts a shared priority slot held back.", r->slot_deferrals},
        {"orbite_rdma_deadline_drops_total", "counter", "Requests dropped before dispatch for their deadline.",
         r->deadline_drops},
        {"orbite_rdma_reconnects_total", "counter", "Requester connections rebuilt.", r->reconnects},
        {"orbite_rdma_connections", "gauge", "Requester connections.", r->connections},
        {"orbite_rdma_source_connections", "gauge", "Requester connections served.", r->source_connections},
        {"orbite_rdma_rail_errors_total", "counter", "Failed attempts charged to a rail pair.", r->rail_errors},
        {"orbite_rdma_rail_open_pairs", "gauge", "Rail pairs paused by errors.", r->rail_open_pairs},
        {"orbite_rdma_rail_probes_total", "counter", "Half-open trials on paused pairs.", r->rail_probes},
        {"orbite_rdma_rail_recoveries_total", "counter", "Trials that brought a pair back.", r->rail_recoveries},
        {"orbite_rdma_monitor_ticks_total", "counter", "Scans of the RDMA monitor.", r->monitor_ticks},
        {"orbite_rdma_route_queries_total", "counter", "Port states queried.", r->route_queries},
        {"orbite_rdma_route_recoveries_total", "counter", "Rails whose port came back.", r->route_recoveries},
        {"orbite_rdma_routes_down", "gauge", "Rails whose port is not active.", r->routes_down},
        {"orbite_rdma_kept_queue_pairs_total", "counter", "Queue pairs the device refused to destroy.",
         r->kept_queue_pairs},
        {"orbite_rdma_read_replays_total", "counter", "READs asked again after their queue pair died.",
         r->read_replays},
        {"orbite_rdma_progress_recoveries_total", "counter", "Lanes whose completion queues were replaced.",
         r->progress_recoveries},
        {"orbite_rdma_dmabuf_registrations_total", "counter", "Device registrations made by dma-buf.",
         r->dmabuf_registrations},
        {"orbite_rdma_peermem_registrations_total", "counter", "Device registrations through peer memory.",
         r->peermem_registrations},
        {"orbite_rdma_staged_slots_total", "counter", "Slots after a request's first, for staged requests.",
         r->staged_slots},
        {"orbite_rdma_private_grants_total", "counter", "Private grants ended and acknowledged.", r->private_grants},
        {"orbite_rdma_reuse_grants_total", "counter", "Device grants served by DevX keys.", r->reuse_grants},
        {"orbite_rdma_reuse_probe_failures_total", "counter", "Registrations that failed the reuse probe.",
         r->reuse_probe_failures},
        {"orbite_rdma_kept_keys_total", "counter", "DevX keys the device refused to destroy.", r->kept_keys},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        scalar(t, rows[i].name, rows[i].type, rows[i].help, rows[i].v);
}

static void nics_text(struct text *t, const struct orb_rdma_nic_load *l, size_t n)
{
    struct col {
        const char *name, *type, *help;
        size_t off;
        int is_double, is_u32;
    } cols[] = {
#define U64(f) offsetof(struct orb_rdma_nic_load, f), 0, 0
#define U32(f) offsetof(struct orb_rdma_nic_load, f), 0, 1
#define DBL(f) offsetof(struct orb_rdma_nic_load, f), 1, 0
        {"orbite_nic_healthy", "gauge", "1 while slices may be placed on the NIC.", U32(healthy)},
        {"orbite_nic_port_active", "gauge", "1 while the monitor finds its port active.", U32(port_active)},
        {"orbite_nic_link_rate_bytes_per_second", "gauge", "The port's rate as the device reports it.",
         U64(link_mbps)},
        {"orbite_nic_effective_rate_bytes_per_second", "gauge", "The rate the estimates start from.",
         U64(effective_mbps)},
        {"orbite_nic_selection_rate_bytes_per_second", "gauge", "The estimate slices are scored with.",
         DBL(selection_bps)},
        {"orbite_nic_transmit_rate_bytes_per_second", "gauge", "The estimate measured from busy periods.",
         DBL(transmit_bps)},
        {"orbite_nic_charged_bytes", "gauge", "Bytes of dispatched slices not completed.", U64(charged_bytes)},
        {"orbite_nic_posted_bytes", "gauge", "Payload posted to the NIC and not completed.", U64(posted_bytes)},
        {"orbite_nic_completed_bytes_total", "counter", "Payload completed.", U64(completed_bytes)},
        {"orbite_nic_allocated_bytes_total", "counter", "Bytes the selector placed on the NIC.", U64(allocated_bytes)},
        {"orbite_nic_rail_errors_total", "counter", "Failed attempts charged to its pairs.", U64(rail_errors)},
        {"orbite_nic_rail_probes_total", "counter", "Half-open trials posted on it.", U64(rail_probes)},
        {"orbite_nic_rail_open_pairs", "gauge", "Its pairs paused by errors.", U64(rail_open_pairs)},
#undef U64
#undef U32
#undef DBL
    };
    for (size_t c = 0; c < sizeof cols / sizeof cols[0]; c++) {
        head(t, cols[c].name, cols[c].type, cols[c].help);
        for (size_t i = 0; i < n; i++) {
            char name[sizeof l[i].name * 2 + 1];
            label_value(name, sizeof name, l[i].name);
            const char *p = (const char *)&l[i] + cols[c].off;
            /* The rates the struct keeps in Mbit/s go out in bytes per second. */
            if (cols[c].is_double) {
                double v;
                memcpy(&v, p, sizeof v);
                put(t, "%s{nic=\"%s\",rail=\"%u\"} %.17g\n", cols[c].name, name, l[i].rail, v);
            } else if (cols[c].is_u32) {
                uint32_t v;
                memcpy(&v, p, sizeof v);
                put(t, "%s{nic=\"%s\",rail=\"%u\"} %u\n", cols[c].name, name, l[i].rail, v);
            } else {
                uint64_t v;
                memcpy(&v, p, sizeof v);
                if (strstr(cols[c].name, "rate_bytes") != NULL)
                    v = v * 1000000u / 8u;
                put(t, "%s{nic=\"%s\",rail=\"%u\"} %llu\n", cols[c].name, name, l[i].rail, (unsigned long long)v);
            }
        }
    }
}

int orb_metrics_prometheus(const orb_engine *engine, char **text_out, size_t *len_out)
{
    struct orb_metrics m;
    int rc = orb_engine_metrics(engine, &m);
    if (rc != 0)
        return rc;
    struct text t = {.buf = malloc(16384), .cap = 16384};
    if (t.buf == NULL)
        return orb_fail(ORB_ENOMEM, "metrics: no memory for the text");
    scalar(&t, "orbite_uptime_seconds", "gauge", "Seconds since the engine was created.", m.uptime_ns / 1000000000u);
    transfers(&t, "orbite_requests_total", "This engine's requests that completed, by transport and operation.",
              m.requested, 0);
    transfers(&t, "orbite_request_bytes_total", "Bytes of this engine's requests that completed.", m.requested, 1);
    transfers(&t, "orbite_request_failures_total", "This engine's requests that failed.", m.requested, 2);
    scalar(&t, "orbite_withdrawn_requests_total", "counter", "Requests withdrawn before they started.",
           m.withdrawn_requests);
    head(&t, "orbite_failures_total", "counter", "This engine's failed requests by status.");
    for (unsigned s = 1; s < 17; s++)
        put(&t, "orbite_failures_total{status=\"ORB_%s\"} %llu\n", status_name[s], (unsigned long long)m.failures[s]);
    transfers(&t, "orbite_served_requests_total", "Peers' requests this engine's source served.", m.served, 0);
    transfers(&t, "orbite_served_bytes_total", "Bytes of peers' requests this engine's source served.", m.served, 1);
    transfers(&t, "orbite_served_failures_total", "Peers' requests (or pieces) refused or failed at this source.",
              m.served, 2);
    head(&t, "orbite_batch_duration_seconds", "histogram",
         "Batches from their first submission until every request ended.");
    uint64_t running = 0;
    for (unsigned i = 0; i < ORB_METRICS_LATENCY_BUCKETS; i++) {
        running += m.latency_buckets[i];
        if (m.latency_bound_us[i] == UINT64_MAX)
            put(&t, "orbite_batch_duration_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)running);
        else
            put(&t, "orbite_batch_duration_seconds_bucket{le=\"%g\"} %llu\n", (double)m.latency_bound_us[i] / 1e6,
                (unsigned long long)running);
    }
    put(&t, "orbite_batch_duration_seconds_sum %.9f\n", (double)m.latency_sum_ns / 1e9);
    put(&t, "orbite_batch_duration_seconds_count %llu\n", (unsigned long long)m.batches);
    scalar(&t, "orbite_notifications_received_total", "counter", "Notifications delivered to this source.",
           m.notifications_received);
    scalar(&t, "orbite_registrations", "gauge", "Published registrations.", m.registrations);
    scalar(&t, "orbite_batches_live", "gauge", "Open batches.", m.batches_live);
    scalar(&t, "orbite_notifications_queued", "gauge", "Notifications received and not yet polled.",
           m.notifications_queued);
    if (m.comp_mask & ORB_METRICS_RDMA) {
        rdma_text(&t, &m.rdma);
        size_t n = 0;
        struct orb_rdma_nic_load *l = NULL;
        if (orb_engine_rdma_nic_load(engine, NULL, 0, &n) == 0 && n > 0 && (l = calloc(n, sizeof *l)) != NULL &&
            orb_engine_rdma_nic_load(engine, l, n, &n) == 0)
            nics_text(&t, l, n);
        free(l);
    } else {
        scalar(&t, "orbite_helper_up", "gauge", "1 when the RDMA transport's NICs came through orbite-helper.", 0);
    }
    const struct orb_cuda_retained *c = &m.cuda_retained;
    scalar(&t, "orbite_cuda_retained_device_allocations", "gauge", "Device allocations whose free failed.",
           c->device_allocations);
    scalar(&t, "orbite_cuda_retained_device_bytes", "gauge", "Their bytes.", c->device_bytes);
    scalar(&t, "orbite_cuda_retained_host_allocations", "gauge", "Pinned host allocations whose free failed.",
           c->host_allocations);
    scalar(&t, "orbite_cuda_retained_host_bytes", "gauge", "Their bytes.", c->host_bytes);
    scalar(&t, "orbite_cuda_retained_contexts", "gauge", "Primary context references kept.", c->contexts);
    scalar(&t, "orbite_cuda_retained_imports", "gauge", "Peers' allocations whose IPC mapping could not be closed.",
           c->imports);
    if (t.failed) {
        free(t.buf);
        return orb_fail(ORB_ENOMEM, "metrics: no memory for the text");
    }
    *text_out = t.buf;
    *len_out = t.len;
    return 0;
}
