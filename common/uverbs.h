/* One uverbs method call: the RDMA_VERBS_IOCTL request (the only ioctl number the seccomp
 * filter admits) with its header and attribute array, as rdma-core's ioctl path builds it. Used
 * by the helper's device context creation (uctx.c) and DevX key queries (devx.c), and by the
 * library's DevX key creation (lib/rdma/devx_key.c). */
#ifndef ORB_COMMON_UVERBS_H
#define ORB_COMMON_UVERBS_H

#include <stddef.h>
#include <stdint.h>

#define ORB_UVERBS_MAX_ATTRS 4u

/* One attribute. `data` is the value for an object handle (len 0) or inline data, otherwise a
 * pointer to `len` bytes (orb_uverbs_ptr). */
struct orb_uverbs_attr {
    uint16_t id;
    uint16_t len;
    uint64_t data;
};

static inline uint64_t orb_uverbs_ptr(const void *p)
{
    return (uint64_t)(uintptr_t)p;
}

/* Call `method` of `object` on the uverbs file `fd`, whose device's driver is `driver_id` (the
 * kernel refuses a header naming another driver), with `n` attributes, every one mandatory.
 * Returns 0, or the errno of the refusal (EINVAL for n above ORB_UVERBS_MAX_ATTRS, EBADF for a
 * negative fd). On success attrs[i].data holds the kernel's copy (the handle of a new object). */
int orb_uverbs_call(int fd, uint32_t driver_id, uint16_t object, uint16_t method, struct orb_uverbs_attr *attrs,
                    size_t n);

#endif
