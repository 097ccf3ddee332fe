/* libibverbs, loaded at run time (see verbs.h). */
#include "rdma/verbs.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/dynlib.h"
#include "core/error.h"
#include "core/log.h"

#define REQUIRED(field, export) {export, offsetof(struct orb_verbs, field), true}
#define OPTIONAL(field, export) {export, offsetof(struct orb_verbs, field), false}

static const struct orb_dl_symbol symbols[] = {
    REQUIRED(get_device_list, "ibv_get_device_list"),
    REQUIRED(free_device_list, "ibv_free_device_list"),
    REQUIRED(get_device_name, "ibv_get_device_name"),
    REQUIRED(get_device_guid, "ibv_get_device_guid"),
    REQUIRED(open_device, "ibv_open_device"),
    REQUIRED(close_device, "ibv_close_device"),
    REQUIRED(query_device, "ibv_query_device"),
    REQUIRED(query_port_compat, "ibv_query_port"),
    REQUIRED(query_gid, "ibv_query_gid"),
    REQUIRED(alloc_pd, "ibv_alloc_pd"),
    REQUIRED(dealloc_pd, "ibv_dealloc_pd"),
    REQUIRED(reg_mr_iova2, "ibv_reg_mr_iova2"),
    REQUIRED(dereg_mr, "ibv_dereg_mr"),
    REQUIRED(create_comp_channel, "ibv_create_comp_channel"),
    REQUIRED(destroy_comp_channel, "ibv_destroy_comp_channel"),
    REQUIRED(create_cq, "ibv_create_cq"),
    REQUIRED(destroy_cq, "ibv_destroy_cq"),
    REQUIRED(get_cq_event, "ibv_get_cq_event"),
    REQUIRED(ack_cq_events, "ibv_ack_cq_events"),
    REQUIRED(create_qp, "ibv_create_qp"),
    REQUIRED(modify_qp, "ibv_modify_qp"),
    REQUIRED(query_qp, "ibv_query_qp"),
    REQUIRED(destroy_qp, "ibv_destroy_qp"),
    REQUIRED(get_async_event, "ibv_get_async_event"),
    REQUIRED(ack_async_event, "ibv_ack_async_event"),
    REQUIRED(wc_status_str, "ibv_wc_status_str"),
    /* rdma-core 28 (importing a context opened elsewhere: the helper's path), 34 (dma-buf), 31
     * (extended GID queries). */
    OPTIONAL(import_device, "ibv_import_device"),
    OPTIONAL(reg_dmabuf_mr, "ibv_reg_dmabuf_mr"),
    OPTIONAL(query_gid_ex, "_ibv_query_gid_ex"),
};

static int inline_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr, struct ibv_send_wr **bad_wr)
{
    return ibv_post_send(qp, wr, bad_wr);
}

static int inline_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr, struct ibv_recv_wr **bad_wr)
{
    return ibv_post_recv(qp, wr, bad_wr);
}

static struct ibv_mw *inline_alloc_mw(struct ibv_pd *pd, enum ibv_mw_type type)
{
    return ibv_alloc_mw(pd, type);
}

static int inline_dealloc_mw(struct ibv_mw *mw)
{
    return ibv_dealloc_mw(mw);
}

int orb_verbs_load(const char *path, struct orb_verbs *out)
{
    if (path == NULL || out == NULL)
        return orb_fail(ORB_EINVAL, "verbs: NULL path or table");
    struct orb_verbs table;
    memset(&table, 0, sizeof table);
    void *handle = NULL;
    int status = orb_dl_open("verbs", path, symbols, sizeof symbols / sizeof symbols[0], &table, sizeof table,
                             " (rdma-core too old?)", &handle);
    if (status != 0)
        return status;
    table.post_send = inline_post_send;
    table.post_recv = inline_post_recv;
    table.alloc_mw = inline_alloc_mw;
    table.dealloc_mw = inline_dealloc_mw;
    /* Kept for the process's lifetime: contexts, MRs and providers loaded by it outlive any one
     * engine, and providers are not safe to unload. */
    *out = table;
    return 0;
}

static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static struct orb_verbs g_verbs;
static int g_status = ORB_EUNAVAILABLE;
static char g_detail[256];
static atomic_bool g_attempted;

static void load_once(void)
{
    atomic_store(&g_attempted, true);
    g_status = orb_verbs_load(ORB_VERBS_LIBRARY, &g_verbs);
    if (g_status != 0) {
        snprintf(g_detail, sizeof g_detail, "%s", orb_last_error());
        ORB_LOGW("%s: the RDMA transport is unavailable in this process", g_detail);
    } else if (g_verbs.import_device == NULL) {
        ORB_LOGI("verbs: %s has no ibv_import_device: devices are opened directly, not through the helper",
                 ORB_VERBS_LIBRARY);
    }
}

int orb_verbs_get(const struct orb_verbs **out)
{
    if (out == NULL)
        return orb_fail(ORB_EINVAL, "verbs: NULL table");
    (void)pthread_once(&g_once, load_once);
    if (g_status != 0)
        return orb_fail(g_status, "%s", g_detail);
    *out = &g_verbs;
    return 0;
}

bool orb_verbs_attempted(void)
{
    return atomic_load(&g_attempted);
}

int orb_verbs_query_port(const struct orb_verbs *v, struct ibv_context *context, uint8_t port,
                         struct ibv_port_attr *attr)
{
    if (v == NULL || context == NULL || attr == NULL)
        return EINVAL;
    struct verbs_context *vctx = verbs_get_ctx_op(context, query_port);
    if (vctx != NULL)
        return vctx->query_port(context, port, attr, sizeof *attr);
    memset(attr, 0, sizeof *attr);
    return v->query_port_compat(context, port, (struct _compat_ibv_port_attr *)attr);
}
