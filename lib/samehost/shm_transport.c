/* The same-host transport's operation table, start, stop and registration state. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clock.h"
#include "core/engine.h"
#include "core/engine_internal.h"
#include "core/error.h"
#include "core/log.h"
#include "core/memory.h"
#include "samehost/shm_internal.h"

static void tp_free(struct shm_tp *tp)
{
    pthread_mutex_destroy(&tp->lock);
    pthread_cond_destroy(&tp->changed);
    free(tp);
}

static int shm_start(orb_engine *engine, void **tp_out)
{
    const struct orb_engine_config *cfg = orb_engine_cfg(engine);
    struct shm_tp *tp = calloc(1, sizeof *tp);
    if (tp == NULL)
        return orb_fail(ORB_ENOMEM, "shm: out of memory for the transport");
    tp->engine = engine;
    tp->enabled = cfg->enable_shm != 0;
    tp->listen_fd = -1;
    tp->pid = (uint32_t)getpid();
    tp->io_timeout_ns = (uint64_t)(cfg->io_timeout_s > 0 ? cfg->io_timeout_s : 30) * ORB_NS_PER_SEC;
    tp->hello_timeout_ns = (uint64_t)cfg->hello_timeout_ms * 1000000ull;
    /* Polling takes a CPU: only with busy_poll_us and two CPUs at least, one for each side. */
    tp->poll_ns = engine->poll_allowed ? (uint64_t)cfg->busy_poll_us * 1000u : 0;
    tp->handoff_ns = tp->poll_ns > SHM_HANDOFF_MIN_NS ? tp->poll_ns : SHM_HANDOFF_MIN_NS;
    atomic_init(&tp->stopping, false);
    atomic_init(&tp->accept_quit, false);
    atomic_init(&tp->source_busy, 0);
    atomic_init(&tp->inflight, 0);
    atomic_init(&tp->next_serial, 1);
    pthread_mutex_init(&tp->lock, NULL);
    if (orb_cond_init_monotonic(&tp->changed) != 0) {
        pthread_mutex_destroy(&tp->lock);
        free(tp);
        return orb_fail(ORB_ENOMEM, "shm: cannot make the transport's condition variable");
    }
    if (!tp->enabled) {
        tp_free(tp);
        (void)orb_fail(ORB_EUNAVAILABLE, "enable_shm is off");
        return ORB_TP_NOT_HERE;
    }
    if (orb_samehost_boot_id(tp->boot_id) != 0) {
        ORB_LOGI("shm: this host's boot id cannot be read (%s)", orb_last_error());
        tp_free(tp);
        return ORB_TP_NOT_HERE;
    }
    tp->epoch = *orb_engine_epoch(engine);
    int rc = shm_source_start(tp);
    if (rc != 0) {
        tp_free(tp);
        return rc;
    }
    *tp_out = tp;
    return 0;
}

static void shm_close_source(void *tp)
{
    (void)tp; /* every request checks the engine's source fence (orb_engine_source_open) */
}

static int shm_stop(void *tp_, uint64_t deadline)
{
    struct shm_tp *tp = tp_;
    atomic_store(&tp->stopping, true);
    int rq = shm_requester_stop(tp, deadline);
    int rc = shm_source_stop(tp, deadline);
    return rq != 0 ? rq : rc;
}

static void shm_destroy(void *tp_)
{
    struct shm_tp *tp = tp_;
    shm_requester_free(tp);
    shm_source_free(tp);
    tp_free(tp);
}

static uint64_t shm_inflight(void *tp_)
{
    struct shm_tp *tp = tp_;
    return atomic_load(&tp->inflight) + atomic_load(&tp->source_busy);
}

/* A registration of shareable host memory gets the window of its memory file that covers it;
 * anything else gets no state (the transport does not carry it). */
static int shm_reg_attach(void *tp_, const struct orb_reg *reg, void **state_out)
{
    struct shm_tp *tp = tp_;
    *state_out = NULL;
    if (reg->kind != &orb_memkind_host)
        return 0;
    const orb_host_memory *owner = reg->owner;
    int fd = orb_host_memory_shared_fd(owner);
    if (fd < 0)
        return 0;
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    uint64_t start = reg->base - (uint64_t)(uintptr_t)orb_host_memory_data(owner);
    uint64_t first = start / page * page;
    uint64_t end = (start + reg->len + page - 1) / page * page;
    struct shm_reg_state *st = calloc(1, sizeof *st);
    if (st == NULL)
        return orb_fail(ORB_ENOMEM, "shm: out of memory for a registration's state");
    st->serial = atomic_fetch_add(&tp->next_serial, 1);
    st->fd = fd;
    st->file_offset = first;
    st->length = end - first;
    st->reg_offset = start - first;
    *state_out = st;
    return 0;
}

static int shm_reg_retire(void *tp_, const struct orb_reg *reg, void *state)
{
    (void)reg;
    struct shm_reg_state *st = state;
    if (st != NULL) {
        shm_requester_forget(tp_, st);
        free(st);
    }
    return 0;
}

const struct orb_transport_ops orb_shm_transport = {
    .id = ORB_TRANSPORT_SHM,
    .name = "shm",
    .request_private_size = 0,
    .stages_through_cpu = 0,
    .moves_device_memory = 0,
    .start = shm_start,
    .endpoint = NULL,
    .close_source = shm_close_source,
    .stop = shm_stop,
    .destroy = shm_destroy,
    .inflight = shm_inflight,
    .reg_attach = shm_reg_attach,
    .reg_retire = shm_reg_retire,
    .peer_open = shm_peer_open,
    .peer_plan = shm_peer_plan,
    .peer_submit = shm_peer_submit,
    .peer_release = shm_peer_release,
    .peer_accepts = shm_peer_accepts,
    .peer_poll = shm_peer_poll,
    .control = shm_source_control,
};
