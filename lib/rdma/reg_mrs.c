/* The memory regions of one host registration under the Direct policy (see reg_mrs.h). */
#include "rdma/reg_mrs.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"

static struct ibv_mr *verbs_reg_mr(void *impl, struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                                   unsigned access)
{
    const struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->reg_mr_iova2(pd, addr, len, iova, access);
}

static int verbs_dereg_mr(void *impl, struct ibv_mr *mr)
{
    const struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->dereg_mr(mr);
}

/* Only in the table of a libibverbs that has it (orb_rdma_verbs_mr_ops_for). */
static struct ibv_mr *verbs_reg_dmabuf(void *impl, struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova,
                                       int fd, unsigned access)
{
    const struct orb_rdma_verbs_impl *vi = impl;
    return vi->v->reg_dmabuf_mr(pd, offset, len, iova, fd, (int)access);
}

static const struct orb_rdma_mr_ops verbs_mr_ops = {
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
    .reg_dmabuf = verbs_reg_dmabuf,
};

static const struct orb_rdma_mr_ops verbs_mr_ops_without_dmabuf = {
    .reg_mr = verbs_reg_mr,
    .dereg_mr = verbs_dereg_mr,
};

const struct orb_rdma_mr_ops *orb_rdma_verbs_mr_ops_for(const struct orb_verbs *v)
{
    return v != NULL && v->reg_dmabuf_mr != NULL ? &verbs_mr_ops : &verbs_mr_ops_without_dmabuf;
}

int orb_rdma_mr_status(int err)
{
    switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EAGAIN:
        return ORB_ERESOURCE;
    case EPERM:
    case EACCES:
        return ORB_EPERM;
    case EFAULT:
    case EINVAL:
        return ORB_EINVAL;
    default:
        return ORB_EUNAVAILABLE;
    }
}

/* Deregister what `m` holds; what the device refuses stays. Returns the number kept. */
static uint32_t release_all(const struct orb_rdma_mr_ops *ops, void *impl, struct orb_rdma_reg_mrs *m)
{
    uint32_t kept = 0;
    for (uint32_t i = 0; i < m->nslots; i++) {
        struct orb_rdma_reg_mr *r = &m->mr[i];
        struct ibv_mr **both[2] = {&r->parent, &r->local};
        for (unsigned k = 0; k < 2; k++) {
            if (*both[k] == NULL)
                continue;
            int err = ops->dereg_mr(impl, *both[k]);
            if (err != 0) {
                ORB_LOGE("rdma: %s: deregistering a %s MR of %llu bytes failed (%s): it is kept, with "
                         "its bytes, for the process's lifetime",
                         m->dev->nics[i].name, k == 0 ? "parent" : "local-only", (unsigned long long)m->len, strerror(err));
                kept++;
                continue;
            }
            *both[k] = NULL;
            m->count--;
        }
        if (r->parent == NULL && r->local == NULL)
            m->nic_mask &= ~(UINT64_C(1) << i);
    }
    return kept;
}

/* What an MR is made of: a CPU (or device) address, or a dma-buf descriptor and an offset in it. */
struct mr_source {
    void *addr;
    int fd;                 /* >= 0: dma-buf */
    uint64_t offset;
};

static int create(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                  const struct mr_source *src, uint64_t iova, uint64_t len, bool remote, struct orb_rdma_reg_mrs **out);

int orb_rdma_reg_mrs_create(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                            void *addr, uint64_t iova, uint64_t len, bool remote, struct orb_rdma_reg_mrs **out)
{
    if (addr == NULL)
        return orb_fail(ORB_EINVAL, "rdma: registration: NULL argument or empty range");
    struct mr_source src = {.addr = addr, .fd = -1};
    return create(ops, impl, dev, &src, iova, len, remote, out);
}

int orb_rdma_reg_mrs_create_dmabuf(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                                   int fd, uint64_t offset, uint64_t iova, uint64_t len, struct orb_rdma_reg_mrs **out)
{
    if (fd < 0)
        return orb_fail(ORB_EINVAL, "rdma: registration: no dma-buf descriptor");
    if (ops == NULL || ops->reg_dmabuf == NULL)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: libibverbs lacks ibv_reg_dmabuf_mr");
    struct mr_source src = {.fd = fd, .offset = offset};
    int rc = create(ops, impl, dev, &src, iova, len, false, out);
    if (rc == 0 || *out != NULL) {
        (*out)->dmabuf_fd = fd; /* registered, or kept by a failed undo: the MRs may map it */
        (*out)->dmabuf_offset = offset;
    }
    return rc;
}

static int create(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                  const struct mr_source *src, uint64_t iova, uint64_t len, bool remote, struct orb_rdma_reg_mrs **out)
{
    if (ops == NULL || dev == NULL || len == 0 || out == NULL)
        return orb_fail(ORB_EINVAL, "rdma: registration: NULL argument or empty range");
    *out = NULL;
    if (dev->nopen == 0)
        return orb_fail(ORB_EUNAVAILABLE, "rdma: registration: no open RDMA context");
    struct orb_rdma_reg_mrs *m = calloc(1, sizeof *m + (size_t)dev->nslots * sizeof m->mr[0]);
    if (m == NULL)
        return orb_fail(ORB_ENOMEM, "rdma: registration: cannot allocate its MR table");
    m->dev = dev;
    m->nslots = dev->nslots;
    m->len = len;
    m->numa_node = ORB_TOPO_NUMA_UNKNOWN;
    m->dmabuf_fd = -1;
    for (uint32_t i = 0; i < dev->nslots; i++) {
        const struct orb_rdma_nic *n = &dev->nics[i];
        if (n->pd == NULL)
            continue;
        for (unsigned k = 0; k < (remote ? 2u : 1u); k++) {
            unsigned access = k == 0 ? ORB_RDMA_LOCAL_ACCESS : ORB_RDMA_PARENT_ACCESS;
            errno = 0;
            struct ibv_mr *mr = src->fd >= 0 ? ops->reg_dmabuf(impl, n->pd, src->offset, (size_t)len, iova, src->fd,
                                                                access)
                                             : ops->reg_mr(impl, n->pd, src->addr, (size_t)len, iova, access);
            if (mr == NULL) {
                int err = errno != 0 ? errno : EIO;
                /* ENOMEM is nearly always the locked-memory limit: every MR pins its pages once
                 * more, against RLIMIT_MEMLOCK unless the process has CAP_IPC_LOCK. */
                int rc = orb_fail(err == EOPNOTSUPP || err == ENOSYS ? ORB_EUNAVAILABLE : orb_rdma_mr_status(err),
                                  "rdma: %s: cannot register %llu bytes%s as its %s MR: %s%s", n->name,
                                  (unsigned long long)len, src->fd >= 0 ? " of a dma-buf" : "",
                                  k == 0 ? "local-only" : "MW_BIND parent", strerror(err),
                                  err == ENOMEM ? " (the locked-memory limit, RLIMIT_MEMLOCK or ulimit -l, may be "
                                                  "reached: each MR copy counts)"
                                                : "");
                char why[256];
                snprintf(why, sizeof why, "%s", orb_last_error());
                if (release_all(ops, impl, m) == 0) {
                    free(m);
                } else {
                    *out = m;
                }
                return orb_fail(rc, "%s", why);
            }
            if (k == 0)
                m->mr[i].local = mr;
            else
                m->mr[i].parent = mr;
            m->count++;
            m->nic_mask |= UINT64_C(1) << i;
        }
    }
    *out = m;
    return 0;
}

int orb_rdma_reg_mrs_destroy(const struct orb_rdma_mr_ops *ops, void *impl, struct orb_rdma_reg_mrs *m)
{
    if (m == NULL)
        return 0;
    if (release_all(ops, impl, m) != 0)
        return orb_fail(ORB_EBUSY, "rdma: %u memory regions could not be deregistered", m->count);
    if (m->dmabuf_fd >= 0) {
        /* Every MR is gone: the descriptor goes now, exactly once. A close that fails is kept
         * failing: the table stays with its owners. */
        int fd = m->dmabuf_fd;
        m->dmabuf_fd = -1;
        if (close(fd) != 0 && errno != EINTR) {
            ORB_LOGE("rdma: closing a registration's dma-buf descriptor failed (%s): the registration is kept",
                     strerror(errno));
            return orb_fail(ORB_EBUSY, "rdma: a dma-buf descriptor could not be closed");
        }
    }
    free(m);
    return 0;
}
