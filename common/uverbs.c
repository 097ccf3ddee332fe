/* One uverbs method call (see uverbs.h). */
#include "common/uverbs.h"

#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include <rdma/ib_user_ioctl_verbs.h>
#include <rdma/rdma_user_ioctl_cmds.h>

int orb_uverbs_call(int fd, uint32_t driver_id, uint16_t object, uint16_t method, struct orb_uverbs_attr *attrs,
                    size_t n)
{
    if (fd < 0)
        return EBADF;
    if (n > ORB_UVERBS_MAX_ATTRS || (n > 0 && attrs == NULL))
        return EINVAL;
    union {
        uint64_t align;
        uint8_t bytes[sizeof(struct ib_uverbs_ioctl_hdr) + ORB_UVERBS_MAX_ATTRS * sizeof(struct ib_uverbs_attr)];
    } cmd;
    memset(&cmd, 0, sizeof cmd);
    struct ib_uverbs_ioctl_hdr *hdr = (struct ib_uverbs_ioctl_hdr *)(void *)cmd.bytes;
    /* The kernel wants the exact length of the header and these n attributes. */
    hdr->length = (uint16_t)(sizeof *hdr + n * sizeof(struct ib_uverbs_attr));
    hdr->object_id = object;
    hdr->method_id = method;
    hdr->num_attrs = (uint16_t)n;
    hdr->driver_id = driver_id;
    for (size_t i = 0; i < n; i++) {
        hdr->attrs[i].attr_id = attrs[i].id;
        hdr->attrs[i].len = attrs[i].len;
        hdr->attrs[i].flags = UVERBS_ATTR_F_MANDATORY;
        hdr->attrs[i].data = attrs[i].data;
    }
    if (ioctl(fd, RDMA_VERBS_IOCTL, cmd.bytes) != 0)
        return errno;
    for (size_t i = 0; i < n; i++)
        attrs[i].data = hdr->attrs[i].data;
    return 0;
}
