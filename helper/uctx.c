/* OPEN_DEVICE's device context (see uctx.h). */
#include "helper/uctx.h"

#include <errno.h>
#include <string.h>

#include <rdma/ib_user_ioctl_cmds.h>
#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/mlx5-abi.h>

#include "core/error.h"
#include "common/uverbs.h"

/* The kernel refuses a uverbs ioctl whose header names another driver than the device's. Only
 * the soft-RoCE kernel check (tests/vm) builds this file for another driver. */
#ifndef ORB_UCTX_DRIVER_ID
#define ORB_UCTX_DRIVER_ID RDMA_DRIVER_MLX5
#endif

_Static_assert(sizeof(struct mlx5_ib_alloc_ucontext_req_v2) == ORB_UCTX_REQ_LEN,
               "mlx5 context request layout changed");

void orb_uctx_encode_request(bool devx, uint8_t out[ORB_UCTX_REQ_LEN])
{
    struct mlx5_ib_alloc_ucontext_req_v2 req;
    memset(&req, 0, sizeof req);
    req.total_num_bfregs = ORB_UCTX_TOTAL_BFREGS;
    req.num_low_latency_bfregs = ORB_UCTX_LOW_LATENCY_BFREGS;
    req.flags = devx ? MLX5_IB_ALLOC_UCTX_DEVX : 0;
    req.max_cqe_version = ORB_UCTX_MAX_CQE_VERSION;
    req.lib_caps = MLX5_LIB_CAP_4K_UAR | MLX5_LIB_CAP_DYN_UAR;
    memcpy(out, &req, sizeof req);
}

/* UVERBS_METHOD_GET_CONTEXT with the two core outputs and the driver's request and response, as
 * rdma-core's ioctl path builds it. */
static int kernel_create(void *impl, int dev_fd, bool devx)
{
    (void)impl;
    uint8_t req[ORB_UCTX_REQ_LEN];
    orb_uctx_encode_request(devx, req);
    struct mlx5_ib_alloc_ucontext_resp resp;
    memset(&resp, 0, sizeof resp);
    uint32_t num_comp_vectors = 0;
    uint64_t core_support = 0;
    struct orb_uverbs_attr attrs[] = {
        {UVERBS_ATTR_GET_CONTEXT_NUM_COMP_VECTORS, sizeof num_comp_vectors, orb_uverbs_ptr(&num_comp_vectors)},
        {UVERBS_ATTR_GET_CONTEXT_CORE_SUPPORT, sizeof core_support, orb_uverbs_ptr(&core_support)},
        {UVERBS_ATTR_UHW_IN, sizeof req, orb_uverbs_ptr(req)}, /* over 8 bytes: passed by pointer */
        {UVERBS_ATTR_UHW_OUT, sizeof resp, orb_uverbs_ptr(&resp)},
    };
    return orb_uverbs_call(dev_fd, ORB_UCTX_DRIVER_ID, UVERBS_OBJECT_DEVICE, UVERBS_METHOD_GET_CONTEXT, attrs,
                           sizeof attrs / sizeof attrs[0]);
}

const struct orb_uctx_ops orb_uctx_kernel_ops = {.create = kernel_create};

/* Errors that say the ioctl is not there: asking again without DevX is useless. EIO is not one
 * of them: the firmware's refusal of the DevX user context comes back as EIO too, and a device
 * that is really gone answers the second attempt with EIO again. */
static bool absent(int err)
{
    return err == ENOTTY || err == EPROTONOSUPPORT || err == ENOSYS || err == EBADF;
}

static int status_of(int err, const char *nic)
{
    switch (err) {
    case ENOTTY:
    case EPROTONOSUPPORT:
    case ENOSYS:
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: no uverbs context creation on this file: %s", nic,
                        strerror(err));
    case EOPNOTSUPP: /* mlx5 refuses a flag or field of the request it does not know */
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: the driver refuses this context request: %s", nic,
                        strerror(err));
    case EIO:
        return orb_fail(ORB_EUNAVAILABLE, "open device %s: the device is gone or its firmware failed: %s", nic,
                        strerror(err));
    case EAGAIN:
        return orb_fail(ORB_EAGAIN,
                        "open device %s: device not active, out of device resources, or the rdma cgroup's "
                        "hca_handle limit reached: %s",
                        nic, strerror(err));
    case ENOMEM:
        return orb_fail(ORB_ENOMEM, "open device %s: out of memory or device resources creating its context", nic);
    default:
        return orb_fail(ORB_EPERM, "open device %s: the kernel refused the device context: %s", nic,
                        strerror(err));
    }
}

int orb_uctx_create(const struct orb_uctx_ops *ops, void *impl, int dev_fd, const char *nic, bool *devx_out)
{
    if (ops == NULL || ops->create == NULL || dev_fd < 0 || nic == NULL || devx_out == NULL)
        return orb_fail(ORB_EINVAL, "open device: no context operations or descriptor");
    int err = ops->create(impl, dev_fd, true);
    if (err == 0) {
        *devx_out = true;
        return 0;
    }
    if (err < 0) /* an errno is positive; anything else is a broken table: fail closed */
        return orb_fail(ORB_EPERM, "open device %s: context creation answered %d", nic, err);
    if (absent(err))
        return status_of(err, nic);
    /* DevX refused (no uctx support, firmware, limits): plain verbs still work, as with libmlx5. */
    err = ops->create(impl, dev_fd, false);
    if (err == 0) {
        *devx_out = false;
        return 0;
    }
    if (err < 0)
        return orb_fail(ORB_EPERM, "open device %s: context creation answered %d", nic, err);
    return status_of(err, nic);
}
