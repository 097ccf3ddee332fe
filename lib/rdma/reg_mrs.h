/* Internal: the memory regions of one host registration under the Direct policy.
 *
 * On every open context (paused ports included), before the range becomes visible:
 *  - a local-only MR (LOCAL_WRITE): the key this process's own work requests use;
 *  - for a range peers may access, a second MR, LOCAL_WRITE|MW_BIND, the parent that one-use
 *    memory windows are bound on. It grants no remote access itself.
 * Neither key ever leaves the process: peers only ever see a window's key, bound to the exact
 * range and direction of one request. All or nothing: a failure deregisters the new copies. A
 * deregistration the device refuses keeps that MR (never freed, never retried), and the caller
 * must then keep the bytes too: a device may still map them.
 *
 * The two verbs calls go through an operation table, so that the rules above are tested
 * without a device. */
#ifndef ORB_RDMA_REG_MRS_H
#define ORB_RDMA_REG_MRS_H

#include <stdbool.h>
#include <stdint.h>

#include "rdma/devices.h"

#define ORB_RDMA_LOCAL_ACCESS ((unsigned)IBV_ACCESS_LOCAL_WRITE)
#define ORB_RDMA_PARENT_ACCESS ((unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_MW_BIND))

struct orb_rdma_mr_ops {
    /* ibv_reg_mr_iova2; NULL with errno. */
    struct ibv_mr *(*reg_mr)(void *impl, struct ibv_pd *pd, void *addr, size_t len, uint64_t iova,
                             unsigned access);
    /* ibv_dereg_mr; 0 or an errno value. */
    int (*dereg_mr)(void *impl, struct ibv_mr *mr);
    /* ibv_reg_dmabuf_mr; NULL with errno. NULL itself where libibverbs lacks it. */
    struct ibv_mr *(*reg_dmabuf)(void *impl, struct ibv_pd *pd, uint64_t offset, size_t len, uint64_t iova, int fd,
                                 unsigned access);
};

/* The real table over the libibverbs `v` (its impl a struct orb_rdma_verbs_impl over `v`):
 * reg_dmabuf NULL where `v` lacks ibv_reg_dmabuf_mr. */
const struct orb_rdma_mr_ops *orb_rdma_verbs_mr_ops_for(const struct orb_verbs *v);

struct orb_rdma_reg_mr {
    struct ibv_mr *local;   /* LOCAL_WRITE */
    struct ibv_mr *parent;  /* LOCAL_WRITE|MW_BIND; NULL for a local-only registration */
};

struct orb_rdma_reg_mrs {
    const struct orb_rdma_devices *dev; /* borrowed: the contexts outlive their MRs */
    uint64_t nic_mask;      /* NIC ids whose MRs are (still) registered */
    uint32_t nslots;        /* entries of mr[] (the devices' slot count) */
    uint32_t count;         /* MRs held */
    uint64_t len;
    int32_t numa_node;      /* the memory's node (ORB_TOPO_NUMA_UNKNOWN); the transport sets it */
    /* Device memory registered by dma-buf: the descriptor, retained until every MR is gone and
     * then closed exactly once (-1: none, or closed). */
    int dmabuf_fd;
    uint64_t dmabuf_offset; /* where the registration's first byte lies in that export */
    uint8_t route;          /* 0 host memory, else the enum orb_gdr_route that made the MRs */
    bool gdr_flush;         /* its device does not order NIC writes: flush after each READ into it */
    uint64_t reuse_mask;    /* NIC ids whose grants of it may use DevX keys (gpu_source_reuse probe passed) */
    struct orb_rdma_reg_mr mr[]; /* by NIC id */
};

/* Register [addr, +len) (CPU address `addr`, device address `iova`) on every open context of
 * `dev`; with `remote`, also the MW_BIND parent. On success *out (the caller's, released with
 * orb_rdma_reg_mrs_destroy) holds them all. On failure nothing stays registered and *out is
 * NULL, unless the undo itself failed: then *out holds what was kept (count > 0) and the call
 * still fails. Errors: ORB_EINVAL (NULL, len 0), ORB_EUNAVAILABLE (no open context),
 * ORB_ENOMEM, ORB_ERESOURCE (the device's MR limit: ENOMEM/ENOSPC from the driver, which also
 * means the memory lock limit), ORB_EPERM (EPERM/EACCES: the memory cannot be pinned with
 * write access) or ORB_EINVAL (EFAULT/EINVAL: not mapped): each message names the NIC, the
 * MR's role and the errno. */
int orb_rdma_reg_mrs_create(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                            void *addr, uint64_t iova, uint64_t len, bool remote, struct orb_rdma_reg_mrs **out);

/* The same for device memory by dma-buf: local-only MRs (LOCAL_WRITE; device memory never gets
 * a MW_BIND parent) of [offset, +len) of the buffer `fd` exports, at device address `iova`. On
 * success `m` takes `fd` (closed by orb_rdma_reg_mrs_destroy once every MR is gone); on failure
 * it stays the caller's, unless *out holds what the undo kept (then `m` holds it too). Errors as
 * orb_rdma_reg_mrs_create, and ORB_EUNAVAILABLE where libibverbs or the device cannot register
 * dma-buf (EOPNOTSUPP), the message naming the NIC. */
int orb_rdma_reg_mrs_create_dmabuf(const struct orb_rdma_mr_ops *ops, void *impl, const struct orb_rdma_devices *dev,
                                   int fd, uint64_t offset, uint64_t iova, uint64_t len, struct orb_rdma_reg_mrs **out);

/* Deregister every MR of `m`. 0: all gone and `m` freed. ORB_EBUSY: some deregistration
 * failed: those MRs stay in `m` (count says how many), which the caller must keep, with the
 * bytes under it, for the process's lifetime. NULL: 0. */
int orb_rdma_reg_mrs_destroy(const struct orb_rdma_mr_ops *ops, void *impl, struct orb_rdma_reg_mrs *m);

/* What a failed MR registration's errno means: ORB_ERESOURCE (ENOMEM, ENOSPC, EAGAIN: the
 * device's MR limit or the memory lock limit), ORB_EPERM (EPERM, EACCES), ORB_EINVAL (EFAULT,
 * EINVAL), ORB_EUNAVAILABLE (anything else, EOPNOTSUPP included). */
int orb_rdma_mr_status(int err);

/* The MRs of NIC `nic`, or NULL when it holds none. */
static inline const struct orb_rdma_reg_mr *orb_rdma_reg_mrs_on(const struct orb_rdma_reg_mrs *m, uint32_t nic)
{
    return m != NULL && nic < m->nslots && ((m->nic_mask >> nic) & 1u) ? &m->mr[nic] : NULL;
}

#endif
