/* Internal: how device memory is registered with the NICs under cuda_memory "direct"
 * (GPUDirect RDMA), by gpu_direct_registration:
 *  - dmabuf: the allocation exported as dma-buf (cuMemGetHandleForAddressRange) and registered
 *    with ibv_reg_dmabuf_mr; it needs the device to say CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
 *    the driver's export and libibverbs' ibv_reg_dmabuf_mr;
 *  - peermem: the device pointer registered with ibv_reg_mr; it needs a peer-memory kernel module
 *    that says it is there (the version file of nv_mem, nv_mem_nc or nvidia_peermem, NCCL's probe:
 *    a module directory alone is no evidence);
 *  - auto: dmabuf when it has everything it needs, else peermem when it has, else neither.
 * A route chosen is the only one tried: a failed export or registration is the registration's
 * failure, never a reason to try the other route or to stage. */
#ifndef ORB_RDMA_GDR_H
#define ORB_RDMA_GDR_H

#include <stdbool.h>
#include <stdint.h>

#include "core/rdma_config.h"

enum orb_gdr_route { ORB_GDR_ROUTE_DMABUF = 1, ORB_GDR_ROUTE_PEERMEM = 2 };

/* What the host offers, gathered by the caller. */
struct orb_gdr_facts {
    bool cuda_dmabuf;              /* the device's attribute and the driver's export */
    bool verbs_dmabuf;             /* libibverbs exports ibv_reg_dmabuf_mr */
    bool peermem;                  /* a peer-memory module's version file exists */
};

/* The route for `wanted` (enum orb_rdma_gdr_registration) given `f`: 0 with *out, or
 * ORB_EUNAVAILABLE naming what is missing. */
int orb_gdr_choose(uint32_t wanted, const struct orb_gdr_facts *f, enum orb_gdr_route *out);

/* The peer-memory module probe under the sysfs root `sys_dirfd` (a descriptor of /sys): bit i
 * for candidate i of kernel/mm/memory_peers/nv_mem/version, kernel/mm/memory_peers/nv_mem_nc/version,
 * module/nvidia_peermem/version that exists as a regular file. */
uint32_t orb_gdr_probe_peermem(int sys_dirfd);

const char *orb_gdr_route_name(enum orb_gdr_route route);

#endif
