/* The engine: configuration, source epoch, registrations, transports, close and drain. */
#include "engine_internal.h"
#include "stager.h"
#include "cpus.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "config.h"
#include "error.h"
#include "log.h"
#include "metrics_http.h"
#include "memory.h"
#include "random.h"
#include "rdma_config.h"

/* Default deadline orb_engine_free() gives a close the caller did not make. */
#define ORB_FREE_CLOSE_TIMEOUT_NS (10ull * ORB_NS_PER_SEC)

static int engine_create(const struct orb_engine_config *cfg, const struct orb_rdma_config *rdma,
                         const struct orb_transport_ops *const *ops, size_t n, orb_engine **out);

/* The transports of this release. */
static const struct orb_transport_ops *const builtin_transports[] = { &orb_tcp_transport,
                                                                     &orb_rdma_transport,
                                                                     &orb_nvlink_transport,
                                                                     &orb_shm_transport };
#define BUILTIN_COUNT (sizeof builtin_transports / sizeof builtin_transports[0])

ORB_EXPORT int orb_engine_create(const struct orb_engine_config *cfg, orb_engine **out)
{
    return engine_create(cfg, NULL, builtin_transports, BUILTIN_COUNT, out);
}

#define KNOWN_PARAMS (ORB_ENGINE_PARAM_CONFIG | ORB_ENGINE_PARAM_RDMA | ORB_ENGINE_PARAM_METRICS)

ORB_EXPORT int orb_engine_create_params(const struct orb_engine_params *params, orb_engine **out)
{
    if (params == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_create_params: params and out must not be NULL");
    if ((params->field_mask & ~(uint64_t)KNOWN_PARAMS) != 0)
        return orb_fail(ORB_EINVAL, "orb_engine_create_params: field_mask bits 0x%llx are "
                        "unknown to this library",
                        (unsigned long long)(params->field_mask & ~(uint64_t)KNOWN_PARAMS));
    struct orb_engine_config defaults;
    const struct orb_engine_config *cfg = NULL;
    if (params->field_mask & ORB_ENGINE_PARAM_CONFIG)
        cfg = params->config;
    if (cfg == NULL) {
        orb_engine_config_init(&defaults);
        cfg = &defaults;
    }
    const struct orb_rdma_config *rdma = NULL;
    if (params->field_mask & ORB_ENGINE_PARAM_RDMA)
        rdma = params->rdma;
    orb_engine *engine = NULL;
    int rc = engine_create(cfg, rdma, builtin_transports, BUILTIN_COUNT, &engine);
    if (rc != 0)
        return rc;
    if (params->field_mask & ORB_ENGINE_PARAM_METRICS) {
        const char *address = params->metrics_address;
        struct orb_metrics_http *h = NULL;
        rc = orb_metrics_http_start(engine, address != NULL && address[0] != '\0' ? address : "127.0.0.1:0", &h);
        if (rc != 0) {
            char why[256];
            snprintf(why, sizeof why, "%s", orb_last_error());
            orb_engine_free(engine);
            return orb_fail(rc, "%s", why);
        }
        atomic_store(&engine->http, h);
    }
    *out = engine;
    return 0;
}

ORB_EXPORT int orb_engine_metrics_address(const orb_engine *engine, char *buf, size_t len)
{
    if (engine == NULL || buf == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "orb_engine_metrics_address: NULL argument or empty buffer");
    struct orb_metrics_http *h = atomic_load(&((orb_engine *)engine)->http);
    if (h == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "this engine serves no metrics over HTTP (ORB_ENGINE_PARAM_METRICS was "
                        "not set, or it was closed)");
    const char *a = orb_metrics_http_address(h);
    if (strlen(a) >= len)
        return orb_fail(ORB_EINVAL, "orb_engine_metrics_address: %zu bytes given, %zu needed", len, strlen(a) + 1);
    memcpy(buf, a, strlen(a) + 1);
    return 0;
}

/* Stop serving metrics over HTTP (once: whoever takes the server stops it). */
static void stop_exporter(orb_engine *engine)
{
    orb_metrics_http_stop(atomic_exchange(&engine->http, NULL));
}

/* Registration hooks: every started transport that keeps registration state attaches it. */
static int engine_reg_retire(void *ctx, struct orb_reg *reg)
{
    orb_engine *engine = ctx;
    int kept = 0;
    for (unsigned i = ORB_TRANSPORT_SLOTS; i-- > 0;) {
        const struct orb_tp_slot *t = &engine->tp[i];
        if (reg->tp_state[i] != NULL && t->ops != NULL && t->ops->reg_retire != NULL &&
            t->ops->reg_retire(t->state, reg, reg->tp_state[i]) != 0) {
            ORB_LOGE("the %s transport could not retire all of [0x%llx, +%llu) (%s): its bytes "
                     "stay referenced for the process's lifetime",
                     t->ops->name, (unsigned long long)reg->base, (unsigned long long)reg->len,
                     orb_last_error());
            kept = 1;
        }
        reg->tp_state[i] = NULL;
    }
    return kept ? ORB_EBUSY : 0;
}

static int engine_reg_attach(void *ctx, struct orb_reg *reg)
{
    orb_engine *engine = ctx;
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++) {
        const struct orb_tp_slot *t = &engine->tp[i];
        if (t->ops == NULL || t->ops->reg_attach == NULL)
            continue;
        void *state = NULL;
        int rc = t->ops->reg_attach(t->state, reg, &state);
        if (rc != 0) {
            rc = orb_fail_wrap(rc, "the %s transport cannot register [0x%llx, +%llu)", t->ops->name,
                               (unsigned long long)reg->base, (unsigned long long)reg->len);
            char detail[256];
            snprintf(detail, sizeof detail, "%s", orb_last_error());
            /* Undo what the others attached; what cannot be undone keeps the bytes. */
            if (engine_reg_retire(engine, reg) != 0)
                orb_reg_keep_owner(reg);
            return orb_fail(rc, "%s", detail);
        }
        reg->tp_state[i] = state;
        if (state != NULL && t->ops->reg_gpu_routes != NULL)
            reg->gpu_routes |= t->ops->reg_gpu_routes(t->state, reg, state);
    }
    return 0;
}

/* Stop every started transport, last slot first (each one, whatever the others answer). 0 when
 * all proved quiescence, else ORB_EUNQUIESCED naming the first that did not. */
static int stop_transports(orb_engine *engine, uint64_t deadline)
{
    int rc = 0;
    char why[320] = "";
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++)
        if (engine->tp[i].ops != NULL && engine->tp[i].ops->abandon_calls != NULL)
            engine->tp[i].ops->abandon_calls(engine->tp[i].state);
    for (unsigned i = ORB_TRANSPORT_SLOTS; i-- > 0;) {
        if (engine->tp[i].ops == NULL)
            continue;
        int st = engine->tp[i].ops->stop(engine->tp[i].state, deadline);
        if (st != 0 && rc == 0) {
            rc = ORB_EUNQUIESCED;
            snprintf(why, sizeof why, "the %s transport: %s", engine->tp[i].ops->name, orb_last_error());
        }
    }
    return rc == 0 ? 0 : orb_fail(rc, "%s", why);
}

static void destroy_transports(orb_engine *engine)
{
    for (unsigned i = ORB_TRANSPORT_SLOTS; i-- > 0;) {
        if (engine->tp[i].ops != NULL)
            engine->tp[i].ops->destroy(engine->tp[i].state);
        engine->tp[i].ops = NULL;
        engine->tp[i].state = NULL;
    }
}

static int start_transports(orb_engine *engine, const struct orb_transport_ops *const *ops,
                            size_t n)
{
    for (size_t k = 0; k < n; k++) {
        const struct orb_transport_ops *t = ops[k];
        unsigned id = (unsigned)t->id;
        if (id == 0 || id >= ORB_TRANSPORT_SLOTS || engine->tp[id].ops != NULL)
            return orb_fail(ORB_EINVAL, "transport table %s has a bad or repeated id %u", t->name, id);
        void *state = NULL;
        int rc = t->start(engine, &state);
        if (rc == ORB_TP_NOT_HERE && t->id != ORB_TRANSPORT_TCP) {
            ORB_LOGI("the %s transport is not available on this host: %s", t->name,
                     orb_last_error());
            snprintf(engine->tp[id].absent_why, sizeof engine->tp[id].absent_why, "%s",
                     orb_last_error());
            continue;
        }
        if (rc == ORB_TP_NOT_HERE)
            rc = ORB_EUNAVAILABLE;
        if (rc != 0)
            return orb_fail_wrap(rc, "cannot start the %s transport", t->name);
        /* Published under the lock: the TCP workers already run and may read the slots
         * (orb_engine_control) while later transports start. */
        pthread_mutex_lock(&engine->lock);
        engine->tp[id].ops = t;
        engine->tp[id].state = state;
        pthread_mutex_unlock(&engine->lock);
    }
    if (engine->tp[ORB_TRANSPORT_TCP].ops == NULL)
        return orb_fail(ORB_EINVAL, "an engine needs the TCP transport (its control connection)");
    return 0;
}

int orb_engine_create_with(const struct orb_engine_config *cfg, const struct orb_rdma_config *rdma,
                           const struct orb_transport_ops *const *ops, size_t n, orb_engine **out)
{
    return engine_create(cfg, rdma, ops, n, out);
}

static int engine_create(const struct orb_engine_config *cfg, const struct orb_rdma_config *rdma,
                         const struct orb_transport_ops *const *ops, size_t n, orb_engine **out)
{
    if (cfg == NULL || out == NULL || ops == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "orb_engine_create: cfg and out must not be NULL");
    int rc = orb_engine_config_validate(cfg);
    if (rc != 0)
        return rc;
    if (rdma != NULL && (rc = orb_rdma_config_check(rdma)) != 0)
        return rc;

    orb_engine *engine = calloc(1, sizeof *engine);
    if (engine == NULL)
        return orb_fail(ORB_ENOMEM, "cannot allocate the engine");
    engine->cfg = *cfg;
    if (rdma != NULL) {
        rc = orb_rdma_config_dup(rdma, &engine->rdma_cfg);
        if (rc != 0)
            goto free_engine;
    }
    atomic_init(&engine->refs, 1);
    atomic_init(&engine->source_open, cfg->enable_source ? 1 : 0);
    atomic_init(&engine->requester_open, 1);
    atomic_init(&engine->live_batches, 0);
    atomic_init(&engine->http, NULL);
    orb_metrics_init(&engine->metrics);
    unsigned cpus = orb_usable_cpus();
    engine->spin_allowed = cfg->busy_poll_us > 0 && cfg->tcp_workers + 1 <= cpus;
    engine->poll_allowed = cfg->busy_poll_us > 0 && cpus >= 2;
    if (pthread_mutex_init(&engine->lock, NULL) != 0) {
        rc = orb_fail(ORB_ENOMEM, "cannot initialise the engine lock");
        goto free_engine;
    }
    rc = orb_random_bytes(engine->epoch.bytes, sizeof engine->epoch.bytes);
    if (rc != 0)
        goto destroy_lock;
    rc = orb_reaper_new(&engine->reaper);
    if (rc != 0)
        goto destroy_lock;
    /* Registrations without transport state (TCP's) never reach the hooks' retire. */
    engine->reg_hooks.ctx = engine;
    engine->reg_hooks.attach = engine_reg_attach;
    engine->reg_hooks.retire = engine_reg_retire;
    rc = orb_registry_new(cfg->max_registrations, engine->reaper, &engine->reg_hooks,
                          &engine->registry);
    if (rc != 0)
        goto free_reaper;
    rc = orb_stage_pool_new(ORB_STAGE_CHUNK, ORB_STAGE_POOL_BYTES, ORB_STAGE_SOURCE_RESERVE, &engine->stage_pool);
    if (rc != 0)
        goto free_registry;
    rc = start_transports(engine, ops, n);
    if (rc != 0)
        goto undo_transports;
    *out = engine;
    return 0;

undo_transports:
    {
        char why[256];
        snprintf(why, sizeof why, "%s", orb_last_error());
        /* Nothing was submitted yet: the started transports stop at once. */
        if (stop_transports(engine, orb_deadline_after(ORB_FREE_CLOSE_TIMEOUT_NS)) != 0)
            ORB_LOGE("engine creation failed and a transport did not stop cleanly: %s", orb_last_error());
        (void)orb_fail(rc, "%s", why);
    }
    destroy_transports(engine);
    orb_stage_pool_free(engine->stage_pool);
free_registry:
    orb_registry_free(engine->registry);
free_reaper:
    orb_reaper_free(engine->reaper);
destroy_lock:
    pthread_mutex_destroy(&engine->lock);
free_engine:
    orb_rdma_config_free(engine->rdma_cfg);
    free(engine);
    return rc;
}

const struct orb_engine_config *orb_engine_cfg(const orb_engine *engine)
{
    return &engine->cfg;
}

struct orb_registry *orb_engine_registry(orb_engine *engine)
{
    return engine->registry;
}

const struct orb_rdma_config *orb_engine_rdma_config(const orb_engine *engine)
{
    return engine->rdma_cfg;
}

const struct orb_epoch *orb_engine_epoch(const orb_engine *engine)
{
    return &engine->epoch;
}

int orb_engine_source_open(const orb_engine *engine)
{
    return atomic_load(&engine->source_open);
}

ORB_EXPORT int orb_engine_endpoint(const orb_engine *engine, char *buf, size_t len)
{
    if (engine == NULL || buf == NULL || len == 0)
        return orb_fail(ORB_EINVAL, "orb_engine_endpoint: NULL argument or empty buffer");
    if (!engine->cfg.enable_source)
        return orb_fail(ORB_EUNAVAILABLE, "this engine has no source service (enable_source is off)");
    const struct orb_tp_slot *tcp = &engine->tp[ORB_TRANSPORT_TCP];
    return tcp->ops->endpoint(tcp->state, buf, len);
}

ORB_EXPORT int orb_engine_rdma_stats(const orb_engine *engine, struct orb_rdma_stats *out)
{
    if (engine == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_rdma_stats: NULL argument");
    const struct orb_tp_slot *t = &engine->tp[ORB_TRANSPORT_RDMA];
    if (t->ops == NULL || t->ops->stats == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "this engine runs no RDMA transport%s%s",
                        t->absent_why[0] != '\0' ? ": " : "", t->absent_why);
    return t->ops->stats(t->state, out, sizeof *out);
}

ORB_EXPORT int orb_engine_rdma_nic_load(const orb_engine *engine, struct orb_rdma_nic_load *out, size_t cap,
                                        size_t *count)
{
    if (engine == NULL || count == NULL || (out == NULL && cap > 0))
        return orb_fail(ORB_EINVAL, "orb_engine_rdma_nic_load: NULL argument");
    const struct orb_tp_slot *t = &engine->tp[ORB_TRANSPORT_RDMA];
    if (t->ops == NULL || t->ops->nic_load == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "this engine runs no RDMA transport%s%s",
                        t->absent_why[0] != '\0' ? ": " : "", t->absent_why);
    return t->ops->nic_load(t->state, out, cap, count);
}

ORB_EXPORT int orb_engine_source_epoch(const orb_engine *engine, struct orb_epoch *out)
{
    if (engine == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_source_epoch: NULL argument");
    *out = engine->epoch;
    return 0;
}

void orb_engine_count_served(orb_engine *engine, unsigned tp, unsigned op, uint64_t bytes, int ends, int status)
{
    if (engine != NULL)
        orb_metrics_served(&engine->metrics, tp, op, bytes, ends, status);
}

int orb_engine_deliver_notification(orb_engine *engine, const struct orb_epoch *sender,
                                    const uint8_t *data, uint32_t len)
{
    if (len == 0 || len > ORB_NOTIFY_MAX)
        return orb_fail(ORB_EINVAL, "notification length %u outside 1..%u", len, ORB_NOTIFY_MAX);
    if (!atomic_load(&engine->source_open))
        return orb_fail(ORB_ECLOSED, "the source is closed");
    struct orb_notification_node *node = malloc(sizeof *node);
    if (node == NULL)
        return orb_fail(ORB_ENOMEM, "cannot queue a notification");
    node->next = NULL;
    node->msg.sender = *sender;
    node->msg.length = len;
    memcpy(node->msg.data, data, len);

    pthread_mutex_lock(&engine->lock);
    if (engine->notes_count >= engine->cfg.max_notifications) {
        pthread_mutex_unlock(&engine->lock);
        free(node);
        return orb_fail(ORB_ERESOURCE, "notification queue full (max_notifications=%u)",
                        engine->cfg.max_notifications);
    }
    orb_metrics_notification(&engine->metrics);
    if (engine->notes_tail != NULL)
        engine->notes_tail->next = node;
    else
        engine->notes_head = node;
    engine->notes_tail = node;
    engine->notes_count++;
    pthread_mutex_unlock(&engine->lock);
    return 0;
}

int orb_engine_control(orb_engine *engine, uint8_t transport, const struct orb_epoch *sender,
                       const uint8_t *req, size_t len, uint8_t *resp, size_t cap, size_t *resp_len)
{
    if (transport == ORB_TRANSPORT_TCP || transport >= ORB_TRANSPORT_SLOTS)
        return orb_fail(ORB_EINVAL, "control message for transport %u", (unsigned)transport);
    if (!atomic_load(&engine->source_open))
        return orb_fail(ORB_ECLOSED, "the source is closed");
    pthread_mutex_lock(&engine->lock);
    const struct orb_transport_ops *ops = engine->tp[transport].ops;
    void *state = engine->tp[transport].state;
    pthread_mutex_unlock(&engine->lock);
    if (ops == NULL || ops->control == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "this engine runs no transport %u that takes control messages",
                        (unsigned)transport);
    return ops->control(state, sender, req, len, resp, cap, resp_len);
}

ORB_EXPORT int orb_engine_poll_notifications(orb_engine *engine, struct orb_notification_msg *out,
                                             size_t cap, size_t *count_out)
{
    if (engine == NULL || count_out == NULL || (out == NULL && cap > 0))
        return orb_fail(ORB_EINVAL, "orb_engine_poll_notifications: NULL argument");
    size_t moved = 0;
    pthread_mutex_lock(&engine->lock);
    while (moved < cap && engine->notes_head != NULL) {
        struct orb_notification_node *node = engine->notes_head;
        engine->notes_head = node->next;
        if (engine->notes_head == NULL)
            engine->notes_tail = NULL;
        engine->notes_count--;
        out[moved++] = node->msg;
        free(node);
    }
    pthread_mutex_unlock(&engine->lock);
    *count_out = moved;
    return 0;
}

ORB_EXPORT int orb_engine_close_source(orb_engine *engine)
{
    if (engine == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_close_source: NULL engine");
    atomic_store(&engine->source_open, 0);
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++)
        if (engine->tp[i].ops != NULL)
            engine->tp[i].ops->close_source(engine->tp[i].state);
    return 0;
}

ORB_EXPORT int orb_engine_close_requester(orb_engine *engine)
{
    if (engine == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_close_requester: NULL engine");
    atomic_store(&engine->requester_open, 0);
    return 0;
}

struct orb_stage_pool *orb_engine_stage_pool(orb_engine *engine)
{
    return engine->stage_pool;
}

struct orb_stager *orb_engine_stager(orb_engine *engine)
{
    pthread_mutex_lock(&engine->lock);
    struct orb_stager *st = engine->stager;
    if (st == NULL && !engine->stopped && !engine->stager_failed) {
        if (orb_stager_new(engine->stage_pool, &st) != 0) {
            engine->stager_failed = 1;
            st = NULL;
        } else {
            engine->stager = st;
        }
    } else if (st == NULL) {
        (void)orb_fail(ORB_ECLOSED, "%s", engine->stopped ? "the engine is closed" : "the stager could not start");
    }
    pthread_mutex_unlock(&engine->lock);
    return st;
}

static uint64_t engine_inflight(orb_engine *engine)
{
    pthread_mutex_lock(&engine->lock);
    uint64_t sum = orb_stager_inflight(engine->stager);
    pthread_mutex_unlock(&engine->lock);
    for (unsigned i = 0; i < ORB_TRANSPORT_SLOTS; i++)
        if (engine->tp[i].ops != NULL)
            sum += engine->tp[i].ops->inflight(engine->tp[i].state);
    return sum;
}

ORB_EXPORT int orb_engine_close(orb_engine *engine, uint64_t timeout_ns)
{
    if (engine == NULL)
        return orb_fail(ORB_EINVAL, "orb_engine_close: NULL engine");
    orb_engine_close_requester(engine);
    orb_engine_close_source(engine);

    /* Drain: accepted work finishes on its own until the deadline. */
    uint64_t deadline = orb_deadline_after(timeout_ns);
    while (engine_inflight(engine) > 0 && orb_now_ns() < deadline)
        usleep(1000);
    uint64_t left = engine_inflight(engine);
    if (left > 0)
        ORB_LOGW("close: %llu transfers still in flight at the deadline; failing them",
                 (unsigned long long)left);

    /* Stopping joins the workers and fails what remains: afterwards no thread touches memory.
     * Where a transport cannot prove that, the engine stays unstopped, holding what that work
     * uses: a later close (or orb_engine_free) asks again. */
    int rc = stop_transports(engine, deadline);
    if (rc != 0) {
        rc = orb_fail_wrap(rc, "close: quiescence is not proven; registrations and their memory stay held");
        ORB_LOGE("%s", orb_last_error());
        return rc;
    }
    stop_exporter(engine);
    pthread_mutex_lock(&engine->lock);
    engine->stopped = 1;
    struct orb_stager *st = engine->stager;
    pthread_mutex_unlock(&engine->lock);
    /* The transports ended every piece: what is left in the stager is landed or failed now. */
    orb_stager_stop(st);
    orb_engine_reap(engine);
    return 0;
}

void orb_engine_ref(orb_engine *engine)
{
    atomic_fetch_add(&engine->refs, 1);
}

static void engine_destroy(orb_engine *engine)
{
    stop_exporter(engine); /* an engine whose close never proved quiescence may still serve */
    orb_engine_reap(engine);
    /* Every retirement (transport state, then the owner's release; the registry's last ones
     * included) runs before this returns, while the engine, its empty table and its stopped
     * transports are still valid objects: a callback may call into the engine, and reg_retire
     * needs its transport. Only then do the transports go. */
    orb_registry_retire_all(engine->registry);
    orb_reaper_free(engine->reaper);
    destroy_transports(engine);
    orb_stager_free(engine->stager);
    orb_stage_pool_free(engine->stage_pool);
    orb_registry_free(engine->registry);
    struct orb_notification_node *node = engine->notes_head;
    while (node != NULL) {
        struct orb_notification_node *next = node->next;
        free(node);
        node = next;
    }
    pthread_mutex_destroy(&engine->lock);
    orb_rdma_config_free(engine->rdma_cfg);
    free(engine);
}

void orb_engine_unref(orb_engine *engine)
{
    if (engine != NULL && atomic_fetch_sub(&engine->refs, 1) == 1)
        engine_destroy(engine);
}

ORB_EXPORT void orb_engine_free(orb_engine *engine)
{
    if (engine == NULL)
        return;
    pthread_mutex_lock(&engine->lock);
    int stopped = engine->stopped;
    pthread_mutex_unlock(&engine->lock);
    if (!stopped && orb_engine_close(engine, ORB_FREE_CLOSE_TIMEOUT_NS) != 0) {
        ORB_LOGE("orb_engine_free: close did not quiesce (%s); leaking the engine rather than "
                 "freeing memory under live work", orb_last_error());
        return;
    }
    orb_engine_unref(engine);
}

void orb_engine_defer_free(orb_engine *engine, struct orb_batch *batch)
{
    pthread_mutex_lock(&engine->lock);
    orb_batch_set_reap_next(batch, engine->reap);
    engine->reap = batch;
    pthread_mutex_unlock(&engine->lock);
}

void orb_engine_reap(orb_engine *engine)
{
    pthread_mutex_lock(&engine->lock);
    struct orb_batch *list = engine->reap;
    engine->reap = NULL;
    pthread_mutex_unlock(&engine->lock);
    while (list != NULL) {
        struct orb_batch *next = orb_batch_reap_next(list);
        orb_batch_destroy(list);
        list = next;
    }
}

/* ---- registration entry points ---------------------------------------------------------- */

static int check_engine_open(orb_engine *engine, const char *call)
{
    if (engine == NULL)
        return orb_fail(ORB_EINVAL, "%s: NULL engine", call);
    pthread_mutex_lock(&engine->lock);
    int stopped = engine->stopped;
    pthread_mutex_unlock(&engine->lock);
    if (stopped)
        return orb_fail(ORB_ECLOSED, "%s: the engine is closed", call);
    return 0;
}

static int check_perm(enum orb_perm perm)
{
    if (perm != ORB_PERM_LOCAL && perm != ORB_PERM_REMOTE_READ && perm != ORB_PERM_REMOTE_WRITE)
        return orb_fail(ORB_EINVAL, "unknown permission %d", (int)perm);
    return 0;
}

ORB_EXPORT int orb_register_memory(orb_engine *engine, void *ptr, size_t len, enum orb_perm perm,
                                   orb_release_fn release, void *ctx, orb_reg_id *id_out)
{
    int rc = check_engine_open(engine, "orb_register_memory");
    if (rc != 0)
        return rc;
    if (ptr == NULL || len == 0 || id_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_register_memory: ptr, len and id_out are required");
    if ((rc = check_perm(perm)) != 0)
        return rc;
    /* The callback is set before the range is published: once visible, another thread may
     * unregister it at once. */
    orb_host_memory *owner;
    rc = orb_host_memory_wrap(ptr, len, release, ctx, &owner);
    if (rc != 0)
        return rc;
    orb_reg_id id;
    /* The same bytes cannot be handed over twice: the registry refuses an identical range that
     * is published, deciding under its own lock. */
    rc = orb_registry_adopt(engine->registry, owner, 0, len, perm, &id);
    if (rc == ORB_EEXIST)
        rc = orb_fail_wrap(ORB_EEXIST, "orb_register_memory: [%p, +%zu): its ownership was "
                                       "transferred before", ptr, len);
    if (rc != 0) {
        /* Nothing adopted: the release callback must not run. */
        owner->release = NULL;
        orb_host_memory_unref(owner);
        return rc;
    }
    orb_host_memory_unref(owner);
    *id_out = id;
    return 0;
}

ORB_EXPORT int orb_register_host_memory(orb_engine *engine, orb_host_memory *owner, size_t offset,
                                        size_t len, enum orb_perm perm, orb_reg_id *id_out)
{
    int rc = check_engine_open(engine, "orb_register_host_memory");
    if (rc != 0)
        return rc;
    if (owner == NULL || id_out == NULL)
        return orb_fail(ORB_EINVAL, "orb_register_host_memory: owner and id_out are required");
    if ((rc = check_perm(perm)) != 0)
        return rc;
    return orb_registry_add(engine->registry, owner, offset, len, perm, id_out);
}

ORB_EXPORT int orb_register_host_memory_batch(orb_engine *engine, const struct orb_host_range *ranges,
                                              size_t n, orb_reg_id *ids_out)
{
    int rc = check_engine_open(engine, "orb_register_host_memory_batch");
    if (rc != 0)
        return rc;
    if (ranges == NULL || ids_out == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "orb_register_host_memory_batch: ranges and ids_out are "
                                    "required and n must be positive");
    return orb_registry_add_batch(engine->registry, ranges, n, ids_out);
}

int orb_engine_register_ranges(orb_engine *engine, const char *call, const struct orb_reg_range *ranges,
                               size_t n, orb_reg_id *ids_out)
{
    int rc = check_engine_open(engine, call);
    if (rc != 0)
        return rc;
    if (ranges == NULL || ids_out == NULL || n == 0)
        return orb_fail(ORB_EINVAL, "%s: ranges and ids_out are required and n must be positive", call);
    for (size_t i = 0; i < n; i++)
        if ((rc = check_perm(ranges[i].perm)) != 0)
            return n > 1 ? orb_fail_wrap(rc, "%s: range %zu", call, i) : rc;
    return orb_registry_add_ranges(engine->registry, ranges, n, ids_out);
}

ORB_EXPORT int orb_unregister_memory(orb_engine *engine, orb_reg_id id)
{
    if (engine == NULL)
        return orb_fail(ORB_EINVAL, "orb_unregister_memory: NULL engine");
    return orb_registry_remove(engine->registry, id);
}

ORB_EXPORT int orb_resolve_local_address(orb_engine *engine, uint64_t addr, uint64_t len,
                                         struct orb_local_region *out)
{
    if (engine == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "orb_resolve_local_address: NULL argument");
    return orb_registry_resolve(engine->registry, addr, len, out);
}
