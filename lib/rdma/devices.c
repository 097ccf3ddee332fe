/* The RDMA NICs of one engine (see devices.h). */
#include "rdma/devices.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "helper/helper_client.h"

/* ---- the real operations ------------------------------------------------------------------ */

static int verbs_helper_open_device(void *impl, const char *nic, int *fd_out)
{
    struct orb_rdma_verbs_impl *vi = impl;
    return orb_helper_open_device(vi->helper, nic, fd_out);
}

static struct ibv_context *verbs_import_device(void *impl, int fd)
{
    struct orb_rdma_verbs_impl *vi = impl;
    if (vi->v->import_device == NULL) {
        errno = EOPNOTSUPP;
        return NULL;
    }
    return vi->v->import_device(fd);
}

static struct ibv_context *verbs_open_direct(void *impl, const char *nic)
{
    struct orb_rdma_verbs_impl *vi = impl;
    int n = 0;
    struct ibv_device **list = vi->v->get_device_list(&n);
    if (list == NULL)
        return NULL;
    struct ibv_context *ctx = NULL;
    int err = ENODEV;
    for (int i = 0; i < n; i++) {
        const char *name = vi->v->get_device_name(list[i]);
        if (name != NULL && strcmp(name, nic) == 0) {
            ctx = vi->v->open_device(list[i]);
            err = ctx == NULL ? errno : 0;
            break;
        }
    }
    vi->v->free_device_list(list);
    if (ctx == NULL)
        errno = err;
    return ctx;
}

static int verbs_close_device(void *impl, struct ibv_context *ctx)
{
    struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->close_device(ctx);
}

static struct ibv_pd *verbs_alloc_pd(void *impl, struct ibv_context *ctx)
{
    struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->alloc_pd(ctx);
}

static int verbs_dealloc_pd(void *impl, struct ibv_pd *pd)
{
    struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->dealloc_pd(pd);
}

void orb_rdma_devices_verbs_ops(struct orb_rdma_verbs_impl *impl, const struct orb_verbs *v,
                                struct orb_helper *helper, struct orb_rdma_open_ops *ops)
{
    impl->v = v;
    impl->helper = helper;
    ops->helper_open_device = helper != NULL ? verbs_helper_open_device : NULL;
    ops->import_device = verbs_import_device;
    ops->open_direct = verbs_open_direct;
    ops->close_device = verbs_close_device;
    ops->alloc_pd = verbs_alloc_pd;
    ops->dealloc_pd = verbs_dealloc_pd;
    ops->describe_provider = NULL; /* the transport sets it (sysfs is lib/topo's) */
}

/* ---- opening ---------------------------------------------------------------------------------- */

/* A session failure of the helper ends the whole open; a refusal concerns one NIC. */
static bool session_failure(int status)
{
    return status == ORB_EPEER || status == ORB_EPROTO || status == ORB_ETIMEDOUT || status == ORB_EINVAL;
}

/* Open NIC `n` (its name and id set). 0 (opened, or left closed with n->status saying why) or a
 * status that ends the whole open. */
static int open_one(struct orb_rdma_devices *d, enum orb_helper_mode mode, struct orb_rdma_nic *n)
{
    const struct orb_rdma_open_ops *ops = &d->ops;
    if (ops->helper_open_device != NULL) {
        int fd = -1;
        int rc = ops->helper_open_device(d->impl, n->name, &fd);
        if (rc == 0) {
            n->ctx = ops->import_device(d->impl, fd);
            if (n->ctx == NULL) {
                int err = errno;
                (void)close(fd);
                n->status = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: the helper's device could not be imported: %s",
                                     n->name, strerror(err));
                ORB_LOGW("%s", orb_last_error());
                return 0;
            }
            /* The imported context owns the descriptor now: ibv_close_device() closes it. */
            n->route = ORB_RDMA_ROUTE_IMPORTED;
            return 0;
        }
        if (session_failure(rc))
            return rc;
        if (rc != ORB_EUNAVAILABLE) {
            /* Denied (or absent): this NIC is never opened. */
            n->status = rc;
            ORB_LOGI("rdma: %s: not opened: %s", n->name, orb_last_error());
            return 0;
        }
        /* The helper opens no context this provider can import. */
        char provider[96];
        if (ops->describe_provider == NULL || ops->describe_provider(d->impl, n->name, provider, sizeof provider) != 0)
            snprintf(provider, sizeof provider, "not named by sysfs");
        if (mode == ORB_HELPER_REQUIRED)
            return orb_fail(ORB_EUNAVAILABLE,
                            "rdma: %s: its provider (%s) cannot import a context from the helper, so the policy "
                            "cannot be enforced for it (helper required)",
                            n->name, provider);
        ORB_LOGW("rdma: %s: its provider (%s) cannot import a context from the helper: opened directly; the "
                 "policy is honoured for it, not enforced",
                 n->name, provider);
    }
    n->ctx = ops->open_direct(d->impl, n->name);
    if (n->ctx == NULL) {
        int err = errno;
        n->status = orb_fail(err == ENODEV ? ORB_ENOENT : ORB_EUNAVAILABLE, "rdma: %s: cannot open it: %s",
                             n->name, strerror(err));
        ORB_LOGW("%s", orb_last_error());
        return 0;
    }
    n->route = ORB_RDMA_ROUTE_DIRECT;
    return 0;
}

int orb_rdma_devices_open(const struct orb_rdma_open_ops *ops, void *impl, const struct orb_topo_inventory *inv,
                          uint64_t allowed, enum orb_helper_mode mode, struct orb_rdma_devices *out)
{
    if (ops == NULL || inv == NULL || out == NULL || ops->import_device == NULL || ops->open_direct == NULL ||
        ops->close_device == NULL || ops->alloc_pd == NULL || ops->dealloc_pd == NULL)
        return orb_fail(ORB_EINVAL, "rdma: devices: NULL argument or operation");
    struct orb_rdma_devices d;
    memset(&d, 0, sizeof d);
    d.ops = *ops;
    d.impl = impl;
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        d.nics[i].id = (uint8_t)i;
        d.nics[i].status = ORB_ENOENT;
    }
    for (uint32_t i = 0; i < inv->nnics && i < ORB_TOPO_MAX_NICS; i++) {
        const struct orb_topo_nic *t = &inv->nics[i];
        if (t->id >= ORB_TOPO_MAX_NICS)
            continue;
        struct orb_rdma_nic *n = &d.nics[t->id];
        memcpy(n->name, t->name, sizeof n->name);
        n->name[sizeof n->name - 1] = '\0';
        if ((uint32_t)t->id + 1 > d.nslots)
            d.nslots = (uint32_t)t->id + 1;
        if (!t->usable) {
            n->status = ORB_EUNAVAILABLE;
            continue;
        }
        if (((allowed >> t->id) & 1u) == 0) {
            n->status = ORB_EPERM; /* never opened, not even asked for */
            continue;
        }
        n->status = 0;
        int rc = open_one(&d, mode, n);
        if (rc != 0) {
            int saved = rc;
            char why[256];
            snprintf(why, sizeof why, "%s", orb_last_error());
            (void)orb_rdma_devices_close(&d);
            return orb_fail(saved, "%s", why);
        }
        if (n->ctx == NULL)
            continue;
        n->pd = d.ops.alloc_pd(d.impl, n->ctx);
        if (n->pd == NULL) {
            n->status = orb_fail(ORB_EUNAVAILABLE, "rdma: %s: no protection domain: %s", n->name, strerror(errno));
            ORB_LOGW("%s", orb_last_error());
            if (d.ops.close_device(d.impl, n->ctx) == 0)
                n->ctx = NULL;
            n->route = ORB_RDMA_ROUTE_NONE;
            continue;
        }
        d.nopen++;
    }
    *out = d;
    return 0;
}

uint32_t orb_rdma_devices_close(struct orb_rdma_devices *d)
{
    if (d == NULL)
        return 0;
    uint32_t kept = 0;
    for (unsigned i = 0; i < ORB_TOPO_MAX_NICS; i++) {
        struct orb_rdma_nic *n = &d->nics[i];
        if (n->pd != NULL) {
            if (d->ops.dealloc_pd(d->impl, n->pd) != 0) {
                kept++; /* kept, never freed twice: its context stays too */
                continue;
            }
            n->pd = NULL;
        }
        if (n->ctx != NULL) {
            if (d->ops.close_device(d->impl, n->ctx) != 0) {
                kept++;
                continue;
            }
            n->ctx = NULL;
        }
        if (n->route != ORB_RDMA_ROUTE_NONE && d->nopen > 0)
            d->nopen--;
        n->route = ORB_RDMA_ROUTE_NONE;
    }
    return kept;
}
