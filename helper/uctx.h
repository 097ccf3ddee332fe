/* OPEN_DEVICE's device context: what makes the handed-over uverbs fd adoptable.
 *
 * The library adopts the NIC with ibv_import_device(fd). That call does not create a device
 * context: the provider's import step asks the kernel for the context already bound to the file
 * (UVERBS_METHOD_QUERY_CONTEXT), and a freshly opened uverbs file has none. So the helper creates
 * it, on the file it opened and verified, before handing the file over; the library and the
 * helper then share one context, whose object handles DEVX_VERIFY can query through the dup the
 * helper keeps.
 *
 * Only the mlx5 provider implements the import step in rdma-core, and the creation request is
 * driver-specific, so this is mlx5's request (struct mlx5_ib_alloc_ucontext_req_v2), built as
 * libmlx5 builds it for its own contexts:
 *  - dynamic UARs with 4 KiB UAR pages (lib_caps DYN_UAR | 4K_UAR): the provider refuses to import
 *    a context with statically allocated UARs, and allocates its own doorbells per object;
 *  - 16 blue-flame registers of which 4 low-latency (libmlx5's defaults, unused with dynamic
 *    UARs, still validated by the kernel), CQE version 1 at most;
 *  - DevX first, and without DevX when the kernel refuses it (as libmlx5 retries), so that a
 *    device without DevX still gets plain verbs; DEVX_VERIFY then answers UNAVAILABLE.
 *
 * It is sent as the uverbs ioctl UVERBS_METHOD_GET_CONTEXT (the driver data as the UHW
 * attributes), which the seccomp filter admits as the one RDMA_VERBS_IOCTL request number; no
 * library is loaded. The kernel decides a DevX context's extra rights (raw transmit with
 * CAP_NET_RAW, internal resources with CAP_SYS_RAWIO) from the creator's effective
 * capabilities: the helper has none effective here, so the tenant gets exactly the rights it
 * would get opening the device itself. */
#ifndef ORB_HELPER_UCTX_H
#define ORB_HELPER_UCTX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* struct mlx5_ib_alloc_ucontext_req_v2 as sent (little-endian host order, 32 bytes). */
#define ORB_UCTX_REQ_LEN 32u
#define ORB_UCTX_TOTAL_BFREGS 16u
#define ORB_UCTX_LOW_LATENCY_BFREGS 4u
#define ORB_UCTX_MAX_CQE_VERSION 1u

/* The request bytes for a context with or without DevX (exposed for tests). */
void orb_uctx_encode_request(bool devx, uint8_t out[ORB_UCTX_REQ_LEN]);

struct orb_uctx_ops {
    /* Create the device context of the uverbs file `dev_fd` (opened and verified, no context
     * yet), asking for DevX when `devx`. Returns 0, or the errno (> 0) of the refusal. */
    int (*create)(void *impl, int dev_fd, bool devx);
};

/* The real table: UVERBS_METHOD_GET_CONTEXT on `dev_fd` (impl unused, may be NULL). */
extern const struct orb_uctx_ops orb_uctx_kernel_ops;

/* Create the context of NIC `nic`'s file `dev_fd` with DevX, or without it when the kernel
 * refuses DevX for any reason but the absence of the ioctl; *devx_out says
 * which (written only on success). Errors, with the detail message set:
 *  ORB_EUNAVAILABLE  no uverbs ioctl on this file (not a uverbs node, or a kernel without the
 *                    method), a driver that refuses the request's layout (EOPNOTSUPP), or a
 *                    device that is gone or whose firmware fails (EIO on both attempts);
 *  ORB_EAGAIN        the device is not active yet, out of resources (firmware NO_RES), or the
 *                    rdma cgroup's hca_handle limit is reached (the kernel says EAGAIN for all);
 *  ORB_ENOMEM        the kernel or the device (firmware LIM_ERR) is out of memory;
 *  ORB_EPERM         every other refusal (fail closed: no fd is handed over);
 *  ORB_EINVAL        no operation table or a negative fd. */
int orb_uctx_create(const struct orb_uctx_ops *ops, void *impl, int dev_fd, const char *nic, bool *devx_out);

#endif
